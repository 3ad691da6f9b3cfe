//! The AutoencoderKL decoder exactly as diffusers computes it
//! (`autoencoders/vae.py` Decoder, `resnet.py` ResnetBlock2D, the mid-block
//! `Attention` with one head), for SD 1.x, SDXL, SD3, FLUX.1 and FLUX.2
//! (`AutoencoderKLFlux2`: 32 latent channels, the same decoder, possibly
//! narrower than its encoder — `decoder_block_out_channels`).
//!
//! The weights load into blocks, which then move into the model's
//! `Graph` (built once, see `models::graph`); the executors in `exec` run it.

use crate::error::Result;
use crate::gpu::Context;
use crate::kernels::conv2d::Conv2dWeights;
use crate::kernels::image::ImageRange;
use crate::kernels::Activation;
use crate::models::config::AutoencoderKlConfig;
use crate::models::graph::{Builder, Conv, Geometry, Graph, Mode, Op, Residual, TensorId};
use crate::models::layers::{load_conv, Norm};
use crate::models::weights::WeightStore;

/// diffusers uses eps 1e-6 for every GroupNorm of the VAE decoder.
pub(crate) const EPS: f32 = 1e-6;

/// ResnetBlock2D: norm1 → SiLU → conv1 → norm2 → SiLU → conv2, plus the
/// (1×1-conv shortcut of the) input.
pub(crate) struct Resnet {
    pub(crate) norm1: Norm,
    conv1: Conv2dWeights,
    norm2: Norm,
    conv2: Conv2dWeights,
    shortcut: Option<Conv2dWeights>,
}

impl Resnet {
    pub(crate) fn load(
        ctx: &Context,
        s: &WeightStore,
        p: &str,
        cin: usize,
        cout: usize,
        groups: usize,
    ) -> Result<Self> {
        Ok(Resnet {
            norm1: Norm::load(ctx, s, &format!("{p}.norm1"), cin, groups, EPS)?,
            conv1: load_conv(ctx, s, &format!("{p}.conv1"), cout, cin, 3, true)?,
            norm2: Norm::load(ctx, s, &format!("{p}.norm2"), cout, groups, EPS)?,
            conv2: load_conv(ctx, s, &format!("{p}.conv2"), cout, cout, 3, true)?,
            shortcut: if cin != cout {
                Some(load_conv(
                    ctx,
                    s,
                    &format!("{p}.conv_shortcut"),
                    cout,
                    cin,
                    1,
                    true,
                )?)
            } else {
                None
            },
        })
    }

    /// `{prefix}.resnets.0 .. n`: the first from `cin` to `cout` channels,
    /// the others at `cout`.
    pub(crate) fn load_stack(
        ctx: &Context,
        s: &WeightStore,
        prefix: &str,
        n: usize,
        cin: usize,
        cout: usize,
        groups: usize,
    ) -> Result<Vec<Self>> {
        (0..n)
            .map(|j| {
                let from = if j == 0 { cin } else { cout };
                let p = format!("{prefix}.resnets.{j}");
                Resnet::load(ctx, s, &p, from, cout, groups)
            })
            .collect()
    }

    /// Adds the block to `b` on `x` (its weights move into the graph).
    pub(crate) fn build(self, b: &mut Builder, x: TensorId) -> TensorId {
        let (norm1, conv1) = (b.norm(self.norm1), b.weights(self.conv1));
        let (norm2, conv2) = (b.norm(self.norm2), b.weights(self.conv2));
        let residual = match self.shortcut {
            Some(sc) => Residual::Shortcut(x, b.weights(sc)),
            None => Residual::InPlace(x),
        };
        let a1 = b.stats(x, norm1);
        let h = b.conv(Conv::new(x, conv1, Geometry::Same).prologue(a1, Activation::Silu));
        let a2 = b.stats(h, norm2);
        let conv2 = Conv::new(h, conv2, Geometry::Same).prologue(a2, Activation::Silu);
        b.conv(conv2.residual(residual))
    }
}

