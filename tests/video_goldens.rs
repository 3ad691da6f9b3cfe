//! TAEHV video decoders against the `taehv.py` goldens in `../shared/golden`
//! (seeded random weights, f16-rounded values run in f32 on CPU): raw output
//! before the clamp within 8e-6 max abs (3× README's measured 2.6e-6; the
//! issue's bound is 2e-3), decoded whole and streamed in
//! chunks of 1 and 2 latent frames.

use std::path::PathBuf;

use wgvae::io::{read_npy, HostTensor};
use wgvae::models::{TaehvDecoder, WanDecoder, WeightStore};
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::{decode_video, Context, LoadOptions, VideoDecoder};

const TOLERANCE: f32 = 8e-6;

fn golden(name: &str) -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join(name))
}

fn load(ctx: &Context, dir: &std::path::Path, file: &str) -> wgvae::Vae {
    let store = WeightStore::from_safetensors(&dir.join(file)).unwrap();
    wgvae::Vae::from(TaehvDecoder::load(ctx, &store).unwrap())
}

/// Video `n` of `latents` [N, T, C, h, w], frames `t0..t1`, as [T, C, h, w].
fn chunk(latents: &HostTensor, n: usize, t0: usize, t1: usize) -> HostTensor {
    let [_, t, c, h, w] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let frame = c * h * w;
    let start = (n * t + t0) * frame;
    HostTensor::new(
        vec![t1 - t0, c, h, w],
        latents.data[start..start + (t1 - t0) * frame].to_vec(),
    )
    .unwrap()
}

fn check(name: &str, file: &str) {
    let Some(dir) = golden(name) else { return };
    let ctx = test_context();
    let dec = load(&ctx, &dir, file);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let got = decode_video(&ctx, &dec, &latents).unwrap();
    assert_eq!(got.shape, want.shape, "{name}: output shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("{name}: whole clip: raw max abs error {err:.3e} at {at}");
    assert!(
        err <= TOLERANCE,
        "{name}: whole clip: {err} > {TOLERANCE} at {at}"
    );

    let [n, t, ..] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    for size in [1, 2] {
        let mut data = Vec::new();
        for v in 0..n {
            let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
            for t0 in (0..t).step_by(size) {
                let frames = stream
                    .decode(&chunk(&latents, v, t0, (t0 + size).min(t)))
                    .unwrap();
                data.extend(frames.data);
            }
        }
        assert_eq!(
            data.len(),
            want.data.len(),
            "{name}: chunks of {size}: values"
        );
        let (err, at) = max_abs_diff(&data, &want.data);
        let (vs_whole, _) = max_abs_diff(&data, &got.data);
        println!(
            "{name}: chunks of {size}: raw max abs error {err:.3e} at {at}, {vs_whole:.3e} from the whole clip"
        );
        assert!(
            err <= TOLERANCE,
            "{name}: chunks of {size}: {err} > {TOLERANCE} at {at}"
        );
    }

    // Double-buffered: push(k) returns chunk k − 1's frames, finish the last;
    // the same values as decoding chunk by chunk.
    let mut pushed = Vec::new();
    let mut firsts = Vec::new();
    for v in 0..n {
        let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
        for t0 in 0..t {
            if let Some(f) = stream.push(&chunk(&latents, v, t0, t0 + 1)).unwrap() {
                firsts.push(f.first);
                pushed.extend(f.frames.data);
            }
        }
        let last = stream.finish().unwrap().unwrap();
        firsts.push(last.first);
        pushed.extend(last.frames.data);
        assert!(stream.finish().unwrap().is_none());
    }
    assert_eq!(firsts[..2], [0, 1], "{name}: first frame indices");
    let (err, at) = max_abs_diff(&pushed, &want.data);
    println!("{name}: pushed one at a time (double-buffered): raw max abs error {err:.3e} at {at}");
    assert_eq!(pushed.len(), want.data.len());
    assert!(err <= TOLERANCE, "{name}: pushed: {err} at {at}");
}

#[test]
fn taew2_1_rand() {
    check("taew2_1-rand", "taew2_1.safetensors");
}

#[test]
fn taew2_2_rand() {
    check("taew2_2-rand", "taew2_2.safetensors");
}

fn message<T>(r: wgvae::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// Wrong channel count, T = 0, wrong rank, a chunk of another size, a
/// TAEHV file given as an image VAE: clear errors, no panics.
#[test]
fn bad_video_inputs_are_errors() {
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let ctx = test_context();
    let dec = load(&ctx, &dir, "taew2_1.safetensors");
    let lat = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.1; n]).unwrap()
    };
    let m = message(decode_video(&ctx, &dec, &lat(vec![1, 2, 15, 2, 2])));
    assert!(m.contains("15 channels") && m.contains("16"), "{m}");
    let m = message(decode_video(&ctx, &dec, &lat(vec![1, 0, 16, 2, 2])));
    assert!(m.contains("T=0"), "{m}");
    let m = message(decode_video(&ctx, &dec, &lat(vec![2, 16, 2, 2])));
    assert!(m.contains("N×T×C×h×w"), "{m}");
    let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
    stream.decode(&lat(vec![1, 16, 2, 2])).unwrap();
    let m = message(stream.decode(&lat(vec![1, 16, 2, 3])));
    assert!(m.contains("same latent size"), "{m}");
    let mut nan = lat(vec![1, 16, 2, 2]);
    nan.data[5] = f32::NAN;
    let m = message(stream.decode(&nan));
    assert!(m.contains("finite"), "{m}");
    let path = dir.join("taew2_1.safetensors");
    wgvae::testing::video_decoder_refuses_images(&ctx, path.to_str().unwrap());
    println!("errors read: {m}");
    // The same file's encoder loads as a video encoder, which encodes no images.
    let enc = wgvae::Vae::load_encoder(&ctx, path.to_str().unwrap(), &LoadOptions::default());
    let enc = enc.unwrap();
    assert_eq!(enc.kind(), wgvae::ModelKind::VideoEncoder);
    let pixels = HostTensor::new(vec![1, 3, 16, 16], vec![0.0; 768]).unwrap();
    let m = message(wgvae::encode(&ctx, &enc, &pixels, &Default::default()));
    assert!(m.contains("is a video encoder"), "{m}");
}

