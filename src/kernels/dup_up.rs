//! `shaders/dup_up.wgsl`: channels to space, on windows so tiles read what
//! the whole image does: the shortcut of a residual Wan up block (diffusers'
//! `DupUp3D` on a video's first frame; Wan 2.2 and Qwen-Image 2.1 decoders)
//! and PyTorch's `pixel_shuffle` (patch-size-2 TAEHV decoders' output).

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
    /// Copies of each source channel (`co · ft · f² / ci`).
    pub repeats: u32,
    /// Up-sampling factor along each axis.
    pub f: u32,
    /// Source frames that are a video's first chunk (each gives only its
    /// last sub-frame); every later one gives `ft` frames.
    pub lead: u32,
    /// 0: DupUp3D / pixel_shuffle order; 1: DCAE ([`Dcae`]); 2: tiled
    /// ([`Order::Tile`], `g_next` channels).
    pub order: u32,
    /// [`Dcae::first`].
    pub g_first: u32,
    /// See `g_first`.
    pub r_first: u32,
    /// [`Dcae::next`].
    pub g_next: u32,
    /// See `g_next`.
    pub r_next: u32,
    /// 1: add into `out` (a residual) instead of overwriting it.
    pub add: u32,
    /// Padding to 80 bytes.
    pub _pad: [u32; 2],
}

/// Which source channel each output channel of a channels-to-space map
/// reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// DupUp3D's `repeat_interleave` + view (and PyTorch's `pixel_shuffle`):
    /// `(((o · ft + dt) · f + dy) · f + dx) / repeats`.
    #[default]
    Interleave,
    /// HunyuanVideo 1.5's ([`Dcae`]).
    Dcae(Dcae),
    /// LTX-2's residual: the source viewed as `g` channels of `ft·f²`
    /// sub-pixels, tiled along channels (`torch.repeat`): `((((o mod g) ·
    /// ft + dt) · f + dy) · f + dx)`.
    Tile(usize),
}

/// HunyuanVideo 1.5's DCAE channel order: output channel `o` at sub-pixel
/// `sub = dy·f + dx` of a first-chunk frame reads source channel `(sub·G +
/// o) / R` with `(G, R) = first`; of a later frame, sub-frame `dt`, `((dt·f²
/// + sub)·G + o) / R` with `(G, R) = next` (the conv output's rearrange: R
/// = 1; the shortcut's `repeat_interleave`: R = repeats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dcae {
    /// (channels per sub-position, repeats) of a first-chunk frame.
    pub first: (usize, usize),
    /// (channels per sub-position, repeats) of a later frame.
    pub next: (usize, usize),
}

/// The kernel.
pub const DUP_UP: KernelSpec = spec::<Params>("dup_up", SOURCE, "dup_up", &[Read, ReadWrite]);

fn key(t: StorageType) -> PipelineKey {
    PipelineKey::new(&DUP_UP)
        .constant("WG", format!("{WG}u"))
        .storage("src", t)
        .storage("out", t)
}

/// PyTorch's `pixel_unshuffle` (space to channels).
pub const PIXEL_UNSHUFFLE: KernelSpec =
    spec::<Params>("dup_up", SOURCE, "pixel_unshuffle", &[Read, ReadWrite]);

fn unshuffle_key(t: StorageType) -> PipelineKey {
    PipelineKey::new(&PIXEL_UNSHUFFLE)
        .flag("UNSHUFFLE")
        .constant("WG", format!("{WG}u"))
        .storage("src", t)
        .storage("out", t)
}

fn dims4(op: &str, t: &Tensor) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::shape(op, format!("{t:?} is not N×C×H×W")))
}

fn to_u32(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, format!("{v} exceeds u32")))
}

