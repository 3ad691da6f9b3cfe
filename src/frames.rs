//! Streaming decode of many latent frames (a video's): `[N, C, h, w]` in,
//! one RGBA8 image per frame out, handed to a callback in frame order.
//!
//! Frames are decoded in chunks of `B`: each chunk is one recorded, batched
//! forward (`N = B` in every dispatch, not a loop over frames), the RGBA8
//! conversion on the GPU (4 bytes per pixel instead of 12 for f32 RGB) and a
//! copy into a `MAP_READ` staging buffer, in one command buffer. Two staging
//! buffers alternate: chunk `k + 1` is recorded and submitted before the host
//! waits for chunk `k`'s map, so the device decodes `k + 1` while the host
//! reads `k` and runs the callback on it. The callback borrows the mapped
//! bytes directly: no host copy between the device and the callback.
//!
//! Activations come from the context's pool as in [`crate::decode()`] (same
//! allocation order, so a planned pool shares its memory plans with it); the
//! staging buffers are not tensors and are reported separately.
//!
//! ```no_run
//! use wgvae::{Context, ContextOptions, FramesOptions, LoadOptions, Vae};
//!
//! fn main() -> wgvae::Result<()> {
//!     let ctx = Context::new(&ContextOptions::default())?;
//!     let vae = Vae::load(&ctx, "../shared/weights/taef2/decoder.safetensors", &LoadOptions::default())?;
//!     // [N, C, h, w]: one latent per frame.
//!     let latents = wgvae::io::load_latents("video_latents.npy".as_ref(), None, vae.latent_channels())?;
//!     let report = wgvae::decode_frames(&ctx, &vae, &latents, &FramesOptions::default(), |f| {
//!         // f.rgba: the [H, W, 4] bytes of frame f.index, lent for the duration of the call.
//!         let path = format!("frame_{:05}.png", f.index);
//!         wgvae::io::write_png_rgb(path.as_ref(), f.width, f.height, f.rgba)
//!     })?;
//!     println!("{:.2} frames/s, P99 latency {:.0} ms", report.frames_per_s, report.latency.p99_ms);
//!     Ok(())
//! }
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::{Context, MapAfter, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::to_rgba8;
use crate::models::{layers::dims4, ImageDecoder, Taps, Vae};
use crate::run::strategy::{is_limit_error, null_peak_of};
use crate::run::Replay;
use crate::tensor::{DType, Tensor};
use crate::tiling::default_max_memory;

/// Options of [`decode_frames`].
#[derive(Clone, Debug, Default)]
pub struct FramesOptions {
    /// Latents are decoder input already: skip `/ scaling_factor + shift_factor`.
    pub raw_latents: bool,
    /// Frames per batched forward (`B`, clamped to `N`). `None`: the largest
    /// `B ≤ ceil(N / 4)` that fits (see [`choose_chunk`]).
    pub chunk: Option<usize>,
    /// Memory budget of the automatic chunk size in bytes: pool memory
    /// (weights included) plus the staging buffers. `None`:
    /// [`default_max_memory`] of the device.
    pub max_memory: Option<u64>,
    /// Time every kernel and copy with GPU timestamps
    /// ([`FramesReport::profile`], summed over the chunks; `None` when the
    /// adapter has no timestamps inside passes). The timestamps are read after
    /// the last chunk, so the double buffering is kept.
    pub profile: bool,
}

/// One decoded frame, lent to the callback of [`decode_frames`].
#[derive(Debug)]
pub struct FrameOut<'a> {
    /// Position of the frame in the latents (0-based); frames arrive in order.
    pub index: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Packed RGBA8 pixels `[H, W, 4]` (R first; alpha 255, or the model's
    /// when `channels` is 4), borrowed from the mapped staging buffer: valid
    /// during the callback only.
    pub rgba: &'a [u8],
    /// The model's image channels ([`crate::Vae::image_channels`]): 3 (RGB)
    /// or 4 (RGBA, alpha in `rgba`).
    pub channels: usize,
    /// Milliseconds from the submit of the frame's chunk (for the first
    /// chunk: from the start of [`decode_frames`]) until its pixels were
    /// mapped on the host.
    pub latency_ms: f64,
}

/// Mean, 99th percentile (nearest rank) and maximum of latencies.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LatencySummary {
    /// Mean latency in ms.
    pub mean_ms: f64,
    /// 99th-percentile latency in ms.
    pub p99_ms: f64,
    /// Largest latency in ms.
    pub max_ms: f64,
}

