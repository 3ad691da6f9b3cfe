//! Video latents → frames with a causal video decoder (the TAEHV family):
//! whole clips ([`decode_video`]) or streamed chunk by chunk
//! ([`VideoDecoder`]), both running the model's graph with time as the
//! batch dimension and keeping only its per-layer time caches (one frame
//! each, from the pool) between chunks.
//!
//! Output is the decoder's raw float output in the reference's layout
//! (TAEHV: frames `[T', 3, H, W]` before its clamp to [0, 1]), with the
//! first `frames_to_trim` frames of a video dropped and the pixel shuffle of
//! patch-size-2 models applied on the host as the frames come back.
//!
//! A decoder borrows its model ([`VideoDecoder::new`]) or shares it
//! ([`VideoDecoder::shared`], `'static`: for hosts that keep the decoder
//! beside the model, e.g. in a Python object). Embedded in a wgpu app,
//! [`VideoDecoder::record_chunk_to_textures`] records a chunk into the
//! app's own `wgpu::CommandEncoder` and writes each frame into one of its
//! textures (RGBA8 or RGBA16F, as [`crate::embed`]'s image path), with
//! nothing submitted or read back; the returned [`PendingFrames`] is kept
//! until the app submits.

use std::sync::{mpsc, Arc};

use crate::error::{Error, Result};
use crate::exec::exact::{level_tiles, video_levels, ExactPlan, Executor, VideoCaches};
use crate::exec::untiled::{run_video, VideoState};
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::models::graph::Graph;
use crate::models::taehv::TaehvDecoder;
use crate::models::wan::WanDecoder;
use crate::models::Taps;
use crate::tensor::Tensor;
use crate::tiling::{TileMode, Tiling};

/// A causal video decoder [`VideoDecoder`] and [`decode_video`] run.
#[derive(Clone, Copy)]
pub enum VideoModel<'a> {
    /// The TAEHV family (latents N×T×C×h×w, output before its [0, 1] clamp).
    Taehv(&'a TaehvDecoder),
    /// The Wan 2.1 VAE (latents N×C×T×h×w, output clamped to [−1, 1]).
    Wan(&'a WanDecoder),
}

impl<'a> From<&'a TaehvDecoder> for VideoModel<'a> {
    fn from(d: &'a TaehvDecoder) -> Self {
        VideoModel::Taehv(d)
    }
}

impl<'a> From<&'a WanDecoder> for VideoModel<'a> {
    fn from(d: &'a WanDecoder) -> Self {
        VideoModel::Wan(d)
    }
}

impl<'a> VideoModel<'a> {
    /// The cooperative-matrix configuration its convolutions run on (`8x8x8 f16->f32`),
    /// `None` on the scalar path.
    pub fn cooperative_matrix(self) -> Option<String> {
        self.graph().matrix_config()
    }

    fn graph(self) -> &'a Graph {
        match self {
            VideoModel::Taehv(d) => d.graph(),
            VideoModel::Wan(d) => d.graph(),
        }
    }
    fn frames_to_trim(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.frames_to_trim(),
            VideoModel::Wan(_) => 0,
        }
    }
    fn patch_size(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.patch_size,
            VideoModel::Wan(_) => 1,
        }
    }
    /// True when latents are N×C×T×h×w (Wan, diffusers), false for N×T×C×h×w (TAEHV).
    pub fn channels_first(&self) -> bool {
        matches!(self, VideoModel::Wan(_))
    }

    /// The latent layout the model takes (TAEHV `ntchw`, Wan `ncthw`).
    pub fn latent_layout(&self) -> VideoLayout {
        match self {
            VideoModel::Taehv(d) => d.latent_layout(),
            VideoModel::Wan(_) => VideoLayout::Ncthw,
        }
    }

    /// The model's name in messages and reports.
    pub fn name(&self) -> &str {
        match self {
            VideoModel::Taehv(d) => d.variant_name(),
            VideoModel::Wan(d) => &d.name,
        }
    }

    /// Channels of one latent frame.
    pub fn latent_channels(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.latent_channels,
            VideoModel::Wan(d) => d.latent_channels(),
        }
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.upscale(),
            VideoModel::Wan(d) => d.upscale(),
        }
    }

    /// The range of the decoded frames (TAEHV [0, 1], Wan [−1, 1]).
    pub fn range(&self) -> crate::kernels::image::ImageRange {
        match self {
            VideoModel::Taehv(_) => crate::kernels::image::ImageRange::ZeroToOne,
            VideoModel::Wan(_) => crate::kernels::image::ImageRange::MinusOneToOne,
        }
    }
}

pub use crate::latents::VideoLayout;

/// Frames one streamed chunk completed, as [`VideoDecoder::push`] hands them over.
#[derive(Debug)]
pub struct VideoFrames {
    /// Frames `[T', 3, H, W]` (TAEHV: raw, before its [0, 1] clamp; Wan:
    /// clamped to [−1, 1]).
    pub frames: HostTensor,
    /// Index in the video of the first of them.
    pub first: usize,
    /// Milliseconds from the submission of their chunk until they were on
    /// the host (the same for every frame of a chunk).
    pub latency_ms: f64,
}

