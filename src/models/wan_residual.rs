//! The residual Wan decoder (diffusers' `is_residual` path): Wan 2.2's
//! video VAE as a causal video graph, and on one frame (Qwen-Image 2.1's
//! `AutoencoderKLQwenImage21`) as an image graph every image executor runs.
//!
//! Versus Wan 2.1 ([`crate::models::wan`]): each up block keeps its input's
//! width (no halving), its `Resample` keeps the block's width, and a
//! `DupUp3D` shortcut of the block's input (channels to space, the last
//! sub-frame of a first chunk: [`crate::kernels::dup_up`]) is added to the
//! up-sampled output. The shortcut is computed before the block's residual
//! blocks (the first adds into the block input in place), so it is held at
//! the up-sampled resolution meanwhile. On a first frame the time conv of `upsample3d` is
//! skipped (diffusers' `"Rep"` cache entry), so the one-frame graph's causal
//! convs are their current-frame taps (planar weights `[cout, cin, k, k]`,
//! Qwen-Image 2.1). The video graph runs time as the batch, as Wan 2.1's
//! ([`crate::models::wan`]): the shortcut of a video's first chunk keeps
//! its last sub-frame, every later frame gives two, as `upsample3d` does.
//! Its output is `patch_size`² pixels per position in diffusers' unpatchify
//! order; `conv_out`'s channels are permuted at load so that a pixel
//! shuffle unpacks them, then clamped to [−1, 1] as diffusers does.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::kernels::elementwise::Unary;
use crate::kernels::image::ImageRange;
use crate::models::graph::{Conv, Geometry, Graph, Residual, TensorId};
use crate::models::layers::load_conv;
use crate::models::wan_config::WanConfig;
use crate::models::wan_layers::{
    causal_from_host, decoder_stages, load_causal, load_pointwise, pixel_shuffle_order,
    GraphBuilder,
};
use crate::models::weights::WeightStore;

/// What the residual decoder's output becomes.
pub(crate) struct ResidualOutput {
    /// `conv_out`'s channels (`out_channels`: 3, or 4 with alpha).
    pub out_channels: usize,
    /// The leading channels the graph computes (RGB: 3).
    pub kept: usize,
}

fn bad(store: &WeightStore, message: String) -> Error {
    Error::BadFile {
        path: PathBuf::from(store.origin()),
        message,
    }
}

/// The decoder of one frame of the residual Wan network of `cfg`
/// (`cfg.base_dim` is the decoder's width), weights in diffusers names;
/// `planar`: causal convs stored as 2-D convs.
pub(crate) fn residual_frame_graph(
    ctx: &Context,
    store: &WeightStore,
    cfg: &WanConfig,
    planar: bool,
    output: ResidualOutput,
) -> Result<Graph> {
    if output.kept == 0 || output.kept > output.out_channels {
        return Err(bad(
            store,
            format!(
                "out_channels {} cannot give an image of {} channels",
                output.out_channels, output.kept
            ),
        ));
    }
    let (g, x, width) = residual_body(ctx, store, cfg, planar, true)?;
    frame_output(ctx, store, g, x, (width, planar), output)
}

/// The residual Wan decoder of `cfg` as a causal video graph (time as the
/// batch), and its output frames per latent frame after the first.
pub(crate) fn residual_video_graph(
    ctx: &Context,
    store: &WeightStore,
    cfg: &WanConfig,
) -> Result<(Graph, usize)> {
    let (mut g, x, width) = residual_body(ctx, store, cfg, false, false)?;
    let x = g.rms(x, "decoder.norm_out.gamma", width, false, true)?;
    // conv_out, its channels from unpatchify's order (c, q_x, q_y) to a
    // pixel shuffle's (c, q_y, q_x).
    let p = cfg.patch_size.max(1);
    let co = cfg.out_channels();
    let (key, dims) = ("decoder.conv_out", [co, width, 3, 3]);
    let wt = store.take(&format!("{key}.weight"), &[co, width, 3, 3, 3])?;
    let bias = store.take(&format!("{key}.bias"), &[co])?;
    let (w, b) = pixel_shuffle_order(&wt, &bias, p);
    let cw = causal_from_host(ctx, store, key, (&w, &b), dims)?;
    let cw = g.b.causal_weights(cw);
    let slot = g.next_slot();
    let mut x = g.b.causal_conv(x, cw, slot, Residual::None);
    if p > 1 {
        x = g.b.pixel_shuffle(x, p);
    }
    // diffusers' `AutoencoderKLWan.decode` clamps the frames.
    x = g.b.map(x, Unary::Clamp { lo: -1.0, hi: 1.0 });
    store.finish(&["encoder.", "quant_conv."])?;
    let (_, up_time) = decoder_stages(cfg, store, "a residual Wan")?;
    let t_upscale = 1usize << up_time.iter().filter(|t| **t).count().min(16);
    Ok((g.b.finish(x, None), t_upscale))
}

