//! The untiled executor: a graph recorded whole into one [`Recorder`],
//! every tensor from the pool, freed after its last use.
//!
//! GroupNorm + activation are never materialised: a statistics kernel
//! produces per-channel affine coefficients and the following conv applies
//! them (and the activation) while loading its input. Residual adds happen
//! in the conv that produces the second operand, in place.

use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::attention::attention_with;
use crate::kernels::conv2d::{
    conv2d_frames, output_size, Conv2dOptions, Conv2dWeights, Frames, Prologue,
};
use crate::kernels::dup_up::{frames_out, to_space};
use crate::kernels::elementwise::unary;
use crate::kernels::tensor_ops::copy_window;
use crate::kernels::Activation;
use crate::models::graph::{CausalWeights, Geometry, Graph, Mode, Op, Residual, TensorId};
use crate::models::layers::{conv, conv_add, conv_as, dims4, identity_affine, Taps};
use crate::tensor::{DType, Tensor};

/// The cache slots of a video graph's time ops, kept between calls
/// (chunks of one video), from the pool.
#[derive(Default)]
pub(crate) struct VideoState {
    caches: Vec<Option<Cache>>,
    /// Per block-causal attention slot: each earlier frame's keys and
    /// values `[1, C, h, w]` (f32), in order.
    kv: std::collections::BTreeMap<usize, Vec<(Tensor, Tensor)>>,
    /// Slots of ops that have seen a video's first frame (no cache kept).
    marks: std::collections::BTreeSet<usize>,
    /// Clip-chunked decoders' tails between clips.
    pub(crate) clips: super::token_ops::ClipState,
}

/// One cache slot: `[kt − 1, C, H, W]` frames used as a ring (the oldest
/// at `start`), so a chunk shorter than the history overwrites the oldest
/// frames in place instead of copying the cache into a new tensor.
struct Cache {
    frames: Tensor,
    start: usize,
}

impl VideoState {
    /// True once cache slot `slot` is filled: the video has started there.
    fn started(&self, slot: usize) -> bool {
        self.caches.get(slot).is_some_and(Option::is_some)
    }

    fn marked(&self, slot: usize) -> bool {
        self.marks.contains(&slot)
    }

    fn mark(&mut self, slot: usize) {
        self.marks.insert(slot);
    }

    /// Cache tensors held.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let kv = self.kv.values().flatten().flat_map(|(k, v)| [k, v]);
        let clips = self.clips.tensors();
        self.caches
            .iter()
            .flatten()
            .map(|c| &c.frames)
            .chain(kv)
            .chain(clips)
    }
}

/// Records `graph` on `input`; returns its output (a decoder's raw image).
pub(crate) fn run(
    graph: &Graph,
    rec: &mut Recorder,
    input: Tensor,
    taps: &mut Taps,
) -> Result<Tensor> {
    run_video(graph, rec, input, taps, &mut VideoState::default())
}

/// [`run`] with the time caches of `state` (a video graph's chunk: the
/// batch dimension is time).
///
/// Every op is per frame except the time ops, which are causal, so the
/// graph after an op that grows time ([`Op::TimeUpsample`],
/// [`Op::TimeGrow`], a time-growing [`Op::DupUp`] on the main path) runs
/// one of its frames at a time, each through the
/// caches as the whole chunk would (same kernels, same sums: identical
/// output) with the activations of one frame instead of all. A split
/// needs the grown tensor to be the only one alive; taps (named whole
/// tensors) record the chunk whole.
pub(crate) fn run_video(
    graph: &Graph,
    rec: &mut Recorder,
    input: Tensor,
    taps: &mut Taps,
    state: &mut VideoState,
) -> Result<Tensor> {
    let n = dims4(&input)?[0];
    let mut slots: Vec<Option<Tensor>> = (0..graph.tensors()).map(|_| None).collect();
    slots[graph.input().0] = Some(input);
    // A frame at a time needs every later op to be causal.
    let split = !taps.is_enabled() && graph.is_causal();
    run_from(graph, rec, slots, (0, n), split, taps, state)
}

