//! The Qwen-Image VAE (diffusers `AutoencoderKLQwenImage`; ComfyUI's
//! `qwen_image_vae.safetensors` in the original Wan key layout), used by
//! Qwen-Image, Qwen-Image-Edit, Krea 2 and Nucleus-Image.
//!
//! It is the Wan 2.1 VAE decoding one frame: post_quant_conv, the causal
//! decoder on a single latent frame (its time caches all zeros, so each
//! causal 3×3×3 conv is the 2-D conv of its current-frame tap and
//! `upsample3d` skips its time conv), clamp to [−1, 1]. The graph is
//! `WanDecoder::load_frame`'s: an image graph whose batch is a batch of
//! images, run by every image executor (untiled, exact tiles, estimates).
//!
//! Latents: N×16×h×w, or N×16×1×h×w as the pipeline hands them to
//! `vae.decode` (one frame). Pipeline latents are normalised per channel:
//! `z = latents / (1 / latents_std) + latents_mean` (the pipeline's f32
//! operations), with the vectors of `config.json` — for a single file
//! without one, the released Qwen-Image vectors (= diffusers' defaults).

use std::path::Path;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::models::diffusers_folder::{bad, class_of, locate, vae_dir};
use crate::models::graph::Graph;
use crate::models::wan::WanDecoder;
use crate::models::wan_config::WanConfig;
use crate::models::wan_weights::wan_store;
use crate::models::weights::WeightStore;
use crate::tensor::DType;

/// The diffusers class name of the Qwen-Image VAE.
pub(crate) const CLASS_NAME: &str = "AutoencoderKLQwenImage";

/// The preset name (`preset:qwenimage`).
pub const PRESET: &str = "qwenimage";

/// The released Qwen-Image `latents_mean` (diffusers' default config; the
/// same values as Wan 2.1's).
pub(crate) const QWEN_IMAGE_LATENTS_MEAN: [f32; 16] = crate::models::wan_config::WAN21_LATENTS_MEAN;
/// The released Qwen-Image `latents_std`.
pub(crate) const QWEN_IMAGE_LATENTS_STD: [f32; 16] = crate::models::wan_config::WAN21_LATENTS_STD;

/// The public Qwen-Image VAE configuration: base_dim 96, z_dim 16, dim_mult
/// [1, 2, 4, 4], 2 residual blocks, temporal down-sampling [false, true,
/// true], the released latents_mean / latents_std.
pub(crate) fn qwen_image_config() -> WanConfig {
    WanConfig {
        latents_mean: QWEN_IMAGE_LATENTS_MEAN.to_vec(),
        latents_std: QWEN_IMAGE_LATENTS_STD.to_vec(),
        ..WanConfig::wan21()
    }
}

/// True when `path` is a diffusers config of an `AutoencoderKLQwenImage`.
pub(crate) fn is_qwen_image_config(path: &Path) -> bool {
    class_of(path).as_deref() == Some(CLASS_NAME)
}

/// True when `spec` names a Qwen-Image VAE: `preset:qwenimage`, a diffusers
/// folder (or pipeline folder with `vae/`) whose config is
/// `AutoencoderKLQwenImage`, or a `.safetensors` file with Wan 2.1 VAE keys
/// that has such a `config.json` beside it, or `config` (an explicit
/// config) is one, or whose file name says `qwen` (ComfyUI's
/// `qwen_image_vae.safetensors`: its keys are those of the Wan 2.1 VAE, so
/// only the name or a config tells them apart). Headers and configs only.
pub fn is_qwen_image(spec: &str, config: Option<&Path>) -> bool {
    if spec == format!("preset:{PRESET}") {
        return true;
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return is_qwen_image_config(&vae_dir(path).join("config.json"));
    }
    if !path.is_file() || !WanDecoder::is_wan(path) {
        return false;
    }
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.to_lowercase().contains("qwen"));
    named
        || config.is_some_and(is_qwen_image_config)
        || is_qwen_image_config(&path.with_file_name("config.json"))
}

