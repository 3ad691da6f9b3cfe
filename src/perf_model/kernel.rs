//! A kernel-level estimate of the cooperative-matrix (tensor-core) conv: what one workgroup's
//! K step costs an SM in matrix cycles, shared-memory wavefronts, issue slots and exposed
//! load latency, for a given kernel design (padded rows or not, one or two stages, pipelined
//! loads or not, the subgroup block). **A model, not a measurement**, like the roofline in
//! the parent module, but one that can rank kernel designs: the roofline cannot (it charges
//! every design the same FLOPs and bytes).
//!
//! # The terms, per workgroup K step (`bm × bn × bk`)
//! - **matrix**: `2·bm·bn·bk` FLOPs at the SM's dense f16 rate.
//! - **fragment loads**: each subgroup loads `sub_m/16 + sub_n/16` 16×16 f16 fragments
//!   (512 B) per 16-deep slice; at 128 B per wavefront that is 4 wavefronts a fragment, times
//!   [`UNPADDED_CONFLICT`] when the staged rows are not padded (rows 256 B apart: the 8 rows
//!   of a fragment phase hit the same banks).
//! - **staging stores**: `bk·(bm + bn)` halves written as 2-byte stores, 4 per staged vec4,
//!   32 lanes 8 bytes apart: 2 wavefronts per store instruction ([`STORE_WAVEFRONTS`] per warp
//!   and vec4), 4× what 8-byte stores would take.
//! - **issue**: warp instructions of the staging (index arithmetic, bounds, conversions; the
//!   GroupNorm prologue's affine + SiLU per input value) at 4 per cycle per SM.
//! - **latency**: a global load's latency ([`SmRates::load_latency_clk`]) and the barriers.
//!   Not pipelined: each step stages, waits for its loads, then multiplies. Pipelined: the
//!   next step's loads are in flight during the products (`max(latency, products)`).
//!
//! The SM runs its `w` resident workgroups (the roofline's occupancy) interleaved: a step
//! costs `max(resource-bound, latency-bound / w)` where the resource bound is the largest of
//! the matrix cycles, the wavefronts (fragments + stores: one per cycle) and the issue cycles,
//! and the latency bound is one workgroup's step alone. Waves as in the roofline (a partial
//! last wave runs its fewer workgroups at the same per-step bounds). The epilogue (per
//! accumulator: a scratch trip between two barriers) is added per workgroup.
//!
//! The rates are the published H100 SXM figures (see [`SmRates::h100_sxm`]); the load
//! latency and the instruction counts are estimates, stated where they are defined.

use serde::Serialize;

use super::{
    ceil_div, occupancy, GpuSpec, Layer, LayerKind, Occupancy, PathKind, Tile, Tiles, Work,
};

/// Fragment-load wavefronts of an unpadded layout over a padded one: a 16×16 f16 fragment is
/// read in 8-row phases, and rows `tm` or `tn` halves apart (256 B for 128-wide tiles) start
/// in the same bank.
pub const UNPADDED_CONFLICT: f64 = 8.0;
/// Wavefronts per warp and staged vec4: 4 two-byte stores, 32 lanes 8 bytes apart (256 B,
/// 2 wavefronts each).
pub const STORE_WAVEFRONTS: f64 = 8.0;
/// Warp instructions per staged weight vec4 (index, load, conversion), per lane.
pub const A_ALU: f64 = 6.0;
/// Warp instructions per staged input vec4 without a prologue: the im2col index arithmetic
/// (a multiply-shift division by k², the tap, 4 column bounds and selects), 4 loads, the
/// conversion, per lane.
pub const B_ALU: f64 = 24.0;
/// Extra instructions per input vec4 with the GroupNorm prologue: per value a fused
/// multiply-add, `exp` (2), an add, a reciprocal (2) and a multiply for SiLU, and the affine's
/// load.
pub const PROLOGUE_ALU: f64 = 28.0;

/// Per-SM rates of a GPU for the kernel estimate.
#[derive(Clone, Debug, Serialize)]
pub struct SmRates {
    /// Clock the peaks are quoted at, Hz.
    pub clock_hz: f64,
    /// Dense f16 matrix FLOPs per cycle per SM.
    pub mma_flops_per_clk: f64,
    /// Shared-memory bytes per cycle per SM (one 128-byte wavefront).
    pub smem_bytes_per_clk: f64,
    /// Warp instructions issued per cycle per SM.
    pub issue_per_clk: f64,
    /// A global load's latency under load, cycles (an estimate).
    pub load_latency_clk: f64,
    /// A workgroup barrier, cycles (an estimate).
    pub barrier_clk: f64,
}

