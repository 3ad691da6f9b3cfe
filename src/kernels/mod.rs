//! The Rust side of each WGSL kernel family: its [`KernelSpec`](crate::gpu::KernelSpec),
//! uniform struct, dispatch geometry and a CPU reference used by tests.
//! Kernels never allocate: callers pass output (and scratch) tensors from the pool.
//!
//! Layout convention: activations are NCHW, contiguous.

pub mod attention;
pub mod conv2d;
mod coop;
#[cfg(test)]
mod coop_probe_tests;
pub mod dup_up;
pub mod elementwise;
pub mod group_norm;
pub mod image;
pub mod latent_affine;
pub mod matmul;
pub mod rms_norm;
pub mod tensor_ops;
pub(crate) mod tokens;

use crate::gpu::{BindingKind, KernelSpec, WgslSource};

/// The spec of entry `entry` in the compiled-in shader file `source` of
/// `family`, with uniforms `P` and storage `bindings` 1.. in order.
const fn spec<P>(
    family: &'static str,
    source: &'static str,
    entry: &'static str,
    bindings: &'static [BindingKind],
) -> KernelSpec {
    KernelSpec {
        family,
        source: WgslSource::Static(source),
        entry,
        bindings,
        uniform_size: std::mem::size_of::<P>() as u64,
        trusted: false,
    }
}

/// An activation applied inside a kernel (fused), never materialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    #[default]
    /// Identity.
    None,
    /// `x · sigmoid(x)`.
    Silu,
    /// `max(x, 0)`.
    Relu,
}

impl Activation {
    /// The `ACT` constant shaders switch on: 0 none, 1 SiLU, 2 ReLU.
    pub fn code(self) -> u32 {
        match self {
            Activation::None => 0,
            Activation::Silu => 1,
            Activation::Relu => 2,
        }
    }

    /// CPU reference.
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Activation::None => v,
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::Relu => v.max(0.0),
        }
    }
}

/// Every kernel spec with every specialisation the engine can request,
/// for the shader-validation and contract tests.
pub fn all_variants() -> Vec<(crate::gpu::KernelSpec, crate::gpu::PipelineKey)> {
    let mut v = Vec::new();
    v.extend(dup_up::variants());
    v.extend(elementwise::variants());
    v.extend(attention::variants());
    v.extend(conv2d::variants());
    v.extend(group_norm::variants());
    v.extend(image::variants());
    v.extend(latent_affine::variants());
    v.extend(matmul::variants());
    v.extend(rms_norm::variants());
    v.extend(tensor_ops::variants());
    v.extend(tokens::variants());
    v
}

/// The storage path a `(context, dtype)` of [`crate::testing::dtype_contexts`]
/// runs, for test messages: the dtype and whether f16 is native.
#[cfg(test)]
fn storage_path(ctx: &crate::gpu::Context, dt: crate::tensor::DType) -> String {
    format!("{} (shader-f16 {})", dt.name(), ctx.caps().shader_f16)
}
