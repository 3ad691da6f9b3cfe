//! The main job: latents in host memory → decoded images, a thin front end
//! over the runner (`run`), which also predicts its memory (the same
//! decode on a null device, see [`crate::estimate::Estimate`]).
//!
//! A decode runs untiled (one recorded forward, one submit) or tiled (see
//! [`crate::tiling`]): `exact` tiles equal the untiled output up to float
//! rounding within a memory budget, `fast` tiles are independent and blended
//! like diffusers. `auto` (the default) decodes untiled whenever the whole
//! decode fits the budget and the device's limits, as predicted on a null device.

use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::to_rgba8;
use crate::memory::MemoryStats;
use crate::models::{ImageDecoder, Taps, Vae};
use crate::run::fast::{run_fast, FastGrid, FastTile, TileRun};
use crate::run::strategy::{choose, input_of, rows_to_run, Geometry, Strategy};
use crate::run::{ms_since, precision, run_exact, run_untiled, tiles_of, untiled_report, Replay};
use crate::tensor::{DType, Tensor};
use crate::tiling::{ExactPlan, Progress, Tiling, TilingReport};

pub use crate::run::input::DeviceLatents;

/// Options for [`decode`].
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Latents are already decoder input (skip `/ scaling_factor + shift_factor`).
    pub raw_latents: bool,
    /// Also read back the raw float output.
    pub keep_raw: bool,
    /// Tiling mode, tile size and memory budget (default: auto).
    pub tiling: Tiling,
    /// Called once per tile step of a tiled decode.
    pub progress: Option<Progress>,
    /// Time every kernel with GPU timestamps (when the adapter can).
    pub profile: bool,
    /// Return an f16 decode that overflowed as it is (counted in
    /// [`Decoded::f16_overflows`]) instead of re-decoding it in bf16.
    pub keep_f16_overflow: bool,
}

/// Where a decode's wall time went. Tiled decodes submit many times: their
/// `gpu_wait_ms` sums the host's waits for the device (syncs, parked-tile
/// readbacks, profiled submits), `readback_ms` is the final gather (with the
/// wait for the last steps), and `record_ms` the rest of the wall time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Recording commands on the CPU (plan tracing excluded).
    pub record_ms: f64,
    /// From submit until the GPU finished.
    pub gpu_wait_ms: f64,
    /// Copying results back to the host.
    pub readback_ms: f64,
}

/// What a decode produced.
pub struct Decoded {
    /// Packed RGBA8 pixels per image, row-major (empty in dry runs).
    pub rgba: Vec<Vec<u8>>,
    /// Image width in pixels.
    pub width: usize,
    /// Image height in pixels.
    pub height: usize,
    /// Raw decoder output [N, C, H, W] when asked for (C = `channels`).
    pub raw: Option<HostTensor>,
    /// The model's image channels ([`Vae::image_channels`]): 3 (RGB, alpha
    /// 255 in `rgba`) or 4 (RGBA: alpha in `rgba` is the model's).
    pub channels: usize,
    /// Wall time from upload to pixels on the host.
    pub decode_ms: f64,
    /// Pool statistics, peaks over this decode (weights included).
    pub memory: MemoryStats,
    /// Host-side time split: recording, GPU wait, readback.
    pub timings: Timings,
    /// Multiply-accumulates the decode's kernels performed (GFLOP/s = 2·MACs / time);
    /// tiled decodes count every tile step, halos included.
    pub macs: u64,
    /// Per-kernel (and per-copy) GPU times when profiling was asked for and
    /// available; summed over all submits of a tiled decode.
    pub profile: Option<crate::gpu::Profile>,
    /// How the decode was tiled.
    pub tiling: TilingReport,
    /// Storage dtype the pixels were decoded in (bf16 after an f16 overflow).
    pub dtype: DType,
    /// Values f16 convolutions could not hold (0 unless the model ran in f16).
    pub f16_overflows: u64,
    /// What was done about an f16 overflow, when one happened.
    pub precision_note: Option<String>,
}