/// A submitted chunk whose output is on its way to a staging buffer.
struct Pending {
    slot: usize,
    submitted: std::time::Instant,
    submission: Option<wgpu::SubmissionIndex>,
    mapped: Option<mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>>,
    /// Output `[frames, channels, h, w]` before trim and pixel shuffle.
    shape: [usize; 4],
    dtype: crate::tensor::DType,
    bytes: u64,
    /// The output as f32, already on the host (a tiled chunk).
    ready: Option<Vec<f32>>,
}

/// A video chunk recorded into the host's encoder by
/// [`VideoDecoder::record_chunk_to_textures`].
///
/// **Keep it until you have submitted that encoder, then drop it.** It owns
/// the chunk's output memory (from the decoder's pool) and any intermediate
/// texture, so the pool does not hand them out again meanwhile (wgpu keeps
/// what an unsubmitted encoder uses alive, so dropping it early is
/// memory-safe; it only ends the accounting).
#[must_use = "keep the PendingFrames until the encoder is submitted"]
#[derive(Debug)]
pub struct PendingFrames {
    _tensors: Vec<Tensor>,
    _intermediates: Vec<wgpu::Texture>,
    frames: usize,
    first: usize,
    width: u32,
    height: u32,
    dispatches: usize,
}

impl PendingFrames {
    /// Frames written: into the first `frames()` target textures.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Index in the video of the first of them.
    pub fn first(&self) -> usize {
        self.first
    }

    /// Width of the frames in pixels (texels written: `0..width`).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height of the frames in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Compute dispatches recorded.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }
}

/// Default tile side of an exact tiled video decode, in output pixels.
pub const VIDEO_DEFAULT_TILE: usize = 256;

/// A [`VideoDecoder`] running exact tiles: its executor (kept for the whole
/// video: the caches' parked tiles count against its device cap) and the
/// time caches as whole-frame tiled activations.
struct TiledVideo {
    exec: Executor,
    caches: VideoCaches,
    /// Tile side in output pixels.
    px: usize,
}

/// The model a [`VideoDecoder`] runs: borrowed, or shared through an `Arc`
/// ([`VideoDecoder::shared`]: a `'static` decoder a host can keep beside
/// anything, e.g. in a Python object).
enum ModelRef<'a> {
    Borrowed(VideoModel<'a>),
    Shared(Arc<VideoVae>),
}

impl ModelRef<'_> {
    fn get(&self) -> VideoModel<'_> {
        match self {
            ModelRef::Borrowed(m) => *m,
            ModelRef::Shared(v) => v.model(),
        }
    }
}

/// A streaming decode of one video: feed latent chunks in order, get the
/// frames each chunk completes. Between calls it holds only the decoder's
/// time caches (one frame per MemBlock), so memory does not grow with the
/// video's length; the output equals decoding the whole clip at once up to
/// float rounding.
///
/// [`VideoDecoder::push`] double-buffers the read-back (as
/// [`crate::decode_frames`] does): chunk k + 1 is recorded and submitted
/// before the host waits for chunk k, whose frames it then returns, so the
/// device decodes k + 1 while the host takes k; [`VideoDecoder::finish`]
/// returns the last chunk's. [`VideoDecoder::decode`] is the same without
/// the overlap (submit, wait, return this chunk's frames).
pub struct VideoDecoder<'a> {
    ctx: Context,
    decoder: ModelRef<'a>,
    state: VideoState,
    /// Latent frame shape `[C, h, w]` of the first chunk.
    frame: Option<[usize; 3]>,
    /// Output frames still to drop at the video's start.
    to_trim: usize,
    /// Frames handed over (or written to host textures) so far.
    delivered: usize,
    /// Latent frames decoded so far.
    latent_frames: usize,
    /// Chunks submitted so far (picks the staging slot).
    submitted: usize,
    /// Two `MAP_READ` buffers, alternating between chunks.
    staging: [Option<(wgpu::Buffer, u64)>; 2],
    /// Largest chunk output so far: what each staging slot grows to.
    largest_chunk_bytes: u64,
    pending: Option<Pending>,
    /// Why an earlier chunk failed after the caches were touched: the
    /// caches no longer hold the previous frames, so later chunks are refused.
    broken: Option<String>,
    /// How frames are tiled (`Off`: untiled, the default).
    tiling: Tiling,
    /// The exact tiled run, from the first chunk on when tiles were chosen.
    tiled: Option<TiledVideo>,
}

impl VideoDecoder<'static> {
    /// A decoder at the start of a video that shares ownership of `model`
    /// (no borrow: it can live beside the `Arc` or outlive it).
    pub fn shared(ctx: &Context, model: Arc<VideoVae>) -> Self {
        Self::with_model(ctx, ModelRef::Shared(model))
    }
}

impl<'a> VideoDecoder<'a> {
    /// A decoder at the start of a video.
    pub fn new(ctx: &Context, decoder: impl Into<VideoModel<'a>>) -> Self {
        Self::with_model(ctx, ModelRef::Borrowed(decoder.into()))
    }

