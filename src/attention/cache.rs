//! KV caches for streaming generation (chunks of frames attending to pinned
//! sink frames plus a rolling window of recent frames).
//!
//! [`RingKvCache`] is the static one: per layer, K and V storage of
//! `sink_frames + window_frames` frame slots `[B, slots · tokens_per_frame,
//! H, d]` (token-major), allocated once from the context's pool. Stream
//! frame f lives in slot f while f < s (pinned sinks), then in slot
//! `s + (f - s) % w`: appending overwrites the oldest rotating slot in place.
//! Nothing is moved or reallocated, and memory is constant in stream length.
//! The slots are in rotated order, which attention does not care about: keys
//! carry their positions already (RoPE is applied before caching) and the
//! window is the cache's content, so attention over the cache is unmasked.
//!
//! [`ConcatKvCache`] is the naive cache it replaces (a baseline): every
//! append allocates a larger cache and copies the old one plus the chunk
//! into it, and every attention copies the sinks and the window out of it.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::attention::{
    flash_attention, kv_append, AttentionProblem, KvInput, KvOutput, Strides,
};
use crate::tensor::{DType, Tensor};

use super::quant::{dims4, QuantizedKv};
use super::Mask;

/// Storage type of a cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    #[default]
    /// Keys and values as f32.
    F32,
    /// int8 codes + one f32 scale per (token, head).
    Int8,
}

/// Shape of a per-layer KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Batch size.
    pub batch: usize,
    /// Attention heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Tokens each appended frame adds.
    pub tokens_per_frame: usize,
    /// Pinned frames: the first `sink_frames` frames of the stream.
    pub sink_frames: usize,
    /// Rotating frames: the most recent `window_frames` frames after the sinks.
    pub window_frames: usize,
    /// Storage type of the cached keys and values.
    pub dtype: KvDtype,
}

impl KvCacheConfig {
    /// Frame slots: sinks + window.
    pub fn slots(&self) -> usize {
        self.sink_frames + self.window_frames
    }

    /// Token capacity.
    pub fn tokens(&self) -> usize {
        self.slots() * self.tokens_per_frame
    }

    /// Bytes of K and V storage of a full cache of this shape
    /// (f32: 4 d per token-head; int8: d + 4).
    pub fn bytes(&self) -> u64 {
        let rows = (self.batch * self.tokens() * self.heads) as u64;
        let per_row = match self.dtype {
            KvDtype::F32 => 4 * self.head_dim as u64,
            KvDtype::Int8 => self.head_dim as u64 + 4,
        };
        2 * rows * per_row
    }

    fn validate(&self, op: &str) -> Result<()> {
        if self.batch == 0
            || self.heads == 0
            || self.tokens_per_frame == 0
            || self.window_frames == 0
        {
            return Err(Error::shape(op, format!("empty cache shape {self:?}")));
        }
        if self.head_dim == 0 || self.head_dim > crate::kernels::attention::MAX_HEAD_DIM {
            return Err(Error::shape(
                op,
                format!("head dimension {}", self.head_dim),
            ));
        }
        if self.dtype == KvDtype::Int8 && !self.head_dim.is_multiple_of(4) {
            return Err(Error::shape(
                op,
                "int8 caches need a head dimension divisible by 4",
            ));
        }
        Ok(())
    }

    /// Frames in a `[B, T, H, d]` chunk of new keys / values.
    fn chunk_frames(&self, op: &str, t: &Tensor) -> Result<usize> {
        let [b, tokens, h, d] = dims4(op, t)?;
        if t.dtype() != DType::F32
            || (b, h, d) != (self.batch, self.heads, self.head_dim)
            || tokens == 0
            || tokens % self.tokens_per_frame != 0
        {
            return Err(Error::shape(
                op,
                format!(
                    "a chunk must be f32 [{}, frames × {}, {}, {}], got {t:?}",
                    self.batch, self.tokens_per_frame, self.heads, self.head_dim
                ),
            ));
        }
        Ok(tokens / self.tokens_per_frame)
    }

