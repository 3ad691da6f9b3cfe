//! The main job: latents in host memory → decoded images, and the memory
//! estimate of the same decode (a dry run through the same code).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, Recorder};
use crate::io::HostTensor;
use crate::kernels::image::to_rgba8;
use crate::memory::{plan_greedy_by_size, MemoryStats, PlannedPool, Policy, TracingPool};
use crate::models::{LoadOptions, Taps, Vae};
use crate::tensor::{DType, Tensor};

/// Options for [`decode`].
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Latents are already decoder input (skip `/ scaling_factor + shift_factor`).
    pub raw_latents: bool,
    /// Also read back the raw float output.
    pub keep_raw: bool,
    /// Time every kernel with GPU timestamps (when the adapter can).
    pub profile: bool,
}

/// Where a decode's wall time went.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Recording commands on the CPU (plan tracing excluded).
    pub record_ms: f64,
    /// From submit until the GPU finished.
    pub gpu_wait_ms: f64,
    /// Copying results back to the host.
    pub readback_ms: f64,
}

/// What a decode produced.
pub struct Decoded {
    /// Packed RGBA8 pixels per image, row-major (empty in dry runs).
    pub rgba: Vec<Vec<u8>>,
    pub width: usize,
    pub height: usize,
    /// Raw decoder output [N, 3, H, W] when asked for.
    pub raw: Option<HostTensor>,
    /// Wall time from upload to pixels on the host.
    pub decode_ms: f64,
    /// Pool statistics, peaks over this decode (weights included).
    pub memory: MemoryStats,
    pub timings: Timings,
    /// Multiply-accumulates the decode's kernels performed (GFLOP/s = 2·MACs / time).
    pub macs: u64,
    /// Per-kernel GPU times when profiling was asked for and available.
    pub profile: Option<crate::gpu::Profile>,
}

