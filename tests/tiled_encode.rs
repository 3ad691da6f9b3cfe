//! Tiled encoding: `exact` equals the untiled encode up to float rounding
//! (max abs ≤ 7.5e-6, 3× README's largest measured 2.5e-6, on the
//! AutoencoderKL mean and std, on TAE latents) with
//! halos through every stride-2 conv, global GroupNorm statistics and the
//! mid-block attention streamed over all latent tiles; `auto` tiles only
//! when the budget demands it and then lowers the measured peak; the
//! estimator predicts tiled encodes; `fast` blends like diffusers.

use std::path::PathBuf;

use wgvae::encode::{encode, load_image, EncodeOptions, Encoded};
use wgvae::estimate::Estimate;
use wgvae::gpu::Context;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::Policy;
use wgvae::models::{AutoencoderKlConfig, WeightStore};
use wgvae::testing::{max_abs_diff, rand_vec, shared_dir, test_context};
use wgvae::{LoadOptions, Tiling};

/// Exact tiles vs the untiled encode: 3× README's largest measured error
/// (2.5e-6, TAEF2 chelsea; the others measure 0.9–1.6e-6).
const UNTILED_TOL: f32 = 7.5e-6;

/// `../shared` beside the project root, or `../../shared` for a git
/// worktree one level deeper (tests skip, saying so, without either).
fn shared() -> Option<PathBuf> {
    let deeper = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    if deeper.join("golden").is_dir() {
        return Some(deeper);
    }
    shared_dir()
}

fn run(ctx: &Context, enc: &wgvae::Vae, img: &HostTensor, tiling: Tiling) -> Encoded {
    let opts = EncodeOptions {
        raw_latents: true,
        tiling,
        ..Default::default()
    };
    encode(ctx, enc, img, &opts).unwrap()
}

/// Exact tiles with the latent level (mid-block) tiled too.
fn exact(tile: usize) -> Tiling {
    let mut t = Tiling::exact().with_tile_size(tile);
    t.tile_mid_block = true;
    t
}

/// Max abs difference of the mean (AutoencoderKL) or latents (TAE) and,
/// when present, of the std, between two encodes.
fn diff(a: &Encoded, b: &Encoded) -> f32 {
    let (m, _) = match (&a.mean, &b.mean) {
        (Some(x), Some(y)) => max_abs_diff(&x.data, &y.data),
        _ => max_abs_diff(&a.latents.data, &b.latents.data),
    };
    let s = match (&a.std, &b.std) {
        (Some(x), Some(y)) => max_abs_diff(&x.data, &y.data).0,
        _ => 0.0,
    };
    assert_eq!(a.latents.shape, b.latents.shape);
    m.max(s)
}

/// A small random-weights AutoencoderKL (2 resnets per block, a channel
/// change with a 1×1 shortcut, 3 stride-2 convs, mid-block attention).
fn random_kl(ctx: &Context) -> wgvae::Vae {
    let cfg = AutoencoderKlConfig {
        block_out_channels: vec![16, 32, 32, 32],
        layers_per_block: 2,
        norm_num_groups: 8,
        ..AutoencoderKlConfig::preset("sd15").unwrap()
    };
    wgvae::Vae::encoder_from_kl_config(ctx, &cfg, &WeightStore::random(17)).unwrap()
}

/// A random image [1, 3, h, w] with values 0–255.
fn random_image(h: usize, w: usize, seed: u64) -> HostTensor {
    let data = rand_vec(3 * h * w, seed, 127.5)
        .into_iter()
        .map(|v| v + 127.5)
        .collect();
    HostTensor::new(vec![1, 3, h, w], data).unwrap()
}

