//! The one error type of the library. Every failure a user can cause or meet
//! (bad files, shapes, limits, out of memory, device loss) is a variant with a
//! message that says what went wrong and what to do.

use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in wgvae.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No adapter matched the request (backend, name filter).
    #[error("no GPU adapter found{0}; install a Vulkan driver (on a CPU-only machine: `apt-get install mesa-vulkan-drivers libvulkan1`) or relax WGPU_BACKEND / WGPU_ADAPTER_NAME / `ContextOptions::adapter`")]
    NoAdapter(String),

    /// The adapter refused to create a device.
    #[error("could not create a device on adapter `{adapter}`: {source}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's reason.
        #[source]
        source: wgpu::RequestDeviceError,
    },

    /// A wgpu validation error caught by an error scope.
    #[error("GPU validation error during {during}: {message}")]
    Validation {
        /// What the engine was doing.
        during: String,
        /// wgpu's message.
        message: String,
    },

    /// The device ran out of memory.
    #[error("GPU out of memory during {during} ({message}); lower the image size, use tiling (`TileMode::Exact`) or set `Tiling::max_memory`")]
    OutOfMemory {
        /// What the engine was doing.
        during: String,
        /// wgpu's message.
        message: String,
    },

    /// The device was lost (driver reset, hang, removal).
    #[error("GPU device lost: {0}; recreate the context")]
    DeviceLost(String),

    /// A single buffer larger than the device allows.
    #[error("{what} needs a buffer of {bytes} bytes but the device's max_buffer_size is {limit} bytes; use tiling (`TileMode::Exact`) or a smaller size")]
    BufferTooLarge {
        /// The buffer's purpose.
        what: String,
        /// Bytes it needs.
        bytes: u64,
        /// The device's `max_buffer_size`.
        limit: u64,
    },

    /// A tensor too large to bind as one storage buffer.
    #[error("{what} is {bytes} bytes but the device's max_storage_buffer_binding_size is {limit} bytes; decode with tiling (`TileMode::Exact` / `TileMode::Auto`) or a smaller size")]
    BindingTooLarge {
        /// The tensor (label and shape).
        what: String,
        /// Its size in bytes.
        bytes: u64,
        /// The device's `max_storage_buffer_binding_size`.
        limit: u64,
    },

    /// A dispatch needs more workgroups than the device allows.
    #[error("{what} needs {groups} workgroups along one dimension but the device allows {limit}")]
    DispatchTooLarge {
        /// The kernel and dimension.
        what: String,
        /// Workgroups needed along it.
        groups: u64,
        /// The device's `max_compute_workgroups_per_dimension`.
        limit: u32,
    },

    /// Shapes that do not fit together.
    #[error("shape error in {op}: {message}")]
    Shape {
        /// The operation.
        op: String,
        /// Which shapes, and why they do not fit.
        message: String,
    },

    /// The caller asked for something the engine does not support (yet).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A broken internal invariant: a bug in wgvae, not in the input.
    #[error(
        "internal error (a bug in wgvae; please report it with the command that caused it): {0}"
    )]
    Internal(String),

    /// A WGSL shader failed to parse or validate (a bug in wgvae).
    #[error("shader `{name}` is invalid: {message}")]
    Shader {
        /// The shader (family and entry point or binding).
        name: String,
        /// naga's or the preprocessor's message.
        message: String,
    },

    /// Reading a buffer back to the host failed.
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),

    /// Bad input file contents.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// The run cannot fit the memory budget the caller set
    /// (`Tiling::max_memory`, `FramesOptions::max_memory`) or the host's
    /// memory; the message names the budget and what to raise or lower.
    #[error("over the memory budget: {0}")]
    OverBudget(String),

    /// Bad input values (NaN latents, wrong channel count …).
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// The decoder produced NaN or infinite values (counted on the GPU: the
    /// RGBA8 kernel marks such pixels with alpha 0), so the image would be garbage.
    #[error("{model} produced {count} non-finite pixels (NaN or ±Inf) of {total}{}: the latents are probably far outside the range the model was trained on (pipeline latents decoded as raw decoder input, or a wrong scaling/shift factor: check --raw-latents, --scaling-factor, --shift-factor), or the weights are damaged or from a diverged model", if *f16 { " even after re-decoding in bf16" } else { "" })]
    NonFiniteOutput {
        /// The model's name.
        model: String,
        /// Pixels with a NaN or infinite channel.
        count: u64,
        /// Pixels decoded.
        total: u64,
        /// The run was an f16 one, re-decoded in bf16.
        f16: bool,
    },

    /// File system errors, with the path.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn shape(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Shape {
            op: op.into(),
            message: message.into(),
        }
    }

    pub(crate) fn from_wgpu(during: &str, e: wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
                during: during.to_string(),
                message: e.to_string(),
            },
            wgpu::Error::Validation { description, .. } => Error::Validation {
                during: during.to_string(),
                message: description,
            },
            wgpu::Error::Internal { description, .. } => Error::Validation {
                during: during.to_string(),
                message: format!("internal: {description}"),
            },
        }
    }
}
