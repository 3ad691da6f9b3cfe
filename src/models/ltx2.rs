//! The LTX-2 video VAE decoder (diffusers `AutoencoderKLLTX2Video`) as a
//! video graph (time as the batch).
//!
//! The released decoder is not causal (`decoder_causal: false`): each
//! 3×3×3 conv sees one frame on each side, the clip's first and last frames
//! repeated beyond its ends, and pads space by reflection. A frame's output
//! depends on frames after it, so the whole clip is one chunk (decoding a
//! clip's first latent frames alone changes their frames). A causal
//! decoder (`decoder_causal: true`, diffusers' class default) sees two
//! frames before each (the video's first repeated) and streams.
//!
//! Decoder: conv_in → mid block (residual blocks) → up blocks (a conv to
//! 8·C / f channels read as 2×2×2 sub-pixels, the clip's first frame
//! dropped, plus the input's own 2×2×2 sub-pixels tiled along channels;
//! then residual blocks) → per-pixel RMS norm → SiLU → conv_out to
//! 3·p² channels, unpatchified (p = 4), not clamped. Residual block:
//! RMS norm → SiLU → conv → RMS norm → SiLU → conv, plus the input. The
//! norms have no parameters. T latent frames give `1 + 8 (T − 1)` frames.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::dup_up::Order;
use crate::kernels::image::ImageRange;
use crate::models::diffusers_folder::{bad, ConfigFields, Configs};
use crate::models::graph::{CausalWeights, Graph, Residual, TensorId};
use crate::models::wan_layers::{causal_from_host, pixel_shuffle_order, GraphBuilder};
use crate::models::weights::WeightStore;
use crate::tensor::{DType, Tensor};

/// diffusers' class name in `config.json`.
pub const CLASS_NAME: &str = "AutoencoderKLLTX2Video";

/// The decoder's shape (diffusers `AutoencoderKLLTX2Video` config fields).
#[derive(Clone, Debug, PartialEq)]
pub struct Ltx2Config {
    /// Latent channels.
    pub latent_channels: usize,
    /// `decoder_block_out_channels` (encoder order; the decoder runs them
    /// reversed).
    pub block_out_channels: Vec<usize>,
    /// `decoder_layers_per_block`: the mid block's, then each up block's.
    pub layers_per_block: Vec<usize>,
    /// `upsample_factor` per up block (channel divisor of its up-sampler).
    pub upsample_factor: Vec<usize>,
    /// Output pixels per side packed in `conv_out`'s channels.
    pub patch_size: usize,
    /// Pipeline latents are `(z − mean) · scaling_factor / std`.
    pub scaling_factor: f32,
    /// `decoder_causal`: each conv sees two frames before it (the video's
    /// first repeated), not one on each side; the decoder then streams.
    pub causal: bool,
}

impl Ltx2Config {
    /// The released LTX-2 VAE decoder: 128 latent channels, blocks [256,
    /// 512, 1024], 5 layers per block, up-sample factors 2, patch size 4.
    pub fn public() -> Self {
        Ltx2Config {
            latent_channels: 128,
            block_out_channels: vec![256, 512, 1024],
            layers_per_block: vec![5, 5, 5, 5],
            upsample_factor: vec![2, 2, 2],
            patch_size: 4,
            scaling_factor: 1.0,
            causal: false,
        }
    }

