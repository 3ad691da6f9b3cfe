//! `wgvae bench decode`: warm-up then timed decodes per size.

use std::path::PathBuf;

use super::{load_average, TimingArgs};
use crate::cli::context;
use crate::cli::report::bench as rb;
use crate::cli::tiles::BenchTileArgs;

#[derive(clap::Args)]
pub(crate) struct DecodeBenchArgs {
    /// VAE: folder, .safetensors file or preset:NAME (sd15, sdxl, sd3, flux1, flux2, flux2-small).
    #[arg(long)]
    vae: String,
    /// Output sizes in pixels (square), comma-separated.
    #[arg(long, default_value = "128,256", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Storage dtypes, comma-separated: f32, f16, bf16, auto.
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    dtypes: Vec<String>,
    /// Images per decode (the latents' batch size N).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[command(flatten)]
    timing: TimingArgs,
    /// Tiling of every decode (default: off, so sizes compare untiled kernels).
    #[command(flatten)]
    tiles: BenchTileArgs,
    /// Report folder (CSV, Markdown, SVG plots), created if missing.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
}

impl DecodeBenchArgs {
    /// The report folder (`--out`).
    pub(crate) fn out(&self) -> &std::path::Path {
        &self.out
    }
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &DecodeBenchArgs) -> wgvae::Result<()> {
    let precisions = a
        .dtypes
        .iter()
        .map(|d| d.parse())
        .collect::<wgvae::Result<Vec<wgvae::models::Precision>>>()?;
    let ctx = context(device_args)?;
    let b = rb::DecodeBench {
        vae: a.vae.clone(),
        sizes: a.sizes.clone(),
        batch: a.batch,
        timing: a.timing.timing()?,
        dtypes: precisions,
        tiling: a.tiles.tiling()?,
    };
    let settings = format!(
        "vae {}, sizes {:?}, dtypes {:?}, batch {}, warm-up {}, runs {}, policy {}, {}{}",
        a.vae,
        a.sizes,
        a.dtypes,
        a.batch,
        a.timing.warmup,
        a.timing.runs,
        a.timing.policy,
        a.tiles.describe(),
        load_average()
    );
    let bar = indicatif::ProgressBar::new_spinner();
    let rows = rb::run_decode_bench(&ctx, &b, |m| bar.set_message(m.to_string()))?;
    bar.finish_and_clear();
    ctx.save_pipeline_cache();
    let meta = rb::Metadata::of(&ctx, settings);
    rb::write_decode_report(&rows, &meta, &a.out)?;
    for r in &rows {
        println!(
            "{}² {} {} ({}): first {:.1} ms, median {:.1} ms (min {:.1}, max {:.1}), {:.3} images/s, {:.2} GFLOP/s, peak allocated {:.1} MiB, reserved {:.1} MiB [{}]",
            r.size, r.dtype, r.matrix, r.tiling, r.first_ms, r.median_ms, r.min_ms, r.max_ms, r.images_per_s, r.gflops, r.peak_allocated_mib, r.peak_reserved_mib, r.status
        );
    }
    println!(
        "wrote {}/decode.csv, decode.md, decode_time.svg, decode_memory.svg",
        a.out.display()
    );
    Ok(())
}