/// Records `graph`'s ops before op `end` on `input` (no taps, no caches):
/// the output of op `end − 1` (which op `end` would read).
pub(crate) fn run_until(
    graph: &Graph,
    rec: &mut Recorder,
    input: Tensor,
    end: usize,
) -> Result<Tensor> {
    let n = dims4(&input)?[0];
    let mut slots: Vec<Option<Tensor>> = (0..graph.tensors()).map(|_| None).collect();
    slots[graph.input().0] = Some(input);
    let (mut taps, mut state) = (Taps::default(), VideoState::default());
    for i in 0..end {
        step(graph, rec, &mut slots, i, n, &mut taps, &mut state)?;
    }
    let last = end
        .checked_sub(1)
        .and_then(|i| graph.out(i))
        .ok_or_else(|| Error::Internal(format!("no op {end} to stop before")))?;
    take(&mut slots, last)
}

/// Runs ops `start..` on `slots` (`n` frames); see [`run_video`].
fn run_from(
    graph: &Graph,
    rec: &mut Recorder,
    mut slots: Vec<Option<Tensor>>,
    (start, n): (usize, usize),
    split: bool,
    taps: &mut Taps,
    state: &mut VideoState,
) -> Result<Tensor> {
    let ops = graph.ops();
    for i in start..ops.len() {
        step(graph, rec, &mut slots, i, n, taps, state)?;
        // HunyuanVideo 1.5's up-samplers grow time by channels to space with
        // the shortcut added (its main path).
        let grows = matches!(
            ops[i],
            Op::TimeUpsample { .. }
                | Op::TimeGrow { .. }
                | Op::DupUp {
                    ft: 2..,
                    residual: Some(_),
                    ..
                }
        );
        let Some(id) = graph.out(i) else { continue };
        if !split || !grows || i + 1 == ops.len() {
            continue;
        }
        let alone = slots
            .iter()
            .enumerate()
            .all(|(j, t)| j == id.0 || t.is_none());
        let frames = dims4(get(&slots, id)?)?[0];
        if !alone || frames < 2 {
            continue;
        }
        let grown = take(&mut slots, id)?;
        let mut outs = Vec::with_capacity(frames);
        let mut grown = Some(grown);
        for f in 0..frames {
            let Some(g) = grown.as_ref() else { break };
            let frame = frame_of(rec, g, f)?;
            if f + 1 == frames {
                grown = None;
            }
            let mut one: Vec<Option<Tensor>> = (0..graph.tensors()).map(|_| None).collect();
            one[id.0] = Some(frame);
            outs.push(run_from(graph, rec, one, (i + 1, 1), split, taps, state)?);
        }
        return concat_frames(rec, outs);
    }
    take(&mut slots, graph.output())
}

/// Frame `f` of `x` [T, C, H, W] copied into its own `[1, C, H, W]`.
pub(crate) fn frame_of(rec: &mut Recorder, x: &Tensor, f: usize) -> Result<Tensor> {
    let [_, c, h, w] = dims4(x)?;
    let one = Tensor::empty(rec.ctx(), &[1, c, h, w], x.dtype(), "one frame")?;
    let ((rows, frame), (dst, _)) = (frame_rows(x)?, frame_rows(&one)?);
    copy_window(rec, &rows, (f, 0), &dst, (0, 0), (1, frame))?;
    Ok(one)
}

/// `parts` (each [Tᵢ, C, H, W]) one after another in time.
fn concat_frames(rec: &mut Recorder, parts: Vec<Tensor>) -> Result<Tensor> {
    let Some(first) = parts.first() else {
        return Err(Error::Internal("no frames to join".into()));
    };
    let [_, c, h, w] = dims4(first)?;
    let mut total = 0;
    for p in &parts {
        let [t, pc, ph, pw] = dims4(p)?;
        if [pc, ph, pw] != [c, h, w] {
            return Err(Error::Internal(format!(
                "frames of {pc}×{ph}×{pw} joined to {c}×{h}×{w}"
            )));
        }
        total += t;
    }
    let out = Tensor::empty(rec.ctx(), &[total, c, h, w], first.dtype(), "frames")?;
    let (rows, frame) = frame_rows(&out)?;
    let mut at = 0;
    for p in parts {
        let t = dims4(&p)?[0];
        let (src, _) = frame_rows(&p)?;
        copy_window(rec, &src, (0, 0), &rows, (at, 0), (t, frame))?;
        at += t;
    }
    Ok(out)
}

