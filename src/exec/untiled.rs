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
use crate::kernels::tensor_ops::copy_window;
use crate::kernels::Activation;
use crate::models::graph::{Graph, Mode, Op, Residual, TensorId};
use crate::models::layers::{conv, conv_add, conv_as, dims4, identity_affine, Taps};
use crate::tensor::{DType, Tensor};

/// The cache slots of a video graph's [`Op::TimeShift`]s, kept between
/// calls (chunks of one video): one frame `[1, C, H, W]` each, from the pool.
#[derive(Default)]
pub(crate) struct VideoState {
    caches: Vec<Option<Tensor>>,
}

impl VideoState {
    /// Cache tensors held.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.caches.iter().flatten()
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
    for (i, op) in graph.ops().iter().enumerate() {
        let out = match op {
            Op::Identity { channels } => Some(identity_affine(rec, n, *channels)?),
            Op::Map { x, f } => {
                let x = take(&mut slots, *x)?;
                unary(rec, *f, &x, &x)?;
                Some(x)
            }
            Op::Stats { x, norm } => Some(graph.norm(*norm).affine(rec, get(&slots, *x)?)?),
            Op::TimeShift { x, cache } => Some(time_shift(rec, get(&slots, *x)?, *cache, state)?),
            Op::TimeGrow { x, stride } => {
                let x = take(&mut slots, *x)?;
                let [t, c, h, w] = dims4(&x)?;
                if *stride == 0 || c % stride != 0 {
                    return Err(Error::Internal(format!(
                        "time stride {stride} does not divide {c} channels"
                    )));
                }
                Some(x.reshape(&[t * stride, c / stride, h, w])?)
            }
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
    if state.caches.len() <= slot {
        state.caches.resize_with(slot + 1, || None);
    }
    let cache = match state.caches[slot].take() {
        Some(k) if k.shape() == [1, c, h, w] && k.dtype() == x.dtype() => k,
        Some(k) => {
            return Err(Error::InvalidInput(format!(
                "a video chunk's frames are {c}×{h}×{w} ({}) at a cached layer that held {:?} from the previous chunk; every chunk of one video must have the same latent size",
                x.dtype().name(),
                k
            )))
        }
        None => {
            let k = Tensor::empty(rec.ctx(), &[1, c, h, w], x.dtype(), "time cache")?;
            rec.zero(&k, "clear::time_cache")?;
            k
        }
    };
    let past = Tensor::empty(rec.ctx(), x.shape(), x.dtype(), "previous frames")?;
    let rows = |v: &Tensor, n: usize| v.reshape(&[1, n, frame]);
    let (x3, past3, cache3) = (rows(x, t)?, rows(&past, t)?, rows(&cache, 1)?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::graph::Builder;
    use crate::testing::{dtype_contexts, rand_vec};

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
