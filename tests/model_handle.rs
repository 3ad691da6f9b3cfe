//! The one model handle: `Vae::load` tells image from video decoders by
//! their files, `Vae::load_encoder` loads image or video encoders, each kind
//! answers what it is, and every front door refuses a model of another kind
//! by name, naming the door that takes it.

use wgvae::encode::{encode, EncodeOptions};
use wgvae::io::HostTensor;
use wgvae::testing::{error_message, shared_dir, test_context};
use wgvae::video_encode::{encode_video, VideoEncoder};
use wgvae::{
    decode, decode_frames, decode_video, DecodeOptions, FramesOptions, LoadOptions, ModelKind, Vae,
    VideoDecoder,
};

fn golden(name: &str) -> Option<String> {
    let dir = shared_dir()?.join("golden").join(name);
    Some(dir.to_str().unwrap().to_string())
}

fn zeros(shape: &[usize]) -> HostTensor {
    HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()]).unwrap()
}

/// Each of the four kinds loads through the handle and says what it is.
#[test]
fn each_kind_loads_through_one_handle() {
    let (Some(kl), Some(taehv)) = (golden("aekl-tiny-sd"), golden("taew2_1-rand")) else {
        return;
    };
    let taehv = format!("{taehv}/taew2_1.safetensors");
    let ctx = test_context();
    let load = LoadOptions::default();

    let image = Vae::load(&ctx, &kl, &load).unwrap();
    assert_eq!(image.kind(), ModelKind::ImageDecoder);
    assert!(image.weights_bytes() > 0);
    assert_eq!(image.latent_layout(), None);
    assert!(image.latent_form().is_ok());
    assert!(image.latent_scaling().is_some());
    let m = error_message(image.frames_for(3));
    assert!(m.contains("is an image decoder"), "{m}");

    let encoder = Vae::load_encoder(&ctx, &kl, &load).unwrap();
    assert_eq!(encoder.kind(), ModelKind::ImageEncoder);
    assert!(encoder.weights_bytes() > 0);
    assert_eq!(
        (encoder.latent_channels(), encoder.upscale()),
        (image.latent_channels(), image.upscale())
    );
    // An AutoencoderKL encoder applies the scaling its decoder undoes.
    assert_eq!(encoder.latent_scaling(), image.latent_scaling());
    let m = error_message(encoder.latent_form());
    assert!(m.contains("is an image encoder"), "{m}");

    let video = Vae::load(&ctx, &taehv, &load).unwrap();
    assert_eq!(video.kind(), ModelKind::VideoDecoder);
    // Options of image VAEs are refused, not ignored.
    let scaled = LoadOptions {
        scaling_factor: Some(0.18215),
        ..LoadOptions::default()
    };
    let m = error_message(Vae::load(&ctx, &taehv, &scaled));
    assert!(
        m.contains("is a video decoder") && m.contains("scaling_factor"),
        "{m}"
    );
    assert!(video.weights_bytes() > 0);
    assert_eq!(video.latent_layout(), Some(wgvae::VideoLayout::Ntchw));
    assert_eq!(video.frames_for(3).unwrap(), 9);
    assert_eq!(video.latent_scaling(), None);
    // TAEHV decodes pipeline latents as they are.
    let mut z = zeros(&[1, 16, 1, 2, 2]);
    video.unnormalize(&mut z).unwrap();

    let video_encoder = Vae::load_encoder(&ctx, &taehv, &load).unwrap();
    assert_eq!(video_encoder.kind(), ModelKind::VideoEncoder);
    assert!(video_encoder.weights_bytes() > 0);
    assert_eq!(
        (video_encoder.latent_channels(), video_encoder.upscale()),
        (video.latent_channels(), video.upscale())
    );
    let m = error_message(video_encoder.unnormalize(&mut z));
    assert!(m.contains("is a video encoder"), "{m}");
}

