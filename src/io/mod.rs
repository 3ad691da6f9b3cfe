//! Files in and out: latents (`.npy`, `.safetensors`), raw outputs (`.npy`)
//! and images (PNG). Every malformed input is an [`Error`] naming the file
//! and what was expected.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A host tensor of f32 values in C order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Values in C (row-major) order.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// A tensor of `shape` holding `data`; an error unless the sizes match.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(data.len()) {
            return Err(Error::InvalidInput(format!(
                "{} values do not fill shape {shape:?}",
                data.len()
            )));
        }
        Ok(HostTensor { shape, data })
    }

    /// `self[:, :, y0..y1, x0..x1]` of an `[N, C, H, W]` tensor (the ranges
    /// must lie inside it).
    // Internal: the tilers pass ranges inside the tensor they planned.
    #[allow(clippy::indexing_slicing)]
    pub fn crop(&self, y0: usize, y1: usize, x0: usize, x1: usize) -> HostTensor {
        let [n, c, h, w] = [self.shape[0], self.shape[1], self.shape[2], self.shape[3]];
        let mut data = Vec::with_capacity(n * c * (y1 - y0) * (x1 - x0));
        for p in 0..n * c {
            for y in y0..y1 {
                let row = (p * h + y) * w;
                data.extend_from_slice(&self.data[row + x0..row + x1]);
            }
        }
        HostTensor {
            shape: vec![n, c, y1 - y0, x1 - x0],
            data,
        }
    }
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The text of the regular file at `path` (a config), with the path in errors.
pub(crate) fn read_text_file(path: &Path) -> Result<String> {
    require_regular_file(path)?;
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Fails unless `path` is a regular file: reading a FIFO or a device would
/// block or never end.
pub(crate) fn require_regular_file(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_file() {
        return Ok(());
    }
    let what = if meta.is_dir() {
        "a folder"
    } else {
        "not a regular file (a FIFO, socket or device)"
    };
    Err(bad(path, format!("is {what}; expected a file")))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    require_regular_file(path)?;
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Bytes of a .npy file's header (magic, version, length field, header
/// text), from its version and length field; `None` when truncated.
fn npy_header_len(bytes: &[u8]) -> Option<usize> {
    match bytes.get(6)? {
        1 => Some(10 + u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]) as usize),
        _ => {
            let l: [u8; 4] = bytes.get(8..12)?.try_into().ok()?;
            Some(12 + u32::from_le_bytes(l) as usize)
        }
    }
}

/// Deepest bracket nesting a `.npy` header may have.
const MAX_NPY_NESTING: usize = 4;

