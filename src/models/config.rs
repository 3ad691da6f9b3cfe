//! AutoencoderKL configuration: diffusers `config.json` and the public presets.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The fields of a diffusers AutoencoderKL `config.json` the decoder needs.
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
pub struct AutoencoderKlConfig {
    /// Channels per resolution level, highest resolution first (diffusers order).
    pub block_out_channels: Vec<usize>,
    #[serde(default = "default_layers")]
    /// ResNet blocks per down block (the decoder's up blocks have one more).
    pub layers_per_block: usize,
    #[serde(default = "default_groups")]
    /// GroupNorm groups.
    pub norm_num_groups: usize,
    #[serde(default = "default_latent")]
    /// Latent channels.
    pub latent_channels: usize,
    #[serde(default = "default_out")]
    /// Image channels.
    pub out_channels: usize,
    #[serde(default = "default_scaling")]
    /// Pipeline latents are `(z − shift) · scaling_factor`.
    pub scaling_factor: f32,
    /// `null` in SD configs means 0.
    #[serde(default)]
    pub shift_factor: Option<f32>,
    #[serde(default = "yes")]
    /// A 1×1 `post_quant_conv` before the decoder.
    pub use_post_quant_conv: bool,
    #[serde(default = "yes")]
    /// A 1×1 `quant_conv` after the encoder.
    pub use_quant_conv: bool,
    #[serde(default = "yes")]
    /// Self-attention in the mid-blocks.
    pub mid_block_add_attention: bool,
    /// The decoder's widths where they differ from the encoder's
    /// (`block_out_channels`): FLUX.2's small decoder, `[96, 192, 384, 384]`.
    #[serde(default)]
    pub decoder_block_out_channels: Option<Vec<usize>>,
    /// The latent normalisation of FLUX.2 (`AutoencoderKLFlux2`): pipeline
    /// latents are 2×2-patchified z normalised by a BatchNorm's running
    /// statistics (`bn.running_mean` / `bn.running_var` in the weights).
    /// `None` for the other AutoencoderKLs (scaling and shift factors).
    #[serde(default, skip_deserializing)]
    pub flux2: Option<Flux2Latents>,
}

/// FLUX.2's latent normalisation: `batch_norm_eps` and `patch_size` of its
/// `config.json` (only (2, 2) exists).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, serde::Serialize)]
pub struct Flux2Latents {
    /// The BatchNorm's eps: `z = unpatchify(latents · sqrt(var + eps) + mean)`.
    pub batch_norm_eps: f32,
}

impl Flux2Latents {
    /// The public FLUX.2 VAE's value.
    pub const PUBLIC: Flux2Latents = Flux2Latents {
        batch_norm_eps: 1e-4,
    };
}

/// The `config.json` fields that make an AutoencoderKL a FLUX.2 VAE.
#[derive(Deserialize)]
struct Flux2Fields {
    #[serde(default, rename = "_class_name")]
    class_name: Option<String>,
    #[serde(default)]
    batch_norm_eps: Option<f32>,
    #[serde(default)]
    patch_size: Option<serde_json::Value>,
    #[serde(default)]
    scaling_factor: Option<f32>,
    #[serde(default)]
    shift_factor: Option<f32>,
}

fn default_layers() -> usize {
    1
}
fn default_groups() -> usize {
    32
}
fn default_latent() -> usize {
    4
}
fn default_out() -> usize {
    3
}
fn default_scaling() -> f32 {
    0.18215
}
fn yes() -> bool {
    true
}

/// Names accepted by [`AutoencoderKlConfig::preset`].
pub const PRESETS: &[&str] = &["sd15", "sdxl", "sd3", "flux1", "flux2", "flux2-small"];

impl AutoencoderKlConfig {
    /// True for the SD 1.x VAE (scaling factor 0.18215, 4 latent channels),
    /// whose activations stay within f16's range; SDXL's overflows f16 and the
    /// 16-channel VAEs are run upcast by diffusers.
    pub(crate) fn is_f16_safe(&self) -> bool {
        self.latent_channels == 4 && (self.scaling_factor - 0.18215).abs() < 1e-6
    }

