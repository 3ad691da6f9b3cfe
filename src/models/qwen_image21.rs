//! The Qwen-Image 2.1 VAE decoder (diffusers `AutoencoderKLQwenImage21`).
//!
//! A residual Wan network (Wan 2.2's `is_residual` decoder, see
//! `models/wan_residual.rs`) specialised to images: its causal convs
//! are stored as 2-D convs, 64 latent channels, five stages (16× spatial),
//! `decoder_base_dim` 144, `out_channels` 4 (RGBA). The graph decodes one
//! frame and clamps to [−1, 1] as diffusers does; it computes every output
//! channel (`out_channels`: RGBA, or RGB for a 3-channel config), so images
//! keep the alpha the pipeline's `postprocess` returns (PIL RGBA).
//! The released width's mid-block attention (one head of 1152 channels)
//! runs the attention kernel's wide-head variant (output chunks of 512:
//! `kernels::attention`).
//!
//! Latents: N×64×h×w, or N×64×1×h×w as the pipeline hands them to
//! `vae.decode`. Pipeline latents: `z = latents · latents_std +
//! latents_mean` per channel (`QwenImage21Pipeline`, f32). Packed tokens
//! N×(h·w)×64, one per latent position, row-major (`_unpack_latents`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::models::diffusers_folder::{bad, class_of, locate, vae_dir};
use crate::models::graph::Graph;
use crate::models::wan::{wan_store, WanConfig};
use crate::models::wan_residual::{residual_frame_graph, ResidualOutput};
use crate::models::weights::WeightStore;
use crate::tensor::DType;

/// The diffusers class name of the Qwen-Image 2.1 VAE.
pub const CLASS_NAME: &str = "AutoencoderKLQwenImage21";

/// The preset name (`preset:qwenimage21`).
pub const PRESET: &str = "qwenimage21";

/// The released Qwen-Image 2.1 `latents_mean` (diffusers' default config).
// −0.5236 is a released statistic, not −π/6.
#[allow(clippy::approx_constant)]
pub const QWEN_IMAGE21_LATENTS_MEAN: [f32; 64] = [
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.651,
    0.2732, 0.7562, -0.6163, -1.0277, 3.8363, 2.021, 0.0472, 0.932, 2.0087, 2.4954, -0.1391,
    -1.4249, 1.8464, -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342,
    -1.0265, -0.7636, 3.0555, 0.0746, -3.0751, -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.368,
    0.4809, -0.4433, 0.3764, 0.5729, -2.0595, 1.096, -1.326, -2.0211, -5.0179, 0.5275, 4.0162,
    1.8505, 0.3026, 1.9373, 1.4937, 0.2632, 0.5547, -1.7121, -0.1562, 0.0304,
];
/// The released Qwen-Image 2.1 `latents_std`.
pub const QWEN_IMAGE21_LATENTS_STD: [f32; 64] = [
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.791, 3.0785, 3.65, 3.9308, 3.0904,
    2.8778, 3.7675, 3.732, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489,
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.283, 3.5694, 4.2467, 3.9037, 3.2947, 5.077, 3.5075,
    3.27, 3.4767, 2.8063, 5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875,
    3.9624, 4.0168, 3.5643, 4.055, 5.5614, 4.2963, 4.408, 3.4959, 3.8747, 3.7608, 3.5735, 3.149,
    3.7662, 3.6746, 3.4563, 3.8161,
];

/// A Qwen-Image 2.1 VAE's decoder configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenImage21Config {
    /// The network (`base_dim` here is the decoder's: `decoder_base_dim`).
    pub wan: WanConfig,
    /// `conv_out`'s channels, the image's: 4 (RGBA) or 3 (RGB).
    pub out_channels: usize,
}