impl SmRates {
    /// H100 SXM: 989.4 TFLOP/s dense f16 over 132 SMs at 1.83 GHz = 4096 FLOP per cycle per
    /// SM; 32 banks × 4 bytes of shared memory per cycle; 4 schedulers issuing one warp
    /// instruction a cycle each (the H100 whitepaper). The load latency is an estimate: about
    /// 600 cycles for a load that misses L1 under a full machine's traffic (published
    /// microbenchmarks put an idle L2 hit near 260 cycles and DRAM above 500); a barrier of
    /// 8 warps about 30 cycles.
    pub fn h100_sxm() -> Self {
        SmRates {
            clock_hz: 1.83e9,
            mma_flops_per_clk: 989.4e12 / 132.0 / 1.83e9,
            smem_bytes_per_clk: 128.0,
            issue_per_clk: 4.0,
            load_latency_clk: 600.0,
            barrier_clk: 30.0,
        }
    }
}

/// A cooperative conv kernel's design: what the estimate charges differently.
#[derive(Clone, Debug, Serialize)]
pub struct ConvDesign {
    /// A short name for tables.
    pub name: &'static str,
    /// Staged rows padded (conflict-free fragment loads).
    pub padded: bool,
    /// Workgroup-memory stages (2: one barrier per K step).
    pub stages: usize,
    /// The next K step's loads in flight during the current step's products.
    pub pipelined: bool,
    /// The subgroup's block of C (`None`: the tiles' `sub_m × sub_n`).
    pub subgroup: Option<(usize, usize)>,
}

impl ConvDesign {
    /// The kernel the H100 measured on 2026-11-27: unpadded rows, one stage, two barriers per
    /// K step, the next step loaded after the products.
    pub fn unpadded_single_stage() -> Self {
        ConvDesign {
            name: "unpadded, 1 stage (2026-11-27)",
            padded: false,
            stages: 1,
            pipelined: false,
            subgroup: None,
        }
    }

    /// The rebuilt kernel: rows padded by 8 halves, loads of the next step in flight during
    /// the products, two stages.
    pub fn padded_pipelined() -> Self {
        ConvDesign {
            name: "padded, pipelined, 2 stages",
            padded: true,
            stages: 2,
            pipelined: true,
            subgroup: None,
        }
    }

    /// [`ConvDesign::padded_pipelined`] with 64 × 64 per subgroup (a bench candidate).
    pub fn padded_pipelined_64x64() -> Self {
        ConvDesign {
            name: "padded, pipelined, 2 stages, 64x64 per subgroup",
            subgroup: Some((64, 64)),
            ..Self::padded_pipelined()
        }
    }

    /// The designs the report compares.
    pub fn all() -> Vec<ConvDesign> {
        vec![
            Self::unpadded_single_stage(),
            ConvDesign {
                name: "padded, 1 stage",
                padded: true,
                ..Self::unpadded_single_stage()
            },
            Self::padded_pipelined(),
            Self::padded_pipelined_64x64(),
        ]
    }
}

/// The estimate for one conv layer.
#[derive(Clone, Debug, Serialize)]
pub struct KernelEstimate {
    /// The workgroup tile (its shared memory with the design's stages and padding).
    pub tile: Tile,
    /// Resident workgroups per SM.
    pub occupancy: Occupancy,
    /// K steps per workgroup.
    pub k_steps: usize,
    /// Workgroups dispatched.
    pub workgroups: u64,
    /// Per K step, cycles: matrix products.
    pub mma_clk: f64,
    /// Per K step, cycles: fragment-load wavefronts.
    pub fragment_clk: f64,
    /// Per K step, cycles: staging-store wavefronts.
    pub store_clk: f64,
    /// Per K step, cycles: issue slots of the staging.
    pub issue_clk: f64,
    /// Per K step, cycles: one workgroup's step alone (latency and barriers included).
    pub alone_clk: f64,
    /// What bounds a step with the SM full: `matrix`, `smem`, `issue` or `latency`.
    pub limiter: &'static str,
    /// Estimated time, seconds.
    pub time_s: f64,
}

