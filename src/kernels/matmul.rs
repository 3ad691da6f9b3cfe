pub(crate) fn variants() -> Vec<(crate::gpu::KernelSpec, crate::gpu::PipelineKey)> {
    Vec::new()
}
