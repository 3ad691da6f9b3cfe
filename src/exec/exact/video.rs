//! Causal video graphs tile by tile (time is the batch dimension, as in
//! [`crate::exec::untiled::run_video`]).
//!
//! Exact by construction: every op runs over the tiles of its *output*
//! frames, and the time caches are whole-frame activations parked tile by
//! tile ([`VideoCaches`], kept between the chunks of one video), so a tile
//! reads the same neighbours in space (its halo window, from the chunk or
//! from the cache) and in time (earlier frames of the chunk, the cache's
//! frames before it) as the untiled decode does. A cache is replaced only
//! after the layer's last tile, so no tile reads a neighbour's updated
//! frames. RMS norms are per position; TGrow is a view of each tile;
//! per-frame attention is the image mid-block's streamed attention with
//! the frames as its batch.

use super::grid::conv_span;
use super::parking::{Act, DevicePiece, Piece};
use super::{stage, ConvSpec, Executor, Residual};
use crate::error::{Error, Result};
use crate::io::HostTensor;
use crate::kernels::conv2d::{conv2d, conv2d_frames, Conv2dOptions, Conv2dWeights, Frames};
use crate::kernels::tensor_ops::{copy_window, Window};
use crate::models::graph::{CausalWeights, Geometry, Graph, Op};
use crate::tensor::{DType, Tensor};

/// The cache slots of a video graph in a tiled run: per slot the frames
/// `[k, C, H, W]` before the next chunk, parked like any activation.
#[derive(Default)]
pub(crate) struct VideoCaches {
    slots: Vec<Option<Act>>,
    /// Slots of ops that have seen a video's first frame (no cache kept).
    marks: std::collections::BTreeSet<usize>,
    /// Per block-causal attention slot: the earlier frames' keys and
    /// values `[1, C, h, w]` (whole: the attention sits at the latent size).
    kv: std::collections::BTreeMap<usize, Vec<(Tensor, Tensor)>>,
}

impl VideoCaches {
    fn take(&mut self, slot: usize) -> Option<Act> {
        self.slots.get_mut(slot).and_then(Option::take)
    }
    fn put(&mut self, slot: usize, a: Act) {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        self.slots[slot] = Some(a);
    }
    pub(super) fn marked(&self, slot: usize) -> bool {
        self.marks.contains(&slot)
    }
    pub(super) fn mark(&mut self, slot: usize) {
        self.marks.insert(slot);
    }
    pub(super) fn has(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(Option::is_some)
    }
    /// Bytes the caches hold on the device (pool memory) and in host memory.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        let kv: u64 = self
            .kv
            .values()
            .flatten()
            .map(|(k, v)| k.byte_size() + v.byte_size())
            .sum();
        self.slots
            .iter()
            .flatten()
            .map(Act::parked_bytes)
            .fold((kv, 0), |(d, h), (pd, ph)| (d + pd, h + ph))
    }
}

/// Resolution levels of a video graph: the latent and one per 2× up-sample
/// (a pixel shuffle by 2ᵏ makes k: TAEHV's patch sizes are 1, 2 and 4).
pub(crate) fn video_levels(graph: &Graph) -> usize {
    1 + graph
        .ops()
        .iter()
        .map(|op| match op {
            Op::Conv(c) if c.geometry == Geometry::Upsample => 1,
            Op::TimeUpsample { .. } => 1,
            // HunyuanVideo 1.5's up-sampler: its conv's channels to space,
            // the shortcut added (a Wan 2.2 shortcut is beside an up-sample).
            Op::DupUp {
                residual: Some(_), ..
            } => 1,
            Op::PixelShuffle { factor, .. } => factor.max(&1).ilog2() as usize,
            _ => 0,
        })
        .sum::<usize>()
}

/// Tile side per level (latent first) for tiles of `px` pixels of the
/// graph's output over a latent of `(h, w)`; `None`: the level runs whole.
pub(crate) fn level_tiles(px: usize, levels: usize, (h, w): (usize, usize)) -> Vec<Option<usize>> {
    let top = levels.saturating_sub(1);
    (0..levels)
        .map(|l| {
            let t = (px >> (top - l)).max(1);
            (t < h << l || t < w << l).then_some(t)
        })
        .collect()
}

