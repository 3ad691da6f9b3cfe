//! The other direction: images → latents (img2img, inpainting, video-to-video).
//!
//! An encode runs untiled (one recorded forward, one submit) or tiled with
//! the decode's machinery ([`crate::tiling`]): `exact` tiles (halos through
//! every stride-2 conv, global GroupNorm statistics, the mid-block attention
//! over all latent tokens) equal the untiled encode up to float rounding
//! within a memory budget; `fast` encodes overlapping tiles independently and
//! blends their moments like diffusers' `tiled_encode`; `auto` (the default)
//! encodes untiled whenever that fits the budget and the device's limits.

use crate::error::{Error, Result};
use crate::gpu::{Context, Recorder};
use crate::io::HostTensor;
use crate::memory::MemoryStats;
use crate::run::fast::{run_fast, FastGrid, FastTile, TileRun};
use crate::run::input::record_encoder;
use crate::run::strategy::{choose, input_of, rows_to_run, Geometry, Strategy};
use crate::run::{precision, run_exact, run_untiled, tiles_of, untiled_report, ExactRun, Replay};
use crate::tensor::DType;
use crate::tiling::{ExactPlan, Progress, Tiling, TilingReport};

pub use crate::io::load_image;
pub(crate) use crate::models::vae_encoder::EncoderKind;
use crate::models::vae_encoder::VaeEncoder;
use crate::models::Vae;

/// Options for [`encode`].
#[derive(Clone, Debug, Default)]
pub struct EncodeOptions {
    /// Sample `mean + std·ε` with this seed instead of returning the mean,
    /// ε from [`standard_normal`] (AutoencoderKL only: TAE encoders are
    /// deterministic, and asking them to sample is an error).
    pub sample: Option<u64>,
    /// Return raw latents (skip `(z − shift_factor) · scaling_factor`).
    /// TAE latents are never scaled: for them it changes nothing (the CLI
    /// rejects `--raw-latents` with a TAE encoder as a flag without effect).
    pub raw_latents: bool,
    /// Tiling mode, tile size (in image pixels) and memory budget (default: auto).
    pub tiling: Tiling,
    /// Called once per tile step of a tiled encode.
    pub progress: Option<Progress>,
}

/// What an encode produced.
pub struct Encoded {
    /// Pool statistics, peaks over this encode (weights included).
    pub memory: crate::memory::MemoryStats,
    /// Latents [N, C, H/8, W/8]: pipeline latents unless `raw_latents`
    /// (FLUX.2's pipeline form: 2×2-patchified, BatchNorm-normalised, [N, 128, H/16, W/16]).
    pub latents: HostTensor,
    /// The distribution's raw mean (AutoencoderKL only).
    pub mean: Option<HostTensor>,
    /// The distribution's std `exp(0.5 · clamp(logvar, −30, 20))` (AutoencoderKL only).
    pub std: Option<HostTensor>,
    /// How the encode was tiled.
    pub tiling: TilingReport,
    /// Storage dtype the latents were encoded in (bf16 after an f16 overflow).
    pub dtype: DType,
    /// Values f16 convolutions could not hold (0 unless the model ran in f16).
    pub f16_overflows: u64,
    /// What was done about an f16 overflow, when one happened.
    pub precision_note: Option<String>,
}

/// An encode as the runner sees it.
#[derive(Clone, Copy)]
struct EncodeJob<'a> {
    enc: &'a VaeEncoder,
    x: &'a HostTensor,
}

/// An exact tiled encode's output shape and host bytes as f32.
type ExactLatents = ([usize; 4], Option<Vec<u8>>);

impl EncodeJob<'_> {
    /// An exact tiled encode: the output's shape and host bytes as f32
    /// (`None` when the executor gathered nothing).
    fn exact(
        &self,
        ctx: &Context,
        plan: ExactPlan,
        progress: Option<Progress>,
    ) -> Result<ExactRun<ExactLatents>> {
        let enc = self.enc;
        run_exact(
            ctx,
            plan,
            (false, false, progress),
            (enc.dtype, self.x),
            |ex, image| {
                let out = ex.run_graph(enc.encoder.graph(), image, false)?.0;
                let (shape, dtype) = ([out.n, out.c, out.h, out.w], out.dtype());
                // Half encoders leave their output in 16 bits: widen to f32 bytes.
                let data = match ex.gather_host(out)?.into_data() {
                    Some(b) => Some(
                        bytemuck::cast_slice(&crate::tensor::f32_from_bytes_of(dtype, &b)?)
                            .to_vec(),
                    ),
                    None => None,
                };
                Ok((shape, data))
            },
        )
    }

    fn replay<'c>(&self, ctx: &'c Context, x: &HostTensor) -> Result<Replay<'c>> {
        let key = || format!("enc{}:{:?}", self.enc.id, x.shape);
        Replay::recorded(ctx, key, |rec| record_encoder(rec, self.enc, x))
    }
}

