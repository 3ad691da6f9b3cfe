//! The Qwen-Image 2.1 VAE (`AutoencoderKLQwenImage21`). Against diffusers:
//! python/tests/test_qwenimage21.py builds a tiny seeded model at test time
//! (torch + diffusers), and `../shared/golden/qwenimage21-tiny` when it
//! exists (exported by python/tests/qwenimage21_reference.py; skipped with a
//! message otherwise). Here, without torch: `preset:qwenimage21` (seeded
//! random weights; a reduced config, and the released width) in exact tiles
//! equals the untiled decode, memory estimates equal measured peaks, and bad
//! input gets clear errors. Output is RGBA (`out_channels` 4): the raw output
//! keeps 4 channels and the pixels' alpha is channel 4's bytes.

#[path = "../examples/embed_headless.rs"]
#[allow(dead_code)]
mod embed_headless;

use std::path::PathBuf;

use wgvae::estimate::Estimate;
use wgvae::io::{read_npy, HostTensor};
use wgvae::kernels::image::ImageRange;
use wgvae::memory::Policy;
use wgvae::models::Precision;
use wgvae::testing::{max_abs_diff, rand_vec, shared_dir, test_context};
use wgvae::tiling::Tiling;
use wgvae::{decode, Context, DecodeOptions, LoadOptions, Vae};

const PRESET: &str = "preset:qwenimage21";
/// f32 against diffusers (the issue's bound).
const F32_TOLERANCE: f32 = 2e-4;
/// Exact tiles against the untiled decode in the same precision.
const TILES_TOLERANCE: f32 = 1e-3;

fn run(ctx: &Context, vae: &Vae, z: &HostTensor, raw: bool, tiling: Tiling) -> wgvae::Decoded {
    let opts = DecodeOptions {
        raw_latents: raw,
        keep_raw: true,
        tiling,
        ..Default::default()
    };
    decode(ctx, vae, z, &opts).unwrap()
}

/// Tiles of 16 pixels: 1 latent pixel, so every level is split.
fn exact() -> Tiling {
    Tiling {
        tile_mid_block: true,
        ..Tiling::exact().with_tile_size(16)
    }
}

/// A reduced config of the public shape (5 stages, 16×, 64 latent
/// channels, every DupUp case; decoder_base_dim 16): fast; the public
/// width is `public_preset_decodes_the_released_width`.
const SMALL_CONFIG: &str = r#"{"_class_name": "AutoencoderKLQwenImage21", "base_dim": 8,
  "decoder_base_dim": 16, "z_dim": 64, "dim_mult": [1, 2, 2, 4, 4], "num_res_blocks": 1,
  "temperal_downsample": [false, true, true, true]}"#;

/// `SMALL_CONFIG` as config.json in a folder of the caller's (tests run in
/// parallel), removed on drop.
fn small_config() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), SMALL_CONFIG).unwrap();
    dir
}

fn load_options(precision: Precision, config: &tempfile::TempDir) -> LoadOptions {
    LoadOptions {
        precision,
        config: Some(config.path().join("config.json")),
        ..Default::default()
    }
}

fn preset(ctx: &Context, precision: Precision) -> Vae {
    let config = small_config();
    Vae::load(ctx, PRESET, &load_options(precision, &config)).unwrap()
}

