//! Planned-pool replay: a decode (or encode, or tile step) is traced once on
//! a null device, planned, and then replayed while a [`Replay`] guard lives.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::{Context, Recorder};
use crate::memory::{plan_greedy, PlannedPool, TracingPool};

/// Largest trace the planned pool plans (greedy placement is quadratic in
/// the number of allocations); longer tiled runs allocate one buffer per
/// tensor instead, as the exact policy.
const MAX_PLANNED_ALLOCATIONS: usize = 8192;

/// While alive, the context's planned pool replays one plan; other pools
/// (and runs too long to plan) are left alone. Dropping it ends the replay,
/// on errors too.
#[must_use = "the replay ends when the guard drops"]
pub(crate) struct Replay<'a> {
    pool: Option<&'a PlannedPool>,
}

impl<'a> Replay<'a> {
    /// For a planned pool: traces `trace` under `key` (once per key, on a null
    /// device) and starts replaying its plan. Other pools: a guard that does
    /// nothing.
    pub(crate) fn begin(
        ctx: &'a Context,
        key: impl FnOnce() -> String,
        trace: impl FnOnce(&Context) -> Result<()>,
    ) -> Result<Replay<'a>> {
        let Some(planned) = ctx.pool().as_any().downcast_ref::<PlannedPool>() else {
            return Ok(Replay { pool: None });
        };
        let Some(key) = ensure_plan(ctx, planned, key(), trace)? else {
            return Ok(Replay { pool: None });
        };
        planned.begin_replay(&key)?;
        Ok(Replay {
            pool: Some(planned),
        })
    }

    /// [`Replay::begin`] for a trace recorded with one recorder.
    pub(crate) fn recorded<T>(
        ctx: &'a Context,
        key: impl FnOnce() -> String,
        record: impl FnOnce(&mut Recorder) -> Result<T>,
    ) -> Result<Replay<'a>> {
        Self::begin(ctx, key, |null| {
            let mut rec = Recorder::new(null);
            record(&mut rec).map(|_| ())
        })
    }
}

impl Drop for Replay<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pool {
            p.end_replay();
        }
    }
}

/// For a planned pool: traces `run` once on a null device under `key` and
/// installs its plan; `None` when the trace is too long to plan.
fn ensure_plan(
    ctx: &Context,
    planned: &PlannedPool,
    key: String,
    run: impl FnOnce(&Context) -> Result<()>,
) -> Result<Option<String>> {
    if !planned.has_plan(&key) {
        // A trace too long to plan stops at its first allocation past the
        // limit (a long tiled run's trace would take as long as the run).
        let tracer = Arc::new(match crate::exec::full_dry_runs() {
            true => TracingPool::new(),
            false => TracingPool::with_max_entries(MAX_PLANNED_ALLOCATIONS),
        });
        let null = Context::null(ctx.caps().clone(), tracer.clone());
        match run(&null) {
            Err(_) if tracer.overflowed() => return Ok(None),
            r => r?,
        }
        let trace = tracer.trace();
        if trace.entries.len() > MAX_PLANNED_ALLOCATIONS {
            return Ok(None);
        }
        let caps = ctx.caps();
        let plan = plan_greedy(
            &trace,
            caps.min_storage_buffer_offset_alignment as u64,
            caps.max_buffer_size,
        )?;
        planned.install_plan(&key, plan);
    }
    Ok(Some(key))
}