/// An image TAE (taesd layout) where a TAEHV decoder is expected.
#[test]
fn an_image_tae_is_not_a_video_decoder() {
    let ctx = test_context();
    let store = WeightStore::from_map(
        wgvae::testing::synthetic_tae_decoder(4, 7),
        wgvae::models::Layout::Tae,
        "taesd.safetensors",
    );
    assert!(!TaehvDecoder::detect(&store));
    let m = message(TaehvDecoder::load(&ctx, &store));
    assert!(
        m.contains("[256, latent_channels, 3, 3]") && m.contains("image TAE"),
        "{m}"
    );
}

/// Streaming holds only the time caches between chunks: the peak allocated
/// is the same for 8 and 32 latent frames, and the caches are the nine
/// MemBlocks' last input frames.
#[test]
fn streaming_memory_is_flat_in_video_length() {
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = load(&ctx, &dir, "taew2_1.safetensors");
    let (h, w) = (2, 3);
    let mut peaks = Vec::new();
    for frames in [8, 32] {
        let latents = HostTensor::new(
            vec![1, frames, 16, h, w],
            wgvae::testing::rand_vec(frames * 16 * h * w, frames as u64, 1.0),
        )
        .unwrap();
        ctx.pool().reset_peak_stats();
        let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
        let mut out = 0;
        for t in 0..frames {
            out += stream.decode(&chunk(&latents, 0, t, t + 1)).unwrap().shape[0];
        }
        assert_eq!(out, 4 * frames - 3);
        // 3 blocks each of 256×h×w, 128×2h×2w, 64×4h×4w f32 values.
        let caches = 3 * 4 * (256 + 128 * 4 + 64 * 16) * h * w;
        assert_eq!(stream.cache_bytes(), caches as u64);
        peaks.push(ctx.pool().stats().allocated_bytes.peak);
    }
    println!(
        "streaming peak allocated (weights included): 8 frames {} B, 32 frames {} B",
        peaks[0], peaks[1]
    );
    assert_eq!(peaks[0], peaks[1]);
    // The null-device estimate (first chunk + one steady chunk) is that peak.
    let caps = ctx.caps().clone();
    let vae = dir.join("taew2_1.safetensors");
    let load = LoadOptions::default();
    let e = wgvae::estimate::Estimate::new(
        &caps,
        wgvae::memory::Policy::Exact,
        vae.to_str().unwrap(),
        &load,
    )
    .video((8 * h, 8 * w), 32, wgvae::video::DEFAULT_CHUNK)
    .unwrap();
    assert_eq!(e.peak_allocated_bytes, peaks[0], "{e:?}");
    assert_eq!(
        e.cache_bytes,
        (3 * 4 * (256 + 128 * 4 + 64 * 16) * h * w) as u64
    );
    assert_eq!(e.output_frames, 4 * 32 - 3);
    // Two read-back buffers of one chunk's 4 f32 frames of 3×16×24.
    assert_eq!(e.staging_bytes, 2 * 4 * 4 * 3 * 16 * 24);
    let m = message(
        wgvae::estimate::Estimate::new(
            &caps,
            wgvae::memory::Policy::Exact,
            vae.to_str().unwrap(),
            &load,
        )
        .video((20, 24), 1, 1),
    );
    assert!(m.contains("multiples of 8"), "{m}");
    let m = message(
        wgvae::estimate::Estimate::new(
            &caps,
            wgvae::memory::Policy::Exact,
            vae.to_str().unwrap(),
            &load,
        )
        .video((16, 24), 0, 1),
    );
    assert!(m.contains("at least one latent frame"), "{m}");
}

