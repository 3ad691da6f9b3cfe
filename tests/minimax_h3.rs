//! The MiniMax-H3 video VAE decoder (a ViT over each clip's latent voxels)
//! against diffusers 0.42.1's `AutoencoderKLMiniMaxH3` on the
//! `minimax-h3-tiny` golden (seeded random weights, f32 CPU, clip_length 9,
//! token_drop 1): the whole video (two overlapping clips cross-faded, the
//! latent padded at its end), streamed in chunks of 1 and 2 latent frames,
//! f16 / bf16, pipeline latents, and bad inputs.

use std::path::PathBuf;

use wgvae::io::{read_npy, HostTensor};
use wgvae::models::minimax_h3::MiniMaxH3Decoder;
use wgvae::testing::{
    channels_first, error_message, max_abs_diff, ncthw_chunk, shared_dir, test_context,
};
use wgvae::{decode_video, Context, VideoDecoder};

/// f32 against diffusers' f32 CPU decode (the bound is 1e-3).
const TOLERANCE: f32 = 1e-4;
/// f16, bf16 bounds against the f32 golden (measured, then about 3× that).
const HALF_BOUND: (f32, f32) = (2.5e-2, 1.3e-1);

fn golden() -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join("minimax-h3-tiny"))
}

fn open(ctx: &Context, dir: &std::path::Path, dtype: wgvae::DType) -> wgvae::Vae {
    wgvae::Vae::from(MiniMaxH3Decoder::open(ctx, dir.to_str().unwrap(), dtype, 0).unwrap())
}

/// Latents `[1, C, T, h, w]` pushed `size` latent frames at a time, then
/// finished: every frame, `[T', 3, H, W]`, and how many each call gave.
fn stream(ctx: &Context, dec: &wgvae::Vae, z: &HostTensor, size: usize) -> (Vec<f32>, Vec<usize>) {
    let t = z.shape[2];
    let mut s = VideoDecoder::new(ctx, dec).unwrap();
    let (mut frames, mut counts) = (Vec::new(), Vec::new());
    for t0 in (0..t).step_by(size) {
        let got = s.push(&ncthw_chunk(z, t0, (t0 + size).min(t))).unwrap();
        counts.push(got.as_ref().map_or(0, |f| f.frames.shape[0]));
        if let Some(f) = got {
            frames.extend(f.frames.data);
        }
    }
    let last = s.finish().unwrap();
    counts.push(last.as_ref().map_or(0, |f| f.frames.shape[0]));
    frames.extend(last.map(|f| f.frames.data).unwrap_or_default());
    (frames, counts)
}

/// The whole video from raw z, and pipeline latents un-normalised to z.
#[test]
fn minimax_h3_tiny_whole_video() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir, wgvae::DType::F32);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let mut unnormalised = latents.clone();
    dec.unnormalize(&mut unnormalised).unwrap();
    let (e, at) = max_abs_diff(&unnormalised.data, &z.data);
    assert!(e <= 1e-6, "latents · std + mean vs z.npy: {e} at {at}");
    let got = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(got.shape, want.shape, "output shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("minimax-h3-tiny: whole video: max abs error {err:.3e} at {at}");
    assert!(err <= TOLERANCE, "whole video: {err} at {at}");
}

/// Chunks of 1 and 2 latent frames: the same frames as the whole video,
/// delivered clip by clip as clips complete.
#[test]
fn minimax_h3_tiny_streams() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir, wgvae::DType::F32);
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let [_, c, tt, h, w] = want.shape[..] else {
        panic!("decoded is not 5-D")
    };
    let whole = decode_video(&ctx, &dec, &z).unwrap();
    for size in [1, 2] {
        let (frames, counts) = stream(&ctx, &dec, &z, size);
        assert_eq!(
            counts.iter().sum::<usize>(),
            tt,
            "chunks of {size}: {counts:?}"
        );
        let (e, at) = max_abs_diff(&channels_first(&frames, [c, tt, h, w]), &whole.data);
        println!("minimax-h3-tiny: chunks of {size}: {e:.3e} from the whole video (frames per call {counts:?})");
        assert!(e <= 1e-6, "chunks of {size}: {e} at {at}");
    }
}

