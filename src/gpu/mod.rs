//! Device side of the engine: the [`Context`] (a host's device or one we
//! create), the capabilities the engine consults, the pipeline cache and the
//! [`Recorder`] that records kernels into one command encoder.

mod context;
mod pipeline;
mod profiler;
mod recorder;
pub(crate) mod requirements;
pub mod storage;

pub use context::{
    default_cache_dir, optional_features, rank_adapters, AdapterChoice, AdapterSelection,
    AdapterSummary, Capabilities, Context, ContextOptions,
};
pub use pipeline::{preprocess, BindingKind, KernelSpec, PipelineCache, PipelineKey, WgslSource};
pub(crate) use profiler::SubmitStats;
pub use profiler::{KernelTime, Profile, Profiler};
pub use recorder::{
    linear_groups, range_count, read_back, read_range_flag, Binding, DispatchLabel, Recorder,
};
pub use storage::{Access, StorageType};

#[cfg(test)]
mod shader_tests;
