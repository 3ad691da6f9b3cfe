//! `shaders/image.wgsl`: decoder output to packed RGBA8 on the GPU, with the
//! exact rounding diffusers uses (numpy's round-half-to-even), into a tensor
//! ([`to_rgba8`]) or straight into a storage texture ([`to_texture`]).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite, WriteTexture};
use crate::gpu::{
    linear_groups, Binding, BindingKind, KernelSpec, PipelineKey, Recorder, StorageType,
};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/image.wgsl");
/// Invocations (pixels) per workgroup.
pub const WG: u32 = 256;

/// Uniform parameters of both entry points (16 bytes, as in the shader).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    /// H * W
    pub plane: u32,
    /// W (used by `to_texture`)
    pub width: u32,
    /// N (used by `to_rgb8`)
    pub images: u32,
    /// Output words (used by `to_rgb8`)
    pub words: u32,
}

/// `to_rgba8`: packed RGBA8 into a tensor.
pub const TO_RGBA8: KernelSpec = spec::<Params>("image", SOURCE, "to_rgba8", &[Read, ReadWrite]);

/// `to_rgb8`: the RGB8 byte stream packed 4 bytes per u32 word.
pub const TO_RGB8: KernelSpec = spec::<Params>("image", SOURCE, "to_rgb8", &[Read, ReadWrite]);

/// `to_texture` into an `Rgba8Unorm` storage texture: the bytes of [`to_rgba8`].
pub const TO_TEXTURE_RGBA8: KernelSpec = spec::<Params>(
    "image",
    SOURCE,
    "to_texture",
    &[Read, WriteTexture(wgpu::TextureFormat::Rgba8Unorm)],
);

/// `to_texture` into an `Rgba16Float` storage texture: clamped values in [0, 1]
/// before quantisation.
pub const TO_TEXTURE_RGBA16F: KernelSpec = spec::<Params>(
    "image",
    SOURCE,
    "to_texture",
    &[Read, WriteTexture(wgpu::TextureFormat::Rgba16Float)],
);

/// Texture formats [`to_texture`] writes as storage textures.
pub const STORAGE_TEXTURE_FORMATS: [wgpu::TextureFormat; 2] = [
    wgpu::TextureFormat::Rgba8Unorm,
    wgpu::TextureFormat::Rgba16Float,
];

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

    /// CPU reference of one channel value in [0, 1] before quantisation:
    /// `x / 2 + 0.5` (diffusers' order) or `x`, clamped.
    pub fn to_unit(self, x: f32) -> f32 {
        match self {
            ImageRange::MinusOneToOne => (x / 2.0 + 0.5).clamp(0.0, 1.0),
            ImageRange::ZeroToOne => x.clamp(0.0, 1.0),
        }
    }

    /// CPU reference of one channel value, in f32 and in diffusers' order:
    /// `x / 2 + 0.5`, clamp, `* 255`, round half to even.
    pub fn to_byte(self, x: f32) -> u8 {
        (self.to_unit(x) * 255.0).round_ties_even() as u8
    }
}

fn key(x: StorageType, range: ImageRange) -> PipelineKey {
    PipelineKey::new(&TO_RGBA8)
        .storage("x", x)
        .constant("WG", format!("{WG}u"))
        .constant("RANGE", format!("{}u", range.code()))
}

/// `[N, H, W]` and the storage type of an image-output kernel's input x
/// `[N, 3, H, W]`.
fn rgb_input(rec: &Recorder, op: &str, x: &Tensor) -> Result<([usize; 3], StorageType)> {
    let [n, c, h, w] = match *x.shape() {
        [n, c, h, w] => [n, c, h, w],
        _ => {
            return Err(Error::shape(
                op,
                format!("x must be [N, 3, H, W], got {x:?}"),
            ))
        }
    };
    let storage = crate::kernels::group_norm::activation_storage(rec, op, x)?;
    if c != 3 {
        return Err(Error::shape(
            op,
            format!("x must have 3 channels, got {x:?}"),
        ));
    }
    Ok(([n, h, w], storage))
}