/// The released width (`preset:qwenimage21` with the public config: the
/// mid-block attention is one head of 1152 channels, in output chunks of the
/// attention kernel) decodes a 2×2 latent untiled and in exact tiles (the
/// latent level stays one tile here; key blocks of a wide head:
/// `kernels::attention` tests), and the estimate equals the measured peak.
/// Against diffusers at a width beyond 512: python/tests/test_qwenimage21.py.
#[test]
fn public_preset_decodes_the_released_width() {
    let base = test_context();
    let policy = Policy::Exact;
    let ctx = base.with_pool(policy.new_pool());
    let load = LoadOptions {
        precision: Precision::F32,
        ..Default::default()
    };
    let vae = Vae::load(&ctx, PRESET, &load).unwrap();
    let z = HostTensor::new(vec![1, 64, 2, 2], rand_vec(256, 5, 1.0)).unwrap();
    let whole = run(&ctx, &vae, &z, true, Tiling::off());
    let est = Estimate::new(ctx.caps(), policy, PRESET, &load)
        .decode([1, 64, 2, 2])
        .unwrap();
    assert_eq!(est.peak_allocated_bytes, whole.memory.allocated_bytes.peak);
    let tiled = run(&ctx, &vae, &z, true, exact());
    assert_ne!(tiled.tiling.mode, "untiled");
    let (a, b) = (whole.raw.unwrap(), tiled.raw.unwrap());
    assert_eq!(a.shape[2..], [32, 32]);
    assert!(a.data.iter().all(|v| v.is_finite()));
    let spread = a.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(spread > 1e-3, "an all-zero decode tests nothing");
    let (err, at) = max_abs_diff(&a.data, &b.data);
    println!("qwenimage21 released width f32: exact tiles vs untiled {err:.3e} at {at}");
    assert!(err <= TILES_TOLERANCE, "{err} at {at}");
}

/// The preset (reduced config); exact tiles (every level split, the
/// DupUp shortcuts read across tile borders) equal the untiled decode.
#[test]
fn preset_exact_tiles_equal_untiled() {
    let ctx = test_context();
    let vae = preset(&ctx, Precision::F32);
    assert!(vae.random_weights());
    assert_eq!((vae.latent_channels(), vae.upscale()), (64, 16));
    let z = HostTensor::new(vec![1, 64, 2, 3], rand_vec(384, 7, 1.0)).unwrap();
    let whole = run(&ctx, &vae, &z, true, Tiling::off());
    assert_eq!(whole.tiling.mode, "untiled");
    assert_eq!((whole.width, whole.height), (48, 32));
    let tiled = run(&ctx, &vae, &z, true, exact());
    assert_ne!(tiled.tiling.mode, "untiled");
    assert_eq!((whole.channels, tiled.channels), (4, 4));
    assert_rgba_bytes(&whole, "untiled");
    assert_rgba_bytes(&tiled, "exact tiles");
    let (a, b) = (whole.raw.unwrap(), tiled.raw.unwrap());
    assert_eq!(a.shape, vec![1, 4, 32, 48]);
    let spread = a.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        spread > 1e-3,
        "a decode of random weights that is all zeros tests nothing"
    );
    let (err, at) = max_abs_diff(&a.data, &b.data);
    println!("qwenimage21 preset f32: exact tiles vs untiled max abs diff {err:.3e} at {at}");
    assert!(err <= TILES_TOLERANCE, "{err} at {at}");
    let alpha = &a.data[3 * 32 * 48..];
    let (err, at) = max_abs_diff(alpha, &b.data[3 * 32 * 48..]);
    println!("qwenimage21 preset f32: alpha, exact tiles vs untiled {err:.3e} at {at}");
    assert!(err <= TILES_TOLERANCE, "alpha: {err} at {at}");
    // Fast (blended) tiles keep the alpha too.
    let fast = run(&ctx, &vae, &z, true, Tiling::fast().with_tile_size(32));
    assert_eq!(fast.tiling.mode, "fast");
    assert_eq!(fast.raw.as_ref().unwrap().shape, vec![1, 4, 32, 48]);
    assert_rgba_bytes(&fast, "fast tiles");
    // Pipeline latents (N×64×1×h×w) = raw z · std + mean.
    let mut five = z.clone();
    five.shape = vec![1, 64, 1, 2, 3];
    let pipe = run(&ctx, &vae, &five, false, Tiling::off());
    let (mean, std) = vae.latent_normalization().unwrap();
    let mut zz = z.clone();
    for (i, v) in zz.data.iter_mut().enumerate() {
        *v = *v * std[i / 6] + mean[i / 6];
    }
    let direct = run(&ctx, &vae, &zz, true, Tiling::off());
    assert_eq!(pipe.raw.unwrap().data, direct.raw.unwrap().data);
}

