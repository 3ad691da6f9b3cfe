//! `shaders/attention.wgsl`: the flash-attention kernel family.
//!
//! One kernel ([`flash_attention`]) for every attention the engine runs: the
//! VAE mid-block (one head of d = 512, channel-major `[N, d, T]` straight
//! from the 1x1 convs; see [`attention`]) and multi-head transformer
//! attention (token-major `[B, T, H, d]`, head-major `[B, H, T, d]`, KV-cache
//! ring buffers), with optional causal and frame-window masks
//! ([`Mask`]) and f32 or int8 K/V ([`KvInput`]). Every
//! tensor is addressed through [`Strides`] of a `[batch, head, token,
//! channel]` view.
//!
//! Online softmax over key tiles staged in workgroup memory, f32
//! accumulation, O(T) memory (the T x T score matrix never exists; the kernel
//! needs no scratch buffer at all). The head dimension is split across
//! invocations (partial dot products reduced through workgroup memory), so
//! d = 512 fits in about 25 KiB of workgroup memory. Wider heads (up to
//! [`MAX_HEAD_DIM`]; Qwen-Image 2.1's mid-block is one head of 1152) split
//! the output channels into chunks of 512 over workgroups, each recomputing
//! the scores over the K tile staged chunk by chunk (the `WIDE` variant;
//! [`AttentionConfig::chunks`]). The specialisation is
//! picked by d (see [`CONFIGS`]). Masks skip whole tiles: a workgroup only
//! walks the (at most two) key ranges its queries can see, and masks element
//! by element only in tiles that straddle a window or causal edge.
//!
//! In f16 models ([`AttentionProblem::f16_operands`]) on devices with
//! cooperative matrices, unmasked attention with f32 K/V runs QKᵀ and PV on
//! them instead ([`MatrixAttention`], entry `attention_coop`).
//!
//! int8 K/V are dequantised inside the kernel, tile by tile, as the tiles are
//! staged (never expanded in memory); [`kv_append`] writes (and for int8
//! quantises) new keys / values into a cache.

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::BindingKind::{Read, ReadWrite};
use crate::gpu::{linear_groups, Capabilities, DrySignature, KernelSpec, PipelineKey, Recorder};
use crate::kernels::spec;
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/attention.wgsl");

/// Largest head dimension supported (beyond [`SINGLE_PASS_HEAD_DIM`], in
/// output chunks: see [`AttentionConfig::chunks`]).
pub const MAX_HEAD_DIM: usize = 4096;

/// Largest head dimension one workgroup covers (the largest configuration's
/// [`AttentionConfig::max_d`]); wider heads run the `WIDE` variant, and the
/// cooperative-matrix kernel is not used for them.
pub const SINGLE_PASS_HEAD_DIM: usize = 512;

/// Uniforms of the `attention` entry (mirrors `Params` in the shader).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, Default)]
pub struct Params {
    /// Head dimension.
    pub d: u32,
    /// Queries per (batch, head).
    pub n_q: u32,
    /// Keys per (batch, head).
    pub n_kv: u32,
    /// Heads.
    pub heads: u32,
    /// q / out strides between batches, heads, tokens and channels
    /// (elements; the shader's `q_sb`, `q_sh`, `q_st`, `q_sc`).
    pub q_strides: [u32; 4],
    /// k / v strides, likewise (`kv_sb` .. `kv_sc`).
    pub kv_strides: [u32; 4],
    /// Softmax scale.
    pub scale: f32,
    /// 1 for a causal mask.
    pub causal: u32,
    /// Key position of query 0.
    pub q_pos0: u32,
    /// Tokens per frame of the frame-window mask (0: none).
    pub frame_tokens: u32,
    /// Sink frames of the frame-window mask.
    pub sink_frames: u32,
    /// 0: every frame (no window).
    pub window_frames: u32,
    /// This dispatch's share of the keys.
    pub kv_begin: u32,
    /// End of the keys the window may see.
    pub kv_end: u32,
    /// Bit 0: first share; bit 1: last share.
    pub phase: u32,
    /// Padding to 16 bytes.
    pub _pad0: u32,
    /// Padding.
    pub _pad1: u32,
    /// Padding.
    pub _pad2: u32,
}

