//! Weight files: diffusers, original LDM (single-file checkpoints and bare VAE
//! files) and TAE layouts, normalised to one naming (diffusers') on load.
//! Weights are converted to f32 on the host and uploaded once by the models.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::latents::LatentBatchNorm;
use crate::tensor::DType;

/// How the keys of a weight file are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `decoder.up_blocks.0.resnets.1.conv2.weight`, …
    Diffusers,
    /// `first_stage_model.decoder.up.3.block.1.conv2.weight` or the same without the prefix.
    Ldm,
    /// TAESD `nn.Sequential` indices: `1.weight`, `3.conv.0.weight`, `3.pool.1.weight`, …
    Tae,
    /// TAEHV (video) state dicts: `decoder.3.conv.0.weight`, `encoder.0.weight`, …
    /// held as TAE indices of the part loaded (the prefix stripped).
    Taehv,
}

/// One host weight: shape and f32 values.
#[derive(Clone, Debug)]
pub struct HostWeight {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Values (f32; converted from the file's dtype).
    pub data: Vec<f32>,
}

enum Source {
    File(BTreeMap<String, HostWeight>),
    /// Seeded random weights of whatever shape the model asks for; without
    /// `values` (a null device's estimate, which reads none), zeros of that shape.
    Random {
        seed: u64,
        values: bool,
    },
}

/// Named weights with bookkeeping: which keys the model used, which it asked
/// for and did not find, so a mismatch names every missing and unexpected key.
pub struct WeightStore {
    source: Source,
    origin: String,
    layout: Layout,
    used: RefCell<BTreeSet<String>>,
    missing: RefCell<Vec<String>>,
    wrong_shape: RefCell<Vec<String>>,
    /// Values handed out as zeros for missing or misshapen keys so far.
    zero_filled: std::cell::Cell<usize>,
    /// Storage dtype of the convolution weights uploaded from this store.
    dtype: std::cell::Cell<DType>,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The JSON header of a `.safetensors` file, read without its tensors (a
/// front end tells models apart before loading weights); `None` when the
/// file is unreadable or no safetensors file (the loader then says why).
pub(crate) fn safetensors_header(path: &Path) -> Option<serde_json::Value> {
    use std::io::Read;
    // A FIFO or device would block the read: regular files only.
    if !path.is_file() {
        return None;
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    // safetensors caps headers at 100 MB.
    if len > 100_000_000 {
        return None;
    }
    let mut bytes = vec![0u8; len];
    f.read_exact(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Maps an LDM key (prefix already stripped) to its diffusers name.
/// `up_blocks` is the number of decoder up blocks (LDM numbers them in reverse).
pub(crate) fn ldm_to_diffusers(key: &str, up_blocks: usize) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let rest = |from: usize| parts.get(from..).unwrap_or_default().join(".");
    let resnet_tail = |s: String| s.replacen("nin_shortcut", "conv_shortcut", 1);
    let attn_tail = |s: &str| -> String {
        match s.split_once('.') {
            Some(("norm", t)) => format!("group_norm.{t}"),
            Some(("q", t)) => format!("to_q.{t}"),
            Some(("k", t)) => format!("to_k.{t}"),
            Some(("v", t)) => format!("to_v.{t}"),
            Some(("proj_out", t)) => format!("to_out.0.{t}"),
            _ => s.to_string(),
        }
    };
    match parts.as_slice() {
        [side @ ("encoder" | "decoder"), "mid", blk, ..] => {
            let tail = rest(3);
            match *blk {
                "block_1" => format!("{side}.mid_block.resnets.0.{}", resnet_tail(tail)),
                "block_2" => format!("{side}.mid_block.resnets.1.{}", resnet_tail(tail)),
                "attn_1" => format!("{side}.mid_block.attentions.0.{}", attn_tail(&tail)),
                _ => key.to_string(),
            }
        }
        [side @ ("encoder" | "decoder"), "norm_out", ..] => {
            format!("{side}.conv_norm_out.{}", rest(2))
        }
        ["decoder", "up", i, "block", j, ..] => {
            let i: usize = i.parse().unwrap_or(usize::MAX);
            let d = up_blocks.wrapping_sub(1).wrapping_sub(i);
            format!("decoder.up_blocks.{d}.resnets.{j}.{}", resnet_tail(rest(5)))
        }
        ["decoder", "up", i, "upsample", ..] => {
            let i: usize = i.parse().unwrap_or(usize::MAX);
            let d = up_blocks.wrapping_sub(1).wrapping_sub(i);
            format!("decoder.up_blocks.{d}.upsamplers.0.{}", rest(4))
        }
        ["encoder", "down", i, "block", j, ..] => {
            format!(
                "encoder.down_blocks.{i}.resnets.{j}.{}",
                resnet_tail(rest(5))
            )
        }
        // BFL's FLUX.2 file (ComfyUI's `flux2-vae.safetensors`) keeps the quant
        // convs inside the encoder and decoder.
        ["decoder", "post_quant_conv", ..] => format!("post_quant_conv.{}", rest(2)),
        ["encoder", "quant_conv", ..] => format!("quant_conv.{}", rest(2)),
        ["encoder", "down", i, "downsample", ..] => {
            format!("encoder.down_blocks.{i}.downsamplers.0.{}", rest(4))
        }
        _ => key.to_string(),
    }
}

/// True for keys that belong to a VAE (after the LDM prefix is stripped).
fn is_vae_key(k: &str) -> bool {
    ["encoder.", "decoder.", "quant_conv.", "post_quant_conv."]
        .iter()
        .any(|p| k.starts_with(p))
        // FLUX.2's latent BatchNorm statistics (not `bn.num_batches_tracked`, an int64).
        || k == BN_MEAN
        || k == BN_VAR
        // LTX-2's latent statistics buffers.
        || k == "latents_mean"
        || k == "latents_std"
}

/// FLUX.2's latent BatchNorm running mean (`AutoencoderKLFlux2.bn`).
pub(crate) const BN_MEAN: &str = "bn.running_mean";
/// FLUX.2's latent BatchNorm running variance.
pub(crate) const BN_VAR: &str = "bn.running_var";

/// Which half of a diffusers `AutoencoderTiny` file to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaePart {
    /// `decoder.layers.N` keys.
    Decoder,
    /// `encoder.layers.N` keys.
    Encoder,
}

/// `decoder.layers.N.rest` → `{N+1}.rest` (TAESD's decoder has the Clamp at
/// index 0), `encoder.layers.N.rest` → `N.rest`; `None` for the other half.
fn diffusers_tiny_to_tae(key: &str, part: TaePart) -> Option<String> {
    let (prefix, shift) = match part {
        TaePart::Decoder => ("decoder.layers.", 1),
        TaePart::Encoder => ("encoder.layers.", 0),
    };
    let rest = key.strip_prefix(prefix)?;
    let (index, tail) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    Some(format!("{}.{tail}", index + shift))
}

/// `decoder.N.rest` → `N.rest` (or `encoder.`, per `part`); `None` for the
/// other half or a key without an index.
fn taehv_to_tae(key: &str, part: TaePart) -> Option<String> {
    let prefix = match part {
        TaePart::Decoder => "decoder.",
        TaePart::Encoder => "encoder.",
    };
    key.strip_prefix(prefix)
        .filter(|rest| is_tae_key(rest))
        .map(String::from)
}

/// A TAEHV state-dict key: `decoder.N…` or `encoder.N…`.
fn is_taehv_key(k: &str) -> bool {
    ["decoder.", "encoder."]
        .iter()
        .any(|p| k.strip_prefix(p).is_some_and(is_tae_key))
}

fn is_tae_key(k: &str) -> bool {
    k.split('.')
        .next()
        .is_some_and(|i| i.parse::<usize>().is_ok())
}

impl WeightStore {
    /// Seeded random weights (for presets used in benchmarks and memory studies).
    pub fn random(seed: u64) -> Self {
        Self::seeded(seed, true)
    }

    /// [`WeightStore::random`] for a model loaded on `ctx`: on a null device
    /// ([`Context::is_null`], memory estimates) no kernel reads a value, so
    /// the values are zeros (untouched pages) instead of 49 M generated numbers.
    pub(crate) fn random_for(ctx: &crate::gpu::Context, seed: u64) -> Self {
        Self::seeded(seed, !ctx.is_null())
    }

    fn seeded(seed: u64, values: bool) -> Self {
        Self::with_source(
            Source::Random { seed, values },
            format!("random weights (seed {seed})"),
            Layout::Diffusers,
        )
    }

    fn with_source(source: Source, origin: String, layout: Layout) -> Self {
        WeightStore {
            source,
            origin,
            layout,
            used: RefCell::default(),
            missing: RefCell::default(),
            wrong_shape: RefCell::default(),
            zero_filled: std::cell::Cell::new(0),
            dtype: std::cell::Cell::new(DType::F32),
        }
    }

    /// Storage dtype for the weights models load from here (f32 by default):
    /// a model's activations take its weights' dtype.
    pub fn set_dtype(&self, dtype: DType) {
        self.dtype.set(dtype);
    }
    /// Storage dtype weights are uploaded in.
    pub fn dtype(&self) -> DType {
        self.dtype.get()
    }

    /// Weights already in host memory, keys in diffusers or TAE naming.
    pub fn from_map(map: BTreeMap<String, HostWeight>, layout: Layout, origin: &str) -> Self {
        Self::with_source(Source::File(map), origin.to_string(), layout)
    }

    /// Reads a `.safetensors` file, detects its layout and renames LDM keys.
    /// Of a full checkpoint only the VAE (`first_stage_model.`) is kept. Of a
    /// diffusers `AutoencoderTiny` file, the decoder, renamed to the TAESD
    /// layout (see [`WeightStore::from_safetensors_part`]).
    pub fn from_safetensors(path: &Path) -> Result<Self> {
        Self::from_safetensors_part(path, TaePart::Decoder)
    }

    /// [`WeightStore::from_safetensors`], choosing which half of a diffusers
    /// `AutoencoderTiny` file (`decoder.layers.N.…`, `encoder.layers.N.…`) to
    /// keep. Its keys become TAESD `nn.Sequential` keys: the decoder's index
    /// shifts by one (TAESD's decoder starts with a Clamp module that diffusers
    /// applies in `forward`), the encoder's stays.
    pub fn from_safetensors_part(path: &Path, part: TaePart) -> Result<Self> {
        crate::io::require_regular_file(path)?;
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if file.metadata().map(|m| m.len()).unwrap_or(1) == 0 {
            return Err(bad(
                path,
                "the file is empty; expected .safetensors VAE weights",
            ));
        }
        // SAFETY: read-only map of a file we do not modify; a concurrent writer could
        // only corrupt values, which the safetensors header checks bound.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_safetensors_bytes(&mmap, path, part)
    }

    /// [`WeightStore::from_safetensors_part`] on the file's bytes; `path`
    /// names it in errors.
    #[doc(hidden)]
    pub fn from_safetensors_bytes(bytes: &[u8], path: &Path, part: TaePart) -> Result<Self> {
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| bad(path, format!("not a valid .safetensors file: {e}")))?;
        let names: Vec<String> = st.names().into_iter().map(String::from).collect();
        if names.is_empty() {
            return Err(bad(path, "the file holds no tensors"));
        }
        let has_ldm_prefix = names.iter().any(|n| n.starts_with("first_stage_model."));
        let mut selected: Vec<(String, String)> = Vec::new(); // (file key, stripped key)
        for n in &names {
            let stripped = if has_ldm_prefix {
                match n.strip_prefix("first_stage_model.") {
                    Some(s) => s,
                    None => continue, // UNet / text encoder of a full checkpoint
                }
            } else {
                n.as_str()
            };
            selected.push((n.clone(), stripped.to_string()));
        }
        let diffusers_tiny = selected
            .iter()
            .any(|(_, k)| k.starts_with("decoder.layers.") || k.starts_with("encoder.layers."));
        if diffusers_tiny {
            selected = selected
                .into_iter()
                .filter_map(|(f, k)| Some((f, diffusers_tiny_to_tae(&k, part)?)))
                .collect();
            if selected.is_empty() {
                return Err(bad(
                    path,
                    format!("a diffusers AutoencoderTiny file without {part:?} weights"),
                ));
            }
        }
        let taehv = !diffusers_tiny && selected.iter().all(|(_, k)| is_taehv_key(k));
        if taehv {
            selected = selected
                .into_iter()
                .filter_map(|(f, k)| Some((f, taehv_to_tae(&k, part)?)))
                .collect();
            if selected.is_empty() {
                return Err(bad(path, format!("a TAEHV file without {part:?} weights")));
            }
        }
        let layout = if diffusers_tiny {
            Layout::Tae
        } else if taehv {
            Layout::Taehv
        } else if selected
            .iter()
            .any(|(_, k)| k.starts_with("decoder.mid.") || k.starts_with("encoder.mid."))
        {
            Layout::Ldm
        } else if selected.iter().any(|(_, k)| {
            k.starts_with("decoder.mid_block.")
                || k.starts_with("decoder.conv_in.")
                || k.starts_with("decoder.transformer_blocks.")
        }) {
            Layout::Diffusers
        } else if selected.iter().all(|(_, k)| is_tae_key(k)) {
            Layout::Tae
        } else {
            let mut sample: Vec<&str> = selected.iter().map(|(_, k)| k.as_str()).take(5).collect();
            sample.sort();
            return Err(bad(
                path,
                format!(
                    "unrecognised weight layout (keys like {}); expected a diffusers AutoencoderKL, an LDM/SD checkpoint VAE or a TAESD-family decoder",
                    sample.join(", ")
                ),
            ));
        };
        let up_blocks = selected
            .iter()
            .filter_map(|(_, k)| k.strip_prefix("decoder.up."))
            .filter_map(|r| r.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1);
        let mut map = BTreeMap::new();
        for (file_key, key) in selected {
            if !matches!(layout, Layout::Tae | Layout::Taehv) && !is_vae_key(&key) {
                continue;
            }
            let view = st.tensor(&file_key).map_err(|e| bad(path, e.to_string()))?;
            let data =
                crate::io::view_to_f32(&view).map_err(|m| bad(path, format!("{file_key}: {m}")))?;
            let name = if layout == Layout::Ldm {
                ldm_to_diffusers(&key, up_blocks)
            } else {
                key
            };
            map.insert(
                name,
                HostWeight {
                    shape: view.shape().to_vec(),
                    data,
                },
            );
        }
        Ok(Self::with_source(
            Source::File(map),
            path.display().to_string(),
            layout,
        ))
    }

    /// Key layout (diffusers, LDM or TAE).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Where the weights come from (file path or `random (seed N)`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// True for seeded random weights.
    pub(crate) fn is_random(&self) -> bool {
        matches!(self.source, Source::Random { .. })
    }

    /// Shape of a stored key (`None` for random weights or absent keys).
    pub(crate) fn shape_of(&self, key: &str) -> Option<Vec<usize>> {
        match &self.source {
            Source::File(m) => m.get(key).map(|w| w.shape.clone()),
            Source::Random { .. } => None,
        }
    }

    /// The shape `[out, in, k, k]` of conv weight `key`, which a layout
    /// detection relies on: missing is an error saying `missing` (what the
    /// file probably is), any other rank an error naming the shape.
    pub(crate) fn conv_shape(&self, key: &str, missing: &str) -> Result<[usize; 4]> {
        let bad = |message: String| Error::BadFile {
            path: self.origin().into(),
            message,
        };
        let shape = self.shape_of(key).ok_or_else(|| bad(missing.to_string()))?;
        <[usize; 4]>::try_from(shape.as_slice()).map_err(|_| {
            bad(format!(
                "`{key}` has shape {shape:?}; expected a conv weight [out, in, k, k]"
            ))
        })
    }

    /// True when the store holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        match &self.source {
            Source::File(m) => m.contains_key(key),
            Source::Random { .. } => false,
        }
    }

