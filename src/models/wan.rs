//! The Wan VAE decoders (diffusers `AutoencoderKLWan`; the original
//! `wan/modules/vae.py` / `vae2_2.py` keys as ComfyUI's
//! `wan_2.1_vae.safetensors` / `wan2.2_vae.safetensors`). Wan 2.2's
//! residual decoder (`is_residual`, `patch_size` 2) is built by
//! `models::wan_residual`; this file is Wan 2.1's.
//!
//! Decoder: post_quant_conv (1×1×1) → causal conv_in → mid block (residual
//! block, per-frame attention, residual block) → up blocks (residual blocks,
//! then `upsample3d` / `upsample2d`) → RMS norm → SiLU → causal conv_out,
//! clamped to [−1, 1] as the frames come back. Residual block: RMS norm →
//! SiLU → causal 3×3×3 conv → RMS norm → SiLU → causal 3×3×3 conv, plus the
//! input (through a 1×1×1 conv when the width changes).
//!
//! The graph runs one video with time as the batch dimension: each causal
//! conv sees the whole stream of its layer with two zero frames before it,
//! which is what diffusers' frame-by-frame `_decode` with its 2-frame
//! feature cache computes; `upsample3d` skips its time conv on a video's
//! first frame (the cache's `"Rep"` entry), so T latent frames give
//! `1 + 4 (T − 1)` frames.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::elementwise::Unary;
use crate::kernels::image::ImageRange;
use crate::models::diffusers_folder::bad;
use crate::models::graph::{Conv, Geometry, Graph, Residual};
use crate::models::wan_config::{is_wan_config, names_a_class};
pub use crate::models::wan_config::{
    WanConfig, WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, WAN22_LATENTS_MEAN, WAN22_LATENTS_STD,
};
use crate::models::wan_layers::{decoder_stages, load_causal, load_pointwise, GraphBuilder};
use crate::models::wan_weights::header_keys;
pub(crate) use crate::models::wan_weights::wan_store;
use crate::models::weights::WeightStore;
use crate::tensor::DType;

/// A Wan 2.1 or 2.2 VAE decoder with its weights on the device.
pub struct WanDecoder {
    /// The model's shape and latent statistics.
    pub(crate) config: WanConfig,
    /// Where the weights came from (for messages).
    pub(crate) name: String,
    /// Set when `latents_mean`/`latents_std` are not the config's own: which
    /// are used (also logged as a warning).
    pub(crate) latents_stats_note: Option<String>,
    graph: Graph,
    t_upscale: usize,
}

impl WanDecoder {
    /// True when `path` (a `.safetensors` file or a diffusers folder) holds
    /// a Wan VAE: its config says `AutoencoderKLWan` or its keys are Wan's.
    pub fn is_wan(path: &Path) -> bool {
        let dir_config = path.join("config.json");
        if path.is_dir() {
            // A config that names no class (`{}`) leaves it to the weights.
            return is_wan_config(&dir_config)
                || (!names_a_class(&dir_config)
                    && Self::is_wan(&path.join("diffusion_pytorch_model.safetensors")));
        }
        header_keys(path).is_some_and(|keys| {
            keys.iter().any(|k| {
                k.starts_with("decoder.middle.")
                    || (k.starts_with("decoder.mid_block.") && k.ends_with(".gamma"))
            })
        })
    }