impl LatencySummary {
    /// Summary of `samples` (NaN fields when empty).
    pub fn of(samples: &[f64]) -> Self {
        if samples.is_empty() {
            return LatencySummary {
                mean_ms: f64::NAN,
                p99_ms: f64::NAN,
                max_ms: f64::NAN,
            };
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = ((0.99 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        LatencySummary {
            mean_ms: sorted.iter().sum::<f64>() / sorted.len() as f64,
            p99_ms: sorted[rank - 1],
            max_ms: sorted[sorted.len() - 1],
        }
    }
}

/// What a [`decode_frames`] call did.
#[derive(Clone, Debug, Serialize)]
pub struct FramesReport {
    /// `N`.
    pub frames: usize,
    /// Frames per batched forward (`B`); the last chunk may hold fewer.
    pub chunk: usize,
    /// Chunks decoded (`ceil(frames / chunk)`).
    pub chunks: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Wall time from the call to the last frame handed over (plan tracing,
    /// recording and callbacks included).
    pub total_ms: f64,
    /// Frames per second over `total_ms`.
    pub frames_per_s: f64,
    /// Per-frame latency (see [`FrameOut::latency_ms`]), in frame order.
    pub latency_ms: Vec<f64>,
    /// Mean / P99 / max of `latency_ms`.
    pub latency: LatencySummary,
    /// Host time spent recording chunks (plan tracing included).
    pub record_ms: f64,
    /// Host time inside `queue.submit`. Near zero on GPUs; on lavapipe the
    /// device work runs inside the submit call (so it overlaps nothing).
    pub submit_ms: f64,
    /// Host time blocked waiting for chunks to finish and map.
    pub wait_ms: f64,
    /// Host time spent in the callback.
    pub callback_ms: f64,
    /// Compute dispatches recorded over all chunks.
    pub dispatches: usize,
    /// Per-kernel and per-copy GPU times summed over the chunks
    /// ([`FramesOptions::profile`] only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<crate::gpu::Profile>,
    /// Bytes read back (`N · H · W · 4`).
    pub readback_bytes: u64,
    /// Bytes of the staging buffers (one or two of `B · H · W · 4` + 4), outside the pool.
    pub staging_bytes: u64,
    /// Values f16 convolutions could not hold (0 unless the model runs in
    /// f16). A chunk with a non-zero count is decoded again in bf16 (with
    /// [`crate::decode()`], frames of the chunk together) before its frames
    /// are handed over, so callbacks never see saturated frames; only a
    /// model built in memory (no file to reload) keeps them, with a warning.
    pub f16_overflows: u64,
    /// Frames decoded again in bf16 after an f16 overflow in their chunk.
    pub redone_frames: usize,
    /// Pool peaks during the call (weights included), as [`crate::Decoded::memory`].
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes during the call (weights included).
    pub peak_reserved_bytes: u64,
}

/// `[N, C, h, w]` of frame latents (`[C, h, w]` is one frame), checked:
/// at least one frame, `channels` channels, data filling the shape, finite.
#[doc(hidden)]
pub fn frames_shape(latents: &HostTensor, channels: usize) -> Result<[usize; 4]> {
    let shape = match *latents.shape.as_slice() {
        [n, c, h, w] => [n, c, h, w],
        [c, h, w] => [1, c, h, w],
        _ => {
            return Err(Error::InvalidInput(format!(
                "frame latents have rank {} (shape {:?}); expected N×C×h×w",
                latents.shape.len(),
                latents.shape
            )))
        }
    };
    let [n, c, h, w] = shape;
    if n == 0 {
        return Err(Error::InvalidInput(format!(
            "frame latents {:?} hold no frames",
            latents.shape
        )));
    }
    if h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "frame latents {:?} are empty",
            latents.shape
        )));
    }
    if c != channels {
        return Err(Error::InvalidInput(format!(
            "frame latents have {c} channels (shape {:?}) but this VAE expects {channels}",
            latents.shape
        )));
    }
    if latents.data.len() != n * c * h * w {
        return Err(Error::InvalidInput(format!(
            "{} values do not fill frame latents of shape {:?}",
            latents.data.len(),
            latents.shape
        )));
    }
    if let Some(i) = latents.data.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(format!(
            "frame latents contain non-finite values (first at flat index {i}, frame {}: {})",
            i / (c * h * w),
            latents.data[i]
        )));
    }
    Ok(shape)
}