/// PyTorch's `pixel_unshuffle` of `src` `[N, C, H·f, W·f]` into `out`
/// `[N, C·f², H, W]` (channel `c·f² + dy·f + dx`).
pub fn pixel_unshuffle(rec: &mut Recorder, src: &Tensor, f: usize, out: &Tensor) -> Result<()> {
    const OP: &str = "pixel_unshuffle";
    let dims = |t: &Tensor| dims4(OP, t);
    let [n, ci, sh, sw] = dims(src)?;
    let [on, co, oh, ow] = dims(out)?;
    if f == 0
        || on != n
        || co != ci * f * f
        || sh != oh * f
        || sw != ow * f
        || src.dtype() != out.dtype()
        || src.overlaps(out)
    {
        return Err(Error::shape(
            OP,
            format!("{src:?} → {out:?} by {f}: N×C×H·f×W·f → N×C·f²×H×W, one dtype"),
        ));
    }
    let u = |v: usize| to_u32(OP, v);
    u(src.numel())?;
    let params = Params {
        total: u(out.numel())?,
        co: u(co)?,
        oh: u(oh)?,
        ow: u(ow)?,
        ci: u(ci)?,
        sh: u(sh)?,
        sw: u(sw)?,
        f: u(f)?,
        ..Params::default()
    };
    if params.total == 0 {
        return Ok(());
    }
    let groups = linear_groups(rec.ctx(), u64::from(params.total).div_ceil(u64::from(WG)))?;
    let t = StorageType::of(src.dtype(), rec.ctx().caps())?;
    rec.dispatch(
        &PIXEL_UNSHUFFLE,
        &unshuffle_key(t),
        &params,
        &[src, out],
        groups,
        0,
    )
}

/// The source channel of output channel `o` of sub-frame `dt` at parity
/// `(a, b)` (row, column).
pub fn source_channel(
    o: usize,
    (ft, dt): (usize, usize),
    repeats: usize,
    a: usize,
    b: usize,
) -> usize {
    (((o * ft + dt) * 2 + a) * 2 + b) / repeats
}

/// Fills `out` `[N, CO, OH, OW]`, the window at `(oy, ox)` of the up-sampled
/// image, from `src` `[N, CI, SH, SW]`, the window at `(sy, sx)` of the
/// low-resolution one, which must cover the output window's source pixels.
/// `co · ft · 4` must be a multiple of `ci` (DupUp3D's condition). Every
/// source frame is a first chunk (an image, one output frame each); see
/// [`dup_up_video`] for frames that grow in time.
pub fn dup_up(
    rec: &mut Recorder,
    src: &Tensor,
    from: (usize, usize),
    out: &Tensor,
    at: (usize, usize),
    ft: usize,
) -> Result<()> {
    let n = src.shape().first().copied().unwrap_or(0);
    dup_up_video(rec, src, from, out, at, ft, n)
}

/// [`dup_up`] of a video's frames `[T, CI, SH, SW]` (time as the batch)
/// into `[lead + ft·(T − lead), CO, OH, OW]`: the first `lead` (0 or 1)
/// source frames are the video's first chunk, which keeps only its last
/// sub-frame, every later frame gives `ft` (diffusers' `DupUp3D` with
/// `first_chunk`).
pub fn dup_up_video(
    rec: &mut Recorder,
    src: &Tensor,
    from: (usize, usize),
    out: &Tensor,
    at: (usize, usize),
    ft: usize,
    lead: usize,
) -> Result<()> {
    to_space(
        rec,
        src,
        from,
        out,
        at,
        (ft, 2),
        (lead, Order::Interleave, false),
    )
}

/// Output frames of channels to space with time factor `ft` over `n`
/// source frames of which the first `lead` are first chunks.
pub fn frames_out(n: usize, ft: usize, lead: usize) -> usize {
    let lead = lead.min(n);
    lead + ft * (n - lead)
}

