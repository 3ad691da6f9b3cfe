//! The runner's part of a video decode or encode: a causal video graph run
//! chunk by chunk with time as the batch dimension, untiled (its time caches
//! kept between chunks) or in exact tiles (the caches parked tile by tile),
//! and the budget test and plan that choose between them. The front ends
//! (`video/`, `video_encode.rs`) stream chunks through it and import no
//! executor.

use crate::error::{Error, Result};
use crate::exec::exact::{level_tiles, video_levels, ExactPlan, Executor, VideoCaches};
use crate::exec::untiled::{run_video, VideoState};
use crate::exec::ByRows;
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::models::graph::Graph;
use crate::models::video_info::ClipGeometry;
use crate::models::Taps;
use crate::tensor::Tensor;
use crate::tiling::TilingReport;

/// The state one video keeps between chunks: the untiled time caches, or,
/// from the first chunk on when tiles were chosen, the exact tiled run.
#[derive(Default)]
pub(crate) struct VideoRun {
    untiled: VideoState,
    tiled: Option<TiledVideo>,
    /// A sample of a few rows of tiles standing for a video planned by rows.
    rows_sample: bool,
}

/// An exact tiled video run: its executor (kept for the whole video: the
/// caches' parked tiles count against its device cap) and the time caches
/// as whole-frame tiled activations.
struct TiledVideo {
    exec: Executor,
    caches: VideoCaches,
    /// Tile side in output pixels.
    px: usize,
}

impl VideoRun {
    /// Records `graph` on the chunk `input` untiled into `rec`, advancing
    /// the time caches: the graph's output.
    pub(crate) fn record(
        &mut self,
        graph: &Graph,
        rec: &mut Recorder,
        input: Tensor,
    ) -> Result<Tensor> {
        run_video(graph, rec, input, &mut Taps::default(), &mut self.untiled)
    }

    /// Runs the rest of the video in exact tiles (set before its first
    /// chunk): latent frames `h × w`, tiles of about `px_out` output pixels,
    /// within `budget` bytes of pool memory and `max_host` of host parking
    /// ([`ExactPlan::max_host`]). A video of more than
    /// [`MAX_VIDEO_TILES`] tiles parks every tile in host memory
    /// ([`video_rows_tile`]), as does one that stands for such a video
    /// ([`VideoRun::sample_rows`]).
    pub(crate) fn start_tiles(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        px_out: usize,
        (budget, max_host): (u64, Option<u64>),
        (h, w): (usize, usize),
    ) -> Result<()> {
        let levels = video_levels(graph);
        let px = video_tile_px(graph, px_out);
        let base = ctx.pool().stats().allocated_bytes.current;
        let avail = budget.checked_sub(base).ok_or_else(|| {
            Error::OverBudget(format!(
                "the weights and other live tensors already use {base} bytes, more than the memory budget of {budget} bytes (`Tiling::max_memory`)"
            ))
        })?;
        let by_rows = self.rows_sample || video_rows_tile(graph, px_out, (h, w)).is_some();
        let plan = ExactPlan {
            px,
            levels: level_tiles(px, levels, (h, w)),
            latent: (h, w),
            device_cap: if by_rows { 0 } else { avail / 2 },
            attention_state_budget: avail / 4,
            total_steps: 0,
            staging_limit: crate::run::strategy::staging_limit(avail),
            // Marks the run as one whose tiles' allocations depend only on
            // their kind (see `exec::exact::attention`).
            by_rows: by_rows.then_some(ByRows {
                latent_rows: h,
                counts: Default::default(),
            }),
            max_host,
        };
        self.tiled = Some(TiledVideo {
            exec: Executor::new(ctx, plan, None),
            caches: VideoCaches::default(),
            px,
        });
        Ok(())
    }

    /// Makes this run (an estimate's, on a null device) a sample of a few
    /// rows of a video planned by rows: its tiles are planned as that
    /// video's ([`video_rows_tile`]).
    pub(crate) fn sample_rows(&mut self) {
        self.rows_sample = true;
    }

