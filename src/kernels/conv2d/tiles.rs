//! Tile shapes of the implicit GEMM and the defaults chosen per device.

use crate::error::{Error, Result};
use crate::gpu::Capabilities;

/// Tile shape of the implicit GEMM: pipeline-key constants a device may choose.
/// A workgroup computes `tm` output channels x `tn` output pixels (a `tn / tw` x `tw` patch),
/// with `(tm / rm) * (tn / rn)` invocations each holding an `rm` x `rn` register block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvTiles {
    /// Output channels per workgroup tile.
    pub tm: u32,
    /// Output pixels per workgroup tile.
    pub tn: u32,
    /// Width of the pixel patch (a power of two dividing `tn`).
    pub tw: u32,
    /// Reduction (Cin * k * k) step per workgroup-memory stage (even; unused when `direct`).
    pub tk: u32,
    /// Output channels per invocation (multiple of 4).
    pub rm: u32,
    /// Output pixels per invocation, along one output row (multiple of 4 dividing `tw`).
    pub rn: u32,
    /// Invocations read their operands straight from the buffers instead of workgroup-memory
    /// tiles (for CPU adapters, where workgroup memory is no faster and barriers are costly).
    pub direct: bool,
    /// Cooperative matrices (tensor cores) instead of register blocks: `rm` x `rn` is then
    /// each subgroup's block of C, in `size` x `size` matrices.
    pub matrix: Option<MatrixTiles>,
}

/// The cooperative-matrix side of [`ConvTiles`]: f16 operands staged in workgroup memory,
/// f32 accumulators, `(tm / rm) * (tn / rn)` subgroups of `lanes` invocations each owning
/// an `rm` x `rn` block of the output tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixTiles {
    /// Side of the square matrices (8 or 16).
    pub size: u32,
    /// Subgroup size the workgroup is planned for (the device's largest).
    pub lanes: u32,
    /// The device's smallest subgroup size: a smaller subgroup means more subgroups, which
    /// repeat the planned ones' work (same values) and need their own epilogue scratch.
    pub lanes_min: u32,
}

impl MatrixTiles {
    /// Subgroups the workgroup is planned for.
    fn planned(&self, t: &ConvTiles) -> u32 {
        (t.tm / t.rm.max(1)) * (t.tn / t.rn.max(1))
    }
}

