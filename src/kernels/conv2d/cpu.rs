//! The CPU reference of the convolution.

use super::{output_size, Conv2dOptions};
use crate::kernels::Activation;

/// PyTorch's reflect padding of index `i` in `0..n` (pads below `n`).
fn reflect(i: i64, n: i64) -> i64 {
    let r = if i < 0 { -i } else { i };
    let r = if r >= n { 2 * (n - 1) - r } else { r };
    r.clamp(0, n - 1)
}

/// Plain CPU reference with the semantics of [`conv2d`](super::conv2d).
///
/// input `[N, Cin, H, W]` (`in_shape`), weight PyTorch `[Cout, Cin, k, k]`, bias `[Cout]`,
/// prologue `([N, Cin, 2] scale/shift, activation)`, residual `[N, Cout, Ho, Wo]`.
#[allow(clippy::too_many_arguments)]
pub fn cpu_conv2d(
    input: &[f32],
    in_shape: [usize; 4],
    weight: &[f32],
    cout: usize,
    k: usize,
    bias: Option<&[f32]>,
    prologue: Option<(&[f32], Activation)>,
    residual: Option<&[f32]>,
    opts: &Conv2dOptions,
) -> Vec<f32> {
    let [n, cin, h, w] = in_shape;
    let up = if opts.upsample { 2 } else { 1 };
    let (hu, wu) = (h * up, w * up);
    let (ho, wo) = output_size(h, w, k, opts);
    // Transformed (prologue) and upsampled input, so padding stays exactly zero.
    let mut xin = vec![0.0f32; n * cin * hu * wu];
    for b in 0..n {
        for c in 0..cin {
            let (scale, shift, act) = match prologue {
                Some((aff, act)) => (aff[(b * cin + c) * 2], aff[(b * cin + c) * 2 + 1], act),
                None => (1.0, 0.0, Activation::None),
            };
            for y in 0..hu {
                for xx in 0..wu {
                    let v = input[((b * cin + c) * h + y / up) * w + xx / up];
                    xin[((b * cin + c) * hu + y) * wu + xx] = act.apply(v * scale + shift);
                }
            }
        }
    }
    let s = opts.stride as i64;
    let (pt, pl) = (opts.pad[0] as i64, opts.pad[1] as i64);
    let mut out = vec![0.0f32; n * cout * ho * wo];
    for b in 0..n {
        for m in 0..cout {
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut acc = 0.0f64;
                    for c in 0..cin {
                        for ky in 0..k {
                            let iy = oy as i64 * s - pt + ky as i64;
                            let Some(iy) = padded_index(iy, hu, opts) else {
                                continue;
                            };
                            for kx in 0..k {
                                let ix = ox as i64 * s - pl + kx as i64;
                                let Some(ix) = padded_index(ix, wu, opts) else {
                                    continue;
                                };
                                let xv = xin[((b * cin + c) * hu + iy) * wu + ix];
                                acc += (weight[((m * cin + c) * k + ky) * k + kx] * xv) as f64;
                            }
                        }
                    }
                    let o = ((b * cout + m) * ho + oy) * wo + ox;
                    let mut v = acc as f32 + bias.map_or(0.0, |bv| bv[m]);
                    if let Some(r) = residual {
                        v += r[o];
                    }
                    out[o] = v;
                }
            }
        }
    }
    out
}

/// A tap's row or column `i` of `n` after the padding mode (replicate clamps, reflect
/// mirrors); `None` outside the frame (zero padding).
fn padded_index(i: i64, n: usize, opts: &Conv2dOptions) -> Option<usize> {
    let n = n as i64;
    let i = if opts.replicate {
        i.clamp(0, n - 1)
    } else if opts.reflect {
        reflect(i, n)
    } else {
        i
    };
    (0..n).contains(&i).then_some(i as usize)
}
