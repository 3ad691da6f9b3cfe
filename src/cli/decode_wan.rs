//! `wgvae decode --vae WAN --frames-out DIR`: Wan 2.1 VAE video latents
//! (N×C×T×h×w or C×T×h×w, pipeline latents un-normalised with the config's
//! `latents_mean`/`latents_std` unless --raw-latents) streamed in chunks of
//! --chunk latent frames (default 1) to frame PNGs.

use serde_json::json;
use wgvae::gpu::Context;
use wgvae::models::{Precision, WanDecoder};
use wgvae::tiling::TileMode;
use wgvae::VideoDecoder;

use super::super::outputs::write_atomically;
use super::super::{device, mib};
use super::{write_memory_snapshot, DecodeArgs};

/// True when `--vae` names a Wan VAE (preset:wan21, a diffusers folder
/// whose config is `AutoencoderKLWan`, or a file with Wan keys).
pub(super) fn is_wan(vae: &str) -> bool {
    vae == "preset:wan21" || WanDecoder::is_wan(std::path::Path::new(vae))
}

pub(super) fn decode_wan(ctx: &Context, a: &DecodeArgs, precision: Precision) -> wgvae::Result<()> {
    let Some(dir) = &a.frames_out else {
        return Err(wgvae::Error::InvalidInput(format!(
            "`{}` is a Wan video VAE: give --frames-out DIR for its frames",
            a.vae
        )));
    };
    let tiling = a.tiles.tiling()?;
    if !matches!(tiling.mode, TileMode::Auto | TileMode::Off) || tiling.tile_size.is_some() {
        return Err(wgvae::Error::InvalidInput(
            "a Wan video decode runs untiled: it takes no --tile exact/fast or --tile-size".into(),
        ));
    }
    let decoder = WanDecoder::open(ctx, &a.vae, precision.resolve(false), a.seed)?;
    let mut latents = match a
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
    if latents.shape.len() == 4 {
        latents.shape.insert(0, 1);
    }
    let [n, c, t, h, w] = match latents.shape[..] {
        [n, c, t, h, w] => [n, c, t, h, w],
        _ => {
            return Err(wgvae::Error::BadFile {
                path: a.latents.clone(),
                message: format!(
                    "Wan video latents are N×C×T×h×w or C×T×h×w, got shape {:?}",
                    latents.shape
                ),
            })
        }
    };
    if c != decoder.latent_channels() || t == 0 {
        return Err(wgvae::Error::BadFile {
            path: a.latents.clone(),
            message: format!(
                "Wan video latents are N×C×T×h×w with C = {} and T ≥ 1, got shape {:?}",
                decoder.latent_channels(),
                latents.shape
            ),
        });
    }
    if !a.raw_latents {
        decoder.unnormalize(&mut latents)?;
    }
    let step = a.chunk.unwrap_or(1);
    if step == 0 {
        return Err(wgvae::Error::InvalidInput(
            "--chunk must be at least 1".into(),
        ));
    }
    let start = std::time::Instant::now();
    ctx.pool().reset_peak_stats();
    let mut paths = Vec::new();
    let (mut width, mut height) = (0, 0);
    let plane = h * w;
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
            // [C, T, h, w] of this video → the chunk's [T, C, h, w].
            let mut data = Vec::with_capacity((t1 - t0) * c * plane);
            for f in t0..t1 {
                for ch in 0..c {
                    let at = ((v * c + ch) * t + f) * plane;
                    data.extend_from_slice(latents.data.get(at..at + plane).unwrap_or_default());
                }
            }
            let chunk = wgvae::io::HostTensor::new(vec![t1 - t0, c, h, w], data)?;
            let frames = stream.decode(&chunk)?;
            let [f, _, fh, fw] = frames.shape[..] else {
                continue;
            };
            (width, height) = (fw, fh);
            let range = wgvae::kernels::image::ImageRange::MinusOneToOne;
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
                "model": decoder.name,
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
            "{}: wrote {} frames of {width}×{height} to {} in {ms:.1} ms on {} (chunks of {step} latent frames); peak allocated {:.1} MiB",
            decoder.name,
            paths.len(),
            dir.display(),
            device(ctx),
            mib(peak)
        );
    }
    Ok(())
}
