//! `wgvae bench attention`: two attention workloads with the metadata
//! header of [`super::bench::Metadata`].
//!
//! - **Frame sweep** (the shape of a published VGGT "VRAM sweep", read at run
//!   time from `../shared/reference/vggt_vram_sweep.csv`): frames × tokens
//!   per frame, embed 128 in 16 heads of 8, f32, for global attention,
//!   one-shot windowed attention (sink + window mask, tiles outside skipped)
//!   and windowed attention streamed frame by frame through a
//!   [`RingKvCache`]. Cells run when their predicted time fits a budget;
//!   memory of every cell is predicted by a dry run of the same code
//!   ([`Context::dry_run`]) and measured from the pool where the cell runs.
//! - **Streaming** (LongLive-shaped): chunks of 3 frames attend to 3 sink
//!   frames + a 9-frame window, 12 heads × 128, with a naive concatenating
//!   cache, the static ring cache, or the ring with int8 K/V; per-chunk
//!   latency (wall time, submit to done), memory per chunk.

use std::path::Path;
use std::time::Instant;

use plotters::prelude::*;
use serde::Serialize;

use super::bench::Metadata;
use super::{write, MIB};
use crate::attention::{
    multi_head_attention, AttentionOptions, ConcatKvCache, KvCacheConfig, KvDtype, Mask,
    RingKvCache,
};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, Recorder};
use crate::memory::Policy;
use crate::tensor::{DType, Tensor};
use crate::testing::rand_vec;

/// The metadata as `prefix key: value` lines (CSV comments, Markdown list).
pub fn metadata_lines(meta: &Metadata, prefix: &str) -> String {
    let v = serde_json::to_value(meta).unwrap_or_default();
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            format!(
                "{prefix}{k}: {}\n",
                v.as_str().map_or(v.to_string(), str::to_string)
            )
        })
        .collect()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------
// Frame sweep

/// How attention over many frames is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SweepMode {
    /// Every token attends to every token (one dispatch).
    Global,
    /// Sink + window frame mask over all tokens at once (one dispatch; tiles
    /// outside the window skipped).
    Window,
    /// The same mask, streamed one frame at a time through a ring KV cache of
    /// sink + window frames: memory independent of the frame count.
    WindowRing,
}

impl SweepMode {
    /// Every mode.
    pub const ALL: [SweepMode; 3] = [SweepMode::Global, SweepMode::Window, SweepMode::WindowRing];
    /// The mode's name in tables.
    pub fn name(self) -> &'static str {
        match self {
            SweepMode::Global => "global",
            SweepMode::Window => "window",
            SweepMode::WindowRing => "window-ring",
        }
    }
}

/// What the sweep covers.
#[derive(Clone, Debug)]
pub struct SweepConfig {
    /// Frame counts swept.
    pub frames: Vec<usize>,
    /// Tokens per frame swept.
    pub tokens_per_frame: Vec<usize>,
    /// Attention modes swept.
    pub modes: Vec<SweepMode>,
    /// Embedding width (heads × head dim).
    pub embed: usize,
    /// Heads.
    pub heads: usize,
    /// Sink frames (window modes).
    pub sink_frames: usize,
    /// Window frames (window modes).
    pub window_frames: usize,
    /// Cells predicted to take longer than this (seconds, all runs) are not run.
    pub budget_s: f64,
    /// Timed runs per point.
    pub runs: usize,
    /// Memory policy.
    pub policy: Policy,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            frames: vec![2, 4, 8, 16, 32, 64, 128, 256],
            tokens_per_frame: vec![64, 256, 1024, 1369],
            modes: SweepMode::ALL.to_vec(),
            embed: 128,
            heads: 16,
            sink_frames: 1,
            window_frames: 8,
            budget_s: 10.0,
            runs: 2,
            policy: Policy::Caching,
        }
    }
}

impl SweepConfig {
    fn head_dim(&self) -> usize {
        self.embed / self.heads
    }
    fn mask(&self, tpf: usize) -> Mask {
        Mask::frame_window(tpf, self.sink_frames, Some(self.window_frames))
    }
    fn ring(&self, tpf: usize) -> KvCacheConfig {
        KvCacheConfig {
            batch: 1,
            heads: self.heads,
            head_dim: self.head_dim(),
            tokens_per_frame: tpf,
            sink_frames: self.sink_frames,
            window_frames: self.window_frames,
            dtype: KvDtype::F32,
        }
    }

    /// Visible (query, key) pairs per head of a cell.
    pub fn visible_pairs(&self, mode: SweepMode, frames: usize, tpf: usize) -> u64 {
        let t = frames * tpf;
        match mode {
            SweepMode::Global => (t * t) as u64,
            SweepMode::Window | SweepMode::WindowRing => self.mask(tpf).visible_pairs(0, t, t),
        }
    }
}

/// One cell of the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRow {
    /// Attention mode.
    pub mode: SweepMode,
    /// Frames.
    pub frames: usize,
    /// Tokens per frame.
    pub tokens_per_frame: usize,
    /// Tokens in total.
    pub tokens: usize,
    /// Storage dtype.
    pub dtype: &'static str,
    /// "ok", "not run: …" or the error.
    pub status: String,
    /// Median wall time (submit to done) over the runs; NaN when not run.
    pub time_ms: f64,
    /// Predicted from the throughput of the previous cell of the mode.
    pub predicted_ms: f64,
    /// Useful GFLOP (4 · visible pairs · embed).
    pub gflop: f64,
    /// Achieved GFLOP/s.
    pub gflops: f64,
    /// Pool peaks: measured when the cell ran, else predicted by a dry run.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// `measured` or `predicted` (dry run, for points too large to run).
    pub memory_source: &'static str,
    /// Predicted by the dry run (equals the measured figure when both exist).
    pub predicted_allocated_bytes: u64,
    /// Predicted peak reserved bytes.
    pub predicted_reserved_bytes: u64,
    /// Bytes of keys + values held.
    pub kv_bytes: u64,
}

/// Allocated tensors of a cell: inputs, output and (ring mode) the cache.
struct CellState {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
}

fn cell_state(ctx: &Context, cfg: &SweepConfig, tokens: usize, fill: bool) -> Result<CellState> {
    let (h, dh) = (cfg.heads, cfg.head_dim());
    let shape = [1, tokens, h, dh];
    let make = |seed: u64, label: &str| -> Result<Tensor> {
        if fill && !ctx.is_dry_run() {
            Tensor::from_f32(ctx, &shape, &rand_vec(tokens * h * dh, seed, 1.0), label)
        } else {
            Tensor::empty(ctx, &shape, DType::F32, label)
        }
    };
    Ok(CellState {
        q: make(1, "sweep q")?,
        k: make(2, "sweep k")?,
        v: make(3, "sweep v")?,
        out: Tensor::empty(ctx, &shape, DType::F32, "sweep out")?,
    })
}

