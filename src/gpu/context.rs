use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::capabilities::{Capabilities, CooperativeMatrix, MatrixConfig};
use crate::gpu::pipeline::PipelineCache;
use crate::memory::{Backing, ExactPool, MemoryPool};

/// How to pick an adapter when wgvae creates the device itself.
#[derive(Clone, Debug, Default)]
pub enum AdapterChoice {
    /// Best available: discrete GPU, then integrated, virtual, other, CPU last.
    /// Honours `WGPU_ADAPTER_NAME` (substring, case-insensitive).
    #[default]
    Auto,
    /// The adapter at this index in [`Context::adapters`]'s list.
    Index(usize),
    /// The first adapter whose name contains this (case-insensitive).
    Name(String),
}

/// Options for [`Context::new`].
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    /// Which adapter to use.
    pub adapter: AdapterChoice,
    /// Backends to consider; `None` reads `WGPU_BACKEND` or uses all.
    pub backends: Option<wgpu::Backends>,
    /// Where to persist the driver's pipeline cache (Vulkan) so later
    /// process starts skip shader compilation. `None`: no disk cache.
    pub pipeline_cache_dir: Option<std::path::PathBuf>,
    /// Cooperative matrices (tensor cores): automatic, forced on, or off.
    pub cooperative_matrix: CooperativeMatrix,
}

/// The default pipeline cache folder: `$WGVAE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/wgvae`, else `~/.cache/wgvae`; `None` when
/// `WGVAE_PIPELINE_CACHE=0` or no home is known.
pub fn default_cache_dir() -> Option<std::path::PathBuf> {
    if std::env::var("WGVAE_PIPELINE_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    if let Some(d) = std::env::var_os("WGVAE_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(std::path::PathBuf::from(d).join("wgvae"));
    }
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/wgvae"))
}

/// The engine's handle on a device: device + queue, their capabilities, the
/// pipeline cache and the memory pool every tensor comes from. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    device: wgpu::Device,
    queue: wgpu::Queue,
    caps: Capabilities,
    pipelines: PipelineCache,
    pool: Arc<dyn MemoryPool>,
    /// Nothing runs and no device memory is allocated: allocations are only
    /// replayed through the pool (memory estimation).
    null: bool,
    /// wgpu errors that reached no error scope (see [`Context::from_device`]).
    uncaptured: UncapturedErrors,
    /// Something the user should see about the adapter choice (CPU fallback).
    notice: Option<String>,
    /// Set by the host to stop tiled runs between tiles ([`Context::with_cancel`]).
    cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// wgpu errors raised outside any error scope, recorded by the handler
/// [`Context::from_device`] installs (shared by contexts on one device).
type UncapturedErrors = Arc<parking_lot::Mutex<Vec<String>>>;

/// Keeps at most this many uncaptured error messages (the oldest are kept).
const MAX_UNCAPTURED: usize = 64;

/// Installs a handler that logs and records wgpu errors no error scope caught,
/// so they never abort the process (wgpu's default handler panics).
fn install_uncaptured_handler(device: &wgpu::Device) -> UncapturedErrors {
    let errors: UncapturedErrors = Default::default();
    let sink = errors.clone();
    device.on_uncaptured_error(Arc::new(move |e| {
        log::error!("uncaptured wgpu error: {e}");
        let mut v = sink.lock();
        if v.len() < MAX_UNCAPTURED {
            v.push(e.to_string());
        }
    }));
    errors
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.inner.caps.adapter_name)
            .field("backend", &self.inner.caps.backend)
            .field("pool", &self.inner.pool.policy_name())
            .finish()
    }
}

/// Features wgvae uses when the adapter offers them; none is required. Cooperative matrices
/// are opted into separately (`wgvae::cooperative_matrix_features`): they are experimental
/// in wgpu and need `wgpu::ExperimentalFeatures::enabled()` in the device descriptor.
pub fn optional_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
        | wgpu::Features::SUBGROUP
        | wgpu::Features::PIPELINE_CACHE
}

fn backends_from_env() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

/// What adapter selection looks at, per adapter (see [`rank_adapters`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name as the driver reports it.
    pub name: String,
    /// Discrete / integrated / virtual / CPU / other.
    pub device_type: wgpu::DeviceType,
    /// Vulkan, Metal, DX12, GL, …
    pub backend: wgpu::Backend,
    /// Can run compute shaders with storage buffers.
    pub compute: bool,
    /// Has the `shader-f16` feature.
    pub shader_f16: bool,
}

