//! int8 keys / values: symmetric per-(token, head) quantisation,
//! `scale = max |x| / 127`, `code = round(x / scale)` in [-127, 127].
//!
//! Codes are packed four per u32 word (channel c in byte c % 4 of word
//! c / 4, two's complement); the engine has no int8 dtype, so code tensors
//! use [`DType::Rgba8`] (four 8-bit values per u32) as their container. At
//! d = 128 a token-head costs 128 + 4 bytes instead of 512 (f32): 0.26×.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::attention::{kv_append, KvOutput, Strides};
use crate::tensor::{DType, Tensor};

/// int8 keys or values, token-major: `codes` `[batch, tokens, heads, d / 4]`
/// words, `scales` `[batch, tokens, heads]` f32.
#[derive(Clone, Debug)]
pub struct QuantizedKv {
    /// int8 codes, four per `u32` word (stored as an Rgba8 tensor).
    pub codes: Tensor,
    /// One f32 scale per (batch, token, head).
    pub scales: Tensor,
    /// Batch size.
    pub batch: usize,
    /// Tokens.
    pub tokens: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
}

impl QuantizedKv {
    /// Uninitialised storage from the context's pool.
    pub fn empty(
        ctx: &Context,
        batch: usize,
        tokens: usize,
        heads: usize,
        head_dim: usize,
        label: &str,
    ) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(4) {
            return Err(Error::shape(
                "QuantizedKv",
                format!("int8 K/V need a head dimension divisible by 4, got {head_dim}"),
            ));
        }
        Ok(QuantizedKv {
            codes: Tensor::empty(
                ctx,
                &[batch, tokens, heads, head_dim / 4],
                DType::Rgba8,
                &format!("{label} int8 codes"),
            )?,
            scales: Tensor::empty(
                ctx,
                &[batch, tokens, heads],
                DType::F32,
                &format!("{label} int8 scales"),
            )?,
            batch,
            tokens,
            heads,
            head_dim,
        })
    }

    /// Quantises `src` `[B, T, H, d]` (f32, token-major) on the GPU into new storage.
    pub fn quantize(rec: &mut Recorder, src: &Tensor, label: &str) -> Result<Self> {
        let [b, t, h, d] = dims4("QuantizedKv::quantize", src)?;
        let out = Self::empty(rec.ctx(), b, t, h, d, label)?;
        let strides = Strides::token_major(t, h, d);
        kv_append(rec, src, strides, 0, out.output(), strides, 0, b, h, t, d)?;
        Ok(out)
    }

    /// Where [`kv_append`] writes into this storage.
    pub fn output(&self) -> KvOutput<'_> {
        KvOutput::Int8 {
            codes: &self.codes,
            scales: &self.scales,
        }
    }

    /// Bytes of codes and scales.
    pub fn bytes(&self) -> u64 {
        self.codes.byte_size() + self.scales.byte_size()
    }

    /// Reads codes (`[B, T, H, d]` i8) and scales (`[B, T, H]`) back (blocking).
    pub fn read(&self, ctx: &Context) -> Result<(Vec<i8>, Vec<f32>)> {
        let bytes = self.codes.to_bytes(ctx)?;
        let codes = bytes.iter().map(|&b| b as i8).collect();
        Ok((codes, self.scales.to_f32(ctx)?))
    }

    /// Reads and dequantises to f32 `[B, T, H, d]` (blocking; for tests).
    pub fn to_f32(&self, ctx: &Context) -> Result<Vec<f32>> {
        let (codes, scales) = self.read(ctx)?;
        Ok(cpu_dequantize(&codes, &scales, self.head_dim))
    }
}

pub(crate) fn dims4(op: &str, t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::shape(
            op,
            format!("expected a 4-D tensor, got {t:?}"),
        )),
    }
}

/// CPU reference: quantises rows of `d` values (one per token-head).
pub fn cpu_quantize(x: &[f32], d: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / d);
    for row in x.chunks_exact(d) {
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inv = if absmax > 0.0 { 127.0 / absmax } else { 0.0 };
        codes.extend(
            row.iter()
                .map(|v| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8),
        );
        scales.push(absmax / 127.0);
    }
    (codes, scales)
}

/// CPU reference: `codes * scale` per row of `d`.
pub fn cpu_dequantize(codes: &[i8], scales: &[f32], d: usize) -> Vec<f32> {
    codes
        .chunks_exact(d)
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&c| c as f32 * s))
        .collect()
}