/// Records and submits one evaluation of a cell (the ring mode streams every
/// frame through a fresh ring). Returns the KV bytes held.
fn run_cell_once(
    ctx: &Context,
    cfg: &SweepConfig,
    mode: SweepMode,
    frames: usize,
    tpf: usize,
    st: &CellState,
) -> Result<u64> {
    let mut rec = Recorder::new(ctx);
    let kv_bytes = match mode {
        SweepMode::Global | SweepMode::Window => {
            let mask = if mode == SweepMode::Global {
                Mask::NONE
            } else {
                cfg.mask(tpf)
            };
            multi_head_attention(
                &mut rec,
                &st.q,
                &st.k,
                &st.v,
                &st.out,
                &AttentionOptions::masked(mask),
            )?;
            st.k.byte_size() + st.v.byte_size()
        }
        SweepMode::WindowRing => {
            let mut ring = RingKvCache::new(ctx, cfg.ring(tpf))?;
            // Every frame's q / k / v are the one frame of inputs (values do
            // not change the work).
            for _ in 0..frames {
                ring.append(&mut rec, &st.k, &st.v)?;
                ring.attend(&mut rec, &st.q, &st.out, None)?;
            }
            ring.kv_bytes()
        }
    };
    rec.submit()?;
    if !ctx.is_dry_run() {
        ctx.wait_idle()?;
    }
    Ok(kv_bytes)
}

/// This device's capabilities with buffer and binding limits lifted, so a
/// dry run predicts every cell (including those too large to bind here) and
/// takes the same decisions (kernel configuration, key splitting) as a real run.
fn prediction_caps(ctx: &Context) -> Capabilities {
    let mut caps = ctx.caps().clone();
    caps.max_buffer_size = caps.max_buffer_size.max(1 << 40);
    caps.max_storage_buffer_binding_size = caps.max_buffer_size;
    caps
}

/// Runs the sweep: every cell predicted by a dry run; cells within the time
/// budget also measured. `progress` receives a line per cell.
pub fn run_sweep(
    ctx: &Context,
    cfg: &SweepConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<SweepRow>> {
    if cfg.heads == 0 || !cfg.embed.is_multiple_of(cfg.heads) {
        return Err(Error::InvalidInput(format!(
            "embed {} is not a multiple of {} heads",
            cfg.embed, cfg.heads
        )));
    }
    let mut rows = Vec::new();
    let mut frames = cfg.frames.clone();
    frames.sort_unstable();
    for &mode in &cfg.modes {
        for &tpf in &cfg.tokens_per_frame {
            // Throughput (flop/s) of the last measured cell of this series.
            let mut rate: Option<f64> = None;
            let mut over_budget = false;
            for &f in &frames {
                let tokens = f * tpf;
                let flop = 4.0 * cfg.visible_pairs(mode, f, tpf) as f64 * cfg.embed as f64;
                // Memory: a dry run of exactly the same calls.
                let dry = Context::dry_run(prediction_caps(ctx), cfg.policy.new_pool());
                let in_tokens = if mode == SweepMode::WindowRing {
                    tpf
                } else {
                    tokens
                };
                let predicted = cell_state(&dry, cfg, in_tokens, false)
                    .and_then(|st| run_cell_once(&dry, cfg, mode, f, tpf, &st).map(|kv| (kv, st)));
                let (kv_bytes, pred_alloc, pred_res) = match predicted {
                    Ok((kv, st)) => {
                        let s = dry.pool().stats();
                        drop(st);
                        (kv, s.allocated_bytes.peak, s.reserved_bytes.peak)
                    }
                    Err(e) => {
                        rows.push(not_run(mode, f, tpf, flop, format!("error: {e}")));
                        continue;
                    }
                };
                // Unmeasured series start from a pessimistic 0.5 GFLOP/s.
                let predicted_s = flop / rate.unwrap_or(0.5e9) * cfg.runs.max(1) as f64;
                let mut row = SweepRow {
                    mode,
                    frames: f,
                    tokens_per_frame: tpf,
                    tokens,
                    dtype: "f32",
                    status: String::new(),
                    time_ms: f64::NAN,
                    predicted_ms: predicted_s * 1e3 / cfg.runs.max(1) as f64,
                    gflop: flop / 1e9,
                    gflops: f64::NAN,
                    peak_allocated_bytes: pred_alloc,
                    peak_reserved_bytes: pred_res,
                    memory_source: "dry run",
                    predicted_allocated_bytes: pred_alloc,
                    predicted_reserved_bytes: pred_res,
                    kv_bytes,
                };
                if over_budget || predicted_s > cfg.budget_s {
                    over_budget = true;
                    row.status = format!(
                        "not run: predicted {:.1} s > budget {:.0} s",
                        predicted_s, cfg.budget_s
                    );
                    progress(&format!("{} {f}×{tpf}: {}", mode.name(), row.status));
                    rows.push(row);
                    continue;
                }
                progress(&format!(
                    "{} {f}×{tpf}: running ({:.1} s predicted)",
                    mode.name(),
                    predicted_s
                ));
                let real = ctx.with_pool(cfg.policy.new_pool());
                let measured = (|| -> Result<Vec<f64>> {
                    let st = cell_state(&real, cfg, in_tokens, true)?;
                    // Uploads land with the first submit: flush them untimed;
                    // cheap cells also get an untimed warm-up run (pipeline
                    // compilation; larger cells reuse the pipelines of the
                    // smaller cells of their series).
                    Recorder::new(&real).submit()?;
                    real.wait_idle()?;
                    if predicted_s / (cfg.runs.max(1) as f64) < 2.0 {
                        run_cell_once(&real, cfg, mode, f, tpf, &st)?;
                    }
                    let mut times = Vec::new();
                    for _ in 0..cfg.runs.max(1) {
                        let t0 = Instant::now();
                        run_cell_once(&real, cfg, mode, f, tpf, &st)?;
                        times.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    Ok(times)
                })();
                match measured {
                    Ok(mut times) => {
                        times.sort_by(f64::total_cmp);
                        let ms = times[times.len() / 2];
                        let s = real.pool().stats();
                        row.status = "ok".into();
                        row.time_ms = ms;
                        row.gflops = flop / 1e9 / (ms / 1e3);
                        row.peak_allocated_bytes = s.allocated_bytes.peak;
                        row.peak_reserved_bytes = s.reserved_bytes.peak;
                        row.memory_source = "measured";
                        rate = Some(flop / (ms / 1e3));
                    }
                    Err(e) => {
                        row.status = format!("error: {e}");
                        over_budget = true;
                    }
                }
                progress(&format!(
                    "{} {f}×{tpf}: {} {:.1} ms",
                    mode.name(),
                    row.status,
                    row.time_ms
                ));
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn not_run(mode: SweepMode, frames: usize, tpf: usize, flop: f64, status: String) -> SweepRow {
    SweepRow {
        mode,
        frames,
        tokens_per_frame: tpf,
        tokens: frames * tpf,
        dtype: "f32",
        status,
        time_ms: f64::NAN,
        predicted_ms: f64::NAN,
        gflop: flop / 1e9,
        gflops: f64::NAN,
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        memory_source: "-",
        predicted_allocated_bytes: 0,
        predicted_reserved_bytes: 0,
        kv_bytes: 0,
    }
}

/// One row of the published VGGT sweep.
#[derive(Clone, Debug, Serialize)]
pub struct VggtRow {
    /// Configuration name.
    pub name: String,
    /// Batch size.
    pub batch: usize,
    /// Frames.
    pub frames: usize,
    /// Image side in pixels.
    pub img: usize,
    /// Time of full attention in ms.
    pub full_ms: f64,
    /// Memory of full attention in MB.
    pub full_mem_mb: f64,
}

impl VggtRow {
    /// Tokens per frame at 14-px patches.
    pub fn tokens_per_frame(&self) -> usize {
        (self.img / 14) * (self.img / 14)
    }
}

/// Reads `vggt_vram_sweep.csv` (columns by header name).
pub fn read_vggt(path: &Path) -> Result<Vec<VggtRow>> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| Error::BadFile {
                path: path.to_path_buf(),
                message: format!("no `{name}` column"),
            })
    };
    let (c_name, c_batch, c_frames, c_img, c_ms, c_mem) = (
        col("name")?,
        col("batch")?,
        col("frames")?,
        col("img")?,
        col("full_ms")?,
        col("full_mem_mb")?,
    );
    let mut rows = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || Error::BadFile {
            path: path.to_path_buf(),
            message: format!("unexpected row `{line}`"),
        };
        let get = |i: usize| f.get(i).copied().ok_or_else(bad);
        rows.push(VggtRow {
            name: get(c_name)?.to_string(),
            batch: get(c_batch)?.parse().map_err(|_| bad())?,
            frames: get(c_frames)?.parse().map_err(|_| bad())?,
            img: get(c_img)?.parse().map_err(|_| bad())?,
            full_ms: get(c_ms)?.parse().map_err(|_| bad())?,
            full_mem_mb: get(c_mem)?.parse().map_err(|_| bad())?,
        });
    }
    Ok(rows)
}

/// Fewest points an exponent is fitted from (two points always fit a line).
pub const MIN_FIT_POINTS: usize = 3;

/// Least-squares slope of log(y) against log(x): the exponent k of y ∝ x^k,
/// from at least [`MIN_FIT_POINTS`] points.
pub fn loglog_slope(points: &[(f64, f64)]) -> Option<f64> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0 > 0.0 && p.1 > 0.0 && p.1.is_finite())
        .map(|p| (p.0.ln(), p.1.ln()))
        .collect();
    if pts.len() < MIN_FIT_POINTS {
        return None;
    }
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Cells faster than this are dominated by the fixed cost of a submission.
const MIN_FIT_MS: f64 = 20.0;

fn fmt_ms(ms: f64) -> String {
    if ms.is_finite() {
        format!("{ms:.1}")
    } else {
        "-".into()
    }
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / MIB)
}

