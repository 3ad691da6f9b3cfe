//! GroupNorm statistics over the tiles of an activation: per-tile partial
//! sums while the tiles are produced, merged exactly (Chan's formula) after
//! the last one into the global affine the next conv applies. The scratch
//! holds at most [`FOLD_TILES`] tiles' partials, folded into one slot when
//! full, so its size does not grow with the image.

use super::parking::Act;
use super::Executor;
use crate::error::Result;
use crate::kernels::group_norm::{
    group_norm_combine, group_norm_fold, group_norm_partials, partial_slots,
};
use crate::models::layers::Norm;
use crate::tensor::{DType, Tensor};

/// Tiles' partials a statistics scratch holds before it is folded (a few
/// tiles' worth: runs of up to this many tiles never fold).
pub(crate) const FOLD_TILES: usize = 8;

/// One GroupNorm's statistics gathered over the tiles of an activation.
pub(crate) struct StatsAcc<'a> {
    norm: &'a Norm,
    scratch: Tensor,
    capacity: usize,
    /// Slots written (from slot 0).
    used: usize,
    /// Slots each tile's partials take.
    slots: Vec<usize>,
}

impl Executor {
    pub(super) fn stats_acc<'n>(&mut self, norm: &'n Norm, act: &Act) -> Result<StatsAcc<'n>> {
        let g = norm.groups();
        let slots: Vec<usize> = (0..act.grid.len())
            .map(|i| {
                let r = act.grid.rect(i);
                partial_slots(act.c, r.h, r.w, g)
            })
            .collect();
        let total: usize = slots.iter().sum();
        let largest = slots.iter().copied().max().unwrap_or(0);
        // Bounded by the tile size, not the tile count (one slot more than
        // a tile: a fold keeps its result in slot 0).
        let capacity = total.min((FOLD_TILES * largest).max(largest + 1));
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
            used: 0,
            slots,
        })
    }

    /// Adds output tile `i`'s GroupNorm partials to `acc` (when its consumer
    /// normalises), parks the tile in `out` and counts the step.
    pub(super) fn emit_tile(
        &mut self,
        out: &mut Act,
        acc: Option<&mut StatsAcc>,
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

    fn stats_add(&mut self, acc: &mut StatsAcc, i: usize, tile: &Tensor) -> Result<()> {
        let k = acc.slots[i];
        if acc.used + k > acc.capacity {
            let rows = tile.shape()[0] * acc.norm.groups();
            group_norm_fold(self.rec(), &acc.scratch, rows, (acc.used, acc.capacity))?;
            acc.used = 1;
        }
        group_norm_partials(
            self.rec(),
            tile,
            acc.norm.groups(),
            None,
            &acc.scratch,
            acc.used,
            acc.capacity,
        )?;
        acc.used += k;
        Ok(())
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
            (acc.used, acc.capacity),
            &acc.norm.params(),
            &affine,
        )?;
        Ok(Some(affine))
    }
}