/// Moves `count` whole frames of `src` (from frame `from`) into `dst` (at
/// frame `to`): each frame is one row of a `[1, T, C·H·W]` view.
fn copy_frames(
    ex: &mut Executor,
    src: &Tensor,
    from: usize,
    dst: &Tensor,
    to: usize,
    count: usize,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let rows = |t: &Tensor| -> Result<Tensor> {
        let s = t.shape();
        let frame: usize = s.iter().skip(1).product();
        t.reshape(&[1, s.first().copied().unwrap_or(0), frame])
    };
    let (s, d) = (rows(src)?, rows(dst)?);
    let frame = s.shape()[2];
    copy_window(ex.rec(), &s, (from, 0), &d, (to, 0), (count, frame))
}

fn frames(in_frame: usize, out_frame: usize, count: usize) -> Frames {
    Frames {
        in_frame,
        out_frame,
        count,
    }
}

impl Executor {
    /// An activation of zeros (a cache at a video's start).
    fn zeros(&mut self, n: usize, c: usize, h: usize, w: usize, dtype: DType) -> Result<Act> {
        let mut a = self.empty_act(n, c, h, w, dtype);
        for i in 0..a.grid.len() {
            let r = a.grid.rect(i);
            let t = Tensor::empty(&self.ctx, &a.shape_of(&r), dtype, "time cache")?;
            self.rec().zero(&t, "clear::time_cache")?;
            self.park(&mut a, i, t)?;
        }
        Ok(a)
    }

    /// Cache slot `slot` (`k` frames like `x`'s); when empty, zeros, or `k`
    /// copies of frame `f` of `x` for `(x, Some(f))` (replicate padding).
    fn cache_of(
        &mut self,
        caches: &mut VideoCaches,
        slot: usize,
        k: usize,
        (x, replicate): (&Act, Option<usize>),
    ) -> Result<Act> {
        match caches.take(slot) {
            Some(a) if a.n == k && a.c == x.c && a.h == x.h && a.w == x.w && a.dtype == x.dtype => {
                Ok(a)
            }
            Some(a) => Err(Error::InvalidInput(format!(
                "a video chunk's frames are {}×{}×{} ({}) at a cached layer that held {}×{}×{} from the previous chunk; every chunk of one video must have the same latent size",
                x.c,
                x.h,
                x.w,
                x.dtype.name(),
                a.c,
                a.h,
                a.w
            ))),
            None => match replicate {
                None => self.zeros(k, x.c, x.h, x.w, x.dtype),
                Some(f) => {
                    let mut a = self.empty_act(k, x.c, x.h, x.w, x.dtype);
                    for i in 0..a.grid.len() {
                        let r = a.grid.rect(i);
                        let t = Tensor::empty(&self.ctx, &a.shape_of(&r), x.dtype, "time cache")?;
                        let xt = self.read_window(x, r)?;
                        for at in 0..k {
                            copy_frames(self, &xt, f, &t, at, 1)?;
                        }
                        drop(xt);
                        self.park(&mut a, i, t)?;
                        self.step_done(stage::TIME)?;
                    }
                    Ok(a)
                }
            },
        }
    }

    /// [`Op::TimeShift`]: `x` one frame later, frame 0 from the cache, which
    /// then keeps `x`'s last frame.
    pub(super) fn time_shift(
        &mut self,
        x: &Act,
        slot: usize,
        caches: &mut VideoCaches,
    ) -> Result<Act> {
        let mut cache = self.cache_of(caches, slot, 1, (x, None))?;
        let mut past = self.empty_act(x.n, x.c, x.h, x.w, x.dtype);
        let mut next = self.empty_act(1, x.c, x.h, x.w, x.dtype);
        for i in 0..x.grid.len() {
            let r = x.grid.rect(i);
            let xt = self.read_window(x, r)?;
            let k = self.take_piece(&mut cache, i)?;
            let p = Tensor::empty(&self.ctx, &x.shape_of(&r), x.dtype, "previous frames")?;
            copy_frames(self, &k, 0, &p, 0, 1)?;
            copy_frames(self, &xt, 0, &p, 1, x.n - 1)?;
            copy_frames(self, &xt, x.n - 1, &k, 0, 1)?;
            drop(xt);
            self.park(&mut past, i, p)?;
            self.park(&mut next, i, k)?;
            self.step_done(stage::TIME)?;
        }
        caches.put(slot, next);
        Ok(past)
    }