    /// Every stored key.
    pub fn keys(&self) -> Vec<String> {
        match &self.source {
            Source::File(m) => m.keys().cloned().collect(),
            Source::Random { .. } => Vec::new(),
        }
    }

    /// The values of `key`, which must have `shape` (a linear `[o, i]` also
    /// matches a 1×1 conv `[o, i, 1, 1]`). A missing or misshapen key is
    /// recorded, zeros are returned, and [`WeightStore::finish`] reports it —
    /// unless the model's tensor is larger than any in the file and 2^24 values (a config
    /// far off the weights): that stops the load at once, before zeros of an
    /// absurd size exist.
    pub fn take(&self, key: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let m = match &self.source {
            Source::Random { seed, values } => {
                return Ok(if *values {
                    random_weight(*seed, key, shape)
                } else {
                    vec![0.0; shape.iter().product()]
                })
            }
            Source::File(m) => m,
        };
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        // Zeros for a small missing key are cheap (and let `finish` name
        // every mismatch); only a tensor beyond both 2^24 values and the
        // file's largest stops the load here (the scan only for such sizes).
        let fits =
            |n: usize| n <= 1 << 24 || n <= m.values().map(|w| w.data.len()).max().unwrap_or(0);
        let Some(n) = n.filter(|&n| fits(n)) else {
            let found = m.get(key).map(|w| format!("{:?}", w.shape));
            return Err(Error::BadFile {
                path: PathBuf::from(&self.origin),
                message: format!(
                    "weights do not match the model ({:?} layout): the model needs `{key}` of shape {shape:?}, larger than any tensor in the file (file has {}). Is this the right model, or does its config.json (block_out_channels, latent_channels) describe another one?",
                    self.layout,
                    found.unwrap_or_else(|| "no such key".into())
                ),
            });
        };
        Ok(match m.get(key) {
            Some(w) => {
                self.used.borrow_mut().insert(key.to_string());
                let squeeze =
                    |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
                if w.shape == shape || (w.data.len() == n && squeeze(&w.shape) == squeeze(shape)) {
                    if let Some((i, v)) = w.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                        return Err(Error::BadFile {
                            path: PathBuf::from(&self.origin),
                            message: format!(
                                "weight `{key}` holds {v} at flat index {i}: the file is damaged or was saved from a diverged model; NaN/Inf weights would decode to an all-NaN image"
                            ),
                        });
                    }
                    w.data.clone()
                } else {
                    self.wrong_shape.borrow_mut().push(format!(
                        "{key}: file has {:?}, model needs {shape:?}",
                        w.shape
                    ));
                    self.zeros(n)?
                }
            }
            None => {
                self.missing.borrow_mut().push(format!("{key} {shape:?}"));
                self.zeros(n)?
            }
        })
    }

