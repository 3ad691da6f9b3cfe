//! A model as data: its layers as a list of ops over tensor ids, built once
//! at load from the weights (which the graph then owns). Executors read it:
//! [`crate::exec::untiled`] records it whole (golden taps included; fast
//! tiles run it per tile), [`crate::exec::exact`] runs it tile by tile.
//!
//! Each tensor has a producer and a last use; an executor frees a tensor
//! right after the op that uses it last ([`Graph::frees`]), newest first.
//! Ops that update a tensor in place (a residual add, a map, the attention's
//! output projection) *consume* it: its storage becomes the op's output.
//! Where the hand-written executors kept a tensor alive longer (a scope end,
//! a shadowed binding), the builder *holds* it, per [`Mode`] (held tensors
//! are freed after those whose last use the op is), so that every
//! executor allocates and frees exactly as before and memory plans stay
//! byte-identical. The exact executor's GroupNorm look-ahead (which
//! statistics a conv gathers while producing its output) is derived from
//! the graph: the [`Op::Stats`] that reads the conv's output
//! ([`Graph::stats_of`]).
//!
//! # Causal video decoders
//! A video decoder's graph runs on one video at a time with time as the
//! batch dimension. [`Op::TimeShift`] gives each frame its predecessor (the
//! first frame gets the cache slot's frame: zeros at a clip's start, the
//! last frame of the previous chunk when streaming), and
//! [`Op::TimeGrow`] turns `s·C` channels into `s` frames (a free view).
//! Cache slots live in the executor's state between calls
//! ([`crate::exec::untiled::VideoState`]), not in the graph's lifetimes.

use crate::error::{Error, Result};
use crate::kernels::conv2d::{Conv2dOptions, Conv2dWeights};
use crate::kernels::dup_up::shuffled_channels;
use crate::kernels::elementwise::Unary;
use crate::kernels::image::ImageRange;
use crate::kernels::rms_norm::NormKind;
use crate::kernels::Activation;
use crate::models::layers::Norm;

/// A tensor of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TensorId(pub(crate) usize);

/// A conv's weights in the graph's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvId(usize);

/// A GroupNorm's parameters in the graph's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NormId(usize);

/// A causal video conv's weights in the graph's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CausalId(usize);

/// An RMS norm's gamma (`√C` folded in, f32 `[C]`) in the graph's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RmsId(usize);

/// A constant tensor in the graph's table (a transformer's register tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConstId(usize);

pub(crate) use super::token_graph::TokenOp;

/// A causal conv over time: `taps[j]` is the 2-D conv of the frame
/// `kt − 1 − j` steps back (`kt = taps.len()`; only the last tap, the
/// current frame's, has the bias). The `kt − 1` frames before a chunk come
/// from the executor's cache slot (zeros at a video's start).
pub(crate) struct CausalWeights {
    pub taps: Vec<Conv2dWeights>,
    /// Replicate padding in space (HunyuanVideo 1.5): the edge pixel.
    pub replicate: bool,
    /// A video's first frame repeated before it in time instead of zero
    /// frames (HunyuanVideo 1.5, a causal LTX-2 decoder).
    pub repeat_first: bool,
    /// Reflect padding in space (LTX-2's decoder).
    pub reflect: bool,
    /// Not causal (LTX-2's decoder): the taps are centred on the frame, the
    /// clip's first and last frames repeated beyond its ends. No cache: a
    /// whole clip is one chunk.
    pub centered: bool,
}

/// Which executor a lifetime is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// [`crate::exec::untiled`].
    Untiled = 0,
    /// [`crate::exec::exact`].
    Exact = 1,
}

/// Both modes.
pub(crate) const BOTH: &[Mode] = &[Mode::Untiled, Mode::Exact];

/// Whole-image geometry of a conv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Geometry {
    /// Stride 1, padding `k / 2`.
    Same,
    /// Nearest 2× upsample fused into a 3×3 conv.
    Upsample,
    /// Stride 2 over the input zero-padded (top, left, bottom, right).
    Down([u32; 4]),
}