/// The deepest nesting of `(`, `[`, `{` in `text`.
fn npy_nesting(text: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0);
    for &b in text {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Reads a `.npy` array (f32, f16, f64; C order) as f32.
pub fn read_npy(path: &Path) -> Result<HostTensor> {
    parse_npy(&read(path)?, path)
}

/// [`read_npy`] on the file's bytes; `path` names it in errors.
#[doc(hidden)]
pub fn parse_npy(bytes: &[u8], path: &Path) -> Result<HostTensor> {
    if bytes.is_empty() {
        return Err(bad(path, "the file is empty; expected a .npy array"));
    }
    // npyz allocates the header's declared length before reading it: a
    // 12-byte file could ask for 4 GiB. (Without the magic, npyz says so.)
    if bytes.starts_with(b"\x93NUMPY") {
        match npy_header_len(bytes) {
            Some(n) if n <= bytes.len() => {
                // npyz's header parser backtracks exponentially in nested
                // brackets (depth 15: seconds, 20: minutes); a real header
                // nests 2 deep (`{'shape': (…)}`), a structured dtype 3.
                let depth = npy_nesting(bytes.get(..n).unwrap_or(bytes));
                if depth > MAX_NPY_NESTING {
                    return Err(bad(
                        path,
                        format!("not a valid .npy file: the header nests brackets {depth} deep; expected at most {MAX_NPY_NESTING} (a dict with a shape tuple)"),
                    ));
                }
            }
            n => {
                return Err(bad(
                    path,
                    format!(
                        "not a valid .npy file: the header needs {} bytes but the file holds {}; the file is truncated",
                        n.map_or("at least 10".to_string(), |n| n.to_string()),
                        bytes.len()
                    ),
                ))
            }
        }
    }
    let npy =
        npyz::NpyFile::new(bytes).map_err(|e| bad(path, format!("not a valid .npy file: {e}")))?;
    // numpy saves a transposed (F-contiguous) array in Fortran order, e.g.
    // FLUX.2's packed tokens from `_pack_latents` (a permute): reordered below.
    let fortran = npy.order() == npyz::Order::Fortran;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let type_str = npy.dtype().descr().trim_matches('\'').to_string();
    let kind = type_str.trim_start_matches(['<', '>', '|', '=']);
    let item = match kind {
        "f4" => 4,
        "f2" => 2,
        "f8" => 8,
        other => {
            return Err(bad(
                path,
                format!("dtype `{other}` is not supported; expected float32, float16 or float64"),
            ))
        }
    };
    // The payload must be exactly what the header describes: checked before
    // anything of that size is allocated.
    let payload = bytes
        .len()
        .saturating_sub(npy_header_len(bytes).unwrap_or(bytes.len()));
    let want = shape
        .iter()
        .try_fold(item, |a: usize, &d| a.checked_mul(d))
        .filter(|&b| b == payload);
    if want.is_none() {
        return Err(bad(
            path,
            format!(
                "the header says shape {shape:?} of {type_str} ({} bytes) but the file holds {payload} bytes of data; the file is truncated or not what its header says",
                shape
                    .iter()
                    .try_fold(item, |a: usize, &d| a.checked_mul(d))
                    .map_or("more than 2^64".to_string(), |b| b.to_string())
            ),
        ));
    }
    let data: Vec<f32> = match kind {
        "f4" => npy
            .into_vec::<f32>()
            .map_err(|e| bad(path, e.to_string()))?,
        "f2" => npy
            .into_vec::<half::f16>()
            .map_err(|e| bad(path, e.to_string()))?
            .into_iter()
            .map(f32::from)
            .collect(),
        _ => {
            let wide = npy
                .into_vec::<f64>()
                .map_err(|e| bad(path, e.to_string()))?;
            if let Some((i, v)) = wide
                .iter()
                .enumerate()
                .find(|(_, v)| v.is_finite() && v.abs() > f32::MAX as f64)
            {
                return Err(bad(
                    path,
                    format!(
                        "float64 value {v} at flat index {i} does not fit float32 (max ±3.4e38); latents are f32 in every pipeline: check how the file was made"
                    ),
                ));
            }
            wide.into_iter().map(|v| v as f32).collect()
        }
    };
    let data = if fortran {
        fortran_to_c(&shape, &data)
    } else {
        data
    };
    HostTensor::new(shape, data).map_err(|e| bad(path, e.to_string()))
}

/// Column-major values of `shape` (the first index fastest) in row-major order.
// `data.len()` is the product of `shape` (checked against the payload above).
#[allow(clippy::indexing_slicing)]
fn fortran_to_c(shape: &[usize], data: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(data.len());
    let mut index = vec![0usize; shape.len()];
    for _ in 0..data.len() {
        let (mut at, mut stride) = (0, 1);
        for (i, &d) in index.iter().zip(shape) {
            at += i * stride;
            stride *= d;
        }
        out.push(data[at]);
        // Next C-order index: the last axis fastest.
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// Writes f32 values as a `.npy` array.
pub fn write_npy(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    write_npy_to(std::io::BufWriter::new(file), path, shape, data)
}

/// Writes f32 values as a `.npy` array into `out` (`path` names it in
/// errors: a caller writing a temporary file names the file it stands for).
#[doc(hidden)]
pub fn write_npy_to(
    out: impl std::io::Write,
    path: &Path,
    shape: &[usize],
    data: &[f32],
) -> Result<()> {
    let io_err = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    use npyz::WriterBuilder;
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&shape.iter().map(|&d| d as u64).collect::<Vec<_>>())
        .writer(out)
        .begin_nd()
        .map_err(io_err)?;
    w.extend(data.iter().copied()).map_err(io_err)?;
    w.finish().map_err(io_err)
}

/// A float32 `.npy` array written as its values arrive: the header with
/// the final shape first, then values appended, so a long video's output
/// never has to be held whole. [`NpyStream::finish`] checks the count.
#[doc(hidden)]
pub struct NpyStream<W: std::io::Write> {
    out: W,
    /// Values still to come.
    left: u64,
    /// Values the shape holds.
    total: u64,
    /// Bytes before the first value.
    header_len: u64,
    path: PathBuf,
}

impl NpyStream<std::io::BufWriter<std::fs::File>> {
    /// Creates `path` holding an array of `shape` (see [`NpyStream::new`]).
    pub fn create(path: &Path, shape: &[usize]) -> Result<Self> {
        let file = std::fs::File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        NpyStream::new(std::io::BufWriter::new(file), path, shape)
    }
}

impl<W: std::io::Write> NpyStream<W> {
    /// Writes the `.npy` 1.0 header of a little-endian f32 C-order array of
    /// `shape` into `out` (`path` names it in errors).
    pub fn new(mut out: W, path: &Path, shape: &[usize]) -> Result<Self> {
        let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
        let tuple = match dims.len() {
            1 => format!("({},)", dims.join("")),
            _ => format!("({})", dims.join(", ")),
        };
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
        // Magic (6) + version (2) + length (2) + header + '\n': a multiple of 64.
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let len = u16::try_from(header.len()).map_err(|_| {
            bad(
                path,
                format!("a shape of {} axes is too long for .npy", shape.len()),
            )
        })?;
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        out.write_all(b"\x93NUMPY\x01\x00").map_err(io)?;
        out.write_all(&len.to_le_bytes()).map_err(io)?;
        out.write_all(header.as_bytes()).map_err(io)?;
        let total = shape.iter().map(|&d| d as u64).product();
        Ok(NpyStream {
            out,
            left: total,
            total,
            header_len: 10 + u64::from(len),
            path: path.to_path_buf(),
        })
    }

    /// Appends `values` (C order).
    pub fn write(&mut self, values: &[f32]) -> Result<()> {
        let n = values.len() as u64;
        if n > self.left {
            return Err(Error::Internal(format!(
                "{}: {n} more values than the {} its shape has room for",
                self.path.display(),
                self.left
            )));
        }
        self.left -= n;
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.out.write_all(&bytes).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Flushes; an error when fewer values came than the shape holds.
    pub fn finish(mut self) -> Result<W> {
        if self.left != 0 {
            return Err(Error::Internal(format!(
                "{}: {} values of its shape were never written",
                self.path.display(),
                self.left
            )));
        }
        self.out.flush().map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.out)
    }
}

impl<W: std::io::Write + std::io::Seek> NpyStream<W> {
    /// Writes `values` at flat index `at` of the array (C order), for
    /// outputs whose values arrive in another order than the array's
    /// (channels-first video written frame by frame). Not mixed with
    /// [`NpyStream::write`], which appends where the last write ended.
    pub fn write_at(&mut self, at: u64, values: &[f32]) -> Result<()> {
        let n = values.len() as u64;
        if at.checked_add(n).is_none_or(|end| end > self.total) || n > self.left {
            return Err(Error::Internal(format!(
                "{}: values {at}..{} are outside its {} values",
                self.path.display(),
                at.saturating_add(n),
                self.total
            )));
        }
        let io = |source| Error::Io {
            path: self.path.clone(),
            source,
        };
        self.out
            .seek(std::io::SeekFrom::Start(self.header_len + at * 4))
            .map_err(io)?;
        self.left -= n;
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.out.write_all(&bytes).map_err(io)
    }
}

/// Writes f32 values as a one-tensor `.safetensors` file under `key`.
pub(crate) fn write_safetensors(
    path: &Path,
    key: &str,
    shape: &[usize],
    data: &[f32],
) -> Result<()> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), bytes)
        .map_err(|e| bad(path, e.to_string()))?;
    safetensors::serialize_to_file(vec![(key, view)], None, path)
        .map_err(|e| bad(path, e.to_string()))
}

