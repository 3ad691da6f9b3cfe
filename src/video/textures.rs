//! Recording a chunk into the host's own encoder, each frame written into one
//! of its textures, with nothing submitted or read back.

use super::VideoDecoder;
use crate::embed::Intermediates;
use crate::error::{Error, Result};
use crate::gpu::Recorder;
use crate::io::HostTensor;
use crate::tensor::Tensor;
use crate::tiling::TileMode;

/// A video chunk recorded into the host's encoder by
/// [`VideoDecoder::record_chunk_to_textures`].
///
/// **Keep it until you have submitted that encoder, then drop it.** It owns
/// the chunk's output memory (from the decoder's pool) and any intermediate
/// texture, so the pool does not hand them out again meanwhile (wgpu keeps
/// what an unsubmitted encoder uses alive, so dropping it early is
/// memory-safe; it only ends the accounting).
#[must_use = "keep the PendingFrames until the encoder is submitted"]
#[derive(Debug)]
pub struct PendingFrames {
    _tensors: Vec<Tensor>,
    _intermediates: Vec<wgpu::Texture>,
    frames: usize,
    first: usize,
    width: u32,
    height: u32,
    dispatches: usize,
}

impl PendingFrames {
    /// Frames written: into the first `frames()` target textures.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Index in the video of the first of them.
    pub fn first(&self) -> usize {
        self.first
    }

    /// Width of the frames in pixels (texels written: `0..width`).
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height of the frames in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Compute dispatches recorded.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }
}

