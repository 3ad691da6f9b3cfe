//! Tiled decoding: exact (global GroupNorm statistics, layer-synchronous
//! tiles) and fast (independent overlapping tiles blended like diffusers).
//!
//! # Exact tiling
//! Every decoder layer runs tile by tile over its *output*: a conv reads its
//! input window (the tile plus the halo its kernel needs, clamped to the
//! image; the conv's own zero padding applies only at image borders, so the
//! result is the whole-image conv restricted to the tile), and the tile is
//! *parked*: kept on the device while the budget allows, else read back to
//! host memory. A GroupNorm's statistics are accumulated per tile
//! ([`group_norm_partials`]) while its input is produced and merged exactly
//! (Chan's formula) after the last tile ([`group_norm_combine`]); the next
//! conv then applies the global affine (and activation) while loading. The
//! mid-block attention computes K and V per tile, parks them, and streams
//! them block by block through each query tile's online-softmax state
//! ([`flash_attention_block`]). Nothing is recomputed: each conv output pixel is
//! computed once (2× upsample convs compute at most one extra row and column
//! per tile side).
//!
//! Each resolution level has its own tile grid: level `l` (the latent is
//! level 0, every 2× upsample adds one) uses tiles of `tile_size >> (L - l)`
//! pixels so tiles nest across levels; a level smaller than its tile runs
//! whole.
//!
//! Encoders run on the same executor in the other direction (image → latent
//! level): a stride-2 conv reads the input span `conv_span` names for its
//! output tile (halo plus the whole-image padding where the tile touches a
//! border, e.g. diffusers' asymmetric (0, 1, 0, 1) pad).
//!
//! # Memory
//! `max_memory` bounds the pool's peak *allocated* bytes of the whole decode,
//! weights included. The plan is found with dry runs of the same code
//! ([`Context::dry_run`]): first with every tile parked on the host, whose
//! peak is the working set `W` of the largest step; then parked device bytes
//! are capped at `max_memory - (already allocated) - W` and a second dry run
//! checks the peak. Parking decisions depend only on byte counts, so the real
//! run allocates exactly what the dry run did.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;

use crate::attention::Mask;
use crate::error::{Error, Result};
use crate::gpu::{read_back, Capabilities, Context, Recorder, SubmitStats};
use crate::kernels::attention::{
    attention, flash_attention_block, AttentionProblem, BlockRole, KvInput, Strides,
};
use crate::kernels::conv2d::{conv2d, output_size, Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::elementwise::{unary, Unary};
use crate::kernels::group_norm::{group_norm_combine, group_norm_partials, partial_slots};
use crate::kernels::image::{to_rgba8, ImageRange};
use crate::kernels::tensor_ops::{copy_window, Window};
use crate::kernels::Activation;
use crate::models::layers::Norm;
use crate::tensor::{DType, Tensor};

/// How a decode is split into tiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TileMode {
    /// Untiled when the whole decode fits `max_memory` and the device's
    /// binding/buffer limits, otherwise `Exact` with the largest tile that fits.
    #[default]
    Auto,
    /// Never tile (errors name the limit a too-large decode exceeds).
    Off,
    /// Tiles whose output equals the untiled decode up to float rounding.
    Exact,
    /// Independent overlapping tiles blended with linear ramps (the
    /// diffusers / ComfyUI behaviour): seams and tone shifts possible.
    Fast,
}

impl TileMode {
    /// The mode's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            TileMode::Auto => "auto",
            TileMode::Off => "off",
            TileMode::Exact => "exact",
            TileMode::Fast => "fast",
        }
    }
}

impl std::str::FromStr for TileMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(TileMode::Auto),
            "off" => Ok(TileMode::Off),
            "exact" => Ok(TileMode::Exact),
            "fast" => Ok(TileMode::Fast),
            _ => Err(Error::InvalidInput(format!(
                "unknown tile mode `{s}`; use auto, off, exact or fast"
            ))),
        }
    }
}

/// Default tile side of `fast` mode in output pixels (diffusers' SD default).
pub const FAST_DEFAULT_TILE: usize = 512;