/// Records a whole decode of decoder-input latents `z` [N, C, h, w]: upload,
/// decoder, RGBA8 conversion. Returns (raw output, RGBA8 pixels).
pub fn record_decode(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<(Tensor, Tensor)> {
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    let raw = vae.forward(rec, input, &mut Taps::default())?;
    let [n, _, h, w] = crate::models::layers::dims4(&raw)?;
    let pixels = Tensor::empty(rec.ctx(), &[n, h, w], DType::Rgba8, "rgba8 image")?;
    to_rgba8(rec, &raw, vae.output_range(), &pixels)?;
    Ok((raw, pixels))
}

fn plan_key(vae: &Vae, shape: &[usize]) -> String {
    format!("vae{}:{shape:?}", vae.id)
}

/// For a planned pool: traces this decode once in a dry run and installs its plan.
fn ensure_plan(ctx: &Context, planned: &PlannedPool, vae: &Vae, z: &HostTensor) -> Result<String> {
    ensure_plan_with(ctx, planned, plan_key(vae, &z.shape), |rec| {
        record_decode(rec, vae, z)
    })
}

/// For a planned pool: traces `record` once in a dry run and installs its
/// plan under `key` (the same allocation sequence must follow in the real run).
pub(crate) fn ensure_plan_with<T>(
    ctx: &Context,
    planned: &PlannedPool,
    key: String,
    record: impl FnOnce(&mut Recorder) -> Result<T>,
) -> Result<String> {
    if !planned.has_plan(&key) {
        let tracer = Arc::new(TracingPool::new());
        let dry = Context::dry_run(ctx.caps().clone(), tracer.clone());
        {
            let mut rec = Recorder::new(&dry);
            let _outputs = record(&mut rec)?;
        }
        let caps = ctx.caps();
        let plan = plan_greedy_by_size(
            &tracer.trace(),
            caps.min_storage_buffer_offset_alignment as u64,
            caps.max_buffer_size,
        )?;
        planned.install_plan(&key, plan);
    }
    Ok(key)
}

/// Decodes `latents` [N, C, h, w] with `vae`: one recorded forward, one submit.
/// In a dry-run context nothing runs and only the memory figures are real.
pub fn decode(
    ctx: &Context,
    vae: &Vae,
    latents: &HostTensor,
    opts: &DecodeOptions,
) -> Result<Decoded> {
    let mut z = latents.clone();
    crate::io::validate_latents(&mut z, vae.latent_channels()).map_err(Error::InvalidInput)?;
    if !opts.raw_latents {
        vae.unscale_latents(&mut z);
    }
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let plan = match planned {
        Some(p) => Some(ensure_plan(ctx, p, vae, &z)?),
        None => None,
    };
    ctx.pool().reset_peak_stats();
    let start = Instant::now();
    let mut rec = Recorder::new(ctx);
    if opts.profile && !rec.enable_profiling() {
        log::warn!("profiling needs TIMESTAMP_QUERY_INSIDE_PASSES, which this adapter lacks");
    }
    if let (Some(p), Some(key)) = (planned, &plan) {
        p.begin_replay(key)?;
    }
    let recorded = record_decode(&mut rec, vae, &z);
    if let Some(p) = planned {
        p.end_replay();
    }
    let (raw, pixels) = recorded?;
    let mut timings = Timings {
        record_ms: start.elapsed().as_secs_f64() * 1e3,
        ..Default::default()
    };
    let submitted = Instant::now();
    let (labels, profile) = rec.submit_profiled()?;
    let macs = labels.iter().map(|l| l.macs).sum();
    if !ctx.is_dry_run() {
        ctx.wait_idle()?;
    }
    timings.gpu_wait_ms = submitted.elapsed().as_secs_f64() * 1e3;
    let read_start = Instant::now();
    let [n, _, height, width] = crate::models::layers::dims4(&raw)?;
    let (rgba, raw_host) = if ctx.is_dry_run() {
        (Vec::new(), None)
    } else {
        let bytes = pixels.to_bytes(ctx)?;
        let raw_host = match opts.keep_raw {
            true => Some(HostTensor::new(raw.shape().to_vec(), raw.to_f32(ctx)?)?),
            false => None,
        };
        let per = height * width * 4;
        (
            bytes.chunks_exact(per).map(|c| c.to_vec()).collect(),
            raw_host,
        )
    };
    debug_assert!(rgba.is_empty() || rgba.len() == n);
    timings.readback_ms = read_start.elapsed().as_secs_f64() * 1e3;
    Ok(Decoded {
        timings,
        macs,
        profile,
        rgba,
        width,
        height,
        raw: raw_host,
        decode_ms: start.elapsed().as_secs_f64() * 1e3,
        memory: ctx.pool().stats(),
    })
}

/// Predicted memory of a decode.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    pub policy: &'static str,
    pub model: String,
    pub latents_shape: Vec<usize>,
    pub image_shape: Vec<usize>,
    pub weights_bytes: u64,
    /// Peaks over the decode, weights included.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// Predicts the pool's peaks for decoding latents of `latent_shape` with
/// `vae_spec` under `policy` on a device with `caps`, without running any
/// kernel or allocating device memory: the decode runs in a dry-run context
/// and the pool replays its allocation sequence.
pub fn estimate_decode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    latent_shape: [usize; 4],
) -> Result<MemoryEstimate> {
    let dry = Context::dry_run(caps.clone(), policy.new_pool());
    let vae = Vae::load(&dry, vae_spec, load)?;
    let z = HostTensor::new(
        latent_shape.to_vec(),
        vec![0.0; latent_shape.iter().product()],
    )?;
    let out = decode(
        &dry,
        &vae,
        &z,
        &DecodeOptions {
            raw_latents: true,
            ..Default::default()
        },
    )?;
    Ok(MemoryEstimate {
        policy: policy.name(),
        model: vae.name.clone(),
        latents_shape: latent_shape.to_vec(),
        image_shape: vec![latent_shape[0], 3, out.height, out.width],
        weights_bytes: vae.weights_bytes,
        peak_allocated_bytes: out.memory.allocated_bytes.peak,
        peak_reserved_bytes: out.memory.reserved_bytes.peak,
    })
}

/// f32 latents in a buffer the host owns: `shape` = [N, C, h, w], contiguous
/// (NCHW), starting at byte `offset`. The buffer needs `COPY_SRC` usage: the
/// decode copies it into its own memory inside the command stream.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLatents<'a> {
    /// The host's buffer (needs `COPY_SRC` usage).
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first value, a multiple of 4.
    pub offset: u64,
    /// `[N, C, h, w]`; `C` must be the VAE's latent channel count.
    pub shape: [usize; 4],
}