/// Attention with f32 K/V: q, k, v, stats (scratch of split key ranges), out.
pub const ATTENTION: KernelSpec = spec::<Params>(
    "attention",
    SOURCE,
    "attention",
    &[Read, Read, Read, ReadWrite, ReadWrite],
);

/// Attention with int8 K/V: q, k codes, k scales, v codes, v scales,
/// stats, out.
pub const ATTENTION_INT8: KernelSpec = spec::<Params>(
    "attention",
    SOURCE,
    "attention",
    &[Read, Read, Read, Read, Read, ReadWrite, ReadWrite],
);

/// Uniforms of the `kv_append` entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable, Default)]
pub struct AppendParams {
    /// Head dimension.
    pub d: u32,
    /// Heads.
    pub heads: u32,
    /// Tokens appended.
    pub tokens: u32,
    /// Batch size.
    pub batch: u32,
    /// Source strides between batches, heads, tokens and channels
    /// (elements; the shader's `src_sb` .. `src_sc`).
    pub src_strides: [u32; 4],
    /// Cache strides between batches, heads and tokens (`dst_sb` .. `dst_st`;
    /// channels are contiguous).
    pub dst_strides: [u32; 3],
    /// First source token.
    pub src_t0: u32,
    /// First cache slot written.
    pub dst_t0: u32,
    /// Padding to 16 bytes.
    pub _pad0: u32,
    /// Padding.
    pub _pad1: u32,
    /// Padding.
    pub _pad2: u32,
}

/// KV append as an f32 copy: src, dst.
pub const KV_APPEND: KernelSpec =
    spec::<AppendParams>("attention", SOURCE, "kv_append", &[Read, ReadWrite]);

/// KV append with int8 quantisation: src, codes, scales.
pub const KV_APPEND_INT8: KernelSpec = spec::<AppendParams>(
    "attention",
    SOURCE,
    "kv_append",
    &[Read, ReadWrite, ReadWrite],
);

/// Invocations per workgroup of `kv_append` (one per token-head row).
pub const APPEND_WG: u32 = 64;

/// One specialisation: invocations per query (`ds`, splitting the head
/// dimension) and query groups per workgroup (`qg`; each invocation handles
/// two queries, so a workgroup handles `2 qg`), head channels per invocation
/// (`dpt`), covering d <= ds * dpt. Key tiles are [`KEYS_PER_TILE`] wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Invocations per query (splitting the head dimension).
    pub ds: u32,
    /// Query groups per workgroup (two queries each).
    pub qg: u32,
    /// Head channels per invocation.
    pub dpt: u32,
}

/// Keys per tile (fixed in the shader: two vec4 per channel).
pub const KEYS_PER_TILE: u32 = 8;

impl AttentionConfig {
    /// Largest head dimension one workgroup of this configuration covers.
    pub fn max_d(&self) -> usize {
        (self.ds * self.dpt) as usize
    }
    /// Output chunks (workgroups along z) for head dimension `d`: 1 up to
    /// [`Self::max_d`], beyond it the `WIDE` variant with one chunk of
    /// `max_d` output channels per workgroup.
    pub fn chunks(&self, d: usize) -> usize {
        d.div_ceil(self.max_d()).max(1)
    }
    /// Invocations per workgroup (`qg · ds`).
    pub fn invocations(&self) -> u32 {
        self.qg * self.ds
    }
    /// Queries per workgroup.
    pub fn queries(&self) -> u32 {
        2 * self.qg
    }
    /// Bytes of workgroup memory: K/V tile, partial dots, scores.
    pub fn workgroup_bytes(&self) -> u32 {
        let (bq, bkv) = (self.queries(), KEYS_PER_TILE);
        4 * (self.ds * self.dpt * bkv + self.ds * bq * bkv + bq * bkv)
    }
}

const fn cfg(ds: u32, qg: u32, dpt: u32) -> AttentionConfig {
    AttentionConfig { ds, qg, dpt }
}

