//! What the runner and the video front doors need to know about a causal
//! video decoder, as data: each model describes itself once
//! ([`crate::models::taehv::TaehvDecoder::video_info`],
//! [`crate::models::wan::WanDecoder::video_info`]).

use crate::kernels::image::ImageRange;
use crate::latents::VideoLayout;

#[derive(Clone, Copy, Debug)]
pub(crate) struct VideoInfo<'a> {
    /// The model's name in messages and reports.
    pub name: &'a str,
    /// Channels of one latent frame.
    pub latent_channels: usize,
    /// Output pixels per latent pixel along each axis.
    pub upscale: usize,
    /// Output frames per latent frame.
    pub t_upscale: usize,
    /// Output frames the graph makes at a video's start and the host drops
    /// (TAEHV: `t_upscale − 1`; Wan's graph makes one frame of the first).
    pub host_trim: usize,
    /// The axis order of its latents.
    pub layout: VideoLayout,
    /// The range of the decoded frames.
    pub range: ImageRange,
    /// Its caches grow with the video (HunyuanVideo 1.5's block-causal
    /// attention keeps every earlier frame's keys and values), so memory
    /// is not flat in the video's length.
    pub cache_grows: bool,
    /// Not causal (LTX-2): a frame depends on later ones, so a video decodes
    /// as one chunk.
    pub whole_clip: bool,
    /// Fewest latent pixels per side a frame needs (LTX-2's reflect padding
    /// needs 2, as PyTorch's does).
    pub min_side: usize,
}

impl VideoInfo<'_> {
    /// Frames a video of `t` latent frames decodes to: its first latent
    /// frame gives one, every later one `t_upscale`.
    pub(crate) fn frames_for(&self, t: usize) -> usize {
        match t {
            0 => 0,
            t => 1usize.saturating_add(self.t_upscale.saturating_mul(t - 1)),
        }
    }
}