    /// Opens `spec`: `preset:wan21` or `preset:wan22` (the public configs,
    /// seeded random weights `seed`), a
    /// diffusers folder (`config.json` + `diffusion_pytorch_model.safetensors`)
    /// or a `.safetensors` file (diffusers or original keys; a `config.json`
    /// beside it is read). Weights are stored as `dtype`.
    pub fn open(ctx: &Context, spec: &str, dtype: DType, seed: u64) -> Result<Self> {
        if let Some(name) = spec.strip_prefix("preset:") {
            let config = match name {
                "wan21" => WanConfig::wan21(),
                "wan22" => WanConfig::wan22(),
                _ => {
                    return Err(Error::InvalidInput(format!(
                        "unknown video preset `{name}` (Wan presets: wan21, wan22)"
                    )))
                }
            };
            let store = WeightStore::random_for(ctx, seed);
            store.set_dtype(dtype);
            let mut dec = Self::load(ctx, &store, config, true)?;
            dec.name = format!("{name} preset (random weights, seed {seed})");
            return Ok(dec);
        }
        let path = Path::new(spec);
        let (file, config) = if path.is_dir() {
            let file = path.join("diffusion_pytorch_model.safetensors");
            if !file.exists() {
                return Err(bad(
                    path,
                    "a diffusers AutoencoderKLWan folder holds `diffusion_pytorch_model.safetensors`; it is not there",
                ));
            }
            (file, Some(path.join("config.json")))
        } else {
            let beside = path.with_file_name("config.json");
            (path.to_path_buf(), beside.exists().then_some(beside))
        };
        let (store, has_post_quant) = wan_store(&file, dtype)?;
        // A config.json beside a single file may belong to another model
        // (a ComfyUI `models/vae/` folder): only a Wan one is used.
        let (config, note) = match config {
            Some(c) if is_wan_config(&c) => WanConfig::from_file_noting(&c)?,
            Some(c) => WanConfig::infer(
                &store,
                &format!(
                    "`{}` is not an AutoencoderKLWan config, so the shape is read off the weights and it gives no latent statistics",
                    c.display()
                ),
            )?,
            None => WanConfig::infer(
                &store,
                &format!("`{}` has no config.json beside it", file.display()),
            )?,
        };
        let mut dec = Self::load(ctx, &store, config, has_post_quant)?;
        dec.name = format!("{} ({})", dec.family(), file.display());
        dec.latents_stats_note = note;
        Ok(dec)
    }

    /// Builds the decoder of `config` from `store` (diffusers key names).
    pub fn load(
        ctx: &Context,
        store: &WeightStore,
        config: WanConfig,
        post_quant_conv: bool,
    ) -> Result<Self> {
        Self::load_graph(ctx, store, config, post_quant_conv, false)
    }

    /// The decoder of one frame alone (Qwen-Image): what the video graph
    /// computes on a video's first frame, as an image graph. Each causal
    /// conv is the 2-D conv of its current-frame tap (the frames before
    /// are the cache's zeros; the other taps are read and dropped),
    /// `upsample3d` skips its time conv, and the output maps to pixels in
    /// [−1, 1]: the batch is a batch of images, every image executor runs
    /// it, and the weights are a third of the video graph's.
    pub(crate) fn load_frame(
        ctx: &Context,
        store: &WeightStore,
        config: WanConfig,
        post_quant_conv: bool,
    ) -> Result<Self> {
        Self::load_graph(ctx, store, config, post_quant_conv, true)
    }