/// f16 storage (TAEHV's own realtime default), the device's first f16
/// path: within 6e-3 of the f32 reference (measured 2.0e-3 native and
/// packed; bf16 measured 2.1e-2, not checked here: each decode costs a
/// minute on lavapipe).
#[test]
fn taew2_1_rand_f16() {
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let contexts = wgvae::testing::dtype_contexts();
    let (ctx, dtype) = contexts
        .into_iter()
        .find(|(_, d)| *d == wgvae::DType::F16)
        .unwrap();
    let store = WeightStore::from_safetensors(&dir.join("taew2_1.safetensors")).unwrap();
    store.set_dtype(dtype);
    let dec = wgvae::Vae::from(TaehvDecoder::load(&ctx, &store).unwrap());
    let got = decode_video(&ctx, &dec, &latents).unwrap();
    let (err, at) = max_abs_diff(&got.data, &want.data);
    let native = ctx.caps().shader_f16;
    println!("taew2_1-rand f16 (native: {native}): raw max abs error {err:.3e} at {at}");
    assert!(err <= 6e-3, "f16: {err} at {at}");
}

/// Wan 2.1 VAE (`AutoencoderKLWan`, small config) within this of the
/// `Context::with_cancel`: a set flag refuses the next chunk with an error
/// before any state changes, so the stream goes on once it is cleared.
#[test]
fn a_cancel_flag_stops_a_stream_between_chunks() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let flag = Arc::new(AtomicBool::new(false));
    let ctx = test_context().with_cancel(flag.clone());
    let dec = load(&ctx, &dir, "taew2_1.safetensors");
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
    stream.push(&chunk(&latents, 0, 0, 1)).unwrap();
    flag.store(true, Ordering::SeqCst);
    let e = stream
        .push(&chunk(&latents, 0, 1, 2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("with_cancel"), "{e}");
    flag.store(false, Ordering::SeqCst);
    stream.push(&chunk(&latents, 0, 1, 2)).unwrap();
    stream.finish().unwrap();
}

/// diffusers golden: 3× the measured 3.4e-6 (the bound is 1e-3).
const WAN_TOLERANCE: f32 = 1e-5;

fn wan(ctx: &Context) -> Option<(PathBuf, wgvae::Vae)> {
    let dir = golden("wan21-tiny")?;
    let dec = wgvae::Vae::from(
        WanDecoder::open(ctx, dir.to_str().unwrap(), wgvae::DType::F32, 0).unwrap(),
    );
    Some((dir, dec))
}

/// Latent frames `t0..t1` of video 0 of Wan latents [1, C, T, h, w] as
/// the [T, C, h, w] chunk a [`VideoDecoder`] takes.
fn wan_chunk(latents: &HostTensor, t0: usize, t1: usize) -> HostTensor {
    let [_, c, t, h, w] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let mut data = Vec::new();
    for f in t0..t1 {
        for ch in 0..c {
            let at = (ch * t + f) * h * w;
            data.extend_from_slice(&latents.data[at..at + h * w]);
        }
    }
    HostTensor::new(vec![t1 - t0, c, h, w], data).unwrap()
}

/// Whole clip and streamed in chunks of 1 and 2 latent frames (one
/// `AutoencoderKLWan._decode` call each decodes frame by frame).
#[test]
fn wan21_tiny() {
    let ctx = test_context();
    let Some((dir, dec)) = wan(&ctx) else { return };
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = decode_video(&ctx, &dec, &latents).unwrap();
    assert_eq!(got.shape, want.shape, "wan21-tiny: output shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("wan21-tiny: whole clip: max abs error {err:.3e} at {at}");
    assert!(
        err <= WAN_TOLERANCE,
        "wan21-tiny: whole clip: {err} at {at}"
    );
    let [_, _, t, ..] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let [_, oc, ot, oh, ow] = want.shape[..] else {
        panic!("decoded is not 5-D")
    };
    for size in [1, 2] {
        let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
        let mut frames = Vec::new();
        for t0 in (0..t).step_by(size) {
            let out = stream
                .decode(&wan_chunk(&latents, t0, (t0 + size).min(t)))
                .unwrap();
            frames.extend(out.data);
        }
        // [T', 3, H, W] → [3, T', H, W].
        let plane = oh * ow;
        assert_eq!(frames.len(), oc * ot * plane, "chunks of {size}: values");
        let mut data = Vec::new();
        for ch in 0..oc {
            for f in 0..ot {
                let at = (f * oc + ch) * plane;
                data.extend_from_slice(&frames[at..at + plane]);
            }
        }
        let (err, at) = max_abs_diff(&data, &want.data);
        let (vs_whole, _) = max_abs_diff(&data, &got.data);
        println!(
            "wan21-tiny: chunks of {size}: max abs error {err:.3e} at {at}, {vs_whole:.3e} from the whole clip"
        );
        assert!(
            err <= WAN_TOLERANCE,
            "wan21-tiny: chunks of {size}: {err} at {at}"
        );
    }
}

/// Wan where a TAEHV file is given, wrong channel count, T = 0, the TAEHV
/// layout: clear errors.
#[test]
fn wan_bad_inputs_are_errors() {
    let ctx = test_context();
    let Some((_, dec)) = wan(&ctx) else { return };
    let Some(taehv) = golden("taew2_1-rand") else {
        return;
    };
    let file = taehv.join("taew2_1.safetensors");
    let m = message(WanDecoder::open(
        &ctx,
        file.to_str().unwrap(),
        wgvae::DType::F32,
        0,
    ));
    assert!(m.contains("TAEHV file"), "{m}");
    let lat = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.1; n]).unwrap()
    };
    let m = message(decode_video(&ctx, &dec, &lat(vec![1, 15, 2, 2, 2])));
    assert!(m.contains("15 channels") && m.contains("Wan"), "{m}");
    let m = message(decode_video(&ctx, &dec, &lat(vec![1, 16, 0, 2, 2])));
    assert!(m.contains("T=0"), "{m}");
    let m = message(decode_video(&ctx, &dec, &lat(vec![16, 2, 2, 2])));
    assert!(m.contains("N×C×T×h×w"), "{m}");
    let m = message(
        VideoDecoder::new(&ctx, &dec)
            .unwrap()
            .decode(&lat(vec![0, 16, 2, 2])),
    );
    assert!(m.contains("T=0"), "{m}");
    let wan_dir = golden("wan21-tiny").unwrap();
    let m = wgvae::testing::video_decoder_refuses_images(&ctx, wan_dir.to_str().unwrap());
    assert!(m.contains("qwen_image_vae"), "{m}");
    println!("errors read: {m}");
}