/// Records a whole decode of decoder-input latents `z` [N, C, h, w]: upload,
/// decoder, RGBA8 conversion. Returns (raw output, RGBA8 pixels).
///
/// f16 models count overflowing stores into the recorder's range flag
/// ([`Recorder::range_flag`]); read it after the submit.
#[doc(hidden)]
pub fn record_decode(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<(Tensor, Tensor)> {
    record_image_decode(rec, vae.image_decoder("decoding images")?, z)
}

/// [`record_decode`] of an image decoder.
pub(crate) fn record_image_decode(
    rec: &mut Recorder,
    vae: &ImageDecoder,
    z: &HostTensor,
) -> Result<(Tensor, Tensor)> {
    crate::run::input::track_f16(rec, vae)?;
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    let raw = vae.forward(rec, input, &mut Taps::default())?;
    let [n, _, h, w] = crate::models::layers::dims4(&raw)?;
    let pixels = Tensor::empty(rec.ctx(), &[n, h, w], DType::Rgba8, "rgba8 image")?;
    to_rgba8(rec, &raw, vae.output_range(), &pixels)?;
    Ok((raw, pixels))
}

pub(crate) fn plan_key(vae: &ImageDecoder, shape: &[usize]) -> String {
    format!("vae{}:{shape:?}", vae.id)
}

/// The replay of an untiled decode of latents of `shape` (see [`record_decode`]).
pub(crate) fn decode_replay<'a>(
    ctx: &'a Context,
    vae: &ImageDecoder,
    shape: &[usize],
) -> Result<Replay<'a>> {
    let z = HostTensor {
        shape: shape.to_vec(),
        data: vec![0.0; shape.iter().product()],
    };
    Replay::recorded(
        ctx,
        || plan_key(vae, shape),
        |rec| record_image_decode(rec, vae, &z),
    )
}

/// The replay of an untiled decode of device latents of `shape` (the
/// recording of [`crate::run::input::record_decoder_from_buffer`], whose
/// allocations differ from a host decode's when it un-normalises on the GPU).
pub(crate) fn device_decode_replay<'a>(
    ctx: &'a Context,
    vae: &ImageDecoder,
    shape: [usize; 4],
    raw_latents: bool,
) -> Result<Replay<'a>> {
    Replay::recorded(
        ctx,
        || format!("{}:device:{raw_latents}", plan_key(vae, &shape)),
        |rec| {
            let raw =
                crate::run::input::record_decoder_from_buffer(rec, vae, shape, None, raw_latents)?;
            let [n, _, h, w] = crate::models::layers::dims4(&raw)?;
            let pixels = Tensor::empty(rec.ctx(), &[n, h, w], DType::Rgba8, "rgba8 image")?;
            to_rgba8(rec, &raw, vae.output_range(), &pixels)
        },
    )
}

/// A decode as the runner sees it.
#[derive(Clone, Copy)]
struct DecodeJob<'a> {
    vae: &'a ImageDecoder,
    z: &'a HostTensor,
    keep_raw: bool,
}

/// Host outputs of an exact tiled decode: (RGBA8, raw f32 bytes, H, W, gather ms).
type ExactImages = (Option<Vec<u8>>, Option<Vec<u8>>, usize, usize, f64);

impl DecodeJob<'_> {
    fn exact(
        &self,
        ctx: &Context,
        plan: ExactPlan,
        profile: bool,
        progress: Option<Progress>,
    ) -> Result<crate::run::ExactRun<ExactImages>> {
        let (vae, keep_raw) = (self.vae, self.keep_raw);
        let how = (profile, true, progress);
        run_exact(ctx, plan, how, (vae.dtype, self.z), |ex, input| {
            let (rgba, raw) = vae.forward_tiled(ex, input, keep_raw)?;
            let (height, width) = (rgba.h, rgba.w);
            let reading = Instant::now();
            let raw = match raw {
                Some(r) => ex.gather_host(r)?.into_data(),
                None => None,
            };
            let rgba = ex.gather_host(rgba)?.into_data();
            Ok((rgba, raw, height, width, ms_since(reading)))
        })
    }
}

/// Decodes `latents` with `vae`: pipeline latents [N, C, h, w] (FLUX.2's
/// 128-channel maps included), a token sequence [N, L, F] on a square grid
/// (others: [`Vae::unpack_tokens`] with the image size first), or raw z with
/// `opts.raw_latents` (see [`Vae::decoder_input`]). Untiled: one recorded forward,
/// one submit; tiled as `opts.tiling` says. On a null device
/// ([`Context::null`]) nothing runs and only the memory figures are real.
pub fn decode(
    ctx: &Context,
    vae: &Vae,
    latents: &HostTensor,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    decode_image(ctx, vae.image_decoder("decoding images")?, latents, opts)
}

