//! TAEHV video encoders against `taehv.py`'s `encode_video` (golden made by
//! tests/data/taehv_encoder/make_golden.py on the seeded random weights of
//! `../shared/golden/taew2_{1,2}-rand`, f16-rounded values run in f32):
//! the whole clip, and the same clip streamed in chunks of 3 and 4 frames
//! equal to it.

use std::path::{Path, PathBuf};

use wgvae::io::{read_npy, HostTensor};
use wgvae::testing::{max_abs_diff, project_dir, shared_dir, test_context};
use wgvae::video_encode::{encode_video, VideoEncoder};
use wgvae::{Context, LoadOptions};

/// 3× the measured 1.25e-6 of the whole clip (README; the issue asks 2e-3).
const TOLERANCE: f32 = 4e-6;
/// f16 storage: 3× the measured error (README).
const F16_TOLERANCE: f32 = 2.5e-3;

const T: usize = 10;
const H: usize = 64;
const W: usize = 80;

/// The golden's input (make_golden.py `video()`): `[1, T, 3, H, W]`.
fn video() -> HostTensor {
    let mut data = Vec::with_capacity(T * 3 * H * W);
    for t in 0..T {
        for c in 0..3 {
            for y in 0..H {
                for x in 0..W {
                    let (t, c, y, x) = (t as f64, c as f64, y as f64, x as f64);
                    let v =
                        0.5 + 0.5 * (0.3 * t + 1.7 * c + 0.11 * y - 0.07 * x + 0.013 * x * y).sin();
                    data.push(v as f32);
                }
            }
        }
    }
    HostTensor::new(vec![1, T, 3, H, W], data).unwrap()
}

fn weights(name: &str) -> Option<PathBuf> {
    shared_dir().map(|s| {
        s.join("golden")
            .join(format!("{name}-rand"))
            .join(format!("{name}.safetensors"))
    })
}

fn load(ctx: &Context, path: &Path) -> wgvae::Vae {
    wgvae::Vae::load_encoder(ctx, path.to_str().unwrap(), &LoadOptions::default()).unwrap()
}

fn check(name: &str) {
    let Some(path) = weights(name) else { return };
    let ctx = test_context();
    let enc = load(&ctx, &path);
    let want = read_npy(
        &project_dir()
            .join("tests/data/taehv_encoder")
            .join(format!("{name}_latents.npy")),
    )
    .unwrap();
    let frames = video();
    let got = encode_video(&ctx, &enc, &frames).unwrap();
    assert_eq!(got.shape, want.shape, "{name}: latent shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("{name}: whole clip: max abs error {err:.3e} at {at}");
    assert!(err <= TOLERANCE, "{name}: {err} > {TOLERANCE} at {at}");

    let frame = 3 * H * W;
    for size in [3, 4] {
        let mut stream = VideoEncoder::new(&ctx, &enc).unwrap();
        let mut data = Vec::new();
        for t0 in (0..T).step_by(size) {
            let t1 = (t0 + size).min(T);
            let chunk = HostTensor::new(
                vec![t1 - t0, 3, H, W],
                frames.data[t0 * frame..t1 * frame].to_vec(),
            )
            .unwrap();
            data.extend(stream.push(&chunk).unwrap().data);
        }
        data.extend(stream.finish().unwrap().data);
        let (d, at) = max_abs_diff(&data, &got.data);
        println!("{name}: chunks of {size} frames: {d:.3e} from the whole clip");
        assert_eq!(data.len(), got.data.len(), "{name}: chunks of {size}");
        assert!(d <= 1e-6, "{name}: chunks of {size}: {d} at {at}");
    }
}

#[test]
fn taew2_1_rand_encoder() {
    check("taew2_1");
}

#[test]
fn taew2_2_rand_encoder() {
    check("taew2_2");
}

fn message<T>(r: wgvae::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_video_encoder_inputs_are_errors() {
    let Some(path) = weights("taew2_2") else {
        return;
    };
    let ctx = test_context();
    let enc = load(&ctx, &path);
    let frames = |shape: Vec<usize>| {
        let n = shape.iter().product();
        HostTensor::new(shape, vec![0.5; n]).unwrap()
    };
    let e = message(encode_video(&ctx, &enc, &frames(vec![1, 4, 4, 16, 16])));
    assert!(e.contains("4 channels") && e.contains("RGB"), "{e}");
    let e = message(encode_video(&ctx, &enc, &frames(vec![1, 0, 3, 16, 16])));
    assert!(e.contains("T=0"), "{e}");
    let e = message(encode_video(&ctx, &enc, &frames(vec![1, 4, 3, 15, 16])));
    assert!(e.contains("divisible by 2"), "{e}");
    let e = message(encode_video(&ctx, &enc, &frames(vec![4, 3, 16, 16])));
    assert!(e.contains("N×T×3×H×W"), "{e}");
    let mut nan = frames(vec![1, 4, 3, 16, 16]);
    nan.data[5] = f32::NAN;
    let e = message(encode_video(&ctx, &enc, &nan));
    assert!(e.contains("finite"), "{e}");

    // A later chunk of another frame size is refused; the stream stays usable.
    let mut stream = VideoEncoder::new(&ctx, &enc).unwrap();
    stream.push(&frames(vec![2, 3, 16, 16])).unwrap();
    let e = message(stream.push(&frames(vec![2, 3, 32, 16])));
    assert!(e.contains("same frame size"), "{e}");
    let out = stream.finish().unwrap();
    assert_eq!(out.shape, vec![1, 48, 1, 1]);
    let e = message(VideoEncoder::new(&ctx, &enc).unwrap().finish());
    assert!(e.contains("at least one frame"), "{e}");

    // A Wan VAE has no encoder here: a clear refusal.
    if let Some(wan) = shared_dir().map(|s| s.join("golden/wan21-tiny")) {
        let e = message(wgvae::Vae::load_encoder(
            &ctx,
            wan.to_str().unwrap(),
            &LoadOptions::default(),
        ));
        assert!(e.contains("Wan") && e.contains("TAEHV"), "{e}");
    }
}

/// f16 storage (f32 arithmetic) against the same f32 golden.
#[test]
fn taew2_1_rand_encoder_f16() {
    let Some(path) = weights("taew2_1") else {
        return;
    };
    let ctx = test_context();
    let opts = LoadOptions {
        precision: "f16".parse().unwrap(),
        ..Default::default()
    };
    let enc = wgvae::Vae::load_encoder(&ctx, path.to_str().unwrap(), &opts).unwrap();
    let want =
        read_npy(&project_dir().join("tests/data/taehv_encoder/taew2_1_latents.npy")).unwrap();
    let got = encode_video(&ctx, &enc, &video()).unwrap();
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("taew2_1 f16: max abs error {err:.3e} at {at}");
    assert!(err <= F16_TOLERANCE, "f16: {err} at {at}");
}