/// x `[N, 3, H, W]` (f32 or f16) → out `[N, H, W]` tensor of `DType::Rgba8`
/// (one u32 per pixel, R in the low byte, alpha = 255). A pixel with a NaN
/// or infinite channel gets alpha 0 (and unspecified RGB bytes): count them
/// with [`count_non_finite`].
pub fn to_rgba8(rec: &mut Recorder, x: &Tensor, range: ImageRange, out: &Tensor) -> Result<()> {
    const OP: &str = "to_rgba8";
    let ([n, h, w], x_storage) = rgb_input(rec, OP, x)?;
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
        width: w as u32,
        images: 0,
        words: 0,
    };
    rec.dispatch(
        &TO_RGBA8,
        &key(x_storage, range),
        &params,
        &[x, out],
        groups,
        0,
    )
}

fn rgb8_key(x: StorageType, range: ImageRange) -> PipelineKey {
    PipelineKey::new(&TO_RGB8)
        .flag("RGB8")
        .storage("x", x)
        .constant("WG", format!("{WG}u"))
        .constant("RANGE", format!("{}u", range.code()))
}

/// u32 words holding the RGB8 bytes of `n` images of `h x w` (3 bytes per pixel).
pub fn rgb8_words(n: usize, h: usize, w: usize) -> usize {
    (n * h * w * 3).div_ceil(4)
}

/// x `[N, 3, H, W]` (f32, f16 or bf16) → out, a `DType::Rgba8` tensor of shape
/// `[rgb8_words(N, H, W)]` holding the RGB8 bytes of all images back to back
/// (R, G, B per pixel, row-major, image after image), 4 bytes per u32 word,
/// little-endian; unused bytes of the last word are 0. Same rounding as [`to_rgba8`].
pub fn to_rgb8(rec: &mut Recorder, x: &Tensor, range: ImageRange, out: &Tensor) -> Result<()> {
    const OP: &str = "to_rgb8";
    let ([n, h, w], x_storage) = rgb_input(rec, OP, x)?;
    let words = rgb8_words(n, h, w);
    if out.shape() != [words] || out.dtype() != DType::Rgba8 {
        return Err(Error::shape(
            OP,
            format!("out must be an rgba8 [{words}] tensor (packed RGB8 bytes), got {out:?}"),
        ));
    }
    if n * h * w * 3 > u32::MAX as usize {
        return Err(Error::shape(OP, format!("{x:?} exceeds u32 indexing")));
    }
    let groups = linear_groups(rec.ctx(), (words as u64).div_ceil(WG as u64))?;
    let params = Params {
        plane: (h * w) as u32,
        width: w as u32,
        images: n as u32,
        words: words as u32,
    };
    rec.dispatch(
        &TO_RGB8,
        &rgb8_key(x_storage, range),
        &params,
        &[x, out],
        groups,
        0,
    )
}

/// CPU reference of [`to_rgb8`]'s bytes: x `[N, 3, H, W]` → RGB bytes `[N, H, W, 3]`.
pub fn cpu_to_rgb8(x: &[f32], n: usize, h: usize, w: usize, range: ImageRange) -> Vec<u8> {
    let plane = h * w;
    let mut out = Vec::with_capacity(n * plane * 3);
    for b in 0..n {
        for i in 0..plane {
            for ch in 0..3 {
                out.push(range.to_byte(x[(b * 3 + ch) * plane + i]));
            }
        }
    }
    out
}

fn texture_spec(format: wgpu::TextureFormat) -> Option<KernelSpec> {
    match format {
        wgpu::TextureFormat::Rgba8Unorm => Some(TO_TEXTURE_RGBA8),
        wgpu::TextureFormat::Rgba16Float => Some(TO_TEXTURE_RGBA16F),
        _ => None,
    }
}

