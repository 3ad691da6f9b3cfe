//! Decodes into host textures: the CLI's PNGs, a device without optional
//! features, every target format and route.

use super::*;

/// Acceptance: TAEF2 astronaut decoded by the engine into a host texture
/// (host device, host encoder, host readback: `examples/embed_headless.rs`)
/// gives the PNG the `wgvae decode` CLI writes, byte for byte (±1 allowed).
#[test]
fn host_texture_decode_equals_cli_png_taef2_astronaut() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let latents = shared.join("golden/taef2/astronaut.latents.npy");
    let vae = shared.join("weights/taef2/decoder.safetensors");
    let cli_png = tmp("astronaut_cli.png");
    let host_png = tmp("astronaut_host.png");
    // The CLI runs in its own process meanwhile.
    let cli = Command::new(wgvae::testing::wgvae_exe(env!("CARGO_BIN_EXE_wgvae")))
        .args([
            "decode",
            latents.to_str().unwrap(),
            "--vae",
            vae.to_str().unwrap(),
            "-o",
        ])
        .arg(&cli_png)
        .env(
            "WGPU_BACKEND",
            std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "vulkan".into()),
        )
        .spawn()
        .expect("run the wgvae CLI");
    let (device, queue) = host();
    let image = run(
        device,
        queue,
        &vae,
        &latents,
        wgpu::TextureFormat::Rgba8UnormSrgb,
        &host_png,
    )
    .unwrap();
    let status = cli.wait_with_output().unwrap().status;
    assert!(status.success(), "the CLI failed");
    let (cli_rgb, host_rgb) = (png_rgb(&cli_png), png_rgb(&host_png));
    let (worst, differing) = compare(&host_rgb, &cli_rgb);
    println!(
        "astronaut {}×{}: host texture vs CLI PNG: {differing} of {} bytes differ, worst by {worst}; host submit + wait {:.0} ms",
        image.width,
        image.height,
        cli_rgb.len(),
        image.gpu_ms
    );
    assert_eq!((image.width, image.height), (512, 512));
    assert!(
        worst <= 1,
        "host texture differs from the CLI PNG by {worst}"
    );
}

/// A host whose device has no optional feature (no SHADER_F16, no
/// timestamps, no subgroups) and WebGPU-default limits raised only to
/// `required_limits()` still decodes (f32 path): within ±1 of PyTorch's PNG.
#[test]
fn device_without_optional_features_decodes_taef2_chelsea() {
    let tmp = scratch();
    let Some(shared) = shared_dir() else { return };
    let limits = wgpu::Limits::default().or_better_values_from(&wgvae::required_limits());
    let (device, queue) = host_device(wgpu::Features::empty(), limits).unwrap();
    assert!(device.features().is_empty());
    let png = tmp("chelsea_nofeatures.png");
    let image = run(
        &device,
        &queue,
        &shared.join("weights/taef2/decoder.safetensors"),
        &shared.join("golden/taef2/chelsea.latents.npy"),
        wgpu::TextureFormat::Rgba8Unorm,
        &png,
    )
    .unwrap();
    assert_eq!((image.width, image.height), (448, 288));
    let got = png_rgb(&png);
    let want = png_rgb(&shared.join("golden/taef2/chelsea.decoded.png"));
    let (worst, differing) = compare(&got, &want);
    println!(
        "chelsea without optional features vs PyTorch's PNG: {differing} of {} bytes differ, worst by {worst}; submit + wait {:.0} ms",
        got.len(),
        image.gpu_ms
    );
    assert!(worst <= 1, "differs from PyTorch's PNG by {worst}");
}

/// Every target format and route, all recorded back to back into one host
/// encoder (same latent shape, planned pool), against `decode_to_image`
/// (the CLI's path) and diffusers' PNG.
#[test]
fn every_target_format_and_route_matches_decode_to_image() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-sd");
    let (device, queue) = host();
    let engine = engine(&dir);
    let latents = read_npy(&dir.join("latents.npy")).unwrap();
    let reference = engine.decode_to_image(&latents).unwrap();
    let (w, h) = engine.image_size(&latents.shape).unwrap();
    assert_eq!((reference.width(), reference.height()), (w, h));
    let diffusers = png_rgb(&dir.join("decoded_0.png"));
    let (worst, _) = compare(&rgb_of(reference.as_raw()), &diffusers);
    assert!(worst <= 1, "decode_to_image vs diffusers: {worst}");

    use wgpu::{TextureFormat as F, TextureUsages as U};
    let cases = [
        (
            "rgba8unorm storage",
            F::Rgba8Unorm,
            U::STORAGE_BINDING,
            (w, h),
        ),
        ("rgba8unorm copy", F::Rgba8Unorm, U::COPY_DST, (w, h)),
        ("rgba8unorm-srgb", F::Rgba8UnormSrgb, U::COPY_DST, (w, h)),
        (
            "rgba16float storage",
            F::Rgba16Float,
            U::STORAGE_BINDING,
            (w, h),
        ),
        ("rgba16float copy", F::Rgba16Float, U::COPY_DST, (w, h)),
        (
            "larger texture",
            F::Rgba8Unorm,
            U::STORAGE_BINDING,
            (w + 5, h + 3),
        ),
        (
            "larger srgb texture",
            F::Rgba8UnormSrgb,
            U::COPY_DST,
            (w + 5, h + 3),
        ),
    ];
    let textures: Vec<_> = cases
        .iter()
        .map(|(_, f, u, size)| target(device, *size, *f, *u))
        .collect();
    let mut encoder = device.create_command_encoder(&Default::default());
    let pending: Vec<_> = textures
        .iter()
        .map(|t| {
            engine
                .record_decode_to_texture(&mut encoder, &latents, t)
                .unwrap()
        })
        .collect();
    assert!(pending
        .iter()
        .all(|p| p.width() == w && p.height() == h && p.dispatches() > 10));
    queue.submit([encoder.finish()]);
    drop(pending);
    for ((name, format, _, (tw, th)), tex) in cases.iter().zip(&textures) {
        let got = read_rgba8(device, queue, tex);
        // The decoded region, then the rest (wgpu zero-initialises textures).
        let mut region = Vec::new();
        for y in 0..*th as usize {
            let row = &got[y * *tw as usize * 4..(y + 1) * *tw as usize * 4];
            if y < h as usize {
                region.extend_from_slice(&row[..w as usize * 4]);
                assert!(
                    row[w as usize * 4..].iter().all(|&b| b == 0),
                    "{name}: row {y} outside"
                );
            } else {
                assert!(
                    row.iter().all(|&b| b == 0),
                    "{name}: row {y} below the image"
                );
            }
        }
        let (worst, differing) = compare(&region, reference.as_raw());
        println!("{name}: {differing} bytes differ from decode_to_image, worst by {worst}");
        if *format == F::Rgba16Float {
            assert!(worst <= 1, "{name}: {worst}");
        } else {
            assert_eq!(differing, 0, "{name}: bytes differ (worst by {worst})");
        }
    }
}
