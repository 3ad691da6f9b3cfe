//! A tiny random decoder-shaped chain, conv3x3 -> GroupNorm -> SiLU -> nearest-2x upsample ->
//! conv3x3, on odd shapes, against the plain CPU references of each kernel
//! (`cpu_conv2d`, `cpu_group_norm`). Needs no weight files.
//!
//! Two GPU paths are checked against the same CPU result:
//! - separate kernels: conv, GroupNorm (no activation), elementwise SiLU, then the second conv
//!   with only the upsample fused into its input load (the engine has no standalone upsample
//!   kernel; the upsample is always a load mode of the conv);
//! - fused (what the decoder records): conv, GroupNorm statistics only, then one conv whose
//!   prologue applies the normalisation + SiLU and whose load upsamples.
//!
//! Tolerance: |gpu - cpu| <= 1e-5 + 1e-4 * |cpu| (f32; the CPU reference accumulates in f64).

use wgvae::gpu::Recorder;
use wgvae::kernels::conv2d::{
    conv2d, cpu_conv2d, output_size, Conv2dOptions, Conv2dWeights, Prologue,
};
use wgvae::kernels::elementwise::{unary, Unary};
use wgvae::kernels::group_norm::{
    cpu_group_norm, group_norm, group_norm_stats, stats_scratch_len, GroupNormParams,
};
use wgvae::kernels::Activation;
use wgvae::tensor::{DType, Tensor};
use wgvae::testing::{assert_close, rand_vec, test_context};

const ATOL: f32 = 1e-5;
const RTOL: f32 = 1e-4;

#[derive(Clone, Copy)]
struct Chain {
    n: usize,
    c_in: usize,
    c_mid: usize,
    c_out: usize,
    h: usize,
    w: usize,
    groups: usize,
}

