//! Timing convolution tile sets on the present adapter: the layer classes of a decoder and
//! the GPU time of each candidate tile set on them (`wgvae bench conv`). Nothing here runs
//! during a decode: a decode never benchmarks before it runs.

use std::time::Instant;

use serde::Serialize;

use super::PytorchConv;
use super::{conv2d, macs, output_size, Conv2dOptions, Conv2dWeights, ConvTiles, Prologue};
use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::Activation;
use crate::tensor::{DType, Tensor};

/// One class of convolution layers of a decoder: the same shapes and fused options, called
/// `calls` times per decode.
#[derive(Clone, Debug, Serialize)]
pub struct LayerClass {
    /// Short name: `512>512 k3 gn+res @64` (input channels > output channels, kernel; `up`
    /// when a nearest 2x up-sample is fused into the load, `gn` with the prologue, `res` with
    /// the residual; input side).
    pub name: String,
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Stored input side (square).
    pub side: usize,
    /// Kernel size (1 or 3).
    pub k: usize,
    /// Nearest 2x up-sample fused into the load.
    pub upsample: bool,
    /// GroupNorm affine + SiLU prologue fused into the load.
    pub prologue: bool,
    /// Residual added in place.
    pub residual: bool,
    /// Calls per decode.
    pub calls: usize,
}

impl LayerClass {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cin: usize,
        cout: usize,
        side: usize,
        k: usize,
        upsample: bool,
        prologue: bool,
        residual: bool,
        calls: usize,
    ) -> Self {
        let up = if upsample { " up" } else { "" };
        let fused = match (prologue, residual) {
            (true, true) => " gn+res",
            (true, false) => " gn",
            (false, true) => " res",
            (false, false) => "",
        };
        LayerClass {
            name: format!("{cin}>{cout} k{k}{up}{fused} @{side}"),
            cin,
            cout,
            side,
            k,
            upsample,
            prologue,
            residual,
            calls,
        }
    }

    /// The geometry options: "same" padding, the up-sample if fused.
    pub fn options(&self) -> Conv2dOptions {
        Conv2dOptions {
            upsample: self.upsample,
            ..Conv2dOptions::same(self.k as u32)
        }
    }

    /// Output side.
    pub fn out_side(&self) -> usize {
        output_size(self.side, self.side, self.k, &self.options()).0
    }

    /// Multiply-accumulates of one call.
    pub fn macs(&self) -> u64 {
        let o = self.out_side();
        macs(1, self.cin, self.cout, o, o, self.k)
    }
}

/// The convolutions of the SD1.5 / SDXL-style AutoencoderKL decoder (block channels 128, 256,
/// 512, 512; three resnets per up block; post_quant_conv; the mid-block attention's
/// projections) decoding a `size`² image, as classes, heaviest first (by MACs per decode):
/// the 40 convs of its profile. `size` must be a multiple of 8.
pub fn sd15_decoder_classes(size: usize) -> Result<Vec<LayerClass>> {
    if size < 8 || !size.is_multiple_of(8) {
        return Err(Error::InvalidInput(format!(
            "decode size {size}: expected a positive multiple of 8 (the latent is size / 8)"
        )));
    }
    let l = size / 8;
    // `cin>cout kK [up] [gn] [res] @side-in-latents xcalls`. A resnet's conv1 (GroupNorm +
    // SiLU prologue) and conv2 (the same and the residual added in place) are separate
    // classes: their pipelines differ. post_quant_conv, conv_in; the mid block and up block 0
    // (5 resnets) at the latent size with the attention's q, k, v and output projections;
    // up blocks 1–3 and their up-samplers; conv_out.
    const SD15: &str = "4>4 k1 @1 x1; 4>512 k3 @1 x1; 512>512 k3 gn @1 x5; 512>512 k3 gn res @1 x5;
        512>512 k1 @1 x3; 512>512 k1 res @1 x1; 512>512 k3 up @1 x1; 512>512 k3 gn @2 x3;
        512>512 k3 gn res @2 x3; 512>512 k3 up @2 x1; 512>256 k3 gn @4 x1; 512>256 k1 @4 x1;
        256>256 k3 gn @4 x2; 256>256 k3 gn res @4 x3; 256>256 k3 up @4 x1; 256>128 k3 gn @8 x1;
        256>128 k1 @8 x1; 128>128 k3 gn @8 x2; 128>128 k3 gn res @8 x3; 128>3 k3 gn @8 x1";
    let mut v: Vec<LayerClass> = SD15.split(';').map(|spec| parse_class(spec, l)).collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.macs() * c.calls as u64));
    Ok(v)
}