    /// A diffusers `config.json`, every field this decoder uses checked by
    /// name; the variants it does not implement are refused by name.
    pub fn from_file(path: &Path) -> Result<Self> {
        let f = ConfigFields::read(path, CLASS_NAME)?;
        let d = Self::public();
        let flags = |k: &str| -> Vec<serde_json::Value> {
            match f.get(k) {
                Some(serde_json::Value::Array(a)) => a.clone(),
                Some(x) => vec![x.clone()],
                None => Vec::new(),
            }
        };
        let refuse = |what: String| -> Result<Self> {
            Err(Error::Unsupported(format!(
                "{}: {what}; the engine implements LTX-2 decoders with reflect padding and spatio-temporal residual up-samplers, causal or not, without timestep conditioning or noise injection",
                path.display()
            )))
        };
        let yes = serde_json::Value::Bool(true);
        if f.get("timestep_conditioning") == Some(&yes) {
            return refuse("timestep_conditioning is true".into());
        }
        if flags("decoder_inject_noise").contains(&yes) {
            return refuse("decoder_inject_noise is on".into());
        }
        if flags("decoder_spatio_temporal_scaling")
            .iter()
            .any(|f| f != &yes)
            || flags("upsample_residual").iter().any(|f| f != &yes)
        {
            return refuse("an up block without its spatio-temporal residual up-sampler".into());
        }
        if flags("upsample_type")
            .iter()
            .any(|t| t.as_str() != Some("spatiotemporal"))
        {
            return refuse(format!("upsample_type {:?}", flags("upsample_type")));
        }
        if let Some(m) = f
            .get("decoder_spatial_padding_mode")
            .filter(|m| m.as_str() != Some("reflect"))
        {
            return refuse(format!("decoder_spatial_padding_mode {m}"));
        }
        if f.int("patch_size_t", 1, (1, 8))? != 1 {
            return refuse("patch_size_t is not 1".into());
        }
        let cfg = Ltx2Config {
            latent_channels: f.int("latent_channels", d.latent_channels, (1, 4096))?,
            block_out_channels: f.ints(
                "decoder_block_out_channels",
                &d.block_out_channels,
                (1, 8192),
            )?,
            layers_per_block: f.ints("decoder_layers_per_block", &d.layers_per_block, (1, 32))?,
            upsample_factor: f.ints("upsample_factor", &d.upsample_factor, (1, 8))?,
            patch_size: f.int("patch_size", d.patch_size, (1, 8))?,
            scaling_factor: f.factor("scaling_factor", d.scaling_factor)?,
            // diffusers' class default is causal; the released config says false.
            causal: f.flag("decoder_causal", true)?,
        };
        cfg.check()
            .map_err(|m| bad(path, format!("config.json: {m}")))?;
        Ok(cfg)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let n = self.block_out_channels.len();
        if self.layers_per_block.len() != n + 1 || self.upsample_factor.len() != n {
            return Err(format!(
                "{n} decoder_block_out_channels need {} decoder_layers_per_block and {n} upsample_factor; got {:?} and {:?}",
                n + 1,
                self.layers_per_block,
                self.upsample_factor
            ));
        }
        Ok(())
    }

    /// Output pixels per latent pixel: 2 per up block, times the patch size.
    pub fn upscale(&self) -> usize {
        (1usize << self.block_out_channels.len().min(16)).saturating_mul(self.patch_size)
    }

    /// Output frames per latent frame after the first.
    pub fn t_upscale(&self) -> usize {
        1usize << self.block_out_channels.len().min(16)
    }
}

/// An LTX-2 video VAE decoder with its weights on the device.
pub struct Ltx2Decoder {
    config: Ltx2Config,
    name: String,
    /// Per-channel latent statistics (the safetensors' `latents_mean` /
    /// `latents_std` buffers; empty: none known).
    latents_mean: Vec<f32>,
    latents_std: Vec<f32>,
    graph: Graph,
}

/// True when `spec` names an LTX-2 video VAE: `preset:ltx2`, a diffusers
/// folder whose config is `AutoencoderKLLTX2Video`, or a `.safetensors`
/// file with its decoder keys.
pub fn is_ltx2(spec: &str) -> bool {
    if spec == "preset:ltx2" {
        return true;
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return crate::models::diffusers_folder::is_class_folder(path, CLASS_NAME);
    }
    path.is_file()
        && crate::models::wan_weights::header_keys(path).is_some_and(|keys| {
            keys.iter().any(|k| {
                k.starts_with("decoder.up_blocks.") && k.ends_with(".upsamplers.0.conv.conv.weight")
            }) && keys.iter().any(|k| {
                k == "latents_mean" || k.starts_with("decoder.mid_block.resnets.0.conv1.conv.")
            }) && !keys.iter().any(|k| k.ends_with(".norm1.gamma"))
        })
}