impl Chain {
    fn run(&self, seed: u64) {
        let ctx = test_context();
        let Chain {
            n,
            c_in,
            c_mid,
            c_out,
            h,
            w,
            groups,
        } = *self;
        let what = format!("[{n},{c_in},{h},{w}] -> {c_mid} (groups {groups}) -> {c_out}");
        let eps = 1e-6f32;
        let x = rand_vec(n * c_in * h * w, seed, 1.0);
        let w1 = rand_vec(c_mid * c_in * 9, seed + 1, 1.0 / ((c_in * 9) as f32).sqrt());
        let b1 = rand_vec(c_mid, seed + 2, 0.5);
        let gamma: Vec<f32> = rand_vec(c_mid, seed + 3, 0.5)
            .iter()
            .map(|g| 1.0 + g)
            .collect();
        let beta = rand_vec(c_mid, seed + 4, 0.5);
        let w2 = rand_vec(
            c_out * c_mid * 9,
            seed + 5,
            1.0 / ((c_mid * 9) as f32).sqrt(),
        );
        let b2 = rand_vec(c_out, seed + 6, 0.5);
        let same = Conv2dOptions::same(3);
        let up = Conv2dOptions {
            upsample: true,
            replicate: false,
            reflect: false,
            ..same
        };

        // CPU: every stage materialised, the upsample by the reference conv's input load
        // (checked against an explicit nearest-2x copy below).
        let y1 = cpu_conv2d(
            &x,
            [n, c_in, h, w],
            &w1,
            c_mid,
            3,
            Some(&b1),
            None,
            None,
            &same,
        );
        let normed = cpu_group_norm(
            &y1,
            [n, c_mid, h, w],
            groups,
            &gamma,
            &beta,
            eps,
            Activation::Silu,
        );
        let upsampled = nearest2x(&normed, [n, c_mid, h, w]);
        let want = cpu_conv2d(
            &upsampled,
            [n, c_mid, 2 * h, 2 * w],
            &w2,
            c_out,
            3,
            Some(&b2),
            None,
            None,
            &same,
        );
        let want_fused_ref = cpu_conv2d(
            &normed,
            [n, c_mid, h, w],
            &w2,
            c_out,
            3,
            Some(&b2),
            None,
            None,
            &up,
        );
        assert_eq!(want, want_fused_ref, "{what}: CPU upsample paths agree");
        assert!(want.iter().all(|v| v.is_finite()));

        // GPU operands.
        let (ho, wo) = output_size(h, w, 3, &up);
        assert_eq!((ho, wo), (2 * h, 2 * w));
        let xt = Tensor::from_f32(&ctx, &[n, c_in, h, w], &x, "x").unwrap();
        let conv1 =
            Conv2dWeights::from_pytorch(&ctx, &w1, c_mid, c_in, 3, Some(&b1), "w1").unwrap();
        let conv2 =
            Conv2dWeights::from_pytorch(&ctx, &w2, c_out, c_mid, 3, Some(&b2), "w2").unwrap();
        let gt = Tensor::from_f32(&ctx, &[c_mid], &gamma, "gamma").unwrap();
        let bt = Tensor::from_f32(&ctx, &[c_mid], &beta, "beta").unwrap();
        let scratch_len = stats_scratch_len(n, c_mid, h, w, groups);
        let scratch = Tensor::empty(&ctx, &[scratch_len], DType::F32, "gn scratch").unwrap();
        let affine = Tensor::empty(&ctx, &[n, c_mid, 2], DType::F32, "affine").unwrap();
        let mid = Tensor::empty(&ctx, &[n, c_mid, h, w], DType::F32, "mid").unwrap();

        // Separate kernels.
        let normed_t = Tensor::empty(&ctx, &[n, c_mid, h, w], DType::F32, "normed").unwrap();
        let act_t = Tensor::empty(&ctx, &[n, c_mid, h, w], DType::F32, "silu").unwrap();
        let out_sep = Tensor::empty(&ctx, &[n, c_out, ho, wo], DType::F32, "out sep").unwrap();
        let mut rec = Recorder::new(&ctx);
        conv2d(&mut rec, &xt, &conv1, None, None, &mid, &same).unwrap();
        group_norm(
            &mut rec,
            &mid,
            &GroupNormParams::new(groups, &gt, &bt, eps),
            Activation::None,
            &scratch,
            &affine,
            &normed_t,
        )
        .unwrap();
        unary(&mut rec, Unary::Silu, &normed_t, &act_t).unwrap();
        conv2d(&mut rec, &act_t, &conv2, None, None, &out_sep, &up).unwrap();
        rec.submit().unwrap();
        // Intermediate stages too, so a failure points at the stage.
        assert_close(
            &mid.to_f32(&ctx).unwrap(),
            &y1,
            ATOL,
            RTOL,
            &format!("{what}: conv1"),
        );
        assert_close(
            &act_t.to_f32(&ctx).unwrap(),
            &normed,
            ATOL,
            RTOL,
            &format!("{what}: group_norm + silu"),
        );
        assert_close(
            &out_sep.to_f32(&ctx).unwrap(),
            &want,
            ATOL,
            RTOL,
            &format!("{what}: separate kernels"),
        );

        // Fused: statistics only, normalisation + SiLU + upsample in the conv's load.
        let out_fused = Tensor::empty(&ctx, &[n, c_out, ho, wo], DType::F32, "out fused").unwrap();
        let mut rec = Recorder::new(&ctx);
        conv2d(&mut rec, &xt, &conv1, None, None, &mid, &same).unwrap();
        group_norm_stats(
            &mut rec,
            &mid,
            &GroupNormParams::new(groups, &gt, &bt, eps),
            &scratch,
            &affine,
        )
        .unwrap();
        let prologue = Prologue {
            affine: &affine,
            act: Activation::Silu,
        };
        conv2d(
            &mut rec,
            &mid,
            &conv2,
            Some(prologue),
            None,
            &out_fused,
            &up,
        )
        .unwrap();
        let labels = rec.labels().len();
        rec.submit().unwrap();
        assert!(
            labels >= 3,
            "{what}: fused path recorded {labels} dispatches"
        );
        assert_close(
            &out_fused.to_f32(&ctx).unwrap(),
            &want,
            ATOL,
            RTOL,
            &format!("{what}: fused prologue + upsample"),
        );
    }
}

/// Nearest-neighbour 2x upsample of x `[N, C, H, W]` -> `[N, C, 2H, 2W]`.
fn nearest2x(x: &[f32], [n, c, h, w]: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0.0; n * c * 4 * h * w];
    for p in 0..n * c {
        for y in 0..2 * h {
            for xx in 0..2 * w {
                out[(p * 2 * h + y) * 2 * w + xx] = x[(p * h + y / 2) * w + xx / 2];
            }
        }
    }
    out
}

#[test]
fn chain_37_to_67_to_3_channels() {
    // 67 channels: a prime, so one channel per group (GroupNorm degenerates to instance norm).
    Chain {
        n: 1,
        c_in: 37,
        c_mid: 67,
        c_out: 3,
        h: 19,
        w: 23,
        groups: 67,
    }
    .run(100);
}

#[test]
fn chain_batch2_3_to_64_to_5_channels() {
    // Two images, 64 channels in 32 groups (the decoder's grouping), odd spatial size.
    Chain {
        n: 2,
        c_in: 3,
        c_mid: 64,
        c_out: 5,
        h: 19,
        w: 23,
        groups: 32,
    }
    .run(200);
}
