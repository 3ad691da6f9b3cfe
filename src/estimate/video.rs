//! Memory estimates of streamed video decodes: the first chunks of the
//! video on a null device or, for frames of many tiles, the first chunks of
//! a few rows of their tiles, which stand for all of them.

use serde::Serialize;

use super::{zeros, Estimate};
use crate::error::{Error, Result};
use crate::exec::exact::{level_tiles, video_levels};
use crate::exec::report::Counts;
use crate::gpu::Context;
use crate::run::rows::{rows_latent, sample_rows, Sampled};
use crate::run::strategy::plan_tile_limit;
use crate::run::video::{video_rows_tile, video_tile_px, MAX_VIDEO_TILES, VIDEO_ROW_TILES};
use crate::tiling::{TileMode, Tiling, TilingReport};
use crate::video::{VideoModel, VIDEO_DEFAULT_TILE};

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
        tiling: Option<&Tiling>,
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
        let limit = crate::tiling::host_memory_available().unwrap_or(u64::MAX);
        dec.check_chunk_frames(chunk, (h, w), limit)
            .map_err(|e| match e {
                Error::OverBudget(m) => Error::OverBudget(format!("{m}; no estimate is made")),
                e => e,
            })?;
        let grows = dec.cache_grows();
        let chunks = frames.div_ceil(chunk);
        if grows && chunks > MAX_GROWING_CHUNKS {
            return Err(Error::InvalidInput(format!(
                "{}: its memory grows with the video (every earlier frame's attention keys), so an estimate runs every chunk; {frames} latent frames in chunks of {chunk} are {chunks} chunks, more than {MAX_GROWING_CHUNKS}: estimate fewer frames or larger chunks",
                dec.name()
            )));
        }
        let latent = [dec.latent_channels(), h / up, w / up];
        let weights_bytes = null.pool().stats().allocated_bytes.current;
        let job = Chunks {
            frames,
            chunk,
            tiling,
        };
        let run = match self.tile_run(&null, dec, latent, &job)? {
            // Frames of many tiles: a few rows of them stand for all.
            Some(t) => self.sampled(latent, t, &job)?,
            None => None,
        };
        let run = match run {
            Some(r) => r,
            None => job.run(&null, dec, latent, false)?,
        };
        let report = run.report.map(|r| TilingReport {
            max_memory: tiling.cloned().unwrap_or_default().budget(null.caps()),
            tiles: crate::run::tiles_of(&r, h, w),
            ..r
        });
        // Upload staging of the tiles is device memory outside the pool too.
        let staging_bytes =
            run.readback_bytes + report.as_ref().map_or(0, |r| r.staging_peak_bytes);
        Ok(VideoMemoryEstimate {
            policy: self.policy.name(),
            model: dec.name().to_string(),
            dtype: vae.dtype_for(self.load.precision, null.caps()).name(),
            frames,
            output_frames: dec.frames_for(frames),
            chunk,
            latent_frame: latent.to_vec(),
            frame_shape: vec![3, h, w],
            weights_bytes,
            cache_bytes: run.cache_bytes,
            activation_bytes: run.steady.saturating_sub(weights_bytes + run.cache_bytes),
            staging_bytes,
            first_chunk_peak_allocated_bytes: run.first,
            chunk_peak_allocated_bytes: run.steady,
            peak_allocated_bytes: run.first.max(run.steady),
            peak_reserved_bytes: run.reserved,
            tile_size: run.tile_size,
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
            reference_tiles: run.reference_tiles,
        })
    }

    /// How the estimate runs a tiled video's tiles: every one, or a few
    /// rows of them (latent tile side `t`, see [`video_rows_tile`]) for
    /// frames of more than [`MAX_VIDEO_TILES`] tiles. Frames of that many
    /// tiles whose rows are longer than a sample takes
    /// ([`VIDEO_ROW_TILES`]), or a model whose caches grow (its attention
    /// keys cover whole frames, so rows do not stand for each other, and it
    /// runs every chunk), get an error rather than minutes of dry runs.
    fn tile_run(
        &self,
        null: &Context,
        dec: VideoModel<'_>,
        [c, h, w]: [usize; 3],
        job: &Chunks,
    ) -> Result<Option<usize>> {
        let Some(tiling) = job.tiling.filter(|_| !dec.clip_based()) else {
            return Ok(None);
        };
        let graph = dec.graph();
        let px = video_tile_px(graph, tiling.tile_size.unwrap_or(VIDEO_DEFAULT_TILE));
        let Some(t) = level_tiles(px, video_levels(graph), (h, w))
            .first()
            .copied()
            .flatten()
        else {
            return Ok(None);
        };
        let (rows, cols) = (h.div_ceil(t), w.div_ceil(t));
        let tiles = rows.saturating_mul(cols);
        let limit = plan_tile_limit(MAX_VIDEO_TILES);
        // A model whose caches grow runs every chunk; its dry runs of a tile
        // cost little beside its whole-frame attention, so it runs more.
        let (chunks, most) = match dec.cache_grows() {
            true => (job.frames.div_ceil(job.chunk), 8 * limit),
            false => (3, 3 * limit),
        };
        if tiles.saturating_mul(chunks) <= most {
            return Ok(None);
        }
        let mut probe = crate::VideoDecoder::of(null, dec);
        probe.set_tiling(tiling.clone())?;
        let first = zeros([job.chunk.min(job.frames), c, h, w])?;
        if !probe.wants_tiles(&first)? {
            return Ok(None);
        }
        let up = dec.upscale();
        let frames = format!(
            "{}x{} frames in {px}-pixel exact tiles ({tiles} tiles, {rows} rows of {cols})",
            h * up,
            w * up
        );
        if dec.cache_grows() {
            return Err(Error::InvalidInput(format!(
                "{}: its caches grow with the video (attention keys of every earlier frame, over whole latent frames), so an estimate runs every chunk through every tile: {chunks} chunks of {frames} are more than it runs in seconds ({most} tile chunks); estimate fewer latent frames or larger chunks, or use larger tiles (`Tiling::tile_size`)",
                dec.name(),
            )));
        }
        match video_rows_tile(graph, px, (h, w)) {
            Some(t) => Ok(Some(t)),
            None => Err(Error::InvalidInput(format!(
                "an estimate of {frames} runs a few rows of tiles, of at most {VIDEO_ROW_TILES} tiles each (each tile streams the estimated chunks): use larger tiles (`Tiling::tile_size`)"
            ))),
        }
    }

    /// The video's chunks on a few rows of its tiles of latent side `t`
    /// ([`sample_rows`]), each sample on a fresh null device in exact tiles
    /// that stand for the whole frames: their peaks, and their counts
    /// extrapolated to every row. `None`: too few rows, or samples that did
    /// not peak alike (the caller runs every tile).
    fn sampled(&self, [c, h, w]: [usize; 3], t: usize, job: &Chunks) -> Result<Option<NullVideo>> {
        let exact = Tiling {
            mode: TileMode::Exact,
            ..job.tiling.cloned().unwrap_or_default()
        };
        let sample = Chunks {
            tiling: Some(&exact),
            ..*job
        };
        let walk = |rows: usize| -> Result<Option<NullVideo>> {
            let null = Context::null(self.caps.clone(), self.policy.new_pool());
            let vae = crate::video::load_video_decoder(&null, self.vae, self.load)?;
            let latent = [c, rows_latent(h, t, rows), w];
            sample.run(&null, vae.model(), latent, true).map(Some)
        };
        let peaks = |s: &NullVideo| {
            let r = s.report.as_ref();
            (
                [
                    s.first,
                    s.steady,
                    s.reserved,
                    s.cache_bytes,
                    s.readback_bytes,
                ],
                r.map(|r| (r.device_parked_peak_bytes, r.staging_peak_bytes)),
            )
        };
        let pass_rows = |s: &NullVideo| s.report.as_ref().map_or(0, |r| r.attention_rows_per_pass);
        match sample_rows((h.div_ceil(t), w.div_ceil(t)), walk, pass_rows, peaks)? {
            Sampled::Rows { samples, x, .. } => {
                let at = samples
                    .each_ref()
                    .map(|s| s.report.as_ref().map(Counts::of));
                let [mut run, _, _] = samples;
                if let (Some(r), [Some(a), Some(b), Some(c)]) = (run.report.as_mut(), at) {
                    Counts::quadratic([a, b, c], x).apply(r);
                }
                Ok(Some(run))
            }
            Sampled::Every | Sampled::Over => Ok(None),
        }
    }
}