/// Encodes `pixels` [N, 3, H, W] (values 0–255), untiled or tiled as
/// `opts.tiling` says. On a null device ([`Context::null`]) nothing runs and
/// only the memory figures are real.
pub fn encode(
    ctx: &Context,
    enc: &Vae,
    pixels: &HostTensor,
    opts: &EncodeOptions,
) -> Result<Encoded> {
    encode_image(ctx, enc.image_encoder("encoding images")?, pixels, opts)
}

/// [`encode`] with an image encoder (the model or its bf16 twin).
pub(crate) fn encode_image(
    ctx: &Context,
    enc: &VaeEncoder,
    pixels: &HostTensor,
    opts: &EncodeOptions,
) -> Result<Encoded> {
    let &[_, c, h, w] = pixels.shape.as_slice() else {
        return Err(Error::InvalidInput(format!(
            "images must be N×3×H×W, got {:?}",
            pixels.shape
        )));
    };
    if c != 3 || h % 8 != 0 || w % 8 != 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "images must be N×3×H×W with H, W multiples of 8, got {:?}",
            pixels.shape
        )));
    }
    if let EncoderKind::Tae(_) = enc.encoder {
        if opts.sample.is_some() {
            return Err(Error::InvalidInput(
                "`EncodeOptions::sample`: TAE encoders are deterministic (they output latents, not a distribution); sampling needs an AutoencoderKL encoder".into(),
            ));
        }
    }
    // diffusers: png / 127.5 − 1; TAE: png / 255. A null device reads no
    // values (an estimate's zeros are not copied).
    let x = match ctx.is_null() {
        true => std::borrow::Cow::Borrowed(pixels),
        false => std::borrow::Cow::Owned(HostTensor {
            shape: pixels.shape.clone(),
            data: match enc.encoder {
                EncoderKind::Kl(_) => pixels.data.iter().map(|v| v / 127.5 - 1.0).collect(),
                EncoderKind::Tae(_) => pixels.data.iter().map(|v| v / 255.0).collect(),
            },
        }),
    };
    let x = x.as_ref();
    let job = EncodeJob { enc, x };
    let floor = enc
        .encoder
        .graph()
        .parked_floor(x.shape[0], (x.shape[2], x.shape[3]));
    let geometry = Geometry::encode(x, enc.levels(), enc.downscale()).with_parked_floor(floor);
    let down = enc.downscale();
    let exact = |null: &Context, plan: &ExactPlan| {
        let x = input_of(x, plan, down);
        let job = EncodeJob { x: &x, ..job };
        job.exact(null, plan.clone(), None).map(|r| r.report)
    };
    let record = |rec: &mut Recorder, x: &HostTensor| record_encoder(rec, enc, x).map(|_| ());
    let (strategy, budget) = choose(ctx, &geometry, &opts.tiling, &record, &exact)?;
    let (moments, memory, mut tiling, overflows) = match strategy {
        Strategy::Untiled => encode_untiled(ctx, &job)?,
        Strategy::Exact(plan) => encode_exact(ctx, &job, plan, opts.progress.clone())?,
        Strategy::Fast { px, overlap } => {
            encode_fast(ctx, &job, px, overlap, opts.progress.as_ref())?
        }
    };
    tiling.max_memory = budget;
    if overflows > 0 {
        let twin = enc.bf16_twin(ctx)?;
        let (mut again, note) =
            precision::redo_in_bf16(overflows, &enc.name, "re-encoded", || {
                encode_image(ctx, twin, pixels, opts)
            })?;
        again.f16_overflows = overflows;
        again.precision_note = Some(note);
        return Ok(again);
    }
    let bad = moments.data.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 && !ctx.is_null() {
        return Err(Error::InvalidInput(format!(
            "{} produced {bad} non-finite latent values (NaN or ±Inf) of {}: the weights are probably damaged or from a diverged model",
            enc.name,
            moments.data.len()
        )));
    }
    let mut out = finish(enc, moments, memory, tiling, opts)?;
    out.dtype = enc.dtype;
    Ok(out)
}

/// (output on the host, pool statistics, tiling report, f16 overflow count).
type EncodeRun = (HostTensor, MemoryStats, TilingReport, u64);