    fn query_dims(&self, op: &str, q: &Tensor, out: &Tensor) -> Result<usize> {
        let [b, t, h, d] = dims4(op, q)?;
        if (b, h, d) != (self.batch, self.heads, self.head_dim) || out.shape() != q.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "q must be [{}, T, {}, {}] and out like q, got {q:?}, {out:?}",
                    self.batch, self.heads, self.head_dim
                ),
            ));
        }
        Ok(t)
    }
}

/// int8 codes and scales read back.
type Int8Rows = (Vec<i8>, Vec<f32>);

enum Store {
    F32(Tensor),
    Int8(QuantizedKv),
}

impl Store {
    fn new(ctx: &Context, cfg: &KvCacheConfig, label: &str) -> Result<Store> {
        let (b, t, h, d) = (cfg.batch, cfg.tokens(), cfg.heads, cfg.head_dim);
        Ok(match cfg.dtype {
            KvDtype::F32 => Store::F32(Tensor::empty(ctx, &[b, t, h, d], DType::F32, label)?),
            KvDtype::Int8 => Store::Int8(QuantizedKv::empty(ctx, b, t, h, d, label)?),
        })
    }

    fn output(&self) -> KvOutput<'_> {
        match self {
            Store::F32(t) => KvOutput::F32(t),
            Store::Int8(q) => q.output(),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Store::F32(t) => t.byte_size(),
            Store::Int8(q) => q.bytes(),
        }
    }

    /// f32 values `[B, tokens, H, d]` (dequantised for int8) and, for int8,
    /// the codes and scales.
    fn read(&self, ctx: &Context) -> Result<(Vec<f32>, Option<Int8Rows>)> {
        Ok(match self {
            Store::F32(t) => (t.to_f32(ctx)?, None),
            Store::Int8(q) => {
                let (codes, scales) = q.read(ctx)?;
                let values = super::quant::cpu_dequantize(&codes, &scales, q.head_dim);
                (values, Some((codes, scales)))
            }
        })
    }
}

/// A cache's content in stream order (for tests and inspection), token-major
/// `[B, frames.len() · tokens_per_frame, H, d]`.
#[derive(Clone, Debug)]
pub struct KvWindow {
    /// Stream frame of each row block, ascending.
    pub frames: Vec<usize>,
    /// Keys and values as f32 (dequantised for int8 caches).
    pub k: Vec<f32>,
    /// Values as f32 (dequantised for int8 caches).
    pub v: Vec<f32>,
    /// int8 caches: codes `[B, T, H, d]` and scales `[B, T, H]`.
    pub k_int8: Option<(Vec<i8>, Vec<f32>)>,
    /// int8 caches: value codes `[B, T, H, d]` and scales `[B, T, H]`.
    pub v_int8: Option<(Vec<i8>, Vec<f32>)>,
}

/// `data` laid out `[B, slots, per-slot values]` with the slots reordered as `order`.
fn gather_slots<T: Copy>(data: &[T], batch: usize, slots: usize, order: &[usize]) -> Vec<T> {
    let per_slot = data.len() / batch / slots;
    let mut out = Vec::with_capacity(batch * order.len() * per_slot);
    for b in 0..batch {
        for &s in order {
            let at = (b * slots + s) * per_slot;
            out.extend_from_slice(&data[at..at + per_slot]);
        }
    }
    out
}

/// The static ring-buffer KV cache (see the module docs).
pub struct RingKvCache {
    cfg: KvCacheConfig,
    k: Store,
    v: Store,
    frames: usize,
    slot_frames: Vec<Option<usize>>,
}

impl RingKvCache {
    /// Allocates K and V storage for `cfg.slots()` frames from `ctx`'s pool (once).
    pub fn new(ctx: &Context, cfg: KvCacheConfig) -> Result<Self> {
        cfg.validate("RingKvCache::new")?;
        Ok(RingKvCache {
            k: Store::new(ctx, &cfg, "ring kv cache K")?,
            v: Store::new(ctx, &cfg, "ring kv cache V")?,
            frames: 0,
            slot_frames: vec![None; cfg.slots()],
            cfg,
        })
    }

