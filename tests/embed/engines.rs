//! Engines on a host device: latents from a host buffer, two engines on one
//! device, the planned pool's pending shapes, misuse reported before anything
//! is recorded.

use super::*;

/// Latents from a host buffer (at an offset, as a host's diffusion model
/// would leave them), unscaled on the GPU (FLUX-style scaling and shift),
/// give the host-latent result within ±1 — through both paths.
#[test]
fn latents_from_a_host_buffer_match_host_latents() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-flux");
    let (device, queue) = host();
    let engine = engine(&dir);
    let (scale, shift) = engine.vae().latent_scaling().unwrap();
    assert!(
        scale != 1.0 && shift != 0.0,
        "this test needs a scaled, shifted VAE"
    );
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let reference = engine.decode_to_image(&latents).unwrap();

    let offset = 256u64;
    let bytes: &[u8] = bytemuck::cast_slice(&latents.data);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host diffusion output"),
        size: offset + bytes.len() as u64 + 64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&buffer, offset, bytes);
    let shape: [usize; 4] = latents.shape.clone().try_into().unwrap();
    let on_device = DeviceLatents {
        buffer: &buffer,
        offset,
        shape,
    };

    let simple = engine.decode_to_image(on_device).unwrap();
    let (worst, differing) = compare(simple.as_raw(), reference.as_raw());
    println!("decode_to_image from a buffer: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 1);

    let image = decode_into_host_texture(
        &engine,
        device,
        queue,
        on_device,
        &latents.shape,
        wgpu::TextureFormat::Rgba8Unorm,
    )
    .unwrap();
    let (worst, differing) = compare(&image.texels, reference.as_raw());
    println!("texture from a buffer: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 1);

    // Raw latents (decoder input already): the engine must not unscale them.
    let raw_engine = raw_engine(&dir);
    let mut z = latents.clone();
    raw_engine.vae().unnormalize(&mut z).unwrap();
    queue.write_buffer(&buffer, offset, bytemuck::cast_slice(&z.data));
    let from_raw = raw_engine.decode_to_image(on_device).unwrap();
    let (worst, _) = compare(from_raw.as_raw(), reference.as_raw());
    assert!(worst <= 1, "raw latents from a buffer: {worst}");
}

/// Two engines (two VAEs) on one host device: recorded into one encoder and
/// decoded from two threads at once; each matches diffusers.
#[test]
fn two_engines_share_one_device() {
    let Some(shared) = shared_dir() else { return };
    let (device, queue) = host();
    let names = ["aekl-tiny-sd", "aekl-tiny-flux"];
    let dirs: Vec<_> = names
        .iter()
        .map(|n| shared.join("golden").join(n))
        .collect();
    let engines: Vec<_> = dirs.iter().map(|d| engine(d)).collect();
    let latents: Vec<_> = dirs
        .iter()
        .map(|d| read_npy(&d.join("latents.npy")).unwrap())
        .collect();
    let wants: Vec<_> = dirs
        .iter()
        .map(|d| png_rgb(&d.join("decoded_0.png")))
        .collect();

    // One encoder, both engines, the host submits once.
    let textures: Vec<_> = engines
        .iter()
        .zip(&latents)
        .map(|(e, l)| {
            target(
                device,
                e.image_size(&l.shape).unwrap(),
                wgpu::TextureFormat::Rgba8Unorm,
                wgpu::TextureUsages::STORAGE_BINDING,
            )
        })
        .collect();
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending: Vec<_> = engines
        .iter()
        .zip(&latents)
        .zip(&textures)
        .map(|((e, l), t)| e.record_decode_to_texture(&mut encoder, l, t).unwrap())
        .collect();
    queue.submit([encoder.finish()]);
    drop(pending);
    for ((name, tex), want) in names.iter().zip(&textures).zip(&wants) {
        let (worst, _) = compare(&rgb_of(&read_rgba8(device, queue, tex)), want);
        assert!(worst <= 1, "{name} (one encoder): {worst}");
    }

    // Both engines from two threads at once (each engine is Sync; they share
    // device and queue and nothing else).
    std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter()
            .zip(&latents)
            .map(|(e, l)| s.spawn(move || e.decode_to_image(l).unwrap()))
            .collect();
        for ((h, name), want) in handles.into_iter().zip(names).zip(&wants) {
            let (worst, _) = compare(&rgb_of(h.join().unwrap().as_raw()), want);
            assert!(worst <= 1, "{name} (threads): {worst}");
        }
    });
}