/// A diffusers `config.json` of an `AutoencoderKLQwenImage`.
pub(crate) fn config_from_file(path: &Path) -> Result<WanConfig> {
    let text = crate::io::read_text_file(path)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(path, format!("config.json is not valid JSON: {e}")))?;
    match v.get("_class_name").and_then(|c| c.as_str()) {
        Some(CLASS_NAME) | None => {}
        Some(c) => {
            return Err(bad(
                path,
                format!(
                    "config.json is a `{c}`, not an `{CLASS_NAME}` (the Qwen-Image VAE); give the Qwen-Image VAE's config.json (`LoadOptions::config`) or none"
                ),
            ))
        }
    }
    #[derive(serde::Deserialize)]
    struct Fields {
        base_dim: Option<usize>,
        z_dim: Option<usize>,
        dim_mult: Option<Vec<usize>>,
        num_res_blocks: Option<usize>,
        temperal_downsample: Option<Vec<bool>>,
        latents_mean: Option<Vec<f32>>,
        latents_std: Option<Vec<f32>>,
    }
    let f: Fields = serde_json::from_value(v).map_err(|e| {
        bad(
            path,
            format!("config.json: {e} (expected integers base_dim, z_dim, num_res_blocks; lists dim_mult, temperal_downsample of booleans, latents_mean, latents_std of numbers)"),
        )
    })?;
    let d = qwen_image_config();
    Ok(WanConfig {
        base_dim: f.base_dim.unwrap_or(d.base_dim),
        z_dim: f.z_dim.unwrap_or(d.z_dim),
        dim_mult: f.dim_mult.unwrap_or(d.dim_mult),
        num_res_blocks: f.num_res_blocks.unwrap_or(d.num_res_blocks),
        temperal_downsample: f.temperal_downsample.unwrap_or(d.temperal_downsample),
        latents_mean: f.latents_mean.unwrap_or(d.latents_mean),
        latents_std: f.latents_std.unwrap_or(d.latents_std),
        ..d
    })
}

/// A Qwen-Image VAE decoder with its weights on the device.
pub struct QwenImageDecoder {
    /// The model's shape and latent statistics.
    pub config: WanConfig,
    /// Where the weights came from (for messages).
    pub name: String,
    /// Where `latents_mean` / `latents_std` came from.
    pub latent_stats: String,
    graph: Graph,
}

impl QwenImageDecoder {
    /// Opens `spec` (see [`is_qwen_image`]): `preset:qwenimage` (weights
    /// seeded by `seed`), a diffusers folder, or a `.safetensors` file
    /// (diffusers or original Wan keys) with `config` or a Qwen-Image
    /// `config.json` beside it, else the released configuration read off
    /// its shapes. Weights are stored as `dtype`.
    pub fn open(
        ctx: &Context,
        spec: &str,
        config: Option<&Path>,
        dtype: DType,
        seed: u64,
    ) -> Result<Self> {
        if let Some(name) = spec.strip_prefix("preset:") {
            if name != PRESET {
                return Err(Error::InvalidInput(format!(
                    "unknown Qwen-Image preset `{name}` (presets: {PRESET})"
                )));
            }
            let store = WeightStore::random_for(ctx, seed);
            store.set_dtype(dtype);
            let mut dec = Self::load(ctx, &store, qwen_image_config(), true)?;
            dec.name = format!("{PRESET} preset (random weights, seed {seed})");
            dec.latent_stats = "the released Qwen-Image latents_mean / latents_std".into();
            return Ok(dec);
        }
        let path = Path::new(spec);
        let (file, config) = locate(path, CLASS_NAME, config)?;
        let (store, has_post_quant) = wan_store(&file, dtype)?;
        let (cfg, stats) = match &config {
            Some(c) => (
                config_from_file(c)?,
                format!("latents_mean / latents_std of {}", c.display()),
            ),
            None => {
                // The released vectors replace whatever the shapes alone would give.
                let (mut cfg, _) = WanConfig::infer(&store, "a Qwen-Image single file")?;
                cfg.latents_mean = QWEN_IMAGE_LATENTS_MEAN.to_vec();
                cfg.latents_std = QWEN_IMAGE_LATENTS_STD.to_vec();
                let note = "no config.json: the released Qwen-Image latents_mean / latents_std (diffusers' defaults)".to_string();
                log::info!(
                    "{}: {note}; give the model's config.json (`LoadOptions::config`) if it has others",
                    file.display()
                );
                (cfg, note)
            }
        };
        let mut dec = Self::load(ctx, &store, cfg, has_post_quant)?;
        dec.name = format!("Qwen-Image VAE ({})", file.display());
        dec.latent_stats = stats;
        Ok(dec)
    }

