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
    /// Halves of padding after each staged row (a multiple of 8: rows stay 16-byte aligned,
    /// as cooperative loads need, and a fragment's rows fall in different banks).
    pub pad: u32,
    /// Workgroup-memory stages (1 or 2): with 2 the next K step is staged into the other
    /// buffer while the current one is multiplied, one barrier per step instead of two.
    pub stages: u32,
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
            // f16 operand tiles (padded rows, per stage), one f32 matrix of epilogue scratch
            // per subgroup.
            return mt.stages * self.tk * (self.tm + self.tn + 2 * mt.pad) * 2
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
        if !mt.pad.is_multiple_of(8) || mt.pad > 64 {
            return bad("pad must be a multiple of 8 halves (16 bytes), at most 64".into());
        }
        if mt.stages != 1 && mt.stages != 2 {
            return bad("stages must be 1 or 2".into());
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
    /// configuration (`None` otherwise): the first of [`ConvTiles::matrix_table`] the device
    /// can run (its workgroup memory and invocation limits decide).
    pub fn matrix_for_layer(caps: &Capabilities, cout: usize, k: usize) -> Option<ConvTiles> {
        Self::matrix_table(caps, cout, k)
            .into_iter()
            .find(|t| t.check(caps).is_ok())
    }

    /// The cooperative-matrix tile sets for a layer, best first (unchecked against the
    /// device's limits): square `size` matrices of the device's configuration, each subgroup
    /// owning `rm` x `rn` of the workgroup's `tm` x `tn` tile; rows padded by 8 halves; two
    /// workgroup-memory stages where the device has the memory, one where it has only the
    /// engine's required 28 KiB. Per-device parameters like the scalar ones:
    /// - 16 (NVIDIA/AMD): 128 x 128 workgroup tiles (64 / 16 channels for small Cout), 64 x 32
    ///   per subgroup (8 accumulators), K steps of 32; two stages need 42 KiB for the wide
    ///   tile (NVIDIA and AMD offer 48 and 64 KiB), one stage 25 KiB.
    /// - 8 (lavapipe, Apple): 32 x 32 tiles, 16 x 16 per subgroup, K steps of 16; lavapipe
    ///   emulates the matrices, so these are sized for compile time and correctness runs.
    ///
    /// Not yet tuned on a GPU: `wgvae bench conv` times these and other candidates.
    pub fn matrix_table(caps: &Capabilities, cout: usize, _k: usize) -> Vec<ConvTiles> {
        let Some(cfg) = caps.matrix() else {
            return Vec::new();
        };
        let lanes = caps.subgroup_max_size.max(1);
        let lanes_min = caps.subgroup_min_size.clamp(1, lanes);
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
        [2, 1]
            .into_iter()
            .map(|stages| ConvTiles {
                tm,
                tn,
                tw: 32,
                tk,
                rm,
                rn,
                direct: false,
                matrix: Some(MatrixTiles {
                    size: s,
                    lanes,
                    lanes_min,
                    pad: 8,
                    stages,
                }),
            })
            .collect()
    }

    /// Candidate tile sets for a layer that the device can run, for `wgvae bench conv` to
    /// time: the table's entries first, then variations of the workgroup tile, the subgroup
    /// block, the K step, the patch width, the row padding and the stages (on a device
    /// without matrices: the scalar default and variations of it). Every candidate computes
    /// the same convolution; only speed differs.
    pub fn candidates(caps: &Capabilities, cout: usize, k: usize) -> Vec<ConvTiles> {
        let mut v: Vec<ConvTiles> = Vec::new();
        let mut push = |t: ConvTiles| {
            if t.check(caps).is_ok() && !v.contains(&t) {
                v.push(t);
            }
        };
        let table = Self::matrix_table(caps, cout, k);
        if table.is_empty() {
            let d = Self::for_layer(caps, cout, k);
            push(d);
            if !d.direct && d.tm >= 64 {
                push(ConvTiles { tk: 16, ..d });
                push(ConvTiles { tn: 64, ..d });
                push(ConvTiles { rm: 4, ..d });
                push(ConvTiles { tm: 64, ..d });
            }
            return v;
        }
        for &t in &table {
            push(t);
        }
        let base = table[0];
        let mt = base.matrix.expect("matrix table entries have matrices");
        let sz = mt.size;
        let with = |pad: u32, stages: u32| Some(MatrixTiles { pad, stages, ..mt });
        // (tm, tn, tk, rm, rn) in matrices of side sz; tm narrows for small Cout like the
        // table's.
        let narrow = (cout.next_power_of_two() as u32).clamp(sz, 8 * sz);
        for (tm, tn, tk, rm, rn, tw, pad, stages) in [
            (8, 8, 2, 4, 2, 32, 0, 2),
            (8, 8, 2, 4, 2, 32, 16, 2),
            (8, 8, 2, 4, 2, 64, 8, 2),
            (8, 8, 4, 4, 2, 32, 8, 1),
            (8, 8, 2, 4, 4, 32, 8, 2),
            (8, 8, 2, 2, 4, 32, 8, 2),
            (8, 16, 2, 4, 4, 64, 8, 1),
            (8, 4, 2, 4, 2, 32, 8, 2),
            (4, 8, 2, 2, 2, 32, 8, 2),
            (4, 8, 4, 2, 2, 32, 8, 2),
        ] {
            let tm = (tm * sz).min(narrow);
            let rm = (rm * sz).min(tm);
            push(ConvTiles {
                tm,
                tn: tn * sz,
                tw: tw.min(tn * sz),
                tk: tk * sz,
                rm,
                rn: rn * sz,
                direct: false,
                matrix: with(pad, stages),
            });
        }
        v
    }

    /// A short name for reports: `128x128x32 r64x32 tw32 p8 s2` (matrices) or
    /// `64x128x8 r8x8 tw32` (scalar; `direct` when read from the buffers).
    pub fn name(&self) -> String {
        let mut s = format!(
            "{}x{}x{} r{}x{} tw{}",
            self.tm, self.tn, self.tk, self.rm, self.rn, self.tw
        );
        if let Some(m) = self.matrix {
            s += &format!(" p{} s{}", m.pad, m.stages);
        } else if self.direct {
            s += " direct";
        }
        s
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
        // NVIDIA's Vulkan limit (AMD offers 64 KiB, lavapipe 64 KiB).
        max_compute_workgroup_storage_size: 48 << 10,
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
/// GPUs and on CPU adapters (every entry of the matrix table: which one a device takes
/// depends on its limits).
pub(super) fn default_tile_sets() -> Vec<ConvTiles> {
    let mut sets = Vec::new();
    for cpu in [false, true] {
        for cout in [3, 8, 64, 512] {
            for k in [1, 3] {
                let t = ConvTiles::for_layer(&typical_caps(cpu), cout, k);
                let m = ConvTiles::matrix_table(&typical_matrix_caps(cpu), cout, k);
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
