//! TAEHV-family causal video decoders (taew2_1, taehv, taew2_2): the tiny
//! video autoencoders of madebyollin/taehv, keys `decoder.N…` as their
//! `nn.Sequential` indices (held without the prefix, see
//! [`crate::models::weights::Layout::Taehv`]).
//!
//! Decoder: `tanh(x/3)·3` → conv(C→256) → ReLU → 3 × [3 MemBlocks → 2× up →
//! TGrow → conv(no bias)] → ReLU → conv(64→3·p²) (→ pixel shuffle p).
//! MemBlock(x) = ReLU(conv(ReLU(conv(ReLU(conv(cat[x, past]))))) + skip(x)),
//! `past` being the block's input one frame earlier (zeros at the start).
//! The graph runs one video with time as the batch dimension: the first conv
//! of a MemBlock is split into its `x` and `past` halves (a conv of `past`,
//! then the conv of `x` added in place), TGrow's 1×1 conv runs before the
//! nearest up-sample (they commute; 4× fewer pixels) and its `s·C` channels
//! become `s` frames by a view. The variant is detected from the shapes.

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::conv2d::{Conv2dWeights, PytorchConv};
use crate::kernels::elementwise::Unary;
use crate::models::graph::{Builder, Conv, Geometry, Graph, Residual, TensorId};
use crate::models::layers::load_conv;
use crate::models::weights::{Layout, WeightStore};

/// Channels of the three decoder stages, then of the output stage.
const WIDTHS: [usize; 4] = [256, 128, 64, 64];
/// Per stage: its MemBlocks' Sequential indices, its TGrow's, its conv's.
const STAGES: [([usize; 3], usize, usize); 3] = [
    ([3, 4, 5], 7, 8),
    ([9, 10, 11], 13, 14),
    ([15, 16, 17], 19, 20),
];
const CONV_OUT: usize = 22;
/// Output image channels (before the pixel shuffle folds `p²` into each).
const IMAGE_CHANNELS: usize = 3;

/// A MemBlock with its first conv split into the halves that read `x` and `past`.
pub(crate) struct MemBlock {
    x_half: Conv2dWeights,
    past_half: Conv2dWeights,
    convs: [Conv2dWeights; 2],
    skip: Option<Conv2dWeights>,
}

fn bad(store: &WeightStore, message: String) -> Error {
    Error::BadFile {
        path: store.origin().into(),
        message,
    }
}

impl MemBlock {
    /// Loads Sequential index `i` (`{i}.conv.{0,2,4}`, optional `{i}.skip.0`) of width `c`.
    pub(crate) fn load(ctx: &Context, store: &WeightStore, i: usize, c: usize) -> Result<MemBlock> {
        let key = format!("{i}.conv.0");
        let w = store.take(&format!("{key}.weight"), &[c, 2 * c, 3, 3])?;
        let bias = store.take(&format!("{key}.bias"), &[c])?;
        // Output o's taps: the first c input channels read x, the last c past.
        let half = |which: usize| -> Vec<f32> {
            w.chunks(9 * c)
                .skip(which)
                .step_by(2)
                .flatten()
                .copied()
                .collect()
        };
        let upload = |weight: &[f32], bias: Option<&[f32]>, label: &str| {
            let host = PytorchConv {
                weight,
                cout: c,
                cin: c,
                k: 3,
                bias,
            };
            Conv2dWeights::upload(ctx, &host, None, store.dtype(), label)
        };
        let x_half = upload(&half(0), Some(&bias), &key)?;
        let past_half = upload(&half(1), None, &key)?;
        let conv = |j: usize| load_conv(ctx, store, &format!("{i}.conv.{j}"), c, c, 3, true);
        let skip_key = format!("{i}.skip.0");
        let skip = store
            .contains(&format!("{skip_key}.weight"))
            .then(|| load_conv(ctx, store, &skip_key, c, c, 1, false))
            .transpose()?;
        Ok(MemBlock {
            x_half,
            past_half,
            convs: [conv(2)?, conv(4)?],
            skip,
        })
    }