/// Records op `i` of `graph` on `slots` (`n` frames), then its frees.
fn step(
    graph: &Graph,
    rec: &mut Recorder,
    slots: &mut [Option<Tensor>],
    i: usize,
    n: usize,
    taps: &mut Taps,
    state: &mut VideoState,
) -> Result<()> {
    let op = &graph.ops()[i];
    let out = match op {
        Op::Identity { channels } => Some(identity_affine(rec, n, *channels)?),
        Op::Map { x, f } => {
            let x = take(slots, *x)?;
            unary(rec, *f, &x, &x)?;
            Some(x)
        }
        Op::Stats { x, norm } => Some(graph.norm(*norm).affine(rec, get(slots, *x)?)?),
        Op::TimeShift { x, cache } => Some(time_shift(rec, get(slots, *x)?, *cache, state)?),
        Op::TimeGrow { x, stride } => {
            let x = take(slots, *x)?;
            let [t, c, h, w] = dims4(&x)?;
            if *stride == 0 || c % stride != 0 {
                return Err(Error::Internal(format!(
                    "time stride {stride} does not divide {c} channels"
                )));
            }
            Some(x.reshape(&[t * stride, c / stride, h, w])?)
        }
        Op::TimePool { x, stride } => {
            let x = take(slots, *x)?;
            let [t, c, h, w] = dims4(&x)?;
            if *stride == 0 || t % stride != 0 {
                return Err(Error::InvalidInput(format!(
                    "{t} frames at a time pool of stride {stride}: a video encoder's chunk must hold a multiple of its time downscale in frames"
                )));
            }
            Some(x.reshape(&[t / stride, c * stride, h, w])?)
        }
        Op::Conv(c) => {
            let w = graph.conv(c.w);
            let opts = c.geometry.options(w.k());
            let residual = match c.residual {
                Residual::None => None,
                Residual::InPlace(r) => Some(take(slots, r)?),
                Residual::Shortcut(s, sc) => Some(conv(
                    rec,
                    get(slots, s)?,
                    graph.conv(sc),
                    None,
                    &Conv2dOptions::same(1),
                )?),
            };
            let prologue = match c.prologue {
                Some((a, act)) => Some(Prologue {
                    affine: get(slots, a)?,
                    act,
                }),
                None => None,
            };
            let x = get(slots, c.x)?;
            let y = match residual {
                None => conv(rec, x, w, prologue, &opts)?,
                Some(r) => conv_add(rec, x, w, prologue, r, &opts)?,
            };
            if let Some(f) = c.epilogue {
                unary(rec, f, &y, &y)?;
            }
            Some(y)
        }
        Op::Attention {
            x,
            affine,
            q,
            k,
            v,
            out,
        } => {
            let x = take(slots, *x)?;
            let a = get(slots, *affine)?;
            let convs = [*q, *k, *v, *out].map(|id| graph.conv(id));
            Some(self_attention(rec, x, None, Some(a), convs)?)
        }
        Op::RmsNorm { x, norm, silu } => {
            let x = get(slots, *x)?;
            let out = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), "rms norm")?;
            let gamma = (graph.rms(*norm), graph.rms_kind(*norm));
            crate::kernels::rms_norm::norm(rec, x, gamma, *silu, &out)?;
            Some(out)
        }
        Op::CausalConv {
            x,
            w,
            cache,
            residual,
        } => {
            let residual = match residual {
                Residual::None => None,
                Residual::InPlace(r) => Some(take(slots, *r)?),
                Residual::Shortcut(s, sc) => Some(conv(
                    rec,
                    get(slots, *s)?,
                    graph.conv(*sc),
                    None,
                    &Conv2dOptions::same(1),
                )?),
            };
            let x = get(slots, *x)?;
            let t = dims4(x)?[0];
            let w = graph.causal(*w);
            Some(causal_conv(rec, x, (0, t), w, residual, *cache, state)?)
        }
        Op::TimeUpsample {
            x,
            w,
            cache,
            up,
            residual,
        } => {
            let residual = residual.map(|r| take(slots, r)).transpose()?;
            let x = get(slots, *x)?;
            let (w, up) = (graph.causal(*w), graph.conv(*up));
            Some(time_upsample(rec, x, (w, up), residual, *cache, state)?)
        }
        Op::DupUp { x, .. } | Op::PixelShuffle { x, .. } => {
            // A shortcut to add (HunyuanVideo's, LTX-2's) is summed in the same pass.
            let residual = match op {
                Op::DupUp {
                    residual: Some(r), ..
                } => Some(take(slots, *r)?),
                _ => None,
            };
            let x = get(slots, *x)?;
            let [n, c, h, w] = dims4(x)?;
            let (channels, (ft, f)) = op.space_factors(c)?;
            let lead = match op {
                Op::DupUp {
                    first_of: Some(slot),
                    ..
                } => {
                    let started = state.started(*slot) || state.marked(*slot);
                    state.mark(*slot);
                    usize::from(!started)
                }
                _ => n,
            };
            let shape = [frames_out(n, ft, lead), channels, f * h, f * w];
            let (out, add) = match residual {
                Some(r) => {
                    if r.shape() != shape {
                        return Err(Error::Internal(format!(
                            "channels-to-space residual {r:?}: the output is {shape:?}"
                        )));
                    }
                    (r, true)
                }
                _ => (
                    Tensor::empty(rec.ctx(), &shape, x.dtype(), "channels to space")?,
                    false,
                ),
            };
            to_space(
                rec,
                x,
                (0, 0),
                &out,
                (0, 0),
                (ft, f),
                (lead, op.order(), add),
            )?;
            Some(out)
        }
        Op::FrameAttention {
            x,
            normed,
            q,
            k,
            v,
            out,
            causal,
        } => {
            let x = take(slots, *x)?;
            let normed = get(slots, *normed)?;
            let convs = [*q, *k, *v, *out].map(|id| graph.conv(id));
            match causal {
                None => Some(self_attention(rec, x, Some(normed), None, convs)?),
                Some(slot) => {
                    let kv = state.kv.entry(*slot).or_default();
                    Some(super::video_ops::causal_attention(
                        rec, x, normed, convs, kv,
                    )?)
                }
            }
        }
        Op::PixelUnshuffle { x, factor } => {
            let x = get(slots, *x)?;
            let [n, c, h, w] = dims4(x)?;
            let f = (*factor).max(1);
            let shape = [n, c * f * f, h / f, w / f];
            let out = Tensor::empty(rec.ctx(), &shape, x.dtype(), "pixel unshuffle")?;
            crate::kernels::dup_up::pixel_unshuffle(rec, x, f, &out)?;
            Some(out)
        }
        Op::Tokens(t) => {
            let mut access = |id: TensorId, consume: bool| -> Result<Tensor> {
                if consume {
                    take(slots, id)
                } else {
                    get(slots, id).cloned()
                }
            };
            let clips = &mut state.clips;
            Some(super::token_ops::token_op(
                graph,
                rec,
                t,
                &mut access,
                clips,
            )?)
        }
        Op::Tap { x, name, activated } => {
            let x = get(slots, *x)?;
            match activated {
                None => taps.tap(rec, name, x)?,
                Some((a, act)) if taps.is_enabled() => {
                    // Never materialised in a normal run; built for the check.
                    let t = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), name)?;
                    let a = get(slots, *a)?;
                    crate::kernels::group_norm::group_norm_apply(rec, x, a, *act, &t)?;
                    taps.tap(rec, name, &t)?;
                }
                Some(_) => {}
            }
            None
        }
    };
    if let (Some(t), Some(id)) = (out, graph.out(i)) {
        slots[id.0] = Some(t);
    }
    for t in graph.frees(Mode::Untiled, i) {
        slots[t.0] = None;
    }
    Ok(())
}