impl QwenImage21Config {
    /// The public configuration: decoder_base_dim 144, z_dim 64, dim_mult
    /// [1, 2, 4, 8, 8], 2 residual blocks, temperal_downsample [false,
    /// true, true, true], out_channels 4, the released latent statistics.
    pub fn public() -> Self {
        QwenImage21Config {
            wan: WanConfig {
                base_dim: 144,
                z_dim: 64,
                dim_mult: vec![1, 2, 4, 8, 8],
                num_res_blocks: 2,
                temperal_downsample: vec![false, true, true, true],
                latents_mean: QWEN_IMAGE21_LATENTS_MEAN.to_vec(),
                latents_std: QWEN_IMAGE21_LATENTS_STD.to_vec(),
                is_residual: true,
                patch_size: 1,
            },
            out_channels: 4,
        }
    }

    /// A diffusers `config.json` of an `AutoencoderKLQwenImage21` (missing
    /// fields take diffusers' defaults).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_text_file(path)?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| bad(path, format!("config.json is not valid JSON: {e}")))?;
        match v.get("_class_name").and_then(|c| c.as_str()) {
            Some(CLASS_NAME) | None => {}
            Some(c) => {
                return Err(bad(
                    path,
                    format!("config.json is a `{c}`, not an `{CLASS_NAME}` (the Qwen-Image 2.1 VAE); give its config.json (`LoadOptions::config`) or none"),
                ))
            }
        }
        #[derive(serde::Deserialize)]
        struct Fields {
            base_dim: Option<usize>,
            decoder_base_dim: Option<Option<usize>>,
            z_dim: Option<usize>,
            dim_mult: Option<Vec<usize>>,
            num_res_blocks: Option<usize>,
            temperal_downsample: Option<Vec<bool>>,
            latents_mean: Option<Vec<f32>>,
            latents_std: Option<Vec<f32>>,
            is_residual: Option<bool>,
            out_channels: Option<usize>,
            patch_size: Option<Option<usize>>,
        }
        let f: Fields = serde_json::from_value(v).map_err(|e| {
            bad(path, format!("config.json: {e} (expected integers base_dim, decoder_base_dim, z_dim, num_res_blocks, out_channels; lists dim_mult, temperal_downsample of booleans, latents_mean, latents_std of numbers)"))
        })?;
        if f.is_residual == Some(false) {
            return Err(bad(path, "is_residual: false (the Wan 2.1-style decoder) is not supported for AutoencoderKLQwenImage21; the released model is residual"));
        }
        if let Some(Some(p)) = f.patch_size.filter(|p| !matches!(p, None | Some(1))) {
            return Err(bad(
                path,
                format!(
                    "patch_size {p} is not supported (the released Qwen-Image 2.1 VAE has none)"
                ),
            ));
        }
        let d = Self::public();
        let base = f.base_dim.unwrap_or(96);
        let z_dim = f.z_dim.unwrap_or(d.wan.z_dim);
        let stats = |v: Option<Vec<f32>>, default: Vec<f32>| match v {
            Some(v) => v,
            // diffusers' defaults are the released 64-channel vectors.
            None if z_dim == default.len() => default,
            None => Vec::new(),
        };
        Ok(QwenImage21Config {
            wan: WanConfig {
                base_dim: f.decoder_base_dim.unwrap_or(Some(144)).unwrap_or(base),
                z_dim,
                dim_mult: f.dim_mult.unwrap_or(d.wan.dim_mult),
                num_res_blocks: f.num_res_blocks.unwrap_or(d.wan.num_res_blocks),
                temperal_downsample: f.temperal_downsample.unwrap_or(d.wan.temperal_downsample),
                latents_mean: stats(f.latents_mean, d.wan.latents_mean),
                latents_std: stats(f.latents_std, d.wan.latents_std),
                is_residual: true,
                patch_size: 1,
            },
            out_channels: check_out_channels(f.out_channels.unwrap_or(d.out_channels))
                .map_err(|m| bad(path, m))?,
        })
    }
}

