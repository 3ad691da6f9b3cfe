//! A paper GPU model (a roofline) of the decoders' GEMM layers: for every
//! conv (and the mid-block attention's two matmuls) of a decoder graph, the
//! FLOPs, the bytes an implicit-GEMM kernel with the engine's tiles moves,
//! the arithmetic intensity, the occupancy and wave count on a named GPU,
//! and the time `max(FLOPs / peak, bytes / bandwidth)` corrected for wave
//! quantisation — with matrix units (f16 operands, f32 accumulators, the
//! tensor-core dense peak) and without (f32 FMAs on the CUDA cores).
//!
//! **This is a model, not a measurement.** It predicts what a kernel with
//! these tiles could reach if it ran at the device's published peaks; real
//! kernels land above it (instruction overheads, bank conflicts, imperfect
//! overlap, clocks below boost). It exists so that a cooperative-matrix
//! kernel can be judged against a target before any GPU measures it, and so
//! that tile choices can be compared on paper.
//!
//! Nothing here touches a device: [`GpuSpec`], [`Tiles`], [`Layer`] and
//! [`predict()`] are plain arithmetic. [`workloads`] lists the layers of the
//! real decoder graphs (it loads the presets on the null device, which
//! allocates nothing and runs nothing).
//!
//! # Assumptions (all of them)
//! - **GEMM view.** A conv is an implicit GEMM: M = output channels, N =
//!   output pixels of one frame, K = Cin·k². Frames (a batch, or a video's
//!   frames with time as the batch) multiply the workgroup count; all frames
//!   of a layer are one dispatch. A causal 3×3×3 conv is 3 time taps, each a
//!   2-D 3×3 conv over all frames; the taps after the first read and
//!   re-write the output (an in-place accumulate, counted as a residual
//!   read). Wan's time up-sampler's 3×1×1 conv (C → 2C) runs on every latent
//!   frame but the first, its 3×3 up-sample conv on `1 + 2(T − 1)` frames.
//! - **Tiles** ([`Tiles`], the engine's per-device parameters, changeable):
//!   each workgroup computes a BM × BN block of C (BM output channels × BN
//!   consecutive output pixels of one frame, taken as a `BN/32 × 32` patch —
//!   a 4×32 patch for BN = 128 — or narrower when the image is narrower).
//! - **Bytes** (global memory traffic, no cache reuse between workgroups):
//!   every workgroup reads its whole BM × K weight panel (clipped to M) and
//!   its input window once — `Cin · (rows·stride + k − 1) · (cols·stride + k
//!   − 1)` values, halved (+1 row/column of halo) in each direction when a
//!   nearest-2× up-sample is fused into the load — and writes its outputs
//!   once. Activations and weights are f16 (2 bytes) in both paths (the
//!   scalar path converts to f32 in shared memory). A fused residual (or an
//!   accumulating time tap) reads one more output-sized tensor; a fused
//!   GroupNorm prologue reads its f32 affine `[Cin, 2]` per workgroup. Edge
//!   tiles read a full window (a slight over-count on small planes).
//! - **Perfect reuse** (`unique_bytes`, a lower bound): each tensor once
//!   (weights, input, output, residual), as if L2 (50 MB on H100, 72 MB on
//!   the RTX 4090) caught every re-read. The truth lies between the two.
//! - **FLOPs** are `2·M·N·K` per frame (useful work); the compute time uses
//!   the *executed* FLOPs of whole tiles (M, N rounded up to BM, BN and K to
//!   BK), so a 3-channel output conv on a 16-row matrix tile pays 16/3.
//!   Bias, activations, softmax exponentials and conversions are not counted.
//! - **Occupancy**: workgroups per SM = min(shared memory, registers,
//!   threads, blocks). Shared memory per workgroup is the tile's staging
//!   (A: BM×BK, B: BK×BN; f16 for the matrix path, f32 for the scalar path;
//!   no double buffering) plus the matrix path's per-subgroup 16×16 f32
//!   epilogue scratch, plus the 1 KB the CUDA driver reserves per block on
//!   sm_80 and later; a tile over the per-block limit does not fit.
//!   Registers per invocation are an *estimate*: accumulators (f32) +
//!   operand fragments + the global→shared staging values (at most 32:
//!   larger tiles stage in batches) + 32 for
//!   addresses, indices and loop state, rounded up to 8, at most 255
//!   (more would spill); allocated per warp in units of 256 registers over
//!   4 SM sub-partitions (16 384 registers each).
//! - **Time**: `t = max(executed FLOPs / peak, bytes / bandwidth) · q`
//!   where `q = waves · slots / workgroups ≥ 1`, `slots = SMs · workgroups
//!   per SM` and `waves = ⌈workgroups / slots⌉`: each resident workgroup is
//!   assumed to progress at `1 / slots` of the machine's rates, so a partial
//!   last wave costs a whole wave. `time_serial_s` is `(compute + memory) ·
//!   q` instead: the no-overlap bound (no double buffering, so a lone
//!   workgroup per SM cannot hide its loads behind its MMAs).
//! - **Bound**: `Latency` when the quantised waves leave more than half the
//!   slots idle (`workgroups / (waves · slots) < 0.5`: too few workgroups
//!   to fill the GPU), else `Bandwidth` when the memory term is the larger,
//!   else `Compute`.
//! - **Attention** (the mid-block's single head, flash-style): QKᵀ is a
//!   GEMM M = keys, N = queries, K = C whose scores stay on chip (no output
//!   write) and whose query panel is read once per query tile; PV is a GEMM
//!   M = C, N = queries, K = keys whose P operand is on chip (no input
//!   read). q, k, v and the output projection are 1×1 convs (the output
//!   projection adds into the residual).
//! - **Norm passes** (GroupNorm statistics: one read; RMS norm, maps and
//!   time shifts: one read + one write) are bandwidth-only rows
//!   (`bytes / bandwidth`, no waves); TimeGrow / TimePool are free views.
//!   Launch overheads and host work are not modelled.

