//! The Qwen-Image VAE (`AutoencoderKLQwenImage`) against the diffusers
//! golden `../shared/golden/qwenimage-tiny`: raw z and pipeline latents,
//! 5-D (N×16×1×h×w) and 4-D, untiled and in exact tiles, f32 / f16 / bf16,
//! the original-key single file, memory estimates, and the errors of bad
//! input. Errors are printed (`-- --nocapture`) for docs/models.md.

use std::path::{Path, PathBuf};

use wgvae::estimate::Estimate;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::Policy;
use wgvae::models::Precision;
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::tiling::Tiling;
use wgvae::{decode, Context, DecodeOptions, LoadOptions, Vae};

/// f32 against diffusers (the bound).
const F32_TOLERANCE: f32 = 2e-4;
/// Exact tiles against the untiled decode in the same precision.
const TILES_TOLERANCE: f32 = 1e-3;

fn golden() -> Option<PathBuf> {
    let dir = shared_dir()?.join("golden/qwenimage-tiny");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return None;
    }
    Some(dir)
}

fn load(ctx: &Context, spec: &Path, precision: Precision) -> Vae {
    let opts = LoadOptions {
        precision,
        ..Default::default()
    };
    Vae::load(ctx, spec.to_str().unwrap(), &opts).unwrap()
}

fn run(ctx: &Context, vae: &Vae, z: &HostTensor, raw: bool, tiling: Tiling) -> wgvae::Decoded {
    let opts = DecodeOptions {
        raw_latents: raw,
        keep_raw: true,
        tiling,
        ..Default::default()
    };
    decode(ctx, vae, z, &opts).unwrap()
}

fn exact() -> Tiling {
    Tiling {
        tile_mid_block: true,
        ..Tiling::exact().with_tile_size(32)
    }
}

/// z.npy and latents.npy, whole and in exact tiles, decode to decoded.npy
/// within 2e-4 in f32; f16 / bf16 errors are measured and bounded.
#[test]
fn decodes_the_golden() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    assert_eq!(want.shape, vec![1, 3, 1, 96, 128]);
    // Measured on lavapipe (docs/models.md): f16 3.6e-3, bf16 2.8e-2;
    // bounds about 3× them (f32: the 2e-4, measured 1.5e-6).
    for (precision, bound) in [
        (Precision::F32, F32_TOLERANCE),
        (Precision::F16, 1.1e-2),
        (Precision::BF16, 8.5e-2),
    ] {
        let vae = load(&ctx, &dir, precision);
        assert_eq!(vae.latent_channels(), 16);
        assert_eq!(vae.upscale(), 8);
        let whole = run(&ctx, &vae, &z, true, Tiling::off());
        assert_eq!(whole.tiling.mode, "untiled");
        let raw = whole.raw.as_ref().unwrap();
        assert_eq!(raw.shape, vec![1, 3, 96, 128]);
        let (err, at) = max_abs_diff(&raw.data, &want.data);
        println!("qwenimage-tiny {precision:?} z.npy untiled: max abs error {err:.3e} at {at}");
        assert!(
            err <= bound,
            "{precision:?} untiled: {err} > {bound} at {at}"
        );

        let pipe = run(&ctx, &vae, &latents, false, Tiling::off());
        let (err, at) = max_abs_diff(&pipe.raw.unwrap().data, &want.data);
        println!(
            "qwenimage-tiny {precision:?} latents.npy untiled: max abs error {err:.3e} at {at}"
        );
        assert!(
            err <= bound,
            "{precision:?} pipeline latents: {err} > {bound}"
        );

        // 4-D latents: the same decode.
        let mut z4 = z.clone();
        z4.shape = vec![1, 16, 12, 16];
        let four = run(&ctx, &vae, &z4, true, Tiling::off());
        assert!(
            four.raw.unwrap().data == raw.data,
            "4-D and 5-D latents differ"
        );

        let tiled = run(&ctx, &vae, &latents, false, exact());
        assert_eq!(tiled.tiling.mode, "exact");
        assert!(tiled.tiling.tiles > 1, "{:?}", tiled.tiling);
        let traw = tiled.raw.unwrap();
        let (vs_whole, at) = max_abs_diff(&traw.data, &raw.data);
        let (err, _) = max_abs_diff(&traw.data, &want.data);
        println!(
            "qwenimage-tiny {precision:?} exact tiles ({} tiles of {:?}): {vs_whole:.3e} from untiled at {at}, {err:.3e} from diffusers",
            tiled.tiling.tiles, tiled.tiling.tile_size
        );
        assert!(
            vs_whole <= TILES_TOLERANCE,
            "{precision:?} tiles: {vs_whole}"
        );
        assert!(
            err <= bound,
            "{precision:?} tiles vs diffusers: {err} > {bound}"
        );
        if precision == Precision::F32 {
            // Fast tiles (diffusers-style, independent): they run too.
            let fast = run(
                &ctx,
                &vae,
                &z,
                true,
                Tiling::fast().with_tile_size(64).with_overlap(16),
            );
            assert_eq!(fast.tiling.mode, "fast");
            let fraw = fast.raw.unwrap();
            assert_eq!(fraw.shape, vec![1, 3, 96, 128]);
            assert!(fraw.data.iter().all(|v| v.abs() <= 1.0), "clamped");
            assert!(
                tiled.rgba == whole.rgba || max_abs_diff(&traw.data, &raw.data).0 < 1e-4,
                "tiled pixels"
            );
        }
    }
}