fn texture_key(spec: &KernelSpec, x: StorageType, range: ImageRange) -> PipelineKey {
    let rgba16f = matches!(
        spec.bindings.last(),
        Some(BindingKind::WriteTexture(wgpu::TextureFormat::Rgba16Float))
    );
    PipelineKey::new(spec)
        .flag("TEXTURE")
        .flag_if(rgba16f, "RGBA16F")
        .storage("x", x)
        .constant("WG", format!("{WG}u"))
        .constant("RANGE", format!("{}u", range.code()))
}

/// x `[1, 3, H, W]` (f32 or f16) → texels `(0..W, 0..H)` of mip level 0,
/// array layer 0 of `texture`: a 2-D texture with `STORAGE_BINDING` usage in
/// one of [`STORAGE_TEXTURE_FORMATS`], at least W×H. `Rgba8Unorm` receives
/// exactly the bytes of [`to_rgba8`]; `Rgba16Float` the clamped values in
/// [0, 1] before quantisation. Both are the decoder's sRGB-encoded pixel
/// values (not linear light), alpha 1 (0 for a pixel with a non-finite channel).
pub fn to_texture(
    rec: &mut Recorder,
    x: &Tensor,
    range: ImageRange,
    texture: &wgpu::Texture,
) -> Result<()> {
    const OP: &str = "to_texture";
    let ([n, h, w], x_storage) = rgb_input(rec, OP, x)?;
    if n != 1 {
        return Err(Error::shape(
            OP,
            format!("x must be one 3-channel image [1, 3, H, W], got {x:?}"),
        ));
    }
    let format = texture.format();
    let spec = texture_spec(format).ok_or_else(|| {
        Error::Unsupported(format!(
            "{OP}: a {format:?} storage texture (supported: {STORAGE_TEXTURE_FORMATS:?})"
        ))
    })?;
    if texture.dimension() != wgpu::TextureDimension::D2
        || texture.sample_count() != 1
        || !texture
            .usage()
            .contains(wgpu::TextureUsages::STORAGE_BINDING)
    {
        return Err(Error::Unsupported(format!(
            "{OP}: the texture must be 2-D, single-sampled, with STORAGE_BINDING usage (got {:?}, {} samples, {:?})",
            texture.dimension(),
            texture.sample_count(),
            texture.usage()
        )));
    }
    if (texture.width() as usize) < w || (texture.height() as usize) < h {
        return Err(Error::shape(
            OP,
            format!(
                "a {w}×{h} image does not fit a {}×{} texture",
                texture.width(),
                texture.height()
            ),
        ));
    }
    if x.numel() > u32::MAX as usize {
        return Err(Error::shape(OP, format!("{x:?} exceeds u32 indexing")));
    }
    let plane = h * w;
    let groups = linear_groups(rec.ctx(), (plane as u64).div_ceil(WG as u64))?;
    let params = Params {
        plane: plane as u32,
        width: w as u32,
        images: 0,
        words: 0,
    };
    let view = texture.create_view(&wgpu::TextureViewDescriptor {
        label: Some("wgvae output texture"),
        format: Some(format),
        dimension: Some(wgpu::TextureViewDimension::D2),
        base_mip_level: 0,
        mip_level_count: Some(1),
        base_array_layer: 0,
        array_layer_count: Some(1),
        ..Default::default()
    });
    rec.dispatch_bindings(
        &spec,
        &texture_key(&spec, x_storage, range),
        &params,
        &[Binding::Tensor(x), Binding::Texture(&view)],
        groups,
        0,
    )
}

/// Alpha of a pixel, as the kernels write it: 1 when every channel is
/// finite, 0 when one is NaN or infinite (the mark hosts count, see
/// [`count_non_finite`]).
pub fn cpu_alpha(x: &[f32], plane: usize, image: usize, pixel: usize) -> bool {
    (0..3).all(|ch| x[(image * 3 + ch) * plane + pixel].is_finite())
}