mod graph_walk;
pub mod kernel;
mod predict;

pub use graph_walk::{workload, workloads, DecoderKind, Workload};
pub use predict::{predict, predict_all, Bound, Prediction, Totals};

use serde::Serialize;

/// Published peaks and per-SM limits of a GPU.
#[derive(Clone, Debug, Serialize)]
pub struct GpuSpec {
    /// Short name (`H100 SXM`, `RTX 4090`).
    pub name: &'static str,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Dense f16 → f32-accumulate matrix (tensor core) peak, FLOP/s.
    pub matrix_flops: f64,
    /// FP32 CUDA-core peak (FMA = 2 FLOPs), FLOP/s.
    pub fp32_flops: f64,
    /// DRAM bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Shared memory per SM, bytes.
    pub smem_per_sm: u32,
    /// Largest shared memory one block may use, bytes.
    pub smem_per_block: u32,
    /// Shared memory the driver reserves per resident block, bytes.
    pub smem_reserved_per_block: u32,
    /// 32-bit registers per SM.
    pub regs_per_sm: u32,
    /// Resident threads per SM.
    pub threads_per_sm: u32,
    /// Resident blocks per SM.
    pub blocks_per_sm: u32,
    /// L2 cache, bytes (not used by the times; for the reader).
    pub l2_bytes: u64,
}

impl GpuSpec {
    /// NVIDIA H100 SXM5 (80 GB HBM3).
    ///
    /// Sources: NVIDIA H100 Tensor Core GPU Architecture whitepaper / H100
    /// datasheet, as tabulated at glennklockwood.com/garden/processors/h100
    /// (132 SMs; FP16 matrix 989.4 TFLOP/s dense at 1.83 GHz — 528 tensor
    /// cores × 1024 FLOP/clock; FP32 vector 66.9 TFLOP/s); 3.35 TB/s HBM3,
    /// 50 MB L2, up to 228 KB shared memory per SM (NVIDIA datasheet);
    /// CUDA C++ Programming Guide, compute capability 9.0: 227 KB shared per
    /// block, 64 K 32-bit registers per SM, 2048 threads and 32 blocks per
    /// SM, 1 KB shared memory reserved per block. Checked 2026-11-27: no
    /// correction to the brief's figures.
    pub(crate) fn h100_sxm() -> Self {
        GpuSpec {
            name: "H100 SXM",
            sms: 132,
            matrix_flops: 989.4e12,
            fp32_flops: 66.9e12,
            bandwidth: 3.35e12,
            smem_per_sm: 228 * 1024,
            smem_per_block: 227 * 1024,
            smem_reserved_per_block: 1024,
            regs_per_sm: 65536,
            threads_per_sm: 2048,
            blocks_per_sm: 32,
            l2_bytes: 50 << 20,
        }
    }