    /// Zeros standing in for a mismatched key until [`WeightStore::finish`]
    /// names them all; once they pass [`ZERO_FILL_LIMIT`] values in all, the
    /// config is far off the file (e.g. `layers_per_block: 64` against a file
    /// of 2) and the load stops with the mismatches so far.
    fn zeros(&self, n: usize) -> Result<Vec<f32>> {
        let total = self.zero_filled.get().saturating_add(n);
        self.zero_filled.set(total);
        if total > ZERO_FILL_LIMIT {
            return Err(self.mismatch(&[], true).unwrap_or_else(|| {
                Error::Internal("zero-filled weights without a recorded mismatch".into())
            }));
        }
        Ok(vec![0.0; n])
    }

    /// Errors naming every missing, misshapen and unexpected key. Keys under
    /// `ignore` prefixes (e.g. the encoder when decoding) are not unexpected.
    pub fn finish(&self, ignore: &[&str]) -> Result<()> {
        match self.mismatch(ignore, false) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The error naming every mismatch (`None`: none). `stopped`: the load
    /// stopped early, so keys not asked for yet are not called unexpected.
    fn mismatch(&self, ignore: &[&str], stopped: bool) -> Option<Error> {
        let Source::File(m) = &self.source else {
            return None;
        };
        let used = self.used.borrow();
        let unexpected: Vec<&String> = m
            .keys()
            .filter(|k| !stopped && !used.contains(*k) && !ignore.iter().any(|p| k.starts_with(p)))
            .collect();
        let missing = self.missing.borrow();
        let wrong = self.wrong_shape.borrow();
        if missing.is_empty() && wrong.is_empty() && unexpected.is_empty() {
            return None;
        }
        let mut msg = format!("weights do not match the model ({:?} layout)", self.layout);
        if stopped {
            msg += &format!(
                ", loading stopped after {} values of zeros for missing or misshapen keys",
                self.zero_filled.get()
            );
        }
        let list = |v: Vec<String>| {
            let n = v.len();
            let mut s: Vec<String> = v.into_iter().take(12).collect();
            if n > 12 {
                s.push(format!("… and {} more", n - 12));
            }
            s.join(", ")
        };
        if !missing.is_empty() {
            msg += &format!(
                "; missing {} keys: {}",
                missing.len(),
                list(missing.clone())
            );
        }
        if !wrong.is_empty() {
            msg += &format!("; wrong shapes: {}", list(wrong.clone()));
        }
        if !unexpected.is_empty() {
            msg += &format!(
                "; {} unexpected keys: {}",
                unexpected.len(),
                list(unexpected.into_iter().cloned().collect())
            );
        }
        Some(Error::BadFile {
            path: PathBuf::from(&self.origin),
            message: msg + ". Is this the right model, or does it need a config.json?",
        })
    }
}

/// Most zeros (values) a [`WeightStore`] hands out for mismatched keys
/// before it stops the load: 2^26 (256 MiB of f32), more than any real
/// VAE's weights (SD's decoder has 49 M values).
pub(crate) const ZERO_FILL_LIMIT: usize = 1 << 26;

/// Deterministic weights for a key: PyTorch's default init bound 1/sqrt(fan_in)
/// for conv/linear weights and biases, GroupNorm weight 1 and bias 0.
fn random_weight(seed: u64, key: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    // A BatchNorm's statistics: the identity (mean 0, variance 1).
    if key == BN_MEAN || key == BN_VAR {
        return vec![if key == BN_VAR { 1.0 } else { 0.0 }; n];
    }
    let is_norm = key.contains("norm");
    if is_norm && shape.len() == 1 {
        let v = if key.ends_with(".weight") { 1.0 } else { 0.0 };
        return vec![v; n];
    }
    let fan_in = match shape.get(1..) {
        Some(rest) if !rest.is_empty() => rest.iter().product::<usize>(),
        _ => 64,
    };
    let bound = 1.0 / (fan_in as f32).sqrt();
    let h = key.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    crate::seeded::uniform(n, h, bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldm_names_map_to_diffusers() {
        let m = |k| ldm_to_diffusers(k, 4);
        assert_eq!(
            m("decoder.up.3.block.1.conv2.weight"),
            "decoder.up_blocks.0.resnets.1.conv2.weight"
        );
        assert_eq!(
            m("decoder.up.0.block.0.nin_shortcut.bias"),
            "decoder.up_blocks.3.resnets.0.conv_shortcut.bias"
        );
        assert_eq!(
            m("decoder.up.2.upsample.conv.weight"),
            "decoder.up_blocks.1.upsamplers.0.conv.weight"
        );
        assert_eq!(
            m("decoder.mid.attn_1.proj_out.weight"),
            "decoder.mid_block.attentions.0.to_out.0.weight"
        );
        assert_eq!(
            m("decoder.mid.attn_1.norm.bias"),
            "decoder.mid_block.attentions.0.group_norm.bias"
        );
        assert_eq!(
            m("decoder.mid.block_2.norm1.weight"),
            "decoder.mid_block.resnets.1.norm1.weight"
        );
        assert_eq!(m("decoder.norm_out.weight"), "decoder.conv_norm_out.weight");
        assert_eq!(
            m("encoder.down.1.downsample.conv.bias"),
            "encoder.down_blocks.1.downsamplers.0.conv.bias"
        );
        assert_eq!(m("post_quant_conv.weight"), "post_quant_conv.weight");
    }

    #[test]
    fn zero_fill_stops_at_its_limit() {
        let mut map = BTreeMap::new();
        map.insert(
            "kept".to_string(),
            HostWeight {
                shape: vec![2],
                data: vec![1.0; 2],
            },
        );
        let s = WeightStore::from_map(map, Layout::Diffusers, "far-off.safetensors");
        // Keys of 2^24 values each (not beyond the per-key stop): the fifth
        // passes 2^26 zeros in all.
        let shape = [1usize << 12, 1 << 12];
        for i in 0..4 {
            assert_eq!(s.take(&format!("layer{i}"), &shape).unwrap().len(), 1 << 24);
        }
        let e = s.take("layer4", &shape).unwrap_err().to_string();
        assert!(e.contains("far-off.safetensors"), "{e}");
        assert!(
            e.contains("loading stopped after 83886080 values of zeros"),
            "{e}"
        );
        assert!(e.contains("missing 5 keys: layer0 [4096, 4096]"), "{e}");
        assert!(!e.contains("unexpected"), "{e}");
    }

    #[test]
    fn mismatches_name_every_key() {
        let mut map = BTreeMap::new();
        map.insert(
            "a".to_string(),
            HostWeight {
                shape: vec![2, 2],
                data: vec![0.0; 4],
            },
        );
        map.insert(
            "b".to_string(),
            HostWeight {
                shape: vec![3],
                data: vec![0.0; 3],
            },
        );
        map.insert(
            "encoder.x".to_string(),
            HostWeight {
                shape: vec![1],
                data: vec![0.0],
            },
        );
        let s = WeightStore::from_map(map, Layout::Diffusers, "test");
        assert_eq!(s.take("a", &[2, 2, 1, 1]).unwrap().len(), 4); // linear == 1x1 conv
        s.take("b", &[4]).unwrap();
        s.take("c", &[5]).unwrap();
        let e = s.finish(&["encoder."]).unwrap_err().to_string();
        assert!(e.contains("missing 1 keys: c [5]"), "{e}");
        assert!(e.contains("b: file has [3], model needs [4]"), "{e}");
        assert!(!e.contains("unexpected"), "{e}");
    }

    #[test]
    fn random_weights_are_deterministic() {
        let take = |key: &str, shape: &[usize]| WeightStore::random(7).take(key, shape).unwrap();
        let a = take("decoder.conv_in.weight", &[8, 4, 3, 3]);
        let b = take("decoder.conv_in.weight", &[8, 4, 3, 3]);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| v.abs() <= 1.0 / 6.0));
        assert_eq!(take("decoder.conv_norm_out.weight", &[4]), vec![1.0; 4]);
    }