/// Tiling options of a decode or encode (a field of [`crate::DecodeOptions`]
/// and [`crate::encode::EncodeOptions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tiling {
    /// How to tile.
    pub mode: TileMode,
    /// Tile side in image pixels (decode output, encode input), rounded up
    /// to a multiple of the model's scale (8). `None`: the largest that fits `max_memory` (exact, auto),
    /// [`FAST_DEFAULT_TILE`] (fast).
    pub tile_size: Option<usize>,
    /// `fast` only: overlap of neighbouring tiles in image pixels, a
    /// multiple of 8 below the tile size (default a quarter of the tile, as
    /// diffusers). Exact tiles need no overlap: their halos are exact.
    pub overlap: Option<usize>,
    /// Peak pool-allocated bytes of the decode or encode, weights included.
    /// `None`: [`default_max_memory`] of the device.
    pub max_memory: Option<u64>,
    /// `exact`: tile the latent-resolution level (the AutoencoderKL
    /// mid-block, TAE's latent-resolution blocks) even when it fits whole (tests).
    pub tile_mid_block: bool,
    /// Most host bytes tiles may be parked in. `None`: the host's
    /// `MemAvailable` (/proc/meminfo) for real runs, unlimited for dry runs
    /// (estimates for another machine). A plan over it fails before any
    /// kernel runs.
    pub max_host_memory: Option<u64>,
}

impl Tiling {
    /// Never tile.
    pub fn off() -> Self {
        Tiling {
            mode: TileMode::Off,
            ..Default::default()
        }
    }
    /// Exact tiles (equal to the untiled result up to rounding).
    pub fn exact() -> Self {
        Tiling {
            mode: TileMode::Exact,
            ..Default::default()
        }
    }
    /// Fast, independently decoded overlapping tiles (diffusers' tiling).
    pub fn fast() -> Self {
        Tiling {
            mode: TileMode::Fast,
            ..Default::default()
        }
    }
    /// Tiles of `px` pixels.
    pub fn with_tile_size(mut self, px: usize) -> Self {
        self.tile_size = Some(px);
        self
    }
    /// Fast tiles overlapping by `px` pixels.
    pub fn with_overlap(mut self, px: usize) -> Self {
        self.overlap = Some(px);
        self
    }
    /// A memory budget of `bytes`.
    pub fn with_max_memory(mut self, bytes: u64) -> Self {
        self.max_memory = Some(bytes);
        self
    }
    /// A limit of `bytes` on tiles parked in host memory.
    pub fn with_max_host_memory(mut self, bytes: u64) -> Self {
        self.max_host_memory = Some(bytes);
        self
    }
    /// The memory budget on a device.
    pub fn budget(&self, caps: &Capabilities) -> u64 {
        self.max_memory.unwrap_or_else(|| default_max_memory(caps))
    }
}

/// The default memory budget. wgpu exposes no VRAM size; the nearest thing
/// it reports is `max_buffer_size`, the largest single buffer, which Vulkan
/// drivers derive from their allocation limits (wgpu caps it at 2 GiB on
/// Mesa; the reference 24 GB GPU reports 24 GiB). The default is three
/// quarters of it, clamped to [1 GiB, 16 GiB]: room for the rest of the
/// application on GPUs, and never less than what a 1024² decode needs tiled.
pub fn default_max_memory(caps: &Capabilities) -> u64 {
    (caps.max_buffer_size / 4 * 3).clamp(1 << 30, 16 << 30)
}

/// `MemAvailable` of /proc/meminfo in bytes (`None` where unreadable).
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One tile step done.
#[derive(Clone, Copy, Debug)]
pub struct ProgressUpdate {
    /// Steps done.
    pub done: usize,
    /// Steps in total.
    pub total: usize,
    /// The layer being run.
    pub stage: &'static str,
}

/// A progress callback (called once per tile step of a tiled decode or encode).
#[derive(Clone)]
pub struct Progress(pub Arc<dyn Fn(ProgressUpdate) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}

/// How a decode or encode was tiled, and what tiling cost.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TilingReport {
    /// `untiled`, `exact` or `fast`.
    pub mode: String,
    /// The memory budget (bytes, weights included).
    pub max_memory: u64,
    /// Tile side in image pixels (decode output, encode input).
    pub tile_size: Option<usize>,
    /// `fast`: overlap in image pixels.
    pub overlap: Option<usize>,
    /// Tiles of the image.
    pub tiles: usize,
    /// `exact`: tile side per resolution level, latent first (`None`: whole).
    pub level_tiles: Vec<Option<usize>>,
    /// `exact`: the mid-block (latent level) ran tile by tile.
    pub mid_block_tiled: bool,
    /// `exact`: the most device bytes parked tiles could use.
    pub device_parking_cap: u64,
    /// Peak bytes of tiles parked on the device.
    pub device_parked_peak_bytes: u64,
    /// Peak bytes of tiles parked in host memory (the latents excluded).
    pub host_parked_peak_bytes: u64,
    /// Host → device bytes uploaded for windows of host-parked tiles.
    pub uploaded_bytes: u64,
    /// Device → host bytes read back (parking and output).
    pub readback_bytes: u64,
    /// Waits for the device (read-backs, staging limits).
    pub syncs: usize,
    /// Tile steps (one layer on one tile).
    pub steps: usize,
    /// Window copies recorded (halo gathers and crops).
    pub window_copies: usize,
    /// `exact`: peak bytes of staging buffers (uploads in flight, or one
    /// read-back), outside the pool; pool peak + this stays within the budget.
    pub staging_peak_bytes: u64,
}

