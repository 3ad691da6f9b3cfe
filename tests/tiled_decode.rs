//! Tiled decoding: `exact` equals the untiled decode (≤ 1e-3 max abs on the
//! AutoencoderKL goldens, ≤ 2e-3 on TAEF2), keeps `--max-memory` (estimator
//! and measured runs), `auto` tiles only when it must, and `fast`
//! reproduces diffusers' own tiled decode.

use std::path::PathBuf;

use wgvae::estimate::Estimate;
use wgvae::gpu::Context;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::Policy;
use wgvae::models::Precision;
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::{decode, DecodeOptions, Decoded, Error, LoadOptions, TileMode, Tiling, Vae};

/// `../shared` beside the project root, or `../../shared` for a git
/// worktree one level deeper (tests skip, saying so, without either).
fn shared() -> Option<PathBuf> {
    let deeper = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    if deeper.join("golden").is_dir() {
        return Some(deeper);
    }
    shared_dir()
}

fn golden(name: &str) -> Option<PathBuf> {
    shared().map(|s| s.join("golden").join(name))
}

fn run(ctx: &Context, vae: &Vae, z: &HostTensor, tiling: Tiling) -> Decoded {
    decode(
        ctx,
        vae,
        z,
        &DecodeOptions {
            keep_raw: true,
            tiling,
            ..Default::default()
        },
    )
    .unwrap()
}

fn mean_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .sum::<f64>()
        / a.len() as f64
}

/// Exact tiles (mid-block tiled too) vs the untiled decode and the golden.
fn check_exact(name: &str, tile: usize) {
    let Some(dir) = golden(name) else { return };
    let ctx = test_context();
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let whole = run(&ctx, &vae, &z, Tiling::off());
    assert_eq!(whole.tiling.mode, "untiled");
    let mut tiling = Tiling::exact().with_tile_size(tile);
    tiling.tile_mid_block = true;
    let tiled = run(&ctx, &vae, &z, tiling);
    let t = &tiled.tiling;
    println!("{name}: {t:?}");
    assert_eq!(t.mode, "exact");
    assert!(t.mid_block_tiled && t.tiles > 1, "{name}: {t:?}");
    let (a, b) = (whole.raw.unwrap(), tiled.raw.unwrap());
    assert_eq!(a.shape, b.shape);
    let (err, at) = max_abs_diff(&b.data, &a.data);
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let (gerr, _) = max_abs_diff(&b.data, &want.data);
    println!(
        "{name}: exact {tile}-px tiles ({} tiles): max abs vs untiled {err:.3e} (mean {:.3e}), vs diffusers {gerr:.3e}",
        t.tiles,
        mean_abs(&b.data, &a.data)
    );
    assert!(err <= 1e-3, "{name}: tiled vs untiled {err} at {at}");
    assert!(gerr <= 1e-3, "{name}: tiled vs diffusers {gerr}");
    let worst = whole.rgba[0]
        .iter()
        .zip(&tiled.rgba[0])
        .map(|(p, q)| p.abs_diff(*q))
        .max()
        .unwrap();
    assert!(worst <= 1, "{name}: pixels differ by {worst}");
    assert_eq!(whole.rgba.len(), tiled.rgba.len());
}

#[test]
fn exact_matches_untiled_aekl_tiny_sd() {
    check_exact("aekl-tiny-sd", 32); // 96×128: 3×4 tiles, 4×4 latent tiles
}

#[test]
fn exact_matches_untiled_aekl_tiny_flux() {
    check_exact("aekl-tiny-flux", 48); // 128×128: odd 48/48/32 edges
}

#[test]
fn exact_matches_untiled_aekl_tiny_sd_batch2() {
    check_exact("aekl-tiny-sd-batch2", 24); // 64×64, batch 2
}

#[test]
fn exact_matches_untiled_aekl_tiny_sd_tiled_many_odd_tiles() {
    check_exact("aekl-tiny-sd-tiled", 104); // 320×384: 4×4 tiles, 8/72-px edge tiles (one latent pixel wide)
}