/// A batch of two images decodes each as alone (the batch is no time axis).
#[test]
fn batch_is_independent_images() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let vae = load(&ctx, &dir, Precision::F32);
    let mut flipped = z.data.clone();
    flipped.reverse();
    let mut two = z.data.clone();
    two.extend(&flipped);
    let batch = HostTensor::new(vec![2, 16, 1, 12, 16], two).unwrap();
    let got = run(&ctx, &vae, &batch, true, Tiling::off());
    let alone = run(&ctx, &vae, &z, true, Tiling::off());
    let got = got.raw.unwrap();
    let half = got.data.len() / 2;
    let (err, _) = max_abs_diff(&got.data[..half], &alone.raw.unwrap().data);
    assert!(err <= 1e-6, "first image of a batch: {err}");
    let other = HostTensor::new(vec![1, 16, 1, 12, 16], flipped).unwrap();
    let other = run(&ctx, &vae, &other, true, Tiling::off()).raw.unwrap();
    let (err, _) = max_abs_diff(&got.data[half..], &other.data);
    assert!(err <= 1e-6, "second image of a batch: {err}");
}

/// The safetensors of `dir` renamed to the original Wan keys (ComfyUI's
/// `qwen_image_vae.safetensors` layout), written to `out`.
fn write_original_layout(dir: &Path, out: &Path, per_block: usize) {
    let bytes = std::fs::read(dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let residual = |t: &str| -> String {
        for (to, from) in [
            ("residual.0.gamma", "norm1.gamma"),
            ("residual.2.", "conv1."),
            ("residual.3.gamma", "norm2.gamma"),
            ("residual.6.", "conv2."),
            ("shortcut.", "conv_shortcut."),
        ] {
            if let Some(rest) = t.strip_prefix(from) {
                return format!("{to}{rest}");
            }
        }
        panic!("unmapped {t}")
    };
    let rename = |k: &str| -> Option<String> {
        if let Some(t) = k.strip_prefix("post_quant_conv.") {
            return Some(format!("conv2.{t}"));
        }
        if let Some(t) = k.strip_prefix("quant_conv.") {
            return Some(format!("conv1.{t}"));
        }
        let t = k.strip_prefix("decoder.")?;
        let map = [
            ("conv_in.", "conv1."),
            ("norm_out.", "head.0."),
            ("conv_out.", "head.2."),
            ("mid_block.attentions.0.", "middle.1."),
        ];
        for (from, to) in map {
            if let Some(rest) = t.strip_prefix(from) {
                return Some(format!("decoder.{to}{rest}"));
            }
        }
        if let Some(rest) = t.strip_prefix("mid_block.resnets.") {
            let (i, rest) = rest.split_once('.').unwrap();
            let m = if i == "0" { 0 } else { 2 };
            return Some(format!("decoder.middle.{m}.{}", residual(rest)));
        }
        let rest = t.strip_prefix("up_blocks.")?;
        let (stage, rest) = rest.split_once('.').unwrap();
        let stage: usize = stage.parse().unwrap();
        if let Some(rest) = rest.strip_prefix("resnets.") {
            let (j, rest) = rest.split_once('.').unwrap();
            let f = stage * (per_block + 1) + j.parse::<usize>().unwrap();
            return Some(format!("decoder.upsamples.{f}.{}", residual(rest)));
        }
        let rest = rest.strip_prefix("upsamplers.0.").unwrap();
        let f = stage * (per_block + 1) + per_block;
        Some(format!("decoder.upsamples.{f}.{rest}"))
    };
    let tensors: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter_map(|(k, v)| rename(&k).map(|k| (k, v)))
        .collect();
    safetensors::serialize_to_file(tensors, None, out).unwrap();
}

/// ComfyUI's single file (original Wan keys, no config.json) decodes like
/// the folder, with the released latents statistics named in its name;
/// without `qwen` in its name it is a Wan 2.1 video VAE (with a hint).
#[test]
fn single_file_in_original_keys() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let scratch = tempfile::tempdir().unwrap();
    let tmp = scratch.path().join("qwen");
    std::fs::create_dir_all(&tmp).unwrap();
    let file = tmp.join("qwen_image_vae.safetensors");
    write_original_layout(&dir, &file, 2);
    let vae = load(&ctx, &file, Precision::F32);
    assert!(vae.name().contains("released Qwen-Image"), "{}", vae.name());
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = run(&ctx, &vae, &latents, false, Tiling::off());
    let (err, at) = max_abs_diff(&got.raw.unwrap().data, &want.data);
    println!("qwen_image_vae.safetensors (original keys): max abs error {err:.3e} at {at}");
    assert!(err <= F32_TOLERANCE, "{err} at {at}");
    assert!(!wgvae::video::is_video_vae(file.to_str().unwrap()));

    let wan = tmp.join("wan_2.1_vae.safetensors");
    std::fs::copy(&file, &wan).unwrap();
    assert!(wgvae::video::is_video_vae(wan.to_str().unwrap()));
    // Named as a Wan file, it loads as the Wan video decoder; decoding
    // images with it says how to read it as Qwen-Image.
    let as_wan = Vae::load(&ctx, wan.to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert_eq!(as_wan.kind(), wgvae::ModelKind::VideoDecoder);
    let image = HostTensor::new(vec![1, 16, 2, 2], vec![0.0; 64]).unwrap();
    let e = wgvae::decode(&ctx, &as_wan, &image, &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("is a video decoder") && e.contains("qwen_image_vae"),
        "{e}"
    );
    // The same file with the Qwen-Image config given decodes images.
    let opts = LoadOptions {
        config: Some(dir.join("config.json")),
        ..Default::default()
    };
    let vae = Vae::load(&ctx, wan.to_str().unwrap(), &opts).unwrap();
    assert!(vae.name().contains("config.json"), "{}", vae.name());
}

/// Estimates (null device) equal what decodes measure, untiled and tiled.
#[test]
fn estimates_equal_measured() {
    let Some(dir) = golden() else { return };
    let base = test_context();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let spec = dir.to_str().unwrap();
    for precision in [Precision::F32, Precision::BF16] {
        for tiling in [Tiling::off(), exact()] {
            let policy = Policy::Exact;
            let ctx = base.with_pool(policy.new_pool());
            let load = LoadOptions {
                precision,
                ..Default::default()
            };
            let vae = Vae::load(&ctx, spec, &load).unwrap();
            let real = run(&ctx, &vae, &latents, false, tiling.clone());
            let est = Estimate::new(ctx.caps(), policy, spec, &load)
                .tiled(&tiling)
                .decode([1, 16, 12, 16])
                .unwrap();
            println!(
                "{precision:?} {}: peak allocated {} B, predicted {} B",
                real.tiling.mode, real.memory.allocated_bytes.peak, est.peak_allocated_bytes
            );
            assert_eq!(est.weights_bytes, vae.weights_bytes());
            assert_eq!(est.peak_allocated_bytes, real.memory.allocated_bytes.peak);
        }
    }
}

/// The preset (public config, seeded random weights) loads and decodes.
#[test]
fn preset_decodes() {
    let ctx = test_context();
    let vae = Vae::load(&ctx, "preset:qwenimage", &LoadOptions::default()).unwrap();
    assert!(vae.random_weights());
    assert_eq!(vae.latent_channels(), 16);
    let z = HostTensor::new(vec![1, 16, 2, 3], wgvae::testing::rand_vec(96, 5, 1.0)).unwrap();
    let out = run(&ctx, &vae, &z, false, Tiling::off());
    assert_eq!((out.width, out.height), (24, 16));
}

/// Bad input: clear errors, nothing allocated.
#[test]
fn bad_latents_are_clear_errors() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let vae = load(&ctx, &dir, Precision::F32);
    let err = |shape: Vec<usize>| {
        let n = shape.iter().product();
        let z = HostTensor::new(shape, vec![0.1; n]).unwrap();
        decode(&ctx, &vae, &z, &DecodeOptions::default())
            .err()
            .unwrap()
            .to_string()
    };
    let m = err(vec![1, 16, 3, 12, 16]);
    assert!(
        m.contains("3 latent frames") && m.contains("decode_video"),
        "{m}"
    );
    let m = err(vec![1, 4, 1, 12, 16]);
    assert!(m.contains("N×16×1×h×w"), "{m}");
    let m = err(vec![1, 1, 16, 12, 16]);
    assert!(m.contains("TAEHV"), "{m}");
    let m = err(vec![1, 4, 12, 16]);
    assert!(m.contains("4 channels") && m.contains("16"), "{m}");
    let m = err(vec![1, 16, 1, 1, 12, 16]);
    assert!(m.contains("rank 6"), "{m}");
    let huge = HostTensor::new(vec![1, 16, 1, 2, 2], vec![3e38; 64]).unwrap();
    let m = decode(&ctx, &vae, &huge, &DecodeOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(m.contains("overflow"), "{m}");
    let opts = LoadOptions {
        scaling_factor: Some(0.5),
        ..Default::default()
    };
    let m = Vae::load(&ctx, dir.to_str().unwrap(), &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(m.contains("latents_mean"), "{m}");
    for spec in [dir.to_str().unwrap(), "preset:qwenimage"] {
        let m = wgvae::Vae::load_encoder(&ctx, spec, &LoadOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            m.contains("encoder") && m.contains("not implemented"),
            "{m}"
        );
    }
}

/// The CLI decodes pipeline latents (default), packed tokens (--size) and
/// raw z (--raw-latents), whole and in exact tiles, to decoded.npy within 2e-4.
#[test]
fn cli_decodes_the_golden() {
    let Some(dir) = golden() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let tmp = scratch.path().join("qwen-cli");
    std::fs::create_dir_all(&tmp).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let exe = wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae"));
    for (input, raw, tiles) in [
        ("latents.npy", false, false),
        ("z.npy", true, false),
        ("latents.npy", false, true),
        ("latents_packed.npy", false, false),
    ] {
        let out = tmp.join(format!("out-{raw}-{tiles}.png"));
        let save = tmp.join(format!("raw-{raw}-{tiles}.npy"));
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("decode")
            .arg(dir.join(input))
            .arg("--vae")
            .arg(&dir)
            .arg("-o")
            .arg(&out)
            .arg("--save-raw")
            .arg(&save);
        if raw {
            cmd.arg("--raw-latents");
        }
        if tiles {
            cmd.args(["--tile", "exact", "--tile-size", "32"]);
        }
        if input == "latents_packed.npy" {
            // A 6×8 token grid is not square: the image size says how it unpacks.
            cmd.args(["--size", "96x128"]);
        }
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "{input}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = read_npy(&save).unwrap();
        let (err, at) = max_abs_diff(&got.data, &want.data);
        println!("CLI {input} raw={raw} tiles={tiles}: max abs error {err:.3e} at {at}");
        assert!(err <= F32_TOLERANCE, "{input}: {err} at {at}");
        assert!(out.exists());
    }
}

/// Streamed frames (`decode_frames`) un-normalise per channel like `decode`.
#[test]
fn frames_match_decode() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let vae = load(&ctx, &dir, Precision::F32);
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let mut two = z.data.clone();
    two.extend(z.data.iter().map(|v| -v));
    let batch = HostTensor::new(vec![2, 16, 12, 16], two).unwrap();
    let whole = decode(&ctx, &vae, &batch, &DecodeOptions::default()).unwrap();
    let opts = wgvae::FramesOptions {
        chunk: Some(1),
        ..Default::default()
    };
    let mut frames = Vec::new();
    wgvae::decode_frames(&ctx, &vae, &batch, &opts, |f| {
        frames.push(f.rgba.to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(frames.len(), 2);
    for (i, (a, b)) in frames.iter().zip(&whole.rgba).enumerate() {
        let off = a.iter().zip(b).filter(|(x, y)| x.abs_diff(**y) > 1).count();
        assert_eq!(off, 0, "frame {i}: {off} bytes differ by more than 1");
    }
}

/// The pipeline's packed tokens (N×L×64, 2×2 patches of the 16 channels)
/// unpack to latents.npy exactly and decode to decoded.npy; without a size a
/// non-square grid is an error naming the size.
#[test]
fn packed_tokens_decode_to_the_golden() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let vae = load(&ctx, &dir, Precision::F32);
    let tokens = read_npy(&dir.join("latents_packed.npy")).unwrap();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let maps = vae.unpack_tokens(&tokens, Some((96, 128))).unwrap();
    assert_eq!(maps.shape, vec![1, 16, 12, 16]);
    assert_eq!(
        maps.data, latents.data,
        "tokens unpack to latents.npy bit for bit"
    );
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let got = run(&ctx, &vae, &maps, false, Tiling::default());
    let (err, at) = max_abs_diff(&got.raw.unwrap().data, &want.data);
    println!("qwenimage-tiny from packed tokens: max abs error {err:.3e} at {at}");
    assert!(err <= F32_TOLERANCE, "{err} at {at}");
    let e = decode(&ctx, &vae, &tokens, &DecodeOptions::default())
        .err()
        .expect("a 6×8 token grid without a size");
    assert!(e.to_string().contains("size"), "{e}");
}
