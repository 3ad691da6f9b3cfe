//! Video decoders (TAEHV, Wan 2.1) for `wgvae.Vae`: whole clips through
//! `wgvae::decode_video` and streams through `wgvae::VideoDecoder`.
//!
//! Latents cross in the model's own layout (TAEHV `N×T×C×h×w`, Wan
//! `N×C×T×h×w`); the Python layer applies a `layout` override with a numpy
//! transpose. Frames come back as the CLI's `--save-raw` writes them (TAEHV
//! `N×T'×3×H×W` raw, Wan `N×3×T'×H×W` clamped) or as uint8 `N×T'×H×W×3`
//! (the CLI's PNG frames).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use wgvae::gpu::{Context, ContextOptions};
use wgvae::io::HostTensor;
use wgvae::kernels::image::cpu_to_rgba8;
use wgvae::kernels::image::ImageRange;
use wgvae::memory::Policy;
use wgvae::models::{LoadOptions, Precision};
use wgvae::video::VideoModel;
use wgvae::{Error, VideoDecoder};

use crate::{adapter_choice, host_tensor, to_py_err, value_err};

/// The loaded decoder a model and its streams share.
struct Loaded {
    ctx: Context,
    /// A video decoder (checked at load); streams share its network.
    vae: wgvae::Vae,
    dtype: &'static str,
    random_weights: bool,
    /// One device run at a time per model (whole clips and stream chunks).
    run: Mutex<()>,
}

impl Loaded {
    /// The range of its frames.
    fn range(&self) -> ImageRange {
        self.vae.output_range()
    }

    /// Wan pipeline latents → the raw z the decoder takes, in place;
    /// `latents` are `[N, C, T, h, w]` (TAEHV has no latent scaling).
    fn unnormalize(&self, latents: &mut HostTensor) -> wgvae::Result<()> {
        self.vae.unnormalize(latents)
    }
}

/// Frames as Python gets them: (bytes, shape).
type Frames<'py> = (Bound<'py, PyByteArray>, Vec<usize>);

/// Frames `[T', 3, H, W]` of one video → uint8 bytes `[T', H, W, 3]` (the
/// CLI's PNG frames: the model's output range, rounded).
fn rgb8(frames: &HostTensor, range: ImageRange) -> wgvae::Result<Vec<u8>> {
    let [t, _, h, w] = match frames.shape[..] {
        [t, 3, h, w] => [t, 3, h, w],
        _ => {
            return Err(Error::Internal(format!(
                "video frames of shape {:?} are not T×3×H×W",
                frames.shape
            )))
        }
    };
    let rgba = cpu_to_rgba8(&frames.data, t, h, w, range);
    Ok(rgba
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect())
}

/// A video VAE decoder on its own device.
#[pyclass(name = "VideoModel", module = "wgvae._wgvae", frozen)]
pub struct VideoModelPy {
    loaded: Arc<Loaded>,
}

#[pymethods]
impl VideoModelPy {
    #[new]
    #[pyo3(signature = (spec, dtype="auto", policy="planned", adapter=None))]
    fn new(
        py: Python<'_>,
        spec: String,
        dtype: &str,
        policy: &str,
        adapter: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let choice = adapter_choice(adapter)?;
        let policy: Policy = policy.parse().map_err(to_py_err)?;
        let precision = dtype.parse::<Precision>().map_err(to_py_err)?;
        let load = LoadOptions {
            precision,
            ..Default::default()
        };
        let loaded = py
            .detach(|| -> wgvae::Result<Loaded> {
                let ctx = Context::new(&ContextOptions {
                    adapter: choice,
                    backends: None,
                    pipeline_cache_dir: wgvae::gpu::default_cache_dir(),
                    ..Default::default()
                })?
                .with_pool(policy.new_pool());
                let vae = wgvae::Vae::load(&ctx, &spec, &load)?;
                vae.video_decoder("wgvae.VideoModel")?;
                // As the CLI: TAEHV is f16-safe, Wan takes bf16 under auto.
                let dtype = vae.dtype().name();
                Ok(Loaded {
                    ctx,
                    vae,
                    dtype,
                    random_weights: spec.starts_with("preset:"),
                    run: Mutex::new(()),
                })
            })
            .map_err(to_py_err)?;
        Ok(VideoModelPy {
            loaded: Arc::new(loaded),
        })
    }

    #[getter]
    fn name(&self) -> String {
        self.loaded.vae.name().to_string()
    }

    #[getter]
    fn latent_channels(&self) -> usize {
        self.loaded.vae.latent_channels()
    }

    /// True for a decoder that is not causal (LTX-2): a video decodes as one chunk.
    #[getter]
    fn whole_clip(&self) -> PyResult<bool> {
        let model = self.loaded.vae.video_decoder("whole_clip");
        Ok(model.map_err(to_py_err)?.whole_clip())
    }

