//! `wgvae bench …`: benchmarks writing CSV + Markdown + SVG reports (the
//! harnesses and writers are in `cli::report`).

mod attention;
mod cold_start;
mod conv;
mod decode;
mod frames;
mod gpu_model;
mod video;

use clap::Subcommand;

use crate::cli::report::bench::Timing;

/// Warm-up runs, timed runs and memory policy of the decode, frames and video benchmarks.
#[derive(clap::Args)]
pub(crate) struct TimingArgs {
    /// Untimed decodes before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Timed runs per cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Memory pool policy: planned (replayed plan), caching (PyTorch-like) or exact.
    #[arg(long, default_value = "planned")]
    pub(crate) policy: String,
}

impl TimingArgs {
    /// The benchmark's [`Timing`] (the policy parsed; at least one timed run).
    pub(crate) fn timing(&self) -> wgvae::Result<Timing> {
        if self.runs == 0 {
            return Err(wgvae::Error::InvalidInput(
                "--runs 0: expected at least 1 timed run (a report of no runs has no figures)"
                    .into(),
            ));
        }
        Ok(Timing {
            warmup: self.warmup,
            runs: self.runs,
            policy: self.policy.parse()?,
        })
    }
}

#[derive(Subcommand)]
pub(crate) enum BenchKind {
    /// Warm-up then timed decodes per size: ms, images/s, MP/s, GFLOP/s, peak memory.
    Decode(decode::DecodeBenchArgs),
    /// Process start → first image in a fresh child process, with an empty and then a
    /// warm pipeline cache directory, beside the steady-state decode time.
    ColdStart(cold_start::ColdStartArgs),
    /// Streamed frame decoding (batched chunks, double-buffered RGBA8 readback) against a
    /// one-frame-at-a-time loop: frames/s, per-frame latency mean / P99 / max, peak memory.
    Frames(frames::FramesBenchArgs),
    /// A video VAE (TAEHV, Wan 2.1) streamed chunk by chunk: frames/s, latency per latent
    /// chunk (mean / P50 / P99 / max) and peak memory against the video's length.
    Video(video::VideoBenchArgs),
    /// Attention: a VGGT-shaped frame sweep and a LongLive-shaped streaming benchmark.
    Attention {
        #[command(subcommand)]
        which: attention::AttentionBenchKind,
    },
    /// Convolution tile sets timed on this adapter (GPU timestamps) on the SD1.5-style
    /// decoder's layer classes: per class the engine's pick beside the fastest candidate.
    Conv(conv::ConvBenchArgs),
    /// A paper GPU model (roofline, not a measurement) of every conv layer of the SD1.5,
    /// SDXL, FLUX.1 and Wan 2.1 decoders on an H100 SXM and an RTX 4090, with and without
    /// matrix units: per-decode totals (and per layer with --layers). Needs no GPU.
    GpuModel(gpu_model::GpuModelArgs),
}

/// `--out DIR` checked before any work: it must be a folder or not exist
/// yet (it is created when the report is written).
pub(crate) fn check_out_dir(out: &std::path::Path) -> wgvae::Result<()> {
    if out.exists() && !out.is_dir() {
        return Err(wgvae::Error::InvalidInput(format!(
            "--out {}: expected a folder for the report files (or a path that does not exist yet), found an existing file; name a folder or remove the file",
            out.display()
        )));
    }
    Ok(())
}

/// `what` (`flag` says which argument sets it) of `elements` f32 values
/// built on the host: refused before allocating when the count overflows
/// or the bytes exceed the host's available memory.
pub(crate) fn check_host_f32(flag: &str, what: &str, elements: Option<usize>) -> wgvae::Result<()> {
    let bytes = elements.and_then(|e| e.checked_mul(4)).map(|b| b as u64);
    let limit = wgvae::tiling::host_memory_available().unwrap_or(u64::MAX);
    match bytes {
        Some(b) if b <= limit => Ok(()),
        _ => Err(wgvae::Error::InvalidInput(format!(
            "{flag}: {what} would take {} of host memory, more than this host has available ({:.1} GiB); use a smaller {flag}",
            bytes.map_or("over 2^64 bytes".into(), |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)),
            limit as f64 / (1u64 << 30) as f64
        ))),
    }
}

pub(crate) fn run(adapter: &crate::cli::DeviceArgs, which: &BenchKind) -> wgvae::Result<()> {
    let out = match which {
        BenchKind::Decode(a) => Some(a.out()),
        BenchKind::ColdStart(a) => Some(a.out()),
        BenchKind::Frames(a) => Some(a.out()),
        BenchKind::Video(a) => Some(a.out()),
        BenchKind::Conv(a) => Some(a.out()),
        BenchKind::Attention { .. } | BenchKind::GpuModel(_) => None,
    };
    // Before any work: a report that cannot be written should not cost the benchmark.
    if let Some(out) = out {
        check_out_dir(out)?;
    }
    match which {
        BenchKind::Decode(a) => decode::run(adapter, a),
        BenchKind::ColdStart(a) => cold_start::run(adapter, a),
        BenchKind::Frames(a) => frames::run(adapter, a),
        BenchKind::Video(a) => video::run(adapter, a),
        BenchKind::Conv(a) => conv::run(adapter, a),
        BenchKind::Attention { which } => attention::run(adapter, which),
        BenchKind::GpuModel(a) => gpu_model::run(a),
    }
}

/// `, load average at start A B C` (Linux; empty elsewhere): lavapipe shares
/// the CPU with everything else, so reports record the load.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| {
            format!(
                ", load average at start {}",
                l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
            )
        })
        .unwrap_or_default()
}
