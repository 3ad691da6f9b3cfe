//! f16 engines: paths that agree, overflow reported and redone in bf16,
//! packed f16 on a device without `shader-f16`.

use super::*;

/// An f16 engine (planned pool): decode_to_image, a host buffer of latents
/// and a texture target all record the same allocation sequence (the f16
/// overflow counter first) and agree with each other, and with the f32
/// engine to within f16 rounding of the pixels.
#[test]
fn f16_engine_paths_agree() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let (device, queue) = host();
    let load = LoadOptions {
        precision: wgvae::models::Precision::F16,
        ..Default::default()
    };
    let f16 = Engine::new(device.clone(), queue.clone(), dir.to_str().unwrap(), &load).unwrap();
    assert_eq!(f16.vae().dtype(), wgvae::DType::F16);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let simple = f16.decode_to_image(&latents).unwrap();
    let texture = decode_into_host_texture(
        &f16,
        device,
        queue,
        &latents,
        &latents.shape,
        wgpu::TextureFormat::Rgba8Unorm,
    )
    .unwrap();
    assert_eq!(compare(&texture.texels, simple.as_raw()), (0, 0));
    let full = engine(&dir).decode_to_image(&latents).unwrap();
    let (worst, differing) = compare(simple.as_raw(), full.as_raw());
    println!("f16 engine vs f32: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 3, "f16 vs f32 pixels: {worst}");
}

/// PSNR of two RGBA8 images.
fn psnr(a: &[u8], b: &[u8]) -> f64 {
    wgvae::testing::psnr(a, b)
}

/// The f16 guard through the embedding API, with an AutoencoderKL whose
/// `decoder.conv_in` is scaled far beyond f16's range: `decode_to_image`
/// from a host buffer reads the counter with the pixels and re-decodes in
/// bf16 (matching the f32 engine); a decode recorded into the host's encoder
/// reports the overflow through its `PendingDecode`, and after
/// `fall_back_to_bf16` the same recording reports none and matches f32.
#[test]
fn f16_overflow_on_engine_paths_is_reported_and_redone() {
    let Some(shared) = shared_dir() else { return };
    let golden = shared.join("golden/aekl-tiny-sd");
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path();
    wgvae::testing::scaled_weights_copy(&golden, "decoder.conv_in.", 3.0e5, dir);
    let (device, queue) = host();
    let latents = read_npy(&golden.join("latents.npy")).unwrap();
    let reference = engine(dir).decode_to_image(&latents).unwrap();
    let load = LoadOptions {
        precision: wgvae::models::Precision::F16,
        ..Default::default()
    };
    let f16 = Engine::new(device.clone(), queue.clone(), dir.to_str().unwrap(), &load).unwrap();
    assert_eq!(f16.dtype(), wgvae::DType::F16);

    // Simple path, latents in a host buffer: redone in bf16 by itself.
    let bytes: &[u8] = bytemuck::cast_slice(&latents.data);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host latents"),
        size: bytes.len() as u64,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&buffer, 0, bytes);
    let on_device = DeviceLatents {
        buffer: &buffer,
        offset: 0,
        shape: latents.shape.clone().try_into().unwrap(),
    };
    let simple = f16.decode_to_image(on_device).unwrap();
    let simple_db = psnr(simple.as_raw(), reference.as_raw());

    // Host encoder and texture: the host reads the count after its submit.
    let (w, h) = f16.image_size(&latents.shape).unwrap();
    let format = wgpu::TextureFormat::Rgba8Unorm;
    let tex = target(
        device,
        (w, h),
        format,
        embed_headless::texture_usage(format),
    );
    let record = |engine: &Engine| {
        let mut enc = device.create_command_encoder(&Default::default());
        let pending = engine
            .record_decode_to_texture(&mut enc, on_device, &tex)
            .unwrap();
        queue.submit([enc.finish()]);
        let count = pending.read_f16_overflows().unwrap();
        (
            count,
            pending.f16_overflow_buffer().is_some(),
            read_rgba8(device, queue, &tex),
        )
    };
    let (saturated_count, counted, saturated) = record(&f16);
    let saturated_db = psnr(&saturated, reference.as_raw());
    f16.fall_back_to_bf16().unwrap();
    assert_eq!(f16.dtype(), wgvae::DType::BF16);
    let (after_count, still_counted, recovered) = record(&f16);
    let recovered_db = psnr(&recovered, reference.as_raw());
    println!(
        "embed f16 overflow: {saturated_count} values; texture as recorded {saturated_db:.1} dB, after fall_back_to_bf16 {recovered_db:.1} dB; decode_to_image from a buffer {simple_db:.1} dB (vs f32)"
    );
    assert!(
        counted && saturated_count > 0,
        "the scaled model must overflow f16"
    );
    assert!(
        saturated_db < 30.0,
        "a saturated decode should look wrong: {saturated_db:.1} dB"
    );
    assert!(!still_counted && after_count == 0);
    // README: 55.9 dB after the fall-back (47 dB: 2.8× its RMS error).
    assert!(recovered_db >= 47.0, "bf16 texture: {recovered_db:.1} dB");
    assert!(
        simple_db >= 47.0,
        "decode_to_image was not redone: {simple_db:.1} dB"
    );
}

/// An f16 engine on a device created without `SHADER_F16` stores f16 packed
/// in `u32` pairs: `decode_to_image` and a texture recorded into the host's
/// encoder agree exactly, match the native-f16 engine within ±1 and the f32
/// engine within f16 rounding of the pixels (±3, as the native path).
#[test]
fn packed_f16_engine_on_a_device_without_shader_f16() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let limits = wgpu::Limits::default().or_better_values_from(&wgvae::required_limits());
    let (device, queue) = host_device(wgpu::Features::empty(), limits).unwrap();
    let load = LoadOptions {
        precision: wgvae::models::Precision::F16,
        ..Default::default()
    };
    let packed = Engine::new(device.clone(), queue.clone(), dir.to_str().unwrap(), &load).unwrap();
    assert!(!packed.caps().shader_f16);
    assert_eq!(packed.dtype(), wgvae::DType::F16);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let simple = packed.decode_to_image(&latents).unwrap();
    let texture = decode_into_host_texture(
        &packed,
        &device,
        &queue,
        &latents,
        &latents.shape,
        wgpu::TextureFormat::Rgba8Unorm,
    )
    .unwrap();
    assert_eq!(compare(&texture.texels, simple.as_raw()), (0, 0));
    let full = engine(&dir).decode_to_image(&latents).unwrap();
    let (worst, differing) = compare(simple.as_raw(), full.as_raw());
    println!("packed f16 engine vs f32: {differing} bytes differ, worst by {worst}");
    assert!(worst <= 3, "packed f16 vs f32 pixels: {worst}");
    let (host_device, host_queue) = host();
    if host_device.features().contains(wgpu::Features::SHADER_F16) {
        let native = Engine::new(
            host_device.clone(),
            host_queue.clone(),
            dir.to_str().unwrap(),
            &load,
        )
        .unwrap();
        let native_img = native.decode_to_image(&latents).unwrap();
        let (worst, differing) = compare(simple.as_raw(), native_img.as_raw());
        println!("packed vs native f16 engine: {differing} bytes differ, worst by {worst}");
        // README: byte-identical (the same f16 values, stored two ways).
        assert_eq!(
            (worst, differing),
            (0, 0),
            "packed vs native f16 engine bytes"
        );
    }
}
