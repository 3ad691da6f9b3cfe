//! The Wan 2.1 VAE decoder (diffusers `AutoencoderKLWan`, the original
//! `wan/modules/vae.py` keys as ComfyUI's `wan_2.1_vae.safetensors`).
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::image::ImageRange;
use crate::models::diffusers_folder::bad;
use crate::models::graph::{Builder, Conv, Geometry, Graph, Residual};
use crate::models::taehv::TaehvDecoder;
use crate::models::wan_layers::{load_causal, load_pointwise, GraphBuilder};
use crate::models::weights::{HostWeight, Layout, WeightStore};
use crate::tensor::DType;

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
        }
    }

    /// A diffusers `config.json` of an `AutoencoderKLWan` (Wan 2.1 only:
    /// `is_residual` and `patch_size` models are Wan 2.2's and refused).
    /// Every field is checked by name; missing `latents_mean`/`latents_std`
    /// are Wan 2.1's for `z_dim` 16 (with a warning), else left empty (only
    /// raw latents decode).
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_file_noting(path).map(|(c, _)| c)
    }

    /// [`WanConfig::from_file`] and, when the latent statistics are not the
    /// file's, a note saying which are used.
    fn from_file_noting(path: &Path) -> Result<(Self, Option<String>)> {
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
                format!("config.json is a `{c}`, not an `AutoencoderKLWan` (Wan 2.1 VAE)"),
            ));
        }
        if v.get("is_residual").and_then(|r| r.as_bool()) == Some(true)
            || v.get("patch_size").is_some_and(|p| !p.is_null())
        {
            return Err(Error::Unsupported(format!(
                "`{}` is a Wan 2.2 VAE (is_residual / patch_size); only the Wan 2.1 VAE decoder is implemented",
                path.display()
            )));
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
            },
            note,
        ))
    }

    /// The config of a file without `config.json`, read off its shapes
    /// (the Wan 2.1 latents' statistics assumed for z_dim 16), and the note
    /// saying so.
    pub(crate) fn infer(store: &WeightStore, why: &str) -> Result<(Self, Option<String>)> {
        let origin = PathBuf::from(store.origin());
        let shape = |k: &str| {
            store
                .shape_of(k)
                .ok_or_else(|| bad(&origin, format!("not a Wan 2.1 VAE decoder: no `{k}`")))
        };
        let conv_in = shape("decoder.conv_in.weight")?;
        let conv_out = shape("decoder.conv_out.weight")?;
        let (Some(&z_dim), Some(&base_dim)) = (conv_in.get(1), conv_out.get(1)) else {
            return Err(bad(&origin, "Wan conv weights must be 5-D"));
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
                "not a Wan 2.1 VAE decoder: no `decoder.up_blocks.0.resnets.0`",
            ));
        }
        let mut dim_mult: Vec<usize> = widths.iter().map(|w| w / base_dim).collect();
        dim_mult.reverse();
        let mut temperal_downsample: Vec<bool> = (0..widths.len().saturating_sub(1))
            .map(|i| {
                store.contains(&format!(
                    "decoder.up_blocks.{i}.upsamplers.0.time_conv.weight"
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
            },
            note,
        ))
    }
}

/// Latent statistics for a config that gives none (`why` says so): Wan
/// 2.1's for its `z_dim` of 16, logged as a warning, else none (pipeline
/// latents are then refused, raw ones decode). The note says which.
fn default_stats(z_dim: usize, why: &str) -> (Vec<f32>, Vec<f32>, Option<String>) {
    let note = if z_dim == WAN21_LATENTS_MEAN.len() {
        format!("{why}: Wan 2.1's published latents_mean/latents_std are used")
    } else {
        format!("{why} and z_dim is {z_dim} (Wan 2.1's statistics are for 16): only raw latents can be decoded")
    };
    log::warn!("{note}");
    if z_dim == WAN21_LATENTS_MEAN.len() {
        (
            WAN21_LATENTS_MEAN.to_vec(),
            WAN21_LATENTS_STD.to_vec(),
            Some(note),
        )
    } else {
        (Vec::new(), Vec::new(), Some(note))
    }
}