/// Writes `attention_sweep.csv`, `attention_sweep.md`,
/// `attention_sweep_time.svg` and `attention_sweep_memory.svg` into `out`.
/// `reference`: the published VGGT sweep, shown beside ours as a shape.
pub fn write_sweep_report(
    rows: &[SweepRow],
    cfg: &SweepConfig,
    meta: &Metadata,
    reference: Option<&[VggtRow]>,
    out: &Path,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut csv = metadata_lines(meta, "# ");
    csv += "mode,frames,tokens_per_frame,tokens,dtype,status,time_ms,predicted_ms,gflop,gflops,peak_allocated_bytes,peak_reserved_bytes,memory_source,predicted_allocated_bytes,predicted_reserved_bytes,kv_bytes\n";
    for r in rows {
        csv += &format!(
            "{},{},{},{},{},\"{}\",{:.3},{:.3},{:.4},{:.4},{},{},{},{},{},{}\n",
            r.mode.name(),
            r.frames,
            r.tokens_per_frame,
            r.tokens,
            r.dtype,
            r.status.replace('"', "'"),
            r.time_ms,
            r.predicted_ms,
            r.gflop,
            r.gflops,
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.memory_source,
            r.predicted_allocated_bytes,
            r.predicted_reserved_bytes,
            r.kv_bytes
        );
    }
    write(&out.join("attention_sweep.csv"), &csv)?;

    let mut md = String::from("# Attention frame sweep\n\n");
    md += &metadata_lines(meta, "- ");
    md += &format!(
        "\nEmbed {} = {} heads × {}, f32, batch 1. `global`: every token sees every token. `window`: frame f sees sink frames [0, {}) and frames [f − {} + 1, f], one dispatch over all tokens (tiles outside the window skipped). `window-ring`: the same mask streamed frame by frame through a ring KV cache of {} + {} frames (memory independent of the frame count). Time: median wall time (submit → done) of {} run(s); cells predicted to exceed {:.0} s are not run. Memory: the pool's peaks ({} policy), measured where the cell ran, else predicted by a dry run of the same calls (the dry run matches the measurement wherever both exist).\n\n",
        cfg.embed,
        cfg.heads,
        cfg.head_dim(),
        cfg.sink_frames,
        cfg.window_frames,
        cfg.sink_frames,
        cfg.window_frames,
        cfg.runs,
        cfg.budget_s,
        cfg.policy.name()
    );
    // Scaling exponents.
    let past_window = 2 * cfg.window_frames;
    md += &format!("## Scaling with the frame count\n\nExponent k of y ∝ frames^k (least squares on log–log). Time: over measured cells that take ≥ {MIN_FIT_MS} ms (above the fixed submit cost), and over those with ≥ {past_window} frames (past the window, where windowed attention must be linear). Memory and KV bytes: over all cells (measured or dry run). An exponent needs at least {MIN_FIT_POINTS} points (`-` otherwise); the point count is in brackets.\n\n| series | tokens/frame | k (time) | k (time, ≥ {past_window} frames) | k (peak allocated) | k (KV bytes) | measured cells |\n|---|---|---|---|---|---|---|\n");
    for &mode in &cfg.modes {
        for &tpf in &cfg.tokens_per_frame {
            let series: Vec<&SweepRow> = rows
                .iter()
                .filter(|r| r.mode == mode && r.tokens_per_frame == tpf)
                .collect();
            let timed: Vec<(f64, f64)> = series
                .iter()
                .filter(|r| r.status == "ok" && r.time_ms >= MIN_FIT_MS)
                .map(|r| (r.frames as f64, r.time_ms))
                .collect();
            let timed_past: Vec<(f64, f64)> = timed
                .iter()
                .copied()
                .filter(|p| p.0 >= past_window as f64)
                .collect();
            let measured = series.iter().filter(|r| r.status == "ok").count();
            let mem: Vec<(f64, f64)> = series
                .iter()
                .filter(|r| r.peak_allocated_bytes > 0)
                .map(|r| (r.frames as f64, r.peak_allocated_bytes as f64))
                .collect();
            let kv: Vec<(f64, f64)> = series
                .iter()
                .filter(|r| r.kv_bytes > 0)
                .map(|r| (r.frames as f64, r.kv_bytes as f64))
                .collect();
            let k = |p: &[(f64, f64)]| {
                loglog_slope(p).map_or("-".into(), |k| format!("{:.2} ({})", k + 0.0, p.len()))
            };
            md += &format!(
                "| {} | {tpf} | {} | {} | {} | {} | {} |\n",
                mode.name(),
                k(&timed),
                k(&timed_past),
                k(&mem),
                k(&kv),
                measured
            );
        }
    }
    if let Some(reference) = reference {
        md += "\nPublished VGGT sweep (batch-1 rows; another device and a whole transformer, so only the shape compares):\n\n| tokens/frame | frames | full ms | full MiB (distorted, see README) |\n|---|---|---|---|\n";
        let mut by_tpf: std::collections::BTreeMap<usize, Vec<(f64, f64, f64)>> =
            Default::default();
        for r in reference.iter().filter(|r| r.batch == 1) {
            md += &format!(
                "| {} | {} | {:.1} | {:.0} |\n",
                r.tokens_per_frame(),
                r.frames,
                r.full_ms,
                r.full_mem_mb
            );
            by_tpf.entry(r.tokens_per_frame()).or_default().push((
                r.frames as f64,
                r.full_ms,
                r.full_mem_mb,
            ));
        }
        for (tpf, pts) in by_tpf {
            // From 8 frames on, the attention's frames² dominates the per-frame work.
            let time: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.0 >= 8.0)
                .map(|p| (p.0, p.1))
                .collect();
            let mem: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.0 >= 8.0)
                .map(|p| (p.0, p.2))
                .collect();
            if let (Some(kt), Some(km)) = (loglog_slope(&time), loglog_slope(&mem)) {
                md += &format!(
                    "\nReference at {tpf} tokens/frame, ≥ 8 frames ({} rows): time ∝ frames^{kt:.2}, memory ∝ frames^{km:.2}.\n",
                    time.len()
                );
            }
        }
    }
    md += "\n## Cells\n\n| mode | frames | tokens/frame | tokens | time ms | GFLOP | GFLOP/s | peak allocated MiB | peak reserved MiB | memory | KV MiB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        md += &format!(
            "| {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} | {} |\n",
            r.mode.name(),
            r.frames,
            r.tokens_per_frame,
            r.tokens,
            fmt_ms(r.time_ms),
            r.gflop,
            if r.gflops.is_finite() {
                format!("{:.2}", r.gflops)
            } else {
                "-".into()
            },
            mib(r.peak_allocated_bytes),
            mib(r.peak_reserved_bytes),
            r.memory_source,
            mib(r.kv_bytes),
            r.status
        );
    }
    write(&out.join("attention_sweep.md"), &md)?;

    let series = |value: &dyn Fn(&SweepRow) -> f64| -> Vec<(String, Vec<(f64, f64)>)> {
        let mut s = Vec::new();
        for &mode in &cfg.modes {
            for &tpf in &cfg.tokens_per_frame {
                let pts: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| r.mode == mode && r.tokens_per_frame == tpf)
                    .map(|r| (r.frames as f64, value(r)))
                    .filter(|p| p.1.is_finite() && p.1 > 0.0)
                    .collect();
                if !pts.is_empty() {
                    s.push((format!("{} {tpf} tok/frame", mode.name()), pts));
                }
            }
        }
        s
    };
    loglog_svg(
        &out.join("attention_sweep_time.svg"),
        &format!("attention time vs frames on {}", meta.adapter),
        "frames",
        "ms",
        &series(&|r| {
            if r.status == "ok" {
                r.time_ms
            } else {
                f64::NAN
            }
        }),
    )?;
    loglog_svg(
        &out.join("attention_sweep_memory.svg"),
        "attention peak allocated memory vs frames",
        "frames",
        "MiB",
        &series(&|r| r.peak_allocated_bytes as f64 / MIB),
    )
}

