//! The cooperative-matrix (tensor-core) variant of the flash attention: entry
//! `attention_coop` (`shaders/attention.wgsl`, section `COOP`; the entry itself is generated
//! here because the accumulators must be named variables). QKᵀ and PV on `S x S` f16
//! matrices with f32 accumulation, the online softmax by invocations in between, the output
//! block in the subgroups' accumulators (rescaled through a per-subgroup scratch matrix).
//!
//! Used for unmasked attention with f32 K/V in f16 models
//! ([`AttentionProblem::f16_operands`]) on devices with a usable configuration, when the
//! head dimension is a multiple of `S` ([`MatrixAttention::for_problem`]); everything else
//! keeps the scalar kernel (f16 operands would change an f32 or bf16 model's precision).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::{AttentionProblem, Params, CPU_LOOP_ITERATION_LIMIT, SOURCE};
use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{Capabilities, KernelSpec, PipelineKey, WgslSource};
use crate::kernels::spec;

/// The cooperative entry's contract (bindings as [`super::ATTENTION`]); the source is
/// generated per [`MatrixAttention`].
const COOP: KernelSpec = spec::<Params>(
    "attention",
    SOURCE,
    "attention_coop",
    &[Read, Read, Read, ReadWrite, ReadWrite],
);

/// One specialisation of the cooperative kernel: `br` queries per workgroup, key tiles of
/// `bc`, QKᵀ / PV staged in chunks of `dc` head channels, the head dimension zero-padded to
/// `dm` (a multiple of `dc`); `(br / size) * (bc / size)` subgroups of `lanes` invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixAttention {
    /// Side of the square matrices (8 or 16).
    pub size: u32,
    /// Subgroup size the workgroup is planned for (the device's largest).
    pub lanes: u32,
    /// The device's smallest subgroup size (extra subgroups repeat planned ones' work and
    /// need their own scratch matrix).
    pub lanes_min: u32,
    /// Queries per workgroup.
    pub br: u32,
    /// Keys per tile.
    pub bc: u32,
    /// Head channels per staged chunk.
    pub dc: u32,
    /// Head dimension padded to a multiple of `dc`.
    pub dm: u32,
}

impl MatrixAttention {
    /// The configuration for head dimension `d` on a device with matrices (`None` without,
    /// or when the device's limits do not hold it), per matrix side:
    /// - 16 (NVIDIA/AMD): 32 queries x 64 keys (8 subgroups), chunks of 64 channels, 24 KiB
    ///   of workgroup memory; d = 512 keeps 8 output matrices per subgroup;
    /// - 8 (lavapipe, Apple): 16 x 32, chunks of 128 channels, 15 KiB (lavapipe emulates
    ///   the matrices: sized for correctness runs).
    pub fn for_head_dim(d: usize, caps: &Capabilities) -> Option<MatrixAttention> {
        let cfg = caps.matrix()?;
        let (br, bc, dc) = match cfg.size {
            8 => (16, 32, 128),
            16 => (32, 64, 64),
            _ => return None,
        };
        let lanes = caps.subgroup_max_size.max(1);
        let lanes_min = caps.subgroup_min_size.clamp(1, lanes);
        let m = Self::with_tiles(cfg.size, lanes, lanes_min, br, bc, dc, d);
        m.check(caps, d).ok().map(|_| m)
    }

    /// The configuration with these tiles for head dimension `d`: chunks of
    /// `min(dc, d rounded up to bc)` channels, `d` padded to a multiple of them.
    pub fn with_tiles(
        size: u32,
        lanes: u32,
        lanes_min: u32,
        br: u32,
        bc: u32,
        dc: u32,
        d: usize,
    ) -> MatrixAttention {
        let d = (d as u32).max(1);
        let dc = dc.min(d.div_ceil(bc) * bc);
        MatrixAttention {
            size,
            lanes,
            lanes_min,
            br,
            bc,
            dc,
            dm: d.div_ceil(dc) * dc,
        }
    }