/// `out_channels` the decoder's images can have (RGB or RGBA), or why not.
fn check_out_channels(c: usize) -> std::result::Result<usize, String> {
    match crate::kernels::image::IMAGE_CHANNELS.contains(&c) {
        true => Ok(c),
        false => Err(format!(
            "out_channels {c} is not an image: config.json must give 3 (RGB) or 4 (RGBA, the released model)"
        )),
    }
}

/// True when `path` is a diffusers config of an `AutoencoderKLQwenImage21`.
pub fn is_qwen_image21_config(path: &Path) -> bool {
    class_of(path).as_deref() == Some(CLASS_NAME)
}

/// True when a `.safetensors` file holds diffusers Qwen-Image 2.1 decoder
/// keys: Wan's names with 2-D causal convs (`decoder.conv_in.weight` of
/// rank 4) and the residual blocks' `upsampler` (Wan 2.1's is
/// `upsamplers.0`). Header only.
fn has_qwen_image21_keys(path: &Path) -> bool {
    let Some(h) = crate::models::weights::safetensors_header(path) else {
        return false;
    };
    let rank = |k: &str| {
        h.get(k)
            .and_then(|t| t.get("shape"))
            .and_then(|s| s.as_array())
            .map(|a| a.len())
    };
    let upsampler = h
        .as_object()
        .is_some_and(|o| o.keys().any(|k| k.contains(".upsampler.resample.")));
    rank("decoder.conv_in.weight") == Some(4) && upsampler
}

/// True when `spec` names a Qwen-Image 2.1 VAE: `preset:qwenimage21`, a
/// diffusers folder (or pipeline folder with `vae/`) whose config is
/// `AutoencoderKLQwenImage21`, `config` (an explicit config) is one, or a
/// `.safetensors` file with its keys (see above). Headers and configs only.
pub fn is_qwen_image21(spec: &str, config: Option<&Path>) -> bool {
    if spec == format!("preset:{PRESET}") {
        return true;
    }
    let path = Path::new(spec);
    if path.is_dir() {
        return is_qwen_image21_config(&vae_dir(path).join("config.json"));
    }
    path.is_file()
        && (config.is_some_and(is_qwen_image21_config)
            || is_qwen_image21_config(&path.with_file_name("config.json"))
            || has_qwen_image21_keys(path))
}

/// A Qwen-Image 2.1 VAE decoder with its weights on the device.
pub struct QwenImage21Decoder {
    /// The model's shape and latent statistics.
    pub config: QwenImage21Config,
    /// Where the weights came from (for messages).
    pub name: String,
    /// Where `latents_mean` / `latents_std` came from.
    pub latent_stats: String,
    graph: Graph,
}

