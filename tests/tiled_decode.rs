//! Tiled decoding: `exact` equals the untiled decode (≤ 1e-3 max abs on the
//! AutoencoderKL goldens, ≤ 2e-3 on TAEF2), keeps `--max-memory` (estimator
//! and measured runs), `auto` tiles only when it must, and `fast`
//! reproduces diffusers' own tiled decode.

use std::path::PathBuf;

use wgvae::decode::estimate_decode_with;
use wgvae::gpu::Context;
use wgvae::io::{read_npy, HostTensor};
use wgvae::memory::Policy;
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::{decode, DecodeOptions, Decoded, LoadOptions, TileMode, Tiling, Vae};

fn golden(name: &str) -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join(name))
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
    check_exact("aekl-tiny-sd-tiled", 56); // 320×384: 6×7 tiles, 40/48-px edge tiles
}
