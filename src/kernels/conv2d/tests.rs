//! GPU kernels against the CPU reference, tile checks and shape errors.

use super::tiles::{default_tile_sets, typical_caps};
use super::*;
use crate::testing::{assert_close, rand_vec, test_context};

/// Small tiles of both kinds: they compile fast on lavapipe and put tile edges everywhere.
const SMALL_DIRECT: ConvTiles = ConvTiles {
    tm: 8,
    tn: 16,
    tw: 8,
    tk: 0,
    rm: 4,
    rn: 4,
    direct: true,
    matrix: None,
};
const SMALL_SHARED: ConvTiles = ConvTiles {
    tm: 8,
    tn: 32,
    tw: 8,
    tk: 4,
    rm: 4,
    rn: 4,
    direct: false,
    matrix: None,
};

/// Stride `stride`, zero padding `pad` (top, left, bottom, right), no upsample.
fn strided(stride: u32, pad: [u32; 4]) -> Conv2dOptions {
    Conv2dOptions {
        stride,
        pad,
        upsample: false,
        replicate: false,
        reflect: false,
    }
}

/// Nearest-2x upsample fused into a "same" k×k convolution (the decoder's upsampler).
fn upsampled(k: u32) -> Conv2dOptions {
    Conv2dOptions {
        replicate: false,
        reflect: false,
        upsample: true,
        ..Conv2dOptions::same(k)
    }
}

/// One GPU-vs-CPU comparison. Tolerance: |got - want| <= 1e-5 + 1e-4 |want| (f32).
#[derive(Clone, Copy)]
struct Case {
    n: usize,
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    k: usize,
    opts: Conv2dOptions,
    bias: bool,
    act: Option<Activation>,
    residual: bool,
    in_place: bool,
    naive: bool,
    /// `None`: the tiles the engine picks for the test device.
    tiles: Option<ConvTiles>,
}

impl Case {
    fn new(n: usize, cin: usize, h: usize, w: usize, cout: usize, k: usize) -> Case {
        Case {
            n,
            cin,
            h,
            w,
            cout,
            k,
            opts: Conv2dOptions::same(k as u32),
            bias: true,
            act: None,
            residual: false,
            in_place: false,
            naive: false,
            tiles: None,
        }
    }

    /// Runs the case with the small tiles of both kinds.
    fn run_small(self, seed: u64) {
        for tiles in [SMALL_DIRECT, SMALL_SHARED] {
            Case {
                tiles: Some(tiles),
                ..self
            }
            .run(seed);
        }
    }

    fn run(&self, seed: u64) {
        self.run_in(&test_context(), DType::F32, seed);
    }

