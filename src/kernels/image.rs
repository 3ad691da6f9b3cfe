//! `shaders/image.wgsl`: decoder output to packed RGBA8 on the GPU, with the
//! exact rounding diffusers uses (numpy's round-half-to-even).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{linear_groups, BindingKind, KernelSpec, PipelineKey, Recorder};
use crate::kernels::elementwise::storage_type;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/image.wgsl");
/// Invocations (pixels) per workgroup.
pub const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    pub plane: u32,
    pub _pad: [u32; 3],
}

pub const TO_RGBA8: KernelSpec = KernelSpec {
    family: "image",
    source: SOURCE,
    entry: "to_rgba8",
    bindings: &[BindingKind::Read, BindingKind::ReadWrite],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// The value range a decoder outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageRange {
    /// diffusers: round(clamp(x/2+0.5, 0, 1)*255)
    MinusOneToOne,
    /// TAE decoders: round(clamp(x, 0, 1)*255)
    ZeroToOne,
}

impl ImageRange {
    fn code(self) -> u32 {
        match self {
            ImageRange::MinusOneToOne => 0,
            ImageRange::ZeroToOne => 1,
        }
    }

    /// CPU reference of one channel value, in f32 and in diffusers' order:
    /// `x / 2 + 0.5`, clamp, `* 255`, round half to even.
    pub fn to_byte(self, x: f32) -> u8 {
        let unit = match self {
            ImageRange::MinusOneToOne => (x / 2.0 + 0.5).clamp(0.0, 1.0),
            ImageRange::ZeroToOne => x.clamp(0.0, 1.0),
        };
        (unit * 255.0).round_ties_even() as u8
    }
}

fn key(dtype: DType, range: ImageRange) -> Result<PipelineKey> {
    Ok(PipelineKey::new(&TO_RGBA8)
        .flag_if(dtype == DType::F16, "F16")
        .alias("T", storage_type(dtype)?)
        .constant("WG", format!("{WG}u"))
        .constant("RANGE", format!("{}u", range.code())))
}

/// x `[N, 3, H, W]` (f32 or f16) → out `[N, H, W]` tensor of `DType::Rgba8`
/// (one u32 per pixel, R in the low byte, alpha = 255). NaN inputs give
/// unspecified bytes.
pub fn to_rgba8(rec: &mut Recorder, x: &Tensor, range: ImageRange, out: &Tensor) -> Result<()> {
    const OP: &str = "to_rgba8";
    let [n, c, h, w] = match *x.shape() {
        [n, c, h, w] => [n, c, h, w],
        _ => {
            return Err(Error::shape(
                OP,
                format!("x must be [N, 3, H, W], got {x:?}"),
            ))
        }
    };
    crate::kernels::group_norm::check_activation_dtype(rec, OP, x)?;
    if c != 3 {
        return Err(Error::shape(
            OP,
            format!("x must have 3 channels, got {x:?}"),
        ));
    }
    if out.shape() != [n, h, w] || out.dtype() != DType::Rgba8 {
        return Err(Error::shape(
            OP,
            format!("out must be an rgba8 [{n}, {h}, {w}] tensor, got {out:?}"),
        ));
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::shape(OP, format!("{x:?} exceeds u32 indexing")));
    }
    let plane = h * w;
    let mut groups = linear_groups(rec.ctx(), (plane as u64).div_ceil(WG as u64))?;
    if n > rec.ctx().caps().max_compute_workgroups_per_dimension as usize {
        return Err(Error::DispatchTooLarge {
            what: format!("{OP} over {n} images"),
            groups: n as u64,
            limit: rec.ctx().caps().max_compute_workgroups_per_dimension,
        });
    }
    groups[2] = n as u32;
    let params = Params {
        plane: plane as u32,
        _pad: [0; 3],
    };
    rec.dispatch(
        &TO_RGBA8,
        &key(x.dtype(), range)?,
        &params,
        &[x, out],
        groups,
        0,
    )
}

