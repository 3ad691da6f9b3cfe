//! Naive CPU references (f64 softmax over every key, masks applied element
//! by element): what the GPU kernels are tested against.

use super::Mask;

/// Plain softmax attention. q `[batch, n_q, heads, d]`, k / v `[batch, n_kv,
/// heads, d]` (token-major), out `[batch, n_q, heads, d]`. Query i sits at
/// key position `q_pos0 + i` for the mask; a query that sees no key gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn cpu_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    batch: usize,
    heads: usize,
    n_q: usize,
    n_kv: usize,
    d: usize,
    scale: f32,
    mask: &Mask,
    q_pos0: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; batch * n_q * heads * d];
    let mut scores = vec![0.0f64; n_kv];
    let row = heads * d;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..n_q {
                let qo = (b * n_q + i) * row + h * d;
                let mut max = f64::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    if !mask.visible(q_pos0 + i, j) {
                        *s = f64::NEG_INFINITY;
                        continue;
                    }
                    let ko = (b * n_kv + j) * row + h * d;
                    let dot: f64 = (0..d).map(|c| q[qo + c] as f64 * k[ko + c] as f64).sum();
                    *s = dot * scale as f64;
                    max = max.max(*s);
                }
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                for c in 0..d {
                    let acc: f64 = (0..n_kv)
                        .filter(|&j| scores[j] > 0.0)
                        .map(|j| v[(b * n_kv + j) * row + h * d + c] as f64 * scores[j])
                        .sum();
                    out[qo + c] = (acc / sum) as f32;
                }
            }
        }
    }
    out
}

/// Permutes token-major `[batch, tokens, heads, d]` data to head-major
/// `[batch, heads, tokens, d]`.
pub fn token_to_head_major(
    x: &[f32],
    batch: usize,
    tokens: usize,
    heads: usize,
    d: usize,
) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for b in 0..batch {
        for t in 0..tokens {
            for h in 0..heads {
                let from = ((b * tokens + t) * heads + h) * d;
                let to = ((b * heads + h) * tokens + t) * d;
                out[to..to + d].copy_from_slice(&x[from..from + d]);
            }
        }
    }
    out
}

/// Cosine similarity of two vectors (f64 accumulation).
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 || bb == 0.0 {
        return if aa == bb { 1.0 } else { 0.0 };
    }
    ab / (aa.sqrt() * bb.sqrt())
}
