//! The mid-block attention tile by tile: K and V per tile, parked, streamed
//! block by block through each query tile's online-softmax state.

use super::parking::Act;
use super::{stage, Executor};
use crate::attention::Mask;
use crate::error::Result;
use crate::kernels::attention::{
    attention_with, flash_attention_block, state_len, AttentionProblem, BlockRole, KvInput, Strides,
};
use crate::kernels::conv2d::{conv2d, Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::tensor_ops::Window;
use crate::kernels::Activation;
use crate::models::layers::Norm;
use crate::tensor::{DType, Tensor};

/// The mid-block attention for [`Executor::attention`].
pub(crate) struct AttentionSpec<'a> {
    pub q: &'a Conv2dWeights,
    pub k: &'a Conv2dWeights,
    pub v: &'a Conv2dWeights,
    pub out: &'a Conv2dWeights,
    /// Global GroupNorm affine of the input `[N, C, 2]` applied on load
    /// (`None`: the projections read their input as it is).
    pub affine: Option<&'a Tensor>,
    /// What q/k/v project (Wan's per-frame attention: the RMS-normed
    /// input); `None`: the input itself. The output is added into the input.
    pub source: Option<&'a Act>,
    /// Statistics of this norm over the output.
    pub stats: Option<&'a Norm>,
}

