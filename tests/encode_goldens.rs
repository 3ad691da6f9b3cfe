//! Encoders against diffusers / PyTorch: AutoencoderKL mean and std within
//! 1e-3 of `encoded_mean.npy` / `encoded_std.npy`; TAEF2 latents within 2e-3
//! of the PyTorch encoder's, and the photo → latents → photo round trip at
//! the published PSNR (±0.1 dB).

use wgvae::encode::{encode, load_image, EncodeOptions};
use wgvae::io::read_npy;
use wgvae::testing::{max_abs_diff, psnr, rgb_of, shared_dir, test_context};
use wgvae::{decode, DecodeOptions, LoadOptions, Vae};

#[test]
fn autoencoder_kl_encoders_match_diffusers() {
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context();
    for name in ["aekl-tiny-sd", "aekl-tiny-flux"] {
        let dir = shared.join("golden").join(name);
        let enc =
            wgvae::Vae::load_encoder(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
        let img = load_image(&dir.join("encode_input.png"), false).unwrap();
        let out = encode(&ctx, &enc, &img, &EncodeOptions::default()).unwrap();
        let (mean, std) = (out.mean.unwrap(), out.std.unwrap());
        let want_mean = read_npy(&dir.join("encoded_mean.npy")).unwrap();
        let want_std = read_npy(&dir.join("encoded_std.npy")).unwrap();
        assert_eq!(mean.shape, want_mean.shape, "{name}");
        let (em, _) = max_abs_diff(&mean.data, &want_mean.data);
        let (es, _) = max_abs_diff(&std.data, &want_std.data);
        println!("{name}: mean max abs error {em:.3e}, std {es:.3e}");
        assert!(em <= 1e-3 && es <= 1e-3, "{name}: mean {em}, std {es}");
        // Pipeline latents are (mean − shift) · scaling_factor.
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap())
                .unwrap();
        let (sf, shift) = (
            golden["scaling_factor"].as_f64().unwrap() as f32,
            golden["shift_factor"].as_f64().unwrap() as f32,
        );
        for (z, m) in out.latents.data.iter().zip(&mean.data) {
            assert!((z - (m - shift) * sf).abs() <= 1e-6);
        }
        // A seeded sample differs from the mean by about one std, reproducibly.
        let s1 = encode(
            &ctx,
            &enc,
            &img,
            &EncodeOptions {
                sample: Some(3),
                raw_latents: true,
                ..Default::default()
            },
        )
        .unwrap()
        .latents;
        let s2 = encode(
            &ctx,
            &enc,
            &img,
            &EncodeOptions {
                sample: Some(3),
                raw_latents: true,
                ..Default::default()
            },
        )
        .unwrap()
        .latents;
        assert_eq!(s1, s2);
        assert!(s1.data != mean.data);
    }
}