/// File formats latents are written in.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatentFormat {
    /// `.npy` (f32, C order).
    Npy,
    /// `.safetensors` with one f32 tensor named `latents`.
    Safetensors,
}

/// The latent file format `path`'s extension names (case-insensitive), or
/// an error naming the accepted ones. Check it before long work that ends
/// in [`write_latents`].
#[doc(hidden)]
pub fn latent_format(path: &Path) -> Result<LatentFormat> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_lowercase)
        .as_deref()
    {
        Some("npy") => Ok(LatentFormat::Npy),
        Some("safetensors") => Ok(LatentFormat::Safetensors),
        _ => Err(bad(
            path,
            "unknown latent file type; use .npy or .safetensors",
        )),
    }
}

/// Writes latents as `.npy` or `.safetensors` (key `latents`) by extension.
pub fn write_latents(path: &Path, t: &HostTensor) -> Result<()> {
    match latent_format(path)? {
        LatentFormat::Npy => write_npy(path, &t.shape, &t.data),
        LatentFormat::Safetensors => write_safetensors(path, "latents", &t.shape, &t.data),
    }
}

/// Writes latents into `out` in the format `path`'s extension names (see
/// [`write_latents`]; `path` names `out` in errors).
#[doc(hidden)]
pub fn write_latents_to(mut out: impl std::io::Write, path: &Path, t: &HostTensor) -> Result<()> {
    match latent_format(path)? {
        LatentFormat::Npy => write_npy_to(out, path, &t.shape, &t.data),
        LatentFormat::Safetensors => {
            let bytes: &[u8] = bytemuck::cast_slice(&t.data);
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                t.shape.clone(),
                bytes,
            )
            .map_err(|e| bad(path, e.to_string()))?;
            let all = safetensors::serialize(vec![("latents", view)], None)
                .map_err(|e| bad(path, e.to_string()))?;
            out.write_all(&all)
                .and_then(|()| out.flush())
                .map_err(|source| Error::Io {
                    path: path.to_path_buf(),
                    source,
                })
        }
    }
}