/// [`decode`] with an image decoder (the model or its bf16 twin).
pub(crate) fn decode_image(
    ctx: &Context,
    vae: &ImageDecoder,
    latents: &HostTensor,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    decode_checked(ctx, vae, latents, opts, true)
}

/// [`decode`]; `check_values` false: latents known to be finite (the zeros
/// of an estimate, whose scan of gigabytes would cost seconds) are not
/// scanned for non-finite values.
pub(crate) fn decode_checked(
    ctx: &Context,
    vae: &ImageDecoder,
    latents: &HostTensor,
    opts: &DecodeOptions,
    check_values: bool,
) -> Result<Decoded> {
    // Token sequences, pipeline maps or raw z, as the model's latent form says.
    let z = vae.decoder_input_cow(latents, opts.raw_latents, None, check_values)?;
    let job = DecodeJob {
        vae,
        z: &z,
        keep_raw: opts.keep_raw,
    };
    let record = |rec: &mut Recorder, z: &HostTensor| record_image_decode(rec, vae, z).map(|_| ());
    let exact = |null: &Context, plan: &ExactPlan| {
        let z = input_of(&z, plan, 1);
        let job = DecodeJob { z: &z, ..job };
        job.exact(null, plan.clone(), false, None).map(|r| r.report)
    };
    let floor = vae
        .graph()
        .parked_floor(z.shape[0], (z.shape[2], z.shape[3]));
    let geometry = Geometry::decode(&z, vae.levels(), vae.upscale()).with_parked_floor(floor);
    let (strategy, budget) = choose(ctx, &geometry, &opts.tiling, &record, &exact)?;
    let mut out = match strategy {
        Strategy::Untiled => decode_untiled(ctx, &job, opts),
        Strategy::Exact(plan) => decode_exact(ctx, &job, plan, opts),
        Strategy::Fast { px, overlap } => decode_fast(ctx, &job, px, overlap, opts),
    }?;
    out.tiling.max_memory = budget;
    if let (true, Some(raw)) = (vae.clamps_output(), out.raw.as_mut()) {
        // As diffusers returns it (the pixels are clamped for every model).
        raw.data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
    }
    if out.f16_overflows > 0 && !opts.keep_f16_overflow {
        let twin = vae.bf16_twin(ctx)?;
        let (mut again, note) =
            precision::redo_in_bf16(out.f16_overflows, &vae.name, "re-decoded", || {
                decode_image(ctx, twin, latents, opts).map_err(|e| match e {
                    Error::NonFiniteOutput {
                        model,
                        count,
                        total,
                        ..
                    } => Error::NonFiniteOutput {
                        model,
                        count,
                        total,
                        f16: true,
                    },
                    e => e,
                })
            })?;
        again.f16_overflows = out.f16_overflows;
        again.precision_note = Some(note);
        again.decode_ms += out.decode_ms;
        return Ok(again);
    }
    if !ctx.is_null() && !opts.keep_f16_overflow {
        check_finite_pixels(&vae.name, out.channels, &out.rgba)?;
        if let Some(raw) = out.raw.as_ref().filter(|_| out.channels != 3) {
            let shape = crate::models::layers::dims4_of(&raw.shape)?;
            let count = crate::kernels::image::cpu_count_non_finite(&raw.data, shape);
            non_finite(&vae.name, count, (shape[0] * shape[2] * shape[3]) as u64)?;
        }
    }
    Ok(out)
}

/// An error when any pixel of packed RGBA8 images of 3 channels is marked
/// non-finite (alpha 0, see [`crate::kernels::image::to_rgba8`]). A
/// 4-channel image's alpha 0 may be the model's: its pixels are not
/// checked here, only its raw output when read back.
pub(crate) fn check_finite_pixels<B: AsRef<[u8]>>(
    model: &str,
    channels: usize,
    images: &[B],
) -> Result<()> {
    if channels != 3 {
        return Ok(());
    }
    let count: u64 = images
        .iter()
        .map(|b| crate::kernels::image::count_non_finite(b.as_ref()))
        .sum();
    let total = images.iter().map(|b| b.as_ref().len() as u64 / 4).sum();
    non_finite(model, count, total)
}

