//! The cooperative-matrix (tensor-core) variant of the batched GEMM: its tiles per device
//! and the generated entry point `matmul_coop` (the static part is the `COOP` section of
//! `shaders/matmul.wgsl`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::{MatmulOptions, Params, SOURCE};
use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{Capabilities, KernelSpec, PipelineKey, WgslSource};
use crate::kernels::spec;

/// The engine's ceilings for any kernel (`gpu::requirements`): a device created with
/// `required_limits()` may offer no more.
const MAX_INVOCATIONS: u32 = 256;
const MAX_WORKGROUP_BYTES: u32 = 28672;

/// Tile shape of the cooperative-matrix GEMM: a workgroup computes a `tm` x `tn` tile of the
/// output with `(tm / rm) * (tn / rn)` subgroups of `lanes` invocations, each owning an
/// `rm` x `rn` block of `size` x `size` f32 accumulators; `tk` deep f16 slices of op(a) and
/// op(bm) are staged in workgroup memory per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTiles {
    /// Output rows per workgroup.
    pub tm: u32,
    /// Output columns per workgroup.
    pub tn: u32,
    /// K depth per workgroup-memory stage (a multiple of `size`).
    pub tk: u32,
    /// Output rows per subgroup (a multiple of `size` dividing `tm`).
    pub rm: u32,
    /// Output columns per subgroup (a multiple of `size` dividing `tn`).
    pub rn: u32,
    /// Side of the square matrices (8: lavapipe, Apple; 16: NVIDIA, AMD).
    pub size: u32,
    /// Subgroup size the workgroup is planned for (the device's largest).
    pub lanes: u32,
    /// The device's smallest subgroup size: smaller subgroups than `lanes` mean more of
    /// them, which repeat the planned ones' blocks and need their own epilogue scratch.
    pub lanes_min: u32,
}

impl CoopTiles {
    /// Subgroups the workgroup is planned for.
    pub fn subgroups(&self) -> u32 {
        (self.tm / self.rm.max(1)) * (self.tn / self.rn.max(1))
    }

    /// Invocations per workgroup.
    pub fn workgroup_size(&self) -> u32 {
        self.subgroups() * self.lanes
    }

    /// Subgroups a workgroup may hold (their epilogue scratch).
    pub fn max_subgroups(&self) -> u32 {
        self.workgroup_size() / self.lanes_min.max(1)
    }

    /// Bytes of workgroup memory: f16 operand tiles, one f32 matrix per subgroup.
    pub fn shared_bytes(&self) -> u32 {
        self.tk * (self.tm + self.tn) * 2 + self.max_subgroups() * self.size * self.size * 4
    }

    /// `8x8x8 f16->f32` (reports).
    pub fn matrix_name(&self) -> String {
        format!("{0}x{0}x{0} f16->f32", self.size)
    }

    /// The shape rules of the generated shader, without a device.
    fn check_shape(&self) -> std::result::Result<(), String> {
        let s = self.size;
        if s != 8 && s != 16 {
            return Err(format!("matrix side {s}: 8 or 16"));
        }
        for (name, v) in [("rm", self.rm), ("rn", self.rn), ("tk", self.tk)] {
            if v == 0 || v % s != 0 {
                return Err(format!("{name} must be a positive multiple of {s}"));
            }
        }
        if !self.tm.is_multiple_of(self.rm) || !self.tn.is_multiple_of(self.rn) {
            return Err("tm must be a multiple of rm and tn of rn".into());
        }
        if self.lanes_min == 0 || !self.lanes.is_multiple_of(self.lanes_min) {
            return Err(
                "subgroup sizes must be positive, the largest a multiple of the smallest".into(),
            );
        }
        if self.workgroup_size() > MAX_INVOCATIONS {
            return Err(format!(
                "{} invocations (at most {MAX_INVOCATIONS})",
                self.workgroup_size()
            ));
        }
        if self.shared_bytes() > MAX_WORKGROUP_BYTES {
            return Err(format!(
                "{} B of workgroup memory (at most {MAX_WORKGROUP_BYTES})",
                self.shared_bytes()
            ));
        }
        Ok(())
    }

