//! Video latents → frames with a causal video decoder (the TAEHV family):
//! whole clips ([`decode_video`]) or streamed chunk by chunk
//! ([`VideoDecoder`]), both running the model's graph with time as the
//! batch dimension and keeping only its per-layer time caches (one frame
//! each, from the pool) between chunks.
//!
//! Output is the decoder's raw float output in the reference's layout
//! (TAEHV: frames `[T', 3, H, W]` before its clamp to [0, 1]), with the
//! first `frames_to_trim` frames of a video dropped and the pixel shuffle of
//! patch-size-2 models applied on the host as the frames come back.

// Input-facing: latents and their shapes come from files.
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::error::{Error, Result};
use crate::exec::untiled::{run_video, VideoState};
use crate::gpu::{read_back, Context, Recorder};
use crate::io::HostTensor;
use crate::models::graph::Graph;
use crate::models::taehv::TaehvDecoder;
use crate::models::wan::WanDecoder;
use crate::models::Taps;
use crate::tensor::Tensor;

/// A causal video decoder [`VideoDecoder`] and [`decode_video`] run.
#[derive(Clone, Copy)]
pub enum VideoModel<'a> {
    /// The TAEHV family (latents N×T×C×h×w, output before its [0, 1] clamp).
    Taehv(&'a TaehvDecoder),
    /// The Wan 2.1 VAE (latents N×C×T×h×w, output clamped to [−1, 1]).
    Wan(&'a WanDecoder),
}

impl<'a> From<&'a TaehvDecoder> for VideoModel<'a> {
    fn from(d: &'a TaehvDecoder) -> Self {
        VideoModel::Taehv(d)
    }
}

impl<'a> From<&'a WanDecoder> for VideoModel<'a> {
    fn from(d: &'a WanDecoder) -> Self {
        VideoModel::Wan(d)
    }
}

impl VideoModel<'_> {
    fn graph(&self) -> &Graph {
        match self {
            VideoModel::Taehv(d) => d.graph(),
            VideoModel::Wan(d) => d.graph(),
        }
    }
    fn frames_to_trim(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.frames_to_trim(),
            VideoModel::Wan(_) => 0,
        }
    }
    fn patch_size(&self) -> usize {
        match self {
            VideoModel::Taehv(d) => d.patch_size,
            VideoModel::Wan(_) => 1,
        }
    }
    /// True when latents are N×C×T×h×w (Wan, diffusers), false for N×T×C×h×w (TAEHV).
    pub fn channels_first(&self) -> bool {
        matches!(self, VideoModel::Wan(_))
    }
}

/// A streaming decode of one video: feed latent chunks in order, get the
/// frames each chunk completes. Between calls it holds only the decoder's
/// time caches (one frame per MemBlock), so memory does not grow with the
/// video's length; the output equals decoding the whole clip at once up to
/// float rounding.
pub struct VideoDecoder<'a> {
    ctx: Context,
    decoder: VideoModel<'a>,
    state: VideoState,
    /// Latent frame shape `[C, h, w]` of the first chunk.
    frame: Option<[usize; 3]>,
    /// Output frames still to drop at the video's start.
    to_trim: usize,
}

impl<'a> VideoDecoder<'a> {
    /// A decoder at the start of a video.
    pub fn new(ctx: &Context, decoder: impl Into<VideoModel<'a>>) -> Self {
        let decoder = decoder.into();
        VideoDecoder {
            ctx: ctx.clone(),
            decoder,
            state: VideoState::default(),
            frame: None,
            to_trim: decoder.frames_to_trim(),
        }
    }

    /// Decodes the next `chunk` of latents `[T, C, h, w]` (T ≥ 1, TAEHV
    /// scale: as the video model produced them) into frames `[T', 3, H, W]`
    /// (TAEHV: raw, before the clamp to [0, 1]; Wan: raw z in, clamped to
    /// [−1, 1] out). The video's first chunk gives `t_upscale · T −
    /// frames_to_trim` frames (Wan: `1 + 4 (T − 1)`), later ones
    /// `t_upscale · T`.
    pub fn decode(&mut self, chunk: &HostTensor) -> Result<HostTensor> {
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => {
                return Err(Error::InvalidInput(format!(
                    "a video latent chunk is T×C×h×w (one video), got shape {:?}",
                    chunk.shape
                )))
            }
        };
        check_frame(self.decoder, [t, c, h, w])?;
        if let Some(f) = self.frame.filter(|f| *f != [c, h, w]) {
            return Err(Error::InvalidInput(format!(
                "latent chunk frames are {c}×{h}×{w}, the video's first chunk had {}×{}×{}: every chunk of one video has the same latent size",
                f[0], f[1], f[2]
            )));
        }
        if let Some((i, v)) = chunk.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "latents hold {v} at flat index {i}: video latents must be finite"
            )));
        }
        self.frame = Some([c, h, w]);
        let mut rec = Recorder::new(&self.ctx);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let raw = run_video(
            self.decoder.graph(),
            &mut rec,
            input,
            &mut Taps::default(),
            &mut self.state,
        )?;
        rec.submit()?;
        let bytes = read_back(&self.ctx, &[&raw])?.pop().unwrap_or_default();
        let values = raw.f32_from_bytes(&bytes)?;
        let [frames, channels, oh, ow] = match raw.shape() {
            &[a, b, c, d] => [a, b, c, d],
            s => return Err(Error::Internal(format!("video decoder output {s:?}"))),
        };
        let skip = self.to_trim.min(frames);
        self.to_trim -= skip;
        let per_frame = channels * oh * ow;
        let kept = values.get(skip * per_frame..).unwrap_or_default();
        let p = self.decoder.patch_size();
        let out_c = channels / (p * p);
        let mut data = pixel_shuffle(kept, frames - skip, out_c, p, oh, ow);
        if let VideoModel::Wan(_) = self.decoder {
            data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        }
        HostTensor::new(vec![frames - skip, out_c, oh * p, ow * p], data)
    }

    /// Pool bytes the time caches hold between chunks.
    pub fn cache_bytes(&self) -> u64 {
        self.state.tensors().map(|t| t.byte_size()).sum()
    }
}

