//! The cooperative-matrix (tensor-core) kernel against the CPU reference, on odd shapes,
//! where the test device has a usable configuration (Mesa 26's lavapipe: 8×8×8 f16 → f32;
//! `ci/coopmat.sh` runs them there). Elsewhere they say why they did not run, and fail
//! instead under `WGVAE_REQUIRE_COOP=1` (see [`crate::testing::matrix_test_context`]).

use super::tests::ConvInputs;
use super::tiles::MatrixTiles;
use super::*;
use crate::testing::{assert_close, test_context};

fn matrix_context(test: &str) -> Option<Context> {
    crate::testing::matrix_test_context(test)
}

/// Tile sets that put tile and subgroup edges everywhere, for the device's matrix side and
/// subgroup sizes: one subgroup row of several (one stage, unpadded rows, a K step's weight
/// vec4s fewer than the invocations); two subgroups per row with a 4-pixel-wide patch (a
/// matrix spans patch rows; two stages, padded); a tall narrow tile (a K step's input vec4s
/// fewer than the invocations); every entry of the engine's table for a wide layer and the
/// first for a narrow one.
fn tile_sets(ctx: &Context) -> Vec<ConvTiles> {
    let caps = ctx.caps();
    let s = caps.matrix().expect("matrix context").size;
    let matrix = |pad, stages| {
        Some(MatrixTiles {
            size: s,
            lanes: caps.subgroup_max_size,
            lanes_min: caps.subgroup_min_size,
            pad,
            stages,
        })
    };
    let mut v = vec![
        ConvTiles {
            tm: s,
            tn: 4 * s,
            tw: s,
            tk: s,
            rm: s,
            rn: s,
            direct: false,
            matrix: matrix(0, 1),
        },
        ConvTiles {
            tm: 2 * s,
            tn: 2 * s,
            tw: 4,
            tk: 2 * s,
            rm: s,
            rn: 2 * s,
            direct: false,
            matrix: matrix(8, 2),
        },
        // Tall and narrow: a K step's input vec4s fewer than the invocations.
        ConvTiles {
            tm: 8 * s,
            tn: s,
            tw: s,
            tk: s,
            rm: s,
            rn: s,
            direct: false,
            matrix: matrix(8, 2),
        },
    ];
    // The wide layer's every entry (two stages, one stage), the narrow layer's first.
    v.extend(ConvTiles::matrix_table(caps, 512, 3));
    v.extend(ConvTiles::matrix_table(caps, 3, 3).into_iter().take(1));
    for t in &v {
        t.check(caps).unwrap();
    }
    v
}

/// One f16 comparison: inputs, weights and residual rounded to f16 for the CPU reference
/// too, so the error is the kernel's f16 operands (the prologue's output rounded) and the
/// f16 output. Bound: 3e-3 + 3e-3 |want| (the scalar f16 path's is 2e-3 + 2e-3 |want|).
#[allow(clippy::too_many_arguments)]
fn check(
    ctx: &Context,
    tiles: ConvTiles,
    [n, cin, h, w]: [usize; 4],
    cout: usize,
    k: usize,
    opts: Conv2dOptions,
    act: Option<Activation>,
    residual: bool,
    seed: u64,
) -> f32 {
    let dt = DType::F16;
    let ins = ConvInputs::random([n, cin, h, w], cout, k, &opts, seed, dt);
    let (ho, wo) = ins.out;
    let want = cpu_conv2d(
        &ins.x,
        [n, cin, h, w],
        &ins.wv,
        cout,
        k,
        Some(&ins.bv),
        act.map(|a| (&ins.aff[..], a)),
        residual.then_some(&ins.rv[..]),
        &opts,
    );
    let host = PytorchConv {
        weight: &ins.wv,
        cout,
        cin,
        k,
        bias: Some(&ins.bv),
    };
    let weights = Conv2dWeights::upload(ctx, &host, Some(tiles), dt, "w").unwrap();
    let xt = Tensor::from_f32_as(ctx, &[n, cin, h, w], &ins.x, dt, "x").unwrap();
    let at = Tensor::from_f32(ctx, &[n, cin, 2], &ins.aff, "affine").unwrap();
    // A residual is added in place, as the engine's layers do.
    let out = Tensor::from_f32_as(ctx, &[n, cout, ho, wo], &ins.rv, dt, "out").unwrap();
    let mut rec = Recorder::new(ctx);
    conv2d(
        &mut rec,
        &xt,
        &weights,
        act.map(|act| Prologue { affine: &at, act }),
        residual.then_some(&out),
        &out,
        &opts,
    )
    .unwrap();
    let label = rec.labels()[0].clone();
    rec.submit().unwrap();
    assert!(
        format!("{label:?}").contains("conv2d_coop"),
        "the cooperative kernel ran: {label:?}"
    );
    let got = out.to_f32(ctx).unwrap();
    let what =
        format!("[{n},{cin},{h},{w}]->{cout} k{k} {opts:?} act {act:?} res {residual} {tiles:?}");
    assert_close(&got, &want, 3e-3, 3e-3, &what);
    got.iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
}