#[test]
fn taef2_encoder_matches_pytorch_and_round_trips() {
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context();
    let enc_path = shared.join("weights/taef2/encoder.safetensors");
    let enc = wgvae::Vae::load_encoder(&ctx, enc_path.to_str().unwrap(), &LoadOptions::default())
        .unwrap();
    let dec_path = shared.join("weights/taef2/decoder.safetensors");
    let dec = Vae::load(&ctx, dec_path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    for (photo, want_psnr) in [("chelsea", 32.7), ("coffee", 29.6), ("astronaut", 31.2)] {
        let img = load_image(&shared.join(format!("images/{photo}.png")), false).unwrap();
        let out = encode(&ctx, &enc, &img, &EncodeOptions::default()).unwrap();
        let want = read_npy(&shared.join(format!("golden/taef2/{photo}.latents.npy"))).unwrap();
        assert_eq!(out.latents.shape, want.shape);
        let (err, at) = max_abs_diff(&out.latents.data, &want.data);
        let back = decode(&ctx, &dec, &out.latents, &DecodeOptions::default()).unwrap();
        let rgb = rgb_of(&back.rgba[0]);
        let original = image::open(shared.join(format!("images/{photo}.png")))
            .unwrap()
            .to_rgb8()
            .into_raw();
        let p = psnr(&rgb, &original);
        println!("taef2 {photo}: latents max abs error {err:.3e}; round trip PSNR {p:.2} dB (PyTorch {want_psnr})");
        assert!(err <= 2e-3, "{photo}: latents differ by {err} at {at}");
        assert!(
            (p - want_psnr).abs() <= 0.1,
            "{photo}: PSNR {p:.2} vs {want_psnr}"
        );
    }
}

#[test]
fn image_sizes_must_be_multiples_of_8_unless_padded() {
    let Some(shared) = shared_dir() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let tmp = scratch.path().join("enc.png");
    image::RgbImage::from_pixel(13, 10, image::Rgb([200, 100, 50]))
        .save(&tmp)
        .unwrap();
    let e = load_image(&tmp, false).unwrap_err().to_string();
    assert!(e.contains("multiple of 8") && e.contains("`pad`"), "{e}");
    let padded = load_image(&tmp, true).unwrap();
    assert_eq!(padded.shape, vec![1, 3, 16, 16]);
    assert!(
        padded.data.iter().take(16 * 16).all(|&v| v == 200.0),
        "edges replicate"
    );
    let ctx = test_context();
    let dec = shared.join("weights/taef2/decoder.safetensors");
    let e = wgvae::Vae::load_encoder(&ctx, dec.to_str().unwrap(), &LoadOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("decoder file"), "{e}");
}

/// `sample: Some(seed)` is exactly `mean + std · ε` with
/// ε = `standard_normal(len, seed)`, before and after the pipeline scaling
/// `(z − shift) · scaling_factor`; and the ε implied by the latents looks
/// standard normal (4096 values: mean within 0.15, std within 0.1 of 1).
#[test]
fn kl_sample_is_mean_plus_std_times_standard_normal() {
    use wgvae::encode::standard_normal;
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context();
    let dir = shared.join("golden/aekl-tiny-flux");
    let enc =
        wgvae::Vae::load_encoder(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let img = load_image(&dir.join("encode_input.png"), false).unwrap();
    let run = |sample, raw_latents| {
        let opts = EncodeOptions {
            sample,
            raw_latents,
            ..Default::default()
        };
        encode(&ctx, &enc, &img, &opts).unwrap()
    };
    let base = run(None, true);
    let (mean, std) = (base.mean.unwrap().data, base.std.unwrap().data);
    assert_eq!(base.latents.data, mean, "no sample: the mean");
    let eps = standard_normal(mean.len(), 9);
    let raw = run(Some(9), true).latents.data;
    let scaled = run(Some(9), false).latents.data;
    let (sf, shift) = enc.latent_scaling().expect("an AutoencoderKL encoder");
    assert!(shift != 0.0, "this test needs a shifted VAE");
    let mut implied = Vec::new();
    for i in 0..mean.len() {
        let z = mean[i] + std[i] * eps[i];
        assert!(
            (raw[i] - z).abs() <= 1e-6 * (1.0 + z.abs()),
            "{i}: {} vs {z}",
            raw[i]
        );
        let s = (z - shift) * sf;
        assert!((scaled[i] - s).abs() <= 1e-6 * (1.0 + s.abs()), "{i}");
        implied.push(((raw[i] - mean[i]) / std[i]) as f64);
    }
    let n = implied.len() as f64;
    let m = implied.iter().sum::<f64>() / n;
    let sd = (implied.iter().map(|e| (e - m).powi(2)).sum::<f64>() / n).sqrt();
    println!("implied ε over {n} latents: mean {m:.4}, std {sd:.4}");
    assert!(
        m.abs() < 0.15 && (sd - 1.0).abs() < 0.1,
        "mean {m}, std {sd}"
    );
}

/// TAE encoders are deterministic: `sample` is an error that says why, not
/// silently ignored; `raw_latents` is a no-op for their unscaled latents.
#[test]
fn tae_encoders_refuse_sample_and_ignore_raw_latents() {
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context();
    let path = shared.join("weights/taef2/encoder.safetensors");
    let enc =
        wgvae::Vae::load_encoder(&ctx, path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let img = wgvae::io::HostTensor::new(vec![1, 3, 8, 8], vec![128.0; 192]).unwrap();
    let sample = EncodeOptions {
        sample: Some(1),
        ..Default::default()
    };
    let e = encode(&ctx, &enc, &img, &sample).err().unwrap().to_string();
    assert!(
        e.contains("`EncodeOptions::sample`") && e.contains("deterministic"),
        "{e}"
    );
    // raw_latents changes nothing for TAE latents (the CLI rejects the flag).
    let raw = EncodeOptions {
        raw_latents: true,
        ..Default::default()
    };
    let plain = encode(&ctx, &enc, &img, &EncodeOptions::default()).unwrap();
    assert_eq!(
        encode(&ctx, &enc, &img, &raw).unwrap().latents,
        plain.latents
    );
}

/// FLUX.2 (both goldens): the raw mean and std, the pipeline form
/// (patchified, BatchNorm-normalised N×128×H/16×W/16) within 2e-4 of
/// diffusers, exact tiles within 1e-3 of untiled; the pipeline form decodes
/// like the raw mean.
#[test]
fn flux2_encoders_match_diffusers() {
    let Some(shared) = shared_dir() else { return };
    let ctx = test_context();
    for name in ["flux2-tiny", "flux2-small-decoder-tiny"] {
        let dir = shared.join("golden").join(name);
        let enc =
            wgvae::Vae::load_encoder(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
        let img = load_image(&dir.join("encode_input.png"), false).unwrap();
        let out = encode(&ctx, &enc, &img, &EncodeOptions::default()).unwrap();
        let (mean, std) = (out.mean.unwrap(), out.std.unwrap());
        let want_mean = read_npy(&dir.join("encoded_mean.npy")).unwrap();
        let want_std = read_npy(&dir.join("encoded_std.npy")).unwrap();
        let want_latents = read_npy(&dir.join("encoded_latents.npy")).unwrap();
        assert_eq!(mean.shape, want_mean.shape, "{name}");
        assert_eq!(out.latents.shape, want_latents.shape, "{name}");
        let (em, _) = max_abs_diff(&mean.data, &want_mean.data);
        let (es, _) = max_abs_diff(&std.data, &want_std.data);
        let (el, _) = max_abs_diff(&out.latents.data, &want_latents.data);
        println!("{name}: mean {em:.3e}, std {es:.3e}, pipeline latents {el:.3e}");
        assert!(
            em <= 2e-4 && es <= 2e-4 && el <= 2e-4,
            "{name}: {em} {es} {el}"
        );
        let raw = EncodeOptions {
            raw_latents: true,
            ..Default::default()
        };
        let r = encode(&ctx, &enc, &img, &raw).unwrap();
        assert_eq!(r.latents, mean, "{name}: raw latents are the mean");
        let tiled = EncodeOptions {
            tiling: wgvae::Tiling::exact().with_tile_size(48),
            ..Default::default()
        };
        let t = encode(&ctx, &enc, &img, &tiled).unwrap();
        assert_eq!(t.tiling.mode, "exact", "{name}");
        let (et, _) = max_abs_diff(&t.latents.data, &out.latents.data);
        println!("{name}: exact tiles vs untiled {et:.3e}");
        assert!(et <= 1e-3, "{name}: tiled {et}");
        let vae = Vae::load(&ctx, dir.to_str().unwrap(), &LoadOptions::default()).unwrap();
        let keep = DecodeOptions {
            keep_raw: true,
            ..Default::default()
        };
        let a = decode(&ctx, &vae, &out.latents, &keep)
            .unwrap()
            .raw
            .unwrap();
        let b = decode(
            &ctx,
            &vae,
            &mean,
            &DecodeOptions {
                raw_latents: true,
                ..keep
            },
        )
        .unwrap()
        .raw
        .unwrap();
        let (ed, _) = max_abs_diff(&a.data, &b.data);
        assert!(
            ed <= 1e-4,
            "{name}: pipeline form decodes like the mean: {ed}"
        );
    }
}