/// The RGBA8 pixels are the raw output's bytes (diffusers' mapping
/// `round(clamp(x / 2 + 0.5, 0, 1) · 255)`, alpha from channel 4) exactly,
/// and the alpha is not constant (a decode whose alpha is all 255 would pass
/// on a 3-channel path).
fn assert_rgba_bytes(d: &wgvae::Decoded, what: &str) {
    let raw = d.raw.as_ref().unwrap();
    let [n, c, h, w] = raw.shape[..] else {
        panic!("{what}: raw shape {:?}", raw.shape)
    };
    assert_eq!(c, 4, "{what}");
    let plane = h * w;
    let range = ImageRange::MinusOneToOne;
    for (b, img) in d.rgba.iter().enumerate() {
        assert_eq!(img.len(), plane * 4, "{what}");
        for p in 0..plane {
            for ch in 0..4 {
                let want = range.to_byte(raw.data[(b * c + ch) * plane + p]);
                assert_eq!(
                    img[p * 4 + ch],
                    want,
                    "{what}: image {b} pixel {p} channel {ch}"
                );
            }
        }
    }
    let alphas: std::collections::BTreeSet<u8> = d
        .rgba
        .iter()
        .flat_map(|i| i.iter().skip(3).step_by(4).copied())
        .collect();
    assert!(
        alphas.len() > 2,
        "{what}: alpha bytes {alphas:?} of {n} images"
    );
}

/// `out_channels` from config.json: 3 gives RGB (alpha 255, raw N×3×H×W, as
/// the other models); other counts are refused at load, naming config.json.
#[test]
fn out_channels_come_from_the_config() {
    let ctx = test_context();
    let scratch = small_config();
    let dir = scratch.path().to_path_buf();
    let with = |c: usize| {
        let path = dir.join(format!("config-{c}.json"));
        let text = SMALL_CONFIG.replace(
            "\"num_res_blocks\"",
            &format!("\"out_channels\": {c}, \"num_res_blocks\""),
        );
        std::fs::write(&path, text).unwrap();
        let opts = LoadOptions {
            precision: Precision::F32,
            config: Some(path),
            ..Default::default()
        };
        Vae::load(&ctx, PRESET, &opts)
    };
    let rgb = with(3).unwrap();
    assert_eq!(rgb.image_channels(), 3);
    let z = HostTensor::new(vec![1, 64, 1, 2], rand_vec(128, 9, 1.0)).unwrap();
    let out = run(&ctx, &rgb, &z, true, Tiling::off());
    assert_eq!(out.raw.as_ref().unwrap().shape, vec![1, 3, 16, 32]);
    assert_eq!(out.channels, 3);
    assert!(out.rgba[0].iter().skip(3).step_by(4).all(|&a| a == 255));
    let rgba = with(4).unwrap();
    assert_eq!(rgba.image_channels(), 4);
    let four = run(&ctx, &rgba, &z, true, Tiling::off());
    assert_eq!(four.raw.unwrap().shape, vec![1, 4, 16, 32]);
    for c in [1, 2, 5] {
        let m = with(c).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            m.contains(&format!("out_channels {c}"))
                && m.contains("config-")
                && m.contains("3 (RGB) or 4"),
            "{c}: {m}"
        );
    }
}

