//! Which keys a query sees: causal and frame-window masks, with the CPU
//! semantics the kernel implements (tests compare against [`Mask::visible`]).
//!
//! Positions are token indices in the key sequence. Frames are consecutive
//! runs of `tokens_per_frame` tokens (token p is in frame p / tokens_per_frame).

use crate::error::{Error, Result};

/// Frame-window mask: query frame `f` sees the sink frames `[0, sink_frames)`
/// and the frames `[f - window_frames + 1, f]`. `window_frames: None` is an
/// infinite window: global attention (every frame, before and after `f`).
/// `sink_frames: 0, window_frames: Some(1)` is frame attention (own frame only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameWindow {
    /// Tokens per frame (frame index = token position / this).
    pub tokens_per_frame: usize,
    /// Leading frames every query sees (attention sinks).
    pub sink_frames: usize,
    /// Frames of the sliding window ending at the query's frame; `None`: unbounded.
    pub window_frames: Option<usize>,
}

/// The masks of one attention call; the default sees every key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mask {
    /// Query at position p sees keys at positions <= p.
    pub causal: bool,
    /// Frame-window mask, if any.
    pub frames: Option<FrameWindow>,
}

impl Mask {
    /// Every query sees every key.
    pub const NONE: Mask = Mask {
        causal: false,
        frames: None,
    };

    /// Keys at positions up to the query's own.
    pub fn causal() -> Mask {
        Mask {
            causal: true,
            frames: None,
        }
    }

    /// Sinks plus a window of frames ending at the query's frame
    /// (`window_frames: None`: global).
    pub fn frame_window(
        tokens_per_frame: usize,
        sink_frames: usize,
        window_frames: Option<usize>,
    ) -> Mask {
        Mask {
            causal: false,
            frames: Some(FrameWindow {
                tokens_per_frame,
                sink_frames,
                window_frames,
            }),
        }
    }

    /// Each frame's tokens see only their own frame.
    pub fn frame_attention(tokens_per_frame: usize) -> Mask {
        Self::frame_window(tokens_per_frame, 0, Some(1))
    }

    /// Adds causality to this mask.
    pub fn and_causal(mut self) -> Mask {
        self.causal = true;
        self
    }

    pub(crate) fn validate(&self, op: &str) -> Result<()> {
        if let Some(f) = &self.frames {
            if f.tokens_per_frame == 0 {
                return Err(Error::shape(op, "frame mask with 0 tokens per frame"));
            }
            if f.window_frames == Some(0) {
                return Err(Error::shape(
                    op,
                    "frame window of 0 frames (use None for global)",
                ));
            }
        }
        Ok(())
    }

    /// (tokens per frame, sink frames, window frames) of a bounded frame
    /// window; `None` when every frame is seen (no window, or a global one).
    fn bounded_window(&self) -> Option<(usize, usize, usize)> {
        let f = self.frames?;
        Some((f.tokens_per_frame, f.sink_frames, f.window_frames?))
    }

    /// (causal, tokens per frame, sink frames, window frames with 0 = all)
    /// as the shader's uniforms encode them.
    pub(crate) fn kernel_fields(&self) -> (bool, usize, usize, usize) {
        match self.bounded_window() {
            Some((tokens_per_frame, sink_frames, w)) => {
                (self.causal, tokens_per_frame, sink_frames, w)
            }
            None => (self.causal, 1, 0, 0),
        }
    }

    /// Whether the query at key position `q_pos` sees the key at `k_pos`.
    pub fn visible(&self, q_pos: usize, k_pos: usize) -> bool {
        if self.causal && k_pos > q_pos {
            return false;
        }
        match self.bounded_window() {
            Some((f, sink_frames, w)) => {
                let (fq, fk) = (q_pos / f, k_pos / f);
                fk < sink_frames || (fk <= fq && fk + w > fq)
            }
            _ => true,
        }
    }

    /// Number of keys `< n_kv` the query at position `q_pos` sees.
    pub fn visible_keys(&self, q_pos: usize, n_kv: usize) -> u64 {
        let last = if self.causal {
            n_kv.min(q_pos + 1)
        } else {
            n_kv
        };
        match self.bounded_window() {
            Some((f, sink_frames, w)) => {
                let fq = q_pos / f;
                let sink_end = (sink_frames * f).min(last);
                let start = ((fq + 1).saturating_sub(w) * f).max(sink_end);
                let end = ((fq + 1) * f).min(last);
                (sink_end + end.saturating_sub(start)) as u64
            }
            _ => last as u64,
        }
    }

    /// Visible (query, key) pairs of queries at positions `q_pos0 ..
    /// q_pos0 + n_q` over keys `0 .. n_kv` (the useful work: 2 d MACs each).
    pub fn visible_pairs(&self, q_pos0: usize, n_q: usize, n_kv: usize) -> u64 {
        if *self == Mask::NONE || self.kernel_fields().3 == 0 && !self.causal {
            return (n_q * n_kv) as u64;
        }
        (q_pos0..q_pos0 + n_q)
            .map(|p| self.visible_keys(p, n_kv))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_keys_counts_like_visible() {
        let masks = [
            Mask::NONE,
            Mask::causal(),
            Mask::frame_window(5, 1, Some(2)),
            Mask::frame_window(5, 2, Some(3)).and_causal(),
            Mask::frame_attention(4),
            Mask::frame_window(3, 1, None),
            Mask::frame_window(3, 4, Some(1)),
        ];
        for m in masks {
            for q_pos in 0..40 {
                for n_kv in [0, 1, 7, 23, 40] {
                    let want = (0..n_kv).filter(|&k| m.visible(q_pos, k)).count() as u64;
                    assert_eq!(
                        m.visible_keys(q_pos, n_kv),
                        want,
                        "{m:?} q {q_pos} n_kv {n_kv}"
                    );
                }
            }
        }
    }

    #[test]
    fn frame_window_semantics() {
        let m = Mask::frame_window(10, 1, Some(3));
        // Query in frame 5 sees frame 0 (sink) and frames 3, 4, 5.
        let seen: Vec<usize> = (0..8).filter(|f| m.visible(55, f * 10)).collect();
        assert_eq!(seen, vec![0, 3, 4, 5]);
        let frame = Mask::frame_attention(10);
        assert!(frame.visible(55, 50) && frame.visible(55, 59) && !frame.visible(55, 49));
        assert!(Mask::frame_window(10, 0, None).visible(0, 99));
        assert!(Mask::frame_window(10, 0, Some(0)).validate("t").is_err());
    }
}
