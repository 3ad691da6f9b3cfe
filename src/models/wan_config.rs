//! The Wan VAE's config (diffusers `AutoencoderKLWan` fields): read from a
//! `config.json` with every field checked by name, or inferred from a weight
//! file's shapes, with Wan 2.1's or 2.2's latent statistics (by z_dim) where
//! none are given.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::models::diffusers_folder::bad;
use crate::models::weights::WeightStore;

/// The public Wan 2.1 `latents_mean` (diffusers' default config).
pub const WAN21_LATENTS_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
/// The public Wan 2.1 `latents_std`.
pub const WAN21_LATENTS_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];

/// The published Wan 2.2 (TI2V-5B) `latents_mean`.
pub const WAN22_LATENTS_MEAN: [f32; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
];
/// The published Wan 2.2 (TI2V-5B) `latents_std`.
pub const WAN22_LATENTS_STD: [f32; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

/// The decoder's shape (diffusers `AutoencoderKLWan` config fields).
#[derive(Clone, Debug, PartialEq)]
pub struct WanConfig {
    /// Decoder base width (`decoder_base_dim`, else `base_dim`).
    pub base_dim: usize,
    /// Latent channels.
    pub z_dim: usize,
    /// Width multipliers (encoder order).
    pub dim_mult: Vec<usize>,
    /// Residual blocks per encoder stage (the decoder has one more).
    pub num_res_blocks: usize,
    /// Time down-sampling per encoder stage (the decoder up-samples in reverse).
    pub temperal_downsample: Vec<bool>,
    /// Pipeline latents' per-channel mean (`z = latents · std + mean`).
    pub latents_mean: Vec<f32>,
    /// Pipeline latents' per-channel std.
    pub latents_std: Vec<f32>,
    /// Wan 2.2's residual decoder (`is_residual`): up blocks keep their
    /// width and add a `DupUp3D` channels-to-space shortcut.
    pub is_residual: bool,
    /// Pixels per side packed into channels at the output (`patch_size`:
    /// Wan 2.2's 2 gives 3·2² = 12 output channels, unpatchified), 1 for none.
    pub patch_size: usize,
}

impl WanConfig {
    /// The public Wan 2.1 VAE: base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4],
    /// 2 residual blocks, temporal down-sampling [False, True, True].
    pub fn wan21() -> Self {
        WanConfig {
            base_dim: 96,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            temperal_downsample: vec![false, true, true],
            latents_mean: WAN21_LATENTS_MEAN.to_vec(),
            latents_std: WAN21_LATENTS_STD.to_vec(),
            is_residual: false,
            patch_size: 1,
        }
    }

    /// The public Wan 2.2 (TI2V-5B) VAE decoder: decoder_base_dim 256,
    /// z_dim 48, dim_mult [1, 2, 4, 4], 2 residual blocks, temporal
    /// down-sampling [false, true, true], residual, patch size 2 (16×
    /// spatial compression), the published latent statistics.
    pub fn wan22() -> Self {
        WanConfig {
            base_dim: 256,
            z_dim: 48,
            latents_mean: WAN22_LATENTS_MEAN.to_vec(),
            latents_std: WAN22_LATENTS_STD.to_vec(),
            is_residual: true,
            patch_size: 2,
            ..WanConfig::wan21()
        }
    }

    /// Output pixels per latent pixel along each axis: 2 per up-sampling
    /// stage, times the patch size.
    pub fn upscale(&self) -> usize {
        (1usize << self.dim_mult.len().saturating_sub(1).min(16)).saturating_mul(self.patch_size)
    }

    /// Channels `conv_out` makes: RGB, `patch_size`² pixels each.
    pub fn out_channels(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }

    /// A diffusers `config.json` of an `AutoencoderKLWan` (Wan 2.1, or Wan
    /// 2.2 with `is_residual` and `patch_size`). Every field is checked by
    /// name; missing `latents_mean`/`latents_std` are Wan 2.1's for `z_dim`
    /// 16 and Wan 2.2's for 48 (with a warning), else left empty (only raw
    /// latents decode).
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_file_noting(path).map(|(c, _)| c)
    }

    /// [`WanConfig::from_file`] and, when the latent statistics are not the
    /// file's, a note saying which are used.
    pub(crate) fn from_file_noting(path: &Path) -> Result<(Self, Option<String>)> {
        let text = crate::io::read_text_file(path)?;
        Self::from_json_noting(&text, path)
    }

    /// [`WanConfig::from_file`] of the text `text` (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        Self::from_json_noting(text, path).map(|(c, _)| c)
    }

    pub(crate) fn from_json_noting(text: &str, path: &Path) -> Result<(Self, Option<String>)> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| bad(path, format!("config.json is not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(bad(
                path,
                format!("config.json holds {v}, not an object of AutoencoderKLWan fields"),
            ));
        }
        let class = v.get("_class_name").and_then(|c| c.as_str());
        if let Some(c) = class.filter(|c| *c != "AutoencoderKLWan") {
            return Err(bad(
                path,
                format!("config.json is a `{c}`, not an `AutoencoderKLWan` (Wan 2.1 / 2.2 VAE)"),
            ));
        }
        let d = WanConfig::wan21();
        // A field, a whole number in `lo..=hi` (beyond: no real VAE, and
        // sizes that would overflow or exhaust memory).
        let whole = |k: &str, x: &serde_json::Value, lo: u64, hi: u64, usual: &str| {
            x.as_u64()
                .filter(|n| (lo..=hi).contains(n))
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        path,
                        format!("config.json: `{k}` is {x}; expected a whole number from {lo} to {hi} (the Wan 2.1 VAE has {usual})"),
                    )
                })
        };
        let int = |k: &str, default: usize, lo: u64, hi: u64| -> Result<usize> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(default),
                Some(x) => whole(k, x, lo, hi, &default.to_string()),
            }
        };
        let list = |k: &str| -> Result<Option<&Vec<serde_json::Value>>> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Array(a)) => Ok(Some(a)),
                Some(x) => Err(bad(
                    path,
                    format!("config.json: `{k}` is {x}; expected a list"),
                )),
            }
        };
        let is_residual = match v.get("is_residual") {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(x) => {
                return Err(bad(
                    path,
                    format!(
                    "config.json: `is_residual` is {x}; expected true (Wan 2.2) or false (Wan 2.1)"
                ),
                ))
            }
        };
        let patch_size = int("patch_size", 1, 1, 4)?;
        if let Some(x) = v.get("out_channels").filter(|x| !x.is_null()) {
            let want = 3 * patch_size * patch_size;
            if x.as_u64() != Some(want as u64) {
                return Err(bad(
                    path,
                    format!("config.json: `out_channels` is {x}; a Wan decoder with patch_size {patch_size} makes RGB in 3·{patch_size}² = {want} channels"),
                ));
            }
        }
        let z_dim = int("z_dim", d.z_dim, 1, 1024)?;
        let base_dim = int("base_dim", d.base_dim, 1, 4096)?;
        let base_dim = int("decoder_base_dim", base_dim, 1, 4096)?;
        let num_res_blocks = int("num_res_blocks", d.num_res_blocks, 1, 16)?;
        let dim_mult = match list("dim_mult")? {
            None => d.dim_mult.clone(),
            Some(a) => {
                if a.is_empty() || a.len() > 8 {
                    return Err(bad(
                        path,
                        format!("config.json: `dim_mult` has {} entries; expected 1 to 8 (the Wan 2.1 VAE has [1, 2, 4, 4])", a.len()),
                    ));
                }
                a.iter()
                    .enumerate()
                    .map(|(i, x)| whole(&format!("dim_mult[{i}]"), x, 1, 64, "1, 2 or 4"))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let widest = dim_mult.iter().max().copied().unwrap_or(1) * base_dim;
        if widest > 16384 {
            return Err(bad(
                path,
                format!("config.json: base_dim {base_dim} × dim_mult {dim_mult:?} gives {widest} channels; at most 16384 are supported (the Wan 2.1 VAE has 384)"),
            ));
        }
        let temperal_downsample = match list("temperal_downsample")? {
            None if dim_mult.len() == d.dim_mult.len() => d.temperal_downsample,
            None => {
                return Err(bad(
                    path,
                    format!("config.json: `temperal_downsample` is missing; with {} dim_mult stages it needs {} booleans", dim_mult.len(), dim_mult.len() - 1),
                ))
            }
            Some(a) => a
                .iter()
                .map(|x| x.as_bool())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    bad(
                        path,
                        "config.json: `temperal_downsample` must hold booleans",
                    )
                })?,
        };
        if temperal_downsample.len() + 1 != dim_mult.len() {
            return Err(bad(
                path,
                format!(
                    "config.json: `temperal_downsample` has {} flags for {} `dim_mult` stages; it needs one fewer than the stages",
                    temperal_downsample.len(),
                    dim_mult.len()
                ),
            ));
        }
        let floats = |k: &str| -> Result<Option<Vec<f32>>> {
            let Some(a) = list(k)? else { return Ok(None) };
            let values = a
                .iter()
                .map(|x| x.as_f64().map(|x| x as f32).filter(|x| x.is_finite()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad(path, format!("config.json: `{k}` must hold finite numbers")))?;
            if values.len() != z_dim {
                return Err(bad(
                    path,
                    format!("config.json: `{k}` has {} values; z_dim is {z_dim}, one per latent channel", values.len()),
                ));
            }
            Ok(Some(values))
        };
        let (latents_mean, latents_std, note) = match (floats("latents_mean")?, floats("latents_std")?) {
            (Some(m), Some(s)) => (m, s, None),
            (Some(_), None) | (None, Some(_)) => {
                return Err(bad(
                    path,
                    "config.json: `latents_mean` and `latents_std` come together; one of them is missing",
                ))
            }
            (None, None) => default_stats(z_dim, &format!("`{}` has no latents_mean/latents_std", path.display())),
        };
        Ok((
            WanConfig {
                base_dim,
                z_dim,
                dim_mult,
                num_res_blocks,
                temperal_downsample,
                latents_mean,
                latents_std,
                is_residual,
                patch_size,
            },
            note,
        ))
    }

    /// The config of a file without `config.json`, read off its shapes
    /// (Wan 2.1's latent statistics assumed for z_dim 16, Wan 2.2's for 48;
    /// `is_residual` and `patch_size` from the key names and `conv_out`), and the note
    /// saying so.
    pub(crate) fn infer(store: &WeightStore, why: &str) -> Result<(Self, Option<String>)> {
        let origin = PathBuf::from(store.origin());
        let shape = |k: &str| {
            store
                .shape_of(k)
                .ok_or_else(|| bad(&origin, format!("not a Wan VAE decoder: no `{k}`")))
        };
        let conv_in = shape("decoder.conv_in.weight")?;
        let conv_out = shape("decoder.conv_out.weight")?;
        let (Some(&z_dim), Some(&base_dim), Some(&out)) =
            (conv_in.get(1), conv_out.get(1), conv_out.first())
        else {
            return Err(bad(&origin, "Wan conv weights must be 5-D"));
        };
        // Wan 2.2's residual up blocks name their Resample `upsampler`.
        let is_residual = store.contains("decoder.up_blocks.0.upsampler.resample.1.weight");
        let Some(patch_size) = (1..=4).find(|p| 3 * p * p == out) else {
            return Err(bad(
                &origin,
                format!("decoder.conv_out makes {out} channels; a Wan decoder makes RGB in 3·p² (3 or 12)"),
            ));
        };
        let upsampler = if is_residual {
            "upsampler"
        } else {
            "upsamplers.0"
        };
        let mut widths = Vec::new();
        while let Some(s) = store.shape_of(&format!(
            "decoder.up_blocks.{}.resnets.0.conv1.weight",
            widths.len()
        )) {
            widths.push(s.first().copied().unwrap_or(0));
        }
        let mut resnets = 0;
        while store.contains(&format!(
            "decoder.up_blocks.0.resnets.{resnets}.conv1.weight"
        )) {
            resnets += 1;
        }
        if widths.is_empty() || base_dim == 0 || resnets == 0 {
            return Err(bad(
                &origin,
                "not a Wan VAE decoder: no `decoder.up_blocks.0.resnets.0`",
            ));
        }
        let mut dim_mult: Vec<usize> = widths.iter().map(|w| w / base_dim).collect();
        dim_mult.reverse();
        let mut temperal_downsample: Vec<bool> = (0..widths.len().saturating_sub(1))
            .map(|i| {
                store.contains(&format!(
                    "decoder.up_blocks.{i}.{upsampler}.time_conv.weight"
                ))
            })
            .collect();
        temperal_downsample.reverse();
        let (latents_mean, latents_std, note) = default_stats(z_dim, why);
        Ok((
            WanConfig {
                base_dim,
                z_dim,
                dim_mult,
                num_res_blocks: resnets - 1,
                temperal_downsample,
                latents_mean,
                latents_std,
                is_residual,
                patch_size,
            },
            note,
        ))
    }
}

