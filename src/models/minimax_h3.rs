//! The MiniMax-H3 video VAE decoder (diffusers `AutoencoderKLMiniMaxH3`):
//! a ViT over a clip's latent voxels, as a graph over channel-major tokens
//! (`models::graph::TokenOp`).
//!
//! One clip: post_quant_conv → every latent voxel a token (`proj_in`), the
//! register tokens and one zero token appended (RoPE position 0) → blocks
//! of `x + scale1 · attn(RMSNorm(x))`, `x + scale2 · SwiGLU-FFN(RMSNorm(x))`
//! (attention: q/k RMS-normed per head, 3-axis RoPE on `rope_dim_ratio` of
//! each head, full non-causal attention) → LayerNorm → `proj_out` to
//! `3 · pt · p²` values per token → unpatchified to `pt` frames of `p × p`
//! pixels, in ImageNet-normalised RGB, not clamped.
//!
//! A video decodes as diffusers' `_decode` chunks it: clips of `k + o`
//! latent frames advancing by `k` (the latent padded at its end with copies
//! of its last frame), the first `p` frames of each clip dropped, each
//! clip's first `f` frames cross-faded with the previous clip's tail, the
//! last tail appended and the frames made from padding cut off
//! (`ClipGeometry` in `models::video_info`). `scale1` / `scale2` are
//! folded into the projections before them, and `norm_out`'s bias into
//! `proj_out`'s.
//!
//! Attention is global over a clip's tokens, so a frame cannot be split
//! into exact tiles; diffusers tiles by default (256-px tiles blended over
//! 64 px), which changes the output for frames over 256 px. The engine
//! decodes untiled: diffusers' output with `disable_tiling()`, and its
//! default output for frames of at most 256 px.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::kernels::image::ImageRange;
use crate::kernels::rms_norm::NormKind;
use crate::models::diffusers_folder::{bad, ConfigFields, Configs};
use crate::models::graph::{Builder, ConvId, Geometry, Graph, Residual, TokenOp};
use crate::models::video_info::ClipGeometry;
use crate::models::wan_layers::load_pointwise;
use crate::models::weights::WeightStore;
use crate::tensor::{DType, Tensor};

/// diffusers' class name in `config.json`.
pub const CLASS_NAME: &str = "AutoencoderKLMiniMaxH3";

/// The decoder's shape (diffusers `AutoencoderKLMiniMaxH3` config fields).
#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxH3Config {
    /// Latent channels.
    pub latent_channels: usize,
    /// Output channels (RGB).
    pub out_channels: usize,
    /// Output pixels per latent pixel (the product of
    /// `spatial_downsample_factors`).
    pub patch_size: usize,
    /// Output frames per latent frame (the product of
    /// `temporal_downsample_factors`).
    pub patch_size_t: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Learned register tokens.
    pub registers: usize,
    /// The feed-forward's width over the model's.
    pub ffn_mult: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// Share of each head's channels RoPE rotates.
    pub rope_dim_ratio: f32,
    /// The decoder's norms' epsilon.
    pub norm_eps: f32,
    /// Frames the encoder takes per clip.
    pub clip_length: usize,
    /// Latent frames the encoder drops from each clip's end.
    pub token_drop: usize,
    /// Pipeline latents are `(z − mean) / std`.
    pub latents_mean: Vec<f32>,
    /// See `latents_mean`.
    pub latents_std: Vec<f32>,
}

impl MiniMaxH3Config {
    /// diffusers' defaults for the released decoder: 24 latent channels,
    /// 16× space, 4× time, 36 layers × 32 heads × 64, 4 registers, SwiGLU
    /// ×4, RoPE theta 100 on ¾ of each head, clips of 17 frames, 3 tokens
    /// dropped; latents mean 0, std 1 (diffusers' class defaults).
    pub fn public() -> Self {
        MiniMaxH3Config {
            latent_channels: 24,
            out_channels: 3,
            patch_size: 16,
            patch_size_t: 4,
            layers: 36,
            heads: 32,
            head_dim: 64,
            registers: 4,
            ffn_mult: 4,
            rope_theta: 100.0,
            rope_dim_ratio: 0.75,
            norm_eps: 1e-5,
            clip_length: 17,
            token_drop: 3,
            latents_mean: vec![0.0; 24],
            latents_std: vec![1.0; 24],
        }
    }

