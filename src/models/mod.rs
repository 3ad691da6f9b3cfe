//! Models: configuration, weight files and the decoders.

#[doc(hidden)]
pub mod autoencoder_kl;
pub mod config;
pub(crate) mod diffusers_folder;
#[doc(hidden)]
pub mod encoder;
// Indices the graph issued itself (tensor, op and weight ids).
#[allow(clippy::indexing_slicing)]
pub(crate) mod graph;
#[doc(hidden)]
pub mod hunyuan_video15;
pub(crate) mod image_decoder;
pub mod layers;
pub mod ltx2;
pub mod minimax_h3;
pub mod qwen_image;
pub mod qwen_image21;
#[doc(hidden)]
pub mod tae;
pub mod taehv;
pub mod taehv_encoder;
pub(crate) mod token_graph;
pub mod vae;
pub mod vae_encoder;
pub(crate) mod video_info;
pub mod video_vae;
pub mod wan;
pub(crate) mod wan_config;
pub(crate) mod wan_layers;
pub(crate) mod wan_residual;
pub(crate) mod wan_weights;
#[doc(hidden)]
pub mod weights;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::tensor::DType;
#[doc(hidden)]
pub use autoencoder_kl::AutoencoderKl;
pub use config::AutoencoderKlConfig;
pub use layers::Taps;
pub use qwen_image::QwenImageDecoder;
pub use qwen_image21::QwenImage21Decoder;
#[doc(hidden)]
pub use tae::TaeDecoder;
pub use taehv::TaehvDecoder;
pub use taehv_encoder::TaehvEncoder;
pub use wan::{WanConfig, WanDecoder};
#[doc(hidden)]
pub use weights::{Layout, TaePart, WeightStore};

pub use image_decoder::{Decoder, ImageDecoder};
pub use vae::{ModelKind, Vae};

/// Options for [`Vae::load`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// A diffusers `config.json` for a weight file that has none beside it.
    pub config: Option<PathBuf>,
    /// Overrides of the latent scaling (AutoencoderKL only).
    pub scaling_factor: Option<f32>,
    /// Overrides the shift factor (AutoencoderKL only).
    pub shift_factor: Option<f32>,
    /// Seed of the random weights of `preset:NAME`.
    pub seed: u64,
    /// Storage dtype of weights and activations.
    pub precision: Precision,
}

/// Storage precision of a model's weights and activations (arithmetic,
/// GroupNorm statistics and softmax are f32 in all of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit floats everywhere (the reference).
    #[default]
    F32,
    /// IEEE half: WGSL `f16` where the device has `shader-f16`, else pairs
    /// packed in `u32` words. Half the memory of f32, 11 significant bits,
    /// finite only up to ±65504 (overflows are counted and redone in bf16).
    F16,
    /// bfloat16 (the high half of an f32, rounded to nearest even), always
    /// packed in `u32` pairs: half the memory, f32's range, 8 significant bits.
    BF16,
    /// The front doors' default (CLI, Python, ComfyUI). On a GPU: f16 for
    /// models known to stay in f16's range (the TAE family, the SD 1.x VAE),
    /// bf16 for the others (SDXL's VAE overflows f16; the SD3 and FLUX.1 VAEs
    /// are run upcast by diffusers). On a CPU adapter (lavapipe, llvmpipe,
    /// WARP): f32. See [`Precision::resolve`].
    Auto,
}

crate::named::named!(Precision, "dtype", {
    F32 => "f32",
    F16 => "f16",
    BF16 => "bf16",
    Auto => "auto",
});

impl Precision {
    /// The dtype for a model on a device: `f16_safe` says whether the
    /// model's activations are known to fit f16.
    ///
    /// On a GPU `Auto` is a memory choice: always a 16-bit type, f16 for
    /// f16-safe models and bf16 for the others, **also on devices without
    /// `shader-f16`**. There f16 is stored packed (`unpack2x16float` /
    /// `pack2x16float` on `u32` pairs): the same memory and the same
    /// conversion work per element as bf16 — which is packed on every device
    /// — with 3 more significant bits, so packed f16 beats bf16 for f16-safe
    /// models. On a CPU adapter `Auto` is f32: host memory is plentiful, the
    /// conversions only add work there, and it is what PyTorch (and ComfyUI)
    /// decode in on a CPU.
    #[doc(hidden)]
    pub fn resolve(self, f16_safe: bool, caps: &crate::gpu::Capabilities) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
            Precision::BF16 => DType::BF16,
            Precision::Auto if caps.is_cpu() => DType::F32,
            Precision::Auto if f16_safe => DType::F16,
            Precision::Auto => DType::BF16,
        }
    }

    /// True when f16 tensors use WGSL's `f16` type on this device (native
    /// half loads and stores); false when they are packed in `u32` pairs.
    #[doc(hidden)]
    pub fn native_f16(caps: &crate::gpu::Capabilities) -> bool {
        caps.shader_f16
    }
}

