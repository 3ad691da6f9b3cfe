//! `wgvae memory`: a decode's or encode's memory, predicted without running it.

use serde_json::json;
use wgvae::gpu::Context;
use wgvae::memory::Policy;
use wgvae::{LoadOptions, Vae};

use super::context;
use super::tiles::{print_tiling, TileArgs};

#[derive(clap::Args)]
pub(crate) struct MemoryArgs {
    /// VAE: folder, .safetensors file or preset:NAME (sd15, sdxl, sd3, flux1, flux2, flux2-small).
    #[arg(long)]
    vae: String,
    /// Output image size in pixels, HxW (latent = pixels / 8).
    #[arg(long)]
    size: String,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Storage precision: f32, f16, bf16 or auto (as `wgvae decode --dtype`).
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Predict for a 24 GB reference GPU's limits instead of this machine's adapter.
    #[arg(long)]
    reference_gpu: bool,
    /// Predict encoding an HxW image instead of decoding to one.
    #[arg(long)]
    encode: bool,
    /// Latent frames of a video (video decoders; the estimate streams and
    /// does not depend on it; default 1).
    #[arg(long)]
    frames: Option<usize>,
    /// Latent frames per streamed chunk of a video (as `decode --chunk`).
    #[arg(long)]
    chunk: Option<usize>,
    #[command(flatten)]
    tiles: TileArgs,
    #[arg(long)]
    json: bool,
}

/// `HxW` (or `N`: square) in pixels, multiples of 8.
fn parse_size(s: &str) -> wgvae::Result<(usize, usize)> {
    let bad = || {
        wgvae::Error::InvalidInput(format!(
            "--size `{s}`: expected HxW in pixels, multiples of 8 (e.g. 1024x1024)"
        ))
    };
    let (h, w) = s.split_once(['x', 'X']).unwrap_or((s, s));
    let (h, w): (usize, usize) = (
        h.trim().parse().map_err(|_| bad())?,
        w.trim().parse().map_err(|_| bad())?,
    );
    if h == 0 || w == 0 || h % 8 != 0 || w % 8 != 0 {
        return Err(bad());
    }
    Ok((h, w))
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &MemoryArgs) -> wgvae::Result<()> {
    let policy: Policy = a.policy.parse()?;
    let load = LoadOptions {
        precision: a.dtype.parse()?,
        ..Default::default()
    };
    let (h, w) = parse_size(&a.size)?;
    let video = wgvae::video::is_video_vae(&a.vae);
    if !video && (a.frames.is_some() || a.chunk.is_some()) {
        return Err(wgvae::Error::InvalidInput(format!(
            "--frames/--chunk predict a video decode; `{}` is not a video decoder",
            a.vae
        )));
    }
    if video {
        return run_video(device_args, a, policy, &load, (h, w));
    }
    let caps = if a.reference_gpu {
        wgvae::gpu::Capabilities::reference_gpu()
    } else {
        context(device_args)?.caps().clone()
    };
    let tiling = a.tiles.tiling()?;
    let (e, dtype) = if a.encode {
        let shape = [a.batch, 3, h, w];
        let e = wgvae::decode::Estimate::new(&caps, policy, &a.vae, &load)
            .tiled(&tiling)
            .encode(shape)?;
        (e, a.dtype.clone())
    } else {
        // The latent channel count comes from the model: load it once in a dry run.
        let probe = Context::null(caps.clone(), Policy::Exact.new_pool());
        let probe = Vae::load(&probe, &a.vae, &load)?;
        let (channels, dtype) = (probe.latent_channels(), probe.dtype.name().to_string());
        let shape = [a.batch, channels, h / 8, w / 8];
        let e = wgvae::decode::Estimate::new(&caps, policy, &a.vae, &load)
            .tiled(&tiling)
            .decode(shape)?;
        (e, dtype)
    };
    let op = if a.encode { "encode" } else { "decode" };
    if a.json {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        v["device"] = json!(caps.adapter_name);
        v["dtype"] = json!(dtype);
        v["op"] = json!(op);
        println!("{v}");
    } else {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{} {op} {}x{} ×{} ({}, {} policy) on {}:",
            e.model, h, w, a.batch, dtype, e.policy, caps.adapter_name
        );
        println!("  weights        {:10.1} MiB", mib(e.weights_bytes));
        println!(
            "  peak allocated {:10.1} MiB (working {:.1} MiB)",
            mib(e.peak_allocated_bytes),
            mib(e.peak_allocated_bytes - e.weights_bytes)
        );
        println!(
            "  peak reserved  {:10.1} MiB (reserved/allocated {:.3})",
            mib(e.peak_reserved_bytes),
            e.peak_reserved_bytes as f64 / e.peak_allocated_bytes as f64
        );
        print_tiling(&e.tiling);
    }
    Ok(())
}

/// `wgvae memory` of a streaming video decode (see [`wgvae::decode::Estimate::video`]).
fn run_video(
    device_args: &crate::cli::DeviceArgs,
    a: &MemoryArgs,
    policy: Policy,
    load: &LoadOptions,
    size: (usize, usize),
) -> wgvae::Result<()> {
    let frames = a.frames.unwrap_or(1);
    let chunk = a.chunk.unwrap_or(wgvae::video::DEFAULT_CHUNK);
    if frames == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--frames must be at least 1 (latent frames of the video)".into(),
        ));
    }
    if chunk == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--chunk must be at least 1".into(),
        ));
    }
    if a.encode || a.batch != 1 {
        return Err(wgvae::Error::InvalidInput(format!(
            "`{}` is a video decoder: its estimate is one streamed video (no --encode, --batch 1)",
            a.vae
        )));
    }
    let tiling = a.tiles.tiling()?;
    if !matches!(tiling.mode, wgvae::TileMode::Auto | wgvae::TileMode::Off)
        || tiling.tile_size.is_some()
    {
        return Err(wgvae::Error::InvalidInput(
            "a video decode runs untiled: no --tile exact/fast or --tile-size".into(),
        ));
    }
    let caps = if a.reference_gpu {
        wgvae::gpu::Capabilities::reference_gpu()
    } else {
        context(device_args)?.caps().clone()
    };
    let e = wgvae::decode::Estimate::new(&caps, policy, &a.vae, load).video(size, frames, chunk)?;
    if a.json {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        v["device"] = json!(caps.adapter_name);
        v["op"] = json!("decode_video");
        println!("{v}");
    } else {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{} streaming video decode {}x{}, {} latent frames -> {} frames, chunks of {} ({}, {} policy) on {}:",
            e.model, size.0, size.1, e.frames, e.output_frames, e.chunk, e.dtype, e.policy, caps.adapter_name
        );
        println!("  weights        {:10.1} MiB", mib(e.weights_bytes));
        println!("  caches         {:10.1} MiB", mib(e.cache_bytes));
        println!("  activations    {:10.1} MiB", mib(e.activation_bytes));
        println!(
            "  staging        {:10.1} MiB (read-back double buffers, outside the pool)",
            mib(e.staging_bytes)
        );
        println!("  peak allocated {:10.1} MiB", mib(e.peak_allocated_bytes));
        println!("  peak reserved  {:10.1} MiB", mib(e.peak_reserved_bytes));
        println!(
            "  independent of the video's length (streamed: only the caches stay between chunks)"
        );
    }
    Ok(())
}
