//! Device side of the engine: the [`Context`] (a host's device or one we
//! create), the capabilities the engine consults, the pipeline cache and the
//! [`Recorder`] that records kernels into one command encoder.

mod capabilities;
mod context;
pub mod device_memory;
mod dry_run;
mod host;
mod pipeline;
mod profiler;
mod recorder;
pub(crate) mod requirements;
mod staging;
#[doc(hidden)]
pub mod storage;
pub mod tensor;

pub use capabilities::{Capabilities, CooperativeMatrix, MatrixConfig, MatrixScalar};
#[doc(hidden)]
pub use context::rank_adapters;
pub use context::{
    default_cache_dir, optional_features, AdapterChoice, AdapterSelection, AdapterSummary, Context,
    ContextOptions,
};
pub(crate) use dry_run::{full_dry_runs, full_plan};
#[doc(hidden)]
pub use host::host_memory_available;
pub(crate) use host::{read_back_host, HostBytes};
#[doc(hidden)]
pub use pipeline::{preprocess, BindingKind, KernelSpec, PipelineCache, PipelineKey, WgslSource};
pub(crate) use profiler::SubmitStats;
pub use profiler::{KernelTime, Profile, Profiler};
pub(crate) use recorder::DrySignature;
#[doc(hidden)]
pub use recorder::{linear_groups, range_count, read_range_flag, Binding, DispatchLabel};
pub use recorder::{read_back, Recorder};
pub(crate) use staging::MapAfter;
#[doc(hidden)]
pub use storage::{Access, StorageType};

#[cfg(test)]
mod shader_tests;