/// The mid-block attention: GroupNorm, q/k/v projections (1×1 convs on the
/// channel-major activations), one head over all h·w tokens, output
/// projection and residual.
pub(crate) struct MidAttention {
    pub(crate) norm: Norm,
    q: Conv2dWeights,
    k: Conv2dWeights,
    v: Conv2dWeights,
    out: Conv2dWeights,
}

impl MidAttention {
    pub(crate) fn load(
        ctx: &Context,
        s: &WeightStore,
        p: &str,
        c: usize,
        groups: usize,
    ) -> Result<Self> {
        Ok(MidAttention {
            norm: Norm::load(ctx, s, &format!("{p}.group_norm"), c, groups, EPS)?,
            q: load_conv(ctx, s, &format!("{p}.to_q"), c, c, 1, true)?,
            k: load_conv(ctx, s, &format!("{p}.to_k"), c, c, 1, true)?,
            v: load_conv(ctx, s, &format!("{p}.to_v"), c, c, 1, true)?,
            out: load_conv(ctx, s, &format!("{p}.to_out.0"), c, c, 1, true)?,
        })
    }

    /// Adds the attention to `b` on `x` (its weights move into the graph).
    pub(crate) fn build(self, b: &mut Builder, x: TensorId) -> TensorId {
        let norm = b.norm(self.norm);
        let (q, k, v, out) = (
            b.weights(self.q),
            b.weights(self.k),
            b.weights(self.v),
            b.weights(self.out),
        );
        let affine = b.stats(x, norm);
        b.attention(Op::Attention {
            x,
            affine,
            q,
            k,
            v,
            out,
        })
    }
}

/// UNetMidBlock2D of the encoder and the decoder: resnet, attention (unless
/// the config leaves it out), resnet, all at the top width `c`.
pub(crate) struct MidBlock {
    resnets: [Resnet; 2],
    attention: Option<MidAttention>,
}

impl MidBlock {
    /// Loads `{prefix}.mid_block.*`.
    pub(crate) fn load(
        ctx: &Context,
        s: &WeightStore,
        prefix: &str,
        c: usize,
        config: &AutoencoderKlConfig,
    ) -> Result<Self> {
        let g = config.norm_num_groups;
        let p = format!("{prefix}.mid_block");
        let resnet = |i: usize| Resnet::load(ctx, s, &format!("{p}.resnets.{i}"), c, c, g);
        // Load order is allocation order: resnets first, as the pools expect.
        let resnets = [resnet(0)?, resnet(1)?];
        let attention = if config.mid_block_add_attention {
            let a = MidAttention::load(ctx, s, &format!("{p}.attentions.0"), c, g)?;
            Some(a)
        } else {
            None
        };
        Ok(MidBlock { resnets, attention })
    }

    /// Adds the block to `b` on `x` (its weights move into the graph).
    pub(crate) fn build(self, b: &mut Builder, mut x: TensorId) -> TensorId {
        let [res0, res1] = self.resnets;
        x = res0.build(b, x);
        if let Some(attn) = self.attention {
            x = attn.build(b, x);
        }
        res1.build(b, x)
    }
}

struct UpBlock {
    resnets: Vec<Resnet>,
    upsample: Option<Conv2dWeights>,
}

/// An AutoencoderKL decoder with its weights on the device.
pub struct AutoencoderKl {
    /// The model's configuration.
    pub config: AutoencoderKlConfig,
    /// FLUX.2's latent BatchNorm statistics (host f32; `None` for the other
    /// AutoencoderKLs, or a FLUX.2 file without `bn.*`, which then decodes raw z only).
    pub latent_bn: Option<crate::latents::LatentBatchNorm>,
    levels: usize,
    graph: Graph,
}