impl ConvTiles {
    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        let blocks = (self.tm / self.rm.max(1)) * (self.tn / self.rn.max(1));
        match self.matrix {
            Some(mt) => blocks * mt.lanes,
            None => blocks,
        }
    }

    /// Subgroups a workgroup may hold (their epilogue scratch): planned subgroups times
    /// the ratio of the largest to the smallest subgroup size.
    pub fn max_subgroups(&self) -> u32 {
        match self.matrix {
            Some(mt) => self.workgroup_size() / mt.lanes_min.max(1),
            None => 0,
        }
    }

    /// Bytes of workgroup memory the tiles use.
    pub fn shared_bytes(&self) -> u32 {
        if let Some(mt) = self.matrix {
            // f16 operand tiles, one f32 matrix of epilogue scratch per subgroup.
            return self.tk * (self.tm + self.tn) * 2
                + self.max_subgroups() * mt.size * mt.size * 4;
        }
        if self.direct {
            0
        } else {
            self.tk * (self.tm + self.tn) * 4
        }
    }

    /// `8x8x8 f16->f32` for a cooperative-matrix tile set (reports, profiles).
    pub fn matrix_name(&self) -> Option<String> {
        self.matrix.map(|m| format!("{0}x{0}x{0} f16->f32", m.size))
    }

    /// Checks the divisibility rules of the shader and the device limits.
    pub fn check(&self, caps: &Capabilities) -> Result<()> {
        let ConvTiles {
            tm,
            tn,
            tw,
            tk,
            rm,
            rn,
            direct,
            matrix,
        } = *self;
        let bad = |why: &str| Err(Error::Unsupported(format!("conv2d tiles {self:?}: {why}")));
        if let Some(mt) = matrix {
            return self.check_matrix(caps, mt);
        }
        if rm == 0 || rn == 0 || rm % 4 != 0 || rn % 4 != 0 {
            return bad("rm and rn must be positive multiples of 4");
        }
        if !direct && (tk == 0 || tk % 2 != 0) {
            return bad("tk must be positive and even");
        }
        if tm % rm != 0 || tn % rn != 0 {
            return bad("tm must be a multiple of rm and tn of rn");
        }
        if !tw.is_power_of_two() || tn % tw != 0 || tw % rn != 0 {
            return bad("tw must be a power of two dividing tn, and a multiple of rn");
        }
        if !direct && (!(tm / 4).is_power_of_two() || !(tn / 4).is_power_of_two()) {
            return bad("tm / 4 and tn / 4 must be powers of two");
        }
        let wg = self.workgroup_size();
        if wg > caps.max_compute_invocations_per_workgroup {
            return bad("workgroup larger than the device allows");
        }
        if self.shared_bytes() > caps.max_compute_workgroup_storage_size {
            return bad("tiles exceed the device's workgroup memory");
        }
        Ok(())
    }

    fn check_matrix(&self, caps: &Capabilities, mt: MatrixTiles) -> Result<()> {
        let bad = |why: String| Err(Error::Unsupported(format!("conv2d tiles {self:?}: {why}")));
        let s = mt.size;
        let Some(cfg) = caps.matrix() else {
            return bad("the device has no usable cooperative-matrix configuration".into());
        };
        if cfg.size != s {
            return bad(format!("the device's cooperative matrices are {cfg}"));
        }
        if !caps.shader_f16 || !caps.subgroup {
            return bad("cooperative tiles need shader-f16 and subgroups".into());
        }
        if self.direct {
            return bad("cooperative tiles are staged in workgroup memory (direct: false)".into());
        }
        for (name, v) in [("rm", self.rm), ("rn", self.rn), ("tk", self.tk)] {
            if v == 0 || v % s != 0 {
                return bad(format!("{name} must be a positive multiple of {s}"));
            }
        }
        if !self.tm.is_multiple_of(self.rm) || !self.tn.is_multiple_of(self.rn) {
            return bad("tm must be a multiple of rm and tn of rn".into());
        }
        if !self.tw.is_power_of_two() || !self.tn.is_multiple_of(self.tw) || self.tw < 4 {
            return bad("tw must be a power of two >= 4 dividing tn".into());
        }
        if !self.tm.is_power_of_two() || !self.tn.is_power_of_two() || self.tm < 4 {
            return bad("tm and tn must be powers of two (tm >= 4)".into());
        }
        if mt.lanes_min == 0 || !mt.lanes.is_multiple_of(mt.lanes_min) || mt.planned(self) == 0 {
            return bad(
                "subgroup sizes must be positive, the largest a multiple of the smallest".into(),
            );
        }
        if self.workgroup_size() > caps.max_compute_invocations_per_workgroup {
            return bad("workgroup larger than the device allows".into());
        }
        if self.shared_bytes() > caps.max_compute_workgroup_storage_size {
            return bad("tiles exceed the device's workgroup memory".into());
        }
        Ok(())
    }

    /// The cooperative-matrix tiles for a layer on a device whose capabilities name a
    /// configuration (`None` otherwise). Square `size` matrices, each subgroup owning
    /// `rm` x `rn` of the output tile; per-device parameters like the scalar ones:
    /// - 16 (NVIDIA/AMD): 128 x 128 workgroup tiles (64 / 16 channels for small Cout), 64 x 32
    ///   per subgroup (8 accumulators), K steps of 32: 24 KiB of workgroup memory.
    /// - 8 (lavapipe, Apple): 32 x 32 tiles, 16 x 16 per subgroup, K steps of 16; lavapipe
    ///   emulates the matrices, so these are sized for compile time and correctness runs.
    pub fn matrix_for_layer(caps: &Capabilities, cout: usize, _k: usize) -> Option<ConvTiles> {
        let cfg = caps.matrix()?;
        let lanes = caps.subgroup_max_size.max(1);
        let lanes_min = caps.subgroup_min_size.clamp(1, lanes);
        let matrix = Some(MatrixTiles {
            size: cfg.size,
            lanes,
            lanes_min,
        });
        let s = cfg.size;
        let (tm, tn, tk, rm, rn) = if s >= 16 {
            if cout <= 16 {
                (16, 128, 32, 16, 32)
            } else if cout <= 64 {
                (64, 128, 32, 32, 32)
            } else {
                (128, 128, 32, 64, 32)
            }
        } else if cout <= 8 {
            (8, 64, 16, 8, 16)
        } else {
            (32, 32, 16, 16, 16)
        };
        let t = ConvTiles {
            tm,
            tn,
            tw: 32,
            tk,
            rm,
            rn,
            direct: false,
            matrix,
        };
        t.check(caps).ok().map(|_| t)
    }

    /// The default tiles for a layer on a device.
    pub fn for_layer(caps: &Capabilities, cout: usize, _k: usize) -> ConvTiles {
        let small = cout <= 16;
        if caps.is_cpu() {
            // CPU adapters (lavapipe): a workgroup runs on one CPU thread, invocations are
            // SIMD lanes, and every workgroup-memory access is a scalar loop over the lanes;
            // register blocks fed directly from the (cached) buffers do best. LLVM's compile
            // time grows fast with the block, and lavapipe compiles each variant at its first
            // dispatch (seconds each: the cold cost of every test process and CLI run).
            // Measured on lavapipe (Mesa 25.0.7, LLVM 15, 2-core AVX2 EPYC), criterion, f32,
            // GFLOP/s plain / fused, cold compile of the pair (bench wall time minus timing):
            //   512x32x32->512: 64x64 tile, 16x16 block: 32.4 / 28.7, ~16 s;
            //                   32x32 tile,   8x8 block: 36.9 / 28.2, ~4 s (chosen);
            //   128x128x128->3: 4x256, 4x32 block: 14.3 / 12.3, ~4 s;
            //                   4x128, 4x16 block: 19.9 / 17.3, < 1 s (chosen).
            if small {
                ConvTiles {
                    tm: 4,
                    tn: 128,
                    tw: 32,
                    tk: 0,
                    rm: 4,
                    rn: 16,
                    direct: true,
                    matrix: None,
                }
            } else {
                ConvTiles {
                    tm: 32,
                    tn: 32,
                    tw: 32,
                    tk: 0,
                    rm: 8,
                    rn: 8,
                    direct: true,
                    matrix: None,
                }
            }
        } else if small {
            // conv_out (Cout = 3): narrow in M so few padded rows are computed.
            ConvTiles {
                tm: 4,
                tn: 256,
                tw: 32,
                tk: 16,
                rm: 4,
                rn: 4,
                direct: false,
                matrix: None,
            }
        } else {
            ConvTiles {
                tm: if cout <= 64 { 64 } else { 128 },
                tn: 128,
                tw: 32,
                tk: 8,
                rm: 8,
                rn: 8,
                direct: false,
                matrix: None,
            }
        }
    }
}