fn same(k: u32) -> Conv2dOptions {
    Conv2dOptions::same(k)
}

/// One case: input `[n, cin, h, w]`, output channels, kernel size, geometry, prologue,
/// in-place residual.
type CaseSpec = (
    [usize; 4],
    usize,
    usize,
    Conv2dOptions,
    Option<Activation>,
    bool,
);

/// Every case with every tile set on the matrix device (if any), the worst error printed.
fn check_cases(test: &str, what: &str, cases: &[CaseSpec], seed: u64) {
    let Some(ctx) = matrix_context(test) else {
        return;
    };
    let worst = check_all(&ctx, cases, seed);
    eprintln!("matrix conv, {what}: worst |error| {worst:.2e}");
}

/// Every case with every tile set; returns the worst error.
fn check_all(ctx: &Context, cases: &[CaseSpec], seed: u64) -> f32 {
    let mut worst = 0.0f32;
    for (i, t) in tile_sets(ctx).into_iter().enumerate() {
        for (c, &(shape, cout, k, opts, act, residual)) in cases.iter().enumerate() {
            let seed = seed + 10 * i as u64 + c as u64;
            worst = worst.max(check(ctx, t, shape, cout, k, opts, act, residual, seed));
        }
    }
    worst
}

#[test]
fn matrix_conv_odd_shapes_match_cpu() {
    let cases: &[CaseSpec] = &[
        ([2, 37, 19, 23], 67, 3, same(3), None, false),
        ([1, 64, 9, 11], 67, 1, same(1), None, false),
        ([1, 3, 7, 5], 4, 3, same(3), None, false),
        // conv_out: 3 channels of a 128-channel input.
        ([1, 128, 6, 10], 3, 3, same(3), None, false),
    ];
    check_cases("matrix_conv_odd_shapes_match_cpu", "plain", cases, 100);
}

/// Every candidate `wgvae bench conv` may time (and a tuning may pick) computes the same
/// convolution: one case per candidate (each is a pipeline to compile) with every fused path
/// at once (up-sample, GroupNorm affine + SiLU, in-place residual) on an odd shape that
/// leaves partial tiles on every side and a K that is no multiple of any step.
#[test]
fn matrix_conv_bench_candidates_match_cpu() {
    let Some(ctx) = matrix_context("matrix_conv_bench_candidates_match_cpu") else {
        return;
    };
    let up = Conv2dOptions {
        upsample: true,
        ..same(3)
    };
    let cands = ConvTiles::candidates(ctx.caps(), 67, 3);
    assert!(cands.len() >= 6, "{cands:?}");
    let mut worst = 0.0f32;
    for (i, t) in cands.into_iter().enumerate() {
        assert!(t.matrix.is_some(), "{t:?}");
        let silu = Some(Activation::Silu);
        let seed = 300 + i as u64;
        worst = worst.max(check(&ctx, t, [1, 37, 10, 23], 67, 3, up, silu, true, seed));
    }
    eprintln!("matrix conv, bench candidates: worst |error| {worst:.2e}");
}

#[test]
fn matrix_conv_fused_paths_match_cpu() {
    let up = |k: u32| Conv2dOptions {
        upsample: true,
        replicate: false,
        reflect: false,
        ..same(k)
    };
    let strided = |stride: u32, pad: [u32; 4]| Conv2dOptions {
        stride,
        pad,
        replicate: false,
        reflect: false,
        upsample: false,
    };
    let (silu, relu) = (Some(Activation::Silu), Some(Activation::Relu));
    let cases: &[CaseSpec] = &[
        // The decoder's resnet conv: GroupNorm affine + SiLU prologue, residual in place.
        ([1, 40, 9, 21], 36, 3, same(3), silu, true),
        // The up-sampler: nearest 2x fused into the load.
        ([2, 37, 7, 9], 67, 3, up(3), None, false),
        ([1, 8, 5, 6], 12, 3, up(3), silu, false),
        // The encoder's down-sampler (stride 2, pad bottom/right) and symmetric stride 2.
        (
            [2, 37, 19, 23],
            67,
            3,
            strided(2, [0, 0, 1, 1]),
            None,
            false,
        ),
        ([1, 5, 9, 12], 7, 3, strided(2, [1; 4]), None, true),
        ([1, 6, 8, 9], 5, 3, strided(1, [0, 2, 1, 0]), relu, false),
        ([1, 64, 9, 11], 67, 1, same(1), None, true),
    ];
    check_cases("matrix_conv_fused_paths_match_cpu", "fused", cases, 200);
}

