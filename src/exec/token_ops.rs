//! The untiled executor's token ops ([`TokenOp`]): a transformer decoder
//! (MiniMax-H3's ViT) over channel-major tokens `[1, C, rows, w]`, its
//! linear layers the graph's 1×1 convs, and the cross-fade of a
//! clip-chunked video decode.

use super::untiled::frame_rows;
use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::attention::{flash_attention, AttentionProblem, KvInput, Strides};
use crate::kernels::conv2d::{Conv2dOptions, Conv2dWeights};
use crate::kernels::rms_norm::{norm, NormKind};
use crate::kernels::tensor_ops::copy_window;
use crate::kernels::tokens::{crossfade, glu, rope, rope_table, set_tokens, tokens, unpatchify};
use crate::models::graph::{Graph, TokenOp};
use crate::models::layers::{conv_add, conv_as, dims4};
use crate::tensor::{DType, Tensor};

/// What a clip op keeps between clips and needs to know of the video.
#[derive(Default)]
pub(crate) struct ClipState {
    /// Per slot: the previous clip's tail.
    tails: std::collections::BTreeMap<usize, Tensor>,
    /// Set for a video's last clip: frames to cut off its end (made from
    /// the padding latent frames).
    pub last: Option<usize>,
}

impl ClipState {
    pub(crate) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.tails.values()
    }
}

/// Records `op`; `get` reads a live tensor, `take` takes one (consumed).
pub(crate) fn token_op(
    graph: &Graph,
    rec: &mut Recorder,
    op: &TokenOp,
    get: &mut dyn FnMut(crate::models::graph::TensorId, bool) -> Result<Tensor>,
    clips: &mut ClipState,
) -> Result<Tensor> {
    let grid = |get: &mut dyn FnMut(_, bool) -> Result<Tensor>, g| -> Result<[usize; 4]> {
        dims4(&get(g, false)?)
    };
    match op {
        TokenOp::From { x, extra } => {
            let x = get(*x, false)?;
            let [t, c, h, w] = dims4(&x)?;
            let rows = t * h + extra.div_ceil(w);
            let out = Tensor::empty(rec.ctx(), &[1, c, rows, w], x.dtype(), "tokens")?;
            tokens(rec, &x, &out, false)?;
            Ok(out)
        }
        TokenOp::Registers { x, grid: g, reg } => {
            let [t, _, h, w] = grid(get, *g)?;
            let x = get(*x, true)?;
            set_tokens(rec, &x, t * h * w, graph.constant(*reg))?;
            Ok(x)
        }
        TokenOp::Rope {
            grid: g,
            half,
            theta,
        } => {
            let [t, _, h, w] = grid(get, *g)?;
            let table = rope_table((t, h, w), half / 3, *theta);
            Tensor::from_f32_in(rec, &[table.len()], &table, "rope")
        }
        TokenOp::Attention {
            x,
            normed,
            grid: g,
            rope,
            qkvo,
            heads,
            extra,
            qk_norm: (ones, eps),
            half,
        } => {
            let [t, _, h, w] = grid(get, *g)?;
            let table = get(*rope, false)?;
            let normed = get(*normed, false)?;
            let x = get(*x, true)?;
            let convs = qkvo.map(|id| graph.conv(id));
            let spec = Heads {
                heads: *heads,
                tokens: t * h * w + extra,
                qk_norm: (graph.constant(*ones), *eps),
                rope: ((t, h, w), *half, &table),
            };
            attention(rec, x, &normed, convs, &spec)
        }
        TokenOp::Glu { x } => {
            let x = get(*x, false)?;
            let [n, c2, rows, w] = dims4(&x)?;
            let out = Tensor::empty(rec.ctx(), &[n, c2 / 2, rows, w], x.dtype(), "swiglu")?;
            glu(rec, &x, &out)?;
            Ok(out)
        }
        TokenOp::Unpatchify {
            x,
            grid: g,
            channels,
            ft,
            f,
        } => {
            let [t, _, h, w] = grid(get, *g)?;
            let x = get(*x, false)?;
            let out = Tensor::empty(
                rec.ctx(),
                &[t * ft, *channels, h * f, w * f],
                x.dtype(),
                "unpatchified",
            )?;
            unpatchify(rec, &x, (t, h, w), (*ft, *f), &out)?;
            Ok(out)
        }
        TokenOp::Clip {
            x,
            slot,
            split,
            skip,
            fade,
        } => {
            let x = get(*x, false)?;
            clip(rec, &x, (*slot, *split, *skip, *fade), clips)
        }
    }
}

/// The clip op ending `graph` (a clip-based decoder's last op) on the
/// clip's frames `x`, stitched from tiles by the runner.
pub(crate) fn clip_step(
    graph: &Graph,
    rec: &mut Recorder,
    x: &Tensor,
    clips: &mut ClipState,
) -> Result<Tensor> {
    match graph.ops().last() {
        Some(crate::models::graph::Op::Tokens(TokenOp::Clip {
            slot,
            split,
            skip,
            fade,
            ..
        })) => clip(rec, x, (*slot, *split, *skip, *fade), clips),
        _ => Err(Error::Internal(
            "the graph does not end with a clip op".into(),
        )),
    }
}