    /// Runs with activations, weights and residual stored in `dt`; the CPU
    /// reference sees the same rounded inputs, so the error is the output's
    /// rounding (plus f32 summation order).
    fn run_in(&self, ctx: &Context, dt: DType, seed: u64) {
        let ctx = ctx.clone();
        let Case {
            n,
            cin,
            h,
            w,
            cout,
            k,
            ..
        } = *self;
        let what = format!(
            "[{n},{cin},{h},{w}]->{cout} k{k} {:?} bias {} act {:?} res {} in-place {} naive {} tiles {:?}",
            self.opts, self.bias, self.act, self.residual, self.in_place, self.naive, self.tiles
        );
        let ConvInputs {
            x,
            wv,
            bv,
            aff,
            rv,
            out: (ho, wo),
        } = ConvInputs::random([n, cin, h, w], cout, k, &self.opts, seed, dt);
        let want = cpu_conv2d(
            &x,
            [n, cin, h, w],
            &wv,
            cout,
            k,
            self.bias.then_some(&bv[..]),
            self.act.map(|a| (&aff[..], a)),
            self.residual.then_some(&rv[..]),
            &self.opts,
        );

        let xt = Tensor::from_f32_as(&ctx, &[n, cin, h, w], &x, dt, "x").unwrap();
        let host = PytorchConv {
            weight: &wv,
            cout,
            cin,
            k,
            bias: self.bias.then_some(&bv[..]),
        };
        let weights = Conv2dWeights::upload(&ctx, &host, self.tiles, dt, "w").unwrap();
        let at = Tensor::from_f32(&ctx, &[n, cin, 2], &aff, "affine").unwrap();
        let rt = Tensor::from_f32_as(&ctx, &[n, cout, ho, wo], &rv, dt, "res").unwrap();
        let out = if self.in_place {
            rt.clone()
        } else {
            Tensor::empty(&ctx, &[n, cout, ho, wo], dt, "out").unwrap()
        };
        let prologue = self.act.map(|act| Prologue { affine: &at, act });
        let residual = self.residual.then_some(&rt);
        let mut rec = Recorder::new(&ctx);
        let call = Conv2dCall {
            input: &xt,
            w: &weights,
            prologue,
            residual,
            out: &out,
            opts: &self.opts,
        };
        let f = if self.naive { conv2d_naive } else { tiled };
        f(&mut rec, &call).unwrap();
        assert_eq!(rec.labels()[0].macs, macs(n, cin, cout, ho, wo, k));
        rec.submit().unwrap();
        // (atol, rtol): f32 1e-5 + 1e-4 relative; half storage adds the output's rounding.
        let (atol, rtol) = match dt {
            DType::F32 => (1e-5, 1e-4),
            DType::F16 => (2e-3, 2e-3),
            _ => (1e-2, 1e-2),
        };
        let what = format!("{what} {}", crate::kernels::storage_path(&ctx, dt));
        assert_close(&out.to_f32(&ctx).unwrap(), &want, atol, rtol, &what);
    }
}

/// Random operands of a conv test, the stored ones rounded through `dt` so
/// the CPU reference sees what the kernel reads.
pub(super) struct ConvInputs {
    /// Input `[n, cin, h, w]`.
    pub x: Vec<f32>,
    /// Weights `[cout, cin, k, k]`.
    pub wv: Vec<f32>,
    /// Bias `[cout]` (kept in f32).
    pub bv: Vec<f32>,
    /// Prologue (scale, shift) per image and input channel.
    pub aff: Vec<f32>,
    /// Residual `[n, cout, ho, wo]`.
    pub rv: Vec<f32>,
    /// Output size `(ho, wo)`.
    pub out: (usize, usize),
}

impl ConvInputs {
    pub(super) fn random(
        [n, cin, h, w]: [usize; 4],
        cout: usize,
        k: usize,
        opts: &Conv2dOptions,
        seed: u64,
        dt: DType,
    ) -> Self {
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|x| crate::gpu::storage::round_through(x, dt))
                .collect()
        };
        let x = round(rand_vec(n * cin * h * w, seed, 1.0));
        // Weights scaled like a trained layer's so sums stay O(1).
        let wscale = 1.0 / ((cin * k * k) as f32).sqrt();
        let wv = round(rand_vec(cout * cin * k * k, seed + 1, wscale));
        let bv = rand_vec(cout, seed + 2, 0.5);
        let aff: Vec<f32> = rand_vec(n * cin * 2, seed + 3, 1.0)
            .chunks(2)
            .flat_map(|s| [1.0 + 0.5 * s[0], s[1]])
            .collect();
        let (ho, wo) = output_size(h, w, k, opts);
        let rv = round(rand_vec(n * cout * ho * wo, seed + 4, 1.0));
        ConvInputs {
            x,
            wv,
            bv,
            aff,
            rv,
            out: (ho, wo),
        }
    }
}

