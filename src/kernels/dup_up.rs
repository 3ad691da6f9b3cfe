//! `shaders/dup_up.wgsl`: the channel-to-space shortcut of a residual Wan up
//! block (diffusers' `DupUp3D` on a video's first frame; Wan 2.2 and
//! Qwen-Image 2.1 decoders), on windows so tiles read what the whole image does.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, KernelSpec, PipelineKey, Recorder, StorageType};
use crate::kernels::elementwise::storage_of;
use crate::kernels::spec;
use crate::tensor::Tensor;

const SOURCE: &str = include_str!("../../shaders/dup_up.wgsl");
/// Invocations per workgroup.
pub const WG: u32 = 256;

/// Uniforms (mirrors `Params` in the shader, 64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    /// Output elements.
    pub total: u32,
    /// Output channels.
    pub co: u32,
    /// Output window rows.
    pub oh: u32,
    /// Output window columns.
    pub ow: u32,
    /// Source channels.
    pub ci: u32,
    /// Source window rows.
    pub sh: u32,
    /// Source window columns.
    pub sw: u32,
    /// Time factor of the block (2 where it also up-samples time).
    pub ft: u32,
    /// The output window's origin in the up-sampled image.
    pub oy: u32,
    /// See `oy`.
    pub ox: u32,
    /// The source window's origin in the low-resolution image.
    pub sy: u32,
    /// See `sy`.
    pub sx: u32,
    /// Copies of each source channel (`co · ft · 4 / ci`).
    pub repeats: u32,
    /// Padding to 64 bytes.
    pub _pad: [u32; 3],
}

/// The kernel.
pub const DUP_UP: KernelSpec = spec::<Params>("dup_up", SOURCE, "dup_up", &[Read, ReadWrite]);

fn key(t: StorageType) -> PipelineKey {
    PipelineKey::new(&DUP_UP)
        .constant("WG", format!("{WG}u"))
        .storage("src", t)
        .storage("out", t)
}

/// The source channel of output channel `o` at parity `(a, b)` (row, column).
pub fn source_channel(o: usize, ft: usize, repeats: usize, a: usize, b: usize) -> usize {
    (((o * ft + ft - 1) * 2 + a) * 2 + b) / repeats
}

/// Fills `out` `[N, CO, OH, OW]`, the window at `(oy, ox)` of the up-sampled
/// image, from `src` `[N, CI, SH, SW]`, the window at `(sy, sx)` of the
/// low-resolution one, which must cover the output window's source pixels.
/// `co · ft · 4` must be a multiple of `ci` (DupUp3D's condition).
pub fn dup_up(
    rec: &mut Recorder,
    src: &Tensor,
    (sy, sx): (usize, usize),
    out: &Tensor,
    (oy, ox): (usize, usize),
    ft: usize,
) -> Result<()> {
    const OP: &str = "dup_up";
    let dims = |t: &Tensor| -> Result<[usize; 4]> {
        <[usize; 4]>::try_from(t.shape())
            .map_err(|_| Error::shape(OP, format!("{t:?} is not N×C×H×W")))
    };
    let [n, ci, sh, sw] = dims(src)?;
    let [on, co, oh, ow] = dims(out)?;
    let factor = co * ft.max(1) * 4;
    if on != n || ci == 0 || ft == 0 || !factor.is_multiple_of(ci) || src.dtype() != out.dtype() {
        return Err(Error::shape(
            OP,
            format!("src {src:?} → out {out:?} (time factor {ft}): same N and dtype, out channels · {ft} · 4 a multiple of src channels"),
        ));
    }
    let covers = oh == 0
        || ow == 0
        || (sy <= oy / 2
            && sx <= ox / 2
            && (oy + oh - 1) / 2 < sy + sh
            && (ox + ow - 1) / 2 < sx + sw);
    if !covers || src.overlaps(out) {
        return Err(Error::shape(
            OP,
            format!("src window at ({sy}, {sx}) of {src:?} does not cover out window at ({oy}, {ox}) of {out:?}, or they overlap"),
        ));
    }
    let total = out.numel();
    if total == 0 {
        return Ok(());
    }
    let u = |v: usize| u32::try_from(v).map_err(|_| Error::shape(OP, format!("{v} exceeds u32")));
    u(src.numel())?;
    let params = Params {
        total: u(total)?,
        co: u(co)?,
        oh: u(oh)?,
        ow: u(ow)?,
        ci: u(ci)?,
        sh: u(sh)?,
        sw: u(sw)?,
        ft: u(ft)?,
        oy: u(oy)?,
        ox: u(ox)?,
        sy: u(sy)?,
        sx: u(sx)?,
        repeats: u(factor / ci)?,
        _pad: [0; 3],
    };
    let groups = linear_groups(rec.ctx(), (total as u64).div_ceil(WG as u64))?;
    let st = storage_of(rec, &[("src", src)])?;
    let t = st.first().map(|s| s.1).unwrap_or(StorageType::F32);
    rec.dispatch(&DUP_UP, &key(t), &params, &[src, out], groups, 0)
}