fn loglog_svg(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let err = |e: String| Error::BadFile {
        path: path.to_path_buf(),
        message: format!("could not draw the plot: {e}"),
    };
    let pts = || series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
    for p in pts() {
        x0 = x0.min(p.0);
        x1 = x1.max(p.0);
        y0 = y0.min(p.1);
        y1 = y1.max(p.1);
    }
    if x1 <= 0.0 {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    }
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.3..x1 * 1.3).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    for (i, (name, data)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))
}

// ---------------------------------------------------------------------------
// Streaming

/// KV-cache strategy of the streaming benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamPreset {
    /// Naive concatenating cache: grows and copies every chunk.
    Baseline,
    /// Static ring cache, f32.
    StaticKv,
    /// Static ring cache, int8 K/V.
    Int8Kv,
}

impl StreamPreset {
    /// Every preset.
    pub const ALL: [StreamPreset; 3] = [
        StreamPreset::Baseline,
        StreamPreset::StaticKv,
        StreamPreset::Int8Kv,
    ];
    /// The preset's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            StreamPreset::Baseline => "baseline",
            StreamPreset::StaticKv => "static-kv",
            StreamPreset::Int8Kv => "int8-kv",
        }
    }
}

impl std::str::FromStr for StreamPreset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        StreamPreset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown preset `{s}`; use baseline, static-kv or int8-kv"
                ))
            })
    }
}

/// The LongLive shape: tokens per latent frame at scale 1.
pub const LONGLIVE_TOKENS_PER_FRAME: usize = 1560;

/// What the streaming benchmark runs.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// KV cache preset.
    pub preset: StreamPreset,
    /// Chunks streamed.
    pub chunks: usize,
    /// Tokens per frame = round(1560 · scale).
    pub scale: f64,
    /// Frames per chunk.
    pub frames_per_chunk: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Sink frames kept.
    pub sink_frames: usize,
    /// Window frames kept.
    pub window_frames: usize,
    /// Chunks reported separately as warm-up (default: until the cache is
    /// full, plus one).
    pub warmup: Option<usize>,
    /// Memory policy.
    pub policy: Policy,
}

impl StreamConfig {
    /// The LongLive-style configuration of `preset`, `chunks` long, token counts scaled by `scale`.
    pub fn longlive(preset: StreamPreset, chunks: usize, scale: f64) -> Self {
        StreamConfig {
            preset,
            chunks,
            scale,
            frames_per_chunk: 3,
            heads: 12,
            head_dim: 128,
            sink_frames: 3,
            window_frames: 9,
            warmup: None,
            policy: Policy::Caching,
        }
    }