    /// NVIDIA GeForce RTX 4090 (AD102, 24 GB GDDR6X).
    ///
    /// Sources: NVIDIA Ada Lovelace GPU Architecture whitepaper (128 SMs;
    /// peak FP16 tensor 165.2 TFLOP/s dense with FP32 accumulate — the often
    /// quoted 330.3 is with FP16 accumulate, 660.6 with sparsity too; FP32
    /// 82.6 TFLOP/s; 72 MB L2), 21 Gbit/s × 384 bit = 1008 GB/s; CUDA C++
    /// Programming Guide, compute capability 8.9: 100 KB shared per SM, 99 KB
    /// per block, 64 K registers, 1536 threads and 24 blocks per SM, 1 KB
    /// reserved per block. Checked 2026-11-27: a published stock-clock
    /// microbenchmark measures 165.6 TFLOP/s FP16→FP32 and 79.1 TFLOP/s
    /// scalar FFMA, consistent with these peaks; no correction.
    pub(crate) fn rtx_4090() -> Self {
        GpuSpec {
            name: "RTX 4090",
            sms: 128,
            matrix_flops: 165.2e12,
            fp32_flops: 82.6e12,
            bandwidth: 1008e9,
            smem_per_sm: 100 * 1024,
            smem_per_block: 99 * 1024,
            smem_reserved_per_block: 1024,
            regs_per_sm: 65536,
            threads_per_sm: 1536,
            blocks_per_sm: 24,
            l2_bytes: 72 << 20,
        }
    }

    /// The GPUs the report covers.
    pub fn all() -> Vec<GpuSpec> {
        vec![GpuSpec::h100_sxm(), GpuSpec::rtx_4090()]
    }

    /// The peak of `path`, FLOP/s.
    pub fn peak(&self, path: PathKind) -> f64 {
        match path {
            PathKind::Matrix => self.matrix_flops,
            PathKind::Scalar => self.fp32_flops,
        }
    }
}

/// Which conv kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathKind {
    /// Cooperative-matrix (tensor-core) implicit GEMM, f16 × f16 → f32.
    Matrix,
    /// Today's scalar implicit GEMM, f32 FMAs on register blocks.
    Scalar,
}

impl PathKind {
    /// Both paths.
    pub const ALL: [PathKind; 2] = [PathKind::Matrix, PathKind::Scalar];

    /// `matrix` or `scalar`.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Matrix => "matrix",
            PathKind::Scalar => "scalar",
        }
    }
}

/// The matrix path's tiles.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixTiles {
    /// Workgroup rows (output channels) per M bound: the first `(limit, bm)`
    /// with `M ≤ limit` wins, else `bm_default`.
    pub bm_small: Vec<(usize, usize)>,
    /// Workgroup rows when M is above every limit.
    pub bm_default: usize,
    /// Workgroup columns (output pixels).
    pub bn: usize,
    /// Reduction step staged in shared memory.
    pub bk: usize,
    /// Rows of C a subgroup owns (at most BM).
    pub sub_m: usize,
    /// Columns of C a subgroup owns.
    pub sub_n: usize,
    /// The MMA tile side (16 × 16 × 16).
    pub mma: usize,
    /// Lanes per subgroup.
    pub subgroup: usize,
}

/// The scalar path's tiles.
#[derive(Clone, Debug, Serialize)]
pub struct ScalarTiles {
    /// Workgroup rows when M ≤ 64.
    pub bm_64: usize,
    /// Workgroup rows otherwise.
    pub bm: usize,
    /// Workgroup columns.
    pub bn: usize,
    /// Reduction step.
    pub bk: usize,
    /// Register block per invocation (rows, columns).
    pub block: (usize, usize),
    /// The narrow tile for M ≤ `narrow_m`: (BM, BN, BK, register block side).
    pub narrow: (usize, usize, usize, usize),
    /// M at or below which the narrow tile is used.
    pub narrow_m: usize,
}

