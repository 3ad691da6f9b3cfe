//! TAESD-family decoders (taesd, taesdxl, taesd3, taef1, taef2): the tiny
//! autoencoders of madebyollin/taesd, keys as their `nn.Sequential` indices.
//!
//! Decoder: `tanh(x/3)·3` → conv(C→64) → ReLU → 3 Blocks → [2× up → conv(no
//! bias) → 3 Blocks] × 2 → 2× up → conv(no bias) → Block → conv(64→3).
//! Block(x) = ReLU(conv(ReLU(conv(ReLU(conv(x'))))) + x'), with
//! x' = x + conv1×1(ReLU(GroupNorm₄(conv1×1(x)))) where a "pool" branch exists (taef2).
//! The variant is detected from the weight shapes.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::conv2d::{Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::elementwise::{unary, Unary};
use crate::kernels::image::ImageRange;
use crate::kernels::Activation;
use crate::models::layers::{conv, conv_add, dims4, identity_affine, load_conv, Norm, Taps};
use crate::models::weights::WeightStore;
use crate::tensor::Tensor;
use crate::tiling::{Act, ConvSpec, Executor, Residual};

pub(crate) const WIDTH: usize = 64;
/// PyTorch GroupNorm default.
const POOL_EPS: f32 = 1e-5;

struct Pool {
    expand: Conv2dWeights,
    norm: Norm,
    project: Conv2dWeights,
}

/// A TAESD Block: `ReLU(conv(ReLU(conv(ReLU(conv(x'))))) + x')` with the optional GroupNorm pool branch.
pub(crate) struct Block {
    pool: Option<Pool>,
    convs: [Conv2dWeights; 3],
}

impl Block {
    /// Loads Sequential index `i` (`{i}.conv.{0,2,4}`, optional `{i}.pool.{0,1,3}`).
    pub(crate) fn load(ctx: &Context, store: &WeightStore, i: usize) -> Result<Block> {
        let pool = if store.contains(&format!("{i}.pool.0.weight")) {
            Some(Pool {
                expand: load_conv(
                    ctx,
                    store,
                    &format!("{i}.pool.0"),
                    4 * WIDTH,
                    WIDTH,
                    1,
                    false,
                )?,
                norm: Norm::load(ctx, store, &format!("{i}.pool.1"), 4 * WIDTH, 4, POOL_EPS)?,
                project: load_conv(
                    ctx,
                    store,
                    &format!("{i}.pool.3"),
                    WIDTH,
                    4 * WIDTH,
                    1,
                    false,
                )?,
            })
        } else {
            None
        };
        let c = |j: usize| load_conv(ctx, store, &format!("{i}.conv.{j}"), WIDTH, WIDTH, 3, true);
        Ok(Block {
            pool,
            convs: [c(0)?, c(2)?, c(4)?],
        })
    }

    /// `x` [N, 64, H, W] → block output (written in place into `x`'s storage).
    /// `relu` is an identity affine [N, 64, 2] for ReLU-only conv prologues.
    pub(crate) fn forward(
        &self,
        rec: &mut Recorder,
        mut x: Tensor,
        relu: &Tensor,
    ) -> Result<Tensor> {
        let same3 = Conv2dOptions::same(3);
        let same1 = Conv2dOptions::same(1);
        let relu_pro = || {
            Some(Prologue {
                affine: relu,
                act: Activation::Relu,
            })
        };
        if let Some(p) = &self.pool {
            let t = conv(rec, &x, &p.expand, None, &same1)?;
            let a = p.norm.affine(rec, &t)?;
            let pro = Some(Prologue {
                affine: &a,
                act: Activation::Relu,
            });
            x = conv_add(rec, &t, &p.project, pro, x, &same1)?;
        }
        let h = conv(rec, &x, &self.convs[0], None, &same3)?;
        let h = conv(rec, &h, &self.convs[1], relu_pro(), &same3)?;
        let x = conv_add(rec, &h, &self.convs[2], relu_pro(), x, &same3)?;
        unary(rec, Unary::Relu, &x, &x)?;
        Ok(x)
    }

    /// Tile by tile (the pool branch's GroupNorm with global statistics).
    /// `relu` is an identity affine [N, 64, 2].
    pub(crate) fn forward_tiled(&self, ex: &mut Executor, x: Act, relu: &Tensor) -> Result<Act> {
        let mut x = x;
        if let Some(p) = &self.pool {
            let spec = ConvSpec::new(&p.expand).stats(Some(&p.norm));
            let (t, a) = ex.conv(&x, spec, Residual::None)?;
            let a = a.ok_or_else(|| {
                Error::Unsupported("pool branch without statistics (a wgvae bug)".into())
            })?;
            let spec = ConvSpec::new(&p.project).prologue(&a, Activation::Relu);
            x = ex.conv(&t, spec, Residual::Take(x))?.0;
        }
        let (h, _) = ex.conv(&x, ConvSpec::new(&self.convs[0]), Residual::None)?;
        let spec = ConvSpec::new(&self.convs[1]).prologue(relu, Activation::Relu);
        let (h, _) = ex.conv(&h, spec, Residual::None)?;
        let spec = ConvSpec::new(&self.convs[2])
            .prologue(relu, Activation::Relu)
            .epilogue(Unary::Relu);
        Ok(ex.conv(&h, spec, Residual::Take(x))?.0)
    }
}

