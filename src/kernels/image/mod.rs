//! `shaders/image.wgsl`: decoder output to packed RGBA8 on the GPU, with the
//! exact rounding diffusers uses (numpy's round-half-to-even), into a tensor
//! ([`to_rgba8`]) or straight into a storage texture ([`to_texture`]).
//! Images have 3 channels (RGB, alpha 255) or 4 (RGBA: Qwen-Image 2.1, whose
//! alpha maps like its RGB).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite, WriteTexture};
use crate::gpu::{
    linear_groups, Binding, BindingKind, KernelSpec, PipelineKey, Recorder, StorageType,
};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/image.wgsl");
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
    /// ImageNet-normalised RGB (MiniMax-H3):
    /// `round(clamp(x·std[c] + mean[c], 0, 1)*255)`
    ImageNet,
}

/// ImageNet's per-channel mean and std (RGB), as torchvision gives them.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// See [`IMAGENET_MEAN`].
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

impl ImageRange {
    fn code(self) -> u32 {
        match self {
            ImageRange::MinusOneToOne => 0,
            ImageRange::ZeroToOne => 1,
            ImageRange::ImageNet => 2,
        }
    }

    /// CPU reference of one channel value in [0, 1] before quantisation:
    /// `x / 2 + 0.5` (diffusers' order) or `x`, clamped.
    pub fn to_unit(self, x: f32) -> f32 {
        self.to_unit_at(x, 0)
    }

    /// [`ImageRange::to_unit`] of a value of channel `ch` (ImageNet's
    /// statistics differ per channel; an alpha channel maps as `ZeroToOne`).
    pub fn to_unit_at(self, x: f32, ch: usize) -> f32 {
        match (self, IMAGENET_STD.get(ch)) {
            (ImageRange::MinusOneToOne, _) => (x / 2.0 + 0.5).clamp(0.0, 1.0),
            (ImageRange::ImageNet, Some(&s)) => (x * s + IMAGENET_MEAN[ch]).clamp(0.0, 1.0),
            _ => x.clamp(0.0, 1.0),
        }
    }

    /// CPU reference of one channel value, in f32 and in diffusers' order:
    /// `x / 2 + 0.5`, clamp, `* 255`, round half to even.
    pub fn to_byte(self, x: f32) -> u8 {
        self.to_byte_at(x, 0)
    }

    /// [`ImageRange::to_byte`] of a value of channel `ch`.
    pub fn to_byte_at(self, x: f32, ch: usize) -> u8 {
        (self.to_unit_at(x, ch) * 255.0).round_ties_even() as u8
    }
}

/// Channels of the images the kernels take: RGB, or RGBA (alpha kept).
pub const IMAGE_CHANNELS: [usize; 2] = [3, 4];

fn key(x: StorageType, range: ImageRange, channels: usize) -> PipelineKey {
    PipelineKey::new(&TO_RGBA8)
        .storage("x", x)
        .constant("WG", format!("{WG}u"))
        .constant("RANGE", format!("{}u", range.code()))
        .constant("CHANNELS", format!("{channels}u"))
}

/// `[N, C, H, W]` and the storage type of an image-output kernel's input x
/// `[N, C, H, W]`, C one of `channels`.
fn image_input(
    rec: &Recorder,
    op: &str,
    x: &Tensor,
    channels: &[usize],
) -> Result<([usize; 4], StorageType)> {
    let [n, c, h, w] = match *x.shape() {
        [n, c, h, w] => [n, c, h, w],
        _ => {
            return Err(Error::shape(
                op,
                format!("x must be [N, C, H, W] (C in {channels:?}), got {x:?}"),
            ))
        }
    };
    let storage = crate::kernels::group_norm::activation_storage(rec, op, x)?;
    if !channels.contains(&c) {
        return Err(Error::shape(
            op,
            format!("x must have {channels:?} channels, got {x:?}"),
        ));
    }
    Ok(([n, c, h, w], storage))
}

/// x `[N, C, H, W]` (f32 or f16; C = 3, or 4 with alpha) → out `[N, H, W]`
/// tensor of `DType::Rgba8` (one u32 per pixel, R in the low byte; alpha 255,
/// or channel 4 mapped as RGB is). A pixel with a NaN or infinite channel gets
/// alpha 0 (and unspecified RGB bytes): count them with [`count_non_finite`]
/// (3-channel images only: a 4-channel image's alpha 0 may be real).
pub fn to_rgba8(rec: &mut Recorder, x: &Tensor, range: ImageRange, out: &Tensor) -> Result<()> {
    const OP: &str = "to_rgba8";
    let ([n, c, h, w], x_storage) = image_input(rec, OP, x, &IMAGE_CHANNELS)?;
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
        &key(x_storage, range, c),
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
        .constant("CHANNELS", "3u")
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
    let ([n, _, h, w], x_storage) = image_input(rec, OP, x, &[3])?;
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
    cpu_bytes(x, [n, 3, h, w], range)
}

