//! `shaders/attention.wgsl`: the flash-attention kernel family.
//!
//! One kernel ([`flash_attention`]) for every attention the engine runs: the
//! VAE mid-block (one head of d = 512, channel-major `[N, d, T]` straight
//! from the 1x1 convs; see [`attention`]) and multi-head transformer
//! attention (token-major `[B, T, H, d]`, head-major `[B, H, T, d]`, KV-cache
//! ring buffers), with optional causal and frame-window masks
//! ([`crate::attention::Mask`]) and f32 or int8 K/V ([`KvInput`]). Every
//! tensor is addressed through [`Strides`] of a `[batch, head, token,
//! channel]` view.
//!
//! Online softmax over key tiles staged in workgroup memory, f32
//! accumulation, O(T) memory (the T x T score matrix never exists; the kernel
//! needs no scratch buffer at all). The head dimension is split across
//! invocations (partial dot products reduced through workgroup memory), so
//! d = 512 fits in about 25 KiB of workgroup memory. The specialisation is
//! picked by d (see [`CONFIGS`]). Masks skip whole tiles: a workgroup only
//! walks the (at most two) key ranges its queries can see, and masks element
//! by element only in tiles that straddle a window or causal edge.
//!
//! int8 K/V are dequantised inside the kernel, tile by tile, as the tiles are
//! staged (never expanded in memory); [`kv_append`] writes (and for int8
//! quantises) new keys / values into a cache.

use bytemuck::{Pod, Zeroable};

use crate::attention::Mask;
use crate::error::{Error, Result};
use crate::gpu::{
    linear_groups, BindingKind, Capabilities, KernelSpec, PipelineKey, Recorder, WgslSource,
};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/attention.wgsl");