    /// [`Op::TimeGrow`]: `[T, s·C, H, W]` as `[T·s, C, H, W]`, a view of each tile.
    pub(super) fn time_grow(&mut self, mut x: Act, stride: usize) -> Result<Act> {
        if stride == 0 || !x.c.is_multiple_of(stride) {
            return Err(Error::Internal(format!(
                "time stride {stride} does not divide {} channels",
                x.c
            )));
        }
        let (n, c) = (x.n * stride, x.c / stride);
        for i in 0..x.pieces.len() {
            let r = x.grid.rect(i);
            // Host tiles keep their bytes (same order): only the shape changes.
            x.pieces[i] = match std::mem::replace(&mut x.pieces[i], Piece::Empty) {
                Piece::Device(d) => {
                    let t = d.into_tensor().reshape(&[n, c, r.h, r.w])?;
                    Piece::Device(DevicePiece::new(t, &self.counters))
                }
                other => other,
            };
        }
        x.n = n;
        x.c = c;
        Ok(x)
    }

    /// [`Op::RmsNorm`]: per position, so per tile.
    pub(super) fn rms_norm(
        &mut self,
        x: &Act,
        gamma: (&Tensor, crate::kernels::rms_norm::NormKind),
        silu: bool,
    ) -> Result<Act> {
        let mut out = self.empty_act(x.n, x.c, x.h, x.w, x.dtype);
        for i in 0..x.grid.len() {
            let r = x.grid.rect(i);
            let xt = self.read_window(x, r)?;
            let o = Tensor::empty(&self.ctx, &x.shape_of(&r), x.dtype, "rms norm")?;
            crate::kernels::rms_norm::norm(self.rec(), &xt, gamma, silu, &o)?;
            drop(xt);
            self.emit_tile(&mut out, None, i, o, stage::MAP)?;
        }
        Ok(out)
    }