/// `x` [T, C, H, W] one frame later: frame 0 from cache slot `slot`
/// (zeros at first), which then takes frame T − 1. Each frame is one row of
/// a `[1, T, C·H·W]` view, so one window-copy kernel moves whole frames.
fn time_shift(
    rec: &mut Recorder,
    x: &Tensor,
    slot: usize,
    state: &mut VideoState,
) -> Result<Tensor> {
    let [t, c, h, w] = dims4(x)?;
    let frame = c * h * w;
    let cache = cache_frames(rec, state, slot, [1, c, h, w], (x, None))?;
    let past = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), "previous frames")?;
    let rows = |v: &Tensor, n: usize| v.reshape(&[1, n, frame]);
    let (x3, past3, cache3) = (rows(x, t)?, rows(&past, t)?, rows(&cache.frames, 1)?);
    copy_window(rec, &cache3, (0, 0), &past3, (0, 0), (1, frame))?;
    copy_window(
        rec,
        &x3,
        (0, 0),
        &past3,
        (1, 0),
        (t.saturating_sub(1), frame),
    )?;
    copy_window(
        rec,
        &x3,
        (t.saturating_sub(1), 0),
        &cache3,
        (0, 0),
        (1, frame),
    )?;
    state.caches[slot] = Some(cache);
    Ok(past)
}