/// The estimate for `layer` (a conv-like GEMM; `None` for attention's products, passes and
/// tiles that do not fit) on `gpu` with `rates`, the matrix path's `tiles` and `design`.
pub fn estimate(
    layer: &Layer,
    gpu: &GpuSpec,
    rates: &SmRates,
    tiles: &Tiles,
    design: &ConvDesign,
) -> Option<KernelEstimate> {
    let Work::Gemm(g) = &layer.work else {
        return None;
    };
    if matches!(layer.kind, LayerKind::AttnQk | LayerKind::AttnPv) {
        return None;
    }
    let mt = &tiles.matrix;
    let mut tile = tiles.pick(PathKind::Matrix, g.m());
    let (sub_m, sub_n) = design.subgroup.unwrap_or((mt.sub_m, mt.sub_n));
    let (sub_m, sub_n) = (sub_m.min(tile.bm), sub_n.min(tile.bn));
    let subgroups = ((tile.bm / sub_m) * (tile.bn / sub_n)).max(1);
    let pad = if design.padded { 8 } else { 0 };
    tile.invocations = subgroups * mt.subgroup;
    tile.smem = design.stages * tile.bk * (tile.bm + tile.bn + 2 * pad) * 2
        + subgroups * mt.mma * mt.mma * 4;
    // Registers: accumulators and fragments for this block; the pipelined prefetch holds a
    // staged share's raw values (an input vec4: 4 values, 4 flags, the affine; a weight vec4:
    // 2 registers).
    let acc = sub_m * sub_n / mt.subgroup;
    let frags = (sub_m / mt.mma + sub_n / mt.mma) * (mt.mma * mt.mma * 2 / 4).div_ceil(mt.subgroup);
    let vec4s_a = (tile.bk * tile.bm / 4).div_ceil(tile.invocations);
    let vec4s_b = (tile.bk * tile.bn / 4).div_ceil(tile.invocations);
    let staging = if design.pipelined {
        vec4s_a * 2 + vec4s_b * 10
    } else {
        (vec4s_a + vec4s_b) * 2
    };
    tile.regs = (acc + frags + staging + tiles.reg_overhead).div_ceil(8) * 8;
    tile.regs = tile.regs.min(255);
    let occ = occupancy(gpu, &tile);
    if occ.wg_per_sm == 0 {
        return None;
    }
    let w = occ.wg_per_sm as f64;
    let (bm, bn, bk) = (tile.bm as f64, tile.bn as f64, tile.bk as f64);
    let mma_clk = 2.0 * bm * bn * bk / rates.mma_flops_per_clk;
    let fragments =
        subgroups as f64 * (sub_m / mt.mma + sub_n / mt.mma) as f64 * bk / mt.mma as f64;
    let frag_bytes = (mt.mma * mt.mma * 2) as f64;
    let conflict = if design.padded {
        1.0
    } else {
        UNPADDED_CONFLICT
    };
    let fragment_clk = fragments * frag_bytes / rates.smem_bytes_per_clk * conflict;
    let (a_vec4s, b_vec4s) = (bk * bm / 4.0, bk * bn / 4.0);
    let lanes = mt.subgroup as f64;
    let store_clk = (a_vec4s + b_vec4s) / lanes * STORE_WAVEFRONTS;
    let b_alu = B_ALU + if g.prologue { PROLOGUE_ALU } else { 0.0 };
    let issue_clk = (a_vec4s * A_ALU + b_vec4s * b_alu) / lanes / rates.issue_per_clk;
    let stage = issue_clk.max(store_clk);
    let compute = mma_clk.max(fragment_clk);
    let latency = rates.load_latency_clk;
    let barriers = if design.stages >= 2 { 1.0 } else { 2.0 } * rates.barrier_clk;
    let alone_clk = if design.pipelined {
        latency.max(compute) + stage + barriers
    } else {
        stage + latency + compute + 2.0 * rates.barrier_clk
    };
    let resources = [
        (mma_clk, "matrix"),
        (fragment_clk + store_clk, "smem"),
        (issue_clk, "issue"),
    ];
    let (busy, busy_name) =
        resources
            .into_iter()
            .fold((0.0f64, "matrix"), |a, b| if b.0 > a.0 { b } else { a });
    let k_steps = ceil_div(g.kdim(), tile.bk);
    let workgroups = (ceil_div(g.m(), tile.bm) * ceil_div(g.n(), tile.bn) * g.frames) as u64;
    // Workgroups each SM runs, w at a time; the last round may hold fewer.
    let per_sm = workgroups.div_ceil(gpu.sms as u64) as f64;
    let full = (per_sm / w).floor();
    let rest = per_sm - full * w;
    let round = |r: f64| k_steps as f64 * (busy * r).max(alone_clk);
    // Per accumulator: the scratch store (8 wavefronts), the lanes' reads, two barriers.
    let accumulators = ((sub_m / mt.mma) * (sub_n / mt.mma)) as f64;
    let epilogue = accumulators * (2.0 * rates.barrier_clk + 16.0);
    let cycles =
        full * round(w) + if rest > 0.0 { round(rest) } else { 0.0 } + per_sm.ceil() / w * epilogue;
    let limiter = if alone_clk > busy * w {
        "latency"
    } else {
        busy_name
    };
    Some(KernelEstimate {
        tile,
        occupancy: occ,
        k_steps,
        workgroups,
        mma_clk,
        fragment_clk,
        store_clk,
        issue_clk,
        alone_clk,
        limiter,
        time_s: cycles / rates.clock_hz,
    })
}

/// Sum of [`estimate`] over a decode's conv layers (attention's products and passes left
/// out), seconds, with the layers counted; `None` when a tile does not fit.
pub fn conv_total(
    layers: &[Layer],
    gpu: &GpuSpec,
    rates: &SmRates,
    tiles: &Tiles,
    design: &ConvDesign,
) -> Option<(f64, usize)> {
    let mut total = 0.0;
    let mut n = 0;
    for l in layers {
        let is_conv = matches!(l.work, Work::Gemm(_))
            && !matches!(l.kind, LayerKind::AttnQk | LayerKind::AttnPv);
        if !is_conv {
            continue;
        }
        total += estimate(l, gpu, rates, tiles, design)?.time_s;
        n += 1;
    }
    Some((total, n))
}