    /// A diffusers `config.json`, every field this decoder uses checked by
    /// name.
    pub fn from_file(path: &Path) -> Result<Self> {
        let f = ConfigFields::read(path, CLASS_NAME)?;
        let d = Self::public();
        let product = |k: &str, default: usize| -> Result<usize> {
            let v = f.ints(k, &[default], (1, 64))?;
            v.iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b).filter(|&p| p <= 1024))
                .ok_or_else(|| bad(path, format!("config.json: `{k}` {v:?} multiply past 1024")))
        };
        let c = f.int("latent_channels", d.latent_channels, (1, 4096))?;
        let cfg = MiniMaxH3Config {
            latent_channels: c,
            out_channels: f.int("out_channels", 3, (1, 4))?,
            patch_size: product("spatial_downsample_factors", 16)?,
            patch_size_t: product("temporal_downsample_factors", 4)?,
            layers: f.int("decoder_num_layers", d.layers, (1, 256))?,
            heads: f.int("decoder_num_attention_heads", d.heads, (1, 256))?,
            head_dim: f.int("decoder_attention_head_dim", d.head_dim, (1, 512))?,
            registers: f.int("decoder_num_register_tokens", d.registers, (0, 1024))?,
            ffn_mult: f.int("decoder_ffn_mult", d.ffn_mult, (1, 64))?,
            rope_theta: f.factor("decoder_rope_theta", d.rope_theta)?,
            rope_dim_ratio: f.factor("decoder_rope_dim_ratio", d.rope_dim_ratio)?,
            norm_eps: f.factor("decoder_norm_eps", d.norm_eps)?,
            clip_length: f.int("clip_length", d.clip_length, (1, 4096))?,
            token_drop: f.int("token_drop", d.token_drop, (0, 4096))?,
            latents_mean: f.floats("latents_mean", &vec![0.0; c], c)?,
            latents_std: f.floats("latents_std", &vec![1.0; c], c)?,
        };
        cfg.check()
            .map_err(|m| bad(path, format!("config.json: {m}")))?;
        Ok(cfg)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let rot = self.rope_dim();
        if !rot.is_multiple_of(6) || rot > self.head_dim {
            return Err(format!(
                "decoder_rope_dim_ratio {} of decoder_attention_head_dim {} gives {rot} rotated channels per head; MiniMax-H3's 3-axis RoPE needs a multiple of 6 (as diffusers checks)",
                self.rope_dim_ratio, self.head_dim
            ));
        }
        let k = self.clip().k;
        if self.token_drop > k {
            return Err(format!(
                "token_drop {} is more than a clip's {k} latent frames (clip_length {} / {})",
                self.token_drop, self.clip_length, self.patch_size_t
            ));
        }
        if self.latents_std.iter().any(|s| !s.is_finite() || *s == 0.0) {
            return Err("latents_std holds zero or a non-finite value".into());
        }
        Ok(())
    }

    /// Channels of the model (`heads · head_dim`).
    pub fn dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels RoPE rotates per head (`int(head_dim · rope_dim_ratio)`).
    pub fn rope_dim(&self) -> usize {
        (self.head_dim as f32 * self.rope_dim_ratio) as usize
    }

    /// How a video is cut into clips.
    pub(crate) fn clip(&self) -> ClipGeometry {
        let pt = self.patch_size_t.max(1);
        let k = self.clip_length.div_ceil(pt).max(1);
        ClipGeometry {
            k,
            overlap: (k - self.token_drop % k) % k,
            drop: self.token_drop,
            t_up: pt,
            skip: (pt - self.clip_length % pt) % pt,
            intra_tail: self.clip_length % pt,
        }
    }
}

/// A MiniMax-H3 video VAE decoder with its weights on the device.
pub struct MiniMaxH3Decoder {
    config: MiniMaxH3Config,
    name: String,
    graph: Graph,
}

