//! The frame sweep: frames × tokens per frame, global vs windowed vs ring-cached.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use wgvae::attention::{
    multi_head_attention, AttentionOptions, KvCacheConfig, KvDtype, Mask, RingKvCache,
};
use wgvae::error::{Error, Result};
use wgvae::gpu::{Capabilities, Context, Recorder};
use wgvae::memory::Policy;
use wgvae::seeded::uniform as rand_vec;
use wgvae::tensor::{DType, Tensor};

use super::{fmt_ms, mib};
use crate::cli::report::bench::Metadata;
use crate::cli::report::{create_dir, io_err, loglog_chart, table, write, MIB};

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
        if fill && !ctx.is_null() {
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
    if !ctx.is_null() {
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
                let dry = Context::null(prediction_caps(ctx), cfg.policy.new_pool());
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
/// Cells faster than this are dominated by the fixed cost of a submission.
const MIN_FIT_MS: f64 = 20.0;

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
    create_dir(out)?;
    let csv = meta.csv("mode,frames,tokens_per_frame,tokens,dtype,status,time_ms,predicted_ms,gflop,gflops,peak_allocated_bytes,peak_reserved_bytes,memory_source,predicted_allocated_bytes,predicted_reserved_bytes,kv_bytes\n", rows, |r| {
        format!(
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
        )
    });
    write(&out.join("attention_sweep.csv"), &csv)?;

    let mut md = meta.markdown("Attention frame sweep");
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
    md += &table("\n## Cells\n\n| mode | frames | tokens/frame | tokens | time ms | GFLOP | GFLOP/s | peak allocated MiB | peak reserved MiB | memory | KV MiB | status |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n", rows, |r| {
        format!(
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
        )
    });
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
    loglog_chart(
        &out.join("attention_sweep_time.svg"),
        &format!("attention time vs frames on {}", meta.adapter),
        ("frames", "ms"),
        &series(&|r| {
            if r.status == "ok" {
                r.time_ms
            } else {
                f64::NAN
            }
        }),
    )?;
    loglog_chart(
        &out.join("attention_sweep_memory.svg"),
        "attention peak allocated memory vs frames",
        ("frames", "MiB"),
        &series(&|r| r.peak_allocated_bytes as f64 / MIB),
    )
}
