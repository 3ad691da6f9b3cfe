//! The cooperative-matrix (tensor-core) attention against the CPU reference, on odd token
//! counts, where the test device has a usable configuration (Mesa 26's lavapipe: 8×8×8 f16
//! → f32; `ci/coopmat.sh` runs them there). Elsewhere they say why they did not run, and
//! fail instead under `WGVAE_REQUIRE_COOP=1` (see [`crate::testing::matrix_test_context`]).
//!
//! Inputs are rounded to f16 for the CPU reference too, so the error is the kernel's: P in
//! f16 for the PV product. Bound: 3e-3 + 3e-3 |want| (the cooperative conv's f16 bound;
//! measured about 5e-4 with v in ±1).

use super::cpu::cpu_cross_attention;
use super::*;
use crate::gpu::storage::round_through;
use crate::gpu::Context;
use crate::testing::{assert_close, max_abs_diff, rand_vec};

const ATOL: f32 = 3e-3;
const RTOL: f32 = 3e-3;

fn round16(v: Vec<f32>) -> Vec<f32> {
    v.into_iter()
        .map(|x| round_through(x, DType::F16))
        .collect()
}

/// f16-representable q, k (in ±`qk`) and v (in ±1).
fn inputs(len_q: usize, len_kv: usize, seed: u64, qk: f32) -> [Vec<f32>; 3] {
    [
        round16(rand_vec(len_q, seed, qk)),
        round16(rand_vec(len_kv, seed + 1, qk)),
        round16(rand_vec(len_kv, seed + 2, 1.0)),
    ]
}

/// Asserts that every dispatch the recorder holds ran the cooperative entry.
fn assert_coop(rec: &Recorder, what: &str) {
    let labels = format!("{:?}", rec.labels());
    assert!(
        !rec.labels().is_empty() && labels.matches("attention_coop").count() == rec.labels().len(),
        "{what}: the cooperative kernel ran: {labels}"
    );
}

/// The mid-block call (`attention_with`, f16 operands) on `[n, d, t]`: max abs error.
fn mid_block(
    ctx: &Context,
    [n, d, t]: [usize; 3],
    seed: u64,
    f16_operands: bool,
) -> (f32, Vec<f32>) {
    let [qd, kd, vd] = inputs(n * d * t, n * d * t, seed, 2.0);
    let scale = 1.0 / (d as f32).sqrt();
    let shape = [n, d, t];
    let q = Tensor::from_f32(ctx, &shape, &qd, "q").unwrap();
    let k = Tensor::from_f32(ctx, &shape, &kd, "k").unwrap();
    let v = Tensor::from_f32(ctx, &shape, &vd, "v").unwrap();
    let out = Tensor::empty(ctx, &shape, DType::F32, "out").unwrap();
    let mut rec = Recorder::new(ctx);
    attention_with(&mut rec, &q, &k, &v, scale, &out, f16_operands).unwrap();
    if f16_operands {
        assert_coop(&rec, &format!("d={d} T={t}"));
    }
    rec.submit().unwrap();
    let got = out.to_f32(ctx).unwrap();
    let want = cpu_attention(&qd, &kd, &vd, n, d, t, scale);
    let what = format!("coop attention n={n} d={d} T={t}");
    assert_close(&got, &want, ATOL, RTOL, &what);
    (max_abs_diff(&got, &want).0, got)
}