/// True when `spec` names a MiniMax-H3 VAE: `preset:minimax-h3`, a
/// diffusers folder of this class, or a `.safetensors` file with its ViT
/// decoder's keys.
pub fn is_minimax_h3(spec: &str) -> bool {
    if spec == "preset:minimax-h3" {
        return true;
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return crate::models::diffusers_folder::is_class_folder(path, CLASS_NAME);
    }
    path.is_file()
        && crate::models::wan_weights::header_keys(path).is_some_and(|keys| {
            keys.iter().any(|k| k == "decoder.register_tokens")
                && keys
                    .iter()
                    .any(|k| k.starts_with("decoder.transformer_blocks."))
        })
}

impl MiniMaxH3Decoder {
    /// Opens `spec`: `preset:minimax-h3` (diffusers' default config, seeded
    /// random weights `seed`), a diffusers folder, or a `.safetensors` file
    /// (a `config.json` of this class beside it is read, else the default
    /// config is assumed). Weights are stored as `dtype`.
    pub fn open(ctx: &Context, spec: &str, dtype: DType, seed: u64) -> Result<Self> {
        let names = (CLASS_NAME, "minimax-h3", "MiniMax-H3 VAE");
        let configs: Configs<MiniMaxH3Config> =
            (MiniMaxH3Config::public, MiniMaxH3Config::from_file);
        let (mut dec, name) = crate::models::diffusers_folder::open_video_model(
            ctx,
            spec,
            names,
            (dtype, seed),
            configs,
            Self::load,
        )?;
        dec.name = name;
        Ok(dec)
    }