    /// Checks the tiles against the shader's rules and the device.
    pub fn check(&self, caps: &Capabilities) -> Result<()> {
        let bad = |why: String| Err(Error::Unsupported(format!("matmul tiles {self:?}: {why}")));
        let Some(cfg) = caps.matrix() else {
            return bad(no_matrices(caps));
        };
        if cfg.size != self.size {
            return bad(format!("the device's cooperative matrices are {cfg}"));
        }
        if !caps.shader_f16 || !caps.subgroup {
            return bad("cooperative matrices need shader-f16 and subgroups".into());
        }
        if let Err(why) = self.check_shape() {
            return bad(why);
        }
        if self.workgroup_size() > caps.max_compute_invocations_per_workgroup {
            return bad("workgroup larger than the device allows".into());
        }
        if self.shared_bytes() > caps.max_compute_workgroup_storage_size {
            return bad("tiles exceed the device's workgroup memory".into());
        }
        Ok(())
    }

    /// The tiles for matrices of side `size` and subgroups of `lanes_min..=lanes`: the first
    /// candidate within the engine's limits (256 invocations, 28 KiB), largest first.
    /// - 16 (NVIDIA/AMD): 128 x 128 workgroup tiles, 64 x 32 per subgroup (8 accumulators),
    ///   K steps of 32: 8 subgroups of 32, 24 KiB; narrower where subgroups are wider or
    ///   smaller ones would need more scratch.
    /// - 8 (lavapipe, Apple): 32 x 32 tiles, 16 x 16 per subgroup (4 accumulators), K steps
    ///   of 16; lavapipe emulates the matrices, so these are sized for compile time and
    ///   correctness runs.
    pub fn pick(size: u32, lanes: u32, lanes_min: u32) -> Option<CoopTiles> {
        let lanes = lanes.max(1);
        let lanes_min = lanes_min.clamp(1, lanes);
        let candidates: &[(u32, u32, u32, u32, u32)] = if size >= 16 {
            &[
                (128, 128, 32, 64, 32),
                (128, 64, 32, 64, 32),
                (64, 64, 32, 32, 32),
                (32, 32, 32, 32, 32),
                (16, 16, 16, 16, 16),
            ]
        } else {
            &[(32, 32, 16, 16, 16), (16, 16, 16, 16, 16), (8, 8, 8, 8, 8)]
        };
        candidates.iter().find_map(|&(tm, tn, tk, rm, rn)| {
            let t = CoopTiles {
                tm,
                tn,
                tk,
                rm,
                rn,
                size,
                lanes,
                lanes_min,
            };
            t.check_shape().is_ok().then_some(t)
        })
    }

    /// The device's tiles, or [`Error::Unsupported`] naming why it has none (no usable
    /// cooperative-matrix configuration, or none within its limits).
    pub fn for_device(caps: &Capabilities) -> Result<CoopTiles> {
        let Some(cfg) = caps.matrix() else {
            return Err(Error::Unsupported(format!(
                "matmul with f16 operands (MatmulPrecision::F16Operands): {}; use MatmulPrecision::F16OperandsOrF32 to fall back to the f32 kernel",
                no_matrices(caps)
            )));
        };
        let t = CoopTiles::pick(cfg.size, caps.subgroup_max_size, caps.subgroup_min_size)
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "matmul with f16 operands: no {cfg} tiles fit subgroups of {}..{} lanes in 256 invocations and 28 KiB",
                    caps.subgroup_min_size, caps.subgroup_max_size
                ))
            })?;
        t.check(caps)?;
        Ok(t)
    }

    /// The kernel spec (generated source) with or without a bias binding.
    pub(super) fn spec(&self, bias: bool) -> KernelSpec {
        let base = if bias { COOP_BIAS } else { COOP };
        KernelSpec {
            source: WgslSource::Generated(source(*self)),
            ..base
        }
    }

    /// The pipeline key: every tile parameter the generated source depends on is a constant.
    pub(super) fn key(&self, opts: &MatmulOptions, bias: bool) -> PipelineKey {
        PipelineKey::new(&self.spec(bias))
            .flag("COOP")
            .flag("F16")
            .flag_if(opts.trans_a, "TRANS_A")
            .flag_if(opts.trans_b, "TRANS_B")
            .flag_if(bias, "BIAS")
            .constant("TM", format!("{}u", self.tm))
            .constant("TN", format!("{}u", self.tn))
            .constant("TK", format!("{}u", self.tk))
            .constant("RM", format!("{}u", self.rm))
            .constant("RN", format!("{}u", self.rn))
            .constant("S", format!("{}u", self.size))
            .constant("LANES", format!("{}u", self.lanes))
            .constant("MAX_SUBGROUPS", format!("{}u", self.max_subgroups()))
    }
}

