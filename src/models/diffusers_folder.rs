//! Where a diffusers VAE's files are: a VAE folder or a pipeline folder with
//! `vae/`, its `config.json` and class name, or a single weight file with an
//! optional config beside it. Shared by the single-frame Wan-family loaders
//! (Qwen-Image, Qwen-Image 2.1).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// An error naming the file or folder it is about.
pub(crate) fn bad(origin: &Path, message: impl Into<String>) -> Error {
    Error::BadFile {
        path: origin.to_path_buf(),
        message: message.into(),
    }
}

/// The folder holding a diffusers VAE: `dir` or its `vae/` (a pipeline).
pub(crate) fn vae_dir(dir: &Path) -> PathBuf {
    match dir.join("vae").is_dir() {
        true => dir.join("vae"),
        false => dir.to_path_buf(),
    }
}

/// True when `spec` is a diffusers folder (or a pipeline folder with `vae/`)
/// whose `config.json` names `class`.
pub(crate) fn is_class_folder(spec: &Path, class: &str) -> bool {
    spec.is_dir() && class_of(&vae_dir(spec).join("config.json")).as_deref() == Some(class)
}

/// The `_class_name` of a diffusers `config.json` (`None`: not a regular
/// file, unreadable, not JSON, or without one).
pub(crate) fn class_of(path: &Path) -> Option<String> {
    // A FIFO would block the read (the loader then names it).
    if !path.is_file() {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(v.get("_class_name")?.as_str()?.to_string())
}

/// The weight file and config of `spec`, a diffusers `class` folder (or a
/// pipeline folder with `vae/`) or a single `.safetensors` file. The config
/// is `config` when given; else the folder's `config.json`, or the one
/// beside a single file only when it is a `class` config (a ComfyUI
/// `models/vae/` folder holds other models' configs too).
pub(crate) fn locate(
    spec: &Path,
    class: &str,
    config: Option<&Path>,
) -> Result<(PathBuf, Option<PathBuf>)> {
    let (file, beside) = if spec.is_dir() {
        let dir = vae_dir(spec);
        let file = dir.join("diffusion_pytorch_model.safetensors");
        if !file.exists() {
            return Err(bad(
                &dir,
                format!("a diffusers {class} folder holds `diffusion_pytorch_model.safetensors`; it is not there"),
            ));
        }
        (file, dir.join("config.json"))
    } else {
        (spec.to_path_buf(), spec.with_file_name("config.json"))
    };
    let config = match config {
        Some(c) => Some(c.to_path_buf()),
        None => Some(beside).filter(|c| spec.is_dir() || class_of(c).as_deref() == Some(class)),
    };
    Ok((file, config))
}

/// A model's released config and its reader of a `config.json`.
pub(crate) type Configs<C> = (fn() -> C, fn(&Path) -> crate::error::Result<C>);

/// The weights (as `dtype`), config and display name of a video VAE named
/// by `spec`: `preset:{preset}` (`public()`, seeded random weights `seed`),
/// a diffusers folder (or a pipeline folder with `vae/`) or a
/// `.safetensors` file of `class` (see [`locate`]; without a config of
/// `class`, `public()` with a warning). `family` names the model.
fn open_video_vae<C>(
    ctx: &crate::gpu::Context,
    spec: &str,
    (class, preset, family): (&str, &str, &str),
    (dtype, seed): (crate::tensor::DType, u64),
    (public, from_file): Configs<C>,
) -> crate::error::Result<(crate::models::weights::WeightStore, C, String)> {
    use crate::models::weights::WeightStore;
    if spec.strip_prefix("preset:") == Some(preset) {
        let store = WeightStore::random_for(ctx, seed);
        store.set_dtype(dtype);
        let name = format!("{preset} preset (random weights, seed {seed})");
        return Ok((store, public(), name));
    }
    let (file, config) = locate(Path::new(spec), class, None)?;
    let config = match config {
        Some(c) => from_file(&c)?,
        None => {
            log::warn!(
                "`{}` has no {class} config.json beside it: the released configuration is assumed",
                file.display()
            );
            public()
        }
    };
    let store = WeightStore::from_safetensors(&file)?;
    store.set_dtype(dtype);
    Ok((store, config, format!("{family} ({})", file.display())))
}

/// [`open_video_vae`], then `load` on the weights and config it read: the
/// model and its display name.
pub(crate) fn open_video_model<C, M>(
    ctx: &crate::gpu::Context,
    spec: &str,
    names: (&str, &str, &str),
    load_as: (crate::tensor::DType, u64),
    configs: Configs<C>,
    load: fn(
        &crate::gpu::Context,
        &crate::models::weights::WeightStore,
        C,
    ) -> crate::error::Result<M>,
) -> crate::error::Result<(M, String)> {
    let (store, config, name) = open_video_vae(ctx, spec, names, load_as, configs)?;
    Ok((load(ctx, &store, config)?, name))
}

/// A diffusers `config.json` of `class` read field by field: each getter
/// takes a field's default when it is missing or null and names the file,
/// the field, what it holds and what is expected otherwise.
pub(crate) struct ConfigFields<'a> {
    path: &'a Path,
    v: serde_json::Value,
}

