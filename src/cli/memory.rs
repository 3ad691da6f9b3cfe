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
    /// Output image size in pixels, HxW (latent = pixels / the model's upscale: 8, or 16 for Qwen-Image 2.1).
    #[arg(long)]
    size: String,
    /// Images per decode (the latents' batch size N).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Storage precision: f32, f16, bf16 or auto (the default, as `wgvae decode --dtype`: it
    /// resolves for the predicted device, so `--reference-gpu` predicts 16-bit storage).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Memory pool policy: planned (replayed plan), caching (PyTorch-like) or exact.
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Predict for a 24 GB reference GPU's limits instead of this machine's adapter.
    #[arg(long)]
    reference_gpu: bool,
    /// Predict encoding an HxW image instead of decoding to one.
    #[arg(long)]
    encode: bool,
    /// Latent frames of a video (video decoders): the estimate is for a video of
    /// this length. Default: three chunks (3 × --chunk), long enough that the peak
    /// is the one every longer video has; shorter videos peak at most as high.
    #[arg(long)]
    frames: Option<usize>,
    /// Latent frames per streamed chunk of a video (as `decode --chunk`).
    #[arg(long)]
    chunk: Option<usize>,
    #[command(flatten)]
    tiles: TileArgs,
    /// Print one JSON object on stdout instead of text.
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
        let e = wgvae::estimate::Estimate::new(&caps, policy, &a.vae, &load)
            .tiled(&tiling)
            .encode(shape)?;
        // The dtype `--dtype` resolves to for this encoder (`auto`: by device and model).
        let probe = Context::null(caps.clone(), Policy::Exact.new_pool());
        let enc = Vae::load_encoder(&probe, &a.vae, &load)?;
        (e, enc.dtype().name().to_string())
    } else {
        // The latent channel count comes from the model: load it once in a dry run.
        let probe = Context::null(caps.clone(), Policy::Exact.new_pool());
        let probe = Vae::load_image_decoder(&probe, &a.vae, &load)?;
        let (channels, dtype) = (probe.latent_channels(), probe.dtype().name().to_string());
        // Pixels per latent pixel: 8, or 16 (Qwen-Image 2.1).
        let up = probe.upscale();
        if h % up != 0 || w % up != 0 {
            return Err(wgvae::Error::InvalidInput(format!(
                "--size {h}x{w}: {} decodes {up} pixels per latent pixel; give sides that are multiples of {up} (e.g. {}x{})",
                a.vae,
                h.div_ceil(up) * up,
                w.div_ceil(up) * up
            )));
        }
        let shape = [a.batch, channels, h / up, w / up];
        let e = wgvae::estimate::Estimate::new(&caps, policy, &a.vae, &load)
            .tiled(&tiling)
            .decode(shape)?;
        (e, dtype)
    };
    let op = if a.encode { "encode" } else { "decode" };
    check_budget(
        tiling.max_memory,
        e.peak_allocated_bytes + e.tiling.staging_peak_bytes,
        "peak allocated + staging",
    )?;
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
            e.peak_reserved_bytes as f64 / e.peak_allocated_bytes.max(1) as f64
        );
        print_tiling(&e.tiling);
    }
    Ok(())
}

/// `--max-memory B` that the predicted `peak` (device bytes: `what`) exceeds
/// is an error: `memory` answers whether the budget can be kept.
fn check_budget(max_memory: Option<u64>, peak: u64, what: &str) -> wgvae::Result<()> {
    match max_memory {
        Some(budget) if peak > budget => Err(wgvae::Error::OverBudget(format!(
            "--max-memory {budget} bytes ({:.1} MiB) cannot be kept: the predicted {what} is {peak} bytes ({:.1} MiB); raise --max-memory to at least {peak}, decode a smaller size, or use --tile exact with a smaller --tile-size",
            budget as f64 / 1048576.0,
            peak as f64 / 1048576.0
        ))),
        _ => Ok(()),
    }
}