    fn load_graph(
        ctx: &Context,
        store: &WeightStore,
        config: WanConfig,
        post_quant_conv: bool,
        image: bool,
    ) -> Result<Self> {
        let cfg = &config;
        let origin = PathBuf::from(store.origin());
        let (dims, up_time) = decoder_stages(cfg, store, "a Wan")?;
        let stages = cfg.dim_mult.len();
        // Empty statistics: none known (raw latents only).
        let stats = |v: &[f32]| v.is_empty() || v.len() == cfg.z_dim;
        if !stats(&cfg.latents_mean) || !stats(&cfg.latents_std) {
            return Err(bad(
                &origin,
                format!(
                    "latents_mean/latents_std have {}/{} values for z_dim {}",
                    cfg.latents_mean.len(),
                    cfg.latents_std.len(),
                    cfg.z_dim
                ),
            ));
        }
        if cfg.is_residual || cfg.patch_size != 1 {
            return Self::load_residual(ctx, store, config, post_quant_conv, image);
        }
        let first = dims.first().copied().unwrap_or(0);
        let (mut g, z) = GraphBuilder::new(ctx, store, image, false);
        let zc = cfg.z_dim;
        let mut x = z;
        if post_quant_conv {
            let w = load_pointwise(ctx, store, "post_quant_conv", zc, zc, true)?;
            let w = g.b.weights(w);
            x = g.b.conv_plain(x, w, Geometry::Same);
        }
        x = g.conv_in_and_mid(x, zc, first)?;
        let mut t_upscale = 1;
        let mut width = first;
        for i in 0..stages {
            let (Some(&d_in), Some(&d_out)) = (dims.get(i), dims.get(i + 1)) else {
                return Err(Error::Internal("Wan stage widths".into()));
            };
            let mut cin = if i > 0 { d_in / 2 } else { d_in };
            if cin != width {
                return Err(Error::Internal(format!(
                    "Wan stage {i}: {width} channels in, {cin} expected"
                )));
            }
            for j in 0..=cfg.num_res_blocks {
                x = g.resblock(x, &format!("decoder.up_blocks.{i}.resnets.{j}"), cin, d_out)?;
                cin = d_out;
            }
            width = d_out;
            if i + 1 == stages {
                break;
            }
            let p = format!("decoder.up_blocks.{i}.upsamplers.0");
            let up = crate::models::layers::load_conv(
                ctx,
                store,
                &format!("{p}.resample.1"),
                d_out / 2,
                d_out,
                3,
                true,
            )?;
            let up = g.b.weights(up);
            let time = up_time.get(i).copied().unwrap_or(false);
            if time && image {
                // A first frame skips the time conv (diffusers' "Rep").
                let c = 2 * d_out;
                store.take(&format!("{p}.time_conv.weight"), &[c, d_out, 3, 1, 1])?;
                store.take(&format!("{p}.time_conv.bias"), &[c])?;
                x = g.b.conv(Conv::new(x, up, Geometry::Upsample));
            } else if time {
                let w = load_causal(
                    ctx,
                    store,
                    &format!("{p}.time_conv"),
                    [2 * d_out, d_out, 3, 1],
                )?;
                let w = g.b.causal_weights(w);
                let slot = g.next_slot();
                x = g.b.time_upsample(x, (w, slot), up, None);
                t_upscale *= 2;
            } else {
                x = g.b.conv(Conv::new(x, up, Geometry::Upsample));
            }
            width = d_out / 2;
        }
        x = g.rms(x, "decoder.norm_out.gamma", width, false, true)?;
        x = g.causal(x, "decoder.conv_out", [3, width, 3, 3], Residual::None)?;
        if !image {
            // diffusers' `AutoencoderKLWan.decode` clamps the frames; an image
            // graph's output maps to pixels, which clamps them anyway.
            x = g.b.map(x, Unary::Clamp { lo: -1.0, hi: 1.0 });
        }
        store.finish(&["encoder.", "quant_conv."])?;
        Ok(WanDecoder {
            config,
            name: String::from("Wan 2.1 VAE"),
            latents_stats_note: None,
            graph: g.b.finish(x, image.then_some(ImageRange::MinusOneToOne)),
            t_upscale,
        })
    }

    /// Wan 2.2's residual decoder (see [`crate::models::wan_residual`]).
    fn load_residual(
        ctx: &Context,
        store: &WeightStore,
        config: WanConfig,
        post_quant_conv: bool,
        image: bool,
    ) -> Result<Self> {
        let origin = PathBuf::from(store.origin());
        if !config.is_residual {
            return Err(bad(
                &origin,
                format!("patch_size {} without is_residual: no Wan VAE has that shape (Wan 2.2's is residual with patch_size 2)", config.patch_size),
            ));
        }
        if image || !post_quant_conv {
            return Err(Error::Unsupported(format!(
                "{}: a residual Wan decoder decodes video with its post_quant_conv (Qwen-Image 2.1's one-frame form is `AutoencoderKLQwenImage21`)",
                origin.display()
            )));
        }
        let (graph, t_upscale) =
            crate::models::wan_residual::residual_video_graph(ctx, store, &config)?;
        Ok(WanDecoder {
            config,
            name: String::from("Wan 2.2 VAE"),
            latents_stats_note: None,
            graph,
            t_upscale,
        })
    }