/// `x` [.., C, H, W] viewed as rows of whole frames `[1, T, C·H·W]`.
pub(crate) fn frame_rows(x: &Tensor) -> Result<(Tensor, usize)> {
    let [t, c, h, w] = dims4(x)?;
    Ok((x.reshape(&[1, t, c * h * w])?, c * h * w))
}

/// Logical frames `l0..l0 + n` of a ring of `len` frames whose oldest is
/// at `start`, as up to two runs `(stored at, offset in l0.., count)`.
fn ring_runs(start: usize, len: usize, l0: usize, n: usize) -> [(usize, usize, usize); 2] {
    let at = (start + l0) % len.max(1);
    let first = n.min(len - at);
    [(at, 0, first), (0, first, n - first)]
}

/// The causal conv of frames `x0..x0 + count` of `x` [T, C, H, W] with the
/// `kt − 1` frames before them from cache slot `slot` (zeros when empty):
/// one pass of the implicit-GEMM conv per time tap, each reading its frames
/// in place (from `x`, or the cache for the outputs it reaches back
/// before the chunk) and adding into the output. The cache then holds the
/// last `kt − 1` frames of the stream. `residual`: the tensor the taps add
/// into (consumed; the result).
fn causal_conv(
    rec: &mut Recorder,
    x: &Tensor,
    (x0, count): (usize, usize),
    w: &CausalWeights,
    residual: Option<Tensor>,
    slot: usize,
    state: &mut VideoState,
) -> Result<Tensor> {
    let [_, c, h, wd] = dims4(x)?;
    let Some((current, earlier)) = w.taps.split_last() else {
        return Err(Error::Internal("causal conv without taps".into()));
    };
    let residual_given = residual.is_some();
    let hist = earlier.len();
    let opts = Conv2dOptions {
        replicate: w.replicate,
        reflect: w.reflect,
        ..Conv2dOptions::same(current.k() as u32)
    };
    let (ho, wo) = output_size(h, wd, current.k(), &opts);
    if w.centered {
        let y = match residual {
            Some(r) => r,
            None => Tensor::empty(
                rec.ctx(),
                &[count, current.cout(), ho, wo],
                x.dtype(),
                "time conv out",
            )?,
        };
        let added = residual_given;
        super::video_ops::centered_conv(rec, (x, x0), &w.taps, (&y, added), count, &opts)?;
        return Ok(y);
    }
    let frames = |in_frame, out_frame, count| Frames {
        in_frame,
        out_frame,
        count,
    };
    let y = match residual {
        Some(r) => {
            conv2d_frames(rec, x, current, Some(&r), &r, &opts, frames(x0, 0, count))?;
            r
        }
        None => {
            let y = Tensor::empty(
                rec.ctx(),
                &[count, current.cout(), ho, wo],
                x.dtype(),
                "causal conv out",
            )?;
            conv2d_frames(rec, x, current, None, &y, &opts, frames(x0, 0, count))?;
            y
        }
    };
    if hist == 0 {
        return Ok(y);
    }
    let start = w.repeat_first.then_some(x0);
    let mut cache = cache_frames(rec, state, slot, [hist, c, h, wd], (x, start))?;
    for (j, tap) in earlier.iter().enumerate() {
        let back = hist - j;
        if count > back {
            conv2d_frames(
                rec,
                x,
                tap,
                Some(&y),
                &y,
                &opts,
                frames(x0, back, count - back),
            )?;
        }
        let n = back.min(count);
        for (at, out, n) in ring_runs(cache.start, hist, hist - back, n) {
            if n > 0 {
                conv2d_frames(
                    rec,
                    &cache.frames,
                    tap,
                    Some(&y),
                    &y,
                    &opts,
                    frames(at, out, n),
                )?;
            }
        }
    }
    // The cache becomes the stream's last `hist` frames: the newest
    // overwrite the oldest in place.
    let ((x_rows, frame), (rows, _)) = (frame_rows(x)?, frame_rows(&cache.frames)?);
    if count >= hist {
        let from = x0 + count - hist;
        copy_window(rec, &x_rows, (from, 0), &rows, (0, 0), (hist, frame))?;
        cache.start = 0;
    } else {
        for (at, off, n) in ring_runs(cache.start, hist, 0, count) {
            if n > 0 {
                copy_window(rec, &x_rows, (x0 + off, 0), &rows, (at, 0), (n, frame))?;
            }
        }
        cache.start = (cache.start + count) % hist;
    }
    state.caches[slot] = Some(cache);
    Ok(y)
}

