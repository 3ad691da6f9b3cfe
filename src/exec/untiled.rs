//! The untiled executor: a graph recorded whole into one [`Recorder`],
//! every tensor from the pool, freed after its last use.
//!
//! GroupNorm + activation are never materialised: a statistics kernel
//! produces per-channel affine coefficients and the following conv applies
//! them (and the activation) while loading its input. Residual adds happen
//! in the conv that produces the second operand, in place.

use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::kernels::attention::attention;
use crate::kernels::conv2d::{Conv2dOptions, Prologue};
use crate::kernels::elementwise::unary;
use crate::kernels::Activation;
use crate::models::graph::{Graph, Mode, Op, Residual, TensorId};
use crate::models::layers::{conv, conv_add, conv_as, dims4, identity_affine, Taps};
use crate::tensor::{DType, Tensor};

/// Records `graph` on `input`; returns its output (a decoder's raw image).
pub(crate) fn run(
    graph: &Graph,
    rec: &mut Recorder,
    input: Tensor,
    taps: &mut Taps,
) -> Result<Tensor> {
    let n = dims4(&input)?[0];
    let mut slots: Vec<Option<Tensor>> = (0..graph.tensors()).map(|_| None).collect();
    slots[graph.input().0] = Some(input);
    for (i, op) in graph.ops().iter().enumerate() {
        let out = match op {
            Op::Identity { channels } => Some(identity_affine(rec, n, *channels)?),
            Op::Map { x, f } => {
                let x = take(&mut slots, *x)?;
                unary(rec, *f, &x, &x)?;
                Some(x)
            }
            Op::Stats { x, norm } => Some(graph.norm(*norm).affine(rec, get(&slots, *x)?)?),
            Op::Conv(c) => {
                let w = graph.conv(c.w);
                let opts = c.geometry.options(w.k());
                let residual = match c.residual {
                    Residual::None => None,
                    Residual::InPlace(r) => Some(take(&mut slots, r)?),
                    Residual::Shortcut(s, sc) => Some(conv(
                        rec,
                        get(&slots, s)?,
                        graph.conv(sc),
                        None,
                        &Conv2dOptions::same(1),
                    )?),
                };
                let prologue = match c.prologue {
                    Some((a, act)) => Some(Prologue {
                        affine: get(&slots, a)?,
                        act,
                    }),
                    None => None,
                };
                let x = get(&slots, c.x)?;
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
                let x = take(&mut slots, *x)?;
                let a = get(&slots, *affine)?;
                let [n, c, h, w] = dims4(&x)?;
                let same1 = Conv2dOptions::same(1);
                let pro = || {
                    Some(Prologue {
                        affine: a,
                        act: Activation::None,
                    })
                };
                // The attention kernel reads f32 q, k, v (softmax inputs stay f32).
                let f32 = DType::F32;
                let q = conv_as(rec, &x, graph.conv(*q), pro(), &same1, f32)?;
                let k = conv_as(rec, &x, graph.conv(*k), pro(), &same1, f32)?;
                let v = conv_as(rec, &x, graph.conv(*v), pro(), &same1, f32)?;
                let o = Tensor::empty(rec.ctx(), &[n, c, h, w], DType::F32, "attention out")?;
                let tokens = [n, c, h * w];
                attention(
                    rec,
                    &q.reshape(&tokens)?,
                    &k.reshape(&tokens)?,
                    &v.reshape(&tokens)?,
                    1.0 / (c as f32).sqrt(),
                    &o.reshape(&tokens)?,
                )?;
                drop((q, k, v));
                Some(conv_add(rec, &o, graph.conv(*out), None, x, &same1)?)
            }
            Op::Tap { x, name, activated } => {
                let x = get(&slots, *x)?;
                match activated {
                    None => taps.tap(rec, name, x)?,
                    Some((a, act)) if taps.is_enabled() => {
                        // Never materialised in a normal run; built for the check.
                        let t = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), name)?;
                        let a = get(&slots, *a)?;
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
    }
    take(&mut slots, graph.output())
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