/// post_quant_conv, conv_in, the mid block and the up blocks: the graph so
/// far, its last tensor and width (`image`: one frame, see the module).
fn residual_body<'a>(
    ctx: &'a Context,
    store: &'a WeightStore,
    cfg: &WanConfig,
    planar: bool,
    image: bool,
) -> Result<(GraphBuilder<'a>, TensorId, usize)> {
    let (dims, up_time) = decoder_stages(cfg, store, "a residual Wan")?;
    let stages = cfg.dim_mult.len();
    let first = dims.first().copied().unwrap_or(0);
    let (mut g, z) = GraphBuilder::new(ctx, store, image, planar);
    let zc = cfg.z_dim;
    let w = load_pointwise(ctx, store, "post_quant_conv", zc, zc, !planar)?;
    let w = g.b.weights(w);
    let mut x = g.b.conv_plain(z, w, Geometry::Same);
    x = g.conv_in_and_mid(x, zc, first)?;
    let mut width = first;
    for i in 0..stages {
        let (Some(&d_in), Some(&d_out)) = (dims.get(i), dims.get(i + 1)) else {
            return Err(Error::Internal("residual Wan stage widths".into()));
        };
        let p = format!("decoder.up_blocks.{i}.upsampler");
        let up_flag = i + 1 < stages;
        let ft = if up_flag && up_time.get(i).copied().unwrap_or(false) {
            2
        } else {
            1
        };
        // A video's time up-sample: its cache slot tells the shortcut
        // whether the chunk starts the video.
        let time_slot = (ft == 2 && !image).then(|| g.next_slot());
        // The shortcut is taken first: the first residual block adds into
        // its input in place (diffusers keeps a low-resolution clone).
        let shortcut = if up_flag {
            if !(d_out * ft * 4).is_multiple_of(d_in) {
                return Err(bad(
                    store,
                    format!("up block {i}: DupUp3D needs {d_out}·{ft}·4 to be a multiple of {d_in} (dim_mult {:?})", cfg.dim_mult),
                ));
            }
            Some(g.b.dup_up_video(x, d_out, ft, time_slot))
        } else {
            None
        };
        let mut cin = d_in;
        for j in 0..=cfg.num_res_blocks {
            x = g.resblock(x, &format!("decoder.up_blocks.{i}.resnets.{j}"), cin, d_out)?;
            cin = d_out;
        }
        width = d_out;
        let Some(shortcut) = shortcut else {
            break;
        };
        let up = load_conv(
            ctx,
            store,
            &format!("{p}.resample.1"),
            d_out,
            d_out,
            3,
            true,
        )?;
        let up = g.b.weights(up);
        if let Some(slot) = time_slot {
            let time = load_causal(
                ctx,
                store,
                &format!("{p}.time_conv"),
                [2 * d_out, d_out, 3, 1],
            )?;
            let time = g.b.causal_weights(time);
            x = g.b.time_upsample(x, (time, slot), up, Some(shortcut));
            continue;
        }
        if ft == 2 {
            // A first frame skips the time conv (diffusers' "Rep").
            let c = 2 * d_out;
            let shape: &[usize] = if planar {
                &[c, d_out, 1, 1]
            } else {
                &[c, d_out, 3, 1, 1]
            };
            store.take(&format!("{p}.time_conv.weight"), shape)?;
            store.take(&format!("{p}.time_conv.bias"), &[c])?;
        }
        let conv = Conv::new(x, up, Geometry::Upsample).residual(Residual::InPlace(shortcut));
        x = g.b.conv(conv);
    }
    Ok((g, x, width))
}

/// norm_out and the kept channels of conv_out's current-frame tap: the
/// image graph of one frame.
fn frame_output(
    ctx: &Context,
    store: &WeightStore,
    mut g: GraphBuilder<'_>,
    x: TensorId,
    (width, planar): (usize, bool),
    output: ResidualOutput,
) -> Result<Graph> {
    let mut x = g.rms(x, "decoder.norm_out.gamma", width, false, true)?;
    // conv_out: only the kept channels (the image's RGB).
    let (co, k) = (output.out_channels, 3);
    let shape: &[usize] = if planar {
        &[co, width, k, k]
    } else {
        &[co, width, 3, k, k]
    };
    let wt = store.take("decoder.conv_out.weight", shape)?;
    let bias = store.take("decoder.conv_out.bias", &[co])?;
    let per_out = wt.len() / co.max(1);
    let taps = if planar { 1 } else { 3 };
    // The current frame's tap of each output channel's kernels.
    let tap: Vec<f32> = wt
        .chunks(per_out)
        .take(output.kept)
        .flat_map(|o| {
            o.chunks(k * k)
                .skip(taps - 1)
                .step_by(taps)
                .flatten()
                .copied()
        })
        .collect();
    let host = PytorchConv {
        weight: &tap,
        cout: output.kept,
        cin: width,
        k,
        bias: bias.get(..output.kept),
    };
    let w = Conv2dWeights::upload(ctx, &host, None, store.dtype(), "decoder.conv_out")?;
    let w = g.b.weights(w);
    x = g.b.conv(Conv::new(x, w, Geometry::Same));
    store.finish(&["encoder.", "quant_conv."])?;
    Ok(g.b.finish(x, Some(ImageRange::MinusOneToOne)))
}