    /// The cooperative kernel for `prob` on this device, when it applies: the device has a
    /// usable configuration, the model runs in f16 (`prob.f16_operands`), no mask, f32 K/V,
    /// no forced scalar configuration, and a head dimension that is a multiple of `S` and at
    /// most [`super::SINGLE_PASS_HEAD_DIM`].
    pub fn for_problem(
        prob: &AttentionProblem,
        int8: bool,
        caps: &Capabilities,
    ) -> Option<MatrixAttention> {
        let s = caps.matrix()?.size as usize;
        let plain = !prob.mask.causal && prob.mask.frames.is_none();
        if !prob.f16_operands || int8 || !plain || prob.config.is_some() {
            return None;
        }
        // Wide heads would keep d / bc output matrices per subgroup live: the scalar kernel's
        // chunked variant runs them.
        if prob.head_dim == 0
            || !prob.head_dim.is_multiple_of(s)
            || prob.head_dim > super::SINGLE_PASS_HEAD_DIM
        {
            return None;
        }
        Self::for_head_dim(prob.head_dim, caps)
    }

    /// Subgroups the workgroup is planned for.
    pub fn subgroups(&self) -> u32 {
        (self.br / self.size.max(1)) * (self.bc / self.size.max(1))
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        self.subgroups() * self.lanes
    }

    /// Subgroups a workgroup may hold (planned ones times largest / smallest size).
    pub fn max_subgroups(&self) -> u32 {
        self.invocations() / self.lanes_min.max(1)
    }

    /// Output matrices per subgroup.
    pub fn output_tiles(&self) -> u32 {
        self.dm / self.bc.max(1)
    }

    /// f32 elements of the scores / scratch array.
    fn scratch(&self) -> u32 {
        (self.br * self.bc).max(self.max_subgroups() * self.size * self.size)
    }

    /// Bytes of workgroup memory: Q and K/V chunks and P (f16), scores / scratch and the
    /// rows' (m, l, alpha) (f32), a flag.
    pub fn workgroup_bytes(&self) -> u32 {
        2 * (self.br * self.dc + self.dc * self.bc + self.br * self.bc)
            + 4 * (self.scratch() + 3 * self.br + 1)
    }

    /// `8x8x8 f16->f32`.
    pub fn matrix_name(&self) -> String {
        format!("{0}x{0}x{0} f16->f32", self.size)
    }

    /// Checks the shader's divisibility rules, the device and the limits.
    pub fn check(&self, caps: &Capabilities, d: usize) -> Result<()> {
        let bad = |why: String| Err(Error::Unsupported(format!("attention {self:?}: {why}")));
        let s = self.size;
        let Some(cfg) = caps.matrix() else {
            return bad("the device has no usable cooperative-matrix configuration".into());
        };
        if cfg.size != s {
            return bad(format!("the device's cooperative matrices are {cfg}"));
        }
        if !caps.shader_f16 || !caps.subgroup {
            return bad("the cooperative kernel needs shader-f16 and subgroups".into());
        }
        if s == 0
            || !self.br.is_multiple_of(s)
            || !self.bc.is_multiple_of(s)
            || self.br == 0
            || self.bc == 0
            || !self.br.is_multiple_of(4)
            || !self.bc.is_multiple_of(4)
            || self.dc == 0
            || !self.dc.is_multiple_of(self.bc)
            || !self.dm.is_multiple_of(self.dc)
            || (self.dm as usize) < d
        {
            return bad(format!(
                "br and bc must be multiples of {s} and 4, dc of bc, dm >= d = {d} of dc"
            ));
        }
        if self.lanes_min == 0 || !self.lanes.is_multiple_of(self.lanes_min) {
            return bad(
                "subgroup sizes must be positive, the largest a multiple of the smallest".into(),
            );
        }
        if self.invocations() > caps.max_compute_invocations_per_workgroup {
            return bad(format!(
                "{} invocations; the device allows {}",
                self.invocations(),
                caps.max_compute_invocations_per_workgroup
            ));
        }
        if self.workgroup_bytes() > caps.max_compute_workgroup_storage_size {
            return bad(format!(
                "{} bytes of workgroup memory; the device allows {}",
                self.workgroup_bytes(),
                caps.max_compute_workgroup_storage_size
            ));
        }
        Ok(())
    }

