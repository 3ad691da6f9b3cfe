//! The HunyuanVideo 1.5 VAE decoder (diffusers `AutoencoderKLHunyuanVideo15`)
//! as a causal video graph (time as the batch, like Wan's).
//!
//! diffusers decodes the whole latent video in one pass, yet every layer is
//! causal: each 3×3×3 conv pads two frames in front by repeating the first
//! frame and one pixel around by repeating the edge (`pad_mode="replicate"`),
//! and the mid block's attention lets a frame's tokens see only frames up
//! to their own. So the graph streams: a conv's cache starts as copies of a
//! video's first frame, the attention keeps earlier frames' keys and values.
//!
//! Decoder: conv_in (plus `z` repeated along channels) → mid block (residual
//! block, block-causal attention, residual block) → up blocks (residual
//! blocks, then a conv to 8× or 4× channels rearranged to space (and time)
//! in the DCAE order, plus the input rearranged and repeated) → RMS norm →
//! SiLU → conv_out, not clamped. The first latent frame is up-sampled in
//! space only, so T latent frames give `1 + 4 (T − 1)` frames.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::kernels::dup_up::{Dcae, Order};
use crate::kernels::image::ImageRange;
use crate::models::diffusers_folder::{bad, ConfigFields, Configs};
use crate::models::graph::{CausalWeights, Graph, Op, Residual, TensorId};
use crate::models::wan_layers::{causal_from_host, load_pointwise, GraphBuilder};
use crate::models::weights::WeightStore;
use crate::tensor::DType;

/// diffusers' class name in `config.json`.
pub const CLASS_NAME: &str = "AutoencoderKLHunyuanVideo15";

/// The decoder's shape (diffusers `AutoencoderKLHunyuanVideo15` config fields).
#[derive(Clone, Debug, PartialEq)]
pub struct HunyuanVideo15Config {
    /// Latent channels.
    pub latent_channels: usize,
    /// Block widths in the encoder's order (the decoder runs them reversed).
    pub block_out_channels: Vec<usize>,
    /// Residual blocks per encoder block (the decoder has one more).
    pub layers_per_block: usize,
    /// Output pixels per latent pixel (a power of two).
    pub spatial_compression_ratio: usize,
    /// Output frames per latent frame after the first (a power of two).
    pub temporal_compression_ratio: usize,
    /// Up-samplers change the width to the next block's.
    pub upsample_match_channel: bool,
    /// Pipeline latents are `z · scaling_factor`.
    pub scaling_factor: f32,
}

impl HunyuanVideo15Config {
    /// The released HunyuanVideo 1.5 VAE: 32 latent channels, blocks
    /// [128, 256, 512, 1024, 1024], 2 layers per block, 16× spatial, 4×
    /// temporal, scaling factor 1.03682.
    pub fn public() -> Self {
        HunyuanVideo15Config {
            latent_channels: 32,
            block_out_channels: vec![128, 256, 512, 1024, 1024],
            layers_per_block: 2,
            spatial_compression_ratio: 16,
            temporal_compression_ratio: 4,
            upsample_match_channel: true,
            scaling_factor: 1.03682,
        }
    }

    /// A diffusers `config.json`, every field checked by name.
    pub fn from_file(path: &Path) -> Result<Self> {
        let f = ConfigFields::read(path, CLASS_NAME)?;
        let d = Self::public();
        let latent_channels = f.int("latent_channels", d.latent_channels, (1, 1024))?;
        let layers_per_block = f.int("layers_per_block", d.layers_per_block, (1, 16))?;
        let spatial = f.int("spatial_compression_ratio", 16, (1, 64))?;
        let temporal = f.int("temporal_compression_ratio", 4, (1, 16))?;
        let block_out_channels = f.ints("block_out_channels", &d.block_out_channels, (1, 8192))?;
        let upsample_match_channel = f.flag("upsample_match_channel", true)?;
        let scaling_factor = f.factor("scaling_factor", d.scaling_factor)?;
        let cfg = HunyuanVideo15Config {
            latent_channels,
            block_out_channels,
            layers_per_block,
            spatial_compression_ratio: spatial,
            temporal_compression_ratio: temporal,
            upsample_match_channel,
            scaling_factor,
        };
        cfg.check()
            .map_err(|m| bad(path, format!("config.json: {m}")))?;
        Ok(cfg)
    }