/// An error when `count` of `total` pixels have a NaN or infinite channel.
fn non_finite(model: &str, count: u64, total: u64) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    Err(Error::NonFiniteOutput {
        model: model.to_string(),
        count,
        total,
        f16: false,
    })
}

fn split_images(bytes: Vec<u8>, n: usize) -> Vec<Vec<u8>> {
    if n <= 1 {
        // No copy: a null device's zeros stay untouched (uncommitted) pages.
        return vec![bytes];
    }
    let per = bytes.len() / n.max(1);
    bytes.chunks_exact(per.max(1)).map(|c| c.to_vec()).collect()
}

/// A decode's result before the front end's fields are filled in.
fn decoded(
    ctx: &Context,
    vae: &ImageDecoder,
    (width, height): (usize, usize),
    tiling: TilingReport,
) -> Decoded {
    Decoded {
        rgba: Vec::new(),
        width,
        height,
        raw: None,
        channels: vae.image_channels(),
        decode_ms: 0.0,
        memory: ctx.pool().stats(),
        timings: Timings::default(),
        macs: 0,
        profile: None,
        tiling,
        dtype: vae.dtype,
        f16_overflows: 0,
        precision_note: None,
    }
}

fn decode_untiled(ctx: &Context, job: &DecodeJob, opts: &DecodeOptions) -> Result<Decoded> {
    let (vae, z) = (job.vae, job.z);
    let replay = decode_replay(ctx, vae, &z.shape)?;
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let run = run_untiled(
        ctx,
        replay,
        opts.profile,
        |rec| record_image_decode(rec, vae, z),
        |(raw, pixels)| {
            let mut wanted = vec![pixels];
            wanted.extend(opts.keep_raw.then_some(raw));
            wanted
        },
    )?;
    let (raw, _) = &run.out;
    let [n, _, height, width] = crate::models::layers::dims4(raw)?;
    let mut bytes = run.bytes.into_iter();
    let rgba = split_images(bytes.next().unwrap_or_default(), n);
    let raw = match bytes.next() {
        Some(b) => Some(HostTensor::new(
            raw.shape().to_vec(),
            raw.f32_from_bytes(&b)?,
        )?),
        None => None,
    };
    let report = untiled_report();
    Ok(Decoded {
        rgba,
        raw,
        timings: Timings {
            record_ms: run.record_ms,
            gpu_wait_ms: run.gpu_wait_ms,
            readback_ms: run.readback_ms,
        },
        macs: run.labels.iter().map(|l| l.macs).sum(),
        profile: run.profile,
        decode_ms: ms_since(start),
        f16_overflows: run.f16_overflows,
        ..decoded(ctx, vae, (width, height), report)
    })
}

fn decode_exact(
    ctx: &Context,
    job: &DecodeJob,
    plan: ExactPlan,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    // An estimate of a plan made on a few rows of tiles runs those rows:
    // their peaks are the whole run's, its counts come with the plan.
    let shown = job.z;
    let (plan, rows) = rows_to_run(ctx, plan, job.z, 1);
    let rows_job;
    let job = match &rows {
        Some((_, z)) => {
            rows_job = DecodeJob { z, ..*job };
            &rows_job
        }
        None => job,
    };
    let by_rows = rows.as_ref().map(|r| r.0);
    let (vae, z) = (job.vae, job.z);
    let key = || {
        format!(
            "{}:{}:raw{}",
            plan_key(vae, &z.shape),
            plan.key(),
            job.keep_raw
        )
    };
    let replay = Replay::begin(ctx, key, |null| {
        job.exact(null, plan.clone(), false, None).map(|_| ())
    })?;
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let result = job.exact(ctx, plan, opts.profile, opts.progress.clone());
    drop(replay);
    let run = result?;
    let (rgba, raw, height, width, readback_ms) = run.out;
    let n = z.shape[0];
    let raw = match raw {
        Some(b) => Some(HostTensor::new(
            vec![n, vae.image_channels(), height, width],
            bytemuck::pod_collect_to_vec::<u8, f32>(&b),
        )?),
        None => None,
    };
    let mut report = run.report;
    let (height, width) = match by_rows {
        Some(b) => {
            b.counts.apply(&mut report);
            let up = height / z.shape[2].max(1);
            (shown.shape[2] * up, shown.shape[3] * up)
        }
        None => (height, width),
    };
    report.tiles = tiles_of(&report, height, width);
    let decode_ms = ms_since(start);
    Ok(Decoded {
        rgba: rgba.map(|b| split_images(b, n)).unwrap_or_default(),
        raw,
        decode_ms,
        // Summed over the tile steps' submits; host time outside waits and
        // the final gather counts as recording.
        timings: Timings {
            record_ms: (decode_ms - run.stats.wait_ms - readback_ms).max(0.0),
            gpu_wait_ms: run.stats.wait_ms,
            readback_ms,
        },
        macs: run.stats.macs,
        profile: run.stats.profile,
        f16_overflows: run.f16_overflows,
        ..decoded(ctx, vae, (width, height), report)
    })
}

