//! Memory estimates: the front ends' runs on a null device, whose pool
//! replays the allocation sequence of a real run without running a kernel.

use serde::Serialize;

use crate::decode::{decode_checked, DecodeOptions};
use crate::encode::{encode, EncodeOptions, VaeEncoder};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context};
use crate::io::HostTensor;
use crate::memory::{MemoryStats, Policy};
use crate::models::{LoadOptions, Vae};
use crate::tiling::{Tiling, TilingReport};

/// Predicted memory of a decode.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    /// Memory policy the estimate is for.
    pub policy: &'static str,
    /// The model's description.
    pub model: String,
    /// Latent shape `[N, C, h, w]`.
    pub latents_shape: Vec<usize>,
    /// Image shape `[N, C, H, W]` (C: the decoder's image channels, or the
    /// encoder's input's 3).
    pub image_shape: Vec<usize>,
    /// Bytes of weights (part of the peaks).
    pub weights_bytes: u64,
    /// Peaks over the decode, weights included.
    pub peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes (pool capacity, weights included).
    pub peak_reserved_bytes: u64,
    /// How the decode would be tiled (host bytes for parking included).
    pub tiling: TilingReport,
}

/// What a run on the null device tells: (model name, weight bytes),
/// (latents shape, image shape), its memory and its tiling.
type NullRun = (
    (String, u64),
    (Vec<usize>, Vec<usize>),
    MemoryStats,
    TilingReport,
);

impl MemoryEstimate {
    /// Runs `job` on a null device with a fresh pool of `policy`.
    fn predict(
        caps: &Capabilities,
        policy: Policy,
        job: impl FnOnce(&Context) -> Result<NullRun>,
    ) -> Result<Self> {
        let null = Context::null(caps.clone(), policy.new_pool());
        let ((model, weights_bytes), (latents_shape, image_shape), memory, tiling) = job(&null)?;
        Ok(MemoryEstimate {
            policy: policy.name(),
            model,
            latents_shape,
            image_shape,
            weights_bytes,
            peak_allocated_bytes: memory.allocated_bytes.peak,
            peak_reserved_bytes: memory.reserved_bytes.peak,
            tiling,
        })
    }
}

/// Zeros of `shape`: the input a real run would hold on the host. A shape
/// whose values could not exist on this host is an error, before anything
/// is allocated (sizes with no real input behind them, e.g. a batch of 2^64).
fn zeros(shape: [usize; 4]) -> Result<HostTensor> {
    let bytes = shape
        .iter()
        .try_fold(4usize, |a, &d| a.checked_mul(d))
        .map(|b| b as u64);
    let limit = crate::tiling::host_memory_available().unwrap_or(u64::MAX);
    match bytes {
        Some(b) if b <= limit => {
            HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()])
        }
        _ => Err(Error::OverBudget(format!(
            "an input of shape {shape:?} ({}) does not fit this host's available memory ({:.1} GiB); a run of that size needs it in host memory, so no estimate is made",
            bytes.map_or("over 2^64 bytes".to_string(), |b| format!("{:.1} GiB of f32", b as f64 / (1u64 << 30) as f64)),
            limit as f64 / (1u64 << 30) as f64
        ))),
    }
}

/// A memory prediction: a model (`vae`, loaded with `load`) on a device
/// with `caps` under `policy`, tiled as `tiling` says. [`Estimate::decode`]
/// and [`Estimate::encode`] run the front end on a null device
/// ([`Context::null`]) whose pool replays the allocation sequence, without
/// running a kernel or allocating device memory; the choices are the ones
/// [`crate::decode()`] / [`crate::encode::encode()`] make with these options on such a device.
#[derive(Clone, Debug)]
pub struct Estimate<'a> {
    /// The device the run is predicted for.
    pub caps: &'a Capabilities,
    /// Memory policy of the pool.
    pub policy: Policy,
    /// The model, as [`Vae::load`] takes it.
    pub vae: &'a str,
    /// How it is loaded (precision, config overrides, preset seed).
    pub load: &'a LoadOptions,
    /// How the run is tiled (untiled unless [`Estimate::tiled`]).
    pub tiling: Tiling,
}

impl<'a> Estimate<'a> {
    /// An untiled run of `vae` on `caps` under `policy`.
    pub fn new(
        caps: &'a Capabilities,
        policy: Policy,
        vae: &'a str,
        load: &'a LoadOptions,
    ) -> Self {
        Estimate {
            caps,
            policy,
            vae,
            load,
            tiling: Tiling::off(),
        }
    }

    /// The same run tiled as `tiling` says.
    pub fn tiled(mut self, tiling: &Tiling) -> Self {
        self.tiling = tiling.clone();
        self
    }