impl Executor {
    /// The mid-block attention (GroupNorm affine given, q/k/v/out 1×1
    /// convs, one head over all tokens, residual) tile by tile: K and V are
    /// computed per tile and parked, then each group of query tiles streams
    /// every K/V block through its online-softmax state.
    pub(crate) fn attention(
        &mut self,
        mut x: Act,
        spec: AttentionSpec,
    ) -> Result<(Act, Option<Tensor>)> {
        let (n, c) = (x.n, x.c);
        let scale = 1.0 / (c as f32).sqrt();
        // An f16 model's attention may round q, k, v to f16 (cooperative matrices).
        let f16_operands = spec.q.dtype() == DType::F16;
        let same1 = Conv2dOptions::same(1);
        let pro = spec.affine.map(|affine| Prologue {
            affine,
            act: Activation::None,
        });
        let tiles = x.grid.len();
        let mut out = self.empty_act(n, spec.out.cout(), x.h, x.w, spec.out.dtype());
        let mut stats = match spec.stats {
            Some(norm) => Some(self.stats_acc(norm, &out)?),
            None => None,
        };
        let proj =
            |ex: &mut Executor, xw: &Tensor, w: &Conv2dWeights, r: &Window| -> Result<Tensor> {
                let t = Tensor::empty(
                    &ex.ctx,
                    &[n, w.cout(), r.h, r.w],
                    DType::F32,
                    "attention proj",
                )?;
                conv2d(ex.rec(), xw, w, pro, None, &t, &same1)?;
                Ok(t)
            };
        if tiles == 1 {
            // Whole: the plain flash-attention kernel, as the untiled decoder.
            let r = x.grid.rect(0);
            let xw = self.read_window(spec.source.unwrap_or(&x), r)?;
            let q = proj(self, &xw, spec.q, &r)?;
            let k = proj(self, &xw, spec.k, &r)?;
            let v = proj(self, &xw, spec.v, &r)?;
            drop(xw);
            let o = Tensor::empty(&self.ctx, &[n, c, r.h, r.w], DType::F32, "attention out")?;
            let tok = [n, c, r.h * r.w];
            attention_with(
                self.rec(),
                &q.reshape(&tok)?,
                &k.reshape(&tok)?,
                &v.reshape(&tok)?,
                scale,
                &o.reshape(&tok)?,
                f16_operands,
            )?;
            drop((q, k, v));
            let res = self.take_piece(&mut x, 0)?;
            conv2d(self.rec(), &o, spec.out, None, Some(&res), &res, &same1)?;
            self.emit_tile(&mut out, stats.as_mut(), 0, res, stage::ATTENTION)?;
        } else {
            let mut ks = self.empty_act(n, c, x.h, x.w, DType::F32);
            let mut vs = self.empty_act(n, c, x.h, x.w, DType::F32);
            for i in 0..tiles {
                let r = x.grid.rect(i);
                let xw = self.read_window(spec.source.unwrap_or(&x), r)?;
                let k = proj(self, &xw, spec.k, &r)?;
                self.park(&mut ks, i, k)?;
                let v = proj(self, &xw, spec.v, &r)?;
                self.park(&mut vs, i, v)?;
                self.step_done(stage::KV)?;
            }
            let full = crate::exec::full_dry_runs();
            // `t` queries over `kv` keys (one K/V block).
            let problem = |t: usize, kv: usize| AttentionProblem {
                batch: n,
                heads: 1,
                q_len: t,
                kv_len: kv,
                head_dim: c,
                q_strides: Strides::channel_major(c, t),
                kv_strides: Strides::channel_major(c, kv),
                scale,
                mask: Mask::NONE,
                q_pos0: 0,
                config: None,
                f16_operands,
            };
            // f32 of a query tile's (max, sum) state (per output chunk of a wide head).
            let ml_len = |ex: &Executor, t: usize| state_len(&problem(t, 1), false, ex.ctx.caps());
            let peaks_only = self.counts_peaks_only();
            // Query tiles per pass (their q, acc and ml states within the budget).
            let states: Vec<u64> = (0..tiles)
                .map(|i| {
                    let t = x.grid.rect(i).area();
                    (2 * n * c * t + ml_len(self, t)) as u64 * 4
                })
                .collect();
            // A plan made on a few rows samples a few passes: they take at
            // most BY_ROWS_PASS_ROWS rows, however many the budget holds.
            let most_rows = match self.plan.by_rows {
                Some(_) => BY_ROWS_PASS_ROWS,
                None => usize::MAX,
            };
            let budget = self.plan.attention_state_budget;
            let groups = query_passes(&states, x.grid.cols(), budget, most_rows);
            self.report.attention_rows_per_pass = self
                .report
                .attention_rows_per_pass
                .max(rows_per_pass(&states, x.grid.cols(), budget).min(most_rows));
            for group in groups {
                let mut states = Vec::new();
                for &i in &group {
                    let r = x.grid.rect(i);
                    let xw = self.read_window(spec.source.unwrap_or(&x), r)?;
                    let q = proj(self, &xw, spec.q, &r)?;
                    let t = r.area();
                    let acc = Tensor::empty(&self.ctx, &[n, c, t], DType::F32, "attention acc")?;
                    let ml = Tensor::empty(
                        &self.ctx,
                        &[ml_len(self, t)],
                        DType::F32,
                        "attention max/sum",
                    )?;
                    states.push((q.reshape(&[n, c, t])?, acc, ml));
                }
                // Blocks already run in this pass with the same shape and
                // parking (K, V on the host or not) allocate, free and record
                // the same from the same live tensors: in dry runs that count
                // only peaks, later ones only stage, step and sync.
                let mut seen: Vec<(usize, usize, bool, bool)> = Vec::new();
                // In a plan made on a few rows, each row of K/V tiles starts
                // with empty staging: what a row stages then depends on its
                // kind alone (the staging peak otherwise creeps up with the
                // rows streamed between waits).
                let by_rows = self.plan.by_rows.is_some();
                for b in 0..tiles {
                    let rb = ks.grid.rect(b);
                    if by_rows && b % ks.grid.cols() == 0 && self.staging > 0 {
                        self.sync()?;
                    }
                    if peaks_only {
                        let class = (rb.h, rb.w, ks.on_host(b), vs.on_host(b));
                        if seen.contains(&class) {
                            for (act, host) in [(&ks, class.2), (&vs, class.3)] {
                                if host {
                                    self.stage_upload(act.bytes_of(&rb), None)?;
                                }
                            }
                            self.step_done(stage::ATTENTION)?;
                            continue;
                        }
                        seen.push(class);
                    }
                    let kb = self.read_window(&ks, rb)?.reshape(&[n, c, rb.area()])?;
                    let vb = self.read_window(&vs, rb)?.reshape(&[n, c, rb.area()])?;
                    let role = BlockRole {
                        first: b == 0,
                        last: b + 1 == tiles,
                    };
                    // Dry runs: states of one query length make identical calls
                    // (their checks and labels depend on shapes only, and live
                    // tensors never overlap), so one is checked and the others
                    // repeat its labels: (q length, its labels' range).
                    let dry = self.ctx.is_null() && !full;
                    let mut checked: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
                    for (q, acc, ml) in &states {
                        let t = q.shape()[2];
                        if let Some((_, labels)) = checked.iter().find(|(l, _)| *l == t) {
                            self.rec().repeat_labels(labels.clone());
                            continue;
                        }
                        let mark = self.rec().dry_mark();
                        let prob = problem(t, rb.area());
                        let kv = KvInput::F32 { k: &kb, v: &vb };
                        flash_attention_block(self.rec(), &prob, q, kv, acc, Some(ml), role)?;
                        if dry {
                            checked.push((t, mark..self.rec().dry_mark()));
                        }
                    }
                    drop((kb, vb));
                    self.step_done(stage::ATTENTION)?;
                }
                for (&i, (q, acc, ml)) in group.iter().zip(states) {
                    drop((q, ml));
                    let r = x.grid.rect(i);
                    let o = acc.reshape(&[n, c, r.h, r.w])?;
                    let res = self.take_piece(&mut x, i)?;
                    conv2d(self.rec(), &o, spec.out, None, Some(&res), &res, &same1)?;
                    drop(o);
                    self.emit_tile(&mut out, stats.as_mut(), i, res, stage::ATTENTION)?;
                }
            }
        }
        drop(x);
        let affine = self.stats_finish(stats, n)?;
        Ok((out, affine))
    }
}