    #[getter]
    fn upscale(&self) -> usize {
        self.loaded.vae.upscale()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.loaded.dtype
    }

    #[getter]
    fn device(&self) -> String {
        let c = self.loaded.ctx.caps();
        format!("{} ({:?})", c.adapter_name, c.backend)
    }

    #[getter]
    fn random_weights(&self) -> bool {
        self.loaded.random_weights
    }

    /// The range of the float frames: (-1, 1) (Wan) or (0, 1) (TAEHV).
    #[getter]
    fn output_range(&self) -> (f32, f32) {
        crate::range_bounds(self.loaded.range())
    }

    /// The latent layout the model takes: `ntchw` (TAEHV) or `ncthw` (Wan).
    #[getter]
    fn layout(&self) -> &'static str {
        self.loaded.vae.latent_layout().map_or("", |l| l.name())
    }

    /// Frames a video of `t` latent frames decodes to.
    fn frames_for(&self, t: usize) -> PyResult<usize> {
        self.loaded.vae.frames_for(t).map_err(to_py_err)
    }

    /// Decodes f32 latents `data` of `shape` (5-D, the model's layout).
    /// Returns (bytes, shape): f32 frames as `decode_video` gives them, or
    /// with `uint8` RGB bytes `[N, T', H, W, 3]`.
    #[pyo3(signature = (data, shape, raw_latents=false, uint8=false, tile="auto"))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        shape: Vec<usize>,
        raw_latents: bool,
        uint8: bool,
        tile: &str,
    ) -> PyResult<Frames<'py>> {
        let loaded = &self.loaded;
        let tiling = video_tiling(tile)?;
        let (bytes, shape) = py.detach(|| -> PyResult<_> {
            let mut latents = host_tensor(data, shape)?;
            let model = loaded.vae.video_decoder("decode").map_err(to_py_err)?;
            if latents.shape.len() != 5 {
                return Err(value_err(format!(
                    "video latents are 5-D ({}), got shape {:?}",
                    model.latent_layout().describe(),
                    latents.shape
                )));
            }
            if let Some((i, v)) = latents
                .data
                .iter()
                .enumerate()
                .find(|(_, v)| !v.is_finite())
            {
                return Err(value_err(format!(
                    "latents hold {v} at flat index {i}: video latents must be finite"
                )));
            }
            if !raw_latents && latents.shape.get(1) == Some(&model.latent_channels()) {
                loaded.unnormalize(&mut latents).map_err(to_py_err)?;
            }
            let _one_at_a_time = loaded.run.lock().unwrap_or_else(|e| e.into_inner());
            let out =
                wgvae::decode_video_tiled(&loaded.ctx, &loaded.vae, &latents, tiling.as_ref())
                    .map_err(to_py_err)?;
            if !uint8 {
                let bytes = bytemuck::cast_slice::<f32, u8>(&out.data).to_vec();
                return Ok((bytes, out.shape));
            }
            video_rgb8(out, model).map_err(to_py_err)
        })?;
        Ok((PyByteArray::new(py, &bytes), shape))
    }

    /// A streaming decode of one video (see `VideoStream`).
    #[pyo3(signature = (raw_latents=false, uint8=false, tile="auto"))]
    fn stream(&self, raw_latents: bool, uint8: bool, tile: &str) -> PyResult<VideoStream> {
        let loaded = Arc::clone(&self.loaded);
        let mut decoder = VideoDecoder::shared(&loaded.ctx, &loaded.vae).map_err(to_py_err)?;
        if let Some(t) = video_tiling(tile)? {
            decoder.set_tiling(t).map_err(to_py_err)?;
        }
        Ok(VideoStream {
            decoder: Mutex::new(decoder),
            raw_latents,
            uint8,
            _loaded: loaded,
        })
    }
}

/// A video decode's `tile`: `"auto"` (the model's default: untiled, but
/// MiniMax-H3's reference tiles), `"off"` or `"fast"` (MiniMax-H3's
/// reference tiles; refused for other video VAEs).
fn video_tiling(tile: &str) -> PyResult<Option<wgvae::tiling::Tiling>> {
    match tile {
        "auto" => Ok(None),
        "off" => Ok(Some(wgvae::tiling::Tiling::off())),
        "fast" => Ok(Some(wgvae::tiling::Tiling::fast())),
        t => Err(value_err(format!(
            "tile {t:?}: a video decode takes 'auto' (the model's default), 'off' or 'fast' (MiniMax-H3's reference tiles)"
        ))),
    }
}

