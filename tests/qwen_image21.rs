//! The Qwen-Image 2.1 VAE (`AutoencoderKLQwenImage21`). Against diffusers:
//! python/tests/test_qwenimage21.py builds a tiny seeded model at test time
//! (torch + diffusers), and `../shared/golden/qwenimage21-tiny` when it
//! exists (exported by python/tests/qwenimage21_reference.py; skipped with a
//! message otherwise). Here, without torch: `preset:qwenimage21` (seeded
//! random weights; a reduced config, and the released width) in exact tiles
//! equals the untiled decode, memory estimates equal measured peaks, and bad
//! input gets clear errors.

use std::path::PathBuf;

use wgvae::estimate::Estimate;
use wgvae::io::{read_npy, HostTensor};
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
    let (a, b) = (whole.raw.unwrap(), tiled.raw.unwrap());
    assert_eq!(a.shape, vec![1, 3, 32, 48]);
    let spread = a.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        spread > 1e-3,
        "a decode of random weights that is all zeros tests nothing"
    );
    let (err, at) = max_abs_diff(&a.data, &b.data);
    println!("qwenimage21 preset f32: exact tiles vs untiled max abs diff {err:.3e} at {at}");
    assert!(err <= TILES_TOLERANCE, "{err} at {at}");
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
/// latents and packed tokens decode to diffusers' RGB within 2e-4 (f32).
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
    let plane = h * w;
    // RGB of the RGBA output.
    let rgb: Vec<f32> = want
        .data
        .chunks(want.data.len() / n)
        .flat_map(|img| img[..3 * plane].to_vec())
        .collect();
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
        let (err, at) = max_abs_diff(&got.raw.unwrap().data, &rgb);
        println!("qwenimage21-tiny from {what}: max abs error {err:.3e} at {at}");
        assert!(err <= F32_TOLERANCE, "{what}: {err} at {at}");
    }
}
