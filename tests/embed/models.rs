//! Engines with cooperative matrices, and the 2026 latent forms (FLUX.2,
//! Qwen-Image) from host and device latents.

use super::*;

/// A host device requested with `cooperative_matrix_features()` and the engine built with
/// `Engine::with_adapter`: f16 models run on the adapter's matrices where it has a usable
/// configuration, the scalar path otherwise; `On` fails clearly where none is usable, and an
/// engine made from the device alone (no adapter list) never uses them.
#[test]
fn engine_with_adapter_uses_cooperative_matrices_where_offered() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let (adapter, device, queue) = matrix_host_device().expect("a host device");
    let offered = adapter
        .cooperative_matrix_properties()
        .iter()
        .any(|p| wgvae::MatrixConfig::of(p).is_usable())
        && device
            .features()
            .contains(wgvae::cooperative_matrix_features());
    let load = LoadOptions {
        precision: wgvae::models::Precision::F16,
        ..Default::default()
    };
    let spec = dir.to_str().unwrap();
    let with = |mode| {
        let options = EngineOptions {
            cooperative_matrix: mode,
            ..Default::default()
        };
        Engine::with_adapter(
            &adapter,
            device.clone(),
            queue.clone(),
            spec,
            &load,
            options,
        )
    };
    // Auto leaves a CPU adapter's (emulated) matrices unused; On uses them.
    let cpu = adapter.get_info().device_type == wgpu::DeviceType::Cpu;
    let auto = with(wgvae::CooperativeMatrix::Auto).unwrap();
    assert_eq!(auto.vae().cooperative_matrix().is_some(), offered && !cpu);
    let auto = if cpu && offered {
        with(wgvae::CooperativeMatrix::On).unwrap()
    } else {
        auto
    };
    // The decoded image equals the engine's own scalar decode within f16 rounding.
    let z = read_npy(&dir.join("latents.npy")).unwrap();
    let off = with(wgvae::CooperativeMatrix::Off).unwrap();
    assert!(off.vae().cooperative_matrix().is_none());
    let a = auto.decode_to_image(&z).unwrap();
    let b = off.decode_to_image(&z).unwrap();
    let (worst, _) = compare(a.as_raw(), b.as_raw());
    assert!(worst <= 2, "matrices vs scalar f16: {worst} levels");
    match with(wgvae::CooperativeMatrix::On) {
        Ok(e) => assert!(offered && e.vae().cooperative_matrix().is_some()),
        Err(e) => {
            assert!(!offered);
            assert!(
                e.to_string()
                    .contains("cooperative matrices were asked for"),
                "{e}"
            );
        }
    }
    let plain = Engine::with_options(
        device.clone(),
        queue.clone(),
        spec,
        &load,
        EngineOptions::default(),
    )
    .unwrap();
    assert!(plain.vae().cooperative_matrix().is_none());
}

/// A FLUX.2 engine: host pipeline latents (128-channel maps) take the path of
/// `decode` (un-normalised on the host); the same maps in a device buffer are
/// un-normalised and unpatchified on the GPU (within ±1 of the host path);
/// raw z from a buffer decodes
/// alike, and each form given to the other mode is refused naming the fix.
#[test]
fn flux2_engine_host_latents_and_device_latents() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/flux2-tiny");
    let (device, queue) = host();
    let engine = engine(&dir);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let reference = engine.decode_to_image(&latents).unwrap();
    let buffer_of = |t: &wgvae::io::HostTensor| latent_buffer(device, queue, t);
    let maps_buffer = buffer_of(&latents);
    let maps = DeviceLatents {
        buffer: &maps_buffer,
        offset: 0,
        shape: latents.shape.clone().try_into().unwrap(),
    };
    let from_maps = engine.decode_to_image(maps).unwrap();
    let (worst, differing) = compare(from_maps.as_raw(), reference.as_raw());
    println!("FLUX.2 maps from a buffer: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 1, "pipeline maps from a buffer: {worst}");
    let z = read_npy(&dir.join("z.npy")).unwrap();
    let z_buffer = buffer_of(&z);
    let on_device = DeviceLatents {
        buffer: &z_buffer,
        offset: 0,
        shape: z.shape.clone().try_into().unwrap(),
    };
    let e = engine.decode_to_image(on_device).unwrap_err().to_string();
    assert!(e.contains("128") && e.contains("raw_latents"), "{e}");
    let raw_engine = raw_engine(&dir);
    let from_z = raw_engine.decode_to_image(on_device).unwrap();
    let (worst, _) = compare(from_z.as_raw(), reference.as_raw());
    assert!(worst <= 1, "z from a buffer: {worst}");
    let e = raw_engine.decode_to_image(maps).unwrap_err().to_string();
    assert!(e.contains("expects 32") && e.contains("raw z"), "{e}");
}

/// A Qwen-Image engine: pipeline latents in a device buffer are
/// un-normalised per channel on the GPU, dividing as the pipeline does —
/// the same image as host latents (within ±1), through both the read-back
/// and the texture path.
#[test]
fn qwen_image_pipeline_latents_from_a_device_buffer() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/qwenimage-tiny");
    let (device, queue) = host();
    let engine = engine(&dir);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let reference = engine.decode_to_image(&latents).unwrap();
    // N×16×1×h×w: one frame, the same bytes as N×16×h×w.
    let shape: [usize; 4] = match *latents.shape.as_slice() {
        [n, c, 1, h, w] | [n, c, h, w] => [n, c, h, w],
        ref s => panic!("unexpected latents {s:?}"),
    };
    let buffer = latent_buffer(device, queue, &latents);
    let on_device = DeviceLatents {
        buffer: &buffer,
        offset: 0,
        shape,
    };
    let image = engine.decode_to_image(on_device).unwrap();
    let (worst, differing) = compare(image.as_raw(), reference.as_raw());
    println!("Qwen-Image latents from a buffer: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 1, "{worst}");
    let texture = decode_into_host_texture(
        &engine,
        device,
        queue,
        on_device,
        &shape,
        wgpu::TextureFormat::Rgba8Unorm,
    )
    .unwrap();
    let (worst, _) = compare(&texture.texels, reference.as_raw());
    assert!(worst <= 1, "texture: {worst}");
}

/// An engine decodes images: a video decoder is refused from its file's
/// header when the engine is built (no weights uploaded), naming the video
/// front doors.
#[test]
fn engine_refuses_a_video_decoder() {
    let Some(shared) = shared_dir() else { return };
    let file = shared.join("golden/taew2_1-rand/taew2_1.safetensors");
    let (device, queue) = host();
    let e = Engine::new(
        device.clone(),
        queue.clone(),
        file.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("TAEHV video decoder") && e.contains("VideoDecoder"),
        "{e}"
    );
}