impl AutoencoderKl {
    /// Uploads the decoder's weights (diffusers names) from `store`.
    pub fn load(ctx: &Context, config: &AutoencoderKlConfig, store: &WeightStore) -> Result<Self> {
        config.validate().map_err(crate::Error::InvalidInput)?;
        let g = config.norm_num_groups;
        let lc = config.latent_channels;
        let latent_bn = match config.flux2 {
            Some(f) => store.latent_batch_norm(4 * lc, f.batch_norm_eps)?,
            None => None,
        };
        let rev: Vec<usize> = config.decoder_channels().iter().rev().copied().collect();
        let top = *rev.first().ok_or_else(|| {
            crate::Error::InvalidInput("AutoencoderKL config: empty block_out_channels".into())
        })?;
        let post_quant_conv = if config.use_post_quant_conv {
            Some(load_conv(ctx, store, "post_quant_conv", lc, lc, 1, true)?)
        } else {
            None
        };
        let conv_in = load_conv(ctx, store, "decoder.conv_in", top, lc, 3, true)?;
        let mid = MidBlock::load(ctx, store, "decoder", top, config)?;
        let mut up_blocks = Vec::new();
        let mut prev = top;
        for (i, &cout) in rev.iter().enumerate() {
            let p = format!("decoder.up_blocks.{i}");
            let n = config.layers_per_block + 1;
            let resnets = Resnet::load_stack(ctx, store, &p, n, prev, cout, g)?;
            let upsample = if i + 1 < rev.len() {
                Some(load_conv(
                    ctx,
                    store,
                    &format!("decoder.up_blocks.{i}.upsamplers.0.conv"),
                    cout,
                    cout,
                    3,
                    true,
                )?)
            } else {
                None
            };
            up_blocks.push(UpBlock { resnets, upsample });
            prev = cout;
        }
        #[allow(clippy::expect_used)] // the config check refuses an empty channel list
        let last = *rev.last().expect("validated non-empty");
        let norm_out = Norm::load(ctx, store, "decoder.conv_norm_out", last, g, EPS)?;
        let conv_out = load_conv(
            ctx,
            store,
            "decoder.conv_out",
            config.out_channels,
            last,
            3,
            true,
        )?;
        store.finish(&["encoder.", "quant_conv.", "bn."])?;
        let levels = up_blocks.len();
        let graph = build(
            post_quant_conv,
            conv_in,
            mid,
            up_blocks,
            (norm_out, conv_out),
        );
        Ok(AutoencoderKl {
            config: config.clone(),
            latent_bn,
            levels,
            graph,
        })
    }

    /// Resolution levels: the latent and one per 2× upsample.
    pub fn levels(&self) -> usize {
        self.levels
    }

    /// The decoder's layers.
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// The decoder's graph: post_quant_conv, conv_in, mid-block, up blocks,
/// conv_norm_out + SiLU + conv_out (as diffusers' Decoder.forward).
fn build(
    post_quant_conv: Option<Conv2dWeights>,
    conv_in: Conv2dWeights,
    mid: MidBlock,
    up_blocks: Vec<UpBlock>,
    (norm_out, conv_out): (Norm, Conv2dWeights),
) -> Graph {
    let (mut b, mut x) = Builder::new();
    if let Some(pq) = post_quant_conv {
        let w = b.weights(pq);
        x = b.conv_plain(x, w, Geometry::Same);
        b.tap(x, "post_quant_conv".into());
    }
    let w = b.weights(conv_in);
    let conv_in_input = x;
    x = b.conv_plain(x, w, Geometry::Same);
    b.tap(x, "decoder.conv_in".into());
    x = mid.build(&mut b, x);
    b.tap(x, "decoder.mid_block".into());
    for (i, block) in up_blocks.into_iter().enumerate() {
        for r in block.resnets {
            x = r.build(&mut b, x);
        }
        if let Some(up) = block.upsample {
            let w = b.weights(up);
            x = b.conv_plain(x, w, Geometry::Upsample);
        }
        b.tap(x, format!("decoder.up_blocks.{i}"));
    }
    let norm = b.norm(norm_out);
    let a = b.stats(x, norm);
    b.tap_activated(x, "decoder.conv_act".into(), a, Activation::Silu);
    let w = b.weights(conv_out);
    let out = b.conv(Conv::new(x, w, Geometry::Same).prologue(a, Activation::Silu));
    // The tiled decoder kept conv_in's input (a shadowed binding) to the end.
    b.hold(conv_in_input, &[Mode::Exact]);
    b.finish(out, Some(ImageRange::MinusOneToOne))
}
