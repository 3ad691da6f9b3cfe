//! Latents a run starts from when they are not a host tensor: a host
//! application's device buffer, copied inside the command stream.

use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::io::HostTensor;
use crate::kernels::latent_affine::{latent_affine, Affine};
use crate::models::vae_encoder::VaeEncoder;
use crate::models::{ImageDecoder, Taps};
use crate::tensor::{DType, Tensor};

/// f32 latents in a buffer the host owns: `shape` = [N, C, h, w], contiguous
/// (NCHW), starting at byte `offset`. The buffer needs `COPY_SRC` usage: the
/// decode copies it into its own memory inside the command stream.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLatents<'a> {
    /// The host's buffer (needs `COPY_SRC` usage).
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first value, a multiple of 4.
    pub offset: u64,
    /// `[N, C, h, w]`: `C` is the VAE's latent channel count (FLUX.2 pipeline
    /// latents: 4 × its 32, the 2×2-patchified maps).
    pub shape: [usize; 4],
}

impl DeviceLatents<'_> {
    /// Bytes the latents occupy in the buffer.
    pub fn byte_size(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 4
    }

    /// Checks shape, usage, alignment and bounds against the image decoder
    /// `vae`, for pipeline latents or (`raw_latents`) decoder input; returns
    /// the shape the decoder gets (FLUX.2 pipeline maps N×128×h×w: N×32×2h×2w).
    pub fn decoder_shape(&self, vae: &crate::models::Vae, raw_latents: bool) -> Result<[usize; 4]> {
        self.image_decoder_shape(vae.image_decoder("device latents")?, raw_latents)
    }

    /// [`DeviceLatents::decoder_shape`] of an image decoder.
    pub(crate) fn image_decoder_shape(
        &self,
        vae: &ImageDecoder,
        raw_latents: bool,
    ) -> Result<[usize; 4]> {
        let [n, c, h, w] = self.shape;
        if n == 0 || h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!(
                "latents of shape {:?} are empty",
                self.shape
            )));
        }
        let patched = !raw_latents && vae.flux2().is_some();
        let want = vae.latent_channels() * if patched { 4 } else { 1 };
        if c != want {
            let form = match (patched, raw_latents && vae.flux2().is_some()) {
                (true, _) => " (FLUX.2 pipeline latents: 2×2-patchified maps; raw z N×32×h×w needs `raw_latents`)",
                (false, true) => " (raw z; FLUX.2 pipeline maps N×128×h×w are decoded without `raw_latents`)",
                _ => "",
            };
            return Err(Error::InvalidInput(format!(
                "latents have {c} channels (shape {:?}) but this VAE expects {want}{form}",
                self.shape
            )));
        }
        if patched {
            vae.latent_batch_norm()?;
        }
        if !self.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::InvalidInput(format!(
                "the latent buffer needs COPY_SRC usage (it has {:?})",
                self.buffer.usage()
            )));
        }
        if !self.offset.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            return Err(Error::InvalidInput(format!(
                "latent buffer offset {} is not a multiple of {}",
                self.offset,
                wgpu::COPY_BUFFER_ALIGNMENT
            )));
        }
        let end = self.offset.checked_add(self.byte_size());
        if end.is_none_or(|e| e > self.buffer.size()) {
            return Err(Error::InvalidInput(format!(
                "latents {:?} (f32, {} bytes) at offset {} overrun a {}-byte buffer",
                self.shape,
                self.byte_size(),
                self.offset,
                self.buffer.size()
            )));
        }
        Ok(match patched {
            true => [n, c / 4, 2 * h, 2 * w],
            false => self.shape,
        })
    }
}

/// Records upload and decoder for decoder-input latents `z` [N, C, h, w] in
/// host memory → raw output [N, 3, H, W] (the first half of
/// [`crate::decode::record_decode`]).
pub(crate) fn record_decoder(
    rec: &mut Recorder,
    vae: &ImageDecoder,
    z: &HostTensor,
) -> Result<Tensor> {
    track_f16(rec, vae)?;
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    vae.forward(rec, input, &mut Taps::default())
}

