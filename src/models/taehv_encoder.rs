//! TAEHV-family causal video encoders (taew2_1, taehv, taew2_2): the
//! `encoder.N…` half of the same `.safetensors` files as
//! [`crate::models::TaehvDecoder`] (held without the prefix).
//!
//! Encoder (`taehv.py`'s `TAEHV.encoder`): pixel unshuffle p (in the graph) → conv(3·p²→64)
//! → ReLU → 3 × [TPool(s) → conv(stride 2, no bias) → 3 MemBlocks] →
//! conv(64→latent). TPool(s) is a 1×1 conv of `s` consecutive frames side by
//! side on channels: in the graph a free view `[T·s, C] → [T, s·C]`
//! (the graph's `TimePool` op, exactly `taehv.py`'s reshape)
//! and one ordinary 1×1 conv; no copy, no new kernel. The strides are read
//! off the TPool weights (`[64, s·64, 1, 1]`).

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::kernels::elementwise::Unary;
use crate::models::graph::{Builder, Conv, Geometry, Graph};
use crate::models::layers::load_conv;
use crate::models::taehv::MemBlock;
use crate::models::weights::WeightStore;

/// Channels of every encoder stage.
const WIDTH: usize = 64;
/// Per stage: its TPool's Sequential index, its strided conv's, its MemBlocks'.
const STAGES: [(usize, usize, [usize; 3]); 3] = [
    (2, 3, [4, 5, 6]),
    (7, 8, [9, 10, 11]),
    (12, 13, [14, 15, 16]),
];
const CONV_OUT: usize = 17;
const IMAGE_CHANNELS: usize = 3;

/// A TAEHV encoder with its weights on the device.
pub struct TaehvEncoder {
    latent_channels: usize,
    patch_size: usize,
    t_downscale: usize,
    graph: Graph,
}

fn bad(store: &WeightStore, message: String) -> Error {
    Error::BadFile {
        path: store.origin().into(),
        message,
    }
}

