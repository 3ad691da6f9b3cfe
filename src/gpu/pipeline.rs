//! Shader specialisation and the pipeline cache.
//!
//! A kernel is described by a [`KernelSpec`] (its WGSL source, entry point,
//! bindings and uniform size). A [`PipelineKey`] adds the specialisation
//! (defines), so each variant compiles exactly once per context.
//!
//! Preprocessing is deliberately small: `#ifdef NAME`, `#ifndef NAME`,
//! `#else`, `#endif` (nestable), and a generated header of `const` and
//! `alias` declarations for the defines that carry values. That keeps
//! every `.wgsl` file readable as WGSL.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::gpu::storage::{self, StorageType};

/// What a kernel does with one binding. Binding 0 is always the kernel's
/// uniform parameter block (bound with a dynamic offset); storage bindings
/// follow at 1, 2, …
///
/// Every storage *buffer* binding is declared `read_write` in the shader and
/// layout, whatever the kernel does with it: pooled tensors share
/// `wgpu::Buffer`s, and WebGPU forbids read-only and writable storage use of
/// one buffer in one dispatch. `Read` / `ReadWrite` document intent (and
/// in-place use).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// A tensor only read by the kernel.
    Read,
    /// A tensor written by the kernel.
    ReadWrite,
    /// A write-only 2-D storage texture of this format (`texture_storage_2d<F, write>`),
    /// bound with [`Binding::Texture`](crate::gpu::Binding::Texture). Used to
    /// write images into a host application's texture.
    WriteTexture(wgpu::TextureFormat),
}

/// A kernel's WGSL text: a shader file compiled in, or text generated at run
/// time (conv2d's unrolled register blocks), shared and freed with its specs.
#[derive(Clone, Debug)]
pub enum WgslSource {
    /// A shader file (`include_str!`).
    Static(&'static str),
    /// Generated text.
    Generated(Arc<str>),
}

impl std::ops::Deref for WgslSource {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            WgslSource::Static(s) => s,
            WgslSource::Generated(s) => s,
        }
    }
}

impl AsRef<str> for WgslSource {
    fn as_ref(&self) -> &str {
        self
    }
}

/// The Rust side of a kernel's contract with its shader.
#[derive(Clone, Debug)]
pub struct KernelSpec {
    /// Kernel family: the shader file's stem (`conv2d` for `shaders/conv2d.wgsl`).
    pub family: &'static str,
    /// The WGSL source (before preprocessing).
    pub source: WgslSource,
    /// Entry point name.
    pub entry: &'static str,
    /// Storage bindings 1.. in order.
    pub bindings: &'static [BindingKind],
    /// `size_of` the uniform struct at binding 0 (checked against the shader in tests).
    pub uniform_size: u64,
    /// Compiled without naga's runtime checks (index clamping, loop bounding): only for
    /// generated kernels whose every index is in bounds by construction, argued where the
    /// spec is made (`conv2d`'s cooperative kernel) and exercised by tests on odd shapes.
    pub trusted: bool,
}

