//! Video encoding with the TAEHV encoders: frames `[T, 3, H, W]` in [0, 1]
//! → latents `[T / t_downscale, C, H / 8p, W / 8p]`, as `taehv.py`'s
//! `TAEHV.encode_video` (the frame count padded at the end with copies of
//! the last frame to a multiple of `t_downscale`).
//!
//! [`VideoEncoder`] streams: chunks of any frame count, the MemBlocks'
//! caches kept between calls, frames short of a whole latent frame held on
//! the host until the next chunk (or padded by [`VideoEncoder::finish`]),
//! so that any chunking gives the latents of the whole clip.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::models::taehv_encoder::TaehvEncoder;
use crate::models::Vae;
use crate::run::video::VideoRun;
use crate::tensor::Tensor;

#[doc(hidden)]
pub use crate::models::taehv_encoder::{check_has_encoder, load_video_encoder};

/// A TAEHV encoder streaming one video chunk by chunk.
pub struct VideoEncoder {
    ctx: Context,
    encoder: Arc<TaehvEncoder>,
    /// The runner's state between chunks (the time caches).
    run: VideoRun,
    /// Frame shape `[3, H, W]` of the first chunk.
    frame: Option<[usize; 3]>,
    /// Frames not yet encoded (fewer than `t_downscale`), flat `[3, H, W]` each.
    held: Vec<f32>,
    /// The last frame seen (what [`VideoEncoder::finish`] pads with).
    last: Vec<f32>,
    /// Why an earlier chunk failed after the caches were touched.
    broken: Option<String>,
}

impl VideoEncoder {
    /// An encoder at the start of a video, sharing `vae`'s network (it may
    /// outlive the borrow); an error unless `vae` is a video encoder.
    pub fn new(ctx: &Context, vae: &Vae) -> Result<Self> {
        let encoder = vae.video_encoder("a VideoEncoder")?;
        Ok(Self::with_encoder(ctx, encoder))
    }

    fn with_encoder(ctx: &Context, encoder: Arc<TaehvEncoder>) -> Self {
        VideoEncoder {
            ctx: ctx.clone(),
            encoder,
            run: VideoRun::default(),
            frame: None,
            held: Vec::new(),
            last: Vec::new(),
            broken: None,
        }
    }

    /// Encodes the next `chunk` of frames `[T, 3, H, W]` (values in [0, 1],
    /// any T ≥ 1): the latents `[T', C, h, w]` of the whole latent frames
    /// completed so far (`T'` may be 0; the remainder waits for the next
    /// chunk or [`VideoEncoder::finish`]).
    pub fn push(&mut self, chunk: &HostTensor) -> Result<HostTensor> {
        if let Some(why) = &self.broken {
            return Err(Error::InvalidInput(format!(
                "this VideoEncoder failed on an earlier chunk ({why}); its caches no longer hold the previous frames: start the video again with a new VideoEncoder"
            )));
        }
        let [t, c, h, w] = self.check_chunk(chunk)?;
        let size = c * h * w;
        self.frame = Some([c, h, w]);
        self.held.extend_from_slice(&chunk.data);
        let start = (t - 1) * size;
        self.last = chunk.data.get(start..).unwrap_or_default().to_vec();
        let frames = self.held.len() / size;
        let whole = frames - frames % self.encoder.t_downscale();
        let rest = self.held.split_off(whole * size);
        let ready = std::mem::replace(&mut self.held, rest);
        self.run(ready, whole).inspect_err(|e| {
            self.broken = Some(e.to_string());
        })
    }

    /// Pads the frames still held with copies of the last frame to a whole
    /// latent frame and encodes them (`taehv.py`'s padding at the video's
    /// end); empty latents when none are held.
    pub fn finish(&mut self) -> Result<HostTensor> {
        let Some([c, h, w]) = self.frame else {
            return Err(Error::InvalidInput(
                "a video needs at least one frame to encode".into(),
            ));
        };
        let size = c * h * w;
        let held = self.held.len() / size;
        if held > 0 {
            for _ in held..self.encoder.t_downscale() {
                self.held.extend_from_slice(&self.last);
            }
        }
        let frames = std::mem::take(&mut self.held);
        let n = frames.len() / size;
        self.run(frames, n)
    }

    /// The checks of a chunk against the model and the video's first chunk.
    fn check_chunk(&self, chunk: &HostTensor) -> Result<[usize; 4]> {
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => {
                return Err(Error::InvalidInput(format!(
                    "a video frame chunk is T×3×H×W (one video), got shape {:?}",
                    chunk.shape
                )))
            }
        };
        check_frames(&self.encoder, [t, c, h, w])?;
        if let Some(f) = self.frame.filter(|f| *f != [c, h, w]) {
            return Err(Error::InvalidInput(format!(
                "chunk frames are {c}×{h}×{w}, the video's first chunk had {}×{}×{}: every chunk of one video has the same frame size",
                f[0], f[1], f[2]
            )));
        }
        if let Some((i, v)) = chunk.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "frames hold {v} at flat index {i}: video frames must be finite"
            )));
        }
        check_range(&chunk.data)?;
        Ok([t, c, h, w])
    }

    /// Encodes `n` frames (a multiple of `t_downscale`) of `frames`.
    fn run(&mut self, frames: Vec<f32>, n: usize) -> Result<HostTensor> {
        let Some([c, h, w]) = self.frame else {
            return Err(Error::Internal("an unchecked video chunk".into()));
        };
        let e = &*self.encoder;
        let (lh, lw) = latent_size(e, h, w);
        if n == 0 {
            return HostTensor::new(vec![0, e.latent_channels(), lh, lw], Vec::new());
        }
        // The graph pixel-unshuffles patch-size-p models' frames itself.
        let mut rec = Recorder::new(&self.ctx);
        let input = Tensor::from_f32_in(&mut rec, &[n, c, h, w], &frames, "video frames")?;
        let y = self.run.record(e.graph(), &mut rec, input)?;
        rec.submit()?;
        let shape = y.shape().to_vec();
        let values = if self.ctx.is_null() {
            vec![0.0; shape.iter().product()]
        } else {
            y.to_f32(&self.ctx)?
        };
        HostTensor::new(shape, values)
    }
}

