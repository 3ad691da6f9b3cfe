//! The exact-tiled executor: every layer runs tile by tile over its
//! output with global GroupNorm statistics (see [`crate::tiling`] for the
//! method and the memory plan).
//!
//! - [`grid`]: tile grids per resolution level, conv input spans;
//! - [`parking`]: parked activations ([`Act`]), windows, read-backs;
//! - [`stats`]: GroupNorm statistics accumulated over tiles;
//! - [`attention`]: the mid-block attention streamed over K/V tiles;
//! - [`video`]: causal video ops (time caches as parked whole-frame activations).

mod attention;
mod grid;
mod parking;
mod run;
mod stats;
mod video;

use crate::error::{Error, Result};
use crate::exec::report::{Progress, ProgressUpdate, TilingReport};
use crate::gpu::{Context, Recorder, SubmitStats};
use crate::kernels::conv2d::{conv2d, output_size, Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::elementwise::{add, unary, Unary};
use crate::kernels::image::{to_rgba8, ImageRange};
use crate::kernels::tensor_ops::{copy_window, Window};
use crate::kernels::Activation;
use crate::memory::TracingPool;
use crate::models::layers::Norm;
use crate::tensor::{DType, Tensor};
pub(crate) use attention::AttentionSpec;
use grid::{conv_span, upsample_span, Grid};
pub(crate) use parking::Act;
use parking::{HostPiece, Piece, Shared};
pub(crate) use stats::FOLD_TILES;
pub(crate) use video::{level_tiles, video_levels, VideoCaches};

/// Everything a tiled run needs to allocate identically in dry and real runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ExactPlan {
    /// Tile side in pixels of the largest level (the image).
    pub px: usize,
    /// Tile side per level (latent first); `None`: whole.
    pub levels: Vec<Option<usize>>,
    /// Latent `(h, w)`.
    pub latent: (usize, usize),
    /// Most bytes of parked tiles on the device.
    pub device_cap: u64,
    /// Bytes the query tiles of one attention pass may hold.
    pub attention_state_budget: u64,
    /// Tile steps (for progress), known after a dry run.
    pub total_steps: usize,
    /// Most bytes of upload staging in flight, and of one read-back of
    /// several tiles (a single tile is read back whole): part of the budget.
    pub staging_limit: u64,
    /// Planned on a few rows of tiles, not every tile (a huge image).
    pub by_rows: Option<ByRows>,
    /// Most bytes of tiles parked in host memory in a real run
    /// (`Tiling::max_host_memory`; `None`: the host's available memory
    /// when the run starts). Null devices predict for any host.
    pub max_host: Option<u64>,
}

/// How a plan made on a few rows of tiles stands for the whole run
/// (see `run::strategy::fit_plan_by_rows`): a run on a null device (an
/// estimate) runs `latent_rows` rows of the latent, whose peaks are the
/// whole run's, and reports `counts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ByRows {
    /// Latent rows of the run that stands for the whole one.
    pub latent_rows: usize,
    /// The whole run's counts, extrapolated.
    pub counts: crate::exec::report::Counts,
}

impl ExactPlan {
    /// Plan key for the planned memory pool.
    pub(crate) fn key(&self) -> String {
        format!(
            "exact:{}:{:?}:{}:{}",
            self.px, self.levels, self.device_cap, self.attention_state_budget
        )
    }
}

/// Stages every exact tiled decode reports progress with.
pub(crate) mod stage {
    pub const CONV: &str = "conv";
    pub const KV: &str = "attention k/v";
    pub const ATTENTION: &str = "attention";
    pub const OUTPUT: &str = "output";
    pub const MAP: &str = "map";
    pub const TIME: &str = "time cache";
}

// ---------------------------------------------------------------------------
// The executor
// ---------------------------------------------------------------------------

/// Most upload staging bytes in flight before the executor waits for the
/// device (a plan's `staging_limit` is at most this, and at most an eighth
/// of the budget left after the weights).
pub(crate) const STAGING_LIMIT: u64 = 256 << 20;
/// Tile steps recorded before a submit (bounds command buffers and lets the
/// device start while the host records).
const STEPS_PER_SUBMIT: usize = 16;

