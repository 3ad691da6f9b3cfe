//! `shaders/attention_stream.wgsl`: single-head attention one key/value block
//! at a time. A tile of queries keeps an online-softmax state (unnormalised
//! accumulator + running max and sum) that each block updates, so attention
//! over all tokens of an image runs with K/V streamed from wherever they are
//! parked (tiled decoding of the VAE mid-block). Same kernel design and
//! configurations as [`crate::kernels::attention`].

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};
use crate::gpu::{BindingKind, KernelSpec, PipelineKey, Recorder};
use crate::kernels::attention::{config_for, AttentionConfig, CONFIGS, MAX_HEAD_DIM};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../shaders/attention_stream.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
/// Uniforms of `attention_block` (mirrors `Params` in the shader).
pub struct Params {
    /// Head dimension.
    pub d: u32,
    /// Queries in the block.
    pub tq: u32,
    /// Keys in the block.
    pub tk: u32,
    /// Softmax scale.
    pub scale: f32,
}

/// One block of streaming attention with running softmax statistics.
pub const ATTENTION_BLOCK: KernelSpec = KernelSpec {
    family: "attention_stream",
    source: SOURCE,
    entry: "attention_block",
    bindings: &[
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::Read,
        BindingKind::ReadWrite,
        BindingKind::ReadWrite,
    ],
    uniform_size: std::mem::size_of::<Params>() as u64,
};

fn key(c: &AttentionConfig, first: bool, last: bool) -> PipelineKey {
    PipelineKey::new(&ATTENTION_BLOCK)
        .constant("DS", format!("{}u", c.ds))
        .constant("QG", format!("{}u", c.qg))
        .constant("DPT", format!("{}u", c.dpt))
        .flag_if(first, "FIRST")
        .flag_if(last, "LAST")
}

/// Which part of a query tile's pass over all key blocks a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRole {
    /// The first block: the state starts empty.
    pub first: bool,
    /// The last block: `acc` receives the normalised output.
    pub last: bool,
}

/// Updates the attention state of queries `q` `[N, d, TQ]` with one block
/// of keys `k` and values `v` `[N, d, TK]` (f32, d <= 512). State: `acc`
/// `[N, d, TQ]` (unnormalised output), `ml` `[N, TQ, 2]` (running max and
/// sum of the pre-scaled scores). After the `last` block, `acc` holds
/// `sum_j softmax_j(q_i . k_j * scale) v_j` over all blocks' keys.
/// Outputs must not alias inputs.
#[allow(clippy::too_many_arguments)]
pub fn attention_block(
    rec: &mut Recorder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    acc: &Tensor,
    ml: &Tensor,
    role: BlockRole,
) -> Result<()> {
    const OP: &str = "attention_block";
    let [n, d, tq] = match *q.shape() {
        [n, d, t] => [n, d, t],
        _ => return Err(Error::shape(OP, format!("q must be [N, d, T], got {q:?}"))),
    };
    let tk = match *k.shape() {
        [kn, kd, t] if kn == n && kd == d => t,
        _ => {
            return Err(Error::shape(
                OP,
                format!("k must be [{n}, {d}, T], got {k:?}"),
            ))
        }
    };
    for (what, x, want) in [
        ("q", q, vec![n, d, tq]),
        ("k", k, vec![n, d, tk]),
        ("v", v, vec![n, d, tk]),
        ("acc", acc, vec![n, d, tq]),
        ("ml", ml, vec![n, tq, 2]),
    ] {
        if x.shape() != want || x.dtype() != DType::F32 {
            return Err(Error::shape(
                OP,
                format!("{what} must be f32 {want:?}, got {x:?}"),
            ));
        }
    }
    if acc.overlaps(q) || acc.overlaps(k) || acc.overlaps(v) || ml.overlaps(acc) {
        return Err(Error::shape(OP, "outputs alias inputs".to_string()));
    }
    if q.numel().max(k.numel()) > u32::MAX as usize {
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
        tq: tq as u32,
        tk: tk as u32,
        scale,
    };
    let groups = [(tq as u32).div_ceil(config.queries()), n as u32, 1];
    let macs = 2 * (n * tq * tk * d) as u64;
    rec.dispatch(
        &ATTENTION_BLOCK,
        &key(&config, role.first, role.last),
        &params,
        &[q, k, v, acc, ml],
        groups,
        macs,
    )
}

