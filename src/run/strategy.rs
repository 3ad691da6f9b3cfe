//! How a run is executed (untiled, exact tiles, fast tiles) and the budget
//! fitting that chooses it: every candidate is run on a null device whose
//! pool predicts the real one.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::exec::report::Counts;
use crate::exec::ByRows;
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::memory::{round_up, AllocationTrace, LimitedPool, MemoryPool, Policy, TracingPool};
use crate::run::rows::{rows_latent, sample_rows, Sampled};
use crate::tiling::{ExactPlan, TileMode, Tiling, TilingReport, FAST_DEFAULT_TILE};

/// How one run executes.
pub(crate) enum Strategy {
    Untiled,
    Exact(ExactPlan),
    Fast { px: usize, overlap: usize },
}

/// The shape of a job (a decode or an encode) as strategy choice sees it.
pub(crate) struct Geometry<'a> {
    /// "decode" or "encode", for messages.
    verb: &'static str,
    /// Completes "no tile size … within the memory budget".
    what: &'static str,
    /// The whole input `[N, C, H, W]`.
    input: &'a HostTensor,
    /// Resolution levels of the model.
    levels: usize,
    /// Tile sizes and overlaps are multiples of this many pixels.
    scale: usize,
    /// Tile pixels per input pixel (decode: the upscale; encode: 1).
    divisor: usize,
    /// Bytes an exact tiled run parks at least ([`crate::models::graph::Graph::parked_floor`]).
    parked_floor: u64,
}

impl<'a> Geometry<'a> {
    /// A decode of latents `z` by a model of `levels` levels, `up` pixels per latent pixel.
    pub(crate) fn decode(z: &'a HostTensor, levels: usize, up: usize) -> Self {
        let what = "decodes these latents";
        Geometry {
            verb: "decode",
            what,
            input: z,
            levels,
            scale: up,
            divisor: up,
            parked_floor: 0,
        }
    }

    /// An encode of image `x` by a model of `levels` levels, `down` pixels per latent pixel.
    pub(crate) fn encode(x: &'a HostTensor, levels: usize, down: usize) -> Self {
        let what = "encodes this image";
        Geometry {
            verb: "encode",
            what,
            input: x,
            levels,
            scale: down,
            divisor: 1,
            parked_floor: 0,
        }
    }

    /// The bytes an exact tiled run parks at least (device or host).
    pub(crate) fn with_parked_floor(mut self, bytes: u64) -> Self {
        self.parked_floor = bytes;
        self
    }

    /// The pyramid of an exact tiled run over the input.
    fn pyramid(&self) -> Result<Pyramid> {
        let (scale, div) = (self.scale, self.divisor);
        let (h, w) = (self.input.shape[2], self.input.shape[3]);
        if (h * div) % scale != 0 || (w * div) % scale != 0 {
            return Err(Error::InvalidInput(format!(
                "a tiled {} needs image sides that are multiples of {scale}, got {h}×{w}",
                self.verb
            )));
        }
        Ok(Pyramid {
            levels: self.levels,
            scale,
            small: (h * div / scale, w * div / scale),
        })
    }
}

/// The resolution pyramid of a tiled run: level 0 (the latent) is `small`
/// `(h, w)`, each further level twice as large; tile sizes count pixels of
/// the largest level, `scale` = 2^(levels − 1) of them per latent pixel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pyramid {
    pub levels: usize,
    pub scale: usize,
    pub small: (usize, usize),
}

/// One untiled pass over an input (the whole one or a tile of it).
pub(crate) type UntiledRun<'a> = dyn Fn(&mut Recorder, &HostTensor) -> Result<()> + 'a;

