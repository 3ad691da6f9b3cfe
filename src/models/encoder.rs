//! Encoders: images to latents. The AutoencoderKL encoder exactly as
//! diffusers computes it (`vae.py` Encoder: conv_in, down blocks with
//! stride-2 convs after an asymmetric (0, 1, 0, 1) zero pad, mid-block with
//! attention, GroupNorm + SiLU + conv_out to 2·latent channels, quant_conv),
//! and the TAESD-family encoders (taef2 weights: `0.weight` …).

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::Conv2dWeights;
use crate::kernels::Activation;
use crate::models::autoencoder_kl::{MidBlock, Resnet, EPS};
use crate::models::config::AutoencoderKlConfig;
use crate::models::graph::{Builder, Conv, Geometry, Graph, Mode, BOTH};
use crate::models::layers::{load_conv, Norm};
use crate::models::tae::{Block, WIDTH};
use crate::models::weights::WeightStore;

/// diffusers' Downsample2D: zero pad (top 0, left 0, bottom 1, right 1), stride 2.
const KL_DOWN_PAD: [u32; 4] = [0, 0, 1, 1];
/// TAE's stride-2 convs pad 1 on every side.
const TAE_DOWN_PAD: [u32; 4] = [1; 4];

/// The AutoencoderKL encoder on the device.
pub struct AutoencoderKlEncoder {
    /// The model's configuration.
    pub config: AutoencoderKlConfig,
    /// FLUX.2's latent BatchNorm (normalises the pipeline form of an encode).
    pub latent_bn: Option<crate::latents::LatentBatchNorm>,
    pub(crate) levels: usize,
    pub(crate) graph: Graph,
}

impl AutoencoderKlEncoder {
    /// Uploads the encoder's weights (diffusers names) from `store`.
    pub fn load(ctx: &Context, config: &AutoencoderKlConfig, store: &WeightStore) -> Result<Self> {
        config.validate().map_err(Error::InvalidInput)?;
        let g = config.norm_num_groups;
        let latent_bn = match config.flux2 {
            Some(f) => {
                let c = 4 * config.latent_channels;
                store.latent_batch_norm(c, f.batch_norm_eps)?
            }
            None => None,
        };
        let ch = &config.block_out_channels;
        let first = *ch.first().ok_or_else(|| {
            Error::InvalidInput("AutoencoderKL config: empty block_out_channels".into())
        })?;
        let conv_in = load_conv(ctx, store, "encoder.conv_in", first, 3, 3, true)?;
        let mut down = Vec::new();
        let mut prev = first;
        for (i, &cout) in ch.iter().enumerate() {
            let p = format!("encoder.down_blocks.{i}");
            let resnets =
                Resnet::load_stack(ctx, store, &p, config.layers_per_block, prev, cout, g)?;
            let downsample = if i + 1 < ch.len() {
                let p = format!("encoder.down_blocks.{i}.downsamplers.0.conv");
                Some(load_conv(ctx, store, &p, cout, cout, 3, true)?)
            } else {
                None
            };
            down.push((resnets, downsample));
            prev = cout;
        }
        let top = prev;
        let mid = MidBlock::load(ctx, store, "encoder", top, config)?;
        let l2 = 2 * config.latent_channels;
        let norm_out = Norm::load(ctx, store, "encoder.conv_norm_out", top, g, EPS)?;
        let conv_out = load_conv(ctx, store, "encoder.conv_out", l2, top, 3, true)?;
        let quant_conv = if config.use_quant_conv {
            Some(load_conv(ctx, store, "quant_conv", l2, l2, 1, true)?)
        } else {
            None
        };
        store.finish(&["decoder.", "post_quant_conv.", "bn."])?;
        let levels = down.len();
        let (mut b, image) = Builder::new();
        let w = b.weights(conv_in);
        let mut x = b.conv_plain(image, w, Geometry::Same);
        for (resnets, downsample) in down {
            for r in resnets {
                x = r.build(&mut b, x);
            }
            if let Some(d) = downsample {
                let w = b.weights(d);
                x = b.conv_plain(x, w, Geometry::Down(KL_DOWN_PAD));
            }
        }
        x = mid.build(&mut b, x);
        let norm = b.norm(norm_out);
        let a = b.stats(x, norm);
        let w = b.weights(conv_out);
        let mut out = b.conv(Conv::new(x, w, Geometry::Same).prologue(a, Activation::Silu));
        if let Some(q) = quant_conv {
            let w = b.weights(q);
            out = b.conv_plain(out, w, Geometry::Same);
        }
        // Scope ends of the hand-written encoders: the affine (both), the
        // last activation and the image (shadowed) in the untiled one.
        b.hold(a, BOTH);
        b.hold(x, &[Mode::Untiled]);
        b.hold(image, &[Mode::Untiled]);
        Ok(AutoencoderKlEncoder {
            config: config.clone(),
            latent_bn,
            levels,
            graph: b.finish(out, None),
        })
    }
}

/// A TAE encoder on the device.
pub struct TaeEncoder {
    /// Latent channels of the output.
    pub latent_channels: usize,
    pub(crate) levels: usize,
    pub(crate) graph: Graph,
}

// Built once per model: the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum TaeLayer {
    Down(Conv2dWeights),
    Block(Block),
}

impl TaeEncoder {
    /// TAESD encoder: 0 conv(3→64), 1 Block, [stride-2 conv (no bias), 3 Blocks] × 3, 14 conv(64→C).
    pub fn load(ctx: &Context, store: &WeightStore) -> Result<Self> {
        let shape = store.conv_shape(
            "14.weight",
            "not a TAE encoder: no `14.weight` (the last conv); is this a decoder file?",
        )?;
        let latent_channels = shape[0];
        let conv_in = load_conv(ctx, store, "0", WIDTH, 3, 3, true)?;
        let mut layers = vec![TaeLayer::Block(Block::load(ctx, store, 1)?)];
        for first in [2, 6, 10] {
            layers.push(TaeLayer::Down(load_conv(
                ctx,
                store,
                &first.to_string(),
                WIDTH,
                WIDTH,
                3,
                false,
            )?));
            for i in first + 1..first + 4 {
                layers.push(TaeLayer::Block(Block::load(ctx, store, i)?));
            }
        }
        let conv_out = load_conv(ctx, store, "14", latent_channels, WIDTH, 3, true)?;
        store.finish(&[])?;
        let levels = 1 + layers
            .iter()
            .filter(|l| matches!(l, TaeLayer::Down(_)))
            .count();
        let (mut b, image) = Builder::new();
        let relu = b.identity(WIDTH);
        let w = b.weights(conv_in);
        let mut x = b.conv_plain(image, w, Geometry::Same);
        for layer in layers {
            x = match layer {
                TaeLayer::Down(w) => {
                    let w = b.weights(w);
                    b.conv_plain(x, w, Geometry::Down(TAE_DOWN_PAD))
                }
                TaeLayer::Block(block) => block.build(&mut b, x, relu),
            };
        }
        let w = b.weights(conv_out);
        let out = b.conv_plain(x, w, Geometry::Same);
        b.hold(relu, BOTH);
        // The untiled encoder kept its input (a shadowed binding) to the end.
        b.hold(image, &[Mode::Untiled]);
        Ok(TaeEncoder {
            latent_channels,
            levels,
            graph: b.finish(out, None),
        })
    }
}
