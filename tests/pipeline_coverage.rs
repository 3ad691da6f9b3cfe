//! Every pipeline the engine actually compiles is one the shader-validation
//! test validates: decodes (untiled and exact-tiled) and encodes of a small
//! random AutoencoderKL in every storage path record only keys listed by
//! `wgvae::kernels::all_variants()`.

use std::collections::HashSet;

use wgvae::encode::{encode, EncodeOptions};
use wgvae::gpu::{Capabilities, Context, ContextOptions};
use wgvae::io::HostTensor;
use wgvae::memory::Policy;
use wgvae::models::weights::WeightStore;
use wgvae::testing::{rand_vec, tiny_kl_config};
use wgvae::{decode, DType, DecodeOptions, Tiling, Vae};

/// One f16 path (mixed f32/f16 operands: latents, attention), untiled decode
/// only: compiling pipelines on lavapipe is slow (the full run takes minutes).
#[test]
fn f16_decode_pipelines_are_validated_variants() {
    let ctx = Context::new(&ContextOptions::default()).expect("an adapter");
    check_coverage(&ctx, vec![(ctx.clone(), DType::F16)], false);
}

/// Every storage path, decodes untiled and exact-tiled, and encodes, on null
/// devices (which record the keys a run asks for without compiling them: a
/// fraction of a second), with this adapter's limits and a reference GPU's
/// (native f16, subgroups): every key requested is a validated variant.
#[test]
fn every_storage_path_requests_only_validated_variants() {
    let real = Context::new(&ContextOptions::default()).expect("an adapter");
    for caps in [real.caps().clone(), Capabilities::reference_gpu()] {
        let null = Context::null(caps.clone(), Policy::Exact.new_pool());
        let mut packed = caps.clone();
        packed.shader_f16 = false;
        let mut paths = vec![(null.clone(), DType::F32), (null.clone(), DType::BF16)];
        if caps.shader_f16 {
            paths.push((null.clone(), DType::F16));
        }
        paths.push((null.with_caps(packed), DType::F16));
        run_paths(&paths, true);
        check_keys(&caps.adapter_name, null.pipelines().requested_keys());
    }
}

/// Every storage path, decodes untiled and exact-tiled, and encodes, compiled
/// for real (about a minute on lavapipe).
#[test]
fn every_compiled_pipeline_is_a_validated_variant() {
    // A context of its own: its pipeline cache holds only what this test ran.
    let ctx = Context::new(&ContextOptions::default()).expect("an adapter");
    let mut paths = vec![(ctx.clone(), DType::F32)];
    if ctx.caps().shader_f16 {
        paths.push((ctx.clone(), DType::F16));
    }
    let mut packed = ctx.caps().clone();
    packed.shader_f16 = false;
    paths.push((ctx.with_caps(packed), DType::F16));
    paths.push((ctx.clone(), DType::BF16));
    check_coverage(&ctx, paths, true);
}

/// Runs the model in every `(context, dtype)` of `paths` (all sharing `ctx`'s
/// pipeline cache) and checks the compiled keys against `all_variants()`.
fn check_coverage(ctx: &Context, paths: Vec<(Context, DType)>, everything: bool) {
    run_paths(&paths, everything);
    check_keys("compiled", ctx.pipelines().keys());
}

/// Decodes (untiled; with `everything`, exact-tiled too) and encodes a small
/// random AutoencoderKL in every `(context, dtype)` of `paths`.
fn run_paths(paths: &[(Context, DType)], everything: bool) {
    let cfg = tiny_kl_config();
    let z = HostTensor::new(vec![1, 4, 6, 5], rand_vec(4 * 30, 3, 1.5)).unwrap();
    let image = HostTensor::new(
        vec![1, 3, 16, 24],
        rand_vec(3 * 16 * 24, 4, 127.0)
            .into_iter()
            .map(|v| v + 127.5)
            .collect(),
    )
    .unwrap();
    for (c, dt) in paths {
        let store = WeightStore::random(7);
        store.set_dtype(*dt);
        let vae = Vae::from_kl_config(c, &cfg, &store, "tiny random").unwrap();
        decode(c, &vae, &z, &DecodeOptions::default()).unwrap();
        if !everything {
            continue;
        }
        let tiled = DecodeOptions {
            tiling: Tiling {
                tile_size: Some(8),
                tile_mid_block: true,
                ..Tiling::exact()
            },
            ..Default::default()
        };
        decode(c, &vae, &z, &tiled).unwrap();
        let store = WeightStore::random(8);
        store.set_dtype(*dt);
        let enc = wgvae::Vae::encoder_from_kl_config(c, &cfg, &store).unwrap();
        encode(c, &enc, &image, &EncodeOptions::default()).unwrap();
        // The Wan video decoder (RMS norm, causal conv taps, per-frame
        // attention), two latent frames so the time convs run.
        let store = WeightStore::random(9);
        store.set_dtype(*dt);
        let wan_cfg = wgvae::models::WanConfig {
            base_dim: 4,
            ..wgvae::models::WanConfig::wan21()
        };
        let wan =
            wgvae::Vae::from(wgvae::models::WanDecoder::load(c, &store, wan_cfg, true).unwrap());
        let zv = HostTensor::new(vec![1, 16, 2, 2, 3], rand_vec(16 * 12, 5, 1.0)).unwrap();
        wgvae::decode_video(c, &wan, &zv).unwrap();
    }
}

/// `keys` (at least 10) are all listed by `all_variants()`.
fn check_keys(what: &str, keys: Vec<wgvae::gpu::PipelineKey>) {
    let listed: HashSet<_> = wgvae::kernels::all_variants()
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    assert!(keys.len() > 10, "{what}: {} pipelines", keys.len());
    let missing: Vec<_> = keys.iter().filter(|k| !listed.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "{what}: {} of {} pipelines are not in all_variants(): {missing:#?}",
        missing.len(),
        keys.len()
    );
    println!("{what}: {} pipelines, all validated variants", keys.len());
}