    /// The public configurations of the SD 1.x, SDXL, SD3 and FLUX.1 VAEs.
    pub fn preset(name: &str) -> Result<Self> {
        let base = AutoencoderKlConfig {
            block_out_channels: vec![128, 256, 512, 512],
            layers_per_block: 2,
            norm_num_groups: 32,
            latent_channels: 4,
            out_channels: 3,
            scaling_factor: 0.18215,
            shift_factor: None,
            use_post_quant_conv: true,
            use_quant_conv: true,
            mid_block_add_attention: true,
            decoder_block_out_channels: None,
            flux2: None,
        };
        Ok(match name.to_lowercase().as_str() {
            "sd15" | "sd1" | "sd1.5" | "sd" => base,
            "sdxl" => AutoencoderKlConfig {
                scaling_factor: 0.13025,
                ..base
            },
            "sd3" => AutoencoderKlConfig {
                latent_channels: 16,
                scaling_factor: 1.5305,
                shift_factor: Some(0.0609),
                use_post_quant_conv: false,
                use_quant_conv: false,
                ..base
            },
            "flux1" | "flux" => AutoencoderKlConfig {
                latent_channels: 16,
                scaling_factor: 0.3611,
                shift_factor: Some(0.1159),
                use_post_quant_conv: false,
                use_quant_conv: false,
                ..base
            },
            // The public FLUX.2 VAE (black-forest-labs/FLUX.2-dev `vae/config.json`):
            // 32 latent channels, BatchNorm-normalised 2×2-patchified pipeline latents.
            "flux2" => AutoencoderKlConfig {
                latent_channels: 32,
                scaling_factor: 1.0,
                flux2: Some(Flux2Latents::PUBLIC),
                ..base
            },
            // BFL's small decoder: 0.75× the decoder widths, the same encoder.
            "flux2-small" => AutoencoderKlConfig {
                latent_channels: 32,
                scaling_factor: 1.0,
                flux2: Some(Flux2Latents::PUBLIC),
                decoder_block_out_channels: Some(vec![96, 192, 384, 384]),
                ..base
            },
            other => {
                return Err(Error::InvalidInput(format!(
                    "unknown preset `{other}`; known presets: {}",
                    PRESETS.join(", ")
                )))
            }
        })
    }