    /// "Wan 2.2 VAE" for the residual decoder, else "Wan 2.1 VAE".
    fn family(&self) -> &'static str {
        if self.config.is_residual {
            "Wan 2.2 VAE"
        } else {
            "Wan 2.1 VAE"
        }
    }

    /// The model's shape and latent statistics.
    pub fn config(&self) -> &WanConfig {
        &self.config
    }

    /// What the video runner needs to know about it.
    pub(crate) fn video_info(&self) -> super::video_info::VideoInfo<'_> {
        super::video_info::VideoInfo {
            name: &self.name,
            latent_channels: self.latent_channels(),
            upscale: self.upscale(),
            t_upscale: self.t_upscale,
            host_trim: 0,
            layout: crate::latents::VideoLayout::Ncthw,
            range: ImageRange::MinusOneToOne,
            cache_grows: false,
            whole_clip: false,
            min_side: 1,
            clip: None,
        }
    }

    /// Latent channels the decoder takes.
    pub fn latent_channels(&self) -> usize {
        self.config.z_dim
    }

    /// Output frames per latent frame after the first (which gives one).
    pub fn t_upscale(&self) -> usize {
        self.t_upscale
    }

    /// Output frames of `t` latent frames: `1 + t_upscale · (t − 1)`.
    pub fn frames_out(&self, t: usize) -> usize {
        if t == 0 {
            0
        } else {
            1usize.saturating_add(self.t_upscale.saturating_mul(t - 1))
        }
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        self.config.upscale()
    }

    /// Pipeline latents `[N, C, T, h, w]` → the raw z the decoder takes, in
    /// place: `z = latents · latents_std + latents_mean` per channel.
    pub fn unnormalize(&self, latents: &mut crate::io::HostTensor) -> Result<()> {
        let [_, c, t, h, w] = match latents.shape[..] {
            [n, c, t, h, w] => [n, c, t, h, w],
            _ => {
                return Err(Error::InvalidInput(format!(
                    "Wan latents are N×C×T×h×w, got shape {:?}",
                    latents.shape
                )))
            }
        };
        if c != self.config.z_dim {
            return Err(Error::InvalidInput(format!(
                "latents have {c} channels; this Wan VAE takes {} (Wan latents are N×C×T×h×w)",
                self.config.z_dim
            )));
        }
        if self.config.latents_mean.is_empty() || self.config.latents_std.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{}: its config gives no latents_mean/latents_std for z_dim {}, so pipeline latents cannot be un-normalised; add them to its config.json, or decode latents that are already raw (`DecodeOptions::raw_latents`)",
                self.name, self.config.z_dim
            )));
        }
        let plane = t * h * w;
        if plane == 0 {
            return Ok(());
        }
        for (i, chunk) in latents.data.chunks_mut(plane).enumerate() {
            let ch = i % c;
            let (Some(&s), Some(&m)) = (
                self.config.latents_std.get(ch),
                self.config.latents_mean.get(ch),
            ) else {
                continue;
            };
            chunk.iter_mut().for_each(|v| *v = *v * s + m);
        }
        Ok(())
    }

    /// The decoder's layers (one video, time as the batch dimension).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph, taken (a single-frame decoder's owner keeps only it).
    pub(crate) fn into_graph(self) -> Graph {
        self.graph
    }
}

/// True when `spec` names a Wan VAE (`preset:wan21`, a diffusers folder whose
/// config is `AutoencoderKLWan`, or a file with Wan keys).
pub fn is_wan_video(spec: &str) -> bool {
    // Qwen-Image (2.1) VAE files have Wan's keys but decode images.
    (matches!(spec, "preset:wan21" | "preset:wan22")
        || WanDecoder::is_wan(std::path::Path::new(spec)))
        && !crate::models::qwen_image::is_qwen_image(spec, None)
        && !crate::models::qwen_image21::is_qwen_image21(spec, None)
}
