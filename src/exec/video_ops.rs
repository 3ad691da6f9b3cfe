//! The video graph ops both executors run whole (on a tile window or on
//! the whole latent-size activation): LTX-2's non-causal time convs and
//! HunyuanVideo 1.5's block-causal attention.

use super::untiled::{frame_of, frame_rows};
use crate::error::Result;
use crate::gpu::Recorder;
use crate::kernels::conv2d::{conv2d_frames, Conv2dOptions, Conv2dWeights, Frames};
use crate::kernels::tensor_ops::copy_window;
use crate::models::layers::{conv_add, conv_as, dims4};
use crate::tensor::{DType, Tensor};

/// A non-causal time conv (LTX-2: [`CausalWeights::centered`]) of frames
/// `x0..x0 + count` of `x`, the whole clip, into `y`: tap `j` of `kt` reads
/// frame `t + j − kt/2` clamped to the clip (its first and last frames
/// repeated beyond its ends). The first tap writes `y` unless `added` (then
/// every tap adds into it).
pub(crate) fn centered_conv(
    rec: &mut Recorder,
    (x, x0): (&Tensor, usize),
    taps: &[Conv2dWeights],
    (y, added): (&Tensor, bool),
    count: usize,
    opts: &Conv2dOptions,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let half = taps.len() / 2;
    // The last tap (with the bias) first.
    for (i, (j, tap)) in taps.iter().enumerate().rev().enumerate() {
        let res = (added || i > 0).then_some(y);
        let d = j as isize - half as isize;
        let lo = (-d).max(0) as usize;
        let hi = (count as isize - d).clamp(0, count as isize) as usize;
        let mut run = |in_frame: usize, out_frame: usize, n: usize| {
            let f = Frames {
                in_frame,
                out_frame,
                count: n,
            };
            conv2d_frames(rec, x, tap, res, y, opts, f)
        };
        if hi > lo {
            run((x0 as isize + lo as isize + d) as usize, lo, hi - lo)?;
        }
        for t in (0..lo.min(count)).chain(hi.max(lo)..count) {
            let src = if t < lo { x0 } else { x0 + count - 1 };
            run(src, t, 1)?;
        }
    }
    Ok(())
}

/// Block-causal single-head attention over a video's frames (see
/// [`Op::FrameAttention`]): q, k, v are 1×1 convs of `normed` in f32; this
/// chunk's keys and values join `kv` (the earlier frames'), and each frame's
/// queries attend every frame up to their own, one key frame per block of
/// the flash kernel (its online-softmax state carried between blocks); the
/// output projection is added onto `x` in place.
pub(crate) fn causal_attention(
    rec: &mut Recorder,
    x: Tensor,
    normed: &Tensor,
    [q, k, v, out]: [&Conv2dWeights; 4],
    kv: &mut Vec<(Tensor, Tensor)>,
) -> Result<Tensor> {
    use crate::kernels::attention::{
        flash_attention_block, state_len, AttentionProblem, BlockRole, KvInput, Strides,
    };
    let [n, c, h, w] = dims4(&x)?;
    let same1 = Conv2dOptions::same(1);
    let f32 = DType::F32;
    let q = conv_as(rec, normed, q, None, &same1, f32)?;
    let k = conv_as(rec, normed, k, None, &same1, f32)?;
    let v = conv_as(rec, normed, v, None, &same1, f32)?;
    let prior = kv.len();
    for f in 0..n {
        kv.push((frame_of(rec, &k, f)?, frame_of(rec, &v, f)?));
    }
    drop((k, v));
    let hw = h * w;
    // One frame [1, C, hw]: channel-major tokens.
    let strides = Strides {
        batch: c * hw,
        head: c * hw,
        token: 1,
        channel: hw,
    };
    let mut prob = AttentionProblem::self_attention(1, 1, hw, c, strides, 1.0 / (c as f32).sqrt());
    prob.kv_strides = strides;
    let stats = Tensor::empty(
        rec.ctx(),
        &[state_len(&prob, false, rec.ctx().caps()).max(1)],
        f32,
        "attention stats",
    )?;
    let o = Tensor::empty(rec.ctx(), &[n, c, h, w], f32, "attention out")?;
    let (o_rows, frame) = frame_rows(&o)?;
    for f in 0..n {
        let qf = frame_of(rec, &q, f)?;
        let of = Tensor::empty(rec.ctx(), &[1, c, h, w], f32, "attention frame out")?;
        let last = prior + f;
        for (j, (kj, vj)) in kv.iter().take(last + 1).enumerate() {
            let role = BlockRole {
                first: j == 0,
                last: j == last,
            };
            let kvin = KvInput::F32 { k: kj, v: vj };
            flash_attention_block(rec, &prob, &qf, kvin, &of, Some(&stats), role)?;
        }
        let (of_rows, _) = frame_rows(&of)?;
        copy_window(rec, &of_rows, (0, 0), &o_rows, (f, 0), (1, frame))?;
    }
    drop(q);
    conv_add(rec, &o, out, None, x, &same1)
}