/// Configurations for GPUs, by increasing head dimension: at most 32 head
/// channels (64 accumulator floats) per invocation, so q and the output
/// accumulator stay in registers. Small heads keep whole dot products in one
/// invocation; large heads split d over up to 16.
pub const CONFIGS: [AttentionConfig; 6] = [
    cfg(1, 32, 8),
    cfg(2, 32, 16),
    cfg(4, 32, 16),
    cfg(8, 16, 16),
    cfg(16, 8, 16),
    cfg(16, 8, 32),
];

/// Configurations for CPU adapters (lavapipe / llvmpipe), measured there:
/// a software rasteriser keeps "registers" in memory anyway, so fewer
/// invocations per query (less partial-sum traffic and redundant softmax)
/// and 128-query blocks (more reuse per staged tile, fewer barriers per
/// query) win: GFLOP per CPU second at d = 128 / 512 rose from 2.2 / 2.1
/// (the GPU configurations) to 3.3 / 3.8.
pub const CPU_CONFIGS: [AttentionConfig; 6] = [
    cfg(1, 64, 8),
    cfg(1, 64, 32),
    cfg(1, 64, 64),
    cfg(2, 64, 64),
    cfg(2, 64, 128),
    cfg(2, 64, 256),
];

/// Query groups of the CPU configurations for short query blocks.
const CPU_SMALL_QG: u32 = 16;

/// The first configuration of `table` covering `d`, else (wide heads, up to
/// [`MAX_HEAD_DIM`]) the largest one.
fn pick(table: &[AttentionConfig], d: usize) -> Option<AttentionConfig> {
    if d > MAX_HEAD_DIM {
        return None;
    }
    let widest = table.last().copied();
    table.iter().copied().find(|c| d <= c.max_d()).or(widest)
}

/// The GPU configuration used for head dimension `d`.
pub fn config_for(d: usize) -> Option<AttentionConfig> {
    pick(&CONFIGS, d)
}

/// The configuration for head dimension `d` and `n_q` queries on a device:
/// the CPU table on CPU adapters (with 32-query blocks when 128-query blocks
/// would pad `n_q` by more than a quarter), falling back to the GPU table
/// when a CPU configuration does not fit the device.
pub fn config_for_device(d: usize, n_q: usize, caps: &Capabilities) -> Option<AttentionConfig> {
    let fits = |c: &AttentionConfig| {
        c.workgroup_bytes() <= caps.max_compute_workgroup_storage_size
            && c.invocations() <= caps.max_compute_invocations_per_workgroup
    };
    if caps.is_cpu() {
        if let Some(mut c) = pick(&CPU_CONFIGS, d) {
            let bq = c.queries() as usize;
            if 4 * n_q.div_ceil(bq) * bq > 5 * n_q {
                c.qg = CPU_SMALL_QG;
            }
            if fits(&c) {
                return Some(c);
            }
        }
    }
    config_for(d)
}

/// A scalar variant: configuration, int8 K/V, wide heads.
type VariantId = (AttentionConfig, bool, bool);

fn key(c: &AttentionConfig, int8: bool, wide: bool) -> PipelineKey {
    // Built once per configuration and thread: a tiled dry run asks for
    // the key of every (query tile, K/V block) pair.
    thread_local! {
        static KEYS: std::cell::RefCell<Vec<(VariantId, PipelineKey)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    KEYS.with(|keys| {
        let mut keys = keys.borrow_mut();
        let id = (*c, int8, wide);
        if let Some((_, k)) = keys.iter().find(|(kid, _)| *kid == id) {
            return k.clone();
        }
        let k = build_key(c, int8, wide);
        keys.push((id, k.clone()));
        k
    })
}

fn build_key(c: &AttentionConfig, int8: bool, wide: bool) -> PipelineKey {
    let spec = if int8 { &ATTENTION_INT8 } else { &ATTENTION };
    PipelineKey::new(spec)
        .flag("ATTENTION")
        .flag_if(int8, "KV_INT8")
        .flag_if(wide, "WIDE")
        .constant("DS", format!("{}u", c.ds))
        .constant("QG", format!("{}u", c.qg))
        .constant("DPT", format!("{}u", c.dpt))
}

fn append_key(int8: bool) -> PipelineKey {
    let spec = if int8 { &KV_APPEND_INT8 } else { &KV_APPEND };
    PipelineKey::new(spec)
        .flag("KV_APPEND")
        .flag_if(int8, "KV_INT8")
        .constant("APPEND_WG", format!("{APPEND_WG}u"))
}

fn to_u32(op: &str, what: &str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::shape(op, format!("{what} = {x} exceeds u32 indexing")))
}