    /// Peaks of decoding latents of `latent_shape` `[N, C, h, w]`.
    pub fn decode(&self, latent_shape: [usize; 4]) -> Result<MemoryEstimate> {
        let latents = zeros(latent_shape)?;
        MemoryEstimate::predict(self.caps, self.policy, |null| {
            let vae = Vae::load(null, self.vae, self.load)?;
            let opts = DecodeOptions {
                raw_latents: true,
                tiling: self.tiling.clone(),
                ..Default::default()
            };
            // Zeros: nothing to scan for non-finite values.
            let out = decode_checked(null, &vae, &latents, &opts, false)?;
            let image = vec![latent_shape[0], out.channels, out.height, out.width];
            let model = (vae.name.clone(), vae.weights_bytes);
            let shapes = (latent_shape.to_vec(), image);
            Ok((model, shapes, out.memory, out.tiling))
        })
    }

    /// Peaks of encoding images of `image_shape` `[N, 3, H, W]`.
    pub fn encode(&self, image_shape: [usize; 4]) -> Result<MemoryEstimate> {
        let image = zeros(image_shape)?;
        MemoryEstimate::predict(self.caps, self.policy, |null| {
            let enc = VaeEncoder::load(null, self.vae, self.load)?;
            let opts = EncodeOptions {
                tiling: self.tiling.clone(),
                ..Default::default()
            };
            let out = encode(null, &enc, &image, &opts)?;
            let model = (enc.name.clone(), enc.weights_bytes);
            let shapes = (out.latents.shape.clone(), image_shape.to_vec());
            Ok((model, shapes, out.memory, out.tiling))
        })
    }
}

/// Predicted memory of a streaming video decode ([`crate::VideoDecoder`])
/// of `frames` latent frames. From three chunks on the peak no longer grows
/// with the length (every later chunk repeats the steady state); shorter
/// videos may peak lower (Wan's first chunk skips its time convs).
/// Peaks are the pool's (weights included); the staging buffers are
/// host-visible read-back memory outside the pool.
#[derive(Clone, Debug, Serialize)]
pub struct VideoMemoryEstimate {
    /// Memory policy the estimate is for.
    pub policy: &'static str,
    /// The decoder's variant.
    pub model: String,
    /// Storage precision.
    pub dtype: &'static str,
    /// Latent frames of the video (T).
    pub frames: usize,
    /// Output frames the video decodes to.
    pub output_frames: usize,
    /// Latent frames per streamed chunk.
    pub chunk: usize,
    /// One latent frame `[C, h, w]`.
    pub latent_frame: Vec<usize>,
    /// One output frame `[3, H, W]`.
    pub frame_shape: Vec<usize>,
    /// Bytes of weights.
    pub weights_bytes: u64,
    /// Bytes of the time caches held between chunks.
    pub cache_bytes: u64,
    /// Peak working bytes of a steady-state chunk (its peak allocated −
    /// weights − caches; the first chunk's for a one-chunk video).
    pub activation_bytes: u64,
    /// Read-back double buffers, and the upload staging of exact tiles
    /// (outside the pool).
    pub staging_bytes: u64,
    /// Peak allocated over the first chunk.
    pub first_chunk_peak_allocated_bytes: u64,
    /// Peak allocated over a steady-state chunk (the same for every later
    /// one; the first chunk's when the video has only one).
    pub chunk_peak_allocated_bytes: u64,
    /// Peak allocated of the whole decode of `frames` latent frames.
    pub peak_allocated_bytes: u64,
    /// Peak reserved of the whole decode of `frames` latent frames.
    pub peak_reserved_bytes: u64,
    /// Exact tile side in output pixels (`None`: untiled).
    pub tile_size: Option<usize>,
    /// The exact tiled run over the estimated chunks (`None`: untiled):
    /// tiles parked on the device and in host memory, uploads, syncs, steps.
    pub tiling: Option<crate::tiling::TilingReport>,
    /// True when the video has at least three full chunks and the model's
    /// caches do not grow: every longer video then has the same peaks
    /// (streaming holds only the caches between chunks). False: a longer
    /// video may peak higher.
    pub independent_of_frames: bool,
    /// The model's caches grow with the video (every earlier frame's
    /// attention keys and values: HunyuanVideo 1.5), so the peak grows
    /// with `frames`; the estimate ran every chunk.
    pub cache_grows: bool,
    /// The decoder is not causal (LTX-2): the whole clip is one chunk, so
    /// the peak grows with `frames`.
    pub whole_clip: bool,
    /// Clip-based (MiniMax-H3): latent frames per clip. Memory is bounded
    /// by one clip (and the previous clip's tail) whatever the length.
    pub clip_frames: Option<usize>,
    /// A clip-based decoder's reference tiles (MiniMax-H3's default, as
    /// diffusers decodes it): tile and least overlap in output pixels.
    pub reference_tiles: Option<(usize, usize)>,
}

