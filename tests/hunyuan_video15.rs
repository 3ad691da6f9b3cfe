//! The HunyuanVideo 1.5 VAE decoder against diffusers 0.42.1's
//! `AutoencoderKLHunyuanVideo15` on the `hunyuanvideo15-tiny` golden
//! (seeded random weights, f32 CPU): diffusers decodes the whole clip in one
//! pass; the engine streams it (replicate-padded causal convs, block-causal
//! attention with earlier frames' keys and values) and must equal it.

use std::path::PathBuf;

use wgvae::io::{read_npy, HostTensor};
use wgvae::models::hunyuan_video15::HunyuanVideo15Decoder;
use wgvae::testing::{
    channels_first, check_exact_video_tiles, error_message, max_abs_diff, shared_dir, stream_ncthw,
    stream_random_frames, test_context,
};
use wgvae::{decode_video, Context};

/// f32 against diffusers' f32 CPU decode (the bound is 1e-3).
const TOLERANCE: f32 = 1e-4;
/// f16, bf16 bounds against the f32 golden (measured, then about 3× that).
const HALF_BOUND: (f32, f32) = (1.6e-2, 0.15);

fn golden() -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join("hunyuanvideo15-tiny"))
}

fn open(ctx: &Context, dir: &std::path::Path) -> wgvae::Vae {
    wgvae::Vae::from(
        HunyuanVideo15Decoder::open(ctx, dir.to_str().unwrap(), wgvae::DType::F32, 0).unwrap(),
    )
}

fn out_dims(want: &HostTensor) -> [usize; 4] {
    let [_, c, t, h, w] = want.shape[..] else {
        panic!("decoded is not 5-D")
    };
    [c, t, h, w]
}

/// Raw z as one clip and streamed in chunks of 1 and 2 latent frames; the
/// pipeline's latents un-normalise to z (config latents_mean/std).
#[test]
fn hunyuanvideo15_tiny_whole_and_streamed() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    assert_eq!(
        (
            dec.latent_channels(),
            dec.upscale(),
            dec.frames_for(2).unwrap() - dec.frames_for(1).unwrap()
        ),
        (32, 16, 4)
    );
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let mut unnormalised = latents.clone();
    dec.unnormalize(&mut unnormalised).unwrap();
    let (e, at) = max_abs_diff(&unnormalised.data, &z.data);
    assert!(e <= 1e-6, "latents / scaling_factor vs z.npy: {e} at {at}");
    let got = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(got.shape, want.shape, "output shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("hunyuanvideo15-tiny: whole clip: max abs error {err:.3e} at {at}");
    assert!(err <= TOLERANCE, "whole clip: {err} at {at}");
    for size in [1, 2] {
        let data = channels_first(&stream_ncthw(&ctx, &dec, &z, size, None).0, out_dims(&want));
        let (err, at) = max_abs_diff(&data, &want.data);
        println!("hunyuanvideo15-tiny: chunks of {size}: max abs error {err:.3e} at {at}");
        assert!(err <= TOLERANCE, "chunks of {size}: {err} at {at}");
    }
}

/// Streaming memory: every chunk adds its frames' attention keys and
/// values (f32 `[C, h·w]` each) and nothing else, and the null-device
/// estimate equals the measured peak at each length.
#[test]
fn hunyuanvideo15_streaming_memory_grows_by_the_keys_only_and_is_predicted() {
    let Some(dir) = golden() else { return };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir);
    let (h, w) = (2, 3);
    let runs: Vec<_> = [3, 6]
        .into_iter()
        .map(|frames| {
            let (_, peak, caches) = stream_random_frames(&ctx, &dec, (h, w), frames);
            (frames, peak, caches)
        })
        .collect();
    // The mid block is 64 channels wide at the latent size.
    let kv_per_frame = 2 * 64 * (h * w) as u64 * 4;
    let [(_, p3, c3), (_, p6, c6)] = runs[..] else {
        unreachable!()
    };
    println!("hunyuanvideo15-tiny streaming: peaks {p3} / {p6} B, caches {c3} / {c6} B");
    assert_eq!(c6 - c3, 3 * kv_per_frame);
    assert_eq!(p6 - p3, 3 * kv_per_frame);
    for (frames, peak, caches) in runs {
        let e = wgvae::estimate::Estimate::new(
            ctx.caps(),
            wgvae::memory::Policy::Exact,
            dir.to_str().unwrap(),
            &wgvae::LoadOptions::default(),
        )
        .video((16 * h, 16 * w), frames, 1)
        .unwrap();
        assert!(e.cache_grows && !e.independent_of_frames, "{e:?}");
        assert_eq!(
            (e.peak_allocated_bytes, e.cache_bytes),
            (peak, caches),
            "{frames} frames"
        );
    }
}