    /// Records a clip-based decoder's `clip` `[T, C, h, w]` as its
    /// reference tiles it (MiniMax-H3's default, diffusers'
    /// `_decode_clip`): spatial tiles of `tile` output pixels overlapping
    /// by at least `min_overlap` (laid out by
    /// [`crate::models::minimax_h3::split_tiles`]), each through the graph
    /// but its clip op, stitched blending each tile with the decoded tiles
    /// above and to its left, then the clip op on the whole frames. Tiles
    /// are decoded independently, so the result is the reference's, not the
    /// untiled decode.
    pub(crate) fn record_reference_tiles(
        &mut self,
        graph: &Graph,
        rec: &mut Recorder,
        clip: &HostTensor,
        (tile, min_overlap, up): (usize, usize, usize),
    ) -> Result<Tensor> {
        use crate::kernels::tokens::{stitch, Stitch};
        let [_, _, h, w] = match clip.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video clip".into())),
        };
        let end = graph.ops().len().saturating_sub(1);
        let split = |len| crate::models::minimax_h3::split_tiles(len * up, tile, min_overlap, up);
        let (ys, th, yo) = split(h);
        let (xs, tw, xo) = split(w);
        let mut out: Option<Tensor> = None;
        // The row above, each tile dropped once the tile below it is stitched.
        let mut above: Vec<Option<Tensor>> = Vec::new();
        for (i, &y0) in ys.iter().enumerate() {
            let mut row: Vec<Option<Tensor>> = Vec::with_capacity(xs.len());
            for (j, &x0) in xs.iter().enumerate() {
                let part = clip.crop(y0 / up, (y0 + th) / up, x0 / up, (x0 + tw) / up);
                let input =
                    Tensor::from_f32_in(rec, &part.shape, &part.data, "video latents tile")?;
                let y = crate::exec::untiled::run_until(graph, rec, input, end)?;
                let [f, c, oh, ow] = crate::models::layers::dims4(&y)?;
                let o = match out.take() {
                    Some(o) => o,
                    None => {
                        Tensor::empty(rec.ctx(), &[f, c, h * up, w * up], y.dtype(), "clip frames")?
                    }
                };
                let s = Stitch {
                    at: (y0, x0),
                    crop: (
                        oh - yo.get(i).copied().unwrap_or(0),
                        ow - xo.get(j).copied().unwrap_or(0),
                    ),
                    above: above
                        .get(j)
                        .and_then(Option::as_ref)
                        .zip(i.checked_sub(1).and_then(|k| yo.get(k)).copied()),
                    left: row
                        .last()
                        .and_then(Option::as_ref)
                        .zip(j.checked_sub(1).and_then(|k| xo.get(k)).copied()),
                };
                stitch(rec, &y, &s, &o)?;
                if let Some(a) = above.get_mut(j) {
                    *a = None;
                }
                out = Some(o);
                row.push(Some(y));
            }
            above = row;
        }
        drop(above);
        let frames = out.ok_or_else(|| Error::Internal("a clip with no tiles".into()))?;
        crate::exec::token_ops::clip_step(graph, rec, &frames, &mut self.untiled.clips)
    }

    /// Marks the next chunk a clip-based decoder's last clip (MiniMax-H3):
    /// its tail is appended, less `cut` frames made from padding.
    pub(crate) fn set_last_clip(&mut self, cut: Option<usize>) {
        self.untiled.clips.last = cut;
    }

    /// The exact tile side in output pixels once tiles were started.
    pub(crate) fn tile_size(&self) -> Option<usize> {
        self.tiled.as_ref().map(|t| t.px)
    }

    /// Runs `chunk` `[T, C, h, w]` in exact tiles when they were started
    /// (`None`: untiled): the output as f32 on the host and its shape.
    pub(crate) fn run_tiled(
        &mut self,
        graph: &Graph,
        chunk: &HostTensor,
    ) -> Option<Result<(Vec<f32>, [usize; 4])>> {
        let t = self.tiled.as_mut()?;
        Some(t.exec.decode_video_chunk(graph, chunk, &mut t.caches))
    }

    /// Pool bytes the time caches hold between chunks (tiles parked in
    /// host memory are not pool memory: see [`VideoRun::tiling_report`]).
    pub(crate) fn cache_bytes(&self) -> u64 {
        let tiled = self.tiled.as_ref().map_or(0, |t| t.caches.bytes().0);
        self.untiled.tensors().map(|t| t.byte_size()).sum::<u64>() + tiled
    }

    /// The exact tiled run's report so far (`None`: untiled), `tiles` and
    /// `max_memory` left for the caller.
    pub(crate) fn tiling_report(&self) -> Option<TilingReport> {
        self.tiled.as_ref().map(|t| TilingReport {
            tile_size: Some(t.px),
            ..t.exec.report()
        })
    }
}

/// Most tiles of a video an estimate runs every one of: an estimate runs
/// a few chunks of several frames through each tile, so beyond this it
/// runs a few rows of them ([`crate::run::rows::sample_rows`]). Real runs
/// of such frames park every tile in host memory too (what the samples
/// stand for): beside the host parking of frames this large (wan21 at
/// 8192²: 0.9 TB) the device's share would save a few percent.
pub(crate) const MAX_VIDEO_TILES: usize = 1024;

/// Most tiles in a row of a video planned by rows: a sample streams the
/// estimated chunks through a few rows, which stay within seconds.
pub(crate) const VIDEO_ROW_TILES: usize = 256;

/// Exact tile side in output pixels for tiles of about `px_out`: a multiple
/// of the graph's scale, every level's tile half the next one's.
pub(crate) fn video_tile_px(graph: &Graph, px_out: usize) -> usize {
    let scale = 1usize << (video_levels(graph) - 1);
    px_out.div_ceil(scale).max(1) * scale
}