    /// The model it runs.
    pub fn model(&self) -> VideoModel<'_> {
        self.decoder.get()
    }

    fn with_model(ctx: &Context, decoder: ModelRef<'a>) -> Self {
        let to_trim = decoder.get().frames_to_trim();
        VideoDecoder {
            ctx: ctx.clone(),
            decoder,
            state: VideoState::default(),
            frame: None,
            to_trim,
            delivered: 0,
            latent_frames: 0,
            submitted: 0,
            staging: [None, None],
            largest_chunk_bytes: 0,
            pending: None,
            broken: None,
            tiling: Tiling::off(),
            tiled: None,
        }
    }

    /// Tiles every frame spatially (set before the first chunk).
    /// [`TileMode::Exact`]: each layer runs tile by tile over its output
    /// with the time caches kept as whole frames parked tile by tile, so the
    /// frames equal the untiled decode up to float rounding (no seams) while
    /// no tensor holds a whole frame at the full resolution: frames larger
    /// than the device's storage binding limit or the memory budget
    /// decode. `tile_size` is in output pixels ([`VIDEO_DEFAULT_TILE`] when
    /// `None`); the budget (`max_memory`) caps the tiles parked on the
    /// device (half of what the weights leave), the rest go to host memory.
    /// [`TileMode::Auto`]: exact tiles only when a null-device dry run of the
    /// untiled first chunk exceeds the budget or a device limit.
    /// [`TileMode::Off`] (the default): untiled. [`TileMode::Fast`] is refused
    /// (its blended tiles would put seams in time as well as space).
    pub fn set_tiling(&mut self, tiling: Tiling) -> Result<()> {
        if self.submitted > 0 {
            return Err(Error::InvalidInput(
                "a VideoDecoder's tiling is set before its first chunk".into(),
            ));
        }
        if tiling.mode == TileMode::Fast {
            return Err(Error::Unsupported(
                "fast (blended) tiles of a video decode: use exact tiles (`TileMode::Exact`), equal to the untiled decode".into(),
            ));
        }
        if tiling.tile_size == Some(0) {
            return Err(Error::InvalidInput("a tile size of 0 pixels".into()));
        }
        self.tiling = tiling;
        Ok(())
    }

    /// [`VideoDecoder::set_tiling`] as a builder.
    pub fn with_tiling(mut self, tiling: Tiling) -> Result<Self> {
        self.set_tiling(tiling)?;
        Ok(self)
    }

    /// The exact tile side in output pixels once a chunk ran tiled (`None`: untiled).
    pub fn tile_size(&self) -> Option<usize> {
        self.tiled.as_ref().map(|t| t.px)
    }

    /// Whether the first chunk `[T, C, h, w]` runs exact tiles: always for
    /// [`TileMode::Exact`]; for [`TileMode::Auto`] when the untiled chunk
    /// does not fit the budget or a device limit (a null-device dry run).
    fn wants_tiles(&self, chunk: &HostTensor) -> Result<bool> {
        match self.tiling.mode {
            TileMode::Off | TileMode::Fast => Ok(false),
            TileMode::Exact => Ok(true),
            TileMode::Auto => {
                let budget = self.tiling.budget(self.ctx.caps());
                let base = self.ctx.pool().stats().allocated_bytes.current;
                let graph = self.decoder.get().graph();
                let fits = crate::run::strategy::fits_budget(&self.ctx, budget, base, |null| {
                    let mut rec = Recorder::new(null);
                    let input =
                        Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
                    let raw = run_video(
                        graph,
                        &mut rec,
                        input,
                        &mut Taps::default(),
                        &mut VideoState::default(),
                    )?;
                    drop(raw);
                    rec.finish();
                    Ok(())
                })?;
                Ok(!fits)
            }
        }
    }

    /// The exact plan of a video whose latent frames are `h × w`.
    fn exact_plan(&self, (h, w): (usize, usize)) -> Result<(ExactPlan, usize)> {
        let graph = self.decoder.get().graph();
        let levels = video_levels(graph);
        let scale = 1usize << (levels - 1);
        let patch = self.decoder.get().patch_size().max(1);
        let px_out = self.tiling.tile_size.unwrap_or(VIDEO_DEFAULT_TILE);
        // Graph-output pixels (before the pixel shuffle), a multiple of the scale.
        let px = px_out.div_ceil(patch).div_ceil(scale).max(1) * scale;
        let budget = self.tiling.budget(self.ctx.caps());
        let base = self.ctx.pool().stats().allocated_bytes.current;
        let avail = budget.checked_sub(base).ok_or_else(|| {
            Error::OverBudget(format!(
                "the weights and other live tensors already use {base} bytes, more than the memory budget of {budget} bytes (`Tiling::max_memory`)"
            ))
        })?;
        let plan = ExactPlan {
            px,
            levels: level_tiles(px, levels, (h, w)),
            latent: (h, w),
            device_cap: avail / 2,
            attention_state_budget: avail / 4,
            total_steps: 0,
            staging_limit: crate::run::strategy::staging_limit(avail),
        };
        Ok((plan, px * patch))
    }

    /// Decodes the next `chunk` of latents `[T, C, h, w]` (T ≥ 1, TAEHV
    /// scale: as the video model produced them) into frames `[T', 3, H, W]`
    /// (TAEHV: raw, before the clamp to [0, 1]; Wan: raw z in, clamped to
    /// [−1, 1] out). The video's first chunk gives `t_upscale · T −
    /// frames_to_trim` frames (Wan: `1 + 4 (T − 1)`), later ones
    /// `t_upscale · T`. Frames of an earlier [`VideoDecoder::push`] not yet
    /// taken come first.
    pub fn decode(&mut self, chunk: &HostTensor) -> Result<HostTensor> {
        let earlier = self.push(chunk)?;
        let this = self.finish()?;
        let out = match (earlier, this) {
            (Some(a), Some(b)) => {
                let mut a = a.frames;
                if let (Some(x), Some(y)) = (a.shape.first_mut(), b.frames.shape.first()) {
                    *x += y;
                }
                a.data.extend(b.frames.data);
                a
            }
            (Some(a), None) | (None, Some(a)) => a.frames,
            (None, None) => return Err(Error::Internal("a decoded chunk went missing".into())),
        };
        Ok(out)
    }

    /// Submits the next `chunk` (as [`VideoDecoder::decode`]) and returns
    /// the frames of the chunk submitted before it (`None` for the first),
    /// waiting for them only after this chunk is on the device's queue.
    pub fn push(&mut self, chunk: &HostTensor) -> Result<Option<VideoFrames>> {
        self.check_usable()?;
        // Bad input is refused before any state changes; the decoder stays usable.
        self.check_chunk(chunk)?;
        let next = self.submit(chunk).map_err(|e| self.poison(e))?;
        let done = match self.pending.replace(next) {
            Some(p) => Some(self.take(p).map_err(|e| self.poison(e))?),
            None => None,
        };
        Ok(done)
    }

    /// The frames of the last pushed chunk (`None` when all were taken).
    pub fn finish(&mut self) -> Result<Option<VideoFrames>> {
        self.check_usable()?;
        match self.pending.take() {
            Some(p) => self.take(p).map(Some).map_err(|e| self.poison(e)),
            None => Ok(None),
        }
    }

    fn check_usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::InvalidInput(format!(
                "this VideoDecoder failed on an earlier chunk ({why}); its causal caches no longer hold the previous frames: start the video again with a new VideoDecoder"
            ))),
            None => Ok(()),
        }
    }

    fn poison(&mut self, e: Error) -> Error {
        self.broken = Some(e.to_string());
        e
    }

    /// The checks of a chunk against the model and the video's earlier chunks.
    fn check_chunk(&self, chunk: &HostTensor) -> Result<()> {
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => {
                return Err(Error::InvalidInput(format!(
                    "a video latent chunk is T×C×h×w (one video), got shape {:?}",
                    chunk.shape
                )))
            }
        };
        check_frame(self.decoder.get(), [t, c, h, w])?;
        if let Some(f) = self.frame.filter(|f| *f != [c, h, w]) {
            return Err(Error::InvalidInput(format!(
                "latent chunk frames are {c}×{h}×{w}, the video's first chunk had {}×{}×{}: every chunk of one video has the same latent size",
                f[0], f[1], f[2]
            )));
        }
        if let Some((i, v)) = chunk.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "latents hold {v} at flat index {i}: video latents must be finite"
            )));
        }
        Ok(())
    }

    /// Records and submits `chunk` (checked by [`Self::check_chunk`]) with
    /// the copy of its output into a staging buffer.
    fn submit(&mut self, chunk: &HostTensor) -> Result<Pending> {
        let [_, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video chunk".into())),
        };
        if self.submitted == 0 && self.wants_tiles(chunk)? {
            let (plan, px) = self.exact_plan((h, w))?;
            self.tiled = Some(TiledVideo {
                exec: Executor::new(&self.ctx, plan, None),
                caches: VideoCaches::default(),
                px,
            });
        }
        self.frame = Some([c, h, w]);
        self.latent_frames += chunk.shape.first().copied().unwrap_or(0);
        let slot = self.submitted % 2;
        if let Some(t) = &mut self.tiled {
            let submitted = std::time::Instant::now();
            let (values, shape) =
                t.exec
                    .decode_video_chunk(self.decoder.get().graph(), chunk, &mut t.caches)?;
            self.submitted += 1;
            return Ok(Pending {
                slot,
                submitted,
                submission: None,
                mapped: None,
                shape,
                dtype: crate::tensor::DType::F32,
                bytes: 0,
                ready: Some(values),
            });
        }
        let null = self.ctx.is_null();
        let mut encoder =
            self.ctx
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("wgvae video chunk"),
                });
        let mut rec = Recorder::with_encoder(&self.ctx, &mut encoder);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let raw = run_video(
            self.decoder.get().graph(),
            &mut rec,
            input,
            &mut Taps::default(),
            &mut self.state,
        )?;
        let shape = match raw.shape() {
            &[a, b, c, d] => [a, b, c, d],
            s => return Err(Error::Internal(format!("video decoder output {s:?}"))),
        };
        // Copies move whole 4-byte words (f16 frames have even sizes anyway).
        let bytes = raw.byte_size().div_ceil(4) * 4;
        self.largest_chunk_bytes = self.largest_chunk_bytes.max(bytes);
        if !null {
            let staging = self.staging_buffer(slot, bytes)?;
            let (src, offset) = (raw.buffer()?.clone(), raw.block().offset);
            rec.timed_transfer("copy::video_to_staging", |e| {
                e.copy_buffer_to_buffer(&src, offset, &staging, 0, bytes)
            });
        }
        rec.finish();
        let dtype = raw.dtype();
        let submitted = std::time::Instant::now();
        let (submission, mapped) = if null {
            (None, None)
        } else {
            let submission = self.ctx.scoped("submitting a video chunk", || {
                Ok(self.ctx.queue().submit([encoder.finish()]))
            })?;
            // Queue order keeps later chunks' writes to this memory after the copy.
            drop(raw);
            let (tx, rx) = mpsc::channel();
            if let Some((buffer, _)) = self.staging.get(slot).and_then(Option::as_ref) {
                buffer
                    .slice(..bytes)
                    .map_async(wgpu::MapMode::Read, move |r| {
                        let _ = tx.send(r);
                    });
            }
            (Some(submission), Some(rx))
        };
        self.submitted += 1;
        Ok(Pending {
            slot,
            submitted,
            submission,
            mapped,
            shape,
            dtype,
            bytes,
            ready: None,
        })
    }

    /// Staging slot `slot`, grown to at least `bytes`.
    fn staging_buffer(&mut self, slot: usize, bytes: u64) -> Result<wgpu::Buffer> {
        let entry = self
            .staging
            .get_mut(slot)
            .ok_or_else(|| Error::Internal("staging slot".into()))?;
        match entry {
            Some((buffer, size)) if *size >= bytes => Ok(buffer.clone()),
            _ => {
                let buffer = self.ctx.readback_buffer("wgvae video readback", bytes)?;
                *entry = Some((buffer.clone(), bytes));
                Ok(buffer)
            }
        }
    }

    /// Waits for `p`'s submission (not later ones) and converts its frames.
    fn take(&mut self, p: Pending) -> Result<VideoFrames> {
        let [frames, channels, oh, ow] = p.shape;
        let values = match (p.ready, p.submission, p.mapped) {
            (Some(v), _, _) => v,
            (None, Some(submission), Some(mapped)) => {
                self.ctx
                    .device()
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(submission),
                        timeout: None,
                    })
                    .map_err(|e| Error::DeviceLost(e.to_string()))?;
                let result = match mapped.try_recv() {
                    Ok(r) => r,
                    Err(_) => {
                        self.ctx.wait_idle()?;
                        mapped.recv().map_err(|e| Error::Readback(e.to_string()))?
                    }
                };
                result.map_err(|e| Error::Readback(e.to_string()))?;
                let Some((buffer, _)) = self.staging.get(p.slot).and_then(Option::as_ref) else {
                    return Err(Error::Internal("video staging buffer missing".into()));
                };
                // Unmapped on every path, so the slot stays usable for a copy.
                let read = buffer
                    .slice(..p.bytes)
                    .get_mapped_range()
                    .map_err(|e| Error::Readback(e.to_string()))
                    .and_then(|view| crate::tensor::f32_from_bytes_of(p.dtype, &view));
                buffer.unmap();
                let mut v = read?;
                v.truncate(frames * channels * oh * ow);
                v
            }
            // A dry run computes nothing: zeros of the right size.
            _ => vec![0.0; frames * channels * oh * ow],
        };
        let latency_ms = p.submitted.elapsed().as_secs_f64() * 1e3;
        let skip = self.to_trim.min(frames);
        self.to_trim -= skip;
        let per_frame = channels * oh * ow;
        let kept = values.get(skip * per_frame..).unwrap_or_default();
        let patch = self.decoder.get().patch_size();
        let out_c = channels / (patch * patch);
        let mut data = pixel_shuffle(kept, frames - skip, out_c, patch, oh, ow);
        if let VideoModel::Wan(_) = self.decoder.get() {
            data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        }
        let first = self.delivered;
        self.delivered += frames - skip;
        Ok(VideoFrames {
            frames: HostTensor::new(vec![frames - skip, out_c, oh * patch, ow * patch], data)?,
            first,
            latency_ms,
        })
    }

    /// Frames the next chunk of `t` latent frames gives (what
    /// [`VideoDecoder::record_chunk_to_textures`] needs textures for): the
    /// first chunk's trimmed count, then `t_upscale · t`.
    pub fn frames_next(&self, t: usize) -> usize {
        let model = self.decoder.get();
        let done = self.latent_frames;
        Self::frames_for(model, done.saturating_add(t)) - Self::frames_for(model, done)
    }

    /// Records the next `chunk` of latents `[T, C, h, w]` (as
    /// [`VideoDecoder::decode`]) into the host's `encoder`, writing its
    /// frames into the host's textures: frame `i` of the chunk into
    /// `targets[i]` (texels `(0..W, 0..H)` of mip level 0, array layer 0;
    /// `W × H` = latent size × [`VideoModel::upscale`]). Needs at least
    /// [`VideoDecoder::frames_next`]`(T)` targets (later ones are left
    /// alone); returns a [`PendingFrames`] saying how many were written.
    /// One texture per frame, so that a host can keep a ring of them and
    /// show or encode each when it likes; use views or copies for array
    /// layers. Targets as [`crate::Engine::record_decode_to_texture`]'s
    /// (`Rgba8Unorm`/`Rgba16Float` with `STORAGE_BINDING`, or
    /// `Rgba8Unorm`/`Rgba8UnormSrgb`/`Rgba16Float` with `COPY_DST`), with
    /// the same values: `Rgba8*` texels hold the bytes of the CLI's frame
    /// PNGs (TAEHV clamped to [0, 1], Wan's [−1, 1] mapped to [0, 1]).
    ///
    /// Nothing is submitted or read back, and the causal caches advance as
    /// for [`VideoDecoder::push`]: **submit `encoder` before anything
    /// recorded later with this decoder's [`Context`]** (the next chunk may
    /// go into the same encoder), and keep the [`PendingFrames`] until
    /// then. Untiled decodes of patch-size-1 models only: tiled decoders,
    /// patch-size-2 TAEHV models (their pixel shuffle runs on the host) and
    /// a pushed chunk whose frames were not taken yet are refused. Every
    /// check runs before the first command is recorded; an error after
    /// that (out of memory) leaves a partial chunk in `encoder` (discard
    /// it) and the decoder unusable, as for `push`.
    pub fn record_chunk_to_textures(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        chunk: &HostTensor,
        targets: &[&wgpu::Texture],
    ) -> Result<PendingFrames> {
        self.check_usable()?;
        self.check_chunk(chunk)?;
        let model = self.decoder.get();
        if self.tiling.mode != TileMode::Off || self.tiled.is_some() {
            return Err(Error::Unsupported(
                "recording a video chunk into the host's encoder runs untiled: this VideoDecoder has tiling set (use push)".into(),
            ));
        }
        if self.pending.is_some() {
            return Err(Error::InvalidInput(
                "a pushed chunk's frames were not taken yet: call finish before recording a chunk into the host's encoder".into(),
            ));
        }
        let patch = model.patch_size();
        if patch != 1 {
            return Err(Error::Unsupported(format!(
                "recording into host textures needs a patch-size-1 model; {} has patch size {patch} (its pixel shuffle runs on the host: use push)",
                model.name()
            )));
        }
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video chunk".into())),
        };
        let frames = self.frames_next(t);
        if targets.len() < frames {
            return Err(Error::InvalidInput(format!(
                "this chunk of {t} latent frames gives {frames} frames but {} target textures were given",
                targets.len()
            )));
        }
        let up = model.upscale();
        let size = |v: usize| {
            u32::try_from(v.saturating_mul(up))
                .map_err(|_| Error::InvalidInput(format!("latent frames {h}×{w} are too large")))
        };
        let (width, height) = (size(w)?, size(h)?);
        let routes = targets
            .iter()
            .take(frames)
            .enumerate()
            .map(|(i, target)| {
                crate::embed::texture_route(target, width, height).map_err(|e| match e {
                    Error::Unsupported(m) => Error::Unsupported(format!("target texture {i}: {m}")),
                    Error::InvalidInput(m) => {
                        Error::InvalidInput(format!("target texture {i}: {m}"))
                    }
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.frame = Some([c, h, w]);
        self.latent_frames += t;
        self.submitted += 1;
        self.record_frames(encoder, chunk, targets, &routes, (width, height))
            .map_err(|e| self.poison(e))
    }

    /// [`Self::record_chunk_to_textures`] once checked.
    fn record_frames(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        chunk: &HostTensor,
        targets: &[&wgpu::Texture],
        routes: &[Option<wgpu::TextureFormat>],
        (width, height): (u32, u32),
    ) -> Result<PendingFrames> {
        let mut rec = Recorder::with_encoder(&self.ctx, encoder);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let model = self.decoder.get();
        let raw = run_video(
            model.graph(),
            &mut rec,
            input,
            &mut Taps::default(),
            &mut self.state,
        )?;
        let [n, channels, oh, ow] = match raw.shape() {
            &[a, b, c, d] => [a, b, c, d],
            s => return Err(Error::Internal(format!("video decoder output {s:?}"))),
        };
        let skip = self.to_trim.min(n);
        self.to_trim -= skip;
        let written = n - skip;
        if written != routes.len() || (ow, oh) != (width as usize, height as usize) {
            return Err(Error::Internal(format!(
                "a chunk decoded to {n} frames of {ow}×{oh}, {written} kept; expected {} of {width}×{height}",
                routes.len()
            )));
        }
        // One frame at a time through a frame-sized tensor (the image
        // kernel writes one image per texture).
        let frame = Tensor::empty(
            &self.ctx,
            &[1, channels, oh, ow],
            raw.dtype(),
            "video frame",
        )?;
        let bytes = frame.byte_size();
        // Frames lie back to back in `raw`: copies need whole 4-byte words.
        let frame_bytes = (channels * oh * ow) as u64 * raw.dtype().size();
        if !frame_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) || frame_bytes != bytes {
            return Err(Error::Unsupported(format!(
                "{ow}×{oh} frames in {} take {frame_bytes} bytes, not whole 4-byte words",
                raw.dtype().name()
            )));
        }
        let mut intermediates: Vec<wgpu::Texture> = Vec::new();
        let range = model.range();
        for (i, (target, route)) in targets.iter().zip(routes).enumerate() {
            let src_offset = raw.block().offset + (skip + i) as u64 * frame_bytes;
            let (src, dst) = (raw.buffer()?.clone(), frame.buffer()?.clone());
            let dst_offset = frame.block().offset;
            rec.encoder()
                .copy_buffer_to_buffer(&src, src_offset, &dst, dst_offset, bytes);
            let through = match route {
                None => None,
                Some(format) => {
                    let found = intermediates.iter().position(|t| t.format() == *format);
                    let at = match found {
                        Some(at) => at,
                        None => {
                            intermediates.push(crate::kernels::image::storage_texture(
                                self.ctx.device(),
                                "wgvae intermediate video frame",
                                width,
                                height,
                                *format,
                            ));
                            intermediates.len() - 1
                        }
                    };
                    intermediates.get(at)
                }
            };
            crate::kernels::image::to_texture(&mut rec, &frame, range, through.unwrap_or(*target))?;
            if let Some(src) = through {
                rec.encoder().copy_texture_to_texture(
                    src.as_image_copy(),
                    target.as_image_copy(),
                    wgpu::Extent3d {
                        width,
                        height,
                        depth_or_array_layers: 1,
                    },
                );
            }
        }
        let dispatches = rec.finish().len();
        let first = self.delivered;
        self.delivered += written;
        Ok(PendingFrames {
            _tensors: vec![raw, frame],
            _intermediates: intermediates,
            frames: written,
            first,
            width,
            height,
            dispatches,
        })
    }

    /// Frames a video of `t` latent frames decodes to (TAEHV: `t_upscale · t
    /// − frames_to_trim`; Wan: `1 + 4 (t − 1)`).
    pub fn frames_for<'m>(decoder: impl Into<VideoModel<'m>>, t: usize) -> usize {
        match decoder.into() {
            VideoModel::Taehv(d) => d
                .t_upscale
                .saturating_mul(t)
                .saturating_sub(d.frames_to_trim()),
            VideoModel::Wan(d) => d.frames_out(t),
        }
    }

    /// Host-visible read-back bytes (outside the pool): two staging
    /// buffers, each as large as the largest chunk output so far (also
    /// counted on a null device, which creates none).
    pub fn staging_bytes(&self) -> u64 {
        2 * self.largest_chunk_bytes
    }

    /// Pool bytes the time caches hold between chunks.
    pub fn cache_bytes(&self) -> u64 {
        let tiled = self.tiled.as_ref().map_or(0, |t| t.caches.bytes());
        self.state.tensors().map(|t| t.byte_size()).sum::<u64>() + tiled
    }
}

