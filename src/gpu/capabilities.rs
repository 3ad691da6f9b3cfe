//! What a device can do ([`Capabilities`], read from its limits and features) and the
//! cooperative-matrix (tensor-core) configurations it offers.

use crate::error::{Error, Result};

/// What the device can do, read from the limits and features it was created
/// with. The rest of the engine consults this and never assumes more.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// The adapter's name.
    pub adapter_name: String,
    /// Graphics API backend.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, CPU, …
    pub device_type: wgpu::DeviceType,
    /// Driver name.
    pub driver: String,
    /// Driver version details.
    pub driver_info: String,
    /// `SHADER_F16` is enabled on the device.
    pub shader_f16: bool,
    /// `TIMESTAMP_QUERY` is enabled on the device.
    pub timestamp_query: bool,
    /// `TIMESTAMP_QUERY_INSIDE_PASSES` is enabled (per-dispatch profiling).
    pub timestamp_inside_passes: bool,
    /// `SUBGROUP` is enabled on the device.
    pub subgroup: bool,
    /// Smallest subgroup the device may run (lanes; 8 on lavapipe, 32 on NVIDIA).
    pub subgroup_min_size: u32,
    /// Largest subgroup the device may run (lanes).
    pub subgroup_max_size: u32,
    /// Every cooperative-matrix (tensor-core) configuration the adapter offers, as far as
    /// the engine knows it (empty for a device wrapped without its adapter's list).
    pub matrix_configs: Vec<MatrixConfig>,
    /// The configuration the engine's kernels use (`None`: the scalar path). Set from
    /// `matrix_configs` by [`CooperativeMatrix`] when the device has
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`, `SHADER_F16` and `SUBGROUP`.
    pub cooperative_matrix: Option<MatrixConfig>,
    /// Largest storage buffer binding in bytes (one tensor per binding).
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer in bytes.
    pub max_buffer_size: u64,
    /// Workgroup (`var<workgroup>`) memory per workgroup in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations per workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Storage buffers one kernel may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Alignment of storage buffer binding offsets in bytes.
    pub min_storage_buffer_offset_alignment: u32,
    /// Alignment of uniform buffer binding offsets in bytes.
    pub min_uniform_buffer_offset_alignment: u32,
    /// Largest uniform buffer binding in bytes.
    pub max_uniform_buffer_binding_size: u64,
    /// The adapter's device-local memory where its backend reports it (the default memory
    /// budget's source on GPUs; `None` for a device wrapped without its adapter).
    pub device_memory: Option<super::device_memory::DeviceMemory>,
}

impl Capabilities {
    /// Reads the capabilities of an existing device.
    pub(crate) fn of_device(device: &wgpu::Device) -> Self {
        let info = device.adapter_info();
        let f = device.features();
        let l = device.limits();
        Capabilities {
            adapter_name: info.name,
            backend: info.backend,
            device_type: info.device_type,
            driver: info.driver,
            driver_info: info.driver_info,
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamp_inside_passes: f.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            subgroup: f.contains(wgpu::Features::SUBGROUP),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            matrix_configs: Vec::new(),
            cooperative_matrix: None,
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
            max_uniform_buffer_binding_size: l.max_uniform_buffer_binding_size,
            device_memory: None,
        }
    }

    /// Limits of a 24 GB discrete GPU on Vulkan (RTX 4090 class: 4 GiB storage
    /// bindings, buffers up to the VRAM size), for predictions made elsewhere.
    pub fn reference_gpu() -> Self {
        Capabilities {
            adapter_name: "reference 24 GB GPU (RTX 4090-class limits)".into(),
            backend: wgpu::Backend::Vulkan,
            device_type: wgpu::DeviceType::DiscreteGpu,
            driver: String::new(),
            driver_info: String::new(),
            shader_f16: true,
            timestamp_query: true,
            timestamp_inside_passes: true,
            subgroup: true,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            matrix_configs: vec![MatrixConfig::F16_F32_16],
            cooperative_matrix: None,
            max_storage_buffer_binding_size: (4u64 << 30) - 4,
            max_buffer_size: 24u64 << 30,
            max_compute_workgroup_storage_size: 49152,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroups_per_dimension: 65535,
            max_storage_buffers_per_shader_stage: 64,
            min_storage_buffer_offset_alignment: 32,
            min_uniform_buffer_offset_alignment: 64,
            max_uniform_buffer_binding_size: 65536,
            device_memory: None,
        }
    }

    /// True for software adapters such as lavapipe / llvmpipe.
    pub fn is_cpu(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }

    /// These capabilities with the cooperative-matrix configuration `policy` picks from
    /// `configs` (the adapter's list), or an error naming what is missing when `policy` is
    /// [`CooperativeMatrix::On`] and none is usable. `device_has_feature`: the device was
    /// created with `EXPERIMENTAL_COOPERATIVE_MATRIX`.
    pub fn with_matrix_configs(
        mut self,
        configs: Vec<MatrixConfig>,
        device_has_feature: bool,
        policy: CooperativeMatrix,
    ) -> Result<Self> {
        self.matrix_configs = configs;
        self.cooperative_matrix = None;
        if policy == CooperativeMatrix::Off {
            return Ok(self);
        }
        let usable = self.usable_matrix_config();
        let why_not = if !device_has_feature {
            Some(if self.matrix_configs.is_empty() {
                "the adapter offers no cooperative matrices (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX; on Vulkan VK_KHR_cooperative_matrix with vulkanMemoryModelDeviceScope), or the device was wrapped without its adapter's list (Context::from_device_with_matrices, Engine::with_adapter)"
            } else {
                "the device was created without wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX (see wgvae::optional_features)"
            })
        } else if !self.shader_f16 || !self.subgroup {
            Some("the device lacks SHADER_F16 or SUBGROUP, which the cooperative kernels need")
        } else if usable.is_none() {
            Some(
                "none of the adapter's configurations is a square 8x8x8 or 16x16x16 f16 -> f32 one",
            )
        } else {
            None
        };
        match (why_not, policy) {
            // CPU adapters (lavapipe) emulate the matrices, several times slower than their
            // scalar path (TAEF2 f16 at 256²: 19.0 s against 3.8 s on Mesa 26): only on demand.
            (None, CooperativeMatrix::Auto) if self.is_cpu() => {
                log::debug!("cooperative matrices not used automatically on a CPU adapter (emulated)")
            }
            (None, _) => self.cooperative_matrix = usable,
            (Some(why), CooperativeMatrix::On) => {
                return Err(Error::Unsupported(format!(
                    "cooperative matrices were asked for on `{}` ({:?}), but {why}; set `ContextOptions::cooperative_matrix` to auto (the scalar path where none is usable) or off",
                    self.adapter_name, self.backend
                )))
            }
            (Some(why), _) => log::debug!("cooperative matrices not used: {why}"),
        }
        Ok(self)
    }

    /// The cooperative-matrix configuration kernels may use: [`Capabilities::cooperative_matrix`]
    /// while the capabilities still have shader-f16 and subgroups (a context that hides them,
    /// e.g. to test the packed-f16 path, hides the matrices too). Kernels ask this, not the field.
    pub fn matrix(&self) -> Option<MatrixConfig> {
        self.cooperative_matrix
            .filter(|_| self.shader_f16 && self.subgroup)
    }

    /// The best configuration of `matrix_configs` the kernels can use: f16 operands with
    /// f32 accumulation, square, the largest side first (16 on NVIDIA/AMD, 8 on lavapipe).
    fn usable_matrix_config(&self) -> Option<MatrixConfig> {
        self.matrix_configs
            .iter()
            .filter(|c| c.is_usable())
            .max_by_key(|c| c.size)
            .copied()
    }
}

/// Whether kernels use cooperative matrices (tensor cores): a per-device choice like tile
/// sizes. `Auto` uses them where a GPU adapter has a usable configuration (CPU adapters such
/// as lavapipe emulate them, slower than their scalar path); `On` uses them wherever a usable
/// configuration exists and makes a missing one an error; `Off` keeps the scalar path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CooperativeMatrix {
    /// Use them where a GPU adapter has a usable configuration (the default).
    #[default]
    Auto,
    /// Use them; creating the context fails where they are unavailable.
    On,
    /// Never use them.
    Off,
}

impl std::str::FromStr for CooperativeMatrix {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(CooperativeMatrix::Auto),
            "on" | "yes" | "true" => Ok(CooperativeMatrix::On),
            "off" | "no" | "false" => Ok(CooperativeMatrix::Off),
            _ => Err(Error::Unsupported(format!(
                "cooperative-matrix mode `{s}`: expected auto, on or off"
            ))),
        }
    }
}

/// Element type of a cooperative-matrix operand or accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatrixScalar {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
}

impl MatrixScalar {
    fn name(self) -> &'static str {
        match self {
            MatrixScalar::F32 => "f32",
            MatrixScalar::F16 => "f16",
            MatrixScalar::I32 => "i32",
            MatrixScalar::U32 => "u32",
        }
    }
}

/// One cooperative-matrix configuration: `C[m×n] += A[m×k] · B[k×n]` per subgroup, A and B
/// of type `ab`, C of type `cr`. Displayed as `8x8x8 f16->f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixConfig {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// Operand type.
    pub ab: MatrixScalar,
    /// Accumulator type.
    pub cr: MatrixScalar,
    /// The side of a square configuration (0 otherwise).
    pub size: u32,
}

