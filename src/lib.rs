//! wgvae: diffusion-model VAE decoding on any GPU wgpu runs on.
//!
//! Hand-written WGSL compute kernels (`shaders/`), recorded into one command
//! encoder per forward pass, with every tensor allocated from one accounted
//! [`memory::MemoryPool`].

pub mod decode;
pub mod error;
pub mod gpu;
pub mod io;
pub mod kernels;
pub mod memory;
pub mod models;
pub mod report;
pub mod tensor;
pub mod testing;
pub mod tiling;

pub use decode::{decode, DecodeOptions, Decoded};
pub use error::{Error, Result};
pub use gpu::{Context, ContextOptions};
pub use models::{LoadOptions, Vae};
pub use tensor::{DType, Tensor};
pub use tiling::{TileMode, Tiling};