/// One untiled encode of `x`: the output on the host (zeros on a null
/// device) and the pool's statistics over it.
fn encode_untiled(ctx: &Context, job: &EncodeJob) -> Result<EncodeRun> {
    let replay = job.replay(ctx, job.x)?;
    ctx.pool().reset_peak_stats();
    let run = run_untiled(
        ctx,
        replay,
        false,
        |rec| record_encoder(rec, job.enc, job.x),
        |out| vec![out],
    )?;
    let memory = ctx.pool().stats();
    let values = run.out.f32_from_bytes(&run.bytes[0])?;
    let report = untiled_report();
    let out = HostTensor::new(run.out.shape().to_vec(), values)?;
    Ok((out, memory, report, run.f16_overflows))
}

fn encode_exact(
    ctx: &Context,
    job: &EncodeJob,
    plan: ExactPlan,
    progress: Option<Progress>,
) -> Result<EncodeRun> {
    // An estimate of a plan made on a few rows of tiles runs those rows
    // (see `decode_exact`).
    let full = job.x;
    let (plan, rows) = rows_to_run(ctx, plan, job.x, job.enc.downscale());
    let rows_job;
    let job = match &rows {
        Some((_, x)) => {
            rows_job = EncodeJob { x, ..*job };
            &rows_job
        }
        None => job,
    };
    let by_rows = rows.as_ref().map(|r| r.0);
    let (enc, x) = (job.enc, job.x);
    let key = || format!("enc{}:{:?}:{}", enc.id, x.shape, plan.key());
    let replay = Replay::begin(ctx, key, |null| {
        job.exact(null, plan.clone(), None).map(|_| ())
    })?;
    ctx.pool().reset_peak_stats();
    let result = job.exact(ctx, plan, progress);
    drop(replay);
    let run = result?;
    let memory = ctx.pool().stats();
    let mut report = run.report;
    let (mut shape, data) = run.out;
    if let Some(b) = by_rows {
        b.counts.apply(&mut report);
        shape[2] = full.shape[2] / enc.downscale();
    }
    report.tiles = tiles_of(&report, full.shape[2], full.shape[3]);
    let values = match data {
        Some(b) => bytemuck::pod_collect_to_vec::<u8, f32>(&b),
        None => vec![0.0; shape.iter().product()],
    };
    let out = HostTensor::new(shape.to_vec(), values)?;
    Ok((out, memory, report, run.f16_overflows))
}

/// Fast tiling as diffusers' `AutoencoderKL._tiled_encode`: image tiles of
/// `px` pixels with a stride of `px - overlap`, each encoded independently
/// (its own GroupNorm statistics and attention), their outputs blended over
/// `overlap / 8` latent pixels and cropped to `(px - overlap) / 8` (see
/// [`crate::run::fast`]).
fn encode_fast(
    ctx: &Context,
    job: &EncodeJob,
    px: usize,
    overlap: usize,
    progress: Option<&Progress>,
) -> Result<EncodeRun> {
    let (enc, x) = (job.enc, job.x);
    let scale = enc.downscale();
    let [n, _, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let (lh, lw) = (h / scale, w / scale);
    let grid = FastGrid {
        tile: px,
        stride: px - overlap,
        extent: overlap / scale,
        limit: (px - overlap) / scale,
        out: (lh, lw),
    };
    ctx.pool().reset_peak_stats();
    let mut overflows = 0;
    let image = run_fast(x, &grid, progress, |xt| {
        ctx.check_cancel()?;
        let replay = job.replay(ctx, xt)?;
        let run = run_untiled(
            ctx,
            replay,
            false,
            |rec| record_encoder(rec, enc, xt),
            |t| vec![t],
        )?;
        let [_, c, th, tw] = crate::models::layers::dims4(&run.out)?;
        overflows += run.f16_overflows;
        let data = run.out.f32_from_bytes(&run.bytes[0])?;
        Ok(TileRun {
            tile: FastTile { h: th, w: tw, data },
            channels: c,
            readback: run.out.byte_size(),
        })
    })?;
    let memory = ctx.pool().stats();
    let report = image.report(px, overlap, image.held_peak);
    let out = HostTensor::new(vec![n, image.channels, lh, lw], image.data)?;
    Ok((out, memory, report, overflows))
}

/// Latents from the encoder output: TAE outputs are the latents;
/// AutoencoderKL moments are split into mean and std, sampled if asked for,
/// and scaled to pipeline latents unless `raw_latents`.
fn finish(
    enc: &VaeEncoder,
    out: HostTensor,
    memory: MemoryStats,
    tiling: TilingReport,
    opts: &EncodeOptions,
) -> Result<Encoded> {
    let EncoderKind::Kl(k) = &enc.encoder else {
        return Ok(Encoded {
            memory,
            latents: out,
            mean: None,
            std: None,
            tiling,
            dtype: enc.dtype,
            f16_overflows: 0,
            precision_note: None,
        });
    };
    let [n, _, lh, lw] = [out.shape[0], out.shape[1], out.shape[2], out.shape[3]];
    let values = out.data;
    // Moments: mean = first half of the channels, log-variance the second.
    let l = k.config.latent_channels;
    let plane = lh * lw;
    let mut mean = Vec::with_capacity(n * l * plane);
    let mut std = Vec::with_capacity(n * l * plane);
    for b in 0..n {
        let base = b * 2 * l * plane;
        mean.extend_from_slice(&values[base..base + l * plane]);
        std.extend(
            values[base + l * plane..base + 2 * l * plane]
                .iter()
                .map(|lv| (0.5 * lv.clamp(-30.0, 20.0)).exp()),
        );
    }
    let mut z = match opts.sample {
        None => mean.clone(),
        Some(seed) => {
            let eps = standard_normal(mean.len(), seed);
            mean.iter()
                .zip(&std)
                .zip(&eps)
                .map(|((m, s), e)| m + s * e)
                .collect()
        }
    };
    let lshape = vec![n, l, lh, lw];
    let latents = match (opts.raw_latents, k.config.flux2) {
        (true, _) => HostTensor::new(lshape.clone(), z)?,
        // FLUX.2's pipeline form (`Flux2Pipeline._encode_vae_image`): 2×2
        // patchify, then the latent BatchNorm: N×4C×h/2×w/2.
        (false, Some(_)) => {
            let bn = k.latent_bn.as_ref().ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{}: the weights hold no `bn.running_mean` / `bn.running_var`, which FLUX.2's pipeline latents need; ask for raw latents (`EncodeOptions::raw_latents`) or load the full VAE file",
                    enc.name
                ))
            })?;
            bn.from_z(&HostTensor::new(lshape.clone(), z)?)?
        }
        (false, None) => {
            let (sf, shift) = (k.config.scaling_factor, k.config.shift());
            z.iter_mut().for_each(|v| *v = (*v - shift) * sf);
            HostTensor::new(lshape.clone(), z)?
        }
    };
    Ok(Encoded {
        memory,
        latents,
        mean: Some(HostTensor::new(lshape.clone(), mean)?),
        std: Some(HostTensor::new(lshape, std)?),
        tiling,
        dtype: enc.dtype,
        f16_overflows: 0,
        precision_note: None,
    })
}