/// Cache slot `slot`'s frames `shape` (taken out of the state; when the
/// slot is empty, zeros, or copies of frame `f` of `x` for `(x, Some(f))`:
/// replicate padding in time); an error when a previous chunk left another
/// shape.
fn cache_frames(
    rec: &mut Recorder,
    state: &mut VideoState,
    slot: usize,
    shape: [usize; 4],
    (x, replicate): (&Tensor, Option<usize>),
) -> Result<Cache> {
    if state.caches.len() <= slot {
        state.caches.resize_with(slot + 1, || None);
    }
    match state.caches[slot].take() {
        Some(k) if k.frames.shape() == shape && k.frames.dtype() == x.dtype() => Ok(k),
        Some(k) => Err(Error::InvalidInput(format!(
            "a video chunk's frames are {}×{}×{} ({}) at a cached layer that held {:?} from the previous chunk; every chunk of one video must have the same latent size",
            shape[1],
            shape[2],
            shape[3],
            x.dtype().name(),
            k.frames,
        ))),
        None => {
            let k = Tensor::empty(rec.ctx(), &shape, x.dtype(), "time cache")?;
            match replicate {
                Some(f) => {
                    let ((src, frame), (dst, _)) = (frame_rows(x)?, frame_rows(&k)?);
                    for at in 0..shape[0] {
                        copy_window(rec, &src, (f, 0), &dst, (at, 0), (1, frame))?;
                    }
                }
                None => rec.zero(&k, "clear::time_cache")?,
            }
            Ok(Cache {
                frames: k,
                start: 0,
            })
        }
    }
}