/// aekl-tiny-sd (96×128 image): 40-px tiles are 3×4 image tiles with 16-
/// and 8-px edges, 5-px latent tiles (12×16 latent: 3×4 with 2- and 1-px
/// edges) through which the attention streams. Equal to the untiled encode
/// (≤ UNTILED_TOL) and to diffusers' mean and std (≤ 1e-3).
#[test]
fn exact_matches_untiled_aekl_tiny_sd() {
    let Some(shared) = shared() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let ctx = test_context();
    let enc =
        wgvae::Vae::load_encoder(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let img = load_image(&dir.join("encode_input.png"), false).unwrap();
    let whole = run(&ctx, &enc, &img, Tiling::off());
    assert_eq!(whole.tiling.mode, "untiled");
    let tiled = run(&ctx, &enc, &img, exact(40));
    let t = &tiled.tiling;
    println!("aekl-tiny-sd encode: {t:?}");
    assert_eq!(t.mode, "exact");
    assert_eq!(t.tiles, 12);
    assert_eq!(t.level_tiles, vec![Some(5), Some(10), Some(20), Some(40)]);
    assert!(t.mid_block_tiled);
    let err = diff(&tiled, &whole);
    let want_mean = read_npy(&dir.join("encoded_mean.npy")).unwrap();
    let want_std = read_npy(&dir.join("encoded_std.npy")).unwrap();
    let (gm, _) = max_abs_diff(&tiled.mean.as_ref().unwrap().data, &want_mean.data);
    let (gs, _) = max_abs_diff(&tiled.std.as_ref().unwrap().data, &want_std.data);
    println!(
        "aekl-tiny-sd: exact 40-px tiles ({} tiles): max abs vs untiled {err:.3e}; vs diffusers mean {gm:.3e}, std {gs:.3e}",
        t.tiles
    );
    assert!(err <= UNTILED_TOL, "tiled vs untiled {err}");
    assert!(
        gm <= 1e-3 && gs <= 1e-3,
        "vs diffusers: mean {gm}, std {gs}"
    );
}

/// TAEF2 encoder on the chelsea photo (288×448): 120-px tiles, 3×4 per
/// level (latent level tiled too, where the pool branches' GroupNorms sit),
/// equal to the untiled encode (≤ UNTILED_TOL) and PyTorch's latents (≤ 2e-3).
#[test]
fn taef2_exact_matches_untiled_on_chelsea() {
    let Some(shared) = shared() else { return };
    let ctx = test_context();
    let weights = shared.join("weights/taef2/encoder.safetensors");
    let enc =
        wgvae::Vae::load_encoder(&ctx, weights.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let img = load_image(&shared.join("images/chelsea.png"), false).unwrap();
    let whole = run(&ctx, &enc, &img, Tiling::off());
    let tiled = run(&ctx, &enc, &img, exact(120));
    let t = &tiled.tiling;
    println!("taef2 chelsea encode: {t:?}");
    assert_eq!(t.mode, "exact");
    assert!(t.tiles >= 4 && t.mid_block_tiled, "{t:?}");
    let err = diff(&tiled, &whole);
    let want = read_npy(&shared.join("golden/taef2/chelsea.latents.npy")).unwrap();
    let (gerr, _) = max_abs_diff(&tiled.latents.data, &want.data);
    println!(
        "taef2 chelsea: exact 120-px tiles ({} tiles): max abs vs untiled {err:.3e}, vs PyTorch {gerr:.3e}",
        t.tiles
    );
    assert!(err <= UNTILED_TOL, "tiled vs untiled {err}");
    assert!(gerr <= 2e-3, "vs PyTorch {gerr}");
}

/// Random weights, no `../shared`: a 72×104 image (9×13 latent) in 32-px
/// tiles (3×4 image tiles with 8-px edges; latent tiles of 4 with 1-px
/// edges), with the latent level whole and tiled.
#[test]
fn exact_matches_untiled_random_kl_odd_sizes() {
    let ctx = test_context();
    let enc = random_kl(&ctx);
    let img = random_image(72, 104, 3);
    let whole = run(&ctx, &enc, &img, Tiling::off());
    let absmax = whole
        .mean
        .as_ref()
        .unwrap()
        .data
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    for mid in [false, true] {
        let mut tiling = Tiling::exact().with_tile_size(32);
        tiling.tile_mid_block = mid;
        let tiled = run(&ctx, &enc, &img, tiling);
        let t = &tiled.tiling;
        assert_eq!(t.mode, "exact");
        assert_eq!(t.tiles, 12);
        assert_eq!(t.mid_block_tiled, mid);
        let err = diff(&tiled, &whole);
        println!(
            "random KL 72×104: exact 32-px tiles (mid-block {}): max abs vs untiled {err:.3e} (|mean| ≤ {absmax:.2})",
            if mid { "tiled" } else { "whole" }
        );
        assert!(err <= UNTILED_TOL, "tiled vs untiled {err}");
    }
}

/// `auto` under a budget below the untiled peak tiles exactly and keeps the
/// budget: the measured peak allocated drops below the untiled one.
#[test]
fn auto_tiles_under_a_small_budget_and_lowers_the_peak() {
    let ctx = test_context().with_pool(Policy::Exact.new_pool());
    let enc = random_kl(&ctx);
    let img = random_image(128, 160, 5);
    let whole = run(&ctx, &enc, &img, Tiling::default());
    assert_eq!(whole.tiling.mode, "untiled", "auto must not tile what fits");
    let untiled_peak = whole.memory.allocated_bytes.peak;
    let budget = enc.weights_bytes() + (untiled_peak - enc.weights_bytes()) / 2;
    let tiled = run(&ctx, &enc, &img, Tiling::default().with_max_memory(budget));
    let t = &tiled.tiling;
    let peak = tiled.memory.allocated_bytes.peak;
    let err = diff(&tiled, &whole);
    println!(
        "random KL 128×160 on {}: untiled peak allocated {untiled_peak} B; auto with a {budget} B budget: {} {}-px tiles {:?}, peak allocated {peak} B ({:.0} %), max abs vs untiled {err:.3e}",
        ctx.caps().adapter_name,
        t.mode,
        t.tile_size.unwrap_or(0),
        t.level_tiles,
        100.0 * peak as f64 / untiled_peak as f64
    );
    assert_eq!(t.mode, "exact");
    assert!(t.tiles > 1);
    assert!(
        peak <= budget && peak < untiled_peak,
        "{peak} vs {untiled_peak}"
    );
    assert!(err <= UNTILED_TOL, "{err}");
    // `off` ignores the budget.
    let off = run(&ctx, &enc, &img, Tiling::off().with_max_memory(budget));
    assert_eq!(off.tiling.mode, "untiled");
}

/// The estimator predicts a tiled encode's peak exactly, for every pool
/// policy, and the tiled encode keeps a budget far below the untiled peak
/// (tiles parked in host memory).
#[test]
fn tiled_encode_estimate_matches_measured() {
    let Some(shared) = shared() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let spec = dir.to_str().unwrap();
    let img = load_image(&dir.join("encode_input.png"), false).unwrap();
    let shape: [usize; 4] = img.shape.clone().try_into().unwrap();
    let base = test_context();
    let reference = {
        let enc = wgvae::Vae::load_encoder(&base, spec, &LoadOptions::default()).unwrap();
        run(&base, &enc, &img, Tiling::off())
    };
    for policy in Policy::ALL {
        let ctx = base.with_pool(policy.new_pool());
        let enc = wgvae::Vae::load_encoder(&ctx, spec, &LoadOptions::default()).unwrap();
        let untiled = run(&ctx, &enc, &img, Tiling::off())
            .memory
            .allocated_bytes
            .peak;
        let budget = enc.weights_bytes() + (untiled - enc.weights_bytes()) / 4;
        let mut tiling = Tiling::exact().with_max_memory(budget);
        tiling.tile_mid_block = true;
        let load = LoadOptions::default();
        let est = Estimate::new(ctx.caps(), policy, spec, &load)
            .tiled(&tiling)
            .encode(shape)
            .unwrap();
        let out = run(&ctx, &enc, &img, tiling);
        let peak = out.memory.allocated_bytes.peak;
        let t = &out.tiling;
        let err = diff(&out, &reference);
        println!(
            "{}: untiled peak {untiled} B, budget {budget} B: measured {peak} B, predicted {} B; {}-px tiles {:?}, host parking {} B; max abs vs untiled {err:.3e}",
            policy.name(),
            est.peak_allocated_bytes,
            t.tile_size.unwrap_or(0),
            t.level_tiles,
            t.host_parked_peak_bytes
        );
        assert_eq!(t.mode, "exact");
        assert!(peak <= budget, "{}: {peak} > {budget}", policy.name());
        assert_eq!(est.peak_allocated_bytes, peak, "{}", policy.name());
        assert_eq!(&est.tiling, t, "{}", policy.name());
        assert!(err <= UNTILED_TOL, "{}: {err}", policy.name());
    }
}

/// `fast` is diffusers' `_tiled_encode`: one tile covering the image is the
/// untiled encode; with 32-px tiles and 8-px overlap (stride 24), the part
/// of the first tile no neighbour blends into is that tile's own encode.
#[test]
fn fast_tiles_blend_like_diffusers() {
    let ctx = test_context();
    let enc = random_kl(&ctx);
    let img = random_image(48, 64, 9);
    let whole = run(&ctx, &enc, &img, Tiling::off());
    let one = run(&ctx, &enc, &img, Tiling::fast().with_tile_size(128));
    assert_eq!((one.tiling.mode.as_str(), one.tiling.tiles), ("fast", 1));
    assert_eq!(diff(&one, &whole), 0.0);
    let fast = run(
        &ctx,
        &enc,
        &img,
        Tiling::fast().with_tile_size(32).with_overlap(8),
    );
    assert_eq!(fast.tiling.tiles, 2 * 3);
    assert_eq!(fast.latents.shape, whole.latents.shape);
    // Tile (0, 0) is image [0, 32)²; the blends touch latent rows/columns ≥ 3.
    let mut corner = vec![0.0; 3 * 32 * 32];
    for c in 0..3 {
        for y in 0..32 {
            let src = (c * 48 + y) * 64;
            corner[(c * 32 + y) * 32..][..32].copy_from_slice(&img.data[src..src + 32]);
        }
    }
    let corner = HostTensor::new(vec![1, 3, 32, 32], corner).unwrap();
    let first = run(&ctx, &enc, &corner, Tiling::off());
    let (m, f) = (&fast.mean.as_ref().unwrap().data, &first.mean.unwrap().data);
    for c in 0..4 {
        for y in 0..3 {
            for x in 0..3 {
                assert_eq!(
                    m[(c * 6 + y) * 8 + x],
                    f[(c * 4 + y) * 4 + x],
                    "c {c} ({y}, {x})"
                );
            }
        }
    }
    let seam = diff(&fast, &whole);
    println!("fast 32-px tiles, overlap 8: max abs vs untiled {seam:.3} (independent tiles)");
    assert!(
        seam > 1e-3,
        "independent tiles cannot equal the whole encode"
    );
}

/// `wgvae encode --tile exact --tile-size 40 --json` reports its tiling and
/// writes the untiled encode's latents; `wgvae memory --encode` predicts it.
#[test]
fn cli_encode_tiles_and_memory_predicts_encodes() {
    let Some(shared) = shared() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let image = dir.join("encode_input.png");
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("tiled-enc.npy");
    let wgvae = |args: &[&str]| {
        let o = std::process::Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
            .args(args)
            .env(
                "WGPU_BACKEND",
                std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
            )
            .output()
            .expect("run wgvae");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{args:?}: {stderr}");
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        serde_json::from_str::<serde_json::Value>(stdout.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    };
    let vae = dir.to_str().unwrap();
    let v = wgvae(&[
        "encode",
        image.to_str().unwrap(),
        "--vae",
        vae,
        "-o",
        out.to_str().unwrap(),
        "--tile",
        "exact",
        "--tile-size",
        "40",
        "--json",
    ]);
    assert_eq!(v["tiling"]["mode"], "exact", "{v}");
    assert_eq!(v["tiling"]["tiles"], 12, "{v}");
    let written = read_npy(&out).unwrap();
    let ctx = test_context();
    let enc = wgvae::Vae::load_encoder(&ctx, vae, &LoadOptions::default()).unwrap();
    let img = load_image(&image, false).unwrap();
    let opts = EncodeOptions {
        tiling: Tiling::off(),
        ..Default::default()
    };
    let whole = encode(&ctx, &enc, &img, &opts).unwrap();
    let (err, _) = max_abs_diff(&written.data, &whole.latents.data);
    assert!(err <= UNTILED_TOL, "CLI tiled vs untiled latents: {err}");
    let m = wgvae(&[
        "memory",
        "--encode",
        "--vae",
        vae,
        "--size",
        "96x128",
        "--tile",
        "exact",
        "--tile-size",
        "40",
        "--json",
    ]);
    assert_eq!(m["op"], "encode", "{m}");
    assert_eq!(m["tiling"]["mode"], "exact", "{m}");
    assert_eq!(m["latents_shape"], serde_json::json!([1, 4, 12, 16]), "{m}");
    // The dtype the default `--dtype auto` resolves to here, not the flag's text.
    let auto = wgvae::models::Precision::Auto
        .resolve(true, ctx.caps())
        .name();
    assert_eq!(m["dtype"], auto, "{m}");
}

/// The SD1.5 preset encoder (random weights) at 256² on this device:
/// untiled vs `auto` under a budget of a third of the untiled working
/// memory (about 20 s on lavapipe; `--nocapture` prints the peaks).
#[test]
fn sd15_encode_peak_untiled_vs_tiled() {
    let ctx = test_context().with_pool(Policy::Planned.new_pool());
    let enc = wgvae::Vae::load_encoder(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let img = random_image(256, 256, 21);
    let time = |tiling: Tiling| {
        let t = std::time::Instant::now();
        let out = run(&ctx, &enc, &img, tiling);
        (t.elapsed().as_secs_f64(), out)
    };
    let (tw, whole) = time(Tiling::off());
    let untiled = whole.memory.allocated_bytes.peak;
    let budget = enc.weights_bytes() + (untiled - enc.weights_bytes()) / 3;
    let (tt, tiled) = time(Tiling::default().with_max_memory(budget));
    let t = &tiled.tiling;
    let peak = tiled.memory.allocated_bytes.peak;
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "sd15 encode 256² on {} (planned pool): weights {:.1} MiB; untiled peak allocated {:.1} MiB in {tw:.1} s; \
         auto under {:.1} MiB: {} {}-px tiles {:?}, peak allocated {:.1} MiB in {tt:.1} s, host parking {:.1} MiB; max abs vs untiled {:.2e}",
        ctx.caps().adapter_name,
        mib(enc.weights_bytes()),
        mib(untiled),
        mib(budget),
        t.mode,
        t.tile_size.unwrap_or(0),
        t.level_tiles,
        mib(peak),
        mib(t.host_parked_peak_bytes),
        diff(&tiled, &whole)
    );
    assert_eq!(t.mode, "exact");
    assert!(peak <= budget);
    let err = diff(&tiled, &whole);
    assert!(err <= UNTILED_TOL, "auto (exact) vs untiled: {err}");
}

/// `auto` on a device whose storage bindings are too small for the untiled
/// encode (a lowered limit): it tiles, exactly; `off` fails naming the limit.
#[test]
fn auto_tiles_when_the_binding_limit_is_too_small() {
    let ctx = test_context();
    let enc = random_kl(&ctx);
    let img = random_image(72, 104, 7);
    let whole = run(&ctx, &enc, &img, Tiling::off());
    let mut caps = ctx.caps().clone();
    // The 16-channel 72×104 activations are 468 KiB; bind at most 256 KiB.
    caps.max_storage_buffer_binding_size = 256 << 10;
    let small = ctx.with_caps(caps);
    let opts = EncodeOptions {
        tiling: Tiling::off(),
        ..Default::default()
    };
    let e = encode(&small, &enc, &img, &opts)
        .err()
        .expect("over the limit");
    let e = e.to_string();
    assert!(e.contains("max_storage_buffer_binding_size"), "{e}");
    let tiled = run(&small, &enc, &img, Tiling::default());
    println!("auto under a 256 KiB binding limit: {:?}", tiled.tiling);
    assert_eq!(tiled.tiling.mode, "exact");
    assert!(tiled.tiling.tiles > 1);
    let err = diff(&tiled, &whole);
    assert!(err <= UNTILED_TOL, "{err}");
}