/// The residual operand of a tiled conv.
pub(crate) enum Residual<'a> {
    None,
    /// Added in place into the activation's tiles (consumed).
    Take(Act),
    /// A 1×1 conv of this activation's tile.
    Shortcut(&'a Act, &'a Conv2dWeights),
}

/// A conv layer for [`Executor::conv`].
pub(crate) struct ConvSpec<'a> {
    pub w: &'a Conv2dWeights,
    /// Global GroupNorm affine `[N, Cin, 2]` and activation applied on load.
    pub prologue: Option<(&'a Tensor, Activation)>,
    /// Nearest 2× upsample before a 3×3 conv.
    pub upsample: bool,
    /// 1, or 2 for a downsampling conv.
    pub stride: usize,
    /// Zero padding of the whole image (top, left, bottom, right); `None`:
    /// `k / 2` on every side.
    pub pad: Option<[u32; 4]>,
    /// Applied to each output tile after the residual add.
    pub epilogue: Option<Unary>,
    /// Gather statistics of this norm over the output.
    pub stats: Option<&'a Norm>,
}

impl<'a> ConvSpec<'a> {
    pub(crate) fn new(w: &'a Conv2dWeights) -> Self {
        ConvSpec {
            w,
            prologue: None,
            upsample: false,
            stride: 1,
            pad: None,
            epilogue: None,
            stats: None,
        }
    }
    pub(crate) fn prologue(mut self, affine: &'a Tensor, act: Activation) -> Self {
        self.prologue = Some((affine, act));
        self
    }
    pub(crate) fn upsample(mut self) -> Self {
        self.upsample = true;
        self
    }
    /// A stride-2 conv over the image zero-padded by `pad` (top, left,
    /// bottom, right): diffusers' Downsample2D pads (0, 0, 1, 1), TAE (1, 1, 1, 1).
    pub(crate) fn downsample(mut self, pad: [u32; 4]) -> Self {
        self.stride = 2;
        self.pad = Some(pad);
        self
    }
    /// Whole-image geometry of the layer.
    fn options(&self) -> Conv2dOptions {
        Conv2dOptions {
            stride: self.stride as u32,
            pad: self.pad.unwrap_or([self.w.k() as u32 / 2; 4]),
            upsample: self.upsample,
            replicate: false,
            reflect: false,
        }
    }
    pub(crate) fn epilogue(mut self, f: Unary) -> Self {
        self.epilogue = Some(f);
        self
    }
    pub(crate) fn stats(mut self, norm: Option<&'a Norm>) -> Self {
        self.stats = norm;
        self
    }
}

/// Runs decoder or encoder layers tile by tile, parking tiles within a device budget.
pub(crate) struct Executor {
    ctx: Context,
    rec: Option<Recorder<'static>>,
    plan: ExactPlan,
    counters: Shared,
    report: TilingReport,
    progress: Option<Progress>,
    staging: u64,
    staging_peak: u64,
    steps_since_submit: usize,
    /// The f16 overflow counter every recorder of this run counts into.
    range_flag: Option<Tensor>,
    /// Time every kernel (each submit then waits for its timestamps).
    profile: bool,
    /// MACs and GPU times summed over this run's submits.
    stats: SubmitStats,
    /// Most bytes parked in host memory ([`ExactPlan::max_host`]).
    host_limit: Option<u64>,
}

impl Executor {
    pub(crate) fn new(ctx: &Context, plan: ExactPlan, progress: Option<Progress>) -> Self {
        let host_limit = match ctx.is_null() {
            true => None,
            false => plan.max_host.or_else(|| ctx.host_memory_available()),
        };
        Executor {
            host_limit,
            ctx: ctx.clone(),
            rec: None,
            plan,
            counters: Shared::default(),
            report: TilingReport::default(),
            progress,
            staging: 0,
            staging_peak: 0,
            steps_since_submit: 0,
            range_flag: None,
            profile: false,
            stats: SubmitStats::default(),
        }
    }

