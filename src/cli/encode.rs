//! `wgvae encode`: an image to latents.

use std::path::PathBuf;

use serde_json::json;
use wgvae::LoadOptions;

use super::outputs::{check_file, write_atomically, Inputs};
use super::progress::progress_bar;
use super::tiles::{print_tiling, TileArgs};
use super::{context, mib};

#[derive(clap::Args)]
pub(crate) struct EncodeArgs {
    image: PathBuf,
    /// VAE: a diffusers folder, a .safetensors file (AutoencoderKL or a TAE *encoder*) or preset:NAME.
    #[arg(long)]
    vae: String,
    #[arg(short, long)]
    output: PathBuf,
    /// Sample from the latent distribution with this seed instead of taking its mean.
    #[arg(long)]
    sample: Option<u64>,
    /// Write raw latents (skip `(z − shift_factor) · scaling_factor`).
    #[arg(long)]
    raw_latents: bool,
    /// Extend images whose sides are not multiples of 8 by replicating the right/bottom edges.
    #[arg(long)]
    pad: bool,
    #[arg(long)]
    config: Option<PathBuf>,
    /// Storage precision: f32, f16, bf16 or auto (arithmetic stays f32).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Tiling as for decode; tile sizes count input image pixels.
    #[command(flatten)]
    tiles: TileArgs,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(cli_adapter: &Option<String>, a: &EncodeArgs) -> wgvae::Result<()> {
    // Before any work: a wrong output name should not cost an encode.
    wgvae::io::latent_format(&a.output)?;
    let mut inputs = Inputs::default();
    inputs.add(&a.image);
    inputs.add_vae(&a.vae, a.config.as_deref());
    check_file(&a.output, "-o", &["npy", "safetensors"], &inputs)?;
    let tiling = a.tiles.tiling()?;
    let ctx = context(cli_adapter)?;
    let opts = LoadOptions {
        config: a.config.clone(),
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let enc = wgvae::encode::VaeEncoder::load(&ctx, &a.vae, &opts)?;
    if a.raw_latents && matches!(enc.encoder, wgvae::encode::EncoderKind::Tae(_)) {
        return Err(wgvae::Error::InvalidInput(
            "--raw-latents: TAE latents carry no scaling or shift (they are the decoder's input as they are); the flag applies to AutoencoderKL encoders".into(),
        ));
    }
    let pixels = wgvae::encode::load_image(&a.image, a.pad)?;
    let start = std::time::Instant::now();
    let out = wgvae::encode::encode(
        &ctx,
        &enc,
        &pixels,
        &wgvae::encode::EncodeOptions {
            sample: a.sample,
            raw_latents: a.raw_latents,
            tiling,
            progress: progress_bar(a.json),
        },
    )?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    write_atomically(&a.output, |t| wgvae::io::write_latents(t, &out.latents))?;
    ctx.save_pipeline_cache();
    if a.json {
        println!(
            "{}",
            json!({"adapter": ctx.caps().adapter_name, "backend": format!("{:?}", ctx.caps().backend),
                   "model": enc.name, "image_shape": pixels.shape, "latents_shape": out.latents.shape,
                   "encode_ms": ms, "sampled": a.sample.is_some(), "raw_latents": a.raw_latents,
                   "weights_bytes": enc.weights_bytes,
                   "dtype": out.dtype.name(), "f16_overflows": out.f16_overflows,
                   "precision_note": out.precision_note,
                   "peak_allocated_bytes": out.memory.allocated_bytes.peak,
                   "peak_reserved_bytes": out.memory.reserved_bytes.peak,
                   "tiling": out.tiling, "output": a.output})
        );
    } else {
        println!(
            "wrote {} ({:?}) — {} in {ms:.1} ms; peak allocated {:.1} MiB, reserved {:.1} MiB",
            a.output.display(),
            out.latents.shape,
            enc.name,
            mib(out.memory.allocated_bytes.peak),
            mib(out.memory.reserved_bytes.peak)
        );
        print_tiling(&out.tiling);
        if let Some(note) = &out.precision_note {
            println!("{note}");
        }
    }
    Ok(())
}
