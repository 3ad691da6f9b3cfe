//! wgvae: diffusion-model VAE decoding on any GPU wgpu runs on.
//!
//! Hand-written WGSL compute kernels (`shaders/`), recorded into one command
//! encoder per forward pass, with every tensor allocated from one accounted
//! [`memory::MemoryPool`].

pub mod error;
pub mod gpu;
pub mod io;
pub mod kernels;
pub mod memory;
pub mod tensor;
pub mod testing;

pub use error::{Error, Result};
pub use gpu::{Context, ContextOptions};
pub use tensor::{DType, Tensor};
