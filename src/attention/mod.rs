//! Multi-head flash attention for transformers: layouts, masks, KV caches.
//!
//! - [`multi_head_attention`] / [`multi_head_attention_int8`]: q, k, v in
//!   token-major `[B, T, H, d]` (or head-major `[B, H, T, d]`, see
//!   [`Layout`]), head dimension up to 4096 (transformers use <= 128; past
//!   512 in output chunks, see `kernels::attention`), with
//!   causal / frame-window masks ([`Mask`]); one dispatch of the flash kernel
//!   in `shaders/attention.wgsl` (O(T) memory, no score matrix).
//! - [`RingKvCache`]: a static per-layer KV cache of `s` pinned sink frames
//!   plus `w` rotating frames, allocated once from the pool; appends
//!   overwrite the oldest rotating slot (no memmove, no reallocation), f32 or
//!   int8 (quantised on append by a GPU kernel, dequantised inside the
//!   attention kernel tile by tile).
//! - [`ConcatKvCache`]: the naive growing, copying cache (a baseline).
//! - [`cpu`]: naive references for tests.
//!
//! The VAE mid-block keeps its channel-major path
//! ([`crate::kernels::attention::attention`]) on the same kernel.

pub mod cache;
#[doc(hidden)]
pub mod cpu;

pub mod quant;

pub use crate::kernels::attention::{FrameWindow, Mask};
pub use cache::{ConcatKvCache, KvCacheConfig, KvDtype, RingKvCache};
pub use quant::QuantizedKv;

use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::attention::{flash_attention, AttentionProblem, KvInput, Strides};
use crate::tensor::Tensor;

/// Memory layout of q / k / v / out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// `[B, T, H, d]`: what projections produce; the KV caches' layout.
    #[default]
    TokenMajor,
    /// `[B, H, T, d]`.
    HeadMajor,
}

impl Layout {
    /// (batch, tokens, heads, d) of a tensor in this layout.
    pub fn dims(self, t: &Tensor) -> Result<(usize, usize, usize, usize)> {
        let [a, b, c, d] = quant::dims4("attention", t)?;
        Ok(match self {
            Layout::TokenMajor => (a, b, c, d),
            Layout::HeadMajor => (a, c, b, d),
        })
    }

    /// Element strides of a `[tokens, heads, d]` tensor in this layout.
    pub fn strides(self, tokens: usize, heads: usize, d: usize) -> Strides {
        match self {
            Layout::TokenMajor => Strides::token_major(tokens, heads, d),
            Layout::HeadMajor => Strides::head_major(heads, tokens, d),
        }
    }
}

/// Options of [`multi_head_attention`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionOptions {
    /// Memory layout of q, k, v and the output.
    pub layout: Layout,
    /// Causal and frame-window masks.
    pub mask: Mask,
    /// Softmax scale; `None`: 1 / sqrt(d).
    pub scale: Option<f32>,
    /// Key position of query 0 (queries of a new chunk after earlier keys).
    pub query_offset: usize,
}

impl AttentionOptions {
    /// Default options with `mask`.
    pub fn masked(mask: Mask) -> Self {
        AttentionOptions {
            mask,
            ..Default::default()
        }
    }
}

fn problem(
    q_dims: (usize, usize, usize, usize),
    kv_dims: (usize, usize, usize, usize),
    opts: &AttentionOptions,
    kv_layout: Layout,
) -> Result<AttentionProblem> {
    let (b, n_q, h, d) = q_dims;
    let (kb, n_kv, kh, kd) = kv_dims;
    if (kb, kh, kd) != (b, h, d) {
        return Err(Error::shape(
            "multi_head_attention",
            format!(
                "q has (batch, heads, d) = {:?}, k / v {:?}",
                (b, h, d),
                (kb, kh, kd)
            ),
        ));
    }
    Ok(AttentionProblem {
        batch: b,
        heads: h,
        q_len: n_q,
        kv_len: n_kv,
        head_dim: d,
        q_strides: opts.layout.strides(n_q, h, d),
        kv_strides: kv_layout.strides(n_kv, h, d),
        scale: opts.scale.unwrap_or(1.0 / (d as f32).sqrt()),
        mask: opts.mask,
        q_pos0: opts.query_offset,
        config: None,
        f16_operands: false,
    })
}

/// Multi-head attention: q, out `[B, Tq, H, d]`, k, v `[B, Tk, H, d]` (f32,
/// in `opts.layout`; head-major swaps T and H). `out` must not overlap the inputs.
pub fn multi_head_attention(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    opts: &AttentionOptions,
) -> Result<()> {
    let l = opts.layout;
    let kv_dims = l.dims(k)?;
    if l.dims(v)? != kv_dims || out.shape() != q.shape() {
        return Err(Error::shape(
            "multi_head_attention",
            format!("k {k:?} and v {v:?} must match; out {out:?} must match q {q:?}"),
        ));
    }
    let prob = problem(l.dims(q)?, kv_dims, opts, l)?;
    flash_attention(rec, &prob, q, KvInput::F32 { k, v }, out)
}

/// Like [`multi_head_attention`] with int8 keys and values (token-major
/// [`QuantizedKv`], dequantised inside the kernel). q / out in `opts.layout`.
pub fn multi_head_attention_int8(
    rec: &mut Recorder,
    q: &Tensor,
    k: &QuantizedKv,
    v: &QuantizedKv,
    out: &Tensor,
    opts: &AttentionOptions,
) -> Result<()> {
    let kv_dims = (k.batch, k.tokens, k.heads, k.head_dim);
    if (v.batch, v.tokens, v.heads, v.head_dim) != kv_dims || out.shape() != q.shape() {
        return Err(Error::shape(
            "multi_head_attention_int8",
            "k and v must match; out must match q",
        ));
    }
    let prob = problem(opts.layout.dims(q)?, kv_dims, opts, Layout::TokenMajor)?;
    let kv = KvInput::Int8 {
        k_codes: &k.codes,
        k_scales: &k.scales,
        v_codes: &v.codes,
        v_scales: &v.scales,
    };
    flash_attention(rec, &prob, q, kv, out)
}