/// f16 and bf16 storage against the f32 golden: the error each gives, bounded.
#[test]
fn minimax_h3_half_precisions_stay_close() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    for (dtype, bound) in [
        (wgvae::DType::F16, HALF_BOUND.0),
        (wgvae::DType::BF16, HALF_BOUND.1),
    ] {
        let dec = open(&ctx, &dir, dtype);
        let got = decode_video(&ctx, &dec, &z).unwrap();
        let (err, at) = max_abs_diff(&got.data, &want.data);
        println!("minimax-h3-tiny: {dtype:?}: max abs error {err:.3e} at {at}");
        assert!(err <= bound, "{dtype:?}: {err} at {at} (bound {bound})");
    }
}

/// Too few latent frames for a clip, the wrong channel count, exact tiles,
/// and the folder given as an image VAE: clear errors.
#[test]
fn minimax_h3_bad_inputs_are_errors() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir, wgvae::DType::F32);
    let lat = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.1; n]).unwrap()
    };
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 8, 2, 4, 4])));
    assert!(
        m.contains("2 latent frames") && m.contains("at least 3"),
        "{m}"
    );
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 16, 3, 4, 4])));
    assert!(m.contains("16 channels") && m.contains("takes 8"), "{m}");
    let m = error_message(
        VideoDecoder::new(&ctx, &dec)
            .unwrap()
            .with_tiling(wgvae::tiling::Tiling::exact()),
    );
    assert!(m.contains("exact tiles") && m.contains("untiled"), "{m}");
    wgvae::testing::video_decoder_refuses_images(&ctx, dir.to_str().unwrap());
    // Frames over a device limit: the advice fits a decoder that takes
    // whole frames (no exact tiles).
    let m = error_message(
        wgvae::estimate::Estimate::new(
            ctx.caps(),
            wgvae::memory::Policy::Exact,
            dir.to_str().unwrap(),
            &wgvae::LoadOptions::default(),
        )
        .video((4096, 4096), 3, 3),
    );
    assert!(
        m.contains("decodes a clip's frames whole") && !m.contains("TileMode::Exact`)"),
        "{m}"
    );
    // Three latent frames, the fewest: one clip (two latent frames of
    // padding), the 9 frames they were encoded from.
    let got = decode_video(&ctx, &dec, &lat(vec![1, 8, 3, 4, 4])).unwrap();
    assert_eq!(got.shape, vec![1, 3, 9, 64, 64]);
}

/// Random latents `[1, 8, t, 4, 4]` pushed a frame at a time: the frames
/// delivered before `finish`, all frames, and the pool's peak allocated.
fn stream_random(ctx: &Context, dec: &wgvae::Vae, t: usize) -> (usize, usize, u64) {
    let z = HostTensor::new(
        vec![1, 8, t, 4, 4],
        wgvae::testing::rand_vec(8 * t * 16, 3, 1.0),
    )
    .unwrap();
    ctx.pool().reset_peak_stats();
    let mut s = VideoDecoder::new(ctx, dec).unwrap();
    let mut early = 0;
    for t0 in 0..t {
        early += s
            .push(&ncthw_chunk(&z, t0, t0 + 1))
            .unwrap()
            .map_or(0, |f| f.frames.shape[0]);
    }
    let last = s.finish().unwrap().map_or(0, |f| f.frames.shape[0]);
    (early, early + last, ctx.pool().stats().allocated_bytes.peak)
}