/// The strategy `tiling` asks for a job of `geometry` whose untiled passes
/// `record` records and whose exact tiled runs `exact` runs, and the memory
/// budget it was chosen for.
pub(crate) fn choose(
    ctx: &Context,
    geometry: &Geometry,
    tiling: &Tiling,
    record: &UntiledRun,
    exact: &TiledRun,
) -> Result<(Strategy, u64)> {
    let budget = tiling.budget(ctx.caps());
    let base = ctx.pool().stats().allocated_bytes.current;
    let untiled_fits = |x: &HostTensor| {
        fits_budget(ctx, budget, base, |null| {
            let mut rec = Recorder::new(null);
            record(&mut rec, x)
        })
    };
    let strategy = match tiling.mode {
        TileMode::Off => Strategy::Untiled,
        TileMode::Fast => choose_fast(geometry, tiling, budget, untiled_fits)?,
        TileMode::Auto if untiled_fits(geometry.input)? => Strategy::Untiled,
        TileMode::Auto | TileMode::Exact => {
            let pyramid = geometry.pyramid()?;
            Strategy::Exact(choose_exact(
                ctx, pyramid, tiling, budget, base, geometry, exact,
            )?)
        }
    };
    Ok((strategy, budget))
}

/// The largest fast tile (the given one, or halving the default) whose
/// untiled run fits the budget.
fn choose_fast(
    geometry: &Geometry,
    tiling: &Tiling,
    budget: u64,
    fits: impl Fn(&HostTensor) -> Result<bool>,
) -> Result<Strategy> {
    let (scale, div, x) = (geometry.scale, geometry.divisor, geometry.input);
    let mut px = round_to(tiling.tile_size.unwrap_or(FAST_DEFAULT_TILE), scale);
    loop {
        let overlap = tiling.overlap.unwrap_or(px / 4 / scale * scale);
        if !overlap.is_multiple_of(scale) || overlap >= px {
            return Err(Error::InvalidInput(format!(
                "`Tiling::overlap` {overlap}: must be a multiple of {scale} below the tile size {px}"
            )));
        }
        // The largest tile must run within the budget.
        let [n, c] = [x.shape[0], x.shape[1]];
        let (h, w) = ((px / div).min(x.shape[2]), (px / div).min(x.shape[3]));
        let probe = HostTensor {
            shape: vec![n, c, h, w],
            data: vec![0.0; n * c * h * w],
        };
        if fits(&probe)? {
            return Ok(Strategy::Fast { px, overlap });
        }
        if tiling.tile_size.is_some() || px <= 8 * scale {
            return Err(Error::OverBudget(format!(
                "a {px}-pixel fast tile does not {} within the memory budget of {budget} bytes; lower `Tiling::tile_size` or raise `Tiling::max_memory`",
                geometry.verb
            )));
        }
        px = round_to(px / 2, scale);
    }
}