/// PyTorch's `pixel_shuffle` by `factor` of the window at `from` of the
/// whole image's `[N, CO·f², H, W]` into `out` `[N, CO, OH, OW]`, the window
/// at `at` of `[N, CO, H·f, W·f]` (covering windows as [`dup_up`]).
pub fn pixel_shuffle(
    rec: &mut Recorder,
    src: &Tensor,
    from: (usize, usize),
    out: &Tensor,
    at: (usize, usize),
    factor: usize,
) -> Result<()> {
    let ci = src.shape().get(1).copied().unwrap_or(0);
    if out.shape().get(1) != Some(&shuffled_channels(ci, factor)?) {
        return Err(Error::shape(
            "pixel_shuffle",
            format!(
                "{src:?} → {out:?}: a pixel shuffle by {factor} gives {ci} / {factor}² channels"
            ),
        ));
    }
    let n = src.shape().first().copied().unwrap_or(0);
    to_space(
        rec,
        src,
        from,
        out,
        at,
        (1, factor),
        (n, Order::Interleave, false),
    )
}

/// Channels a pixel shuffle by `factor` leaves of `c`.
pub fn shuffled_channels(c: usize, factor: usize) -> Result<usize> {
    let p2 = factor * factor;
    if p2 == 0 || !c.is_multiple_of(p2) {
        return Err(Error::shape(
            "pixel_shuffle",
            format!("{c} channels do not pixel-shuffle by {factor}: they must be a multiple of {factor}² = {p2}"),
        ));
    }
    Ok(c / p2)
}

/// Channels to space with time factor `ft` and space factor `f` (see the
/// shader): [`dup_up`] is `(ft, 2)`, [`pixel_shuffle`] `(1, f)`; the first
/// `lead` source frames are first chunks (see [`dup_up_video`]), `order`
/// which channel each output channel reads; `add`: the result is added to
/// what `out` holds (a shortcut summed in the same pass).
pub fn to_space(
    rec: &mut Recorder,
    src: &Tensor,
    (sy, sx): (usize, usize),
    out: &Tensor,
    (oy, ox): (usize, usize),
    (ft, f): (usize, usize),
    (lead, order, add): (usize, Order, bool),
) -> Result<()> {
    const OP: &str = "dup_up";
    let dims = |t: &Tensor| dims4(OP, t);
    let [n, ci, sh, sw] = dims(src)?;
    let [on, co, oh, ow] = dims(out)?;
    let factor = co * ft.max(1) * f * f;
    if lead > n
        || on != frames_out(n, ft, lead)
        || ci == 0
        || co == 0
        || ft == 0
        || f == 0
        || !factor.is_multiple_of(ci)
        || src.dtype() != out.dtype()
    {
        return Err(Error::shape(
            OP,
            format!("src {src:?} → out {out:?} (time factor {ft}, space factor {f}, {lead} first-chunk frames, {order:?}): {} output frames, the same dtype, out channels · {ft} · {f}² a multiple of src channels, DCAE channels within the source", frames_out(n, ft, lead)),
        ));
    }
    let covers = oh == 0
        || ow == 0
        || (sy <= oy / f
            && sx <= ox / f
            && (oy + oh - 1) / f < sy + sh
            && (ox + ow - 1) / f < sx + sw);
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
    let u = |v: usize| to_u32(OP, v);
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
        f: u(f)?,
        lead: u(lead)?,
        order: match order {
            Order::Interleave => 0,
            Order::Dcae(_) => 1,
            Order::Tile(_) => 2,
        },
        g_first: u(if let Order::Dcae(d) = order {
            d.first.0
        } else {
            0
        })?,
        r_first: u(if let Order::Dcae(d) = order {
            d.first.1
        } else {
            1
        })?,
        g_next: u(match order {
            Order::Dcae(d) => d.next.0,
            Order::Tile(g) => g,
            Order::Interleave => 0,
        })?,
        r_next: u(if let Order::Dcae(d) = order {
            d.next.1
        } else {
            1
        })?,
        add: u32::from(add),
        _pad: [0; 2],
    };
    let groups = linear_groups(rec.ctx(), (total as u64).div_ceil(WG as u64))?;
    let st = storage_of(rec, &[("src", src)])?;
    let t = st.first().map(|s| s.1).unwrap_or(StorageType::F32);
    rec.dispatch(&DUP_UP, &key(t), &params, &[src, out], groups, 0)
}

