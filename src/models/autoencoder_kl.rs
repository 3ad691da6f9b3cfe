//! The AutoencoderKL decoder exactly as diffusers computes it
//! (`autoencoders/vae.py` Decoder, `resnet.py` ResnetBlock2D, the mid-block
//! `Attention` with one head), for SD 1.x, SDXL, SD3 and FLUX.1.
//!
//! GroupNorm + SiLU are never materialised: a statistics kernel produces
//! per-channel affine coefficients and the following conv applies them (and
//! the activation) while loading its input. Residual adds happen in the conv
//! that produces the second operand, in place.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::kernels::attention::attention;
use crate::kernels::conv2d::{Conv2dOptions, Conv2dWeights, Prologue};
use crate::kernels::image::ImageRange;
use crate::kernels::Activation;
use crate::models::config::AutoencoderKlConfig;
use crate::models::layers::{conv, conv_add, conv_as, dims4, load_conv, Norm, Taps};
use crate::models::weights::WeightStore;
use crate::tensor::{DType, Tensor};
use crate::tiling::{Act, AttentionSpec, ConvSpec, Executor, Residual};

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

    pub(crate) fn forward(&self, rec: &mut Recorder, x: Tensor) -> Result<Tensor> {
        let same3 = Conv2dOptions::same(3);
        let a1 = self.norm1.affine(rec, &x)?;
        let h = conv(
            rec,
            &x,
            &self.conv1,
            Some(Prologue {
                affine: &a1,
                act: Activation::Silu,
            }),
            &same3,
        )?;
        drop(a1);
        let a2 = self.norm2.affine(rec, &h)?;
        let residual = match &self.shortcut {
            Some(sc) => conv(rec, &x, sc, None, &Conv2dOptions::same(1))?,
            None => x,
        };
        conv_add(
            rec,
            &h,
            &self.conv2,
            Some(Prologue {
                affine: &a2,
                act: Activation::Silu,
            }),
            residual,
            &same3,
        )
    }
}

impl Resnet {
    /// Tile by tile: `a1` is norm1's global affine over `x`; returns the
    /// output and the affine of `next` (the following GroupNorm) over it.
    pub(crate) fn forward_tiled(
        &self,
        ex: &mut Executor,
        x: Act,
        a1: Tensor,
        next: Option<&Norm>,
    ) -> Result<(Act, Option<Tensor>)> {
        let spec1 = ConvSpec::new(&self.conv1)
            .prologue(&a1, Activation::Silu)
            .stats(Some(&self.norm2));
        let (h, a2) = ex.conv(&x, spec1, Residual::None)?;
        drop(a1);
        let a2 = need(a2)?;
        let spec2 = ConvSpec::new(&self.conv2)
            .prologue(&a2, Activation::Silu)
            .stats(next);
        match &self.shortcut {
            Some(sc) => ex.conv(&h, spec2, Residual::Shortcut(&x, sc)),
            None => ex.conv(&h, spec2, Residual::Take(x)),
        }
    }
}

