//! A transformer decoder's ops in a [`Graph`](super::graph::Graph):
//! [`TokenOp`], run by the untiled executor's token ops.

use super::graph::{ConstId, ConvId, TensorId};

/// A transformer decoder's ops over channel-major tokens `[1, C, rows, w]`
/// (see [`crate::kernels::tokens`]: a latent grid's `T·h·w` tokens first,
/// then extra ones, then padding to whole rows). `grid` is the latent
/// `[T, C, h, w]` whose frame tokens they are, read for its shape only.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TokenOp {
    /// Frames `x` to tokens, with room for `extra` more after the grid's
    /// (zeroed) into a new tensor.
    From { x: TensorId, extra: usize },
    /// The tokens after the grid's set in place (consumes `x`): the
    /// constants `reg` (`[R, C]`), then zeros (a zero token, padding).
    Registers {
        x: TensorId,
        grid: TensorId,
        reg: ConstId,
    },
    /// The grid's 3-axis RoPE table (`half / 3` frequencies of base
    /// `theta` per axis, see [`crate::kernels::tokens::rope_table`]) into a
    /// new tensor, made once for every attention of a pass.
    Rope {
        grid: TensorId,
        half: usize,
        theta: f32,
    },
    /// Multi-head self-attention over the grid's and `extra` tokens
    /// (padding excluded): q, k, v 1×1 convs of `normed`, q and k
    /// RMS-normed per head (`eps`, the constant `ones` as gamma) and rotated
    /// (RoPE on `2·half` channels of each head from the table `rope`), the
    /// `out` projection added into `x` (consumed).
    Attention {
        x: TensorId,
        normed: TensorId,
        grid: TensorId,
        rope: TensorId,
        qkvo: [ConvId; 4],
        heads: usize,
        extra: usize,
        qk_norm: (ConstId, f32),
        half: usize,
    },
    /// SwiGLU: the first half of `x`'s channels times SiLU of the second,
    /// into a new tensor.
    Glu { x: TensorId },
    /// The grid's tokens back to frames, each token's channels unpacked in
    /// `(c, dt, dy, dx)` order into `channels` × `ft` frames × `f`² pixels:
    /// `[T·ft, channels, h·f, w·f]`.
    Unpatchify {
        x: TensorId,
        grid: TensorId,
        channels: usize,
        ft: usize,
        f: usize,
    },
    /// One clip of a clip-chunked video decode (MiniMax-H3): of `x`'s
    /// frames, `[skip, split)` are the clip's (the first `fade` cross-faded
    /// with the previous clip's tail, kept in cache slot `slot`), and
    /// `[split + skip, ..)` the tail the next clip fades from. The video's
    /// last clip (the executor's state says so) appends its tail instead,
    /// less the frames made from padding.
    Clip {
        x: TensorId,
        slot: usize,
        split: usize,
        skip: usize,
        fade: usize,
    },
}
