//! Every golden family decoded in f16 through the cooperative-matrix (tensor-core) kernels,
//! beside the scalar f16 path on the same device, against the reference outputs in
//! `../shared/golden`. Runs where the test device has a usable configuration (Mesa 26's
//! lavapipe in `ci/coopmat.sh`, which sets `WGVAE_REQUIRE_COOP=1` so that a missing one
//! fails); elsewhere each test says why it did not run.
//!
//! Bounds are the scalar f16 path's (the README's precision section and
//! `tests/half_precision.rs`, `tests/video_goldens.rs`); each test prints both paths' errors.

use std::path::PathBuf;

use wgvae::gpu::Context;
use wgvae::io::read_npy;
use wgvae::models::{Precision, TaehvDecoder, WanDecoder, WeightStore};
use wgvae::testing::{matrix_test_context, max_abs_diff, psnr, scalar_context, shared_dir};
use wgvae::{decode, decode_video, DType, DecodeOptions, LoadOptions, Vae};

fn golden(name: &str) -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join(name))
}

/// The two contexts (cooperative, scalar) on the test device, or `None` (see module doc).
fn contexts(test: &str) -> Option<(Context, Context)> {
    let ctx = matrix_test_context(test)?;
    shared_dir()?;
    let scalar = scalar_context(&ctx);
    Some((ctx, scalar))
}

fn load_f16(ctx: &Context, spec: &str) -> Vae {
    let opts = LoadOptions {
        precision: Precision::F16,
        ..Default::default()
    };
    Vae::load(ctx, spec, &opts).unwrap()
}

/// AutoencoderKL goldens (diffusers): raw output max abs error, f16 bounds of
/// `half_precision.rs` (2.5–3× the scalar path's measured errors).
#[test]
fn aekl_goldens_in_f16_on_matrices() {
    let Some((coop, scalar)) = contexts("aekl_goldens_in_f16_on_matrices") else {
        return;
    };
    for (name, tol) in [
        ("aekl-tiny-sd", 1e-2),
        ("aekl-tiny-flux", 1.2e-2),
        ("aekl-tiny-sd-batch2", 1e-2),
    ] {
        let dir = golden(name).unwrap();
        let z = read_npy(&dir.join("latents.npy")).unwrap();
        let want = read_npy(&dir.join("decoded.npy")).unwrap();
        let opts = DecodeOptions {
            keep_raw: true,
            ..Default::default()
        };
        let mut errs = Vec::new();
        for ctx in [&coop, &scalar] {
            let vae = load_f16(ctx, dir.to_str().unwrap());
            // Profiled where the device times dispatches: the kernels that ran are named.
            let opts = DecodeOptions {
                profile: ctx.caps().timestamp_inside_passes,
                ..opts.clone()
            };
            let out = decode(ctx, &vae, &z, &opts).unwrap();
            assert_eq!(out.dtype, DType::F16, "{name}");
            assert_eq!(out.f16_overflows, 0, "{name}");
            assert_eq!(out.profile.is_some(), opts.profile, "{name}: profiled");
            if let Some(p) = &out.profile {
                let ran = |k: &str| p.kernels.iter().any(|t| t.kernel.contains(k));
                let on = std::ptr::eq(ctx, &coop);
                for k in ["conv2d_coop", "attention_coop"] {
                    assert_eq!(ran(k), on, "{name}: {k} ran: {:?}", p.kernels);
                }
            }
            errs.push((
                vae.cooperative_matrix(),
                max_abs_diff(&out.raw.unwrap().data, &want.data).0,
            ));
        }
        let [(used, e_coop), (none, e_scalar)] = [errs[0].clone(), errs[1].clone()];
        println!(
            "{name}: raw max abs error vs diffusers, f16: matrices ({}) {e_coop:.3e}, scalar {e_scalar:.3e}",
            used.as_deref().unwrap_or("?")
        );
        assert!(used.is_some(), "{name}: the cooperative path ran");
        assert!(none.is_none(), "{name}: the scalar context stayed scalar");
        assert!(e_coop <= tol, "{name}: matrices: {e_coop} > {tol}");
    }
}

/// The pretrained TAEF2 on the astronaut photo's central 32×32 latents: PSNR against the
/// f32 decode (the README's f16 bound: at least 54 dB; scalar f16 measured 62–64 dB).
#[test]
fn taef2_photo_in_f16_on_matrices() {
    let Some((coop, scalar)) = contexts("taef2_photo_in_f16_on_matrices") else {
        return;
    };
    let shared = shared_dir().unwrap();
    let spec = shared.join("weights/taef2/decoder.safetensors");
    let spec = spec.to_str().unwrap();
    let full = read_npy(&shared.join("golden/taef2/astronaut.latents.npy")).unwrap();
    let (h, w) = (full.shape[2], full.shape[3]);
    let z = full.crop(h / 2 - 16, h / 2 + 16, w / 2 - 16, w / 2 + 16);
    let f32_vae = Vae::load(
        &scalar,
        spec,
        &LoadOptions {
            precision: Precision::F32,
            ..Default::default()
        },
    )
    .unwrap();
    let base = decode(&scalar, &f32_vae, &z, &DecodeOptions::default()).unwrap();
    let mut dbs = Vec::new();
    for ctx in [&coop, &scalar] {
        let vae = load_f16(ctx, spec);
        let out = decode(ctx, &vae, &z, &DecodeOptions::default()).unwrap();
        assert_eq!(out.f16_overflows, 0);
        dbs.push(psnr(&base.rgba[0], &out.rgba[0]));
    }
    println!(
        "taef2 astronaut (central 256²): PSNR vs f32: matrices {:.2} dB, scalar f16 {:.2} dB",
        dbs[0], dbs[1]
    );
    assert!(dbs[0] >= 54.0, "matrices: PSNR {:.2} dB < 54", dbs[0]);
}