impl VideoDecoder<'_> {
    /// Records the next `chunk` of latents `[T, C, h, w]` (as
    /// [`VideoDecoder::decode`]) into the host's `encoder`, writing its
    /// frames into the host's textures: frame `i` of the chunk into
    /// `targets[i]` (texels `(0..W, 0..H)` of mip level 0, array layer 0;
    /// `W × H` = latent size × [`Vae::upscale`](crate::Vae::upscale)). Needs at least
    /// [`VideoDecoder::frames_next`]`(T)` targets (later ones are left
    /// alone); returns a [`PendingFrames`] saying how many were written.
    /// One texture per frame, so that a host can keep a ring of them and
    /// show or encode each when it likes; use views or copies for array
    /// layers. Targets as [`crate::Engine::record_decode_to_texture`]'s
    /// (`Rgba8Unorm`/`Rgba16Float` with `STORAGE_BINDING`, or
    /// `Rgba8Unorm`/`Rgba8UnormSrgb`/`Rgba16Float` with `COPY_DST`), with
    /// the same values: `Rgba8*` texels hold the bytes of the CLI's frame
    /// PNGs (TAEHV clamped to [0, 1], Wan's [−1, 1] mapped to [0, 1]).
    ///
    /// Nothing is submitted or read back, and the causal caches advance as
    /// for [`VideoDecoder::push`]: **submit `encoder` before anything
    /// recorded later with this decoder's [`Context`](crate::gpu::Context)** (the next chunk may
    /// go into the same encoder), and keep the [`PendingFrames`] until
    /// then. Untiled decodes only: tiled decoders and a pushed chunk whose
    /// frames were not taken yet are refused. Every
    /// check runs before the first command is recorded; an error after
    /// that (out of memory) leaves a partial chunk in `encoder` (discard
    /// it) and the decoder unusable, as for `push`.
    pub fn record_chunk_to_textures(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        chunk: &HostTensor,
        targets: &[&wgpu::Texture],
    ) -> Result<PendingFrames> {
        self.check_usable()?;
        self.check_chunk(chunk)?;
        let model = self.decoder.get();
        if model.clip_based() {
            return Err(Error::Unsupported(format!(
                "recording into the host's encoder is chunk by chunk; the {} decodes clip by clip, its frames lagging the latent frames given (use push and finish)",
                model.name()
            )));
        }
        if self.tiling.mode != TileMode::Off || self.run.tile_size().is_some() {
            return Err(Error::Unsupported(
                "recording a video chunk into the host's encoder runs untiled: this VideoDecoder has tiling set (use push)".into(),
            ));
        }
        if self.pending.is_some() {
            return Err(Error::InvalidInput(
                "a pushed chunk's frames were not taken yet: call finish before recording a chunk into the host's encoder".into(),
            ));
        }
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video chunk".into())),
        };
        let frames = self.frames_next(t);
        if targets.len() < frames {
            return Err(Error::InvalidInput(format!(
                "this chunk of {t} latent frames gives {frames} frames but {} target textures were given",
                targets.len()
            )));
        }
        let up = model.upscale();
        let size = |v: usize| {
            u32::try_from(v.saturating_mul(up))
                .map_err(|_| Error::InvalidInput(format!("latent frames {h}×{w} are too large")))
        };
        let (width, height) = (size(w)?, size(h)?);
        let routes = targets
            .iter()
            .take(frames)
            .enumerate()
            .map(|(i, target)| {
                crate::embed::texture_route(target, width, height).map_err(|e| match e {
                    Error::Unsupported(m) => Error::Unsupported(format!("target texture {i}: {m}")),
                    Error::InvalidInput(m) => {
                        Error::InvalidInput(format!("target texture {i}: {m}"))
                    }
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.frame = Some([c, h, w]);
        self.latent_frames += t;
        self.submitted += 1;
        self.record_frames(encoder, chunk, targets, &routes, (width, height))
            .map_err(|e| self.poison(e))
    }

    /// [`Self::record_chunk_to_textures`] once checked.
    fn record_frames(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        chunk: &HostTensor,
        targets: &[&wgpu::Texture],
        routes: &[Option<wgpu::TextureFormat>],
        (width, height): (u32, u32),
    ) -> Result<PendingFrames> {
        let mut rec = Recorder::with_encoder(&self.ctx, encoder);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let model = self.decoder.get();
        let raw = self.run.record(model.graph(), &mut rec, input)?;
        let [n, channels, oh, ow] = match raw.shape() {
            &[a, b, c, d] => [a, b, c, d],
            s => return Err(Error::Internal(format!("video decoder output {s:?}"))),
        };
        let skip = self.to_trim.min(n);
        self.to_trim -= skip;
        let written = n - skip;
        if written != routes.len() || (ow, oh) != (width as usize, height as usize) {
            return Err(Error::Internal(format!(
                "a chunk decoded to {n} frames of {ow}×{oh}, {written} kept; expected {} of {width}×{height}",
                routes.len()
            )));
        }
        // One frame at a time through a frame-sized tensor (the image
        // kernel writes one image per texture).
        let frame = Tensor::empty(
            &self.ctx,
            &[1, channels, oh, ow],
            raw.dtype(),
            "video frame",
        )?;
        let bytes = frame.byte_size();
        // Frames lie back to back in `raw`: copies need whole 4-byte words.
        let frame_bytes = (channels * oh * ow) as u64 * raw.dtype().size();
        if !frame_bytes.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) || frame_bytes != bytes {
            return Err(Error::Unsupported(format!(
                "{ow}×{oh} frames in {} take {frame_bytes} bytes, not whole 4-byte words",
                raw.dtype().name()
            )));
        }
        let mut intermediates = Intermediates::new("wgvae intermediate video frame");
        let range = model.range();
        for (i, (target, route)) in targets.iter().zip(routes).enumerate() {
            let src_offset = raw.block().offset + (skip + i) as u64 * frame_bytes;
            let (src, dst) = (raw.buffer()?.clone(), frame.buffer()?.clone());
            let dst_offset = frame.block().offset;
            rec.encoder()
                .copy_buffer_to_buffer(&src, src_offset, &dst, dst_offset, bytes);
            intermediates.write(&mut rec, &frame, range, target, *route, (width, height))?;
        }
        let dispatches = rec.finish().len();
        let first = self.delivered;
        self.delivered += written;
        Ok(PendingFrames {
            _tensors: vec![raw, frame],
            _intermediates: intermediates.into_textures(),
            frames: written,
            first,
            width,
            height,
            dispatches,
        })
    }
}
