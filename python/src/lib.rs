//! `wgvae._wgvae`: the native half of the `wgvae` Python package.
//!
//! It wraps the library's front doors only (`Vae::load`, `decode`, `encode`,
//! `estimate::Estimate`, `Context::adapters`; video: `Vae::load` of a video VAE,
//! `decode_video`, `VideoDecoder`). Arrays cross as little-endian
//! f32 `bytes` plus a shape: the pure-Python layer (`python/wgvae/__init__.py`)
//! turns numpy arrays, `__array__` objects and DLPack tensors into them, which
//! keeps the extension free of numpy's C API (one abi3 wheel for every
//! CPython ≥ 3.9). The GIL is released while the device works.

// Errors become Python exceptions, not panics: no bare unwrap, expect or panic.
#![warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pyo3::exceptions::{
    PyFileNotFoundError, PyMemoryError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList};

use std::sync::Mutex;

use wgvae::encode::EncodeOptions;
use wgvae::estimate::Estimate;
use wgvae::gpu::{AdapterChoice, AdapterSummary, Context, ContextOptions};
use wgvae::io::HostTensor;
use wgvae::memory::Policy;
use wgvae::models::Precision;
use wgvae::tiling::{TileMode, Tiling};
use wgvae::{DecodeOptions, Error, LoadOptions, Vae};

mod progress;
mod video;

use progress::Watch;

/// The Python exception for a library error, carrying its message:
/// ValueError for bad input, MemoryError for a budget or device memory that
/// cannot hold the run, FileNotFoundError / OSError for the file system,
/// RuntimeError for device failures and bugs.
pub(crate) fn to_py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidInput(_)
        | Error::Shape { .. }
        | Error::BadFile { .. }
        | Error::NonFiniteOutput { .. }
        | Error::Unsupported(_) => PyValueError::new_err(msg),
        // A budget no tiling can meet (`max_memory`, host memory) is a
        // MemoryError as the device running out is.
        Error::OverBudget(_)
        | Error::OutOfMemory { .. }
        | Error::BufferTooLarge { .. }
        | Error::BindingTooLarge { .. } => PyMemoryError::new_err(msg),
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } => PyOSError::new_err(msg),
        // Device failures (no adapter, lost device, validation, readback) and
        // internal errors; variants added later land here too.
        #[allow(unreachable_patterns)]
        _ => PyRuntimeError::new_err(msg),
    }
}

pub(crate) fn value_err(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// `None` | index | name substring → the adapter choice.
pub(crate) fn adapter_choice(adapter: Option<&Bound<'_, PyAny>>) -> PyResult<AdapterChoice> {
    let Some(a) = adapter else {
        return Ok(AdapterChoice::Auto);
    };
    if a.is_none() {
        return Ok(AdapterChoice::Auto);
    }
    if let Ok(i) = a.extract::<usize>() {
        return Ok(AdapterChoice::Index(i));
    }
    if let Ok(s) = a.extract::<String>() {
        return Ok(AdapterChoice::Name(s));
    }
    Err(value_err(
        "adapter: expected None, an index (int) or a name substring (str)",
    ))
}

/// f32 values from little-endian bytes, checked against `shape`.
pub(crate) fn host_tensor(data: &[u8], shape: Vec<usize>) -> PyResult<HostTensor> {
    if !data.len().is_multiple_of(4) {
        return Err(value_err(format!(
            "{} bytes are not a whole number of float32 values",
            data.len()
        )));
    }
    let values: Vec<f32> = bytemuck::pod_collect_to_vec(data);
    HostTensor::new(shape, values).map_err(to_py_err)
}

fn tiling(tile: &str, tile_size: Option<usize>, max_memory: Option<u64>) -> PyResult<Tiling> {
    Ok(Tiling {
        mode: tile.parse::<TileMode>().map_err(to_py_err)?,
        tile_size,
        max_memory,
        ..Default::default()
    })
}

/// [`tiling`] with `fast` mode's overlap (image pixels).
fn tiling_with_overlap(
    tile: &str,
    tile_size: Option<usize>,
    overlap: Option<usize>,
    max_memory: Option<u64>,
) -> PyResult<Tiling> {
    Ok(Tiling {
        overlap,
        ..tiling(tile, tile_size, max_memory)?
    })
}

/// An output range as (low, high).
pub(crate) fn range_bounds(r: wgvae::kernels::image::ImageRange) -> (f32, f32) {
    use wgvae::kernels::image::ImageRange;
    match r {
        ImageRange::MinusOneToOne => (-1.0, 1.0),
        ImageRange::ZeroToOne => (0.0, 1.0),
        // ImageNet-normalised RGB (MiniMax-H3): where 0 and 1 map to, widest channel.
        ImageRange::ImageNet => (-0.485 / 0.229, (1.0 - 0.406) / 0.225),
    }
}

/// Every adapter wgpu sees: index, name, backend, device type, driver,
/// shader_f16, PCI vendor and device ids and the PCI bus id (`""` where the
/// backend does not report it; Vulkan's `VK_EXT_pci_bus_info`).
#[pyfunction]
fn adapters(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let found: Vec<_> = py.detach(|| {
        Context::adapters(None)
            .iter()
            .map(|a| (a.get_info(), AdapterSummary::of(a).shader_f16))
            .collect()
    });
    let list = PyList::empty(py);
    for (i, (info, f16)) in found.into_iter().enumerate() {
        let d = PyDict::new(py);
        d.set_item("index", i)?;
        d.set_item("name", info.name)?;
        d.set_item("backend", format!("{:?}", info.backend))?;
        d.set_item("device_type", format!("{:?}", info.device_type))?;
        d.set_item("driver", info.driver)?;
        d.set_item("driver_info", info.driver_info)?;
        d.set_item("shader_f16", f16)?;
        d.set_item("vendor_id", info.vendor)?;
        d.set_item("device_id", info.device)?;
        d.set_item("pci_bus_id", info.device_pci_bus_id)?;
        list.append(d)?;
    }
    Ok(list)
}

/// A decode as Python gets it: (RGB bytes, raw f32 bytes, H, W).
type DecodedBytes<'py> = (
    Bound<'py, PyByteArray>,
    Option<Bound<'py, PyByteArray>>,
    usize,
    usize,
);

