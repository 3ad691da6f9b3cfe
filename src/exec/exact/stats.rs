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

    pub(super) fn stats_add(&mut self, acc: &StatsAcc, i: usize, tile: &Tensor) -> Result<()> {
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

    pub(super) fn stats_finish(&mut self, acc: StatsAcc, n: usize) -> Result<Tensor> {
        let c = acc.norm.channels();
        let affine = Tensor::empty(&self.ctx, &[n, c, 2], DType::F32, "groupnorm affine")?;
        let (gamma, beta) = acc.norm.gamma_beta();
        group_norm_combine(
            self.rec(),
            &acc.scratch,
            n,
            acc.norm.groups(),
            acc.capacity,
            gamma,
            beta,
            acc.norm.eps(),
            &affine,
        )?;
        Ok(affine)
    }
}