/// Records one chunk: latents `[B, C, h, w]` (uploaded inside the command
/// stream; `None`, when tracing or fitting, only allocates them) → decoder → RGBA8
/// `[B, H, W]`. Allocates in the order of [`crate::decode::record_decode`],
/// so the two share memory plans.
fn record_chunk(
    rec: &mut Recorder,
    vae: &ImageDecoder,
    shape: [usize; 4],
    latents: Option<&[f32]>,
) -> Result<Tensor> {
    crate::run::input::track_f16(rec, vae)?;
    let input = match latents {
        Some(data) => Tensor::from_f32_in(rec, &shape, data, "latents")?,
        None => Tensor::empty(rec.ctx(), &shape, DType::F32, "latents")?,
    };
    let raw = vae.forward(rec, input, &mut Taps::default())?;
    let [n, _, h, w] = dims4(&raw)?;
    let pixels = Tensor::empty(rec.ctx(), &[n, h, w], DType::Rgba8, "rgba8 image")?;
    to_rgba8(rec, &raw, vae.output_range(), &pixels)?;
    Ok(pixels)
}

/// Staging buffers a decode of `n` frames in chunks of `chunk` uses.
fn staging_slots(n: usize, chunk: usize) -> usize {
    n.div_ceil(chunk).min(2)
}

/// Chunks a stream is cut into at least (when it has that many frames), so
/// that reading chunk k back overlaps decoding chunk k + 1: with one chunk
/// nothing overlaps; with c chunks the unhidden part is about 1/c of the
/// readback.
#[doc(hidden)]
pub const MIN_CHUNKS: usize = 4;

/// The largest chunk `B ≤ ceil(N / MIN_CHUNKS)` for frame latents of
/// `latent_shape` `[N, C, h, w]` (so the double-buffered readback has
/// chunks to overlap) whose batched decode stays within the device's binding,
/// buffer and dispatch limits and, with the pool's current allocations and
/// the staging buffers, within `max_memory` (default
/// [`default_max_memory`]). Predicted by null-device runs of the chunk's decode
/// (binary search over `B`), nothing runs. An error when not even one frame
/// fits: decode such frames one by one with tiling ([`crate::decode()`]).
#[doc(hidden)]
pub fn choose_chunk(
    ctx: &Context,
    vae: &Vae,
    latent_shape: [usize; 4],
    max_memory: Option<u64>,
) -> Result<usize> {
    let vae = vae.image_decoder("decoding frames")?;
    choose_image_chunk(ctx, vae, latent_shape, max_memory)
}