/// CPU reference: x `[N, 3, H, W]` → RGBA bytes `[N, H, W, 4]`.
pub fn cpu_to_rgba8(x: &[f32], n: usize, h: usize, w: usize, range: ImageRange) -> Vec<u8> {
    let plane = h * w;
    let mut out = Vec::with_capacity(n * plane * 4);
    for b in 0..n {
        for i in 0..plane {
            for ch in 0..3 {
                out.push(range.to_byte(x[(b * 3 + ch) * plane + i]));
            }
            out.push(255);
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for dtype in [DType::F32, DType::F16] {
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            v.push((TO_RGBA8, key(dtype, range).expect("supported dtype")));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{rand_vec, test_context};

    fn gpu(
        ctx: &crate::Context,
        data: &[f32],
        n: usize,
        h: usize,
        w: usize,
        range: ImageRange,
    ) -> Vec<u8> {
        let x = Tensor::from_f32(ctx, &[n, 3, h, w], data, "x").unwrap();
        let out = Tensor::empty(ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
        let mut rec = Recorder::new(ctx);
        to_rgba8(&mut rec, &x, range, &out).unwrap();
        rec.submit().unwrap();
        out.to_bytes(ctx).unwrap()
    }

    #[test]
    fn cpu_reference_rounds_half_to_even_like_numpy() {
        // numpy: np.float32([0.5, 1.5, 2.5, 254.5]).round() == [0, 2, 2, 254]
        for (k, want) in [(0.5f32, 0u8), (1.5, 2), (2.5, 2), (254.5, 254)] {
            assert_eq!(k.round_ties_even() as u8, want);
        }
        // MinusOneToOne: x = 0 -> 0.5 * 255 = 127.5 exactly -> 128 (even).
        assert_eq!(ImageRange::MinusOneToOne.to_byte(0.0), 128);
        assert_eq!(ImageRange::MinusOneToOne.to_byte(-1.0), 0);
        assert_eq!(ImageRange::MinusOneToOne.to_byte(1.0), 255);
    }

    /// Exact byte equality (no tolerance) with the CPU reference, including
    /// values whose f32 product with 255 is exactly k + 0.5.
    #[test]
    fn rgba8_matches_cpu_exactly_including_halves() {
        let ctx = test_context();
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            for (n, h, w) in [(1, 7, 5), (2, 19, 23)] {
                let len = n * 3 * h * w;
                let mut data = rand_vec(len, 77, 1.3);
                // Exact halves: x with f32(x * 255) == k + 0.5 (in unit space).
                let mut halves = Vec::new();
                for k in 0..255u32 {
                    let unit = (k as f32 + 0.5) / 255.0;
                    if unit * 255.0 == k as f32 + 0.5 {
                        halves.push(match range {
                            ImageRange::ZeroToOne => unit,
                            // x / 2 + 0.5 == unit exactly when x = 2 * (unit - 0.5) is exact.
                            ImageRange::MinusOneToOne => (unit - 0.5) * 2.0,
                        });
                    }
                }
                assert!(halves.len() > 20, "few exact halves: {}", halves.len());
                for (d, v) in data
                    .iter_mut()
                    .zip(halves.iter().chain([-5.0, 5.0, 0.0, 1.0, -1.0].iter()))
                {
                    *d = *v;
                }
                let got = gpu(&ctx, &data, n, h, w, range);
                let want = cpu_to_rgba8(&data, n, h, w, range);
                assert_eq!(got.len(), want.len());
                for (i, (g, wv)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g,
                        wv,
                        "{range:?} {n}x{h}x{w}: byte {i} (pixel {}) from input",
                        i / 4
                    );
                }
            }
        }
    }

    #[test]
    fn exact_half_cases_round_to_even() {
        // Inputs whose f32 product with 255 is exactly k + 0.5 must give the
        // even neighbour on the GPU (WGSL round() is round-half-to-even).
        let ctx = test_context();
        let r = ImageRange::ZeroToOne;
        let mut data = Vec::new();
        let mut expected = Vec::new();
        for k in [0u32, 1, 2, 3, 126, 127, 253, 254] {
            let unit = (k as f32 + 0.5) / 255.0;
            if unit * 255.0 == k as f32 + 0.5 {
                data.push(unit);
                expected.push(if k % 2 == 0 { k } else { k + 1 } as u8);
            }
        }
        assert!(!expected.is_empty());
        let w = data.len();
        let mut planar = data.clone();
        planar.extend(&data);
        planar.extend(&data);
        let got = gpu(&ctx, &planar, 1, 1, w, r);
        for (i, e) in expected.iter().enumerate() {
            assert_eq!(
                &got[i * 4..i * 4 + 4],
                &[*e, *e, *e, 255],
                "value {}",
                data[i]
            );
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[1, 4, 5, 5], DType::F32, "x").unwrap();
        let out = Tensor::empty(&ctx, &[1, 5, 5], DType::Rgba8, "o").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &out),
            Err(Error::Shape { .. })
        ));
        let x = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::F32, "x").unwrap();
        let wrong = Tensor::empty(&ctx, &[1, 5, 5], DType::F32, "o").unwrap();
        assert!(matches!(
            to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &wrong),
            Err(Error::Shape { .. })
        ));
        let wrong = Tensor::empty(&ctx, &[1, 5, 6], DType::Rgba8, "o").unwrap();
        assert!(matches!(
            to_rgba8(&mut rec, &x, ImageRange::ZeroToOne, &wrong),
            Err(Error::Shape { .. })
        ));
        let xr = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::Rgba8, "xr").unwrap();
        assert!(matches!(
            to_rgba8(&mut rec, &xr, ImageRange::ZeroToOne, &out),
            Err(Error::Shape { .. })
        ));
    }
}