/// Every storage path (native f16, packed f16, packed bf16) through both
/// tile kinds, the naive kernel and a fused upsample + prologue +
/// in-place residual block, on odd shapes.
#[test]
fn half_storage_matches_cpu() {
    let up = upsampled(3);
    let block = Case {
        act: Some(Activation::Silu),
        residual: true,
        in_place: true,
        opts: up,
        ..Case::new(1, 37, 9, 11, 67, 3)
    };
    for (ctx, dt) in crate::testing::dtype_contexts() {
        if dt == DType::F32 {
            continue;
        }
        for tiles in [SMALL_DIRECT, SMALL_SHARED] {
            let tiles = Some(tiles);
            Case {
                tiles,
                ..Case::new(2, 37, 19, 23, 67, 3)
            }
            .run_in(&ctx, dt, 50);
            Case { tiles, ..block }.run_in(&ctx, dt, 51);
        }
        Case {
            naive: true,
            ..Case::new(1, 5, 7, 9, 3, 1)
        }
        .run_in(&ctx, dt, 52);
        block.run_in(&ctx, dt, 53);
    }
}

#[test]
fn conv3x3_odd_shapes_match_cpu() {
    Case::new(1, 3, 7, 5, 4, 3).run_small(1);
    Case::new(2, 37, 19, 23, 67, 3).run_small(2);
    Case {
        bias: false,
        ..Case::new(1, 64, 9, 11, 67, 3)
    }
    .run_small(3);
}

#[test]
fn conv1x1_odd_shapes_match_cpu() {
    Case::new(1, 64, 9, 11, 67, 1).run_small(4);
    Case {
        bias: false,
        ..Case::new(2, 37, 19, 23, 5, 1)
    }
    .run_small(5);
    Case::new(1, 3, 7, 5, 4, 1).run_small(6);
}

#[test]
fn stride2_and_asymmetric_padding_match_cpu() {
    // The VAE encoder's downsampling conv: pad (top 0, left 0, bottom 1, right 1), stride 2.
    let enc = strided(2, [0, 0, 1, 1]);
    Case {
        opts: enc,
        ..Case::new(2, 37, 19, 23, 67, 3)
    }
    .run_small(7);
    let sym = strided(2, [1; 4]);
    Case {
        opts: sym,
        bias: false,
        ..Case::new(1, 5, 9, 12, 7, 3)
    }
    .run_small(9);
    let one = strided(2, [0; 4]);
    Case {
        opts: one,
        ..Case::new(1, 6, 9, 11, 10, 1)
    }
    .run_small(10);
    // Asymmetric padding at stride 1 (wider on the left and bottom).
    let asym = strided(1, [0, 2, 1, 0]);
    Case {
        opts: asym,
        ..Case::new(1, 6, 8, 9, 5, 3)
    }
    .run_small(8);
}

#[test]
fn upsample_matches_cpu() {
    let up = upsampled(3);
    Case {
        opts: up,
        ..Case::new(2, 37, 7, 9, 67, 3)
    }
    .run_small(11);
    let up1 = upsampled(1);
    Case {
        opts: up1,
        ..Case::new(1, 6, 5, 3, 9, 1)
    }
    .run_small(12);
}

/// Replicate padding (HunyuanVideo 1.5's convs) on odd shapes through
/// both tile kinds and the naive kernel, with a residual.
#[test]
fn replicate_padding_matches_cpu() {
    let rep = Conv2dOptions {
        replicate: true,
        ..Conv2dOptions::same(3)
    };
    Case {
        opts: rep,
        ..Case::new(2, 37, 7, 9, 67, 3)
    }
    .run_small(13);
    Case {
        opts: rep,
        residual: true,
        ..Case::new(1, 5, 1, 6, 4, 3)
    }
    .run_small(14);
}

/// Reflect padding (LTX-2's decoder convs) on odd shapes, with a residual.
#[test]
fn reflect_padding_matches_cpu() {
    let refl = Conv2dOptions {
        reflect: true,
        ..Conv2dOptions::same(3)
    };
    Case {
        opts: refl,
        ..Case::new(2, 37, 7, 9, 67, 3)
    }
    .run_small(15);
    Case {
        opts: refl,
        residual: true,
        ..Case::new(1, 5, 2, 6, 4, 3)
    }
    .run_small(16);
}

