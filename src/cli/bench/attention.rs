//! `wgvae bench attention …`: the frame sweep, the streaming KV-cache
//! benchmark and VAE mid-block attention.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use crate::cli::context;
use crate::cli::report::{attention as ra, bench as rb};

#[derive(Subcommand)]
pub(crate) enum AttentionBenchKind {
    /// Frames × tokens per frame, global vs windowed (sink + window) vs windowed through a ring
    /// KV cache: time, GFLOP/s, peak allocated / reserved (dry-run predictions beyond the budget), KV bytes.
    Sweep {
        /// Report folder (CSV, Markdown, SVG plots), created if missing.
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// Video lengths in frames, comma-separated.
        #[arg(long, default_value = "2,4,8,16,32,64,128,256", value_delimiter = ',')]
        frames: Vec<usize>,
        /// Tokens per frame, comma-separated.
        #[arg(long, default_value = "64,256,1024,1369", value_delimiter = ',')]
        tokens_per_frame: Vec<usize>,
        /// Modes, comma-separated: global, window, window-ring.
        #[arg(
            long,
            default_value = "global,window,window-ring",
            value_delimiter = ','
        )]
        modes: Vec<String>,
        /// Embedding width (heads × head dimension).
        #[arg(long, default_value_t = 128)]
        embed: usize,
        /// Attention heads.
        #[arg(long, default_value_t = 16)]
        heads: usize,
        /// Sink frames every query attends to (windowed modes).
        #[arg(long, default_value_t = 1)]
        sink: usize,
        /// Frames of the sliding window (windowed modes).
        #[arg(long, default_value_t = 8)]
        window: usize,
        /// Seconds a cell may take (all runs); longer cells are predicted, not run.
        #[arg(long, default_value_t = 10.0)]
        budget: f64,
        /// Timed runs per cell (the median is reported).
        #[arg(long, default_value_t = 2)]
        runs: usize,
        /// Memory pool policy: planned (replayed plan), caching (PyTorch-like) or exact.
        #[arg(long, default_value = "caching")]
        policy: String,
        /// The published VGGT sweep (read, never copied).
        #[arg(long, default_value = "../shared/reference/vggt_vram_sweep.csv")]
        reference: PathBuf,
    },
    /// Chunks of 3 frames attending to 3 sink + 9 window frames (12 heads × 128) through a KV cache.
    Stream {
        /// baseline (growing, copying cache), static-kv (ring), int8-kv (ring + int8), or all.
        #[arg(long)]
        preset: String,
        /// Chunks to stream.
        #[arg(long, default_value_t = 100)]
        chunks: usize,
        /// Tokens per frame = 1560 × scale (default: 1 on a GPU, 0.02 on a CPU adapter).
        #[arg(long)]
        scale: Option<f64>,
        /// Warm-up chunks reported separately (default: until the cache is full, plus one).
        #[arg(long)]
        warmup: Option<usize>,
        /// Memory pool policy: planned (replayed plan), caching (PyTorch-like) or exact.
        #[arg(long, default_value = "caching")]
        policy: String,
        /// Also write attention_stream.{csv,md}, per-chunk CSV and SVGs here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print one JSON object on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// VAE mid-block attention (one head, d = 512) at T = h·w tokens: time, GFLOP/s, memory.
    Midblock {
        /// Report folder (CSV, Markdown, SVG plots), created if missing.
        #[arg(long, default_value = "bench")]
        out: PathBuf,
        /// Token counts (1024, 4096, 16384 = 256², 512², 1024² decodes).
        #[arg(long, default_value = "1024,4096,16384", value_delimiter = ',')]
        tokens: Vec<usize>,
        /// Head dimension (the VAE mid-block's channels).
        #[arg(long, default_value_t = 512)]
        head_dim: usize,
        /// Timed runs per size (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds a size may take (warm-up + runs); longer sizes are marked not run.
        #[arg(long, default_value_t = 300.0)]
        budget: f64,
        /// Memory pool policy: planned (replayed plan), caching (PyTorch-like) or exact.
        #[arg(long, default_value = "planned")]
        policy: String,
    },
}

/// The one of `all` whose `name` is `s`, or the error `unknown()` says.
fn by_name<T: Copy>(
    all: &[T],
    name: fn(T) -> &'static str,
    s: &str,
    unknown: impl FnOnce() -> String,
) -> wgvae::Result<T> {
    let found = all.iter().copied().find(|&x| name(x) == s);
    found.ok_or_else(|| wgvae::Error::InvalidInput(unknown()))
}