/// d in {64, 96, 512} (and 384, Wan's) x T in {1, 7, 37, 100, 300}, batch 2, against an
/// f64 reference on the same f16 inputs; the scalar kernel's error beside it.
#[test]
fn matrix_attention_odd_shapes_match_cpu() {
    let Some(ctx) = crate::testing::matrix_test_context("matrix_attention_odd_shapes_match_cpu")
    else {
        return;
    };
    let mut worst = (0.0f32, 0.0f32);
    for d in [64usize, 96, 384, 512] {
        for t in [1usize, 7, 37, 100, 300] {
            if d == 384 && t != 100 {
                continue;
            }
            let (e, _) = mid_block(&ctx, [2, d, t], (d * 1000 + t) as u64, true);
            let (e_scalar, _) = mid_block(&ctx, [2, d, t], (d * 1000 + t) as u64, false);
            println!("d={d} T={t}: max abs error vs f64: matrices {e:.2e}, scalar {e_scalar:.2e}");
            worst = (worst.0.max(e), worst.1.max(e_scalar));
        }
    }
    println!(
        "worst max abs error: matrices {:.2e}, scalar {:.2e}",
        worst.0, worst.1
    );
}

/// f32 operands (f32 / bf16 models), masks, int8 K/V, a forced scalar configuration and
/// head dimensions that are not a multiple of the matrix side keep the scalar kernel.
#[test]
fn matrix_attention_is_picked_only_where_it_applies() {
    let caps = Capabilities::reference_gpu();
    let mut with = caps.clone();
    with.cooperative_matrix = Some(crate::gpu::MatrixConfig::F16_F32_16);
    let base = AttentionProblem {
        f16_operands: true,
        ..AttentionProblem::self_attention(1, 1, 4096, 512, Strides::channel_major(512, 4096), 1.0)
    };
    assert!(
        MatrixAttention::for_problem(&base, false, &caps).is_none(),
        "no matrices"
    );
    let m = MatrixAttention::for_problem(&base, false, &with).expect("f16 mid-block");
    assert_eq!((m.size, m.lanes, m.dm, m.invocations()), (16, 32, 512, 256));
    assert!(m.workgroup_bytes() <= 28672, "the engine's required limit");
    assert_eq!(m.keys_per_dispatch(&with), None, "one dispatch on GPUs");
    let no = |p: AttentionProblem, int8: bool| MatrixAttention::for_problem(&p, int8, &with);
    assert!(no(
        AttentionProblem {
            f16_operands: false,
            ..base
        },
        false
    )
    .is_none());
    assert!(no(
        AttentionProblem {
            mask: Mask::causal(),
            ..base
        },
        false
    )
    .is_none());
    assert!(no(base, true).is_none());
    let forced = Some(config_for(512).unwrap());
    assert!(no(
        AttentionProblem {
            config: forced,
            ..base
        },
        false
    )
    .is_none());
    assert!(no(
        AttentionProblem {
            head_dim: 100,
            ..base
        },
        false
    )
    .is_none());
    assert!(no(
        AttentionProblem {
            head_dim: 384,
            ..base
        },
        false
    )
    .is_some());
    // On lavapipe-like caps: 8 x 8, keys split over dispatches, stats allocated.
    let mut cpu = Capabilities::reference_gpu();
    cpu.device_type = wgpu::DeviceType::Cpu;
    cpu.cooperative_matrix = Some(crate::gpu::MatrixConfig::F16_F32_8);
    cpu.subgroup_min_size = 8;
    cpu.subgroup_max_size = 8;
    let m = MatrixAttention::for_problem(&base, false, &cpu).expect("8x8 mid-block");
    assert_eq!((m.size, m.invocations(), m.dm), (8, 64, 512));
    let keys = m.keys_per_dispatch(&cpu).expect("CPU adapters split keys");
    assert!((1024..16384).contains(&keys), "{keys}");
    let big = AttentionProblem {
        q_len: 16384,
        kv_len: 16384,
        ..base
    };
    assert_eq!(stats_len(&big, false, &cpu), 16384 * 2);
    let scalar = AttentionProblem {
        f16_operands: false,
        ..big
    };
    let scalar_keys = keys_per_dispatch(
        &config_for_device(512, 16384, &cpu).unwrap(),
        512,
        false,
        &cpu,
    );
    assert_ne!(
        scalar_keys,
        Some(keys),
        "the cooperative kernel's own loop count"
    );
    assert_eq!(stats_len(&scalar, false, &cpu), 16384 * 2);
    // Wide heads (Qwen-Image 2.1's 1152) leave the matrices to the scalar kernel's output
    // chunks, with a softmax state per chunk.
    let wide = AttentionProblem {
        head_dim: 1152,
        q_strides: Strides::channel_major(1152, 16384),
        kv_strides: Strides::channel_major(1152, 16384),
        ..big
    };
    assert!(no(wide, false).is_none());
    assert!(MatrixAttention::for_problem(&wide, false, &cpu).is_none());
    assert_eq!(stats_len(&wide, false, &cpu), 16384 * 2 * 3);
}