fn check_holds(op: &str, what: &str, t: &Tensor, dtype: DType, elems: usize) -> Result<()> {
    if t.dtype() != dtype || t.numel() < elems {
        return Err(Error::shape(
            op,
            format!(
                "{what} must be a {} tensor of at least {elems} elements, got {t:?}",
                dtype.name()
            ),
        ));
    }
    if t.numel() > u32::MAX as usize {
        return Err(Error::shape(
            op,
            format!("{what} {t:?} exceeds u32 indexing"),
        ));
    }
    Ok(())
}

/// Checks that the device can run configuration `config` for head dim `d`.
fn check_device(rec: &Recorder, config: &AttentionConfig, d: usize) -> Result<()> {
    let caps = rec.ctx().caps();
    if config.workgroup_bytes() > caps.max_compute_workgroup_storage_size
        || config.invocations() > caps.max_compute_invocations_per_workgroup
    {
        return Err(Error::Unsupported(format!(
            "attention with d = {d} needs {} bytes of workgroup memory and {} invocations; the device allows {} and {}",
            config.workgroup_bytes(),
            config.invocations(),
            caps.max_compute_workgroup_storage_size,
            caps.max_compute_invocations_per_workgroup
        )));
    }
    Ok(())
}

/// Total loop iterations one invocation may run on software rasterisers
/// (llvmpipe's loop limiter: 65535 over all loops of an invocation, after
/// which every loop exits silently and results are wrong).
pub const CPU_LOOP_ITERATION_LIMIT: usize = 65535;

/// Keys one dispatch may process with configuration `c` on a device:
/// `None` (all keys at once) on GPUs; on CPU adapters, as many tiles as keep
/// a conservative count of the kernel's loop iterations (per tile: the key
/// loop, the K tile loads and channel loops of every chunk (one unless
/// wide), the V tile load with its per-key loops, the partial-sum
/// reduction, the PV channel loop) under 90 % of
/// [`CPU_LOOP_ITERATION_LIMIT`].
pub fn keys_per_dispatch(
    c: &AttentionConfig,
    d: usize,
    int8: bool,
    caps: &Capabilities,
) -> Option<usize> {
    if !caps.is_cpu() {
        return None;
    }
    let (wg, dpt, ds) = (c.invocations() as usize, c.dpt as usize, c.ds as usize);
    let (chunks, dc) = (c.chunks(d), d.min(c.max_d()));
    let load_elems = if int8 { dc / 4 * 2 } else { dc * 2 };
    let load = load_elems.div_ceil(wg) * 5;
    let reduce = (c.queries() as usize * 2).div_ceil(wg) * (1 + ds);
    // The chunk loop itself exists only in the wide variant.
    let chunk_loop = if chunks > 1 { chunks } else { 0 };
    let per_tile = 1 + (chunks + 1) * (load + dpt) + reduce + chunk_loop;
    let fixed = 2 * dpt + 64;
    let tiles = (CPU_LOOP_ITERATION_LIMIT * 9 / 10 - fixed) / per_tile;
    Some(tiles.max(1) * KEYS_PER_TILE as usize)
}

/// The scalar configuration a problem runs with on a device (forced or picked).
fn scalar_config(prob: &AttentionProblem, caps: &Capabilities) -> Option<AttentionConfig> {
    prob.config
        .or_else(|| config_for_device(prob.head_dim, prob.q_len, caps))
}

/// f32 elements of the online-softmax state (running max and sum) of a
/// problem on this device: `batch · heads · q_len · 2` per output chunk
/// (wide heads: [`AttentionConfig::chunks`]). The `stats` that
/// [`flash_attention_block`] carries between key blocks must hold this many.
pub fn state_len(prob: &AttentionProblem, int8: bool, caps: &Capabilities) -> usize {
    let chunks = match MatrixAttention::for_problem(prob, int8, caps) {
        Some(_) => 1,
        None => scalar_config(prob, caps).map_or(1, |c| c.chunks(prob.head_dim)),
    };
    prob.batch * prob.heads * prob.q_len * 2 * chunks
}

