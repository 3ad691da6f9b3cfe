//! `wgvae decode`: latents to PNGs, whole, tiled or streamed as frames.

use std::path::PathBuf;

use serde_json::json;
use wgvae::gpu::Context;
use wgvae::memory::Policy;
use wgvae::models::{Precision, TaehvDecoder, WeightStore};
use wgvae::tiling::TileMode;
use wgvae::{DecodeOptions, LoadOptions, Vae, VideoDecoder};

use super::outputs::{check_dir, check_file, write_atomically, Inputs};
use super::progress::progress_bar;
use super::tiles::{print_tiling, TileArgs};
use super::{context, device, mib};

#[path = "decode_wan.rs"]
mod wan;

#[derive(clap::Args)]
pub(crate) struct DecodeArgs {
    /// Latents: .npy (f32/f16) or .safetensors, N×C×h×w or C×h×w.
    latents: PathBuf,
    /// VAE: a diffusers folder, a .safetensors file (diffusers, LDM or TAE layout) or preset:NAME
    /// (sd15, sdxl, sd3, flux1 with seeded random weights). A TAEHV video decoder (taew2_1,
    /// taew2_2) decodes N×T×C×h×w video latents with --frames-out.
    #[arg(long)]
    vae: String,
    /// Output PNG (a batch writes OUT_0.png, OUT_1.png, …).
    #[arg(short, long, default_value = "out.png")]
    output: PathBuf,
    /// Also write the raw float32 decoder output N×3×H×W as .npy.
    #[arg(long)]
    save_raw: Option<PathBuf>,
    /// Latents are decoder input already: skip `/ scaling_factor + shift_factor`.
    #[arg(long)]
    raw_latents: bool,
    /// Tensor name inside a .safetensors latent file with several tensors.
    #[arg(long)]
    key: Option<String>,
    /// diffusers config.json for a weight file without one beside it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    scaling_factor: Option<f32>,
    #[arg(long)]
    shift_factor: Option<f32>,
    /// Seed of preset:NAME random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Memory pool policy: caching (PyTorch-like), planned or exact.
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Storage of weights and activations: f32, f16, bf16 or auto (f16 for models known to fit
    /// f16, else bf16). Arithmetic stays f32; an f16 overflow is detected and re-decoded in bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Per-kernel GPU time table (timestamp queries) and the record / GPU / readback split.
    #[arg(long)]
    profile: bool,
    /// Write the pool's segments and blocks after the decode as JSON.
    #[arg(long)]
    memory_snapshot: Option<PathBuf>,
    #[command(flatten)]
    tiles: TileArgs,
    /// Stream the frames of N×C×h×w latents (e.g. a video's) in batched chunks with
    /// double-buffered readback and write DIR/frame_00000.png, … (DIR is created).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["save_raw"])]
    frames_out: Option<PathBuf>,
    /// Frames per batched forward with --frames-out (default: the largest of at most
    /// ceil(N/4) that fits --max-memory and the device's limits); with a TAEHV video
    /// decoder, latent frames per streamed chunk (default 1).
    #[arg(long, value_name = "B", requires = "frames_out")]
    chunk: Option<usize>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// The decode's outputs checked against its inputs, before any work.
fn check_outputs(a: &DecodeArgs) -> wgvae::Result<Inputs> {
    let mut inputs = Inputs::default();
    inputs.add(&a.latents);
    inputs.add_vae(&a.vae, a.config.as_deref());
    match &a.frames_out {
        Some(dir) => check_dir(dir, "--frames-out", &inputs)?,
        // `-o NAME` without an extension writes NAME.png; `-o DIR/` is no name.
        None if a.output.is_dir() || a.output.to_string_lossy().ends_with(['/', '\\']) => {
            return Err(wgvae::Error::BadFile {
                path: a.output.clone(),
                message: "-o is a folder; give a file name inside it (e.g. DIR/out.png)".into(),
            });
        }
        None => {
            let first = &wgvae::io::batch_paths(&a.output, 1)[0];
            check_file(first, "-o", &["png"], &inputs)?;
        }
    }
    if let Some(p) = &a.save_raw {
        check_file(p, "--save-raw", &["npy"], &inputs)?;
    }
    if let Some(p) = &a.memory_snapshot {
        check_file(p, "--memory-snapshot", &["json"], &inputs)?;
    }
    Ok(inputs)
}

pub(crate) fn run(cli_adapter: &Option<String>, a: &DecodeArgs) -> wgvae::Result<()> {
    let inputs = check_outputs(a)?;
    // Flags before any work: a typo should not cost a model load.
    let policy: Policy = a.policy.parse()?;
    let tiling = a.tiles.tiling()?;
    let ctx = context(cli_adapter)?.with_pool(policy.new_pool());
    let load = LoadOptions {
        config: a.config.clone(),
        scaling_factor: a.scaling_factor,
        shift_factor: a.shift_factor,
        seed: a.seed,
        precision: a.dtype.parse()?,
    };
    let video = std::path::Path::new(&a.vae);
    if video.is_file() && TaehvDecoder::is_taehv_file(video) {
        return decode_video(&ctx, a, load.precision);
    }
    if wan::is_wan(&a.vae) {
        return wan::decode_wan(&ctx, a, load.precision);
    }
    let vae = Vae::load(&ctx, &a.vae, &load)?;
    if vae.random_weights && !a.json {
        eprintln!("note: {} — the image shows noise, not a picture", vae.name);
    }
    let latents = wgvae::io::load_latents(&a.latents, a.key.as_deref(), vae.latent_channels())?;
    if let Some(dir) = &a.frames_out {
        return decode_frames(&ctx, &vae, &latents, a, tiling, dir);
    }
    // A batch writes OUT_0.png, OUT_1.png…: each checked before the decode.
    let paths = wgvae::io::batch_paths(&a.output, latents.shape[0]);
    for p in &paths {
        check_file(p, "-o", &["png"], &inputs)?;
    }
    let opts = DecodeOptions {
        raw_latents: a.raw_latents,
        keep_raw: a.save_raw.is_some(),
        profile: a.profile,
        tiling,
        progress: progress_bar(a.json),
        keep_f16_overflow: false,
    };
    let out = wgvae::decode(&ctx, &vae, &latents, &opts)?;
    ctx.save_pipeline_cache();
    for (p, img) in paths.iter().zip(&out.rgba) {
        write_atomically(p, |t| {
            wgvae::io::write_png_rgb(t, out.width, out.height, img)
        })?;
    }
    if let (Some(p), Some(raw)) = (&a.save_raw, &out.raw) {
        write_atomically(p, |t| wgvae::io::write_npy(t, &raw.shape, &raw.data))?;
    }
    write_memory_snapshot(&ctx, a)?;
    let n = out.rgba.len();
    if a.json {
        println!(
            "{}",
            json_summary(
                &ctx,
                &vae,
                &latents,
                json!({
                    "image_shape": [n, 3, out.height, out.width],
                    "dtype": out.dtype.name(),
                    "f16_overflows": out.f16_overflows,
                    "precision_note": out.precision_note,
                    "decode_ms": out.decode_ms,
                    "weights_bytes": vae.weights_bytes,
                    "peak_allocated_bytes": out.memory.allocated_bytes.peak,
                    "peak_reserved_bytes": out.memory.reserved_bytes.peak,
                    "policy": ctx.pool().policy_name(),
                    "tiling": out.tiling,
                    "outputs": paths,
                    "raw": a.save_raw,
                    "timings": out.timings,
                    "macs": out.macs,
                    "profile": out.profile,
                })
            )
        );
    } else {
        for p in &paths {
            println!("wrote {}", p.display());
        }
        println!(
            "{}: {}×{} ×{n} in {:.1} ms on {}; peak allocated {:.1} MiB, reserved {:.1} MiB",
            vae.name,
            out.width,
            out.height,
            out.decode_ms,
            device(&ctx),
            mib(out.memory.allocated_bytes.peak),
            mib(out.memory.reserved_bytes.peak)
        );
        if a.profile {
            let t = &out.timings;
            println!(
                "record {:.1} ms, submit → GPU done {:.1} ms, readback {:.1} ms",
                t.record_ms, t.gpu_wait_ms, t.readback_ms
            );
            print_profile(out.profile.as_ref(), &ctx);
        }
        print_tiling(&out.tiling);
        if let Some(note) = &out.precision_note {
            println!("precision: {note}");
        } else if out.dtype != wgvae::tensor::DType::F32 {
            println!("precision: {} storage, f32 arithmetic", out.dtype.name());
        }
    }
    Ok(())
}

/// `decode --frames-out DIR`: streams the frames through `wgvae::frames` and
/// writes one PNG per frame as it arrives.
fn decode_frames(
    ctx: &Context,
    vae: &Vae,
    latents: &wgvae::io::HostTensor,
    a: &DecodeArgs,
    tiling: wgvae::tiling::Tiling,
    dir: &std::path::Path,
) -> wgvae::Result<()> {
    if !matches!(tiling.mode, TileMode::Auto | TileMode::Off)
        || tiling.tile_size.is_some()
        || tiling.overlap.is_some()
    {
        return Err(wgvae::Error::InvalidInput(
            "--frames-out decodes whole frames in batched chunks; it takes no --tile exact/fast, --tile-size or --tile-overlap (decode without --frames-out to tile)".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|source| wgvae::Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let opts = wgvae::FramesOptions {
        raw_latents: a.raw_latents,
        chunk: a.chunk,
        max_memory: tiling.max_memory,
        profile: a.profile,
    };
    let mut paths = Vec::with_capacity(latents.shape[0]);
    let on_frame = |f: wgvae::FrameOut<'_>| {
        let path = dir.join(format!("frame_{:05}.png", f.index));
        write_atomically(&path, |t| {
            wgvae::io::write_png_rgb(t, f.width, f.height, f.rgba)
        })?;
        paths.push(path);
        Ok(())
    };
    let report = wgvae::decode_frames(ctx, vae, latents, &opts, on_frame)?;
    ctx.save_pipeline_cache();
    write_memory_snapshot(ctx, a)?;
    let r = &report;
    if a.json {
        println!(
            "{}",
            json_summary(
                ctx,
                vae,
                latents,
                json!({
                    "image_shape": [r.frames, 3, r.height, r.width],
                    "dtype": vae.dtype.name(),
                    "f16_overflows": r.f16_overflows,
                    "decode_ms": r.total_ms,
                    "weights_bytes": vae.weights_bytes,
                    "peak_allocated_bytes": r.peak_allocated_bytes,
                    "peak_reserved_bytes": r.peak_reserved_bytes,
                    "policy": ctx.pool().policy_name(),
                    "outputs": paths,
                    "frames": report,
                })
            )
        );
    } else {
        println!(
            "wrote {} frames to {} (frame_00000.png … frame_{:05}.png)",
            r.frames,
            dir.display(),
            r.frames - 1
        );
        println!(
            "{}: {} frames of {}×{} in chunks of {} ({} chunks) in {:.1} ms on {}: {:.3} frames/s",
            vae.name,
            r.frames,
            r.width,
            r.height,
            r.chunk,
            r.chunks,
            r.total_ms,
            device(ctx),
            r.frames_per_s
        );
        println!(
            "latency per frame: mean {:.1} ms, P99 {:.1} ms, max {:.1} ms; host: recording {:.1} ms, in submit {:.1} ms, blocked on the device {:.1} ms, writing PNGs {:.1} ms",
            r.latency.mean_ms, r.latency.p99_ms, r.latency.max_ms, r.record_ms, r.submit_ms, r.wait_ms, r.callback_ms
        );
        if r.f16_overflows > 0 {
            println!(
                "f16 overflow: {} values beyond ±65504 (or NaN); {} of {} frames re-decoded in bf16",
                r.f16_overflows, r.redone_frames, r.frames
            );
        }
        println!(
            "peak allocated {:.1} MiB, reserved {:.1} MiB, readback staging {:.1} MiB",
            mib(r.peak_allocated_bytes),
            mib(r.peak_reserved_bytes),
            mib(r.staging_bytes)
        );
        if a.profile {
            print_profile(r.profile.as_ref(), ctx);
        }
    }
    Ok(())
}

/// The per-kernel table, or why there is none.
/// `decode --vae TAEHV.safetensors --frames-out DIR`: video latents
/// (N×T×C×h×w or T×C×h×w) streamed `--chunk` latent frames at a time
/// (default 1) through a [`VideoDecoder`], each frame written as it arrives
/// (`DIR/frame_00000.png`, …; one `DIR/video_N/` per video of a batch).
fn decode_video(ctx: &Context, a: &DecodeArgs, precision: Precision) -> wgvae::Result<()> {
    let Some(dir) = &a.frames_out else {
        return Err(wgvae::Error::InvalidInput(format!(
            "`{}` is a TAEHV video decoder: give --frames-out DIR for its frames",
            a.vae
        )));
    };
    let tiling = a.tiles.tiling()?;
    if !matches!(tiling.mode, TileMode::Auto | TileMode::Off) || tiling.tile_size.is_some() {
        return Err(wgvae::Error::InvalidInput(
            "a TAEHV video decode runs untiled: it takes no --tile exact/fast or --tile-size"
                .into(),
        ));
    }
    let store = WeightStore::from_safetensors(std::path::Path::new(&a.vae))?;
    store.set_dtype(precision.resolve(true));
    let decoder = TaehvDecoder::load(ctx, &store)?;
    drop(store);
    let latents = match a
        .latents
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_lowercase)
        .as_deref()
    {
        Some("npy") => wgvae::io::read_npy(&a.latents)?,
        Some("safetensors") => wgvae::io::read_safetensors_tensor(&a.latents, a.key.as_deref())?,
        _ => {
            return Err(wgvae::Error::BadFile {
                path: a.latents.clone(),
                message: "unknown latent file type; expected .npy or .safetensors".into(),
            })
        }
    };
    let [n, t, c, h, w] = match latents.shape[..] {
        [n, t, c, h, w] => [n, t, c, h, w],
        [t, c, h, w] => [1, t, c, h, w],
        _ => {
            return Err(wgvae::Error::BadFile {
                path: a.latents.clone(),
                message: format!(
                    "TAEHV video latents are N×T×C×h×w or T×C×h×w, got shape {:?}",
                    latents.shape
                ),
            })
        }
    };
    let step = a.chunk.unwrap_or(1);
    if step == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--chunk must be at least 1".into(),
        ));
    }
    let frame = c * h * w;
    let start = std::time::Instant::now();
    ctx.pool().reset_peak_stats();
    let mut paths = Vec::new();
    let (mut width, mut height) = (0, 0);
    for v in 0..n {
        let out = if n == 1 {
            dir.clone()
        } else {
            dir.join(format!("video_{v}"))
        };
        std::fs::create_dir_all(&out).map_err(|source| wgvae::Error::Io {
            path: out.clone(),
            source,
        })?;
        let mut stream = VideoDecoder::new(ctx, &decoder);
        let mut index = 0;
        for t0 in (0..t).step_by(step) {
            let t1 = (t0 + step).min(t);
            let at = (v * t + t0) * frame;
            let data = latents
                .data
                .get(at..at + (t1 - t0) * frame)
                .unwrap_or_default();
            let chunk = wgvae::io::HostTensor::new(vec![t1 - t0, c, h, w], data.to_vec())?;
            let frames = stream.decode(&chunk)?;
            let [f, _, fh, fw] = frames.shape[..] else {
                continue;
            };
            (width, height) = (fw, fh);
            let range = wgvae::kernels::image::ImageRange::ZeroToOne;
            let rgba = wgvae::kernels::image::cpu_to_rgba8(&frames.data, f, fh, fw, range);
            for img in rgba.chunks_exact(fh * fw * 4) {
                let path = out.join(format!("frame_{index:05}.png"));
                write_atomically(&path, |p| wgvae::io::write_png_rgb(p, fw, fh, img))?;
                paths.push(path);
                index += 1;
            }
        }
    }
    ctx.save_pipeline_cache();
    write_memory_snapshot(ctx, a)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let peak = ctx.pool().stats().allocated_bytes.peak;
    if a.json {
        println!(
            "{}",
            json!({
                "adapter": ctx.caps().adapter_name,
                "backend": format!("{:?}", ctx.caps().backend),
                "model": decoder.variant_name(),
                "latents_shape": latents.shape,
                "frames": paths.len(),
                "frame_shape": [3, height, width],
                "chunk_latent_frames": step,
                "decode_ms": ms,
                "frames_per_s": paths.len() as f64 / (ms / 1e3),
                "peak_allocated_bytes": peak,
                "outputs": paths,
            })
        );
    } else {
        println!(
            "{} ({}): wrote {} frames of {width}×{height} to {} in {ms:.1} ms on {} (chunks of {step} latent frames); peak allocated {:.1} MiB",
            decoder.variant_name(),
            a.vae,
            paths.len(),
            dir.display(),
            device(ctx),
            mib(peak)
        );
    }
    Ok(())
}

