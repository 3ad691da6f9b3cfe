//! Video latents → frames with a causal video decoder (the TAEHV family):
//! whole clips ([`decode_video`]) or streamed chunk by chunk
//! ([`VideoDecoder`]), both running the model's graph with time as the
//! batch dimension and keeping only its per-layer time caches (one frame
//! each, from the pool) between chunks.
//!
//! Output is the graph's float output in the reference's layout (TAEHV:
//! frames `[T', 3, H, W]` before its clamp to [0, 1], pixel-shuffled by the
//! graph for patch-size-2 models; Wan: clamped by the graph), less the first
//! `frames_to_trim` frames of a video, which the read-back leaves out.
//!
//! A decoder borrows its model ([`VideoDecoder::new`]) or shares it
//! ([`VideoDecoder::shared`], `'static`: for hosts that keep the decoder
//! beside the model, e.g. in a Python object). Embedded in a wgpu app,
//! [`VideoDecoder::record_chunk_to_textures`] records a chunk into the
//! app's own `wgpu::CommandEncoder` and writes each frame into one of its
//! textures (RGBA8 or RGBA16F, as [`crate::embed`]'s image path), with
//! nothing submitted or read back; the returned [`PendingFrames`] is kept
//! until the app submits.

mod model;
mod readback;
mod textures;
mod tiles;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::models::Vae;
use crate::run::video::{ClipFeed, VideoRun};
use crate::tiling::Tiling;

use model::{check_frame, ModelRef};
use readback::Pending;

pub use crate::latents::VideoLayout;
// What the CLI, the Python crate and tests use of the model handle's inside.
#[doc(hidden)]
pub use crate::models::video_vae::{
    is_video_vae, is_wan, load_video_decoder, VideoModel, VideoVae,
};
pub use textures::PendingFrames;
#[doc(hidden)]
pub use tiles::VIDEO_DEFAULT_TILE;

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
    /// The runner's state between chunks (time caches, exact tiles).
    run: VideoRun,
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
    /// A clip-based decoder's latent frames not yet decoded (MiniMax-H3).
    clips: Option<ClipFeed>,
}

impl VideoDecoder<'static> {
    /// A decoder at the start of a video that shares ownership of `vae`'s
    /// network (no borrow: it can live beside the model or outlive it). An
    /// error unless `vae` is a video decoder.
    pub fn shared(ctx: &Context, vae: &Vae) -> Result<Self> {
        let model = vae.shared_video_decoder("a VideoDecoder")?;
        Ok(Self::with_model(ctx, ModelRef::Shared(model)))
    }
}

impl<'a> VideoDecoder<'a> {
    /// A decoder at the start of a video; an error unless `vae` is a video
    /// decoder.
    pub fn new(ctx: &Context, vae: &'a Vae) -> Result<Self> {
        Ok(Self::of(ctx, vae.video_decoder("a VideoDecoder")?))
    }

    /// A decoder of the runner's view of a video decoder.
    #[doc(hidden)]
    pub fn of(ctx: &Context, model: VideoModel<'a>) -> Self {
        Self::with_model(ctx, ModelRef::Borrowed(model))
    }