/// f32 elements of the `stats` scratch a problem needs on this device
/// ([`state_len`] when its keys are split over several dispatches, else 0).
pub fn stats_len(prob: &AttentionProblem, int8: bool, caps: &Capabilities) -> usize {
    let keys = match MatrixAttention::for_problem(prob, int8, caps) {
        Some(m) => m.keys_per_dispatch(caps),
        None => {
            scalar_config(prob, caps).and_then(|c| keys_per_dispatch(&c, prob.head_dim, int8, caps))
        }
    };
    match keys {
        Some(keys) if prob.kv_len > keys => state_len(prob, int8, caps),
        _ => 0,
    }
}

/// [`flash_attention_with_stats`], allocating the `stats` scratch from the
/// pool when this device needs one (CPU adapters with many keys; never on GPUs).
pub fn flash_attention(
    rec: &mut Recorder,
    prob: &AttentionProblem,
    q: &Tensor,
    kv: KvInput,
    out: &Tensor,
) -> Result<()> {
    let int8 = matches!(kv, KvInput::Int8 { .. });
    let n = stats_len(prob, int8, rec.ctx().caps());
    let stats = if n > 0 {
        Some(Tensor::empty(
            rec.ctx(),
            &[n],
            DType::F32,
            "attention stats",
        )?)
    } else {
        None
    };
    flash_attention_with_stats(rec, prob, q, kv, out, stats.as_ref())
}

/// Which part of a query block's pass over several key blocks a call is
/// (attention over keys that live in separate tensors, e.g. the tiles of a
/// tiled mid-block): the online-softmax state carries over in `out`
/// (unnormalised) and `stats` (running max and sum) between calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRole {
    /// The first key block: the state starts empty.
    pub first: bool,
    /// The last key block: `out` receives the normalised output.
    pub last: bool,
}

impl BlockRole {
    /// All keys in one call.
    pub const WHOLE: BlockRole = BlockRole {
        first: true,
        last: true,
    };
}

/// Flash attention over strided q / k / v (see the module docs):
/// `out[b, h, i] = sum_j softmax_j(q[b, h, i] . k[b, h, j] * scale) v[b, h, j]`
/// over the keys `j < kv_len` that `prob.mask` lets query i see. `out` uses
/// `q_strides` and must not overlap q, k or v. A query that sees no key gets
/// zeros. MACs are counted over the visible (query, key) pairs.
///
/// Where the device caps loop iterations ([`keys_per_dispatch`]) the keys
/// are split over several dispatches that carry the online-softmax state in
/// `stats` (f32, at least [`stats_len`] elements; unused otherwise).
pub fn flash_attention_with_stats(
    rec: &mut Recorder,
    prob: &AttentionProblem,
    q: &Tensor,
    kv: KvInput,
    out: &Tensor,
    stats: Option<&Tensor>,
) -> Result<()> {
    flash_attention_block(rec, prob, q, kv, out, stats, BlockRole::WHOLE)
}

/// [`flash_attention_with_stats`] over one block of a query block's keys:
/// the keys of `kv` (`prob.kv_len` of them) are one part of a longer
/// sequence whose other parts come in other calls, in order, with the same
/// `out` and `stats` ([`state_len`] f32, required unless
/// `role` is [`BlockRole::WHOLE`] and the device runs the keys in one
/// dispatch). Masks are evaluated against this block's own key positions,
/// so blocks of a longer sequence use [`Mask::NONE`].
pub fn flash_attention_block(
    rec: &mut Recorder,
    prob: &AttentionProblem,
    q: &Tensor,
    kv: KvInput,
    out: &Tensor,
    stats: Option<&Tensor>,
    role: BlockRole,
) -> Result<()> {
    // A dry run (null device) records nothing: a call whose checks already
    // passed with the same signature only repeats its dispatch labels
    // (tiled attention makes millions of identical calls).
    rec.memoised(
        || Some(dry_signature(prob, q, &kv, out, stats, role)),
        |rec| flash_attention_block_checked(rec, prob, q, kv, out, stats, role),
    )
}