/// Latent frames per streamed chunk when the caller gives none (the CLI's
/// `--chunk` default): one, the lowest latency and the smallest memory.
pub const DEFAULT_CHUNK: usize = 1;

/// A loaded video decoder, owned (see [`VideoModel`] for the borrowed view
/// [`VideoDecoder`] and [`decode_video`] take).
pub enum VideoVae {
    /// A TAEHV decoder.
    Taehv(TaehvDecoder),
    /// A Wan 2.1 VAE decoder.
    Wan(WanDecoder),
}

impl VideoVae {
    /// The dtype `precision` gives this model on `caps` (TAEHV is f16-safe;
    /// Wan takes bf16 under `auto` on a GPU).
    pub fn dtype_for(
        &self,
        precision: crate::models::Precision,
        caps: &crate::gpu::Capabilities,
    ) -> crate::tensor::DType {
        precision.resolve(matches!(self, VideoVae::Taehv(_)), caps)
    }

    /// The borrowed view the decoders run.
    pub fn model(&self) -> VideoModel<'_> {
        match self {
            VideoVae::Taehv(d) => d.into(),
            VideoVae::Wan(d) => d.into(),
        }
    }
}

pub use crate::models::wan::is_wan_video as is_wan;

/// True when `spec` names a video decoder (TAEHV file or Wan VAE), read from
/// headers and configs only.
pub fn is_video_vae(spec: &str) -> bool {
    let path = std::path::Path::new(spec);
    (path.is_file() && TaehvDecoder::is_taehv_file(path)) || is_wan(spec)
}

