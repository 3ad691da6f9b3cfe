//! The CPU reference the attention kernels are tested against.

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
    cpu_cross_attention(q, k, v, n, d, t, t, scale)
}

/// [`cpu_attention`] of `tq` queries `[n, d, tq]` over `tk` keys / values `[n, d, tk]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn cpu_cross_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    d: usize,
    tq: usize,
    tk: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0; n * d * tq];
    let mut scores = vec![0.0f64; tk];
    for b in 0..n {
        let (qb, kb, vb) = (b * d * tq, b * d * tk, b * d * tk);
        for i in 0..tq {
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let mut dot = 0.0f64;
                for c in 0..d {
                    dot += q[qb + c * tq + i] as f64 * k[kb + c * tk + j] as f64;
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
                let row = &v[vb + c * tk..vb + (c + 1) * tk];
                let acc: f64 = row.iter().zip(&scores).map(|(&x, &p)| x as f64 * p).sum();
                out[qb + c * tq + i] = (acc / sum) as f32;
            }
        }
    }
    out
}