pub(crate) fn variants() -> Vec<(KernelSpec, PipelineKey)> {
    let mut v = Vec::new();
    for c in CONFIGS {
        for first in [false, true] {
            for last in [false, true] {
                v.push((ATTENTION_BLOCK, key(&c, first, last)));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::cpu_attention;
    use crate::testing::{assert_close, rand_vec, test_context};

    /// Columns `[t0, t1)` of `[n, d, t]` data.
    fn columns(x: &[f32], n: usize, d: usize, t: usize, t0: usize, t1: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n * d * (t1 - t0));
        for row in 0..n * d {
            out.extend_from_slice(&x[row * t + t0..row * t + t1]);
        }
        out
    }

    /// Query tiles x uneven key blocks (including blocks shorter than the
    /// 8-key tile and a single block) against the whole-sequence f64
    /// reference; d in {33, 64, 512}, batch 2. Tolerance 1e-5 abs + 1e-4 rel.
    #[test]
    fn blocks_combine_to_full_attention() {
        let ctx = test_context();
        let n = 2;
        for (d, t, q_splits, k_splits) in [
            (33usize, 37usize, vec![0, 37], vec![0, 5, 20, 37]),
            (64, 45, vec![0, 13, 45], vec![0, 1, 9, 30, 45]),
            (512, 29, vec![0, 16, 29], vec![0, 29]),
            (512, 29, vec![0, 29], vec![0, 7, 14, 29]),
        ] {
            let len = n * d * t;
            let qd = rand_vec(len, d as u64, 2.0);
            let kd = rand_vec(len, d as u64 + 1, 2.0);
            let vd = rand_vec(len, d as u64 + 2, 1.0);
            let scale = 1.0 / (d as f32).sqrt();
            let want = cpu_attention(&qd, &kd, &vd, n, d, t, scale);
            for qs in q_splits.windows(2) {
                let tq = qs[1] - qs[0];
                let q =
                    Tensor::from_f32(&ctx, &[n, d, tq], &columns(&qd, n, d, t, qs[0], qs[1]), "q")
                        .unwrap();
                let acc = Tensor::empty(&ctx, &[n, d, tq], DType::F32, "acc").unwrap();
                let ml = Tensor::empty(&ctx, &[n, tq, 2], DType::F32, "ml").unwrap();
                let mut rec = Recorder::new(&ctx);
                let blocks = k_splits.len() - 1;
                for (b, ks) in k_splits.windows(2).enumerate() {
                    let tk = ks[1] - ks[0];
                    let k = Tensor::from_f32_in(
                        &mut rec,
                        &[n, d, tk],
                        &columns(&kd, n, d, t, ks[0], ks[1]),
                        "k",
                    )
                    .unwrap();
                    let v = Tensor::from_f32_in(
                        &mut rec,
                        &[n, d, tk],
                        &columns(&vd, n, d, t, ks[0], ks[1]),
                        "v",
                    )
                    .unwrap();
                    let role = BlockRole {
                        first: b == 0,
                        last: b + 1 == blocks,
                    };
                    attention_block(&mut rec, &q, &k, &v, scale, &acc, &ml, role).unwrap();
                }
                rec.submit().unwrap();
                assert_close(
                    &acc.to_f32(&ctx).unwrap(),
                    &columns(&want, n, d, t, qs[0], qs[1]),
                    1e-5,
                    1e-4,
                    &format!("d={d} T={t} queries {qs:?} blocks {k_splits:?}"),
                );
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let ctx = test_context();
        let q = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "q").unwrap();
        let k = Tensor::empty(&ctx, &[1, 8, 6], DType::F32, "k").unwrap();
        let acc = Tensor::empty(&ctx, &[1, 8, 5], DType::F32, "acc").unwrap();
        let ml_bad = Tensor::empty(&ctx, &[1, 6, 2], DType::F32, "ml").unwrap();
        let k_bad = Tensor::empty(&ctx, &[1, 7, 6], DType::F32, "k").unwrap();
        let ml = Tensor::empty(&ctx, &[1, 5, 2], DType::F32, "ml").unwrap();
        let role = BlockRole {
            first: true,
            last: true,
        };
        let mut rec = Recorder::new(&ctx);
        assert!(matches!(
            attention_block(&mut rec, &q, &k, &k, 1.0, &acc, &ml_bad, role),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            attention_block(&mut rec, &q, &k_bad, &k_bad, 1.0, &acc, &ml, role),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            attention_block(&mut rec, &q, &k, &k, 1.0, &q, &ml, role),
            Err(Error::Shape { .. })
        ));
        attention_block(&mut rec, &q, &k, &k, 1.0, &acc, &ml, role).unwrap();
    }
}