impl DeviceLatents<'_> {
    /// Bytes the latents occupy in the buffer.
    pub fn byte_size(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 4
    }

    /// Checks shape, usage, alignment and bounds against `vae`.
    pub fn validate(&self, vae: &Vae) -> Result<()> {
        let [n, c, h, w] = self.shape;
        if n == 0 || h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!(
                "latents of shape {:?} are empty",
                self.shape
            )));
        }
        if c != vae.latent_channels() {
            return Err(Error::InvalidInput(format!(
                "latents have {c} channels (shape {:?}) but this VAE expects {}",
                self.shape,
                vae.latent_channels()
            )));
        }
        if !self.buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::InvalidInput(format!(
                "the latent buffer needs COPY_SRC usage (it has {:?})",
                self.buffer.usage()
            )));
        }
        if !self.offset.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
            return Err(Error::InvalidInput(format!(
                "latent buffer offset {} is not a multiple of {}",
                self.offset,
                wgpu::COPY_BUFFER_ALIGNMENT
            )));
        }
        let end = self.offset.checked_add(self.byte_size());
        if end.is_none_or(|e| e > self.buffer.size()) {
            return Err(Error::InvalidInput(format!(
                "latents {:?} (f32, {} bytes) at offset {} overrun a {}-byte buffer",
                self.shape,
                self.byte_size(),
                self.offset,
                self.buffer.size()
            )));
        }
        Ok(())
    }
}

/// Records upload and decoder for decoder-input latents `z` [N, C, h, w] in
/// host memory → raw output [N, 3, H, W] (the first half of [`record_decode`]).
pub fn record_decoder(rec: &mut Recorder, vae: &Vae, z: &HostTensor) -> Result<Tensor> {
    let input = Tensor::from_f32_in(rec, &z.shape, &z.data, "latents")?;
    vae.forward(rec, input, &mut Taps::default())
}

/// Records a decode of latents in a host buffer → raw output [N, 3, H, W]:
/// `copy_buffer_to_buffer` into a pool tensor, then — unless `raw_latents` —
/// the unscaling `x * (1 / scaling_factor) + shift_factor` with the
/// elementwise ScaleShift kernel, then the decoder.
///
/// The host path ([`Vae::unscale_latents`]) divides; multiplying by the f32
/// reciprocal differs from the division by at most one ulp (and the device
/// may fuse the multiply-add), far below what changes a decoded pixel by more
/// than ±1. NaN / infinite latents are not detected (that would need a read
/// back).
pub fn record_decoder_from_buffer(
    rec: &mut Recorder,
    vae: &Vae,
    latents: &DeviceLatents,
    raw_latents: bool,
) -> Result<Tensor> {
    latents.validate(vae)?;
    let input = Tensor::empty(rec.ctx(), &latents.shape, DType::F32, "latents")?;
    if !rec.ctx().is_dry_run() {
        let (dst, dst_offset) = (input.buffer()?.clone(), input.block().offset);
        rec.encoder().copy_buffer_to_buffer(
            latents.buffer,
            latents.offset,
            &dst,
            dst_offset,
            latents.byte_size(),
        );
    }
    let (scale, shift) = vae.latent_scaling();
    if !raw_latents && (scale != 1.0 || shift != 0.0) {
        let f = crate::kernels::elementwise::Unary::ScaleShift {
            alpha: 1.0 / scale,
            beta: shift,
        };
        crate::kernels::elementwise::unary(rec, f, &input, &input)?;
    }
    vae.forward(rec, input, &mut Taps::default())
}

/// Runs `record` (which records one decode of latents of `shape`) with the
/// context's planned pool replaying the plan of that decode, tracing it
/// first if needed, exactly as [`decode`] does. Other pools: just runs it.
///
/// `record` must allocate the same sequence as [`record_decode`] or a prefix
/// of it (latent tensor, decoder, optionally the RGBA8 tensor) — true of
/// [`record_decoder`] and [`record_decoder_from_buffer`]. Calls must not
/// overlap on one pool (replay state is the pool's).
pub fn with_decode_plan<T>(
    ctx: &Context,
    vae: &Vae,
    shape: &[usize],
    record: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(planned) = ctx.pool().as_any().downcast_ref::<PlannedPool>() else {
        return record();
    };
    let z = HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()])?;
    let key = ensure_plan(ctx, planned, vae, &z)?;
    planned.begin_replay(&key)?;
    let out = record();
    planned.end_replay();
    out
}
