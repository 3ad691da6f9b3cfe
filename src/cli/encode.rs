//! `wgvae encode`: an image to latents.

use std::path::PathBuf;

use serde_json::json;
use wgvae::LoadOptions;

use super::outputs::{check_file, write_atomically, Inputs};
use super::progress::Activity;
use super::tiles::{print_tiling, TileArgs};
use super::{context, mib};

#[derive(clap::Args)]
pub(crate) struct EncodeArgs {
    /// An image, or with a TAEHV --vae a video: a .npy of frames N×T×3×H×W (f32 in [0, 1]).
    image: PathBuf,
    /// VAE: a diffusers folder, a .safetensors file (AutoencoderKL, a TAE *encoder* or a TAEHV video VAE) or preset:NAME.
    #[arg(long)]
    vae: String,
    /// Output latents: .npy (f32) or .safetensors (one tensor named `latents`).
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
    /// diffusers config.json for a weight file without one beside it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Storage precision: f32, f16, bf16 or auto (the default, as `wgvae decode --dtype`;
    /// arithmetic stays f32).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Tiling as for decode; tile sizes count input image pixels.
    #[command(flatten)]
    tiles: TileArgs,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &EncodeArgs) -> wgvae::Result<()> {
    // Before any work: a wrong output name should not cost an encode.
    wgvae::io::latent_format(&a.output)?;
    let mut inputs = Inputs::default();
    inputs.add(&a.image);
    inputs.add_vae(&a.vae, a.config.as_deref());
    check_file(&a.output, "-o", &["npy", "safetensors"], &inputs)?;
    if wgvae::video::is_video_vae(&a.vae) {
        return run_video(device_args, a);
    }
    let tiling = a.tiles.tiling()?;
    let ctx = context(device_args)?;
    let opts = LoadOptions {
        config: a.config.clone(),
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let enc = wgvae::Vae::load_encoder(&ctx, &a.vae, &opts)?;
    // TAE encoders give latents as they are: no scaling to undo.
    if a.raw_latents && enc.latent_scaling().is_none() {
        return Err(wgvae::Error::InvalidInput(
            "--raw-latents: TAE latents carry no scaling or shift (they are the decoder's input as they are); the flag applies to AutoencoderKL encoders".into(),
        ));
    }
    if has_ext(&a.image, "npy") {
        return Err(wgvae::Error::BadFile {
            path: a.image.clone(),
            message: format!(
                "`{}` is an image encoder: it takes a PNG image, not a .npy array (video frames N×T×3×H×W encode with a TAEHV video VAE, e.g. taew2_1.safetensors)",
                a.vae
            ),
        });
    }
    let pixels = wgvae::encode::load_image(&a.image, a.pad)?;
    let start = std::time::Instant::now();
    let activity = Activity::start(a.json, "encoding", ctx.pipelines());
    let out = wgvae::encode::encode(
        &ctx,
        &enc,
        &pixels,
        &wgvae::encode::EncodeOptions {
            sample: a.sample,
            raw_latents: a.raw_latents,
            tiling,
            progress: Some(activity.progress()),
        },
    );
    drop(activity);
    let out = out?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    write_atomically(&a.output, "-o", |w| {
        wgvae::io::write_latents_to(w, &a.output, &out.latents)
    })?;
    ctx.save_pipeline_cache();
    if a.json {
        println!(
            "{}",
            json!({"adapter": ctx.caps().adapter_name, "backend": format!("{:?}", ctx.caps().backend),
                   "model": enc.name(), "image_shape": pixels.shape, "latents_shape": out.latents.shape,
                   "encode_ms": ms, "sampled": a.sample.is_some(), "raw_latents": a.raw_latents,
                   "weights_bytes": enc.weights_bytes(),
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
            enc.name(),
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

/// A TAEHV `--vae`: a `.npy` of frames `N×T×3×H×W` in [0, 1] to latents
/// `N×T'×C×h×w` (`taehv.py`'s `encode_video`).
fn run_video(device_args: &crate::cli::DeviceArgs, a: &EncodeArgs) -> wgvae::Result<()> {
    let t = &a.tiles;
    let image_only = [
        ("--sample", a.sample.is_some()),
        ("--raw-latents", a.raw_latents),
        ("--pad", a.pad),
        ("--config", a.config.is_some()),
        ("--tile", !matches!(t.tile.as_str(), "auto" | "off")),
        ("--tile-size", t.tile_size.is_some()),
        ("--tile-overlap", t.tile_overlap.is_some()),
        ("--max-memory", t.max_memory.is_some()),
        ("--max-host-memory", t.max_host_memory.is_some()),
        ("--tile-mid-block", t.tile_mid_block),
    ];
    wgvae::video_encode::check_has_encoder(&a.vae)?;
    if let Some((flag, _)) = image_only.iter().find(|(_, set)| *set) {
        return Err(wgvae::Error::InvalidInput(format!(
            "{flag} applies to image encoders; {} is a video VAE (TAEHV latents are deterministic, unscaled and encoded untiled)",
            a.vae
        )));
    }
    if !has_ext(&a.image, "npy") {
        return Err(wgvae::Error::BadFile {
            path: a.image.clone(),
            message: format!(
                "{} is a TAEHV video VAE: it encodes frames given as a .npy of N×T×3×H×W float32 values in [0, 1], not an image file; encode an image with an image VAE (an AutoencoderKL or TAE encoder)",
                a.vae
            ),
        });
    }
    let frames = wgvae::io::read_npy(&a.image)?;
    let ctx = context(device_args)?;
    let opts = LoadOptions {
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let enc = wgvae::Vae::load_encoder(&ctx, &a.vae, &opts)?;
    let start = std::time::Instant::now();
    let latents = wgvae::video_encode::encode_video(&ctx, &enc, &frames)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    write_atomically(&a.output, "-o", |w| {
        wgvae::io::write_latents_to(w, &a.output, &latents)
    })?;
    ctx.save_pipeline_cache();
    if a.json {
        println!(
            "{}",
            json!({"adapter": ctx.caps().adapter_name, "backend": format!("{:?}", ctx.caps().backend),
                   "model": enc.name(), "frames_shape": frames.shape,
                   "latents_shape": latents.shape, "encode_ms": ms, "output": a.output})
        );
    } else {
        println!(
            "wrote {} ({:?}) — {} encoder in {ms:.1} ms",
            a.output.display(),
            latents.shape,
            enc.name(),
        );
    }
    Ok(())
}

/// `path` ends in `.ext` (any case).
fn has_ext(path: &std::path::Path, ext: &str) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case(ext))
}