/// The query tiles of each attention pass, from every tile's state bytes
/// (row-major, `cols` a row): all in one pass when they fit `budget`; else
/// passes of the same number of whole rows, as many as the first (largest)
/// row's states fit; else, where one row does not fit, chunks of each row
/// of the same number of tiles, as many as the first (largest) tile's fit.
/// Fixed pass sizes make every pass of an image no larger than its first
/// full one (wherever the row or chunk falls), which is what lets the
/// planner plan a tall image on a few of its rows. A pass takes at most
/// `most_rows` rows.
fn query_passes(states: &[u64], cols: usize, budget: u64, most_rows: usize) -> Vec<Vec<usize>> {
    let tiles = states.len();
    let rows = tiles.div_ceil(cols.max(1));
    if (states.iter().sum::<u64>() <= budget && rows <= most_rows) || cols == 0 {
        return vec![(0..tiles).collect()];
    }
    match rows_per_pass(states, cols, budget).min(rows).min(most_rows) {
        0 => {
            let per = (budget / states[0].max(1)).max(1) as usize;
            (0..rows)
                .flat_map(|r| {
                    let row: Vec<usize> = (r * cols..((r + 1) * cols).min(tiles)).collect();
                    row.chunks(per).map(<[usize]>::to_vec).collect::<Vec<_>>()
                })
                .collect()
        }
        m => (0..rows)
            .step_by(m)
            .map(|r| (r * cols..((r + m) * cols).min(tiles)).collect())
            .collect(),
    }
}

/// Most rows of query tiles in an attention pass of a plan made on a few
/// rows of tiles: its samples then need only a few rows. The cost is in
/// real runs whose budget would hold more rows: every pass streams every
/// K/V tile, so they stream them more often. The full-size models' budgets
/// hold 1–2 rows at these sizes (sd15, wan21); small-channel models pay.
const BY_ROWS_PASS_ROWS: usize = 2;

/// Whole rows of query tiles (of the first, largest row) `budget` holds
/// (0: not even one): the rows of a pass where the tiles do not all fit.
pub(super) fn rows_per_pass(states: &[u64], cols: usize, budget: u64) -> usize {
    let first_row: u64 = states.iter().take(cols.max(1)).sum();
    (budget / first_row.max(1)) as usize
}

#[cfg(test)]
mod tests {
    use super::query_passes;

    /// Every tile in exactly one pass, in order; no pass over the budget
    /// unless it is a single tile; no pass larger than the first full one.
    #[test]
    fn query_passes_cover_every_tile_within_the_budget() {
        // 5 rows × 7 columns, the last row and column smaller.
        let (rows, cols) = (5, 7);
        let states: Vec<u64> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                (if r + 1 == rows { 3 } else { 10 }) * (if c + 1 == cols { 2 } else { 5 })
            })
            .collect();
        let total: u64 = states.iter().sum();
        for budget in [
            1,
            49,
            50,
            99,
            150,
            320,
            321,
            700,
            1000,
            total - 1,
            total,
            total + 5,
        ] {
            for most in [usize::MAX, 2, 1] {
                let passes = query_passes(&states, cols, budget, most);
                let flat: Vec<usize> = passes.iter().flatten().copied().collect();
                assert_eq!(
                    flat,
                    (0..rows * cols).collect::<Vec<_>>(),
                    "budget {budget}"
                );
                let sums: Vec<u64> = passes
                    .iter()
                    .map(|p| p.iter().map(|&i| states[i]).sum())
                    .collect();
                for (p, s) in passes.iter().zip(&sums) {
                    assert!(*s <= budget || p.len() == 1, "budget {budget}: {passes:?}");
                    assert!(s <= &sums[0], "budget {budget}: pass {p:?} over the first");
                    let span = p.last().unwrap() / cols - p[0] / cols + 1;
                    assert!(span <= most, "budget {budget}, {most} rows: {p:?}");
                }
                let one = total <= budget && rows <= most;
                assert_eq!(passes.len() == 1, one, "budget {budget}, {most} rows");
            }
        }
    }
}