/// The affine a tiled layer was asked to gather.
pub(crate) fn need(affine: Option<Tensor>) -> Result<Tensor> {
    affine.ok_or_else(|| {
        Error::Unsupported("tiled layer without its GroupNorm statistics (a wgvae bug)".into())
    })
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

    pub(crate) fn forward(&self, rec: &mut Recorder, x: Tensor) -> Result<Tensor> {
        let [n, c, h, w] = dims4(&x)?;
        let same1 = Conv2dOptions::same(1);
        let a = self.norm.affine(rec, &x)?;
        let pro = || {
            Some(Prologue {
                affine: &a,
                act: Activation::None,
            })
        };
        // The attention kernel reads f32 q, k, v (softmax inputs stay f32).
        let f32 = DType::F32;
        let q = conv_as(rec, &x, &self.q, pro(), &same1, f32)?;
        let k = conv_as(rec, &x, &self.k, pro(), &same1, f32)?;
        let v = conv_as(rec, &x, &self.v, pro(), &same1, f32)?;
        let o = Tensor::empty(rec.ctx(), &[n, c, h, w], DType::F32, "attention out")?;
        let tokens = [n, c, h * w];
        attention(
            rec,
            &q.reshape(&tokens)?,
            &k.reshape(&tokens)?,
            &v.reshape(&tokens)?,
            1.0 / (c as f32).sqrt(),
            &o.reshape(&tokens)?,
        )?;
        drop((q, k, v));
        conv_add(rec, &o, &self.out, None, x, &same1)
    }

    /// Tile by tile (see [`Executor::attention`]): `affine` is the global
    /// GroupNorm affine `[N, C, 2]` of `x`; returns the output and the affine
    /// of `next` over it.
    pub(crate) fn forward_tiled(
        &self,
        ex: &mut Executor,
        x: Act,
        affine: Tensor,
        next: Option<&Norm>,
    ) -> Result<(Act, Option<Tensor>)> {
        ex.attention(
            x,
            AttentionSpec {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                out: &self.out,
                affine: &affine,
                stats: next,
            },
        )
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
    post_quant_conv: Option<Conv2dWeights>,
    conv_in: Conv2dWeights,
    mid_resnets: [Resnet; 2],
    mid_attention: Option<MidAttention>,
    up_blocks: Vec<UpBlock>,
    norm_out: Norm,
    conv_out: Conv2dWeights,
}

impl AutoencoderKl {
    /// Uploads the decoder's weights (diffusers names) from `store`.
    pub fn load(ctx: &Context, config: &AutoencoderKlConfig, store: &WeightStore) -> Result<Self> {
        config.validate().map_err(crate::Error::InvalidInput)?;
        let g = config.norm_num_groups;
        let lc = config.latent_channels;
        let rev: Vec<usize> = config.block_out_channels.iter().rev().copied().collect();
        let top = rev[0];
        let post_quant_conv = if config.use_post_quant_conv {
            Some(load_conv(ctx, store, "post_quant_conv", lc, lc, 1, true)?)
        } else {
            None
        };
        let conv_in = load_conv(ctx, store, "decoder.conv_in", top, lc, 3, true)?;
        let mid_resnets = [
            Resnet::load(ctx, store, "decoder.mid_block.resnets.0", top, top, g)?,
            Resnet::load(ctx, store, "decoder.mid_block.resnets.1", top, top, g)?,
        ];
        let mid_attention = if config.mid_block_add_attention {
            Some(MidAttention::load(
                ctx,
                store,
                "decoder.mid_block.attentions.0",
                top,
                g,
            )?)
        } else {
            None
        };
        let mut up_blocks = Vec::new();
        let mut prev = top;
        for (i, &cout) in rev.iter().enumerate() {
            let mut resnets = Vec::new();
            for j in 0..=config.layers_per_block {
                let cin = if j == 0 { prev } else { cout };
                resnets.push(Resnet::load(
                    ctx,
                    store,
                    &format!("decoder.up_blocks.{i}.resnets.{j}"),
                    cin,
                    cout,
                    g,
                )?);
            }
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
        store.finish(&["encoder.", "quant_conv."])?;
        Ok(AutoencoderKl {
            config: config.clone(),
            post_quant_conv,
            conv_in,
            mid_resnets,
            mid_attention,
            up_blocks,
            norm_out,
            conv_out,
        })
    }

    /// Resolution levels: the latent and one per 2× upsample.
    pub fn levels(&self) -> usize {
        self.up_blocks.len()
    }

    /// The decoder tile by tile (exact: global GroupNorm statistics). `z`
    /// holds unscaled latents `[N, C, h, w]`; returns RGBA8 pixels `[N, 1, 8h, 8w]`
    /// and, when `keep_raw`, the raw output `[N, 3, 8h, 8w]`.
    pub(crate) fn forward_tiled(
        &self,
        ex: &mut Executor,
        z: Act,
        keep_raw: bool,
    ) -> Result<(Act, Option<Act>)> {
        let mut x = z;
        if let Some(pq) = &self.post_quant_conv {
            x = ex.conv(&x, ConvSpec::new(pq), Residual::None)?.0;
        }
        let res0 = &self.mid_resnets[0];
        let res1 = &self.mid_resnets[1];
        let (mut x, mut a) = ex.conv(
            &x,
            ConvSpec::new(&self.conv_in).stats(Some(&res0.norm1)),
            Residual::None,
        )?;
        let after_res0 = match &self.mid_attention {
            Some(at) => &at.norm,
            None => &res1.norm1,
        };
        (x, a) = res0.forward_tiled(ex, x, need(a)?, Some(after_res0))?;
        if let Some(at) = &self.mid_attention {
            (x, a) = at.forward_tiled(ex, x, need(a)?, Some(&res1.norm1))?;
        }
        let first_up = &self.up_blocks[0].resnets[0].norm1;
        (x, a) = res1.forward_tiled(ex, x, need(a)?, Some(first_up))?;
        for (i, block) in self.up_blocks.iter().enumerate() {
            let after_block = match self.up_blocks.get(i + 1) {
                Some(b) => &b.resnets[0].norm1,
                None => &self.norm_out,
            };
            for (j, r) in block.resnets.iter().enumerate() {
                let next = match block.resnets.get(j + 1) {
                    Some(r2) => Some(&r2.norm1),
                    None if block.upsample.is_some() => None,
                    None => Some(after_block),
                };
                (x, a) = r.forward_tiled(ex, x, need(a)?, next)?;
            }
            if let Some(up) = &block.upsample {
                let spec = ConvSpec::new(up).upsample().stats(Some(after_block));
                (x, a) = ex.conv(&x, spec, Residual::None)?;
            }
        }
        let a = need(a)?;
        ex.conv_to_image(
            &x,
            ConvSpec::new(&self.conv_out).prologue(&a, Activation::Silu),
            ImageRange::MinusOneToOne,
            keep_raw,
        )
    }

    /// Records the decoder. `z` [N, latent_channels, h, w] are *unscaled*
    /// latents (what `vae.decode` receives); returns the raw output [N, 3, 8h, 8w].
    pub fn forward(&self, rec: &mut Recorder, z: Tensor, taps: &mut Taps) -> Result<Tensor> {
        let mut x = z;
        if let Some(pq) = &self.post_quant_conv {
            x = conv(rec, &x, pq, None, &Conv2dOptions::same(1))?;
            taps.tap(rec, "post_quant_conv", &x)?;
        }
        x = conv(rec, &x, &self.conv_in, None, &Conv2dOptions::same(3))?;
        taps.tap(rec, "decoder.conv_in", &x)?;
        x = self.mid_resnets[0].forward(rec, x)?;
        if let Some(attn) = &self.mid_attention {
            x = attn.forward(rec, x)?;
        }
        x = self.mid_resnets[1].forward(rec, x)?;
        taps.tap(rec, "decoder.mid_block", &x)?;
        let up2 = Conv2dOptions {
            upsample: true,
            ..Conv2dOptions::same(3)
        };
        for (i, block) in self.up_blocks.iter().enumerate() {
            for r in &block.resnets {
                x = r.forward(rec, x)?;
            }
            if let Some(up) = &block.upsample {
                x = conv(rec, &x, up, None, &up2)?;
            }
            taps.tap(rec, &format!("decoder.up_blocks.{i}"), &x)?;
        }
        let a = self.norm_out.affine(rec, &x)?;
        if taps.is_enabled() {
            // conv_act is never materialised in a normal decode; build it for the check.
            let act = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), "conv_act")?;
            crate::kernels::group_norm::group_norm_apply(rec, &x, &a, Activation::Silu, &act)?;
            taps.tap(rec, "decoder.conv_act", &act)?;
        }
        conv(
            rec,
            &x,
            &self.conv_out,
            Some(Prologue {
                affine: &a,
                act: Activation::Silu,
            }),
            &Conv2dOptions::same(3),
        )
    }
}