    /// The cache's configuration.
    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    /// Frames appended since creation.
    pub fn frames_appended(&self) -> usize {
        self.frames
    }

    /// Slot of stream frame `f`.
    pub(crate) fn slot_of(&self, f: usize) -> usize {
        let (s, w) = (self.cfg.sink_frames, self.cfg.window_frames);
        if f < s {
            f
        } else {
            s + (f - s) % w
        }
    }

    /// The stream frame each slot holds.
    pub fn slot_frames(&self) -> &[Option<usize>] {
        &self.slot_frames
    }

    /// Filled slots form a prefix: tokens `0 .. valid_tokens()` are keys.
    pub fn valid_tokens(&self) -> usize {
        self.frames.min(self.cfg.slots()) * self.cfg.tokens_per_frame
    }

    /// Bytes of K and V storage (constant).
    pub fn kv_bytes(&self) -> u64 {
        self.k.bytes() + self.v.bytes()
    }

    /// Writes a chunk of new keys and values `[B, F · tokens_per_frame, H, d]`
    /// (f32, token-major; 1 <= F <= window_frames) into the slots of stream
    /// frames `frames_appended() ..`, quantising for int8 caches: at most two
    /// dispatches per tensor per contiguous run of slots.
    pub fn append(&mut self, rec: &mut Recorder, k: &Tensor, v: &Tensor) -> Result<()> {
        const OP: &str = "RingKvCache::append";
        let f = self.cfg.chunk_frames(OP, k)?;
        if self.cfg.chunk_frames(OP, v)? != f {
            return Err(Error::shape(OP, format!("k {k:?} and v {v:?} differ")));
        }
        if f > self.cfg.window_frames {
            return Err(Error::shape(
                OP,
                format!(
                    "a chunk of {f} frames does not fit a window of {}",
                    self.cfg.window_frames
                ),
            ));
        }
        let KvCacheConfig {
            batch,
            heads,
            head_dim: d,
            tokens_per_frame: tpf,
            ..
        } = self.cfg;
        let src_strides = Strides::token_major(f * tpf, heads, d);
        let dst_strides = Strides::token_major(self.cfg.tokens(), heads, d);
        // Runs of chunk frames going to consecutive slots: (first chunk frame, first slot, frames).
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for i in 0..f {
            let slot = self.slot_of(self.frames + i);
            match runs.last_mut() {
                Some((i0, s0, n)) if *i0 + *n == i && *s0 + *n == slot => *n += 1,
                _ => runs.push((i, slot, 1)),
            }
        }
        for &(i0, s0, n) in &runs {
            for (src, store) in [(k, &self.k), (v, &self.v)] {
                kv_append(
                    rec,
                    src,
                    src_strides,
                    i0 * tpf,
                    store.output(),
                    dst_strides,
                    s0 * tpf,
                    batch,
                    heads,
                    n * tpf,
                    d,
                )?;
            }
        }
        for i in 0..f {
            let slot = self.slot_of(self.frames + i);
            self.slot_frames[slot] = Some(self.frames + i);
        }
        self.frames += f;
        Ok(())
    }

