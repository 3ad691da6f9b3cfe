//! AutoencoderKL configuration: diffusers `config.json` and the public presets.

// Input-facing: what a file or flag holds reaches this code (issue #15).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

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
pub const PRESETS: &[&str] = &["sd15", "sdxl", "sd3", "flux1"];

impl AutoencoderKlConfig {
    /// True for the SD 1.x VAE (scaling factor 0.18215, 4 latent channels),
    /// whose activations stay within f16's range; SDXL's overflows f16 and the
    /// 16-channel VAEs are run upcast by diffusers.
    pub fn is_f16_safe(&self) -> bool {
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
        let cfg: Self = serde_json::from_str(text).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a diffusers AutoencoderKL config: {e}"),
        })?;
        cfg.validate().map_err(|m| Error::BadFile {
            path: path.to_path_buf(),
            message: m,
        })?;
        Ok(cfg)
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
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
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
    }
}
