//! `decode --vae TAEHV.safetensors` or `--vae WAN` (a Wan 2.1 VAE): video
//! latents streamed `--chunk` latent frames at a time (default 1) through a
//! [`VideoDecoder`] with double-buffered read-back, each frame written as it
//! arrives to the outputs asked for: PNGs (`--frames-out DIR`), a video
//! (`--video-out`: `.y4m` written here, `.mp4`/`.webm`/`.gif`/`.mkv`/`.mov`
//! piped to ffmpeg), the raw float32 output (`--save-raw`; TAEHV:
//! `N×T'×3×H×W` before the clamp, as taehv.py; Wan: `N×3×T'×H×W` after its
//! [−1, 1] clamp, as diffusers). Wan pipeline latents are un-normalised
//! unless --raw-latents. Memory stays constant in the video's length on the
//! host as on the device (Wan's channels-first --save-raw writes each
//! frame's planes at their offsets in the file).

use std::path::{Path, PathBuf};

use serde_json::json;
use wgvae::frames::LatencySummary;
use wgvae::gpu::Context;
use wgvae::io::{HostTensor, NpyStream};
use wgvae::kernels::image::{cpu_to_rgba8, ImageRange};
use wgvae::models::Precision;
use wgvae::tiling::TileMode;
use wgvae::y4m::{FrameRate, Y4mWriter};
use wgvae::{Error, VideoDecoder, VideoFrames, VideoLayout};

use super::super::ffmpeg::{self, FfmpegWriter, VIDEO_EXTS};
use super::super::interrupt;
use super::super::outputs::{check_file, remove_old_frames, write_atomically, Inputs, Staged};
use super::super::progress::frame_bar;
use super::super::{device, mib};
use super::{write_memory_snapshot, DecodeArgs};

fn bad(path: &Path, message: String) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message,
    }
}

/// Latents read from `path` as the `N×T×C×h×w` the decoder takes, from 5-D
/// latents in `layout`: every shape mistake named with the file, what was
/// expected, what was found and the fix.
pub(crate) fn video_latents(
    path: &Path,
    latents: HostTensor,
    layout: VideoLayout,
    model: &str,
    channels: usize,
) -> wgvae::Result<HostTensor> {
    let shape: [usize; 5] = match latents.shape[..] {
        [a, b, c, d, e] => [a, b, c, d, e],
        [_, c, _, _] if c == channels => {
            return Err(bad(
                path,
                format!(
                    "latents have shape {:?}: 4-D, an image latent (N×C×h×w); {model} is a video VAE and takes 5-D {} latents. One video of T latent frames is 1×T×C×h×w (numpy: `x[None]` on T×C×h×w); image latents decode with an image VAE",
                    latents.shape,
                    layout.describe()
                ),
            ))
        }
        _ => {
            return Err(bad(
                path,
                format!(
                    "latents have shape {:?} (rank {}); {model} is a video VAE and takes 5-D {} latents with C = {channels}",
                    latents.shape,
                    latents.shape.len(),
                    layout.describe()
                ),
            ))
        }
    };
    let [n, t, c, h, w] = layout.dims(shape);
    if c != channels {
        let other = match layout {
            VideoLayout::Ntchw => VideoLayout::Ncthw,
            VideoLayout::Ncthw => VideoLayout::Ntchw,
        };
        let fix = if other.dims(shape)[2] == channels {
            format!(
                "they look like {} ({}): pass --layout {}",
                other.name(),
                other.describe(),
                other.name()
            )
        } else {
            "are these latents for another VAE?".into()
        };
        return Err(bad(
            path,
            format!(
                "latents of shape {:?} read as {} ({}) have {c} channels; {model} takes {channels}: {fix}",
                latents.shape,
                layout.name(),
                layout.describe()
            ),
        ));
    }
    if t == 0 {
        return Err(bad(
            path,
            format!(
                "latents of shape {:?} ({}) hold no latent frames (T = 0); a video needs at least one",
                latents.shape,
                layout.describe()
            ),
        ));
    }
    if n == 0 || h == 0 || w == 0 {
        return Err(bad(
            path,
            format!(
                "latents of shape {:?} ({}) are empty: N = {n}, h = {h}, w = {w}",
                latents.shape,
                layout.describe()
            ),
        ));
    }
    if let Some((i, v)) = latents
        .data
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
    {
        return Err(bad(
            path,
            format!("latents hold {v} at flat index {i}: video latents must be finite"),
        ));
    }
    layout
        .to_ntchw(latents)
        .map_err(|e| bad(path, e.to_string()))
}