/// TAEHV (taew2_1, seeded weights): raw max abs error against taehv.py, f16 bound 6e-3
/// (`video_goldens.rs`, scalar measured 2.0e-3).
#[test]
fn taehv_golden_in_f16_on_matrices() {
    let Some((coop, scalar)) = contexts("taehv_golden_in_f16_on_matrices") else {
        return;
    };
    let dir = golden("taew2_1-rand").unwrap();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded_raw.npy")).unwrap();
    let mut errs = Vec::new();
    for ctx in [&coop, &scalar] {
        let store = WeightStore::from_safetensors(&dir.join("taew2_1.safetensors")).unwrap();
        store.set_dtype(DType::F16);
        let dec = wgvae::Vae::from(TaehvDecoder::load(ctx, &store).unwrap());
        let used = dec.cooperative_matrix();
        let got = decode_video(ctx, &dec, &latents).unwrap();
        errs.push((used, max_abs_diff(&got.data, &want.data).0));
    }
    println!(
        "taew2_1-rand f16: raw max abs error: matrices ({}) {:.3e}, scalar {:.3e}",
        errs[0].0.as_deref().unwrap_or("?"),
        errs[0].1,
        errs[1].1
    );
    assert!(errs[0].0.is_some() && errs[1].0.is_none());
    assert!(errs[0].1 <= 6e-3, "matrices: {}", errs[0].1);
}

/// The Wan 2.1 VAE (diffusers, seeded weights) in f16, causal 3-D convs included: raw max
/// abs error against diffusers; bound 1e-2 (no scalar f16 bound existed: that path measured
/// 4.4e-3 on Mesa 26's lavapipe, the matrices 4.8e-3; the f32 bound is 1e-5).
#[test]
fn wan_golden_in_f16_on_matrices() {
    let Some((coop, scalar)) = contexts("wan_golden_in_f16_on_matrices") else {
        return;
    };
    let dir = golden("wan21-tiny").unwrap();
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let mut errs = Vec::new();
    for ctx in [&coop, &scalar] {
        let dec =
            wgvae::Vae::from(WanDecoder::open(ctx, dir.to_str().unwrap(), DType::F16, 0).unwrap());
        let used = dec.cooperative_matrix();
        let got = decode_video(ctx, &dec, &latents).unwrap();
        errs.push((used, max_abs_diff(&got.data, &want.data).0));
    }
    println!(
        "wan21-tiny f16: max abs error vs diffusers: matrices ({}) {:.3e}, scalar {:.3e}",
        errs[0].0.as_deref().unwrap_or("?"),
        errs[0].1,
        errs[1].1
    );
    assert!(errs[0].0.is_some() && errs[1].0.is_none());
    assert!(errs[0].1 <= 1e-2, "matrices: {}", errs[0].1);
}

/// MiniMax-H3's transformer decoder (diffusers, seeded weights) in f16: its linear layers
/// are 1×1 convs on the matrices and its attention (head dim 16, padding tokens left out
/// by strides) the cooperative attention kernel. Raw max abs error against diffusers; bound
/// 2.5e-2 (`tests/minimax_h3.rs`: the scalar f16 path measured 7.5e-3 on Mesa 25).
#[test]
fn minimax_h3_golden_in_f16_on_matrices() {
    let Some((coop, scalar)) = contexts("minimax_h3_golden_in_f16_on_matrices") else {
        return;
    };
    let dir = golden("minimax-h3-tiny").unwrap();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let mut errs = Vec::new();
    for ctx in [&coop, &scalar] {
        let spec = dir.to_str().unwrap();
        let dec = wgvae::Vae::from(
            wgvae::models::minimax_h3::MiniMaxH3Decoder::open(ctx, spec, DType::F16, 0).unwrap(),
        );
        let used = dec.cooperative_matrix();
        let got = decode_video(ctx, &dec, &z).unwrap();
        errs.push((used, max_abs_diff(&got.data, &want.data).0));
    }
    println!(
        "minimax-h3-tiny f16: max abs error vs diffusers: matrices ({}) {:.3e}, scalar {:.3e}",
        errs[0].0.as_deref().unwrap_or("?"),
        errs[0].1,
        errs[1].1
    );
    assert!(errs[0].0.is_some() && errs[1].0.is_none());
    assert!(errs[0].1 <= 2.5e-2, "matrices: {}", errs[0].1);
}