/// The engine's per-device tile parameters, and the element sizes.
#[derive(Clone, Debug, Serialize)]
pub struct Tiles {
    /// Cooperative-matrix tiles.
    pub matrix: MatrixTiles,
    /// Scalar tiles.
    pub scalar: ScalarTiles,
    /// Width of a workgroup's pixel patch (BN consecutive pixels ≈ BN/32 × 32).
    pub patch_cols: usize,
    /// Bytes per activation element in memory.
    pub act_bytes: u64,
    /// Bytes per weight element in memory.
    pub weight_bytes: u64,
    /// Registers per invocation for addresses, indices and loop state.
    pub reg_overhead: usize,
}

impl Default for Tiles {
    /// The tiles the engine plans for NVIDIA (see the module docs).
    fn default() -> Self {
        Tiles {
            matrix: MatrixTiles {
                bm_small: vec![(16, 16), (64, 64)],
                bm_default: 128,
                bn: 128,
                bk: 32,
                sub_m: 64,
                sub_n: 32,
                mma: 16,
                subgroup: 32,
            },
            scalar: ScalarTiles {
                bm_64: 64,
                bm: 128,
                bn: 128,
                bk: 8,
                block: (8, 8),
                narrow: (4, 256, 16, 4),
                narrow_m: 16,
            },
            patch_cols: 32,
            act_bytes: 2,
            weight_bytes: 2,
            reg_overhead: 32,
        }
    }
}

/// One workgroup's tile for a layer, with its resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Tile {
    /// Rows of C (output channels).
    pub bm: usize,
    /// Columns of C (output pixels).
    pub bn: usize,
    /// Reduction step.
    pub bk: usize,
    /// Invocations (threads) per workgroup.
    pub invocations: usize,
    /// Estimated registers per invocation.
    pub regs: usize,
    /// Shared memory per workgroup, bytes (driver reserve not included).
    pub smem: usize,
}

/// Most registers the global → shared staging holds at once (larger
/// tiles stage in batches).
const STAGING_CAP: usize = 32;

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b.max(1))
}

fn round_up(a: usize, b: usize) -> usize {
    ceil_div(a, b) * b
}

impl Tiles {
    /// The tile `path` uses for a GEMM with `m` rows (output channels).
    pub fn pick(&self, path: PathKind, m: usize) -> Tile {
        match path {
            PathKind::Matrix => {
                let t = &self.matrix;
                let bm = t
                    .bm_small
                    .iter()
                    .find(|(limit, _)| m <= *limit)
                    .map_or(t.bm_default, |&(_, bm)| bm);
                let sub_m = t.sub_m.min(bm);
                let sub_n = t.sub_n.min(t.bn);
                let subgroups = ((bm / sub_m) * (t.bn / sub_n)).max(1);
                let invocations = subgroups * t.subgroup;
                // f16 operands: A BM×BK + B BK×BN, and a 16×16 f32 scratch per subgroup.
                let smem = (bm * t.bk + t.bk * t.bn) * 2 + subgroups * t.mma * t.mma * 4;
                // Per lane: f32 accumulators, one k-step's A and B fragments
                // (16×16 f16 = 4 registers a lane each), the staged values.
                let acc = sub_m * sub_n / t.subgroup;
                let frag = (t.mma * t.mma * 2 / 4).div_ceil(t.subgroup);
                let frags = (sub_m / t.mma + sub_n / t.mma) * frag;
                let staging =
                    ceil_div((bm * t.bk + t.bk * t.bn) * 2, 4 * invocations).min(STAGING_CAP);
                let regs = round_up(acc + frags + staging + self.reg_overhead, 8).min(255);
                Tile {
                    bm,
                    bn: t.bn,
                    bk: t.bk,
                    invocations,
                    regs,
                    smem,
                }
            }
            PathKind::Scalar => {
                let t = &self.scalar;
                let (bm, bn, bk, (rm, rn)) = if m <= t.narrow_m {
                    let (bm, bn, bk, r) = t.narrow;
                    (bm, bn, bk, (r, r))
                } else if m <= 64 {
                    (t.bm_64, t.bn, t.bk, t.block)
                } else {
                    (t.bm, t.bn, t.bk, t.block)
                };
                let invocations = ((bm / rm) * (bn / rn)).max(1);
                let smem = bk * (bm + bn) * 4;
                let staging = ceil_div(bk * (bm + bn), invocations).min(STAGING_CAP);
                let regs = round_up(rm * rn + rm + rn + staging + self.reg_overhead, 8).min(255);
                Tile {
                    bm,
                    bn,
                    bk,
                    invocations,
                    regs,
                    smem,
                }
            }
        }
    }
}

