//! Latent and weight files the user can get wrong, and the formats they may
//! come in; needs no files from ../shared.

use std::path::PathBuf;

use wgvae::io::{load_latents, read_npy, HostTensor};
use wgvae::models::weights::WeightStore;
use wgvae::testing::{rand_vec, test_context, tiny_kl_config};
use wgvae::{decode, DecodeOptions, LoadOptions, Vae};

/// Paths in a fresh folder of one test's own, removed on drop (also on failure).
fn scratch() -> impl Fn(&str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap();
    move |name| dir.path().join(name)
}

fn tiny_vae() -> Vae {
    let cfg = tiny_kl_config();
    Vae::from_kl_config(&test_context(), &cfg, &WeightStore::random(3), "tiny").unwrap()
}

fn decode_err(vae: &Vae, t: HostTensor) -> String {
    decode(&test_context(), vae, &t, &DecodeOptions::default())
        .err()
        .expect("must fail")
        .to_string()
}

#[test]
fn infinite_latents_are_rejected() {
    let tmp = scratch();
    let vae = tiny_vae();
    for bad in [f32::INFINITY, f32::NEG_INFINITY] {
        let mut v = vec![0.5; 4 * 4 * 3];
        v[10] = bad;
        let e = decode_err(&vae, HostTensor::new(vec![1, 4, 4, 3], v).unwrap());
        assert!(e.contains("non-finite") && e.contains("index 10"), "{e}");
    }
    // Through the file loader too.
    let p = tmp("inf.npy");
    let mut v = vec![0.0; 4 * 2 * 2];
    v[3] = f32::INFINITY;
    wgvae::io::write_npy(&p, &[4, 2, 2], &v).unwrap();
    let e = load_latents(&p, None, 4).err().unwrap().to_string();
    assert!(e.contains("non-finite") && e.contains("inf.npy"), "{e}");
}

#[test]
fn empty_and_tensorless_safetensors_are_clear_errors() {
    let tmp = scratch();
    let empty = tmp("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    let e = load_latents(&empty, None, 4).err().unwrap().to_string();
    assert!(e.contains("empty") && e.contains("latent"), "{e}");
    let e = Vae::load(
        &test_context(),
        empty.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("empty") && e.contains("weights"), "{e}");

    // A valid header with no tensor at all.
    let none = tmp("none.safetensors");
    let views: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
    safetensors::serialize_to_file(views, None, &none).unwrap();
    assert!(std::fs::metadata(&none).unwrap().len() > 0);
    let e = load_latents(&none, None, 4).err().unwrap().to_string();
    assert!(e.contains("no tensor"), "{e}");
    let e = Vae::load(
        &test_context(),
        none.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("no tensors"), "{e}");
}

/// A `.npy` with a hand-written `<f2` (little-endian f16) header, as
/// `np.save(path, latents.astype(np.float16))` writes it.
fn write_f16_npy(path: &std::path::Path, shape: &[usize], data: &[f32]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(
        "{{'descr': '<f2', 'fortran_order': False, 'shape': ({}), }}",
        dims.join(", ") + if shape.len() == 1 { "," } else { "" }
    );
    // Magic (6) + version (2) + header length (2) + header, padded to 64 with a final newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    for v in data {
        bytes.extend(half::f16::from_f32(*v).to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn f16_npy_latents_decode_like_their_f32_values() {
    let tmp = scratch();
    let shape = [1, 4, 5, 3];
    let values: Vec<f32> = rand_vec(60, 21, 2.0)
        .into_iter()
        .map(|v| half::f16::from_f32(v).to_f32())
        .collect();
    let p = tmp("latents-f16.npy");
    write_f16_npy(&p, &shape, &values);
    let t = read_npy(&p).unwrap();
    assert_eq!(t.shape, shape);
    assert_eq!(t.data, values, "f16 values widen exactly");
    // C×h×w files are promoted to a batch of one.
    let p3 = tmp("latents-f16-rank3.npy");
    write_f16_npy(&p3, &shape[1..], &values);
    let t3 = load_latents(&p3, None, 4).unwrap();
    assert_eq!(t3.shape, shape);

    let vae = tiny_vae();
    let ctx = test_context();
    let a = decode(&ctx, &vae, &t3, &DecodeOptions::default()).unwrap();
    let f32_latents = HostTensor::new(shape.to_vec(), values).unwrap();
    let b = decode(&ctx, &vae, &f32_latents, &DecodeOptions::default()).unwrap();
    assert_eq!(a.rgba, b.rgba);
}