    /// The model it runs.
    #[doc(hidden)]
    pub fn model(&self) -> VideoModel<'_> {
        self.decoder.get()
    }

    fn with_model(ctx: &Context, decoder: ModelRef<'a>) -> Self {
        let to_trim = decoder.get().frames_to_trim();
        // A clip-based decoder (MiniMax-H3) tiles as its reference does by default.
        let tiling = if decoder.get().clip_based() {
            Tiling {
                mode: crate::tiling::TileMode::Auto,
                ..Tiling::default()
            }
        } else {
            Tiling::off()
        };
        VideoDecoder {
            ctx: ctx.clone(),
            decoder,
            run: VideoRun::default(),
            frame: None,
            to_trim,
            delivered: 0,
            latent_frames: 0,
            submitted: 0,
            staging: [None, None],
            largest_chunk_bytes: 0,
            pending: None,
            broken: None,
            tiling,
            clips: None,
        }
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
    ///
    /// A clip-based decoder (MiniMax-H3) keeps latent frames until they
    /// complete a clip that is not the video's last: a push submits the
    /// clips it completes (maybe none) and returns the frames of those
    /// submitted before the last of them.
    pub fn push(&mut self, chunk: &HostTensor) -> Result<Option<VideoFrames>> {
        self.check_usable()?;
        // Bad input is refused before any state changes; the decoder stays usable.
        self.check_chunk(chunk)?;
        // A host's stop (`Context::with_cancel`) between chunks: usable too.
        self.ctx.check_cancel()?;
        if let (Some(geo), &[t, c, h, w]) = (self.decoder.get().clip(), &chunk.shape[..]) {
            let frame = [c, h, w];
            let feed = self.clips.get_or_insert_with(|| ClipFeed::new(geo, frame));
            let clips = feed.push(chunk).map_err(|e| self.poison(e))?;
            self.latent_frames += t;
            self.frame = Some(frame);
            return self.submit_clips(clips);
        }
        let next = self.submit(chunk).map_err(|e| match self.run.tile_size() {
            Some(px) => limit_advice(self.decoder.get().name(), Some(px), e),
            None => e,
        });
        let next = next.map_err(|e| self.poison(e))?;
        let done = match self.pending.replace(next) {
            Some(p) => Some(self.take(p).map_err(|e| self.poison(e))?),
            None => None,
        };
        Ok(done)
    }

    /// The frames of the last pushed chunk (`None` when all were taken); a
    /// clip-based decoder first decodes the video's remaining clips (its end
    /// padded as diffusers pads it).
    pub fn finish(&mut self) -> Result<Option<VideoFrames>> {
        self.check_usable()?;
        let mut done = Vec::new();
        if let Some(mut feed) = self.clips.take() {
            let name = self.decoder.get().name().to_string();
            let clips = feed.finish(&name).map_err(|e| self.poison(e))?;
            done.extend(self.submit_clips(clips)?);
        }
        if let Some(p) = self.pending.take() {
            done.push(self.take(p).map_err(|e| self.poison(e))?);
        }
        Ok(merge(done))
    }

    /// Submits `clips` in order: the frames of those submitted before the
    /// last (and of the chunk pending before them).
    fn submit_clips(&mut self, clips: Vec<crate::run::video::Clip>) -> Result<Option<VideoFrames>> {
        let mut done = Vec::new();
        for (clip, cut) in clips {
            self.run.set_last_clip(cut);
            let name = self.decoder.get().name().to_string();
            let next = self.submit(&clip).map_err(|e| limit_advice(&name, None, e));
            let next = next.map_err(|e| self.poison(e))?;
            self.run.set_last_clip(None);
            if let Some(p) = self.pending.replace(next) {
                done.push(self.take(p).map_err(|e| self.poison(e))?);
            }
        }
        Ok(merge(done))
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
        let model = self.decoder.get();
        check_frame(model, [t, c, h, w])?;
        if model.whole_clip() && self.latent_frames > 0 {
            return Err(Error::InvalidInput(format!(
                "the {} decoder is not causal (a frame depends on later ones): it decodes a video's whole clip in one chunk, and this decoder already decoded {} latent frames; give all latent frames at once (CLI: drop --chunk)",
                model.name(),
                self.latent_frames
            )));
        }
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

    /// Frames the next chunk of `t` latent frames gives (what
    /// [`VideoDecoder::record_chunk_to_textures`] needs textures for): the
    /// first chunk's trimmed count, then `t_upscale · t`.
    pub fn frames_next(&self, t: usize) -> usize {
        let model = self.decoder.get();
        let done = self.latent_frames;
        model.frames_for(done.saturating_add(t)) - model.frames_for(done)
    }

    /// Host-visible read-back bytes (outside the pool): two staging
    /// buffers, each as large as the largest chunk output so far (also
    /// counted on a null device, which creates none).
    pub fn staging_bytes(&self) -> u64 {
        2 * self.largest_chunk_bytes
    }

    /// Pool bytes the time caches hold between chunks.
    pub fn cache_bytes(&self) -> u64 {
        self.run.cache_bytes()
    }
}

/// A device limit a chunk met, with advice that applies where the limit's
/// usual advice (exact tiles) does not: a clip-based decoder's (its
/// attention spans whole clips, so it takes no exact tiles), or a run
/// already in exact tiles of `tiled` pixels.
fn limit_advice(name: &str, tiled: Option<usize>, e: Error) -> Error {
    let (what, bytes, limit, kind) = match &e {
        Error::BufferTooLarge { what, bytes, limit } => (what, bytes, limit, "max_buffer_size"),
        Error::BindingTooLarge { what, bytes, limit } => {
            (what, bytes, limit, "max_storage_buffer_binding_size")
        }
        _ => return e,
    };
    let why = match tiled {
        Some(px) => format!(
            "in exact {px}-pixel tiles, so it is a tensor the tiles do not split (a layer over whole latent frames, such as a whole-frame attention's) or one tile's; decode smaller frames, or use smaller tiles (`Tiling::tile_size`)"
        ),
        None => format!(
            "the {name} decodes a clip's frames whole (its reference tiles bound only its transformer's tokens, and exact tiles do not apply: its attention spans whole clips); decode smaller frames or on a device with larger buffers"
        ),
    };
    Error::Unsupported(format!(
        "{what} needs {bytes} bytes but the device's {kind} is {limit} bytes: {why}"
    ))
}

/// Frames of consecutive submissions as one: the first's index, the
/// slowest latency.
fn merge(parts: Vec<VideoFrames>) -> Option<VideoFrames> {
    let mut parts = parts.into_iter();
    let mut out = parts.next()?;
    for p in parts {
        if let (Some(a), Some(b)) = (out.frames.shape.first_mut(), p.frames.shape.first()) {
            *a += b;
        }
        out.frames.data.extend(p.frames.data);
        out.latency_ms = out.latency_ms.max(p.latency_ms);
    }
    Some(out)
}

/// Latent frames per streamed chunk when the caller gives none (the CLI's
/// `--chunk` default): one, the lowest latency and the smallest memory.
#[doc(hidden)]
pub const DEFAULT_CHUNK: usize = 1;

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
pub fn decode_video(ctx: &Context, vae: &Vae, latents: &HostTensor) -> Result<HostTensor> {
    decode_video_tiled(ctx, vae, latents, None)
}

/// [`decode_video`] with each video's frames tiled as `tiling` says
/// ([`VideoDecoder::set_tiling`]; `None`: the model's default, untiled but
/// for MiniMax-H3, which tiles as its reference does).
pub fn decode_video_tiled(
    ctx: &Context,
    vae: &Vae,
    latents: &HostTensor,
    tiling: Option<&Tiling>,
) -> Result<HostTensor> {
    let decoder = vae.video_decoder("decoding video")?;
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
        let mut stream = VideoDecoder::of(ctx, decoder);
        if let Some(t) = tiling {
            stream.set_tiling(t.clone())?;
        }
        let frames = stream.decode(&chunk)?;
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
}