    /// Builds the decoder of `config` from `store` (diffusers key names).
    pub fn load(ctx: &Context, store: &WeightStore, config: MiniMaxH3Config) -> Result<Self> {
        config.check().map_err(|m| Error::BadFile {
            path: PathBuf::from(store.origin()),
            message: m,
        })?;
        let graph = build(ctx, store, &config)?;
        Ok(MiniMaxH3Decoder {
            config,
            name: String::from("MiniMax-H3 VAE"),
            graph,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &MiniMaxH3Config {
        &self.config
    }

    /// What the video runner needs to know about it.
    pub(crate) fn video_info(&self) -> super::video_info::VideoInfo<'_> {
        let c = &self.config;
        super::video_info::VideoInfo {
            name: &self.name,
            latent_channels: c.latent_channels,
            upscale: c.patch_size,
            t_upscale: c.patch_size_t,
            host_trim: 0,
            layout: crate::latents::VideoLayout::Ncthw,
            range: ImageRange::ImageNet,
            cache_grows: false,
            whole_clip: false,
            min_side: 1,
            clip: Some(c.clip()),
        }
    }

    /// Pipeline latents `[N, C, T, h, w]` → the raw z, in place: `z =
    /// latents · latents_std + latents_mean` (`MiniMaxH3VideoDecodeStep`).
    pub fn unnormalize(&self, latents: &mut crate::io::HostTensor) -> Result<()> {
        let (mean, std) = (&self.config.latents_mean, &self.config.latents_std);
        let c = self.config.latent_channels;
        crate::latents::map_ncthw_channels(latents, "MiniMax-H3 VAE", c, |ch, v| {
            v * std.get(ch).copied().unwrap_or(1.0) + mean.get(ch).copied().unwrap_or(0.0)
        })
    }

    /// One clip's layers (its latent frames as the batch).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// A linear layer `{prefix}` `[cout, cin]` as a 1×1 conv, its output
/// channels scaled by `scale` (a block's `scale1` / `scale2`) and `shift`
/// added to its bias (a folded LayerNorm bias, `W · β`).
fn linear(
    ctx: &Context,
    store: &WeightStore,
    prefix: &str,
    [cout, cin]: [usize; 2],
    scale: Option<&[f32]>,
) -> Result<Conv2dWeights> {
    let mut w = store.take(&format!("{prefix}.weight"), &[cout, cin])?;
    let mut b = store.take(&format!("{prefix}.bias"), &[cout])?;
    if let Some(s) = scale {
        for ((row, bias), &so) in w.chunks_mut(cin.max(1)).zip(b.iter_mut()).zip(s) {
            row.iter_mut().for_each(|v| *v *= so);
            *bias *= so;
        }
    }
    let host = PytorchConv {
        weight: &w,
        cout,
        cin,
        k: 1,
        bias: Some(&b),
    };
    Conv2dWeights::upload(ctx, &host, None, store.dtype(), prefix)
}

fn build(ctx: &Context, store: &WeightStore, cfg: &MiniMaxH3Config) -> Result<Graph> {
    let (c, d) = (cfg.latent_channels, cfg.dim());
    let extra = cfg.registers + 1;
    let (mut b, z) = Builder::new();
    let w = |b: &mut Builder, wt: Conv2dWeights| -> ConvId { b.weights(wt) };
    let pq = load_pointwise(ctx, store, "post_quant_conv", c, c, true)?;
    let pq = w(&mut b, pq);
    let x = b.conv_plain(z, pq, Geometry::Same);
    let tokens = b.tokens(TokenOp::From { x, extra });
    let proj_in = linear(ctx, store, "decoder.proj_in", [d, c], None)?;
    let proj_in = w(&mut b, proj_in);
    let x = b.conv_plain(tokens, proj_in, Geometry::Same);
    let reg = store.take("decoder.register_tokens", &[1, cfg.registers, d])?;
    let reg = Tensor::from_f32(
        ctx,
        &[cfg.registers.max(1), d],
        &pad_rows(reg, d),
        "register tokens",
    )?;
    let reg = b.constant(reg);
    let mut x = b.tokens(TokenOp::Registers { x, grid: z, reg });
    let eps = cfg.norm_eps;
    let gamma = |b: &mut Builder, key: &str, kind: NormKind| -> Result<_> {
        let g = store.take(key, &[d])?;
        Ok(b.norm_gamma(Tensor::from_f32(ctx, &[d], &g, key)?, kind))
    };
    let inner = d * cfg.ffn_mult;
    // Shared by every layer: the q/k norms' gamma and the pass's RoPE table.
    let ones = Tensor::from_f32(ctx, &[cfg.head_dim], &vec![1.0; cfg.head_dim], "qk norm")?;
    let ones = b.constant(ones);
    let half = cfg.rope_dim() / 2;
    let theta = cfg.rope_theta;
    let rope = b.tokens(TokenOp::Rope {
        grid: z,
        half,
        theta,
    });
    for i in 0..cfg.layers {
        let p = format!("decoder.transformer_blocks.{i}");
        let scale1 = store.take(&format!("{p}.scale1"), &[d])?;
        let scale2 = store.take(&format!("{p}.scale2"), &[d])?;
        let n1 = gamma(&mut b, &format!("{p}.norm1.weight"), NormKind::Rms(eps))?;
        let normed = b.rms_norm(x, n1, false);
        let mut qkvo = Vec::with_capacity(4);
        for (name, scale) in [
            ("to_q", None),
            ("to_k", None),
            ("to_v", None),
            ("to_out.0", Some(&scale1[..])),
        ] {
            let wt = linear(ctx, store, &format!("{p}.attn.{name}"), [d, d], scale)?;
            qkvo.push(w(&mut b, wt));
        }
        let qkvo = <[ConvId; 4]>::try_from(qkvo)
            .map_err(|_| Error::Internal("attention projections".into()))?;
        x = b.tokens(TokenOp::Attention {
            x,
            normed,
            grid: z,
            rope,
            qkvo,
            heads: cfg.heads,
            extra,
            qk_norm: (ones, eps),
            half,
        });
        let n2 = gamma(&mut b, &format!("{p}.norm2.weight"), NormKind::Rms(eps))?;
        let normed = b.rms_norm(x, n2, false);
        let up = linear(
            ctx,
            store,
            &format!("{p}.ff.net.0.proj"),
            [2 * inner, d],
            None,
        )?;
        let up = w(&mut b, up);
        let h = b.conv_plain(normed, up, Geometry::Same);
        let g = b.tokens(TokenOp::Glu { x: h });
        let down = linear(
            ctx,
            store,
            &format!("{p}.ff.net.2"),
            [d, inner],
            Some(&scale2),
        )?;
        let down = w(&mut b, down);
        x = b.conv(
            crate::models::graph::Conv::new(g, down, Geometry::Same).residual(Residual::InPlace(x)),
        );
    }
    // norm_out's scale in the norm, its bias folded into proj_out's.
    let ln = gamma(&mut b, "decoder.norm_out.weight", NormKind::Layer(eps))?;
    let normed = b.rms_norm(x, ln, false);
    let pt = cfg.patch_size_t;
    let ps = cfg.patch_size;
    let co = cfg.out_channels * pt * ps * ps;
    let beta = store.take("decoder.norm_out.bias", &[d])?;
    let wo = store.take("decoder.proj_out.weight", &[co, d])?;
    let mut bo = store.take("decoder.proj_out.bias", &[co])?;
    for (row, bias) in wo.chunks(d.max(1)).zip(bo.iter_mut()) {
        *bias += row.iter().zip(&beta).map(|(a, b)| a * b).sum::<f32>();
    }
    let host = PytorchConv {
        weight: &wo,
        cout: co,
        cin: d,
        k: 1,
        bias: Some(&bo),
    };
    let proj_out = Conv2dWeights::upload(ctx, &host, None, store.dtype(), "decoder.proj_out")?;
    let proj_out = w(&mut b, proj_out);
    let y = b.conv_plain(normed, proj_out, Geometry::Same);
    let frames = b.tokens(TokenOp::Unpatchify {
        x: y,
        grid: z,
        channels: cfg.out_channels,
        ft: pt,
        f: ps,
    });
    let clip = cfg.clip();
    let out = b.tokens(TokenOp::Clip {
        x: frames,
        slot: 0,
        split: clip.t_up * clip.k,
        skip: clip.skip,
        fade: clip.fade(),
    });
    store.finish(&["encoder.", "quant_conv."])?;
    Ok(b.finish(out, None))
}

/// The register tokens `[R, d]`, one zero row when there are none (a
/// tensor is never empty; the kernel reads only `R` rows).
fn pad_rows(mut reg: Vec<f32>, d: usize) -> Vec<f32> {
    if reg.is_empty() {
        reg = vec![0.0; d];
    }
    reg
}

/// diffusers' `_split_tiles` of MiniMax-H3: `tile`-pixel tiles over
/// `length` pixels, the fewest that keep every overlap at least
/// `min_overlap`, the slack spread over the overlaps in steps of `ratio`
/// (so tiles start on latent pixels): each tile's start, then the overlap
/// with the next. One tile of `length` when it fits in one.
pub(crate) fn split_tiles(
    length: usize,
    tile: usize,
    min_overlap: usize,
    ratio: usize,
) -> (Vec<usize>, usize, Vec<usize>) {
    if tile >= length || min_overlap >= tile {
        return (vec![0], length, Vec::new());
    }
    let mut n = length.div_ceil(tile);
    while tile * n < min_overlap * (n - 1) + length {
        n += 1;
    }
    // Each overlap gets `min_overlap` and its round-robin share of the slack.
    let steps = (tile * n - min_overlap * (n - 1) - length) / ratio.max(1);
    let overlaps: Vec<usize> = (0..n - 1)
        .map(|i| min_overlap + ratio * (steps / (n - 1) + usize::from(i < steps % (n - 1))))
        .collect();
    let mut starts = vec![0];
    let mut at = 0;
    for o in &overlaps {
        at += tile - o;
        starts.push(at);
    }
    (starts, tile, overlaps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_split_tiles` worked through by hand: 720 and 1280 pixels in
    /// 256-pixel tiles overlapping by at least 64, steps of 16.
    #[test]
    fn tiles_split_as_diffusers() {
        assert_eq!(
            split_tiles(720, 256, 64, 16),
            (vec![0, 144, 304, 464], 256, vec![112, 96, 96])
        );
        assert_eq!(
            split_tiles(1280, 256, 64, 16),
            (
                vec![0, 160, 320, 496, 672, 848, 1024],
                256,
                vec![96, 96, 80, 80, 80, 80]
            )
        );
        assert_eq!(split_tiles(256, 256, 64, 16), (vec![0], 256, vec![]));
        assert_eq!(split_tiles(64, 256, 64, 16), (vec![0], 64, vec![]));
    }
}