/// Loads the video decoder at `spec` (a TAEHV `.safetensors` file, a Wan
/// diffusers folder or file, or `preset:wan21` with weights from
/// `load.seed`) in the storage precision `load` asks for.
pub fn load_video_decoder(
    ctx: &Context,
    spec: &str,
    load: &crate::models::LoadOptions,
) -> Result<VideoVae> {
    if is_wan(spec) {
        let dtype = load.precision.resolve(false, ctx.caps());
        return Ok(VideoVae::Wan(WanDecoder::open(
            ctx, spec, dtype, load.seed,
        )?));
    }
    let store = crate::models::WeightStore::from_safetensors(std::path::Path::new(spec))?;
    store.set_dtype(load.precision.resolve(true, ctx.caps()));
    Ok(VideoVae::Taehv(TaehvDecoder::load(ctx, &store)?))
}

/// The shape checks of one video's latents `[T, C, h, w]`.
fn check_frame(decoder: VideoModel, [t, c, h, w]: [usize; 4]) -> Result<()> {
    let (name, channels, layout) = match decoder {
        VideoModel::Taehv(d) => (
            d.variant_name(),
            d.latent_channels,
            "TAEHV latents are N×T×C×h×w",
        ),
        VideoModel::Wan(d) => (
            "Wan 2.1 VAE",
            d.latent_channels(),
            "Wan latents are N×C×T×h×w",
        ),
    };
    if c != channels {
        return Err(Error::InvalidInput(format!(
            "latents have {c} channels; this {name} decoder takes {channels} ({layout})"
        )));
    }
    if t == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "video latents need at least one frame of at least 1×1: got T={t}, h={h}, w={w}"
        )));
    }
    Ok(())
}