impl Ltx2Decoder {
    /// Opens `spec`: `preset:ltx2` (the released config, seeded random
    /// weights `seed`), a diffusers folder, or a `.safetensors` file (a
    /// `config.json` of this class beside it is read, else the released
    /// config is assumed). Weights are stored as `dtype`.
    pub fn open(ctx: &Context, spec: &str, dtype: DType, seed: u64) -> Result<Self> {
        let names = (CLASS_NAME, "ltx2", "LTX-2 VAE");
        let configs: Configs<Ltx2Config> = (Ltx2Config::public, Ltx2Config::from_file);
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
    pub fn load(ctx: &Context, store: &WeightStore, config: Ltx2Config) -> Result<Self> {
        config.check().map_err(|m| Error::BadFile {
            path: PathBuf::from(store.origin()),
            message: m,
        })?;
        let c = config.latent_channels;
        let stat = |k: &str| -> Result<Vec<f32>> {
            if store.contains(k) {
                store.take(k, &[c])
            } else {
                Ok(Vec::new())
            }
        };
        let (latents_mean, latents_std) = (stat("latents_mean")?, stat("latents_std")?);
        let graph = build(ctx, store, &config)?;
        Ok(Ltx2Decoder {
            config,
            name: String::from("LTX-2 VAE"),
            latents_mean,
            latents_std,
            graph,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &Ltx2Config {
        &self.config
    }

    /// Latent channels the decoder takes.
    pub fn latent_channels(&self) -> usize {
        self.config.latent_channels
    }

    /// What the video runner needs to know about it.
    pub(crate) fn video_info(&self) -> super::video_info::VideoInfo<'_> {
        super::video_info::VideoInfo {
            name: &self.name,
            latent_channels: self.latent_channels(),
            upscale: self.config.upscale(),
            t_upscale: self.config.t_upscale(),
            host_trim: 0,
            layout: crate::latents::VideoLayout::Ncthw,
            range: ImageRange::MinusOneToOne,
            cache_grows: false,
            whole_clip: !self.config.causal,
            min_side: 2,
            clip: None,
        }
    }

    /// Pipeline latents `[N, C, T, h, w]` → the raw z, in place: `z =
    /// latents · latents_std / scaling_factor + latents_mean`
    /// (`LTX2Pipeline._denormalize_latents`).
    pub fn unnormalize(&self, latents: &mut crate::io::HostTensor) -> Result<()> {
        let c = self.config.latent_channels;
        if self.latents_mean.len() != c || self.latents_std.len() != c {
            // The shape is still checked first: a wrong latent is the clearer message.
            crate::latents::map_ncthw_channels(latents, "LTX-2 VAE", c, |_, v| v)?;
            return Err(Error::InvalidInput(format!(
                "{}: its weights hold no latents_mean / latents_std, so pipeline latents cannot be un-normalised; decode raw latents (`DecodeOptions::raw_latents`, CLI --raw-latents)",
                self.name
            )));
        }
        let (mean, std, s) = (
            &self.latents_mean,
            &self.latents_std,
            self.config.scaling_factor,
        );
        crate::latents::map_ncthw_channels(latents, "LTX-2 VAE", c, |ch, v| {
            v * std.get(ch).copied().unwrap_or(1.0) / s + mean.get(ch).copied().unwrap_or(0.0)
        })
    }

    /// The decoder's layers (one whole clip, time as the batch dimension).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// Reflect padding in space and, in time, centred taps (the clip's ends
/// repeated) or, `causal`, two frames before (the video's first repeated).
fn time_padding(cw: &mut CausalWeights, causal: bool) {
    cw.reflect = true;
    cw.centered = !causal;
    cw.repeat_first = causal;
}

/// The conv `{prefix}.conv` `[cout, cin, 3, 3, 3]` (see [`time_padding`]).
fn conv(
    g: &mut GraphBuilder<'_>,
    prefix: &str,
    [cout, cin]: [usize; 2],
    causal: bool,
) -> Result<CausalWeights> {
    let w = g
        .store
        .take(&format!("{prefix}.conv.weight"), &[cout, cin, 3, 3, 3])?;
    let b = g.store.take(&format!("{prefix}.conv.bias"), &[cout])?;
    let mut cw = causal_from_host(g.ctx, g.store, prefix, (&w, &b), [cout, cin, 3, 3])?;
    time_padding(&mut cw, causal);
    Ok(cw)
}

fn time_conv(
    g: &mut GraphBuilder<'_>,
    x: TensorId,
    (prefix, dims, causal): (&str, [usize; 2], bool),
    residual: Residual,
) -> Result<TensorId> {
    let w = conv(g, prefix, dims, causal)?;
    let w = g.b.causal_weights(w);
    let slot = g.next_slot();
    Ok(g.b.causal_conv(x, w, slot, residual))
}

/// The parameter-free per-pixel RMS norm over `c` channels (SiLU after).
fn rms(g: &mut GraphBuilder<'_>, x: TensorId, c: usize) -> Result<TensorId> {
    let scale = (c as f32).sqrt();
    let t = Tensor::from_f32(g.ctx, &[c], &vec![scale; c], "PerChannelRMSNorm")?;
    let id = g.b.rms_gamma(t);
    Ok(g.b.rms_norm(x, id, true))
}

fn resnet(
    g: &mut GraphBuilder<'_>,
    x: TensorId,
    (prefix, c, causal): (&str, usize, bool),
) -> Result<TensorId> {
    for k in [
        "norm3.weight",
        "conv_shortcut.weight",
        "scale_shift_table",
        "per_channel_scale1",
    ] {
        if g.store.contains(&format!("{prefix}.{k}")) {
            return Err(Error::Unsupported(format!(
                "{}: `{prefix}.{k}`: residual blocks that change width, take timesteps or inject noise are not implemented",
                g.store.origin()
            )));
        }
    }
    let n1 = rms(g, x, c)?;
    let c1 = time_conv(
        g,
        n1,
        (&format!("{prefix}.conv1"), [c, c], causal),
        Residual::None,
    )?;
    let n2 = rms(g, c1, c)?;
    time_conv(
        g,
        n2,
        (&format!("{prefix}.conv2"), [c, c], causal),
        Residual::InPlace(x),
    )
}

fn build(ctx: &Context, store: &WeightStore, cfg: &Ltx2Config) -> Result<Graph> {
    let widths: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
    let factors: Vec<usize> = cfg.upsample_factor.iter().rev().copied().collect();
    let layers: Vec<usize> = cfg.layers_per_block.iter().rev().copied().collect();
    let bad_shape = |m: String| Error::BadFile {
        path: PathBuf::from(store.origin()),
        message: m,
    };
    let (mut g, z) = GraphBuilder::new(ctx, store, false, false);
    let mut c = widths.first().copied().unwrap_or(0);
    let causal = cfg.causal;
    let conv_in = ("decoder.conv_in", [c, cfg.latent_channels], causal);
    let mut x = time_conv(&mut g, z, conv_in, Residual::None)?;
    for j in 0..layers.first().copied().unwrap_or(0) {
        x = resnet(
            &mut g,
            x,
            (&format!("decoder.mid_block.resnets.{j}"), c, causal),
        )?;
    }
    for (i, (&width, &f)) in widths.iter().zip(&factors).enumerate() {
        let p = format!("decoder.up_blocks.{i}");
        let out = width / f.max(1);
        if f == 0 || c % 8 != 0 || c != out * f || (c * 8) % f != 0 {
            return Err(bad_shape(format!(
                "up block {i}: {c} channels do not up-sample by a factor {f} into {out} (decoder_block_out_channels {:?}, upsample_factor {:?})",
                cfg.block_out_channels, cfg.upsample_factor
            )));
        }
        // The input's own 2×2×2 sub-pixels, tiled along channels, then the
        // conv's; each drops the clip's first frame.
        let (mark_a, mark_b) = (g.next_slot(), g.next_slot());
        let sc =
            g.b.channels_to_space(x, (out, 2), Order::Tile(c / 8), Some(mark_a), None);
        let h = time_conv(
            &mut g,
            x,
            (&format!("{p}.upsamplers.0.conv"), [c * 8 / f, c], causal),
            Residual::None,
        )?;
        x =
            g.b.channels_to_space(h, (out, 2), Order::Interleave, Some(mark_b), Some(sc));
        c = out;
        for j in 0..layers.get(i + 1).copied().unwrap_or(0) {
            x = resnet(&mut g, x, (&format!("{p}.resnets.{j}"), c, causal))?;
        }
    }
    x = rms(&mut g, x, c)?;
    // conv_out, its channels from the unpatchify order (c, q_x, q_y) to a
    // pixel shuffle's (c, q_y, q_x).
    let p = cfg.patch_size;
    let co = 3 * p * p;
    let wt = store.take("decoder.conv_out.conv.weight", &[co, c, 3, 3, 3])?;
    let bias = store.take("decoder.conv_out.conv.bias", &[co])?;
    let (w, b) = pixel_shuffle_order(&wt, &bias, p);
    let mut cw = causal_from_host(ctx, store, "decoder.conv_out", (&w, &b), [co, c, 3, 3])?;
    time_padding(&mut cw, causal);
    let cw = g.b.causal_weights(cw);
    let slot = g.next_slot();
    x = g.b.causal_conv(x, cw, slot, Residual::None);
    if p > 1 {
        x = g.b.pixel_shuffle(x, p);
    }
    store.finish(&["encoder.", "latents_mean", "latents_std"])?;
    Ok(g.b.finish(x, None))
}