/// `auto` on a device whose storage bindings are too small for the untiled
/// decode (a lowered limit emulates lavapipe's 128 MiB vs SD1.5 at 512²):
/// it tiles, exactly; `off` fails naming the limit.
#[test]
fn auto_tiles_when_the_binding_limit_is_too_small() {
    let Some(dir) = golden("aekl-tiny-sd") else {
        return;
    };
    let ctx = test_context();
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let whole = run(&ctx, &vae, &z, Tiling::default());
    assert_eq!(whole.tiling.mode, "untiled", "auto must not tile what fits");
    let mut caps = ctx.caps().clone();
    // The 32-channel 96×128 activations are 1.5 MiB; bind at most 256 KiB.
    caps.max_storage_buffer_binding_size = 256 << 10;
    let small = ctx.with_caps(caps);
    let e = decode(
        &small,
        &vae,
        &z,
        &DecodeOptions {
            tiling: Tiling::off(),
            ..Default::default()
        },
    )
    .err()
    .expect("untiled must exceed the binding limit")
    .to_string();
    assert!(e.contains("max_storage_buffer_binding_size"), "{e}");
    // Tiles the caller chose too large for the limit: the advice is about
    // the tile size, not "use tiling".
    let e = decode(
        &small,
        &vae,
        &z,
        &DecodeOptions {
            tiling: Tiling::exact().with_tile_size(128),
            ..Default::default()
        },
    )
    .err()
    .expect("128-pixel tiles must exceed the binding limit");
    assert!(matches!(e, wgvae::Error::InvalidInput(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("in exact tiles of 128 px")
            && e.contains("max_storage_buffer_binding_size")
            && e.contains("lower `Tiling::tile_size`")
            && !e.contains("use tiling"),
        "{e}"
    );
    let tiled = run(&small, &vae, &z, Tiling::default());
    println!("auto under a 256 KiB binding limit: {:?}", tiled.tiling);
    assert_eq!(tiled.tiling.mode, "exact");
    assert!(tiled.tiling.tiles > 1);
    let (err, at) = max_abs_diff(&tiled.raw.unwrap().data, &whole.raw.unwrap().data);
    println!("auto-tiled vs untiled: max abs {err:.3e}");
    assert!(err <= 1e-3, "{err} at {at}");
}

/// `--max-memory` is a promise: with a budget far below the untiled peak
/// the estimator predicts exactly the measured peak, both stay within the
/// budget (tiles parked in host memory, mid-block K/V streamed from there)
/// and the output is still exact; for every pool policy.
#[test]
fn max_memory_is_kept_estimated_and_exact() {
    let Some(dir) = golden("aekl-tiny-sd") else {
        return;
    };
    let spec = dir.to_str().unwrap();
    let base = test_context();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let shape: [usize; 4] = z.shape.clone().try_into().unwrap();
    let reference = {
        let vae = Vae::load(&base, spec, &LoadOptions::default()).unwrap();
        run(&base, &vae, &z, Tiling::off())
    };
    let untiled_peak = reference.memory.allocated_bytes.peak;
    for policy in Policy::ALL {
        let ctx = base.with_pool(policy.new_pool());
        let vae = Vae::load(&ctx, spec, &LoadOptions::default()).unwrap();
        let budget = vae.weights_bytes() + (3 << 19);
        let mut tiling = Tiling::exact().with_max_memory(budget);
        tiling.tile_mid_block = true;
        let est = Estimate::new(ctx.caps(), policy, spec, &LoadOptions::default())
            .tiled(&tiling)
            .decode(shape)
            .unwrap();
        // The estimator predicts a decode without the raw output (as the CLI).
        let out = decode(
            &ctx,
            &vae,
            &z,
            &DecodeOptions {
                tiling: tiling.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        let peak = out.memory.allocated_bytes.peak;
        let t = &out.tiling;
        let worst = out.rgba[0]
            .iter()
            .zip(&reference.rgba[0])
            .map(|(p, q)| p.abs_diff(*q))
            .max()
            .unwrap();
        println!(
            "{}: budget {budget} B (untiled peak {untiled_peak} B): measured peak {peak} B + staging {} B, predicted {} B; {}-px tiles {:?}, device parking {} B, host parking {} B, {} B uploaded, {} syncs; pixels within {worst}",
            policy.name(),
            t.staging_peak_bytes,
            est.peak_allocated_bytes,
            t.tile_size.unwrap_or(0),
            t.level_tiles,
            t.device_parked_peak_bytes,
            t.host_parked_peak_bytes,
            t.uploaded_bytes,
            t.syncs
        );
        assert!(untiled_peak > budget, "the budget must force tiling");
        // Staging buffers (uploads of host-parked windows, read-backs) are
        // device memory too: the pool peak and the staging peak together
        // keep the budget.
        assert!(t.staging_peak_bytes > 0, "host parking stages bytes");
        assert!(
            peak + t.staging_peak_bytes <= budget,
            "{}: pool peak {peak} + staging peak {} > budget {budget}",
            policy.name(),
            t.staging_peak_bytes
        );
        assert_eq!(
            est.peak_allocated_bytes,
            peak,
            "{}: estimate vs measured",
            policy.name()
        );
        assert_eq!(
            &est.tiling,
            t,
            "{}: the estimator plans the same tiling",
            policy.name()
        );
        assert!(
            t.host_parked_peak_bytes > 0,
            "a tight budget parks on the host"
        );
        assert!(t.mid_block_tiled);
        assert!(worst <= 1, "{}: pixels differ by {worst}", policy.name());
        if policy == Policy::Exact {
            let out = run(&ctx, &vae, &z, tiling);
            assert!(out.memory.allocated_bytes.peak <= budget);
            let (err, at) = max_abs_diff(
                &out.raw.unwrap().data,
                &reference.raw.as_ref().unwrap().data,
            );
            println!("host-parked exact decode: max abs vs untiled {err:.3e}");
            assert!(err <= 1e-3, "{err} at {at}");
        }
    }
}

/// The number of MiB a message prints first ("3.2 MiB …").
trait MibPrefix {
    fn strip_suffix_mib(&self) -> Option<f64>;
}

impl MibPrefix for str {
    fn strip_suffix_mib(&self) -> Option<f64> {
        self.split_once(" MiB")?.0.parse().ok()
    }
}

/// A tiled run that would park more host memory than allowed fails before
/// decoding, naming both figures and what to do.
#[test]
fn host_parking_over_the_host_limit_fails_early() {
    let Some(dir) = golden("aekl-tiny-sd") else {
        return;
    };
    // A pool of its own: the budget counts live tensors, and the shared
    // context's pool also holds those of tests running beside this one.
    let ctx = test_context().with_pool(Policy::Caching.new_pool());
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let mut tiling = Tiling::exact().with_max_memory(vae.weights_bytes() + (3 << 19));
    tiling.tile_mid_block = true;
    let opts = |t: Tiling| DecodeOptions {
        tiling: t,
        ..Default::default()
    };
    let tight = tiling.clone().with_max_host_memory(1 << 20);
    let Err(err) = decode(&ctx, &vae, &z, &opts(tight)) else {
        panic!("a decode over the host limit ran");
    };
    assert!(matches!(err, Error::OverBudget(_)), "{err}");
    let err = err.to_string();
    println!("{err}");
    assert!(
        err.contains("1.0 MiB are available") && err.contains("`Tiling::max_host_memory`"),
        "{err}"
    );
    assert!(
        err.contains("raise `Tiling::max_memory`") && err.contains("smaller image"),
        "{err}"
    );
    // Refused before any planning: the floor of what any tile size parks
    // on the host is already over the limit.
    let floor = err
        .split("parks at least ")
        .nth(1)
        .and_then(|t| t.strip_suffix_mib())
        .unwrap_or_else(|| panic!("no host floor in {err}"));
    // The same decode within a roomy host limit runs and parks on the host,
    // at least the floor the refusal named (printed to 0.1 MiB).
    let ok = decode(&ctx, &vae, &z, &opts(tiling.with_max_host_memory(1 << 30))).unwrap();
    let host = ok.tiling.host_parked_peak_bytes as f64 / 1048576.0;
    assert!(
        host > 1.0 && host + 0.05 >= floor,
        "{host} MiB parked, floor {floor} MiB"
    );
}

/// TAEF2 (GroupNorm only in the pool branches of its latent-resolution
/// blocks): exact tiles, latent level tiled too, vs untiled and PyTorch on
/// one photo of `golden/taef2`.
fn taef2_exact_matches_untiled(photo: &str) {
    let Some(shared) = shared() else { return };
    let ctx = test_context();
    let weights = shared.join("weights/taef2/decoder.safetensors");
    let vae = Vae::load(&ctx, weights.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let dir = shared.join("golden/taef2");
    let z = read_npy(&dir.join(format!("{photo}.latents.npy"))).unwrap();
    let want = read_npy(&dir.join(format!("{photo}.decoded.npy"))).unwrap();
    // taef2's GroupNorms sit in its first three blocks, at latent
    // resolution: tile that level too.
    let mut tiling = Tiling::exact().with_tile_size(120);
    tiling.tile_mid_block = true;
    let tiled = run(&ctx, &vae, &z, tiling);
    assert!(tiled.tiling.tiles > 1 && tiled.tiling.mid_block_tiled);
    // Against PyTorch's whole decode directly (our untiled decode is within
    // 4.8e-6 of it, tests/decode_goldens.rs): no untiled run needed, and a
    // seam, a wrong halo or a tile-local GroupNorm shows as 1e-2 or more.
    let b = tiled.raw.unwrap();
    assert_eq!(b.shape, want.shape, "{photo}");
    let (gerr, at) = max_abs_diff(&b.data, &want.data);
    println!(
        "taef2 {photo} {:?}: exact 120-px tiles ({} tiles): max abs vs PyTorch {gerr:.3e} (mean {:.3e})",
        z.shape,
        tiled.tiling.tiles,
        mean_abs(&b.data, &want.data)
    );
    // Measured ≤ 3.8e-6 (README).
    assert!(gerr <= 1e-5, "{photo}: {gerr} at {at}");
}

#[test]
fn taef2_exact_matches_untiled_on_chelsea() {
    taef2_exact_matches_untiled("chelsea");
}

#[test]
fn taef2_exact_matches_untiled_on_coffee() {
    taef2_exact_matches_untiled("coffee");
}

#[test]
fn taef2_exact_matches_untiled_on_astronaut() {
    taef2_exact_matches_untiled("astronaut");
}

/// `fast` on a batch of two equals `fast` on each latent alone (tiles,
/// blends and GroupNorms are per sample), and its host figure counts the
/// full-resolution f32 image.
#[test]
fn fast_batch2_equals_fast_per_sample() {
    let Some(dir) = golden("aekl-tiny-sd") else {
        return;
    };
    let ctx = test_context();
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    assert_eq!(z.shape[0], 1);
    let other: Vec<f32> = z.data.iter().rev().map(|v| -0.5 * v).collect();
    let mut both = z.data.clone();
    both.extend(&other);
    let mut shape2 = z.shape.clone();
    shape2[0] = 2;
    let z2 = HostTensor::new(shape2, both).unwrap();
    let z_other = HostTensor::new(z.shape.clone(), other).unwrap();
    let fast = || Tiling::fast().with_tile_size(48).with_overlap(16);
    let batch = run(&ctx, &vae, &z2, fast());
    assert!(batch.tiling.tiles > 1);
    let raw = batch.raw.unwrap();
    let per = raw.data.len() / 2;
    for (i, single) in [&z, &z_other].into_iter().enumerate() {
        let one = run(&ctx, &vae, single, fast());
        let (err, at) = max_abs_diff(&raw.data[i * per..(i + 1) * per], &one.raw.unwrap().data);
        println!("fast batch-2 sample {i} vs alone: max abs {err:.2e}");
        assert!(err <= 1e-5, "sample {i}: {err} at {at}");
        assert_eq!(batch.rgba[i], one.rgba[0]);
    }
    let image_bytes = (2 * 3 * batch.height * batch.width * 4) as u64;
    assert!(batch.tiling.host_parked_peak_bytes >= image_bytes);
}

/// `fast` with a TAE decoder (no GroupNorm outside its latent blocks):
/// tiles blend into an image of the right size close to the untiled one.
#[test]
fn fast_tiles_a_tae_decoder() {
    let Some(shared) = shared() else { return };
    let ctx = test_context();
    let weights = shared.join("weights/taef2/decoder.safetensors");
    let vae = Vae::load(&ctx, weights.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&shared.join("golden/taef2/chelsea.latents.npy")).unwrap();
    // PyTorch's whole decode stands for ours (within 4.8e-6 of it).
    let whole = read_npy(&shared.join("golden/taef2/chelsea.decoded.npy")).unwrap();
    let fast = run(
        &ctx,
        &vae,
        &z,
        Tiling::fast().with_tile_size(192).with_overlap(64),
    );
    assert_eq!(fast.tiling.mode, "fast");
    assert!(fast.tiling.tiles > 1);
    let (a, b) = (whole, fast.raw.unwrap());
    assert_eq!(a.shape, b.shape);
    let (max, _) = max_abs_diff(&b.data, &a.data);
    let mean = mean_abs(&b.data, &a.data);
    println!(
        "taef2 chelsea fast (192 px, overlap 64, {} tiles) vs untiled: max abs {max:.3e}, mean {mean:.3e}",
        fast.tiling.tiles
    );
    // Measured: max 0.186, mean 0.0212 (its latent-block GroupNorms see
    // one tile each); a misplaced tile or broken ramp gives several times that.
    assert!(
        mean < 0.04,
        "fast TAE tiles drift from the untiled decode: mean {mean}"
    );
}

/// `fast` is diffusers' `tiled_decode`: same tiles, same blend; it lands
/// on diffusers' own tiled output, seams and all (unlike `exact`).
#[test]
fn fast_reproduces_diffusers_tiled_decode() {
    let Some(dir) = golden("aekl-tiny-sd-tiled") else {
        return;
    };
    let ctx = test_context();
    let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let theirs_tiled = read_npy(&dir.join("decoded_diffusers_tiled.npy")).unwrap();
    let theirs_whole = read_npy(&dir.join("decoded.npy")).unwrap();
    let fast = run(
        &ctx,
        &vae,
        &z,
        Tiling::fast().with_tile_size(128).with_overlap(32),
    );
    assert_eq!(fast.tiling.mode, "fast");
    let raw = fast.raw.unwrap();
    assert_eq!(raw.shape, theirs_tiled.shape);
    let (err, at) = max_abs_diff(&raw.data, &theirs_tiled.data);
    let (seam, _) = max_abs_diff(&raw.data, &theirs_whole.data);
    let exact = run(&ctx, &vae, &z, Tiling::exact().with_tile_size(128));
    let (exact_err, _) = max_abs_diff(&exact.raw.as_ref().unwrap().data, &theirs_whole.data);
    println!(
        "fast (128 px, overlap 32, {} tiles) vs diffusers tiled: max abs {err:.3e}, mean {:.3e}; \
         fast vs whole decode: max {seam:.3}, mean {:.4}; exact 128-px tiles vs whole: max {exact_err:.2e}",
        fast.tiling.tiles,
        mean_abs(&raw.data, &theirs_tiled.data),
        mean_abs(&raw.data, &theirs_whole.data),
    );
    // 3× README's measured 4.3e-6 and 3.5e-6.
    assert!(err <= 1.3e-5, "fast vs diffusers tiled: {err} at {at}");
    assert!(seam > 0.1, "fast tiling must show diffusers' seams");
    assert!(exact_err <= 1.05e-5, "exact vs whole: {exact_err}");
}

/// The FLUX.1 preset within 1 GiB (weights included) at 1024², 2048², 4096²
/// and 8192², f32 and f16 (the README's acceptance table), predicted on the
/// reference GPU: the estimator keeps the promise (dry runs: seconds each).
#[test]
fn flux_preset_estimate_keeps_a_1gib_budget() {
    let caps = wgvae::gpu::Capabilities::reference_gpu();
    let budget = 1u64 << 30;
    for precision in [Precision::F32, Precision::F16] {
        for side in [1024usize, 2048, 4096, 8192] {
            let est = Estimate::new(
                &caps,
                Policy::Caching,
                "preset:flux1",
                &LoadOptions {
                    precision,
                    ..Default::default()
                },
            )
            .tiled(&Tiling::exact().with_max_memory(budget))
            .decode([1, 16, side / 8, side / 8])
            .unwrap();
            let t = &est.tiling;
            println!(
                "flux1 {precision:?} {side}²: peak {:.1} MiB + staging {:.1} MiB (weights {:.1}), {}-px tiles {:?}, mid-block tiled {}, host parking {:.0} MiB",
                est.peak_allocated_bytes as f64 / 1048576.0,
                t.staging_peak_bytes as f64 / 1048576.0,
                est.weights_bytes as f64 / 1048576.0,
                t.tile_size.unwrap_or(0),
                t.level_tiles,
                t.mid_block_tiled,
                t.host_parked_peak_bytes as f64 / 1048576.0
            );
            assert_eq!(t.mode, "exact");
            // Pool peak plus staging peak (device memory outside the pool).
            assert!(
                est.peak_allocated_bytes + t.staging_peak_bytes <= budget,
                "{precision:?} {side}²: {} + staging {} > {budget}",
                est.peak_allocated_bytes,
                t.staging_peak_bytes
            );
            if side >= 4096 {
                assert!(
                    t.mid_block_tiled,
                    "{side}²: the mid-block must be tiled too"
                );
            }
        }
    }
}

/// Modes parse; `auto` is the default.
#[test]
fn tile_modes_parse() {
    assert_eq!(Tiling::default().mode, TileMode::Auto);
    for m in ["auto", "off", "exact", "fast"] {
        assert_eq!(m.parse::<TileMode>().unwrap().name(), m);
    }
    assert!("tiles".parse::<TileMode>().is_err());
}

/// The SD1.5 preset at 512² needs a 256 MiB activation untiled, over
/// lavapipe's 128 MiB binding limit: `auto` tiles it and completes. Slow on
/// lavapipe (minutes in release):
/// `cargo test --release --test tiled_decode sd15_512 -- --ignored --nocapture`.
#[test]
#[ignore]
fn sd15_512_decodes_under_auto_despite_the_binding_limit() {
    let ctx = test_context();
    let vae = Vae::load(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let z = HostTensor::new(
        vec![1, 4, 64, 64],
        wgvae::testing::rand_vec(4 * 64 * 64, 5, 1.0),
    )
    .unwrap();
    let t = std::time::Instant::now();
    let keep = DecodeOptions {
        keep_raw: true,
        ..Default::default()
    };
    let out = decode(&ctx, &vae, &z, &keep).unwrap();
    println!(
        "sd15 512² auto on {}: {:.1} s, peak allocated {:.1} MiB, {:?}",
        ctx.caps().adapter_name,
        t.elapsed().as_secs_f64(),
        out.memory.allocated_bytes.peak as f64 / 1048576.0,
        out.tiling
    );
    assert_eq!((out.width, out.height), (512, 512));
    if ctx.caps().max_storage_buffer_binding_size < 256 << 20 {
        assert_eq!(out.tiling.mode, "exact");
    }
    let px = &out.rgba[0];
    assert!(px.chunks_exact(4).any(|p| p[0] != px[0]), "a flat image");
    // Exact with another tile size lands on the same image.
    let other = match out.tiling.tile_size {
        Some(256) => 192,
        _ => 256,
    };
    let exact = decode(
        &ctx,
        &vae,
        &z,
        &DecodeOptions {
            keep_raw: true,
            tiling: Tiling::exact().with_tile_size(other),
            ..Default::default()
        },
    )
    .unwrap();
    let (err, at) = max_abs_diff(&out.raw.unwrap().data, &exact.raw.unwrap().data);
    println!("sd15 512² auto vs exact {other}-px tiles: max abs {err:.3e}");
    assert!(err <= 1e-3, "{err} at {at}");
}

/// Overhead of exact tiling where the untiled decode fits too:
/// `cargo test --release --test tiled_decode exact_overhead -- --ignored --nocapture`
/// (SD1.5 preset; WGVAE_BENCH_LATENT=16 by default: 128²). Configurations
/// alternate with untiled runs so a changing machine load hits both.
#[test]
#[ignore]
fn exact_overhead_benchmark() {
    let ctx = test_context();
    let side: usize = std::env::var("WGVAE_BENCH_LATENT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let vae = Vae::load(&ctx, "preset:sd15", &LoadOptions::default()).unwrap();
    let z = HostTensor::new(
        vec![1, 4, side, side],
        wgvae::testing::rand_vec(4 * side * side, 11, 1.0),
    )
    .unwrap();
    // CPU seconds of this process (lavapipe runs in-process), which other
    // load on the machine does not inflate the way it inflates wall time.
    let cpu = || -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<f64> = after
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        // utime and stime are fields 14 and 15 (11 and 12 after the name), in ticks.
        (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
    };
    let time = |tiling: Tiling| {
        let opts = DecodeOptions {
            raw_latents: true,
            keep_raw: true,
            tiling,
            ..Default::default()
        };
        let (t, c) = (std::time::Instant::now(), cpu());
        let d = decode(&ctx, &vae, &z, &opts).unwrap();
        println!(
            "  {} decode: {:.2} s wall, {:.2} s cpu",
            d.tiling.mode,
            t.elapsed().as_secs_f64(),
            cpu() - c
        );
        (cpu() - c, d)
    };
    let (_, whole) = time(Tiling::off()); // warm-up: pipelines
    let configs = [(side * 4, false), (side * 2, false), (side * 2, true)];
    let (mut untiled, mut tiled) = (0.0, vec![0.0; configs.len()]);
    for (i, &(px, mid)) in configs.iter().enumerate() {
        let (a, _) = time(Tiling::off());
        let mut t = Tiling::exact().with_tile_size(px);
        t.tile_mid_block = mid;
        let (b, d) = time(t);
        untiled += a;
        tiled[i] = b;
        let (err, _) = max_abs_diff(
            &d.raw.as_ref().unwrap().data,
            &whole.raw.as_ref().unwrap().data,
        );
        println!(
            "{}²: untiled {a:.2} cpu-s; exact {px}-px tiles ({} tiles, mid-block {}): {b:.2} cpu-s = {:.3}× (max abs {err:.2e}, {} steps, {} window copies)",
            side * 8,
            d.tiling.tiles,
            if mid { "tiled" } else { "whole" },
            b / a,
            d.tiling.steps,
            d.tiling.window_copies
        );
        // The timings are reported, not asserted; exactness is.
        assert!(
            err <= 1e-3,
            "exact {px}-px tiles: max abs {err} from untiled"
        );
    }
    let mean = untiled / configs.len() as f64;
    for (i, &(px, mid)) in configs.iter().enumerate() {
        println!(
            "exact {px}-px (mid {}) vs mean untiled {mean:.2} cpu-s: {:.3}×",
            if mid { "tiled" } else { "whole" },
            tiled[i] / mean
        );
    }
}