/// Largest head dimension supported.
pub const MAX_HEAD_DIM: usize = 512;

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
    /// q / out stride between batches (elements).
    pub q_sb: u32,
    /// q / out stride between heads.
    pub q_sh: u32,
    /// q / out stride between tokens.
    pub q_st: u32,
    /// q / out stride between channels.
    pub q_sc: u32,
    /// k / v stride between batches.
    pub kv_sb: u32,
    /// k / v stride between heads.
    pub kv_sh: u32,
    /// k / v stride between tokens.
    pub kv_st: u32,
    /// k / v stride between channels.
    pub kv_sc: u32,
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
pub const ATTENTION: KernelSpec = KernelSpec {
    family: "attention",
    source: WgslSource::Static(SOURCE),
    entry: "attention",
    bindings: &[
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::ReadWrite,
        BindingKind::ReadWrite,
    ],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// Attention with int8 K/V: q, k codes, k scales, v codes, v scales,
/// stats, out.
pub const ATTENTION_INT8: KernelSpec = KernelSpec {
    family: "attention",
    source: WgslSource::Static(SOURCE),
    entry: "attention",
    bindings: &[
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::ReadWrite,
        BindingKind::ReadWrite,
    ],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

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
    /// Source stride between batches (elements).
    pub src_sb: u32,
    /// Source stride between heads.
    pub src_sh: u32,
    /// Source stride between tokens.
    pub src_st: u32,
    /// Source stride between channels.
    pub src_sc: u32,
    /// Cache stride between batches.
    pub dst_sb: u32,
    /// Cache stride between heads.
    pub dst_sh: u32,
    /// Cache stride between tokens.
    pub dst_st: u32,
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
pub const KV_APPEND: KernelSpec = KernelSpec {
    family: "attention",
    source: WgslSource::Static(SOURCE),
    entry: "kv_append",
    bindings: &[BindingKind::Read, BindingKind::ReadWrite],
    uniform_size: std::mem::size_of::<AppendParams>() as u64,
};

/// KV append with int8 quantisation: src, codes, scales.
pub const KV_APPEND_INT8: KernelSpec = KernelSpec {
    family: "attention",
    source: WgslSource::Static(SOURCE),
    entry: "kv_append",
    bindings: &[
        BindingKind::Read,
        BindingKind::ReadWrite,
        BindingKind::ReadWrite,
    ],
    uniform_size: std::mem::size_of::<AppendParams>() as u64,
};

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
    /// Largest head dimension this configuration handles.
    pub fn max_d(&self) -> usize {
        (self.ds * self.dpt) as usize
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

/// The GPU configuration used for head dimension `d`.
pub fn config_for(d: usize) -> Option<AttentionConfig> {
    CONFIGS.iter().copied().find(|c| d <= c.max_d())
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
        if let Some(mut c) = CPU_CONFIGS.iter().copied().find(|c| d <= c.max_d()) {
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

fn key(c: &AttentionConfig, int8: bool) -> PipelineKey {
    let spec = if int8 { &ATTENTION_INT8 } else { &ATTENTION };
    PipelineKey::new(spec)
        .flag("ATTENTION")
        .flag_if(int8, "KV_INT8")
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

/// Element strides of a `[batch, head, token, channel]` view of a tensor.
/// For int8 K/V the strides are those of the f32 layout the codes replace
/// (channel stride 1); the kernels convert them to words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// Stride between batches (elements).
    pub batch: usize,
    /// Stride between heads.
    pub head: usize,
    /// Stride between tokens.
    pub token: usize,
    /// Stride between channels.
    pub channel: usize,
}

impl Strides {
    /// Token-major `[B, T, H, d]` (transformers, KV caches).
    pub fn token_major(tokens: usize, heads: usize, d: usize) -> Self {
        Strides {
            batch: tokens * heads * d,
            head: d,
            token: heads * d,
            channel: 1,
        }
    }

    /// Head-major `[B, H, T, d]`.
    pub fn head_major(heads: usize, tokens: usize, d: usize) -> Self {
        Strides {
            batch: heads * tokens * d,
            head: tokens * d,
            token: d,
            channel: 1,
        }
    }

    /// Channel-major single head `[N, d, T]` (NCHW activations, T = H·W).
    pub fn channel_major(d: usize, tokens: usize) -> Self {
        Strides {
            batch: d * tokens,
            head: 0,
            token: 1,
            channel: tokens,
        }
    }

    /// Largest element offset the view touches (for bounds checks).
    pub fn max_offset(&self, batch: usize, heads: usize, tokens: usize, d: usize) -> usize {
        if batch == 0 || heads == 0 || tokens == 0 || d == 0 {
            return 0;
        }
        (batch - 1) * self.batch
            + (heads - 1) * self.head
            + (tokens - 1) * self.token
            + (d - 1) * self.channel
    }

    fn words(&self) -> Strides {
        Strides {
            batch: self.batch / 4,
            head: self.head / 4,
            token: self.token / 4,
            channel: 1,
        }
    }
}

/// Keys and values as the kernel reads them.
#[derive(Clone, Copy, Debug)]
pub enum KvInput<'a> {
    /// f32 tensors laid out by the problem's `kv_strides`.
    F32 {
        /// Keys.
        k: &'a Tensor,
        /// Values.
        v: &'a Tensor,
    },
    /// int8 codes (four per u32 word, stored as [`DType::Rgba8`] words) and
    /// one f32 scale per (batch, token, head), index = word offset / (d / 4).
    Int8 {
        /// Key codes.
        k_codes: &'a Tensor,
        /// Key scales.
        k_scales: &'a Tensor,
        /// Value codes.
        v_codes: &'a Tensor,
        /// Value scales.
        v_scales: &'a Tensor,
    },
}

/// The shape of one attention call. Queries are tokens `0 .. q_len` of q,
/// keys `0 .. kv_len` of k / v; query i sits at key position `q_pos0 + i`
/// for the masks (a chunk of queries appended after earlier keys).
#[derive(Clone, Copy, Debug)]
pub struct AttentionProblem {
    /// Batch size.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Queries.
    pub q_len: usize,
    /// Keys (and values).
    pub kv_len: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Strides of q and out.
    pub q_strides: Strides,
    /// Strides of k and v.
    pub kv_strides: Strides,
    /// Softmax scale (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Causal / frame-window masks.
    pub mask: Mask,
    /// Key position of query 0.
    pub q_pos0: usize,
    /// Forces a kernel configuration (tests, tuning); `None`: the device's
    /// choice ([`config_for_device`]).
    pub config: Option<AttentionConfig>,
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
/// loop, both tile loads with their per-key loops, the partial-sum
/// reduction, the two channel loops) under 90 % of
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
    let load_elems = if int8 { d / 4 * 2 } else { d * 2 };
    let load = load_elems.div_ceil(wg) * 5;
    let reduce = (c.queries() as usize * 2).div_ceil(wg) * (1 + ds);
    let per_tile = 1 + 2 * load + reduce + 2 * dpt;
    let fixed = 2 * dpt + 64;
    let tiles = (CPU_LOOP_ITERATION_LIMIT * 9 / 10 - fixed) / per_tile;
    Some(tiles.max(1) * KEYS_PER_TILE as usize)
}

/// f32 elements of the `stats` scratch a problem needs on this device
/// (`batch · heads · q_len · 2` when its keys are split over several
/// dispatches, else 0).
pub fn stats_len(prob: &AttentionProblem, int8: bool, caps: &Capabilities) -> usize {
    let config = prob
        .config
        .or_else(|| config_for_device(prob.head_dim, prob.q_len, caps));
    match config.and_then(|c| keys_per_dispatch(&c, prob.head_dim, int8, caps)) {
        Some(keys) if prob.kv_len > keys => prob.batch * prob.heads * prob.q_len * 2,
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
/// `out` and `stats` (`[batch * heads, q_len, 2]` f32, required unless
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
    let config = match prob.config {
        Some(c) if d <= c.max_d() => c,
        Some(c) => {
            return Err(Error::Unsupported(format!(
                "attention configuration {c:?} handles d <= {}, not {d}",
                c.max_d()
            )))
        }
        None => config_for_device(d, q_len, rec.ctx().caps()).ok_or_else(|| {
            Error::Unsupported(format!(
                "attention head dimension {d} (at most {MAX_HEAD_DIM})"
            ))
        })?,
    };
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
            let s = prob.kv_strides;
            if !d.is_multiple_of(4)
                || s.channel != 1
                || !s.batch.is_multiple_of(d)
                || !s.head.is_multiple_of(d)
                || !s.token.is_multiple_of(d)
            {
                return Err(Error::shape(
                    OP,
                    format!("int8 K/V need d % 4 == 0 and a dense channel-innermost layout, got d = {d}, {s:?}"),
                ));
            }
            let words = s.words();
            let code_words = words.max_offset(batch, heads, kv_len, d / 4) + 1;
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
    let qs = prob.q_strides;
    let params = Params {
        d: d as u32,
        n_q: to_u32(OP, "q_len", q_len)?,
        n_kv: to_u32(OP, "kv_len", kv_len)?,
        heads: heads as u32,
        q_sb: to_u32(OP, "q batch stride", qs.batch)?,
        q_sh: to_u32(OP, "q head stride", qs.head)?,
        q_st: to_u32(OP, "q token stride", qs.token)?,
        q_sc: to_u32(OP, "q channel stride", qs.channel)?,
        kv_sb: to_u32(OP, "kv batch stride", kv_strides.batch)?,
        kv_sh: to_u32(OP, "kv head stride", kv_strides.head)?,
        kv_st: to_u32(OP, "kv token stride", kv_strides.token)?,
        kv_sc: to_u32(OP, "kv channel stride", kv_strides.channel)?,
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
    let groups = [
        to_u32(
            OP,
            "query blocks",
            q_len.div_ceil(config.queries() as usize),
        )?,
        to_u32(OP, "batch * heads", batch * heads)?,
        1,
    ];
    // QK^T and PV: 2 d multiply-adds per visible (query, key) pair.
    let pairs = prob.mask.visible_pairs(prob.q_pos0, q_len, kv_len);
    let macs = 2 * pairs * (batch * heads * d) as u64;
    let int8 = matches!(kv, KvInput::Int8 { .. });
    let spec = if int8 { &ATTENTION_INT8 } else { &ATTENTION };
    let share = keys_per_dispatch(&config, d, int8, rec.ctx().caps())
        .filter(|&keys| kv_len > keys)
        .unwrap_or(kv_len.max(1));
    let shares = kv_len.div_ceil(share).max(1);
    // Unused in a single dispatch over all keys: `out` stands in for the binding.
    let stats = match stats {
        _ if shares == 1 && role == BlockRole::WHOLE => out,
        Some(t) => {
            check_holds(OP, "stats", t, DType::F32, batch * heads * q_len * 2)?;
            if t.overlaps(out) || kv_tensors.iter().chain([&q]).any(|x| t.overlaps(x)) {
                return Err(Error::shape(OP, "stats must not overlap q, k, v or out"));
            }
            t
        }
        None => {
            return Err(Error::shape(
                OP,
                format!(
                    "{kv_len} keys in {shares} dispatch(es) ({role:?}) need a stats scratch of {} f32 (see stats_len)",
                    batch * heads * q_len * 2
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
        rec.dispatch(spec, &key(&config, int8), &params, &tensors, groups, m)?;
    }
    Ok(())
}

/// q, k, v `[N, d, T]` f32 (T = H*W tokens, d <= 512); out `[N, d, T]`;
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
    let strides = Strides::channel_major(d, t);
    let prob = AttentionProblem {
        batch: n,
        heads: 1,
        q_len: t,
        kv_len: t,
        head_dim: d,
        q_strides: strides,
        kv_strides: strides,
        scale,
        mask: Mask::NONE,
        q_pos0: 0,
        config: None,
    };
    flash_attention(rec, &prob, q, KvInput::F32 { k, v }, out)
}

/// Where [`kv_append`] writes.
#[derive(Clone, Copy, Debug)]
pub enum KvOutput<'a> {
    /// An f32 cache.
    F32(&'a Tensor),
    /// An int8 cache: codes (Rgba8 words) and scales (f32).
    Int8 {
        /// Codes (Rgba8 words).
        codes: &'a Tensor,
        /// Scales (f32).
        scales: &'a Tensor,
    },
}

/// Tokens `src_t0 .. src_t0 + tokens` of `src` (f32, `[batch, heads, token,
/// d]` view through `src_strides`) are written to tokens `dst_t0 ..` of a
/// cache with `dst_strides` (f32 layout, channel stride 1): copied (f32) or
/// quantised to int8 with one scale per (batch, token, head).
#[allow(clippy::too_many_arguments)]
pub fn kv_append(
    rec: &mut Recorder,
    src: &Tensor,
    src_strides: Strides,
    src_t0: usize,
    dst: KvOutput,
    dst_strides: Strides,
    dst_t0: usize,
    batch: usize,
    heads: usize,
    tokens: usize,
    d: usize,
) -> Result<()> {
    const OP: &str = "kv_append";
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::shape(OP, format!("head dimension {d}")));
    }
    let src_elems = src_strides.max_offset(batch, heads, src_t0 + tokens, d) + 1;
    check_holds(OP, "src", src, DType::F32, src_elems)?;
    if dst_strides.channel != 1 {
        return Err(Error::shape(
            OP,
            format!("cache channel stride must be 1, got {dst_strides:?}"),
        ));
    }
    let dst_elems = dst_strides.max_offset(batch, heads, dst_t0 + tokens, d) + 1;
    let (spec, dst_s, tensors): (&KernelSpec, Strides, Vec<&Tensor>) = match dst {
        KvOutput::F32(t) => {
            check_holds(OP, "cache", t, DType::F32, dst_elems)?;
            (&KV_APPEND, dst_strides, vec![src, t])
        }
        KvOutput::Int8 { codes, scales } => {
            let s = dst_strides;
            if !d.is_multiple_of(4)
                || !s.batch.is_multiple_of(d)
                || !s.head.is_multiple_of(d)
                || !s.token.is_multiple_of(d)
            {
                return Err(Error::shape(
                    OP,
                    format!("int8 caches need d % 4 == 0 and a dense layout, got d = {d}, {s:?}"),
                ));
            }
            let words = s.words();
            let code_words = words.max_offset(batch, heads, dst_t0 + tokens, d / 4) + 1;
            check_holds(OP, "codes", codes, DType::Rgba8, code_words)?;
            check_holds(OP, "scales", scales, DType::F32, code_words.div_ceil(d / 4))?;
            (&KV_APPEND_INT8, words, vec![src, codes, scales])
        }
    };
    if tensors[1..].iter().any(|t| t.overlaps(src)) {
        return Err(Error::shape(OP, "the cache must not overlap the source"));
    }
    let params = AppendParams {
        d: d as u32,
        heads: to_u32(OP, "heads", heads)?,
        tokens: to_u32(OP, "tokens", tokens)?,
        batch: to_u32(OP, "batch", batch)?,
        src_sb: to_u32(OP, "src batch stride", src_strides.batch)?,
        src_sh: to_u32(OP, "src head stride", src_strides.head)?,
        src_st: to_u32(OP, "src token stride", src_strides.token)?,
        src_sc: to_u32(OP, "src channel stride", src_strides.channel)?,
        dst_sb: to_u32(OP, "cache batch stride", dst_s.batch)?,
        dst_sh: to_u32(OP, "cache head stride", dst_s.head)?,
        dst_st: to_u32(OP, "cache token stride", dst_s.token)?,
        src_t0: to_u32(OP, "src_t0", src_t0)?,
        dst_t0: to_u32(OP, "dst_t0", dst_t0)?,
        ..Default::default()
    };
    let rows = (batch * heads * tokens) as u64;
    let groups = linear_groups(rec.ctx(), rows.div_ceil(APPEND_WG as u64))?;
    let int8 = matches!(dst, KvOutput::Int8 { .. });
    rec.dispatch(spec, &append_key(int8), &params, &tensors, groups, 0)
}

/// CPU reference (f64 softmax and sums): q, k, v `[n, d, t]` → out `[n, d, t]`.
pub fn cpu_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    d: usize,
    t: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0; n * d * t];
    let mut scores = vec![0.0f64; t];
    for b in 0..n {
        let base = b * d * t;
        for i in 0..t {
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let mut dot = 0.0f64;
                for c in 0..d {
                    dot += q[base + c * t + i] as f64 * k[base + c * t + j] as f64;
                }
                *s = dot * scale as f64;
                max = max.max(*s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            for c in 0..d {
                let row = &v[base + c * t..base + (c + 1) * t];
                let acc: f64 = row.iter().zip(&scores).map(|(&x, &p)| x as f64 * p).sum();
                out[base + c * t + i] = (acc / sum) as f32;
            }
        }
    }
    out
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let small = CPU_CONFIGS.map(|c| cfg(c.ds, CPU_SMALL_QG, c.dpt));
    let mut v: Vec<(KernelSpec, PipelineKey)> = CONFIGS
        .iter()
        .chain(&CPU_CONFIGS)
        .chain(&small)
        .flat_map(|c| [(ATTENTION, key(c, false)), (ATTENTION_INT8, key(c, true))])
        .collect();
    v.push((KV_APPEND, append_key(false)));
    v.push((KV_APPEND_INT8, append_key(true)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    #[test]
    fn configs_fit_webgpu_default_limits() {
        for c in CONFIGS.iter().chain(&CPU_CONFIGS) {
            assert!(
                c.workgroup_bytes() <= 16384 * 2,
                "{c:?}: {} bytes",
                c.workgroup_bytes()
            );
            assert!(c.invocations() <= 256, "{c:?}");
        }
        assert_eq!(config_for(512).map(|c| c.max_d()), Some(512));
        assert_eq!(config_for(513), None);
        let cpu = test_context().caps().clone();
        if cpu.is_cpu() {
            let big = config_for_device(128, 4680, &cpu).unwrap();
            let small = config_for_device(128, 93, &cpu).unwrap();
            assert_eq!((big.ds, big.qg, small.qg), (2, 64, CPU_SMALL_QG));
        }
        let gpu = Capabilities::reference_gpu();
        assert_eq!(config_for_device(512, 4096, &gpu), config_for(512));
    }

    /// d in {8, 33, 64, 512} x T in {1, 7, 37, 300}, batch 2, against an f64
    /// reference. Tolerance: 1e-4 relative + 1e-5 absolute. Inputs in
    /// [-2, 2] with scale 1/sqrt(d) give peaked as well as flat softmaxes.
    #[test]
    fn attention_matches_cpu() {
        let ctx = test_context();
        let n = 2;
        let mut seed = 0;
        for d in [8usize, 33, 64, 512] {
            for t in [1usize, 7, 37, 300] {
                seed += 3;
                let len = n * d * t;
                let qd = rand_vec(len, seed, 2.0);
                let kd = rand_vec(len, seed + 1, 2.0);
                let vd = rand_vec(len, seed + 2, 1.0);
                let scale = 1.0 / (d as f32).sqrt();
                let shape = [n, d, t];
                let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
                let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
                let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
                let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
                let mut rec = Recorder::new(&ctx);
                attention(&mut rec, &q, &k, &v, scale, &out).unwrap();
                rec.submit().unwrap();
                let want = cpu_attention(&qd, &kd, &vd, n, d, t, scale);
                assert_close(
                    &out.to_f32(&ctx).unwrap(),
                    &want,
                    1e-5,
                    1e-4,
                    &format!("attention d={d} T={t}"),
                );
            }
        }
    }

    /// Every configuration (GPU table, CPU table, short-block CPU variants),
    /// forced, at its largest head dimension and one odd one below, with a
    /// sink + window + causal mask and odd token counts, against the CPU.
    /// (On this CPU adapter the engine itself would pick only the CPU table.)
    #[test]
    fn every_configuration_matches_cpu() {
        use crate::attention::cpu::cpu_attention as cpu_mha;
        let ctx = test_context();
        let small = CPU_CONFIGS.map(|c| cfg(c.ds, CPU_SMALL_QG, c.dpt));
        let mask = Mask::frame_window(7, 1, Some(2)).and_causal();
        let mut seed = 500;
        for c in CONFIGS.iter().chain(&CPU_CONFIGS).chain(&small).copied() {
            if check_device(&Recorder::new(&ctx), &c, c.max_d()).is_err() {
                println!("{c:?}: does not fit this device, skipped");
                continue;
            }
            for d in [c.max_d(), c.max_d() - 3] {
                seed += 3;
                let (h, t) = (2, 37);
                let qd = rand_vec(t * h * d, seed, 2.0);
                let kd = rand_vec(t * h * d, seed + 1, 2.0);
                let vd = rand_vec(t * h * d, seed + 2, 1.0);
                let shape = [1, t, h, d];
                let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
                let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
                let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
                let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let strides = Strides::token_major(t, h, d);
                let prob = AttentionProblem {
                    batch: 1,
                    heads: h,
                    q_len: t,
                    kv_len: t,
                    head_dim: d,
                    q_strides: strides,
                    kv_strides: strides,
                    scale,
                    mask,
                    q_pos0: 0,
                    config: Some(c),
                };
                let mut rec = Recorder::new(&ctx);
                flash_attention(&mut rec, &prob, &q, KvInput::F32 { k: &k, v: &v }, &out).unwrap();
                rec.submit().unwrap();
                let want = cpu_mha(&qd, &kd, &vd, 1, h, t, t, d, scale, &mask, 0);
                assert_close(
                    &out.to_f32(&ctx).unwrap(),
                    &want,
                    1e-5,
                    1e-4,
                    &format!("{c:?} d={d}"),
                );
                if d % 4 == 0 {
                    // int8 K/V through the same configuration, against the
                    // CPU over the dequantised values.
                    let mut rec = Recorder::new(&ctx);
                    let k8 = crate::attention::QuantizedKv::quantize(&mut rec, &k, "k").unwrap();
                    let v8 = crate::attention::QuantizedKv::quantize(&mut rec, &v, "v").unwrap();
                    let kv = KvInput::Int8 {
                        k_codes: &k8.codes,
                        k_scales: &k8.scales,
                        v_codes: &v8.codes,
                        v_scales: &v8.scales,
                    };
                    flash_attention(&mut rec, &prob, &q, kv, &out).unwrap();
                    rec.submit().unwrap();
                    let (kq, vq) = (k8.to_f32(&ctx).unwrap(), v8.to_f32(&ctx).unwrap());
                    let want = cpu_mha(&qd, &kq, &vq, 1, h, t, t, d, scale, &mask, 0);
                    assert_close(
                        &out.to_f32(&ctx).unwrap(),
                        &want,
                        1e-5,
                        1e-4,
                        &format!("int8 {c:?} d={d}"),
                    );
                }
            }
        }
    }

    /// Large logits (scale 1): the online softmax must not overflow.
    #[test]
    fn attention_is_stable_with_large_scores() {
        let ctx = test_context();
        let (n, d, t) = (1, 64, 45);
        let qd = rand_vec(n * d * t, 91, 4.0);
        let kd = rand_vec(n * d * t, 92, 4.0);
        let vd = rand_vec(n * d * t, 93, 1.0);
        let shape = [n, d, t];
        let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
        let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
        let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
        let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        attention(&mut rec, &q, &k, &v, 1.0, &out).unwrap();
        rec.submit().unwrap();
        let want = cpu_attention(&qd, &kd, &vd, n, d, t, 1.0);
        // Logits reach ~±200: exp's relative error grows with |x| (Vulkan: 3 + 2|x| ulp).
        assert_close(
            &out.to_f32(&ctx).unwrap(),
            &want,
            1e-4,
            1e-3,
            "large-score attention",
        );
    }

    #[test]
    fn bad_shapes_are_errors() {
        let ctx = test_context();
        let q = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "q").unwrap();
        let k = Tensor::empty(&ctx, &[1, 8, 6], DType::F32, "k").unwrap();
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            attention(&mut rec, &q, &k, &q, 1.0, &q),
            Err(Error::Shape { .. })
        ));
        let q4 = Tensor::empty(&ctx, &[1, 8, 5, 1], DType::F32, "q4").unwrap();
        assert!(matches!(
            attention(&mut rec, &q4, &q4, &q4, 1.0, &q4),
            Err(Error::Shape { .. })
        ));
        let big = Tensor::empty(&ctx, &[1, 513, 2], DType::F32, "big").unwrap();
        assert!(matches!(
            attention(&mut rec, &big, &big, &big, 1.0, &big),
            Err(Error::Unsupported(_))
        ));
    }

    /// Channel-major `[n, d, tq]` queries over `[n, d, tk]` keys/values, f64.
    #[allow(clippy::too_many_arguments)]
    fn cpu_cross(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        d: usize,
        tq: usize,
        tk: usize,
        scale: f32,
    ) -> Vec<f32> {
        let mut out = vec![0f32; n * d * tq];
        for b in 0..n {
            let (qb, kb, vb) = (&q[b * d * tq..], &k[b * d * tk..], &v[b * d * tk..]);
            for i in 0..tq {
                let s: Vec<f64> = (0..tk)
                    .map(|j| {
                        (0..d)
                            .map(|c| qb[c * tq + i] as f64 * kb[c * tk + j] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    let o: f64 = (0..tk).map(|j| e[j] * vb[c * tk + j] as f64).sum();
                    out[b * d * tq + c * tq + i] = (o / z) as f32;
                }
            }
        }
        out
    }

    /// Columns `[t0, t1)` of `[n, d, t]` data.
    fn columns(x: &[f32], n: usize, d: usize, t: usize, t0: usize, t1: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n * d * (t1 - t0));
        for row in 0..n * d {
            out.extend_from_slice(&x[row * t + t0..row * t + t1]);
        }
        out
    }

    /// Keys split over separate tensors (uneven blocks, blocks shorter than
    /// a key tile, one block longer than a CPU adapter runs in one dispatch)
    /// combine through `flash_attention_block` to attention over all keys;
    /// d in {33, 64, 512}, batch 2, odd query counts. Tolerance 1e-5 abs +
    /// 1e-4 rel vs an f64 reference.
    #[test]
    fn key_blocks_combine_to_full_attention() {
        let ctx = test_context();
        let caps = ctx.caps().clone();
        let n = 2;
        let cpu_share = |d: usize, tq: usize| {
            config_for_device(d, tq, &caps)
                .and_then(|c| keys_per_dispatch(&c, d, false, &caps))
                .unwrap_or(40)
        };
        let long = cpu_share(512, 9) + 13;
        for (d, tq, k_splits) in [
            (33usize, 37usize, vec![0, 5, 20, 37]),
            (64, 13, vec![0, 1, 9, 30, 45]),
            (512, 29, vec![0, 29]),
            (512, 9, vec![0, 7, 7 + long, 7 + long + 3]),
        ] {
            let tk = *k_splits.last().unwrap();
            let qd = rand_vec(n * d * tq, d as u64, 2.0);
            let kd = rand_vec(n * d * tk, d as u64 + 1, 2.0);
            let vd = rand_vec(n * d * tk, d as u64 + 2, 1.0);
            let scale = 1.0 / (d as f32).sqrt();
            let want = cpu_cross(&qd, &kd, &vd, n, d, tq, tk, scale);
            let q = Tensor::from_f32(&ctx, &[n, d, tq], &qd, "q").unwrap();
            let out = Tensor::empty(&ctx, &[n, d, tq], DType::F32, "out").unwrap();
            let stats = Tensor::empty(&ctx, &[n * tq * 2], DType::F32, "stats").unwrap();
            let mut rec = Recorder::new(&ctx);
            let blocks = k_splits.len() - 1;
            for (b, ks) in k_splits.windows(2).enumerate() {
                let len = ks[1] - ks[0];
                let k = Tensor::from_f32_in(
                    &mut rec,
                    &[n, d, len],
                    &columns(&kd, n, d, tk, ks[0], ks[1]),
                    "k",
                )
                .unwrap();
                let v = Tensor::from_f32_in(
                    &mut rec,
                    &[n, d, len],
                    &columns(&vd, n, d, tk, ks[0], ks[1]),
                    "v",
                )
                .unwrap();
                let prob = AttentionProblem {
                    batch: n,
                    heads: 1,
                    q_len: tq,
                    kv_len: len,
                    head_dim: d,
                    q_strides: Strides::channel_major(d, tq),
                    kv_strides: Strides::channel_major(d, len),
                    scale,
                    mask: Mask::NONE,
                    q_pos0: 0,
                    config: None,
                };
                let role = BlockRole {
                    first: b == 0,
                    last: b + 1 == blocks,
                };
                flash_attention_block(
                    &mut rec,
                    &prob,
                    &q,
                    KvInput::F32 { k: &k, v: &v },
                    &out,
                    Some(&stats),
                    role,
                )
                .unwrap();
            }
            rec.submit().unwrap();
            assert_close(
                &out.to_f32(&ctx).unwrap(),
                &want,
                1e-5,
                1e-4,
                &format!("d={d} queries {tq} key blocks {k_splits:?}"),
            );
        }
        // A block of a longer sequence without a stats scratch is an error.
        let q = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "q").unwrap();
        let o = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "o").unwrap();
        let prob = AttentionProblem {
            batch: 1,
            heads: 1,
            q_len: 5,
            kv_len: 5,
            head_dim: 8,
            q_strides: Strides::channel_major(8, 5),
            kv_strides: Strides::channel_major(8, 5),
            scale: 1.0,
            mask: Mask::NONE,
            q_pos0: 0,
            config: None,
        };
        let role = BlockRole {
            first: true,
            last: false,
        };
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            flash_attention_block(
                &mut rec,
                &prob,
                &q,
                KvInput::F32 { k: &q, v: &q },
                &o,
                None,
                role
            ),
            Err(Error::Shape { .. })
        ));
    }

    /// Rough throughput: `cargo test --lib attention_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn attention_throughput() {
        let ctx = test_context();
        let t: usize = std::env::var("ATT_T")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(4096);
        let d: usize = std::env::var("ATT_D")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(512);
        let n = 1;
        let shape = [n, d, t];
        let data = rand_vec(n * d * t, 5, 1.0);
        let q = Tensor::from_f32(&ctx, &shape, &data, "q").unwrap();
        let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
        // Warm up (pipeline compile) on a small problem.
        let small = Tensor::from_f32(&ctx, &[1, d, 16], &data[..d * 16], "s").unwrap();
        let small_out = Tensor::empty(&ctx, &[1, d, 16], DType::F32, "so").unwrap();
        let mut rec = Recorder::new(&ctx);
        attention(&mut rec, &small, &small, &small, 0.044, &small_out).unwrap();
        rec.submit().unwrap();
        ctx.wait_idle().unwrap();
        let start = std::time::Instant::now();
        let mut rec = Recorder::new(&ctx);
        attention(&mut rec, &q, &q, &q, 1.0 / (d as f32).sqrt(), &out).unwrap();
        rec.submit().unwrap();
        ctx.wait_idle().unwrap();
        let secs = start.elapsed().as_secs_f64();
        let flops = 4.0 * (t * t * d) as f64;
        println!(
            "attention d={d} T={t}: {:.3} s, {:.2} GFLOP/s",
            secs,
            flops / secs / 1e9
        );
    }

    /// Multi-head throughput, GPU time from timestamps:
    /// `ATT_T=4096 ATT_H=16 ATT_D=8 ATT_WINDOW=64,1,8 ATT_INT8=1 cargo test --lib multihead_throughput -- --ignored --nocapture`
    /// (ATT_WINDOW = tokens per frame, sinks, window frames).
    #[test]
    #[ignore]
    fn multihead_throughput() {
        use crate::attention::{
            multi_head_attention, multi_head_attention_int8, AttentionOptions, QuantizedKv,
        };
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(d)
        };
        let (t, h, d) = (env("ATT_T", 2048), env("ATT_H", 16), env("ATT_D", 8));
        let mask = match std::env::var("ATT_WINDOW") {
            Ok(w) => {
                let v: Vec<usize> = w.split(',').filter_map(|x| x.parse().ok()).collect();
                Mask::frame_window(v[0], v[1], Some(v[2]))
            }
            Err(_) => Mask::NONE,
        };
        let int8 = std::env::var("ATT_INT8").is_ok();
        // ATT_CFG=ds,qg,dpt forces a configuration.
        let forced = std::env::var("ATT_CFG").ok().map(|v| {
            let v: Vec<u32> = v.split(',').filter_map(|x| x.parse().ok()).collect();
            cfg(v[0], v[1], v[2])
        });
        let ctx = test_context();
        let shape = [1, t, h, d];
        let x = Tensor::from_f32(&ctx, &shape, &rand_vec(t * h * d, 1, 1.0), "x").unwrap();
        let y = Tensor::from_f32(&ctx, &shape, &rand_vec(t * h * d, 2, 1.0), "y").unwrap();
        let nq = env("ATT_Q", t);
        let qx =
            Tensor::from_f32(&ctx, &[1, nq, h, d], &rand_vec(nq * h * d, 3, 1.0), "q").unwrap();
        let out = Tensor::empty(&ctx, &[1, nq, h, d], DType::F32, "out").unwrap();
        let mut rec = Recorder::new(&ctx);
        let k8 = QuantizedKv::quantize(&mut rec, &x, "k").unwrap();
        let v8 = QuantizedKv::quantize(&mut rec, &y, "v").unwrap();
        rec.submit().unwrap();
        let opts = AttentionOptions::masked(mask);
        // Process CPU seconds (utime + stime): on a software rasteriser this
        // measures the work even when other processes share the cores.
        let cpu_s = || -> f64 {
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
            let rest = stat.rsplit(')').next().unwrap_or("");
            let f: Vec<f64> = rest
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0.0))
                .collect();
            (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
        };
        for run in 0..3 {
            let c0 = cpu_s();
            let mut rec = Recorder::new(&ctx);
            rec.enable_profiling();
            if let Some(config) = forced {
                let prob = AttentionProblem {
                    batch: 1,
                    heads: h,
                    q_len: nq,
                    kv_len: t,
                    head_dim: d,
                    q_strides: Strides::token_major(nq, h, d),
                    kv_strides: Strides::token_major(t, h, d),
                    scale: 1.0 / (d as f32).sqrt(),
                    mask,
                    q_pos0: 0,
                    config: Some(config),
                };
                let kv = if int8 {
                    KvInput::Int8 {
                        k_codes: &k8.codes,
                        k_scales: &k8.scales,
                        v_codes: &v8.codes,
                        v_scales: &v8.scales,
                    }
                } else {
                    KvInput::F32 { k: &x, v: &y }
                };
                flash_attention(&mut rec, &prob, &qx, kv, &out).unwrap();
            } else if int8 {
                multi_head_attention_int8(&mut rec, &qx, &k8, &v8, &out, &opts).unwrap();
            } else {
                multi_head_attention(&mut rec, &qx, &x, &y, &out, &opts).unwrap();
            }
            let rec_macs: u64 = rec.labels().iter().map(|l| l.macs).sum();
            let (_, prof) = rec.submit_profiled().unwrap();
            let p = prof.unwrap();
            let cpu = cpu_s() - c0;
            let macs: u64 = rec_macs;
            let flop = 2.0 * macs as f64 / 1e9;
            println!(
                "run {run}: Q={nq} T={t} H={h} d={d} int8={int8} {mask:?}: {:.1} ms, {:.2} GFLOP/s; {cpu:.2} CPU s, {:.2} GFLOP per CPU s",
                p.gpu_ms, flop / (p.gpu_ms / 1e3), flop / cpu
            );
        }
    }
}
