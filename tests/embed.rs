//! The embedding API (`wgvae::Engine`) on a device the "host" creates itself:
//! decodes into host textures equal the CLI's PNGs, every target format and
//! route, latents from a host buffer, a device without optional features,
//! two engines on one device, and misuse reported before anything is recorded.
//!
//! The TAEF2 decodes are slow on lavapipe (astronaut 512²: minutes in a debug
//! build on a busy machine), so only the acceptance test and the
//! no-optional-features test use TAEF2; the rest use the tiny AutoencoderKL
//! goldens.

#[path = "../examples/embed_headless.rs"]
#[allow(dead_code)]
mod embed_headless;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use embed_headless::{
    decode_into_host_texture, default_host_device, host_device, matrix_host_device, run,
};
use wgvae::io::{read_npy, HostTensor};
use wgvae::testing::shared_dir;
use wgvae::{DeviceLatents, Engine, EngineOptions, Error, LoadOptions};

/// One host device per test process, created the way a host would.
fn host() -> &'static (wgpu::Device, wgpu::Queue) {
    static HOST: OnceLock<(wgpu::Device, wgpu::Queue)> = OnceLock::new();
    HOST.get_or_init(|| default_host_device().expect("a host device (install lavapipe)"))
}

/// Paths in a fresh folder of one test's own, removed on drop (also on failure).
fn scratch() -> impl Fn(&str) -> PathBuf {
    let dir = tempfile::tempdir().unwrap();
    move |name| dir.path().join(name)
}

fn png_rgb(path: &Path) -> Vec<u8> {
    image::open(path).unwrap().to_rgb8().into_raw()
}

fn rgb_of(rgba: &[u8]) -> Vec<u8> {
    rgba.chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect()
}

/// (worst |a - b|, number of differing bytes)
fn compare(a: &[u8], b: &[u8]) -> (u8, usize) {
    assert_eq!(a.len(), b.len(), "image sizes differ");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0);
    (worst, a.iter().zip(b).filter(|(x, y)| x != y).count())
}

/// A host application's buffer holding `t` (f32), as a diffusion model
/// would leave latents: `COPY_SRC` for the decode's copy.
fn latent_buffer(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    t: &wgvae::io::HostTensor,
) -> wgpu::Buffer {
    let bytes: &[u8] = bytemuck::cast_slice(&t.data);
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host latents"),
        size: bytes.len() as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&buffer, 0, bytes);
    buffer
}

fn engine(dir: &Path) -> Engine {
    let (device, queue) = host();
    Engine::new(
        device.clone(),
        queue.clone(),
        dir.to_str().unwrap(),
        &LoadOptions::default(),
    )
    .unwrap()
}

fn target(
    device: &wgpu::Device,
    (width, height): (u32, u32),
    format: wgpu::TextureFormat,
    usage: wgpu::TextureUsages,
) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some("test target"),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: usage | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    })
}

/// Reads a texture back to RGBA8 (`Rgba16Float` quantised as round(v * 255)).
fn read_rgba8(device: &wgpu::Device, queue: &wgpu::Queue, tex: &wgpu::Texture) -> Vec<u8> {
    let bpp = tex.format().block_copy_size(None).unwrap();
    let (w, h) = (tex.width(), tex.height());
    let row = (w * bpp).div_ceil(256) * 256;
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (row * h) as u64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_texture_to_buffer(
        tex.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &buf,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(row),
                rows_per_image: None,
            },
        },
        tex.size(),
    );
    queue.submit([enc.finish()]);
    buf.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let texels: Vec<u8> = buf
        .slice(..)
        .get_mapped_range()
        .unwrap()
        .chunks_exact(row as usize)
        .flat_map(|r| r[..(w * bpp) as usize].to_vec())
        .collect();
    embed_headless::HostImage {
        width: w,
        height: h,
        format: tex.format(),
        texels,
        gpu_ms: 0.0,
    }
    .rgba8()
}

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

/// Latents from a host buffer (at an offset, as a host's diffusion model
/// would leave them), unscaled on the GPU (FLUX-style scaling and shift),
/// give the host-latent result within ±1 — through both paths.
#[test]
fn latents_from_a_host_buffer_match_host_latents() {
    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden/aekl-tiny-flux");
    let (device, queue) = host();
    let engine = engine(&dir);
    let (scale, shift) = engine.vae().latent_scaling();
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
    let raw_engine = Engine::with_options(
        device.clone(),
        queue.clone(),
        dir.to_str().unwrap(),
        &LoadOptions::default(),
        EngineOptions {
            raw_latents: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut z = latents.clone();
    raw_engine.vae().unscale_latents(&mut z).unwrap();
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
    use std::sync::Arc;
    use wgpu::{TextureFormat as F, TextureUsages as U};
    use wgvae::kernels::image::ImageRange;
    use wgvae::models::{TaehvDecoder, WeightStore};
    use wgvae::video::VideoVae;
    use wgvae::{Context, VideoDecoder};

    let Some(shared) = shared_dir() else { return };
    let dir = shared.join("golden").join(name);
    let (device, queue) = host();
    let ctx = Context::from_device(device.clone(), queue.clone());
    let store = WeightStore::from_safetensors(&dir.join(file)).unwrap();
    let vae = Arc::new(VideoVae::from(TaehvDecoder::load(&ctx, &store).unwrap()));
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
    let mut reference = VideoDecoder::shared(&ctx, Arc::clone(&vae));
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

    let mut dec = VideoDecoder::shared(&ctx, Arc::clone(&vae));
    let up = dec.model().upscale();
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
    assert_eq!(got.len(), VideoDecoder::frames_for(vae.model(), t.min(3)));
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let (worst, differing) = compare(a, b);
        assert!(
            worst <= 1,
            "frame {i}: worst {worst}, {differing} bytes differ"
        );
    }

    // Tiled decoders are refused.
    let mut tiled = VideoDecoder::shared(&ctx, vae)
        .with_tiling(wgvae::tiling::Tiling::exact())
        .unwrap();
    let tex = target(device, size, F::Rgba8Unorm, U::STORAGE_BINDING);
    let e = tiled.record_chunk_to_textures(&mut enc, &chunks[0], &[&tex]);
    assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
}

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
    let raw_engine = Engine::with_options(
        device.clone(),
        queue.clone(),
        dir.to_str().unwrap(),
        &LoadOptions::default(),
        EngineOptions {
            raw_latents: true,
            ..Default::default()
        },
    )
    .unwrap();
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