/// One define: a flag (for `#ifdef`), a `const` or an `alias`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Define {
    Flag(&'static str),
    Const(&'static str, String),
    Alias(&'static str, String),
    /// How the `#storage` binding of this name holds its elements.
    Storage(&'static str, StorageType),
}

/// Cache key: kernel family, entry point and specialisation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// Kernel family (the shader file's name).
    pub family: &'static str,
    /// Entry point name.
    pub entry: &'static str,
    /// Constants, aliases, flags and storage types injected by the preprocessor.
    pub defines: Vec<Define>,
}

impl PipelineKey {
    /// A key for `spec` with no specialisation yet.
    pub fn new(spec: &KernelSpec) -> Self {
        PipelineKey {
            family: spec.family,
            entry: spec.entry,
            defines: Vec::new(),
        }
    }
    /// Defines preprocessor flag `name` (for `#ifdef`).
    pub fn flag(mut self, name: &'static str) -> Self {
        self.defines.push(Define::Flag(name));
        self
    }
    /// Defines flag `name` when `cond` holds.
    pub(crate) fn flag_if(self, cond: bool, name: &'static str) -> Self {
        if cond {
            self.flag(name)
        } else {
            self
        }
    }
    /// Injects `const name = value;`.
    pub fn constant(mut self, name: &'static str, value: impl ToString) -> Self {
        self.defines.push(Define::Const(name, value.to_string()));
        self
    }
    /// Injects `alias name = ty;`.
    pub fn alias(mut self, name: &'static str, ty: impl ToString) -> Self {
        self.defines.push(Define::Alias(name, ty.to_string()));
        self
    }
    /// The storage type of the `#storage` binding `name` (f32 when unset).
    pub fn storage(mut self, name: &'static str, ty: StorageType) -> Self {
        self.defines.push(Define::Storage(name, ty));
        self
    }
    fn is_defined(&self, name: &str) -> bool {
        self.defines.iter().any(|d| match d {
            Define::Flag(n) | Define::Const(n, _) | Define::Alias(n, _) => *n == name,
            Define::Storage(..) => false,
        })
    }
    fn storage_of(&self, name: &str) -> StorageType {
        self.defines
            .iter()
            .find_map(|d| match d {
                Define::Storage(n, t) if *n == name => Some(*t),
                _ => None,
            })
            .unwrap_or(StorageType::F32)
    }
    fn storage_types(&self) -> impl Iterator<Item = StorageType> + '_ {
        self.defines.iter().filter_map(|d| match d {
            Define::Storage(_, t) => Some(*t),
            _ => None,
        })
    }
}

/// Expands a WGSL source for a key. `enable f16;` is emitted first when the
/// `F16` flag is set, `enable wgpu_cooperative_matrix;` when `COOP` is (WGSL
/// requires enables before any declaration).
pub fn preprocess(source: impl AsRef<str>, key: &PipelineKey) -> Result<String> {
    let source = source.as_ref();
    let mut out = String::with_capacity(source.len() + 256);
    if key.is_defined("F16") || key.storage_types().any(|t| t == StorageType::F16) {
        out.push_str("enable f16;\n");
    }
    if key.is_defined("COOP") {
        out.push_str("enable wgpu_cooperative_matrix;\n");
    }
    if storage::needs_packed_helpers(key.storage_types()) {
        out.push_str(storage::packed_helpers());
    }
    for d in &key.defines {
        match d {
            Define::Flag(_) | Define::Storage(..) => {}
            Define::Const(n, v) => out.push_str(&format!("const {n} = {v};\n")),
            Define::Alias(n, v) => out.push_str(&format!("alias {n} = {v};\n")),
        }
    }
    // Stack of (this branch active, any enclosing inactive).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |s: &Vec<(bool, bool)>| s.iter().all(|(a, _)| *a);
    let err = |line: usize, msg: &str| Error::Shader {
        name: format!("{}:{}", key.family, line + 1),
        message: msg.to_string(),
    };
    for (i, line) in source.lines().enumerate() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#ifdef ") {
            stack.push((key.is_defined(rest.trim()), false));
        } else if let Some(rest) = t.strip_prefix("#ifndef ") {
            stack.push((!key.is_defined(rest.trim()), false));
        } else if t.starts_with("#else") {
            let top = stack
                .last_mut()
                .ok_or_else(|| err(i, "#else without #ifdef"))?;
            if top.1 {
                return Err(err(i, "two #else in one #ifdef"));
            }
            *top = (!top.0, true);
        } else if t.starts_with("#endif") {
            stack.pop().ok_or_else(|| err(i, "#endif without #ifdef"))?;
        } else if let Some(rest) = t.strip_prefix("#storage ") {
            if active(&stack) {
                let (name, binding, access, vec4) =
                    storage::parse_directive(rest).map_err(|m| err(i, &m))?;
                out.push_str(&storage::declare(
                    name,
                    binding,
                    key.storage_of(name),
                    access,
                    vec4,
                )?);
            }
        } else if t.starts_with('#') {
            return Err(err(i, "unknown preprocessor directive"));
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(err(source.lines().count(), "unterminated #ifdef"));
    }
    Ok(out)
}

/// A compiled pipeline with its bind group layout.
#[derive(Debug)]
pub struct CachedPipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// A driver pipeline cache persisted to a file (Vulkan), so a second process
/// start skips shader compilation.
struct DiskCache {
    cache: wgpu::PipelineCache,
    path: std::path::PathBuf,
}

/// Compiles each (kernel, entry, specialisation) once. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct PipelineCache {
    map: Arc<Mutex<HashMap<PipelineKey, Arc<CachedPipeline>>>>,
    disk: Arc<Mutex<Option<DiskCache>>>,
    /// Keys a null device's dispatches asked for (never compiled).
    requested: Arc<Mutex<std::collections::HashSet<PipelineKey>>>,
}