#[test]
fn prologue_silu_relu_match_cpu() {
    for (i, act) in [Activation::Silu, Activation::Relu, Activation::None]
        .into_iter()
        .enumerate()
    {
        Case {
            act: Some(act),
            ..Case::new(2, 37, 9, 13, 67, 3)
        }
        .run_small(20 + i as u64);
    }
    // With upsample and padding: padded taps stay exactly 0 after the transform.
    let up = upsampled(3);
    Case {
        act: Some(Activation::Silu),
        opts: up,
        ..Case::new(1, 8, 5, 6, 12, 3)
    }
    .run_small(24);
}

#[test]
fn residual_and_in_place_match_cpu() {
    Case {
        residual: true,
        ..Case::new(2, 37, 19, 23, 67, 3)
    }
    .run_small(30);
    let in_place = Case {
        residual: true,
        in_place: true,
        ..Case::new(1, 64, 9, 11, 67, 3)
    };
    Case {
        act: Some(Activation::Silu),
        ..in_place
    }
    .run_small(31);
    Case {
        bias: false,
        k: 1,
        opts: Conv2dOptions::same(1),
        ..in_place
    }
    .run_small(32);
}

#[test]
fn engine_default_tiles_match_cpu() {
    // What the engine picks for the test device (lavapipe: direct, 8 x 8 blocks).
    Case::new(2, 37, 19, 23, 67, 3).run(40);
    Case {
        bias: false,
        ..Case::new(1, 64, 9, 11, 67, 1)
    }
    .run(41);
    let up = upsampled(3);
    let block = Case {
        act: Some(Activation::Silu),
        residual: true,
        in_place: true,
        opts: up,
        ..Case::new(1, 40, 9, 21, 36, 3)
    };
    block.run(42);
}

#[test]
fn gpu_default_tiles_match_cpu() {
    // What the engine picks on GPUs (workgroup-memory tiles), run here too.
    let gpu = typical_caps(false);
    let big = ConvTiles::for_layer(&gpu, 512, 3);
    Case {
        tiles: Some(big),
        ..Case::new(2, 37, 19, 23, 67, 3)
    }
    .run(43);
    let enc = strided(2, [0, 0, 1, 1]);
    let mid = ConvTiles::for_layer(&gpu, 64, 3);
    Case {
        tiles: Some(mid),
        opts: enc,
        act: Some(Activation::Relu),
        residual: true,
        ..Case::new(1, 20, 33, 35, 40, 3)
    }
    .run(44);
    let small = ConvTiles::for_layer(&gpu, 3, 3);
    Case {
        tiles: Some(small),
        act: Some(Activation::Silu),
        ..Case::new(1, 64, 17, 19, 3, 3)
    }
    .run(45);
}

/// The candidates `wgvae bench conv` times on a GPU without matrices (the scalar
/// workgroup-memory tiles) compute the same convolution, run here; on GPUs with matrices the
/// list starts with the table's entries, each valid for the device, names distinct.
#[test]
fn sweep_candidates_match_cpu() {
    let gpu = typical_caps(false);
    for cout in [512, 64, 3] {
        let cands = ConvTiles::candidates(&gpu, cout, 3);
        assert!(!cands.is_empty());
        assert_eq!(cands[0], ConvTiles::for_layer(&gpu, cout, 3));
        if cout == 512 {
            assert!(cands.len() >= 4, "{cands:?}");
            for (i, t) in cands.into_iter().enumerate() {
                Case {
                    tiles: Some(t),
                    act: Some(Activation::Silu),
                    residual: true,
                    in_place: true,
                    ..Case::new(1, 21, 11, 37, 67, 3)
                }
                .run(60 + i as u64);
            }
        }
    }
    let matrix = super::tiles::typical_matrix_caps(false);
    for cout in [512, 64, 3] {
        let cands = ConvTiles::candidates(&matrix, cout, 3);
        let table = ConvTiles::matrix_table(&matrix, cout, 3);
        assert_eq!(cands[..table.len()], table[..], "table entries first");
        assert!(cands.len() >= 6, "{cands:?}");
        let mut names: Vec<String> = cands.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), cands.len(), "distinct names: {names:?}");
        for t in &cands {
            t.check(&matrix).unwrap();
        }
    }
}