fn no_matrices(caps: &Capabilities) -> String {
    format!(
        "`{}` has no usable cooperative-matrix configuration (square 8x8x8 or 16x16x16 f16->f32 with shader-f16 and subgroups; its list: {:?}; see ContextOptions::cooperative_matrix)",
        caps.adapter_name,
        caps.matrix_configs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
    )
}

/// `out = alpha · A · B` on cooperative matrices (entry generated per tile shape).
const COOP: KernelSpec = spec::<Params>("matmul", SOURCE, "matmul_coop", &[Read, Read, ReadWrite]);
/// `out = alpha · A · B + bias` on cooperative matrices.
const COOP_BIAS: KernelSpec = spec::<Params>(
    "matmul",
    SOURCE,
    "matmul_coop",
    &[Read, Read, Read, ReadWrite],
);

/// The shader with the generated entry point for these tiles appended (once per process per
/// tile shape).
fn source(tiles: CoopTiles) -> Arc<str> {
    static SOURCES: OnceLock<Mutex<HashMap<CoopTiles, Arc<str>>>> = OnceLock::new();
    let mut map = SOURCES.get_or_init(Default::default).lock();
    map.entry(tiles)
        .or_insert_with(|| Arc::from(format!("{SOURCE}{}", kernel_source(&tiles))))
        .clone()
}

/// The generated entry point: accumulators `c{i}_{j}` of the subgroup's `rm / S` x `rn / S`
/// block as named variables (WGSL has no arrays of cooperative matrices), the K loop over
/// the staged tiles unrolled by `tk / S`, and the epilogue through the subgroup's scratch
/// matrix. The operand loads follow the staged layouts (`#ifdef TRANS_A` / `TRANS_B`: the
/// preprocessor runs over the whole source); in naga a plain `coopLoad` is column-major
/// with the given stride, `coopLoadT` / `coopStoreT` row-major.
fn kernel_source(t: &CoopTiles) -> String {
    use std::fmt::Write;
    let sz = t.size;
    let block = crate::kernels::coop::Block {
        size: sz,
        mi: t.rm / sz,
        nj: t.rn / sz,
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n// Generated by kernels/matmul/coop.rs: {} x {} cooperative {sz} x {sz} matrices per subgroup.",
        block.mi, block.nj
    );
    block.aliases(&mut s);
    s.push_str(
        "
@compute @workgroup_size(WG)
fn matmul_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
               @builtin(subgroup_id) sgid: u32, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) lanes: u32) {
    let row0 = wg.y * TM;
    let col0 = wg.x * TN;
    let a_base = wg.z * p.a_batch_stride;
    let b_base = wg.z * p.b_batch_stride;
    let out_base = wg.z * p.out_batch_stride;
    // This subgroup's block of the tile (extra subgroups repeat one: see matmul.wgsl).
    let sg = sgid % NSUB;
    let sm = (sg / (TN / RN)) * RM;
    let sn = (sg % (TN / RN)) * RN;
    let cb = sgid * SS;
",
    );
    block.accumulators(&mut s);
    s.push_str(
        "    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        coop_stage(li, k0, row0, col0, a_base, b_base);
        workgroupBarrier();
",
    );
    for kk in 0..t.tk / sz {
        block.step(
            &mut s,
            kk,
            |kk, i| {
                let (k, m) = (kk * sz, i * sz);
                format!(
                    "#ifdef TRANS_A
        let a{kk}_{i} = coopLoad<CA>(&a_sh[{k}u * TM + sm + {m}u], TM);
#else
        let a{kk}_{i} = coopLoadT<CA>(&a_sh[(sm + {m}u) * TK + {k}u], TK);
#endif"
                )
            },
            |kk, j| {
                let (k, n) = (kk * sz, j * sz);
                format!(
                    "#ifdef TRANS_B
        let b{kk}_{j} = coopLoad<CB>(&b_sh[(sn + {n}u) * TK + {k}u], TK);
#else
        let b{kk}_{j} = coopLoadT<CB>(&b_sh[{k}u * TN + sn + {n}u], TN);
#endif"
                )
            },
        );
    }
    s.push_str("        workgroupBarrier();\n    }\n");
    block.epilogue(&mut s, |i, j| {
        format!(
            "coop_store(cb, lane, lanes, out_base, row0 + sm + {}u, col0 + sn + {}u)",
            i * sz,
            j * sz
        )
    });
    s.push_str("}\n");
    s
}