/// x `[N, C, H, W]` → bytes `[N, H, W, C]`, each value as [`ImageRange::to_byte`] maps it.
fn cpu_bytes(x: &[f32], [n, c, h, w]: [usize; 4], range: ImageRange) -> Vec<u8> {
    let plane = h * w;
    let mut out = Vec::with_capacity(n * plane * c);
    for b in 0..n {
        for i in 0..plane {
            for ch in 0..c {
                out.push(range.to_byte_at(x[(b * c + ch) * plane + i], ch));
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

fn texture_key(
    spec: &KernelSpec,
    x: StorageType,
    range: ImageRange,
    channels: usize,
) -> PipelineKey {
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
        .constant("CHANNELS", format!("{channels}u"))
}

/// x `[1, C, H, W]` (f32 or f16; C = 3, or 4 with alpha) → texels `(0..W, 0..H)` of mip level 0,
/// array layer 0 of `texture`: a 2-D texture with `STORAGE_BINDING` usage in
/// one of [`STORAGE_TEXTURE_FORMATS`], at least W×H. `Rgba8Unorm` receives
/// exactly the bytes of [`to_rgba8`]; `Rgba16Float` the clamped values in
/// [0, 1] before quantisation. Both are the decoder's sRGB-encoded pixel
/// values (not linear light), alpha 1 or channel 4 (0 for a pixel with a non-finite channel).
pub fn to_texture(
    rec: &mut Recorder,
    x: &Tensor,
    range: ImageRange,
    texture: &wgpu::Texture,
) -> Result<()> {
    const OP: &str = "to_texture";
    let ([n, c, h, w], x_storage) = image_input(rec, OP, x, &IMAGE_CHANNELS)?;
    if n != 1 {
        return Err(Error::shape(
            OP,
            format!("x must be one image [1, C, H, W], got {x:?}"),
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
        &texture_key(&spec, x_storage, range, c),
        &params,
        &[Binding::Tensor(x), Binding::Texture(&view)],
        groups,
        0,
    )
}

/// Whether every channel of a pixel of x `[N, C, H, W]` is finite (the
/// kernels' alpha 0 marks one that is not).
fn cpu_finite(x: &[f32], [_, c, h, w]: [usize; 4], image: usize, pixel: usize) -> bool {
    (0..c).all(|ch| x[(image * c + ch) * h * w + pixel].is_finite())
}

/// Pixels of x `[N, C, H, W]` with a NaN or infinite channel.
pub fn cpu_count_non_finite(x: &[f32], shape: [usize; 4]) -> u64 {
    let [n, _, h, w] = shape;
    let plane = h * w;
    (0..n * plane)
        .filter(|&p| !cpu_finite(x, shape, p / plane, p % plane))
        .count() as u64
}

/// CPU reference of the `Rgba16Float` texels of [`to_texture`] before the
/// f16 conversion: x `[1, C, H, W]` → `[H, W, 4]` values in [0, 1].
pub fn cpu_to_unit_rgba(x: &[f32], c: usize, h: usize, w: usize, range: ImageRange) -> Vec<f32> {
    let plane = h * w;
    let mut out = Vec::with_capacity(plane * 4);
    for i in 0..plane {
        for ch in 0..3 {
            out.push(range.to_unit_at(x[ch * plane + i], ch));
        }
        let a = if c == 4 {
            range.to_unit(x[3 * plane + i])
        } else {
            1.0
        };
        out.push(if cpu_finite(x, [1, c, h, w], 0, i) {
            a
        } else {
            0.0
        });
    }
    out
}

/// CPU reference: x `[N, 3, H, W]` → RGBA bytes `[N, H, W, 4]` (the RGB
/// bytes of a non-finite pixel are unspecified on the GPU).
pub fn cpu_to_rgba8(x: &[f32], n: usize, h: usize, w: usize, range: ImageRange) -> Vec<u8> {
    cpu_image_to_rgba8(x, [n, 3, h, w], range)
}

/// CPU reference of [`to_rgba8`]: x `[N, C, H, W]` (C = 3, or 4 with alpha)
/// → RGBA bytes `[N, H, W, 4]` (the RGB bytes of a non-finite pixel are
/// unspecified on the GPU).
pub fn cpu_image_to_rgba8(x: &[f32], shape: [usize; 4], range: ImageRange) -> Vec<u8> {
    let [_, c, h, w] = shape;
    let plane = h * w;
    cpu_bytes(x, shape, range)
        .chunks_exact(c)
        .enumerate()
        .flat_map(|(p, px)| {
            let a = if !cpu_finite(x, shape, p / plane, p % plane) {
                0
            } else if c == 4 {
                px[3]
            } else {
                255
            };
            [px[0], px[1], px[2], a]
        })
        .collect()
}

/// Pixels of packed RGBA8 bytes ([`to_rgba8`]) of 3-channel images marked
/// non-finite (alpha 0).
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
            v.push((TO_RGB8, rgb8_key(dtype, range)));
            for c in IMAGE_CHANNELS {
                v.push((TO_RGBA8, key(dtype, range, c)));
                for spec in [TO_TEXTURE_RGBA8, TO_TEXTURE_RGBA16F] {
                    let k = texture_key(&spec, dtype, range, c);
                    v.push((spec, k));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests;
