//! The runner behind every front end ([`crate::decode()`], [`crate::encode::encode`],
//! [`crate::decode_frames`], [`crate::Engine`]): strategy choice and budget
//! fitting ([`strategy`]), planned-pool replay ([`replay`]), fast tiles
//! ([`fast`]), exact tiles and untiled passes (here), and the f16 → bf16
//! redo ([`precision`]). Memory estimates are the same runs on a null device.

pub(crate) mod fast;
#[warn(clippy::indexing_slicing)]
pub(crate) mod input;
pub(crate) mod precision;
pub(crate) mod replay;
pub(crate) mod rows;
pub(crate) mod strategy;
pub(crate) mod video;

use std::time::Instant;

use crate::error::Result;
use crate::gpu::{Context, DispatchLabel, Profile, Recorder, SubmitStats};
use crate::io::HostTensor;
use crate::tensor::{DType, Tensor};
use crate::tiling::{Act, ExactPlan, Executor, Progress, TilingReport};

pub(crate) use replay::Replay;

/// An untiled pass: what `record` returned, the bytes read back of the
/// tensors it asked for, and what the pass took.
pub(crate) struct Untiled<T> {
    pub out: T,
    pub bytes: Vec<Vec<u8>>,
    pub f16_overflows: u64,
    pub labels: Vec<DispatchLabel>,
    pub profile: Option<Profile>,
    /// Recording, then submit until the device was idle, then the read back.
    pub record_ms: f64,
    pub gpu_wait_ms: f64,
    pub readback_ms: f64,
}

/// One untiled pass on `ctx`: `record` records it into one recorder (under
/// `replay`, the planned pool's plan for it), returning its outputs and the
/// tensors of them to read back; submitted, waited for and read back in one
/// transfer with the f16 overflow counter.
pub(crate) fn run_untiled<T>(
    ctx: &Context,
    replay: Replay<'_>,
    profile: bool,
    record: impl FnOnce(&mut Recorder) -> Result<T>,
    wanted: impl FnOnce(&T) -> Vec<&Tensor>,
) -> Result<Untiled<T>> {
    let start = Instant::now();
    let mut rec = Recorder::new(ctx);
    if profile && !rec.enable_profiling() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    let recorded = record(&mut rec);
    drop(replay);
    let out = recorded?;
    let range_flag = rec.range_flag().cloned();
    let record_ms = ms_since(start);
    let submitted = Instant::now();
    let (labels, profile) = rec.submit_profiled()?;
    ctx.wait_idle()?;
    let gpu_wait_ms = ms_since(submitted);
    let reading = Instant::now();
    let mut tensors = wanted(&out);
    let n = tensors.len();
    tensors.extend(range_flag.as_ref());
    let mut bytes = crate::gpu::read_back(ctx, &tensors)?;
    let f16_overflows = match bytes.len() > n {
        true => bytes.pop().map_or(0, |b| crate::gpu::range_count(&b)) as u64,
        false => 0,
    };
    Ok(Untiled {
        out,
        bytes,
        f16_overflows,
        labels,
        profile,
        record_ms,
        gpu_wait_ms,
        readback_ms: ms_since(reading),
    })
}

/// What an exact tiled run left: the model's output (as `forward` gathered
/// it), the report, MACs and GPU times of every step, the f16 overflows.
pub(crate) struct ExactRun<T> {
    pub out: T,
    pub report: TilingReport,
    pub stats: SubmitStats,
    pub f16_overflows: u64,
}

/// One exact tiled run of `plan` over host input `x` with a model of
/// `dtype`: `forward` runs the model on the executor and gathers its output
/// (`stats`: also sum MACs and GPU times of its submits).
pub(crate) fn run_exact<T>(
    ctx: &Context,
    plan: ExactPlan,
    (profile, stats, progress): (bool, bool, Option<Progress>),
    (dtype, x): (DType, &HostTensor),
    forward: impl FnOnce(&mut Executor, Act) -> Result<T>,
) -> Result<ExactRun<T>> {
    let mut ex = Executor::new(ctx, plan, progress);
    if profile && !ex.enable_profiling() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    let range_flag = match dtype {
        DType::F16 => Some(ex.track_f16_range()?),
        _ => None,
    };
    let shape = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let input = ex.host_act(shape, &x.data);
    let out = forward(&mut ex, input)?;
    let (report, stats) = match stats {
        true => ex.finish_with_stats()?,
        false => (ex.finish()?, SubmitStats::default()),
    };
    let f16_overflows = match &range_flag {
        Some(f) => crate::gpu::read_range_flag(ctx, f)? as u64,
        None => 0,
    };
    Ok(ExactRun {
        out,
        report,
        stats,
        f16_overflows,
    })
}

/// The report of an untiled run.
pub(crate) fn untiled_report() -> TilingReport {
    TilingReport {
        mode: "untiled".into(),
        tiles: 1,
        steps: 1,
        ..Default::default()
    }
}

/// Tiles of `px` pixels (the report's, or the whole image) covering `h × w`.
pub(crate) fn tiles_of(report: &TilingReport, h: usize, w: usize) -> usize {
    let px = report.tile_size.unwrap_or(h.max(w)).max(1);
    h.div_ceil(px) * w.div_ceil(px)
}

/// Milliseconds since `t`.
pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