// ---------------------------------------------------------------------------
// Grids and parked activations
// ---------------------------------------------------------------------------

/// Square tiles of `tile` pixels over an `h x w` plane (the last row and
/// column are smaller); a single tile when `tile` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    h: usize,
    w: usize,
    th: usize,
    tw: usize,
    rows: usize,
    cols: usize,
}

impl Grid {
    pub(crate) fn new(h: usize, w: usize, tile: Option<usize>) -> Grid {
        let (th, tw) = match tile {
            Some(t) => (t.clamp(1, h.max(1)), t.clamp(1, w.max(1))),
            None => (h.max(1), w.max(1)),
        };
        Grid {
            h,
            w,
            th,
            tw,
            rows: h.div_ceil(th),
            cols: w.div_ceil(tw),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.rows * self.cols
    }
    pub(crate) fn rect(&self, i: usize) -> Window {
        let (r, c) = (i / self.cols, i % self.cols);
        let (y, x) = (r * self.th, c * self.tw);
        Window::new(y, x, self.th.min(self.h - y), self.tw.min(self.w - x))
    }
    /// Tiles overlapping `win`, in raster order.
    fn overlapping(&self, win: &Window) -> Vec<usize> {
        if win.h == 0 || win.w == 0 {
            return Vec::new();
        }
        let (r0, r1) = (win.y / self.th, (win.bottom() - 1) / self.th);
        let (c0, c1) = (win.x / self.tw, (win.right() - 1) / self.tw);
        let mut v = Vec::new();
        for r in r0..=r1.min(self.rows - 1) {
            for c in c0..=c1.min(self.cols - 1) {
                v.push(r * self.cols + c);
            }
        }
        v
    }
}

#[derive(Default)]
struct Counters {
    device: u64,
    device_peak: u64,
    host: u64,
    host_peak: u64,
}

type Shared = Rc<RefCell<Counters>>;

/// A tile kept on the device; its bytes count against the parking cap.
struct DevicePiece {
    tensor: Option<Tensor>,
    counters: Shared,
}

impl DevicePiece {
    fn new(t: Tensor, counters: &Shared) -> Self {
        {
            let mut c = counters.borrow_mut();
            c.device += t.byte_size();
            c.device_peak = c.device_peak.max(c.device);
        }
        DevicePiece {
            tensor: Some(t),
            counters: counters.clone(),
        }
    }
    fn tensor(&self) -> &Tensor {
        self.tensor.as_ref().expect("present until dropped")
    }
    fn into_tensor(mut self) -> Tensor {
        let t = self.tensor.take().expect("present until dropped");
        self.counters.borrow_mut().device -= t.byte_size();
        t
    }
}

impl Drop for DevicePiece {
    fn drop(&mut self) {
        if let Some(t) = &self.tensor {
            self.counters.borrow_mut().device -= t.byte_size();
        }
    }
}

/// A tile in host memory (`None` data in dry runs), counted as parked
/// unless it is the caller's input.
struct HostPiece {
    data: Option<Vec<u8>>,
    bytes: u64,
    counters: Option<Shared>,
}

impl HostPiece {
    fn new(data: Option<Vec<u8>>, bytes: u64, counters: Option<&Shared>) -> Self {
        if let Some(counters) = counters {
            let mut c = counters.borrow_mut();
            c.host += bytes;
            c.host_peak = c.host_peak.max(c.host);
        }
        HostPiece {
            data,
            bytes,
            counters: counters.cloned(),
        }
    }
}

impl Drop for HostPiece {
    fn drop(&mut self) {
        if let Some(c) = &self.counters {
            c.borrow_mut().host -= self.bytes;
        }
    }
}

enum Piece {
    Empty,
    Device(DevicePiece),
    Host(HostPiece),
}

/// An activation `[N, C, H, W]` (4-byte elements) parked tile by tile.
pub(crate) struct Act {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    dtype: DType,
    grid: Grid,
    pieces: Vec<Piece>,
}

impl Act {
    /// Storage dtype of the parked tiles (and of [`Executor::gather_host`]'s bytes).
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape_of(&self, win: &Window) -> [usize; 4] {
        [self.n, self.c, win.h, win.w]
    }
    fn bytes_of(&self, win: &Window) -> u64 {
        Tensor::bytes_for(&self.shape_of(win), self.dtype)
    }
}

/// Row-copies the overlap `o` (image coordinates) from a host block laid
/// out `[planes, src.h, src.w]` at `src` into `[planes, dst.h, dst.w]` at `dst`;
/// elements of `e` bytes.
#[allow(clippy::too_many_arguments)]
fn host_copy(
    planes: usize,
    e: usize,
    from: &[u8],
    src: &Window,
    to: &mut [u8],
    dst: &Window,
    o: &Window,
) {
    for p in 0..planes {
        for y in o.y..o.bottom() {
            let s = ((p * src.h + y - src.y) * src.w + o.x - src.x) * e;
            let d = ((p * dst.h + y - dst.y) * dst.w + o.x - dst.x) * e;
            to[d..d + o.w * e].copy_from_slice(&from[s..s + o.w * e]);
        }
    }
}

// ---------------------------------------------------------------------------
// The plan of an exact tiled decode
// ---------------------------------------------------------------------------

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

/// One GroupNorm's statistics gathered over the tiles of an activation.
pub(crate) struct StatsAcc<'a> {
    norm: &'a Norm,
    scratch: Tensor,
    capacity: usize,
    offsets: Vec<usize>,
}

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