/// The planned pool and a live `PendingDecode`: a different latent shape is
/// refused until the pending decode is dropped; then it decodes correctly.
#[test]
fn planned_pool_refuses_a_new_shape_while_a_decode_is_pending() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let (device, queue) = host();
    let engine = engine(&dir);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    // An 8×8 crop of the 12×16 latents.
    let [n, c, h, w]: [usize; 4] = latents.shape.clone().try_into().unwrap();
    let mut crop = Vec::new();
    for b in 0..n * c {
        for y in 0..8 {
            let row = (b * h + y) * w;
            crop.extend_from_slice(&latents.data[row..row + 8]);
        }
    }
    let small = HostTensor::new(vec![n, c, 8, 8], crop).unwrap();
    let big_tex = target(
        device,
        engine.image_size(&latents.shape).unwrap(),
        wgpu::TextureFormat::Rgba8Unorm,
        wgpu::TextureUsages::STORAGE_BINDING,
    );
    let small_tex = target(
        device,
        engine.image_size(&small.shape).unwrap(),
        wgpu::TextureFormat::Rgba8Unorm,
        wgpu::TextureUsages::STORAGE_BINDING,
    );

    let mut encoder = device.create_command_encoder(&Default::default());
    let pending = engine
        .record_decode_to_texture(&mut encoder, &latents, &big_tex)
        .unwrap();
    let mut other = device.create_command_encoder(&Default::default());
    match engine.record_decode_to_texture(&mut other, &small, &small_tex) {
        Err(Error::Unsupported(m)) => println!("refused as documented: {m}"),
        r => panic!("expected Error::Unsupported, got {r:?}"),
    }
    queue.submit([encoder.finish()]);
    drop(pending);
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending = engine
        .record_decode_to_texture(&mut encoder, &small, &small_tex)
        .unwrap();
    queue.submit([encoder.finish()]);
    drop(pending);
    let want = engine.decode_to_image(&small).unwrap();
    assert_eq!(read_rgba8(device, queue, &small_tex), want.into_raw());
}

/// Misuse is an error returned before anything is recorded.
#[test]
fn misuse_is_reported() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let (device, _queue) = host();
    let engine = engine(&dir);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let size = engine.image_size(&latents.shape).unwrap();
    let mut enc = device.create_command_encoder(&Default::default());
    use wgpu::{TextureFormat as F, TextureUsages as U};
    let mut record = |tex: &wgpu::Texture, l: &HostTensor| {
        engine
            .record_decode_to_texture(&mut enc, l, tex)
            .map(|_| ())
    };
    // Formats and usages.
    assert!(matches!(
        record(&target(device, size, F::Bgra8Unorm, U::COPY_DST), &latents),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        record(
            &target(device, size, F::Rgba8UnormSrgb, U::TEXTURE_BINDING),
            &latents
        ),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        record(
            &target(device, size, F::Rgba8Unorm, U::TEXTURE_BINDING),
            &latents
        ),
        Err(Error::Unsupported(_))
    ));
    // Too small.
    let small = (size.0 - 1, size.1);
    assert!(matches!(
        record(
            &target(device, small, F::Rgba8Unorm, U::STORAGE_BINDING),
            &latents
        ),
        Err(Error::InvalidInput(_))
    ));
    // A batch into one texture; wrong channels; NaN.
    let ok_tex = target(device, size, F::Rgba8Unorm, U::STORAGE_BINDING);
    let mut two = latents.clone();
    two.shape[0] = 2;
    two.data.extend(latents.data.clone());
    assert!(matches!(record(&ok_tex, &two), Err(Error::InvalidInput(_))));
    let mut nan = latents.clone();
    nan.data[3] = f32::NAN;
    assert!(matches!(record(&ok_tex, &nan), Err(Error::InvalidInput(_))));
    let wrong_channels = HostTensor::new(vec![1, 3, 12, 16], vec![0.0; 3 * 12 * 16]).unwrap();
    assert!(matches!(
        record(&ok_tex, &wrong_channels),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        engine.decode_to_image(&two),
        Err(Error::InvalidInput(_))
    ));
    // Device latents: usage, alignment, bounds.
    let shape: [usize; 4] = latents.shape.clone().try_into().unwrap();
    let bytes = latents.data.len() as u64 * 4;
    let no_copy = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let copy_src = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes + 4,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    for (what, buffer, offset) in [
        ("no COPY_SRC", &no_copy, 0),
        ("misaligned", &copy_src, 2),
        ("overrun", &copy_src, 8),
    ] {
        let l = DeviceLatents {
            buffer,
            offset,
            shape,
        };
        assert!(
            matches!(
                engine.record_decode_to_texture(&mut enc, l, &ok_tex),
                Err(Error::InvalidInput(_))
            ),
            "{what}"
        );
    }
    // Nothing was recorded: the encoder finishes and submits cleanly.
    let (_, queue) = host();
    queue.submit([enc.finish()]);
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
}