/// Wan's `upsample3d` on `x` [T, C, H, W] (see [`Op::TimeUpsample`]): at a
/// video's start (empty slot) frame 0 goes straight to the spatial conv and
/// the time conv starts from zeros on the frames after it. `residual`: the
/// tensor the spatial conv adds into (consumed; the result).
fn time_upsample(
    rec: &mut Recorder,
    x: &Tensor,
    (w, up): (&CausalWeights, &crate::kernels::conv2d::Conv2dWeights),
    residual: Option<Tensor>,
    slot: usize,
    state: &mut VideoState,
) -> Result<Tensor> {
    let [t, c, h, wd] = dims4(x)?;
    let first = !state.started(slot);
    let pass = usize::from(first);
    if first {
        let hist = w.taps.len().saturating_sub(1);
        let k = cache_frames(rec, state, slot, [hist, c, h, wd], (x, None))?;
        state.caches[slot] = Some(k);
    }
    let count = t.saturating_sub(pass);
    let opts = Geometry::Upsample.options(3);
    let shape = [pass + 2 * count, up.cout(), 2 * h, 2 * wd];
    let added = residual.is_some();
    let out = match residual {
        Some(r) if r.shape() == shape => r,
        Some(r) => {
            return Err(Error::Internal(format!(
                "upsample3d residual {r:?}: the output is {shape:?}"
            )))
        }
        None => Tensor::empty(rec.ctx(), &shape, x.dtype(), "upsample3d out")?,
    };
    let add = added.then_some(&out);
    let frames = |in_frame, out_frame, count| Frames {
        in_frame,
        out_frame,
        count,
    };
    if pass == 1 {
        conv2d_frames(rec, x, up, add, &out, &opts, frames(0, 0, 1))?;
    }
    if count > 0 {
        let y = causal_conv(rec, x, (pass, count), w, None, slot, state)?;
        let y = y.reshape(&[2 * count, c, h, wd])?;
        conv2d_frames(rec, &y, up, add, &out, &opts, frames(0, pass, 2 * count))?;
    }
    Ok(out)
}

fn get(slots: &[Option<Tensor>], t: TensorId) -> Result<&Tensor> {
    slots[t.0].as_ref().ok_or_else(|| missing(t))
}

fn take(slots: &mut [Option<Tensor>], t: TensorId) -> Result<Tensor> {
    slots[t.0].take().ok_or_else(|| missing(t))
}

fn missing(t: TensorId) -> Error {
    Error::Internal(format!(
        "model graph read {t:?} before it was computed or after it was freed"
    ))
}

/// Single-head self-attention over each image's (frame's) `h·w` tokens: q, k,
/// v are 1×1 convs of `normed` (or of `x` itself with `affine` as their
/// prologue), read by the attention kernel in f32; the output projection is
/// added onto `x` in place.
fn self_attention(
    rec: &mut Recorder,
    x: Tensor,
    normed: Option<&Tensor>,
    affine: Option<&Tensor>,
    [q, k, v, out]: [&Conv2dWeights; 4],
) -> Result<Tensor> {
    let [n, c, h, w] = dims4(&x)?;
    let same1 = Conv2dOptions::same(1);
    let pro = || {
        affine.map(|affine| Prologue {
            affine,
            act: Activation::None,
        })
    };
    // The attention kernel reads f32 q, k, v (softmax inputs stay f32).
    let f32 = DType::F32;
    let src = normed.unwrap_or(&x);
    let q = conv_as(rec, src, q, pro(), &same1, f32)?;
    let k = conv_as(rec, src, k, pro(), &same1, f32)?;
    let v = conv_as(rec, src, v, pro(), &same1, f32)?;
    let o = Tensor::empty(rec.ctx(), &[n, c, h, w], DType::F32, "attention out")?;
    let tokens = [n, c, h * w];
    // An f16 model's attention may round q, k, v to f16 (cooperative matrices).
    let f16_operands = out.dtype() == DType::F16;
    attention_with(
        rec,
        &q.reshape(&tokens)?,
        &k.reshape(&tokens)?,
        &v.reshape(&tokens)?,
        1.0 / (c as f32).sqrt(),
        &o.reshape(&tokens)?,
        f16_operands,
    )?;
    drop((q, k, v));
    conv_add(rec, &o, out, None, x, &same1)
}