impl Geometry {
    /// The conv options of the whole-image conv with kernel `k`.
    pub(crate) fn options(self, k: usize) -> Conv2dOptions {
        match self {
            Geometry::Same => Conv2dOptions::same(k as u32),
            Geometry::Upsample => Conv2dOptions {
                upsample: true,
                replicate: false,
                reflect: false,
                ..Conv2dOptions::same(3)
            },
            Geometry::Down(pad) => Conv2dOptions {
                stride: 2,
                pad,
                replicate: false,
                reflect: false,
                upsample: false,
            },
        }
    }
}

/// The residual operand of a conv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Residual {
    /// None.
    None,
    /// Added in place into this tensor (consumed: it becomes the output).
    InPlace(TensorId),
    /// A 1×1 conv of this tensor (a ResnetBlock2D's shortcut).
    Shortcut(TensorId, ConvId),
}

/// A conv with its prologue (GroupNorm affine + activation on load),
/// geometry, residual add and epilogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Conv {
    pub x: TensorId,
    pub w: ConvId,
    /// Affine `[N, Cin, 2]` (a [`Op::Stats`] or [`Op::Identity`]) and activation.
    pub prologue: Option<(TensorId, Activation)>,
    pub geometry: Geometry,
    pub residual: Residual,
    /// Applied to the output after the residual add.
    pub epilogue: Option<Unary>,
}

/// One op; each produces at most one tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    /// Identity affine `[N, channels, 2]` (prologues that only activate).
    Identity { channels: usize },
    /// `f` on every element, in place (consumes `x`).
    Map { x: TensorId, f: Unary },
    /// A convolution.
    Conv(Conv),
    /// A GroupNorm's statistics over `x` as affine coefficients `[N, C, 2]`.
    Stats { x: TensorId, norm: NormId },
    /// The mid-block attention: q/k/v 1×1 convs on `x` with `affine`
    /// applied, one head over all tokens, `out` projection added into `x`
    /// (consumed).
    Attention {
        x: TensorId,
        affine: TensorId,
        q: ConvId,
        k: ConvId,
        v: ConvId,
        out: ConvId,
    },
    /// `x` [T, C, H, W] shifted one frame later in time: frame 0 is cache
    /// slot `cache`'s frame, which then becomes frame T − 1 of `x`.
    TimeShift { x: TensorId, cache: usize },
    /// `x` [T, s·C, H, W] viewed as [T·s, C, H, W] (consumes `x`).
    TimeGrow { x: TensorId, stride: usize },
    /// `x` [T·s, C, H, W] viewed as [T, s·C, H, W] (consumes `x`): frames
    /// `s·t … s·t + s − 1` side by side on channels, as TAEHV's TPool
    /// reshapes them before its 1×1 conv (a free view, no copy).
    TimePool { x: TensorId, stride: usize },
    /// RMS norm over channels per position (SiLU after when `silu`) into a
    /// new tensor.
    RmsNorm {
        x: TensorId,
        norm: RmsId,
        silu: bool,
    },
    /// Causal conv over time of `x` [T, C, H, W] (time as the batch), the
    /// frames before from cache slot `cache`, which then keeps the last
    /// `kt − 1` frames; `residual` added (an in-place one is consumed).
    CausalConv {
        x: TensorId,
        w: CausalId,
        cache: usize,
        residual: Residual,
    },
    /// Wan's `upsample3d` Resample: a causal time conv to 2·C channels, read
    /// as 2 frames per frame, then the nearest-2× up-sample and 3×3 conv
    /// `up` per frame. A video's first frame skips the time conv (diffusers'
    /// `"Rep"` cache entry); its cache slot starts at zeros after it.
    /// `residual` (a residual up block's [`Op::DupUp`] shortcut) is added
    /// to the output in place (consumed).
    TimeUpsample {
        x: TensorId,
        w: CausalId,
        cache: usize,
        up: ConvId,
        residual: Option<TensorId>,
    },
    /// The channel-to-space shortcut of a residual Wan up block into a new
    /// tensor `[N', channels, 2H, 2W]` (diffusers' `DupUp3D`; see
    /// [`crate::kernels::dup_up`]); `ft` its time factor. `first_of`: in a
    /// video graph, the cache slot of the block's [`Op::TimeUpsample`]:
    /// while it is empty, the chunk starts the video and its first frame
    /// gives one frame (the last sub-frame), every other `ft`, as the time
    /// up-sample does (the slot is marked started once the op has run,
    /// for ops whose slot holds no cache). `None`: every frame is a first
    /// chunk (an image).
    DupUp {
        x: TensorId,
        channels: usize,
        ft: usize,
        first_of: Option<usize>,
        /// Which source channel each output channel reads (DupUp3D's,
        /// HunyuanVideo 1.5's DCAE, LTX-2's tiled).
        order: crate::kernels::dup_up::Order,
        /// Added to the output in place (consumed; untiled only).
        residual: Option<TensorId>,
    },
    /// PyTorch's `pixel_shuffle` of `x` `[T, C·f², H, W]` into a new tensor
    /// `[T, C, H·f, W·f]` (a patch-size-f TAEHV decoder's output).
    PixelShuffle { x: TensorId, factor: usize },
    /// PyTorch's `pixel_unshuffle` of `x` `[T, C, H·f, W·f]` into a new
    /// tensor `[T, C·f², H, W]` (a patch-size-f TAEHV encoder's input).
    PixelUnshuffle { x: TensorId, factor: usize },
    /// Per-frame single-head self-attention over all tokens: q/k/v 1×1 convs
    /// of `normed`, `out` projection added into `x` (consumed). `causal`:
    /// block-causal over the video instead (HunyuanVideo 1.5's mid block:
    /// a frame's tokens see every token of its own and earlier frames), the
    /// earlier chunks' keys and values kept in cache slot `causal`.
    FrameAttention {
        x: TensorId,
        normed: TensorId,
        q: ConvId,
        k: ConvId,
        v: ConvId,
        out: ConvId,
        causal: Option<usize>,
    },
    /// A transformer decoder's token op.
    Tokens(TokenOp),
    /// A golden-check copy of `x` (with `affine` + activation applied when
    /// given); untiled only, not a use.
    Tap {
        x: TensorId,
        name: String,
        activated: Option<(TensorId, Activation)>,
    },
}

