//! The cooperative-matrix GEMM (`matmul_coop`) against the CPU reference on odd shapes,
//! where the test device has a usable configuration (Mesa 26's lavapipe: 8×8×8 f16 → f32;
//! `ci/coopmat.sh` runs them there). Elsewhere they say why they did not run, and fail
//! instead under `WGVAE_REQUIRE_COOP=1` (see [`crate::testing::matrix_test_context`]).
//! The selection tests (errors, fallback) run everywhere.

use super::*;
use crate::gpu::storage::round_through;
use crate::gpu::Context;
use crate::testing::{assert_close, matrix_test_context, rand_vec, scalar_context, test_context};

fn round16(v: Vec<f32>) -> Vec<f32> {
    v.into_iter()
        .map(|x| round_through(x, DType::F16))
        .collect()
}

/// One GEMM: shapes, layouts, broadcasts, bias and alpha.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    bias: bool,
    /// a (b) has batch 1 (batch stride 0) under a larger batch.
    bcast_a: bool,
    bcast_b: bool,
    alpha: f32,
}

/// Runs `case` on `tiles` with inputs in [-1, 1] rounded to f16 (the reference gets the
/// same rounded values, so the error is the kernel's f32 accumulation order only) and
/// returns the largest |error|. Bound: 1e-4 + 1e-4 |want| (inputs in [-1, 1], K <= 129:
/// an f32 sum's rounding is ~1e-6; the f16 rounding of the inputs alone would be ~1e-3).
fn check(ctx: &Context, tiles: CoopTiles, c: Case, seed: u64) -> f32 {
    let Case {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        bias,
        bcast_a,
        bcast_b,
        alpha,
    } = c;
    let opts = MatmulOptions {
        trans_a,
        trans_b,
        alpha,
        precision: MatmulPrecision::F16Operands,
    };
    let ab = if bcast_a { 1 } else { batch };
    let bb = if bcast_b { 1 } else { batch };
    let a_data = round16(rand_vec(ab * m * k, seed, 1.0));
    let b_data = round16(rand_vec(bb * k * n, seed + 1, 1.0));
    let bias_data = rand_vec(n, seed + 2, 1.0);
    let a_shape = if trans_a { [ab, k, m] } else { [ab, m, k] };
    let b_shape = if trans_b { [bb, n, k] } else { [bb, k, n] };
    let a = Tensor::from_f32(ctx, &a_shape, &a_data, "a").unwrap();
    let b = Tensor::from_f32(ctx, &b_shape, &b_data, "b").unwrap();
    let bt = Tensor::from_f32(ctx, &[n], &bias_data, "bias").unwrap();
    let out = Tensor::empty(ctx, &[batch, m, n], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(ctx);
    matmul_with(
        &mut rec,
        &a,
        &b,
        bias.then_some(&bt),
        &out,
        &opts,
        Some(tiles),
    )
    .unwrap();
    let labels = rec.submit().unwrap();
    assert!(
        labels.len() == 1 && labels[0].entry == "matmul_coop",
        "the cooperative kernel ran: {labels:?}"
    );
    let want = cpu_matmul(
        &a_data,
        &b_data,
        bias.then_some(&bias_data[..]),
        batch,
        m,
        n,
        k,
        &opts,
    );
    let got = out.to_f32(ctx).unwrap();
    assert_close(&got, &want, 1e-4, 1e-4, &format!("{c:?} {tiles:?}"));
    got.iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
}

/// The device's tiles and two that put subgroup and tile edges elsewhere: a row of four
/// one-matrix subgroups with one matrix per K step, and a 2 x 2 grid of subgroups holding
/// two matrices each with two per K step.
fn tile_sets(ctx: &Context) -> Vec<CoopTiles> {
    let caps = ctx.caps();
    let base = CoopTiles::for_device(caps).unwrap();
    let s = base.size;
    let v = vec![
        base,
        CoopTiles {
            tm: s,
            tn: 4 * s,
            tk: s,
            rm: s,
            rn: s,
            ..base
        },
        CoopTiles {
            tm: 4 * s,
            tn: 2 * s,
            tk: 2 * s,
            rm: 2 * s,
            rn: s,
            ..base
        },
    ];
    for t in &v {
        t.check(caps).unwrap();
    }
    v
}

#[test]
fn matmul_coop_odd_shapes_match_cpu() {
    let Some(ctx) = matrix_test_context("matmul_coop_odd_shapes_match_cpu") else {
        return;
    };
    let sets = tile_sets(&ctx);
    // (batch, m, n, k, a broadcast, b broadcast)
    let shapes = [
        (1, 1, 1, 1, false, false),
        (1, 7, 37, 100, false, false),
        (2, 37, 129, 7, true, false),
        (3, 100, 1, 129, false, true),
        (2, 129, 100, 37, false, false),
        (2, 64, 64, 32, true, false),
    ];
    let mut seed = 0;
    let mut cases = 0;
    let mut worst = 0.0f32;
    for (si, &tiles) in sets.iter().enumerate() {
        for (i, &(batch, m, n, k, bcast_a, bcast_b)) in shapes.iter().enumerate() {
            // Every layout on the device's tiles; one per shape on the others.
            for layout in 0..4usize {
                if si > 0 && layout != (i + si) % 4 {
                    continue;
                }
                seed += 10;
                let case = Case {
                    batch,
                    m,
                    n,
                    k,
                    trans_a: layout & 1 != 0,
                    trans_b: layout & 2 != 0,
                    bias: (i + layout) % 2 == 0,
                    bcast_a,
                    bcast_b,
                    alpha: if layout % 2 == 0 { 0.75 } else { -1.5 },
                };
                worst = worst.max(check(&ctx, tiles, case, seed));
                cases += 1;
            }
        }
    }
    println!(
        "matmul_coop ({}): worst |error| {worst:.2e} over {cases} cases",
        sets[0].matrix_name()
    );
}

/// The public entry: `F16Operands` runs the cooperative kernel on a device that has one.
#[test]
fn matmul_f16_operands_selects_the_coop_entry() {
    let Some(ctx) = matrix_test_context("matmul_f16_operands_selects_the_coop_entry") else {
        return;
    };
    let (m, n, k) = (20, 30, 40);
    let a_data = round16(rand_vec(m * k, 5, 1.0));
    let b_data = round16(rand_vec(k * n, 6, 1.0));
    let a = Tensor::from_f32(&ctx, &[m, k], &a_data, "a").unwrap();
    let b = Tensor::from_f32(&ctx, &[k, n], &b_data, "b").unwrap();
    let out = Tensor::empty(&ctx, &[m, n], DType::F32, "out").unwrap();
    for precision in [
        MatmulPrecision::F16Operands,
        MatmulPrecision::F16OperandsOrF32,
    ] {
        let opts = MatmulOptions {
            precision,
            ..Default::default()
        };
        let mut rec = Recorder::new(&ctx);
        matmul(&mut rec, &a, &b, None, &out, &opts).unwrap();
        let labels = rec.submit().unwrap();
        assert_eq!(labels[0].entry, "matmul_coop", "{precision:?}");
        let want = cpu_matmul(&a_data, &b_data, None, 1, m, n, k, &opts);
        assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-4, 1e-4, "F16Operands");
    }
}