/// What limits the workgroups resident on an SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limiter {
    /// Shared memory.
    SharedMemory,
    /// Registers.
    Registers,
    /// Resident threads.
    Threads,
    /// Resident blocks.
    Blocks,
}

impl Limiter {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Limiter::SharedMemory => "smem",
            Limiter::Registers => "regs",
            Limiter::Threads => "threads",
            Limiter::Blocks => "blocks",
        }
    }
}

/// Workgroups per SM and what limits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Occupancy {
    /// Resident workgroups per SM (0: the tile does not fit).
    pub wg_per_sm: u32,
    /// The binding limit.
    pub limiter: Limiter,
    /// Resident warps per SM.
    pub warps_per_sm: u32,
}

/// Occupancy of `tile` on `gpu` (see the module docs).
pub fn occupancy(gpu: &GpuSpec, tile: &Tile) -> Occupancy {
    let warps = ceil_div(tile.invocations, 32) as u32;
    let smem = if tile.smem as u32 > gpu.smem_per_block {
        0
    } else {
        gpu.smem_per_sm / (tile.smem as u32 + gpu.smem_reserved_per_block)
    };
    // Registers: per warp in units of 256, per SM sub-partition (4 of them).
    let per_warp = round_up(tile.regs * 32, 256) as u32;
    let warps_by_regs = 4 * ((gpu.regs_per_sm / 4) / per_warp.max(1));
    let regs = warps_by_regs / warps.max(1);
    let threads = gpu.threads_per_sm / (warps.max(1) * 32);
    let limits = [
        (smem, Limiter::SharedMemory),
        (regs, Limiter::Registers),
        (threads, Limiter::Threads),
        (gpu.blocks_per_sm, Limiter::Blocks),
    ];
    let (wg_per_sm, limiter) = limits
        .into_iter()
        .min_by_key(|(n, _)| *n)
        .unwrap_or((0, Limiter::Blocks));
    Occupancy {
        wg_per_sm,
        limiter,
        warps_per_sm: wg_per_sm * warps,
    }
}

/// What a layer is, for tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// A 2-D conv (fused up-sample, prologue, residual as flagged).
    Conv,
    /// A resnet's 1×1 shortcut conv.
    Shortcut,
    /// One time tap of a causal 3×3×3 conv.
    CausalTap,
    /// One time tap of Wan's 3×1×1 time up-sample conv.
    TimeConv,
    /// An attention q / k / v / output 1×1 conv.
    AttnProj,
    /// The attention's QKᵀ.
    AttnQk,
    /// The attention's PV.
    AttnPv,
    /// A bandwidth-only pass (norm statistics, RMS norm, map, copy).
    Pass,
}

impl LayerKind {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Conv => "conv",
            LayerKind::Shortcut => "shortcut",
            LayerKind::CausalTap => "causal_tap",
            LayerKind::TimeConv => "time_conv",
            LayerKind::AttnProj => "attn_proj",
            LayerKind::AttnQk => "attn_qk",
            LayerKind::AttnPv => "attn_pv",
            LayerKind::Pass => "pass",
        }
    }
}

/// How often a GEMM's B operand (the input window) is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputReads {
    /// By every workgroup (a conv's im2col window).
    PerWorkgroup,
    /// Once per column of workgroups (flash attention's query block, kept
    /// on chip while the key blocks stream by).
    PerColumn,
    /// Never: the operand is on chip (attention's P).
    None,
}

/// An implicit GEMM: a conv `cin → cout`, `k × k`, over `frames` planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Gemm {
    /// Input channels (K = cin · k²).
    pub cin: usize,
    /// Output channels (M).
    pub cout: usize,
    /// Kernel side.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// A nearest-2× up-sample of the input fused into the load.
    pub upsample: bool,
    /// Input plane (before any up-sample).
    pub hi: usize,
    /// Input plane width.
    pub wi: usize,
    /// Output plane (N = ho · wo per frame).
    pub ho: usize,
    /// Output plane width.
    pub wo: usize,
    /// Planes (batch or video frames) in the dispatch.
    pub frames: usize,
    /// Reads an output-sized tensor in its epilogue (residual add or an
    /// accumulating time tap).
    pub residual: bool,
    /// A GroupNorm affine (+ activation) applied on load.
    pub prologue: bool,
    /// How the input is read.
    pub input: InputReads,
    /// Whether C is written to memory.
    pub writes_output: bool,
    /// The A operand (weights) differs per frame (attention's K and V).
    pub a_per_frame: bool,
}