/// Converts one safetensors tensor view to f32.
pub(crate) fn view_to_f32(
    view: &safetensors::tensor::TensorView<'_>,
) -> std::result::Result<Vec<f32>, String> {
    use crate::tensor::widen;
    use safetensors::Dtype;
    let b = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => widen::<f32>(b),
        Dtype::F16 => widen::<half::f16>(b),
        Dtype::BF16 => widen::<half::bf16>(b),
        Dtype::F64 => bytemuck::pod_collect_to_vec::<u8, f64>(b)
            .into_iter()
            .map(|v| v as f32)
            .collect(),
        d => {
            return Err(format!(
                "dtype {d:?} is not supported; expected F32, F16 or BF16"
            ))
        }
    })
}

/// Reads one tensor from a `.safetensors` file: `key`, or the only tensor.
pub fn read_safetensors_tensor(path: &Path, key: Option<&str>) -> Result<HostTensor> {
    parse_safetensors_tensor(&read(path)?, path, key)
}

/// [`read_safetensors_tensor`] on the file's bytes; `path` names it in errors.
#[doc(hidden)]
pub fn parse_safetensors_tensor(
    bytes: &[u8],
    path: &Path,
    key: Option<&str>,
) -> Result<HostTensor> {
    if bytes.is_empty() {
        return Err(bad(
            path,
            "the file is empty; expected a .safetensors file holding the latent tensor",
        ));
    }
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| bad(path, format!("not a valid .safetensors file: {e}")))?;
    let names = st.names();
    let name = match key {
        Some(k) => k.to_string(),
        None if names.len() == 1 => names.concat(),
        None if names.is_empty() => return Err(bad(path, "the file holds no tensor")),
        None => {
            let mut n: Vec<&str> = names.clone();
            n.sort();
            return Err(bad(
                path,
                format!(
                    "the file holds {} tensors ({}); choose one with the `key` argument",
                    n.len(),
                    n.join(", ")
                ),
            ));
        }
    };
    let view = st.tensor(&name).map_err(|_| {
        bad(
            path,
            format!("no tensor named `{name}` (has: {})", names.join(", ")),
        )
    })?;
    let data = view_to_f32(&view).map_err(|m| bad(path, m))?;
    HostTensor::new(view.shape().to_vec(), data).map_err(|e| bad(path, e.to_string()))
}