/// A multi-head attention's shape: heads, tokens attended (the grid's and
/// the extra ones), the q/k norm's gamma (ones) and eps, and the RoPE grid,
/// pairs and table.
struct Heads<'a> {
    heads: usize,
    tokens: usize,
    qk_norm: (&'a Tensor, f32),
    rope: ((usize, usize, usize), usize, &'a Tensor),
}

/// [`TokenOp::Attention`]: q, k, v in f32 `[heads, d, rows, w]`, q and k
/// RMS-normed per head and rotated, one flash-attention call over every
/// head (padding tokens neither attend nor are attended), the output
/// projection added into `x`.
fn attention(
    rec: &mut Recorder,
    x: Tensor,
    normed: &Tensor,
    [q, k, v, out]: [&Conv2dWeights; 4],
    s: &Heads<'_>,
) -> Result<Tensor> {
    let [_, dm, rows, w] = dims4(&x)?;
    let plane = rows * w;
    let dh = dm / s.heads.max(1);
    if dh * s.heads != dm || s.tokens > plane {
        return Err(Error::Internal(format!(
            "attention of {} heads over {} of {plane} tokens of {dm} channels",
            s.heads, s.tokens
        )));
    }
    let same1 = Conv2dOptions::same(1);
    let per_head = [s.heads, dh, rows, w];
    let (ones, eps) = s.qk_norm;
    let (grid, half, table) = s.rope;
    // q and k: projected, normed per head, rotated.
    let mut qk = Vec::with_capacity(2);
    for wt in [q, k] {
        let p = conv_as(rec, normed, wt, None, &same1, DType::F32)?;
        let n = Tensor::empty(rec.ctx(), &per_head, DType::F32, "q/k")?;
        norm(
            rec,
            &p.reshape(&per_head)?,
            (ones, NormKind::Rms(eps)),
            false,
            &n,
        )?;
        drop(p);
        rope(rec, &n, table, grid, half)?;
        qk.push(n);
    }
    let v = conv_as(rec, normed, v, None, &same1, DType::F32)?;
    let o = Tensor::empty(rec.ctx(), &[1, dm, rows, w], DType::F32, "attention out")?;
    // Padding tokens get no output: zero them so the projection reads zeros.
    if s.tokens < plane {
        rec.zero(&o, "attention padding")?;
    }
    let strides = Strides {
        batch: dh * plane,
        head: 0,
        token: 1,
        channel: plane,
    };
    let scale = 1.0 / (dh as f32).sqrt();
    let prob = AttentionProblem {
        f16_operands: out.dtype() == DType::F16,
        ..AttentionProblem::self_attention(s.heads, 1, s.tokens, dh, strides, scale)
    };
    let [qn, kn] =
        <[Tensor; 2]>::try_from(qk).map_err(|_| Error::Internal("attention q/k missing".into()))?;
    flash_attention(rec, &prob, &qn, KvInput::F32 { k: &kn, v: &v }, &o)?;
    drop((qn, kn, v));
    conv_add(rec, &o, out, None, x, &same1)
}

/// [`TokenOp::Clip`] on the clip's frames `x`.
fn clip(
    rec: &mut Recorder,
    x: &Tensor,
    (slot, split, skip, fade): (usize, usize, usize, usize),
    state: &mut ClipState,
) -> Result<Tensor> {
    let [frames, c, h, w] = dims4(x)?;
    if split > frames || skip > split {
        return Err(Error::Internal(format!(
            "a clip of {frames} frames split at {split}, {skip} skipped"
        )));
    }
    let keep = split - skip;
    let tail = frames.saturating_sub(split + skip);
    let prev = state.tails.remove(&slot);
    let prev = prev.as_ref().map(|p| {
        let n = dims4(p).map_or(0, |d| d[0]);
        (p, fade.min(n).min(keep))
    });
    let (emitted, tail_out) = match state.last {
        Some(cut) => {
            let total = (keep + tail).checked_sub(cut).ok_or_else(|| {
                Error::Internal(format!(
                    "{cut} padding frames cut from a clip of {keep} + {tail}"
                ))
            })?;
            (total.min(keep), total.saturating_sub(keep))
        }
        None => (keep, 0),
    };
    let out = Tensor::empty(rec.ctx(), &[emitted + tail_out, c, h, w], x.dtype(), "clip")?;
    match prev.filter(|p| p.1 > 0) {
        Some(p) => crossfade(rec, x, (skip, emitted), &out, 0, Some(p))?,
        None => copy_frames(rec, (x, skip), (&out, 0), emitted)?,
    }
    if tail_out > 0 {
        copy_frames(rec, (x, split + skip), (&out, emitted), tail_out)?;
    }
    if state.last.is_none() && tail > 0 {
        let t = Tensor::empty(rec.ctx(), &[tail, c, h, w], x.dtype(), "clip tail")?;
        copy_frames(rec, (x, split + skip), (&t, 0), tail)?;
        state.tails.insert(slot, t);
    }
    Ok(out)
}

/// Frames `s0..s0 + n` of `src` `[F, C, H, W]` into `dst` from frame `d0`
/// (whole frames as rows of the window-copy kernel).
fn copy_frames(
    rec: &mut Recorder,
    (src, s0): (&Tensor, usize),
    (dst, d0): (&Tensor, usize),
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let ((s, frame), (d, _)) = (frame_rows(src)?, frame_rows(dst)?);
    copy_window(rec, &s, (s0, 0), &d, (d0, 0), (n, frame))
}