/// CPU reference of [`dup_up`] on whole images: `src` `[n, ci, h, w]` →
/// `[n, co, 2h, 2w]`.
pub fn cpu_dup_up(src: &[f32], [n, ci, h, w]: [usize; 4], co: usize, ft: usize) -> Vec<f32> {
    cpu_dup_up_video(src, [n, ci, h, w], co, ft, n)
}

/// CPU reference of [`dup_up_video`], written as `DupUp3D` is (repeat
/// channels, view `[co, ft, 2, 2, T, H, W]`, permute to `[co, T, ft, H, 2,
/// W, 2]`, the first chunk's earlier sub-frames dropped), frames first:
/// `[n, ci, h, w]` → `[lead + ft·(n − lead), co, 2h, 2w]`.
pub fn cpu_dup_up_video(
    src: &[f32],
    [n, ci, h, w]: [usize; 4],
    co: usize,
    ft: usize,
    lead: usize,
) -> Vec<f32> {
    let repeats = co * ft * 4 / ci;
    let (oh, ow) = (2 * h, 2 * w);
    let mut out = Vec::with_capacity(frames_out(n, ft, lead) * co * oh * ow);
    for t in 0..n {
        let subs = if t < lead { ft - 1..ft } else { 0..ft };
        for dt in subs {
            for o in 0..co {
                for y in 0..oh {
                    for x in 0..ow {
                        let c = source_channel(o, (ft, dt), repeats, y % 2, x % 2);
                        out.push(src[((t * ci + c) * h + y / 2) * w + x / 2]);
                    }
                }
            }
        }
    }
    out
}

/// CPU reference of the DCAE order ([`Dcae`]) by 2, written as diffusers'
/// `HunyuanVideo15Upsample` is (view `[r1, 2, 2, G]` of the channels,
/// permute to `[G, T, r1, H, 2, W, 2]`, a `repeat_interleave` by R before
/// it): `src` `[n, ci, h, w]` → `[lead + ft·(n − lead), co, 2h, 2w]`.
pub fn cpu_dcae(
    src: &[f32],
    [n, ci, h, w]: [usize; 4],
    co: usize,
    ft: usize,
    (lead, d): (usize, Dcae),
) -> Vec<f32> {
    let (oh, ow) = (2 * h, 2 * w);
    let mut out = Vec::with_capacity(frames_out(n, ft, lead) * co * oh * ow);
    for t in 0..n {
        let first = t < lead;
        for dt in 0..if first { 1 } else { ft } {
            for o in 0..co {
                for y in 0..oh {
                    for x in 0..ow {
                        let sub = (y % 2) * 2 + x % 2;
                        let c = if first {
                            (sub * d.first.0 + o) / d.first.1
                        } else {
                            ((dt * 4 + sub) * d.next.0 + o) / d.next.1
                        };
                        out.push(src[((t * ci + c) * h + y / 2) * w + x / 2]);
                    }
                }
            }
        }
    }
    out
}