/// `px` rounded up to a positive multiple of `m`.
pub(crate) fn round_to(px: usize, m: usize) -> usize {
    px.max(1).div_ceil(m) * m
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

/// Peak of live bytes of a trace with every size rounded up to `align`
/// (what a planned pool's replay counts as allocated): what a
/// [`TracingPool::peak_only`] tracer counts as it goes (checked below).
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

/// Peak allocated bytes of `run` on a null device that predicts `ctx`'s
/// pool: a fresh pool of the same policy; for planned pools, the traced peak
/// with sizes rounded as a replay rounds them (an upper bound when the run
/// is too long to plan).
pub(crate) fn null_peak_of<T>(
    ctx: &Context,
    run: impl FnOnce(&Context) -> Result<T>,
) -> Result<(u64, T)> {
    null_peak_inner(ctx, u64::MAX, run)?.ok_or_else(|| {
        Error::Internal("an unlimited null-device pool refused an allocation".into())
    })
}

/// [`null_peak_of`], stopping the run as soon as its allocated bytes pass
/// `limit` (`None` then: its peak is over `limit`). Allocated bytes only
/// grow when rounded as a replay rounds them, so a run that stops could not
/// have fitted.
pub(crate) fn null_peak_within<T>(
    ctx: &Context,
    limit: u64,
    run: impl FnOnce(&Context) -> Result<T>,
) -> Result<Option<(u64, T)>> {
    null_peak_inner(ctx, limit, run)
}

fn null_peak_inner<T>(
    ctx: &Context,
    limit: u64,
    run: impl FnOnce(&Context) -> Result<T>,
) -> Result<Option<(u64, T)>> {
    let planned = ctx.pool().policy_name() == Policy::Planned.name();
    let align = ctx.caps().min_storage_buffer_offset_alignment as u64;
    let full = crate::exec::full_dry_runs();
    let tracer = Arc::new(match full {
        true => TracingPool::new(),
        false => TracingPool::peak_only(align),
    });
    let inner: Arc<dyn MemoryPool> = if planned {
        tracer.clone()
    } else {
        same_policy_pool(ctx)
    };
    let limited = Arc::new(LimitedPool::new(inner, limit));
    let null = Context::null(ctx.caps().clone(), limited.clone());
    let out = match run(&null) {
        Ok(out) => out,
        Err(_) if limited.tripped() => return Ok(None),
        Err(e) => return Err(e),
    };
    let peak = if planned && full {
        traced_peak(&tracer.trace(), align)
    } else if planned {
        tracer.aligned_peak()
    } else {
        null.pool().stats().allocated_bytes.peak
    };
    Ok(Some((peak, out)))
}

/// A fresh pool of the context's policy, for null devices that predict it.
fn same_policy_pool(ctx: &Context) -> Arc<dyn MemoryPool> {
    ctx.pool()
        .policy_name()
        .parse::<Policy>()
        .unwrap_or(Policy::Exact)
        .new_pool()
}

/// True when `run` (one untiled pass, run on a null device) stays within
/// the device limits and `budget` on top of `base` bytes already allocated.
pub(crate) fn fits_budget(
    ctx: &Context,
    budget: u64,
    base: u64,
    run: impl FnOnce(&Context) -> Result<()>,
) -> Result<bool> {
    let Some(limit) = budget.checked_sub(base) else {
        return Ok(false);
    };
    match null_peak_within(ctx, limit, run) {
        Ok(Some((peak, ()))) => Ok(base + peak <= budget),
        Ok(None) => Ok(false),
        Err(e) if is_limit_error(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Most tiles a plan is made on ([`fit_plan`] runs every one on a null device).
const MAX_TILES: usize = 4096;
/// Most tiles in a row of a plan made on a few rows ([`fit_plan_by_rows`]).
const MAX_ROW_TILES: usize = 1024;

/// Most tiles a plan is made on tile by tile: `default`, or
/// `WGVAE_MAX_PLAN_TILES` (tests plan small images and videos by rows).
pub(crate) fn plan_tile_limit(default: usize) -> usize {
    std::env::var("WGVAE_MAX_PLAN_TILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Tile sizes (output pixels) tried when none is given, largest first.
const TILE_CANDIDATES: [usize; 16] = [
    4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 16,
];

/// One exact tiled run (decode or encode) of a plan in the given context,
/// returning its report; [`choose_exact`] calls it on null devices.
pub(crate) type TiledRun<'a> = dyn Fn(&Context, &ExactPlan) -> Result<TilingReport> + 'a;

/// The exact plan with the largest tile that fits `budget` (or the given
/// tile), found with null-device runs of `run`.
fn choose_exact(
    ctx: &Context,
    pyramid: Pyramid,
    tiling: &Tiling,
    budget: u64,
    base: u64,
    geometry: &Geometry,
    run: &TiledRun,
) -> Result<ExactPlan> {
    let what = geometry.what;
    let avail = budget.checked_sub(base).ok_or_else(|| {
        Error::OverBudget(format!(
            "the weights and other live tensors already use {base} bytes, more than the memory budget of {budget} bytes (`Tiling::max_memory`)"
        ))
    })?;
    let (out_h, out_w) = (
        pyramid.small.0 * pyramid.scale,
        pyramid.small.1 * pyramid.scale,
    );
    // What the device cannot hold is parked on the host whatever the tiles:
    // a run the host cannot take either is refused before any planning.
    let host_floor = geometry.parked_floor.saturating_sub(avail);
    let host_limit = tiling
        .max_host_memory
        .or_else(|| ctx.host_memory_available());
    if let Some(limit) = host_limit.filter(|&l| host_floor > l) {
        return Err(Error::OverBudget(format!(
            "an exact tiled {} of this {out_h}×{out_w} image parks at least {} in host memory at any tile size (its largest layer's input and output activations are {}; the device budget is {}, {} of it already used by weights and other tensors), but only {} are available ({}); raise `Tiling::max_memory` (the device holds more), {} a smaller image or use a machine with more memory",
            geometry.verb,
            human_bytes(host_floor),
            human_bytes(geometry.parked_floor),
            human_bytes(budget),
            human_bytes(base),
            human_bytes(limit),
            if tiling.max_host_memory.is_some() {
                "`Tiling::max_host_memory`"
            } else {
                "MemAvailable in /proc/meminfo"
            },
            geometry.verb,
        )));
    }
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
    let score = |r: &TilingReport| r.uploaded_bytes + r.readback_bytes + r.steps as u64 * STEP_COST;
    let mut best: Option<(u64, ExactPlan, u64)> = None;
    let mut worse = 0;
    let mut last_limit = None;
    let mut over_cap = None;
    for px in candidates {
        // Planning runs every tile on a null device: beyond MAX_TILES it
        // would take minutes (smaller candidates only have more tiles), so
        // it runs a few rows of them, if a row is not that long itself.
        let tiles = out_h.div_ceil(px).saturating_mul(out_w.div_ceil(px));
        let by_rows = tiles > plan_tile_limit(MAX_TILES);
        if by_rows && out_w.div_ceil(px) > MAX_ROW_TILES {
            over_cap = Some((px, tiles));
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
                by_rows: None,
                max_host: tiling.max_host_memory,
            };
            // A whole mid-block grows with the image: no rows stand for it.
            if by_rows && plan.levels[0].is_none() {
                continue;
            }
            // A candidate whose top-left corner alone allocates a tensor
            // over the budget cannot fit: skip its dry run over every tile.
            // (Only where the full dry run would walk many more tiles.)
            if tiling.tile_size.is_none()
                && tiles >= 16 * CORNER_TILES * CORNER_TILES
                && !no_crop_probe()
                && corner_over(ctx, &plan, up, avail, run)?
            {
                continue;
            }
            let fitted = match by_rows {
                true => fit_plan_by_rows(ctx, plan, avail, run),
                false => fit_plan(ctx, plan, avail, run),
            };
            match fitted {
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
        if let Some(limit) = host_limit.filter(|&l| host > l) {
            return Err(Error::OverBudget(format!(
                "this tiled run would park {:.1} MiB of tiles in host memory, but only {:.1} MiB are available ({}); raise `Tiling::max_memory` (fewer tiles parked on the host) or decode a smaller image",
                host as f64 / 1048576.0,
                limit as f64 / 1048576.0,
                if tiling.max_host_memory.is_some() {
                    "`Tiling::max_host_memory`"
                } else {
                    "MemAvailable in /proc/meminfo"
                }
            )));
        }
        return Ok(plan);
    }
    if let Some((px, tiles)) = over_cap {
        // Larger candidates were run and did not fit; this one was not.
        let parks = match host_floor {
            0 => String::new(),
            b => format!(
                "; at any tile size it would park at least {} in host memory (its largest layer's input and output activations are {})",
                human_bytes(b),
                human_bytes(geometry.parked_floor)
            ),
        };
        let rows = format!(
            ", or a few rows of tiles where a row has at most {MAX_ROW_TILES}; this one has {}",
            out_w.div_ceil(px)
        );
        let msg = format!(
            "an exact tiled run of this {out_h}×{out_w} image {}: {tiles} tiles, more than the {MAX_TILES} a plan may have (planning runs every tile on a null device{rows}){parks}; {}",
            if tiling.tile_size.is_some() {
                format!("in {px}-pixel tiles")
            } else {
                format!("within the memory budget of {} needs tiles of {px} pixels or fewer (larger ones were planned and do not fit)", human_bytes(budget))
            },
            if tiling.tile_size.is_some() {
                "use larger tiles (`Tiling::tile_size`) or a smaller image"
            } else {
                "raise `Tiling::max_memory` (larger tiles) or use a smaller image"
            },
        );
        // Without a tile size it is the budget that asks for so many tiles.
        return Err(if tiling.tile_size.is_some() {
            Error::InvalidInput(msg)
        } else {
            Error::OverBudget(msg)
        });
    }
    Err(match last_limit {
        Some(e) if tiling.tile_size.is_some() => in_given_tiles(e, round_to(tiling.tile_size.unwrap_or(0), pyramid.scale)),
        _ => Error::OverBudget(format!(
            "no tile size {what} within the memory budget of {budget} bytes ({}, of which {} are already in use by weights and other tensors); raise `Tiling::max_memory`{}",
            human_bytes(budget),
            human_bytes(base),
            if tiling.tile_size.is_some() { " or lower `Tiling::tile_size`" } else { "" }
        )),
    })
}

/// A device-limit error of a run in the tiles the caller chose, with advice
/// for tiles (the error's own says "use tiling").
fn in_given_tiles(e: Error, px: usize) -> Error {
    let (what, needs, limit) = match &e {
        Error::BindingTooLarge { what, bytes, limit } => (
            what,
            format!("{bytes} bytes"),
            format!("{limit} bytes in one binding (max_storage_buffer_binding_size)"),
        ),
        Error::BufferTooLarge { what, bytes, limit } => (
            what,
            format!("{bytes} bytes"),
            format!("{limit} bytes in one buffer (max_buffer_size)"),
        ),
        Error::DispatchTooLarge {
            what,
            groups,
            limit,
        } => (
            what,
            format!("{groups} workgroups"),
            format!("{limit} per dimension"),
        ),
        _ => return e,
    };
    Error::InvalidInput(format!(
        "in exact tiles of {px} px, {what} needs {needs} but the device allows {limit}; lower `Tiling::tile_size` (tile tensors shrink with it) or use a smaller image (whole-image tensors, such as the GroupNorm statistics of every tile, grow with it)"
    ))
}

/// Tiles a side of the corner [`corner_over`] runs.
const CORNER_TILES: usize = 3;

/// `WGVAE_NO_CROP_PROBE` set: every candidate gets its full dry run (tests
/// compare the plans chosen with and without the probe).
fn no_crop_probe() -> bool {
    std::env::var_os("WGVAE_NO_CROP_PROBE").is_some()
}

/// True when `plan` run on only its top-left corner (`CORNER_TILES`²
/// tiles, or fewer where the image is narrower) on a null device allocates
/// one tensor of more than `avail` bytes or passes a device limit (binding,
/// buffer, dispatch). Every tensor of the corner has a counterpart at least
/// as large in the whole run (the same tiles, halos only clipped at the
/// corner's edges; whole tensors and attention state over fewer tiles), so
/// the whole run's pool would pass `avail` there or its device limit stop
/// it (if nothing stops it before): the candidate is dropped either way
/// (without a given tile size a limit error only drops it), and its dry run
/// over every tile — for a tiled mid-block, every K/V tile past every query
/// tile before the first over-limit tensor of a larger level — is skipped.
/// False when the corner is the whole image. Checked: the plans and errors
/// chosen with and without it are the same (`WGVAE_NO_CROP_PROBE`,
/// tests/cli_estimates.rs).
fn corner_over(
    ctx: &Context,
    plan: &ExactPlan,
    up: usize,
    avail: u64,
    run: &TiledRun,
) -> Result<bool> {
    let (h, w) = plan.latent;
    let side = CORNER_TILES * (plan.px / up).max(1);
    let corner = (h.min(side), w.min(side));
    if corner == (h, w) {
        return Ok(false);
    }
    let full = crate::exec::full_dry_runs();
    let tracer = Arc::new(match full {
        true => TracingPool::new(),
        false => TracingPool::peak_only(1),
    });
    let null = Context::null(ctx.caps().clone(), tracer.clone());
    let mut probe = plan.clone();
    probe.latent = corner;
    probe.device_cap = 0;
    match run(&null, &probe) {
        Err(e) if is_limit_error(&e) => Ok(true),
        // Another error ends the corner early: what it allocated counts.
        _ if full => Ok(tracer.trace().entries.iter().any(|e| e.bytes > avail)),
        _ => Ok(tracer.largest() > avail),
    }
}

/// The input of a run of `plan`: `x` itself, or zeros of the plan's corner
/// ([`corner_over`]'s probes, on null devices only) when the plan covers a
/// smaller latent; `per_latent` input pixels per latent pixel.
pub(crate) fn input_of<'x>(
    x: &'x HostTensor,
    plan: &ExactPlan,
    per_latent: usize,
) -> std::borrow::Cow<'x, HostTensor> {
    let (h, w) = (plan.latent.0 * per_latent, plan.latent.1 * per_latent);
    if (x.shape[2], x.shape[3]) == (h, w) {
        return std::borrow::Cow::Borrowed(x);
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    std::borrow::Cow::Owned(HostTensor {
        shape: vec![n, c, h, w],
        data: vec![0.0; n * c * h * w],
    })
}

/// What an estimate (a run on a null device) of `plan` runs: for a plan made
/// on a few rows of tiles, the plan of those rows, their input (zeros of
/// `x`'s width, `per_latent` input pixels per latent pixel) and how they
/// stand for the whole run; else `plan` as it is.
pub(crate) fn rows_to_run(
    ctx: &Context,
    mut plan: ExactPlan,
    x: &HostTensor,
    per_latent: usize,
) -> (ExactPlan, Option<(ByRows, HostTensor)>) {
    match plan.by_rows.filter(|_| ctx.is_null()) {
        Some(b) => {
            plan.latent.0 = b.latent_rows;
            let x = input_of(x, &plan, per_latent).into_owned();
            (plan, Some((b, x)))
        }
        None => (plan, None),
    }
}

/// `bytes` in the largest unit that keeps it ≥ 1 (a tiny budget is not "0 MiB").
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [
        ("TiB", 1099511627776.0),
        ("GiB", 1073741824.0),
        ("MiB", 1048576.0),
        ("KiB", 1024.0),
    ];
    let b = bytes as f64;
    match UNITS.iter().find(|(_, u)| b >= *u) {
        Some((name, u)) => format!("{:.1} {name}", b / u),
        None => format!("{bytes} bytes"),
    }
}

/// Staging (upload and read-back buffers) a tiled run may hold: an eighth
/// of the budget left after the weights, at most [`crate::tiling::STAGING_LIMIT`],
/// at least 64 KiB. [`fit_plan`] counts its measured peak against the budget.
pub(crate) fn staging_limit(avail: u64) -> u64 {
    (avail / 8).clamp(64 << 10, crate::tiling::STAGING_LIMIT)
}

/// Fits `plan` into `avail` bytes: the working set is the pool peak with
/// every tile parked on the host plus the staging peak; parked device bytes
/// get what remains, checked (and if need be lowered) with a second
/// null-device run. Returns the plan and the report of its run.
fn fit_plan(
    ctx: &Context,
    mut plan: ExactPlan,
    avail: u64,
    run: &TiledRun,
) -> Result<Option<(ExactPlan, TilingReport)>> {
    // Pool peak and staging peak (device memory outside the pool) together.
    // `None` when the pool alone passes `limit` (the run stops there).
    let null_peak = |plan: &ExactPlan, limit: u64| -> Result<Option<(u64, TilingReport)>> {
        Ok(null_peak_within(ctx, limit, |null| run(null, plan))?
            .map(|(peak, r)| (peak + r.staging_peak_bytes, r)))
    };
    plan.device_cap = 0;
    let Some((working, report)) = null_peak(&plan, avail)? else {
        return Ok(None);
    };
    if working > avail {
        return Ok(None);
    }
    plan.total_steps = report.steps;
    let mut cap = avail - working;
    for _ in 0..4 {
        plan.device_cap = cap;
        // Unlimited: an over-budget peak sets the next, lower cap.
        let Some((peak, report)) = null_peak(&plan, u64::MAX)? else {
            return Ok(None);
        };
        if peak <= avail {
            return Ok(Some((plan, report)));
        }
        cap = cap.saturating_sub(peak - avail);
    }
    Ok(None)
}

/// [`fit_plan`] for an image of more than [`MAX_TILES`] tiles, from runs of a
/// few rows of its tiles ([`sample_rows`]). Every tile parks in host memory
/// (device cap 0: beside terabytes of host parking the device's share saves
/// nothing), so what a tile step allocates depends on its kind of tile
/// alone (edge or interior; the GroupNorm scratch is bounded and attention
/// passes have a fixed size, see `exec::exact`). A plan of few rows falls
/// back to [`fit_plan`].
fn fit_plan_by_rows(
    ctx: &Context,
    mut plan: ExactPlan,
    avail: u64,
    run: &TiledRun,
) -> Result<Option<(ExactPlan, TilingReport)>> {
    let Some(t) = plan.levels.first().copied().flatten() else {
        return fit_plan(ctx, plan, avail, run);
    };
    let every = plan.clone();
    let (h, w) = plan.latent;
    plan.device_cap = 0;
    // Marks the walks as runs of a plan by rows (see `exec::exact::attention`).
    plan.by_rows = Some(ByRows {
        latent_rows: h,
        counts: Counts::default(),
    });
    let walk = |r: usize| -> Result<Option<(u64, TilingReport)>> {
        let mut p = plan.clone();
        p.latent = (rows_latent(h, t, r), w);
        Ok(null_peak_within(ctx, avail, |null| run(null, &p))?
            .map(|(peak, rep)| (peak + rep.staging_peak_bytes, rep))
            .filter(|(peak, _)| *peak <= avail))
    };
    let sampled = sample_rows(
        (h.div_ceil(t), w.div_ceil(t)),
        walk,
        |s| s.1.attention_rows_per_pass,
        |s| s.0,
    )?;
    let (peak, mut report, rows_run, counts) = match sampled {
        Sampled::Every => return fit_plan(ctx, every, avail, run),
        Sampled::Over => return Ok(None),
        Sampled::Rows { samples, rows, x } => {
            let counts = Counts::quadratic(samples.each_ref().map(|s| Counts::of(&s.1)), x);
            let [(peak, report), _, _] = samples;
            (peak, report, rows, counts)
        }
    };
    if peak > avail {
        return Ok(None);
    }
    counts.apply(&mut report);
    plan.total_steps = report.steps;
    plan.by_rows = Some(ByRows {
        latent_rows: rows_latent(h, t, rows_run),
        counts,
    });
    Ok(Some((plan, report)))
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, traced_peak};
    use crate::memory::{Backing, MemoryPool, TracingPool};

    /// A peak-only tracer's peak equals the peak of the kept trace, for
    /// any interleaving of allocations and releases (and odd sizes).
    #[test]
    fn peak_only_tracing_equals_the_traced_peak() {
        let backing = Backing::Virtual {
            max_buffer_size: u64::MAX,
        };
        for align in [1, 4, 256] {
            let (full, peak) = (TracingPool::new(), TracingPool::peak_only(align));
            let mut live = Vec::new();
            let mut x = 12345u64;
            for _ in 0..2000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if x >> 62 != 0 || live.is_empty() {
                    let bytes = (x >> 40) % 5000;
                    let a = full.allocate(&backing, bytes, 4, "t").unwrap();
                    let b = peak.allocate(&backing, bytes, 4, "t").unwrap();
                    live.push((a, b));
                } else {
                    let (a, b) = live.swap_remove((x >> 20) as usize % live.len());
                    full.release(&a);
                    peak.release(&b);
                }
            }
            assert_eq!(peak.aligned_peak(), traced_peak(&full.trace(), align));
            let largest = full.trace().entries.iter().map(|e| e.bytes).max();
            assert_eq!(Some(peak.largest()), largest);
        }
    }

    #[test]
    fn budgets_print_in_a_unit_that_is_not_zero() {
        assert_eq!(human_bytes(0), "0 bytes");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_bytes(16 << 30), "16.0 GiB");
        assert_eq!(human_bytes(7 << 40), "7.0 TiB");
    }
}
