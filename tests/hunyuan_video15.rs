//! The HunyuanVideo 1.5 VAE decoder against diffusers 0.42.1's
//! `AutoencoderKLHunyuanVideo15` on the `hunyuanvideo15-tiny` golden
//! (seeded random weights, f32 CPU): diffusers decodes the whole clip in one
//! pass; the engine streams it (replicate-padded causal convs, block-causal
//! attention with earlier frames' keys and values) and must equal it.

use std::path::PathBuf;

use wgvae::io::{read_npy, HostTensor};
use wgvae::models::hunyuan_video15::HunyuanVideo15Decoder;
use wgvae::testing::{max_abs_diff, shared_dir, test_context};
use wgvae::{decode_video, Context, VideoDecoder};

/// f32 against diffusers' f32 CPU decode (the bound is 1e-3).
const TOLERANCE: f32 = 1e-4;

fn golden() -> Option<PathBuf> {
    shared_dir().map(|s| s.join("golden").join("hunyuanvideo15-tiny"))
}

fn open(ctx: &Context, dir: &std::path::Path) -> HunyuanVideo15Decoder {
    HunyuanVideo15Decoder::open(ctx, dir.to_str().unwrap(), wgvae::DType::F32, 0).unwrap()
}

/// Latent frames `t0..t1` of Wan latents [1, C, T, h, w] as the [T, C, h, w]
/// chunk a [`VideoDecoder`] takes.
fn chunk(latents: &HostTensor, t0: usize, t1: usize) -> HostTensor {
    let [_, c, t, h, w] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let mut data = Vec::new();
    for f in t0..t1 {
        for ch in 0..c {
            let at = (ch * t + f) * h * w;
            data.extend_from_slice(&latents.data[at..at + h * w]);
        }
    }
    HostTensor::new(vec![t1 - t0, c, h, w], data).unwrap()
}

/// Frames [T', 3, H, W] → diffusers' [3, T', H, W].
fn channels_first(frames: &[f32], [c, t, h, w]: [usize; 4]) -> Vec<f32> {
    let plane = h * w;
    assert_eq!(frames.len(), c * t * plane, "frame values");
    let mut data = Vec::with_capacity(frames.len());
    for ch in 0..c {
        for f in 0..t {
            let at = (f * c + ch) * plane;
            data.extend_from_slice(&frames[at..at + plane]);
        }
    }
    data
}

fn out_dims(want: &HostTensor) -> [usize; 4] {
    let [_, c, t, h, w] = want.shape[..] else {
        panic!("decoded is not 5-D")
    };
    [c, t, h, w]
}

fn stream(
    ctx: &Context,
    dec: &HunyuanVideo15Decoder,
    latents: &HostTensor,
    size: usize,
) -> Vec<f32> {
    let t = latents.shape[2];
    let mut s = VideoDecoder::new(ctx, dec);
    let mut frames = Vec::new();
    for t0 in (0..t).step_by(size) {
        frames.extend(
            s.decode(&chunk(latents, t0, (t0 + size).min(t)))
                .unwrap()
                .data,
        );
    }
    frames
}

/// Raw z as one clip and streamed in chunks of 1 and 2 latent frames; the
/// pipeline's latents un-normalise to z (config latents_mean/std).
#[test]
fn hunyuanvideo15_tiny_whole_and_streamed() {
    let Some(dir) = golden() else { return };
    let ctx = test_context();
    let dec = open(&ctx, &dir);
    assert_eq!(
        (dec.latent_channels(), dec.upscale(), dec.t_upscale()),
        (32, 16, 4)
    );
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let want = read_npy(&dir.join("decoded.npy")).unwrap();
    let mut unnormalised = latents.clone();
    dec.unnormalize(&mut unnormalised).unwrap();
    let (e, at) = max_abs_diff(&unnormalised.data, &z.data);
    assert!(e <= 1e-6, "latents / scaling_factor vs z.npy: {e} at {at}");
    let got = decode_video(&ctx, &dec, &z).unwrap();
    assert_eq!(got.shape, want.shape, "output shape");
    let (err, at) = max_abs_diff(&got.data, &want.data);
    println!("hunyuanvideo15-tiny: whole clip: max abs error {err:.3e} at {at}");
    assert!(err <= TOLERANCE, "whole clip: {err} at {at}");
    for size in [1, 2] {
        let data = channels_first(&stream(&ctx, &dec, &z, size), out_dims(&want));
        let (err, at) = max_abs_diff(&data, &want.data);
        println!("hunyuanvideo15-tiny: chunks of {size}: max abs error {err:.3e} at {at}");
        assert!(err <= TOLERANCE, "chunks of {size}: {err} at {at}");
    }
}
