//! Streamed read-back: a chunk is recorded and submitted with a copy of its
//! output into one of two staging buffers, then mapped and converted to host
//! frames when its frames are taken, less the frames the model trims at a
//! video's start. The frames are the graph's output as they are: a model's
//! post-processing (TAEHV's pixel shuffle, Wan's clamp) is part of its graph.

use super::{VideoDecoder, VideoFrames};
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
    /// Output `[frames, channels, h, w]` before the trim.
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
        let [t, c, h, w] = match chunk.shape[..] {
            [t, c, h, w] => [t, c, h, w],
            _ => return Err(Error::Internal("an unchecked video chunk".into())),
        };
        // Its frames land in host memory: refused before it runs when they cannot.
        if let Some(limit) = self.ctx.host_memory_available() {
            let up = self.decoder.get().upscale();
            self.decoder
                .get()
                .check_chunk_frames(t, (h * up, w * up), limit)?;
        }
        if self.submitted == 0 && self.wants_tiles(chunk)? {
            self.start_tiles((h, w))?;
        }
        self.frame = Some([c, h, w]);
        // A clip-based decoder counts latent frames as they are pushed (clips overlap).
        if !self.decoder.get().clip_based() {
            self.latent_frames += chunk.shape.first().copied().unwrap_or(0);
        }
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
        let graph = self.decoder.get().graph();
        let raw = match self.reference_tiling((h, w)) {
            Some(tiles) => self
                .run
                .record_reference_tiles(graph, &mut rec, chunk, tiles)?,
            None => {
                let input =
                    Tensor::from_f32_in(&mut rec, &chunk.shape, &chunk.data, "video latents")?;
                self.run.record(graph, &mut rec, input)?
            }
        };
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
        // The frames the model trims at a video's start are not read.
        let skip = self.to_trim.min(frames);
        let per_frame = channels * oh * ow;
        let kept = (frames - skip) * per_frame;
        let data = match (p.ready, p.mapped) {
            (Some(mut v), _) => {
                v.drain(..(skip * per_frame).min(v.len()));
                v
            }
            (None, Some(mapped)) => {
                mapped.wait(&self.ctx)?;
                let Some((buffer, _)) = self.staging.get(p.slot).and_then(Option::as_ref) else {
                    return Err(Error::Internal("video staging buffer missing".into()));
                };
                let from = skip * per_frame * p.dtype.size() as usize;
                // Unmapped on every path, so the slot stays usable for a copy.
                let read = buffer
                    .slice(..p.bytes)
                    .get_mapped_range()
                    .map_err(|e| Error::Readback(e.to_string()))
                    .and_then(|view| {
                        crate::tensor::f32_from_bytes_of(p.dtype, view.get(from..).unwrap_or(&[]))
                    });
                buffer.unmap();
                let mut v = read?;
                v.truncate(kept);
                v
            }
            // A dry run computes nothing: zeros of the right size.
            _ => vec![0.0; kept],
        };
        let latency_ms = p.submitted.elapsed().as_secs_f64() * 1e3;
        self.to_trim -= skip;
        let first = self.delivered;
        self.delivered += frames - skip;
        Ok(VideoFrames {
            frames: HostTensor::new(vec![frames - skip, channels, oh, ow], data)?,
            first,
            latency_ms,
        })
    }
}
