//! What one attention call computes: the tensors' [`Strides`], the K/V input ([`KvInput`], f32
//! or int8) and the whole problem ([`AttentionProblem`]) the kernels and their checks read.

use super::*;

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

    /// Batch, head, token and channel stride as the shaders' `u32`s.
    pub(super) fn shader_strides(&self, op: &str, what: &str) -> Result<[u32; 4]> {
        let mut out = [0; 4];
        let named = [
            ("batch", self.batch),
            ("head", self.head),
            ("token", self.token),
            ("channel", self.channel),
        ];
        for (o, (name, x)) in out.iter_mut().zip(named) {
            // The message is built only on failure: dry runs of tiled
            // attention record millions of these.
            *o = u32::try_from(x).map_err(|_| {
                Error::shape(
                    op,
                    format!("{what} {name} stride = {x} exceeds u32 indexing"),
                )
            })?;
        }
        Ok(out)
    }

    /// The strides of int8 codes (four per word) replacing this f32 layout, in
    /// words, and the words `batch x heads x tokens` rows of `d` codes span.
    /// The layout must be dense and channel-innermost, with `d % 4 == 0`.
    pub(super) fn int8_words(
        &self,
        op: &str,
        what: &str,
        batch: usize,
        heads: usize,
        tokens: usize,
        d: usize,
    ) -> Result<(Strides, usize)> {
        let s = self;
        if !d.is_multiple_of(4)
            || s.channel != 1
            || !s.batch.is_multiple_of(d)
            || !s.head.is_multiple_of(d)
            || !s.token.is_multiple_of(d)
        {
            return Err(Error::shape(
                op,
                format!("int8 {what} need d % 4 == 0 and a dense channel-innermost layout, got d = {d}, {s:?}"),
            ));
        }
        let words = Strides {
            batch: s.batch / 4,
            head: s.head / 4,
            token: s.token / 4,
            channel: 1,
        };
        Ok((words, words.max_offset(batch, heads, tokens, d / 4) + 1))
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
    /// The model runs in f16, so q, k and v may be rounded to f16: unmasked
    /// attention with f32 K/V then runs on cooperative matrices where the
    /// device has them ([`MatrixAttention::for_problem`]). `false` keeps f32
    /// operands (f32 and bf16 models).
    pub f16_operands: bool,
}

impl AttentionProblem {
    /// `tokens` queries over the same `tokens` keys, q / k / v / out all laid out by
    /// `strides`; no mask, the device's configuration.
    pub fn self_attention(
        batch: usize,
        heads: usize,
        tokens: usize,
        head_dim: usize,
        strides: Strides,
        scale: f32,
    ) -> Self {
        AttentionProblem {
            batch,
            heads,
            q_len: tokens,
            kv_len: tokens,
            head_dim,
            q_strides: strides,
            kv_strides: strides,
            scale,
            mask: Mask::NONE,
            q_pos0: 0,
            config: None,
            f16_operands: false,
        }
    }
}