impl AdapterSummary {
    /// The summary of a wgpu adapter.
    pub fn of(a: &wgpu::Adapter) -> Self {
        let info = a.get_info();
        AdapterSummary {
            name: info.name,
            device_type: info.device_type,
            backend: info.backend,
            compute: a
                .get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS),
            shader_f16: a.features().contains(wgpu::Features::SHADER_F16),
        }
    }
}

/// The adapter [`rank_adapters`] picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSelection {
    /// Index into the list given to [`rank_adapters`].
    pub index: usize,
    /// Set when the choice is a CPU adapter picked automatically: no GPU
    /// adapter exists (or matches the name filter). Shown to users.
    pub notice: Option<String>,
}

/// Chooses among `adapters` (in [`Context::adapters`] order):
/// - `Index(i)`: adapter `i`, whatever it is;
/// - `Name(s)`, or `Auto` with `env_name` (`WGPU_ADAPTER_NAME`) set: only
///   adapters whose name contains it (case-insensitive), ranked as below;
/// - `Auto`: compute-capable adapters ranked discrete GPU, integrated,
///   virtual, other, CPU last; then Vulkan, Metal/DX12, GL; then shader-f16
///   first; ties keep list order.
pub fn rank_adapters(
    adapters: &[AdapterSummary],
    choice: &AdapterChoice,
    env_name: Option<&str>,
) -> Result<AdapterSelection> {
    if let AdapterChoice::Index(i) = *choice {
        let n = adapters.len();
        return if i < n {
            Ok(AdapterSelection {
                index: i,
                notice: None,
            })
        } else {
            Err(Error::NoAdapter(format!(" at index {i} (there are {n})")))
        };
    }
    let filter = match choice {
        AdapterChoice::Name(n) => Some(n.to_lowercase()),
        _ => env_name.filter(|s| !s.is_empty()).map(str::to_lowercase),
    };
    let best = adapters
        .iter()
        .enumerate()
        .filter(|(_, a)| a.compute)
        .filter(|(_, a)| {
            filter
                .as_ref()
                .is_none_or(|f| a.name.to_lowercase().contains(f.as_str()))
        })
        .min_by_key(|(i, a)| {
            (
                type_rank(a.device_type),
                backend_rank(a.backend),
                !a.shader_f16 as u32,
                *i,
            )
        });
    let Some((index, a)) = best else {
        return Err(Error::NoAdapter(match &filter {
            Some(f) => format!(" matching `{f}`"),
            None => String::new(),
        }));
    };
    let notice = (a.device_type == wgpu::DeviceType::Cpu).then(|| {
        format!(
            "no GPU adapter found{}: falling back to the CPU adapter `{}` ({:?}); expect slow decodes",
            filter
                .as_ref()
                .map(|f| format!(" matching `{f}`"))
                .unwrap_or_default(),
            a.name,
            a.backend
        )
    });
    Ok(AdapterSelection { index, notice })
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal | wgpu::Backend::Dx12 => 1,
        wgpu::Backend::Gl => 2,
        _ => 3,
    }
}