/// A long video streams clip by clip (frames arrive before the end) in
/// memory bounded by one clip: two lengths equal modulo a clip have the
/// same streamed peak, and the null-device estimate equals it.
#[test]
fn minimax_h3_streams_in_bounded_memory() {
    let Some(dir) = golden() else { return };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir, wgvae::DType::F32);
    let short = stream_random(&ctx, &dec, 13);
    let long = stream_random(&ctx, &dec, 22);
    println!("minimax-h3-tiny streamed: 13 latent frames {short:?}, 22 {long:?} (early, total frames, peak B)");
    assert!(
        short.0 > 0 && long.0 > short.0,
        "frames only at the end: {short:?} {long:?}"
    );
    // 9 frames per 3 latent frames (clip_length 9), as diffusers' 19 for 7.
    assert_eq!((short.1, long.1), (3 * 13 - 2, 3 * 22 - 2));
    assert_eq!(dec.frames_for(22).unwrap(), long.1);
    assert_eq!(short.2, long.2, "streamed peak allocated");
    let e = wgvae::estimate::Estimate::new(
        ctx.caps(),
        wgvae::memory::Policy::Exact,
        dir.to_str().unwrap(),
        &wgvae::LoadOptions::default(),
    )
    .video((64, 64), 22, 1)
    .unwrap();
    println!(
        "estimate: {} B, {} frames",
        e.peak_allocated_bytes, e.output_frames
    );
    assert_eq!(e.output_frames, long.1);
    assert_eq!(e.peak_allocated_bytes, long.2);
}

/// Frames over 256 px decode by default in the reference's tiles (as
/// diffusers ships the model): each 256-px tile decoded on its own and
/// stitched, the first rows / columns of a tile blended with the tiles
/// above / to the left as decoded. Checked against the tiles decoded
/// untiled one by one and stitched here on the host; the estimate equals
/// the measured peak.
#[test]
fn minimax_h3_reference_tiles() {
    let Some(dir) = golden() else { return };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir, wgvae::DType::F32);
    let (t, h, w) = (5, 20, 17);
    let z = HostTensor::new(
        vec![1, 8, t, h, w],
        wgvae::testing::rand_vec(8 * t * h * w, 11, 1.0),
    )
    .unwrap();
    ctx.pool().reset_peak_stats();
    let tiled = decode_video(&ctx, &dec, &z).unwrap();
    let peak = ctx.pool().stats().allocated_bytes.peak;
    let off = wgvae::tiling::Tiling::off();
    let untiled = wgvae::decode_video_tiled(&ctx, &dec, &z, Some(&off)).unwrap();
    let (d, _) = max_abs_diff(&tiled.data, &untiled.data);
    assert!(d > 1e-3, "tiles decode independently: {d} from untiled");
    // 320 rows: tiles at rows 0 and 64 (overlap 192); 272 columns: at 0 and 16 (overlap 240).
    let [_, c, f, oh, ow] = tiled.shape[..] else {
        panic!("not 5-D")
    };
    let (ys, yo, xs, xo) = ([0usize, 64], 192usize, [0usize, 16], 240usize);
    let tile = |y0: usize, x0: usize| {
        // z [1, 8, t, h, w] cropped to the tile's latents.
        let (lh, lw) = (16.min(h - y0 / 16), 16.min(w - x0 / 16));
        let mut data = Vec::new();
        for p in 0..8 * t {
            for y in 0..lh {
                let at = (p * h + y0 / 16 + y) * w + x0 / 16;
                data.extend_from_slice(&z.data[at..at + lw]);
            }
        }
        let part = HostTensor::new(vec![1, 8, t, lh, lw], data).unwrap();
        wgvae::decode_video_tiled(&ctx, &dec, &part, Some(&off)).unwrap()
    };
    let tiles: Vec<Vec<HostTensor>> = ys
        .iter()
        .map(|&y| xs.iter().map(|&x| tile(y, x)).collect())
        .collect();
    let (th, tw) = (tiles[0][0].shape[3], tiles[0][0].shape[4]);
    let at = |t: &HostTensor, p: usize, y: usize, x: usize| t.data[(p * th + y) * tw + x];
    let mut want = vec![0.0f32; c * f * oh * ow];
    for (i, &y0) in ys.iter().enumerate() {
        for (j, &x0) in xs.iter().enumerate() {
            let tl = &tiles[i][j];
            let ch = if i == 0 { th - yo } else { th };
            let cw = if j == 0 { tw - xo } else { tw };
            for p in 0..c * f {
                for y in 0..ch {
                    for x in 0..cw {
                        let mut v = at(tl, p, y, x);
                        if i > 0 && y < yo {
                            let wb = y as f32 / yo as f32;
                            v = at(&tiles[0][j], p, th - yo + y, x) * (1.0 - wb) + v * wb;
                        }
                        if j > 0 && x < xo {
                            let wb = x as f32 / xo as f32;
                            v = at(&tiles[i][0], p, y, tw - xo + x) * (1.0 - wb) + v * wb;
                        }
                        want[(p * oh + y0 + y) * ow + x0 + x] = v;
                    }
                }
            }
        }
    }
    let (e, at_) = max_abs_diff(&tiled.data, &want);
    println!("minimax-h3 reference tiles: {e:.3e} from the tiles stitched on the host (untiled differs by {d:.3e})");
    assert!(e <= 1e-5, "{e} at {at_}");
    let est = wgvae::estimate::Estimate::new(
        ctx.caps(),
        wgvae::memory::Policy::Exact,
        dir.to_str().unwrap(),
        &wgvae::LoadOptions::default(),
    )
    .video((h * 16, w * 16), t, t)
    .unwrap();
    assert_eq!(est.reference_tiles, Some((256, 64)));
    assert_eq!(est.peak_allocated_bytes, peak, "estimate vs measured peak");
}