    /// Profiles every following submit (per-kernel GPU times summed over
    /// all tile steps; returns whether the device can).
    pub(crate) fn enable_profiling(&mut self) -> bool {
        self.profile = crate::gpu::Profiler::new(&self.ctx).is_some();
        self.profile
    }

    pub(crate) fn rec(&mut self) -> &mut Recorder<'static> {
        let (ctx, flag, profile) = (&self.ctx, &self.range_flag, self.profile);
        self.rec.get_or_insert_with(|| {
            let mut rec = Recorder::new(ctx);
            if let Some(f) = flag {
                rec.set_range_flag(f.clone());
            }
            if profile {
                rec.enable_profiling();
            }
            rec
        })
    }

    /// Counts f16 conv stores outside f16's range from now on (see
    /// [`Recorder::track_f16_range`]); returns the counter.
    pub(crate) fn track_f16_range(&mut self) -> Result<Tensor> {
        let t = self.rec().track_f16_range()?;
        self.range_flag = Some(t.clone());
        Ok(t)
    }

    pub(super) fn submit(&mut self) -> Result<()> {
        if self.ctx.is_null() && !self.profile {
            // A null device submits nothing: its recorder stays (a run
            // parking on the host submits at every tile, and a new recorder
            // costs more than a dry tile step), its labels are counted.
            if let Some(rec) = self.rec.as_mut() {
                self.stats.add(&rec.take_labels(), None);
            }
        } else if let Some(rec) = self.rec.take() {
            if self.profile {
                let waiting = std::time::Instant::now();
                let (labels, profile) = rec.submit_profiled()?;
                self.stats.add(&labels, profile);
                self.stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
            } else {
                let labels = rec.submit()?;
                self.stats.add(&labels, None);
            }
        }
        self.steps_since_submit = 0;
        Ok(())
    }

    /// Submits and waits: staging buffers of earlier uploads are freed.
    pub(super) fn sync(&mut self) -> Result<()> {
        self.submit()?;
        let waiting = std::time::Instant::now();
        self.ctx.wait_idle()?; // returns at once on the null device
        self.stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
        self.staging = 0;
        self.report.syncs += 1;
        Ok(())
    }

    /// Submits what is recorded and returns the report.
    pub(crate) fn finish(self) -> Result<TilingReport> {
        Ok(self.finish_with_stats()?.0)
    }

    /// [`Executor::finish`], with the MACs and (when profiling) the GPU
    /// times of every submit of the run.
    pub(crate) fn finish_with_stats(mut self) -> Result<(TilingReport, SubmitStats)> {
        self.submit()?;
        let r = self.report();
        Ok((r, std::mem::take(&mut self.stats)))
    }

    /// The report of what ran so far (a streamed video's executor lives on).
    pub(crate) fn report(&self) -> TilingReport {
        let c = self.counters.borrow();
        let mut r = self.report.clone();
        r.mode = "exact".into();
        r.tile_size = Some(self.plan.px);
        r.level_tiles = self.plan.levels.clone();
        r.mid_block_tiled = self.plan.levels.first().is_some_and(|l| l.is_some());
        r.device_parking_cap = self.plan.device_cap;
        r.device_parked_peak_bytes = c.device_peak;
        r.host_parked_peak_bytes = c.host_peak;
        r.staging_peak_bytes = self.staging_peak;
        r
    }

    pub(super) fn step_done(&mut self, stage: &'static str) -> Result<()> {
        self.ctx.check_cancel()?;
        self.report.steps += 1;
        self.steps_since_submit += 1;
        if let Some(p) = &self.progress {
            (p.0)(ProgressUpdate {
                done: self.report.steps,
                total: self.plan.total_steps.max(self.report.steps),
                stage,
            });
        }
        if self.staging >= self.plan.staging_limit {
            self.sync()?;
        } else if self.steps_since_submit >= STEPS_PER_SUBMIT {
            self.submit()?;
        }
        Ok(())
    }

    /// A planner's dry run that counts only the pool's peak and largest
    /// tensor (a [`TracingPool::peak_only`] tracer on a null device): a
    /// tile step that repeats an earlier one's allocations from the same
    /// live bytes may skip them. False with [`crate::exec::full_plan`].
    pub(super) fn counts_peaks_only(&self) -> bool {
        self.ctx.is_null()
            && !crate::exec::full_plan()
            && self
                .ctx
                .pool()
                .as_any()
                .downcast_ref::<TracingPool>()
                .is_some_and(TracingPool::is_peak_only)
    }

    /// The grid of an `h x w` activation (its resolution level's tiles).
    fn grid_for(&self, h: usize, w: usize) -> Grid {
        let (lh, lw) = self.plan.latent;
        let mut level = 0;
        while lh << level < h && level + 1 < self.plan.levels.len() {
            level += 1;
        }
        debug_assert!(lh << level == h && lw << level == w);
        Grid::new(h, w, self.plan.levels[level])
    }

    pub(super) fn empty_act(&self, n: usize, c: usize, h: usize, w: usize, dtype: DType) -> Act {
        let grid = self.grid_for(h, w);
        Act {
            n,
            c,
            h,
            w,
            dtype,
            grid,
            pieces: (0..grid.len()).map(|_| Piece::Empty).collect(),
        }
    }

    /// An activation held in host memory as one piece (the latents).
    pub(crate) fn host_act(&mut self, shape: [usize; 4], data: &[f32]) -> Act {
        let [n, c, h, w] = shape;
        let data = self.ctx.host_copy_of(bytemuck::cast_slice(data));
        Act {
            n,
            c,
            h,
            w,
            dtype: DType::F32,
            grid: Grid::new(h, w, None),
            pieces: vec![Piece::Host(HostPiece::new(data, None))],
        }
    }

    /// Computes output tile `r` of a conv on `x`, into `residual` when given.
    fn conv_tile(
        &mut self,
        x: &Act,
        spec: &ConvSpec,
        r: Window,
        residual: Option<Tensor>,
    ) -> Result<Tensor> {
        let k = spec.w.k();
        let cout = spec.w.cout();
        // Input window, padding and where the tile sits in the conv output.
        let (win, pad, offset, out_hw) = if spec.upsample {
            if k != 3 {
                return Err(Error::Unsupported("tiled upsample conv with k != 3".into()));
            }
            let (y0, y1, pt, pb, oy, oh) = upsample_span(r.y, r.bottom(), x.h);
            let (x0, x1, pl, pr, ox, ow) = upsample_span(r.x, r.right(), x.w);
            (
                Window::new(y0, x0, y1 - y0, x1 - x0),
                [pt, pl, pb, pr],
                (oy, ox),
                (oh, ow),
            )
        } else {
            let whole = spec.options();
            let s = spec.stride;
            let [pt, pl, ..] = whole.pad;
            let (y0, y1, pt, pb) = conv_span(r.y, r.bottom(), x.h, k, s, pt as usize);
            let (x0, x1, pl, pr) = conv_span(r.x, r.right(), x.w, k, s, pl as usize);
            (
                Window::new(y0, x0, y1 - y0, x1 - x0),
                [pt, pl, pb, pr],
                (0, 0),
                (r.h, r.w),
            )
        };
        let opts = Conv2dOptions {
            pad,
            ..spec.options()
        };
        let input = self.read_window(x, win)?;
        let prologue = spec.prologue.map(|(affine, act)| Prologue { affine, act });
        let exact = offset == (0, 0) && out_hw == (r.h, r.w);
        let n = x.n;
        let out = match residual {
            Some(res) if exact => {
                conv2d(
                    self.rec(),
                    &input,
                    spec.w,
                    prologue,
                    Some(&res),
                    &res,
                    &opts,
                )?;
                res
            }
            residual => {
                let full = Tensor::empty(
                    &self.ctx,
                    &[n, cout, out_hw.0, out_hw.1],
                    spec.w.dtype(),
                    "conv tile",
                )?;
                conv2d(self.rec(), &input, spec.w, prologue, None, &full, &opts)?;
                let tile = if exact {
                    full
                } else {
                    drop(input);
                    let tile = Tensor::empty(
                        &self.ctx,
                        &[n, cout, r.h, r.w],
                        spec.w.dtype(),
                        "conv tile",
                    )?;
                    copy_window(self.rec(), &full, offset, &tile, (0, 0), (r.h, r.w))?;
                    self.report.window_copies += 1;
                    tile
                };
                match residual {
                    // An up-sampling conv's tile is a window of its output:
                    // the residual is added after the copy.
                    Some(res) => {
                        add(self.rec(), &tile, &res, &res)?;
                        res
                    }
                    None => tile,
                }
            }
        };
        if let Some(f) = spec.epilogue {
            unary(self.rec(), f, &out, &out)?;
        }
        Ok(out)
    }

    /// A conv layer over all tiles of its output; returns the output and the
    /// global affine of `spec.stats` over it.
    pub(crate) fn conv(
        &mut self,
        x: &Act,
        spec: ConvSpec,
        mut residual: Residual,
    ) -> Result<(Act, Option<Tensor>)> {
        let (oh, ow) = output_size(x.h, x.w, spec.w.k(), &spec.options());
        if spec.stride != 1 && !matches!(residual, Residual::None) {
            return Err(Error::Unsupported(
                "tiled residual add after a strided conv".into(),
            ));
        }
        // Activations take the weights' dtype (the model's).
        let mut out = self.empty_act(x.n, spec.w.cout(), oh, ow, spec.w.dtype());
        if let Residual::Take(res) = &residual {
            if res.grid != out.grid || res.c != out.c || res.n != out.n {
                return Err(Error::shape(
                    "tiled conv",
                    format!(
                        "residual [{}, {}, {}, {}] does not match the output's tiles",
                        res.n, res.c, res.h, res.w
                    ),
                ));
            }
        }
        let mut stats = match spec.stats {
            Some(norm) => Some(self.stats_acc(norm, &out)?),
            None => None,
        };
        for i in 0..out.grid.len() {
            let r = out.grid.rect(i);
            let res = match &mut residual {
                Residual::None => None,
                Residual::Take(act) => Some(self.take_piece(act, i)?),
                Residual::Shortcut(xa, sc) => {
                    let xw = self.read_window(xa, r)?;
                    let t = Tensor::empty(
                        &self.ctx,
                        &[x.n, sc.cout(), r.h, r.w],
                        sc.dtype(),
                        "shortcut tile",
                    )?;
                    conv2d(self.rec(), &xw, sc, None, None, &t, &Conv2dOptions::same(1))?;
                    Some(t)
                }
            };
            let tile = self.conv_tile(x, &spec, r, res)?;
            self.emit_tile(&mut out, stats.as_mut(), i, tile, stage::CONV)?;
        }
        drop(residual);
        let affine = self.stats_finish(stats, x.n)?;
        Ok((out, affine))
    }

    /// The final conv: each output tile becomes RGBA8 pixels (and the raw
    /// output when `keep_raw`).
    pub(crate) fn conv_to_image(
        &mut self,
        x: &Act,
        spec: ConvSpec,
        range: ImageRange,
        keep_raw: bool,
    ) -> Result<(Act, Option<Act>)> {
        let (n, c) = (x.n, spec.w.cout());
        let mut rgba = self.empty_act(n, 1, x.h, x.w, DType::Rgba8);
        let mut raw = keep_raw.then(|| self.empty_act(n, c, x.h, x.w, DType::F32));
        for i in 0..rgba.grid.len() {
            let r = rgba.grid.rect(i);
            let tile = self.conv_tile(x, &spec, r, None)?;
            let px = Tensor::empty(&self.ctx, &[n, 1, r.h, r.w], DType::Rgba8, "rgba8 tile")?;
            to_rgba8(self.rec(), &tile, range, &px.reshape(&[n, r.h, r.w])?)?;
            self.park(&mut rgba, i, px)?;
            if let Some(raw) = &mut raw {
                // The raw output is handed out as f32 whatever the model's dtype.
                let tile = if tile.dtype() == DType::F32 {
                    tile
                } else {
                    let wide = Tensor::empty(&self.ctx, tile.shape(), DType::F32, "raw tile")?;
                    unary(
                        self.rec(),
                        Unary::ScaleShift {
                            alpha: 1.0,
                            beta: 0.0,
                        },
                        &tile,
                        &wide,
                    )?;
                    wide
                };
                self.park(raw, i, tile)?;
            }
            self.step_done(stage::OUTPUT)?;
        }
        Ok((rgba, raw))
    }

    /// [`crate::models::graph::Op::DupUp`] (`(ft, 2)`) and
    /// [`crate::models::graph::Op::PixelShuffle`] (`(1, f)`): `x` to
    /// `channels` at `f`× its resolution, each output tile from the window
    /// of `x` under it (whole-image coordinates, so tiles equal the untiled
    /// result); the first `lead` frames are a video's first chunk (see
    /// [`crate::kernels::dup_up::dup_up_video`]). With `residual` the tiles
    /// are added into its tiles (in place, in the same pass).
    pub(crate) fn channels_to_space(
        &mut self,
        x: &Act,
        channels: usize,
        (ft, f): (usize, usize),
        (lead, order): (usize, crate::kernels::dup_up::Order),
        mut residual: Option<Act>,
    ) -> Result<Act> {
        let n = crate::kernels::dup_up::frames_out(x.n, ft, lead);
        let mut out = self.empty_act(n, channels, f * x.h, f * x.w, x.dtype);
        if let Some(r) = &residual {
            if (r.n, r.c, r.h, r.w) != (out.n, out.c, out.h, out.w) || r.grid != out.grid {
                return Err(Error::Internal(format!(
                    "tiled channels-to-space residual [{}, {}, {}, {}]: the output is [{}, {}, {}, {}]",
                    r.n, r.c, r.h, r.w, out.n, out.c, out.h, out.w
                )));
            }
        }
        for i in 0..out.grid.len() {
            let r = out.grid.rect(i);
            let (y0, x0) = (r.y / f, r.x / f);
            let win = Window::new(
                y0,
                x0,
                r.bottom().div_ceil(f) - y0,
                r.right().div_ceil(f) - x0,
            );
            let src = self.read_window(x, win)?;
            let (o, add) = match &mut residual {
                Some(res) => (self.take_piece(res, i)?, true),
                None => {
                    let o =
                        Tensor::empty(&self.ctx, &out.shape_of(&r), x.dtype, "channels to space")?;
                    (o, false)
                }
            };
            let at = (r.y, r.x);
            let map = (lead, order, add);
            crate::kernels::dup_up::to_space(self.rec(), &src, (y0, x0), &o, at, (ft, f), map)?;
            drop(src);
            self.emit_tile(&mut out, None, i, o, stage::MAP)?;
        }
        Ok(out)
    }

    /// `f` applied to every element of `x` (tile by tile, in place).
    pub(crate) fn map(&mut self, mut x: Act, f: Unary) -> Result<Act> {
        if x.grid != self.grid_for(x.h, x.w) {
            // The caller's latents are one host piece: mapped whole, they
            // would be uploaded whole; map them tile by tile instead.
            let mut out = self.empty_act(x.n, x.c, x.h, x.w, x.dtype);
            for i in 0..out.grid.len() {
                let t = self.read_window(&x, out.grid.rect(i))?;
                unary(self.rec(), f, &t, &t)?;
                self.park(&mut out, i, t)?;
                self.step_done(stage::MAP)?;
            }
            return Ok(out);
        }
        let mut out = Act {
            pieces: (0..x.grid.len()).map(|_| Piece::Empty).collect(),
            ..x
        };
        for i in 0..x.grid.len() {
            let t = self.take_piece(&mut x, i)?;
            unary(self.rec(), f, &t, &t)?;
            self.park(&mut out, i, t)?;
            self.step_done(stage::MAP)?;
        }
        Ok(out)
    }
}

// See `exec::untiled`: models never import an executor.
impl crate::models::ImageDecoder {
    /// The decoder tile by tile (see [`crate::tiling`]): `z` unscaled latents; returns RGBA8
    /// pixels `[N, 1, H, W]` and the raw output when `keep_raw`.
    pub(crate) fn forward_tiled(
        &self,
        ex: &mut Executor,
        z: Act,
        keep_raw: bool,
    ) -> Result<(Act, Option<Act>)> {
        ex.run_graph(self.graph(), z, keep_raw)
    }
}
