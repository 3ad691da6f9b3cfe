//! Tests of the GroupNorm kernels (moved out of group_norm.rs for its length).

use super::*;
use crate::testing::{assert_close, rand_vec, test_context};
use crate::Context;

struct Run {
    out: Vec<f32>,
    affine: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn run(
    ctx: &Context,
    data: &[f32],
    shape: [usize; 4],
    groups: usize,
    gamma: &[f32],
    beta: &[f32],
    act: Activation,
    in_place: bool,
) -> Run {
    let [n, c, h, w] = shape;
    let x = Tensor::from_f32(ctx, &shape, data, "x").unwrap();
    let g = Tensor::from_f32(ctx, &[c], gamma, "gamma").unwrap();
    let b = Tensor::from_f32(ctx, &[c], beta, "beta").unwrap();
    let scratch = Tensor::empty(
        ctx,
        &[stats_scratch_len(n, c, h, w, groups)],
        DType::F32,
        "scratch",
    )
    .unwrap();
    let affine = Tensor::empty(ctx, &[n, c, 2], DType::F32, "affine").unwrap();
    let out = if in_place {
        x.clone()
    } else {
        Tensor::empty(ctx, &shape, DType::F32, "out").unwrap()
    };
    let mut rec = Recorder::new(ctx);
    group_norm(
        &mut rec,
        &x,
        &GroupNormParams::new(groups, &g, &b, 1e-6),
        act,
        &scratch,
        &affine,
        &out,
    )
    .unwrap();
    rec.submit().unwrap();
    Run {
        out: out.to_f32(ctx).unwrap(),
        affine: affine.to_f32(ctx).unwrap(),
    }
}

/// Tolerance: 1e-4 relative + 1e-5 absolute against an f64 reference.
#[test]
fn group_norm_matches_cpu_on_odd_shapes() {
    let ctx = test_context();
    let cases: &[([usize; 4], usize, Activation)] = &[
        ([1, 3, 7, 5], 1, Activation::None),
        ([2, 64, 19, 23], 32, Activation::Silu),
        ([2, 66, 19, 23], 3, Activation::Relu),
        ([1, 66, 37, 19], 33, Activation::Silu),
        // Prime channel counts: one channel per group, and one group of all.
        ([2, 67, 19, 23], 67, Activation::Silu),
        ([1, 67, 19, 23], 1, Activation::None),
        ([2, 37, 19, 23], 37, Activation::Relu),
        ([2, 37, 19, 23], 1, Activation::Silu),
        // Groups spanning two statistics chunks (20440 elements per group).
        ([1, 8, 70, 73], 2, Activation::None),
    ];
    for (i, &(shape, groups, act)) in cases.iter().enumerate() {
        let len: usize = shape.iter().product();
        let data = rand_vec(len, 10 + i as u64, 3.0);
        let gamma: Vec<f32> = rand_vec(shape[1], 20 + i as u64, 1.0)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        let beta = rand_vec(shape[1], 30 + i as u64, 0.5);
        let got = run(&ctx, &data, shape, groups, &gamma, &beta, act, i % 2 == 1);
        let want = cpu_group_norm(&data, shape, groups, &gamma, &beta, 1e-6, act);
        assert_close(
            &got.out,
            &want,
            1e-5,
            1e-4,
            &format!("group_norm {shape:?} groups={groups} {act:?}"),
        );
    }
}

/// Values 1000 + U(-1, 1): naive E[x²] - E[x]² in f32 would lose the
/// variance entirely (ulp(1e6) ≈ 0.06 vs var ≈ 0.33). The scale
/// coefficient (gamma * rstd) must match f64 to 1e-4 relative; the
/// output's tolerance adds the inherent rounding of the affine form
/// `x * scale + (beta - mean * scale)`: a few ulp of |mean * scale|.
#[test]
fn group_norm_statistics_are_stable_with_large_mean() {
    let ctx = test_context();
    // One chunk per group, and three chunks per group (45000 elements).
    for (shape, groups) in [([2, 64, 37, 41], 32), ([1, 4, 150, 150], 2)] {
        let [n, c, _, _] = shape;
        let len: usize = shape.iter().product();
        let data: Vec<f32> = rand_vec(len, 7, 1.0).iter().map(|v| 1000.0 + v).collect();
        let gamma = vec![1.0; c];
        let beta = vec![0.0; c];
        let none = Activation::None;
        let got = run(&ctx, &data, shape, groups, &gamma, &beta, none, false);
        let stats = cpu_group_stats(&data, shape, groups, 1e-6);
        for b in 0..n {
            for ch in 0..c {
                let (mean, rstd) = stats[b * groups + ch / (c / groups)];
                let scale = got.affine[(b * c + ch) * 2] as f64;
                let shift = got.affine[(b * c + ch) * 2 + 1] as f64;
                assert!(
                    (scale - rstd).abs() <= 1e-4 * rstd,
                    "scale {scale} vs rstd {rstd}"
                );
                // shift = -mean * scale: the implied mean must match f64 closely, to
                // 1e-4 plus two ulp of the f32 shift (about 1.2e-4 each near 1732):
                // NVIDIA's H100 rounds it 1.05e-4 away. Cancellation would be ~0.06.
                let implied_mean = -shift / scale;
                let ulp = (shift.abs() as f32).next_up() as f64 - shift.abs();
                let tol = 1e-4 + 2.0 * ulp / scale;
                assert!(
                    (implied_mean - mean).abs() <= tol,
                    "mean {implied_mean} vs {mean} (tolerance {tol:.2e})"
                );
            }
        }
        let want = cpu_group_norm(&data, shape, groups, &gamma, &beta, 1e-6, none);
        let ulp_budget = 4.0 * 1000.0 * 1.8 * f32::EPSILON;
        assert_close(
            &got.out,
            &want,
            1e-4 + ulp_budget,
            1e-4,
            &format!("large-mean {shape:?}"),
        );
    }
}

/// Tiled statistics: partials of four disjoint regions into one scratch
/// (or a bounded one, folded) give the same affine coefficients as the
/// whole tensor.
#[test]
fn partials_from_regions_combine_to_full_statistics() {
    let ctx = test_context();
    let (n, c, h, w, groups) = (2, 6, 45, 51, 3);
    let shape = [n, c, h, w];
    let data: Vec<f32> = rand_vec(n * c * h * w, 3, 2.0)
        .iter()
        .map(|v| v + 5.0)
        .collect();
    let gamma = rand_vec(c, 4, 1.0);
    let beta = rand_vec(c, 5, 1.0);
    let x = Tensor::from_f32(&ctx, &shape, &data, "x").unwrap();
    let gt = Tensor::from_f32(&ctx, &[c], &gamma, "gamma").unwrap();
    let bt = Tensor::from_f32(&ctx, &[c], &beta, "beta").unwrap();
    let regions = [
        StatsRegion {
            y0: 0,
            x0: 0,
            h: 20,
            w: 30,
        },
        StatsRegion {
            y0: 0,
            x0: 30,
            h: 20,
            w: 21,
        },
        StatsRegion {
            y0: 20,
            x0: 0,
            h: 25,
            w: 30,
        },
        StatsRegion {
            y0: 20,
            x0: 30,
            h: 25,
            w: 21,
        },
    ];
    let total: usize = regions
        .iter()
        .map(|r| partial_slots(c, r.h, r.w, groups))
        .sum();
    let largest = regions
        .iter()
        .map(|r| partial_slots(c, r.h, r.w, groups))
        .max()
        .unwrap();
    // Every region its own slots; then a scratch of one region and a slot,
    // folded whenever the next region's slots do not fit (stale slots past
    // the used ones must not count).
    for capacity in [total, largest + 1] {
        let scratch =
            Tensor::empty(&ctx, &[n * groups * capacity * 4], DType::F32, "scratch").unwrap();
        let affine = Tensor::empty(&ctx, &[n, c, 2], DType::F32, "affine").unwrap();
        let mut rec = Recorder::new(&ctx);
        let (mut used, mut folds) = (0, 0);
        for r in regions {
            let k = partial_slots(c, r.h, r.w, groups);
            if used + k > capacity {
                group_norm_fold(&mut rec, &scratch, n * groups, (used, capacity)).unwrap();
                used = 1;
                folds += 1;
            }
            group_norm_partials(&mut rec, &x, groups, Some(r), &scratch, used, capacity).unwrap();
            used += k;
        }
        assert_eq!(folds > 0, capacity < total);
        group_norm_combine(
            &mut rec,
            &scratch,
            n,
            (used, capacity),
            &GroupNormParams::new(groups, &gt, &bt, 1e-6),
            &affine,
        )
        .unwrap();
        rec.submit().unwrap();
        let got = affine.to_f32(&ctx).unwrap();
        let stats = cpu_group_stats(&data, shape, groups, 1e-6);
        let mut want = Vec::new();
        for b in 0..n {
            for ch in 0..c {
                let (mean, rstd) = stats[b * groups + ch / (c / groups)];
                let scale = gamma[ch] as f64 * rstd;
                want.push(scale as f32);
                want.push((beta[ch] as f64 - mean * scale) as f32);
            }
        }
        assert_close(
            &got,
            &want,
            1e-5,
            1e-4,
            &format!("tiled partials, capacity {capacity}"),
        );
    }
}

/// Half storage (native f16, packed f16, packed bf16), in place:
/// statistics stay f32, so the error is the output's rounding.
#[test]
fn group_norm_half_storage_matches_cpu() {
    for (ctx, dt) in crate::testing::dtype_contexts() {
        if dt == DType::F32 {
            continue;
        }
        let shape = [1, 64, 19, 23];
        let len: usize = shape.iter().product();
        let data: Vec<f32> = rand_vec(len, 9, 2.0)
            .iter()
            .map(|&v| crate::gpu::storage::round_through(v, dt))
            .collect();
        let x = Tensor::from_f32_as(&ctx, &shape, &data, dt, "x").unwrap();
        let gamma = vec![1.5; 64];
        let beta = vec![0.25; 64];
        let g = Tensor::from_f32(&ctx, &[64], &gamma, "g").unwrap();
        let b = Tensor::from_f32(&ctx, &[64], &beta, "b").unwrap();
        let scratch = Tensor::empty(
            &ctx,
            &[stats_scratch_len(1, 64, 19, 23, 32)],
            DType::F32,
            "s",
        )
        .unwrap();
        let affine = Tensor::empty(&ctx, &[1, 64, 2], DType::F32, "a").unwrap();
        let mut rec = Recorder::new(&ctx);
        group_norm(
            &mut rec,
            &x,
            &GroupNormParams::new(32, &g, &b, 1e-6),
            Activation::Silu,
            &scratch,
            &affine,
            &x,
        )
        .unwrap();
        rec.submit().unwrap();
        let want = cpu_group_norm(&data, shape, 32, &gamma, &beta, 1e-6, Activation::Silu);
        // One rounding of the output: 2^-11 (f16) or 2^-8 (bf16) relative, plus f32 noise.
        let tol = if dt == DType::BF16 { 8e-3 } else { 2e-3 };
        let what = format!("group_norm {}", crate::kernels::storage_path(&ctx, dt));
        assert_close(&x.to_f32(&ctx).unwrap(), &want, tol, tol, &what);
    }
}

#[test]
fn bad_shapes_are_errors() {
    let ctx = test_context();
    let x = Tensor::empty(&ctx, &[1, 66, 4, 4], DType::F32, "x").unwrap();
    let g = Tensor::empty(&ctx, &[66], DType::F32, "g").unwrap();
    let scratch = Tensor::empty(&ctx, &[1024], DType::F32, "s").unwrap();
    let affine = Tensor::empty(&ctx, &[1, 66, 2], DType::F32, "a").unwrap();
    let mut rec = Recorder::new(&ctx);
    let (p3, p32) = (
        GroupNormParams::new(3, &g, &g, 1e-6),
        GroupNormParams::new(32, &g, &g, 1e-6),
    );
    // 32 groups do not divide 66 channels.
    let r = group_norm_stats(&mut rec, &x, &p32, &scratch, &affine);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // Too small a scratch.
    let tiny = Tensor::empty(&ctx, &[3], DType::F32, "tiny").unwrap();
    let r = group_norm_stats(&mut rec, &x, &p3, &tiny, &affine);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // Mismatched out, wrong affine, rank-3 x.
    let out = Tensor::empty(&ctx, &[1, 66, 4, 5], DType::F32, "o").unwrap();
    let r = group_norm_apply(&mut rec, &x, &affine, Activation::None, &out);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let r = group_norm_apply(&mut rec, &x, &g, Activation::None, &x);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let x3 = Tensor::empty(&ctx, &[66, 4, 4], DType::F32, "x3").unwrap();
    let r = group_norm_stats(&mut rec, &x3, &p3, &scratch, &affine);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // Rgba8 activations, wrong dtype of the affine.
    let xr = Tensor::empty(&ctx, &[1, 66, 4, 4], DType::Rgba8, "xr").unwrap();
    let r = group_norm_stats(&mut rec, &xr, &p3, &scratch, &affine);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let r = group_norm_apply(&mut rec, &xr, &affine, Activation::None, &xr);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let a16 = Tensor::empty(&ctx, &[1, 66, 2], DType::F16, "a16").unwrap();
    let r = group_norm_apply(&mut rec, &x, &a16, Activation::None, &x);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
}

/// Rough throughput on this adapter: `cargo test --release --lib group_norm_throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn group_norm_throughput() {
    let ctx = test_context();
    let shape = [1, 128, 256, 256];
    let (n, c, h, w) = (1, 128, 256, 256);
    let len: usize = shape.iter().product();
    let data = rand_vec(len, 1, 1.0);
    let x = Tensor::from_f32(&ctx, &shape, &data, "x").unwrap();
    let g = Tensor::from_f32(&ctx, &[c], &vec![1.0; c], "g").unwrap();
    let scratch =
        Tensor::empty(&ctx, &[stats_scratch_len(n, c, h, w, 32)], DType::F32, "s").unwrap();
    let affine = Tensor::empty(&ctx, &[n, c, 2], DType::F32, "a").unwrap();
    let out = Tensor::empty(&ctx, &shape, DType::F32, "o").unwrap();
    // Best of 5 batches of 3 (the machine is shared: the minimum is the
    // least disturbed measurement).
    let time = |f: &dyn Fn(&mut Recorder)| {
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let mut rec = Recorder::new(&ctx);
            for _ in 0..3 {
                f(&mut rec);
            }
            rec.submit().unwrap();
            ctx.wait_idle().unwrap();
            best = best.min(t.elapsed().as_secs_f64() / 3.0);
        }
        best
    };
    let act = Activation::Silu;
    let full = time(&|rec| {
        group_norm(
            rec,
            &x,
            &GroupNormParams::new(32, &g, &g, 1e-6),
            act,
            &scratch,
            &affine,
            &out,
        )
        .unwrap()
    });
    let stats = time(&|rec| {
        group_norm_stats(
            rec,
            &x,
            &GroupNormParams::new(32, &g, &g, 1e-6),
            &scratch,
            &affine,
        )
        .unwrap()
    });
    let apply = time(&|rec| group_norm_apply(rec, &x, &affine, act, &out).unwrap());
    let relu = time(&|rec| {
        crate::kernels::elementwise::unary(rec, crate::kernels::elementwise::Unary::Relu, &x, &out)
            .unwrap()
    });
    let mb = len as f64 * 4.0 / 1e6;
    println!(
        "  baseline elementwise relu: {:.2} ms ({:.2} GB/s read+write)",
        relu * 1e3,
        2.0 * mb / relu / 1e3
    );
    // Bytes moved: read x twice (stats, apply) + write out once.
    println!(
        "group_norm [1,128,256,256] g=32 silu: {:.2} ms, {:.2} GB/s (3 x {mb:.0} MB moved)",
        full * 1e3,
        3.0 * mb / full / 1e3
    );
    println!(
        "  stats pass {:.2} ms ({:.2} GB/s read), apply pass {:.2} ms ({:.2} GB/s read+write)",
        stats * 1e3,
        mb / stats / 1e3,
        apply * 1e3,
        2.0 * mb / apply / 1e3
    );
}