/// `wgvae decode latents.npy --vae minimax-h3-tiny --save-raw --frames-out`
/// (pipeline latents: `· std + mean`) equals the golden; the PNGs are its
/// ImageNet-normalised frames mapped back to RGB; `--tile exact` and
/// `encode` are refused by name.
#[test]
fn minimax_h3_cli() {
    let Some(dir) = golden() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let raw = scratch.path().join("raw.npy");
    let frames = scratch.path().join("frames");
    let run = |extra: &[&str]| {
        std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(["decode", dir.join("latents.npy").to_str().unwrap(), "--vae"])
            .arg(&dir)
            .args(extra)
            .env(
                "WGPU_BACKEND",
                std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
            )
            .output()
            .unwrap()
    };
    let o = run(&[
        "--save-raw",
        raw.to_str().unwrap(),
        "--frames-out",
        frames.to_str().unwrap(),
        "--chunk",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["frames"].as_u64(), v["tiling"].as_str()),
        (Some(19), Some("untiled")),
        "{v}"
    );
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = read_npy(&raw).unwrap();
    assert_eq!(got.shape, want.shape);
    let (e, at) = max_abs_diff(&got.data, &want.data);
    println!("minimax-h3-tiny CLI --save-raw: max |diff| = {e:.3e} at {at}");
    assert!(e <= TOLERANCE, "--save-raw differs by {e} at {at}");
    // Frame 5's PNG: clamp(x · std + mean, 0, 1) per channel, rounded.
    let png = image::open(frames.join("frame_00005.png"))
        .unwrap()
        .to_rgb8();
    let [_, _, t, h, w] = want.shape[..] else {
        panic!("not 5-D")
    };
    let (mean, std) = ([0.485f32, 0.456, 0.406], [0.229f32, 0.224, 0.225]);
    for (i, px) in png.pixels().enumerate() {
        for c in 0..3 {
            let x = want.data[((c * t) + 5) * h * w + i];
            let b = ((x * std[c] + mean[c]).clamp(0.0, 1.0) * 255.0).round_ties_even() as i32;
            assert!(
                (px[c] as i32 - b).abs() <= 1,
                "pixel {i} channel {c}: {} vs {b}",
                px[c]
            );
        }
    }
    let o = run(&["--save-raw", raw.to_str().unwrap(), "--tile", "exact"]);
    let m = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && m.contains("exact tiles"), "{m}");
}