/// CPU reference of the `Rgba16Float` texels of [`to_texture`] before the
/// f16 conversion: x `[1, 3, H, W]` → `[H, W, 4]` values in [0, 1].
pub fn cpu_to_unit_rgba(x: &[f32], h: usize, w: usize, range: ImageRange) -> Vec<f32> {
    let plane = h * w;
    let mut out = Vec::with_capacity(plane * 4);
    for i in 0..plane {
        for ch in 0..3 {
            out.push(range.to_unit(x[ch * plane + i]));
        }
        out.push(if cpu_alpha(x, plane, 0, i) { 1.0 } else { 0.0 });
    }
    out
}

/// CPU reference: x `[N, 3, H, W]` → RGBA bytes `[N, H, W, 4]` (the RGB
/// bytes of a non-finite pixel are unspecified on the GPU).
pub fn cpu_to_rgba8(x: &[f32], n: usize, h: usize, w: usize, range: ImageRange) -> Vec<u8> {
    let plane = h * w;
    cpu_to_rgb8(x, n, h, w, range)
        .chunks_exact(3)
        .enumerate()
        .flat_map(|(p, rgb)| {
            let a = if cpu_alpha(x, plane, p / plane, p % plane) {
                255
            } else {
                0
            };
            [rgb[0], rgb[1], rgb[2], a]
        })
        .collect()
}

/// Pixels of packed RGBA8 bytes ([`to_rgba8`]) marked non-finite (alpha 0).
pub fn count_non_finite(rgba: &[u8]) -> u64 {
    rgba.chunks_exact(4).filter(|p| p[3] == 0).count() as u64
}