/// The CLI writes an RGBA PNG whose bytes are the library's pixels and a
/// `--save-raw` of N×4×H×W.
#[test]
fn cli_writes_rgba_png_and_raw() {
    let scratch = small_config();
    let dir = scratch.path().to_path_buf();
    let z = HostTensor::new(vec![1, 64, 2, 3], rand_vec(384, 11, 1.0)).unwrap();
    let (zp, png, npy) = (dir.join("z.npy"), dir.join("out.png"), dir.join("raw.npy"));
    wgvae::io::write_npy(&zp, &z.shape, &z.data).unwrap();
    let config = dir.join("config.json");
    let out = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args([
            "decode",
            "--vae",
            PRESET,
            "--config",
            config.to_str().unwrap(),
            "--dtype",
            "f32",
        ])
        .args([
            "--raw-latents",
            "--tile",
            "off",
            "-o",
            png.to_str().unwrap(),
        ])
        .args(["--save-raw", npy.to_str().unwrap(), zp.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let img = image::open(&png).unwrap();
    assert_eq!(img.color(), image::ColorType::Rgba8);
    let raw = read_npy(&npy).unwrap();
    assert_eq!(raw.shape, vec![1, 4, 32, 48]);
    let ctx = test_context();
    let vae = preset(&ctx, Precision::F32);
    let lib = run(&ctx, &vae, &z, true, Tiling::off());
    assert_eq!(lib.raw.as_ref().unwrap().data, raw.data);
    assert_rgba_bytes(&lib, "library");
    assert_eq!(img.into_rgba8().into_raw(), lib.rgba[0]);
}

/// An `Engine` on a host's device keeps the alpha: its images equal
/// `decode`'s pixels, and host textures (Rgba8Unorm exactly, Rgba16Float
/// within one step) hold the same RGBA.
#[test]
fn engine_images_and_textures_keep_alpha() {
    let (device, queue) = embed_headless::default_host_device().unwrap();
    let config = small_config();
    let load = load_options(Precision::F32, &config);
    let engine = wgvae::Engine::new(device.clone(), queue.clone(), PRESET, &load).unwrap();
    let z = HostTensor::new(vec![1, 64, 2, 3], rand_vec(384, 13, 1.0)).unwrap();
    let image = engine.decode_to_image(&z).unwrap();
    let ctx = test_context();
    let vae = preset(&ctx, Precision::F32);
    let lib = run(&ctx, &vae, &z, false, Tiling::off());
    assert_rgba_bytes(&lib, "decode");
    assert_eq!(image.as_raw(), &lib.rgba[0], "engine image vs decode");
    for (format, step) in [
        (wgpu::TextureFormat::Rgba8Unorm, 0),
        (wgpu::TextureFormat::Rgba16Float, 1),
    ] {
        let host = embed_headless::decode_into_host_texture(
            &engine, &device, &queue, &z, &z.shape, format,
        )
        .unwrap();
        let texels = host.rgba8();
        assert_eq!(texels.len(), lib.rgba[0].len());
        let worst = texels
            .iter()
            .zip(&lib.rgba[0])
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        assert!(worst <= step, "{format:?}: worst byte difference {worst}");
    }
}

/// Estimates (null device) equal what decodes measure, untiled and tiled.
#[test]
fn preset_estimates_equal_measured() {
    let base = test_context();
    let z = HostTensor::new(vec![1, 64, 2, 2], rand_vec(256, 3, 1.0)).unwrap();
    for tiling in [Tiling::off(), exact()] {
        let policy = Policy::Exact;
        let ctx = base.with_pool(policy.new_pool());
        let config = small_config();
        let load = load_options(Precision::BF16, &config);
        let vae = Vae::load(&ctx, PRESET, &load).unwrap();
        let real = run(&ctx, &vae, &z, true, tiling.clone());
        let est = Estimate::new(ctx.caps(), policy, PRESET, &load)
            .tiled(&tiling)
            .decode([1, 64, 2, 2])
            .unwrap();
        println!(
            "qwenimage21 preset bf16 {}: peak allocated {} B, predicted {} B",
            real.tiling.mode, real.memory.allocated_bytes.peak, est.peak_allocated_bytes
        );
        assert_eq!(est.weights_bytes, vae.weights_bytes());
        assert_eq!(est.peak_allocated_bytes, real.memory.allocated_bytes.peak);
    }
}

/// Wrong channels (a Qwen-Image 1 latent to 2.1 and back), a token count
/// that is not h·w, several frames: errors naming what was expected.
#[test]
fn bad_latents_are_clear_errors() {
    let ctx = test_context();
    let vae = preset(&ctx, Precision::BF16);
    let err = |vae: &Vae, shape: Vec<usize>| {
        let n = shape.iter().product();
        let z = HostTensor::new(shape, vec![0.1; n]).unwrap();
        decode(&ctx, vae, &z, &DecodeOptions::default())
            .err()
            .unwrap()
            .to_string()
    };
    let m = err(&vae, vec![1, 16, 1, 4, 4]);
    assert!(m.contains("N×64×1×h×w"), "{m}");
    let m = err(&vae, vec![1, 16, 4, 4]);
    assert!(m.contains("16 channels") && m.contains("64"), "{m}");
    let m = err(&vae, vec![1, 64, 3, 4, 4]);
    assert!(m.contains("one frame"), "{m}");
    // 12 tokens for a 64×64 image (16 positions).
    let twelve = HostTensor::new(vec![1, 12, 64], rand_vec(768, 1, 1.0)).unwrap();
    let m = vae
        .unpack_tokens(&twelve, Some((64, 64)))
        .err()
        .unwrap()
        .to_string();
    assert!(m.contains("12 tokens") && m.contains("16"), "{m}");
    // 16 tokens of 64 features: a square 4×4 grid without a size.
    let tokens = HostTensor::new(vec![1, 16, 64], rand_vec(1024, 2, 1.0)).unwrap();
    let maps = vae.unpack_tokens(&tokens, None).unwrap();
    assert_eq!(maps.shape, vec![1, 64, 4, 4]);
    // No encoder: a clear refusal, not an unknown preset.
    let m = wgvae::Vae::load_encoder(&ctx, PRESET, &LoadOptions::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(m.contains("Qwen-Image 2.1") && m.contains("encoder"), "{m}");
    let qwen1 = Vae::load(&ctx, "preset:qwenimage", &LoadOptions::default()).unwrap();
    let m = err(&qwen1, vec![1, 64, 4, 4]);
    assert!(m.contains("64 channels") && m.contains("16"), "{m}");
}

fn golden() -> Option<PathBuf> {
    let dir = shared_dir()?.join("golden/qwenimage21-tiny");
    if !dir.is_dir() {
        // Not an error under WGVAE_REQUIRE_SHARED=1: this golden is optional
        // (python/tests/test_qwenimage21.py checks diffusers without it).
        eprintln!(
            "skipped: {} is absent (export it with python/tests/qwenimage21_reference.py)",
            dir.display()
        );
        return None;
    }
    Some(dir)
}

/// `../shared/golden/qwenimage21-tiny`, when it exists: raw z, pipeline
/// latents and packed tokens decode to diffusers' RGBA within 2e-4 (f32).
#[test]
fn decodes_the_golden_if_present() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let opts = LoadOptions {
        precision: Precision::F32,
        ..Default::default()
    };
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &opts).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let [n, _, _, h, w] = want.shape[..] else {
        panic!("decoded.npy is N×4×1×H×W, got {:?}", want.shape)
    };
    // N×4×1×H×W holds the values of N×4×H×W.
    assert_eq!(want.data.len(), n * 4 * h * w);
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let tokens = read_npy(&dir.join("latents_packed.npy")).unwrap();
    let maps = vae.unpack_tokens(&tokens, Some((h, w))).unwrap();
    for (what, t, raw) in [
        ("z", &z, true),
        ("latents", &latents, false),
        ("tokens", &maps, false),
    ] {
        let got = run(&ctx, &vae, t, raw, Tiling::off());
        let (err, at) = max_abs_diff(&got.raw.unwrap().data, &want.data);
        println!("qwenimage21-tiny from {what}: max abs error {err:.3e} at {at}");
        assert!(err <= F32_TOLERANCE, "{what}: {err} at {at}");
    }
}
