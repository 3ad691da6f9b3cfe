//! Encoders: images to latents. The AutoencoderKL encoder exactly as
//! diffusers computes it (`vae.py` Encoder: conv_in, down blocks with
//! stride-2 convs after an asymmetric (0, 1, 0, 1) zero pad, mid-block with
//! attention, GroupNorm + SiLU + conv_out to 2·latent channels, quant_conv),
//! and the TAESD-family encoders (taef2 weights: `0.weight` …).

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::conv2d::{Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::Activation;
use crate::models::autoencoder_kl::{need, MidAttention, Resnet, EPS};
use crate::models::config::AutoencoderKlConfig;
use crate::models::layers::{conv, identity_affine, load_conv, Norm};
use crate::models::tae::{Block, WIDTH};
use crate::models::weights::WeightStore;
use crate::tensor::Tensor;
use crate::tiling::{Act, ConvSpec, Executor, Residual};

/// diffusers' Downsample2D: zero pad (top 0, left 0, bottom 1, right 1), stride 2.
const KL_DOWN_PAD: [u32; 4] = [0, 0, 1, 1];
/// TAE's stride-2 convs pad 1 on every side.
const TAE_DOWN_PAD: [u32; 4] = [1; 4];

/// One layer of the AutoencoderKL encoder between conv_in and conv_norm_out.
enum KlStage<'a> {
    Resnet(&'a Resnet),
    Down(&'a Conv2dWeights),
    Attention(&'a MidAttention),
}

impl KlStage<'_> {
    /// The GroupNorm applied to this stage's input (none before a downsample).
    fn input_norm(&self) -> Option<&Norm> {
        match self {
            KlStage::Resnet(r) => Some(&r.norm1),
            KlStage::Down(_) => None,
            KlStage::Attention(a) => Some(&a.norm),
        }
    }
}

/// The AutoencoderKL encoder on the device.
pub struct AutoencoderKlEncoder {
    /// The model's configuration.
    pub config: AutoencoderKlConfig,
    conv_in: Conv2dWeights,
    /// Per down block: resnets, then the stride-2 conv (all but the last block).
    down: Vec<(Vec<Resnet>, Option<Conv2dWeights>)>,
    mid_resnets: [Resnet; 2],
    mid_attention: Option<MidAttention>,
    norm_out: Norm,
    conv_out: Conv2dWeights,
    quant_conv: Option<Conv2dWeights>,
}

impl AutoencoderKlEncoder {
    /// Uploads the encoder's weights (diffusers names) from `store`.
    pub fn load(ctx: &Context, config: &AutoencoderKlConfig, store: &WeightStore) -> Result<Self> {
        config.validate().map_err(Error::InvalidInput)?;
        let g = config.norm_num_groups;
        let ch = &config.block_out_channels;
        let conv_in = load_conv(ctx, store, "encoder.conv_in", ch[0], 3, 3, true)?;
        let mut down = Vec::new();
        let mut prev = ch[0];
        for (i, &cout) in ch.iter().enumerate() {
            let mut resnets = Vec::new();
            for j in 0..config.layers_per_block {
                let cin = if j == 0 { prev } else { cout };
                resnets.push(Resnet::load(
                    ctx,
                    store,
                    &format!("encoder.down_blocks.{i}.resnets.{j}"),
                    cin,
                    cout,
                    g,
                )?);
            }
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
        let mid_resnets = [
            Resnet::load(ctx, store, "encoder.mid_block.resnets.0", top, top, g)?,
            Resnet::load(ctx, store, "encoder.mid_block.resnets.1", top, top, g)?,
        ];
        let mid_attention = if config.mid_block_add_attention {
            Some(MidAttention::load(
                ctx,
                store,
                "encoder.mid_block.attentions.0",
                top,
                g,
            )?)
        } else {
            None
        };
        let l2 = 2 * config.latent_channels;
        let norm_out = Norm::load(ctx, store, "encoder.conv_norm_out", top, g, EPS)?;
        let conv_out = load_conv(ctx, store, "encoder.conv_out", l2, top, 3, true)?;
        let quant_conv = if config.use_quant_conv {
            Some(load_conv(ctx, store, "quant_conv", l2, l2, 1, true)?)
        } else {
            None
        };
        store.finish(&["decoder.", "post_quant_conv."])?;
        Ok(AutoencoderKlEncoder {
            config: config.clone(),
            conv_in,
            down,
            mid_resnets,
            mid_attention,
            norm_out,
            conv_out,
            quant_conv,
        })
    }

    /// `x` [N, 3, H, W] in [-1, 1] → moments [N, 2·latent, H/8, W/8] (mean, then log-variance).
    pub fn forward(&self, rec: &mut Recorder, x: Tensor) -> Result<Tensor> {
        let same3 = Conv2dOptions::same(3);
        // diffusers' Downsample2D pads (left 0, right 1, top 0, bottom 1) then convolves with stride 2.
        let down2 = Conv2dOptions {
            stride: 2,
            pad: KL_DOWN_PAD,
            upsample: false,
        };
        let mut x = conv(rec, &x, &self.conv_in, None, &same3)?;
        for (resnets, downsample) in &self.down {
            for r in resnets {
                x = r.forward(rec, x)?;
            }
            if let Some(d) = downsample {
                x = conv(rec, &x, d, None, &down2)?;
            }
        }
        x = self.mid_resnets[0].forward(rec, x)?;
        if let Some(a) = &self.mid_attention {
            x = a.forward(rec, x)?;
        }
        x = self.mid_resnets[1].forward(rec, x)?;
        let a = self.norm_out.affine(rec, &x)?;
        let pro = Some(Prologue {
            affine: &a,
            act: Activation::Silu,
        });
        let mut moments = conv(rec, &x, &self.conv_out, pro, &same3)?;
        if let Some(q) = &self.quant_conv {
            moments = conv(rec, &moments, q, None, &Conv2dOptions::same(1))?;
        }
        Ok(moments)
    }

    /// Resolution levels: the latent and one per stride-2 conv.
    pub fn levels(&self) -> usize {
        self.down.len()
    }

    /// The layers between conv_in and conv_norm_out, in order.
    fn stages(&self) -> Vec<KlStage<'_>> {
        let mut stages = Vec::new();
        for (resnets, downsample) in &self.down {
            stages.extend(resnets.iter().map(KlStage::Resnet));
            stages.extend(downsample.iter().map(KlStage::Down));
        }
        stages.push(KlStage::Resnet(&self.mid_resnets[0]));
        stages.extend(self.mid_attention.iter().map(KlStage::Attention));
        stages.push(KlStage::Resnet(&self.mid_resnets[1]));
        stages
    }

    /// [`Self::forward`] tile by tile (exact: every GroupNorm with global
    /// statistics, gathered while the layer before it produces its input).
    /// `x` [N, 3, H, W] in [-1, 1] → moments [N, 2·latent, H/8, W/8].
    pub(crate) fn forward_tiled(&self, ex: &mut Executor, image: Act) -> Result<Act> {
        let stages = self.stages();
        // The norm each layer's output feeds (conv_norm_out after the last).
        let next = |i: usize| match stages.get(i) {
            Some(s) => s.input_norm(),
            None => Some(&self.norm_out),
        };
        let spec = ConvSpec::new(&self.conv_in).stats(next(0));
        let (mut x, mut a) = ex.conv(&image, spec, Residual::None)?;
        drop(image);
        for (i, stage) in stages.iter().enumerate() {
            (x, a) = match stage {
                KlStage::Resnet(r) => r.forward_tiled(ex, x, need(a)?, next(i + 1))?,
                KlStage::Attention(at) => at.forward_tiled(ex, x, need(a)?, next(i + 1))?,
                KlStage::Down(w) => {
                    let spec = ConvSpec::new(w).downsample(KL_DOWN_PAD).stats(next(i + 1));
                    ex.conv(&x, spec, Residual::None)?
                }
            };
        }
        let a = need(a)?;
        let spec = ConvSpec::new(&self.conv_out).prologue(&a, Activation::Silu);
        let (mut moments, _) = ex.conv(&x, spec, Residual::None)?;
        drop(x);
        if let Some(q) = &self.quant_conv {
            moments = ex.conv(&moments, ConvSpec::new(q), Residual::None)?.0;
        }
        Ok(moments)
    }
}

/// A TAE encoder on the device.
pub struct TaeEncoder {
    /// Latent channels of the output.
    pub latent_channels: usize,
    conv_in: Conv2dWeights,
    /// Sequential layers after the first conv: stride-2 convs and Blocks.
    layers: Vec<TaeLayer>,
    conv_out: Conv2dWeights,
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
        let shape = store.shape_of("14.weight").ok_or_else(|| Error::BadFile {
            path: store.origin().into(),
            message: "not a TAE encoder: no `14.weight` (the last conv); is this a decoder file?"
                .into(),
        })?;
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
        Ok(TaeEncoder {
            latent_channels,
            conv_in,
            layers,
            conv_out,
        })
    }

    /// `x` [N, 3, H, W] in [0, 1] → latents [N, C, H/8, W/8].
    pub fn forward(&self, rec: &mut Recorder, x: Tensor) -> Result<Tensor> {
        let n = x.shape()[0];
        let same3 = Conv2dOptions::same(3);
        let down2 = Conv2dOptions {
            stride: 2,
            pad: TAE_DOWN_PAD,
            upsample: false,
        };
        let relu = identity_affine(rec, n, WIDTH)?;
        let mut x = conv(rec, &x, &self.conv_in, None, &same3)?;
        for layer in &self.layers {
            x = match layer {
                TaeLayer::Down(w) => conv(rec, &x, w, None, &down2)?,
                TaeLayer::Block(b) => b.forward(rec, x, &relu)?,
            };
        }
        conv(rec, &x, &self.conv_out, None, &same3)
    }

    /// Resolution levels: the latent and one per stride-2 conv.
    pub fn levels(&self) -> usize {
        1 + self
            .layers
            .iter()
            .filter(|l| matches!(l, TaeLayer::Down(_)))
            .count()
    }

    /// [`Self::forward`] tile by tile (the pool branches' GroupNorms, where
    /// present, with global statistics). `x` [N, 3, H, W] in [0, 1] →
    /// latents [N, C, H/8, W/8].
    pub(crate) fn forward_tiled(&self, ex: &mut Executor, image: Act) -> Result<Act> {
        let relu = identity_affine(ex.rec(), image.n, WIDTH)?;
        let (mut x, _) = ex.conv(&image, ConvSpec::new(&self.conv_in), Residual::None)?;
        drop(image);
        for layer in &self.layers {
            x = match layer {
                TaeLayer::Down(w) => {
                    let spec = ConvSpec::new(w).downsample(TAE_DOWN_PAD);
                    ex.conv(&x, spec, Residual::None)?.0
                }
                TaeLayer::Block(b) => b.forward_tiled(ex, x, &relu)?,
            };
        }
        Ok(ex
            .conv(&x, ConvSpec::new(&self.conv_out), Residual::None)?
            .0)
    }
}