    /// Keys one dispatch may process on a device (see [`super::keys_per_dispatch`]):
    /// `None` on GPUs; on CPU adapters as many tiles as keep a conservative count of the
    /// kernel's loop iterations under 90 % of [`CPU_LOOP_ITERATION_LIMIT`].
    pub fn keys_per_dispatch(&self, caps: &Capabilities) -> Option<usize> {
        if !caps.is_cpu() {
            return None;
        }
        let wg = self.invocations().max(1) as usize;
        let chunks = (self.dm / self.dc.max(1)) as usize;
        let (br, bc, dc) = (self.br as usize, self.bc as usize, self.dc as usize);
        let lane_loop = ((self.size * self.size) as usize).div_ceil(self.lanes_min.max(1) as usize);
        let tiles = self.output_tiles() as usize;
        let stage_q = (br * dc / 4).div_ceil(wg) + 1;
        let stage_kv = (bc * dc / 4).div_ceil(wg) + 1;
        let softmax = br.div_ceil(wg) * (2 + 2 * bc / 4) + 1;
        let per_tile = 1 + chunks * (1 + stage_q + 2 * stage_kv) + softmax + tiles * lane_loop;
        let fixed = 2 * tiles * lane_loop + 2 * (br.div_ceil(wg) + 1) + 64;
        let n = (CPU_LOOP_ITERATION_LIMIT * 9 / 10 - fixed) / per_tile;
        Some(n.max(1) * bc)
    }

    pub(super) fn spec(&self) -> KernelSpec {
        KernelSpec {
            source: WgslSource::Generated(source(*self)),
            ..COOP
        }
    }

    pub(super) fn key(&self) -> PipelineKey {
        PipelineKey::new(&self.spec())
            .flag("ATTENTION")
            .flag("COOP")
            .flag("F16")
            .constant("S", format!("{}u", self.size))
            .constant("LANES", format!("{}u", self.lanes))
            .constant("MAX_SUBGROUPS", format!("{}u", self.max_subgroups()))
            .constant("BR", format!("{}u", self.br))
            .constant("BC", format!("{}u", self.bc))
            .constant("DC", format!("{}u", self.dc))
            .constant("DM", format!("{}u", self.dm))
            .constant("SCR", format!("{}u", self.scratch()))
    }
}

/// The shader with the generated entry for `m` appended (once per process per variant).
fn source(m: MatrixAttention) -> Arc<str> {
    static SOURCES: OnceLock<Mutex<HashMap<MatrixAttention, Arc<str>>>> = OnceLock::new();
    let mut map = SOURCES.get_or_init(Default::default).lock();
    map.entry(m)
        .or_insert_with(|| Arc::from(format!("{SOURCE}{}", entry_source(&m))))
        .clone()
}

