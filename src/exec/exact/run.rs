//! A model graph tile by tile: each op becomes one executor layer; a conv
//! (or the attention) whose output a GroupNorm reads gathers that norm's
//! statistics while it produces the tiles ([`Graph::stats_of`]), so the
//! [`Op::Stats`] itself has nothing left to do.

use super::{Act, AttentionSpec, ConvSpec, Executor, Residual as ExResidual, VideoCaches};
use crate::error::{Error, Result};
use crate::models::graph::{Geometry, Graph, Mode, Op, Residual, TensorId};
use crate::models::layers::identity_affine;
use crate::tensor::Tensor;

/// A graph tensor in a tiled run: an activation, or a small whole tensor
/// (an affine).
enum Value {
    Act(Act),
    Whole(Tensor),
}

impl Executor {
    /// Runs `graph` on `input`; returns its output and, for a decoder
    /// (whose output becomes RGBA8 pixels) with `keep_raw`, the raw output.
    pub(crate) fn run_graph(
        &mut self,
        graph: &Graph,
        input: Act,
        keep_raw: bool,
    ) -> Result<(Act, Option<Act>)> {
        self.run_graph_with(graph, input, keep_raw, None)
    }

    /// [`Executor::run_graph`] with the time caches of a video graph's
    /// chunk (`None`: the graph has no time ops).
    pub(crate) fn run_graph_with(
        &mut self,
        graph: &Graph,
        input: Act,
        keep_raw: bool,
        mut caches: Option<&mut VideoCaches>,
    ) -> Result<(Act, Option<Act>)> {
        let n = input.n;
        let mut slots: Vec<Option<Value>> = (0..graph.tensors()).map(|_| None).collect();
        slots[graph.input().0] = Some(Value::Act(input));
        let mut result = None;
        for (i, op) in graph.ops().iter().enumerate() {
            let out = graph.out(i);
            let lookahead = out.and_then(|t| graph.stats_of(t));
            let (value, affine) = match op {
                Op::Identity { channels } => (
                    Some(Value::Whole(identity_affine(self.rec(), n, *channels)?)),
                    None,
                ),
                Op::Map { x, f } => {
                    let x = take_act(&mut slots, *x)?;
                    (Some(Value::Act(self.map(x, *f)?)), None)
                }
                Op::Stats { .. } => {
                    if out.is_some_and(|t| slots[t.0].is_none()) {
                        return Err(Error::Internal(
                            "GroupNorm over a tensor no tiled layer produced".into(),
                        ));
                    }
                    (None, None)
                }
                Op::Tap { .. } => (None, None),
                Op::TimeShift { x, cache } => {
                    let caches = video_caches(&mut caches)?;
                    let y = self.time_shift(act(&slots, *x)?, *cache, caches)?;
                    (Some(Value::Act(y)), None)
                }
                Op::TimeGrow { x, stride } => {
                    let x = take_act(&mut slots, *x)?;
                    (Some(Value::Act(self.time_grow(x, *stride)?)), None)
                }
                Op::Tokens(_) => {
                    return Err(Error::Unsupported(
                        "exact tiles of a transformer decoder (MiniMax-H3): every token attends to every other, so a tile's pixels depend on the whole frame; it decodes untiled".into(),
                    ))
                }
                Op::RmsNorm { x, norm, silu } => {
                    let gamma = (graph.rms(*norm), graph.rms_kind(*norm));
                    let y = self.rms_norm(act(&slots, *x)?, gamma, *silu)?;
                    (Some(Value::Act(y)), None)
                }
                Op::CausalConv {
                    x,
                    w,
                    cache,
                    residual,
                } => {
                    let caches = video_caches(&mut caches)?;
                    let taken = match residual {
                        Residual::InPlace(r) => Some(take_act(&mut slots, *r)?),
                        _ => None,
                    };
                    let res = match (*residual, taken) {
                        (Residual::Shortcut(s, sc), _) => {
                            ExResidual::Shortcut(act(&slots, s)?, graph.conv(sc))
                        }
                        (_, Some(r)) => ExResidual::Take(r),
                        _ => ExResidual::None,
                    };
                    let x = act(&slots, *x)?;
                    let t = x.n;
                    let y = self.causal_conv(x, (0, t), graph.causal(*w), res, *cache, caches)?;
                    (Some(Value::Act(y)), None)
                }
                Op::TimePool { .. } | Op::PixelUnshuffle { .. } => {
                    return Err(Error::Unsupported(
                        "exact tiles of a video encoder (its time pooling runs untiled only)"
                            .into(),
                    ))
                }
                Op::TimeUpsample {
                    x,
                    w,
                    cache,
                    up,
                    residual,
                } => {
                    let caches = video_caches(&mut caches)?;
                    let res = match residual {
                        Some(r) => ExResidual::Take(take_act(&mut slots, *r)?),
                        None => ExResidual::None,
                    };
                    let x = act(&slots, *x)?;
                    let (w, up) = (graph.causal(*w), graph.conv(*up));
                    let y = self.time_upsample(x, (w, up), res, *cache, caches)?;
                    (Some(Value::Act(y)), None)
                }
                Op::DupUp { x, .. } | Op::PixelShuffle { x, .. } => {
                    if lookahead.is_some() {
                        return Err(Error::Unsupported(
                            "GroupNorm statistics over a DupUp shortcut or a pixel shuffle".into(),
                        ));
                    }
                    let residual = match op {
                        Op::DupUp {
                            residual: Some(r), ..
                        } => Some(take_act(&mut slots, *r)?),
                        _ => None,
                    };
                    let x = act(&slots, *x)?;
                    let lead = match op {
                        Op::DupUp {
                            first_of: Some(slot),
                            ..
                        } => {
                            let caches = video_caches(&mut caches)?;
                            let started = caches.has(*slot) || caches.marked(*slot);
                            caches.mark(*slot);
                            usize::from(!started)
                        }
                        _ => x.n,
                    };
                    let (channels, factors) = op.space_factors(x.c)?;
                    let map = (lead, op.order());
                    let y = self.channels_to_space(x, channels, factors, map, residual)?;
                    (Some(Value::Act(y)), None)
                }
                Op::FrameAttention {
                    x,
                    normed,
                    q,
                    k,
                    v,
                    out: o,
                    causal: Some(slot),
                } => {
                    let caches = video_caches(&mut caches)?;
                    let x = take_act(&mut slots, *x)?;
                    let convs = [*q, *k, *v, *o].map(|id| graph.conv(id));
                    let normed = act(&slots, *normed)?;
                    let y = self.causal_attention(x, normed, convs, *slot, caches)?;
                    (Some(Value::Act(y)), None)
                }
                Op::FrameAttention {
                    x,
                    normed,
                    q,
                    k,
                    v,
                    out: o,
                    causal: None,
                } => {
                    let x = take_act(&mut slots, *x)?;
                    let spec = AttentionSpec {
                        q: graph.conv(*q),
                        k: graph.conv(*k),
                        v: graph.conv(*v),
                        out: graph.conv(*o),
                        affine: None,
                        source: Some(act(&slots, *normed)?),
                        stats: lookahead.map(|l| l.0),
                    };
                    let (y, a) = self.attention(x, spec)?;
                    (Some(Value::Act(y)), a)
                }
                Op::Attention {
                    x,
                    affine,
                    q,
                    k,
                    v,
                    out: o,
                } => {
                    let x = take_act(&mut slots, *x)?;
                    let spec = AttentionSpec {
                        q: graph.conv(*q),
                        k: graph.conv(*k),
                        v: graph.conv(*v),
                        out: graph.conv(*o),
                        affine: Some(whole(&slots, *affine)?),
                        source: None,
                        stats: lookahead.map(|l| l.0),
                    };
                    let (y, a) = self.attention(x, spec)?;
                    (Some(Value::Act(y)), a)
                }
                Op::Conv(c) => {
                    let residual = match c.residual {
                        Residual::InPlace(r) => Some(take_act(&mut slots, r)?),
                        _ => None,
                    };
                    let mut spec = ConvSpec::new(graph.conv(c.w)).stats(lookahead.map(|l| l.0));
                    spec = match c.geometry {
                        Geometry::Same => spec,
                        Geometry::Upsample => spec.upsample(),
                        Geometry::Down(pad) => spec.downsample(pad),
                    };
                    if let Some((a, act)) = c.prologue {
                        spec = spec.prologue(whole(&slots, a)?, act);
                    }
                    if let Some(f) = c.epilogue {
                        spec = spec.epilogue(f);
                    }
                    let x = act(&slots, c.x)?;
                    match (graph.image(), out == Some(graph.output())) {
                        (Some(range), true) => {
                            result = Some(self.conv_to_image(x, spec, range, keep_raw)?);
                            (None, None)
                        }
                        _ => {
                            let res = match (c.residual, residual) {
                                (Residual::Shortcut(s, sc), _) => {
                                    ExResidual::Shortcut(act(&slots, s)?, graph.conv(sc))
                                }
                                (_, Some(r)) => ExResidual::Take(r),
                                _ => ExResidual::None,
                            };
                            let (y, a) = self.conv(x, spec, res)?;
                            (Some(Value::Act(y)), a)
                        }
                    }
                }
            };
            if let (Some(v), Some(t)) = (value, out) {
                slots[t.0] = Some(v);
            }
            if let Some((_, t)) = lookahead {
                let a = affine.ok_or_else(|| {
                    Error::Internal("tiled layer without its GroupNorm statistics".into())
                })?;
                slots[t.0] = Some(Value::Whole(a));
            }
            for t in graph.frees(Mode::Exact, i) {
                slots[t.0] = None;
            }
        }
        match result {
            Some(r) => Ok(r),
            None => Ok((take_act(&mut slots, graph.output())?, None)),
        }
    }
}

/// The caches a video op needs (an error for a graph run without them).
fn video_caches<'c>(caches: &'c mut Option<&mut VideoCaches>) -> Result<&'c mut VideoCaches> {
    caches.as_deref_mut().ok_or_else(|| {
        Error::Internal("a video graph's time op in a tiled run without time caches".into())
    })
}

fn missing(t: TensorId) -> Error {
    Error::Internal(format!(
        "tiled graph read {t:?} before it was computed or after it was freed"
    ))
}

fn act(slots: &[Option<Value>], t: TensorId) -> Result<&Act> {
    match &slots[t.0] {
        Some(Value::Act(a)) => Ok(a),
        _ => Err(missing(t)),
    }
}

fn whole(slots: &[Option<Value>], t: TensorId) -> Result<&Tensor> {
    match &slots[t.0] {
        Some(Value::Whole(w)) => Ok(w),
        _ => Err(missing(t)),
    }
}

fn take_act(slots: &mut [Option<Value>], t: TensorId) -> Result<Act> {
    match slots[t.0].take() {
        Some(Value::Act(a)) => Ok(a),
        _ => Err(missing(t)),
    }
}