impl MatrixConfig {
    /// 16×16×16 f16 → f32 (NVIDIA, AMD).
    pub const F16_F32_16: MatrixConfig = MatrixConfig::square(16);
    /// 8×8×8 f16 → f32 (lavapipe, Apple).
    pub const F16_F32_8: MatrixConfig = MatrixConfig::square(8);

    const fn square(size: u32) -> MatrixConfig {
        MatrixConfig {
            m: size,
            n: size,
            k: size,
            ab: MatrixScalar::F16,
            cr: MatrixScalar::F32,
            size,
        }
    }

    /// The engine's view of a wgpu configuration.
    pub fn of(p: &wgpu::CooperativeMatrixProperties) -> MatrixConfig {
        let scalar = |t: wgpu::CooperativeScalarType| match t {
            wgpu::CooperativeScalarType::F32 => MatrixScalar::F32,
            wgpu::CooperativeScalarType::F16 => MatrixScalar::F16,
            wgpu::CooperativeScalarType::I32 => MatrixScalar::I32,
            wgpu::CooperativeScalarType::U32 => MatrixScalar::U32,
        };
        let square = p.m_size == p.n_size && p.n_size == p.k_size;
        MatrixConfig {
            m: p.m_size,
            n: p.n_size,
            k: p.k_size,
            ab: scalar(p.ab_type),
            cr: scalar(p.cr_type),
            size: if square { p.m_size } else { 0 },
        }
    }

    /// The kernels use square 8 or 16 configurations with f16 operands and f32 accumulation.
    pub fn is_usable(&self) -> bool {
        matches!(self.size, 8 | 16) && self.ab == MatrixScalar::F16 && self.cr == MatrixScalar::F32
    }
}

impl std::fmt::Display for MatrixConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{} {}->{}",
            self.m,
            self.n,
            self.k,
            self.ab.name(),
            self.cr.name()
        )
    }
}