/// The original `wan/modules/vae.py` key of a decoder weight → its diffusers
/// name (as diffusers' `convert_wan_to_diffusers.py`); `per_block`: residual
/// blocks per up stage. `None`: not a decoder key.
fn original_to_diffusers(key: &str, per_block: usize) -> Option<String> {
    let residual = |rest: &str| -> Option<String> {
        let map = [
            ("residual.0.gamma", "norm1.gamma"),
            ("residual.2.", "conv1."),
            ("residual.3.gamma", "norm2.gamma"),
            ("residual.6.", "conv2."),
            ("shortcut.", "conv_shortcut."),
        ];
        map.iter()
            .find_map(|(from, to)| rest.strip_prefix(from).map(|t| format!("{to}{t}")))
    };
    if let Some(t) = key.strip_prefix("conv2.") {
        return Some(format!("post_quant_conv.{t}"));
    }
    let rest = key.strip_prefix("decoder.")?;
    if let Some(t) = rest.strip_prefix("conv1.") {
        return Some(format!("decoder.conv_in.{t}"));
    }
    if let Some(t) = rest.strip_prefix("head.0.") {
        return Some(format!("decoder.norm_out.{t}"));
    }
    if let Some(t) = rest.strip_prefix("head.2.") {
        return Some(format!("decoder.conv_out.{t}"));
    }
    if let Some(t) = rest.strip_prefix("middle.") {
        let (i, t) = t.split_once('.')?;
        return match i {
            "0" => Some(format!("decoder.mid_block.resnets.0.{}", residual(t)?)),
            "1" => Some(format!("decoder.mid_block.attentions.0.{t}")),
            "2" => Some(format!("decoder.mid_block.resnets.1.{}", residual(t)?)),
            _ => None,
        };
    }
    let t = rest.strip_prefix("upsamples.")?;
    let (f, t) = t.split_once('.')?;
    let f: usize = f.parse().ok()?;
    // Stages of `per_block` residual blocks and one Resample (the last
    // stage has none, which the division does not see).
    let (stage, at) = (f / (per_block + 1), f % (per_block + 1));
    if at < per_block {
        Some(format!(
            "decoder.up_blocks.{stage}.resnets.{at}.{}",
            residual(t)?
        ))
    } else {
        Some(format!("decoder.up_blocks.{stage}.upsamplers.0.{t}"))
    }
}

/// A Wan 2.1 VAE decoder with its weights on the device.
pub struct WanDecoder {
    /// The model's shape and latent statistics.
    pub config: WanConfig,
    /// Where the weights came from (for messages).
    pub name: String,
    /// Set when `latents_mean`/`latents_std` are not the config's own: which
    /// are used (also logged as a warning).
    pub latents_stats_note: Option<String>,
    graph: Graph,
    t_upscale: usize,
}

/// Keys of a Wan file, diffusers-named, from `path` (a `.safetensors`).
/// A Wan-architecture weight file (diffusers or original keys) as a store of
/// `dtype`, and whether it has a `post_quant_conv` (Wan 2.1, Qwen-Image).
pub(crate) fn wan_store(file: &Path, dtype: DType) -> Result<(WeightStore, bool)> {
    crate::io::require_regular_file(file)?;
    let map = read_wan_weights(file)?;
    let has_post_quant = map.contains_key("post_quant_conv.weight");
    let store = WeightStore::from_map(map, Layout::Diffusers, &file.display().to_string());
    store.set_dtype(dtype);
    Ok((store, has_post_quant))
}