    /// Reads a diffusers `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_text_file(path)?;
        Self::from_json(&text, path)
    }

    /// [`AutoencoderKlConfig::from_file`] on the file's text; `path` names it in errors.
    #[doc(hidden)]
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let mut cfg: Self = serde_json::from_str(text).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a diffusers AutoencoderKL config: {e}"),
        })?;
        let extra: Flux2Fields = serde_json::from_str(text).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a diffusers AutoencoderKL config: {e}"),
        })?;
        cfg.apply_flux2_fields(&extra).map_err(|m| Error::BadFile {
            path: path.to_path_buf(),
            message: m,
        })?;
        cfg.validate().map_err(|m| Error::BadFile {
            path: path.to_path_buf(),
            message: m,
        })?;
        Ok(cfg)
    }

    /// `_class_name: AutoencoderKLFlux2` (or a `batch_norm_eps` field):
    /// FLUX.2's normalisation, patch size (2, 2), and no scaling factor
    /// (its config has none: 1 and 0 unless the file gives them).
    fn apply_flux2_fields(&mut self, f: &Flux2Fields) -> std::result::Result<(), String> {
        let is_flux2 =
            f.class_name.as_deref() == Some("AutoencoderKLFlux2") || f.batch_norm_eps.is_some();
        if !is_flux2 {
            return Ok(());
        }
        let eps = f
            .batch_norm_eps
            .unwrap_or(Flux2Latents::PUBLIC.batch_norm_eps);
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(format!(
                "batch_norm_eps {eps} must be finite and non-negative (FLUX.2 uses 1e-4)"
            ));
        }
        if let Some(p) = &f.patch_size {
            let two = serde_json::json!([2, 2]);
            if *p != two && *p != serde_json::json!(2) {
                return Err(format!(
                    "patch_size {p} is not supported: FLUX.2 latents are 2×2 patches (patch_size [2, 2])"
                ));
            }
        }
        self.flux2 = Some(Flux2Latents {
            batch_norm_eps: eps,
        });
        self.scaling_factor = f.scaling_factor.unwrap_or(1.0);
        self.shift_factor = f.shift_factor;
        Ok(())
    }

    /// The decoder's widths, highest resolution first
    /// (`decoder_block_out_channels`, else `block_out_channels`).
    pub(crate) fn decoder_channels(&self) -> &[usize] {
        self.decoder_block_out_channels
            .as_deref()
            .unwrap_or(&self.block_out_channels)
    }

    /// The shift factor (0 when there is none).
    pub fn shift(&self) -> f32 {
        self.shift_factor.unwrap_or(0.0)
    }

    /// Structural checks that would otherwise surface as shape errors deep in a decode.
    pub fn validate(&self) -> std::result::Result<(), String> {
        // Bounds far beyond any published VAE, so absurd values are refused
        // before a layer is allocated (and 2^(blocks − 1) cannot overflow).
        const MAX_BLOCKS: usize = 8;
        const MAX_CHANNELS: usize = 16384;
        const MAX_LAYERS: usize = 64;
        if self.block_out_channels.is_empty() || self.block_out_channels.len() > MAX_BLOCKS {
            return Err(format!(
                "block_out_channels {:?} must list 1 to {MAX_BLOCKS} widths",
                self.block_out_channels
            ));
        }
        if self.norm_num_groups == 0 {
            return Err("norm_num_groups must be positive (diffusers' VAEs use 32)".into());
        }
        if self.layers_per_block > MAX_LAYERS {
            return Err(format!(
                "layers_per_block {} is over {MAX_LAYERS} (published VAEs use 1 or 2)",
                self.layers_per_block
            ));
        }
        let widths = [self.latent_channels, self.out_channels];
        if self
            .block_out_channels
            .iter()
            .chain(&widths)
            .any(|&c| c > MAX_CHANNELS)
        {
            return Err(format!(
                "channel counts (block_out_channels {:?}, latent_channels {}, out_channels {}) must be at most {MAX_CHANNELS}",
                self.block_out_channels, self.latent_channels, self.out_channels
            ));
        }
        for &c in &self.block_out_channels {
            if c == 0 || c % self.norm_num_groups != 0 {
                return Err(format!(
                    "block_out_channels {:?} must be positive multiples of norm_num_groups {}",
                    self.block_out_channels, self.norm_num_groups
                ));
            }
        }
        if let Some(d) = &self.decoder_block_out_channels {
            if d.len() != self.block_out_channels.len() {
                return Err(format!(
                    "decoder_block_out_channels {d:?} must list as many widths as block_out_channels {:?}",
                    self.block_out_channels
                ));
            }
            if d.iter()
                .any(|&c| c == 0 || c > MAX_CHANNELS || c % self.norm_num_groups != 0)
            {
                return Err(format!(
                    "decoder_block_out_channels {d:?} must be positive multiples of norm_num_groups {} (at most {MAX_CHANNELS})",
                    self.norm_num_groups
                ));
            }
        }
        if self.latent_channels == 0 || self.out_channels == 0 {
            return Err("latent_channels and out_channels must be positive".into());
        }
        if !(self.scaling_factor.is_finite() && self.scaling_factor != 0.0) {
            return Err(format!(
                "scaling_factor {} must be finite and non-zero",
                self.scaling_factor
            ));
        }
        if self.shift_factor.is_some_and(|s| !s.is_finite()) {
            return Err(format!(
                "shift_factor {:?} must be finite",
                self.shift_factor
            ));
        }
        Ok(())
    }

    /// Pixels per latent along each axis (2^(blocks − 1)).
    pub fn upscale(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that used to panic or allocate without bound are refused,
    /// each with a message naming the field.
    #[test]
    fn absurd_configs_are_refused_naming_the_field() {
        let base = AutoencoderKlConfig::preset("sd15").unwrap();
        assert!(base.validate().is_ok());
        type Breaks = Box<dyn Fn(&mut AutoencoderKlConfig)>;
        let cases: Vec<(&str, Breaks)> = vec![
            ("norm_num_groups", Box::new(|c| c.norm_num_groups = 0)),
            (
                "block_out_channels",
                Box::new(|c| c.block_out_channels = vec![]),
            ),
            (
                "block_out_channels",
                Box::new(|c| c.block_out_channels = vec![32; 70]),
            ),
            (
                "block_out_channels",
                Box::new(|c| c.block_out_channels[0] = 1 << 40),
            ),
            ("latent_channels", Box::new(|c| c.latent_channels = 1 << 40)),
            (
                "layers_per_block",
                Box::new(|c| c.layers_per_block = 1_000_000),
            ),
            (
                "scaling_factor",
                Box::new(|c| c.scaling_factor = f32::INFINITY),
            ),
            (
                "shift_factor",
                Box::new(|c| c.shift_factor = Some(f32::NAN)),
            ),
        ];
        for (field, break_it) in cases {
            let mut c = base.clone();
            break_it(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    /// Each preset carries its published diffusers `vae/config.json` values
    /// (SD 1.5, SDXL, SD3-medium, FLUX.1-dev), and no two presets are equal.
    #[test]
    fn presets_are_valid_and_distinct() {
        // (name, latent channels, scaling_factor, shift_factor, quant convs)
        let published = [
            ("sd15", 4, 0.18215, None, true),
            ("sdxl", 4, 0.13025, None, true),
            ("sd3", 16, 1.5305, Some(0.0609), false),
            ("flux1", 16, 0.3611, Some(0.1159), false),
            ("flux2", 32, 1.0, None, true),
            ("flux2-small", 32, 1.0, None, true),
        ];
        assert_eq!(published.len(), PRESETS.len());
        let mut seen: Vec<AutoencoderKlConfig> = Vec::new();
        for (&name, (want, latent, scaling, shift, quant)) in PRESETS.iter().zip(published) {
            assert_eq!(name, want);
            let c = AutoencoderKlConfig::preset(name).unwrap();
            c.validate().unwrap();
            assert_eq!(c.upscale(), 8);
            assert_eq!(c.block_out_channels, [128, 256, 512, 512], "{name}");
            assert_eq!((c.layers_per_block, c.norm_num_groups), (2, 32), "{name}");
            assert_eq!((c.latent_channels, c.out_channels), (latent, 3), "{name}");
            assert_eq!(c.scaling_factor, scaling, "{name}");
            assert_eq!(c.shift_factor, shift, "{name}");
            assert_eq!(
                (c.use_quant_conv, c.use_post_quant_conv),
                (quant, quant),
                "{name}"
            );
            assert!(c.mid_block_add_attention, "{name}");
            assert_eq!(c.is_f16_safe(), name == "sd15", "{name}");
            assert!(!seen.contains(&c), "{name} equals an earlier preset");
            seen.push(c);
        }
        for (alias, name) in [("SD1.5", "sd15"), ("flux", "flux1"), ("sd", "sd15")] {
            assert_eq!(
                AutoencoderKlConfig::preset(alias).unwrap(),
                AutoencoderKlConfig::preset(name).unwrap()
            );
        }
        assert!(AutoencoderKlConfig::preset("nope")
            .unwrap_err()
            .to_string()
            .contains("sd15"));
    }

    #[test]
    fn golden_configs_parse() {
        let Some(shared) = crate::testing::shared_dir() else {
            return;
        };
        let c = AutoencoderKlConfig::from_file(&shared.join("golden/aekl-tiny-flux/config.json"))
            .unwrap();
        assert_eq!(c.latent_channels, 16);
        assert_eq!(c.shift(), 0.1159);
        assert!(!c.use_post_quant_conv);
        let c = AutoencoderKlConfig::from_file(&shared.join("golden/aekl-tiny-sd/config.json"))
            .unwrap();
        assert_eq!(c.shift(), 0.0);
        assert_eq!(c.norm_num_groups, 16);
        assert_eq!(c.flux2, None);
        let c =
            AutoencoderKlConfig::from_file(&shared.join("golden/flux2-tiny/config.json")).unwrap();
        assert_eq!(c.flux2, Some(Flux2Latents::PUBLIC));
        assert_eq!(
            (c.latent_channels, c.scaling_factor, c.shift()),
            (32, 1.0, 0.0)
        );
        assert_eq!(c.decoder_channels(), [16, 32, 48, 48]);
        let path = shared.join("golden/flux2-small-decoder-tiny/config.json");
        let c = AutoencoderKlConfig::from_file(&path).unwrap();
        assert_eq!(c.decoder_channels(), [12, 24, 36, 36]);
        assert_eq!(c.block_out_channels, [16, 32, 48, 48]);
        let text = std::fs::read_to_string(&path).unwrap();
        let bad = text.replace(
            "\"patch_size\": [\n    2,\n    2\n  ]",
            "\"patch_size\": [4, 4]",
        );
        assert_ne!(bad, text);
        let e = AutoencoderKlConfig::from_json(&bad, &path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("patch_size"), "{e}");
    }
}