/// An encode as Python gets it: (latent bytes, shape, mean bytes, std bytes).
type Encoded<'py> = (
    Bound<'py, PyByteArray>,
    Vec<usize>,
    Option<Bound<'py, PyByteArray>>,
    Option<Bound<'py, PyByteArray>>,
);

/// A loaded decoder on its own device (the encoder is loaded on first use).
#[pyclass(module = "wgvae._wgvae", frozen)]
struct Model {
    ctx: Context,
    vae: Vae,
    spec: String,
    encoder_spec: String,
    load: LoadOptions,
    policy: Policy,
    max_memory: Option<u64>,
    /// One run at a time per model; also holds the lazily loaded encoder.
    encoder: Mutex<Option<Vae>>,
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (spec, dtype="auto", policy="planned", adapter=None, max_memory=None, encoder=None))]
    fn new(
        py: Python<'_>,
        spec: String,
        dtype: &str,
        policy: &str,
        adapter: Option<&Bound<'_, PyAny>>,
        max_memory: Option<u64>,
        encoder: Option<String>,
    ) -> PyResult<Self> {
        let choice = adapter_choice(adapter)?;
        let policy: Policy = policy.parse().map_err(to_py_err)?;
        let load = LoadOptions {
            precision: dtype.parse::<Precision>().map_err(to_py_err)?,
            ..Default::default()
        };
        let (ctx, vae) = py
            .detach(|| {
                let ctx = Context::new(&ContextOptions {
                    adapter: choice,
                    backends: None,
                    pipeline_cache_dir: wgvae::gpu::default_cache_dir(),
                    ..Default::default()
                })?
                .with_pool(policy.new_pool());
                let vae = Vae::load_image_decoder(&ctx, &spec, &load)?;
                Ok((ctx, vae))
            })
            .map_err(to_py_err)?;
        Ok(Model {
            ctx,
            vae,
            encoder_spec: encoder.unwrap_or_else(|| spec.clone()),
            spec,
            load,
            policy,
            max_memory,
            encoder: Mutex::new(None),
        })
    }

    /// The model's description.
    #[getter]
    fn name(&self) -> String {
        self.vae.name().to_string()
    }

    #[getter]
    fn latent_channels(&self) -> usize {
        self.vae.latent_channels()
    }

    /// Channels of the decoded images: 3 (RGB) or 4 (RGBA, Qwen-Image 2.1).
    #[getter]
    fn image_channels(&self) -> usize {
        self.vae.image_channels()
    }

    #[getter]
    fn upscale(&self) -> usize {
        self.vae.upscale()
    }

    /// Storage dtype the weights and activations use.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.vae.dtype().name()
    }

    /// Adapter name and backend.
    #[getter]
    fn device(&self) -> String {
        let c = self.ctx.caps();
        format!("{} ({:?})", c.adapter_name, c.backend)
    }

    #[getter]
    fn random_weights(&self) -> bool {
        self.vae.random_weights()
    }

    /// The range of the float output: (-1, 1) (diffusers) or (0, 1) (TAE).
    #[getter]
    fn output_range(&self) -> (f32, f32) {
        range_bounds(self.vae.output_range())
    }

    /// Channels of the pipeline's latent maps: FLUX.2's 128 (4 × its 32 z
    /// channels, 2×2 patches, BatchNorm-normalised), else the z channels.
    #[getter]
    fn pipeline_channels(&self) -> usize {
        match self.vae.flux2() {
            Some(_) => 4 * self.vae.latent_channels(),
            None => self.vae.latent_channels(),
        }
    }

    /// Decodes f32 latents `data` of `shape` [N, C, h, w]. Returns
    /// (pixel bytes N×H×W×K, raw f32 bytes N×K×H×W or None, H, W), K the
    /// model's image channels (3 RGB, 4 RGBA).
    /// `size` (H, W): `data` is a packed token sequence [N, L, F], unpacked
    /// by the model's rule on that image's token grid.
    /// `progress`: see `progress.rs` (called between tiles; untiled runs
    /// make no call).
    #[pyo3(signature = (data, shape, tile="auto", tile_size=None, raw_latents=false, keep_raw=false, max_memory=None, size=None, overlap=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        shape: Vec<usize>,
        tile: &str,
        tile_size: Option<usize>,
        raw_latents: bool,
        keep_raw: bool,
        max_memory: Option<u64>,
        size: Option<(usize, usize)>,
        overlap: Option<usize>,
        progress: Option<Bound<'py, PyAny>>,
    ) -> PyResult<DecodedBytes<'py>> {
        let watch = Watch::new(progress)?;
        let opts = DecodeOptions {
            raw_latents,
            keep_raw,
            tiling: tiling_with_overlap(tile, tile_size, overlap, max_memory.or(self.max_memory))?,
            progress: watch.progress(),
            ..Default::default()
        };
        let ctx = watch.context(&self.ctx);
        let decoded = py.detach(|| -> PyResult<_> {
            let mut latents = host_tensor(data, shape)?;
            if size.is_some() {
                latents = self.vae.unpack_tokens(&latents, size).map_err(to_py_err)?;
            }
            let _one_at_a_time = self.encoder.lock().unwrap_or_else(|e| e.into_inner());
            let out = wgvae::decode(&ctx, &self.vae, &latents, &opts).map_err(to_py_err)?;
            let c = out.channels;
            let mut rgb = Vec::with_capacity(out.rgba.iter().map(|i| i.len() / 4 * c).sum());
            for img in &out.rgba {
                for px in img.chunks_exact(4) {
                    rgb.extend_from_slice(&px[..c]);
                }
            }
            let raw = out
                .raw
                .map(|r| bytemuck::cast_slice::<f32, u8>(&r.data).to_vec());
            Ok((rgb, raw, out.height, out.width))
        });
        let (rgb, raw, h, w) = watch.finish(decoded)?;
        Ok((
            PyByteArray::new(py, &rgb),
            raw.map(|r| PyByteArray::new(py, &r)),
            h,
            w,
        ))
    }

    /// Encodes f32 pixels `data` of `shape` [N, 3, H, W], values 0–255.
    /// Returns (f32 latent bytes, latent shape, mean bytes, std bytes); the
    /// last two (the raw distribution, AutoencoderKL / FLUX.2 only, shape
    /// [N, C, h, w]) are None unless `moments`.
    #[pyo3(signature = (data, shape, tile="auto", tile_size=None, raw_latents=false, sample=None, max_memory=None, overlap=None, progress=None, moments=false))]
    #[allow(clippy::too_many_arguments)]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        shape: Vec<usize>,
        tile: &str,
        tile_size: Option<usize>,
        raw_latents: bool,
        sample: Option<u64>,
        max_memory: Option<u64>,
        overlap: Option<usize>,
        progress: Option<Bound<'py, PyAny>>,
        moments: bool,
    ) -> PyResult<Encoded<'py>> {
        let watch = Watch::new(progress)?;
        let opts = EncodeOptions {
            sample,
            raw_latents,
            tiling: tiling_with_overlap(tile, tile_size, overlap, max_memory.or(self.max_memory))?,
            progress: watch.progress(),
        };
        let ctx = watch.context(&self.ctx);
        let encoded = py.detach(|| -> PyResult<_> {
            let pixels = host_tensor(data, shape)?;
            let mut slot = self.encoder.lock().unwrap_or_else(|e| e.into_inner());
            let enc = match slot.take() {
                Some(e) => e,
                None => Vae::load_encoder(&self.ctx, &self.encoder_spec, &self.load)
                    .map_err(to_py_err)?,
            };
            let out = wgvae::encode::encode(&ctx, &enc, &pixels, &opts);
            *slot = Some(enc);
            let out = out.map_err(to_py_err)?;
            let f32_bytes = |t: &HostTensor| bytemuck::cast_slice::<f32, u8>(&t.data).to_vec();
            let bytes = f32_bytes(&out.latents);
            let (mean, std) = match (moments, &out.mean, &out.std) {
                (true, Some(m), Some(s)) => (Some(f32_bytes(m)), Some(f32_bytes(s))),
                _ => (None, None),
            };
            Ok((bytes, out.latents.shape, mean, std))
        });
        let (bytes, shape, mean, std) = watch.finish(encoded)?;
        let array = |b: Option<Vec<u8>>| b.map(|b| PyByteArray::new(py, &b));
        Ok((PyByteArray::new(py, &bytes), shape, array(mean), array(std)))
    }

    /// The JSON `wgvae memory --json` prints for the same arguments (a run
    /// on a null device: nothing is allocated on the real one).
    #[pyo3(signature = (height, width, batch=1, dtype=None, encode=false, tile="auto", tile_size=None, max_memory=None))]
    #[allow(clippy::too_many_arguments)]
    fn memory(
        &self,
        py: Python<'_>,
        height: usize,
        width: usize,
        batch: usize,
        dtype: Option<&str>,
        encode: bool,
        tile: &str,
        tile_size: Option<usize>,
        max_memory: Option<u64>,
    ) -> PyResult<String> {
        if height == 0
            || width == 0
            || !height.is_multiple_of(8)
            || !width.is_multiple_of(8)
            || batch == 0
        {
            return Err(value_err(format!(
                "size ({height}, {width}) × batch {batch}: expected pixel sizes that are positive multiples of 8 and a positive batch"
            )));
        }
        let mut load = self.load.clone();
        if let Some(d) = dtype {
            load.precision = d.parse::<Precision>().map_err(to_py_err)?;
        }
        let tiling = tiling(tile, tile_size, max_memory.or(self.max_memory))?;
        let caps = self.ctx.caps().clone();
        let policy = self.policy;
        let (spec, channels) = (self.spec.as_str(), self.vae.latent_channels());
        let (dtype_given, own_dtype) = (dtype, self.vae.dtype().name());
        py.detach(|| -> wgvae::Result<String> {
            let estimate = Estimate::new(&caps, policy, spec, &load).tiled(&tiling);
            let (e, dtype) = if encode {
                let e = estimate.encode([batch, 3, height, width])?;
                (e, load.precision.resolve_name())
            } else {
                let e = estimate.decode([batch, channels, height / 8, width / 8])?;
                // As the CLI: the dtype the model resolves to (a dry load).
                let dtype = match dtype_given {
                    None => own_dtype.to_string(),
                    Some(_) => {
                        let probe = Context::null(caps.clone(), Policy::Exact.new_pool());
                        Vae::load_image_decoder(&probe, spec, &load)?
                            .dtype()
                            .name()
                            .to_string()
                    }
                };
                (e, dtype)
            };
            let mut v = serde_json::to_value(&e)
                .map_err(|e| Error::Internal(format!("memory estimate as JSON: {e}")))?;
            v["device"] = caps.adapter_name.clone().into();
            v["dtype"] = dtype.into();
            v["op"] = if encode { "encode" } else { "decode" }.into();
            Ok(v.to_string())
        })
        .map_err(to_py_err)
    }
}

/// The name `wgvae memory --encode --json` prints as the dtype: the
/// precision as asked for.
trait PrecisionName {
    fn resolve_name(self) -> String;
}

impl PrecisionName for Precision {
    fn resolve_name(self) -> String {
        wgvae::named::Named::name(self).to_string()
    }
}

#[pymodule]
fn _wgvae(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(adapters, m)?)?;
    m.add_class::<Model>()?;
    m.add_class::<video::VideoModelPy>()?;
    m.add_class::<video::VideoStream>()?;
    m.add_function(wrap_pyfunction!(video::is_video_vae, m)?)?;
    m.add("Cancelled", m.py().get_type::<progress::Cancelled>())?;
    // `preset:NAME` models (random weights): the image presets, Qwen-Image's, the video presets.
    let mut presets: Vec<&str> = wgvae::models::config::PRESETS.to_vec();
    presets.extend([
        wgvae::models::qwen_image::PRESET,
        "wan21",
        "wan22",
        "hunyuanvideo15",
    ]);
    m.add("PRESETS", presets)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