#[test]
fn conv_out_three_channels_matches_cpu() {
    // The VAE's conv_out: Cout = 3 after a GroupNorm + SiLU prologue.
    Case {
        act: Some(Activation::Silu),
        ..Case::new(1, 64, 17, 19, 3, 3)
    }
    .run(46);
    Case::new(2, 16, 9, 7, 3, 3).run_small(47);
}

#[test]
fn naive_kernel_matches_cpu() {
    Case {
        naive: true,
        ..Case::new(2, 37, 9, 13, 67, 3)
    }
    .run(50);
    let enc = strided(2, [0, 0, 1, 1]);
    Case {
        naive: true,
        opts: enc,
        residual: true,
        act: Some(Activation::Relu),
        ..Case::new(1, 6, 9, 11, 10, 3)
    }
    .run(51);
    let up = upsampled(3);
    Case {
        naive: true,
        opts: up,
        act: Some(Activation::Silu),
        ..Case::new(1, 5, 4, 6, 7, 3)
    }
    .run(52);
}

#[test]
fn output_size_and_macs() {
    assert_eq!(output_size(64, 64, 3, &Conv2dOptions::same(3)), (64, 64));
    let enc = strided(2, [0, 0, 1, 1]);
    assert_eq!(output_size(512, 512, 3, &enc), (256, 256));
    let up = upsampled(3);
    assert_eq!(output_size(64, 32, 3, &up), (128, 64));
    assert_eq!(output_size(7, 5, 1, &Conv2dOptions::same(1)), (7, 5));
    assert_eq!(macs(1, 512, 512, 64, 64, 3), 512 * 512 * 64 * 64 * 9);
}

#[test]
fn bad_tiles_are_rejected() {
    let caps = typical_caps(false);
    let matrix_caps = |s: u32| super::tiles::typical_matrix_caps(s == 8);
    for t in default_tile_sets() {
        match t.matrix {
            Some(m) => {
                // On a device with the matrix configuration only.
                t.check(&matrix_caps(m.size)).unwrap();
                assert!(t.check(&caps).is_err());
            }
            None => t.check(&caps).unwrap(),
        }
    }
    let ok = SMALL_SHARED;
    for bad in [
        ConvTiles { rm: 6, ..ok },
        ConvTiles { tk: 3, ..ok },
        ConvTiles { tw: 12, ..ok },
        ConvTiles { tm: 12, ..ok },
        ConvTiles {
            tm: 4096,
            rm: 4,
            ..ok
        },
    ] {
        assert!(
            matches!(bad.check(&caps), Err(Error::Unsupported(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn bad_shapes_are_errors() {
    let ctx = test_context();
    let w = Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 9], 4, 3, 3, None, "w").unwrap();
    let x = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x").unwrap();
    let out = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "out").unwrap();
    let opts = Conv2dOptions::same(3);
    let is_shape = |r: Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rec = Recorder::new(&ctx);
    // Wrong channel count.
    let x4 = Tensor::empty(&ctx, &[1, 4, 7, 5], DType::F32, "x4").unwrap();
    assert!(is_shape(conv2d(&mut rec, &x4, &w, None, None, &out, &opts)));
    // Wrong output size.
    let bad_out = Tensor::empty(&ctx, &[1, 4, 7, 6], DType::F32, "o").unwrap();
    assert!(is_shape(conv2d(
        &mut rec, &x, &w, None, None, &bad_out, &opts
    )));
    // Not 4-D.
    let x3 = Tensor::empty(&ctx, &[3, 7, 5], DType::F32, "x3").unwrap();
    assert!(is_shape(conv2d(&mut rec, &x3, &w, None, None, &out, &opts)));
    // Residual of another shape.
    assert!(is_shape(conv2d(
        &mut rec,
        &x,
        &w,
        None,
        Some(&bad_out),
        &out,
        &opts
    )));
    // Affine of another shape.
    let aff = Tensor::empty(&ctx, &[1, 4, 2], DType::F32, "aff").unwrap();
    let pro = Prologue {
        affine: &aff,
        act: Activation::Silu,
    };
    assert!(is_shape(conv2d(
        &mut rec,
        &x,
        &w,
        Some(pro),
        None,
        &out,
        &opts
    )));
    // Stride 3.
    let s3 = Conv2dOptions { stride: 3, ..opts };
    assert!(is_shape(conv2d(&mut rec, &x, &w, None, None, &out, &s3)));
    // Output aliasing the input.
    let w33 = Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 3 * 3 * 9], 3, 3, 3, None, "w").unwrap();
    let x33 = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::F32, "x33").unwrap();
    assert!(is_shape(conv2d(
        &mut rec, &x33, &w33, None, None, &x33, &opts
    )));
    // Bad weights.
    assert!(matches!(
        Conv2dWeights::from_pytorch(&ctx, &[0.0; 10], 4, 3, 3, None, "w"),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 25], 4, 3, 5, None, "w"),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 9], 4, 3, 3, Some(&[0.0; 3]), "w"),
        Err(Error::Shape { .. })
    ));
    assert!(rec.labels().is_empty());
}