/// The chunks an estimate streams: `frames` latent frames, `chunk` at a
/// time, tiled as `tiling` says (`None`: the model's default).
#[derive(Clone, Copy)]
struct Chunks<'t> {
    frames: usize,
    chunk: usize,
    tiling: Option<&'t Tiling>,
}

/// What a null-device run of a video's first chunks tells.
#[derive(Clone)]
struct NullVideo {
    /// Peak allocated over the first chunk, and over the steady state.
    first: u64,
    steady: u64,
    reserved: u64,
    /// Pool bytes of the time caches between chunks.
    cache_bytes: u64,
    /// Read-back staging buffers of an untiled run.
    readback_bytes: u64,
    tile_size: Option<usize>,
    report: Option<TilingReport>,
    /// A clip-based decoder's reference tiles (output pixels).
    reference_tiles: Option<(usize, usize)>,
}

impl Chunks<'_> {
    /// Streams the chunks of latent frames `[C, h, w]` through `dec` on the
    /// null device `null`; `rows_sample`: the frames are a few rows of
    /// tiles of a video planned by rows.
    fn run(
        &self,
        null: &Context,
        dec: VideoModel<'_>,
        latent: [usize; 3],
        rows_sample: bool,
    ) -> Result<NullVideo> {
        let Chunks {
            frames,
            chunk,
            tiling,
        } = *self;
        let mut stream = crate::VideoDecoder::of(null, dec);
        if let Some(t) = tiling {
            stream.set_tiling(t.clone())?;
        }
        if rows_sample {
            stream.sample_rows();
        }
        let zeros = |t: usize| zeros([t, latent[0], latent[1], latent[2]]);
        // The first chunk (no caches yet, Wan's first frame skips its time
        // convs) and up to two more, as long as the video has frames for
        // them: the second may still differ from the steady state. A model
        // whose caches grow runs every chunk (the last peaks highest).
        let grows = dec.cache_grows();
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
                stream.push(&zeros(t)?)?;
                // The tail a clip leaves for the next (the last clip leaves none).
                clip_cache = clip_cache.max(stream.cache_bytes());
            }
            stream.finish()?;
            let stats = null.pool().stats();
            peaks = [stats.allocated_bytes.peak; 3];
            reserved = stats.reserved_bytes.peak;
            left = 0;
        }
        for i in 0..if grows { frames.div_ceil(chunk) } else { 3 } {
            if left == 0 {
                break;
            }
            let t = chunk.min(left);
            left -= t;
            let z = zeros(t)?;
            null.pool().reset_peak_stats();
            stream.decode(&z)?;
            let stats = null.pool().stats();
            let peak = &mut peaks[i.min(2)];
            *peak = (*peak).max(stats.allocated_bytes.peak);
            reserved = reserved.max(stats.reserved_bytes.peak);
        }
        // A one-chunk video has no steady state: its only chunk is it.
        let steady = if frames > chunk {
            peaks[1].max(peaks[2])
        } else {
            peaks[0]
        };
        Ok(NullVideo {
            first: peaks[0],
            steady,
            reserved,
            cache_bytes: stream.cache_bytes().max(clip_cache),
            readback_bytes: stream.staging_bytes(),
            tile_size: stream.tile_size(),
            report: stream.tiling_report(),
            reference_tiles: stream.reference_tiles((latent[1], latent[2])),
        })
    }
}