    /// Tokens per frame.
    pub fn tokens_per_frame(&self) -> usize {
        ((LONGLIVE_TOKENS_PER_FRAME as f64 * self.scale).round() as usize).max(1)
    }

    /// Chunks excluded from the statistics (cache filling up).
    pub fn warmup_chunks(&self) -> usize {
        self.warmup.unwrap_or_else(|| {
            (self.sink_frames + self.window_frames).div_ceil(self.frames_per_chunk.max(1)) + 1
        })
    }

    fn cache(&self, dtype: KvDtype) -> KvCacheConfig {
        KvCacheConfig {
            batch: 1,
            heads: self.heads,
            head_dim: self.head_dim,
            tokens_per_frame: self.tokens_per_frame(),
            sink_frames: self.sink_frames,
            window_frames: self.window_frames,
            dtype,
        }
    }
}

/// One chunk of a stream.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkSample {
    /// Chunk index.
    pub chunk: usize,
    /// Wall time: record, submit, wait for the GPU.
    pub ms: f64,
    /// Sum of the chunk's dispatch times from GPU timestamps, when available.
    pub gpu_ms: Option<f64>,
    /// Pool bytes allocated after the chunk.
    pub allocated_bytes: u64,
    /// Pool bytes reserved after the chunk.
    pub reserved_bytes: u64,
    /// Bytes of the KV cache.
    pub kv_bytes: u64,
}

/// The result of one streaming run.
#[derive(Clone, Debug, Serialize)]
pub struct StreamResult {
    /// Preset name.
    pub preset: &'static str,
    /// Chunks streamed.
    pub chunks: usize,
    /// Token-count scale.
    pub scale: f64,
    /// Tokens per frame.
    pub tokens_per_frame: usize,
    /// Frames per chunk.
    pub frames_per_chunk: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Sink frames kept.
    pub sink_frames: usize,
    /// Window frames kept.
    pub window_frames: usize,
    /// Memory policy.
    pub policy: &'static str,
    /// Chunks excluded from the statistics.
    pub warmup_chunks: usize,
    /// Latency of each warm-up chunk (cache filling, pipelines compiling).
    pub warmup_ms: Vec<f64>,
    /// Steady state (after warm-up).
    pub mean_ms: f64,
    /// Median chunk time in ms.
    pub p50_ms: f64,
    /// 99th-percentile chunk time in ms.
    pub p99_ms: f64,
    /// Largest chunk time in ms.
    pub max_ms: f64,
    /// Mean GPU time per chunk (timestamp queries), when available.
    pub gpu_mean_ms: Option<f64>,
    /// Chunks per second.
    pub chunks_per_s: f64,
    /// Latent frames per second.
    pub frames_per_s: f64,
    /// Useful attention GFLOP/s in steady state (4 · queries · keys · d · heads / mean).
    pub attention_gflops: f64,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// KV bytes held at the end (the baseline: grown cache + window copies).
    pub kv_bytes: u64,
    /// Allocated bytes after 10 chunks.
    pub allocated_after_10: Option<u64>,
    /// Allocated bytes after 100 chunks.
    pub allocated_after_100: Option<u64>,
    /// Reserved bytes after 10 chunks.
    pub reserved_after_10: Option<u64>,
    /// Reserved bytes after 100 chunks.
    pub reserved_after_100: Option<u64>,
    /// int8-kv only: the last chunk's output against the same stream through
    /// an f32 ring cache — max abs error and cosine similarity.
    pub int8_max_abs_error: Option<f64>,
    /// int8-kv only: cosine similarity of that comparison.
    pub int8_cosine: Option<f64>,
    #[serde(skip)]
    /// Per-chunk samples.
    pub samples: Vec<ChunkSample>,
}

enum Cache {
    Concat(ConcatKvCache),
    Ring(RingKvCache),
}

/// Streams `cfg.chunks` chunks: each appends its keys / values to the cache
/// and attends its queries over the cache, in one submission, waited for.
pub fn run_stream(
    ctx: &Context,
    cfg: &StreamConfig,
    mut progress: impl FnMut(&str),
) -> Result<StreamResult> {
    let ctx = ctx.with_pool(cfg.policy.new_pool());
    let tpf = cfg.tokens_per_frame();
    let chunk_tokens = cfg.frames_per_chunk * tpf;
    let shape = [1, chunk_tokens, cfg.heads, cfg.head_dim];
    let n = chunk_tokens * cfg.heads * cfg.head_dim;
    let q = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 1, 1.0), "chunk q")?;
    let k = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 2, 1.0), "chunk k")?;
    let v = Tensor::from_f32(&ctx, &shape, &rand_vec(n, 3, 1.0), "chunk v")?;
    let out = Tensor::empty(&ctx, &shape, DType::F32, "chunk out")?;
    let mut cache = match cfg.preset {
        StreamPreset::Baseline => Cache::Concat(ConcatKvCache::new(cfg.cache(KvDtype::F32))?),
        StreamPreset::StaticKv => Cache::Ring(RingKvCache::new(&ctx, cfg.cache(KvDtype::F32))?),
        StreamPreset::Int8Kv => Cache::Ring(RingKvCache::new(&ctx, cfg.cache(KvDtype::Int8))?),
    };
    Recorder::new(&ctx).submit()?; // flush the uploads, untimed
    ctx.wait_idle()?;
    let mut samples = Vec::with_capacity(cfg.chunks);
    for chunk in 1..=cfg.chunks {
        let t0 = Instant::now();
        let mut rec = Recorder::new(&ctx);
        let profiling = rec.enable_profiling();
        let kv_bytes = match &mut cache {
            Cache::Concat(c) => {
                c.append(&mut rec, &k, &v)?;
                c.attend(&mut rec, &q, &out, None)?;
                c.kv_bytes() + c.window_bytes()
            }
            Cache::Ring(c) => {
                c.append(&mut rec, &k, &v)?;
                c.attend(&mut rec, &q, &out, None)?;
                c.kv_bytes()
            }
        };
        let (_, profile) = rec.submit_profiled()?;
        ctx.wait_idle()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let s = ctx.pool().stats();
        samples.push(ChunkSample {
            chunk,
            ms,
            gpu_ms: profile.filter(|_| profiling).map(|p| p.gpu_ms),
            allocated_bytes: s.allocated_bytes.current,
            reserved_bytes: s.reserved_bytes.current,
            kv_bytes,
        });
        if chunk % 10 == 0 || chunk == cfg.chunks {
            progress(&format!(
                "{} chunk {chunk}/{}: {ms:.1} ms",
                cfg.preset.name(),
                cfg.chunks
            ));
        }
    }
    let stats = ctx.pool().stats();
    let int8_error = match cfg.preset {
        StreamPreset::Int8Kv if cfg.chunks > 0 => Some(int8_vs_f32(&ctx, cfg, &q, &k, &v, &out)?),
        _ => None,
    };
    let warm = cfg.warmup_chunks().min(cfg.chunks.saturating_sub(1));
    let steady: Vec<&ChunkSample> = samples[warm..].iter().collect();
    let mut times: Vec<f64> = steady.iter().map(|s| s.ms).collect();
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if times.is_empty() {
            return f64::NAN;
        }
        let rank = ((p * times.len() as f64).ceil() as usize).clamp(1, times.len());
        times[rank - 1]
    };
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let gpu: Vec<f64> = steady.iter().filter_map(|s| s.gpu_ms).collect();
    let keys = (cfg.sink_frames + cfg.window_frames) * tpf;
    let flop = 4.0 * (chunk_tokens * keys * cfg.head_dim * cfg.heads) as f64;
    let at = |c: usize| samples.get(c - 1);
    Ok(StreamResult {
        preset: cfg.preset.name(),
        chunks: cfg.chunks,
        scale: cfg.scale,
        tokens_per_frame: tpf,
        frames_per_chunk: cfg.frames_per_chunk,
        heads: cfg.heads,
        head_dim: cfg.head_dim,
        sink_frames: cfg.sink_frames,
        window_frames: cfg.window_frames,
        policy: cfg.policy.name(),
        warmup_chunks: warm,
        warmup_ms: samples[..warm].iter().map(|s| s.ms).collect(),
        mean_ms: mean,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        max_ms: times.last().copied().unwrap_or(f64::NAN),
        gpu_mean_ms: (!gpu.is_empty()).then(|| gpu.iter().sum::<f64>() / gpu.len() as f64),
        chunks_per_s: 1e3 / mean,
        frames_per_s: 1e3 / mean * cfg.frames_per_chunk as f64,
        attention_gflops: flop / 1e9 / (mean / 1e3),
        peak_allocated_bytes: stats.allocated_bytes.peak,
        peak_reserved_bytes: stats.reserved_bytes.peak,
        kv_bytes: samples.last().map_or(0, |s| s.kv_bytes),
        allocated_after_10: at(10).map(|s| s.allocated_bytes),
        allocated_after_100: at(100).map(|s| s.allocated_bytes),
        reserved_after_10: at(10).map(|s| s.reserved_bytes),
        reserved_after_100: at(100).map(|s| s.reserved_bytes),
        int8_max_abs_error: int8_error.map(|e| e.0),
        int8_cosine: int8_error.map(|e| e.1),
        samples,
    })
}