    /// [`Op::CausalConv`] of frames `x0..x0 + count` of `x`, the frames
    /// before them from cache slot `slot`: per output tile, the window of
    /// the chunk and of the cache its spatial kernel reads, one
    /// implicit-GEMM pass per time tap (as the untiled executor, in the
    /// same order). The cache then holds the stream's last `kt − 1` frames.
    pub(super) fn causal_conv(
        &mut self,
        x: &Act,
        (x0, count): (usize, usize),
        w: &CausalWeights,
        mut residual: Residual,
        slot: usize,
        caches: &mut VideoCaches,
    ) -> Result<Act> {
        let Some((current, earlier)) = w.taps.split_last() else {
            return Err(Error::Internal("causal conv without taps".into()));
        };
        let hist = earlier.len();
        let k = current.k();
        let cache = if hist > 0 && !w.centered {
            let start = w.repeat_first.then_some(x0);
            Some(self.cache_of(caches, slot, hist, (x, start))?)
        } else {
            None
        };
        let mut out = self.empty_act(count, current.cout(), x.h, x.w, x.dtype);
        if let Residual::Take(res) = &residual {
            if res.grid != out.grid || res.c != out.c || res.n != out.n {
                return Err(Error::shape(
                    "tiled causal conv",
                    format!(
                        "residual [{}, {}, {}, {}] does not match the output's tiles",
                        res.n, res.c, res.h, res.w
                    ),
                ));
            }
        }
        for i in 0..out.grid.len() {
            let r = out.grid.rect(i);
            let (y0, y1, pt, pb) = conv_span(r.y, r.bottom(), x.h, k, 1, k / 2);
            let (c0, c1, pl, pr) = conv_span(r.x, r.right(), x.w, k, 1, k / 2);
            let win = Window::new(y0, c0, y1 - y0, c1 - c0);
            let opts = Conv2dOptions {
                stride: 1,
                pad: [pt, pl, pb, pr],
                upsample: false,
                // The window stops at the frame's edges, so clamping to it
                // repeats the edge as the whole frame's padding does.
                replicate: w.replicate,
                reflect: w.reflect,
            };
            let res = match &mut residual {
                Residual::None => None,
                Residual::Take(a) => Some(self.take_piece(a, i)?),
                Residual::Shortcut(s, sc) => {
                    let sw = self.read_window(s, r)?;
                    let t = Tensor::empty(
                        &self.ctx,
                        &[count, sc.cout(), r.h, r.w],
                        x.dtype,
                        "shortcut tile",
                    )?;
                    conv2d(self.rec(), &sw, sc, None, None, &t, &Conv2dOptions::same(1))?;
                    Some(t)
                }
            };
            let xw = self.read_window(x, win)?;
            if w.centered {
                let added = res.is_some();
                let y = match res {
                    Some(y) => y,
                    None => Tensor::empty(
                        &self.ctx,
                        &[count, current.cout(), r.h, r.w],
                        x.dtype,
                        "time conv tile",
                    )?,
                };
                let taps = &w.taps;
                crate::exec::video_ops::centered_conv(
                    self.rec(),
                    (&xw, x0),
                    taps,
                    (&y, added),
                    count,
                    &opts,
                )?;
                drop(xw);
                self.emit_tile(&mut out, None, i, y, stage::CONV)?;
                continue;
            }
            let y = match res {
                Some(y) => {
                    conv2d_frames(
                        self.rec(),
                        &xw,
                        current,
                        Some(&y),
                        &y,
                        &opts,
                        frames(x0, 0, count),
                    )?;
                    y
                }
                None => {
                    let y = Tensor::empty(
                        &self.ctx,
                        &[count, current.cout(), r.h, r.w],
                        x.dtype,
                        "causal conv tile",
                    )?;
                    conv2d_frames(
                        self.rec(),
                        &xw,
                        current,
                        None,
                        &y,
                        &opts,
                        frames(x0, 0, count),
                    )?;
                    y
                }
            };
            if let Some(cache) = &cache {
                let cw = self.read_window(cache, win)?;
                for (j, tap) in earlier.iter().enumerate() {
                    let back = hist - j;
                    if count > back {
                        let f = frames(x0, back, count - back);
                        conv2d_frames(self.rec(), &xw, tap, Some(&y), &y, &opts, f)?;
                    }
                    let n = back.min(count);
                    if n > 0 {
                        let f = frames(hist - back, 0, n);
                        conv2d_frames(self.rec(), &cw, tap, Some(&y), &y, &opts, f)?;
                    }
                }
            }
            drop(xw);
            self.emit_tile(&mut out, None, i, y, stage::CONV)?;
        }
        drop(residual);
        // The cache becomes the stream's last `hist` frames (after the last
        // tile: every tile read the old frames of its halo).
        if let Some(mut old) = cache {
            let mut next = self.empty_act(hist, x.c, x.h, x.w, x.dtype);
            // The caches' tiles (the input may be the latents, one piece).
            for i in 0..next.grid.len() {
                let r = next.grid.rect(i);
                let xt = self.read_window(x, r)?;
                let kt = self.take_piece(&mut old, i)?;
                let nk = if count >= hist {
                    copy_frames(self, &xt, x0 + count - hist, &kt, 0, hist)?;
                    kt
                } else {
                    let nk =
                        Tensor::empty(&self.ctx, &[hist, x.c, r.h, r.w], x.dtype, "time cache")?;
                    copy_frames(self, &kt, count, &nk, 0, hist - count)?;
                    copy_frames(self, &xt, x0, &nk, hist - count, count)?;
                    nk
                };
                drop(xt);
                self.park(&mut next, i, nk)?;
                self.step_done(stage::TIME)?;
            }
            caches.put(slot, next);
        }
        Ok(out)
    }

    /// Block-causal attention ([`Op::FrameAttention`] with `causal`): it
    /// sits at the latent size, so it runs whole (the untiled executor's)
    /// on `x` and `normed` gathered from their tiles, its result tiled again.
    pub(super) fn causal_attention(
        &mut self,
        x: Act,
        normed: &Act,
        convs: [&Conv2dWeights; 4],
        slot: usize,
        caches: &mut VideoCaches,
    ) -> Result<Act> {
        let (n, c, h, w, dtype) = (x.n, x.c, x.h, x.w, x.dtype);
        let whole = Window::new(0, 0, h, w);
        let xt = self.read_window(&x, whole)?;
        drop(x);
        let nt = self.read_window(normed, whole)?;
        let kv = caches.kv.entry(slot).or_default();
        let y = crate::exec::video_ops::causal_attention(self.rec(), xt, &nt, convs, kv)?;
        drop(nt);
        let mut out = self.empty_act(n, c, h, w, dtype);
        let planes = y.reshape(&[n * c, h, w])?;
        for i in 0..out.grid.len() {
            let r = out.grid.rect(i);
            let t = Tensor::empty(&self.ctx, &out.shape_of(&r), dtype, "attention tile")?;
            let dst = t.reshape(&[n * c, r.h, r.w])?;
            copy_window(self.rec(), &planes, (r.y, r.x), &dst, (0, 0), (r.h, r.w))?;
            self.park(&mut out, i, t)?;
            self.step_done(stage::MAP)?;
        }
        Ok(out)
    }