/// Keys in separate tensors (block roles) and a block longer than a CPU adapter runs in one
/// dispatch (split key ranges through `stats`) combine to attention over all keys.
#[test]
fn matrix_key_blocks_combine_to_full_attention() {
    let Some(ctx) =
        crate::testing::matrix_test_context("matrix_key_blocks_combine_to_full_attention")
    else {
        return;
    };
    let caps = ctx.caps().clone();
    let n = 2;
    let d = 512;
    // CPU adapters split long key ranges over dispatches; GPUs run each block in one.
    let per_dispatch =
        MatrixAttention::for_head_dim(d, &caps).and_then(|m| m.keys_per_dispatch(&caps));
    let share = per_dispatch.unwrap_or(40);
    let long = share + 13;
    for (tq, k_splits) in [
        (37usize, vec![0, 5, 60, 100]),
        (9, vec![0, 7, 7 + long, 7 + long + 3]),
    ] {
        let tk = *k_splits.last().unwrap();
        let [qd, kd, vd] = inputs(n * d * tq, n * d * tk, tq as u64, 2.0);
        let scale = 1.0 / (d as f32).sqrt();
        let want = cpu_cross_attention(&qd, &kd, &vd, n, d, tq, tk, scale);
        let q = Tensor::from_f32(&ctx, &[n, d, tq], &qd, "q").unwrap();
        let out = Tensor::empty(&ctx, &[n, d, tq], DType::F32, "out").unwrap();
        let stats = Tensor::empty(&ctx, &[n * tq * 2], DType::F32, "stats").unwrap();
        let mut rec = Recorder::new(&ctx);
        let blocks = k_splits.len() - 1;
        let mut keep = Vec::new();
        for (b, ks) in k_splits.windows(2).enumerate() {
            let len = ks[1] - ks[0];
            let cols = |x: &[f32]| -> Vec<f32> {
                (0..n * d)
                    .flat_map(|row| x[row * tk + ks[0]..row * tk + ks[1]].to_vec())
                    .collect()
            };
            let k = Tensor::from_f32(&ctx, &[n, d, len], &cols(&kd), "k").unwrap();
            let v = Tensor::from_f32(&ctx, &[n, d, len], &cols(&vd), "v").unwrap();
            let prob = AttentionProblem {
                f16_operands: true,
                ..AttentionProblem::self_attention(
                    n,
                    1,
                    tq,
                    d,
                    Strides::channel_major(d, tq),
                    scale,
                )
            };
            let prob = AttentionProblem {
                kv_len: len,
                kv_strides: Strides::channel_major(d, len),
                ..prob
            };
            let role = BlockRole {
                first: b == 0,
                last: b + 1 == blocks,
            };
            let kv = KvInput::F32 { k: &k, v: &v };
            flash_attention_block(&mut rec, &prob, &q, kv, &out, Some(&stats), role).unwrap();
            keep.push((k, v));
        }
        let what = format!("coop d={d} queries {tq} key blocks {k_splits:?}");
        assert_coop(&rec, &what);
        if per_dispatch.is_some() && tk > share {
            assert!(
                rec.labels().len() > blocks,
                "{what}: keys split over dispatches"
            );
        }
        rec.submit().unwrap();
        let got = out.to_f32(&ctx).unwrap();
        println!("{what}: max abs error {:.2e}", max_abs_diff(&got, &want).0);
        assert_close(&got, &want, ATOL, RTOL, &what);
    }
}