fn write_memory_snapshot(ctx: &Context, a: &DecodeArgs) -> wgvae::Result<()> {
    if let Some(p) = &a.memory_snapshot {
        write_atomically(p, |t| {
            std::fs::write(t, ctx.pool().snapshot().to_json()).map_err(|source| wgvae::Error::Io {
                path: p.clone(),
                source,
            })
        })?;
    }
    Ok(())
}

/// The `--json` summary: the fields both decode paths share, then `rest`.
fn json_summary(
    ctx: &Context,
    vae: &Vae,
    latents: &wgvae::io::HostTensor,
    rest: serde_json::Value,
) -> serde_json::Value {
    let mut summary = json!({
        "adapter": ctx.caps().adapter_name,
        "backend": format!("{:?}", ctx.caps().backend),
        "model": vae.name,
        "random_weights": vae.random_weights,
        "latents_shape": latents.shape,
    });
    if let (Some(all), serde_json::Value::Object(rest)) = (summary.as_object_mut(), rest) {
        all.extend(rest);
    }
    summary
}

pub(crate) fn print_profile(profile: Option<&wgvae::gpu::Profile>, ctx: &Context) {
    match profile {
        Some(p) if !p.kernels.is_empty() => print!("{}", p.table()),
        Some(_) => println!("(profile empty: no kernel was timed)"),
        None if !ctx.caps().timestamp_inside_passes => {
            println!("(no per-kernel times: the adapter cannot write timestamps inside passes)")
        }
        None => println!("(no per-kernel times recorded)"),
    }
}