/// A model's bf16 copy, loaded again from the same file or preset the first
/// time an f16 run overflows.
pub(crate) struct Bf16Twin<T> {
    /// What was loaded (`None`: built from weights in memory, no twin).
    source: Option<(String, LoadOptions)>,
    twin: std::sync::OnceLock<Box<T>>,
}

impl<T> Default for Bf16Twin<T> {
    fn default() -> Self {
        Bf16Twin {
            source: None,
            twin: Default::default(),
        }
    }
}

impl<T> Bf16Twin<T> {
    /// Remembers where the model came from.
    pub(crate) fn loaded_from(&mut self, spec: &str, opts: &LoadOptions) {
        self.source = Some((spec.to_string(), opts.clone()));
    }

    /// The twin, loading it with `load(spec, bf16 options)` on first use.
    pub(crate) fn get(
        &self,
        what: &str,
        load: impl FnOnce(&str, &LoadOptions) -> Result<T>,
    ) -> Result<&T> {
        if let Some(t) = self.twin.get() {
            return Ok(t);
        }
        let (spec, opts) = self.source.as_ref().ok_or_else(|| {
            Error::Unsupported(format!("this {what} was not loaded from a file or preset"))
        })?;
        let opts = LoadOptions {
            precision: Precision::BF16,
            ..opts.clone()
        };
        let twin = Box::new(load(spec, &opts)?);
        Ok(self.twin.get_or_init(|| twin))
    }
}

/// Latents after `z / scale + shift` are all finite; else an error naming
/// the first bad value and the likely cause.
// Input-facing (issue #15): these read what files and flags hold.
pub(crate) fn check_unscaled(values: &[f32], scale: f32, shift: f32) -> Result<()> {
    match values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        None => Ok(()),
        Some((i, v)) => Err(Error::InvalidInput(format!(
            "latents overflow when unscaled (z / scaling_factor {scale} + shift_factor {shift}): value {v} at flat index {i}; check the scaling and shift factors (`LoadOptions::scaling_factor`, `LoadOptions::shift_factor`) or the latents' range (pipeline latents are roughly within ±10)"
        ))),
    }
}

pub(crate) fn next_vae_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn infer_config(store: &WeightStore, opts: &LoadOptions) -> Result<AutoencoderKlConfig> {
    // Every shape read here is rank-checked: the file decides them.
    let conv_in = store.conv_shape(
        "decoder.conv_in.weight",
        "no decoder.conv_in.weight: this file holds no AutoencoderKL decoder",
    )?;
    let mut rev = Vec::new();
    loop {
        let key = format!("decoder.up_blocks.{}.resnets.0.conv2.weight", rev.len());
        if !store.contains(&key) {
            break;
        }
        rev.push(store.conv_shape(&key, "")?[0]);
    }
    let mut layers = 0;
    while store.contains(&format!(
        "decoder.up_blocks.0.resnets.{}.conv1.weight",
        layers + 1
    )) {
        layers += 1;
    }
    let latent_channels = conv_in[1];
    // FLUX.2 (ComfyUI's / BFL's single file has no config): 32 latent
    // channels and the latent BatchNorm; a small decoder has its own widths.
    let flux2 = store.contains(weights::BN_MEAN) || store.contains(weights::BN_VAR);
    let mut enc = Vec::new();
    loop {
        let key = format!("encoder.down_blocks.{}.resnets.0.conv2.weight", enc.len());
        if !store.contains(&key) {
            break;
        }
        enc.push(store.conv_shape(&key, "")?[0]);
    }
    let has_pq = store.contains("post_quant_conv.weight");
    // Public SD/SDXL VAEs have 4 latent channels, FLUX.1/SD3 16; the scaling
    // factor cannot be read off the weights: the SD 1.x / FLUX.1 values are
    // the defaults, overridable (--scaling-factor, --shift-factor, --config).
    let (scaling, shift) = if flux2 {
        (1.0, None)
    } else if latent_channels == 16 {
        (0.3611, Some(0.1159))
    } else {
        (0.18215, None)
    };
    let dec: Vec<usize> = rev.into_iter().rev().collect();
    let (block_out_channels, decoder_block_out_channels) = if enc.len() == dec.len() && enc != dec {
        (enc, Some(dec))
    } else {
        (dec, None)
    };
    let cfg = AutoencoderKlConfig {
        block_out_channels,
        layers_per_block: layers,
        norm_num_groups: 32,
        latent_channels,
        out_channels: match store.contains("decoder.conv_out.weight") {
            true => store.conv_shape("decoder.conv_out.weight", "")?[0],
            false => 3,
        },
        scaling_factor: scaling,
        shift_factor: shift,
        use_post_quant_conv: has_pq,
        use_quant_conv: store.contains("quant_conv.weight"),
        mid_block_add_attention: store.contains("decoder.mid_block.attentions.0.to_q.weight"),
        decoder_block_out_channels,
        flux2: flux2.then_some(config::Flux2Latents::PUBLIC),
    };
    log::info!(
        "no config.json: inferred {:?} ×{} layers, {} latent channels, scaling {} shift {:?} (override with `LoadOptions::config` / `LoadOptions::scaling_factor` / `LoadOptions::shift_factor`)",
        cfg.block_out_channels,
        cfg.layers_per_block,
        latent_channels,
        scaling,
        shift
    );
    let _ = opts;
    Ok(cfg)
}