/// `[T, C·p², H, W]` → `[T, C, H·p, W·p]` (PyTorch `pixel_shuffle`).
fn pixel_shuffle(x: &[f32], t: usize, c: usize, p: usize, h: usize, w: usize) -> Vec<f32> {
    if p == 1 {
        return x.to_vec();
    }
    let (oh, ow) = (h * p, w * p);
    let mut out = vec![0.0; t * c * oh * ow];
    for (o, v) in out.iter_mut().enumerate() {
        let (x_o, rest) = (o % ow, o / ow);
        let (y_o, rest) = (rest % oh, rest / oh);
        let (ch, f) = (rest % c, rest / c);
        let (i, j) = (y_o % p, x_o % p);
        let src_c = ch * p * p + i * p + j;
        let src = ((f * c * p * p + src_c) * h + y_o / p) * w + x_o / p;
        *v = x.get(src).copied().unwrap_or(0.0);
    }
    out
}

/// `[A, B, rest]` → `[B, A, rest]` of one video.
fn swap_axes(x: &[f32], a: usize, b: usize, rest: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for j in 0..b {
        for i in 0..a {
            let at = (i * b + j) * rest;
            out.extend_from_slice(x.get(at..at + rest).unwrap_or_default());
        }
    }
    out
}

/// Decodes video latents whole. TAEHV: `[N, T, C, h, w]` → frames
/// `[N, T', 3, H, W]` (raw, before the clamp to [0, 1]),
/// `T' = t_upscale · T − frames_to_trim`. Wan: raw z `[N, C, T, h, w]` →
/// `[N, 3, T', H, W]` clamped to [−1, 1], `T' = 1 + 4 (T − 1)` (as diffusers'
/// `AutoencoderKLWan.decode`). Each video is one [`VideoDecoder`] chunk.
pub fn decode_video<'a>(
    ctx: &Context,
    decoder: impl Into<VideoModel<'a>>,
    latents: &HostTensor,
) -> Result<HostTensor> {
    let decoder = decoder.into();
    let wan = decoder.channels_first();
    let [n, t, c, h, w] = match (&latents.shape[..], wan) {
        (&[n, t, c, h, w], false) => [n, t, c, h, w],
        (&[n, c, t, h, w], true) => [n, t, c, h, w],
        _ => {
            return Err(Error::InvalidInput(format!(
                "video latents are {}, got shape {:?}",
                if wan {
                    "N×C×T×h×w (Wan layout)"
                } else {
                    "N×T×C×h×w (TAEHV layout)"
                },
                latents.shape
            )))
        }
    };
    check_frame(decoder, [t, c, h, w])?;
    if n == 0 {
        return Err(Error::InvalidInput(
            "video latents hold no video (N = 0)".into(),
        ));
    }
    let per_video = t * c * h * w;
    let mut shape = Vec::new();
    let mut data = Vec::new();
    for video in latents.data.chunks(per_video).take(n) {
        let video = if wan {
            swap_axes(video, c, t, h * w)
        } else {
            video.to_vec()
        };
        let chunk = HostTensor::new(vec![t, c, h, w], video)?;
        let frames = VideoDecoder::new(ctx, decoder).decode(&chunk)?;
        match (wan, &frames.shape[..]) {
            (true, &[ft, fc, fh, fw]) => {
                data.extend(swap_axes(&frames.data, ft, fc, fh * fw));
                shape = vec![fc, ft, fh, fw];
            }
            _ => {
                shape = frames.shape;
                data.extend(frames.data);
            }
        }
    }
    shape.insert(0, n);
    HostTensor::new(shape, data)
}

