//! wgvae: diffusion-model VAE decoding on any GPU wgpu runs on.
//!
//! Hand-written WGSL compute kernels (`shaders/`), recorded into one command
//! encoder per forward pass, with every tensor allocated from one accounted
//! [`memory::MemoryPool`].
//!
//! # Embedding in a wgpu application
//!
//! A game engine, image editor or node UI that already owns a
//! `wgpu::Device` decodes latents on it with an [`Engine`] (see [`embed`]):
//! request [`required_features`] / [`required_limits`] (and, when the adapter
//! has them, [`optional_features`]) when creating the device, load a VAE
//! once, then decode straight into one of your textures inside one of your
//! command encoders — or take the simple path to an [`image::RgbaImage`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The host's device, created with wgvae's requirements merged in.
//! let instance = wgpu::Instance::default();
//! let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
//! let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
//!     required_features: wgvae::required_features()
//!         | (adapter.features() & wgvae::optional_features()),
//!     required_limits: wgpu::Limits::default()
//!         .or_better_values_from(&wgvae::recommended_limits(&adapter)),
//!     ..Default::default()
//! }))?;
//!
//! // Load the VAE once. Device and queue are cheap handles: pass clones.
//! let engine = wgvae::Engine::new(
//!     device.clone(),
//!     queue.clone(),
//!     "taef2/decoder.safetensors",
//!     &wgvae::LoadOptions::default(),
//! )?;
//! let latents = wgvae::io::read_npy("latents.npy".as_ref())?;
//!
//! // Simple path: pixels back on the host.
//! engine.decode_to_image(&latents)?.save("decoded.png")?;
//!
//! // Or record into the host's encoder, writing the host's texture.
//! let (width, height) = engine.image_size(&latents.shape)?;
//! let texture = device.create_texture(&wgpu::TextureDescriptor {
//!     label: Some("decoded"),
//!     size: wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
//!     mip_level_count: 1,
//!     sample_count: 1,
//!     dimension: wgpu::TextureDimension::D2,
//!     format: wgpu::TextureFormat::Rgba8UnormSrgb,
//!     usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
//!     view_formats: &[],
//! });
//! let mut encoder = device.create_command_encoder(&Default::default());
//! let pending = engine.record_decode_to_texture(&mut encoder, &latents, &texture)?;
//! // ... record the host's own passes sampling `texture` ...
//! queue.submit([encoder.finish()]);
//! drop(pending); // only after submitting
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
// Errors are `Result`s naming what went wrong, not panics: no bare unwrap,
// expect or panic in the library (clippy.toml lets test code use them).
// Input-facing modules, whose shapes and sizes come from files and flags, also
// warn on indexing that may panic: `#[warn(clippy::indexing_slicing)]` on their
// `mod` line (io, latents, models, video, video_encode, y4m, run::input, and the
// CLI's ffmpeg and outputs).
#![warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[doc(hidden)]
pub mod attention;
pub mod decode;
pub mod embed;
pub mod encode;
pub mod error;
pub mod estimate;
// Tile-plan invariants stated as `expect` messages (exact/parking.rs, exact/attention.rs).
#[allow(clippy::expect_used)]
pub(crate) mod exec;
pub mod frames;
#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod gpu;
#[warn(clippy::indexing_slicing)]
pub mod io;
/// Kernel wrappers, tile tables and CPU references: crate internals, public
/// only for the crate's benches and integration tests.
#[doc(hidden)]
#[allow(clippy::expect_used)] // matmul/coop.rs: the default cooperative tiles always exist
pub mod kernels;
#[warn(clippy::indexing_slicing)]
pub mod latents;
#[doc(hidden)]
pub mod memory;
#[warn(clippy::indexing_slicing)]
#[doc(hidden)]
pub mod models;
#[doc(hidden)]
pub mod named;
#[doc(hidden)]
pub mod perf_model;
pub(crate) mod run;
pub mod seeded;
/// Tensors: a device buffer with shape and storage type ([`Tensor`], [`DType`] at the crate root).
#[doc(hidden)]
pub mod tensor {
    pub use crate::gpu::tensor::*;
}
pub mod testing;
pub mod tiling;
#[warn(clippy::indexing_slicing)]
pub mod video;
#[warn(clippy::indexing_slicing)]
pub mod video_encode;
#[doc(hidden)]
#[warn(clippy::indexing_slicing)]
pub mod y4m;

/// The wgpu this wgvae links (wgvae 0.1 needs wgpu 30): a host embedding the engine builds its
/// device with `wgvae::wgpu` (or the same wgpu major) so the types match.
pub use wgpu;

pub use decode::{decode, DecodeOptions, Decoded};
pub use embed::{
    check_device, cooperative_matrix_features, optional_features, recommended_limits,
    required_features, required_limits, DeviceLatents, Engine, EngineOptions, Latents,
    PendingDecode,
};
pub use encode::{encode, EncodeOptions, Encoded};
pub use error::{Error, Result};
pub use frames::{decode_frames, FrameOut, FramesOptions, FramesReport};
pub use gpu::{Context, ContextOptions, CooperativeMatrix, MatrixConfig};
pub use memory::{MemoryPool, MemoryStats, Policy, Stat};
pub use models::{LoadOptions, ModelKind, Precision, Vae};
pub use tensor::{DType, Tensor};
pub use tiling::{TileMode, Tiling};
pub use video::{
    decode_video, decode_video_tiled, PendingFrames, VideoDecoder, VideoFrames, VideoLayout,
};

/// The Rust examples of README.md and docs/, compiled by `cargo test --doc`
/// (`no_run`: they need a GPU and model files), so they stay true.
#[cfg(doctest)]
mod doc_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/library.md")]
    struct Library;
    #[doc = include_str!("../docs/video.md")]
    struct Video;
}