/// The key of ComfyUI's `.latent` files (SaveLatent) holding the latents.
pub(crate) const COMFYUI_LATENT_KEY: &str = "latent_tensor";
/// The marker key of ComfyUI's current `.latent` format: without it, LoadLatent
/// multiplies the tensor by 1 / 0.18215 (files of the first format held SD
/// latents times the SD scaling factor).
pub(crate) const COMFYUI_VERSION_KEY: &str = "latent_format_version_0";

/// Latents as read from a file, with what the file says about their form.
#[derive(Clone, Debug, PartialEq)]
pub struct LatentFile {
    /// The tensor (no shape or channel check yet: the model decides the form).
    pub tensor: HostTensor,
    /// True for a ComfyUI `.latent` file: it holds the VAE's own latents as
    /// ComfyUI's VAEEncode / samplers hand them to VAEDecode — raw z for the
    /// SD/SDXL/SD3/FLUX.1 VAEs (ComfyUI scales them inside the diffusion model),
    /// FLUX.2's 128-channel BatchNorm-normalised 2×2-patchified maps.
    pub comfyui: bool,
}

/// Reads latents from `.npy`, `.safetensors` (`key`, or the only tensor) or a
/// ComfyUI `.latent` file (LoadLatent's rule: `latent_tensor`, times
/// 1 / 0.18215 unless the `latent_format_version_0` marker is present).
/// Shapes and channels are left to [`crate::Vae::decoder_input`].
pub fn read_latent_file(path: &Path, key: Option<&str>) -> Result<LatentFile> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_lowercase();
    let tensor = match ext.as_str() {
        "npy" => read_npy(path)?,
        "safetensors" => read_safetensors_tensor(path, key)?,
        "latent" => {
            let bytes = read(path)?;
            let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
                bad(
                    path,
                    format!("not a ComfyUI .latent file (a safetensors file): {e}"),
                )
            })?;
            let names = st.names();
            if !names.contains(&COMFYUI_LATENT_KEY) {
                return Err(bad(
                    path,
                    format!(
                        "a ComfyUI .latent file holds `{COMFYUI_LATENT_KEY}`; this one has {}",
                        names.join(", ")
                    ),
                ));
            }
            let mut t = parse_safetensors_tensor(&bytes, path, Some(COMFYUI_LATENT_KEY))?;
            if !names.contains(&COMFYUI_VERSION_KEY) {
                for v in &mut t.data {
                    *v *= 1.0 / 0.18215;
                }
            }
            return Ok(LatentFile {
                tensor: t,
                comfyui: true,
            });
        }
        _ => {
            return Err(bad(
                path,
                "unknown latent file type; expected .npy, .safetensors or ComfyUI's .latent",
            ))
        }
    };
    Ok(LatentFile {
        tensor,
        comfyui: false,
    })
}