    /// A config far off the file stops at the first tensor larger than any
    /// the file holds (and than 2^24 values), before zeros of that size
    /// exist; a wrapping shape too.
    #[test]
    fn a_tensor_larger_than_the_file_stops_the_load() {
        let mut map = BTreeMap::new();
        let w = HostWeight {
            shape: vec![4, 4],
            data: vec![0.0; 16],
        };
        map.insert("a".to_string(), w);
        let s = WeightStore::from_map(map, Layout::Diffusers, "test.safetensors");
        s.take("missing", &[16]).unwrap();
        let mut nan = BTreeMap::new();
        let w = HostWeight {
            shape: vec![3],
            data: vec![0.0, f32::NAN, 1.0],
        };
        nan.insert("w".to_string(), w);
        let bad = WeightStore::from_map(nan, Layout::Diffusers, "nan.safetensors");
        let e = bad.take("w", &[3]).unwrap_err().to_string();
        assert!(
            e.contains("nan.safetensors") && e.contains("`w` holds NaN at flat index 1"),
            "{e}"
        );
        // Layout detection reads shapes off the file: a rank it does not
        // expect is an error naming the key, not an index out of bounds.
        let e = s.conv_shape("a", "no a").unwrap_err().to_string();
        assert!(
            e.contains("`a` has shape [4, 4]; expected a conv weight"),
            "{e}"
        );
        let e = s.conv_shape("b", "no conv b here").unwrap_err().to_string();
        assert!(e.contains("no conv b here"), "{e}");
        for shape in [&[1 << 20, 1 << 20][..], &[usize::MAX, 2]] {
            let e = s.take("a", shape).unwrap_err().to_string();
            assert!(e.contains("test.safetensors"), "{e}");
            assert!(
                e.contains("larger than any tensor in the file (file has [4, 4])"),
                "{e}"
            );
        }
    }
}