impl QwenImage21Decoder {
    /// Opens `spec` (see [`is_qwen_image21`]): `preset:qwenimage21`
    /// (weights seeded by `seed`; the public config, or `config`'s shape), a diffusers folder, or a `.safetensors`
    /// file with `config`, a Qwen-Image 2.1 `config.json` beside it, or the
    /// public configuration. Weights are stored as `dtype`.
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
                    "unknown Qwen-Image 2.1 preset `{name}` (presets: {PRESET})"
                )));
            }
            let store = WeightStore::random_for(ctx, seed);
            store.set_dtype(dtype);
            // With a config: random weights of its shape (tests, studies).
            let cfg = match config {
                Some(c) => QwenImage21Config::from_file(c)?,
                None => QwenImage21Config::public(),
            };
            let mut dec = Self::load(ctx, &store, cfg)?;
            dec.name = format!("{PRESET} preset (random weights, seed {seed})");
            dec.latent_stats = "the released Qwen-Image 2.1 latents_mean / latents_std".into();
            return Ok(dec);
        }
        let path = Path::new(spec);
        let (file, config) = locate(path, CLASS_NAME, config)?;
        let (store, _) = wan_store(&file, dtype)?;
        let (cfg, stats) = match &config {
            Some(c) => (
                QwenImage21Config::from_file(c)?,
                format!("latents_mean / latents_std of {}", c.display()),
            ),
            None => {
                let note = "no config.json: the public Qwen-Image 2.1 configuration and latents_mean / latents_std (diffusers' defaults)".to_string();
                log::info!(
                    "{}: {note}; give the model's config.json (`LoadOptions::config`) if it has others",
                    file.display()
                );
                (QwenImage21Config::public(), note)
            }
        };
        let mut dec = Self::load(ctx, &store, cfg)?;
        dec.name = format!("Qwen-Image 2.1 VAE ({})", file.display());
        dec.latent_stats = stats;
        Ok(dec)
    }

    /// Builds the decoder of `config` from `store` (diffusers key names).
    pub fn load(ctx: &Context, store: &WeightStore, config: QwenImage21Config) -> Result<Self> {
        let c = &config.wan;
        let stats = |v: &[f32]| v.is_empty() || v.len() == c.z_dim;
        if !stats(&c.latents_mean) || !stats(&c.latents_std) {
            return Err(bad(
                Path::new(store.origin()),
                format!(
                    "latents_mean/latents_std have {}/{} values for z_dim {}",
                    c.latents_mean.len(),
                    c.latents_std.len(),
                    c.z_dim
                ),
            ));
        }
        check_out_channels(config.out_channels).map_err(|m| bad(Path::new(store.origin()), m))?;
        let output = ResidualOutput {
            out_channels: config.out_channels,
            kept: config.out_channels,
        };
        let graph = residual_frame_graph(ctx, store, c, true, output)?;
        Ok(QwenImage21Decoder {
            config,
            name: String::from("Qwen-Image 2.1 VAE"),
            latent_stats: String::from("config"),
            graph,
        })
    }

    /// Channels of the decoded images: 4 (RGBA) or 3 (RGB).
    pub fn image_channels(&self) -> usize {
        self.config.out_channels
    }

    /// Latent channels the decoder takes.
    pub fn latent_channels(&self) -> usize {
        self.config.wan.z_dim
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        1 << self.config.wan.dim_mult.len().saturating_sub(1)
    }

    /// Resolution levels: the latent and one per 2× up-sample.
    pub fn levels(&self) -> usize {
        self.config.wan.dim_mult.len().max(1)
    }

    /// Pipeline latents `[N, C, h, w]` → the z the decoder takes, in place:
    /// `z = latents · latents_std + latents_mean` per channel (the
    /// pipeline's f32 operations).
    pub fn unnormalize(&self, latents: &mut HostTensor) -> Result<()> {
        let c = self.config.wan.z_dim;
        let plane: usize = latents.shape.iter().skip(2).product();
        if latents.shape.get(1) != Some(&c) || plane == 0 {
            return Err(Error::InvalidInput(format!(
                "Qwen-Image 2.1 latents are N×{c}×h×w; got shape {:?}",
                latents.shape
            )));
        }
        let (mean, std) = (&self.config.wan.latents_mean, &self.config.wan.latents_std);
        if mean.is_empty() || std.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{}: its config gives no latents_mean/latents_std for z_dim {c}, so pipeline latents cannot be un-normalised; add them to its config.json, or decode raw latents (`DecodeOptions::raw_latents`)",
                self.name
            )));
        }
        for (i, chunk) in latents.data.chunks_mut(plane).enumerate() {
            let ch = i % c;
            let (Some(&s), Some(&m)) = (std.get(ch), mean.get(ch)) else {
                continue;
            };
            chunk.iter_mut().for_each(|v| *v = *v * s + m);
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
        let c = self.config.wan.z_dim;
        if let [n, tc, frames, h, w] = t.shape[..] {
            if tc != c || frames != 1 {
                return Err(format!(
                    "latents have shape {:?}: the Qwen-Image 2.1 VAE decodes one frame, N×{c}×1×h×w (as the pipeline hands it to the VAE) or N×{c}×h×w",
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
