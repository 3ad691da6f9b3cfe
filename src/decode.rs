//! The main job: latents in host memory → decoded images, and the memory
//! estimate of the same decode (a dry run through the same code).
//!
//! A decode runs untiled (one recorded forward, one submit) or tiled (see
//! [`crate::tiling`]): `exact` tiles equal the untiled output up to float
//! rounding within a memory budget, `fast` tiles are independent and blended
//! like diffusers. `auto` (the default) decodes untiled whenever the whole
//! decode fits the budget and the device's limits, as predicted by a dry run.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::to_rgba8;
use crate::memory::{
    plan_greedy_by_size, round_up, AllocationTrace, MemoryPool, MemoryStats, PlannedPool, Policy,
    TracingPool,
};
use crate::models::{LoadOptions, Taps, Vae};
use crate::tensor::{DType, Tensor};
use crate::tiling::{
    ExactPlan, Executor, Progress, ProgressUpdate, TileMode, Tiling, TilingReport,
    FAST_DEFAULT_TILE,
};

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
    /// Raw decoder output [N, 3, H, W] when asked for.
    pub raw: Option<HostTensor>,
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
pub fn record_decode(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<(Tensor, Tensor)> {
    track_f16(rec, vae)?;
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    let raw = vae.forward(rec, input, &mut Taps::default())?;
    let [n, _, h, w] = crate::models::layers::dims4(&raw)?;
    let pixels = Tensor::empty(rec.ctx(), &[n, h, w], DType::Rgba8, "rgba8 image")?;
    to_rgba8(rec, &raw, vae.output_range(), &pixels)?;
    Ok((raw, pixels))
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

pub(crate) fn plan_key(vae: &Vae, shape: &[usize]) -> String {
    format!("vae{}:{shape:?}", vae.id)
}

/// Largest trace the planned pool plans (greedy placement is quadratic in
/// the number of allocations); longer tiled decodes allocate one buffer per
/// tensor instead, as the exact policy.
const MAX_PLANNED_ALLOCATIONS: usize = 8192;

/// For a planned pool: traces `run` once in a dry run under `key` and
/// installs its plan; `None` when the trace is too long to plan.
pub(crate) fn ensure_plan_with(
    ctx: &Context,
    planned: &PlannedPool,
    key: String,
    run: impl FnOnce(&Context) -> Result<()>,
) -> Result<Option<String>> {
    if !planned.has_plan(&key) {
        let tracer = Arc::new(TracingPool::new());
        let dry = Context::dry_run(ctx.caps().clone(), tracer.clone());
        run(&dry)?;
        let trace = tracer.trace();
        if trace.entries.len() > MAX_PLANNED_ALLOCATIONS {
            return Ok(None);
        }
        let caps = ctx.caps();
        let plan = plan_greedy_by_size(
            &trace,
            caps.min_storage_buffer_offset_alignment as u64,
            caps.max_buffer_size,
        )?;
        planned.install_plan(&key, plan);
    }
    Ok(Some(key))
}

/// Peak of live bytes of a trace with every size rounded up to `align`
/// (what a planned pool's replay counts as allocated).
fn traced_peak(trace: &AllocationTrace, align: u64) -> u64 {
    let mut events: Vec<(usize, i64)> = Vec::with_capacity(2 * trace.entries.len());
    for e in &trace.entries {
        let size = round_up(e.bytes.max(4), align) as i64;
        events.push((e.start, size));
        if e.end != usize::MAX {
            events.push((e.end, -size));
        }
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, d) in events {
        live += d;
        peak = peak.max(live);
    }
    peak as u64
}

/// Peak allocated bytes of `run` in a dry run that predicts `ctx`'s pool: a
/// fresh pool of the same policy; for planned pools, the traced peak with
/// sizes rounded as a replay rounds them (an upper bound when the decode is
/// too long to plan).
pub(crate) fn dry_peak_of<T>(
    ctx: &Context,
    run: impl FnOnce(&Context) -> Result<T>,
) -> Result<(u64, T)> {
    if ctx.pool().policy_name() == Policy::Planned.name() {
        let tracer = Arc::new(TracingPool::new());
        let dry = Context::dry_run(ctx.caps().clone(), tracer.clone());
        let out = run(&dry)?;
        let align = ctx.caps().min_storage_buffer_offset_alignment as u64;
        Ok((traced_peak(&tracer.trace(), align), out))
    } else {
        let dry = Context::dry_run(ctx.caps().clone(), same_policy_pool(ctx));
        let out = run(&dry)?;
        Ok((dry.pool().stats().allocated_bytes.peak, out))
    }
}

/// For a planned pool: traces this decode once in a dry run and installs its plan.
fn ensure_plan(
    ctx: &Context,
    planned: &PlannedPool,
    vae: &Vae,
    z: &HostTensor,
) -> Result<Option<String>> {
    ensure_plan_with(ctx, planned, plan_key(vae, &z.shape), |dry| {
        let mut rec = Recorder::new(dry);
        record_decode(&mut rec, vae, z).map(|_| ())
    })
}

/// A fresh pool of the context's policy, for dry runs that predict it.
fn same_policy_pool(ctx: &Context) -> Arc<dyn MemoryPool> {
    ctx.pool()
        .policy_name()
        .parse::<Policy>()
        .unwrap_or(Policy::Exact)
        .new_pool()
}

/// Errors that mean "too large for this device", which tiling can avoid.
pub(crate) fn is_limit_error(e: &Error) -> bool {
    matches!(
        e,
        Error::BindingTooLarge { .. }
            | Error::BufferTooLarge { .. }
            | Error::DispatchTooLarge { .. }
    )
}

/// How one decode runs.
enum Strategy {
    Untiled,
    Exact(ExactPlan),
    Fast { px: usize, overlap: usize },
}

/// Decodes `latents` [N, C, h, w] with `vae`. Untiled: one recorded forward,
/// one submit; tiled as `opts.tiling` says. In a dry-run context nothing
/// runs and only the memory figures are real.
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
    let budget = opts.tiling.budget(ctx.caps());
    let base = ctx.pool().stats().allocated_bytes.current;
    let strategy = choose_strategy(ctx, vae, &z, opts, budget, base)?;
    let mut out = match strategy {
        Strategy::Untiled => decode_untiled(ctx, vae, &z, opts),
        Strategy::Exact(plan) => decode_exact(ctx, vae, &z, plan, opts),
        Strategy::Fast { px, overlap } => decode_fast(ctx, vae, &z, px, overlap, opts),
    }?;
    out.tiling.max_memory = budget;
    if out.f16_overflows > 0 && !opts.keep_f16_overflow {
        // Values beyond ±65504 were saturated: the image is wrong. bf16 has
        // f32's range; decode again with a bf16 copy of the model.
        let twin = vae.bf16_twin(ctx)?;
        let note = format!(
            "f16 overflow: {} values beyond ±65504 (or NaN) in {}; re-decoded in bf16",
            out.f16_overflows, vae.name
        );
        log::warn!("{note}");
        let mut again = decode(ctx, twin, latents, opts)?;
        again.f16_overflows = out.f16_overflows;
        again.precision_note = Some(note);
        again.decode_ms += out.decode_ms;
        return Ok(again);
    }
    Ok(out)
}

fn choose_strategy(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    opts: &DecodeOptions,
    budget: u64,
    base: u64,
) -> Result<Strategy> {
    let tiling = &opts.tiling;
    let up = vae.upscale();
    match tiling.mode {
        TileMode::Off => Ok(Strategy::Untiled),
        TileMode::Fast => {
            let mut px = round_to(tiling.tile_size.unwrap_or(FAST_DEFAULT_TILE), up);
            loop {
                let overlap = tiling.overlap.unwrap_or(px / 4 / up * up);
                if !overlap.is_multiple_of(up) || overlap >= px {
                    return Err(Error::InvalidInput(format!(
                        "--tile-overlap {overlap}: must be a multiple of {up} below the tile size {px}"
                    )));
                }
                // The largest tile must decode within the budget.
                let (th, tw) = ((px / up).min(z.shape[2]), (px / up).min(z.shape[3]));
                let probe = HostTensor {
                    shape: vec![z.shape[0], z.shape[1], th, tw],
                    data: vec![0.0; z.shape[0] * z.shape[1] * th * tw],
                };
                if untiled_fits(ctx, vae, &probe, budget, base)? {
                    return Ok(Strategy::Fast { px, overlap });
                }
                if tiling.tile_size.is_some() || px <= 8 * up {
                    return Err(Error::InvalidInput(format!(
                        "a {px}-pixel fast tile does not decode within the memory budget of {budget} bytes; lower --tile-size or raise --max-memory"
                    )));
                }
                px = round_to(px / 2, up);
            }
        }
        TileMode::Auto => {
            if untiled_fits(ctx, vae, z, budget, base)? {
                Ok(Strategy::Untiled)
            } else {
                Ok(Strategy::Exact(choose_exact_decode(
                    ctx, vae, z, opts, budget, base,
                )?))
            }
        }
        TileMode::Exact => Ok(Strategy::Exact(choose_exact_decode(
            ctx, vae, z, opts, budget, base,
        )?)),
    }
}

/// `px` rounded up to a positive multiple of `m`.
pub(crate) fn round_to(px: usize, m: usize) -> usize {
    px.max(1).div_ceil(m) * m
}

/// True when the untiled decode stays within the device limits and `budget`.
fn untiled_fits(ctx: &Context, vae: &Vae, z: &HostTensor, budget: u64, base: u64) -> Result<bool> {
    fits_budget(ctx, budget, base, |dry| {
        let mut rec = Recorder::new(dry);
        record_decode(&mut rec, vae, z).map(|_| ())
    })
}

/// True when `run` (one untiled pass, run in a dry-run context) stays within
/// the device limits and `budget` on top of `base` bytes already allocated.
pub(crate) fn fits_budget(
    ctx: &Context,
    budget: u64,
    base: u64,
    run: impl FnOnce(&Context) -> Result<()>,
) -> Result<bool> {
    match dry_peak_of(ctx, run) {
        Ok((peak, ())) => Ok(base + peak <= budget),
        Err(e) if is_limit_error(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Tile sizes (output pixels) tried when none is given, largest first.
const TILE_CANDIDATES: [usize; 16] = [
    4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 16,
];

/// The resolution pyramid of a tiled run: level 0 (the latent) is `small`
/// `(h, w)`, each further level twice as large; tile sizes count pixels of
/// the largest level, `scale` = 2^(levels − 1) of them per latent pixel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pyramid {
    pub levels: usize,
    pub scale: usize,
    pub small: (usize, usize),
}

/// One exact tiled run (decode or encode) of a plan in the given context,
/// returning its report; [`choose_exact`] calls it in dry runs.
pub(crate) type TiledRun<'a> = dyn Fn(&Context, &ExactPlan) -> Result<TilingReport> + 'a;

/// The exact decode plan with the largest tile that fits `budget`.
fn choose_exact_decode(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    opts: &DecodeOptions,
    budget: u64,
    base: u64,
) -> Result<ExactPlan> {
    let pyramid = Pyramid {
        levels: vae.levels(),
        scale: vae.upscale(),
        small: (z.shape[2], z.shape[3]),
    };
    let run = |dry: &Context, plan: &ExactPlan| {
        run_exact(dry, vae, z, plan.clone(), (opts.keep_raw, false), None).map(|o| o.report)
    };
    let what = "decodes these latents";
    choose_exact(ctx, pyramid, &opts.tiling, budget, base, what, &run)
}

/// The exact plan with the largest tile that fits `budget` (or the given
/// tile), found with dry runs of `run`; `what` completes the error message
/// ("no tile size {what} within the memory budget").
pub(crate) fn choose_exact(
    ctx: &Context,
    pyramid: Pyramid,
    tiling: &Tiling,
    budget: u64,
    base: u64,
    what: &str,
    run: &TiledRun,
) -> Result<ExactPlan> {
    let avail = budget.checked_sub(base).ok_or_else(|| {
        Error::InvalidInput(format!(
            "the weights and other live tensors already use {base} bytes, more than the memory budget of {budget} bytes (--max-memory)"
        ))
    })?;
    let up = pyramid.scale;
    let levels = pyramid.levels;
    let top = levels - 1;
    let (h, w) = pyramid.small;
    let longest = round_to(h.max(w) * up, up);
    let candidates: Vec<usize> = match tiling.tile_size {
        Some(px) => vec![round_to(px, up)],
        None => std::iter::once(longest)
            .chain(
                TILE_CANDIDATES
                    .into_iter()
                    .filter(|&p| p < longest && p >= up),
            )
            .collect(),
    };
    // Fewest host transfers first (each byte parked on the host crosses the
    // bus twice), then fewer tile steps: a tile step costs about as much
    // as moving STEP_COST bytes. Stops at the first plan that parks nothing
    // on the host, or when smaller tiles stop helping.
    const STEP_COST: u64 = 1 << 20;
    const MAX_TILES: usize = 4096;
    let score = |r: &TilingReport| r.uploaded_bytes + r.readback_bytes + r.steps as u64 * STEP_COST;
    let mut best: Option<(u64, ExactPlan, u64)> = None;
    let mut worse = 0;
    let mut last_limit = None;
    let (out_h, out_w) = (h * up, w * up);
    for px in candidates {
        if best.is_some() && out_h.div_ceil(px) * out_w.div_ceil(px) > MAX_TILES {
            break;
        }
        let tiled: Vec<Option<usize>> = (0..levels)
            .map(|l| {
                let t = (px >> (top - l)).max(1);
                (t < h << l || t < w << l).then_some(t)
            })
            .collect();
        let mut mids = Vec::new();
        if !tiling.tile_mid_block {
            mids.push(None);
        }
        if tiled[0].is_some() || mids.is_empty() {
            mids.push(tiled[0]);
        }
        for mid in mids {
            let mut lv = tiled.clone();
            lv[0] = mid;
            let plan = ExactPlan {
                px,
                levels: lv,
                latent: (h, w),
                device_cap: 0,
                attention_state_budget: avail / 4,
                total_steps: 0,
                staging_limit: staging_limit(avail),
            };
            match fit_plan(ctx, plan, avail, run) {
                Ok(Some((plan, report))) => {
                    if report.host_parked_peak_bytes == 0 {
                        return Ok(plan);
                    }
                    let s = score(&report);
                    if best.as_ref().is_none_or(|(b, _, _)| s < *b) {
                        best = Some((s, plan, report.host_parked_peak_bytes));
                        worse = 0;
                    } else {
                        worse += 1;
                    }
                    break;
                }
                Ok(None) => {}
                Err(e) if is_limit_error(&e) => last_limit = Some(e),
                Err(e) => return Err(e),
            }
        }
        if worse >= 2 {
            break;
        }
    }
    if let Some((_, plan, host)) = best {
        let host_limit = tiling.max_host_memory.or_else(|| {
            (!ctx.is_dry_run())
                .then(crate::tiling::host_memory_available)
                .flatten()
        });
        if let Some(limit) = host_limit.filter(|&l| host > l) {
            return Err(Error::InvalidInput(format!(
                "this tiled run would park {:.1} MiB of tiles in host memory, but only {:.1} MiB are available ({}); raise --max-memory (fewer tiles parked on the host) or decode a smaller image",
                host as f64 / 1048576.0,
                limit as f64 / 1048576.0,
                if tiling.max_host_memory.is_some() {
                    "--max-host-memory"
                } else {
                    "MemAvailable in /proc/meminfo"
                }
            )));
        }
        return Ok(plan);
    }
    Err(match last_limit {
        Some(e) if tiling.tile_size.is_some() => e,
        _ => Error::InvalidInput(format!(
            "no tile size {what} within the memory budget of {budget} bytes ({:.0} MiB, of which {:.0} MiB are already in use by weights and other tensors); raise --max-memory{}",
            budget as f64 / 1048576.0,
            base as f64 / 1048576.0,
            if tiling.tile_size.is_some() { " or lower --tile-size" } else { "" }
        )),
    })
}

/// Runs an exact tiled decode and returns its host outputs and report.
struct ExactOutput {
    rgba: Option<Vec<u8>>,
    raw: Option<Vec<u8>>,
    height: usize,
    width: usize,
    report: TilingReport,
    f16_overflows: u32,
    /// MACs, GPU times and host wait of all tile steps.
    stats: crate::gpu::SubmitStats,
    /// Gathering the output on the host.
    readback_ms: f64,
}

fn run_exact(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    plan: ExactPlan,
    (keep_raw, profile): (bool, bool),
    progress: Option<Progress>,
) -> Result<ExactOutput> {
    let mut ex = Executor::new(ctx, plan, progress);
    if profile && !ex.enable_profiling() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    let range_flag = match vae.dtype {
        DType::F16 => Some(ex.track_f16_range()?),
        _ => None,
    };
    let shape = [z.shape[0], z.shape[1], z.shape[2], z.shape[3]];
    let input = ex.host_act(shape, &z.data);
    let (rgba, raw) = vae.forward_tiled(&mut ex, input, keep_raw)?;
    let (height, width) = (rgba.h, rgba.w);
    let reading = Instant::now();
    let raw = match raw {
        Some(r) => ex.gather_host(r)?,
        None => None,
    };
    let rgba = ex.gather_host(rgba)?;
    let readback_ms = reading.elapsed().as_secs_f64() * 1e3;
    let (report, stats) = ex.finish_with_stats()?;
    let f16_overflows = match &range_flag {
        Some(f) => crate::gpu::read_range_flag(ctx, f)?,
        None => 0,
    };
    Ok(ExactOutput {
        rgba,
        raw,
        f16_overflows,
        height,
        width,
        report,
        stats,
        readback_ms,
    })
}

/// Staging (upload and read-back buffers) a tiled run may hold: an eighth
/// of the budget left after the weights, at most [`STAGING_LIMIT`], at
/// least 64 KiB. [`fit_plan`] counts its measured peak against the budget.
pub(crate) fn staging_limit(avail: u64) -> u64 {
    (avail / 8).clamp(64 << 10, crate::tiling::STAGING_LIMIT)
}

/// Fits `plan` into `avail` bytes: the working set is the pool peak with
/// every tile parked on the host plus the staging peak; parked device bytes
/// get what remains, checked (and if need be lowered) with a second dry
/// run. Returns the plan and the report of its dry run.
fn fit_plan(
    ctx: &Context,
    mut plan: ExactPlan,
    avail: u64,
    run: &TiledRun,
) -> Result<Option<(ExactPlan, TilingReport)>> {
    // Pool peak and staging peak (device memory outside the pool) together.
    let dry_peak = |plan: &ExactPlan| {
        dry_peak_of(ctx, |dry| run(dry, plan)).map(|(peak, r)| (peak + r.staging_peak_bytes, r))
    };
    plan.device_cap = 0;
    let (working, report) = dry_peak(&plan)?;
    if working > avail {
        return Ok(None);
    }
    plan.total_steps = report.steps;
    let mut cap = avail - working;
    for _ in 0..4 {
        plan.device_cap = cap;
        let (peak, report) = dry_peak(&plan)?;
        if peak <= avail {
            return Ok(Some((plan, report)));
        }
        cap = cap.saturating_sub(peak - avail);
    }
    Ok(None)
}

fn split_images(bytes: Vec<u8>, n: usize) -> Vec<Vec<u8>> {
    let per = bytes.len() / n.max(1);
    bytes.chunks_exact(per.max(1)).map(|c| c.to_vec()).collect()
}

fn decode_untiled(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let plan = match planned {
        Some(p) => ensure_plan(ctx, p, vae, z)?,
        None => None,
    };
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let mut rec = Recorder::new(ctx);
    if opts.profile && !rec.enable_profiling() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    if let (Some(p), Some(key)) = (planned, &plan) {
        p.begin_replay(key)?;
    }
    let recorded = record_decode(&mut rec, vae, z);
    if let Some(p) = planned {
        p.end_replay();
    }
    let (raw, pixels) = recorded?;
    let range_flag = rec.range_flag().cloned();
    let mut timings = Timings {
        record_ms: start.elapsed().as_secs_f64() * 1e3,
        ..Default::default()
    };
    let submitted = Instant::now();
    let (labels, profile) = rec.submit_profiled()?;
    let macs = labels.iter().map(|l| l.macs).sum();
    if !ctx.is_dry_run() {
        ctx.wait_idle()?;
    }
    timings.gpu_wait_ms = submitted.elapsed().as_secs_f64() * 1e3;
    let read_start = Instant::now();
    let [n, _, height, width] = crate::models::layers::dims4(&raw)?;
    let (rgba, raw_host, f16_overflows) = if ctx.is_dry_run() {
        (Vec::new(), None, 0)
    } else {
        // One readback: pixels, the raw output when asked for, the f16 counter.
        let mut wanted = vec![&pixels];
        wanted.extend(opts.keep_raw.then_some(&raw));
        wanted.extend(range_flag.as_ref());
        let mut back = crate::gpu::read_back(ctx, &wanted)?.into_iter();
        let bytes = back.next().unwrap_or_default();
        let raw_host = match opts.keep_raw {
            true => {
                let values = raw.f32_from_bytes(&back.next().unwrap_or_default())?;
                Some(HostTensor::new(raw.shape().to_vec(), values)?)
            }
            false => None,
        };
        let count = back.next().map_or(0, |b| crate::gpu::range_count(&b));
        (split_images(bytes, n), raw_host, count)
    };
    debug_assert!(rgba.is_empty() || rgba.len() == n);
    timings.readback_ms = read_start.elapsed().as_secs_f64() * 1e3;
    Ok(Decoded {
        timings,
        macs,
        profile,
        rgba,
        width,
        height,
        raw: raw_host,
        decode_ms: start.elapsed().as_secs_f64() * 1e3,
        memory: ctx.pool().stats(),
        dtype: vae.dtype,
        f16_overflows: f16_overflows as u64,
        precision_note: None,
        tiling: TilingReport {
            mode: "untiled".into(),
            tiles: 1,
            steps: 1,
            ..Default::default()
        },
    })
}

fn decode_exact(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    plan: ExactPlan,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let key = match planned {
        Some(p) => {
            let key = format!(
                "{}:{}:raw{}",
                plan_key(vae, &z.shape),
                plan.key(),
                opts.keep_raw
            );
            ensure_plan_with(ctx, p, key, |dry| {
                run_exact(dry, vae, z, plan.clone(), (opts.keep_raw, false), None).map(|_| ())
            })?
        }
        None => None,
    };
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    if let (Some(p), Some(key)) = (planned, &key) {
        p.begin_replay(key)?;
    }
    let result = run_exact(
        ctx,
        vae,
        z,
        plan,
        (opts.keep_raw, opts.profile),
        opts.progress.clone(),
    );
    if let Some(p) = planned {
        p.end_replay();
    }
    let out = result?;
    let n = z.shape[0];
    let (height, width) = (out.height, out.width);
    let rgba = out.rgba.map(|b| split_images(b, n)).unwrap_or_default();
    let raw = match out.raw {
        Some(b) => Some(HostTensor::new(
            vec![n, 3, height, width],
            bytemuck::pod_collect_to_vec::<u8, f32>(&b),
        )?),
        None => None,
    };
    let mut report = out.report;
    report.tiles = {
        let px = report.tile_size.unwrap_or(height.max(width)).max(1);
        height.div_ceil(px) * width.div_ceil(px)
    };
    let decode_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Decoded {
        rgba,
        width,
        height,
        raw,
        decode_ms,
        memory: ctx.pool().stats(),
        tiling: report,
        // Summed over the tile steps' submits; host time outside waits and
        // the final gather counts as recording.
        timings: Timings {
            record_ms: (decode_ms - out.stats.wait_ms - out.readback_ms).max(0.0),
            gpu_wait_ms: out.stats.wait_ms,
            readback_ms: out.readback_ms,
        },
        macs: out.stats.macs,
        profile: out.stats.profile,
        dtype: vae.dtype,
        f16_overflows: out.f16_overflows as u64,
        precision_note: None,
    })
}

/// A decoded fast-mode tile `[N, 3, h, w]` on the host.
pub(crate) struct FastTile {
    pub h: usize,
    pub w: usize,
    pub data: Vec<f32>,
}

/// diffusers' `blend_v`: the first rows of `b` fade in over the last rows of `a`.
pub(crate) fn blend_v(a: &FastTile, b: &mut FastTile, planes: usize, extent: usize) {
    let e = a.h.min(b.h).min(extent);
    for y in 0..e {
        let (wa, wb) = ramp(y, e);
        for p in 0..planes {
            let ra = (p * a.h + a.h - e + y) * a.w;
            let rb = (p * b.h + y) * b.w;
            for x in 0..b.w.min(a.w) {
                b.data[rb + x] = a.data[ra + x] * wa + b.data[rb + x] * wb;
            }
        }
    }
}

/// diffusers' `blend_h`: the first columns of `b` fade in over the last columns of `a`.
pub(crate) fn blend_h(a: &FastTile, b: &mut FastTile, planes: usize, extent: usize) {
    let e = a.w.min(b.w).min(extent);
    for p in 0..planes {
        for y in 0..b.h.min(a.h) {
            let ra = (p * a.h + y) * a.w;
            let rb = (p * b.h + y) * b.w;
            for x in 0..e {
                let (wa, wb) = ramp(x, e);
                b.data[rb + x] = a.data[ra + a.w - e + x] * wa + b.data[rb + x] * wb;
            }
        }
    }
}

/// Weights `(1 - i/e, i/e)` as PyTorch applies Python floats to f32 tensors.
fn ramp(i: usize, e: usize) -> (f32, f32) {
    let t = i as f64 / e as f64;
    ((1.0 - t) as f32, t as f32)
}

/// One untiled decode of a tile, raw output read back (`None` in dry runs).
fn decode_tile_raw(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    profile: bool,
    stats: &mut crate::gpu::SubmitStats,
) -> Result<(usize, usize, Option<Vec<f32>>, u32)> {
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let plan = match planned {
        Some(p) => ensure_plan(ctx, p, vae, z)?,
        None => None,
    };
    let mut rec = Recorder::new(ctx);
    if profile {
        rec.enable_profiling();
    }
    if let (Some(p), Some(key)) = (planned, &plan) {
        p.begin_replay(key)?;
    }
    let recorded = record_decode(&mut rec, vae, z);
    if let Some(p) = planned {
        p.end_replay();
    }
    let (raw, _pixels) = recorded?;
    let flag = rec.range_flag().cloned();
    let waiting = Instant::now();
    let (labels, times) = rec.submit_profiled()?;
    stats.add(&labels, times);
    let [_, _, h, w] = crate::models::layers::dims4(&raw)?;
    if ctx.is_dry_run() {
        return Ok((h, w, None, 0));
    }
    // One readback: the tile's raw output and the f16 counter.
    let mut wanted = vec![&raw];
    wanted.extend(flag.as_ref());
    let mut back = crate::gpu::read_back(ctx, &wanted)?.into_iter();
    stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
    let data = raw.f32_from_bytes(&back.next().unwrap_or_default())?;
    let overflows = back.next().map_or(0, |b| crate::gpu::range_count(&b));
    Ok((h, w, Some(data), overflows))
}

/// Fast tiling exactly as diffusers' `AutoencoderKL.tiled_decode`: latent
/// tiles of `px / 8` with a stride of `(px - overlap) / 8`, each decoded
/// independently (its own GroupNorm statistics and attention), blended in
/// raster order over `overlap` pixels with linear ramps (in place, so later
/// tiles blend with already blended neighbours) and cropped to `px - overlap`.
fn decode_fast(
    ctx: &Context,
    vae: &Vae,
    z: &HostTensor,
    px: usize,
    overlap: usize,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let up = vae.upscale();
    let [n, _, h, w] = [z.shape[0], z.shape[1], z.shape[2], z.shape[3]];
    let tile = px / up;
    let stride = (px - overlap) / up;
    let row_limit = px - overlap;
    let (height, width) = (h * up, w * up);
    let planes = n * 3;
    let rows: Vec<usize> = (0..h).step_by(stride).collect();
    let cols: Vec<usize> = (0..w).step_by(stride).collect();
    let total = rows.len() * cols.len();
    let dry = ctx.is_dry_run();
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let mut image = (!dry).then(|| vec![0f32; planes * height * width]);
    let mut prev: Vec<FastTile> = Vec::new();
    let (mut out_y, mut done) = (0, 0);
    let mut readback = 0u64;
    let mut f16_overflows = 0u64;
    let mut stats = crate::gpu::SubmitStats::default();
    if opts.profile && crate::gpu::Profiler::new(ctx).is_none() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    for &i in &rows {
        let mut row: Vec<FastTile> = Vec::new();
        let (mut out_x, mut crop_h) = (0, 0);
        for (ci, &j) in cols.iter().enumerate() {
            let zt = z.crop(i, (i + tile).min(h), j, (j + tile).min(w));
            let (th, tw, data, overflows) =
                decode_tile_raw(ctx, vae, &zt, opts.profile, &mut stats)?;
            f16_overflows += overflows as u64;
            readback += (planes * th * tw * 4) as u64;
            let mut t = FastTile {
                h: th,
                w: tw,
                data: data.unwrap_or_default(),
            };
            if !dry {
                if let Some(above) = prev.get(ci) {
                    blend_v(above, &mut t, planes, overlap);
                }
                if let Some(left) = row.last() {
                    blend_h(left, &mut t, planes, overlap);
                }
            }
            let (ch, cw) = (row_limit.min(th), row_limit.min(tw));
            if let Some(img) = image.as_mut() {
                for p in 0..planes {
                    for y in 0..ch {
                        let src = (p * th + y) * tw;
                        let dst = (p * height + out_y + y) * width + out_x;
                        img[dst..dst + cw].copy_from_slice(&t.data[src..src + cw]);
                    }
                }
            }
            out_x += cw;
            crop_h = ch;
            row.push(t);
            done += 1;
            if let Some(p) = &opts.progress {
                (p.0)(ProgressUpdate {
                    done,
                    total,
                    stage: "fast tile",
                });
            }
        }
        out_y += crop_h;
        prev = row;
    }
    debug_assert!(dry || out_y == height);
    let range = vae.output_range();
    let (rgba, raw) = match image {
        Some(img) => {
            let plane = height * width;
            let rgba = (0..n)
                .map(|b| {
                    let mut px = Vec::with_capacity(plane * 4);
                    for i in 0..plane {
                        for ch in 0..3 {
                            px.push(range.to_byte(img[(b * 3 + ch) * plane + i]));
                        }
                        px.push(255);
                    }
                    px
                })
                .collect();
            let raw = opts
                .keep_raw
                .then(|| HostTensor::new(vec![n, 3, height, width], img))
                .transpose()?;
            (rgba, raw)
        }
        None => (Vec::new(), None),
    };
    Ok(Decoded {
        rgba,
        width,
        height,
        raw,
        decode_ms: start.elapsed().as_secs_f64() * 1e3,
        memory: ctx.pool().stats(),
        // Per tile: submit, wait and read back the raw output; the host
        // blend and the RGBA conversion count as recording.
        timings: Timings {
            record_ms: (start.elapsed().as_secs_f64() * 1e3 - stats.wait_ms).max(0.0),
            gpu_wait_ms: stats.wait_ms,
            readback_ms: 0.0,
        },
        macs: stats.macs,
        profile: stats.profile,
        dtype: vae.dtype,
        f16_overflows,
        precision_note: None,
        tiling: TilingReport {
            mode: "fast".into(),
            tile_size: Some(px),
            overlap: Some(overlap),
            tiles: total,
            steps: total,
            readback_bytes: readback,
            syncs: total,
            // Two rows of f32 tiles for blending and the full-resolution
            // f32 image they are cropped into.
            host_parked_peak_bytes: (2 * cols.len() * planes * px * px * 4
                + planes * height * width * 4) as u64,
            ..Default::default()
        },
    })
}

/// Predicted memory of a decode.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    /// Memory policy the estimate is for.
    pub policy: &'static str,
    /// The model's description.
    pub model: String,
    /// Latent shape `[N, C, h, w]`.
    pub latents_shape: Vec<usize>,
    /// Image shape `[N, 3, H, W]`.
    pub image_shape: Vec<usize>,
    /// Bytes of weights (part of the peaks).
    pub weights_bytes: u64,
    /// Peaks over the decode, weights included.
    pub peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes (pool capacity, weights included).
    pub peak_reserved_bytes: u64,
    /// How the decode would be tiled (host bytes for parking included).
    pub tiling: TilingReport,
}

/// Predicts the pool's peaks for decoding latents of `latent_shape` with
/// `vae_spec` under `policy` on a device with `caps`, without running any
/// kernel or allocating device memory: the decode runs in a dry-run context
/// and the pool replays its allocation sequence. Untiled (as
/// [`Tiling::off`]); see [`estimate_decode_with`].
pub fn estimate_decode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    latent_shape: [usize; 4],
) -> Result<MemoryEstimate> {
    estimate_decode_with(caps, policy, vae_spec, load, latent_shape, &Tiling::off())
}

