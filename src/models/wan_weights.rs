//! Reading a Wan-architecture weight file: diffusers keys as they are, the
//! original `wan/modules/vae.py` keys (ComfyUI's `wan_2.1_vae.safetensors`)
//! renamed to diffusers', everything but the decoder dropped.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::models::diffusers_folder::bad;
use crate::models::taehv::TaehvDecoder;
use crate::models::weights::{HostWeight, Layout, WeightStore};
use crate::tensor::DType;

/// The original `wan/modules/vae.py` (Wan 2.1: `decoder.upsamples.N`) or
/// `vae2_2.py` (Wan 2.2: `decoder.upsamples.I.upsamples.J`) key of a
/// decoder weight → its diffusers name (as diffusers'
/// `convert_wan_to_diffusers.py`); `per_block`: residual blocks per up
/// stage. `None`: not a decoder key.
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
    if let Some(t) = t.strip_prefix("upsamples.") {
        // Wan 2.2 (`vae2_2.py`): stage `f` holds `per_block` residual
        // blocks, then its Resample.
        let (j, t) = t.split_once('.')?;
        let j: usize = j.parse().ok()?;
        return if j < per_block {
            Some(format!(
                "decoder.up_blocks.{f}.resnets.{j}.{}",
                residual(t)?
            ))
        } else {
            Some(format!("decoder.up_blocks.{f}.upsampler.{t}"))
        };
    }
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

/// The decoder weights of a Wan file (`path`, a `.safetensors`), diffusers-named.
pub(crate) fn read_wan_weights(path: &Path) -> Result<BTreeMap<String, HostWeight>> {
    if TaehvDecoder::is_taehv_file(path) {
        return Err(bad(
            path,
            "this is a TAEHV file (a tiny video decoder, `decoder.N…` keys), not a Wan VAE: load it with `TaehvDecoder`",
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
                "not a Wan VAE: no `decoder.mid_block.…` (diffusers) or `decoder.middle.…` (original) keys; found keys like {}",
                sample.join(", ")
            ),
        ));
    }
    // Residual blocks per stage: the upsamples index of the first Resample
    // (Wan 2.2: within its stage).
    let per_block = names
        .iter()
        .filter_map(|n| {
            let t = n.strip_prefix("decoder.upsamples.")?;
            let (f, rest) = t.split_once('.')?;
            let (f, rest) = match rest.strip_prefix("upsamples.") {
                Some(inner) => inner.split_once('.')?,
                None => (f, rest),
            };
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

/// The tensor names in a `.safetensors` header (`None`: unreadable).
pub(crate) fn header_keys(path: &Path) -> Option<Vec<String>> {
    let header = super::weights::safetensors_header(path)?;
    Some(header.as_object()?.keys().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Wan 2.2's nested `decoder.upsamples.I.upsamples.J` (`vae2_2.py`):
    /// J < per_block residual blocks, then the stage's Resample.
    #[test]
    fn wan22_original_keys_map_to_residual_up_blocks() {
        let m = |k: &str| original_to_diffusers(k, 3);
        assert_eq!(
            m("decoder.upsamples.1.upsamples.2.residual.6.weight").as_deref(),
            Some("decoder.up_blocks.1.resnets.2.conv2.weight")
        );
        assert_eq!(
            m("decoder.upsamples.0.upsamples.0.shortcut.bias").as_deref(),
            Some("decoder.up_blocks.0.resnets.0.conv_shortcut.bias")
        );
        assert_eq!(
            m("decoder.upsamples.0.upsamples.3.time_conv.weight").as_deref(),
            Some("decoder.up_blocks.0.upsampler.time_conv.weight")
        );
        assert_eq!(
            m("decoder.upsamples.2.upsamples.3.resample.1.bias").as_deref(),
            Some("decoder.up_blocks.2.upsampler.resample.1.bias")
        );
    }
}
