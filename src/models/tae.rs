//! TAESD-family decoders (taesd, taesdxl, taesd3, taef1, taef2): the tiny
//! autoencoders of madebyollin/taesd, keys as their `nn.Sequential` indices.
//!
//! Decoder: `tanh(x/3)·3` → conv(C→64) → ReLU → 3 Blocks → [2× up → conv(no
//! bias) → 3 Blocks] × 2 → 2× up → conv(no bias) → Block → conv(64→3).
//! Block(x) = ReLU(conv(ReLU(conv(ReLU(conv(x'))))) + x'), with
//! x' = x + conv1×1(ReLU(GroupNorm₄(conv1×1(x)))) where a "pool" branch exists (taef2).
//! The variant is detected from the weight shapes.

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::Conv2dWeights;
use crate::kernels::elementwise::Unary;
use crate::kernels::image::ImageRange;
use crate::kernels::Activation;
use crate::models::graph::{Builder, Conv, Geometry, Graph, Residual, TensorId, BOTH};
use crate::models::layers::{load_conv, Norm};
use crate::models::weights::WeightStore;

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

    /// Adds the block to `b` on `x` (updated in place; the weights move
    /// into the graph). `relu` is an identity affine [N, 64, 2] for
    /// ReLU-only conv prologues.
    pub(crate) fn build(self, b: &mut Builder, x: TensorId, relu: TensorId) -> TensorId {
        let mut x = x;
        if let Some(p) = self.pool {
            let (expand, norm) = (b.weights(p.expand), b.norm(p.norm));
            let project = b.weights(p.project);
            let t = b.conv_plain(x, expand, Geometry::Same);
            let a = b.stats(t, norm);
            let c = Conv::new(t, project, Geometry::Same).prologue(a, Activation::Relu);
            x = b.conv(c.residual(Residual::InPlace(x)));
        }
        let [c0, c1, c2] = self.convs.map(|w| b.weights(w));
        let h1 = b.conv_plain(x, c0, Geometry::Same);
        let h2 = b.conv(Conv::new(h1, c1, Geometry::Same).prologue(relu, Activation::Relu));
        let c = Conv::new(h2, c2, Geometry::Same).prologue(relu, Activation::Relu);
        let y = b.conv(c.residual(Residual::InPlace(x)).epilogue(Unary::Relu));
        // The first conv's output lived to the block's end (a shadowed binding).
        b.hold(h1, BOTH);
        y
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
    graph: Graph,
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
        let shape = store.conv_shape(
            "1.weight",
            "not a TAE decoder: no `1.weight` (the first conv); is this an encoder file?",
        )?;
        if shape[0] != WIDTH {
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
            graph: build(conv_in, layers, conv_out),
        })
    }

    /// The decoder's layers.
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// `tanh(z/3)·3` → conv_in + ReLU → layers → conv_out.
fn build(conv_in: Conv2dWeights, layers: Vec<Layer>, conv_out: Conv2dWeights) -> Graph {
    let (mut b, z) = Builder::new();
    let relu = b.identity(WIDTH);
    let z = b.map(z, Unary::TanhClamp(3.0));
    let w = b.weights(conv_in);
    let mut x = b.conv(Conv::new(z, w, Geometry::Same).epilogue(Unary::Relu));
    for (i, layer) in layers.into_iter().enumerate() {
        x = match layer {
            Layer::UpConv(w) => {
                let w = b.weights(w);
                b.conv_plain(x, w, Geometry::Upsample)
            }
            Layer::Block(block) => block.build(&mut b, x, relu),
        };
        b.tap(x, format!("layer.{i}"));
    }
    let w = b.weights(conv_out);
    let out = b.conv_plain(x, w, Geometry::Same);
    b.hold(relu, BOTH);
    b.finish(out, Some(ImageRange::ZeroToOne))
}