/// Reads latents from `.npy` or `.safetensors` and checks them: rank 3 or 4
/// (C×h×w becomes 1×C×h×w), the expected channel count, finite values.
pub fn load_latents(path: &Path, key: Option<&str>, channels: usize) -> Result<HostTensor> {
    let mut t = read_latents(path, key)?;
    validate_latents(&mut t, channels).map_err(|m| bad(path, m))?;
    Ok(t)
}

/// Reads latents from `.npy` or `.safetensors` as they are (no checks:
/// [`crate::Vae::check_latents`] or [`validate_latents`] next).
pub(crate) fn read_latents(path: &Path, key: Option<&str>) -> Result<HostTensor> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_lowercase();
    match ext.as_str() {
        "npy" => read_npy(path),
        "safetensors" => read_safetensors_tensor(path, key),
        _ => Err(bad(
            path,
            "unknown latent file type; expected .npy or .safetensors",
        )),
    }
}

/// Shape and value checks for latents (N×C×h×w after this).
#[doc(hidden)]
pub fn validate_latents(t: &mut HostTensor, channels: usize) -> std::result::Result<(), String> {
    match t.shape.len() {
        3 => t.shape.insert(0, 1),
        4 => {}
        5 => {
            return Err(format!(
                "latents have rank 5 (shape {:?}): video latents (N×T×C×h×w or N×C×T×h×w), but this is an image VAE, which takes N×C×h×w or C×h×w; decode video latents with a video VAE (e.g. --vae taew2_1.safetensors for Wan 2.1 latents)",
                t.shape
            ))
        }
        r => {
            return Err(format!(
                "latents have rank {r} (shape {:?}); expected N×C×h×w or C×h×w",
                t.shape
            ))
        }
    }
    check_latent_values(t, channels)
}

/// [`validate_latents`]' checks of latents already N×C×h×w (nothing to
/// change, so a borrowed tensor will do).
pub(crate) fn check_latent_values(
    t: &HostTensor,
    channels: usize,
) -> std::result::Result<(), String> {
    if t.data.is_empty() {
        return Err(format!("latents are empty (shape {:?})", t.shape));
    }
    let c = t.shape.get(1).copied().unwrap_or(0);
    if c != channels {
        return Err(format!(
            "latents have {c} channels (shape {:?}) but this VAE expects {channels}",
            t.shape
        ));
    }
    // Branch-free per chunk (vectorised): gigabytes of latents scan fast.
    let finite = |c: &[f32]| c.iter().fold(true, |a, v| a & v.is_finite());
    if t.data.chunks(1 << 14).all(finite) {
        return Ok(());
    }
    if let Some((i, v)) = t.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        let bad = t.data.iter().filter(|v| !v.is_finite()).count();
        return Err(format!(
            "latents contain {bad} non-finite values (first at flat index {i}: {v}); the diffusion step upstream probably diverged"
        ));
    }
    Ok(())
}

/// Output file names for a batch: `out.png` for one image, `out_0.png`, `out_1.png`, … otherwise.
/// A name without an extension gets `.png`.
#[doc(hidden)]
pub fn batch_paths(out: &Path, n: usize) -> Vec<PathBuf> {
    let with_ext;
    let out = if out.extension().is_none() {
        with_ext = out.with_extension("png");
        with_ext.as_path()
    } else {
        out
    };
    if n == 1 {
        return vec![out.to_path_buf()];
    }
    let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("out");
    let ext = out.extension().and_then(|s| s.to_str()).unwrap_or("png");
    (0..n)
        .map(|i| out.with_file_name(format!("{stem}_{i}.{ext}")))
        .collect()
}

/// Writes packed RGBA8 pixels (R in the low byte) as an RGB PNG.
pub fn write_png_rgb(path: &Path, width: usize, height: usize, rgba: &[u8]) -> Result<()> {
    let rgb: Vec<u8> = rgba
        .chunks_exact(4)
        .flat_map(|p| p.iter().take(3).copied())
        .collect();
    image::save_buffer(
        path,
        &rgb,
        width as u32,
        height as u32,
        image::ExtendedColorType::Rgb8,
    )
    .map_err(|e| bad(path, format!("could not write PNG: {e}")))
}