/// Fast tiling exactly as diffusers' `AutoencoderKL.tiled_decode`: latent
/// tiles of `px / 8` with a stride of `(px - overlap) / 8`, each decoded
/// independently (its own GroupNorm statistics and attention), blended over
/// `overlap` pixels and cropped to `px - overlap` (see [`crate::run::fast`]).
fn decode_fast(
    ctx: &Context,
    job: &DecodeJob,
    px: usize,
    overlap: usize,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let (vae, z) = (job.vae, job.z);
    let up = vae.upscale();
    let (n, height, width) = (z.shape[0], z.shape[2] * up, z.shape[3] * up);
    let grid = FastGrid {
        tile: px / up,
        stride: (px - overlap) / up,
        extent: overlap,
        limit: px - overlap,
        out: (height, width),
    };
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let (mut f16_overflows, mut stats) = (0, crate::gpu::SubmitStats::default());
    if opts.profile && crate::gpu::Profiler::new(ctx).is_none() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    let mut image = run_fast(z, &grid, opts.progress.as_ref(), |zt| {
        ctx.check_cancel()?;
        let replay = decode_replay(ctx, vae, &zt.shape)?;
        let run = run_untiled(
            ctx,
            replay,
            false,
            |rec| {
                if opts.profile {
                    rec.enable_profiling();
                }
                record_image_decode(rec, vae, zt)
            },
            |(raw, _)| vec![raw],
        )?;
        let (raw, _) = &run.out;
        let [_, c, th, tw] = crate::models::layers::dims4(raw)?;
        f16_overflows += run.f16_overflows;
        stats.wait_ms += run.gpu_wait_ms + run.readback_ms;
        stats.add(&run.labels, run.profile);
        let data = raw.f32_from_bytes(&run.bytes[0])?;
        Ok(TileRun {
            tile: FastTile { h: th, w: tw, data },
            channels: c,
            readback: (n * c * th * tw * 4) as u64,
        })
    })?;
    let c = vae.image_channels();
    let planes = n * c;
    let img = std::mem::take(&mut image.data);
    // The GPU kernel's bytes (alpha 0 marks a non-finite pixel).
    let shape = [n, c, height, width];
    let rgba = crate::kernels::image::cpu_image_to_rgba8(&img, shape, vae.output_range());
    let rgba = split_images(rgba, n);
    let raw = opts
        .keep_raw
        .then(|| HostTensor::new(shape.to_vec(), img))
        .transpose()?;
    // Two rows of f32 tiles for blending and the full-resolution f32
    // image they are cropped into.
    let parked = 2 * image.cols * planes * px * px * 4 + planes * height * width * 4;
    let report = image.report(px, overlap, parked as u64);
    Ok(Decoded {
        rgba,
        raw,
        decode_ms: ms_since(start),
        // Per tile: submit, wait and read back the raw output; the host
        // blend and the RGBA conversion count as recording.
        timings: Timings {
            record_ms: (ms_since(start) - stats.wait_ms).max(0.0),
            gpu_wait_ms: stats.wait_ms,
            readback_ms: 0.0,
        },
        macs: stats.macs,
        profile: stats.profile,
        f16_overflows,
        ..decoded(ctx, vae, (width, height), report)
    })
}