    /// Adds the block on `x` (consumed) with time cache slot `slot`.
    pub(crate) fn build(self, b: &mut Builder, x: TensorId, slot: usize) -> TensorId {
        let past = b.time_shift(x, slot);
        let (wx, wp) = (b.weights(self.x_half), b.weights(self.past_half));
        let [w2, w4] = self.convs.map(|w| b.weights(w));
        let from_past = b.conv_plain(past, wp, Geometry::Same);
        let c0 = Conv::new(x, wx, Geometry::Same).residual(Residual::InPlace(from_past));
        let h1 = b.conv(c0.epilogue(Unary::Relu));
        let h2 = b.conv(Conv::new(h1, w2, Geometry::Same).epilogue(Unary::Relu));
        let residual = match self.skip {
            Some(s) => Residual::Shortcut(x, b.weights(s)),
            None => Residual::InPlace(x),
        };
        let c4 = Conv::new(h2, w4, Geometry::Same).residual(residual);
        b.conv(c4.epilogue(Unary::Relu))
    }
}

/// A TAEHV decoder with its weights on the device.
pub struct TaehvDecoder {
    /// Latent channels the decoder expects.
    pub(crate) latent_channels: usize,
    /// Output pixel-shuffle factor (taew2_2: 2).
    pub(crate) patch_size: usize,
    /// Output frames per latent frame (the product of the TGrow strides).
    pub(crate) t_upscale: usize,
    graph: Graph,
}