/// [`write_png_rgb`] into `out` (`path` names it in errors).
#[doc(hidden)]
pub fn write_png_rgb_to(
    out: impl std::io::Write,
    path: &Path,
    width: usize,
    height: usize,
    rgba: &[u8],
) -> Result<()> {
    write_png_to(out, path, width, height, rgba, 3)
}

/// Packed RGBA8 pixels of an image of `channels` ([`crate::Vae::image_channels`])
/// as a PNG into `out`: RGB for 3 (alpha dropped, as [`write_png_rgb`]), RGBA
/// for 4 (`path` names it in errors).
#[doc(hidden)]
pub fn write_png_to(
    mut out: impl std::io::Write,
    path: &Path,
    width: usize,
    height: usize,
    rgba: &[u8],
    channels: usize,
) -> Result<()> {
    use image::ImageEncoder;
    let (pixels, color) = match channels {
        3 => (
            std::borrow::Cow::Owned(
                rgba.chunks_exact(4)
                    .flat_map(|p| p.iter().take(3).copied())
                    .collect(),
            ),
            image::ExtendedColorType::Rgb8,
        ),
        4 => (
            std::borrow::Cow::Borrowed(rgba),
            image::ExtendedColorType::Rgba8,
        ),
        c => {
            return Err(Error::InvalidInput(format!(
                "{}: a PNG of {c}-channel images (expected 3, RGB, or 4, RGBA)",
                path.display()
            )))
        }
    };
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(&pixels, width as u32, height as u32, color)
        .map_err(|e| bad(path, format!("could not write PNG: {e}")))?;
    out.flush().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads an image as [1, 3, H, W] pixel values 0–255 (alpha dropped).
/// Sizes must be multiples of 8, or `pad` extends the right and bottom
/// edges by replication to the next multiple.
pub fn load_image(path: &Path, pad: bool) -> Result<HostTensor> {
    let unreadable = |e: &dyn std::fmt::Display| bad(path, format!("not a readable image: {e}"));
    require_regular_file(path)?;
    let bytes = std::fs::read(path).map_err(|e| unreadable(&e))?;
    // The format by extension, as `image::open` chooses it.
    let format = image::ImageFormat::from_path(path).map_err(|e| unreadable(&e))?;
    decode_image(&bytes, format, path, pad)
}

/// [`load_image`] on a PNG file's bytes; `path` names it in errors.
#[doc(hidden)]
pub fn parse_png(bytes: &[u8], path: &Path, pad: bool) -> Result<HostTensor> {
    decode_image(bytes, image::ImageFormat::Png, path, pad)
}

fn decode_image(
    bytes: &[u8],
    format: image::ImageFormat,
    path: &Path,
    pad: bool,
) -> Result<HostTensor> {
    let img = image::load_from_memory_with_format(bytes, format)
        .map_err(|e| bad(path, format!("not a readable image: {e}")))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let (pw, ph) = (w.div_ceil(8) * 8, h.div_ceil(8) * 8);
    if (pw, ph) != (w, h) && !pad {
        return Err(Error::BadFile {
            path: path.to_path_buf(),
            message: format!("{w}×{h} is not a multiple of 8 in each dimension; crop it, or load it with `pad` set to extend the edges to {pw}×{ph}"),
        });
    }
    let mut data = Vec::with_capacity(3 * ph * pw);
    for c in 0..3 {
        for y in 0..ph {
            for x in 0..pw {
                let p = img.get_pixel(x.min(w - 1) as u32, y.min(h - 1) as u32);
                data.push(p.0.get(c).copied().unwrap_or(0) as f32);
            }
        }
    }
    HostTensor::new(vec![1, 3, ph, pw], data)
}

#[cfg(test)]
mod tests;