// Built once per model: the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Layer {
    Block(Block),
    /// Nearest 2× upsample fused into a bias-free conv.
    UpConv(Conv2dWeights),
}

/// A TAE decoder with its weights on the device.
pub struct TaeDecoder {
    /// Latent channels the decoder expects.
    pub latent_channels: usize,
    /// True when the weights hold `3.pool.0` (TAEF2's extra stage).
    pub has_pool: bool,
    conv_in: Conv2dWeights,
    layers: Vec<Layer>,
    conv_out: Conv2dWeights,
}

impl TaeDecoder {
    /// Family name by latent channels.
    pub fn variant_name(&self) -> &'static str {
        match (self.latent_channels, self.has_pool) {
            (4, _) => "taesd/taesdxl",
            (16, _) => "taesd3/taef1",
            (32, true) => "taef2",
            _ => "tae",
        }
    }

    /// Uploads a decoder from TAE-layout weights.
    pub fn load(ctx: &Context, store: &WeightStore) -> Result<Self> {
        let shape = store.shape_of("1.weight").ok_or_else(|| Error::BadFile {
            path: store.origin().into(),
            message: "not a TAE decoder: no `1.weight` (the first conv); is this an encoder file?"
                .into(),
        })?;
        if shape.len() != 4 || shape[0] != WIDTH {
            return Err(Error::BadFile {
                path: store.origin().into(),
                message: format!("`1.weight` has shape {shape:?}; a TAE decoder's first conv is [64, latent_channels, 3, 3]"),
            });
        }
        let latent_channels = shape[1];
        let has_pool = store.contains("3.pool.0.weight");
        let conv_in = load_conv(ctx, store, "1", WIDTH, latent_channels, 3, true)?;
        let block = |i: usize| -> Result<Layer> { Ok(Layer::Block(Block::load(ctx, store, i)?)) };
        let up = |i: usize| -> Result<Layer> {
            Ok(Layer::UpConv(load_conv(
                ctx,
                store,
                &i.to_string(),
                WIDTH,
                WIDTH,
                3,
                false,
            )?))
        };
        // Sequential indices: 0 clamp, 1 conv, 2 ReLU, 3-5 blocks, 6 up, 7 conv, 8-10 blocks,
        // 11 up, 12 conv, 13-15 blocks, 16 up, 17 conv, 18 block, 19 conv out.
        let layers = vec![
            block(3)?,
            block(4)?,
            block(5)?,
            up(7)?,
            block(8)?,
            block(9)?,
            block(10)?,
            up(12)?,
            block(13)?,
            block(14)?,
            block(15)?,
            up(17)?,
            block(18)?,
        ];
        let conv_out = load_conv(ctx, store, "19", 3, WIDTH, 3, true)?;
        store.finish(&[])?;
        Ok(TaeDecoder {
            latent_channels,
            has_pool,
            conv_in,
            layers,
            conv_out,
        })
    }

    /// The decoder tile by tile (exact; the taef2 pool branches' GroupNorms
    /// use global statistics). Returns RGBA8 pixels `[N, 1, 8h, 8w]` and,
    /// when `keep_raw`, the raw output `[N, 3, 8h, 8w]`.
    pub(crate) fn forward_tiled(
        &self,
        ex: &mut Executor,
        z: Act,
        keep_raw: bool,
    ) -> Result<(Act, Option<Act>)> {
        let n = z.n;
        let relu = identity_affine(ex.rec(), n, WIDTH)?;
        let z = ex.map(z, Unary::TanhClamp(3.0))?;
        let spec = ConvSpec::new(&self.conv_in).epilogue(Unary::Relu);
        let (mut x, _) = ex.conv(&z, spec, Residual::None)?;
        drop(z);
        for layer in &self.layers {
            match layer {
                Layer::UpConv(w) => {
                    x = ex.conv(&x, ConvSpec::new(w).upsample(), Residual::None)?.0;
                }
                Layer::Block(b) => x = b.forward_tiled(ex, x, &relu)?,
            }
        }
        ex.conv_to_image(
            &x,
            ConvSpec::new(&self.conv_out),
            ImageRange::ZeroToOne,
            keep_raw,
        )
    }

    /// Records the decoder: `z` [N, C, h, w] latents (scale 1) → raw image [N, 3, 8h, 8w] in ≈[0, 1].
    pub fn forward(&self, rec: &mut Recorder, z: Tensor, taps: &mut Taps) -> Result<Tensor> {
        let [n, ..] = dims4(&z)?;
        let same3 = Conv2dOptions::same(3);
        let up2 = Conv2dOptions {
            upsample: true,
            ..same3
        };
        let relu = identity_affine(rec, n, WIDTH)?;
        unary(rec, Unary::TanhClamp(3.0), &z, &z)?;
        let mut x = conv(rec, &z, &self.conv_in, None, &same3)?;
        drop(z);
        unary(rec, Unary::Relu, &x, &x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = match layer {
                Layer::UpConv(w) => conv(rec, &x, w, None, &up2)?,
                Layer::Block(b) => b.forward(rec, x, &relu)?,
            };
            taps.tap(rec, &format!("layer.{i}"), &x)?;
        }
        conv(rec, &x, &self.conv_out, None, &same3)
    }
}