/// The latent tile side of exact tiles of about `px_out` output pixels over
/// latent frames `(h, w)` when the video is planned by rows: more than
/// [`MAX_VIDEO_TILES`] tiles (or `WGVAE_MAX_PLAN_TILES`), a tiled latent
/// level, rows of at most [`VIDEO_ROW_TILES`] tiles. Every tile of such a
/// video parks in host memory, so its estimate runs a few rows of tiles.
pub(crate) fn video_rows_tile(
    graph: &Graph,
    px_out: usize,
    (h, w): (usize, usize),
) -> Option<usize> {
    let px = video_tile_px(graph, px_out);
    let t = level_tiles(px, video_levels(graph), (h, w))
        .first()
        .copied()
        .flatten()?;
    let (rows, cols) = (h.div_ceil(t), w.div_ceil(t));
    let limit = crate::run::strategy::plan_tile_limit(MAX_VIDEO_TILES);
    (rows.saturating_mul(cols) > limit && cols <= VIDEO_ROW_TILES).then_some(t)
}

/// Whether `graph` on the untiled chunk `[T, C, h, w]` fits `budget` above
/// `base` bytes and the device's limits (a null-device dry run).
pub(crate) fn untiled_chunk_fits(
    ctx: &Context,
    budget: u64,
    base: u64,
    graph: &Graph,
    chunk: &HostTensor,
) -> Result<bool> {
    crate::run::strategy::fits_budget(ctx, budget, base, |null| {
        let mut rec = Recorder::new(null);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let raw = VideoRun::default().record(graph, &mut rec, input)?;
        drop(raw);
        rec.finish();
        Ok(())
    })
}

/// The latent frames a clip-based decoder (MiniMax-H3) has been given and
/// not yet decoded: clips go out once complete and known not to be the
/// video's last (a frame past them arrived); [`ClipFeed::finish`] pads the
/// video's end as diffusers does and gives the rest, the last marked.
pub(crate) struct ClipFeed {
    geo: ClipGeometry,
    /// Latent frame `[C, h, w]`.
    frame: [usize; 3],
    /// Latent frames from the next clip's first on.
    buf: Vec<f32>,
    /// Latent frames given so far.
    pushed: usize,
    /// Clips given out so far.
    clips: usize,
}

/// A clip's latent frames `[k + overlap, C, h, w]`, and for the video's
/// last clip the frames to cut off its end.
pub(crate) type Clip = (HostTensor, Option<usize>);

impl ClipFeed {
    pub(crate) fn new(geo: ClipGeometry, frame: [usize; 3]) -> Self {
        ClipFeed {
            geo,
            frame,
            buf: Vec::new(),
            pushed: 0,
            clips: 0,
        }
    }

    fn per_frame(&self) -> usize {
        self.frame.iter().product::<usize>().max(1)
    }

    fn clip_frames(&self) -> usize {
        self.geo.k + self.geo.overlap
    }

    /// Takes `chunk` `[T, C, h, w]` (checked): the clips it completes.
    pub(crate) fn push(&mut self, chunk: &HostTensor) -> Result<Vec<Clip>> {
        self.buf.extend_from_slice(&chunk.data);
        self.pushed += chunk.shape.first().copied().unwrap_or(0);
        let mut out = Vec::new();
        // A clip is not the last once a frame past it has come.
        while self.buf.len() / self.per_frame() > self.clip_frames() {
            out.push((self.next_clip()?, None));
        }
        Ok(out)
    }

    fn next_clip(&mut self) -> Result<HostTensor> {
        let n = self.clip_frames();
        let per = self.per_frame();
        let data = self.buf.get(..n * per).unwrap_or_default().to_vec();
        self.buf.drain(..(self.geo.k * per).min(self.buf.len()));
        self.clips += 1;
        let [c, h, w] = self.frame;
        HostTensor::new(vec![n, c, h, w], data)
    }

    /// The video ended: its remaining clips, the end padded with copies of
    /// its last latent frame; an error when it is too short for one clip.
    pub(crate) fn finish(&mut self, name: &str) -> Result<Vec<Clip>> {
        let t = self.pushed;
        if t == 0 {
            return Ok(Vec::new());
        }
        let total = self.geo.clips(t);
        if total == 0 {
            return Err(Error::InvalidInput(format!(
                "{t} latent frames: the {name} decodes clips of {} latent frames and needs at least {} (diffusers decodes no clip below that and fails)",
                self.clip_frames(),
                self.geo.min_frames()
            )));
        }
        let per = self.per_frame();
        let last = self
            .buf
            .len()
            .checked_sub(per)
            .map(|at| self.buf[at..].to_vec());
        let Some(last) = last else {
            return Err(Error::Internal(
                "a clip-based video ended with no frame".into(),
            ));
        };
        let mut out = Vec::new();
        while self.clips < total {
            while self.buf.len() / per < self.clip_frames() {
                self.buf.extend_from_slice(&last);
            }
            let cut = (self.clips + 1 == total).then(|| self.geo.cut(t));
            out.push((self.next_clip()?, cut));
        }
        self.buf.clear();
        Ok(out)
    }
}