/// `wgvae memory` of a streaming video decode (see
/// [`wgvae::estimate::Estimate::video_tiled`]), tiled as `decode` would tile it.
fn run_video(
    device_args: &crate::cli::DeviceArgs,
    a: &MemoryArgs,
    policy: Policy,
    load: &LoadOptions,
    size: (usize, usize),
) -> wgvae::Result<()> {
    let chunk = a.chunk.unwrap_or(wgvae::video::DEFAULT_CHUNK);
    if chunk == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--chunk 0: expected at least 1 latent frame per chunk".into(),
        ));
    }
    // Three chunks: the first (no caches), the second and a steady one;
    // every later chunk repeats the steady state.
    let bound = chunk.saturating_mul(3);
    let max_frames = wgvae::estimate::MAX_VIDEO_FRAMES;
    if a.frames.is_none() && bound > max_frames {
        return Err(wgvae::Error::InvalidInput(format!(
            "--chunk {chunk}: without --frames the estimate is for three chunks ({bound} latent frames), more than the {max_frames} an estimate takes; give --frames or a --chunk of at most {}",
            max_frames / 3
        )));
    }
    let frames = a.frames.unwrap_or(bound);
    if frames == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--frames must be at least 1 (latent frames of the video)".into(),
        ));
    }
    if a.encode || a.batch != 1 {
        return Err(wgvae::Error::InvalidInput(format!(
            "`{}` is a video decoder: its estimate is one streamed video (no --encode, --batch 1)",
            a.vae
        )));
    }
    // As `wgvae decode` of a video: exact, auto or off; blended tiles are
    // MiniMax-H3's reference tiling only (the library refuses them otherwise).
    let tiling = a.tiles.tiling()?;
    if tiling.tile_size.is_some() && tiling.mode == wgvae::TileMode::Off {
        return Err(wgvae::Error::InvalidInput(
            "--tile-size applies to --tile exact, fast (MiniMax-H3) or auto".into(),
        ));
    }
    let caps = if a.reference_gpu {
        wgvae::gpu::Capabilities::reference_gpu()
    } else {
        context(device_args)?.caps().clone()
    };
    let e = wgvae::estimate::Estimate::new(&caps, policy, &a.vae, load)
        .video_tiled(size, frames, chunk, &tiling)?;
    let b = e.breakdown();
    check_budget(
        tiling.max_memory,
        e.peak_allocated_bytes + e.staging_bytes,
        "peak allocated + read-back staging",
    )?;
    if a.json {
        let mut v = serde_json::to_value(&e).unwrap_or_default();
        v["device"] = json!(caps.adapter_name);
        v["op"] = json!("decode_video");
        v["frames_defaulted"] = json!(a.frames.is_none());
        v["breakdown"] = json!({
            "weights_bytes": b.weights,
            "cache_bytes": b.caches,
            "working_bytes": b.working,
        });
        println!("{v}");
    } else {
        let mib = |b: u64| b as f64 / 1048576.0;
        let tiles = match (e.tile_size, e.reference_tiles) {
            (Some(px), _) => format!(", exact tiles of {px} px"),
            (None, Some((px, ov))) => {
                format!(", the reference's tiles of {px} px overlapping by at least {ov} px")
            }
            _ => ", untiled".to_string(),
        };
        println!(
            "{} streaming video decode {}x{}, {} latent frames -> {} frames, chunks of {}{tiles} ({}, {} policy) on {}:",
            e.model, size.0, size.1, e.frames, e.output_frames, e.chunk, e.dtype, e.policy, caps.adapter_name
        );
        println!("  {:<28} {:>10}", "", "MiB");
        println!("  {:<28} {:>10.1}", "weights", mib(b.weights));
        println!("  {:<28} {:>10.1}", "time caches", mib(b.caches));
        println!("  {:<28} {:>10.1}", "chunk working memory", mib(b.working));
        println!(
            "  {:<28} {:>10.1}",
            "= peak allocated (pool)",
            mib(e.peak_allocated_bytes)
        );
        println!(
            "  {:<28} {:>10.1}",
            "peak reserved (pool)",
            mib(e.peak_reserved_bytes)
        );
        println!(
            "  {:<28} {:>10.1}",
            "+ staging (read-back, upload)",
            mib(e.staging_bytes)
        );
        println!(
            "  {:<28} {:>10.1}",
            "= device memory at the peak",
            mib(e.peak_allocated_bytes + e.staging_bytes)
        );
        println!("  time caches: what the caches hold at the peak; chunk working memory: the rest of the peak (activations of the chunk that peaks)");
        if let Some(clip) = e.clip_frames {
            println!(
                "  the decoder runs clip by clip ({clip} latent frames each, overlapping clips cross-faded): memory is bounded by one clip whatever the video's length"
            );
        } else if e.whole_clip {
            println!(
                "  the decoder is not causal: the whole clip of {} latent frames is one chunk, so a longer video peaks higher (exact tiles bound the working memory where the clip does not fit)",
                e.frames
            );
        } else if e.cache_grows {
            println!(
                "  the caches grow with the video (its attention keeps every earlier latent frame's keys and values): this is the peak of {} latent frames, a longer video peaks higher",
                e.frames
            );
        } else if e.independent_of_frames {
            println!(
                "  every video of {} or more latent frames in chunks of {} has this peak; shorter ones peak at most this{}",
                bound,
                e.chunk,
                if a.frames.is_none() { " (--frames not given: 3 chunks)" } else { "" }
            );
        } else {
            println!(
                "  a video of {} latent frames (fewer than 3 full chunks): longer ones may peak higher, up to the peak at --frames {bound}",
                e.frames
            );
        }
        if let Some(t) = &e.tiling {
            print_tiling(t);
        }
    }
    Ok(())
}
