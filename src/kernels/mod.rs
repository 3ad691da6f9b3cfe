//! The Rust side of each WGSL kernel family: its [`KernelSpec`](crate::gpu::KernelSpec),
//! uniform struct, dispatch geometry and a CPU reference used by tests.
//! Kernels never allocate: callers pass output tensors from the pool.

pub mod elementwise;

/// Every kernel spec with every specialisation the engine can request,
/// for the shader-validation and contract tests.
pub fn all_variants() -> Vec<(crate::gpu::KernelSpec, crate::gpu::PipelineKey)> {
    let mut v = Vec::new();
    v.extend(elementwise::variants());
    v
}