/// The cooperative variants the engine may request: 8 x 8 matrices on subgroups of 8
/// (lavapipe) and 16 x 16 on subgroups of 32 (NVIDIA), every transpose and bias.
pub(super) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for (size, lanes) in [(8, 8), (16, 32)] {
        let tiles = CoopTiles::pick(size, lanes, lanes).expect("default cooperative tiles");
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for bias in [false, true] {
                    let opts = MatmulOptions {
                        trans_a,
                        trans_b,
                        ..Default::default()
                    };
                    v.push((tiles.spec(bias), tiles.key(&opts, bias)));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The picks fit the engine's limits, and the generated source names every accumulator.
    #[test]
    fn default_tiles_fit_and_generate() {
        let t16 = CoopTiles::pick(16, 32, 32).unwrap();
        assert_eq!(
            (t16.tm, t16.tn, t16.tk, t16.rm, t16.rn),
            (128, 128, 32, 64, 32)
        );
        assert_eq!(t16.workgroup_size(), 256);
        assert_eq!(t16.shared_bytes(), 24576);
        let t8 = CoopTiles::pick(8, 8, 8).unwrap();
        assert_eq!((t8.tm, t8.tn, t8.tk, t8.rm, t8.rn), (32, 32, 16, 16, 16));
        assert_eq!(t8.subgroups(), 4);
        // Wave64 or subgroups of 8..32: smaller tiles, still within the limits.
        for (lanes, min) in [(64, 64), (32, 8), (64, 4)] {
            let t = CoopTiles::pick(16, lanes, min).unwrap();
            assert!(
                t.workgroup_size() <= 256 && t.shared_bytes() <= 28672,
                "{t:?}"
            );
        }
        let src = kernel_source(&t16);
        assert!(
            src.contains("var c3_1: CC;") && !src.contains("c4_"),
            "{src}"
        );
        assert!(src.contains("coopMultiplyAdd(a1_3, b1_1, c3_1)"));
    }

    /// Without a usable configuration the error names the reason.
    #[test]
    fn no_matrices_is_unsupported() {
        let caps = Capabilities::reference_gpu();
        match CoopTiles::for_device(&caps) {
            Err(Error::Unsupported(m)) => {
                assert!(
                    m.contains("no usable cooperative-matrix configuration"),
                    "{m}"
                )
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        let mut caps = caps;
        caps.cooperative_matrix = Some(crate::gpu::MatrixConfig::F16_F32_16);
        let t = CoopTiles::for_device(&caps).unwrap();
        assert_eq!(t.size, 16);
    }
}