/// Latent statistics for a config that gives none (`why` says so): Wan
/// 2.1's for its `z_dim` of 16, Wan 2.2's for 48, logged as a warning,
/// else none (pipeline latents are then refused, raw ones decode). The
/// note says which.
fn default_stats(z_dim: usize, why: &str) -> (Vec<f32>, Vec<f32>, Option<String>) {
    let known = match z_dim {
        16 => Some(("2.1", &WAN21_LATENTS_MEAN[..], &WAN21_LATENTS_STD[..])),
        48 => Some(("2.2", &WAN22_LATENTS_MEAN[..], &WAN22_LATENTS_STD[..])),
        _ => None,
    };
    let note = match known {
        Some((v, ..)) => format!("{why}: Wan {v}'s published latents_mean/latents_std are used"),
        None => format!("{why} and z_dim is {z_dim} (Wan 2.1's statistics are for 16, Wan 2.2's for 48): only raw latents can be decoded"),
    };
    log::warn!("{note}");
    match known {
        Some((_, m, s)) => (m.to_vec(), s.to_vec(), Some(note)),
        None => (Vec::new(), Vec::new(), Some(note)),
    }
}

/// True when `path` is a diffusers config of an `AutoencoderKLWan`.
pub(crate) fn is_wan_config(path: &Path) -> bool {
    // A FIFO would block the read (the loader then names it).
    if !path.is_file() {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    if text.contains("\"AutoencoderKLWan\"") {
        return true;
    }
    // Without `_class_name`: told by fields only AutoencoderKLWan has.
    serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| {
        v.get("_class_name").is_none()
            && ["z_dim", "temperal_downsample", "base_dim"]
                .iter()
                .any(|k| v.get(k).is_some())
    })
}