/// `OUT.mp4` for one video, `OUT_v.mp4` for video `v` of a batch.
fn video_path(out: &Path, v: usize, n: usize) -> PathBuf {
    wgvae::io::batch_paths(out, n)
        .into_iter()
        .nth(v)
        .unwrap_or_else(|| out.to_path_buf())
}

/// A `--video-out` being written: raw `.y4m`, or frames piped to ffmpeg.
enum VideoSink {
    Y4m(Y4mWriter<std::io::BufWriter<std::fs::File>>),
    Ffmpeg(FfmpegWriter),
}

impl VideoSink {
    fn write_frame(&mut self, frame: &[f32]) -> wgvae::Result<()> {
        match self {
            VideoSink::Y4m(w) => w.write_frame(frame),
            VideoSink::Ffmpeg(w) => w.write_frame(frame),
        }
    }

    /// Flushes (`.y4m`) or waits for ffmpeg to finish its file.
    fn finish(self) -> wgvae::Result<()> {
        match self {
            VideoSink::Y4m(w) => w.finish().map(drop),
            VideoSink::Ffmpeg(w) => w.finish(),
        }
    }
}

/// The outputs of one streamed decode, fed frame by frame.
struct Sinks {
    pngs: Option<PathBuf>,
    /// The sink first: dropped (an error, a signal), ffmpeg is stopped before
    /// the staged temporary file it writes is removed.
    video: Option<(VideoSink, Staged)>,
    npy: Option<(Staged, NpyStream<std::io::BufWriter<std::fs::File>>)>,
    written: Vec<PathBuf>,
    latency_ms: Vec<f64>,
    bar: Option<indicatif::ProgressBar>,
    range: ImageRange,
    /// `--save-raw` is channels-first (Wan `[N, 3, T', H, W]`): where the
    /// next frame's planes go.
    channels_first: Option<PlaneCursor>,
}

/// The next frame of a channels-first raw output: each of its three planes
/// is written where it belongs, so nothing waits on the host.
struct PlaneCursor {
    frames_per_video: usize,
    plane: usize,
    video: usize,
    frame: usize,
}

impl Sinks {
    /// Takes one chunk's frames `[T', 3, H, W]` of a video (PNGs go in `dir`).
    fn take(&mut self, got: &VideoFrames, dir: Option<&Path>) -> wgvae::Result<()> {
        let [f, c, h, w] = match got.frames.shape[..] {
            [f, c, h, w] => [f, c, h, w],
            _ => return Err(Error::Internal("video frames are not 4-D".into())),
        };
        let per = c * h * w;
        if let Some(dir) = dir {
            let rgba = cpu_to_rgba8(&got.frames.data, f, h, w, self.range);
            for (i, img) in rgba.chunks_exact(h * w * 4).enumerate() {
                let path = dir.join(format!("frame_{:05}.png", got.first + i));
                write_atomically(&path, "--frames-out", |out| {
                    wgvae::io::write_png_rgb_to(out, &path, w, h, img)
                })?;
                self.written.push(path);
            }
        }
        for frame in got.frames.data.chunks_exact(per) {
            if let Some((video, _)) = &mut self.video {
                video.write_frame(frame)?;
            }
            match (&mut self.channels_first, &mut self.npy) {
                (Some(at), Some((_, npy))) => {
                    for (ch, plane) in frame.chunks_exact(at.plane).enumerate() {
                        let i = ((at.video * 3 + ch) * at.frames_per_video + at.frame) * at.plane;
                        npy.write_at(i as u64, plane)?;
                    }
                    at.frame += 1;
                }
                (None, Some((_, npy))) => npy.write(frame)?,
                _ => {}
            }
            self.latency_ms.push(got.latency_ms);
            if let Some(bar) = &self.bar {
                bar.inc(1);
            }
        }
        Ok(())
    }

