//! `wgvae bench video`: a video VAE streamed through `VideoDecoder` per
//! dtype, chunk size and video length.

use std::path::PathBuf;

use super::{load_average, TimingArgs};
use crate::cli::context;
use crate::cli::report::{bench as rb, video as rv};

#[derive(clap::Args)]
pub(crate) struct VideoBenchArgs {
    /// A TAEHV `.safetensors` file, a video VAE (diffusers folder or file) or preset:wan21 / wan22 / hunyuanvideo15 / ltx2 / minimax-h3.
    #[arg(long)]
    vae: String,
    /// Seed of a preset's random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Square output size in pixels (seeded random latents).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Video lengths in latent frames, comma-separated: a row each, so peak memory
    /// shows against the length.
    #[arg(
        long,
        alias = "frames",
        default_value = "3,6,12",
        value_delimiter = ','
    )]
    latent_frames: Vec<usize>,
    /// Latent frames per streamed chunk, comma-separated.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    chunk: Vec<usize>,
    /// Storage dtypes, comma-separated: f32, f16, bf16, auto.
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    dtypes: Vec<String>,
    #[command(flatten)]
    timing: TimingArgs,
    /// Report folder (CSV, Markdown, SVG plots), created if missing.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

impl VideoBenchArgs {
    /// The report folder (`--out`).
    pub(crate) fn out(&self) -> &std::path::Path {
        &self.out
    }
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &VideoBenchArgs) -> wgvae::Result<()> {
    let dtypes = a
        .dtypes
        .iter()
        .map(|d| d.parse())
        .collect::<wgvae::Result<Vec<wgvae::models::Precision>>>()?;
    let b = rv::VideoBench {
        vae: a.vae.clone(),
        seed: a.seed,
        size: a.size,
        latent_frames: a.latent_frames.clone(),
        chunks: a.chunk.clone(),
        dtypes,
        timing: a.timing.timing()?,
    };
    let ctx = context(device_args)?;
    let settings = format!(
        "vae {}, seed {}, random latents {}², latent frames {:?}, chunks {:?}, dtypes {:?}, warm-up {}, runs {}, policy {}{}",
        a.vae,
        a.seed,
        a.size,
        a.latent_frames,
        a.chunk,
        a.dtypes,
        a.timing.warmup,
        a.timing.runs,
        a.timing.policy,
        load_average()
    );
    let (rows, samples) = rv::run_video_bench(&ctx, &b, |m| eprintln!("{m}"))?;
    ctx.save_pipeline_cache();
    let meta = rb::Metadata::of(&ctx, settings);
    rv::write_video_report(&rows, &samples, &meta, &a.out)?;
    for r in &rows {
        println!(
            "{} {} chunk {} × {} latent frames ({} frames of {}×{}): {:.3} frames/s (median {:.1} ms of {} runs), chunk latency mean {:.1} / P50 {:.1} / P99 {:.1} / max {:.1} ms, peak allocated {:.1} MiB, reserved {:.1} MiB, caches {:.2} MiB, CPU {:.0} ms/frame [{}]",
            r.model, r.dtype, r.chunk, r.latent_frames, r.frames, r.width, r.height, r.frames_per_s,
            r.median_total_ms, r.runs, r.latency.mean_ms, r.latency.p50_ms, r.latency.p99_ms,
            r.latency.max_ms, r.peak_allocated_mib, r.peak_reserved_mib, r.cache_mib,
            r.cpu_ms_per_frame, r.status
        );
    }
    println!(
        "wrote {}/video.csv, video.md, video_latency.csv, video_memory.svg, video_throughput.svg",
        a.out.display()
    );
    Ok(())
}