impl Op {
    /// [`Op::DupUp`] and [`Op::PixelShuffle`] of an input of `c` channels as
    /// channels to space: the output channels and the (time, space) factors
    /// of [`crate::kernels::dup_up::to_space`].
    pub(crate) fn space_factors(&self, c: usize) -> Result<(usize, (usize, usize))> {
        match self {
            Op::DupUp { channels, ft, .. } => Ok((*channels, (*ft, 2))),
            Op::PixelShuffle { factor, .. } => Ok((shuffled_channels(c, *factor)?, (1, *factor))),
            op => Err(Error::Internal(format!("{op:?} is not channels to space"))),
        }
    }

    /// The channel order of an [`Op::DupUp`] (a pixel shuffle's is
    /// [`crate::kernels::dup_up::Order::Interleave`]).
    pub(crate) fn order(&self) -> crate::kernels::dup_up::Order {
        match self {
            Op::DupUp { order, .. } => *order,
            _ => crate::kernels::dup_up::Order::Interleave,
        }
    }
}

/// A model's layers, weights included.
pub(crate) struct Graph {
    ops: Vec<Op>,
    /// Output of each op.
    outs: Vec<Option<TensorId>>,
    convs: Vec<Conv2dWeights>,
    norms: Vec<Norm>,
    causal: Vec<CausalWeights>,
    rms: Vec<(crate::tensor::Tensor, NormKind)>,
    consts: Vec<crate::tensor::Tensor>,
    input: TensorId,
    output: TensorId,
    image: Option<ImageRange>,
    /// Per mode, per op: tensors to free after it, in order.
    frees: [Vec<Vec<TensorId>>; 2],
    /// Per tensor: the [`Op::Stats`] reading it.
    stats_of: Vec<Option<usize>>,
}

