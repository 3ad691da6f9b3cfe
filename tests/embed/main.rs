//! The embedding API (`wgvae::Engine`) on a device the "host" creates itself:
//! decodes into host textures equal the CLI's PNGs, every target format and
//! route, latents from a host buffer, a device without optional features,
//! two engines on one device, and misuse reported before anything is recorded.
//!
//! The TAEF2 decodes are slow on lavapipe (astronaut 512²: minutes in a debug
//! build on a busy machine), so only the acceptance test and the
//! no-optional-features test use TAEF2; the rest use the tiny AutoencoderKL
//! goldens.

#[path = "../../examples/embed_headless.rs"]
#[allow(dead_code)]
mod embed_headless;

mod engines;
mod models;
mod precision;
mod textures;
mod video;

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

/// An engine on the host device that takes raw latents (decoder input
/// already: no pipeline unscaling).
fn raw_engine(dir: &Path) -> Engine {
    let (device, queue) = host();
    let options = EngineOptions {
        raw_latents: true,
        ..Default::default()
    };
    let load = LoadOptions::default();
    Engine::with_options(
        device.clone(),
        queue.clone(),
        dir.to_str().unwrap(),
        &load,
        options,
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
