//! `wgvae bench frames`: streamed frame decoding against a one-frame loop.

use std::path::PathBuf;

use super::{load_average, TimingArgs};
use crate::cli::context;
use crate::cli::report::{bench as rb, frames as rf};

#[derive(clap::Args)]
pub(crate) struct FramesBenchArgs {
    /// VAE: a diffusers folder, a .safetensors file or preset:NAME.
    #[arg(long)]
    vae: String,
    /// Frames per decode (N).
    #[arg(long, default_value_t = 16)]
    frames: usize,
    /// Square output size in pixels of random latents (ignored with --latents).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Take the frames from this latent file (cycled and perturbed when it holds fewer).
    #[arg(long)]
    latents: Option<PathBuf>,
    /// Chunk sizes to measure, comma-separated: numbers or `auto`.
    #[arg(long, default_value = "auto", value_delimiter = ',')]
    chunk: Vec<String>,
    /// Skip the one-frame-at-a-time loop baseline.
    #[arg(long)]
    no_baseline: bool,
    #[command(flatten)]
    timing: TimingArgs,
    /// Report folder (CSV, Markdown, SVG plots), created if missing.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

impl FramesBenchArgs {
    /// The report folder (`--out`).
    pub(crate) fn out(&self) -> &std::path::Path {
        &self.out
    }
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &FramesBenchArgs) -> wgvae::Result<()> {
    let chunks = a
        .chunk
        .iter()
        .map(|c| match c.trim() {
            "auto" => Ok(None),
            s => match s.parse::<usize>() {
                Ok(v) if v > 0 => Ok(Some(v)),
                _ => Err(wgvae::Error::InvalidInput(format!(
                    "--chunk {s}: expected a positive number or auto"
                ))),
            },
        })
        .collect::<wgvae::Result<_>>()?;
    let b = rf::FramesBench {
        vae: a.vae.clone(),
        frames: a.frames,
        latents: a.latents.clone(),
        size: a.size,
        chunks,
        baseline: !a.no_baseline,
        timing: a.timing.timing()?,
    };
    let ctx = context(device_args)?;
    let load = load_average();
    let source = match &b.latents {
        Some(p) => format!("latents {}", p.display()),
        None => format!("random latents {}²", b.size),
    };
    let settings = format!(
        "vae {}, {} frames, {source}, chunks {:?}, baseline {}, warm-up {}, runs {}, policy {}, f32{load}",
        b.vae, b.frames, a.chunk, b.baseline, a.timing.warmup, a.timing.runs, a.timing.policy
    );
    let (rows, samples) = rf::run_frames_bench(&ctx, &b, |m| eprintln!("{m}"))?;
    let meta = rb::Metadata::of(&ctx, settings);
    rf::write_frames_report(&rows, &samples, &meta, &a.out)?;
    for r in &rows {
        println!(
            "{} chunk {} ({}): {} frames of {}×{}: {:.3} frames/s (median {:.1} ms of {} runs), latency mean {:.1} / P99 {:.1} / max {:.1} ms, peak allocated {:.1} MiB, reserved {:.1} MiB, process CPU {:.0} ms/frame, {:.2}× the loop ({:.2}× in CPU time) [{}]",
            r.mode, r.chunk_setting, r.chunk, r.frames, r.width, r.height, r.frames_per_s, r.median_total_ms, r.runs,
            r.latency.mean_ms, r.latency.p99_ms, r.latency.max_ms, r.peak_allocated_mib, r.peak_reserved_mib,
            r.cpu_ms_per_frame, r.vs_loop, r.vs_loop_cpu, r.status
        );
    }
    println!(
        "wrote {}/frames.csv, frames.md, frames_latency.csv",
        a.out.display()
    );
    Ok(())
}
