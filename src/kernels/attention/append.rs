//! Appending keys/values to a KV cache (f32 or int8 with per-row scales).

use super::*;

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
            let (words, code_words) =
                dst_strides.int8_words(OP, "caches", batch, heads, dst_t0 + tokens, d)?;
            check_holds(OP, "codes", codes, DType::Rgba8, code_words)?;
            check_holds(OP, "scales", scales, DType::F32, code_words.div_ceil(d / 4))?;
            (&KV_APPEND_INT8, words, vec![src, codes, scales])
        }
    };
    if tensors[1..].iter().any(|t| t.overlaps(src)) {
        return Err(Error::shape(OP, "the cache must not overlap the source"));
    }
    // The channel stride is 1 (checked above), the shader assumes it.
    let [dst_sb, dst_sh, dst_st, _] = dst_s.shader_strides(OP, "cache")?;
    let params = AppendParams {
        d: d as u32,
        heads: to_u32(OP, "heads", heads)?,
        tokens: to_u32(OP, "tokens", tokens)?,
        batch: to_u32(OP, "batch", batch)?,
        src_strides: src_strides.shader_strides(OP, "src")?,
        dst_strides: [dst_sb, dst_sh, dst_st],
        src_t0: to_u32(OP, "src_t0", src_t0)?,
        dst_t0: to_u32(OP, "dst_t0", dst_t0)?,
        ..Default::default()
    };
    let rows = (batch * heads * tokens) as u64;
    let groups = linear_groups(rec.ctx(), rows.div_ceil(APPEND_WG as u64))?;
    let int8 = matches!(dst, KvOutput::Int8 { .. });
    rec.dispatch(spec, &append_key(int8), &params, &tensors, groups, 0)
}