impl Gemm {
    /// A plain conv over `frames` planes of `hi × wi`, output `ho × wo`.
    pub fn conv(cin: usize, cout: usize, k: usize, (hi, wi): (usize, usize)) -> Gemm {
        Gemm {
            cin,
            cout,
            k,
            stride: 1,
            upsample: false,
            hi,
            wi,
            ho: hi,
            wo: wi,
            frames: 1,
            residual: false,
            prologue: false,
            input: InputReads::PerWorkgroup,
            writes_output: true,
            a_per_frame: false,
        }
    }

    /// M: output channels.
    pub fn m(&self) -> usize {
        self.cout
    }
    /// N: output pixels per frame.
    pub fn n(&self) -> usize {
        self.ho * self.wo
    }
    /// K: the reduction length.
    pub(crate) fn kdim(&self) -> usize {
        self.cin * self.k * self.k
    }
    /// Useful FLOPs: `2·M·N·K` per frame.
    pub fn flops(&self) -> f64 {
        2.0 * self.m() as f64 * self.n() as f64 * self.kdim() as f64 * self.frames as f64
    }

    /// Input values one workgroup's window covers (per channel).
    fn window(&self, bn: usize, patch_cols: usize) -> usize {
        let cols = patch_cols.min(self.wo).max(1);
        let rows = ceil_div(bn, cols);
        let extent = |len: usize| len * self.stride + self.k - 1;
        let (mut eh, mut ew) = (extent(rows), extent(cols));
        if self.upsample {
            let halve = |e: usize| ceil_div(e, 2) + usize::from(self.k > 1);
            eh = halve(eh);
            ew = halve(ew);
        }
        // Never more than the (padded) input plane.
        eh.min(self.hi + self.k - 1) * ew.min(self.wi + self.k - 1)
    }
}

/// A bandwidth-only pass over `elements` values, read `reads` times and
/// written `writes` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Pass {
    /// What it is (`gn_stats`, `rms_norm`, `map`, `time_shift`).
    pub name: &'static str,
    /// Elements of the tensor.
    pub elements: u64,
    /// Reads of it.
    pub reads: u32,
    /// Writes of it.
    pub writes: u32,
}

/// What a layer computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Work {
    /// An implicit GEMM.
    Gemm(Gemm),
    /// A bandwidth-only pass.
    Pass(Pass),
}

/// One row of the model: a GEMM or a pass of a decoder graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// The graph op it comes from.
    pub op: usize,
    /// The decoder section (`mid_block`, `up_blocks.2`, …; may be empty).
    pub section: String,
    /// What it is.
    pub kind: LayerKind,
    /// Its work.
    pub work: Work,
}

impl Layer {
    /// A short description: `conv 3x3 512→512 64x64 ×21 up +res +gn`.
    pub fn label(&self) -> String {
        match &self.work {
            Work::Gemm(g) => {
                let mut s = match self.kind {
                    LayerKind::AttnQk => {
                        format!("QKᵀ {} queries × {} keys × C {}", g.n(), g.m(), g.cin)
                    }
                    LayerKind::AttnPv => {
                        format!("PV {} queries × {} keys × C {}", g.n(), g.cin, g.m())
                    }
                    _ => format!(
                        "{} {}x{} {}→{} {}x{}",
                        self.kind.name(),
                        g.k,
                        g.k,
                        g.cin,
                        g.cout,
                        g.ho,
                        g.wo
                    ),
                };
                if g.frames > 1 {
                    s += &format!(" ×{}", g.frames);
                }
                if g.stride > 1 {
                    s += &format!(" /{}", g.stride);
                }
                if g.upsample {
                    s += " up";
                }
                if g.residual {
                    s += " +res";
                }
                if g.prologue {
                    s += " +gn";
                }
                s
            }
            Work::Pass(p) => format!(
                "{} {} elements ({} read {} written)",
                p.name, p.elements, p.reads, p.writes
            ),
        }
    }
}

#[cfg(test)]
mod tests;
