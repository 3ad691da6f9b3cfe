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
    /// Decoded clip by clip (MiniMax-H3): the graph runs on one clip's
    /// latent frames at a time, overlapping clips cross-faded.
    pub clip: Option<ClipGeometry>,
}

/// How a clip-based decoder (MiniMax-H3, as diffusers' `_decode` chunks
/// it) cuts a video of `T` latent frames: the latent padded at its end with
/// copies of its last frame until `T + drop` is a multiple of `k`; clip `i`
/// the latent frames `[i·k, i·k + k + overlap)`; of its `t_up` frames per
/// latent frame, the first `skip` dropped, frames up to `t_up·k` kept (the
/// first [`ClipGeometry::fade`] cross-faded with the previous clip's tail),
/// the rest the tail; the last clip's tail appended and the frames made from
/// padding cut off the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClipGeometry {
    /// Latent frames a clip advances (`tokens_chunk_size`).
    pub k: usize,
    /// Latent frames each clip shares with the next (`token_overlap`).
    pub overlap: usize,
    /// Latent frames the encoder drops from each clip (`token_drop`).
    pub drop: usize,
    /// Frames per latent frame.
    pub t_up: usize,
    /// Frames dropped at a clip's start (`frame_pre_padding`).
    pub skip: usize,
    /// `clip_length mod t_up`: the frames a clip's last latent frame covers.
    pub intra_tail: usize,
}

impl ClipGeometry {
    /// Latent frames of padding a video of `t` gets.
    pub(crate) fn padding(&self, t: usize) -> usize {
        (self.k - (t + self.drop) % self.k) % self.k
    }

    /// Clips a video of `t` latent frames decodes in.
    pub(crate) fn clips(&self, t: usize) -> usize {
        ((t + self.drop + self.padding(t)) / self.k).saturating_sub(usize::from(self.drop > 0))
    }

    /// Fewest latent frames that make a clip (diffusers decodes nothing,
    /// and fails, below it).
    pub(crate) fn min_frames(&self) -> usize {
        (self.k + 1).saturating_sub(self.drop).max(1)
    }

    /// Frames each clip keeps before its tail.
    pub(crate) fn kept(&self) -> usize {
        self.t_up * self.k - self.skip
    }

    /// A clip's tail (the frames the next fades from).
    pub(crate) fn tail(&self) -> usize {
        if self.drop == 0 {
            return 0;
        }
        (self.t_up * self.overlap).saturating_sub(self.skip)
    }

    /// Frames of a clip cross-faded with the previous tail (`frame_overlap`).
    pub(crate) fn fade(&self) -> usize {
        (self.t_up * self.overlap).saturating_sub(self.skip)
    }

    /// Frames made from the padding of a video of `t`, cut off its end.
    pub(crate) fn cut(&self, t: usize) -> usize {
        (0..self.padding(t))
            .map(|i| {
                if self.intra_tail != 0 && (t + i).is_multiple_of(self.k) {
                    self.intra_tail
                } else {
                    self.t_up
                }
            })
            .sum()
    }

    /// Frames a video of `t` latent frames decodes to (0 below
    /// [`ClipGeometry::min_frames`]).
    pub(crate) fn frames_for(&self, t: usize) -> usize {
        match self.clips(t) {
            0 => 0,
            n => (n * self.kept() + self.tail()).saturating_sub(self.cut(t)),
        }
    }
}

impl VideoInfo<'_> {
    /// Frames a video of `t` latent frames decodes to: its first latent
    /// frame gives one, every later one `t_upscale`.
    pub(crate) fn frames_for(&self, t: usize) -> usize {
        if let Some(c) = self.clip {
            return c.frames_for(t);
        }
        match t {
            0 => 0,
            t => 1usize.saturating_add(self.t_upscale.saturating_mul(t - 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The geometry of diffusers' `_decode`: the tiny golden (clip_length 9,
    /// token_drop 1) and the release (17, 3), against frame counts worked
    /// through its code by hand.
    #[test]
    fn clip_geometry_matches_diffusers_decode() {
        let tiny = ClipGeometry {
            k: 3,
            overlap: 2,
            drop: 1,
            t_up: 4,
            skip: 3,
            intra_tail: 1,
        };
        // T = 7: one latent frame of padding, 2 clips of 9 frames, a tail of 5, 4 cut.
        assert_eq!((tiny.padding(7), tiny.clips(7), tiny.cut(7)), (1, 2, 4));
        assert_eq!(tiny.frames_for(7), 19);
        assert_eq!(tiny.min_frames(), 3);
        assert_eq!(tiny.frames_for(2), 0);
        // T = 5: no padding, one clip: 9 + 5.
        assert_eq!(tiny.frames_for(5), 14);
        // T = 3: two latent frames of padding, one clip.
        assert_eq!((tiny.padding(3), tiny.clips(3)), (2, 1));
        let release = ClipGeometry {
            k: 5,
            overlap: 2,
            drop: 3,
            t_up: 4,
            skip: 3,
            intra_tail: 1,
        };
        assert_eq!(release.fade(), 5);
        assert_eq!(release.min_frames(), 3);
        // 21 latent frames (a 5-second clip): padding 1, 4 clips.
        assert_eq!((release.padding(21), release.clips(21)), (1, 4));
        assert_eq!(release.frames_for(21), 4 * 17 + 5 - release.cut(21));
    }
}