/// Latent height and width of `h × w` frames (convs of stride 2, pad 1).
fn latent_size(e: &TaehvEncoder, h: usize, w: usize) -> (usize, usize) {
    let down = |mut v: usize| {
        v /= e.patch_size();
        for _ in 0..3 {
            v = v.div_ceil(2);
        }
        v
    };
    (down(h), down(w))
}

/// The shape checks of one video's frames `[T, C, H, W]`.
fn check_frames(e: &TaehvEncoder, [t, c, h, w]: [usize; 4]) -> Result<()> {
    let name = e.variant_name();
    if c != 3 {
        return Err(Error::InvalidInput(format!(
            "frames have {c} channels; the {name} encoder takes RGB frames (3 channels, N×T×3×H×W in [0, 1])"
        )));
    }
    let p = e.patch_size();
    if t == 0 || h == 0 || w == 0 || h % p != 0 || w % p != 0 {
        return Err(Error::InvalidInput(format!(
            "video frames need at least one frame of a size divisible by {p} (the {name} patch size): got T={t}, H={h}, W={w}"
        )));
    }
    Ok(())
}

/// Encodes videos whole: frames `[N, T, 3, H, W]` in [0, 1] → latents
/// `[N, ⌈T / t_downscale⌉, C, h, w]`, as `taehv.py`'s `encode_video`. Each
/// video is one [`VideoEncoder`] chunk.
pub fn encode_video(ctx: &Context, vae: &Vae, frames: &HostTensor) -> Result<HostTensor> {
    let encoder = vae.video_encoder("encoding video")?;
    let [n, t, c, h, w] = match frames.shape[..] {
        [n, t, c, h, w] => [n, t, c, h, w],
        _ => {
            return Err(Error::InvalidInput(format!(
                "video frames are N×T×3×H×W (TAEHV layout, values in [0, 1]), got shape {:?}",
                frames.shape
            )))
        }
    };
    check_frames(&encoder, [t, c, h, w])?;
    if n == 0 {
        return Err(Error::InvalidInput(
            "video frames hold no video (N = 0)".into(),
        ));
    }
    let per_video = t * c * h * w;
    let mut shape = Vec::new();
    let mut data = Vec::new();
    for video in frames.data.chunks(per_video).take(n) {
        let chunk = HostTensor::new(vec![t, c, h, w], video.to_vec())?;
        let mut enc = VideoEncoder::with_encoder(ctx, Arc::clone(&encoder));
        let a = enc.push(&chunk)?;
        let b = enc.finish()?;
        shape = a.shape.clone();
        if let (Some(x), Some(y)) = (shape.first_mut(), b.shape.first()) {
            *x += y;
        }
        data.extend(a.data);
        data.extend(b.data);
    }
    shape.insert(0, n);
    HostTensor::new(shape, data)
}

/// Float error tolerated outside [0, 1] (a frame converted from 8-bit).
const RANGE_SLACK: f32 = 1e-5;

/// Finite frame values must lie in [0, 1]: values in 0–255 or [−1, 1]
/// would encode without a word into latents of another picture.
fn check_range(values: &[f32]) -> Result<()> {
    let (lo, hi) = values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if values.is_empty() || (lo >= -RANGE_SLACK && hi <= 1.0 + RANGE_SLACK) {
        return Ok(());
    }
    let fix = if lo >= 0.0 && hi <= 255.0 {
        "they look like 8-bit pixel values (0–255): divide them by 255"
    } else if lo >= -1.0 - RANGE_SLACK && hi <= 1.0 + RANGE_SLACK {
        "they look like [−1, 1] (a diffusion pipeline's range): map them with (x + 1) / 2"
    } else {
        "rescale or clip them to [0, 1]"
    };
    Err(Error::InvalidInput(format!(
        "video frames must hold values in [0, 1]; these range from {lo} to {hi}: {fix}"
    )))
}

// Hosts move a streaming encoder between threads: keep it `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<VideoEncoder>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_values_outside_0_1_are_named_with_the_fix() {
        assert!(check_range(&[0.0, 0.5, 1.0]).is_ok());
        let e = check_range(&[0.0, 12.0, 255.0]).unwrap_err().to_string();
        assert!(
            e.contains("from 0 to 255") && e.contains("divide them by 255"),
            "{e}"
        );
        let e = check_range(&[-1.0, 0.0, 0.9]).unwrap_err().to_string();
        assert!(
            e.contains("from -1 to 0.9") && e.contains("(x + 1) / 2"),
            "{e}"
        );
        let e = check_range(&[-3.0, 400.0]).unwrap_err().to_string();
        assert!(e.contains("rescale or clip"), "{e}");
    }
}
