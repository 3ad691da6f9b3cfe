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
}

impl ConvTiles {
    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        (self.tm / self.rm.max(1)) * (self.tn / self.rn.max(1))
    }

    /// Bytes of workgroup memory the tiles use.
    pub fn shared_bytes(&self) -> u32 {
        if self.direct {
            0
        } else {
            self.tk * (self.tm + self.tn) * 4
        }
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
        } = *self;
        let bad = |why: &str| Err(Error::Unsupported(format!("conv2d tiles {self:?}: {why}")));
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
        max_storage_buffer_binding_size: 1 << 27,
        max_buffer_size: 1 << 30,
        max_compute_workgroup_storage_size: 32 << 10,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroups_per_dimension: 65535,
        max_storage_buffers_per_shader_stage: 8,
        min_storage_buffer_offset_alignment: 256,
        min_uniform_buffer_offset_alignment: 256,
        max_uniform_buffer_binding_size: 1 << 16,
    }
}

/// Every tile set [`ConvTiles::for_layer`] picks, on GPUs and on CPU adapters.
pub(super) fn default_tile_sets() -> Vec<ConvTiles> {
    let mut sets = Vec::new();
    for cpu in [false, true] {
        for cout in [3, 64, 512] {
            for k in [1, 3] {
                let t = ConvTiles::for_layer(&typical_caps(cpu), cout, k);
                if !sets.contains(&t) {
                    sets.push(t);
                }
            }
        }
    }
    sets
}