/// `conv2d_frames`: 2 images from input image 1 added into output images
/// 2..4 of a 5-image residual (in place); the other images untouched, both
/// tile kinds and the device's default tiles.
#[test]
fn frame_offsets_read_and_write_the_chosen_images() {
    let tiles = [None, Some(SMALL_DIRECT), Some(SMALL_SHARED)];
    frame_offsets_case(&test_context(), DType::F32, (5, 6), &tiles, (1e-5, 1e-4));
}

/// The frame-offset check of [`frame_offsets_read_and_write_the_chosen_images`] with
/// `(cin, cout)` channels, values stored in `dt` (rounded for the reference too), each of
/// `tiles`, within `(atol, rtol)`; an out-of-range frame set is an error.
pub(super) fn frame_offsets_case(
    ctx: &Context,
    dt: DType,
    (cin, cout): (usize, usize),
    tiles: &[Option<ConvTiles>],
    (atol, rtol): (f32, f32),
) {
    let (h, w) = (7, 9);
    let round = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| crate::gpu::storage::round_through(x, dt))
            .collect()
    };
    let x = round(rand_vec(4 * cin * h * w, 41, 1.0));
    let wt = round(rand_vec(cout * cin * 9, 42, 0.3));
    let b = rand_vec(cout, 43, 0.1);
    let r = round(rand_vec(5 * cout * h * w, 44, 1.0));
    let opts = Conv2dOptions::same(3);
    let img = |v: &[f32], c: usize, i: usize| v[i * c * h * w..(i + 1) * c * h * w].to_vec();
    let sliced: Vec<f32> = (1..3).flat_map(|i| img(&x, cin, i)).collect();
    let res: Vec<f32> = (2..4).flat_map(|i| img(&r, cout, i)).collect();
    let conv = cpu_conv2d(
        &sliced,
        [2, cin, h, w],
        &wt,
        cout,
        3,
        Some(&b),
        None,
        Some(&res),
        &opts,
    );
    let mut want = r.clone();
    want[2 * cout * h * w..4 * cout * h * w].copy_from_slice(&conv);
    for &tiles in tiles {
        let host = PytorchConv {
            weight: &wt,
            cout,
            cin,
            k: 3,
            bias: Some(&b),
        };
        let weights = Conv2dWeights::upload(ctx, &host, tiles, dt, "w").unwrap();
        let input = Tensor::from_f32_as(ctx, &[4, cin, h, w], &x, dt, "x").unwrap();
        let out = Tensor::from_f32_as(ctx, &[5, cout, h, w], &r, dt, "out").unwrap();
        let mut rec = Recorder::new(ctx);
        let frames = Frames {
            in_frame: 1,
            out_frame: 2,
            count: 2,
        };
        conv2d_frames(&mut rec, &input, &weights, Some(&out), &out, &opts, frames).unwrap();
        rec.submit().unwrap();
        let what = format!("frames, {dt:?}, {tiles:?}");
        assert_close(&out.to_f32(ctx).unwrap(), &want, atol, rtol, &what);
        let bad = Frames {
            in_frame: 3,
            out_frame: 0,
            count: 2,
        };
        let mut rec = Recorder::new(ctx);
        let e = conv2d_frames(&mut rec, &input, &weights, None, &out, &opts, bad);
        assert!(e.is_err());
    }
}