/// [`choose_chunk`] of an image decoder.
fn choose_image_chunk(
    ctx: &Context,
    vae: &ImageDecoder,
    latent_shape: [usize; 4],
    max_memory: Option<u64>,
) -> Result<usize> {
    let [n, c, h, w] = latent_shape;
    if n == 0 {
        return Err(Error::InvalidInput("no frames to decode".into()));
    }
    let budget = max_memory.unwrap_or_else(|| default_max_memory(ctx.caps()));
    let base = ctx.pool().stats().allocated_bytes.current;
    let up = vae.upscale();
    let frame_bytes = (h * up * w * up * 4) as u64;
    // `None` when `b` frames fit, else why not.
    let misfit = |b: usize| -> Result<Option<Error>> {
        let staging = staging_slots(n, b) as u64 * (b as u64 * frame_bytes + 4);
        let run = null_peak_of(ctx, |null| {
            let mut rec = Recorder::new(null);
            record_chunk(&mut rec, vae, [b, c, h, w], None).map(|_| ())
        });
        match run {
            Ok((peak, ())) if base + peak + staging <= budget => Ok(None),
            Ok((peak, ())) => Ok(Some(Error::OverBudget(format!(
                "a chunk of {b} frame(s) needs {} MiB ({} MiB already in use, {} MiB of activations, {} MiB of staging), more than the memory budget of {} MiB; raise `FramesOptions::max_memory`",
                (base + peak + staging) >> 20,
                base >> 20,
                peak >> 20,
                staging >> 20,
                budget >> 20
            )))),
            Err(e) if is_limit_error(&e) => Ok(Some(e)),
            Err(e) => Err(e),
        }
    };
    let cap = n.div_ceil(MIN_CHUNKS);
    if misfit(cap)?.is_none() {
        return Ok(cap);
    }
    if let Some(e) = misfit(1)? {
        return Err(e);
    }
    // Invariant: `lo` frames fit, `hi` frames do not.
    let (mut lo, mut hi) = (1, cap);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if misfit(mid)?.is_none() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// A submitted chunk whose pixels are on their way to a staging buffer.
struct InFlight {
    slot: usize,
    first: usize,
    count: usize,
    /// Where its latency is measured from.
    origin: Instant,
    /// The staging buffer ends with the chunk's f16 overflow counter.
    counted: bool,
    mapped: MapAfter,
}

/// Host-side bookkeeping of one [`decode_frames`] call.
struct Delivery {
    width: usize,
    height: usize,
    latency_ms: Vec<f64>,
    next_index: usize,
    wait_ms: f64,
    callback_ms: f64,
    /// Values f16 convolutions could not hold, over all chunks so far.
    f16_overflows: u64,
    /// Frames of overflowing chunks, decoded again in bf16.
    redone_frames: usize,
    /// The model, for errors.
    model: String,
    /// The model's image channels (alpha kept when 4).
    channels: usize,
}

impl Delivery {
    /// Waits for `chunk`'s submission (not for later ones), then lends its
    /// frames to `on_frame` straight from the mapped staging buffer.
    fn deliver(
        &mut self,
        ctx: &Context,
        staging: &wgpu::Buffer,
        chunk: InFlight,
        on_frame: &mut impl FnMut(FrameOut<'_>) -> Result<()>,
        redo: &mut impl FnMut(usize, usize) -> Result<Vec<Vec<u8>>>,
    ) -> Result<()> {
        let waited = Instant::now();
        chunk.mapped.wait(ctx)?;
        let latency_ms = chunk.origin.elapsed().as_secs_f64() * 1e3;
        self.wait_ms += waited.elapsed().as_secs_f64() * 1e3;
        let frame_bytes = self.width * self.height * 4;
        let called = Instant::now();
        let view = staging
            .slice(..(chunk.count * frame_bytes) as u64 + 4)
            .get_mapped_range()
            .map_err(|e| Error::Readback(e.to_string()))?;
        let tail = chunk.count * frame_bytes;
        let overflows = match (chunk.counted, <[u8; 4]>::try_from(&view[tail..tail + 4])) {
            (true, Ok(counter)) => u32::from_le_bytes(counter) as u64,
            _ => 0,
        };
        self.f16_overflows += overflows;
        // A saturated chunk is decoded again in bf16 before any of its
        // frames is handed over (models without a file to reload keep it).
        let redone = match overflows {
            0 => None,
            _ => match redo(chunk.first, chunk.count) {
                Ok(frames) => {
                    self.redone_frames += chunk.count;
                    Some(frames)
                }
                Err(Error::Unsupported(why)) => {
                    log::warn!(
                        "f16 overflow in frames {}..{}: kept ({why})",
                        chunk.first,
                        chunk.first + chunk.count
                    );
                    None
                }
                Err(e) => return Err(e),
            },
        };
        // Non-finite pixels are an error, unless an overflowing f16 chunk
        // had to be kept as it is (logged above).
        if !ctx.is_null() && (overflows == 0 || redone.is_some()) {
            match &redone {
                Some(frames) => {
                    crate::decode::check_finite_pixels(&self.model, self.channels, frames)?
                }
                None => crate::decode::check_finite_pixels(
                    &self.model,
                    self.channels,
                    &[&view[..tail]],
                )?,
            }
        }
        for i in 0..chunk.count {
            let index = chunk.first + i;
            debug_assert_eq!(index, self.next_index);
            self.latency_ms[index] = latency_ms;
            self.next_index = index + 1;
            let rgba = match &redone {
                Some(frames) => &frames[i][..],
                None => &view[i * frame_bytes..(i + 1) * frame_bytes],
            };
            on_frame(FrameOut {
                index,
                width: self.width,
                height: self.height,
                rgba,
                channels: self.channels,
                latency_ms,
            })?;
        }
        drop(view);
        staging.unmap();
        self.callback_ms += called.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }
}

/// Decodes frame latents `[N, C, h, w]` (pipeline latents unless
/// `opts.raw_latents`) in chunks of `B` frames (see the module docs) and calls
/// `on_frame` once per frame, in frame order, with its RGBA8 pixels
/// `[H, W, 4]`. Pixels equal those of [`crate::decode()`] of each frame alone
/// (checked by `tests/frames.rs`).
///
/// Untiled only: a frame that does not decode untiled on the device is an
/// error (decode it with [`crate::decode()`], which tiles). An error from
/// `on_frame` stops the decode and is returned. Not available on a null device
/// (predict a chunk's memory with [`crate::estimate::Estimate`] at
/// `[B, C, h, w]`).
pub fn decode_frames(
    ctx: &Context,
    vae: &Vae,
    latents: &HostTensor,
    opts: &FramesOptions,
    mut on_frame: impl FnMut(FrameOut<'_>) -> Result<()>,
) -> Result<FramesReport> {
    let start = Instant::now();
    let vae = vae.image_decoder("decoding frames")?;
    // FLUX.2 pipeline latents are un-normalised and unpatchified on the host first.
    let converted;
    let (latents, opts) = if vae.flux2().is_some() && !opts.raw_latents {
        converted = (
            vae.decoder_input(latents, false, None)?,
            FramesOptions {
                raw_latents: true,
                ..opts.clone()
            },
        );
        (&converted.0, &converted.1)
    } else {
        (latents, opts)
    };
    let profile = opts.profile;
    let shape = frames_shape(latents, vae.latent_channels())?;
    let [n, c, h, w] = shape;
    let chunk = match opts.chunk {
        Some(0) => {
            return Err(Error::InvalidInput(
                "chunk size 0: a chunk holds at least one frame".into(),
            ))
        }
        Some(b) => b.min(n),
        None => choose_image_chunk(ctx, vae, shape, opts.max_memory)?,
    };
    let chunks = n.div_ceil(chunk);
    let up = vae.upscale();
    let (height, width) = (h * up, w * up);
    let frame_bytes = (height * width * 4) as u64;
    let frame_len = c * h * w;

    // The pixels, then the chunk's f16 overflow counter (f16 models).
    let staging_size = chunk as u64 * frame_bytes + 4;
    let max_buffer = ctx.caps().max_buffer_size;
    if staging_size > max_buffer {
        return Err(Error::BufferTooLarge {
            what: format!("the readback buffer of a chunk of {chunk} frames"),
            bytes: staging_size,
            limit: max_buffer,
        });
    }
    let staging = (0..staging_slots(n, chunk))
        .map(|_| ctx.readback_buffer("wgvae frame readback", staging_size))
        .collect::<Result<Vec<_>>>()?;

    let (scale, shift) = vae.latent_scaling();
    let unscale = !opts.raw_latents && (scale != 1.0 || shift != 0.0);
    // Qwen-Image: per channel, as `ImageDecoder::unscale_latents`.
    let normalize = !opts.raw_latents && vae.latent_normalization().is_some();
    let mut unscaled = Vec::new();
    ctx.pool().reset_peak_stats();
    let mut delivery = Delivery {
        width,
        height,
        latency_ms: vec![f64::NAN; n],
        next_index: 0,
        wait_ms: 0.0,
        callback_ms: 0.0,
        f16_overflows: 0,
        redone_frames: 0,
        model: vae.name.clone(),
        channels: vae.image_channels(),
    };
    // Frames `first..first + count` decoded alone with the bf16 twin.
    let mut redo = |first: usize, count: usize| -> Result<Vec<Vec<u8>>> {
        let twin = vae.bf16_twin(ctx)?;
        let z = HostTensor::new(
            vec![count, c, h, w],
            latents.data[first * frame_len..(first + count) * frame_len].to_vec(),
        )?;
        let opts = crate::decode::DecodeOptions {
            raw_latents: opts.raw_latents,
            ..Default::default()
        };
        Ok(crate::decode::decode_image(ctx, twin, &z, &opts)?.rgba)
    };
    let (mut record_ms, mut submit_ms, mut dispatches) = (0.0, 0.0, 0);
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(2);
    let mut profilers = Vec::new();
    for k in 0..chunks {
        let recording = Instant::now();
        let first = k * chunk;
        let count = chunk.min(n - first);
        let chunk_shape = [count, c, h, w];
        let mut data = &latents.data[first * frame_len..(first + count) * frame_len];
        if unscale {
            // As ImageDecoder::unscale_latents (same f32 operations), chunk by chunk.
            unscaled.clear();
            unscaled.extend(data.iter().map(|v| *v / scale + shift));
            crate::models::check_unscaled(&unscaled, scale, shift)?;
            data = &unscaled;
        }
        if normalize {
            let mut t = HostTensor::new(chunk_shape.to_vec(), data.to_vec())?;
            vae.unscale_latents(&mut t)?;
            unscaled = t.data;
            data = &unscaled;
        }
        let key = || crate::decode::plan_key(vae, &chunk_shape);
        let replay = Replay::recorded(ctx, key, |rec| record_chunk(rec, vae, chunk_shape, None))?;
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("wgvae frame chunk"),
            });
        let mut rec = Recorder::with_encoder(ctx, &mut encoder);
        if profile {
            rec.enable_profiling();
        }
        let recorded = record_chunk(&mut rec, vae, chunk_shape, Some(data));
        drop(replay);
        let pixels = recorded?;
        let range_flag = rec.range_flag().cloned();
        if pixels.shape() != [count, height, width] {
            return Err(Error::shape(
                "decode_frames",
                format!(
                    "decoded {:?}, expected [{count}, {height}, {width}]",
                    pixels.shape()
                ),
            ));
        }
        let slot = k % 2;
        let bytes = count as u64 * frame_bytes;
        // Recorded through the recorder so a profile times the readback copies too.
        let (pixel_buffer, pixel_offset) = (pixels.buffer()?.clone(), pixels.block().offset);
        let flag = match &range_flag {
            Some(f) => Some((f.buffer()?.clone(), f.block().offset)),
            None => None,
        };
        rec.timed_transfer("copy::frames_to_staging", |e| {
            e.copy_buffer_to_buffer(&pixel_buffer, pixel_offset, &staging[slot], 0, bytes);
            if let Some((fb, fo)) = &flag {
                e.copy_buffer_to_buffer(fb, *fo, &staging[slot], bytes, 4);
            }
        });
        let (labels, profiler) = rec.finish_profiled();
        dispatches += labels.len();
        profilers.extend(profiler);
        record_ms += recording.elapsed().as_secs_f64() * 1e3;
        let origin = if k == 0 { start } else { Instant::now() };
        let submitting = Instant::now();
        let submission = ctx.scoped("submitting a frame chunk", || {
            Ok(ctx.queue().submit([encoder.finish()]))
        })?;
        submit_ms += submitting.elapsed().as_secs_f64() * 1e3;
        // Queue order keeps the next chunk's writes to this memory after the copy.
        let counted = range_flag.is_some();
        drop((pixels, range_flag));
        let mapped = MapAfter::new(staging[slot].slice(..bytes + 4), submission);
        in_flight.push_back(InFlight {
            slot,
            first,
            count,
            origin,
            counted,
            mapped,
        });
        // Chunk k is submitted: now take chunk k - 1 (freeing its slot for k + 1).
        if in_flight.len() == 2 {
            if let Some(done) = in_flight.pop_front() {
                let buffer = &staging[done.slot];
                delivery.deliver(ctx, buffer, done, &mut on_frame, &mut redo)?;
            }
        }
    }
    while let Some(done) = in_flight.pop_front() {
        let buffer = &staging[done.slot];
        delivery.deliver(ctx, buffer, done, &mut on_frame, &mut redo)?;
    }
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut times = crate::gpu::SubmitStats::default();
    for p in &profilers {
        times.add(&[], Some(p.read(ctx)?));
    }
    let memory = ctx.pool().stats();
    if delivery.f16_overflows > 0 {
        log::warn!(
            "f16 overflow: {} values beyond ±65504 (or NaN) in {}: {} of {n} frames re-decoded in bf16",
            delivery.f16_overflows,
            vae.name,
            delivery.redone_frames
        );
    }
    Ok(FramesReport {
        f16_overflows: delivery.f16_overflows,
        redone_frames: delivery.redone_frames,
        frames: n,
        chunk,
        chunks,
        width,
        height,
        total_ms,
        frames_per_s: n as f64 / (total_ms / 1e3),
        latency: LatencySummary::of(&delivery.latency_ms),
        latency_ms: delivery.latency_ms,
        record_ms,
        submit_ms,
        wait_ms: delivery.wait_ms,
        callback_ms: delivery.callback_ms,
        dispatches,
        readback_bytes: n as u64 * frame_bytes,
        staging_bytes: staging.len() as u64 * staging_size,
        peak_allocated_bytes: memory.allocated_bytes.peak,
        peak_reserved_bytes: memory.reserved_bytes.peak,
        profile: times.profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_summary_uses_nearest_rank() {
        let s = LatencySummary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.mean_ms, s.p99_ms, s.max_ms), (3.0, 5.0, 5.0));
        let many: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(LatencySummary::of(&many).p99_ms, 198.0);
        assert!(LatencySummary::of(&[]).mean_ms.is_nan());
    }

    #[test]
    fn frame_shapes_are_checked() {
        let t = |shape: Vec<usize>| HostTensor {
            data: vec![0.5; shape.iter().product()],
            shape,
        };
        assert_eq!(frames_shape(&t(vec![5, 4, 2, 3]), 4).unwrap(), [5, 4, 2, 3]);
        assert_eq!(frames_shape(&t(vec![4, 2, 3]), 4).unwrap(), [1, 4, 2, 3]);
        let err = |x: &HostTensor| frames_shape(x, 4).unwrap_err().to_string();
        assert!(err(&t(vec![0, 4, 2, 3])).contains("no frames"));
        assert!(err(&t(vec![2, 3, 2, 3])).contains("expects 4"));
        assert!(err(&t(vec![4, 6])).contains("rank 2"));
        assert!(err(&t(vec![1, 4, 0, 3])).contains("empty"));
        let mut short = t(vec![2, 4, 2, 3]);
        short.data.pop();
        assert!(err(&short).contains("do not fill"));
        let mut nan = t(vec![2, 4, 2, 3]);
        nan.data[30] = f32::INFINITY;
        assert!(err(&nan).contains("frame 1"));
        assert_eq!(staging_slots(5, 2), 2);
        assert_eq!(staging_slots(5, 5), 1);
    }
}