    /// Ends one video: a channels-first raw output moves to the next one.
    fn end_video(&mut self) {
        if let Some(at) = &mut self.channels_first {
            at.video += 1;
            at.frame = 0;
        }
    }
}

/// `decode` with a video decoder, TAEHV or Wan (see the module docs).
pub(crate) fn decode_video(
    ctx: &Context,
    a: &DecodeArgs,
    inputs: &Inputs,
    precision: Precision,
) -> wgvae::Result<()> {
    if a.frames_out.is_none() && a.video_out.is_none() && a.save_raw.is_none() {
        return Err(Error::InvalidInput(format!(
            "`{}` is a video decoder: give --frames-out DIR (PNG frames), --video-out OUT.mp4 (or .webm, .gif, .mkv, .mov through ffmpeg; .y4m without it) or --save-raw RAW.npy",
            a.vae
        )));
    }
    let tiling = a.tiles.tiling()?;
    if tiling.tile_size.is_some() && tiling.mode == TileMode::Off {
        return Err(Error::InvalidInput(
            "--tile-size applies to --tile exact, fast (MiniMax-H3) or auto".into(),
        ));
    }
    let rate: FrameRate = a.fps.parse()?;
    let layout_flag = a
        .layout
        .as_deref()
        .map(str::parse::<VideoLayout>)
        .transpose()?;
    let step = a.chunk.unwrap_or(wgvae::video::DEFAULT_CHUNK);
    if step == 0 {
        return Err(Error::InvalidInput("--chunk must be at least 1".into()));
    }
    let loaded = wgvae::Vae::load(
        ctx,
        &a.vae,
        &wgvae::models::LoadOptions {
            precision,
            seed: a.seed,
            ..Default::default()
        },
    )?;
    let dtype = loaded.dtype();
    let decoder = loaded.video_decoder("decoding video")?;
    // Exact tiles (or auto: exact when the untiled frame exceeds the budget
    // or a binding limit); blended fast tiles are a clip-based decoder's
    // reference tiling only (MiniMax-H3's default).
    if tiling.mode == TileMode::Fast && !decoder.clip_based() {
        return Err(Error::InvalidInput(
            "a video decode takes --tile exact (equal to untiled), auto or off, not --tile fast (MiniMax-H3's reference tiles only)"
                .into(),
        ));
    }
    if decoder.whole_clip() && a.chunk.is_some() {
        return Err(Error::InvalidInput(format!(
            "--chunk: the {} decoder is not causal (a frame depends on later ones), so it decodes each video's whole clip in one chunk; drop --chunk",
            decoder.name()
        )));
    }
    let layout = layout_flag.unwrap_or_else(|| decoder.latent_layout());
    let given = match a
        .latents
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_lowercase)
        .as_deref()
    {
        Some("npy") => wgvae::io::read_npy(&a.latents)?,
        Some("safetensors") => wgvae::io::read_safetensors_tensor(&a.latents, a.key.as_deref())?,
        _ => {
            return Err(bad(
                &a.latents,
                "unknown latent file type; expected .npy or .safetensors".into(),
            ))
        }
    };
    let given_shape = given.shape.clone();
    let latents = video_latents(
        &a.latents,
        given,
        layout,
        decoder.name(),
        decoder.latent_channels(),
    )?;
    let [n, t, c, h, w] = match latents.shape[..] {
        [n, t, c, h, w] => [n, t, c, h, w],
        _ => return Err(Error::Internal("video latents are not 5-D".into())),
    };
    let mut latents = latents;
    if !a.raw_latents {
        // N×T×C×h×w read as (N·T)×C×1×h×w: the same per-channel planes.
        latents.shape = vec![n * t, c, 1, h, w];
        loaded.unnormalize(&mut latents)?;
        latents.shape = vec![n, t, c, h, w];
    }
    // A batch writes OUT_0.mp4, OUT_1.mp4…: each checked before the decode.
    let container = a.video_out.as_deref().and_then(ffmpeg::container_of);
    let ffmpeg_exe = match (&a.video_out, container) {
        (Some(out), Some(_)) => Some(ffmpeg::find(a.ffmpeg.as_deref(), out)?),
        _ => None,
    };
    if let Some(out) = &a.video_out {
        for v in 0..n {
            check_file(&video_path(out, v, n), "--video-out", VIDEO_EXTS, inputs)?;
        }
    }
    let per_video = decoder.frames_for(t);
    let (height, width) = (h * decoder.upscale(), w * decoder.upscale());
    let mut sinks = Sinks {
        pngs: a.frames_out.clone(),
        video: None,
        npy: None,
        written: Vec::new(),
        latency_ms: Vec::with_capacity(n * per_video),
        bar: frame_bar(a.json, n * per_video),
        range: decoder.range(),
        channels_first: None,
    };
    // The raw output: one file for the batch, N×T'×3×H×W as taehv.py returns
    // it, or N×3×T'×H×W as diffusers' Wan decode does.
    if let Some(p) = &a.save_raw {
        let staged = Staged::new(p, "--save-raw")?;
        let shape = if decoder.channels_first() {
            sinks.channels_first = Some(PlaneCursor {
                frames_per_video: per_video,
                plane: height * width,
                video: 0,
                frame: 0,
            });
            [n, 3, per_video, height, width]
        } else {
            [n, per_video, 3, height, width]
        };
        let npy = NpyStream::new(staged.writer()?, p, &shape)?;
        sinks.npy = Some((staged, npy));
    }
    if let (Some(d), true) = (&a.frames_out, a.overwrite) {
        remove_old_frames(d)?;
    }
    let frame = c * h * w;
    let start = std::time::Instant::now();
    ctx.pool().reset_peak_stats();
    let mut videos = Vec::new();
    let mut chroma = None;
    // Exact tile side of the run (`None`: untiled).
    let mut tile_px = None;
    // A clip-based decoder's reference tiles (MiniMax-H3's default) where one tile does not cover a frame.
    let mut reference = None;
    for v in 0..n {
        let dir = match &sinks.pngs {
            Some(d) if n == 1 => Some(d.clone()),
            Some(d) => Some(d.join(format!("video_{v}"))),
            None => None,
        };
        if let Some(d) = &dir {
            std::fs::create_dir_all(d).map_err(|source| Error::Io {
                path: d.clone(),
                source,
            })?;
        }
        if let Some(out) = &a.video_out {
            let path = video_path(out, v, n);
            let staged = Staged::new(&path, "--video-out")?;
            let sink = match (container, &ffmpeg_exe) {
                (Some(container), Some(exe)) => {
                    chroma = Some(container.pixels);
                    VideoSink::Ffmpeg(FfmpegWriter::spawn(
                        exe,
                        container,
                        staged.temp_path()?,
                        &path,
                        width,
                        height,
                        rate,
                        decoder.range(),
                    )?)
                }
                _ => {
                    let y4m = Y4mWriter::new(
                        staged.writer()?,
                        &path,
                        width,
                        height,
                        rate,
                        decoder.range(),
                    )?;
                    chroma = Some(match y4m.chroma() {
                        wgvae::y4m::Chroma::C420Jpeg => "420jpeg",
                        wgvae::y4m::Chroma::C444 => "444",
                    });
                    VideoSink::Y4m(y4m)
                }
            };
            sinks.video = Some((sink, staged));
            videos.push(path);
        }
        let mut stream = VideoDecoder::new(ctx, &loaded)?;
        stream.set_tiling(tiling.clone())?;
        let step = if decoder.whole_clip() { t } else { step };
        for t0 in (0..t).step_by(step) {
            let t1 = (t0 + step).min(t);
            let at = (v * t + t0) * frame;
            let data = latents
                .data
                .get(at..at + (t1 - t0) * frame)
                .unwrap_or_default();
            // A signal stops the run here; the staged outputs remove their files.
            interrupt::check()?;
            let chunk = HostTensor::new(vec![t1 - t0, c, h, w], data.to_vec())?;
            // Chunk k is on the device's queue; the host takes chunk k − 1.
            if let Some(got) = stream.push(&chunk)? {
                sinks.take(&got, dir.as_deref())?;
            }
        }
        if let Some(got) = stream.finish()? {
            sinks.take(&got, dir.as_deref())?;
        }
        tile_px = tile_px.or(stream.tile_size());
        reference = reference.or(stream.reference_tiles((h, w)));
        sinks.end_video();
        if let Some((video, staged)) = sinks.video.take() {
            video.finish()?;
            staged.commit()?;
        }
    }
    if let Some((staged, npy)) = sinks.npy.take() {
        npy.finish()?;
        staged.commit()?;
    }
    if let Some(bar) = &sinks.bar {
        bar.finish_and_clear();
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let tiled_as = match (tile_px, reference) {
        (Some(_), _) => "exact",
        (None, Some(_)) => "reference",
        _ => "untiled",
    };
    ctx.save_pipeline_cache();
    write_memory_snapshot(ctx, a)?;
    let stats = ctx.pool().stats();
    let (peak, reserved) = (stats.allocated_bytes.peak, stats.reserved_bytes.peak);
    let frames = sinks.latency_ms.len();
    let fps = frames as f64 / (ms / 1e3);
    let latency = LatencySummary::of(&sinks.latency_ms);
    let chroma_name = chroma;
    if a.json {
        println!(
            "{}",
            json!({
                "adapter": ctx.caps().adapter_name,
                "backend": format!("{:?}", ctx.caps().backend),
                "model": decoder.name(),
                "dtype": dtype.name(),
                "cooperative_matrix": decoder.cooperative_matrix(),
                "latents_shape": given_shape,
                "layout": layout,
                "frames": frames,
                "frame_shape": [3, height, width],
                "chunk_latent_frames": step,
                "tiling": tiled_as,
                "tile_size": tile_px.or(reference.map(|r| r.0)),
                "decode_ms": ms,
                "frames_per_s": fps,
                "latency": latency,
                "peak_allocated_bytes": peak,
                "peak_reserved_bytes": reserved,
                "outputs": sinks.written,
                "video_out": videos,
                "video_fps": rate.fps(),
                "video_chroma": chroma_name,
                "raw": a.save_raw,
                "latents_stats_note": loaded.latents_stats_note(),
            })
        );
    } else {
        let mut wrote = Vec::new();
        if let Some(d) = &a.frames_out {
            wrote.push(format!("{} PNGs to {}", sinks.written.len(), d.display()));
        }
        for p in &videos {
            wrote.push(format!(
                "{} ({} fps, {})",
                p.display(),
                a.fps,
                chroma_name.unwrap_or("")
            ));
        }
        if let Some(p) = &a.save_raw {
            wrote.push(format!("{} (raw float32)", p.display()));
        }
        println!("wrote {}", wrote.join(", "));
        let tiles = match (tile_px, reference) {
            (Some(px), _) => format!(", exact tiles of {px} px"),
            (None, Some((px, ov))) => {
                format!(", the reference's tiles of {px} px overlapping by at least {ov} px")
            }
            _ => String::new(),
        };
        println!(
            "{} ({}): {frames} frames of {width}×{height} in {ms:.1} ms on {} (chunks of {step} latent frames{tiles}): {fps:.2} frames/s; latency per frame mean {:.1} ms, P99 {:.1} ms, max {:.1} ms; peak allocated {:.1} MiB",
            decoder.name(),
            a.vae,
            device(ctx),
            latency.mean_ms,
            latency.p99_ms,
            latency.max_ms,
            mib(peak)
        );
    }
    Ok(())
}