/// Whole-clip f32 output (TAEHV `[N, T', 3, H, W]`, Wan `[N, 3, T', H, W]`)
/// → uint8 `[N, T', H, W, 3]`.
fn video_rgb8(out: HostTensor, model: VideoModel) -> wgvae::Result<(Vec<u8>, Vec<usize>)> {
    let [n, a, b, h, w] = match out.shape[..] {
        [n, a, b, h, w] => [n, a, b, h, w],
        _ => return Err(Error::Internal("video frames are not 5-D".into())),
    };
    let t = if model.channels_first() { b } else { a };
    let mut bytes = Vec::with_capacity(n * t * h * w * 3);
    for video in out.data.chunks_exact(a * b * h * w) {
        let frames = if model.channels_first() {
            // [3, T', H, W] → [T', 3, H, W]
            let plane = h * w;
            let mut v = Vec::with_capacity(video.len());
            for f in 0..t {
                for c in 0..3 {
                    let at = (c * t + f) * plane;
                    v.extend_from_slice(&video[at..at + plane]);
                }
            }
            v
        } else {
            video.to_vec()
        };
        bytes.extend(rgb8(
            &HostTensor::new(vec![t, 3, h, w], frames)?,
            model.range(),
        )?);
    }
    Ok((bytes, vec![n, t, h, w, 3]))
}

/// One video decoded chunk by chunk: `push` submits a chunk and returns the
/// frames of the chunk before it (the device decodes while the host takes
/// them); `finish` returns the last chunk's.
#[pyclass(module = "wgvae._wgvae", frozen)]
pub struct VideoStream {
    decoder: Mutex<VideoDecoder<'static>>,
    raw_latents: bool,
    uint8: bool,
    _loaded: Arc<Loaded>,
}

/// What a push or finish returns: (bytes, shape `[T', 3, H, W]` f32 or
/// `[T', H, W, 3]` uint8, index of the first frame), or None.
type Ready<'py> = Option<(Bound<'py, PyByteArray>, Vec<usize>, usize)>;

/// [`Ready`] before it becomes Python objects.
type HostFrames = (Vec<u8>, Vec<usize>, usize);

impl VideoStream {
    fn frames<'py>(&self, py: Python<'py>, got: Option<HostFrames>) -> Ready<'py> {
        got.map(|(b, s, first)| (PyByteArray::new(py, &b), s, first))
    }

    fn convert(&self, got: Option<wgvae::VideoFrames>) -> wgvae::Result<Option<HostFrames>> {
        let Some(got) = got else { return Ok(None) };
        if self.uint8 {
            let [t, _, h, w] = match got.frames.shape[..] {
                [t, c, h, w] => [t, c, h, w],
                _ => return Err(Error::Internal("video frames are not 4-D".into())),
            };
            let bytes = rgb8(&got.frames, self._loaded.range())?;
            return Ok(Some((bytes, vec![t, h, w, 3], got.first)));
        }
        let bytes = bytemuck::cast_slice::<f32, u8>(&got.frames.data).to_vec();
        Ok(Some((bytes, got.frames.shape, got.first)))
    }
}

#[pymethods]
impl VideoStream {
    /// Pushes the next chunk: f32 latents `data` of `shape` `[T, C, h, w]`
    /// (frames outermost, whatever the model's layout).
    fn push<'py>(&self, py: Python<'py>, data: &[u8], shape: Vec<usize>) -> PyResult<Ready<'py>> {
        let got = py.detach(|| -> PyResult<_> {
            let mut chunk = host_tensor(data, shape)?;
            let loaded = &self._loaded;
            if let (false, &[t, c, h, w]) = (self.raw_latents, &chunk.shape[..]) {
                if c == loaded.vae.latent_channels() && chunk.data.iter().all(|v| v.is_finite()) {
                    // [T, C, h, w] read as [T, C, 1, h, w]: the same per-channel planes.
                    chunk.shape = vec![t, c, 1, h, w];
                    loaded.unnormalize(&mut chunk).map_err(to_py_err)?;
                    chunk.shape = vec![t, c, h, w];
                }
            }
            let mut decoder = self.decoder.lock().unwrap_or_else(|e| e.into_inner());
            let _one_at_a_time = loaded.run.lock().unwrap_or_else(|e| e.into_inner());
            let got = decoder.push(&chunk).map_err(to_py_err)?;
            self.convert(got).map_err(to_py_err)
        })?;
        Ok(self.frames(py, got))
    }

    /// The frames of the last pushed chunk (None when all were taken).
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Ready<'py>> {
        let got = py.detach(|| -> PyResult<_> {
            let mut decoder = self.decoder.lock().unwrap_or_else(|e| e.into_inner());
            let _one_at_a_time = self._loaded.run.lock().unwrap_or_else(|e| e.into_inner());
            let got = decoder.finish().map_err(to_py_err)?;
            self.convert(got).map_err(to_py_err)
        })?;
        Ok(self.frames(py, got))
    }
}

/// True when `spec` names a video decoder (TAEHV file, Wan VAE).
#[pyfunction]
pub fn is_video_vae(py: Python<'_>, spec: String) -> bool {
    py.detach(|| wgvae::video::is_video_vae(&spec))
}