pub(crate) fn read_wan_weights(path: &Path) -> Result<BTreeMap<String, HostWeight>> {
    if TaehvDecoder::is_taehv_file(path) {
        return Err(bad(
            path,
            "this is a TAEHV file (a tiny video decoder, `decoder.N…` keys), not a Wan 2.1 VAE: load it with `TaehvDecoder`",
        ));
    }
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(path, format!("not a valid .safetensors file: {e}")))?;
    let names: Vec<String> = st.names().into_iter().map(String::from).collect();
    let original = names
        .iter()
        .any(|n| n.starts_with("decoder.middle.") || n.starts_with("decoder.upsamples."));
    let diffusers = names.iter().any(|n| n.starts_with("decoder.mid_block."));
    if !original && !diffusers {
        let mut sample: Vec<&str> = names.iter().map(String::as_str).take(4).collect();
        sample.sort();
        return Err(bad(
            path,
            format!(
                "not a Wan 2.1 VAE: no `decoder.mid_block.…` (diffusers) or `decoder.middle.…` (original) keys; found keys like {}",
                sample.join(", ")
            ),
        ));
    }
    // Residual blocks per stage: the upsamples index of the first Resample.
    let per_block = names
        .iter()
        .filter_map(|n| {
            let t = n.strip_prefix("decoder.upsamples.")?;
            let (f, rest) = t.split_once('.')?;
            (rest.starts_with("resample.") || rest.starts_with("time_conv."))
                .then(|| f.parse::<usize>().ok())
                .flatten()
        })
        .min()
        .unwrap_or(3);
    let mut map = BTreeMap::new();
    for n in &names {
        let key = if original {
            match original_to_diffusers(n, per_block) {
                Some(k) => k,
                None => continue,
            }
        } else if n.starts_with("decoder.") || n.starts_with("post_quant_conv.") {
            n.clone()
        } else {
            continue;
        };
        let view = st.tensor(n).map_err(|e| bad(path, e.to_string()))?;
        let data = crate::io::view_to_f32(&view).map_err(|m| bad(path, format!("{n}: {m}")))?;
        map.insert(
            key,
            HostWeight {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(map)
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

    /// Opens `spec`: `preset:wan21` (seeded random weights, `seed`), a
    /// diffusers folder (`config.json` + `diffusion_pytorch_model.safetensors`)
    /// or a `.safetensors` file (diffusers or original keys; a `config.json`
    /// beside it is read). Weights are stored as `dtype`.
    pub fn open(ctx: &Context, spec: &str, dtype: DType, seed: u64) -> Result<Self> {
        if let Some(name) = spec.strip_prefix("preset:") {
            if name != "wan21" {
                return Err(Error::InvalidInput(format!(
                    "unknown video preset `{name}` (video presets: wan21)"
                )));
            }
            let store = WeightStore::random_for(ctx, seed);
            store.set_dtype(dtype);
            let mut dec = Self::load(ctx, &store, WanConfig::wan21(), true)?;
            dec.name = format!("wan21 preset (random weights, seed {seed})");
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
        dec.name = format!("Wan 2.1 VAE ({})", file.display());
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
        let stages = cfg.dim_mult.len();
        if stages == 0 || cfg.temperal_downsample.len() + 1 != stages || cfg.base_dim == 0 {
            return Err(bad(
                &origin,
                format!(
                    "a Wan config needs dim_mult of n ≥ 1 stages and n − 1 temperal_downsample flags; got {:?} and {:?}",
                    cfg.dim_mult, cfg.temperal_downsample
                ),
            ));
        }
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
        // dims = base · [mult[-1]] + reversed(mult).
        let mut dims: Vec<usize> = cfg
            .dim_mult
            .iter()
            .rev()
            .map(|m| m * cfg.base_dim)
            .collect();
        let first = dims.first().copied().unwrap_or(0);
        dims.insert(0, first);
        let up_time: Vec<bool> = cfg.temperal_downsample.iter().rev().copied().collect();
        let (b, z) = Builder::new();
        let mut g = GraphBuilder {
            ctx,
            store,
            b,
            slot: 0,
            image,
            planar: false,
        };
        let zc = cfg.z_dim;
        let mut x = z;
        if post_quant_conv {
            let w = load_pointwise(ctx, store, "post_quant_conv", zc, zc, true)?;
            let w = g.b.weights(w);
            x = g.b.conv_plain(x, w, Geometry::Same);
        }
        x = g.causal(x, "decoder.conv_in", [first, zc, 3, 3], Residual::None)?;
        x = g.resblock(x, "decoder.mid_block.resnets.0", first, first)?;
        x = g.attention(x, "decoder.mid_block.attentions.0", first)?;
        x = g.resblock(x, "decoder.mid_block.resnets.1", first, first)?;
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
                x = g.b.time_upsample(x, w, slot, up);
                t_upscale *= 2;
            } else {
                x = g.b.conv(Conv::new(x, up, Geometry::Upsample));
            }
            width = d_out / 2;
        }
        x = g.rms(x, "decoder.norm_out.gamma", width, false, true)?;
        x = g.causal(x, "decoder.conv_out", [3, width, 3, 3], Residual::None)?;
        store.finish(&["encoder.", "quant_conv."])?;
        Ok(WanDecoder {
            config,
            name: String::from("Wan 2.1 VAE"),
            latents_stats_note: None,
            graph: g.b.finish(x, image.then_some(ImageRange::MinusOneToOne)),
            t_upscale,
        })
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
        1 << (self.config.dim_mult.len().saturating_sub(1))
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

/// True when `path` is a diffusers config of an `AutoencoderKLWan`.
fn is_wan_config(path: &Path) -> bool {
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
fn names_a_class(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_none_or(|v| v.get("_class_name").is_some())
}

/// The tensor names in a `.safetensors` header (`None`: unreadable).
fn header_keys(path: &Path) -> Option<Vec<String>> {
    let header = super::weights::safetensors_header(path)?;
    Some(header.as_object()?.keys().cloned().collect())
}

/// True when `spec` names a Wan VAE (`preset:wan21`, a diffusers folder whose
/// config is `AutoencoderKLWan`, or a file with Wan keys).
pub fn is_wan_video(spec: &str) -> bool {
    // Qwen-Image (2.1) VAE files have Wan's keys but decode images.
    (spec == "preset:wan21" || WanDecoder::is_wan(std::path::Path::new(spec)))
        && !crate::models::qwen_image::is_qwen_image(spec, None)
        && !crate::models::qwen_image21::is_qwen_image21(spec, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config.json with `fields` over Wan 2.1's class name, read back.
    fn config(fields: &str) -> (PathBuf, Result<(WanConfig, Option<String>)>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wgvae-wan-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
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
        let dir = std::env::temp_dir().join(format!("wgvae-wan-class-{}", std::process::id()));
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

    #[test]
    fn original_keys_map_like_the_conversion_script() {
        let m = |k: &str| original_to_diffusers(k, 3);
        assert_eq!(m("conv2.weight").as_deref(), Some("post_quant_conv.weight"));
        assert_eq!(m("conv1.weight"), None);
        assert_eq!(
            m("decoder.conv1.bias").as_deref(),
            Some("decoder.conv_in.bias")
        );
        assert_eq!(
            m("decoder.middle.0.residual.0.gamma").as_deref(),
            Some("decoder.mid_block.resnets.0.norm1.gamma")
        );
        assert_eq!(
            m("decoder.middle.1.to_qkv.weight").as_deref(),
            Some("decoder.mid_block.attentions.0.to_qkv.weight")
        );
        assert_eq!(
            m("decoder.middle.2.residual.6.bias").as_deref(),
            Some("decoder.mid_block.resnets.1.conv2.bias")
        );
        assert_eq!(
            m("decoder.upsamples.5.residual.3.gamma").as_deref(),
            Some("decoder.up_blocks.1.resnets.1.norm2.gamma")
        );
        assert_eq!(
            m("decoder.upsamples.4.shortcut.weight").as_deref(),
            Some("decoder.up_blocks.1.resnets.0.conv_shortcut.weight")
        );
        assert_eq!(
            m("decoder.upsamples.7.time_conv.weight").as_deref(),
            Some("decoder.up_blocks.1.upsamplers.0.time_conv.weight")
        );
        assert_eq!(
            m("decoder.upsamples.11.resample.1.bias").as_deref(),
            Some("decoder.up_blocks.2.upsamplers.0.resample.1.bias")
        );
        assert_eq!(
            m("decoder.upsamples.14.residual.2.weight").as_deref(),
            Some("decoder.up_blocks.3.resnets.2.conv1.weight")
        );
        assert_eq!(
            m("decoder.head.0.gamma").as_deref(),
            Some("decoder.norm_out.gamma")
        );
        assert_eq!(
            m("decoder.head.2.weight").as_deref(),
            Some("decoder.conv_out.weight")
        );
        assert_eq!(m("encoder.conv1.weight"), None);
    }
}