/// Everything [`flash_attention_block`]'s checks and dispatches depend on
/// besides the recorder's device: the problem, each operand's dtype, length
/// and bytes, which operands overlap, and the block's role.
fn dry_signature(
    prob: &AttentionProblem,
    q: &Tensor,
    kv: &KvInput,
    out: &Tensor,
    stats: Option<&Tensor>,
    role: BlockRole,
) -> DrySignature {
    let AttentionProblem {
        batch,
        heads,
        q_len,
        kv_len,
        head_dim,
        q_strides,
        kv_strides,
        scale,
        mask,
        q_pos0,
        config,
        f16_operands,
    } = *prob;
    // At most 1 + 11 + 8 + 4 + 4 + 2 + 7 × 3 + 21 = 72 words.
    let mut v = DrySignature::new(u64::from_le_bytes(*b"flash\0\0\0"));
    for w in [
        batch as u64,
        heads as u64,
        q_len as u64,
        kv_len as u64,
        head_dim as u64,
        scale.to_bits() as u64,
        q_pos0 as u64,
        f16_operands as u64,
        role.first as u64,
        role.last as u64,
        mask.causal as u64,
    ] {
        v.push(w);
    }
    for s in [q_strides, kv_strides] {
        for w in [s.batch, s.head, s.token, s.channel] {
            v.push(w as u64);
        }
    }
    match mask.frames {
        Some(f) => {
            for w in [
                1,
                f.tokens_per_frame as u64,
                f.sink_frames as u64,
                f.window_frames.map_or(u64::MAX, |w| w as u64),
            ] {
                v.push(w);
            }
        }
        None => v.push(0),
    }
    match config {
        Some(c) => {
            for w in [1, c.ds as u64, c.qg as u64, c.dpt as u64] {
                v.push(w);
            }
        }
        None => v.push(0),
    }
    let mut operands: [Option<&Tensor>; 7] = [Some(q), Some(out), None, None, None, None, stats];
    let kv_count = match *kv {
        KvInput::F32 { k, v } => {
            operands[2..4].copy_from_slice(&[Some(k), Some(v)]);
            2
        }
        KvInput::Int8 {
            k_codes,
            k_scales,
            v_codes,
            v_scales,
        } => {
            operands[2..6].copy_from_slice(&[
                Some(k_codes),
                Some(k_scales),
                Some(v_codes),
                Some(v_scales),
            ]);
            4
        }
    };
    v.push(kv_count);
    v.push(stats.is_some() as u64);
    for t in operands.iter().flatten() {
        v.push(t.dtype() as u64);
        v.push(t.numel() as u64);
        v.push(t.byte_size());
    }
    v.push_overlaps(&operands);
    v
}

