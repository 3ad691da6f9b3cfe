//! The Wan 2.2 (TI2V-5B) VAE decoder against diffusers 0.42.1's
//! `AutoencoderKLWan` (residual, patch size 2, z_dim 48) on the
//! `wan22-tiny` golden (seeded random weights, f32 CPU): whole clip, streamed
//! in chunks of 1 and 2 latent frames, exact spatial tiles, the CLI, memory
//! estimates against the measured peak, and the errors a wrong latent gets.

use std::path::PathBuf;

use wgvae::io::{read_npy, HostTensor};
use wgvae::models::WanDecoder;
use wgvae::testing::{
    channels_first, check_exact_video_tiles, error_message, max_abs_diff, shared_dir, stream_ncthw,
    stream_random_frames, test_context,
};
use wgvae::{decode_video, Context, LoadOptions};

/// f32 against diffusers' f32 CPU decode (the bound is 1e-3).
const TOLERANCE: f32 = 1e-4;
/// f16, bf16 bounds against the f32 golden (measured, then about 3× that).
const HALF_BOUND: (f32, f32) = (1e-2, 8e-2);
/// Exact tiles against the untiled decode.
const TILED_TOLERANCE: f32 = 1e-5;

fn golden() -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join("wan22-tiny"))
}

fn open(ctx: &Context, dir: &std::path::Path) -> wgvae::Vae {
    wgvae::Vae::from(WanDecoder::open(ctx, dir.to_str().unwrap(), wgvae::DType::F32, 0).unwrap())
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
fn wan22_tiny_whole_and_streamed() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    assert_eq!(
        (
            dec.latent_channels(),
            dec.upscale(),
            dec.frames_for(2).unwrap() - dec.frames_for(1).unwrap()
        ),
        (48, 16, 4)
    );
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
    println!("wan22-tiny: whole clip: max abs error {err:.3e} at {at}");
    assert!(err <= TOLERANCE, "whole clip: {err} at {at}");
    for size in [1, 2] {
        let data = channels_first(&stream_ncthw(&ctx, &dec, &z, size, None).0, out_dims(&want));
        let (err, at) = max_abs_diff(&data, &want.data);
        println!("wan22-tiny: chunks of {size}: max abs error {err:.3e} at {at}");
        assert!(err <= TOLERANCE, "chunks of {size}: {err} at {at}");
    }
}

/// Exact tiles of 32 output pixels (2×3 tiles of the 64×96 frames, every
/// level tiled): whole clip, and streamed in chunks of 1 within a tight
/// budget (tiles parked on the host), against the untiled decode.
#[test]
fn wan22_tiny_exact_tiles() {
    let Some(dir) = golden() else { return };
    // Its own pool: the tight budget counts this decode's tensors only.
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir);
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let bounds = (TILED_TOLERANCE, TOLERANCE);
    check_exact_video_tiles(&ctx, &dec, (&z, &want), 32, bounds, "wan22-tiny");
}

/// Streaming peak allocated is the same for 3 and 9 latent frames (the
/// causal caches bound it), and the null-device estimate equals it.
#[test]
fn wan22_streaming_memory_is_flat_and_predicted() {
    let Some(dir) = golden() else { return };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = open(&ctx, &dir);
    let (h, w) = (2, 3);
    let mut peaks = Vec::new();
    let mut caches = Vec::new();
    for frames in [3, 9] {
        let (out, peak, cache) = stream_random_frames(&ctx, &dec, (h, w), frames);
        assert_eq!(out, 4 * frames - 3);
        peaks.push(peak);
        caches.push(cache);
    }
    println!(
        "wan22-tiny streaming peak allocated: 3 frames {} B, 9 frames {} B; caches {} B",
        peaks[0], peaks[1], caches[1]
    );
    assert_eq!(peaks[0], peaks[1]);
    assert_eq!(caches[0], caches[1]);
    let e = wgvae::estimate::Estimate::new(
        ctx.caps(),
        wgvae::memory::Policy::Exact,
        dir.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .video((16 * h, 16 * w), 9, 1)
    .unwrap();
    assert_eq!(e.peak_allocated_bytes, peaks[0], "{e:?}");
    assert_eq!(e.cache_bytes, caches[0]);
    assert_eq!(e.output_frames, 4 * 9 - 3);
}

/// A Wan 2.1 latent (16 channels), a 4-D latent, T = 0: clear errors.
#[test]
fn wan22_bad_latents_are_errors() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    let lat = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.1; n]).unwrap()
    };
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 16, 2, 2, 2])));
    assert!(m.contains("16 channels") && m.contains("48"), "{m}");
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![1, 48, 0, 2, 2])));
    assert!(m.contains("T=0"), "{m}");
    let m = error_message(decode_video(&ctx, &dec, &lat(vec![48, 2, 2, 2])));
    assert!(m.contains("N×C×T×h×w"), "{m}");
    println!("errors read: {m}");
}