impl PipelineCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The keys of every pipeline compiled so far (tests check them against
    /// [`crate::kernels::all_variants`]).
    pub fn keys(&self) -> Vec<PipelineKey> {
        let map = self.map.lock();
        map.keys().cloned().collect()
    }

    /// Notes `key` as requested by a dispatch on a null device, which
    /// compiles nothing: dry runs show which pipelines a run would compile.
    pub(crate) fn note_requested(&self, key: &PipelineKey) {
        let mut requested = self.requested.lock();
        // Cloned only when new: dry runs request the same keys millions of times.
        if !requested.contains(key) {
            requested.insert(key.clone());
        }
    }

    /// The keys dispatches on a null device ([`crate::gpu::Context::null`])
    /// asked for (tests check them against [`crate::kernels::all_variants`]
    /// for every storage path in milliseconds, without compiling).
    pub fn requested_keys(&self) -> Vec<PipelineKey> {
        self.requested.lock().iter().cloned().collect()
    }

    /// Loads (or starts) the driver's pipeline cache for this device from
    /// `dir`. Needs `Features::PIPELINE_CACHE` (Vulkan); returns whether a
    /// cache is in use.
    pub(crate) fn attach_disk_cache(&self, device: &wgpu::Device, dir: &std::path::Path) -> bool {
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return false;
        }
        let Some(key) = wgpu::util::pipeline_cache_key(&device.adapter_info()) else {
            return false;
        };
        let path = dir.join(key);
        let data = std::fs::read(&path).ok();
        // SAFETY: the data was written by `save_disk_cache` for this adapter key;
        // wgpu/the driver validate it and fall back to an empty cache if stale.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("wgvae pipeline cache"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        *self.disk.lock() = Some(DiskCache { cache, path });
        true
    }

    /// Writes the driver's pipeline cache back to its file (if attached).
    pub(crate) fn save_disk_cache(&self) -> std::io::Result<()> {
        let guard = self.disk.lock();
        let Some(d) = guard.as_ref() else {
            return Ok(());
        };
        let Some(data) = d.cache.get_data() else {
            return Ok(());
        };
        if let Some(parent) = d.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = d.path.with_extension("tmp");
        std::fs::write(&tmp, &data)?;
        std::fs::rename(&tmp, &d.path)
    }

    /// Number of compiled pipelines.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// True when no pipeline has been compiled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bind group layout of a kernel (see [`BindingKind`] for why every
    /// storage buffer binding is read-write).
    pub(crate) fn layout_entries(spec: &KernelSpec) -> Vec<wgpu::BindGroupLayoutEntry> {
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: wgpu::BufferSize::new(spec.uniform_size),
            },
            count: None,
        }];
        for (i, kind) in spec.bindings.iter().enumerate() {
            let ty = match kind {
                BindingKind::Read | BindingKind::ReadWrite => wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                BindingKind::WriteTexture(format) => wgpu::BindingType::StorageTexture {
                    access: wgpu::StorageTextureAccess::WriteOnly,
                    format: *format,
                    view_dimension: wgpu::TextureViewDimension::D2,
                },
            };
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty,
                count: None,
            });
        }
        entries
    }

    /// The pipeline for `key`, compiling it on first use.
    pub fn get(
        &self,
        device: &wgpu::Device,
        spec: &KernelSpec,
        key: &PipelineKey,
    ) -> Result<Arc<CachedPipeline>> {
        if let Some(p) = self.map.lock().get(key) {
            return Ok(p.clone());
        }
        let source = preprocess(&*spec.source, key)?;
        let label = format!("{}::{}", key.family, key.entry);
        let started = std::time::Instant::now();
        // Innermost scope: validation (a bug in a shader); outer: out of memory.
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = if spec.trusted {
            // SAFETY: `trusted` specs index only within their bindings and workgroup arrays
            // and their loops terminate (the argument is written where such a spec is made);
            // the checks cost the hot kernels a clamp per access and a counter per loop.
            unsafe {
                device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            device.create_shader_module(desc)
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &Self::layout_entries(spec),
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let disk = self.disk.lock();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Our kernels initialise the shared memory they read.
                zero_initialize_workgroup_memory: false,
            },
            cache: disk.as_ref().map(|d| &d.cache),
        });
        drop(disk);
        let invalid = pollster::block_on(validation.pop());
        if let Some(e) = pollster::block_on(oom.pop()) {
            return Err(Error::from_wgpu(&format!("compiling {label}"), e));
        }
        if let Some(e) = invalid {
            return Err(Error::Shader {
                name: label,
                message: e.to_string(),
            });
        }
        // Driver compile time: on software drivers the main cost of a cold start.
        log::debug!(
            "compiled {label} {key:?} in {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let cached = Arc::new(CachedPipeline { pipeline, layout });
        self.map.lock().insert(key.clone(), cached.clone());
        Ok(cached)
    }
}