/// [`VideoMemoryEstimate::breakdown`]: the peak allocated bytes in parts
/// that add up to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct VideoPeakBreakdown {
    /// The weights.
    pub weights: u64,
    /// The time caches (at most what the peak holds beside the weights).
    pub caches: u64,
    /// The rest of the peak: the activations of the chunk that peaks.
    pub working: u64,
}

impl VideoMemoryEstimate {
    /// `peak_allocated_bytes` = weights + caches + working, each part at
    /// most what the peak leaves for it (so the parts always add up).
    pub fn breakdown(&self) -> VideoPeakBreakdown {
        let peak = self.peak_allocated_bytes;
        let weights = self.weights_bytes.min(peak);
        let caches = self.cache_bytes.min(peak - weights);
        VideoPeakBreakdown {
            weights,
            caches,
            working: peak - weights - caches,
        }
    }
}

/// Most chunks an estimate of a model whose caches grow runs (each on the null device).
const MAX_GROWING_CHUNKS: usize = 1 << 14;

/// Most latent frames a video estimate takes (frame counts stay far from overflow).
#[doc(hidden)]
pub const MAX_VIDEO_FRAMES: usize = 1 << 24;

impl Estimate<'_> {
    /// Peaks of streaming a video of `frames` latent frames, `chunk` at a
    /// time, into frames of `size` `(H, W)` pixels: the first three chunks
    /// (those the video has) run on a null device; every later chunk repeats
    /// the steady state's allocations. Untiled.
    pub fn video(
        &self,
        size: (usize, usize),
        frames: usize,
        chunk: usize,
    ) -> Result<VideoMemoryEstimate> {
        self.video_with(size, frames, chunk, None)
    }

    /// [`Estimate::video`] with frames tiled as `tiling` asks
    /// ([`crate::VideoDecoder::set_tiling`]): an exact tiled decode runs on
    /// the null device too (its tiles parked on the host are outside the pool).
    pub fn video_tiled(
        &self,
        size: (usize, usize),
        frames: usize,
        chunk: usize,
        tiling: &crate::tiling::Tiling,
    ) -> Result<VideoMemoryEstimate> {
        self.video_with(size, frames, chunk, Some(tiling))
    }

    /// [`Estimate::video_tiled`]; `None`: the model's default tiling
    /// (untiled, MiniMax-H3 in its reference's tiles).
    fn video_with(
        &self,
        size: (usize, usize),
        frames: usize,
        chunk: usize,
        tiling: Option<&crate::tiling::Tiling>,
    ) -> Result<VideoMemoryEstimate> {
        let (h, w) = size;
        if frames == 0 || chunk == 0 || frames > MAX_VIDEO_FRAMES {
            return Err(Error::InvalidInput(format!(
                "a video needs at least one latent frame (at most {MAX_VIDEO_FRAMES}) and chunks of at least one (got {frames} frames, chunks of {chunk})"
            )));
        }
        if h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!(
                "video frame size {h}x{w}: both sides must be positive"
            )));
        }
        let null = Context::null(self.caps.clone(), self.policy.new_pool());
        let vae = crate::video::load_video_decoder(&null, self.vae, self.load)?;
        let dec = vae.model();
        let up = dec.upscale();
        if h % up != 0 || w % up != 0 {
            return Err(Error::InvalidInput(format!(
                "video frame size {h}x{w}: a {} decoder's frames are multiples of {up} pixels (one latent pixel each)",
                dec.name()
            )));
        }
        // A decoder that is not causal (LTX-2) takes the whole clip at once.
        let chunk = if dec.whole_clip() { frames } else { chunk };
        // A real run holds a chunk's decoded frames (f32) in host memory:
        // one the host cannot take gets no estimate (nor a dry run that
        // would build them).
        let steady = dec
            .frames_for(chunk.saturating_add(1))
            .saturating_sub(dec.frames_for(1));
        let out_frames = dec.frames_for(chunk).max(steady).max(1);
        let frame_bytes = (3 * 4u64).saturating_mul(h as u64).saturating_mul(w as u64);
        let chunk_bytes = frame_bytes.saturating_mul(out_frames as u64);
        let limit = crate::tiling::host_memory_available().unwrap_or(u64::MAX);
        if chunk_bytes > limit {
            return Err(Error::OverBudget(format!(
                "a chunk of {chunk} latent frames decodes to {out_frames} frames of {h}x{w}, whose {:.1} GiB of f32 do not fit this host's available memory ({:.1} GiB); a run of that size holds them in host memory, so no estimate is made: use smaller frames or chunks",
                chunk_bytes as f64 / (1u64 << 30) as f64,
                limit as f64 / (1u64 << 30) as f64
            )));
        }
        let c = dec.latent_channels();
        let latent = [c, h / up, w / up];
        let weights_bytes = null.pool().stats().allocated_bytes.current;
        let mut stream = crate::VideoDecoder::new(&null, dec);
        if let Some(t) = tiling {
            stream.set_tiling(t.clone())?;
        }
        // The first chunk (no caches yet, Wan's first frame skips its time
        // convs) and up to two more, as long as the video has frames for
        // them: the second may still differ from the steady state. A model
        // whose caches grow runs every chunk (the last peaks highest).
        let grows = dec.cache_grows();
        let chunks = frames.div_ceil(chunk);
        if grows && chunks > MAX_GROWING_CHUNKS {
            return Err(Error::InvalidInput(format!(
                "{}: its memory grows with the video (every earlier frame's attention keys), so an estimate runs every chunk; {frames} latent frames in chunks of {chunk} are {chunks} chunks, more than {MAX_GROWING_CHUNKS}: estimate fewer frames or larger chunks",
                dec.name()
            )));
        }
        let mut peaks = [0u64; 3];
        let mut reserved = 0u64;
        let mut left = frames;
        let mut clip_cache = 0u64;
        if let Some(geo) = dec.clip() {
            // Clip by clip: the first clip (no tail to fade from), the ones
            // after it (all alike) and the last (its tail appended). A video
            // shortened by whole clips, its length the same modulo a clip,
            // has each of them.
            let spare = frames.saturating_sub(3 * geo.k + geo.overlap + 1) / geo.k;
            let mut rest = frames - spare * geo.k;
            null.pool().reset_peak_stats();
            while rest > 0 {
                let t = chunk.min(rest);
                rest -= t;
                stream.push(&zeros([t, latent[0], latent[1], latent[2]])?)?;
                // The tail a clip leaves for the next (the last clip leaves none).
                clip_cache = clip_cache.max(stream.cache_bytes());
            }
            stream.finish()?;
            let stats = null.pool().stats();
            peaks = [stats.allocated_bytes.peak; 3];
            reserved = stats.reserved_bytes.peak;
            left = 0;
        }
        for i in 0..if grows { chunks } else { 3 } {
            if left == 0 {
                break;
            }
            let t = chunk.min(left);
            left -= t;
            let z = zeros([t, latent[0], latent[1], latent[2]])?;
            null.pool().reset_peak_stats();
            stream.decode(&z)?;
            let stats = null.pool().stats();
            let peak = &mut peaks[i.min(2)];
            *peak = (*peak).max(stats.allocated_bytes.peak);
            reserved = reserved.max(stats.reserved_bytes.peak);
        }
        let first = peaks[0];
        // A one-chunk video has no steady state: its only chunk is it.
        let steady = if frames > chunk {
            peaks[1].max(peaks[2])
        } else {
            first
        };
        let cache_bytes = stream.cache_bytes().max(clip_cache);
        let peak = first.max(steady);
        let report = stream.tiling_report().map(|r| crate::tiling::TilingReport {
            max_memory: tiling.cloned().unwrap_or_default().budget(null.caps()),
            tiles: crate::run::tiles_of(&r, h, w),
            ..r
        });
        // Upload staging of the tiles is device memory outside the pool too.
        let staging_bytes =
            stream.staging_bytes() + report.as_ref().map_or(0, |r| r.staging_peak_bytes);
        Ok(VideoMemoryEstimate {
            policy: self.policy.name(),
            model: dec.name().to_string(),
            dtype: vae.dtype_for(self.load.precision, null.caps()).name(),
            frames,
            output_frames: crate::VideoDecoder::frames_for(dec, frames),
            chunk,
            latent_frame: latent.to_vec(),
            frame_shape: vec![3, h, w],
            weights_bytes,
            cache_bytes,
            activation_bytes: steady.saturating_sub(weights_bytes + cache_bytes),
            staging_bytes,
            first_chunk_peak_allocated_bytes: first,
            chunk_peak_allocated_bytes: steady,
            peak_allocated_bytes: peak,
            peak_reserved_bytes: reserved,
            tile_size: stream.tile_size(),
            tiling: report,
            // A clip-based decoder's peak is bounded by a clip; its last clip
            // varies with the length modulo a clip.
            independent_of_frames: frames / chunk >= 3
                && !grows
                && !dec.whole_clip()
                && !dec.clip_based(),
            cache_grows: grows,
            whole_clip: dec.whole_clip(),
            clip_frames: dec.clip().map(|g| g.k + g.overlap),
            reference_tiles: stream.reference_tiles((h / up, w / up)),
        })
    }
}