    /// Builds the decoder of `config` from `store` (diffusers key names).
    pub fn load(
        ctx: &Context,
        store: &WeightStore,
        config: WanConfig,
        post_quant_conv: bool,
    ) -> Result<Self> {
        let wan = WanDecoder::load_frame(ctx, store, config, post_quant_conv)?;
        let config = wan.config.clone();
        Ok(QwenImageDecoder {
            config,
            name: String::from("Qwen-Image VAE"),
            latent_stats: String::from("config"),
            graph: wan.into_graph(),
        })
    }

    /// Latent channels the decoder takes.
    pub fn latent_channels(&self) -> usize {
        self.config.z_dim
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        1 << self.config.dim_mult.len().saturating_sub(1)
    }

    /// Resolution levels: the latent and one per 2× up-sample.
    pub fn levels(&self) -> usize {
        self.config.dim_mult.len().max(1)
    }

    /// Pipeline latents `[N, C, h, w]` → the z the decoder takes, in place:
    /// `z = latents / (1 / latents_std) + latents_mean` per channel (the
    /// pipeline's f32 operations).
    pub fn unnormalize(&self, latents: &mut HostTensor) -> Result<()> {
        let c = self.config.z_dim;
        let plane: usize = latents.shape.iter().skip(2).product();
        if latents.shape.get(1) != Some(&c) || plane == 0 {
            return Err(Error::InvalidInput(format!(
                "Qwen-Image latents are N×{c}×h×w; got shape {:?}",
                latents.shape
            )));
        }
        for (i, chunk) in latents.data.chunks_mut(plane).enumerate() {
            let ch = i % c;
            let (Some(&s), Some(&m)) = (
                self.config.latents_std.get(ch),
                self.config.latents_mean.get(ch),
            ) else {
                continue;
            };
            let inv = 1.0 / s;
            chunk.iter_mut().for_each(|v| *v = *v / inv + m);
        }
        match latents.data.iter().position(|v| !v.is_finite()) {
            None => Ok(()),
            Some(i) => Err(Error::InvalidInput(format!(
                "latents overflow when un-normalised (latents · latents_std + latents_mean): value {} at flat index {i}; pipeline latents are roughly within ±10 (raw z: `DecodeOptions::raw_latents`)",
                latents.data.get(i).copied().unwrap_or(f32::NAN)
            ))),
        }
    }

    /// Latents as the decoder takes them, checked: N×C×h×w, or one frame
    /// N×C×1×h×w (squeezed); C×h×w becomes 1×C×h×w.
    pub fn check_latents(&self, t: &mut HostTensor) -> std::result::Result<(), String> {
        let c = self.config.z_dim;
        if let [n, tc, frames, h, w] = t.shape[..] {
            if tc != c {
                let hint = match frames == c {
                    true => " (N×T×C×h×w, TAEHV's layout?)",
                    false => "",
                };
                return Err(format!(
                    "latents have shape {:?}{hint}: the Qwen-Image VAE takes N×{c}×1×h×w (one frame, as the pipeline hands it to the VAE) or N×{c}×h×w",
                    t.shape
                ));
            }
            if frames != 1 {
                return Err(format!(
                    "latents have shape {:?}: {frames} latent frames; the Qwen-Image VAE decodes images (one frame: N×{c}×1×h×w or N×{c}×h×w). A video of T latent frames decodes with the Wan 2.1 VAE as a video decoder (`wgvae decode --vae WAN_DIR --frames-out DIR`, `wgvae::decode_video`)",
                    t.shape
                ));
            }
            t.shape = vec![n, c, h, w];
        }
        crate::io::validate_latents(t, c)
    }

    /// The decoder's layers (an image graph).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}