/// Dry runs: a conv whose signature already passed the checks repeats its
/// labels (other tensors of the same shapes); a call of other output or
/// residual shapes, or of another dtype, is still refused.
#[test]
fn dry_runs_repeat_checked_convs_and_still_refuse_bad_ones() {
    let ctx = Context::null(
        crate::gpu::Capabilities::reference_gpu(),
        crate::memory::Policy::Exact.new_pool(),
    );
    let w = Conv2dWeights::from_pytorch(&ctx, &vec![0.0; 4 * 3 * 9], 4, 3, 3, None, "w").unwrap();
    let t = |shape: &[usize]| Tensor::empty(&ctx, shape, DType::F32, "t").unwrap();
    let opts = Conv2dOptions::same(3);
    let mut rec = Recorder::new(&ctx);
    let (x, out) = (t(&[1, 3, 7, 5]), t(&[1, 4, 7, 5]));
    conv2d(&mut rec, &x, &w, None, None, &out, &opts).unwrap();
    let once = rec.dry_mark();
    assert!(once > 0);
    let (x2, out2) = (t(&[1, 3, 7, 5]), t(&[1, 4, 7, 5]));
    conv2d(&mut rec, &x2, &w, None, None, &out2, &opts).unwrap();
    assert_eq!(rec.dry_mark(), 2 * once, "a repeat records the same labels");
    let is_shape = |r: Result<()>| matches!(r, Err(Error::Shape { .. }));
    let bad = t(&[1, 4, 7, 6]);
    assert!(is_shape(conv2d(&mut rec, &x, &w, None, None, &bad, &opts)));
    assert!(is_shape(conv2d(
        &mut rec,
        &x,
        &w,
        None,
        Some(&bad),
        &out,
        &opts
    )));
    let rgba = Tensor::empty(&ctx, &[1, 3, 7, 5], DType::Rgba8, "x").unwrap();
    assert!(is_shape(conv2d(
        &mut rec, &rgba, &w, None, None, &out, &opts
    )));
    assert_eq!(rec.dry_mark(), 2 * once, "refused calls record nothing");
}

/// The sweep's layer classes are the SD1.5 decoder's 40 convs (its profile's count), heaviest
/// first, and a bad size is an error.
#[test]
fn sweep_classes_are_the_decoders_convs() {
    use super::sweep::sd15_decoder_classes;
    let classes = sd15_decoder_classes(512).unwrap();
    assert_eq!(classes.iter().map(|c| c.calls).sum::<usize>(), 40);
    let mut names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), classes.len(), "{names:?}");
    assert!(names.contains(&"512>512 k3 gn+res @128"), "{names:?}");
    let cost = |c: &super::sweep::LayerClass| c.macs() * c.calls as u64;
    assert!(classes.windows(2).all(|w| cost(&w[0]) >= cost(&w[1])));
    // The decoder's MACs: 512² output, 1.25 T multiply-accumulates.
    let total: u64 = classes.iter().map(cost).sum();
    assert!((1.2e12..1.3e12).contains(&(total as f64)), "{total}");
    for bad in [0, 7, 100] {
        assert!(sd15_decoder_classes(bad).is_err(), "{bad}");
    }
}