/// Every front door refuses the other kinds, naming the kind it was given
/// and the door that takes it, before it runs anything.
#[test]
fn front_doors_refuse_other_kinds_by_name() {
    let (Some(kl), Some(taehv), Some(wan)) = (
        golden("aekl-tiny-sd"),
        golden("taew2_1-rand"),
        golden("wan21-tiny"),
    ) else {
        return;
    };
    let taehv = format!("{taehv}/taew2_1.safetensors");
    let ctx = test_context();
    let load = LoadOptions::default();
    let image = Vae::load(&ctx, &kl, &load).unwrap();
    let encoder = Vae::load_encoder(&ctx, &kl, &load).unwrap();
    let video = Vae::load(&ctx, &taehv, &load).unwrap();
    let video_encoder = Vae::load_encoder(&ctx, &taehv, &load).unwrap();
    let image_latents = zeros(&[1, 4, 4, 4]);
    let video_latents = zeros(&[1, 1, 16, 2, 2]);
    let pixels = zeros(&[1, 3, 16, 16]);

    let check = |m: String, door: &str, kind: &str, instead: &str| {
        assert!(
            m.starts_with(&format!("invalid input: {door}"))
                && m.contains(kind)
                && m.contains(instead),
            "expected `{door}` … `{kind}` … `{instead}` in: {m}"
        );
    };
    let opts = DecodeOptions::default();
    for (vae, kind, instead) in [
        (&encoder, "is an image encoder", "decoder with `Vae::load`"),
        (&video, "is a video decoder", "decode_video"),
        (&video_encoder, "is a video encoder", "video_encode"),
    ] {
        check(
            error_message(decode(&ctx, vae, &image_latents, &opts)),
            "decoding images",
            kind,
            instead,
        );
        let frames = decode_frames(&ctx, vae, &image_latents, &FramesOptions::default(), |_| {
            Ok(())
        });
        check(error_message(frames), "decoding frames", kind, instead);
    }
    for (vae, kind, instead) in [
        (&image, "is an image decoder", "Vae::load_encoder"),
        (&video, "is a video decoder", "image models are"),
        (&video_encoder, "is a video encoder", "image models are"),
    ] {
        let encoded = encode(&ctx, vae, &pixels, &EncodeOptions::default());
        check(error_message(encoded), "encoding images", kind, instead);
    }
    for (vae, kind, instead) in [
        (&image, "is an image decoder", "needs a video model"),
        (&encoder, "is an image encoder", "needs a video model"),
        (
            &video_encoder,
            "is a video encoder",
            "decoder of the same file",
        ),
    ] {
        check(
            error_message(decode_video(&ctx, vae, &video_latents)),
            "decoding video",
            kind,
            instead,
        );
        check(
            error_message(VideoDecoder::new(&ctx, vae)),
            "a VideoDecoder",
            kind,
            instead,
        );
        check(
            error_message(VideoDecoder::shared(&ctx, vae)),
            "a VideoDecoder",
            kind,
            instead,
        );
    }
    for (vae, kind, instead) in [
        (&image, "is an image decoder", "needs a video model"),
        (&encoder, "is an image encoder", "needs a video model"),
        (&video, "is a video decoder", "encoder of a TAEHV file"),
    ] {
        check(
            error_message(encode_video(&ctx, vae, &zeros(&[1, 4, 3, 16, 16]))),
            "encoding video",
            kind,
            instead,
        );
        check(
            error_message(VideoEncoder::new(&ctx, vae)),
            "a VideoEncoder",
            kind,
            instead,
        );
    }

    // Hosts that decode images only refuse video files from their headers.
    let m = error_message(Vae::load_image_decoder(&ctx, &taehv, &load));
    assert!(
        m.contains("TAEHV video decoder") && m.contains("decode_video"),
        "{m}"
    );

    // A Wan VAE file has a Qwen-Image VAE's keys: the refusal says how to
    // decode images with such a file.
    let wan = Vae::load(&ctx, &wan, &load).unwrap();
    assert_eq!(wan.kind(), ModelKind::VideoDecoder);
    let m = error_message(decode(&ctx, &wan, &image_latents, &opts));
    assert!(
        m.contains("is a video decoder") && m.contains("qwen_image_vae.safetensors"),
        "{m}"
    );
}