/// Without matrices `F16Operands` is `Unsupported` naming the reason, and
/// `F16OperandsOrF32` runs the f32 kernel (runs on every device: the matrices are hidden).
#[test]
fn f16_operands_without_matrices_is_unsupported_or_falls_back() {
    let ctx = scalar_context(&test_context());
    let (m, n, k) = (5, 6, 7);
    let a_data = rand_vec(m * k, 7, 1.0);
    let b_data = rand_vec(k * n, 8, 1.0);
    let a = Tensor::from_f32(&ctx, &[m, k], &a_data, "a").unwrap();
    let b = Tensor::from_f32(&ctx, &[k, n], &b_data, "b").unwrap();
    let out = Tensor::empty(&ctx, &[m, n], DType::F32, "out").unwrap();
    let mut rec = Recorder::new(&ctx);
    let opts = MatmulOptions {
        precision: MatmulPrecision::F16Operands,
        ..Default::default()
    };
    match matmul(&mut rec, &a, &b, None, &out, &opts) {
        Err(Error::Unsupported(msg)) => assert!(
            msg.contains("no usable cooperative-matrix configuration")
                && msg.contains("F16OperandsOrF32"),
            "{msg}"
        ),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let opts = MatmulOptions {
        precision: MatmulPrecision::F16OperandsOrF32,
        ..opts
    };
    matmul(&mut rec, &a, &b, None, &out, &opts).unwrap();
    let labels = rec.submit().unwrap();
    assert_eq!(labels.len(), 1);
    assert_eq!(labels[0].entry, "matmul");
    let want = cpu_matmul(&a_data, &b_data, None, 1, m, n, k, &opts);
    assert_close(&out.to_f32(&ctx).unwrap(), &want, 1e-5, 1e-4, "fallback");
}

/// GFLOP/s of the cooperative kernel against the f32 one, in one run:
/// `WGVAE_REQUIRE_COOP=1 <lib tests> matmul_coop_throughput --ignored --nocapture`
/// (on lavapipe the matrices are emulated: a correctness run, not a speed claim).
#[test]
#[ignore]
fn matmul_coop_throughput() {
    let Some(ctx) = matrix_test_context("matmul_coop_throughput") else {
        return;
    };
    let tiles = CoopTiles::for_device(ctx.caps()).unwrap();
    for (m, n, k) in [(512, 512, 512), (4096, 512, 512)] {
        let a = Tensor::from_f32(&ctx, &[m, k], &rand_vec(m * k, 1, 1.0), "a").unwrap();
        let b = Tensor::from_f32(&ctx, &[k, n], &rand_vec(k * n, 2, 1.0), "b").unwrap();
        let out = Tensor::empty(&ctx, &[m, n], DType::F32, "out").unwrap();
        let time = |coop: Option<CoopTiles>| {
            let mut best = f64::INFINITY;
            // The first run compiles the pipeline.
            for _ in 0..4 {
                let t = std::time::Instant::now();
                let mut rec = Recorder::new(&ctx);
                matmul_with(
                    &mut rec,
                    &a,
                    &b,
                    None,
                    &out,
                    &MatmulOptions::default(),
                    coop,
                )
                .unwrap();
                rec.submit().unwrap();
                ctx.wait_idle().unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            2.0 * (m * n * k) as f64 / best / 1e9
        };
        let scalar = time(None);
        let coop = time(Some(tiles));
        println!(
            "matmul {m}x{n}x{k} on `{}`: f32 kernel {scalar:.2} GFLOP/s, matmul_coop ({}) {coop:.2} GFLOP/s, ratio {:.2}",
            ctx.caps().adapter_name,
            tiles.matrix_name(),
            coop / scalar
        );
    }
}
