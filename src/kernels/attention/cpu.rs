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
