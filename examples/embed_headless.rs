//! wgvae inside a host application, without a window: the host owns the
//! device, the command encoder and the texture; wgvae records its decode into
//! them; the host copies the texture to its own buffer, submits, reads it back
//! and writes a PNG.
//!
//! ```text
//! cargo run --example embed_headless -- LATENTS.npy --vae VAE [-o out.png] [--format rgba8unorm-srgb]
//! ```
//!
//! `tests/embed.rs` runs this file's [`run`] as a test.

use std::error::Error;
use std::path::Path;
use std::time::Instant;

/// What the host read back from its texture.
pub struct HostImage {
    pub width: u32,
    pub height: u32,
    pub format: wgpu::TextureFormat,
    /// Texels, tightly packed rows: 4 bytes per texel for `Rgba8*`, 8 (four
    /// little-endian f16) for `Rgba16Float`.
    pub texels: Vec<u8>,
    /// Wall time of the host's submit and wait.
    pub gpu_ms: f64,
}

impl HostImage {
    /// RGBA8 pixels: `Rgba8*` texels as they are, `Rgba16Float` quantised
    /// as `round(v * 255)`.
    pub fn rgba8(&self) -> Vec<u8> {
        match self.format {
            wgpu::TextureFormat::Rgba16Float => self
                .texels
                .chunks_exact(2)
                .map(|h| {
                    let v = half::f16::from_le_bytes([h[0], h[1]]).to_f32();
                    (v.clamp(0.0, 1.0) * 255.0).round_ties_even() as u8
                })
                .collect(),
            _ => self.texels.clone(),
        }
    }
}

/// The host's adapter: high performance, on the primary backends (Vulkan,
/// Metal, DX12) unless `WGPU_BACKEND` says otherwise.
pub fn host_adapter() -> Result<wgpu::Adapter, Box<dyn Error>> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if std::env::var_os("WGPU_BACKEND").is_none() {
        desc.backends = wgpu::Backends::PRIMARY;
    }
    let instance = wgpu::Instance::new(desc);
    Ok(pollster::block_on(instance.request_adapter(
        &wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        },
    ))?)
}

/// A host's device on [`host_adapter`] with exactly these features and limits.
pub fn host_device(
    features: wgpu::Features,
    limits: wgpu::Limits,
) -> Result<(wgpu::Device, wgpu::Queue), Box<dyn Error>> {
    let adapter = host_adapter()?;
    let device = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("host device"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))?;
    Ok(device)
}

/// The device a host that wants wgvae's optional features would create.
pub fn default_host_device() -> Result<(wgpu::Device, wgpu::Queue), Box<dyn Error>> {
    let adapter = host_adapter()?;
    let features = wgvae::required_features() | (adapter.features() & wgvae::optional_features());
    let limits =
        wgpu::Limits::default().or_better_values_from(&wgvae::recommended_limits(&adapter));
    drop(adapter);
    host_device(features, limits)
}

/// A host device that lets wgvae use the adapter's cooperative matrices (tensor cores):
/// wgvae's optional features plus [`wgvae::cooperative_matrix_features`] where the adapter has
/// them, requested with wgpu's experimental-features opt-in. Returns the adapter too: build
/// the engine with `Engine::with_adapter` so it can read the adapter's configurations.
pub fn matrix_host_device() -> Result<(wgpu::Adapter, wgpu::Device, wgpu::Queue), Box<dyn Error>> {
    let adapter = host_adapter()?;
    let wanted = wgvae::optional_features() | wgvae::cooperative_matrix_features();
    let features = wgvae::required_features() | (adapter.features() & wanted);
    let limits =
        wgpu::Limits::default().or_better_values_from(&wgvae::recommended_limits(&adapter));
    let experimental = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        // SAFETY: wgpu marks cooperative matrices experimental (possible implementation bugs);
        // wgvae checks its cooperative kernels against CPU references.
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("host device with cooperative matrices"),
        required_features: features,
        required_limits: limits,
        experimental_features: experimental,
        ..Default::default()
    }))?;
    Ok((adapter, device, queue))
}

/// Usage a host gives a texture of `format` that wgvae writes and the host
/// samples and copies from. `Rgba8UnormSrgb` cannot be a storage texture: the
/// engine writes it through an intermediate, so it needs `COPY_DST`.
pub fn texture_usage(format: wgpu::TextureFormat) -> wgpu::TextureUsages {
    let host = wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_SRC;
    if format.is_srgb() {
        host | wgpu::TextureUsages::COPY_DST
    } else {
        host | wgpu::TextureUsages::STORAGE_BINDING
    }
}