/// A 2D texture [`to_texture`] can write and a copy can read.
pub(crate) fn storage_texture(
    device: &wgpu::Device,
    label: &str,
    width: u32,
    height: u32,
    format: wgpu::TextureFormat,
) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    })
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for dtype in StorageType::ALL {
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            v.push((TO_RGBA8, key(dtype, range)));
            v.push((TO_RGB8, rgb8_key(dtype, range)));
            for spec in [TO_TEXTURE_RGBA8, TO_TEXTURE_RGBA16F] {
                let k = texture_key(&spec, dtype, range);
                v.push((spec, k));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{rand_vec, test_context};
    use wgpu::TextureFormat;

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

    /// RGB8 bytes equal the CPU reference exactly, in every storage type, on
    /// sizes whose images end mid-word (3 * H * W not a multiple of 4: words
    /// straddle pixels and images) and whose last word is partial (padded with 0).
    #[test]
    fn rgb8_matches_cpu_exactly_on_odd_sizes() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
                for (n, h, w) in [(1, 7, 5), (2, 19, 23), (3, 1, 1), (2, 3, 5)] {
                    let len = n * 3 * h * w;
                    let data: Vec<f32> = rand_vec(len, 91 + n as u64, 1.3)
                        .into_iter()
                        .map(|v| crate::gpu::storage::round_through(v, dt))
                        .collect();
                    let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
                    let words = rgb8_words(n, h, w);
                    let out = Tensor::empty(&ctx, &[words], DType::Rgba8, "rgb").unwrap();
                    let mut rec = Recorder::new(&ctx);
                    to_rgb8(&mut rec, &x, range, &out).unwrap();
                    rec.submit().unwrap();
                    let got = out.to_bytes(&ctx).unwrap();
                    let want = cpu_to_rgb8(&data, n, h, w, range);
                    let what = format!("{} {range:?} {n}x{h}x{w}", dt.name());
                    assert_eq!(got.len(), words * 4, "{what}");
                    assert_eq!(&got[..want.len()], &want[..], "{what}");
                    assert!(got[want.len()..].iter().all(|&b| b == 0), "{what}: padding");
                    // The same bytes as the RGBA8 kernel without alpha.
                    let rgba = gpu_rgba(&ctx, &x, range);
                    assert_eq!(crate::testing::rgb_of(&rgba), want, "{what}: vs rgba8");
                }
            }
        }
    }

    /// A pixel with a NaN or infinite channel (in any channel, any image,
    /// every storage type) gets alpha 0; every other pixel is exactly the
    /// CPU reference, large finite values included.
    #[test]
    fn non_finite_pixels_get_alpha_zero() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            let (n, h, w) = (2usize, 7usize, 5usize);
            let plane = h * w;
            let mut data = rand_vec(n * 3 * plane, 5, 1.2);
            let big = if dt == DType::F32 { 3.0e38 } else { 60000.0 };
            // (image, channel, pixel, value)
            let marks = [
                (0, 0, 0, f32::NAN),
                (0, 1, 6, f32::INFINITY),
                (0, 2, 34, f32::NEG_INFINITY),
                (1, 2, 17, f32::NAN),
                (1, 0, 3, big),
                (1, 1, 3, -big),
            ];
            for &(b, ch, i, v) in &marks {
                data[(b * 3 + ch) * plane + i] = v;
            }
            let data: Vec<f32> = data
                .iter()
                .map(|&v| crate::gpu::storage::round_through(v, dt))
                .collect();
            let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
            let got = gpu_rgba(&ctx, &x, ImageRange::MinusOneToOne);
            let want = cpu_to_rgba8(&data, n, h, w, ImageRange::MinusOneToOne);
            // f16 uploads saturate infinities (NaN stays NaN): 2 or 4 marked.
            let marked = if dt == DType::F16 { 2 } else { 4 };
            assert_eq!(count_non_finite(&want), marked, "{}: reference", dt.name());
            assert_eq!(count_non_finite(&got), marked, "{}", dt.name());
            for p in 0..n * plane {
                let (g, wv) = (&got[p * 4..p * 4 + 4], &want[p * 4..p * 4 + 4]);
                if wv[3] == 0 {
                    assert_eq!(g[3], 0, "{}: pixel {p} is non-finite", dt.name());
                } else {
                    assert_eq!(g, wv, "{}: pixel {p}", dt.name());
                }
            }
        }
    }

    fn gpu_rgba(ctx: &crate::Context, x: &Tensor, range: ImageRange) -> Vec<u8> {
        let [n, _, h, w] = *x.shape() else {
            unreachable!()
        };
        let out = Tensor::empty(ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
        let mut rec = Recorder::new(ctx);
        to_rgba8(&mut rec, x, range, &out).unwrap();
        rec.submit().unwrap();
        out.to_bytes(ctx).unwrap()
    }

    #[test]
    fn rgb8_rejects_bad_shapes() {
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x").unwrap();
        let r = ImageRange::ZeroToOne;
        let mut rec = Recorder::new(&ctx);
        for shape in [[27usize].as_slice(), &[26], &[1, 7, 5]] {
            let out = Tensor::empty(&ctx, shape, DType::Rgba8, "o").unwrap();
            let ok = to_rgb8(&mut rec, &x, r, &out);
            assert_eq!(ok.is_ok(), shape == [27], "{shape:?}");
        }
        let out = Tensor::empty(&ctx, &[27], DType::F32, "o").unwrap();
        assert!(to_rgb8(&mut rec, &x, r, &out).is_err());
        let x4 = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "x4").unwrap();
        let out = Tensor::empty(&ctx, &[35], DType::Rgba8, "o").unwrap();
        assert!(to_rgb8(&mut rec, &x4, r, &out).is_err());
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

    /// Reads mip 0 / layer 0 of a `COPY_SRC` texture back: tightly packed rows.
    fn read_texture(ctx: &crate::Context, tex: &wgpu::Texture) -> Vec<u8> {
        let bpp = tex.format().block_copy_size(None).unwrap();
        let (w, h) = (tex.width(), tex.height());
        let row = (w * bpp).div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT)
            * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
        let staging = Tensor::empty(ctx, &[(row * h / 4) as usize], DType::F32, "tex").unwrap();
        let mut enc = ctx.device().create_command_encoder(&Default::default());
        enc.copy_texture_to_buffer(
            tex.as_image_copy(),
            wgpu::TexelCopyBufferInfo {
                buffer: staging.buffer().unwrap(),
                layout: wgpu::TexelCopyBufferLayout {
                    offset: staging.block().offset,
                    bytes_per_row: Some(row),
                    rows_per_image: None,
                },
            },
            tex.size(),
        );
        ctx.queue().submit([enc.finish()]);
        let padded = staging.to_bytes(ctx).unwrap();
        padded
            .chunks_exact(row as usize)
            .flat_map(|r| r[..(w * bpp) as usize].to_vec())
            .collect()
    }

    fn storage_texture(
        ctx: &crate::Context,
        w: u32,
        h: u32,
        format: wgpu::TextureFormat,
    ) -> wgpu::Texture {
        super::storage_texture(ctx.device(), "test target", w, h, format)
    }

    /// The texels [`to_texture`] writes for `x` into a new `w` x `h` texture
    /// of `format`.
    fn texture_bytes(
        ctx: &crate::Context,
        x: &Tensor,
        range: ImageRange,
        w: usize,
        h: usize,
        format: wgpu::TextureFormat,
    ) -> Vec<u8> {
        let tex = storage_texture(ctx, w as u32, h as u32, format);
        let mut rec = Recorder::new(ctx);
        to_texture(&mut rec, x, range, &tex).unwrap();
        rec.submit().unwrap();
        read_texture(ctx, &tex)
    }

    /// Rgba8Unorm texels are byte-identical to `to_rgba8` (and so to the CPU
    /// reference), exact halves included; a larger texture keeps its other
    /// texels (zero-initialised by wgpu) untouched.
    #[test]
    fn texture_rgba8_equals_packed_bytes() {
        let ctx = test_context();
        for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
            let (h, w) = (19usize, 23usize);
            let mut data = rand_vec(3 * h * w, 31, 1.4);
            for (k, d) in data.iter_mut().take(255).enumerate() {
                let unit = (k as f32 + 0.5) / 255.0;
                *d = match range {
                    ImageRange::ZeroToOne => unit,
                    ImageRange::MinusOneToOne => (unit - 0.5) * 2.0,
                };
            }
            let want = cpu_to_rgba8(&data, 1, h, w, range);
            assert_eq!(gpu(&ctx, &data, 1, h, w, range), want);
            let x = Tensor::from_f32(&ctx, &[1, 3, h, w], &data, "x").unwrap();
            let got = texture_bytes(&ctx, &x, range, w + 3, h + 2, TextureFormat::Rgba8Unorm);
            let tw = w + 3;
            for y in 0..h + 2 {
                for xx in 0..tw {
                    let texel = &got[(y * tw + xx) * 4..(y * tw + xx) * 4 + 4];
                    if y < h && xx < w {
                        let i = (y * w + xx) * 4;
                        assert_eq!(texel, &want[i..i + 4], "{range:?} texel ({xx}, {y})");
                    } else {
                        assert_eq!(texel, &[0, 0, 0, 0], "{range:?} outside texel ({xx}, {y})");
                    }
                }
            }
        }
    }

    /// Rgba16Float texels are the unquantised values converted to f16: one of
    /// the two f16 values bracketing the CPU value (Vulkan lets the store round
    /// either way; lavapipe truncates), i.e. within one f16 ulp.
    #[test]
    fn texture_rgba16f_holds_unquantised_values() {
        let ctx = test_context();
        let (h, w) = (7usize, 5usize);
        let data = rand_vec(3 * h * w, 5, 1.3);
        let range = ImageRange::MinusOneToOne;
        let x = Tensor::from_f32(&ctx, &[1, 3, h, w], &data, "x").unwrap();
        let texels = texture_bytes(&ctx, &x, range, w, h, TextureFormat::Rgba16Float);
        let got: Vec<f32> = bytemuck::pod_collect_to_vec::<u8, half::f16>(&texels)
            .into_iter()
            .map(f32::from)
            .collect();
        let want = cpu_to_unit_rgba(&data, h, w, range);
        assert_eq!(got.len(), want.len());
        for (i, (g, v)) in got.iter().zip(&want).enumerate() {
            let near = half::f16::from_f32(*v);
            let (lo, hi) = if f32::from(near) <= *v {
                (near, half::f16::from_bits(near.to_bits() + 1))
            } else {
                (half::f16::from_bits(near.to_bits() - 1), near)
            };
            assert!(
                *g == f32::from(lo) || *g == f32::from(hi),
                "texel value {i}: got {g}, want {v} (f16 neighbours {lo}, {hi})"
            );
        }
    }

    /// Half-precision inputs (native f16, packed f16 with shader-f16 hidden,
    /// packed bf16) on odd shapes: `to_rgba8` and an Rgba8Unorm `to_texture`
    /// give exactly the CPU reference's bytes of the values as stored
    /// (inputs rounded through the dtype first, so only the load differs).
    #[test]
    fn half_inputs_convert_exactly() {
        for (ctx, dt) in crate::testing::dtype_contexts() {
            if dt == DType::F32 {
                continue;
            }
            let what = crate::kernels::storage_path(&ctx, dt);
            for range in [ImageRange::MinusOneToOne, ImageRange::ZeroToOne] {
                for (n, h, w) in [(1, 7, 5), (2, 19, 23)] {
                    let data: Vec<f32> = rand_vec(n * 3 * h * w, 13, 1.3)
                        .into_iter()
                        .map(|v| crate::gpu::storage::round_through(v, dt))
                        .collect();
                    let want = cpu_to_rgba8(&data, n, h, w, range);
                    let x = Tensor::from_f32_as(&ctx, &[n, 3, h, w], &data, dt, "x").unwrap();
                    let out = Tensor::empty(&ctx, &[n, h, w], DType::Rgba8, "rgba").unwrap();
                    let mut rec = Recorder::new(&ctx);
                    to_rgba8(&mut rec, &x, range, &out).unwrap();
                    rec.submit().unwrap();
                    assert_eq!(out.to_bytes(&ctx).unwrap(), want, "{what} {range:?} rgba8");
                    if n == 1 {
                        let texels =
                            texture_bytes(&ctx, &x, range, w, h, TextureFormat::Rgba8Unorm);
                        assert_eq!(texels, want, "{what} {range:?} texture");
                    }
                }
            }
        }
    }

    #[test]
    fn texture_misuse_is_an_error() {
        let ctx = test_context();
        let x = Tensor::empty(&ctx, &[1, 3, 5, 5], DType::F32, "x").unwrap();
        let mut rec = Recorder::new(&ctx);
        let small = storage_texture(&ctx, 4, 5, wgpu::TextureFormat::Rgba8Unorm);
        assert!(matches!(
            to_texture(&mut rec, &x, ImageRange::ZeroToOne, &small),
            Err(Error::Shape { .. })
        ));
        let x2 = Tensor::empty(&ctx, &[2, 3, 5, 5], DType::F32, "x2").unwrap();
        let ok = storage_texture(&ctx, 5, 5, wgpu::TextureFormat::Rgba8Unorm);
        assert!(matches!(
            to_texture(&mut rec, &x2, ImageRange::ZeroToOne, &ok),
            Err(Error::Shape { .. })
        ));
        let r32 = storage_texture(&ctx, 5, 5, wgpu::TextureFormat::R32Float);
        assert!(matches!(
            to_texture(&mut rec, &x, ImageRange::ZeroToOne, &r32),
            Err(Error::Unsupported(_))
        ));
        let not_storage = ctx.device().create_texture(&wgpu::TextureDescriptor {
            label: None,
            size: wgpu::Extent3d {
                width: 5,
                height: 5,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba8Unorm,
            usage: wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        assert!(matches!(
            to_texture(&mut rec, &x, ImageRange::ZeroToOne, &not_storage),
            Err(Error::Unsupported(_))
        ));
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
