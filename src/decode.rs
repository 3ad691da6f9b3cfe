//! The main job: latents in host memory → decoded images.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::to_rgba8;
use crate::memory::MemoryStats;
use crate::models::{Taps, Vae};
use crate::tensor::{DType, Tensor};

/// Options for [`decode`].
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Latents are already decoder input (skip `/ scaling_factor + shift_factor`).
    pub raw_latents: bool,
    /// Also read back the raw float output.
    pub keep_raw: bool,
}

/// What a decode produced.
pub struct Decoded {
    /// Packed RGBA8 pixels per image, row-major.
    pub rgba: Vec<Vec<u8>>,
    pub width: usize,
    pub height: usize,
    /// Raw decoder output [N, 3, H, W] when asked for.
    pub raw: Option<HostTensor>,
    /// Wall time from upload to pixels on the host.
    pub decode_ms: f64,
    /// Pool statistics, peaks over this decode (weights included).
    pub memory: MemoryStats,
}

/// Decodes `latents` [N, C, h, w] with `vae`: one recorded forward, one submit.
pub fn decode(
    ctx: &Context,
    vae: &Vae,
    latents: &HostTensor,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let mut z = latents.clone();
    crate::io::validate_latents(&mut z, vae.latent_channels()).map_err(Error::InvalidInput)?;
    if !opts.raw_latents {
        vae.unscale_latents(&mut z);
    }
    let [n, _, h, w] = [z.shape[0], z.shape[1], z.shape[2], z.shape[3]];
    let (height, width) = (h * vae.upscale(), w * vae.upscale());
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let mut rec = Recorder::new(ctx);
    let input = Tensor::from_f32(ctx, &z.shape, &z.data, "latents")?;
    let raw = vae.forward(&mut rec, input, &mut Taps::default())?;
    let pixels = Tensor::empty(ctx, &[n, height, width], DType::Rgba8, "rgba8 image")?;
    to_rgba8(&mut rec, &raw, vae.output_range(), &pixels)?;
    rec.submit()?;
    let bytes = pixels.to_bytes(ctx)?;
    let raw_host = if opts.keep_raw {
        Some(HostTensor::new(raw.shape().to_vec(), raw.to_f32(ctx)?)?)
    } else {
        None
    };
    let decode_ms = start.elapsed().as_secs_f64() * 1e3;
    let per = height * width * 4;
    Ok(Decoded {
        rgba: bytes.chunks_exact(per).map(|c| c.to_vec()).collect(),
        width,
        height,
        raw: raw_host,
        decode_ms,
        memory: ctx.pool().stats(),
    })
}