/// Decodes `latents` with `engine` into a new host texture of `format`
/// (usage from [`texture_usage`]) inside a host encoder, copies the texture
/// into a host buffer in the same encoder, submits once and reads back.
pub fn decode_into_host_texture<'a>(
    engine: &wgvae::Engine,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    latents: impl Into<wgvae::Latents<'a>>,
    shape: &[usize],
    format: wgpu::TextureFormat,
) -> Result<HostImage, Box<dyn Error>> {
    let (width, height) = engine.image_size(shape)?;
    let texture = device.create_texture(&wgpu::TextureDescriptor {
        label: Some("host texture"),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: texture_usage(format),
        view_formats: &[],
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("host frame"),
    });
    let pending = engine.record_decode_to_texture(&mut encoder, latents, &texture)?;

    // The host's own commands after the decode: texture -> readback buffer.
    let bytes_per_texel = format.block_copy_size(None).ok_or("not a color format")?;
    let row = (width * bytes_per_texel).div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT)
        * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host readback"),
        size: row as u64 * height as u64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &readback,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(row),
                rows_per_image: None,
            },
        },
        texture.size(),
    );
    let start = Instant::now();
    queue.submit([encoder.finish()]);
    drop(pending); // submitted: the engine may reuse that memory now
    readback.slice(..).map_async(wgpu::MapMode::Read, |r| {
        r.expect("map readback");
    });
    device.poll(wgpu::PollType::wait_indefinitely())?;
    let gpu_ms = start.elapsed().as_secs_f64() * 1e3;
    let mapped = readback.slice(..).get_mapped_range()?;
    let tight = (width * bytes_per_texel) as usize;
    let texels = mapped
        .chunks_exact(row as usize)
        .flat_map(|r| r[..tight].iter().copied())
        .collect();
    Ok(HostImage {
        width,
        height,
        format,
        texels,
        gpu_ms,
    })
}

/// The whole example: host device (created by the caller), engine, decode of
/// the latent file into an `Rgba8UnormSrgb` texture, read back, PNG (RGB,
/// like the CLI's) written to `out`.
pub fn run(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    vae: &Path,
    latents: &Path,
    format: wgpu::TextureFormat,
    out: &Path,
) -> Result<HostImage, Box<dyn Error>> {
    let engine = wgvae::Engine::new(
        device.clone(),
        queue.clone(),
        vae.to_str().ok_or("VAE path is not UTF-8")?,
        &wgvae::LoadOptions::default(),
    )?;
    let latents = wgvae::io::load_latents(latents, None, engine.latent_channels())?;
    let image = decode_into_host_texture(&engine, device, queue, &latents, &latents.shape, format)?;
    let rgb: Vec<u8> = image
        .rgba8()
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    image::save_buffer(
        out,
        &rgb,
        image.width,
        image.height,
        image::ExtendedColorType::Rgb8,
    )?;
    Ok(image)
}

fn parse_format(s: &str) -> Result<wgpu::TextureFormat, Box<dyn Error>> {
    Ok(match s {
        "rgba8unorm" => wgpu::TextureFormat::Rgba8Unorm,
        "rgba8unorm-srgb" => wgpu::TextureFormat::Rgba8UnormSrgb,
        "rgba16float" => wgpu::TextureFormat::Rgba16Float,
        _ => {
            return Err(
                format!("--format {s}: use rgba8unorm, rgba8unorm-srgb or rgba16float").into(),
            )
        }
    })
}

#[allow(dead_code)] // tests/embed.rs includes this file as a module
fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (mut latents, mut vae, mut out) = (None, None, "embed_headless.png".to_string());
    let mut format = wgpu::TextureFormat::Rgba8UnormSrgb;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--vae" => vae = args.next(),
            "-o" | "--output" => out = args.next().ok_or("-o needs a path")?,
            "--format" => format = parse_format(&args.next().ok_or("--format needs a value")?)?,
            _ => latents = Some(a),
        }
    }
    let usage = "usage: embed_headless LATENTS --vae VAE [-o out.png] [--format rgba8unorm|rgba8unorm-srgb|rgba16float]";
    let (latents, vae) = (latents.ok_or(usage)?, vae.ok_or(usage)?);
    let (device, queue) = default_host_device()?;
    let image = run(
        &device,
        &queue,
        vae.as_ref(),
        latents.as_ref(),
        format,
        out.as_ref(),
    )?;
    println!(
        "wrote {out}: {}×{} via a {:?} host texture, submit + wait {:.1} ms",
        image.width, image.height, image.format, image.gpu_ms
    );
    Ok(())
}
