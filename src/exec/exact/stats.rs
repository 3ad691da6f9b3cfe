//! GroupNorm statistics over the tiles of an activation: per-tile partial
//! sums while the tiles are produced, merged exactly (Chan's formula) after
//! the last one into the global affine the next conv applies.

use super::parking::Act;
use super::Executor;
use crate::error::Result;
use crate::kernels::group_norm::{group_norm_combine, group_norm_partials, partial_slots};
use crate::models::layers::Norm;
use crate::tensor::{DType, Tensor};

/// One GroupNorm's statistics gathered over the tiles of an activation.
pub(crate) struct StatsAcc<'a> {
    norm: &'a Norm,
    scratch: Tensor,
    capacity: usize,
    offsets: Vec<usize>,
}

impl Executor {
    pub(super) fn stats_acc<'n>(&mut self, norm: &'n Norm, act: &Act) -> Result<StatsAcc<'n>> {
        let g = norm.groups();
        let mut offsets = Vec::with_capacity(act.grid.len());
        let mut capacity = 0;
        for i in 0..act.grid.len() {
            let r = act.grid.rect(i);
            offsets.push(capacity);
            capacity += partial_slots(act.c, r.h, r.w, g);
        }
        let scratch = Tensor::empty(
            &self.ctx,
            &[act.n * g * capacity * 4],
            DType::F32,
            "groupnorm tile partials",
        )?;
        Ok(StatsAcc {
            norm,
            scratch,
            capacity,
            offsets,
        })
    }

    /// Adds output tile `i`'s GroupNorm partials to `acc` (when its consumer
    /// normalises), parks the tile in `out` and counts the step.
    pub(super) fn emit_tile(
        &mut self,
        out: &mut Act,
        acc: Option<&StatsAcc>,
        i: usize,
        tile: Tensor,
        stage: &'static str,
    ) -> Result<()> {
        if let Some(acc) = acc {
            self.stats_add(acc, i, &tile)?;
        }
        self.park(out, i, tile)?;
        self.step_done(stage)
    }

    fn stats_add(&mut self, acc: &StatsAcc, i: usize, tile: &Tensor) -> Result<()> {
        group_norm_partials(
            self.rec(),
            tile,
            acc.norm.groups(),
            None,
            &acc.scratch,
            acc.offsets[i],
            acc.capacity,
        )
    }

    /// The GroupNorm affine of everything added to `acc` (`None` without one).
    pub(super) fn stats_finish(
        &mut self,
        acc: Option<StatsAcc>,
        n: usize,
    ) -> Result<Option<Tensor>> {
        let Some(acc) = acc else { return Ok(None) };
        let c = acc.norm.channels();
        let affine = Tensor::empty(&self.ctx, &[n, c, 2], DType::F32, "groupnorm affine")?;
        group_norm_combine(
            self.rec(),
            &acc.scratch,
            n,
            acc.capacity,
            &acc.norm.params(),
            &affine,
        )?;
        Ok(Some(affine))
    }
}