/// Records the upload of encoder input `x` [N, 3, H, W] and the encoder →
/// its output [N, C, H/8, W/8] (AutoencoderKL: the moments, 2·latent channels).
///
/// f16 encoders first allocate the recorder's overflow counter
/// ([`Recorder::track_f16_range`]); read it after the submit.
pub(crate) fn record_encoder(
    rec: &mut Recorder,
    enc: &VaeEncoder,
    x: &HostTensor,
) -> Result<Tensor> {
    if enc.dtype == DType::F16 && rec.range_flag().is_none() {
        rec.track_f16_range()?;
    }
    let input = Tensor::from_f32_in(rec, &x.shape, &x.data, "image")?;
    crate::exec::untiled::run(enc.encoder.graph(), rec, input, &mut Default::default())
}

/// Records a decode of latents in a host buffer → raw output [N, 3, H, W]:
/// `copy_buffer_to_buffer` of `source` (buffer, byte offset; `None` on a null
/// device, whose trace plans the run) into a pool tensor of `shape`, then —
/// unless `raw_latents` — the pipeline's un-normalisation on the GPU, then
/// the decoder. Call [`DeviceLatents::decoder_shape`] first.
///
/// The un-normalisation is the host path's ([`Vae::decoder_input`]):
/// - FLUX.2: `x · sqrt(var + eps) + mean` per patch channel and the 2×2
///   unpatchify, one [`latent_affine`] pass;
/// - Qwen-Image: `x / (1 / latents_std) + latents_mean` per channel, one pass;
/// - a scaling and shift factor: `x * (1 / scaling_factor) + shift_factor` in
///   place with the elementwise ScaleShift kernel. The host path divides;
///   multiplying by the f32 reciprocal differs from the division by at most
///   one ulp (and the device may fuse the multiply-add), far below what
///   changes a decoded pixel by more than ±1.
///
/// NaN / infinite latents are not detected (that would need a read back).
pub(crate) fn record_decoder_from_buffer(
    rec: &mut Recorder,
    vae: &ImageDecoder,
    shape: [usize; 4],
    source: Option<(&wgpu::Buffer, u64)>,
    raw_latents: bool,
) -> Result<Tensor> {
    track_f16(rec, vae)?;
    let input = Tensor::empty(rec.ctx(), &shape, DType::F32, "latents")?;
    if let Some((buffer, offset)) = source {
        rec.copy_from_buffer(buffer, offset, &input)?;
    }
    let input = match raw_latents {
        true => input,
        false => unnormalize(rec, vae, input)?,
    };
    vae.forward(rec, input, &mut Taps::default())
}

/// Pipeline latents → decoder input on the device (see
/// [`record_decoder_from_buffer`]).
fn unnormalize(rec: &mut Recorder, vae: &ImageDecoder, x: Tensor) -> Result<Tensor> {
    let [n, c, h, w] = <[usize; 4]>::try_from(x.shape())
        .map_err(|_| Error::shape("latents", format!("{x:?} is not N×C×h×w")))?;
    let per_channel = |op, r: usize, a: Vec<f32>, s: &[f32], rec: &mut Recorder| {
        let coef = Tensor::from_f32_in(
            rec,
            &[2 * c],
            &[a.as_slice(), s].concat(),
            "latent statistics",
        )?;
        let z = Tensor::empty(
            rec.ctx(),
            &[n, c / (r * r), h * r, w * r],
            DType::F32,
            "latents z",
        )?;
        latent_affine(rec, op, r, &x, &coef, &z)?;
        Ok::<_, Error>(z)
    };
    if vae.flux2().is_some() {
        let bn = vae.latent_batch_norm()?;
        return per_channel(Affine::Multiply, 2, bn.std.clone(), &bn.mean, rec);
    }
    if let Some((mean, std)) = vae.latent_normalization() {
        // As the pipeline: `latents_std = 1 / std`, then `latents / latents_std`.
        let inv = std.iter().map(|s| 1.0 / s).collect();
        return per_channel(Affine::Divide, 1, inv, mean, rec);
    }
    let (scale, shift) = vae.latent_scaling();
    if scale != 1.0 || shift != 0.0 {
        let f = crate::kernels::elementwise::Unary::ScaleShift {
            alpha: 1.0 / scale,
            beta: shift,
        };
        crate::kernels::elementwise::unary(rec, f, &x, &x)?;
    }
    Ok(x)
}

/// f16 models count overflowing conv stores (see [`Recorder::track_f16_range`]).
/// Every decode recording starts with it, so all of them allocate alike and
/// share memory plans.
pub(crate) fn track_f16(rec: &mut Recorder, vae: &ImageDecoder) -> Result<()> {
    if vae.dtype == DType::F16 && rec.range_flag().is_none() {
        rec.track_f16_range()?;
    }
    Ok(())
}