/// [`estimate_decode`] of a decode tiled as `tiling` says (the same
/// choices [`decode`] makes with these options on a device with `caps`).
pub fn estimate_decode_with(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    latent_shape: [usize; 4],
    tiling: &Tiling,
) -> Result<MemoryEstimate> {
    let dry = Context::dry_run(caps.clone(), policy.new_pool());
    let vae = Vae::load(&dry, vae_spec, load)?;
    let z = HostTensor::new(
        latent_shape.to_vec(),
        vec![0.0; latent_shape.iter().product()],
    )?;
    let out = decode(
        &dry,
        &vae,
        &z,
        &DecodeOptions {
            raw_latents: true,
            tiling: tiling.clone(),
            ..Default::default()
        },
    )?;
    Ok(MemoryEstimate {
        policy: policy.name(),
        model: vae.name.clone(),
        latents_shape: latent_shape.to_vec(),
        image_shape: vec![latent_shape[0], 3, out.height, out.width],
        weights_bytes: vae.weights_bytes,
        peak_allocated_bytes: out.memory.allocated_bytes.peak,
        peak_reserved_bytes: out.memory.reserved_bytes.peak,
        tiling: out.tiling,
    })
}

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
/// host memory → raw output [N, 3, H, W] (the first half of [`record_decode`]).
pub fn record_decoder(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<Tensor> {
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
pub fn record_decoder_from_buffer(
    rec: &mut Recorder,
    vae: &Vae,
    latents: &DeviceLatents,
    raw_latents: bool,
) -> Result<Tensor> {
    latents.validate(vae)?;
    track_f16(rec, vae)?;
    let input = Tensor::empty(rec.ctx(), &latents.shape, DType::F32, "latents")?;
    if !rec.ctx().is_dry_run() {
        let (dst, dst_offset) = (input.buffer()?.clone(), input.block().offset);
        rec.timed_transfer("copy::latents", |e| {
            e.copy_buffer_to_buffer(
                latents.buffer,
                latents.offset,
                &dst,
                dst_offset,
                latents.byte_size(),
            )
        });
    }
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

/// Runs `record` (which records one decode of latents of `shape`) with the
/// context's planned pool replaying the plan of that decode, tracing it
/// first if needed, exactly as [`decode`] does. Other pools: just runs it.
///
/// `record` must allocate the same sequence as [`record_decode`] or a prefix
/// of it (latent tensor, decoder, optionally the RGBA8 tensor) — true of
/// [`record_decoder`] and [`record_decoder_from_buffer`]. Calls must not
/// overlap on one pool (replay state is the pool's).
pub fn with_decode_plan<T>(
    ctx: &Context,
    vae: &Vae,
    shape: &[usize],
    record: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(planned) = ctx.pool().as_any().downcast_ref::<PlannedPool>() else {
        return record();
    };
    let z = HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()])?;
    let Some(key) = ensure_plan(ctx, planned, vae, &z)? else {
        return record();
    };
    planned.begin_replay(&key)?;
    let out = record();
    planned.end_replay();
    out
}

/// For a planned pool: traces `record` (recorded with one recorder) once in a
/// dry run and installs its plan; `None` when the trace is too long to plan.
pub(crate) fn ensure_recorded_plan<T>(
    ctx: &Context,
    planned: &PlannedPool,
    key: String,
    record: impl FnOnce(&mut Recorder) -> Result<T>,
) -> Result<Option<String>> {
    ensure_plan_with(ctx, planned, key, |dry| {
        let mut rec = Recorder::new(dry);
        record(&mut rec).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// diffusers' blend on a 1-plane example, computed by hand.
    #[test]
    fn blends_follow_diffusers() {
        let a = FastTile {
            h: 4,
            w: 2,
            data: vec![1.0; 8],
        };
        let mut b = FastTile {
            h: 3,
            w: 2,
            data: vec![0.0; 6],
        };
        blend_v(&a, &mut b, 1, 2);
        // y = 0: a weight 1; y = 1: a weight 0.5; y = 2 untouched.
        assert_eq!(b.data, vec![1.0, 1.0, 0.5, 0.5, 0.0, 0.0]);
        let mut c = FastTile {
            h: 3,
            w: 2,
            data: vec![0.0; 6],
        };
        blend_h(&b, &mut c, 1, 4);
        assert_eq!(c.data, vec![1.0, 0.5, 0.5, 0.25, 0.0, 0.0]);
    }
}
