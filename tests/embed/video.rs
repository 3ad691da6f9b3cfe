//! Video chunks recorded into the host's encoder and textures.

use super::*;

/// A streamed video recorded chunk by chunk into the host's encoder and
/// textures (TAEHV taew2_1-rand, chunks of 1 and 2 latent frames): the
/// frames read back from the textures equal `push`/`finish`'s frames as
/// RGBA8 (±1), through both routes (storage texture, copy into sRGB), and
/// bad targets are refused before anything is recorded.
#[test]
fn video_chunks_recorded_into_host_textures_match_push() {
    check_video_textures("taew2_1-rand", "taew2_1.safetensors");
}

/// As [`video_chunks_recorded_into_host_textures_match_push`] for a
/// patch-size-2 model (taew2_2-rand): its pixel shuffle is a graph op, so
/// its frames reach host textures too.
#[test]
fn patch_size_2_video_chunks_recorded_into_host_textures_match_push() {
    check_video_textures("taew2_2-rand", "taew2_2.safetensors");
}

fn check_video_textures(name: &str, file: &str) {
    use wgpu::{TextureFormat as F, TextureUsages as U};
    use wgvae::kernels::image::ImageRange;
    use wgvae::models::{TaehvDecoder, WeightStore};
    use wgvae::{Context, VideoDecoder};

    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden").join(name);
    let (device, queue) = host();
    let ctx = Context::from_device(device.clone(), queue.clone());
    let store = WeightStore::from_safetensors(&dir.join(file)).unwrap();
    let vae = wgvae::Vae::from(TaehvDecoder::load(&ctx, &store).unwrap());
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let [_, t, c, h, w] = latents.shape[..] else {
        panic!("latents are not 5-D")
    };
    let frame = c * h * w;
    let chunk = |t0: usize, t1: usize| {
        HostTensor::new(
            vec![t1 - t0, c, h, w],
            latents.data[t0 * frame..t1 * frame].to_vec(),
        )
        .unwrap()
    };
    let chunks = [chunk(0, 1), chunk(1, t.min(3))];

    // Reference: push/finish, frames converted to RGBA8 on the host.
    let mut reference = VideoDecoder::shared(&ctx, &vae).unwrap();
    let mut want: Vec<Vec<u8>> = Vec::new();
    for ch in &chunks {
        let f = reference.decode(ch).unwrap();
        let [_, _, fh, fw] = f.shape[..] else {
            panic!()
        };
        for img in f.data.chunks_exact(3 * fh * fw) {
            let (r, g, b) = (
                &img[..fh * fw],
                &img[fh * fw..2 * fh * fw],
                &img[2 * fh * fw..],
            );
            want.push(
                (0..fh * fw)
                    .flat_map(|i| [r[i], g[i], b[i]].map(|v| ImageRange::ZeroToOne.to_byte(v)))
                    .collect(),
            );
        }
    }

    let mut dec = VideoDecoder::shared(&ctx, &vae).unwrap();
    let up = vae.upscale();
    let size = ((w * up) as u32, (h * up) as u32);
    // Misuse first: refused before recording, the decoder stays usable.
    let n0 = dec.frames_next(1);
    assert_eq!(n0, 1);
    let mut enc = device.create_command_encoder(&Default::default());
    let bad = [
        (target(device, size, F::Bgra8Unorm, U::COPY_DST), "format"),
        (
            target(device, size, F::Rgba8Unorm, U::TEXTURE_BINDING),
            "usage",
        ),
        (
            target(
                device,
                (size.0 - 1, size.1),
                F::Rgba8Unorm,
                U::STORAGE_BINDING,
            ),
            "size",
        ),
    ];
    for (tex, what) in &bad {
        let e = dec.record_chunk_to_textures(&mut enc, &chunks[0], &[tex]);
        assert!(e.is_err(), "a target with the wrong {what} was accepted");
    }
    let e = dec
        .record_chunk_to_textures(&mut enc, &chunks[0], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 frames") && e.contains("0 target"), "{e}");

    let mut got: Vec<Vec<u8>> = Vec::new();
    for (ch, (format, usage)) in chunks.iter().zip([
        (F::Rgba8Unorm, U::STORAGE_BINDING),
        (F::Rgba8UnormSrgb, U::COPY_DST),
    ]) {
        let n = dec.frames_next(ch.shape[0]);
        let texs: Vec<_> = (0..n)
            .map(|_| target(device, size, format, usage))
            .collect();
        let refs: Vec<&wgpu::Texture> = texs.iter().collect();
        let pending = dec.record_chunk_to_textures(&mut enc, ch, &refs).unwrap();
        assert_eq!((pending.frames(), pending.first()), (n, got.len()));
        queue.submit([std::mem::replace(
            &mut enc,
            device.create_command_encoder(&Default::default()),
        )
        .finish()]);
        drop(pending);
        got.extend(texs.iter().map(|t| rgb_of(&read_rgba8(device, queue, t))));
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(got.len(), vae.frames_for(t.min(3)).unwrap());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let (worst, differing) = compare(a, b);
        assert!(
            worst <= 1,
            "frame {i}: worst {worst}, {differing} bytes differ"
        );
    }

    // Tiled decoders are refused.
    let mut tiled = VideoDecoder::shared(&ctx, &vae)
        .unwrap()
        .with_tiling(wgvae::tiling::Tiling::exact())
        .unwrap();
    let tex = target(device, size, F::Rgba8Unorm, U::STORAGE_BINDING);
    let e = tiled.record_chunk_to_textures(&mut enc, &chunks[0], &[&tex]);
    assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
}