/// The causal video conv's time taps: frame offsets read earlier input images and add into
/// later output images in place (Wan's 3x3x3 convs), through the cooperative kernel.
#[test]
fn matrix_conv_frame_offsets_match_cpu() {
    let Some(ctx) = matrix_context("matrix_conv_frame_offsets_match_cpu") else {
        return;
    };
    let tiles: Vec<_> = tile_sets(&ctx).into_iter().map(Some).collect();
    super::tests::frame_offsets_case(&ctx, DType::F16, (13, 20), &tiles, (3e-3, 3e-3));
}

/// The engine picks cooperative tiles for f16 weights (and only for them) on a device with
/// a configuration, and never on one without.
#[test]
fn matrix_tiles_only_for_f16_on_matrix_devices() {
    use super::tiles::{typical_caps, typical_matrix_caps};
    for cpu in [false, true] {
        let with = typical_matrix_caps(cpu);
        let without = typical_caps(cpu);
        for cout in [3, 64, 512] {
            let t = ConvTiles::matrix_for_layer(&with, cout, 3).expect("matrix tiles");
            t.check(&with).unwrap();
            assert_eq!(t.matrix.unwrap().size, if cpu { 8 } else { 16 });
            assert!(t.workgroup_size() <= 256, "{t:?}");
            // A device with only the engine's required workgroup memory gets a set within it.
            let required = crate::gpu::requirements::required_limits();
            let mut tight = with.clone();
            tight.max_compute_workgroup_storage_size = required.max_compute_workgroup_storage_size;
            let f = ConvTiles::matrix_for_layer(&tight, cout, 3).expect("tiles within the limits");
            assert!(
                f.shared_bytes() <= required.max_compute_workgroup_storage_size,
                "{f:?}"
            );
            assert!(ConvTiles::matrix_for_layer(&without, cout, 3).is_none());
            // A matrix tile set is refused where the device has no such configuration.
            assert!(t.check(&without).is_err());
        }
    }
    // On the test device: f16 weights get matrix tiles iff it has a configuration.
    let ctx = test_context();
    let host = PytorchConv {
        weight: &[0.5; 16 * 8 * 9],
        cout: 16,
        cin: 8,
        k: 3,
        bias: None,
    };
    let has = ctx.caps().matrix().is_some();
    for (dt, want) in [
        (DType::F16, has && ctx.caps().shader_f16),
        (DType::F32, false),
        (DType::BF16, false),
    ] {
        let w = Conv2dWeights::upload(&ctx, &host, None, dt, "w").unwrap();
        assert_eq!(w.tiles().matrix.is_some(), want, "{dt:?}");
    }
    // Cooperative tiles hold f16 weights (the kernel reads them as stored): other weight
    // types are refused at upload, naming the fix (on a null device with matrices).
    let caps = super::tiles::typical_matrix_caps(false);
    let null = Context::null(caps.clone(), crate::memory::Policy::Exact.new_pool());
    let tiles = ConvTiles::matrix_for_layer(&caps, 16, 3).unwrap();
    Conv2dWeights::upload(&null, &host, Some(tiles), DType::F16, "w").unwrap();
    for dt in [DType::F32, DType::BF16] {
        match Conv2dWeights::upload(&null, &host, Some(tiles), dt, "w") {
            Err(Error::Unsupported(m)) => assert!(m.contains("f16 weights"), "{m}"),
            other => panic!("{dt:?}: {other:?}"),
        }
    }
    // Hiding shader-f16 (the packed-f16 path) hides the matrices too.
    let mut caps = ctx.caps().clone();
    caps.shader_f16 = false;
    assert!(caps.matrix().is_none());
    let packed = ctx.with_caps(caps);
    let w = Conv2dWeights::upload(&packed, &host, None, DType::F16, "w").unwrap();
    assert!(w.tiles().matrix.is_none());
}
