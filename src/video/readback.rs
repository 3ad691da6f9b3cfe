//! Streamed read-back: a chunk is recorded and submitted with a copy of its
//! output into one of two staging buffers, then mapped and converted to host
//! frames (trim, pixel shuffle, Wan's clamp) when its frames are taken.

use super::{VideoDecoder, VideoFrames, VideoModel};
use crate::error::{Error, Result};
use crate::gpu::{MapAfter, Recorder};
use crate::io::HostTensor;
use crate::tensor::Tensor;

/// A submitted chunk whose output is on its way to a staging buffer.
pub(super) struct Pending {
    slot: usize,
    submitted: std::time::Instant,
    /// The staging slot's map (`None`: tiled, or a dry run).
    mapped: Option<MapAfter>,
    /// Output `[frames, channels, h, w]` before trim and pixel shuffle.
    shape: [usize; 4],
    dtype: crate::tensor::DType,
    bytes: u64,
    /// The output as f32, already on the host (a tiled chunk).
    ready: Option<Vec<f32>>,
}

impl VideoDecoder<'_> {
    /// Records and submits `chunk` (checked by [`Self::check_chunk`]) with
    /// the copy of its output into a staging buffer.
    pub(super) fn submit(&mut self, chunk: &HostTensor) -> Result<Pending> {
        let [_, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video chunk".into())),
        };
        if self.submitted == 0 && self.wants_tiles(chunk)? {
            self.start_tiles((h, w))?;
        }
        self.frame = Some([c, h, w]);
        self.latent_frames += chunk.shape.first().copied().unwrap_or(0);
        let slot = self.submitted % 2;
        // A tiled chunk's latency counts from the start of its run.
        let started = std::time::Instant::now();
        if let Some(run) = self.run.run_tiled(self.decoder.get().graph(), chunk) {
            let (values, shape) = run?;
            self.submitted += 1;
            return Ok(Pending {
                slot,
                submitted: started,
                mapped: None,
                shape,
                dtype: crate::tensor::DType::F32,
                bytes: 0,
                ready: Some(values),
            });
        }
        let null = self.ctx.is_null();
        let mut encoder =
            self.ctx
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("wgvae video chunk"),
                });
        let mut rec = Recorder::with_encoder(&self.ctx, &mut encoder);
        let input = Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
        let raw = self
            .run
            .record(self.decoder.get().graph(), &mut rec, input)?;
        let shape = match raw.shape() {
            &[a, b, c, d] => [a, b, c, d],
            s => return Err(Error::Internal(format!("video decoder output {s:?}"))),
        };
        // Copies move whole 4-byte words (f16 frames have even sizes anyway).
        let bytes = raw.byte_size().div_ceil(4) * 4;
        self.largest_chunk_bytes = self.largest_chunk_bytes.max(bytes);
        if !null {
            let staging = self.staging_buffer(slot, bytes)?;
            let (src, offset) = (raw.buffer()?.clone(), raw.block().offset);
            rec.timed_transfer("copy::video_to_staging", |e| {
                e.copy_buffer_to_buffer(&src, offset, &staging, 0, bytes)
            });
        }
        rec.finish();
        let dtype = raw.dtype();
        let submitted = std::time::Instant::now();
        let mapped = if null {
            None
        } else {
            let submission = self.ctx.scoped("submitting a video chunk", || {
                Ok(self.ctx.queue().submit([encoder.finish()]))
            })?;
            // Queue order keeps later chunks' writes to this memory after the copy.
            drop(raw);
            let Some((buffer, _)) = self.staging.get(slot).and_then(Option::as_ref) else {
                return Err(Error::Internal("video staging buffer missing".into()));
            };
            Some(MapAfter::new(buffer.slice(..bytes), submission))
        };
        self.submitted += 1;
        Ok(Pending {
            slot,
            submitted,
            mapped,
            shape,
            dtype,
            bytes,
            ready: None,
        })
    }

    /// Staging slot `slot`, grown to at least `bytes`.
    fn staging_buffer(&mut self, slot: usize, bytes: u64) -> Result<wgpu::Buffer> {
        let entry = self
            .staging
            .get_mut(slot)
            .ok_or_else(|| Error::Internal("staging slot".into()))?;
        match entry {
            Some((buffer, size)) if *size >= bytes => Ok(buffer.clone()),
            _ => {
                let buffer = self.ctx.readback_buffer("wgvae video readback", bytes)?;
                *entry = Some((buffer.clone(), bytes));
                Ok(buffer)
            }
        }
    }

    /// Waits for `p`'s submission (not later ones) and converts its frames.
    pub(super) fn take(&mut self, p: Pending) -> Result<VideoFrames> {
        let [frames, channels, oh, ow] = p.shape;
        let values = match (p.ready, p.mapped) {
            (Some(v), _) => v,
            (None, Some(mapped)) => {
                mapped.wait(&self.ctx)?;
                let Some((buffer, _)) = self.staging.get(p.slot).and_then(Option::as_ref) else {
                    return Err(Error::Internal("video staging buffer missing".into()));
                };
                // Unmapped on every path, so the slot stays usable for a copy.
                let read = buffer
                    .slice(..p.bytes)
                    .get_mapped_range()
                    .map_err(|e| Error::Readback(e.to_string()))
                    .and_then(|view| crate::tensor::f32_from_bytes_of(p.dtype, &view));
                buffer.unmap();
                let mut v = read?;
                v.truncate(frames * channels * oh * ow);
                v
            }
            // A dry run computes nothing: zeros of the right size.
            _ => vec![0.0; frames * channels * oh * ow],
        };
        let latency_ms = p.submitted.elapsed().as_secs_f64() * 1e3;
        let skip = self.to_trim.min(frames);
        self.to_trim -= skip;
        let per_frame = channels * oh * ow;
        let kept = values.get(skip * per_frame..).unwrap_or_default();
        let patch = self.decoder.get().patch_size();
        let out_c = channels / (patch * patch);
        let mut data = pixel_shuffle(kept, frames - skip, out_c, patch, oh, ow);
        if let VideoModel::Wan(_) = self.decoder.get() {
            data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        }
        let first = self.delivered;
        self.delivered += frames - skip;
        Ok(VideoFrames {
            frames: HostTensor::new(vec![frames - skip, out_c, oh * patch, ow * patch], data)?,
            first,
            latency_ms,
        })
    }
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
