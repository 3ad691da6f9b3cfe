//! Latents a run starts from when they are not a host tensor: a host
//! application's device buffer, copied inside the command stream.

use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::io::HostTensor;
use crate::models::{Taps, Vae};
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
    /// `[N, C, h, w]`; `C` must be the VAE's latent channel count.
    pub shape: [usize; 4],
}

impl DeviceLatents<'_> {
    /// Bytes the latents occupy in the buffer.
    pub fn byte_size(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 4
    }

    /// Checks shape, usage, alignment and bounds against `vae`.
    pub fn validate(&self, vae: &Vae) -> Result<()> {
        let [n, c, h, w] = self.shape;
        if n == 0 || h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!(
                "latents of shape {:?} are empty",
                self.shape
            )));
        }
        if c != vae.latent_channels() {
            return Err(Error::InvalidInput(format!(
                "latents have {c} channels (shape {:?}) but this VAE expects {}",
                self.shape,
                vae.latent_channels()
            )));
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
        Ok(())
    }
}

/// Records upload and decoder for decoder-input latents `z` [N, C, h, w] in
/// host memory → raw output [N, 3, H, W] (the first half of
/// [`crate::decode::record_decode`]).
pub(crate) fn record_decoder(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<Tensor> {
    track_f16(rec, vae)?;
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    vae.forward(rec, input, &mut Taps::default())
}

/// Records a decode of latents in a host buffer → raw output [N, 3, H, W]:
/// `copy_buffer_to_buffer` into a pool tensor, then — unless `raw_latents` —
/// the unscaling `x * (1 / scaling_factor) + shift_factor` with the
/// elementwise ScaleShift kernel, then the decoder.
///
/// The host path ([`Vae::unscale_latents`]) divides; multiplying by the f32
/// reciprocal differs from the division by at most one ulp (and the device
/// may fuse the multiply-add), far below what changes a decoded pixel by more
/// than ±1. NaN / infinite latents are not detected (that would need a read
/// back).
pub(crate) fn record_decoder_from_buffer(
    rec: &mut Recorder,
    vae: &Vae,
    latents: &DeviceLatents,
    raw_latents: bool,
) -> Result<Tensor> {
    refuse_device_pipeline_latents(vae, raw_latents)?;
    latents.validate(vae)?;
    if !raw_latents && vae.latent_normalization().is_some() {
        return Err(crate::error::Error::Unsupported(format!(
            "{}: pipeline latents in a device buffer are un-normalised per channel (latents_mean / latents_std) only on the host: pass host latents, or un-normalise them yourself and decode raw (`raw_latents`)",
            vae.name
        )));
    }
    track_f16(rec, vae)?;
    let input = Tensor::empty(rec.ctx(), &latents.shape, DType::F32, "latents")?;
    rec.copy_from_buffer(latents.buffer, latents.offset, &input)?;
    let (scale, shift) = vae.latent_scaling();
    if !raw_latents && (scale != 1.0 || shift != 0.0) {
        let f = crate::kernels::elementwise::Unary::ScaleShift {
            alpha: 1.0 / scale,
            beta: shift,
        };
        crate::kernels::elementwise::unary(rec, f, &input, &input)?;
    }
    vae.forward(rec, input, &mut Taps::default())
}

/// FLUX.2 pipeline latents in a device buffer are an error: their BatchNorm
/// un-normalisation and 2×2 unpatchify run on the host.
pub(crate) fn refuse_device_pipeline_latents(vae: &Vae, raw_latents: bool) -> Result<()> {
    if !raw_latents && vae.flux2().is_some() {
        return Err(Error::Unsupported(
            "FLUX.2 pipeline latents in a device buffer: their BatchNorm un-normalisation and 2×2 unpatchify run on the host; pass host latents, or decode raw z (N×32×h×w) from the buffer with `EngineOptions::raw_latents`".into(),
        ));
    }
    Ok(())
}

/// f16 models count overflowing conv stores (see [`Recorder::track_f16_range`]).
/// Every decode recording starts with it, so all of them allocate alike and
/// share memory plans.
pub(crate) fn track_f16(rec: &mut Recorder, vae: &Vae) -> Result<()> {
    if vae.dtype == DType::F16 && rec.range_flag().is_none() {
        rec.track_f16_range()?;
    }
    Ok(())
}