/// CPU reference of [`dup_up`] on whole images: `src` `[n, ci, h, w]` →
/// `[n, co, 2h, 2w]`.
pub fn cpu_dup_up(src: &[f32], [n, ci, h, w]: [usize; 4], co: usize, ft: usize) -> Vec<f32> {
    let repeats = co * ft * 4 / ci;
    let (oh, ow) = (2 * h, 2 * w);
    let mut out = vec![0.0; n * co * oh * ow];
    for b in 0..n {
        for o in 0..co {
            for y in 0..oh {
                for x in 0..ow {
                    let c = source_channel(o, ft, repeats, y % 2, x % 2);
                    out[((b * co + o) * oh + y) * ow + x] =
                        src[((b * ci + c) * h + y / 2) * w + x / 2];
                }
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    StorageType::ALL.iter().map(|t| (DUP_UP, key(*t))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::rand_vec;

    /// Whole images and windows at odd offsets, both time factors, every
    /// storage type: bit-equal to the CPU reference (a copy).
    #[test]
    fn dup_up_matches_cpu_whole_and_windowed() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            for (ci, co, ft) in [(8, 8, 2), (8, 4, 1), (6, 3, 2), (4, 8, 1)] {
                let (n, h, w) = (2, 5, 7);
                let data: Vec<f32> = rand_vec(n * ci * h * w, 3, 2.0)
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let want = cpu_dup_up(&data, [n, ci, h, w], co, ft);
                let src = Tensor::from_f32_as(&ctx, &[n, ci, h, w], &data, dt, "src").unwrap();
                let out = Tensor::empty(&ctx, &[n, co, 2 * h, 2 * w], dt, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                dup_up(&mut rec, &src, (0, 0), &out, (0, 0), ft).unwrap();
                rec.submit().unwrap();
                assert_eq!(out.to_f32(&ctx).unwrap(), want, "{dt:?} {ci}->{co} ft {ft}");
                // The window rows 3..9, columns 5..12 from the source window
                // rows 1..5, columns 2..6.
                let (oy, ox, oh, ow) = (3, 5, 6, 7);
                let (sy, sx, sh, sw) = (1, 2, 4, 4);
                let mut part = vec![0.0; n * ci * sh * sw];
                crate::kernels::tensor_ops::cpu_copy_window(
                    &data,
                    (h, w),
                    (sy, sx),
                    &mut part,
                    (sh, sw),
                    (0, 0),
                    (sh, sw),
                    n * ci,
                );
                let src = Tensor::from_f32_as(&ctx, &[n, ci, sh, sw], &part, dt, "src").unwrap();
                let out = Tensor::empty(&ctx, &[n, co, oh, ow], dt, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                dup_up(&mut rec, &src, (sy, sx), &out, (oy, ox), ft).unwrap();
                rec.submit().unwrap();
                let mut want_win = vec![0.0; n * co * oh * ow];
                crate::kernels::tensor_ops::cpu_copy_window(
                    &want,
                    (2 * h, 2 * w),
                    (oy, ox),
                    &mut want_win,
                    (oh, ow),
                    (0, 0),
                    (oh, ow),
                    n * co,
                );
                assert_eq!(out.to_f32(&ctx).unwrap(), want_win, "{dt:?} window");
            }
        }
    }

    /// A source window that misses output pixels is refused.
    #[test]
    fn dup_up_refuses_a_window_that_does_not_cover() {
        let ctx = crate::testing::test_context();
        let src = Tensor::from_f32(&ctx, &[1, 4, 2, 2], &[0.0; 16], "src").unwrap();
        let out = Tensor::empty(&ctx, &[1, 4, 6, 6], crate::tensor::DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(dup_up(&mut rec, &src, (0, 0), &out, (0, 0), 1).is_err());
    }
}