impl Graph {
    pub(crate) fn ops(&self) -> &[Op] {
        &self.ops
    }
    /// The tensor op `i` produces.
    pub(crate) fn out(&self, i: usize) -> Option<TensorId> {
        self.outs[i]
    }
    pub(crate) fn tensors(&self) -> usize {
        self.stats_of.len()
    }
    pub(crate) fn input(&self) -> TensorId {
        self.input
    }
    pub(crate) fn output(&self) -> TensorId {
        self.output
    }
    /// How the output maps to pixels (decoders); `None`: a plain tensor.
    pub(crate) fn image(&self) -> Option<ImageRange> {
        self.image
    }
    pub(crate) fn conv(&self, w: ConvId) -> &Conv2dWeights {
        &self.convs[w.0]
    }
    /// The storage dtype of its weights (its first convolution's; f32
    /// for a graph without one).
    pub(crate) fn weights_dtype(&self) -> crate::tensor::DType {
        let causal = self.causal.iter().flat_map(|c| c.taps.iter());
        self.convs
            .iter()
            .chain(causal)
            .map(|w| w.dtype())
            .next()
            .unwrap_or(crate::tensor::DType::F32)
    }
    /// The cooperative-matrix configuration the convolutions run on (`8x8x8 f16->f32`),
    /// `None` when they all take the scalar path.
    pub(crate) fn matrix_config(&self) -> Option<String> {
        let causal = self.causal.iter().flat_map(|c| c.taps.iter());
        self.convs
            .iter()
            .chain(causal)
            .find_map(|w| w.tiles().matrix_name())
    }
    pub(crate) fn norm(&self, n: NormId) -> &Norm {
        &self.norms[n.0]
    }
    /// True unless a time conv is centred (LTX-2): then a frame depends on
    /// later ones and the graph runs a clip's frames together.
    pub(crate) fn is_causal(&self) -> bool {
        !self.causal.iter().any(|w| w.centered)
    }

    pub(crate) fn causal(&self, w: CausalId) -> &CausalWeights {
        &self.causal[w.0]
    }
    pub(crate) fn rms(&self, n: RmsId) -> &crate::tensor::Tensor {
        &self.rms[n.0].0
    }
    /// Which norm an [`Op::RmsNorm`] is.
    pub(crate) fn rms_kind(&self, n: RmsId) -> NormKind {
        self.rms[n.0].1
    }
    pub(crate) fn constant(&self, c: ConstId) -> &crate::tensor::Tensor {
        &self.consts[c.0]
    }
    /// Tensors to free after op `i` in `mode`, in order.
    pub(crate) fn frees(&self, mode: Mode, i: usize) -> &[TensorId] {
        &self.frees[mode as usize][i]
    }
    /// Bytes the exact tiled executor holds parked (on the device or the
    /// host) at the end of the largest conv: its whole input and output
    /// activations, for `n` latents of `(h, w)`. A floor: shapes are
    /// followed only through convs, maps, up-samples and attention, and the
    /// caller's input (not parked) is not counted.
    pub(crate) fn parked_floor(&self, n: usize, (h, w): (usize, usize)) -> u64 {
        use crate::gpu::tensor::{DType, Tensor};
        // Per tensor: (channels, h, w, dtype) where known.
        let mut shapes: Vec<Option<(usize, usize, usize, DType)>> = vec![None; self.tensors()];
        shapes[self.input.0] = Some((0, h, w, DType::F32));
        let bytes = |s: (usize, usize, usize, DType)| Tensor::bytes_for(&[n, s.0, s.1, s.2], s.3);
        let mut floor = 0u64;
        for (i, op) in self.ops.iter().enumerate() {
            let Some(out) = self.outs[i] else { continue };
            let shape = match op {
                Op::Map { x, .. } => shapes[x.0],
                Op::DupUp { x, .. } | Op::PixelShuffle { x, .. } => {
                    shapes[x.0].and_then(|(c, h, w, d)| {
                        let (c, (_, f)) = op.space_factors(c).ok()?;
                        Some((c, f * h, f * w, d))
                    })
                }
                Op::Attention { x, out: o, .. } => {
                    let o = self.conv(*o);
                    shapes[x.0].map(|(_, h, w, _)| (o.cout(), h, w, o.dtype()))
                }
                Op::Conv(c) => {
                    let wt = self.conv(c.w);
                    shapes[c.x.0].map(|(_, h, w, _)| {
                        let (oh, ow) = crate::kernels::conv2d::output_size(
                            h,
                            w,
                            wt.k(),
                            &c.geometry.options(wt.k()),
                        );
                        if self.image.is_some() && out == self.output {
                            (1, oh, ow, DType::Rgba8)
                        } else {
                            (wt.cout(), oh, ow, wt.dtype())
                        }
                    })
                }
                _ => None,
            };
            if let (Op::Conv(c), Some(y)) = (op, shape) {
                if c.x != self.input {
                    if let Some(x) = shapes[c.x.0] {
                        floor = floor.max(bytes(x).saturating_add(bytes(y)));
                    }
                }
            }
            shapes[out.0] = shape;
        }
        floor
    }