/// Exact tiles of 32 output pixels (2×3 tiles of the 64×96 frames; the
/// replicate padding at each frame edge, the mid block's attention whole at
/// the latent size): whole clip, and streamed in chunks of 1 within a tight
/// budget (tiles parked on the host), against the untiled decode.
#[test]
fn hunyuanvideo15_tiny_exact_tiles() {
    let Some(dir) = golden() else { return };
    // Its own pool: the tight budget counts this decode's tensors only.
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir);
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let name = "hunyuanvideo15-tiny";
    check_exact_video_tiles(&ctx, &dec, (&z, &want), 32, (1e-5, TOLERANCE), name);
}

/// A Wan latent (48 channels), a 4-D latent, T = 0 and the folder given as
/// an image VAE: clear errors.
#[test]
fn hunyuanvideo15_bad_inputs_are_errors() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    let lat = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.1; n]).unwrap()
    };
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 48, 2, 2, 2])));
    assert!(m.contains("48 channels") && m.contains("32"), "{m}");
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 32, 0, 2, 2])));
    assert!(m.contains("T=0"), "{m}");
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![32, 2, 2, 2])));
    assert!(m.contains("N×C×T×h×w"), "{m}");
    wgvae::testing::video_decoder_refuses_images(&ctx, dir.to_str().unwrap());
}

/// `preset:hunyuanvideo15` (the released config, seeded random weights)
/// loads and runs one latent frame into one 16×16 frame on a null device
/// with a 24 GB GPU's limits (its widest weights exceed lavapipe's 128 MiB
/// binding).
#[test]
fn hunyuanvideo15_preset_loads() {
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    let null = wgvae::Context::null(caps, wgvae::memory::Policy::Planned.new_pool());
    let dec = wgvae::Vae::from(
        HunyuanVideo15Decoder::open(&null, "preset:hunyuanvideo15", wgvae::DType::BF16, 0).unwrap(),
    );
    assert_eq!(
        (
            dec.latent_channels(),
            dec.upscale(),
            dec.frames_for(2).unwrap() - dec.frames_for(1).unwrap()
        ),
        (32, 16, 4)
    );
    let z = HostTensor::new(vec![1, 32, 1, 1, 1], vec![0.5; 32]).unwrap();
    let out = decode_video(&null, &dec, &z).unwrap();
    assert_eq!(out.shape, vec![1, 3, 1, 16, 16]);
}

/// `wgvae decode latents.npy --vae hunyuanvideo15-tiny --save-raw`
/// (pipeline latents: divided by the scaling factor) equals the golden.
#[test]
fn hunyuanvideo15_cli_save_raw() {
    let Some(dir) = golden() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let raw = scratch.path().join("raw.npy");
    let frames = scratch.path().join("frames");
    let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args(["decode", dir.join("latents.npy").to_str().unwrap(), "--vae"])
        .arg(&dir)
        .arg("--save-raw")
        .arg(&raw)
        .arg("--frames-out")
        .arg(&frames)
        .args(["--chunk", "2", "--json"])
        .env(
            "WGPU_BACKEND",
            std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["frames"], 9, "{v}");
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = read_npy(&raw).unwrap();
    assert_eq!(got.shape, want.shape);
    let (e, at) = max_abs_diff(&got.data, &want.data);
    println!("hunyuanvideo15-tiny CLI --save-raw: max |diff| = {e:.3e} at {at}");
    assert!(e <= TOLERANCE, "--save-raw differs by {e} at {at}");
    assert_eq!(std::fs::read_dir(&frames).unwrap().count(), 9);
}

/// f16 and bf16 storage (activations and weights rounded, f32 arithmetic)
/// against the f32 golden: the error each precision gives, bounded.
#[test]
fn half_precisions_stay_close() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    for (dtype, bound) in [
        (wgvae::DType::F16, HALF_BOUND.0),
        (wgvae::DType::BF16, HALF_BOUND.1),
    ] {
        let dec = wgvae::Vae::from(
            HunyuanVideo15Decoder::open(&ctx, dir.to_str().unwrap(), dtype, 0).unwrap(),
        );
        let got = decode_video(&ctx, &dec, &z).unwrap();
        let (err, at) = max_abs_diff(&got.data, &want.data);
        let peak = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        println!(
            "{}: {dtype:?}: max abs error {err:.3e} at {at} (values up to {peak:.2})",
            dir.display()
        );
        assert!(err <= bound, "{dtype:?}: {err} at {at}");
    }
}

/// `wgvae encode` with a HunyuanVideo 1.5 or LTX-2 VAE names the family and
/// says its encoder is not implemented, before reading the input.
#[test]
fn encoders_of_the_new_video_vaes_are_refused_by_family() {
    let Some(dir) = golden() else { return };
    for (name, family) in [
        ("hunyuanvideo15-tiny", "HunyuanVideo 1.5 VAE"),
        ("ltx2-tiny", "LTX-2 VAE"),
    ] {
        let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(["encode", "no-such-input.png", "--vae"])
            .arg(dir.with_file_name(name))
            .args(["-o", "never-written.npy"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains(family)
                && err.contains("encoder is not implemented"),
            "{err}"
        );
    }
}