    /// [`Op::TimeUpsample`] (Wan's `upsample3d`): the time conv on the
    /// frames after a video's first, its 2·C channels read as two frames
    /// (a view), then the nearest-2× up-sample conv tile by tile over the
    /// frames in order (the first frame itself at a video's start), adding
    /// `residual`.
    pub(super) fn time_upsample(
        &mut self,
        x: &Act,
        (w, up): (&CausalWeights, &Conv2dWeights),
        residual: Residual,
        slot: usize,
        caches: &mut VideoCaches,
    ) -> Result<Act> {
        let first = !caches.has(slot);
        let pass = usize::from(first);
        let hist = w.taps.len().saturating_sub(1);
        if hist == 0 {
            return Err(Error::Unsupported(
                "tiled time up-sample without earlier time taps".into(),
            ));
        }
        if first {
            let z = self.zeros(hist, x.c, x.h, x.w, x.dtype)?;
            caches.put(slot, z);
        }
        let count = x.n.saturating_sub(pass);
        let y = if count > 0 {
            let y = self.causal_conv(x, (pass, count), w, Residual::None, slot, caches)?;
            Some(self.time_grow(y, 2)?)
        } else {
            None
        };
        // The frames the spatial conv reads, in output order.
        let frames_in = pass + 2 * count;
        let z = match (pass, y) {
            (0, Some(y)) => y,
            (_, y) => {
                let mut z = self.empty_act(frames_in, x.c, x.h, x.w, x.dtype);
                for i in 0..x.grid.len() {
                    let r = x.grid.rect(i);
                    let t = Tensor::empty(&self.ctx, &z.shape_of(&r), x.dtype, "upsample3d in")?;
                    let xt = self.read_window(x, r)?;
                    copy_frames(self, &xt, 0, &t, 0, 1)?;
                    drop(xt);
                    if let Some(y) = &y {
                        let yt = self.read_window(y, r)?;
                        copy_frames(self, &yt, 0, &t, 1, 2 * count)?;
                    }
                    self.park(&mut z, i, t)?;
                    self.step_done(stage::TIME)?;
                }
                z
            }
        };
        let (out, _) = self.conv(&z, ConvSpec::new(up).upsample(), residual)?;
        Ok(out)
    }

    /// Decodes one chunk `[T, C, h, w]` of a video with `graph` and the
    /// caches of its earlier chunks: returns the output `[T', C', H, W]`
    /// as f32 on the host (zeros on a null device).
    pub(crate) fn decode_video_chunk(
        &mut self,
        graph: &Graph,
        chunk: &HostTensor,
        caches: &mut VideoCaches,
    ) -> Result<(Vec<f32>, [usize; 4])> {
        let shape: [usize; 4] = chunk.shape.as_slice().try_into().map_err(|_| {
            Error::Internal(format!("a tiled video chunk of shape {:?}", chunk.shape))
        })?;
        let input = self.host_act(shape, &chunk.data);
        let (y, _) = self.run_graph_with(graph, input, false, Some(caches))?;
        let out = [y.n, y.c, y.h, y.w];
        let dtype = y.dtype;
        let bytes = self.gather_host(y)?;
        self.submit()?;
        let values = match bytes.data() {
            Some(d) => crate::tensor::f32_from_bytes_of(dtype, d)?,
            None => vec![0.0; out.iter().product()],
        };
        Ok((values, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Level tiles nest (each twice the one below) and a level no larger
    /// than its tile runs whole, on odd latent sizes.
    #[test]
    fn level_tiles_nest_on_odd_shapes() {
        assert_eq!(
            level_tiles(24, 4, (5, 3)),
            vec![Some(3), Some(6), Some(12), Some(24)]
        );
        // A 3×3 latent fits every level's tile: all run whole.
        assert_eq!(level_tiles(24, 4, (3, 3)), vec![None, None, None, None]);
        assert_eq!(
            level_tiles(16, 4, (3, 5)),
            vec![Some(2), Some(4), Some(8), Some(16)]
        );
        // Tiles of one latent pixel still cover every level.
        assert_eq!(level_tiles(8, 4, (1, 2))[0], Some(1));
    }
}