    /// The GroupNorm whose statistics are taken over `t`, and the affine
    /// tensor they give (the look-ahead of the exact executor).
    pub(crate) fn stats_of(&self, t: TensorId) -> Option<(&Norm, TensorId)> {
        let i = self.stats_of[t.0]?;
        match &self.ops[i] {
            Op::Stats { norm, .. } => Some((self.norm(*norm), self.outs[i]?)),
            _ => None,
        }
    }
}

/// Builds a [`Graph`] op by op.
pub(crate) struct Builder {
    ops: Vec<Op>,
    outs: Vec<Option<TensorId>>,
    convs: Vec<Conv2dWeights>,
    norms: Vec<Norm>,
    causal: Vec<CausalWeights>,
    rms: Vec<(crate::tensor::Tensor, NormKind)>,
    consts: Vec<crate::tensor::Tensor>,
    /// Per tensor: the op producing it (`None`: the input).
    producer: Vec<Option<usize>>,
    last_use: Vec<Option<usize>>,
    held: [Vec<Option<usize>>; 2],
    consumed: Vec<bool>,
}

impl Builder {
    /// A builder and the graph's input tensor.
    pub(crate) fn new() -> (Builder, TensorId) {
        let b = Builder {
            ops: Vec::new(),
            outs: Vec::new(),
            convs: Vec::new(),
            norms: Vec::new(),
            causal: Vec::new(),
            rms: Vec::new(),
            consts: Vec::new(),
            producer: vec![None],
            last_use: vec![None],
            held: [vec![None], vec![None]],
            consumed: vec![false],
        };
        (b, TensorId(0))
    }

    /// Moves conv weights into the graph.
    pub(crate) fn weights(&mut self, w: Conv2dWeights) -> ConvId {
        self.convs.push(w);
        ConvId(self.convs.len() - 1)
    }

    /// Moves a causal conv's weights into the graph.
    pub(crate) fn causal_weights(&mut self, w: CausalWeights) -> CausalId {
        self.causal.push(w);
        CausalId(self.causal.len() - 1)
    }

    /// Moves an RMS norm's gamma into the graph.
    pub(crate) fn rms_gamma(&mut self, g: crate::tensor::Tensor) -> RmsId {
        self.norm_gamma(g, NormKind::Wan)
    }

    /// Moves the gamma of a norm of `kind` into the graph.
    pub(crate) fn norm_gamma(&mut self, g: crate::tensor::Tensor, kind: NormKind) -> RmsId {
        self.rms.push((g, kind));
        RmsId(self.rms.len() - 1)
    }

    /// Moves a constant tensor into the graph.
    pub(crate) fn constant(&mut self, t: crate::tensor::Tensor) -> ConstId {
        self.consts.push(t);
        ConstId(self.consts.len() - 1)
    }

    /// A token op (see [`TokenOp`]).
    pub(crate) fn tokens(&mut self, op: TokenOp) -> TensorId {
        self.push(Op::Tokens(op), true)
    }

    /// RMS norm of `x` (then SiLU when `silu`).
    pub(crate) fn rms_norm(&mut self, x: TensorId, norm: RmsId, silu: bool) -> TensorId {
        self.push(Op::RmsNorm { x, norm, silu }, true)
    }

    /// A causal conv of `x` with cache slot `cache` (see [`Op::CausalConv`]).
    pub(crate) fn causal_conv(
        &mut self,
        x: TensorId,
        w: CausalId,
        cache: usize,
        residual: Residual,
    ) -> TensorId {
        self.push(
            Op::CausalConv {
                x,
                w,
                cache,
                residual,
            },
            true,
        )
    }

