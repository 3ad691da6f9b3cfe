//! `wgvae decode`: latents to PNGs, whole, tiled or streamed as frames.

use std::path::PathBuf;

use serde_json::json;
use wgvae::gpu::Context;
use wgvae::memory::Policy;
use wgvae::tiling::TileMode;
use wgvae::{DecodeOptions, LoadOptions, Vae};

mod video;

use video::decode_video;

use super::ffmpeg::VIDEO_EXTS;
use super::outputs::{check_dir, check_file, remove_old_frames, write_atomically, Inputs};
use super::progress::Activity;
use super::tiles::{print_tiling, TileArgs};
use super::{context, device, mib};

#[derive(clap::Args)]
pub(crate) struct DecodeArgs {
    /// Latents: .npy (f32/f16), .safetensors or a ComfyUI .latent; N×C×h×w or C×h×w maps
    /// (FLUX.2: its 128-channel pipeline maps), or a packed token sequence N×L×F (FLUX.1: F = 64,
    /// FLUX.2: F = 128; give --size unless the token grid is square).
    latents: PathBuf,
    /// Image size in pixels, HxW, for packed token latents (N×L×F) whose grid is not square.
    #[arg(long, value_name = "HxW")]
    size: Option<String>,
    /// VAE: a diffusers folder, a .safetensors file (diffusers, LDM or TAE layout) or preset:NAME
    /// (sd15, sdxl, sd3, flux1, flux2, flux2-small with seeded random weights). A video decoder (TAEHV: taew2_1,
    /// taew2_2, N×T×C×h×w latents; Wan 2.1 / 2.2, HunyuanVideo 1.5, LTX-2 and MiniMax-H3 VAEs: a
    /// diffusers folder, a single file or preset:wan21 / wan22 / hunyuanvideo15 / ltx2 /
    /// minimax-h3, N×C×T×h×w) writes
    /// --frames-out, --video-out and/or --save-raw.
    #[arg(long)]
    vae: String,
    /// Output PNG (a batch writes OUT_0.png, OUT_1.png, …): RGB, or RGBA for a 4-channel
    /// model (Qwen-Image 2.1).
    #[arg(short, long, default_value = "out.png")]
    output: PathBuf,
    /// Also write the raw float32 decoder output as .npy: N×C×H×W (image VAE; C = 4 for
    /// Qwen-Image 2.1's RGBA, as diffusers' `decode(z).sample[:, :, 0]`), N×T'×3×H×W
    /// before the clamp (TAEHV), N×3×T'×H×W after the [-1, 1] clamp (Wan, diffusers' layout).
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
    /// Override the VAE's `scaling_factor` (pipeline latents are divided by it before decoding).
    #[arg(long)]
    scaling_factor: Option<f32>,
    /// Override the VAE's `shift_factor` (added after the division; SD3 / FLUX.1 have one).
    #[arg(long)]
    shift_factor: Option<f32>,
    /// Seed of preset:NAME random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Memory pool policy: caching (PyTorch-like), planned or exact.
    #[arg(long, default_value = "planned")]
    policy: String,
    /// Storage of weights and activations: f32, f16, bf16 or auto (the default: f32 on a CPU
    /// adapter; on a GPU f16 for models known to fit f16, else bf16). Arithmetic stays f32; an
    /// f16 overflow is detected and re-decoded in bf16.
    #[arg(long, default_value = "auto")]
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
    #[arg(long, value_name = "DIR")]
    frames_out: Option<PathBuf>,
    /// With --frames-out DIR holding files: remove its frame_*.png (and video_*/frame_*.png)
    /// from an earlier run before writing (other files stay). Without it, a non-empty DIR is
    /// an error, so frames of two runs are never mixed.
    #[arg(long)]
    overwrite: bool,
    /// Frames per batched forward with --frames-out (default: the largest of at most
    /// ceil(N/4) that fits --max-memory and the device's limits); with a video
    /// decoder (TAEHV or Wan), latent frames per streamed chunk (default 1).
    #[arg(long, value_name = "B")]
    chunk: Option<usize>,
    /// Video decoders: write the frames as a video, frame by frame as they are decoded.
    /// .mp4 / .mkv / .mov (H.264, yuv420p, CRF 18), .webm (VP9) and .gif (one palette) are
    /// encoded by ffmpeg (--ffmpeg, WGVAE_FFMPEG or PATH); .y4m is raw YUV4MPEG2 (BT.601 full
    /// range, 4:2:0 when width and height are even, else 4:4:4) and needs nothing. A batch of
    /// N videos writes OUT_0.mp4, OUT_1.mp4, ….
    #[arg(long, value_name = "OUT.mp4|webm|gif|mkv|mov|y4m")]
    video_out: Option<PathBuf>,
    /// The ffmpeg executable that encodes --video-out .mp4/.webm/.gif/.mkv/.mov (default: the
    /// WGVAE_FFMPEG environment variable, else `ffmpeg` on PATH).
    #[arg(long, value_name = "PATH")]
    ffmpeg: Option<PathBuf>,
    /// Frame rate of --video-out, 0.001 to 10000 fps: 16 (Wan's), 24, 12.5, a ratio
    /// (24000/1001), or an NTSC rate as a decimal (23.976, 29.97, 59.94 → N·1000/1001).
    #[arg(long, default_value = "16", value_name = "RATE")]
    fps: String,
    /// Axis order of 5-D video latents: ntchw (N×T×C×h×w) or ncthw (N×C×T×h×w).
    /// Default: the model's own (TAEHV: ntchw; Wan: ncthw).
    #[arg(long, value_name = "ntchw|ncthw")]
    layout: Option<String>,
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
        Some(dir) => check_dir(dir, "--frames-out", &inputs, a.overwrite)?,
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
    if let Some(p) = &a.video_out {
        check_file(p, "--video-out", VIDEO_EXTS, &inputs)?;
        // ffmpeg found, started and holding the encoder before any work.
        if let Some(container) = super::ffmpeg::container_of(p) {
            let exe = super::ffmpeg::find(a.ffmpeg.as_deref(), p)?;
            super::ffmpeg::check(&exe, container, p)?;
        }
    }
    if let (Some(exe), false) = (
        &a.ffmpeg,
        a.video_out
            .as_deref()
            .is_some_and(|p| super::ffmpeg::container_of(p).is_some()),
    ) {
        return Err(wgvae::Error::InvalidInput(format!(
            "--ffmpeg `{}` encodes --video-out .mp4, .webm, .gif, .mkv or .mov; this run writes none: drop --ffmpeg or give such a --video-out",
            exe.display()
        )));
    }
    if let Some(p) = &a.memory_snapshot {
        check_file(p, "--memory-snapshot", &["json"], &inputs)?;
    }
    Ok(inputs)
}