pub(crate) fn apply_overrides(cfg: &mut AutoencoderKlConfig, opts: &LoadOptions) -> Result<()> {
    if cfg.flux2.is_some() && (opts.scaling_factor.is_some() || opts.shift_factor.is_some()) {
        return Err(Error::InvalidInput(
            "FLUX.2 latents have no scaling or shift factor: its pipeline normalises them with the VAE's BatchNorm statistics (`bn.running_mean` / `bn.running_var`); drop `LoadOptions::scaling_factor` / `LoadOptions::shift_factor`".into(),
        ));
    }
    if let Some(s) = opts.scaling_factor {
        cfg.scaling_factor = s;
    }
    if let Some(s) = opts.shift_factor {
        cfg.shift_factor = Some(s);
    }
    Ok(())
}

/// The weight file and config.json (if any) behind a `--vae` path: a file
/// (config.json beside it), a diffusers folder or a pipeline folder with `vae/`.
/// `opts.config` overrides the config found.
pub(crate) fn locate_weights(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(PathBuf, Option<PathBuf>)> {
    if !path.exists() {
        return Err(Error::InvalidInput(format!(
            "the VAE `{}` is neither a file, a folder nor preset:NAME (presets: {})",
            path.display(),
            config::PRESETS.join(", ")
        )));
    }
    let (weights, config) = if path.is_dir() {
        find_weights_in(path)?
    } else {
        let beside = path.with_file_name("config.json");
        (path.to_path_buf(), beside.exists().then_some(beside))
    };
    Ok((weights, opts.config.clone().or(config)))
}

/// The AutoencoderKL config: from `config.json` when given, else inferred
/// from the weight shapes; then the scaling overrides of `opts`.
pub fn resolve_config(
    store: &WeightStore,
    config: Option<&Path>,
    opts: &LoadOptions,
) -> Result<AutoencoderKlConfig> {
    let mut cfg = match config {
        Some(c) => AutoencoderKlConfig::from_file(c)?,
        None => infer_config(store, opts)?,
    };
    apply_overrides(&mut cfg, opts)?;
    Ok(cfg)
}

fn find_weights_in(dir: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    let dir = if dir.join("vae").is_dir() {
        dir.join("vae")
    } else {
        dir.to_path_buf()
    };
    let config = dir.join("config.json");
    let preferred = dir.join("diffusion_pytorch_model.safetensors");
    let weights = if preferred.exists() {
        preferred
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        found.sort();
        found.into_iter().next().ok_or_else(|| Error::BadFile {
            path: dir.clone(),
            message: "no .safetensors weights in this folder (expected diffusion_pytorch_model.safetensors)".into(),
        })?
    };
    Ok((weights, config.exists().then_some(config)))
}

/// Runs `load` and measures the pool bytes it leaves allocated (its weights).
pub(crate) fn weights_loaded_by<T>(
    ctx: &Context,
    load: impl FnOnce() -> Result<T>,
) -> Result<(T, u64)> {
    let before = ctx.pool().stats().allocated_bytes.current;
    let loaded = load()?;
    let after = ctx.pool().stats().allocated_bytes.current;
    Ok((loaded, after.saturating_sub(before)))
}