    /// Wan's `upsample3d` (see [`Op::TimeUpsample`]), `residual` added.
    pub(crate) fn time_upsample(
        &mut self,
        x: TensorId,
        (w, cache): (CausalId, usize),
        up: ConvId,
        residual: Option<TensorId>,
    ) -> TensorId {
        let op = Op::TimeUpsample {
            x,
            w,
            cache,
            up,
            residual,
        };
        self.push(op, true)
    }

    /// A residual up block's shortcut, `first_of` the block's time cache
    /// slot in a video graph, `None` in an image's (see [`Op::DupUp`]).
    pub(crate) fn dup_up_video(
        &mut self,
        x: TensorId,
        channels: usize,
        ft: usize,
        first_of: Option<usize>,
    ) -> TensorId {
        let op = Op::DupUp {
            x,
            channels,
            ft,
            first_of,
            order: crate::kernels::dup_up::Order::Interleave,
            residual: None,
        };
        self.push(op, true)
    }

    /// Channels to space of `x` into `channels` with time factor `ft` in
    /// `order` (HunyuanVideo 1.5's and LTX-2's up-samplers), `first_of` as
    /// [`Op::DupUp`]'s, added into `residual`.
    pub(crate) fn channels_to_space(
        &mut self,
        x: TensorId,
        (channels, ft): (usize, usize),
        order: crate::kernels::dup_up::Order,
        first_of: Option<usize>,
        residual: Option<TensorId>,
    ) -> TensorId {
        let op = Op::DupUp {
            x,
            channels,
            ft,
            first_of,
            order,
            residual,
        };
        self.push(op, true)
    }

    /// `x` pixel-unshuffled by `factor` (see [`Op::PixelUnshuffle`]).
    pub(crate) fn pixel_unshuffle(&mut self, x: TensorId, factor: usize) -> TensorId {
        self.push(Op::PixelUnshuffle { x, factor }, true)
    }

    /// `x` pixel-shuffled by `factor` (see [`Op::PixelShuffle`]).
    pub(crate) fn pixel_shuffle(&mut self, x: TensorId, factor: usize) -> TensorId {
        self.push(Op::PixelShuffle { x, factor }, true)
    }

    /// Per-frame attention (see [`Op::FrameAttention`]).
    pub(crate) fn frame_attention(&mut self, op: Op) -> TensorId {
        debug_assert!(matches!(op, Op::FrameAttention { .. }));
        self.push(op, true)
    }

    /// Moves a GroupNorm's parameters into the graph.
    pub(crate) fn norm(&mut self, n: Norm) -> NormId {
        self.norms.push(n);
        NormId(self.norms.len() - 1)
    }