impl Context {
    /// Wraps a device the host application already owns. wgvae uses only the
    /// features and limits the device was created with.
    ///
    /// Every wgpu call wgvae makes runs inside error scopes and comes back as an
    /// [`Error`]. For errors that reach no scope (e.g. from host work on the same
    /// device) this installs an uncaptured-error handler that logs and records
    /// them ([`Context::take_uncaptured_errors`]) instead of wgpu's default, which
    /// panics. wgpu offers no way to read a device's current handler, so this
    /// replaces one the host installed before: a host with its own handler
    /// uses [`Context::from_host_device`], which leaves it alone (wgvae's errors
    /// still come back through its error scopes).
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::from_device_with_pool(device, queue, Arc::new(ExactPool::new()))
    }

    /// Like [`Context::from_device`] with a chosen memory pool.
    pub fn from_device_with_pool(
        device: wgpu::Device,
        queue: wgpu::Queue,
        pool: Arc<dyn MemoryPool>,
    ) -> Self {
        let uncaptured = install_uncaptured_handler(&device);
        Self::wrap_device(device, queue, pool, uncaptured)
    }

    /// Like [`Context::from_device_with_pool`], but the device's uncaptured-error handler is
    /// left as the host set it ([`Engine`](crate::Engine) uses this: the host owns the device
    /// and its error policy); [`Context::take_uncaptured_errors`] then stays empty.
    pub fn from_host_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        pool: Arc<dyn MemoryPool>,
    ) -> Self {
        Self::wrap_device(device, queue, pool, Default::default())
    }

    fn wrap_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        pool: Arc<dyn MemoryPool>,
        uncaptured: UncapturedErrors,
    ) -> Self {
        let caps = Capabilities::of_device(&device);
        Context {
            inner: Arc::new(Inner {
                pipelines: PipelineCache::new(),
                device,
                queue,
                caps,
                pool,
                null: false,
                uncaptured,
                notice: None,
                cancel: None,
            }),
        }
    }

    /// A message for the user about how the adapter was chosen: set by
    /// [`Context::new`] when it fell back to a CPU adapter (slow decodes).
    pub fn notice(&self) -> Option<&str> {
        self.inner.notice.as_deref()
    }

    /// Messages of wgpu errors no error scope caught on this device since the
    /// context was created (at most 64), oldest first; drains the record.
    pub fn take_uncaptured_errors(&self) -> Vec<String> {
        let mut v = self.inner.uncaptured.lock();
        std::mem::take(&mut *v)
    }

    /// A new context sharing device, queue and pipelines but with another pool.
    pub fn with_pool(&self, pool: Arc<dyn MemoryPool>) -> Self {
        Context {
            inner: Arc::new(Inner {
                pool,
                ..Inner::clone(&self.inner)
            }),
        }
    }

    /// A context sharing everything with this one whose tiled decodes and
    /// encodes stop with an error at the next tile once `flag` is set (a
    /// host's Ctrl-C), and video decoders at the next chunk pushed; untiled
    /// work is one submission and runs to its end.
    pub fn with_cancel(&self, flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Context {
            inner: Arc::new(Inner {
                cancel: Some(flag),
                ..Inner::clone(&self.inner)
            }),
        }
    }

    /// An error once the flag of [`Context::with_cancel`] is set (checked
    /// between tiles).
    pub(crate) fn check_cancel(&self) -> Result<()> {
        match &self.inner.cancel {
            Some(f) if f.load(std::sync::atomic::Ordering::SeqCst) => Err(Error::InvalidInput(
                "stopped: the cancel flag of `Context::with_cancel` was set".into(),
            )),
            _ => Ok(()),
        }
    }

    /// A context sharing device, queue, pipelines and pool that reports
    /// `caps` instead of the device's own: emulates a smaller device (lower
    /// binding or buffer limits) on this one. `caps` must not exceed what
    /// the device supports.
    #[doc(hidden)]
    pub fn with_caps(&self, caps: Capabilities) -> Self {
        Context {
            inner: Arc::new(Inner {
                device: self.inner.device.clone(),
                queue: self.inner.queue.clone(),
                caps,
                pipelines: self.inner.pipelines.clone(),
                pool: self.inner.pool.clone(),
                null: self.inner.null,
                uncaptured: self.inner.uncaptured.clone(),
                notice: self.inner.notice.clone(),
                cancel: self.inner.cancel.clone(),
            }),
        }
    }

    /// A context on a null device: the limits of `caps`, a pool, and no GPU
    /// work at all. Models load (weights are accounted, not uploaded),
    /// forward passes record nothing and read-backs return zeros, so the
    /// pool sees exactly the allocation sequence of a real run. This is how
    /// memory is predicted (a "dry run"); nothing above the device and pool
    /// layers needs to know.
    #[doc(hidden)]
    pub fn null(caps: Capabilities, pool: Arc<dyn MemoryPool>) -> Self {
        let (device, queue) = wgpu::Device::noop(&wgpu::DeviceDescriptor::default());
        Context {
            inner: Arc::new(Inner {
                device,
                queue,
                caps,
                pipelines: PipelineCache::new(),
                pool,
                null: true,
                uncaptured: Default::default(),
                notice: None,
                cancel: None,
            }),
        }
    }

    /// True on a null device ([`Context::null`]): for the device and pool
    /// layers; models, executors and front ends never ask.
    #[doc(hidden)]
    pub fn is_null(&self) -> bool {
        self.inner.null
    }

    /// Host memory available for parked tiles: `MemAvailable` of
    /// /proc/meminfo on a real device (`None` where unreadable), unlimited
    /// (`None`) on a null device, whose host buffers are never filled.
    #[doc(hidden)]
    pub fn host_memory_available(&self) -> Option<u64> {
        match self.inner.null {
            true => None,
            false => super::host::host_memory_available(),
        }
    }

    /// A `MAP_READ | COPY_DST` buffer of `size` bytes outside the pool, for
    /// read-backs the caller maps itself (a null device has none to map).
    pub(crate) fn readback_buffer(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        if self.inner.null {
            return Err(Error::Unsupported(format!(
                "{label}: mapping device memory in a dry run (a null device runs nothing; estimate memory with estimate::Estimate)"
            )));
        }
        self.scoped("allocating a readback buffer", || {
            Ok(self.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }))
        })
    }

    /// Where the pool gets device buffers from.
    #[doc(hidden)]
    pub fn backing(&self) -> Backing<'_> {
        if self.inner.null {
            Backing::Virtual {
                max_buffer_size: self.inner.caps.max_buffer_size,
            }
        } else {
            Backing::Device(&self.inner.device)
        }
    }

    /// The instance wgvae uses when it creates devices itself.
    pub fn instance(backends: Option<wgpu::Backends>) -> wgpu::Instance {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends.unwrap_or_else(backends_from_env);
        // Validation layers only when asked for (WGPU_DEBUG / WGPU_VALIDATION).
        desc.flags = wgpu::InstanceFlags::empty().with_env();
        wgpu::Instance::new(desc)
    }

    /// Every adapter wgpu sees, in the order [`AdapterChoice::Index`] uses.
    pub fn adapters(backends: Option<wgpu::Backends>) -> Vec<wgpu::Adapter> {
        let instance = Self::instance(backends);
        let b = backends.unwrap_or_else(backends_from_env);
        pollster::block_on(instance.enumerate_adapters(b))
    }

    /// Picks an adapter following `choice`: GPUs first, a CPU adapter only
    /// when nothing else exists (see [`rank_adapters`]; the CPU fallback is
    /// logged as a warning and returned by [`Context::notice`] after
    /// [`Context::new`]).
    pub fn choose_adapter(options: &ContextOptions) -> Result<wgpu::Adapter> {
        Ok(Self::select_adapter(options)?.0)
    }

    fn select_adapter(options: &ContextOptions) -> Result<(wgpu::Adapter, Option<String>)> {
        let mut adapters = Self::adapters(options.backends);
        let summaries: Vec<AdapterSummary> = adapters.iter().map(AdapterSummary::of).collect();
        let env = std::env::var("WGPU_ADAPTER_NAME").ok();
        let selection = rank_adapters(&summaries, &options.adapter, env.as_deref())?;
        if let Some(n) = &selection.notice {
            log::warn!("{n}");
        }
        Ok((adapters.swap_remove(selection.index), selection.notice))
    }

    /// Creates a device on the best adapter (see [`Context::choose_adapter`])
    /// with the adapter's full limits and every optional feature it offers.
    pub fn new(options: &ContextOptions) -> Result<Self> {
        let (adapter, notice) = Self::select_adapter(options)?;
        let mut ctx = Self::from_adapter_with(&adapter, options.cooperative_matrix)?;
        if let Some(inner) = Arc::get_mut(&mut ctx.inner) {
            inner.notice = notice;
        }
        if let Some(dir) = &options.pipeline_cache_dir {
            ctx.pipelines().attach_disk_cache(ctx.device(), dir);
        }
        Ok(ctx)
    }

    /// Persists the driver pipeline cache (see [`ContextOptions::pipeline_cache_dir`]).
    #[doc(hidden)]
    pub fn save_pipeline_cache(&self) {
        if let Err(e) = self.inner.pipelines.save_disk_cache() {
            log::warn!("could not save the pipeline cache: {e}");
        }
    }

    /// Creates a device on a given adapter (cooperative matrices automatic).
    pub fn from_adapter(adapter: &wgpu::Adapter) -> Result<Self> {
        Self::from_adapter_with(adapter, CooperativeMatrix::Auto)
    }

    /// Creates a device on a given adapter with the cooperative-matrix choice `matrices`.
    pub(crate) fn from_adapter_with(
        adapter: &wgpu::Adapter,
        matrices: CooperativeMatrix,
    ) -> Result<Self> {
        let mut features = adapter.features() & optional_features();
        let coop = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let want_coop = matrices != CooperativeMatrix::Off && adapter.features().contains(coop);
        if want_coop {
            features |= coop;
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgvae"),
            required_features: features,
            required_limits: adapter.limits(),
            experimental_features: if want_coop {
                // SAFETY: wgpu's experimental features may have bugs; the only one enabled is
                // cooperative matrices, whose kernels are checked against CPU references.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            Error::RequestDevice {
                adapter: adapter.get_info().name,
                source: e,
            }
        })?;
        // from_device installs the uncaptured-error handler.
        Self::from_device(device, queue)
            .with_matrices(&adapter.cooperative_matrix_properties(), matrices)
            .map(|c| c.with_device_memory(super::device_memory::of_adapter(adapter)))
    }

    /// Wraps a host's device as [`Context::from_device`] does, letting its kernels use
    /// cooperative matrices: `configs` is the adapter's
    /// `cooperative_matrix_properties()`, and the device must have been created with
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` (and `SHADER_F16`, `SUBGROUP`) for any to be used.
    pub fn from_device_with_matrices(
        device: wgpu::Device,
        queue: wgpu::Queue,
        configs: &[wgpu::CooperativeMatrixProperties],
        matrices: CooperativeMatrix,
    ) -> Result<Self> {
        Self::from_device(device, queue).with_matrices(configs, matrices)
    }

    /// This (fresh) context with the cooperative-matrix configuration `matrices` picks from
    /// the adapter's `configs` (see [`Capabilities::with_matrix_configs`]).
    pub(crate) fn with_matrices(
        self,
        configs: &[wgpu::CooperativeMatrixProperties],
        matrices: CooperativeMatrix,
    ) -> Result<Self> {
        let has = self
            .device()
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let caps = self.caps().clone().with_matrix_configs(
            configs.iter().map(MatrixConfig::of).collect(),
            has,
            matrices,
        )?;
        Ok(self.replace_caps(caps))
    }

    /// This (fresh) context knowing its adapter's device-local memory (see
    /// [`Capabilities::device_memory`]).
    pub(crate) fn with_device_memory(
        self,
        memory: Option<super::device_memory::DeviceMemory>,
    ) -> Self {
        let mut caps = self.caps().clone();
        caps.device_memory = memory;
        self.replace_caps(caps)
    }

    /// This context with `caps` (a fresh context not yet shared).
    fn replace_caps(mut self, caps: Capabilities) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => {
                inner.caps = caps;
                self
            }
            None => self.with_caps(caps),
        }
    }

    /// The wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// What the engine knows of the device (limits, features).
    pub fn caps(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// The compiled-pipeline cache.
    #[doc(hidden)]
    pub fn pipelines(&self) -> &PipelineCache {
        &self.inner.pipelines
    }

    /// The pool every tensor of this context is allocated from.
    pub fn pool(&self) -> &Arc<dyn MemoryPool> {
        &self.inner.pool
    }

    /// Runs `f` inside validation and out-of-memory error scopes and returns
    /// the first error wgpu reported as an [`Error`], naming `during`.
    pub(crate) fn scoped<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let oom = self
            .inner
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self
            .inner
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::from_wgpu(during, e));
        }
        if let Some(e) = v {
            return Err(Error::from_wgpu(during, e));
        }
        out
    }

    /// Maps all of `buffer` (`MAP_READ`, its copies submitted) for reading, waits for the
    /// device, hands the bytes to `f` and unmaps it again.
    pub(crate) fn read_mapped<T>(
        &self,
        buffer: &wgpu::Buffer,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait_idle()?;
        rx.recv()
            .map_err(|e| Error::Readback(e.to_string()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let view = buffer
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Readback(e.to_string()))?;
        let out = f(&view);
        drop(view);
        buffer.unmap();
        Ok(out)
    }

    /// Blocks until all submitted work is done.
    pub fn wait_idle(&self) -> Result<()> {
        if self.inner.null {
            return Ok(());
        }
        self.inner
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::DeviceLost(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::{Backend, DeviceType};

    fn a(name: &str, device_type: DeviceType, backend: Backend) -> AdapterSummary {
        AdapterSummary {
            name: name.into(),
            device_type,
            backend,
            compute: true,
            shader_f16: false,
        }
    }

    fn machine() -> Vec<AdapterSummary> {
        vec![
            a("llvmpipe (LLVM 15)", DeviceType::Cpu, Backend::Vulkan),
            a(
                "Intel(R) UHD 770",
                DeviceType::IntegratedGpu,
                Backend::Vulkan,
            ),
            a(
                "NVIDIA GeForce RTX 4090",
                DeviceType::DiscreteGpu,
                Backend::Gl,
            ),
            a(
                "NVIDIA GeForce RTX 4090",
                DeviceType::DiscreteGpu,
                Backend::Vulkan,
            ),
        ]
    }

    fn pick(list: &[AdapterSummary], choice: AdapterChoice, env: Option<&str>) -> Result<usize> {
        rank_adapters(list, &choice, env).map(|s| s.index)
    }

    #[test]
    fn auto_prefers_discrete_then_vulkan_and_puts_cpu_last() {
        let list = machine();
        let s = rank_adapters(&list, &AdapterChoice::Auto, None).unwrap();
        assert_eq!(
            s,
            AdapterSelection {
                index: 3,
                notice: None
            }
        );
        // Without the discrete GPU: the integrated one, still not the CPU.
        assert_eq!(pick(&list[..2], AdapterChoice::Auto, None).unwrap(), 1);
        // shader-f16 breaks ties between equal adapters.
        let mut twins = vec![list[1].clone(), list[1].clone()];
        twins[1].shader_f16 = true;
        assert_eq!(pick(&twins, AdapterChoice::Auto, None).unwrap(), 1);
        // Adapters without compute shaders are never chosen.
        let mut no_compute = list.clone();
        no_compute[3].compute = false;
        no_compute[2].compute = false;
        assert_eq!(pick(&no_compute, AdapterChoice::Auto, None).unwrap(), 1);
    }

    #[test]
    fn cpu_adapter_only_as_a_fallback_and_then_with_a_notice() {
        let list = machine();
        let s = rank_adapters(&list[..1], &AdapterChoice::Auto, None).unwrap();
        assert_eq!(s.index, 0);
        let notice = s.notice.expect("the CPU fallback is announced");
        assert!(
            notice.contains("llvmpipe") && notice.contains("CPU"),
            "{notice}"
        );
        // Asked for explicitly: no fallback notice.
        let s = rank_adapters(&list, &AdapterChoice::Index(0), None).unwrap();
        assert_eq!(
            s,
            AdapterSelection {
                index: 0,
                notice: None
            }
        );
        assert!(rank_adapters(&[], &AdapterChoice::Auto, None).is_err());
    }

    #[test]
    fn name_index_and_env_filters() {
        let list = machine();
        // Name: case-insensitive substring, then the usual ranking (Vulkan first).
        assert_eq!(
            pick(&list, AdapterChoice::Name("rtx".into()), None).unwrap(),
            3
        );
        assert_eq!(
            pick(&list, AdapterChoice::Name("INTEL".into()), None).unwrap(),
            1
        );
        assert!(matches!(
            pick(&list, AdapterChoice::Name("radeon".into()), None),
            Err(Error::NoAdapter(m)) if m.contains("radeon")
        ));
        // Index: exactly that adapter, even a CPU or GL one.
        assert_eq!(pick(&list, AdapterChoice::Index(2), None).unwrap(), 2);
        assert!(pick(&list, AdapterChoice::Index(4), None).is_err());
        // WGPU_ADAPTER_NAME applies to Auto only; an explicit name wins.
        assert_eq!(pick(&list, AdapterChoice::Auto, Some("uhd")).unwrap(), 1);
        assert_eq!(pick(&list, AdapterChoice::Auto, Some("")).unwrap(), 3);
        assert_eq!(
            pick(&list, AdapterChoice::Name("rtx".into()), Some("uhd")).unwrap(),
            3
        );
        assert_eq!(
            pick(&list, AdapterChoice::Index(0), Some("uhd")).unwrap(),
            0
        );
        // A filter matching only the CPU adapter: chosen, with a notice naming the filter.
        let s = rank_adapters(&list, &AdapterChoice::Auto, Some("llvm")).unwrap();
        assert_eq!(s.index, 0);
        assert!(s.notice.unwrap().contains("matching `llvm`"));
    }
}