/// The same stream through an f32 ring cache (its own pool, after the
/// measured run): max abs error and cosine of the int8 output `out` of the
/// last chunk against it.
fn int8_vs_f32(
    ctx: &Context,
    cfg: &StreamConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
) -> Result<(f64, f64)> {
    let side = ctx.with_pool(Policy::Exact.new_pool());
    let mut cache = RingKvCache::new(&side, cfg.cache(KvDtype::F32))?;
    let want = Tensor::empty(&side, out.shape(), DType::F32, "f32 reference out")?;
    let mut rec = Recorder::new(&side);
    for _ in 0..cfg.chunks {
        cache.append(&mut rec, k, v)?;
    }
    cache.attend(&mut rec, q, &want, None)?;
    rec.submit()?;
    let (got, want) = (out.to_f32(ctx)?, want.to_f32(&side)?);
    let max_err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() as f64)
        .fold(0.0, f64::max);
    let dot: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let norm = |x: &[f32]| x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    Ok((max_err, dot / (norm(&got) * norm(&want)).max(1e-30)))
}

fn opt_mib(b: Option<u64>) -> String {
    b.map_or("-".into(), mib)
}

/// Writes `attention_stream.csv` (one row per preset), `attention_stream_chunks.csv`
/// (one row per chunk), `attention_stream.md` and `attention_stream_memory.svg`.
pub fn write_stream_report(results: &[StreamResult], meta: &Metadata, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut csv = metadata_lines(meta, "# ");
    csv += "preset,chunks,scale,tokens_per_frame,frames_per_chunk,heads,head_dim,sink_frames,window_frames,warmup_chunks,warmup_ms,mean_ms,p50_ms,p99_ms,max_ms,gpu_mean_ms,chunks_per_s,frames_per_s,attention_gflops,peak_allocated_bytes,peak_reserved_bytes,kv_bytes,allocated_after_10,allocated_after_100,int8_max_abs_error,int8_cosine\n";
    for r in results {
        csv += &format!(
            "{},{},{},{},{},{},{},{},{},{},\"{}\",{:.3},{:.3},{:.3},{:.3},{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{}\n",
            r.preset,
            r.chunks,
            r.scale,
            r.tokens_per_frame,
            r.frames_per_chunk,
            r.heads,
            r.head_dim,
            r.sink_frames,
            r.window_frames,
            r.warmup_chunks,
            r.warmup_ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(" "),
            r.mean_ms,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.gpu_mean_ms.map_or(String::new(), |g| format!("{g:.3}")),
            r.chunks_per_s,
            r.frames_per_s,
            r.attention_gflops,
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.kv_bytes,
            r.allocated_after_10.map_or(String::new(), |b| b.to_string()),
            r.allocated_after_100.map_or(String::new(), |b| b.to_string()),
            r.int8_max_abs_error.map_or(String::new(), |e| format!("{e:.3e}")),
            r.int8_cosine.map_or(String::new(), |c| format!("{c:.6}")),
        );
    }
    write(&out.join("attention_stream.csv"), &csv)?;
    let mut chunks = metadata_lines(meta, "# ");
    chunks += "preset,chunk,ms,gpu_ms,allocated_bytes,reserved_bytes,kv_bytes\n";
    for r in results {
        for s in &r.samples {
            chunks += &format!(
                "{},{},{:.3},{},{},{},{}\n",
                r.preset,
                s.chunk,
                s.ms,
                s.gpu_ms.map_or(String::new(), |g| format!("{g:.3}")),
                s.allocated_bytes,
                s.reserved_bytes,
                s.kv_bytes
            );
        }
    }
    write(&out.join("attention_stream_chunks.csv"), &chunks)?;

    let mut md = String::from("# Streaming attention (LongLive-shaped)\n\n");
    md += &metadata_lines(meta, "- ");
    if let Some(r) = results.first() {
        md += &format!(
            "\nChunks of {} latent frames × {} tokens (scale {} of {}), {} heads × {}, f32 activations; each chunk appends its K/V to the cache and its queries attend to {} sink frames + a {}-frame window ({} keys when full), one submission per chunk, waited for. Latency: wall time per chunk (record, submit, GPU done); the first {} chunks (cache filling, pipeline compilation) are warm-up. Memory: the pool ({} policy).\n",
            r.frames_per_chunk,
            r.tokens_per_frame,
            r.scale,
            LONGLIVE_TOKENS_PER_FRAME,
            r.heads,
            r.head_dim,
            r.sink_frames,
            r.window_frames,
            (r.sink_frames + r.window_frames) * r.tokens_per_frame,
            r.warmup_chunks,
            r.policy
        );
    }
    md += "\n| preset | chunks | mean ms | P50 ms | P99 ms | max ms | GPU ms (mean) | chunks/s | frames/s | attention GFLOP/s | peak allocated MiB | peak reserved MiB | KV MiB | allocated after 10 / 100 chunks MiB | warm-up ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in results {
        md += &format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} / {} | {} |\n",
            r.preset,
            r.chunks,
            r.mean_ms,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.gpu_mean_ms.map_or("-".into(), |g| format!("{g:.2}")),
            r.chunks_per_s,
            r.frames_per_s,
            r.attention_gflops,
            mib(r.peak_allocated_bytes),
            mib(r.peak_reserved_bytes),
            mib(r.kv_bytes),
            opt_mib(r.allocated_after_10),
            opt_mib(r.allocated_after_100),
            r.warmup_ms.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(", ")
        );
    }
    let find = |name: &str| results.iter().find(|r| r.preset == name);
    if let (Some(s), Some(i)) = (find("static-kv"), find("int8-kv")) {
        md += &format!(
            "\nint8-kv vs static-kv: KV bytes {:.3}× of the f32 cache (measured; vs an f16 cache, computed at 2 bytes per element: {:.3}×); mean latency {:.3}×, P99 {:.3}×, mean GPU time {}.\n",
            i.kv_bytes as f64 / s.kv_bytes as f64,
            2.0 * i.kv_bytes as f64 / s.kv_bytes as f64,
            i.mean_ms / s.mean_ms,
            i.p99_ms / s.p99_ms,
            match (i.gpu_mean_ms, s.gpu_mean_ms) {
                (Some(a), Some(b)) => format!("{:.3}×", a / b),
                _ => "not available".into(),
            }
        );
    }
    if let Some(i) = find("int8-kv") {
        if let (Some(e), Some(c)) = (i.int8_max_abs_error, i.int8_cosine) {
            md += &format!(
                "\nint8-kv accuracy: the last chunk's output vs the same stream through an f32 ring cache: max abs error {e:.3e}, cosine similarity {c:.6}.\n"
            );
        }
    }
    for r in results {
        if let (Some(a), Some(b)) = (r.allocated_after_10, r.allocated_after_100) {
            md += &format!(
                "\n{}: allocated after 10 chunks {} B, after 100 chunks {} B ({}).",
                r.preset,
                a,
                b,
                if a == b { "identical" } else { "grows" }
            );
        }
    }
    md += "\n";
    write(&out.join("attention_stream.md"), &md)?;

    let mem: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            (
                format!("{} allocated", r.preset),
                r.samples
                    .iter()
                    .map(|s| (s.chunk as f64, s.allocated_bytes as f64 / MIB))
                    .collect(),
            )
        })
        .collect();
    loglog_svg(
        &out.join("attention_stream_memory.svg"),
        "allocated memory vs chunks streamed",
        "chunks",
        "MiB",
        &mem,
    )?;
    let lat: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| {
            (
                format!("{} ms", r.preset),
                r.samples.iter().map(|s| (s.chunk as f64, s.ms)).collect(),
            )
        })
        .collect();
    loglog_svg(
        &out.join("attention_stream_latency.svg"),
        &format!("chunk latency on {}", meta.adapter),
        "chunk",
        "ms",
        &lat,
    )
}