    /// The shape rules diffusers' decoder relies on, as a message.
    fn check(&self) -> std::result::Result<(), String> {
        let (s, t) = (
            self.spatial_compression_ratio,
            self.temporal_compression_ratio,
        );
        let blocks = self.block_out_channels.len();
        if !s.is_power_of_two() || !t.is_power_of_two() || t > s {
            return Err(format!("spatial_compression_ratio {s} and temporal_compression_ratio {t} must be powers of two, temporal at most spatial"));
        }
        if s.ilog2() as usize >= blocks.max(1) {
            return Err(format!("spatial_compression_ratio {s} needs more than log2({s}) = {} blocks; block_out_channels has {blocks}", s.ilog2()));
        }
        let top = self.block_out_channels.last().copied().unwrap_or(0);
        if top == 0 || !top.is_multiple_of(self.latent_channels) {
            return Err(format!(
                "the widest block ({top}) must be a multiple of latent_channels ({})",
                self.latent_channels
            ));
        }
        Ok(())
    }

    /// Output pixels per latent pixel.
    pub fn upscale(&self) -> usize {
        self.spatial_compression_ratio
    }
}

/// A HunyuanVideo 1.5 VAE decoder with its weights on the device.
pub struct HunyuanVideo15Decoder {
    config: HunyuanVideo15Config,
    name: String,
    graph: Graph,
}

/// Up to `limit` of `store`'s keys that hold HunyuanVideo 1.5's decoder.
fn has_decoder_keys(keys: &[String]) -> bool {
    keys.iter().any(|k| {
        k.starts_with("decoder.up_blocks.") && k.ends_with(".upsamplers.0.conv.conv.weight")
    })
}

/// True when `spec` names a HunyuanVideo 1.5 VAE: `preset:hunyuanvideo15`,
/// a diffusers folder whose config is `AutoencoderKLHunyuanVideo15`, or a
/// `.safetensors` file with its decoder keys.
pub fn is_hunyuan_video15(spec: &str) -> bool {
    if spec == "preset:hunyuanvideo15" {
        return true;
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return crate::models::diffusers_folder::is_class_folder(path, CLASS_NAME);
    }
    path.is_file()
        && crate::models::wan_weights::header_keys(path).is_some_and(|k| has_decoder_keys(&k))
}