/// `n` independent standard normal values (mean 0, std 1) from `seed`,
/// reproducible across platforms: SplitMix64 (Steele, Lea & Flood 2014)
/// gives 53-bit uniforms `u ∈ (0, 1]`, and the Box–Muller transform turns
/// each pair into two normals `√(−2 ln u₁)·(cos, sin)(2π u₂)`, computed in
/// f64 and rounded to f32. This is the ε of `--sample SEED`; it does not
/// reproduce PyTorch's generator (no CPU/GPU framework shares one).
#[doc(hidden)]
pub fn standard_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut next_uniform = move || {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Top 53 bits, shifted to (0, 1] so ln never sees 0.
        ((z >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    };
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let (u1, u2) = (next_uniform(), next_uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        out.push((r * cos) as f32);
        out.push((r * sin) as f32);
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ε of `--sample`: reproducible per seed, different across seeds, and
    /// standard normal over 400 000 draws: mean within 0.005 of 0 (its std
    /// error is 0.0016), std within 0.005 of 1, and the one- and two-sigma
    /// fractions within 0.003 of 68.27 % and 95.45 % (truncating or
    /// one-sided transforms fail these).
    #[test]
    fn standard_normal_statistics() {
        let n = 400_000;
        let e = standard_normal(n, 42);
        assert_eq!(e.len(), n);
        assert_eq!(e, standard_normal(n, 42));
        assert_eq!(standard_normal(7, 42), e[..7].to_vec(), "prefix-stable");
        let other = standard_normal(1000, 43);
        assert!(other.iter().zip(&e).filter(|(a, b)| a == b).count() < 5);
        let mean = e.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = e.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let within = |k: f32| e.iter().filter(|v| v.abs() <= k).count() as f64 / n as f64;
        let (one, two) = (within(1.0), within(2.0));
        println!(
            "standard_normal: mean {mean:.5}, std {:.5}, |ε|≤1 {one:.4}, |ε|≤2 {two:.4}",
            var.sqrt()
        );
        assert!(mean.abs() < 5e-3, "mean {mean}");
        assert!((var.sqrt() - 1.0).abs() < 5e-3, "std {}", var.sqrt());
        assert!((one - 0.6827).abs() < 3e-3, "P(|ε| ≤ 1) = {one}");
        assert!((two - 0.9545).abs() < 3e-3, "P(|ε| ≤ 2) = {two}");
        assert!(e.iter().all(|v| v.is_finite()));
    }
}