// ---------------------------------------------------------------------------
// Mid-block attention

/// Settings of the mid-block attention benchmark: one head of `head_dim`
/// over T = h·w tokens, channel-major (the AutoencoderKL mid-block; T = 1024,
/// 4096, 16384 at 256², 512², 1024² decodes of an 8× VAE).
#[derive(Clone, Debug)]
pub struct MidBlockConfig {
    /// Token counts to run.
    pub tokens: Vec<usize>,
    /// Head dimension (512 for every AutoencoderKL preset).
    pub head_dim: usize,
    /// Timed runs per size (median reported).
    pub runs: usize,
    /// Sizes whose predicted time exceeds this many seconds are not run.
    pub budget_s: f64,
    /// Memory pool policy.
    pub policy: Policy,
}

impl Default for MidBlockConfig {
    fn default() -> Self {
        MidBlockConfig {
            tokens: vec![1024, 4096, 16384],
            head_dim: 512,
            runs: 3,
            budget_s: 300.0,
            policy: Policy::Planned,
        }
    }
}

/// One size of the mid-block attention benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct MidBlockRow {
    /// Tokens (queries = keys).
    pub tokens: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// `ok`, `not run: …` or `error: …`.
    pub status: String,
    /// Timed runs.
    pub runs: usize,
    /// Median / min / max wall time, submit to done (ms).
    pub ms_median: f64,
    /// Fastest run (ms).
    pub ms_min: f64,
    /// Slowest run (ms).
    pub ms_max: f64,
    /// Median GPU time from timestamp queries (ms), when the adapter has them.
    pub gpu_ms: Option<f64>,
    /// 4·T²·d floating-point operations (QKᵀ and PV).
    pub gflop: f64,
    /// GFLOP / median wall time.
    pub gflops: f64,
    /// Pool peak allocated (q, k, v, out and the key-split scratch).
    pub peak_allocated_bytes: u64,
    /// Pool peak reserved.
    pub peak_reserved_bytes: u64,
    /// Bytes of the T×T f32 score matrix a non-flash kernel would hold.
    pub score_matrix_bytes: u64,
    /// Dispatches the keys were split into (llvmpipe's loop cap; 1 on GPUs).
    pub dispatches: usize,
}