/// `preset:wan21` (the public config, seeded random weights) loads and
/// decodes one latent frame into one frame.
#[test]
fn wan21_preset_decodes() {
    let ctx = test_context();
    let dec =
        wgvae::Vae::from(WanDecoder::open(&ctx, "preset:wan21", wgvae::DType::F32, 0).unwrap());
    assert_eq!(
        (
            dec.latent_channels(),
            dec.upscale(),
            dec.frames_for(2).unwrap() - dec.frames_for(1).unwrap()
        ),
        (16, 8, 4)
    );
    let z = HostTensor::new(vec![1, 16, 1, 1, 1], vec![0.5; 16]).unwrap();
    let out = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(out.shape, vec![1, 3, 1, 8, 8]);
    assert!(out.data.iter().all(|v| v.is_finite() && v.abs() <= 1.0));
}

/// `wgvae decode latents.npy --vae wan21-tiny --raw-latents --frames-out
/// DIR --chunk 2` writes the golden's 9 frames (±1 level).
#[test]
fn wan_cli_writes_frames() {
    let Some(dir) = golden("wan21-tiny") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("wan-frames");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "decode".to_string(),
            dir.join("latents.npy").display().to_string(),
            "--vae".into(),
            dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(&args)
            .env(
                "WGPU_BACKEND",
                std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
            )
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let outs = out.to_str().unwrap();
    let raw = scratch.path().join("wan-raw.npy");
    let (ok, stdout, err) = run(&[
        "--raw-latents",
        "--frames-out",
        outs,
        "--save-raw",
        raw.to_str().unwrap(),
        "--chunk",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["frames"], 9, "{v}");
    assert_eq!(v["frame_shape"], serde_json::json!([3, 64, 80]), "{v}");
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    // --save-raw: N×3×T'×H×W after the clamp, diffusers' layout and values.
    let got = read_npy(&raw).unwrap();
    std::fs::remove_file(&raw).ok();
    assert_eq!(got.shape, want.shape);
    let (e, at) = max_abs_diff(&got.data, &want.data);
    println!("wan21-tiny CLI --save-raw: max |diff| = {e:.3e} at {at}");
    assert!(e <= WAN_TOLERANCE, "--save-raw differs by {e} at {at}");
    let plane = 64 * 80;
    let range = wgvae::kernels::image::ImageRange::MinusOneToOne;
    for f in 0..9 {
        let frame: Vec<f32> = (0..3)
            .flat_map(|c| {
                let at = (c * 9 + f) * plane;
                want.data[at..at + plane].to_vec()
            })
            .collect();
        let rgba = wgvae::kernels::image::cpu_to_rgba8(&frame, 1, 64, 80, range);
        let png = image::open(out.join(format!("frame_{f:05}.png")))
            .unwrap()
            .to_rgb8()
            .into_raw();
        let worst = wgvae::testing::rgb_of(&rgba)
            .iter()
            .zip(&png)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(worst <= 1, "frame {f} differs by {worst}");
    }
    let (ok, _, err) = run(&[]);
    assert!(!ok && err.contains("--frames-out"), "{err}");
}

/// The diffusers name of a Wan decoder weight → its original
/// `wan/modules/vae.py` name (the inverse of diffusers' conversion script)
/// for `per_block` residual blocks per up stage.
fn wan_original_key(key: &str, per_block: usize) -> Option<String> {
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
    let base = i.parse::<usize>().ok()? * (per_block + 1);
    if let Some(t) = t.strip_prefix("resnets.") {
        let (j, t) = t.split_once('.')?;
        let f = base + j.parse::<usize>().ok()?;
        return Some(format!("decoder.upsamples.{f}.{}", res(t)?));
    }
    let t = t.strip_prefix("upsamplers.0.")?;
    Some(format!("decoder.upsamples.{}.{t}", base + per_block))
}

/// The golden's weights under the original Wan key names in one
/// `.safetensors` file without a config.json (as ComfyUI ships
/// `wan_2.1_vae.safetensors`) decode exactly as the diffusers folder.
#[test]
fn wan_original_keys_load() {
    let ctx = test_context();
    let Some((dir, dec)) = wan(&ctx) else { return };
    let bytes = std::fs::read(dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = Vec::new();
    for name in st.names() {
        let Some(key) = wan_original_key(name, 2) else {
            continue;
        };
        tensors.push((key, st.tensor(name).unwrap()));
    }
    assert!(tensors.len() > 50);
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("wan-orig");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join("wan_2.1_vae.safetensors");
    safetensors::serialize_to_file(tensors, None, &file).unwrap();
    let orig = WanDecoder::open(&ctx, file.to_str().unwrap(), wgvae::DType::F32, 0).unwrap();
    assert_eq!(orig.config().base_dim, 16);
    assert_eq!(orig.config().num_res_blocks, 1);
    assert_eq!(orig.config().temperal_downsample, vec![false, true, true]);
    let orig = wgvae::Vae::from(orig);
    let z = HostTensor::new(
        vec![1, 16, 2, 4, 4],
        wgvae::testing::rand_vec(16 * 2 * 16, 3, 1.0),
    )
    .unwrap();
    let a = decode_video(&ctx, &orig, &z).unwrap();
    let b = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(a.data, b.data);
}

/// Streaming Wan holds only its caches between chunks: the same peak
/// allocated for 4 and 12 latent frames.
#[test]
fn wan_streaming_memory_is_flat_in_video_length() {
    let Some(dir) = golden("wan21-tiny") else {
        return;
    };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let dec = wgvae::Vae::from(
        WanDecoder::open(&ctx, dir.to_str().unwrap(), wgvae::DType::F32, 0).unwrap(),
    );
    let (h, w) = (2, 3);
    let mut peaks = Vec::new();
    let mut caches = Vec::new();
    for frames in [4, 12] {
        ctx.pool().reset_peak_stats();
        let mut stream = VideoDecoder::new(&ctx, &dec).unwrap();
        let mut out = 0;
        for t in 0..frames {
            let z = HostTensor::new(
                vec![1, 16, h, w],
                wgvae::testing::rand_vec(16 * h * w, t as u64, 1.0),
            )
            .unwrap();
            out += stream.decode(&z).unwrap().shape[0];
        }
        assert_eq!(out, 4 * frames - 3);
        caches.push(stream.cache_bytes());
        peaks.push(ctx.pool().stats().allocated_bytes.peak);
    }
    println!(
        "wan streaming peak allocated: 4 frames {} B, 12 frames {} B; caches {} B",
        peaks[0], peaks[1], caches[1]
    );
    assert_eq!(peaks[0], peaks[1]);
    assert_eq!(caches[0], caches[1]);
    // The null-device estimate is that peak, caches included.
    let e = wgvae::estimate::Estimate::new(
        ctx.caps(),
        wgvae::memory::Policy::Exact,
        dir.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .video((8 * h, 8 * w), 12, 1)
    .unwrap();
    assert_eq!(e.peak_allocated_bytes, peaks[0], "{e:?}");
    assert_eq!(e.cache_bytes, caches[0]);
    assert_eq!(e.output_frames, 4 * 12 - 3);
}

/// `preset:wan21` streaming 480×832 in bf16 on the reference GPU: the
/// predicted peak (2.20 GiB: weights 146 MiB, causal caches 1.80 GiB,
/// activations 0.30 GiB; the stages after each time up-sampling run one
/// frame at a time) is under issue #16's 2.5 GiB, against PyTorch's 10.1 GB
/// for 81 frames, and does not grow from 81 to 161 frames (a dry run, no
/// decode).
#[test]
fn wan21_preset_480p_estimate_is_flat_and_under_2_5_gib() {
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    let load = LoadOptions {
        precision: wgvae::models::Precision::BF16,
        ..Default::default()
    };
    let mut peaks = Vec::new();
    for frames in [21, 41] {
        let e = wgvae::estimate::Estimate::new(
            &caps,
            wgvae::memory::Policy::Planned,
            "preset:wan21",
            &load,
        )
        .video((480, 832), frames, wgvae::video::DEFAULT_CHUNK)
        .unwrap();
        println!(
            "preset:wan21 480x832 bf16, {frames} latent frames ({} out): peak allocated {:.1} MiB, reserved {:.1} MiB (weights {:.1}, caches {:.1}, activations {:.1}, staging {:.1} MiB)",
            e.output_frames,
            e.peak_allocated_bytes as f64 / 1048576.0,
            e.peak_reserved_bytes as f64 / 1048576.0,
            e.weights_bytes as f64 / 1048576.0,
            e.cache_bytes as f64 / 1048576.0,
            e.activation_bytes as f64 / 1048576.0,
            e.staging_bytes as f64 / 1048576.0,
        );
        assert_eq!(e.output_frames, 4 * frames - 3);
        assert!(e.peak_reserved_bytes <= 2560 << 20, "{e:?}");
        assert!(e.peak_allocated_bytes <= 2560 << 20, "{e:?}");
        peaks.push((e.peak_allocated_bytes, e.peak_reserved_bytes));
    }
    assert_eq!(peaks[0], peaks[1]);
}

/// Wan 2.2 at 720p in bf16 with the reference GPU's limits: streamed peak is
/// flat in the number of latent frames (causal caches) and stays under 5 GiB
/// (docs/video.md: 5 039 MiB measured 2026-11-29).
#[test]
fn wan22_preset_720p_estimate_is_flat_and_under_5_gib() {
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    let load = LoadOptions {
        precision: wgvae::models::Precision::BF16,
        ..Default::default()
    };
    let mut peaks = Vec::new();
    for frames in [31, 61] {
        let e = wgvae::estimate::Estimate::new(
            &caps,
            wgvae::memory::Policy::Planned,
            "preset:wan22",
            &load,
        )
        .video((720, 1280), frames, wgvae::video::DEFAULT_CHUNK)
        .unwrap();
        println!(
            "preset:wan22 720x1280 bf16, {frames} latent frames ({} out): peak allocated {:.1} MiB, reserved {:.1} MiB",
            e.output_frames,
            e.peak_allocated_bytes as f64 / 1048576.0,
            e.peak_reserved_bytes as f64 / 1048576.0,
        );
        assert_eq!(e.output_frames, 4 * frames - 3);
        assert!(e.peak_allocated_bytes <= 5120 << 20, "{e:?}");
        peaks.push((e.peak_allocated_bytes, e.peak_reserved_bytes));
    }
    assert_eq!(peaks[0], peaks[1]);
}

/// f16 storage (f32 arithmetic) of the Wan decoder against the f32
/// diffusers golden.
#[test]
fn wan21_tiny_f16() {
    let Some(dir) = golden("wan21-tiny") else {
        return;
    };
    let contexts = wgvae::testing::dtype_contexts();
    let (ctx, dtype) = contexts
        .into_iter()
        .find(|(_, d)| *d == wgvae::DType::F16)
        .unwrap();
    let dec = wgvae::Vae::from(WanDecoder::open(&ctx, dir.to_str().unwrap(), dtype, 0).unwrap());
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = decode_video(&ctx, &dec, &latents).unwrap();
    let (err, at) = max_abs_diff(&got.data, &want.data);
    let native = ctx.caps().shader_f16;
    println!("wan21-tiny f16 (native: {native}): max abs error {err:.3e} at {at}");
    assert!(err <= WAN_F16_TOLERANCE, "f16: {err} at {at}");
}

/// 3× the measured f16 error (4.9e-3, native f16 on lavapipe).
const WAN_F16_TOLERANCE: f32 = 1.5e-2;

/// Exact tiles vs the untiled decode: float rounding only (the bound).
const TILED_TOLERANCE: f32 = 1e-3;

/// The frames of `chunks` streamed through an exact tiled [`VideoDecoder`]
/// with tiles of `px` output pixels; `tight`: a budget of 2 MiB beyond
/// what is allocated (the weights), so most tiles and caches park in host
/// memory.
fn tiled_frames(
    ctx: &Context,
    dec: &wgvae::Vae,
    chunks: &[HostTensor],
    px: usize,
    tight: bool,
) -> Vec<f32> {
    let mut tiling = wgvae::tiling::Tiling::exact().with_tile_size(px);
    if tight {
        tiling = tiling.with_max_memory(ctx.pool().stats().allocated_bytes.current + (2 << 20));
    }
    let mut stream = VideoDecoder::new(ctx, dec)
        .unwrap()
        .with_tiling(tiling)
        .unwrap();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(stream.decode(c).unwrap().data);
    }
    assert!(stream.tile_size().is_some(), "the decode ran untiled");
    out
}

/// Tiled `got` against the untiled decode and the golden (same layout).
fn check_close(name: &str, what: &str, got: &[f32], untiled: &[f32], golden: &[f32]) {
    assert_eq!(got.len(), untiled.len(), "{name}: {what}: values");
    let (e, at) = max_abs_diff(got, untiled);
    let (g, gat) = max_abs_diff(got, golden);
    println!("{name}: exact tiles, {what}: {e:.3e} from untiled (at {at}), {g:.3e} from the golden (at {gat})");
    assert!(
        e <= TILED_TOLERANCE,
        "{name}: {what}: {e} from untiled at {at}"
    );
    assert!(
        g <= TILED_TOLERANCE,
        "{name}: {what}: {g} from the golden at {gat}"
    );
}

/// TAEHV in exact tiles of `px` output pixels (several per level, odd edge
/// tiles): whole clip, and streamed in chunks of 1 with tiles parked in host memory.
fn check_tiled(name: &str, file: &str, px: usize) {
    let Some(dir) = golden(name) else { return };
    let ctx = test_context();
    let dec = load(&ctx, &dir, file);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let [1, t, ..] = latents.shape[..] else {
        panic!("one video expected")
    };
    let clip = chunk(&latents, 0, 0, t);
    let untiled = VideoDecoder::new(&ctx, &dec)
        .unwrap()
        .decode(&clip)
        .unwrap()
        .data;
    let whole = tiled_frames(&ctx, &dec, std::slice::from_ref(&clip), px, false);
    check_close(name, "whole clip", &whole, &untiled, &want.data);
    let ones: Vec<HostTensor> = (0..t).map(|t0| chunk(&latents, 0, t0, t0 + 1)).collect();
    let streamed = tiled_frames(&ctx, &dec, &ones, px, true);
    check_close(
        name,
        "chunks of 1, parked on the host",
        &streamed,
        &untiled,
        &want.data,
    );
}

/// 64×80 frames (8×10 latents) in 40-pixel tiles: 2×2 tiles at every
/// level, the last row 24 (latent 3) high, the last column 40.
#[test]
fn taew2_1_rand_exact_tiles() {
    check_tiled("taew2_1-rand", "taew2_1.safetensors", 40);
}

/// Patch size 2: 40-pixel output tiles are 24-pixel graph tiles over its
/// 32×48 output (latent 4×6: tiles of 3, the last row 1 high).
#[test]
fn taew2_2_rand_exact_tiles() {
    check_tiled("taew2_2-rand", "taew2_2.safetensors", 40);
}

/// Wan 2.1 (RMS norms, causal 3-tap convs, time up-sampling, the
/// mid-block's per-frame attention streamed over K/V tiles) in 40-pixel
/// tiles (as taew2_1's): whole clip and streamed in chunks of 1.
#[test]
fn wan21_tiny_exact_tiles() {
    let ctx = test_context();
    let Some((dir, dec)) = wan(&ctx) else { return };
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let [_, _, t, ..] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let [_, oc, ot, oh, ow] = want.shape[..] else {
        panic!("decoded is not 5-D")
    };
    // [T', 3, H, W] → [3, T', H, W] (the golden's layout).
    let channels_first = |frames: &[f32]| -> Vec<f32> {
        let plane = oh * ow;
        let mut data = Vec::new();
        for ch in 0..oc {
            for f in 0..ot {
                let at = (f * oc + ch) * plane;
                data.extend_from_slice(&frames[at..at + plane]);
            }
        }
        data
    };
    let clip = wan_chunk(&latents, 0, t);
    let untiled = channels_first(
        &VideoDecoder::new(&ctx, &dec)
            .unwrap()
            .decode(&clip)
            .unwrap()
            .data,
    );
    let whole = channels_first(&tiled_frames(
        &ctx,
        &dec,
        std::slice::from_ref(&clip),
        40,
        false,
    ));
    check_close("wan21-tiny", "whole clip", &whole, &untiled, &want.data);
    let ones: Vec<HostTensor> = (0..t).map(|t0| wan_chunk(&latents, t0, t0 + 1)).collect();
    let streamed = channels_first(&tiled_frames(&ctx, &dec, &ones, 40, true));
    check_close(
        "wan21-tiny",
        "chunks of 1, parked on the host",
        &streamed,
        &untiled,
        &want.data,
    );
}

/// `decode VIDEO --vae taew2_1 --tile exact --tile-size 40 --save-raw`:
/// the raw output equals the golden within the tiled bound and the JSON
/// says exact tiles; `--tile fast` is refused.
#[test]
fn cli_exact_tiles() {
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let run = |extra: &[&str]| {
        let mut args = vec![
            "decode".to_string(),
            dir.join("latents.npy").display().to_string(),
            "--vae".into(),
            dir.join("taew2_1.safetensors").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(&args)
            .env(
                "WGPU_BACKEND",
                std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
            )
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let scratch = tempfile::tempdir().unwrap();
    let raw = scratch.path().join("vtile-raw.npy");
    let raws = raw.to_str().unwrap();
    let (ok, stdout, err) = run(&[
        "--tile",
        "exact",
        "--tile-size",
        "40",
        "--save-raw",
        raws,
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["tiling"], "exact", "{v}");
    assert_eq!(v["tile_size"], 40, "{v}");
    let want = read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let got = read_npy(&raw).unwrap();
    std::fs::remove_file(&raw).ok();
    assert_eq!(got.shape, want.shape);
    let (e, at) = max_abs_diff(&got.data, &want.data);
    println!("taew2_1-rand CLI --tile exact: max |diff| = {e:.3e} at {at}");
    assert!(e <= TILED_TOLERANCE, "--tile exact differs by {e} at {at}");
    let (ok, _, err) = run(&["--tile", "fast", "--save-raw", raws]);
    assert!(!ok && err.contains("--tile exact"), "{err}");
}

/// The null-device estimate covers exact tiles. Untiled, taew2_1's
/// 1024×1024 frames need a 256 MiB tensor (one frame × 64 × 1024² after a
/// time grow: the stages after it run a frame at a time), over the device's
/// storage binding limit (128 MiB on lavapipe). At 512×512 the untiled decode
/// fits (64 MiB per frame tensor); in 128-pixel tiles within a 96 MiB budget
/// (half of it for parked tiles, the rest parked in host memory) it stays
/// within the budget and below the untiled peak.
#[test]
fn exact_tiles_estimate_below_untiled() {
    let Some(dir) = golden("taew2_1-rand") else {
        return;
    };
    let caps = test_context().caps().clone();
    let vae = dir.join("taew2_1.safetensors");
    let load = LoadOptions::default();
    let est = || {
        wgvae::estimate::Estimate::new(
            &caps,
            wgvae::memory::Policy::Exact,
            vae.to_str().unwrap(),
            &load,
        )
    };
    if caps.max_storage_buffer_binding_size < 256 << 20 {
        let m = message(est().video((1024, 1024), 2, 1));
        assert!(m.contains("256") || m.contains("binding"), "{m}");
    }
    let untiled = est().video((512, 512), 3, 1).unwrap();
    let budget = 96 << 20;
    let tiling = wgvae::tiling::Tiling::exact()
        .with_tile_size(128)
        .with_max_memory(budget);
    let tiled = est().video_tiled((512, 512), 3, 1, &tiling).unwrap();
    println!(
        "taew2_1 512×512, chunks of 1: exact 128-px tiles peak allocated {} B (caches {} B)",
        tiled.peak_allocated_bytes, tiled.cache_bytes
    );
    assert_eq!(tiled.tile_size, Some(128));
    // 3 blocks each of 256×64², 128×128², 64×256² f32 values: whole frames,
    // their tiles parked on the device (pool memory, `cache_bytes`) or in
    // host memory.
    let whole = 3 * 4 * (256 * 64 * 64 + 128 * 128 * 128 + 64 * 256 * 256);
    let t = tiled
        .tiling
        .as_ref()
        .expect("an exact tiled estimate reports its tiling");
    assert!(tiled.cache_bytes <= whole && tiled.cache_bytes <= t.device_parked_peak_bytes);
    assert!(
        whole - tiled.cache_bytes <= t.host_parked_peak_bytes,
        "{} B of caches on the device, {} B parked on the host at most",
        tiled.cache_bytes,
        t.host_parked_peak_bytes
    );
    assert!(tiled.peak_allocated_bytes <= budget);
    assert!(
        tiled.peak_allocated_bytes < untiled.peak_allocated_bytes,
        "tiled {} B, untiled {} B",
        tiled.peak_allocated_bytes,
        untiled.peak_allocated_bytes
    );
}

/// Exact video tiles that would park more in host memory than the run may
/// use (`Tiling::max_host_memory`, else what the host has available) stop
/// with an error naming the limit, before the host runs out; with room the
/// same video decodes.
#[test]
fn exact_video_tiles_keep_the_host_limit() {
    let Some(dir) = golden("wan21-tiny") else {
        return;
    };
    let ctx = test_context().with_pool(wgvae::memory::Policy::Exact.new_pool());
    let load = LoadOptions::default();
    let vae = wgvae::Vae::load(&ctx, dir.to_str().unwrap(), &load).unwrap();
    let weights = ctx.pool().stats().allocated_bytes.current;
    let z = HostTensor::new(
        vec![2, 16, 8, 10],
        wgvae::testing::rand_vec(2 * 16 * 80, 3, 1.0),
    )
    .unwrap();
    let decode = |host: u64| {
        let tiling = wgvae::tiling::Tiling::exact()
            .with_tile_size(16)
            .with_max_memory(weights + (64 << 10))
            .with_max_host_memory(host);
        let mut stream = VideoDecoder::new(&ctx, &vae).unwrap();
        stream.set_tiling(tiling).unwrap();
        stream.decode(&z).map(|_| stream.tiling_report().unwrap())
    };
    let m = message(decode(256 << 10));
    assert!(
        m.contains("max_host_memory") && m.contains("host memory"),
        "{m}"
    );
    let report = decode(1 << 30).unwrap();
    assert!(report.host_parked_peak_bytes > 256 << 10, "{report:?}");
}

/// A chunk whose decoded frames (f32, held in host memory) cannot fit the
/// host's available memory is refused before it runs, naming the sizes.
#[test]
fn video_chunks_whose_frames_cannot_fit_the_host_are_refused() {
    let Some(dir) = golden("wan21-tiny") else {
        return;
    };
    let ctx = test_context();
    let load = LoadOptions::default();
    let vae = wgvae::Vae::load(&ctx, dir.to_str().unwrap(), &load).unwrap();
    let avail = wgvae::tiling::host_memory_available().unwrap_or(u64::MAX);
    // Wan: a chunk of one latent frame gives 4 frames (8× up, 3 f32 planes)
    // once the first has passed: the most a chunk of one gives. Twice what is
    // available, so that memory other tests free meanwhile cannot make it fit.
    let per_latent_pixel = 4 * 12 * 64u64;
    let side = ((2 * avail / per_latent_pixel) as f64).sqrt() as usize + 1;
    if (64 * side * side) as u64 > avail / 4 {
        println!("skipped: {avail} bytes available are too few for the latents");
        return;
    }
    let z = HostTensor::new(vec![1, 16, side, side], vec![0.0; 16 * side * side]).unwrap();
    let mut stream = VideoDecoder::new(&ctx, &vae).unwrap();
    let started = std::time::Instant::now();
    let m = message(stream.decode(&z));
    assert!(
        m.contains(&format!("{0}x{0}", 8 * side)) && m.contains("available memory"),
        "{m}"
    );
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}