    /// Attention of queries q `[B, Tq, H, d]` (token-major f32) over every
    /// key in the cache (sinks + window, unmasked); out like q.
    pub fn attend(
        &self,
        rec: &mut Recorder,
        q: &Tensor,
        out: &Tensor,
        scale: Option<f32>,
    ) -> Result<()> {
        const OP: &str = "RingKvCache::attend";
        let n_q = self.cfg.query_dims(OP, q, out)?;
        let KvCacheConfig {
            batch,
            heads,
            head_dim: d,
            ..
        } = self.cfg;
        let prob = AttentionProblem {
            batch,
            heads,
            q_len: n_q,
            kv_len: self.valid_tokens(),
            head_dim: d,
            q_strides: Strides::token_major(n_q, heads, d),
            kv_strides: Strides::token_major(self.cfg.tokens(), heads, d),
            scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
            mask: Mask::NONE,
            q_pos0: 0,
            config: None,
            f16_operands: false,
        };
        let kv = match (&self.k, &self.v) {
            (Store::F32(k), Store::F32(v)) => KvInput::F32 { k, v },
            (Store::Int8(k), Store::Int8(v)) => KvInput::Int8 {
                k_codes: &k.codes,
                k_scales: &k.scales,
                v_codes: &v.codes,
                v_scales: &v.scales,
            },
            _ => unreachable!("K and V share a dtype"),
        };
        flash_attention(rec, &prob, q, kv, out)
    }

    /// Reads the cache back in stream order (blocking; tests and tools).
    pub fn read_window(&self, ctx: &Context) -> Result<KvWindow> {
        let mut held: Vec<(usize, usize)> = self
            .slot_frames
            .iter()
            .enumerate()
            .filter_map(|(s, f)| f.map(|f| (f, s)))
            .collect();
        held.sort_unstable();
        let order: Vec<usize> = held.iter().map(|&(_, s)| s).collect();
        let (b, slots) = (self.cfg.batch, self.cfg.slots());
        let (k, k8) = self.k.read(ctx)?;
        let (v, v8) = self.v.read(ctx)?;
        let g8 = |x: Option<(Vec<i8>, Vec<f32>)>| {
            x.map(|(c, s)| {
                (
                    gather_slots(&c, b, slots, &order),
                    gather_slots(&s, b, slots, &order),
                )
            })
        };
        Ok(KvWindow {
            frames: held.iter().map(|&(f, _)| f).collect(),
            k: gather_slots(&k, b, slots, &order),
            v: gather_slots(&v, b, slots, &order),
            k_int8: g8(k8),
            v_int8: g8(v8),
        })
    }
}

/// The naive concatenating cache (f32): grows by a reallocation and two
/// copies per append, and copies the sinks + window out for each attention.
/// Memory grows linearly with the stream. A baseline for [`RingKvCache`].
pub struct ConcatKvCache {
    cfg: KvCacheConfig,
    k: Option<Tensor>,
    v: Option<Tensor>,
    frames: usize,
}

impl ConcatKvCache {
    /// An empty cache (allocates on append). `cfg.dtype` must be f32.
    pub fn new(cfg: KvCacheConfig) -> Result<Self> {
        cfg.validate("ConcatKvCache::new")?;
        if cfg.dtype != KvDtype::F32 {
            return Err(Error::Unsupported(
                "the concatenating baseline cache is f32 only".into(),
            ));
        }
        Ok(ConcatKvCache {
            cfg,
            k: None,
            v: None,
            frames: 0,
        })
    }

    /// Frames appended since the cache was created (evicted ones included).
    pub fn frames_appended(&self) -> usize {
        self.frames
    }

    /// Bytes of the grown K and V caches.
    pub fn kv_bytes(&self) -> u64 {
        self.k.as_ref().map_or(0, |t| t.byte_size()) + self.v.as_ref().map_or(0, |t| t.byte_size())
    }

    /// Bytes of the sink + window copies each attention makes.
    pub fn window_bytes(&self) -> u64 {
        let frames = self.window_frames().iter().map(|r| r.1).sum::<usize>();
        2 * (self.cfg.batch
            * frames
            * self.cfg.tokens_per_frame
            * self.cfg.heads
            * self.cfg.head_dim
            * 4) as u64
    }

    /// (first frame, frames) of the sinks and of the window.
    fn window_frames(&self) -> [(usize, usize); 2] {
        let sinks = self.cfg.sink_frames.min(self.frames);
        let recent = self.cfg.window_frames.min(self.frames - sinks);
        [(0, sinks), (self.frames - recent, recent)]
    }