/// Runs mid-block attention at each size: memory from the pool, time as the
/// median of `runs` after an untimed warm-up (small sizes) — the kernel the
/// decoder's mid-block calls ([`crate::kernels::attention::attention`]).
pub fn run_mid_block(
    ctx: &Context,
    cfg: &MidBlockConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<MidBlockRow>> {
    use crate::kernels::attention::{attention, config_for_device, keys_per_dispatch};
    let d = cfg.head_dim;
    let mut rows = Vec::new();
    let mut rate: Option<f64> = None;
    let mut tokens = cfg.tokens.clone();
    tokens.sort_unstable();
    for &t in &tokens {
        let flop = 4.0 * (t as f64) * (t as f64) * d as f64;
        let dispatches = config_for_device(d, t, ctx.caps())
            .and_then(|c| keys_per_dispatch(&c, d, false, ctx.caps()))
            .map_or(1, |k| t.div_ceil(k).max(1));
        let per_run_s = flop / rate.unwrap_or(2e9);
        // Large sizes reuse the pipelines the smaller ones compiled: no warm-up run.
        let warm_up = per_run_s < 5.0;
        let predicted_s = per_run_s * (cfg.runs.max(1) + usize::from(warm_up)) as f64;
        let mut row = MidBlockRow {
            tokens: t,
            head_dim: d,
            status: String::new(),
            runs: 0,
            ms_median: f64::NAN,
            ms_min: f64::NAN,
            ms_max: f64::NAN,
            gpu_ms: None,
            gflop: flop / 1e9,
            gflops: f64::NAN,
            peak_allocated_bytes: 0,
            peak_reserved_bytes: 0,
            score_matrix_bytes: (t * t * 4) as u64,
            dispatches,
        };
        if predicted_s > cfg.budget_s {
            row.status = format!(
                "not run: predicted {predicted_s:.0} s > budget {:.0} s",
                cfg.budget_s
            );
            progress(&format!("T={t}: {}", row.status));
            rows.push(row);
            continue;
        }
        progress(&format!("T={t}: running ({predicted_s:.1} s predicted)"));
        let real = ctx.with_pool(cfg.policy.new_pool());
        let measured = (|| -> Result<(Vec<f64>, Vec<f64>)> {
            let shape = [1, d, t];
            let n = d * t;
            let q = Tensor::from_f32(&real, &shape, &rand_vec(n, 1, 1.0), "q")?;
            let k = Tensor::from_f32(&real, &shape, &rand_vec(n, 2, 1.0), "k")?;
            let v = Tensor::from_f32(&real, &shape, &rand_vec(n, 3, 1.0), "v")?;
            let out = Tensor::empty(&real, &shape, DType::F32, "out")?;
            let scale = 1.0 / (d as f32).sqrt();
            let once = |timed: bool| -> Result<(f64, Option<f64>)> {
                let t0 = Instant::now();
                let mut rec = Recorder::new(&real);
                if timed {
                    rec.enable_profiling();
                }
                attention(&mut rec, &q, &k, &v, scale, &out)?;
                let (_, profile) = rec.submit_profiled()?;
                real.wait_idle()?;
                Ok((t0.elapsed().as_secs_f64() * 1e3, profile.map(|p| p.gpu_ms)))
            };
            // Uploads and pipeline compilation stay out of the timed runs.
            if warm_up {
                once(false)?;
            } else {
                Recorder::new(&real).submit()?;
                real.wait_idle()?;
            }
            let (mut wall, mut gpu) = (Vec::new(), Vec::new());
            for _ in 0..cfg.runs.max(1) {
                let (w, g) = once(true)?;
                wall.push(w);
                gpu.extend(g.filter(|&g| g > 0.0));
            }
            Ok((wall, gpu))
        })();
        match measured {
            Ok((mut wall, mut gpu)) => {
                wall.sort_by(f64::total_cmp);
                gpu.sort_by(f64::total_cmp);
                let s = real.pool().stats();
                row.status = "ok".into();
                row.runs = wall.len();
                row.ms_median = wall[wall.len() / 2];
                row.ms_min = wall[0];
                row.ms_max = wall[wall.len() - 1];
                row.gpu_ms = (gpu.len() == wall.len()).then(|| gpu[gpu.len() / 2]);
                row.gflops = flop / 1e9 / (row.ms_median / 1e3);
                row.peak_allocated_bytes = s.allocated_bytes.peak;
                row.peak_reserved_bytes = s.reserved_bytes.peak;
                rate = Some(flop / (row.ms_median / 1e3));
            }
            Err(e) => row.status = format!("error: {e}"),
        }
        progress(&format!(
            "T={t}: {} {:.1} ms, {:.2} GFLOP/s",
            row.status, row.ms_median, row.gflops
        ));
        rows.push(row);
    }
    Ok(rows)
}

/// Writes `attention_midblock.csv` and `attention_midblock.md`.
pub fn write_mid_block_report(
    rows: &[MidBlockRow],
    cfg: &MidBlockConfig,
    meta: &Metadata,
    out: &Path,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let settings = format!(
        "head_dim {}, runs {}, budget {} s, policy {}, f32, one head, channel-major",
        cfg.head_dim,
        cfg.runs,
        cfg.budget_s,
        cfg.policy.name()
    );
    let mut csv = metadata_lines(meta, "# ");
    csv += &format!("# benchmark: {settings}\n");
    csv += "tokens,head_dim,status,runs,ms_median,ms_min,ms_max,gpu_ms,gflop,gflops,peak_allocated_bytes,peak_reserved_bytes,score_matrix_bytes,dispatches\n";
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            String::new()
        }
    };
    for r in rows {
        csv += &format!(
            "{},{},\"{}\",{},{},{},{},{},{:.3},{},{},{},{},{}\n",
            r.tokens,
            r.head_dim,
            r.status,
            r.runs,
            num(r.ms_median),
            num(r.ms_min),
            num(r.ms_max),
            r.gpu_ms.map_or(String::new(), num),
            r.gflop,
            num(r.gflops),
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.score_matrix_bytes,
            r.dispatches,
        );
    }
    write(&out.join("attention_midblock.csv"), &csv)?;
    let mut md = String::from("# Mid-block attention (flash, one head)\n\n");
    md += &metadata_lines(meta, "- ");
    md += &format!("- benchmark: {settings}\n\n");
    md += "| tokens (decode) | status | median ms (min–max) | GPU ms | GFLOP | GFLOP/s | peak allocated MiB | T×T scores a non-flash kernel holds, MiB | dispatches |\n";
    md += "|---|---|---|---|---|---|---|---|---|\n";
    let fmt = |x: f64, p: usize| {
        if x.is_finite() {
            format!("{x:.p$}")
        } else {
            "–".into()
        }
    };
    for r in rows {
        let side = ((r.tokens as f64).sqrt() * 8.0).round();
        md += &format!(
            "| {} ({side}²) | {} | {} ({}–{}) | {} | {:.1} | {} | {:.1} | {:.0} | {} |\n",
            r.tokens,
            r.status,
            fmt(r.ms_median, 1),
            fmt(r.ms_min, 1),
            fmt(r.ms_max, 1),
            r.gpu_ms.map_or("–".into(), |g| fmt(g, 1)),
            r.gflop,
            fmt(r.gflops, 2),
            r.peak_allocated_bytes as f64 / MIB,
            r.score_matrix_bytes as f64 / MIB,
            r.dispatches,
        );
    }
    md += "\nMemory is O(T): q, k, v and out (4·T·d·4 bytes) plus, where keys are split over dispatches, a 2·T f32 scratch; the T×T score matrix is never materialised.\n";
    write(&out.join("attention_midblock.md"), &md)
}