    fn push(&mut self, op: Op, produces: bool) -> TensorId {
        let i = self.ops.len();
        let (uses, consumes): (Vec<TensorId>, Option<TensorId>) = match &op {
            Op::Identity { .. } | Op::Tap { .. } => (vec![], None),
            Op::Map { x, .. } => (vec![*x], Some(*x)),
            Op::Stats { x, .. } | Op::TimeShift { x, .. } => (vec![*x], None),
            Op::TimeGrow { x, .. } | Op::TimePool { x, .. } => (vec![*x], Some(*x)),
            Op::RmsNorm { x, .. } | Op::PixelShuffle { x, .. } | Op::PixelUnshuffle { x, .. } => {
                (vec![*x], None)
            }
            Op::DupUp { x, residual, .. } => match residual {
                Some(r) => (vec![*x, *r], Some(*r)),
                None => (vec![*x], None),
            },
            Op::TimeUpsample { x, residual, .. } => match residual {
                Some(r) => (vec![*x, *r], Some(*r)),
                None => (vec![*x], None),
            },
            Op::FrameAttention { x, normed, .. } => (vec![*x, *normed], Some(*x)),
            Op::CausalConv { x, residual, .. } => match residual {
                Residual::None => (vec![*x], None),
                Residual::InPlace(r) => (vec![*x, *r], Some(*r)),
                Residual::Shortcut(sc, _) => (vec![*x, *sc], None),
            },
            Op::Attention { x, affine, .. } => (vec![*x, *affine], Some(*x)),
            Op::Tokens(t) => match t {
                TokenOp::From { x, .. } | TokenOp::Glu { x } | TokenOp::Clip { x, .. } => {
                    (vec![*x], None)
                }
                TokenOp::Registers { x, grid, .. } => (vec![*x, *grid], Some(*x)),
                TokenOp::Rope { grid, .. } => (vec![*grid], None),
                TokenOp::Attention {
                    x,
                    normed,
                    grid,
                    rope,
                    ..
                } => (vec![*x, *normed, *grid, *rope], Some(*x)),
                TokenOp::Unpatchify { x, grid, .. } => (vec![*x, *grid], None),
            },
            Op::Conv(c) => {
                let mut u = vec![c.x];
                u.extend(c.prologue.map(|p| p.0));
                match c.residual {
                    Residual::None => (u, None),
                    Residual::InPlace(r) => {
                        u.push(r);
                        (u, Some(r))
                    }
                    Residual::Shortcut(s, _) => {
                        u.push(s);
                        (u, None)
                    }
                }
            }
        };
        for t in uses {
            debug_assert!(!self.consumed[t.0], "{t:?} used after an in-place op");
            self.last_use[t.0] = Some(i);
        }
        if let Some(t) = consumes {
            self.consumed[t.0] = true;
        }
        self.ops.push(op);
        let out = produces.then(|| {
            self.producer.push(Some(i));
            self.last_use.push(None);
            self.held[0].push(None);
            self.held[1].push(None);
            self.consumed.push(false);
            TensorId(self.producer.len() - 1)
        });
        self.outs.push(out);
        out.unwrap_or(TensorId(usize::MAX))
    }

    /// Identity affine `[N, channels, 2]`.
    pub(crate) fn identity(&mut self, channels: usize) -> TensorId {
        self.push(Op::Identity { channels }, true)
    }

    /// `f` in place on `x` (consumed).
    pub(crate) fn map(&mut self, x: TensorId, f: Unary) -> TensorId {
        self.push(Op::Map { x, f }, true)
    }

    /// A conv (see [`Conv`]).
    pub(crate) fn conv(&mut self, c: Conv) -> TensorId {
        self.push(Op::Conv(c), true)
    }

    /// A plain conv of `x`: no prologue, residual or epilogue.
    pub(crate) fn conv_plain(&mut self, x: TensorId, w: ConvId, geometry: Geometry) -> TensorId {
        self.conv(Conv::new(x, w, geometry))
    }

    /// `x` one frame later in time, frame 0 from cache slot `cache`.
    pub(crate) fn time_shift(&mut self, x: TensorId, cache: usize) -> TensorId {
        self.push(Op::TimeShift { x, cache }, true)
    }

    /// `x` [T, s·C, H, W] as [T·s, C, H, W] (consumed).
    pub(crate) fn time_grow(&mut self, x: TensorId, stride: usize) -> TensorId {
        self.push(Op::TimeGrow { x, stride }, true)
    }

    /// `x` [T·s, C, H, W] as [T, s·C, H, W] (consumed).
    pub(crate) fn time_pool(&mut self, x: TensorId, stride: usize) -> TensorId {
        self.push(Op::TimePool { x, stride }, true)
    }

    /// GroupNorm statistics of `x`.
    pub(crate) fn stats(&mut self, x: TensorId, norm: NormId) -> TensorId {
        self.push(Op::Stats { x, norm }, true)
    }

    /// The mid-block attention on `x` (consumed).
    pub(crate) fn attention(&mut self, op: Op) -> TensorId {
        debug_assert!(matches!(op, Op::Attention { .. }));
        self.push(op, true)
    }

    /// A golden-check tap of `x` (untiled executor with taps enabled).
    pub(crate) fn tap(&mut self, x: TensorId, name: String) {
        self.push(
            Op::Tap {
                x,
                name,
                activated: None,
            },
            false,
        );
    }