/// The mid-block attention for [`Executor::attention`].
pub(crate) struct AttentionSpec<'a> {
    pub q: &'a Conv2dWeights,
    pub k: &'a Conv2dWeights,
    pub v: &'a Conv2dWeights,
    pub out: &'a Conv2dWeights,
    /// Global GroupNorm affine of the input `[N, C, 2]`.
    pub affine: &'a Tensor,
    /// Statistics of this norm over the output.
    pub stats: Option<&'a Norm>,
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
}

impl Executor {
    pub(crate) fn new(ctx: &Context, plan: ExactPlan, progress: Option<Progress>) -> Self {
        Executor {
            ctx: ctx.clone(),
            rec: None,
            plan,
            counters: Rc::new(RefCell::new(Counters::default())),
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

    fn submit(&mut self) -> Result<()> {
        if let Some(rec) = self.rec.take() {
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
    fn sync(&mut self) -> Result<()> {
        self.submit()?;
        if !self.ctx.is_dry_run() {
            let waiting = std::time::Instant::now();
            self.ctx.wait_idle()?;
            self.stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
        }
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
        let c = self.counters.borrow();
        let mut r = std::mem::take(&mut self.report);
        r.mode = "exact".into();
        r.tile_size = Some(self.plan.px);
        r.level_tiles = self.plan.levels.clone();
        r.mid_block_tiled = self.plan.levels.first().is_some_and(|l| l.is_some());
        r.device_parking_cap = self.plan.device_cap;
        r.device_parked_peak_bytes = c.device_peak;
        r.host_parked_peak_bytes = c.host_peak;
        r.staging_peak_bytes = self.staging_peak;
        Ok((r, std::mem::take(&mut self.stats)))
    }

    fn step_done(&mut self, stage: &'static str) -> Result<()> {
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

    fn empty_act(&self, n: usize, c: usize, h: usize, w: usize, dtype: DType) -> Act {
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
        let bytes = (data.len() * 4) as u64;
        let data = (!self.ctx.is_dry_run()).then(|| bytemuck::cast_slice(data).to_vec());
        Act {
            n,
            c,
            h,
            w,
            dtype: DType::F32,
            grid: Grid::new(h, w, None),
            pieces: vec![Piece::Host(HostPiece::new(data, bytes, None))],
        }
    }

    /// Parks tile `i` of `act`: on the device while the cap allows, else in
    /// host memory (read back now, so no device bytes wait for a transfer).
    fn park(&mut self, act: &mut Act, i: usize, t: Tensor) -> Result<()> {
        debug_assert_eq!(t.shape(), act.shape_of(&act.grid.rect(i)));
        let bytes = t.byte_size();
        let device = self.counters.borrow().device;
        act.pieces[i] = if device + bytes <= self.plan.device_cap {
            Piece::Device(DevicePiece::new(t, &self.counters))
        } else {
            let data = if self.ctx.is_dry_run() {
                None
            } else {
                self.submit()?;
                let waiting = std::time::Instant::now();
                let data = read_back(&self.ctx, &[&t])?.pop();
                self.stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
                data
            };
            // The read-back waited for the device: upload staging is free.
            self.staging = 0;
            self.staging_peak = self.staging_peak.max(readback_staging(&[bytes]));
            self.report.syncs += 1;
            self.report.readback_bytes += bytes;
            Piece::Host(HostPiece::new(data, bytes, Some(&self.counters)))
        };
        Ok(())
    }

    /// Uploads host bytes of `shape` into a new tensor.
    /// Staging in flight stays within the plan's `staging_limit`: the
    /// executor waits for the device first when it would not, and a
    /// tensor larger than the limit goes in pieces with waits between.
    fn upload(&mut self, shape: &[usize], dtype: DType, data: Option<&[u8]>) -> Result<Tensor> {
        let t = Tensor::empty(&self.ctx, shape, dtype, "tile upload")?;
        let bytes = t.byte_size();
        let piece = (self.plan.staging_limit / 4 * 4).max(4);
        let mut at = 0u64;
        while at < bytes {
            let len = piece.min(bytes - at);
            if self.staging > 0 && self.staging + len > self.plan.staging_limit {
                self.sync()?;
            }
            if let Some(d) = data {
                let end = ((at + len) as usize).min(d.len());
                self.rec().upload_at(&t, at, &d[at as usize..end])?;
            }
            self.staging += len;
            self.staging_peak = self.staging_peak.max(self.staging);
            at += len;
        }
        self.report.uploaded_bytes += bytes;
        Ok(t)
    }

    /// The window `win` of `act` as a tensor `[N, C, win.h, win.w]`: the
    /// parked tile itself when `win` is exactly a device tile (do not
    /// modify it), else gathered from the tiles it overlaps.
    pub(crate) fn read_window(&mut self, act: &Act, win: Window) -> Result<Tensor> {
        let parts = act.grid.overlapping(&win);
        if let [i] = parts[..] {
            if act.grid.rect(i) == win {
                match &act.pieces[i] {
                    Piece::Device(d) => return Ok(d.tensor().clone()),
                    Piece::Host(h) => {
                        return self.upload(&act.shape_of(&win), act.dtype, h.data.as_deref());
                    }
                    Piece::Empty => {}
                }
            }
        }
        let shape = act.shape_of(&win);
        let planes = act.n * act.c;
        let any_host = parts
            .iter()
            .any(|&i| matches!(act.pieces[i], Piece::Host(_)));
        let out = if any_host {
            let mut bytes =
                (!self.ctx.is_dry_run()).then(|| vec![0u8; act.bytes_of(&win) as usize]);
            for &i in &parts {
                if let (Piece::Host(h), Some(buf)) = (&act.pieces[i], bytes.as_mut()) {
                    let r = act.grid.rect(i);
                    let o = r.intersect(&win).expect("overlapping tile");
                    if let Some(src) = &h.data {
                        host_copy(planes, act.dtype.size() as usize, src, &r, buf, &win, &o);
                    }
                }
            }
            self.upload(&shape, act.dtype, bytes.as_deref())?
        } else {
            Tensor::empty(&self.ctx, &shape, act.dtype, "tile window")?
        };
        for &i in &parts {
            let r = act.grid.rect(i);
            let o = r.intersect(&win).expect("overlapping tile");
            match &act.pieces[i] {
                Piece::Device(d) => {
                    let src = d.tensor().clone();
                    copy_window(
                        self.rec(),
                        &src,
                        (o.y - r.y, o.x - r.x),
                        &out,
                        (o.y - win.y, o.x - win.x),
                        (o.h, o.w),
                    )?;
                    self.report.window_copies += 1;
                }
                Piece::Host(_) => {}
                Piece::Empty => {
                    return Err(Error::Unsupported(format!(
                        "tiled decode read tile {i} of an activation before it was computed (a wgvae bug)"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Moves tile `i` out of `act` as a device tensor (for in-place use).
    fn take_piece(&mut self, act: &mut Act, i: usize) -> Result<Tensor> {
        let win = act.grid.rect(i);
        match std::mem::replace(&mut act.pieces[i], Piece::Empty) {
            Piece::Device(d) => Ok(d.into_tensor()),
            Piece::Host(h) => self.upload(&act.shape_of(&win), act.dtype, h.data.as_deref()),
            Piece::Empty => Err(Error::Unsupported(format!(
                "tiled decode took tile {i} twice (a wgvae bug)"
            ))),
        }
    }

    fn stats_acc<'n>(&mut self, norm: &'n Norm, act: &Act) -> Result<StatsAcc<'n>> {
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

    fn stats_finish(&mut self, acc: StatsAcc, n: usize) -> Result<Tensor> {
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
            Some(_) => {
                return Err(Error::Unsupported(
                    "tiled residual add after an upsample conv".into(),
                ))
            }
            None => {
                let full = Tensor::empty(
                    &self.ctx,
                    &[n, cout, out_hw.0, out_hw.1],
                    spec.w.dtype(),
                    "conv tile",
                )?;
                conv2d(self.rec(), &input, spec.w, prologue, None, &full, &opts)?;
                if exact {
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
        let stats = match spec.stats {
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
            if let Some(acc) = &stats {
                self.stats_add(acc, i, &tile)?;
            }
            self.park(&mut out, i, tile)?;
            self.step_done(stage::CONV)?;
        }
        drop(residual);
        let affine = match stats {
            Some(acc) => Some(self.stats_finish(acc, x.n)?),
            None => None,
        };
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

    /// `f` applied to every element of `x` (tile by tile, in place).
    pub(crate) fn map(&mut self, mut x: Act, f: Unary) -> Result<Act> {
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
        let same1 = Conv2dOptions::same(1);
        let pro = Some(Prologue {
            affine: spec.affine,
            act: Activation::None,
        });
        let tiles = x.grid.len();
        let mut out = self.empty_act(n, spec.out.cout(), x.h, x.w, spec.out.dtype());
        let stats = match spec.stats {
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
            let xw = self.read_window(&x, r)?;
            let q = proj(self, &xw, spec.q, &r)?;
            let k = proj(self, &xw, spec.k, &r)?;
            let v = proj(self, &xw, spec.v, &r)?;
            drop(xw);
            let o = Tensor::empty(&self.ctx, &[n, c, r.h, r.w], DType::F32, "attention out")?;
            let tok = [n, c, r.h * r.w];
            attention(
                self.rec(),
                &q.reshape(&tok)?,
                &k.reshape(&tok)?,
                &v.reshape(&tok)?,
                scale,
                &o.reshape(&tok)?,
            )?;
            drop((q, k, v));
            let res = self.take_piece(&mut x, 0)?;
            conv2d(self.rec(), &o, spec.out, None, Some(&res), &res, &same1)?;
            if let Some(acc) = &stats {
                self.stats_add(acc, 0, &res)?;
            }
            self.park(&mut out, 0, res)?;
            self.step_done(stage::ATTENTION)?;
        } else {
            let mut ks = self.empty_act(n, c, x.h, x.w, DType::F32);
            let mut vs = self.empty_act(n, c, x.h, x.w, DType::F32);
            for i in 0..tiles {
                let r = x.grid.rect(i);
                let xw = self.read_window(&x, r)?;
                let k = proj(self, &xw, spec.k, &r)?;
                self.park(&mut ks, i, k)?;
                let v = proj(self, &xw, spec.v, &r)?;
                self.park(&mut vs, i, v)?;
                self.step_done(stage::KV)?;
            }
            // Query tiles per pass: as many states (q, acc, ml) as the budget holds.
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut used = u64::MAX;
            for i in 0..tiles {
                let r = x.grid.rect(i);
                let state = (2 * n * c * r.area() + 2 * n * r.area()) as u64 * 4;
                if used.saturating_add(state) > self.plan.attention_state_budget
                    || groups.is_empty()
                {
                    groups.push(Vec::new());
                    used = 0;
                }
                used += state;
                groups.last_mut().expect("pushed").push(i);
            }
            for group in groups {
                let mut states = Vec::new();
                for &i in &group {
                    let r = x.grid.rect(i);
                    let xw = self.read_window(&x, r)?;
                    let q = proj(self, &xw, spec.q, &r)?;
                    let t = r.area();
                    let acc = Tensor::empty(&self.ctx, &[n, c, t], DType::F32, "attention acc")?;
                    let ml = Tensor::empty(&self.ctx, &[n, t, 2], DType::F32, "attention max/sum")?;
                    states.push((q.reshape(&[n, c, t])?, acc, ml));
                }
                for b in 0..tiles {
                    let rb = ks.grid.rect(b);
                    let kb = self.read_window(&ks, rb)?.reshape(&[n, c, rb.area()])?;
                    let vb = self.read_window(&vs, rb)?.reshape(&[n, c, rb.area()])?;
                    let role = BlockRole {
                        first: b == 0,
                        last: b + 1 == tiles,
                    };
                    for (q, acc, ml) in &states {
                        let t = q.shape()[2];
                        let prob = AttentionProblem {
                            batch: n,
                            heads: 1,
                            q_len: t,
                            kv_len: rb.area(),
                            head_dim: c,
                            q_strides: Strides::channel_major(c, t),
                            kv_strides: Strides::channel_major(c, rb.area()),
                            scale,
                            mask: Mask::NONE,
                            q_pos0: 0,
                            config: None,
                        };
                        let kv = KvInput::F32 { k: &kb, v: &vb };
                        flash_attention_block(self.rec(), &prob, q, kv, acc, Some(ml), role)?;
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
                    if let Some(acc) = &stats {
                        self.stats_add(acc, i, &res)?;
                    }
                    self.park(&mut out, i, res)?;
                    self.step_done(stage::ATTENTION)?;
                }
            }
        }
        drop(x);
        let affine = match stats {
            Some(acc) => Some(self.stats_finish(acc, n)?),
            None => None,
        };
        Ok((out, affine))
    }

    /// Gathers an activation in host memory (`None` in dry runs): one
    /// read-back of its device tiles, host tiles copied.
    pub(crate) fn gather_host(&mut self, act: Act) -> Result<Option<Vec<u8>>> {
        self.submit()?;
        let whole = Window::new(0, 0, act.h, act.w);
        let device: Vec<usize> = (0..act.pieces.len())
            .filter(|&i| matches!(act.pieces[i], Piece::Device(_)))
            .collect();
        let bytes: u64 = device
            .iter()
            .map(|&i| act.bytes_of(&act.grid.rect(i)))
            .sum();
        self.report.readback_bytes += bytes;
        if !device.is_empty() {
            self.report.syncs += 1;
        }
        // Staging of the largest read-back group (as grouped below).
        let mut group: Vec<u64> = Vec::new();
        for &i in &device {
            let b = act.bytes_of(&act.grid.rect(i));
            group.push(b);
            if group.len() > 1 && readback_staging(&group) > self.plan.staging_limit {
                group = vec![b];
            }
            self.staging_peak = self.staging_peak.max(readback_staging(&group));
        }
        if self.ctx.is_dry_run() {
            return Ok(None);
        }
        let tensors: Vec<&Tensor> = device
            .iter()
            .map(|&i| match &act.pieces[i] {
                Piece::Device(d) => d.tensor(),
                _ => unreachable!("filtered"),
            })
            .collect();
        // Read back in groups of tiles within the staging limit (a tile
        // over the limit alone), not the whole output at once.
        let mut data = Vec::with_capacity(tensors.len());
        let mut group: Vec<&Tensor> = Vec::new();
        for t in tensors {
            let sizes: Vec<u64> = group.iter().chain([&t]).map(|t| t.byte_size()).collect();
            if !group.is_empty() && readback_staging(&sizes) > self.plan.staging_limit {
                data.extend(read_back(&self.ctx, &group)?);
                group.clear();
            }
            group.push(t);
        }
        if !group.is_empty() {
            data.extend(read_back(&self.ctx, &group)?);
        }
        let mut out = vec![0u8; act.bytes_of(&whole) as usize];
        let planes = act.n * act.c;
        let esize = act.dtype.size() as usize;
        let mut next = data.into_iter();
        for (i, piece) in act.pieces.iter().enumerate() {
            let r = act.grid.rect(i);
            match piece {
                Piece::Device(_) => {
                    let d = next.next().expect("one read-back per device tile");
                    host_copy(planes, esize, &d, &r, &mut out, &whole, &r);
                }
                Piece::Host(h) => {
                    if let Some(d) = &h.data {
                        host_copy(planes, esize, d, &r, &mut out, &whole, &r);
                    }
                }
                Piece::Empty => {
                    return Err(Error::Unsupported(
                        "tiled decode output has an uncomputed tile (a wgvae bug)".into(),
                    ))
                }
            }
        }
        Ok(Some(out))
    }
}

/// Bytes of the staging buffer [`read_back`] creates for tensors of `sizes`.
fn readback_staging(sizes: &[u64]) -> u64 {
    sizes.iter().map(|&b| crate::memory::round_up(b, 256)).sum()
}

/// For a 3×3 conv on the 2× nearest upsample of an `n`-long axis, output
/// span `[o0, o1)`: the low-resolution input span `[a, b)`, the zero padding
/// before and after, the offset of `o0` in the conv output and its length.
fn upsample_span(o0: usize, o1: usize, n: usize) -> (usize, usize, u32, u32, usize, usize) {
    let a = o0.saturating_sub(1) / 2;
    let b = ((o1 + 2) / 2).min(n);
    let before = (o0 == 0) as usize;
    let after = (o1 == 2 * n) as usize;
    // Output index j is centred on upsampled row 2a + j + 1 - before.
    let first = 2 * a + 1 - before;
    let len = 2 * (b - a) + before + after - 2;
    (a, b, before as u32, after as u32, o0 - first, len)
}

/// For a conv with kernel `k` and stride `s` over an `n`-long axis zero-padded
/// by `pad_before` (and as much after as the whole-image conv has), output
/// span `[o0, o1)`: the input span `[a, b)` it reads and the zero padding
/// before and after it. Inside the image the halo is real data, so the
/// conv of the padded span is the whole-image conv restricted to the span.
fn conv_span(
    o0: usize,
    o1: usize,
    n: usize,
    k: usize,
    s: usize,
    pad_before: usize,
) -> (usize, usize, u32, u32) {
    // Output j reads padded rows [s·j, s·j + k), i.e. input rows shifted by pad_before.
    let lo = (s * o0) as isize - pad_before as isize;
    let hi = (s * (o1 - 1) + k) as isize - pad_before as isize;
    let a = lo.max(0) as usize;
    let b = (hi.min(n as isize) as usize).max(a);
    (a, b, (a as isize - lo) as u32, (hi - b as isize) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_the_plane_once() {
        for (h, w, t) in [
            (40, 48, Some(16)),
            (7, 5, Some(3)),
            (9, 9, None),
            (3, 20, Some(8)),
        ] {
            let g = Grid::new(h, w, t);
            let mut seen = vec![0; h * w];
            for i in 0..g.len() {
                let r = g.rect(i);
                for y in r.y..r.bottom() {
                    for x in r.x..r.right() {
                        seen[y * w + x] += 1;
                    }
                }
                assert_eq!(g.overlapping(&r), vec![i]);
            }
            assert!(seen.iter().all(|&s| s == 1), "{h}x{w} tile {t:?}");
        }
        let g = Grid::new(40, 48, Some(16));
        assert_eq!(g.overlapping(&Window::new(15, 15, 2, 2)), vec![0, 1, 3, 4]);
    }

    /// 1-D conv of `x` zero-padded by (`before`, `after`) with kernel `kern`, stride `s`.
    fn conv1d(x: &[f32], kern: &[f32], s: usize, before: usize, after: usize) -> Vec<f32> {
        let mut p = vec![0.0; before];
        p.extend_from_slice(x);
        p.extend(std::iter::repeat_n(0.0, after));
        let k = kern.len();
        (0..)
            .map(|j| s * j)
            .take_while(|&i| i + k <= p.len())
            .map(|i| (0..k).map(|t| p[i + t] * kern[t]).sum())
            .collect()
    }

    /// Every output span of stride-1 and stride-2 convs (same padding,
    /// diffusers' (0, 1) and TAE's (1, 1) downsampling padding), computed
    /// from the span `conv_span` names with its padding, equals the
    /// whole-axis conv there: the halo rule the tiled encoder relies on.
    #[test]
    fn conv_spans_reproduce_the_whole_conv() {
        let kern3 = [0.5f32, -1.25, 2.0];
        for n in 1..=13usize {
            let x: Vec<f32> = (0..n).map(|i| (i * 7 % 5) as f32 - 1.5).collect();
            for (k, s, before, after) in [(1, 1, 0, 0), (3, 1, 1, 1), (3, 2, 0, 1), (3, 2, 1, 1)] {
                let kern = &kern3[..k];
                let whole = conv1d(&x, kern, s, before, after);
                for o0 in 0..whole.len() {
                    for o1 in o0 + 1..=whole.len() {
                        let (a, b, pb, pa) = conv_span(o0, o1, n, k, s, before);
                        assert!(a <= b && b <= n);
                        assert!(pb as usize <= before && pa as usize <= after);
                        let part = conv1d(&x[a..b], kern, s, pb as usize, pa as usize);
                        assert_eq!(
                            part,
                            whole[o0..o1],
                            "n {n} k {k} s {s} pad ({before}, {after}) [{o0}, {o1})"
                        );
                    }
                }
            }
        }
    }

    /// The upsample span covers exactly the output rows the tile needs.
    #[test]
    fn upsample_spans_cover_their_tiles() {
        for n in [1usize, 2, 5, 8] {
            for o0 in 0..2 * n {
                for o1 in o0 + 1..=2 * n {
                    let (a, b, before, after, off, len) = upsample_span(o0, o1, n);
                    assert!(a < b && b <= n);
                    // Conv output j covers upsampled rows centred at c = 2a + j + 1 - before.
                    let first = 2 * a + 1 - before as usize;
                    assert_eq!(first + off, o0);
                    assert!(off + (o1 - o0) <= len, "n {n} [{o0}, {o1})");
                    // Its 3 taps stay inside the window or hit the zero padding.
                    let (lo, hi) = (first as isize - 1, (first + len) as isize);
                    assert!(lo >= 2 * a as isize - before as isize);
                    assert!(hi <= 2 * b as isize + after as isize);
                    assert_eq!(before == 1, o0 == 0);
                    assert_eq!(after == 1, o1 == 2 * n && b == n);
                }
            }
        }
    }
}
