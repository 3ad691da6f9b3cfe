//! Deterministic pseudo-random values: the seeded weights of `preset:NAME`
//! models, benchmark latents and tests share this one generator, so a seed
//! means the same numbers everywhere.
#![doc(hidden)]

/// `n` values in [-scale, scale] from `seed` (xorshift64*).
pub fn uniform(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            (r * 2.0 - 1.0) * scale
        })
        .collect()
}