pub(crate) fn run(
    device_args: &crate::cli::DeviceArgs,
    which: &AttentionBenchKind,
) -> wgvae::Result<()> {
    let ctx = context(device_args)?;
    match which {
        AttentionBenchKind::Sweep {
            out,
            frames,
            tokens_per_frame,
            modes,
            embed,
            heads,
            sink,
            window,
            budget,
            runs,
            policy,
            reference,
        } => {
            let modes = modes
                .iter()
                .map(|m| {
                    by_name(&ra::SweepMode::ALL, ra::SweepMode::name, m, || {
                        format!("--modes {m}: use global, window or window-ring")
                    })
                })
                .collect::<wgvae::Result<Vec<_>>>()?;
            let cfg = ra::SweepConfig {
                frames: frames.clone(),
                tokens_per_frame: tokens_per_frame.clone(),
                modes,
                embed: *embed,
                heads: *heads,
                sink_frames: *sink,
                window_frames: *window,
                budget_s: *budget,
                runs: *runs,
                policy: policy.parse()?,
            };
            let reference = if reference.exists() {
                Some(ra::read_vggt(reference)?)
            } else {
                eprintln!(
                    "note: {} not found; the report omits the published sweep",
                    reference.display()
                );
                None
            };
            let settings = format!(
                "frames {frames:?}, tokens/frame {tokens_per_frame:?}, embed {embed}, {heads} heads, sink {sink}, window {window}, budget {budget} s/cell, runs {runs}, policy {policy}, f32"
            );
            let rows = ra::run_sweep(&ctx, &cfg, |m| eprintln!("{m}"))?;
            let meta = rb::Metadata::of(&ctx, settings);
            ra::write_sweep_report(&rows, &cfg, &meta, reference.as_deref(), out)?;
            let ran = rows.iter().filter(|r| r.status == "ok").count();
            println!(
                "{ran} of {} cells run; wrote {}/attention_sweep.csv, attention_sweep.md, attention_sweep_time.svg, attention_sweep_memory.svg",
                rows.len(),
                out.display()
            );
        }
        AttentionBenchKind::Midblock {
            out,
            tokens,
            head_dim,
            runs,
            budget,
            policy,
        } => {
            let cfg = ra::MidBlockConfig {
                tokens: tokens.clone(),
                head_dim: *head_dim,
                runs: *runs,
                budget_s: *budget,
                policy: policy.parse()?,
            };
            let rows = ra::run_mid_block(&ctx, &cfg, |m| eprintln!("{m}"))?;
            let settings = format!(
                "mid-block attention: tokens {tokens:?}, head_dim {head_dim}, runs {runs}, budget {budget} s, policy {policy}, f32"
            );
            let meta = rb::Metadata::of(&ctx, settings);
            ra::write_mid_block_report(&rows, &cfg, &meta, out)?;
            for r in &rows {
                println!(
                    "T={} (d={}): {} median {:.1} ms, {:.2} GFLOP/s, peak allocated {:.1} MiB (a T×T score matrix would be {:.0} MiB)",
                    r.tokens, r.head_dim, r.status, r.ms_median, r.gflops,
                    r.peak_allocated_bytes as f64 / 1048576.0, r.score_matrix_bytes as f64 / 1048576.0
                );
            }
            println!(
                "wrote {}/attention_midblock.csv, attention_midblock.md",
                out.display()
            );
        }
        AttentionBenchKind::Stream {
            preset,
            chunks,
            scale,
            warmup,
            policy,
            out,
            json: as_json,
        } => {
            let presets: Vec<ra::StreamPreset> = if preset == "all" {
                ra::StreamPreset::ALL.to_vec()
            } else {
                vec![by_name(
                    &ra::StreamPreset::ALL,
                    ra::StreamPreset::name,
                    preset,
                    || format!("unknown preset `{preset}`; use baseline, static-kv or int8-kv"),
                )?]
            };
            let scale = scale.unwrap_or(if ctx.caps().is_cpu() { 0.02 } else { 1.0 });
            let mut results = Vec::new();
            for p in presets {
                let mut cfg = ra::StreamConfig::longlive(p, *chunks, scale);
                cfg.warmup = *warmup;
                cfg.policy = policy.parse()?;
                let r = ra::run_stream(&ctx, &cfg, |m| {
                    if !as_json {
                        eprintln!("{m}")
                    }
                })?;
                if !as_json {
                    println!(
                        "{}: {} chunks of 3×{} tokens: mean {:.2} ms, P99 {:.2} ms, max {:.2} ms (warm-up {:?} ms), {:.2} chunks/s, {:.2} frames/s, peak allocated {:.2} MiB, KV {:.2} MiB",
                        r.preset, r.chunks, r.tokens_per_frame, r.mean_ms, r.p99_ms, r.max_ms,
                        r.warmup_ms.iter().map(|m| m.round()).collect::<Vec<_>>(),
                        r.chunks_per_s, r.frames_per_s,
                        r.peak_allocated_bytes as f64 / 1048576.0, r.kv_bytes as f64 / 1048576.0
                    );
                }
                results.push(r);
            }
            if let Some(out) = out {
                let settings = format!(
                    "presets {preset}, {chunks} chunks, scale {scale}, policy {policy}, f32 activations"
                );
                let meta = rb::Metadata::of(&ctx, settings);
                ra::write_stream_report(&results, &meta, out)?;
                if !as_json {
                    println!(
                        "wrote {}/attention_stream.csv, attention_stream_chunks.csv, attention_stream.md, attention_stream_*.svg",
                        out.display()
                    );
                }
            }
            if *as_json {
                let mut v = if results.len() == 1 {
                    serde_json::to_value(&results[0]).unwrap_or_default()
                } else {
                    json!({ "presets": results })
                };
                v["adapter"] = json!(ctx.caps().adapter_name);
                v["backend"] = json!(format!("{:?}", ctx.caps().backend));
                println!("{v}");
            }
        }
    }
    Ok(())
}