    /// A tap of `x` with `affine` and `act` applied.
    pub(crate) fn tap_activated(
        &mut self,
        x: TensorId,
        name: String,
        affine: TensorId,
        act: Activation,
    ) {
        self.push(
            Op::Tap {
                x,
                name,
                activated: Some((affine, act)),
            },
            false,
        );
    }

    /// Keeps `t` alive (in `modes`) until the last op pushed so far.
    pub(crate) fn hold(&mut self, t: TensorId, modes: &[Mode]) {
        let i = self.ops.len().checked_sub(1);
        for &m in modes {
            self.held[m as usize][t.0] = i;
        }
    }

    /// The graph with `output` (never freed); `image`: how a decoder's
    /// output maps to pixels.
    pub(crate) fn finish(self, output: TensorId, image: Option<ImageRange>) -> Graph {
        let n = self.ops.len();
        let tensors = self.producer.len();
        let mut frees: [Vec<Vec<TensorId>>; 2] = [vec![Vec::new(); n], vec![Vec::new(); n]];
        for (m, frees) in frees.iter_mut().enumerate() {
            // Tensors at their natural last use first, then held ones; newest first.
            let mut held: Vec<Vec<TensorId>> = vec![Vec::new(); n];
            for t in (0..tensors).rev() {
                if TensorId(t) == output || self.consumed[t] {
                    continue;
                }
                let natural = self.last_use[t].or(self.producer[t]);
                let Some(natural) = natural else { continue };
                match self.held[m][t] {
                    Some(h) if h >= natural => held[h].push(TensorId(t)),
                    _ => frees[natural].push(TensorId(t)),
                }
            }
            for (f, h) in frees.iter_mut().zip(held) {
                f.extend(h);
            }
        }
        let mut stats_of = vec![None; tensors];
        for (i, op) in self.ops.iter().enumerate() {
            if let Op::Stats { x, .. } = op {
                debug_assert!(stats_of[x.0].is_none(), "two GroupNorms over {x:?}");
                stats_of[x.0] = Some(i);
            }
        }
        Graph {
            ops: self.ops,
            outs: self.outs,
            convs: self.convs,
            norms: self.norms,
            causal: self.causal,
            rms: self.rms,
            consts: self.consts,
            input: TensorId(0),
            output,
            image,
            frees,
            stats_of,
        }
    }
}

impl Conv {
    /// A conv of `x` with `w`: no prologue, residual or epilogue.
    pub(crate) fn new(x: TensorId, w: ConvId, geometry: Geometry) -> Conv {
        Conv {
            x,
            w,
            prologue: None,
            geometry,
            residual: Residual::None,
            epilogue: None,
        }
    }
    /// With `affine` and `act` applied on load.
    pub(crate) fn prologue(mut self, affine: TensorId, act: Activation) -> Conv {
        self.prologue = Some((affine, act));
        self
    }
    /// With a residual add.
    pub(crate) fn residual(mut self, r: Residual) -> Conv {
        self.residual = r;
        self
    }
    /// With `f` applied to the output.
    pub(crate) fn epilogue(mut self, f: Unary) -> Conv {
        self.epilogue = Some(f);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Natural last uses free newest first, held tensors after them; consumed
    /// tensors and the output are never freed; the look-ahead finds the Stats.
    #[test]
    fn frees_follow_last_uses_and_holds() {
        let (mut b, x) = Builder::new();
        let r = b.identity(4);
        let h1 = b.map(x, Unary::Relu);
        let h2 = b.stats(h1, NormId(0));
        let y = b.map(h1, Unary::Silu);
        b.hold(r, &[Mode::Untiled]);
        let g = b.finish(y, None);
        assert!(g.frees(Mode::Untiled, 0).is_empty());
        assert_eq!(g.frees(Mode::Untiled, 2), &[h2]);
        assert_eq!(g.frees(Mode::Untiled, 3), &[r]);
        assert_eq!(g.frees(Mode::Exact, 0), &[r]);
        assert_eq!(g.frees(Mode::Exact, 2), &[h2]);
        assert!(g.frees(Mode::Exact, 3).is_empty());
        assert_eq!(g.stats_of[h1.0], Some(2));
        assert_eq!(g.stats_of[x.0], None);
    }
}