impl<'a> ConfigFields<'a> {
    /// Reads `path`, refusing invalid JSON and another `_class_name`.
    pub(crate) fn read(path: &'a Path, class: &str) -> crate::error::Result<Self> {
        let text = crate::io::read_text_file(path)?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| bad(path, format!("config.json is not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(bad(
                path,
                format!("config.json holds {v}, not an object of {class} fields"),
            ));
        }
        if let Some(c) = v
            .get("_class_name")
            .and_then(|c| c.as_str())
            .filter(|c| *c != class)
        {
            return Err(bad(
                path,
                format!("config.json is a `{c}`, not an `{class}`"),
            ));
        }
        Ok(ConfigFields { path, v })
    }

    /// The field `k`, `None` when missing or null.
    pub(crate) fn get(&self, k: &str) -> Option<&serde_json::Value> {
        self.v.get(k).filter(|x| !x.is_null())
    }

    fn bad(&self, k: &str, x: &serde_json::Value, expected: &str) -> crate::error::Error {
        bad(
            self.path,
            format!("config.json: `{k}` is {x}; expected {expected}"),
        )
    }

    fn whole_of(
        &self,
        k: &str,
        x: &serde_json::Value,
        (lo, hi): (u64, u64),
    ) -> crate::error::Result<usize> {
        x.as_u64()
            .filter(|n| (lo..=hi).contains(n))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.bad(k, x, &format!("a whole number from {lo} to {hi}")))
    }

    /// A whole number in `lo..=hi`.
    pub(crate) fn int(
        &self,
        k: &str,
        default: usize,
        range: (u64, u64),
    ) -> crate::error::Result<usize> {
        self.get(k)
            .map_or(Ok(default), |x| self.whole_of(k, x, range))
    }

    /// A list of 1 to 8 whole numbers in `lo..=hi`.
    pub(crate) fn ints(
        &self,
        k: &str,
        default: &[usize],
        range: (u64, u64),
    ) -> crate::error::Result<Vec<usize>> {
        match self.get(k) {
            None => Ok(default.to_vec()),
            Some(serde_json::Value::Array(a)) if (1..=8).contains(&a.len()) => {
                a.iter().map(|x| self.whole_of(k, x, range)).collect()
            }
            Some(x) => Err(self.bad(k, x, "a list of 1 to 8 whole numbers")),
        }
    }

    /// A boolean.
    pub(crate) fn flag(&self, k: &str, default: bool) -> crate::error::Result<bool> {
        match self.get(k) {
            None => Ok(default),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.bad(k, x, "true or false")),
        }
    }

    /// A list of `n` finite numbers.
    pub(crate) fn floats(
        &self,
        k: &str,
        default: &[f32],
        n: usize,
    ) -> crate::error::Result<Vec<f32>> {
        match self.get(k) {
            None => Ok(default.to_vec()),
            Some(serde_json::Value::Array(a)) if a.len() == n => a
                .iter()
                .map(|x| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| self.bad(k, x, "a finite number"))
                })
                .collect(),
            Some(x) => Err(self.bad(
                k,
                x,
                &format!("a list of {n} numbers (one per latent channel)"),
            )),
        }
    }

    /// A finite non-zero number.
    pub(crate) fn factor(&self, k: &str, default: f32) -> crate::error::Result<f32> {
        match self.get(k) {
            None => Ok(default),
            Some(x) => x
                .as_f64()
                .map(|f| f as f32)
                .filter(|f| f.is_finite() && *f != 0.0)
                .ok_or_else(|| self.bad(k, x, "a finite non-zero number")),
        }
    }
}
