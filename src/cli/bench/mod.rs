//! `wgvae bench …`: benchmarks writing CSV + Markdown + SVG reports (the
//! harnesses and writers are in `cli::report`).

mod attention;
mod cold_start;
mod decode;
mod frames;
mod gpu_model;
mod video;

use clap::Subcommand;

use crate::cli::report::bench::Timing;

/// Warm-up runs, timed runs and memory policy of the decode, frames and video benchmarks.
#[derive(clap::Args)]
pub(crate) struct TimingArgs {
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    #[arg(long, default_value = "planned")]
    pub(crate) policy: String,
}

impl TimingArgs {
    /// The benchmark's [`Timing`] (the policy parsed).
    pub(crate) fn timing(&self) -> wgvae::Result<Timing> {
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
    /// A paper GPU model (roofline, not a measurement) of every conv layer of the SD1.5,
    /// SDXL, FLUX.1 and Wan 2.1 decoders on an H100 SXM and an RTX 4090, with and without
    /// matrix units: per-decode totals (and per layer with --layers). Needs no GPU.
    GpuModel(gpu_model::GpuModelArgs),
}

pub(crate) fn run(adapter: &crate::cli::DeviceArgs, which: &BenchKind) -> wgvae::Result<()> {
    match which {
        BenchKind::Decode(a) => decode::run(adapter, a),
        BenchKind::ColdStart(a) => cold_start::run(adapter, a),
        BenchKind::Frames(a) => frames::run(adapter, a),
        BenchKind::Video(a) => video::run(adapter, a),
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