/// Token-major multi-head attention (strides other than the mid-block's): 2 heads of 64.
#[test]
fn matrix_attention_token_major_heads() {
    let Some(ctx) = crate::testing::matrix_test_context("matrix_attention_token_major_heads")
    else {
        return;
    };
    let (n, h, t, d) = (2usize, 2usize, 45usize, 64usize);
    let len = n * t * h * d;
    let [qd, kd, vd] = inputs(len, len, 7, 2.0);
    let scale = 1.0 / (d as f32).sqrt();
    let strides = Strides::token_major(t, h, d);
    let prob = AttentionProblem {
        f16_operands: true,
        ..AttentionProblem::self_attention(n, h, t, d, strides, scale)
    };
    let shape = [n, t, h * d];
    let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
    let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
    let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
    let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    flash_attention(&mut rec, &prob, &q, KvInput::F32 { k: &k, v: &v }, &out).unwrap();
    assert_coop(&rec, "token-major heads");
    rec.submit().unwrap();
    let got = out.to_f32(&ctx).unwrap();
    // Reference per (batch, head) on channel-major copies.
    let to_cm = |x: &[f32]| -> Vec<f32> {
        let mut o = vec![0.0; len];
        for b in 0..n {
            for hh in 0..h {
                for tt in 0..t {
                    for c in 0..d {
                        o[((b * h + hh) * d + c) * t + tt] = x[((b * t + tt) * h + hh) * d + c];
                    }
                }
            }
        }
        o
    };
    let want_cm = cpu_attention(&to_cm(&qd), &to_cm(&kd), &to_cm(&vd), n * h, d, t, scale);
    let got_cm = to_cm(&got);
    assert_close(&got_cm, &want_cm, ATOL, RTOL, "token-major heads");
}

/// One run of the mid-block-sized problem (T = 1024, d = 512) on the cooperative and the
/// scalar kernel: `cargo test --lib matrix_attention_time -- --ignored --nocapture` (on
/// lavapipe the matrices are emulated: a correctness run, not a speed claim).
#[test]
#[ignore]
fn matrix_attention_time() {
    let Some(ctx) = crate::testing::matrix_test_context("matrix_attention_time") else {
        return;
    };
    let (n, d, t) = (1usize, 512usize, 1024usize);
    let [qd, kd, vd] = inputs(n * d * t, n * d * t, 3, 2.0);
    let scale = 1.0 / (d as f32).sqrt();
    let shape = [n, d, t];
    let q = Tensor::from_f32(&ctx, &shape, &qd, "q").unwrap();
    let k = Tensor::from_f32(&ctx, &shape, &kd, "k").unwrap();
    let v = Tensor::from_f32(&ctx, &shape, &vd, "v").unwrap();
    let out = Tensor::empty(&ctx, &shape, DType::F32, "out").unwrap();
    let want = cpu_attention(&qd, &kd, &vd, n, d, t, scale);
    let mut times = Vec::new();
    for f16_operands in [true, false] {
        let mut best = f64::INFINITY;
        let mut err = 0.0;
        for _ in 0..3 {
            let start = std::time::Instant::now();
            let mut rec = Recorder::new(&ctx);
            attention_with(&mut rec, &q, &k, &v, scale, &out, f16_operands).unwrap();
            rec.submit().unwrap();
            let got = out.to_f32(&ctx).unwrap();
            best = best.min(start.elapsed().as_secs_f64());
            err = max_abs_diff(&got, &want).0;
        }
        let name = if f16_operands { "matrices" } else { "scalar" };
        println!(
            "T={t} d={d}: {name} {:.1} ms (best of 3, incl. read-back), max abs error {err:.2e}",
            best * 1e3
        );
        times.push(best);
    }
    println!("matrices / scalar time: {:.2}", times[0] / times[1]);
}