impl TaehvEncoder {
    /// Family name by latent channels and patch size.
    pub fn variant_name(&self) -> &'static str {
        match (self.latent_channels, self.patch_size) {
            (16, 1) => "taew2_1/taehv",
            (48, 2) => "taew2_2",
            (32, 2) => "taehv1_5",
            _ => "taehv",
        }
    }

    /// Uploads an encoder from a store of TAEHV `encoder.N…` weights (see
    /// [`crate::models::TaePart::Encoder`]).
    pub fn load(ctx: &Context, store: &WeightStore) -> Result<Self> {
        let first = store.conv_shape(
            "0.weight",
            "not a TAEHV encoder: no `encoder.0.weight` (the first conv); the file may hold a decoder only",
        )?;
        let [width, cin, k, _] = first;
        let patch_size = [1, 2, 4]
            .into_iter()
            .find(|p| IMAGE_CHANNELS * p * p == cin);
        let patch_size = match patch_size {
            Some(p) if width == WIDTH && k == 3 => p,
            _ => {
                return Err(bad(
                    store,
                    format!(
                        "`encoder.0.weight` has shape {first:?}; a TAEHV encoder's first conv is [64, 3·p², 3, 3] with p = 1, 2 or 4"
                    ),
                ))
            }
        };
        let (mut b, mut x) = Builder::new();
        // RGB frames in; a patch-size-p model packs p×p pixels into channels first.
        if patch_size > 1 {
            x = b.pixel_unshuffle(x, patch_size);
        }
        let w = b.weights(load_conv(ctx, store, "0", WIDTH, cin, 3, true)?);
        let mut x = b.conv(Conv::new(x, w, Geometry::Same).epilogue(Unary::Relu));
        let mut slot = 0;
        let mut t_downscale = 1;
        for (pool, down, blocks) in STAGES {
            let key = format!("{pool}.conv");
            let g = store.conv_shape(
                &format!("{key}.weight"),
                &format!("not a TAEHV encoder: no `encoder.{key}.weight` (a TPool)"),
            )?;
            if g[0] != WIDTH || g[1] % WIDTH != 0 || g[1] == 0 || g[2] != 1 || g[3] != 1 {
                return Err(bad(
                    store,
                    format!(
                        "`encoder.{key}.weight` has shape {g:?}; a TPool of {WIDTH} channels is [{WIDTH}, stride·{WIDTH}, 1, 1]"
                    ),
                ));
            }
            let stride = g[1] / WIDTH;
            t_downscale *= stride;
            if stride > 1 {
                x = b.time_pool(x, stride);
            }
            let w = b.weights(load_conv(ctx, store, &key, WIDTH, g[1], 1, false)?);
            x = b.conv_plain(x, w, Geometry::Same);
            let w = b.weights(load_conv(
                ctx,
                store,
                &down.to_string(),
                WIDTH,
                WIDTH,
                3,
                false,
            )?);
            x = b.conv_plain(x, w, Geometry::Down([1, 1, 1, 1]));
            for i in blocks {
                x = MemBlock::load(ctx, store, i, WIDTH)?.build(&mut b, x, slot);
                slot += 1;
            }
        }
        let out = store.conv_shape(
            &format!("{CONV_OUT}.weight"),
            "not a TAEHV encoder: no `encoder.17.weight` (the output conv)",
        )?;
        let latent_channels = out[0];
        let w = load_conv(
            ctx,
            store,
            &CONV_OUT.to_string(),
            latent_channels,
            WIDTH,
            3,
            true,
        )?;
        let w = b.weights(w);
        let y = b.conv_plain(x, w, Geometry::Same);
        store.finish(&[])?;
        Ok(TaehvEncoder {
            latent_channels,
            patch_size,
            t_downscale,
            graph: b.finish(y, None),
        })
    }

    /// Latent channels it produces.
    pub fn latent_channels(&self) -> usize {
        self.latent_channels
    }

    /// Input pixel-unshuffle factor (taew2_2: 2).
    pub fn patch_size(&self) -> usize {
        self.patch_size
    }

    /// Input frames per latent frame (the product of the TPool strides).
    pub fn t_downscale(&self) -> usize {
        self.t_downscale
    }

    /// Input pixels per latent pixel along each axis.
    pub fn downscale(&self) -> usize {
        8 * self.patch_size
    }

    /// The encoder's layers (one video, time as the batch dimension).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }
}

/// Refuses a video VAE whose encoder wgvae does not implement (Wan 2.1 /
/// 2.2, HunyuanVideo 1.5, LTX-2, MiniMax-H3), naming its family, before any input is
/// read; only TAEHV files encode.
pub fn check_has_encoder(spec: &str) -> Result<()> {
    let family = if crate::models::wan::is_wan_video(spec) {
        Some("a Wan 2.1 / 2.2 VAE")
    } else if crate::models::hunyuan_video15::is_hunyuan_video15(spec) {
        Some("a HunyuanVideo 1.5 VAE")
    } else if crate::models::ltx2::is_ltx2(spec) {
        Some("an LTX-2 VAE")
    } else if crate::models::minimax_h3::is_minimax_h3(spec) {
        Some("a MiniMax-H3 VAE")
    } else {
        None
    };
    if let Some(family) = family {
        return Err(Error::Unsupported(format!(
            "{spec} is {family}: its encoder is not implemented; only the TAEHV video encoders (taew2_1, taehv, taew2_2) are; encode with a TAEHV .safetensors file"
        )));
    }
    Ok(())
}

/// Loads the TAEHV encoder of the `.safetensors` file at `spec` (its
/// `encoder.N…` half) in the storage precision `load` asks for. A Wan VAE
/// is refused (its encoder is not implemented).
pub fn load_video_encoder(
    ctx: &Context,
    spec: &str,
    load: &super::LoadOptions,
) -> Result<TaehvEncoder> {
    check_has_encoder(spec)?;
    let store = WeightStore::from_safetensors_part(
        std::path::Path::new(spec),
        crate::models::TaePart::Encoder,
    )?;
    store.set_dtype(load.precision.resolve(true, ctx.caps()));
    TaehvEncoder::load(ctx, &store)
}