    /// `cat([cache, chunk], dim = tokens)`: a new cache, two copies.
    pub fn append(&mut self, rec: &mut Recorder, k: &Tensor, v: &Tensor) -> Result<()> {
        const OP: &str = "ConcatKvCache::append";
        let f = self.cfg.chunk_frames(OP, k)?;
        if self.cfg.chunk_frames(OP, v)? != f {
            return Err(Error::shape(OP, format!("k {k:?} and v {v:?} differ")));
        }
        let KvCacheConfig {
            batch: b,
            heads: h,
            head_dim: d,
            tokens_per_frame: tpf,
            ..
        } = self.cfg;
        let old_tokens = self.frames * tpf;
        let new_tokens = old_tokens + f * tpf;
        let mut grown = Vec::new();
        for (old, chunk) in [(&self.k, k), (&self.v, v)] {
            let t = Tensor::empty(
                rec.ctx(),
                &[b, new_tokens, h, d],
                DType::F32,
                "concat kv cache",
            )?;
            let dst = Strides::token_major(new_tokens, h, d);
            if let Some(old) = old {
                let src = Strides::token_major(old_tokens, h, d);
                kv_append(
                    rec,
                    old,
                    src,
                    0,
                    KvOutput::F32(&t),
                    dst,
                    0,
                    b,
                    h,
                    old_tokens,
                    d,
                )?;
            }
            let src = Strides::token_major(f * tpf, h, d);
            kv_append(
                rec,
                chunk,
                src,
                0,
                KvOutput::F32(&t),
                dst,
                old_tokens,
                b,
                h,
                f * tpf,
                d,
            )?;
            grown.push(t);
        }
        self.v = grown.pop();
        self.k = grown.pop();
        self.frames += f;
        Ok(())
    }

    /// Copies the sinks and the window out (`cat([cache[:s], cache[-w:]])`)
    /// and attends q `[B, Tq, H, d]` over them; out like q.
    pub fn attend(
        &self,
        rec: &mut Recorder,
        q: &Tensor,
        out: &Tensor,
        scale: Option<f32>,
    ) -> Result<()> {
        const OP: &str = "ConcatKvCache::attend";
        let n_q = self.cfg.query_dims(OP, q, out)?;
        let (Some(k), Some(v)) = (&self.k, &self.v) else {
            return Err(Error::shape(OP, "attention over an empty cache"));
        };
        let KvCacheConfig {
            batch: b,
            heads: h,
            head_dim: d,
            tokens_per_frame: tpf,
            ..
        } = self.cfg;
        let ranges = self.window_frames();
        let win_tokens = (ranges[0].1 + ranges[1].1) * tpf;
        let src = Strides::token_major(self.frames * tpf, h, d);
        let dst = Strides::token_major(win_tokens, h, d);
        let mut copies = Vec::new();
        for cache in [k, v] {
            let w = Tensor::empty(
                rec.ctx(),
                &[b, win_tokens, h, d],
                DType::F32,
                "kv window copy",
            )?;
            let mut at = 0;
            for (f0, n) in ranges {
                if n > 0 {
                    kv_append(
                        rec,
                        cache,
                        src,
                        f0 * tpf,
                        KvOutput::F32(&w),
                        dst,
                        at,
                        b,
                        h,
                        n * tpf,
                        d,
                    )?;
                    at += n * tpf;
                }
            }
            copies.push(w);
        }
        let prob = AttentionProblem {
            batch: b,
            heads: h,
            q_len: n_q,
            kv_len: win_tokens,
            head_dim: d,
            q_strides: Strides::token_major(n_q, h, d),
            kv_strides: dst,
            scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
            mask: Mask::NONE,
            q_pos0: 0,
            config: None,
            f16_operands: false,
        };
        let kv = KvInput::F32 {
            k: &copies[0],
            v: &copies[1],
        };
        flash_attention(rec, &prob, q, kv, out)
    }
}