/// Capabilities of a typical device of a kind (GPU or CPU adapter), for listing the
/// defaults [`ConvTiles::for_layer`] picks without such a device at hand.
pub(super) fn typical_caps(cpu: bool) -> Capabilities {
    Capabilities {
        adapter_name: String::new(),
        backend: wgpu::Backend::Vulkan,
        device_type: if cpu {
            wgpu::DeviceType::Cpu
        } else {
            wgpu::DeviceType::DiscreteGpu
        },
        driver: String::new(),
        driver_info: String::new(),
        shader_f16: false,
        timestamp_query: false,
        timestamp_inside_passes: false,
        subgroup: false,
        subgroup_min_size: if cpu { 8 } else { 32 },
        subgroup_max_size: if cpu { 8 } else { 32 },
        matrix_configs: Vec::new(),
        cooperative_matrix: None,
        max_storage_buffer_binding_size: 1 << 27,
        max_buffer_size: 1 << 30,
        max_compute_workgroup_storage_size: 32 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroups_per_dimension: 65535,
        max_storage_buffers_per_shader_stage: 8,
        min_storage_buffer_offset_alignment: 256,
        min_uniform_buffer_offset_alignment: 256,
        max_uniform_buffer_binding_size: 1 << 16,
        device_memory: None,
    }
}

/// [`typical_caps`] with cooperative matrices of side `size` (16 on GPUs, 8 on lavapipe).
pub(super) fn typical_matrix_caps(cpu: bool) -> Capabilities {
    let mut caps = typical_caps(cpu);
    let cfg = if cpu {
        crate::gpu::MatrixConfig::F16_F32_8
    } else {
        crate::gpu::MatrixConfig::F16_F32_16
    };
    caps.shader_f16 = true;
    caps.subgroup = true;
    caps.matrix_configs = vec![cfg];
    caps.cooperative_matrix = Some(cfg);
    caps
}

/// Every tile set [`ConvTiles::for_layer`] and [`ConvTiles::matrix_for_layer`] pick, on
/// GPUs and on CPU adapters.
pub(super) fn default_tile_sets() -> Vec<ConvTiles> {
    let mut sets = Vec::new();
    for cpu in [false, true] {
        for cout in [3, 8, 64, 512] {
            for k in [1, 3] {
                let t = ConvTiles::for_layer(&typical_caps(cpu), cout, k);
                let m = ConvTiles::matrix_for_layer(&typical_matrix_caps(cpu), cout, k);
                for t in std::iter::once(t).chain(m) {
                    if !sets.contains(&t) {
                        sets.push(t);
                    }
                }
            }
        }
    }
    sets
}