#[cfg(test)]
mod tiny_key_tests {
    use super::*;

    #[test]
    fn diffusers_autoencoder_tiny_keys_map_to_taesd_indices() {
        let d = TaePart::Decoder;
        let e = TaePart::Encoder;
        // TAESD's decoder has the Clamp at index 0; diffusers applies it in forward().
        assert_eq!(
            diffusers_tiny_to_tae("decoder.layers.0.weight", d).as_deref(),
            Some("1.weight")
        );
        assert_eq!(
            diffusers_tiny_to_tae("decoder.layers.17.conv.4.bias", d).as_deref(),
            Some("18.conv.4.bias")
        );
        assert_eq!(
            diffusers_tiny_to_tae("encoder.layers.14.weight", e).as_deref(),
            Some("14.weight")
        );
        // The other half, and anything else, is dropped.
        assert_eq!(diffusers_tiny_to_tae("encoder.layers.0.weight", d), None);
        assert_eq!(diffusers_tiny_to_tae("decoder.layers.0.weight", e), None);
        assert_eq!(diffusers_tiny_to_tae("decoder.layers.x.weight", d), None);
        assert_eq!(diffusers_tiny_to_tae("decoder.conv_in.weight", d), None);
    }
}

/// FLUX.2's latent BatchNorm, read from the weights (the latents module stays below models).
impl WeightStore {
    /// Reads `bn.running_mean` / `bn.running_var` (`channels` each) from
    /// this store; `None` when the file has neither (it then decodes raw z only).
    pub fn latent_batch_norm(&self, channels: usize, eps: f32) -> Result<Option<LatentBatchNorm>> {
        let (has_mean, has_var) = (self.contains(BN_MEAN), self.contains(BN_VAR));
        if !self.is_random() {
            match (has_mean, has_var) {
                (false, false) => {
                    log::warn!(
                        "{}: a FLUX.2 VAE without `{BN_MEAN}` / `{BN_VAR}`: only raw latents (z) can be decoded",
                        self.origin()
                    );
                    return Ok(None);
                }
                (true, false) | (false, true) => {
                    let missing = if has_mean { BN_VAR } else { BN_MEAN };
                    return Err(Error::BadFile {
                        path: self.origin().into(),
                        message: format!(
                            "a FLUX.2 VAE needs both `{BN_MEAN}` and `{BN_VAR}` (its latent BatchNorm statistics, {channels} values each); `{missing}` is missing: the file is incomplete, use the full VAE file"
                        ),
                    });
                }
                _ => {}
            }
        }
        let mean = self.take(BN_MEAN, &[channels])?;
        let var = self.take(BN_VAR, &[channels])?;
        let std: Vec<f32> = var.iter().map(|v| (v + eps).sqrt()).collect();
        if let Some((i, v)) = var
            .iter()
            .enumerate()
            .find(|(i, _)| !std.get(*i).is_some_and(|s| s.is_finite() && *s > 0.0))
        {
            return Err(Error::BadFile {
                path: self.origin().into(),
                message: format!(
                    "`{BN_VAR}` holds {v} at index {i}: a variance must be non-negative (with batch_norm_eps {eps}, positive)"
                ),
            });
        }
        Ok(Some(LatentBatchNorm { mean, std }))
    }
}