impl HunyuanVideo15Decoder {
    /// Opens `spec`: `preset:hunyuanvideo15` (the released config, seeded
    /// random weights `seed`), a diffusers folder (`config.json` +
    /// `diffusion_pytorch_model.safetensors`) or a `.safetensors` file (a
    /// `config.json` beside it is read, else the released config is
    /// assumed). Weights are stored as `dtype`.
    pub fn open(ctx: &Context, spec: &str, dtype: DType, seed: u64) -> Result<Self> {
        let names = (CLASS_NAME, "hunyuanvideo15", "HunyuanVideo 1.5 VAE");
        let configs: Configs<HunyuanVideo15Config> = (
            HunyuanVideo15Config::public,
            HunyuanVideo15Config::from_file,
        );
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
    pub fn load(ctx: &Context, store: &WeightStore, config: HunyuanVideo15Config) -> Result<Self> {
        config.check().map_err(|m| Error::BadFile {
            path: PathBuf::from(store.origin()),
            message: m,
        })?;
        let graph = build(ctx, store, &config)?;
        Ok(HunyuanVideo15Decoder {
            config,
            name: String::from("HunyuanVideo 1.5 VAE"),
            graph,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &HunyuanVideo15Config {
        &self.config
    }

    /// Latent channels the decoder takes.
    pub fn latent_channels(&self) -> usize {
        self.config.latent_channels
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        self.config.upscale()
    }

    /// Output frames per latent frame after the first (which gives one).
    pub fn t_upscale(&self) -> usize {
        self.config.temporal_compression_ratio
    }

    /// What the video runner needs to know about it.
    pub(crate) fn video_info(&self) -> super::video_info::VideoInfo<'_> {
        super::video_info::VideoInfo {
            name: &self.name,
            latent_channels: self.latent_channels(),
            upscale: self.upscale(),
            t_upscale: self.t_upscale(),
            host_trim: 0,
            layout: crate::latents::VideoLayout::Ncthw,
            range: ImageRange::MinusOneToOne,
            cache_grows: true,
            whole_clip: false,
            min_side: 1,
            clip: None,
        }
    }

    /// Pipeline latents `[N, C, T, h, w]` → the raw z the decoder takes, in
    /// place: `z = latents / scaling_factor` (HunyuanVideo15Pipeline).
    pub fn unnormalize(&self, latents: &mut crate::io::HostTensor) -> Result<()> {
        let (c, s) = (self.config.latent_channels, self.config.scaling_factor);
        crate::latents::map_ncthw_channels(latents, "HunyuanVideo 1.5 VAE", c, |_, v| v / s)
    }

    /// The decoder's layers (one video, time as the batch dimension).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// Loads the causal conv `{prefix}.conv` `[cout, cin, 3, 3, 3]` with
/// replicate padding.
fn causal(
    g: &mut GraphBuilder<'_>,
    prefix: &str,
    [cout, cin]: [usize; 2],
) -> Result<CausalWeights> {
    let w = g
        .store
        .take(&format!("{prefix}.conv.weight"), &[cout, cin, 3, 3, 3])?;
    let b = g.store.take(&format!("{prefix}.conv.bias"), &[cout])?;
    let mut cw = causal_from_host(g.ctx, g.store, prefix, (&w, &b), [cout, cin, 3, 3])?;
    cw.replicate = true;
    cw.repeat_first = true;
    Ok(cw)
}

fn causal_conv(
    g: &mut GraphBuilder<'_>,
    x: TensorId,
    prefix: &str,
    dims: [usize; 2],
    residual: Residual,
) -> Result<TensorId> {
    let w = causal(g, prefix, dims)?;
    let w = g.b.causal_weights(w);
    let slot = g.next_slot();
    Ok(g.b.causal_conv(x, w, slot, residual))
}

fn resnet(
    g: &mut GraphBuilder<'_>,
    x: TensorId,
    prefix: &str,
    cin: usize,
    cout: usize,
) -> Result<TensorId> {
    let n1 = g.rms(x, &format!("{prefix}.norm1.gamma"), cin, false, true)?;
    let c1 = causal_conv(
        g,
        n1,
        &format!("{prefix}.conv1"),
        [cout, cin],
        Residual::None,
    )?;
    let n2 = g.rms(c1, &format!("{prefix}.norm2.gamma"), cout, false, true)?;
    let residual = if cin != cout {
        let sc = load_pointwise(
            g.ctx,
            g.store,
            &format!("{prefix}.conv_shortcut"),
            cout,
            cin,
            true,
        )?;
        Residual::Shortcut(x, g.b.weights(sc))
    } else {
        Residual::InPlace(x)
    };
    causal_conv(g, n2, &format!("{prefix}.conv2"), [cout, cout], residual)
}

/// The mid block's block-causal attention (separate to_q / to_k / to_v).
fn attention(g: &mut GraphBuilder<'_>, x: TensorId, prefix: &str, c: usize) -> Result<TensorId> {
    let normed = g.rms(x, &format!("{prefix}.norm.gamma"), c, false, false)?;
    let mut ids = Vec::new();
    for name in ["to_q", "to_k", "to_v", "proj_out"] {
        let w = load_pointwise(g.ctx, g.store, &format!("{prefix}.{name}"), c, c, true)?;
        ids.push(g.b.weights(w));
    }
    let [q, k, v, out] = ids[..] else {
        return Err(Error::Internal("attention projections".into()));
    };
    let slot = g.next_slot();
    Ok(g.b.frame_attention(Op::FrameAttention {
        x,
        normed,
        q,
        k,
        v,
        out,
        causal: Some(slot),
    }))
}

/// A 1×1 conv whose output channel `o` copies input channel `o / r`
/// (`repeat_interleave` along channels, exact: one product by 1).
fn repeat_channels(
    ctx: &Context,
    store: &WeightStore,
    cin: usize,
    r: usize,
) -> Result<Conv2dWeights> {
    let cout = cin * r;
    let mut w = vec![0.0; cout * cin];
    for o in 0..cout {
        if let Some(v) = w.get_mut(o * cin + o / r) {
            *v = 1.0;
        }
    }
    let host = PytorchConv {
        weight: &w,
        cout,
        cin,
        k: 1,
        bias: None,
    };
    Conv2dWeights::upload(ctx, &host, None, store.dtype(), "decoder.conv_in repeat")
}

fn build(ctx: &Context, store: &WeightStore, cfg: &HunyuanVideo15Config) -> Result<Graph> {
    let widths: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
    let first = widths.first().copied().unwrap_or(0);
    let zc = cfg.latent_channels;
    let (mut g, z) = GraphBuilder::new(ctx, store, false, false);
    // conv_in(z) + z repeated along channels.
    let rep = repeat_channels(ctx, store, zc, first / zc)?;
    let rep = g.b.weights(rep);
    let mut x = causal_conv(
        &mut g,
        z,
        "decoder.conv_in",
        [first, zc],
        Residual::Shortcut(z, rep),
    )?;
    x = resnet(&mut g, x, "decoder.mid_block.resnets.0", first, first)?;
    x = attention(&mut g, x, "decoder.mid_block.attentions.0", first)?;
    x = resnet(&mut g, x, "decoder.mid_block.resnets.1", first, first)?;
    let spatial_ups = cfg.spatial_compression_ratio.ilog2() as usize;
    let temporal_ups = cfg.temporal_compression_ratio.ilog2() as usize;
    let mut cin = first;
    for (i, &cout) in widths.iter().enumerate() {
        let p = format!("decoder.up_blocks.{i}");
        for j in 0..=cfg.layers_per_block {
            x = resnet(&mut g, x, &format!("{p}.resnets.{j}"), cin, cout)?;
            cin = cout;
        }
        if i >= spatial_ups && i >= temporal_ups {
            continue;
        }
        let up_out = match (cfg.upsample_match_channel, widths.get(i + 1)) {
            (true, Some(&next)) => next,
            _ => cout,
        };
        let time = i < temporal_ups;
        let (ft, factor) = if time { (2, 8) } else { (1, 4) };
        let repeats = factor * up_out / cout;
        if repeats == 0 || factor * up_out != repeats * cout || (time && repeats % 2 != 0) {
            return Err(Error::BadFile {
                path: PathBuf::from(store.origin()),
                message: format!("up block {i}: {factor}·{up_out} channels are not a whole (even, with time) multiple of {cout}: block_out_channels {:?}", cfg.block_out_channels),
            });
        }
        // The shortcut first (x is read again by the conv): the input
        // rearranged to space (and time) and repeated.
        let (mark_a, mark_b) = (g.next_slot(), g.next_slot());
        let marks = |m| time.then_some(m);
        let first_repeats = if time { repeats / 2 } else { repeats };
        let shortcut = Dcae {
            first: (up_out, first_repeats),
            next: (up_out, repeats),
        };
        let sc =
            g.b.channels_to_space(x, (up_out, ft), Order::Dcae(shortcut), marks(mark_a), None);
        let h = causal_conv(
            &mut g,
            x,
            &format!("{p}.upsamplers.0.conv"),
            [up_out * factor, cout],
            Residual::None,
        )?;
        // A first frame's conv output holds 2·C channels per sub-pixel and
        // keeps the first C.
        let conv_map = Dcae {
            first: (if time { 2 * up_out } else { up_out }, 1),
            next: (up_out, 1),
        };
        x = g.b.channels_to_space(
            h,
            (up_out, ft),
            Order::Dcae(conv_map),
            marks(mark_b),
            Some(sc),
        );
        cin = up_out;
    }
    x = g.rms(x, "decoder.norm_out.gamma", cin, false, true)?;
    x = causal_conv(&mut g, x, "decoder.conv_out", [3, cin], Residual::None)?;
    store.finish(&["encoder."])?;
    Ok(g.b.finish(x, None))
}