// Hosts move a streaming decoder between threads (Python releases the GIL
// while it decodes): keep it `Send`, tiled state included.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<VideoDecoder<'static>>();
    send::<PendingFrames>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_reorder_to_ntchw() {
        // N=1, C=2, T=3, 1×1: value = 10·c + t.
        let ncthw: Vec<f32> = (0..2)
            .flat_map(|c| (0..3).map(move |t| (10 * c + t) as f32))
            .collect();
        let x = HostTensor::new(vec![1, 2, 3, 1, 1], ncthw).unwrap();
        assert_eq!(VideoLayout::Ncthw.dims([1, 2, 3, 1, 1]), [1, 3, 2, 1, 1]);
        let y = VideoLayout::Ncthw.to_ntchw(x.clone()).unwrap();
        assert_eq!(y.shape, vec![1, 3, 2, 1, 1]);
        assert_eq!(y.data, vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
        assert_eq!(VideoLayout::Ntchw.to_ntchw(x.clone()).unwrap().data, x.data);
        assert_eq!("NCTHW".parse::<VideoLayout>().unwrap(), VideoLayout::Ncthw);
        let e = "nchw".parse::<VideoLayout>().unwrap_err().to_string();
        assert!(e.contains("ntchw") && e.contains("ncthw"), "{e}");
        let flat = HostTensor::new(vec![6], vec![0.0; 6]).unwrap();
        assert!(VideoLayout::Ncthw.to_ntchw(flat).is_err());
    }

    #[test]
    fn pixel_shuffle_matches_pytorch_order() {
        // One frame, one output channel, p = 2, 1×2 input: channel k = i·2 + j.
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect(); // [1, 4, 1, 2]
        let y = pixel_shuffle(&x, 1, 1, 2, 1, 2);
        // out[y][x] = in[(y%2)*2 + x%2][0][x/2]
        assert_eq!(y, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
    }
}
