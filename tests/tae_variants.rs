//! TAESD-family variants other than taef2, on synthetic weights (no files
//! needed): 4-channel (taesd / taesdxl) and 16-channel (taesd3 / taef1)
//! decoders without the pool branch. Detection from the weight shapes, and the
//! decode against a plain CPU reference built from `cpu_conv2d`.
//!
//! Tolerance: |gpu - cpu| <= 1e-4 + 1e-3 |cpu| over ~35 chained f32 convs
//! (the reference accumulates each conv in f64 and rounds to f32).

use std::collections::BTreeMap;

use wgvae::kernels::conv2d::{cpu_conv2d, Conv2dOptions};
use wgvae::models::tae::TaeDecoder;
use wgvae::models::weights::HostWeight;
use wgvae::models::{Layout, WeightStore};
use wgvae::testing::{
    assert_close, rand_vec, synthetic_tae_decoder as synthetic, test_context, TAE_BLOCKS, TAE_UPS,
    TAE_WIDTH,
};
use wgvae::{decode, DecodeOptions, LoadOptions, Vae};

const W: usize = TAE_WIDTH;
const BLOCKS: [usize; 10] = TAE_BLOCKS;
const UPS: [usize; 3] = TAE_UPS;

/// The TAESD decoder on the CPU: z `[1, c, h, w]` → `[1, 3, 8h, 8w]`.
fn cpu_tae(m: &BTreeMap<String, HostWeight>, z: &[f32], c: usize, h: usize, w: usize) -> Vec<f32> {
    let same = Conv2dOptions::same(3);
    let up = Conv2dOptions {
        upsample: true,
        replicate: false,
        reflect: false,
        ..same
    };
    let relu = |v: Vec<f32>| v.into_iter().map(|x| x.max(0.0)).collect::<Vec<f32>>();
    let conv = |x: &[f32], cin: usize, h: usize, w: usize, key: &str, opts: &Conv2dOptions| {
        let wt = &m[&format!("{key}.weight")];
        let bias = m.get(&format!("{key}.bias")).map(|b| b.data.as_slice());
        cpu_conv2d(
            x,
            [1, cin, h, w],
            &wt.data,
            wt.shape[0],
            3,
            bias,
            None,
            None,
            opts,
        )
    };
    let x: Vec<f32> = z.iter().map(|v| (v / 3.0).tanh() * 3.0).collect();
    let mut x = relu(conv(&x, c, h, w, "1", &same));
    let (mut h, mut w) = (h, w);
    for i in 3..=18 {
        if BLOCKS.contains(&i) {
            let a = relu(conv(&x, W, h, w, &format!("{i}.conv.0"), &same));
            let a = relu(conv(&a, W, h, w, &format!("{i}.conv.2"), &same));
            let a = conv(&a, W, h, w, &format!("{i}.conv.4"), &same);
            x = a.iter().zip(&x).map(|(a, b)| (a + b).max(0.0)).collect();
        } else if UPS.contains(&i) {
            x = conv(&x, W, h, w, &i.to_string(), &up);
            h *= 2;
            w *= 2;
        }
    }
    conv(&x, W, h, w, "19", &same)
}

fn write_store(m: &BTreeMap<String, HostWeight>, path: &std::path::Path) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = m
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.shape.clone(),
                bytemuck::cast_slice(&v.data).to_vec(),
            )
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(k, s, b)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .unwrap();
            (k.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn check_variant(c: usize, name: &str) {
    let ctx = test_context();
    let weights = synthetic(c, 100 * c as u64);
    // From an in-memory store: detection from the shapes.
    let store = WeightStore::from_map(weights.clone(), Layout::Tae, "synthetic");
    let tae = TaeDecoder::load(&ctx, &store).unwrap();
    assert_eq!(tae.latent_channels, c);
    assert!(!tae.has_pool);
    assert_eq!(tae.variant_name(), name);

    // From a file, through the public loader and decode().
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tae");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("tae{c}_decoder.safetensors"));
    write_store(&weights, &file);
    let vae = Vae::load(&ctx, file.to_str().unwrap(), &LoadOptions::default()).unwrap();
    assert!(vae.name().starts_with(name), "{}", vae.name());
    assert_eq!(vae.latent_channels(), c);
    assert_eq!(
        vae.latent_scaling(),
        Some((1.0, 0.0)),
        "TAE latents use scale 1"
    );

    let (h, w) = (3, 2);
    let z = rand_vec(c * h * w, 7 + c as u64, 2.0);
    let latents = wgvae::io::HostTensor::new(vec![1, c, h, w], z.clone()).unwrap();
    let opts = DecodeOptions {
        keep_raw: true,
        ..Default::default()
    };
    let out = decode(&ctx, &vae, &latents, &opts).unwrap();
    let raw = out.raw.unwrap();
    assert_eq!(raw.shape, vec![1, 3, 8 * h, 8 * w]);
    let want = cpu_tae(&weights, &z, c, h, w);
    let spread = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        spread > 1e-2,
        "{name}: degenerate output (max |x| {spread})"
    );
    assert_close(&raw.data, &want, 1e-4, 1e-3, name);
    assert_eq!((out.height, out.width), (8 * h, 8 * w));
}

#[test]
fn taesd_four_channel_decoder_matches_cpu() {
    check_variant(4, "taesd/taesdxl");
}

#[test]
fn taesd3_sixteen_channel_decoder_matches_cpu() {
    check_variant(16, "taesd3/taef1");
}