#[allow(clippy::too_many_arguments)]
fn flash_attention_block_checked(
    rec: &mut Recorder,
    prob: &AttentionProblem,
    q: &Tensor,
    kv: KvInput,
    out: &Tensor,
    stats: Option<&Tensor>,
    role: BlockRole,
) -> Result<()> {
    const OP: &str = "flash_attention";
    let AttentionProblem {
        batch,
        heads,
        q_len,
        kv_len,
        head_dim: d,
        ..
    } = *prob;
    if d == 0 || heads == 0 || batch == 0 {
        return Err(Error::shape(OP, format!("empty problem {prob:?}")));
    }
    let int8 = matches!(kv, KvInput::Int8 { .. });
    let matrix = MatrixAttention::for_problem(prob, int8, rec.ctx().caps());
    if d > MAX_HEAD_DIM {
        return Err(Error::Unsupported(format!(
            "attention head dimension {d} (at most {MAX_HEAD_DIM})"
        )));
    }
    let config = scalar_config(prob, rec.ctx().caps()).ok_or_else(|| {
        Error::Unsupported(format!("attention head dimension {d}: no configuration"))
    })?;
    let chunks = config.chunks(d);
    // Wide int8 chunks start at whole words.
    if int8 && chunks > 1 && config.max_d() % 4 != 0 {
        return Err(Error::Unsupported(format!(
            "int8 attention with d = {d} in chunks of {c:?}.max_d() = {}: chunks must be multiples of 4",
            config.max_d(),
            c = config
        )));
    }
    check_device(rec, &config, d)?;
    prob.mask.validate(OP)?;
    let q_elems = prob.q_strides.max_offset(batch, heads, q_len, d) + 1;
    check_holds(OP, "q", q, DType::F32, q_elems)?;
    check_holds(OP, "out", out, DType::F32, q_elems)?;
    let kv_elems = prob.kv_strides.max_offset(batch, heads, kv_len, d) + 1;
    let (kv_strides, kv_tensors): (Strides, Vec<&Tensor>) = match kv {
        KvInput::F32 { k, v } => {
            check_holds(OP, "k", k, DType::F32, kv_elems)?;
            check_holds(OP, "v", v, DType::F32, kv_elems)?;
            (prob.kv_strides, vec![k, v])
        }
        KvInput::Int8 {
            k_codes,
            k_scales,
            v_codes,
            v_scales,
        } => {
            let (words, code_words) = prob
                .kv_strides
                .int8_words(OP, "K/V", batch, heads, kv_len, d)?;
            let scale_elems = code_words.div_ceil(d / 4);
            check_holds(OP, "k codes", k_codes, DType::Rgba8, code_words)?;
            check_holds(OP, "v codes", v_codes, DType::Rgba8, code_words)?;
            check_holds(OP, "k scales", k_scales, DType::F32, scale_elems)?;
            check_holds(OP, "v scales", v_scales, DType::F32, scale_elems)?;
            (words, vec![k_codes, k_scales, v_codes, v_scales])
        }
    };
    if kv_tensors.iter().chain([&q]).any(|t| out.overlaps(t)) {
        return Err(Error::shape(OP, "out must not overlap q, k or v"));
    }
    let (causal, tpf, sink, window) = prob.mask.kernel_fields();
    let params = Params {
        d: d as u32,
        n_q: to_u32(OP, "q_len", q_len)?,
        n_kv: to_u32(OP, "kv_len", kv_len)?,
        heads: heads as u32,
        q_strides: prob.q_strides.shader_strides(OP, "q")?,
        kv_strides: kv_strides.shader_strides(OP, "kv")?,
        scale: prob.scale,
        causal: causal as u32,
        q_pos0: to_u32(OP, "q_pos0", prob.q_pos0)?,
        frame_tokens: to_u32(OP, "tokens per frame", tpf)?,
        sink_frames: to_u32(OP, "sink frames", sink)?,
        window_frames: to_u32(OP, "window frames", window)?,
        kv_begin: 0,
        kv_end: to_u32(OP, "kv_len", kv_len)?,
        phase: 3,
        ..Default::default()
    };
    // Positions must stay in u32 inside the shader.
    to_u32(OP, "q_pos0 + q_len", prob.q_pos0 + q_len)?;
    let block = match &matrix {
        Some(m) => m.br,
        None => config.queries(),
    };
    let wide = matrix.is_none() && chunks > 1;
    let groups = [
        to_u32(OP, "query blocks", q_len.div_ceil(block as usize))?,
        to_u32(OP, "batch * heads", batch * heads)?,
        if wide { chunks as u32 } else { 1 },
    ];
    // QK^T and PV: 2 d multiply-adds per visible (query, key) pair.
    let pairs = prob.mask.visible_pairs(prob.q_pos0, q_len, kv_len);
    let macs = 2 * pairs * (batch * heads * d) as u64;
    let (spec, key) = match &matrix {
        Some(m) => (m.spec(), m.key()),
        None => (
            if int8 { ATTENTION_INT8 } else { ATTENTION },
            key(&config, int8, wide),
        ),
    };
    let keys = match &matrix {
        Some(m) => m.keys_per_dispatch(rec.ctx().caps()),
        None => keys_per_dispatch(&config, d, int8, rec.ctx().caps()),
    };
    let share = keys.filter(|&keys| kv_len > keys).unwrap_or(kv_len.max(1));
    let shares = kv_len.div_ceil(share).max(1);
    // Unused in a single dispatch over all keys: `out` stands in for the binding.
    let state = state_len(prob, int8, rec.ctx().caps());
    let stats = match stats {
        _ if shares == 1 && role == BlockRole::WHOLE => out,
        Some(t) => {
            check_holds(OP, "stats", t, DType::F32, state)?;
            if t.overlaps(out) || kv_tensors.iter().chain([&q]).any(|x| t.overlaps(x)) {
                return Err(Error::shape(OP, "stats must not overlap q, k, v or out"));
            }
            t
        }
        None => {
            return Err(Error::shape(
                OP,
                format!(
                    "{kv_len} keys in {shares} dispatch(es) ({role:?}) need a stats scratch of {state} f32 (see state_len)"
                ),
            ))
        }
    };
    let mut tensors: Vec<&Tensor> = vec![q];
    tensors.extend(kv_tensors);
    tensors.push(stats);
    tensors.push(out);
    for i in 0..shares {
        let begin = i * share;
        let end = (begin + share).min(kv_len);
        let first = role.first && i == 0;
        let last = role.last && i + 1 == shares;
        let params = Params {
            kv_begin: begin as u32,
            kv_end: end as u32,
            phase: u32::from(first) | (u32::from(last) << 1),
            ..params
        };
        // The work (MACs) is counted once, on the first share.
        let m = if i == 0 { macs } else { 0 };
        rec.dispatch(&spec, &key, &params, &tensors, groups, m)?;
    }
    Ok(())
}