/// True when `path` is a JSON object with a `_class_name` (or unreadable).
pub(crate) fn names_a_class(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_none_or(|v| v.get("_class_name").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config.json with `fields` over Wan 2.1's class name, read back (its
    /// folder is gone on return: callers only look for the path in messages).
    fn config(fields: &str) -> (PathBuf, Result<(WanConfig, Option<String>)>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let sep = if fields.is_empty() { "" } else { ", " };
        std::fs::write(
            &path,
            format!("{{\"_class_name\": \"AutoencoderKLWan\"{sep}{fields}}}"),
        )
        .unwrap();
        let got = WanConfig::from_file_noting(&path);
        (path, got)
    }

    #[test]
    fn bad_config_fields_are_named_with_config_json() {
        for (fields, names) in [
            (r#""z_dim": 0"#, "`z_dim` is 0"),
            (r#""z_dim": 1e12"#, "`z_dim` is 1000000000000.0"),
            (r#""z_dim": -16"#, "`z_dim` is -16"),
            (r#""base_dim": 0"#, "`base_dim` is 0"),
            (r#""decoder_base_dim": 5000"#, "`decoder_base_dim` is 5000"),
            (r#""num_res_blocks": 0"#, "`num_res_blocks` is 0"),
            (r#""dim_mult": [1, 0, 4, 4]"#, "`dim_mult[1]` is 0"),
            (r#""dim_mult": []"#, "`dim_mult` has 0 entries"),
            (r#""dim_mult": 4"#, "`dim_mult` is 4; expected a list"),
            (r#""dim_mult": [1, 2]"#, "`temperal_downsample` is missing"),
            (
                r#""temperal_downsample": [true]"#,
                "`temperal_downsample` has 1 flags",
            ),
            (
                r#""base_dim": 4096, "dim_mult": [1, 2, 4, 8]"#,
                "32768 channels",
            ),
            (
                r#""latents_mean": [0.0]"#,
                "`latents_mean` has 1 values; z_dim is 16",
            ),
            (r#""latents_std": [1.0, 1.0]"#, "`latents_std` has 2 values"),
        ] {
            let (path, got) = config(fields);
            let e = got
                .err()
                .unwrap_or_else(|| panic!("{fields}: accepted"))
                .to_string();
            assert!(
                e.contains(names)
                    && e.contains("config.json")
                    && e.contains(&*path.to_string_lossy()),
                "{fields}: {e}"
            );
        }
    }

    #[test]
    fn missing_latent_statistics_are_said_not_silent() {
        // z_dim 16: Wan 2.1's, with a note naming the file.
        let (path, got) = config("");
        let (c, note) = got.unwrap();
        assert_eq!(c, WanConfig::wan21());
        let note = note.unwrap();
        assert!(
            note.contains(&*path.to_string_lossy()) && note.contains("Wan 2.1's"),
            "{note}"
        );
        // Another z_dim: none (raw latents only), said so.
        let (_, got) = config(r#""z_dim": 8"#);
        let (c, note) = got.unwrap();
        assert!(c.latents_mean.is_empty() && c.latents_std.is_empty());
        assert!(note.unwrap().contains("only raw latents"));
        // Given: the file's own, no note.
        let sixteen = vec!["0.5"; 16].join(", ");
        let (_, got) = config(&format!(
            r#""latents_mean": [{sixteen}], "latents_std": [{sixteen}]"#
        ));
        let (c, note) = got.unwrap();
        assert_eq!((c.latents_mean[3], note), (0.5, None));
    }

    #[test]
    fn a_config_without_class_name_is_told_by_its_fields() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("wan-class");
        std::fs::create_dir_all(&dir).unwrap();
        let wan = dir.join("wan.json");
        std::fs::write(&wan, r#"{"z_dim": 16, "base_dim": 96}"#).unwrap();
        assert!(is_wan_config(&wan));
        let kl = dir.join("kl.json");
        std::fs::write(
            &kl,
            r#"{"latent_channels": 4, "block_out_channels": [128]}"#,
        )
        .unwrap();
        assert!(!is_wan_config(&kl));
    }
}