/// The shape checks of one video's latents `[T, C, h, w]`.
fn check_frame(decoder: VideoModel, [t, c, h, w]: [usize; 4]) -> Result<()> {
    let (name, channels, layout) = match decoder {
        VideoModel::Taehv(d) => (
            d.variant_name(),
            d.latent_channels,
            "TAEHV latents are N×T×C×h×w",
        ),
        VideoModel::Wan(d) => (
            "Wan 2.1 VAE",
            d.latent_channels(),
            "Wan latents are N×C×T×h×w",
        ),
    };
    if c != channels {
        return Err(Error::InvalidInput(format!(
            "latents have {c} channels; this {name} decoder takes {channels} ({layout})"
        )));
    }
    if t == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "video latents need at least one frame of at least 1×1: got T={t}, h={h}, w={w}"
        )));
    }
    Ok(())
}

/// `[T, C·p², H, W]` → `[T, C, H·p, W·p]` (PyTorch `pixel_shuffle`).
fn pixel_shuffle(x: &[f32], t: usize, c: usize, p: usize, h: usize, w: usize) -> Vec<f32> {
    if p == 1 {
        return x.to_vec();
    }
    let (oh, ow) = (h * p, w * p);
    let mut out = vec![0.0; t * c * oh * ow];
    for (o, v) in out.iter_mut().enumerate() {
        let (x_o, rest) = (o % ow, o / ow);
        let (y_o, rest) = (rest % oh, rest / oh);
        let (ch, f) = (rest % c, rest / c);
        let (i, j) = (y_o % p, x_o % p);
        let src_c = ch * p * p + i * p + j;
        let src = ((f * c * p * p + src_c) * h + y_o / p) * w + x_o / p;
        *v = x.get(src).copied().unwrap_or(0.0);
    }
    out
}

/// `[A, B, rest]` → `[B, A, rest]` of one video.
fn swap_axes(x: &[f32], a: usize, b: usize, rest: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for j in 0..b {
        for i in 0..a {
            let at = (i * b + j) * rest;
            out.extend_from_slice(x.get(at..at + rest).unwrap_or_default());
        }
    }
    out
}

/// Decodes video latents whole. TAEHV: `[N, T, C, h, w]` → frames
/// `[N, T', 3, H, W]` (raw, before the clamp to [0, 1]),
/// `T' = t_upscale · T − frames_to_trim`. Wan: raw z `[N, C, T, h, w]` →
/// `[N, 3, T', H, W]` clamped to [−1, 1], `T' = 1 + 4 (T − 1)` (as diffusers'
/// `AutoencoderKLWan.decode`). Each video is one [`VideoDecoder`] chunk.
pub fn decode_video<'a>(
    ctx: &Context,
    decoder: impl Into<VideoModel<'a>>,
    latents: &HostTensor,
) -> Result<HostTensor> {
    let decoder = decoder.into();
    let wan = decoder.channels_first();
    let [n, t, c, h, w] = match (&latents.shape[..], wan) {
        (&[n, t, c, h, w], false) => [n, t, c, h, w],
        (&[n, c, t, h, w], true) => [n, t, c, h, w],
        _ => {
            return Err(Error::InvalidInput(format!(
                "video latents are {}, got shape {:?}",
                if wan {
                    "N×C×T×h×w (Wan layout)"
                } else {
                    "N×T×C×h×w (TAEHV layout)"
                },
                latents.shape
            )))
        }
    };
    check_frame(decoder, [t, c, h, w])?;
    if n == 0 {
        return Err(Error::InvalidInput(
            "video latents hold no video (N = 0)".into(),
        ));
    }
    let per_video = t * c * h * w;
    let mut shape = Vec::new();
    let mut data = Vec::new();
    for video in latents.data.chunks(per_video).take(n) {
        let video = if wan {
            swap_axes(video, c, t, h * w)
        } else {
            video.to_vec()
        };
        let chunk = HostTensor::new(vec![t, c, h, w], video)?;
        let frames = VideoDecoder::new(ctx, decoder).decode(&chunk)?;
        match (wan, &frames.shape[..]) {
            (true, &[ft, fc, fh, fw]) => {
                data.extend(swap_axes(&frames.data, ft, fc, fh * fw));
                shape = vec![fc, ft, fh, fw];
            }
            _ => {
                shape = frames.shape;
                data.extend(frames.data);
            }
        }
    }
    shape.insert(0, n);
    HostTensor::new(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_shuffle_matches_pytorch_order() {
        // One frame, one output channel, p = 2, 1×2 input: channel k = i·2 + j.
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect(); // [1, 4, 1, 2]
        let y = pixel_shuffle(&x, 1, 1, 2, 1, 2);
        // out[y][x] = in[(y%2)*2 + x%2][0][x/2]
        assert_eq!(y, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
    }
}
