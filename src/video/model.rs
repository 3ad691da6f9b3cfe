//! What a [`VideoDecoder`](super::VideoDecoder) holds of its model, and the
//! shape checks of its latents.

use std::sync::Arc;

use super::VideoLayout;
use crate::error::{Error, Result};
use crate::models::video_vae::{VideoModel, VideoVae};

/// The model a [`VideoDecoder`] runs: borrowed, or shared through an `Arc`
/// ([`VideoDecoder::shared`]: a `'static` decoder a host can keep beside
/// anything, e.g. in a Python object).
pub(super) enum ModelRef<'a> {
    Borrowed(VideoModel<'a>),
    Shared(Arc<VideoVae>),
}

impl ModelRef<'_> {
    pub(super) fn get(&self) -> VideoModel<'_> {
        match self {
            ModelRef::Borrowed(m) => *m,
            ModelRef::Shared(v) => v.model(),
        }
    }
}

/// The shape checks of one video's latents `[T, C, h, w]`.
pub(super) fn check_frame(decoder: VideoModel, [t, c, h, w]: [usize; 4]) -> Result<()> {
    let channels = decoder.latent_channels();
    if c != channels {
        let layout = match decoder.latent_layout() {
            VideoLayout::Ntchw => "N×T×C×h×w",
            VideoLayout::Ncthw => "N×C×T×h×w",
        };
        return Err(Error::InvalidInput(format!(
            "latents have {c} channels; this {} decoder takes {channels} (its latents are {layout})",
            decoder.name()
        )));
    }
    if t == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "video latents need at least one frame of at least 1×1: got T={t}, h={h}, w={w}"
        )));
    }
    let side = decoder.min_side();
    if h < side || w < side {
        return Err(Error::InvalidInput(format!(
            "latent frames of {h}×{w}: the {} decoder's reflect padding needs at least {side}×{side} latent pixels (as PyTorch's)",
            decoder.name()
        )));
    }
    Ok(())
}