/// CPU reference of [`pixel_shuffle`] on whole images, as PyTorch writes
/// it (`[T, C·p², H, W]` → view `[T, C, p, p, H, W]` → permute to
/// `[T, C, H, p, W, p]`): `x` `[t, c·p², h, w]` → `[t, c, h·p, w·p]`.
pub fn cpu_pixel_shuffle(x: &[f32], [t, c, h, w]: [usize; 4], p: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for f in 0..t {
        for ch in 0..c {
            for y in 0..h {
                for i in 0..p {
                    for xx in 0..w {
                        for j in 0..p {
                            let src_c = (ch * p + i) * p + j;
                            out.push(x[((f * c * p * p + src_c) * h + y) * w + xx]);
                        }
                    }
                }
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let shuffle = StorageType::ALL.iter().map(|t| (DUP_UP, key(*t)));
    let unshuffle = StorageType::ALL
        .iter()
        .map(|t| (PIXEL_UNSHUFFLE, unshuffle_key(*t)));
    shuffle.chain(unshuffle).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::rand_vec;

    /// PyTorch's order (channel `c·f² + dy·f + dx`), on a case worked by
    /// hand and on odd shapes in every storage type against the inverse
    /// index map, and bad shapes refused.
    #[test]
    fn pixel_unshuffle_matches_pytorch_order() {
        let ctx = crate::testing::test_context();
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let src = Tensor::from_f32(&ctx, &[1, 1, 2, 4], &x, "x").unwrap();
        let out = Tensor::empty(&ctx, &[1, 4, 1, 2], crate::tensor::DType::F32, "o").unwrap();
        let mut rec = Recorder::new(&ctx);
        pixel_unshuffle(&mut rec, &src, 2, &out).unwrap();
        rec.submit().unwrap();
        // Out channel i·2 + j holds x[2y + i][2x + j].
        assert_eq!(
            out.to_f32(&ctx).unwrap(),
            vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
        );
        let (n, c, h, w, f) = (3, 3, 5, 7, 3);
        let data: Vec<f32> = rand_vec(n * c * h * f * w * f, 4, 2.0)
            .iter()
            .map(|v| (v * 64.0).round() / 64.0)
            .collect();
        let mut want = vec![0.0; data.len()];
        for b in 0..n {
            for ch in 0..c {
                for y in 0..h * f {
                    for xx in 0..w * f {
                        let o = ch * f * f + (y % f) * f + xx % f;
                        want[((b * c * f * f + o) * h + y / f) * w + xx / f] =
                            data[((b * c + ch) * h * f + y) * w * f + xx];
                    }
                }
            }
        }
        for (ctx, dt) in crate::testing::dtype_contexts() {
            let src = Tensor::from_f32_as(&ctx, &[n, c, h * f, w * f], &data, dt, "x").unwrap();
            let out = Tensor::empty(&ctx, &[n, c * f * f, h, w], dt, "o").unwrap();
            let mut rec = Recorder::new(&ctx);
            pixel_unshuffle(&mut rec, &src, f, &out).unwrap();
            rec.submit().unwrap();
            assert_eq!(out.to_f32(&ctx).unwrap(), want, "{dt:?}");
            let bad = Tensor::empty(&ctx, &[n, c * f * f, h, w + 1], dt, "bad").unwrap();
            let mut rec = Recorder::new(&ctx);
            assert!(pixel_unshuffle(&mut rec, &src, f, &bad).is_err());
        }
    }

    /// Output windows of `kernel` (channels to space by `f`): `data`
    /// `[n, ci, h, w]` whole, then the output window `(oy, ox, oh, ow)` from
    /// the source window under it, each bit-equal to `want` `[n, co, h·f,
    /// w·f]` (its window: a copy).
    fn check_windows(
        (ctx, dt): (&crate::gpu::Context, crate::tensor::DType),
        (data, [n, ci, h, w]): (&[f32], [usize; 4]),
        (want, co, f): (&[f32], usize, usize),
        (oy, ox, oh, ow): (usize, usize, usize, usize),
        kernel: impl Fn(&mut Recorder, &Tensor, (usize, usize), &Tensor, (usize, usize)) -> Result<()>,
        what: &str,
    ) {
        let (hf, wf) = (h * f, w * f);
        let src = Tensor::from_f32_as(ctx, &[n, ci, h, w], data, dt, "src").unwrap();
        let out = Tensor::empty(ctx, &[n, co, hf, wf], dt, "out").unwrap();
        let mut rec = Recorder::new(ctx);
        kernel(&mut rec, &src, (0, 0), &out, (0, 0)).unwrap();
        rec.submit().unwrap();
        assert_eq!(out.to_f32(ctx).unwrap(), want, "{dt:?} {what}");
        let (sy, sx) = (oy / f, ox / f);
        let (sh, sw) = ((oy + oh).div_ceil(f) - sy, (ox + ow).div_ceil(f) - sx);
        let mut part = vec![0.0; n * ci * sh * sw];
        let copy = crate::kernels::tensor_ops::cpu_copy_window;
        copy(
            data,
            (h, w),
            (sy, sx),
            &mut part,
            (sh, sw),
            (0, 0),
            (sh, sw),
            n * ci,
        );
        let src = Tensor::from_f32_as(ctx, &[n, ci, sh, sw], &part, dt, "src").unwrap();
        let out = Tensor::empty(ctx, &[n, co, oh, ow], dt, "out").unwrap();
        let mut rec = Recorder::new(ctx);
        kernel(&mut rec, &src, (sy, sx), &out, (oy, ox)).unwrap();
        rec.submit().unwrap();
        let mut want_win = vec![0.0; n * co * oh * ow];
        copy(
            want,
            (hf, wf),
            (oy, ox),
            &mut want_win,
            (oh, ow),
            (0, 0),
            (oh, ow),
            n * co,
        );
        assert_eq!(out.to_f32(ctx).unwrap(), want_win, "{dt:?} {what} window");
    }

    /// Whole images and windows at odd offsets (rows 3..9, columns 5..12
    /// from source rows 1..5, columns 2..6), both time factors, every
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
                check_windows(
                    (&ctx, dt),
                    (&data, [n, ci, h, w]),
                    (&want, co, 2),
                    (3, 5, 6, 7),
                    |rec, src, from, out, at| dup_up(rec, src, from, out, at, ft),
                    &format!("{ci}->{co} ft {ft}"),
                );
            }
        }
    }

    /// DupUp3D's order on one known case (8 channels to 1, ft 2, a 1×1
    /// frame): frame `dt`, pixel `(a, b)` holds channel `dt·4 + a·2 + b`; a
    /// first chunk keeps frame 1 only.
    #[test]
    fn cpu_dup_up_video_matches_dupup3d_order() {
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let all: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(cpu_dup_up_video(&x, [1, 8, 1, 1], 1, 2, 0), all);
        assert_eq!(cpu_dup_up_video(&x, [1, 8, 1, 1], 1, 2, 1), all[4..]);
    }

    /// Video frames (a first chunk or not, time factors 1 and 2) on odd
    /// shapes, whole and on a window at odd offsets, every storage type:
    /// bit-equal to the CPU reference.
    #[test]
    fn dup_up_video_matches_cpu_whole_and_windowed() {
        let copy = crate::kernels::tensor_ops::cpu_copy_window;
        for (ctx, dt) in crate::testing::dtype_contexts() {
            for (ci, co, ft, lead) in [(8, 8, 2, 1), (8, 8, 2, 0), (6, 3, 2, 1), (8, 4, 1, 1)] {
                let (n, h, w) = (3, 5, 7);
                let data: Vec<f32> = rand_vec(n * ci * h * w, 5, 2.0)
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let want = cpu_dup_up_video(&data, [n, ci, h, w], co, ft, lead);
                let no = frames_out(n, ft, lead);
                let what = format!("{dt:?} {ci}->{co} ft {ft} lead {lead}");
                let src = Tensor::from_f32_as(&ctx, &[n, ci, h, w], &data, dt, "src").unwrap();
                let out = Tensor::empty(&ctx, &[no, co, 2 * h, 2 * w], dt, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                dup_up_video(&mut rec, &src, (0, 0), &out, (0, 0), ft, lead).unwrap();
                rec.submit().unwrap();
                assert_eq!(out.to_f32(&ctx).unwrap(), want, "{what}");
                // Output rows 3..9, columns 5..12 from source rows 1..5, columns 2..6.
                let ((oy, ox, oh, ow), (sy, sx, sh, sw)) = ((3, 5, 6, 7), (1, 2, 4, 4));
                let mut part = vec![0.0; n * ci * sh * sw];
                copy(
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
                let out = Tensor::empty(&ctx, &[no, co, oh, ow], dt, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                dup_up_video(&mut rec, &src, (sy, sx), &out, (oy, ox), ft, lead).unwrap();
                rec.submit().unwrap();
                let mut want_win = vec![0.0; no * co * oh * ow];
                let full = (2 * h, 2 * w);
                copy(
                    &want,
                    full,
                    (oy, ox),
                    &mut want_win,
                    (oh, ow),
                    (0, 0),
                    (oh, ow),
                    no * co,
                );
                assert_eq!(out.to_f32(&ctx).unwrap(), want_win, "{what} window");
            }
        }
    }

    /// `add`: the map is summed into what `out` holds (a residual), in
    /// every storage type, DCAE order, a first-chunk frame and later ones.
    #[test]
    fn to_space_adds_into_a_residual() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            let (n, ci, h, w, co, ft, lead) = (3, 16, 3, 5, 2, 2, 1);
            let round = |v: Vec<f32>| -> Vec<f32> {
                v.into_iter()
                    .map(|x| crate::gpu::storage::round_through(x, dt))
                    .collect()
            };
            let data = round(rand_vec(n * ci * h * w, 11, 1.0));
            let d = Dcae {
                first: (2 * co, 1),
                next: (co, 1),
            };
            let map = cpu_dcae(&data, [n, ci, h, w], co, ft, (lead, d));
            let base = round(rand_vec(map.len(), 12, 1.0));
            let no = frames_out(n, ft, lead);
            let src = Tensor::from_f32_as(&ctx, &[n, ci, h, w], &data, dt, "src").unwrap();
            let out = Tensor::from_f32_as(&ctx, &[no, co, 2 * h, 2 * w], &base, dt, "out").unwrap();
            let mut rec = Recorder::new(&ctx);
            let order = (lead, Order::Dcae(d), true);
            to_space(&mut rec, &src, (0, 0), &out, (0, 0), (ft, 2), order).unwrap();
            rec.submit().unwrap();
            let want: Vec<f32> = map.iter().zip(&base).map(|(a, b)| a + b).collect();
            crate::testing::assert_close(
                &out.to_f32(&ctx).unwrap(),
                &want,
                1e-6,
                1e-2,
                &format!("{dt:?}"),
            );
        }
    }

    /// PyTorch's order on one known case: one frame, one output channel,
    /// p = 2, a 1×2 input: out[y][x] = in[(y % 2)·2 + x % 2][0][x / 2].
    #[test]
    fn cpu_pixel_shuffle_matches_pytorch_order() {
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect(); // [1, 4, 1, 2]
        let y = cpu_pixel_shuffle(&x, [1, 1, 1, 2], 2);
        assert_eq!(y, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
    }

    /// Pixel shuffles by 2, 3 and 4 of odd shapes, whole and on a window at
    /// odd offsets, every storage type: bit-equal to the CPU reference.
    #[test]
    fn pixel_shuffle_matches_cpu_whole_and_windowed() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            for (p, c) in [(2, 3), (3, 1), (4, 3)] {
                let (t, h, w) = (3, 5, 7);
                let ci = c * p * p;
                let data: Vec<f32> = rand_vec(t * ci * h * w, 9, 2.0)
                    .into_iter()
                    .map(|v| crate::gpu::storage::round_through(v, dt))
                    .collect();
                let want = cpu_pixel_shuffle(&data, [t, c, h, w], p);
                check_windows(
                    (&ctx, dt),
                    (&data, [t, ci, h, w]),
                    (&want, c, p),
                    (3, 5, 2 * p + 1, 3 * p - 1),
                    |rec, src, from, out, at| pixel_shuffle(rec, src, from, out, at, p),
                    &format!("p {p}"),
                );
            }
        }
    }

    /// Channels that are not the output's times p² are refused.
    #[test]
    fn pixel_shuffle_refuses_wrong_channels() {
        let ctx = crate::testing::test_context();
        let out = Tensor::empty(&ctx, &[1, 3, 4, 4], crate::tensor::DType::F32, "out").unwrap();
        for (ci, says) in [(8, "gives 8 / 2²"), (6, "multiple of 2²")] {
            let data = vec![0.0; ci * 4];
            let src = Tensor::from_f32(&ctx, &[1, ci, 2, 2], &data, "src").unwrap();
            let mut rec = Recorder::new(&ctx);
            let e = pixel_shuffle(&mut rec, &src, (0, 0), &out, (0, 0), 2).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
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
