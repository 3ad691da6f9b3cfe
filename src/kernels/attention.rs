//! `shaders/attention.wgsl`: single-head flash attention for the VAE
//! mid-block in channel-major layout (q, k, v straight from 1x1 convs).
//!
//! Online softmax over key tiles staged in workgroup memory, f32
//! accumulation, O(T) memory (the T x T score matrix never exists). The head
//! dimension is split across invocations (partial dot products reduced
//! through workgroup memory), so d = 512 fits in about 25 KiB of workgroup
//! memory. One of four specialisations is picked by d (<= 64, 128, 256, 512).

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{BindingKind, KernelSpec, PipelineKey, Recorder};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/attention.wgsl");

/// Largest head dimension supported.
pub const MAX_HEAD_DIM: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Params {
    pub d: u32,
    pub t: u32,
    pub scale: f32,
    pub _pad: u32,
}

pub const ATTENTION: KernelSpec = KernelSpec {
    family: "attention",
    source: SOURCE,
    entry: "attention",
    bindings: &[
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::ReadWrite,
    ],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

/// One specialisation: invocations per query (`ds`, splitting the head
/// dimension) and query groups per workgroup (`qg`; each invocation handles
/// two queries, so a workgroup handles `2 qg`), head channels per invocation
/// (`dpt`), covering d <= ds * dpt. Key tiles are [`KEYS_PER_TILE`] wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    pub ds: u32,
    pub qg: u32,
    pub dpt: u32,
}

/// Keys per tile (fixed in the shader: two vec4 per channel).
pub const KEYS_PER_TILE: u32 = 8;

impl AttentionConfig {
    /// Largest head dimension this configuration handles.
    pub fn max_d(&self) -> usize {
        (self.ds * self.dpt) as usize
    }
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

/// Configurations by increasing head dimension.
pub const CONFIGS: [AttentionConfig; 4] = [
    AttentionConfig {
        ds: 4,
        qg: 32,
        dpt: 16,
    },
    AttentionConfig {
        ds: 8,
        qg: 16,
        dpt: 16,
    },
    AttentionConfig {
        ds: 16,
        qg: 8,
        dpt: 16,
    },
    AttentionConfig {
        ds: 16,
        qg: 8,
        dpt: 32,
    },
];

/// The configuration used for head dimension `d`.
pub fn config_for(d: usize) -> Option<AttentionConfig> {
    CONFIGS.iter().copied().find(|c| d <= c.max_d())
}

fn key(c: &AttentionConfig) -> PipelineKey {
    PipelineKey::new(&ATTENTION)
        .constant("DS", format!("{}u", c.ds))
        .constant("QG", format!("{}u", c.qg))
        .constant("DPT", format!("{}u", c.dpt))
}

/// q, k, v `[N, d, T]` f32 (T = H*W tokens, d <= 512); out `[N, d, T]`;
/// `out[:, :, i] = sum_j softmax_j(q_i . k_j * scale) v_j`.
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
    let config = config_for(d).ok_or_else(|| {
        Error::Unsupported(format!(
            "attention head dimension {d} (at most {MAX_HEAD_DIM})"
        ))
    })?;
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
    let params = Params {
        d: d as u32,
        t: t as u32,
        scale,
        _pad: 0,
    };
    let groups = [(t as u32).div_ceil(config.queries()), n as u32, 1];
    // QK^T and PV: 2 * T^2 * d multiply-adds per batch element.
    let macs = 2 * (n * t * t * d) as u64;
    rec.dispatch(
        &ATTENTION,
        &key(&config),
        &params,
        &[q, k, v, out],
        groups,
        macs,
    )
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
    CONFIGS.iter().map(|c| (ATTENTION, key(c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_close, rand_vec, test_context};

    #[test]
    fn configs_fit_webgpu_default_limits() {
        for c in CONFIGS {
            assert!(
                c.workgroup_bytes() <= 16384 * 2,
                "{c:?}: {} bytes",
                c.workgroup_bytes()
            );
            assert!(c.invocations() <= 256, "{c:?}");
        }
        assert_eq!(config_for(512).map(|c| c.max_d()), Some(512));
        assert_eq!(config_for(513), None);
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
}