/// `preset:wan22` (the public TI2V-5B config, seeded random weights)
/// decodes one latent frame into one 16×16 frame in [−1, 1].
#[test]
fn wan22_preset_decodes() {
    let ctx = test_context();
    let dec =
        wgvae::Vae::from(WanDecoder::open(&ctx, "preset:wan22", wgvae::DType::F32, 0).unwrap());
    assert_eq!(
        (
            dec.latent_channels(),
            dec.upscale(),
            dec.frames_for(2).unwrap() - dec.frames_for(1).unwrap()
        ),
        (48, 16, 4)
    );
    let z = HostTensor::new(vec![1, 48, 1, 1, 1], vec![0.5; 48]).unwrap();
    let out = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(out.shape, vec![1, 3, 1, 16, 16]);
    assert!(out.data.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
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
        let dec =
            wgvae::Vae::from(WanDecoder::open(&ctx, dir.to_str().unwrap(), dtype, 0).unwrap());
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

/// The diffusers name of a Wan 2.2 decoder weight → its `vae2_2.py` name
/// (`per_block` residual blocks per up stage), as `wan2.2_vae.safetensors`
/// holds it; `None` for the encoder's.
fn original_key(key: &str, per_block: usize) -> Option<String> {
    let res = |t: &str| {
        [
            ("norm1.gamma", "residual.0.gamma"),
            ("conv1.", "residual.2."),
            ("norm2.gamma", "residual.3.gamma"),
            ("conv2.", "residual.6."),
            ("conv_shortcut.", "shortcut."),
        ]
        .iter()
        .find_map(|(a, b)| t.strip_prefix(a).map(|r| format!("{b}{r}")))
    };
    if let Some(t) = key.strip_prefix("post_quant_conv.") {
        return Some(format!("conv2.{t}"));
    }
    let d = key.strip_prefix("decoder.")?;
    for (from, to) in [
        ("conv_in.", "conv1."),
        ("norm_out.", "head.0."),
        ("conv_out.", "head.2."),
        ("mid_block.attentions.0.", "middle.1."),
    ] {
        if let Some(t) = d.strip_prefix(from) {
            return Some(format!("decoder.{to}{t}"));
        }
    }
    if let Some(t) = d.strip_prefix("mid_block.resnets.") {
        let (i, t) = t.split_once('.')?;
        let m = if i == "0" { 0 } else { 2 };
        return Some(format!("decoder.middle.{m}.{}", res(t)?));
    }
    let t = d.strip_prefix("up_blocks.")?;
    let (i, t) = t.split_once('.')?;
    if let Some(t) = t.strip_prefix("resnets.") {
        let (j, t) = t.split_once('.')?;
        return Some(format!("decoder.upsamples.{i}.upsamples.{j}.{}", res(t)?));
    }
    let t = t.strip_prefix("upsampler.")?;
    Some(format!("decoder.upsamples.{i}.upsamples.{per_block}.{t}"))
}

/// The golden's weights under `vae2_2.py`'s key names in one `.safetensors`
/// file without a config.json (as ComfyUI ships `wan2.2_vae.safetensors`):
/// the shape is read off the weights (residual, patch size 2, z_dim 48,
/// decoder width 12), Wan 2.2's published latent statistics are assumed
/// with a note, and it decodes exactly as the diffusers folder.
#[test]
fn wan22_original_single_file_loads() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    let bytes = std::fs::read(dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<_> = st
        .names()
        .into_iter()
        .filter_map(|n| Some((original_key(n, 2)?, st.tensor(n).unwrap())))
        .collect();
    assert!(tensors
        .iter()
        .any(|(k, _)| k == "decoder.upsamples.0.upsamples.2.time_conv.weight"));
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("wan2.2_vae.safetensors");
    safetensors::serialize_to_file(tensors, None, &file).unwrap();
    let orig = WanDecoder::open(&ctx, file.to_str().unwrap(), wgvae::DType::F32, 0).unwrap();
    let c = orig.config();
    assert!(
        c.is_residual && c.patch_size == 2 && c.base_dim == 12 && c.z_dim == 48,
        "{c:?}"
    );
    assert_eq!(
        (c.num_res_blocks, c.temperal_downsample.clone()),
        (1, vec![false, true, true])
    );
    assert_eq!(
        c.latents_mean,
        wgvae::models::wan::WAN22_LATENTS_MEAN.to_vec()
    );
    let vae = wgvae::Vae::from(orig);
    assert!(vae
        .latents_stats_note()
        .unwrap()
        .contains("Wan 2.2's published"));
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let a = decode_video(&ctx, &vae, &z).unwrap();
    let b = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(a.data, b.data);
}

/// `wgvae decode latents.npy --vae wan22-tiny --frames-out DIR --save-raw`
/// (pipeline latents by default) equals the golden; `--raw-latents` with
/// z.npy and exact 32-pixel tiles too.
#[test]
fn wan22_cli() {
    let Some(dir) = golden() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let run = |input: &str, extra: &[&str], tag: &str| {
        let raw = scratch.path().join(format!("{tag}.npy"));
        let frames = scratch.path().join(tag);
        let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(["decode", dir.join(input).to_str().unwrap(), "--vae"])
            .arg(&dir)
            .arg("--save-raw")
            .arg(&raw)
            .arg("--frames-out")
            .arg(&frames)
            .arg("--json")
            .args(extra)
            .env(
                "WGPU_BACKEND",
                std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
            )
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{tag}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["frames"], 9, "{v}");
        assert_eq!(v["frame_shape"], serde_json::json!([3, 64, 96]), "{v}");
        assert_eq!(std::fs::read_dir(&frames).unwrap().count(), 9);
        let got = read_npy(&raw).unwrap();
        assert_eq!(got.shape, want.shape);
        let (e, at) = max_abs_diff(&got.data, &want.data);
        println!("wan22-tiny CLI {tag}: max |diff| = {e:.3e} at {at}");
        assert!(e <= TOLERANCE, "{tag}: {e} at {at}");
    };
    run("latents.npy", &[], "pipeline");
    run("z.npy", &["--raw-latents", "--chunk", "2"], "raw");
    run(
        "z.npy",
        &["--raw-latents", "--tile", "exact", "--tile-size", "32"],
        "tiled",
    );
}