/// Dry runs: partials whose signature already passed the checks repeat
/// their labels (tiles of one shape at other slots); partials past the
/// scratch capacity or from a region outside the plane are still refused.
#[test]
fn dry_runs_repeat_checked_partials_and_still_refuse_bad_ones() {
    let ctx = Context::null(
        crate::gpu::Capabilities::reference_gpu(),
        crate::memory::Policy::Exact.new_pool(),
    );
    let (n, c, h, w, g) = (1, 8, 6, 5, 2);
    let slots = partial_slots(c, h, w, g);
    let x = Tensor::empty(&ctx, &[n, c, h, w], DType::F32, "x").unwrap();
    let scratch = Tensor::empty(&ctx, &[n * g * 2 * slots * 4], DType::F32, "s").unwrap();
    let mut rec = Recorder::new(&ctx);
    group_norm_partials(&mut rec, &x, g, None, &scratch, 0, 2 * slots).unwrap();
    let once = rec.dry_mark();
    assert!(once > 0);
    group_norm_partials(&mut rec, &x, g, None, &scratch, slots, 2 * slots).unwrap();
    assert_eq!(rec.dry_mark(), 2 * once, "a repeat records the same labels");
    let past = group_norm_partials(&mut rec, &x, g, None, &scratch, slots + 1, 2 * slots);
    assert!(past.unwrap_err().to_string().contains("capacity"));
    let outside = StatsRegion { y0: 1, x0: 0, h, w };
    assert!(group_norm_partials(&mut rec, &x, g, Some(outside), &scratch, 0, 2 * slots).is_err());
    assert_eq!(rec.dry_mark(), 2 * once, "refused calls record nothing");
}