/// One class of [`sd15_decoder_classes`]'s table (a constant: its entries are well formed).
fn parse_class(spec: &str, latent: usize) -> LayerClass {
    let (mut cin, mut cout, mut k, mut side, mut calls) = (0, 0, 0, 0, 0);
    let (mut up, mut gn, mut res) = (false, false, false);
    for word in spec.split_whitespace() {
        let num = |w: &str| w.parse::<usize>().unwrap_or(0);
        match word {
            "up" => up = true,
            "gn" => gn = true,
            "res" => res = true,
            w if w.starts_with('k') => k = num(&w[1..]),
            w if w.starts_with('@') => side = num(&w[1..]) * latent,
            w if w.starts_with('x') => calls = num(&w[1..]),
            w => {
                let (a, b) = w.split_once('>').unwrap_or(("0", "0"));
                (cin, cout) = (num(a), num(b));
            }
        }
    }
    LayerClass::new(cin, cout, side, k, up, gn, res, calls)
}

/// One candidate's time on one class.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    /// The tile set's short name ([`ConvTiles::name`]).
    pub tiles: String,
    /// The set itself.
    #[serde(skip)]
    pub set: ConvTiles,
    /// Median time of one call, ms.
    pub median_ms: f64,
    /// Fastest call, ms.
    pub min_ms: f64,
    /// 2 · MACs / median time, TFLOP/s.
    pub tflops: f64,
    /// GPU timestamps (true) or wall time from submit to done (false: the adapter has no
    /// timestamps inside passes; includes submission overhead).
    pub gpu_time: bool,
}

/// Random values in [-scale, scale) (a fixed LCG: the same inputs for every candidate).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The tensors of one class, shared by its candidates.
pub struct ClassInputs {
    class: LayerClass,
    dtype: DType,
    weight: Vec<f32>,
    bias: Vec<f32>,
    input: Tensor,
    affine: Tensor,
    out: Tensor,
}

impl ClassInputs {
    /// Allocates and fills the input, prologue affine and output of `class` in `dtype` (a
    /// residual class adds into the output in place at every call: the values drift, the
    /// time does not).
    pub fn new(ctx: &Context, class: &LayerClass, dtype: DType) -> Result<Self> {
        let (cin, cout, s, k) = (class.cin, class.cout, class.side, class.k);
        let o = class.out_side();
        let x = values(cin * s * s, 1, 1.0);
        // He-style scale keeps outputs near unit range (no f16 overflow).
        let wscale = (3.0 / (cin * k * k) as f32).sqrt();
        let aff: Vec<f32> = (0..cin).flat_map(|_| [1.0, 0.0]).collect();
        Ok(ClassInputs {
            class: class.clone(),
            dtype,
            weight: values(cout * cin * k * k, 2, wscale),
            bias: values(cout, 3, 0.1),
            input: Tensor::from_f32_as(ctx, &[1, cin, s, s], &x, dtype, "sweep.x")?,
            affine: Tensor::from_f32(ctx, &[1, cin, 2], &aff, "sweep.affine")?,
            out: Tensor::from_f32_as(
                ctx,
                &[1, cout, o, o],
                &vec![0.0; cout * o * o],
                dtype,
                "sweep.out",
            )?,
        })
    }

    /// Times `tiles` on the class: `warmup` untimed calls, then the median of `runs` calls,
    /// each submitted and waited for alone.
    pub fn time(
        &self,
        ctx: &Context,
        tiles: ConvTiles,
        warmup: usize,
        runs: usize,
    ) -> Result<Timing> {
        let c = &self.class;
        let host = PytorchConv {
            weight: &self.weight,
            cout: c.cout,
            cin: c.cin,
            k: c.k,
            bias: Some(&self.bias),
        };
        let w = Conv2dWeights::upload(ctx, &host, Some(tiles), self.dtype, "sweep.w")?;
        let opts = c.options();
        let mut times = Vec::with_capacity(runs);
        let mut gpu_time = true;
        for i in 0..warmup + runs.max(1) {
            let mut rec = Recorder::new(ctx);
            let profiled = rec.enable_profiling();
            let prologue = c.prologue.then_some(Prologue {
                affine: &self.affine,
                act: Activation::Silu,
            });
            let residual = c.residual.then_some(&self.out);
            let t0 = Instant::now();
            conv2d(
                &mut rec,
                &self.input,
                &w,
                prologue,
                residual,
                &self.out,
                &opts,
            )?;
            let (_, profile) = rec.submit_profiled()?;
            let wall = t0.elapsed().as_secs_f64() * 1e3;
            let ms = match profile.filter(|_| profiled) {
                Some(p) if p.gpu_ms > 0.0 => p.gpu_ms,
                _ => {
                    gpu_time = false;
                    wall
                }
            };
            if i >= warmup {
                times.push(ms);
            }
        }
        times.sort_by(f64::total_cmp);
        let median_ms = times[times.len() / 2];
        Ok(Timing {
            tiles: tiles.name(),
            set: tiles,
            median_ms,
            min_ms: times[0],
            tflops: 2.0 * c.macs() as f64 / (median_ms * 1e-3) / 1e12,
            gpu_time,
        })
    }
}
