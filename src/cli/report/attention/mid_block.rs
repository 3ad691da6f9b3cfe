//! VAE mid-block attention: one head, d = 512, at T = h·w tokens.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use wgvae::error::Result;
use wgvae::gpu::{Context, Recorder};
use wgvae::memory::Policy;
use wgvae::seeded::uniform as rand_vec;
use wgvae::tensor::{DType, Tensor};

use crate::cli::report::bench::Metadata;
use crate::cli::report::{create_dir, table, write, MIB};

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
/// decoder's mid-block calls ([`wgvae::kernels::attention::attention`]).
pub fn run_mid_block(
    ctx: &Context,
    cfg: &MidBlockConfig,
    mut progress: impl FnMut(&str),
) -> Result<Vec<MidBlockRow>> {
    use wgvae::kernels::attention::{attention, config_for_device, keys_per_dispatch};
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
    create_dir(out)?;
    let settings = format!(
        "head_dim {}, runs {}, budget {} s, policy {}, f32, one head, channel-major",
        cfg.head_dim,
        cfg.runs,
        cfg.budget_s,
        cfg.policy.name()
    );
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            String::new()
        }
    };
    let csv = meta.csv(&format!("# benchmark: {settings}\ntokens,head_dim,status,runs,ms_median,ms_min,ms_max,gpu_ms,gflop,gflops,peak_allocated_bytes,peak_reserved_bytes,score_matrix_bytes,dispatches\n"), rows, |r| {
        format!(
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
        )
    });
    write(&out.join("attention_midblock.csv"), &csv)?;
    let mut md = meta.markdown("Mid-block attention (flash, one head)");
    let fmt = |x: f64, p: usize| {
        if x.is_finite() {
            format!("{x:.p$}")
        } else {
            "–".into()
        }
    };
    md += &table(&format!("- benchmark: {settings}\n\n| tokens (decode) | status | median ms (min–max) | GPU ms | GFLOP | GFLOP/s | peak allocated MiB | T×T scores a non-flash kernel holds, MiB | dispatches |\n|---|---|---|---|---|---|---|---|---|\n"), rows, |r| {
        let side = ((r.tokens as f64).sqrt() * 8.0).round();
        format!(
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
        )
    });
    md += "\nMemory is O(T): q, k, v and out (4·T·d·4 bytes) plus, where keys are split over dispatches, a 2·T f32 scratch; the T×T score matrix is never materialised.\n";
    write(&out.join("attention_midblock.md"), &md)
}