/// q, k, v `[N, d, T]` f32 (T = H*W tokens, d <= [`MAX_HEAD_DIM`]); out `[N, d, T]`;
/// `out[:, :, i] = sum_j softmax_j(q_i . k_j * scale) v_j`: the VAE
/// mid-block's single-head attention, channel-major, no mask.
/// `out` must not alias q, k or v.
pub fn attention(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    attention_with(rec, q, k, v, scale, out, false)
}

/// [`attention`] for a model running in `f16_operands` (see
/// [`AttentionProblem::f16_operands`]): then on cooperative matrices where the
/// device has them.
pub fn attention_with(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    out: &Tensor,
    f16_operands: bool,
) -> Result<()> {
    const OP: &str = "attention";
    let [n, d, t] = match *q.shape() {
        [n, d, t] => [n, d, t],
        _ => return Err(Error::shape(OP, format!("q must be [N, d, T], got {q:?}"))),
    };
    for (what, x) in [("q", q), ("k", k), ("v", v), ("out", out)] {
        if x.shape() != q.shape() || x.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!("{what} must be f32 {:?} like q, got {x:?}", q.shape()),
            ));
        }
    }
    if q.numel() > u32::MAX as usize {
        return Err(Error::shape(OP, format!("{q:?} exceeds u32 indexing")));
    }
    if d > MAX_HEAD_DIM {
        return Err(Error::Unsupported(format!(
            "attention head dimension {d} (at most {MAX_HEAD_DIM})"
        )));
    }
    let prob = AttentionProblem {
        f16_operands,
        ..AttentionProblem::self_attention(n, 1, t, d, Strides::channel_major(d, t), scale)
    };
    flash_attention(rec, &prob, q, KvInput::F32 { k, v }, out)
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let small = CPU_CONFIGS.map(|c| cfg(c.ds, CPU_SMALL_QG, c.dpt));
    let plain = CONFIGS.iter().chain(&CPU_CONFIGS).chain(&small);
    // Wide heads run the widest configuration of each table.
    let widest = [CONFIGS[5], CPU_CONFIGS[5], small[5]];
    let mut v: Vec<(KernelSpec, PipelineKey)> = plain
        .map(|c| (c, false))
        .chain(widest.iter().map(|c| (c, true)))
        .flat_map(|(c, w)| {
            [
                (ATTENTION, key(c, false, w)),
                (ATTENTION_INT8, key(c, true, w)),
            ]
        })
        .collect();
    v.extend(matrix::variants());
    v.push((KV_APPEND, append_key(false)));
    v.push((KV_APPEND_INT8, append_key(true)));
    v
}

mod append;
mod cpu;
pub mod mask;
mod matrix;
mod problem;

pub use append::{kv_append, KvOutput};
pub use cpu::cpu_attention;
pub use mask::{FrameWindow, Mask};
pub use matrix::MatrixAttention;
pub use problem::{AttentionProblem, KvInput, Strides};

#[cfg(test)]
mod matrix_tests;
#[cfg(test)]
mod tests;