impl TaehvDecoder {
    /// Family name by latent channels and patch size.
    pub fn variant_name(&self) -> &'static str {
        match (self.latent_channels, self.patch_size) {
            (16, 1) => "taew2_1/taehv",
            (48, 2) => "taew2_2",
            (32, 2) => "taehv1_5",
            _ => "taehv",
        }
    }

    /// True when `store` looks like a TAEHV decoder: a 256-wide first conv and
    /// MemBlocks at index 3 (TAESD's first conv is 64 wide).
    pub fn detect(store: &WeightStore) -> bool {
        matches!(store.layout(), Layout::Taehv | Layout::Tae)
            && store.contains("3.conv.0.weight")
            && store
                .shape_of("1.weight")
                .is_some_and(|s| s.first() == Some(&WIDTHS[0]))
    }

    /// True when the `.safetensors` file at `path` holds a TAEHV decoder (see
    /// [`TaehvDecoder::detect`]), read off its header alone: a front end picks
    /// the video path before loading weights. Any unreadable file is `false`
    /// (the image loader then says what is wrong with it).
    pub(crate) fn is_taehv_file(path: &std::path::Path) -> bool {
        let Some(header) = super::weights::safetensors_header(path) else {
            return false;
        };
        ["decoder.", ""].iter().any(|p| {
            let width = header
                .get(format!("{p}1.weight"))
                .and_then(|t| t.get("shape")?.get(0)?.as_u64());
            width == Some(WIDTHS[0] as u64) && header.get(format!("{p}3.conv.0.weight")).is_some()
        })
    }

    /// Uploads a decoder from TAEHV weights (`decoder.N…` keys, or the same
    /// without the prefix).
    pub fn load(ctx: &Context, store: &WeightStore) -> Result<Self> {
        let shape = store.conv_shape(
            "1.weight",
            "not a TAEHV decoder: no `decoder.1.weight` (the first conv); is this an encoder file?",
        )?;
        let [width, latent_channels, k, _] = shape;
        if width != WIDTHS[0] || k != 3 {
            let hint = if width == 64 {
                " (a 64-wide first conv is an image TAE such as taesd: decode it as an image VAE)"
            } else {
                ""
            };
            return Err(bad(
                store,
                format!(
                    "`decoder.1.weight` has shape {shape:?}; a TAEHV decoder's first conv is [256, latent_channels, 3, 3]{hint}"
                ),
            ));
        }
        if !store.contains("3.conv.0.weight") {
            return Err(bad(
                store,
                "not a TAEHV decoder: no `decoder.3.conv.0.weight` (the first MemBlock)".into(),
            ));
        }
        let out = store.conv_shape(
            &format!("{CONV_OUT}.weight"),
            "not a TAEHV decoder: no `decoder.22.weight` (the output conv)",
        )?;
        let patch_size = match [1, 2, 4]
            .into_iter()
            .find(|p| IMAGE_CHANNELS * p * p == out[0])
        {
            Some(p) => p,
            None => {
                let n = out[0];
                return Err(bad(
                    store,
                    format!(
                        "`decoder.22.weight` has {n} output channels; a TAEHV decoder has 3·p² (3, 12 or 48 for patch size 1, 2 or 4): found shape {out:?}"
                    ),
                ));
            }
        };
        let conv_in = load_conv(ctx, store, "1", WIDTHS[0], latent_channels, 3, true)?;
        let (mut b, z) = Builder::new();
        let z = b.map(z, Unary::TanhClamp(3.0));
        let w = b.weights(conv_in);
        let mut x = b.conv(Conv::new(z, w, Geometry::Same).epilogue(Unary::Relu));
        let mut slot = 0;
        let mut t_upscale = 1;
        for (s, &(blocks, grow, proj)) in STAGES.iter().enumerate() {
            let (c, next) = match (WIDTHS.get(s), WIDTHS.get(s + 1)) {
                (Some(&c), Some(&n)) => (c, n),
                _ => return Err(Error::Internal("TAEHV stage widths".into())),
            };
            for i in blocks {
                x = MemBlock::load(ctx, store, i, c)?.build(&mut b, x, slot);
                slot += 1;
            }
            let key = format!("{grow}.conv");
            let g = store.conv_shape(
                &format!("{key}.weight"),
                &format!("not a TAEHV decoder: no `decoder.{key}.weight` (a TGrow)"),
            )?;
            if g[1] != c || g[0] % c != 0 || g[0] == 0 || g[2] != 1 || g[3] != 1 {
                return Err(bad(
                    store,
                    format!(
                        "`decoder.{key}.weight` has shape {g:?}; a TGrow of {c} channels is [stride·{c}, {c}, 1, 1] with stride 1 or 2"
                    ),
                ));
            }
            let stride = g[0] / c;
            t_upscale *= stride;
            let w = b.weights(load_conv(ctx, store, &key, g[0], c, 1, false)?);
            let mut t = b.conv_plain(x, w, Geometry::Same);
            if stride > 1 {
                t = b.time_grow(t, stride);
            }
            let w = b.weights(load_conv(ctx, store, &proj.to_string(), next, c, 3, false)?);
            let up = Conv::new(t, w, Geometry::Upsample);
            // The last stage's conv is followed by the ReLU at index 21.
            x = b.conv(if s + 1 == STAGES.len() {
                up.epilogue(Unary::Relu)
            } else {
                up
            });
        }
        let w = load_conv(
            ctx,
            store,
            &CONV_OUT.to_string(),
            out[0],
            WIDTHS[3],
            3,
            true,
        )?;
        let w = b.weights(w);
        let mut y = b.conv_plain(x, w, Geometry::Same);
        if patch_size > 1 {
            // taehv.py's `F.pixel_shuffle(x, patch_size)` after the decoder.
            y = b.pixel_shuffle(y, patch_size);
        }
        store.finish(&[])?;
        Ok(TaehvDecoder {
            latent_channels,
            patch_size,
            t_upscale,
            graph: b.finish(y, None),
        })
    }

    /// What the video runner needs to know about it.
    pub(crate) fn video_info(&self) -> super::video_info::VideoInfo<'static> {
        super::video_info::VideoInfo {
            name: self.variant_name(),
            latent_channels: self.latent_channels,
            upscale: self.upscale(),
            t_upscale: self.t_upscale,
            host_trim: self.frames_to_trim(),
            layout: self.latent_layout(),
            range: crate::kernels::image::ImageRange::ZeroToOne,
            cache_grows: false,
            whole_clip: false,
            min_side: 1,
            clip: None,
        }
    }

    /// The axis order of its latents: `N×T×C×h×w`, as `taehv.py` takes them.
    pub fn latent_layout(&self) -> crate::latents::VideoLayout {
        crate::latents::VideoLayout::Ntchw
    }

    /// Output frames dropped at a video's start (`t_upscale − 1`).
    pub fn frames_to_trim(&self) -> usize {
        self.t_upscale.saturating_sub(1)
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        8 * self.patch_size
    }

    /// The decoder's layers (one video, time as the batch dimension).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}