/// The generated entry `attention_coop`: the score accumulator, the subgroup's output
/// matrices `o{t}` (columns `(cj + t CS) S ..`) and the unrolled chunks of QKᵀ and PV.
fn entry_source(m: &MatrixAttention) -> String {
    use std::fmt::Write;
    let sz = m.size;
    let nt = m.output_tiles();
    let per_chunk = m.dc / m.bc;
    let chunks = m.dm / m.dc;
    let kq = m.dc / sz;
    let kp = m.bc / sz;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n#ifdef COOP\n// Generated by kernels/attention/matrix.rs: {nt} output matrices of {sz} x {sz} per subgroup."
    );
    crate::kernels::coop::aliases(sz, &mut s);
    s.push_str(
        "
@compute @workgroup_size(WG)
fn attention_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
                  @builtin(subgroup_id) sgid: u32, @builtin(subgroup_invocation_id) lane: u32,
                  @builtin(subgroup_size) lanes: u32) {
    let b = wg.y / p.heads;
    let h = wg.y % p.heads;
    let q_base = b * p.q_sb + h * p.q_sh;
    let kv_base = b * p.kv_sb + h * p.kv_sh;
    let i0 = wg.x * BR;
    // This subgroup's blocks (extra subgroups repeat one: see the COOP section).
    let sg = sgid % NSUB;
    let r0 = (sg / CS) * S;
    let cj = sg % CS;
    let cb = sgid * SS;
    let resume = (p.phase & 1u) == 0u;
    let last = (p.phase & 2u) != 0u;
    coop_init_stats(li, wg.y, i0, resume);
",
    );
    for t in 0..nt {
        let _ = writeln!(s, "    var o{t}: CC;");
    }
    s.push_str("    if resume {\n");
    for t in 0..nt {
        let _ = writeln!(
            s,
            "        coop_read_out(cb, lane, lanes, q_base, i0 + r0, (cj + {t}u * CS) * S);
        workgroupBarrier();
        o{t} = coopLoadT<CC>(&sc[cb], S);
        workgroupBarrier();"
        );
    }
    s.push_str(
        "    }
    workgroupBarrier();
    for (var j0 = p.kv_begin; j0 < p.kv_end; j0 += BC) {
        // 1. S = Q K^T over the head dimension, chunk by chunk.
        var s_acc: CC;
        for (var c0 = 0u; c0 < DM; c0 += DC) {
            coop_stage_q(li, q_base, i0, c0);
            coop_stage_kv(li, 0u, kv_base, j0, p.kv_end, c0);
            workgroupBarrier();
",
    );
    for kk in 0..kq {
        let _ = writeln!(
            s,
            "            s_acc = coopMultiplyAdd(coopLoad<CA>(&q_sh[{0}u * BR + r0], BR), coopLoadT<CB>(&kv_sh[{0}u * BC + cj * S], BC), s_acc);",
            kk * sz
        );
    }
    s.push_str(
        "            workgroupBarrier();
        }
        if li == 0u {
            moved.x = 0u;
        }
        coopStoreT(s_acc, &sc[r0 * BC + cj * S], BC);
        workgroupBarrier();
        // 2. Online softmax, P as f16.
        coop_softmax(li, j0, p.kv_end);
        // 3. O = alpha O through the scratch, when some row's max moved.
        if workgroupUniformLoad(&moved).x != 0u {
",
    );
    for t in 0..nt {
        let _ = writeln!(
            s,
            "            coopStoreT(o{t}, &sc[cb], S);
            workgroupBarrier();
            coop_scale_rows(cb, lane, lanes, r0);
            workgroupBarrier();
            o{t} = coopLoadT<CC>(&sc[cb], S);
            workgroupBarrier();"
        );
    }
    s.push_str("        }\n        // 4. O += P V, V chunk by chunk.\n");
    for kk in 0..kp {
        let _ = writeln!(
            s,
            "        let p{kk} = coopLoadT<CA>(&p_sh[r0 * BC + {}u], BC);",
            kk * sz
        );
    }
    for ch in 0..chunks {
        let _ = writeln!(
            s,
            "        coop_stage_kv(li, 1u, kv_base, j0, p.kv_end, {}u);\n        workgroupBarrier();",
            ch * m.dc
        );
        for u in 0..per_chunk {
            let t = ch * per_chunk + u;
            for kk in 0..kp {
                let _ = writeln!(
                    s,
                    "        o{t} = coopMultiplyAdd(p{kk}, coopLoad<CB>(&kv_sh[(cj + {u}u * CS) * S * BC + {}u], BC), o{t});",
                    kk * sz
                );
            }
        }
        s.push_str("        workgroupBarrier();\n");
    }
    s.push_str("    }\n    // The output (normalised on the last share) and, before a later share, (m, l).\n");
    for t in 0..nt {
        let _ = writeln!(
            s,
            "    coopStoreT(o{t}, &sc[cb], S);
    workgroupBarrier();
    coop_write_out(cb, lane, lanes, q_base, i0, r0, (cj + {t}u * CS) * S, last);
    workgroupBarrier();"
        );
    }
    s.push_str(
        "    if !last {
        coop_save_stats(li, wg.y, i0);
    }
}
#endif
",
    );
    s
}

/// The cooperative variants the engine may compile: per matrix side (8 with 8 lanes, 16
/// with 32), the mid-block's and Wan's head dimensions and small ones the tests use.
pub(super) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for (size, lanes, br, bc, dc, dims) in [
        (8, 8, 16, 32, 128, &[64usize, 96, 384, 512][..]),
        (16, 32, 32, 64, 64, &[64, 96, 384, 512][..]),
    ] {
        for &d in dims {
            let m = MatrixAttention::with_tiles(size, lanes, lanes, br, bc, dc, d);
            v.push((m.spec(), m.key()));
        }
    }
    v
}