pub(crate) fn run(device_args: &crate::cli::DeviceArgs, a: &DecodeArgs) -> wgvae::Result<()> {
    let inputs = check_outputs(a)?;
    // Flags before any work: a typo should not cost a model load.
    if a.overwrite && a.frames_out.is_none() {
        return Err(wgvae::Error::InvalidInput(
            "--overwrite applies to --frames-out DIR (other outputs are always replaced whole): add --frames-out or drop --overwrite".into(),
        ));
    }
    let policy: Policy = a.policy.parse()?;
    let tiling = a.tiles.tiling()?;
    let precision = a.dtype.parse()?;
    // A video decoder is told by its file's header alone, before the device starts.
    // (A Wan-keyed file with a Qwen-Image --config decodes images.)
    let is_video = wgvae::video::is_video_vae(&a.vae)
        && !wgvae::models::qwen_image::is_qwen_image(&a.vae, a.config.as_deref());
    // Video-only flags on what is not a video decoder: refused once the
    // model has loaded as an image VAE (a damaged or unknown file gets its
    // own error first).
    let video_only = [
        ("--video-out", a.video_out.is_some()),
        ("--layout", a.layout.is_some()),
        ("--fps", a.fps != "16"),
    ]
    .into_iter()
    .find(|(_, given)| *given)
    .map(|(flag, _)| flag);
    if !is_video {
        if a.chunk.is_some() && a.frames_out.is_none() {
            return Err(wgvae::Error::InvalidInput(
                "--chunk sets the frames per batched forward of --frames-out DIR: add --frames-out"
                    .into(),
            ));
        }
        if a.frames_out.is_some() && a.save_raw.is_some() {
            return Err(wgvae::Error::InvalidInput(
                "--frames-out writes PNGs only with an image VAE; drop --save-raw (or decode without --frames-out to save the raw output)".into(),
            ));
        }
    }
    if is_video {
        // Image-only flags on a video decoder: refused rather than ignored.
        let image_only = [
            ("--config", a.config.is_some()),
            ("--scaling-factor", a.scaling_factor.is_some()),
            ("--shift-factor", a.shift_factor.is_some()),
            ("--profile", a.profile),
            ("--tile-mid-block", a.tiles.tile_mid_block),
        ];
        if let Some((flag, _)) = image_only.iter().find(|(_, given)| *given) {
            return Err(wgvae::Error::InvalidInput(format!(
                "{flag} applies to image VAEs; `{}` is a video decoder, which streams in constant memory (`wgvae memory --vae {} --size HxW --frames T` predicts it; Wan pipeline latents are un-normalised with the VAE's own config, --raw-latents skips that)",
                a.vae, a.vae
            )));
        }
    }
    let size = a.size.as_deref().map(parse_size).transpose()?;
    if is_video && size.is_some() {
        return Err(wgvae::Error::InvalidInput(
            "--size gives the image size of packed token latents (N×L×F) for image VAEs; video latents are N×C×T×h×w or N×T×C×h×w".into(),
        ));
    }
    let ctx = context(device_args)?.with_pool(policy.new_pool());
    if is_video {
        return decode_video(&ctx, a, &inputs, precision);
    }
    let load = LoadOptions {
        config: a.config.clone(),
        scaling_factor: a.scaling_factor,
        shift_factor: a.shift_factor,
        seed: a.seed,
        precision,
    };
    let vae = Vae::load_image_decoder(&ctx, &a.vae, &load)?;
    if let Some(flag) = video_only {
        return Err(wgvae::Error::InvalidInput(format!(
            "{flag} is for video decoders (TAEHV: taew2_1, taew2_2; Wan 2.1 / 2.2, HunyuanVideo 1.5, LTX-2, MiniMax-H3); `{}` is an image VAE ({}): write its frames with --frames-out DIR",
            a.vae, vae.name()
        )));
    }
    if vae.random_weights() && !a.json {
        eprintln!(
            "note: {} — the image shows noise, not a picture",
            vae.name()
        );
    }
    let file = wgvae::io::read_latent_file(&a.latents, a.key.as_deref())?;
    // A ComfyUI .latent holds the VAE's own latents: raw z, except FLUX.2's
    // BatchNorm-normalised 128-channel maps (ComfyUI's FLUX.2 VAE normalises inside).
    let raw = a.raw_latents || (file.comfyui && vae.flux2().is_none());
    let latents = vae
        .decoder_input(&file.tensor, raw, size)
        .map_err(|e| match e {
            wgvae::Error::InvalidInput(message) => wgvae::Error::BadFile {
                path: a.latents.clone(),
                message,
            },
            e => e,
        })?;
    if let Some(dir) = &a.frames_out {
        return decode_frames(&ctx, &vae, &latents, a, tiling, dir);
    }
    // A batch writes OUT_0.png, OUT_1.png…: each checked before the decode.
    let paths = wgvae::io::batch_paths(&a.output, latents.shape[0]);
    for p in &paths {
        check_file(p, "-o", &["png"], &inputs)?;
    }
    let activity = Activity::start(a.json, "decoding", ctx.pipelines());
    let opts = DecodeOptions {
        // Un-normalised (and unpacked) above.
        raw_latents: true,
        keep_raw: a.save_raw.is_some(),
        profile: a.profile,
        tiling,
        progress: Some(activity.progress()),
        keep_f16_overflow: false,
    };
    let out = wgvae::decode(&ctx, &vae, &latents, &opts);
    drop(activity);
    let out = out?;
    super::interrupt::check()?;
    ctx.save_pipeline_cache();
    for (p, img) in paths.iter().zip(&out.rgba) {
        write_atomically(p, "-o", |w| {
            wgvae::io::write_png_to(w, p, out.width, out.height, img, out.channels)
        })?;
    }
    if let (Some(p), Some(raw)) = (&a.save_raw, &out.raw) {
        write_atomically(p, "--save-raw", |w| {
            wgvae::io::write_npy_to(w, p, &raw.shape, &raw.data)
        })?;
    }
    write_memory_snapshot(&ctx, a)?;
    let n = out.rgba.len();
    if a.json {
        println!(
            "{}",
            json_summary(
                &ctx,
                &vae,
                &file.tensor,
                json!({
                    "image_shape": [n, out.channels, out.height, out.width],
                    "dtype": out.dtype.name(),
                    // A decode redone in bf16 after an f16 overflow ran the scalar twin.
                    "cooperative_matrix": if out.dtype == vae.dtype() { vae.cooperative_matrix() } else { None },
                    "f16_overflows": out.f16_overflows,
                    "precision_note": out.precision_note,
                    "decode_ms": out.decode_ms,
                    "weights_bytes": vae.weights_bytes(),
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
            vae.name(),
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
    if a.overwrite {
        remove_old_frames(dir)?;
    }
    let opts = wgvae::FramesOptions {
        // Un-normalised (and unpacked) by `run`.
        raw_latents: true,
        chunk: a.chunk,
        max_memory: tiling.max_memory,
        profile: a.profile,
    };
    let mut paths = Vec::with_capacity(latents.shape[0]);
    let on_frame = |f: wgvae::FrameOut<'_>| {
        super::interrupt::check()?;
        let path = dir.join(format!("frame_{:05}.png", f.index));
        write_atomically(&path, "--frames-out", |w| {
            wgvae::io::write_png_to(w, &path, f.width, f.height, f.rgba, f.channels)
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
                    "image_shape": [r.frames, vae.image_channels(), r.height, r.width],
                    "dtype": vae.dtype().name(),
                    "f16_overflows": r.f16_overflows,
                    "decode_ms": r.total_ms,
                    "weights_bytes": vae.weights_bytes(),
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
            vae.name(),
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

fn write_memory_snapshot(ctx: &Context, a: &DecodeArgs) -> wgvae::Result<()> {
    if let Some(p) = &a.memory_snapshot {
        write_atomically(p, "--memory-snapshot", |w| {
            std::io::Write::write_all(w, ctx.pool().snapshot().to_json().as_bytes()).map_err(
                |source| wgvae::Error::Io {
                    path: p.clone(),
                    source,
                },
            )
        })?;
    }
    Ok(())
}

/// The `--json` summary: the fields both decode paths share, then `rest`.
/// `--size HxW` (or `N`: square), in image pixels.
fn parse_size(s: &str) -> wgvae::Result<(usize, usize)> {
    let bad = || {
        wgvae::Error::InvalidInput(format!(
            "--size `{s}`: expected HxW in image pixels (e.g. 1024x768)"
        ))
    };
    let (h, w) = s.split_once(['x', 'X']).unwrap_or((s, s));
    let h: usize = h.trim().parse().map_err(|_| bad())?;
    let w: usize = w.trim().parse().map_err(|_| bad())?;
    if h == 0 || w == 0 {
        return Err(bad());
    }
    Ok((h, w))
}

fn json_summary(
    ctx: &Context,
    vae: &Vae,
    latents: &wgvae::io::HostTensor,
    rest: serde_json::Value,
) -> serde_json::Value {
    let mut summary = json!({
        "adapter": ctx.caps().adapter_name,
        "backend": format!("{:?}", ctx.caps().backend),
        "model": vae.name(),
        "random_weights": vae.random_weights(),
        "latents_shape": latents.shape,
        "cooperative_matrix": vae.cooperative_matrix(),
    });
    if let (Some(all), serde_json::Value::Object(rest)) = (summary.as_object_mut(), rest) {
        all.extend(rest);
    }
    summary
}

/// The per-kernel table, or why there is none.
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