// Running a loaded model is the executors' business: the models describe graphs and never
// import an executor, so these methods live here.
impl crate::models::ImageDecoder {
    /// Records the decoder on `z` [N, C, h, w] (decoder input) → raw [N, 3, H, W].
    #[doc(hidden)]
    pub fn forward(&self, rec: &mut Recorder, z: Tensor, taps: &mut Taps) -> Result<Tensor> {
        run(self.graph(), rec, z, taps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::graph::Builder;
    use crate::testing::{dtype_contexts, rand_vec};

    /// A ring's logical frames map to stored runs, wrapping once.
    #[test]
    fn ring_runs_wrap() {
        assert_eq!(ring_runs(0, 2, 0, 2), [(0, 0, 2), (0, 2, 0)]);
        assert_eq!(ring_runs(1, 2, 0, 2), [(1, 0, 1), (0, 1, 1)]);
        assert_eq!(ring_runs(1, 2, 1, 1), [(0, 0, 1), (0, 1, 0)]);
        assert_eq!(ring_runs(0, 2, 1, 0), [(1, 0, 0), (0, 0, 0)]);
    }

    /// After a time grow the graph runs frame by frame (taps off) with the
    /// output of the whole chunk recorded at once (taps on), across chunks.
    #[test]
    fn frames_after_a_time_grow_match_the_whole_chunk() {
        let (mut b, x) = Builder::new();
        let grown = b.time_grow(x, 2);
        let past = b.time_shift(grown, 0);
        let g = b.finish(past, None);
        let [c, h, w] = [2, 3, 5];
        let frame = 2 * c * h * w;
        for (ctx, dtype) in dtype_contexts() {
            let all = rand_vec(4 * frame, 5, 1.0);
            let mut outs = Vec::new();
            for mut taps in [Taps::default(), Taps::enabled()] {
                let mut state = VideoState::default();
                let mut got = Vec::new();
                for (t0, t1) in [(0, 3), (3, 4)] {
                    let mut rec = Recorder::new(&ctx);
                    let data = &all[t0 * frame..t1 * frame];
                    let shape = [t1 - t0, 2 * c, h, w];
                    let x = Tensor::from_f32_as(&ctx, &shape, data, dtype, "x").unwrap();
                    let y = run_video(&g, &mut rec, x, &mut taps, &mut state).unwrap();
                    assert_eq!(y.shape(), [2 * (t1 - t0), c, h, w]);
                    rec.submit().unwrap();
                    got.extend(y.to_f32(&ctx).unwrap());
                }
                outs.push(got);
            }
            assert_eq!(outs[0], outs[1], "{dtype:?}");
        }
    }

    /// Time shift over two chunks of odd frame sizes equals the CPU shift of
    /// the whole sequence (zeros before the first frame), in every dtype.
    #[test]
    fn time_shift_matches_cpu_across_chunks() {
        let (mut b, x) = Builder::new();
        let past = b.time_shift(x, 0);
        let g = b.finish(past, None);
        let [c, h, w] = [3, 5, 7];
        let frame = c * h * w;
        for (ctx, dtype) in dtype_contexts() {
            let mut state = VideoState::default();
            let all = rand_vec(5 * frame, 11, 1.0);
            let mut got = Vec::new();
            for (t0, t1) in [(0, 3), (3, 4), (4, 5)] {
                let mut rec = Recorder::new(&ctx);
                let data = &all[t0 * frame..t1 * frame];
                let x = Tensor::from_f32_as(&ctx, &[t1 - t0, c, h, w], data, dtype, "x").unwrap();
                let y = run_video(&g, &mut rec, x, &mut Taps::default(), &mut state).unwrap();
                rec.submit().unwrap();
                got.extend(y.to_f32(&ctx).unwrap());
            }
            let want: Vec<f32> = std::iter::repeat_n(0.0, frame)
                .chain(all[..4 * frame].iter().copied())
                .collect();
            let rounded = Tensor::from_f32_as(&ctx, &[5 * frame], &want, dtype, "w").unwrap();
            assert_eq!(got, rounded.to_f32(&ctx).unwrap(), "{dtype:?}");
            assert_eq!(state.tensors().count(), 1);
        }
    }
}
