//! The other direction: images → latents (img2img, inpainting, video-to-video).
//!
//! An encode runs untiled (one recorded forward, one submit) or tiled with
//! the decode's machinery ([`crate::tiling`]): `exact` tiles (halos through
//! every stride-2 conv, global GroupNorm statistics, the mid-block attention
//! over all latent tokens) equal the untiled encode up to float rounding
//! within a memory budget; `fast` encodes overlapping tiles independently and
//! blends their moments like diffusers' `tiled_encode`; `auto` (the default)
//! encodes untiled whenever that fits the budget and the device's limits.

use std::path::Path;

use crate::decode::{
    blend_h, blend_v, choose_exact, ensure_plan_with, ensure_recorded_plan, fits_budget, round_to,
    FastTile, Pyramid,
};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, Recorder};
use crate::io::HostTensor;
use crate::memory::{MemoryStats, PlannedPool, Policy};
use crate::models::config::AutoencoderKlConfig;
use crate::models::encoder::{AutoencoderKlEncoder, TaeEncoder};
use crate::models::{Layout, LoadOptions, TaePart, WeightStore};
use crate::tensor::{DType, Tensor};
use crate::tiling::{
    ExactPlan, Executor, Progress, ProgressUpdate, TileMode, Tiling, TilingReport,
    FAST_DEFAULT_TILE,
};

/// The encoder behind a [`VaeEncoder`].
// One per loaded model: the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum EncoderKind {
    /// An AutoencoderKL encoder: outputs the moments (mean, log-variance).
    Kl(AutoencoderKlEncoder),
    /// A TAE encoder: outputs the latents directly (deterministic).
    Tae(TaeEncoder),
}

/// A loaded VAE encoder, weights on the device.
pub struct VaeEncoder {
    /// The network.
    pub encoder: EncoderKind,
    /// Human-readable description: kind and source.
    pub name: String,
    /// Bytes of weights uploaded.
    pub weights_bytes: u64,
    /// Storage dtype of weights and activations.
    pub dtype: DType,
    /// Process-unique id (memory plans are cached per model and shape).
    id: u64,
    /// What was loaded, to load it again in bf16 after an f16 overflow.
    source: Option<(String, LoadOptions)>,
    /// The same encoder in bf16, loaded on the first f16 overflow.
    bf16_twin: std::sync::OnceLock<Box<VaeEncoder>>,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

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
    /// Latents [N, C, H/8, W/8]: pipeline latents unless `raw_latents`.
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

impl VaeEncoder {
    /// Loads an encoder: a diffusers folder or a .safetensors file with an
    /// AutoencoderKL encoder (diffusers or LDM keys), or a TAE encoder file.
    pub fn load(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        let before = ctx.pool().stats().allocated_bytes.current;
        let mut enc = Self::load_inner(ctx, spec, opts)?;
        enc.source = Some((spec.to_string(), opts.clone()));
        enc.weights_bytes = ctx
            .pool()
            .stats()
            .allocated_bytes
            .current
            .saturating_sub(before);
        Ok(enc)
    }

    fn load_inner(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        if let Some(name) = spec.strip_prefix("preset:") {
            let cfg = AutoencoderKlConfig::preset(name)?;
            let store = if ctx.is_dry_run() {
                WeightStore::zeros()
            } else {
                WeightStore::random(opts.seed)
            };
            store.set_dtype(opts.precision.resolve(cfg.is_f16_safe()));
            let mut enc = Self::from_kl_config(ctx, &cfg, &store)?;
            enc.name = format!("{name} preset encoder (random weights, seed {})", opts.seed);
            return Ok(enc);
        }
        let (weights, config) = crate::models::locate_weights(Path::new(spec), opts)?;
        let store = WeightStore::from_safetensors_part(&weights, TaePart::Encoder)?;
        if store.layout() == Layout::Tae {
            let dtype = opts.precision.resolve(true);
            store.set_dtype(dtype);
            let tae = TaeEncoder::load(ctx, &store)?;
            return Ok(VaeEncoder {
                dtype,
                source: None,
                bf16_twin: Default::default(),
                name: format!(
                    "TAE encoder, {} latent channels ({})",
                    tae.latent_channels,
                    weights.display()
                ),
                encoder: EncoderKind::Tae(tae),
                weights_bytes: 0,
                id: next_id(),
            });
        }
        let cfg = crate::models::resolve_config(&store, config.as_deref(), opts)?;
        let dtype = opts.precision.resolve(cfg.is_f16_safe());
        store.set_dtype(dtype);
        Ok(VaeEncoder {
            dtype,
            source: None,
            bf16_twin: Default::default(),
            encoder: EncoderKind::Kl(AutoencoderKlEncoder::load(ctx, &cfg, &store)?),
            name: format!(
                "AutoencoderKL encoder ({:?} layout, {})",
                store.layout(),
                weights.display()
            ),
            weights_bytes: 0,
            id: next_id(),
        })
    }

    /// An AutoencoderKL encoder of `config` with the weights in `store`
    /// (diffusers names), e.g. [`WeightStore::random`] for tests and studies.
    pub fn from_kl_config(
        ctx: &Context,
        config: &AutoencoderKlConfig,
        store: &WeightStore,
    ) -> Result<VaeEncoder> {
        let before = ctx.pool().stats().allocated_bytes.current;
        let kl = AutoencoderKlEncoder::load(ctx, config, store)?;
        Ok(VaeEncoder {
            dtype: store.dtype(),
            source: None,
            bf16_twin: Default::default(),
            encoder: EncoderKind::Kl(kl),
            name: format!("AutoencoderKL encoder ({})", store.origin()),
            weights_bytes: ctx
                .pool()
                .stats()
                .allocated_bytes
                .current
                .saturating_sub(before),
            id: next_id(),
        })
    }

    /// This encoder in bf16 (loaded once, on first use, from the same file
    /// or preset): where an f16 encode overflowed.
    pub fn bf16_twin(&self, ctx: &Context) -> Result<&VaeEncoder> {
        if let Some(t) = self.bf16_twin.get() {
            return Ok(t);
        }
        let (spec, opts) = self.source.as_ref().ok_or_else(|| {
            Error::Unsupported("this encoder was not loaded from a file or preset".into())
        })?;
        let opts = LoadOptions {
            precision: crate::models::Precision::BF16,
            ..opts.clone()
        };
        let twin = Box::new(VaeEncoder::load(ctx, spec, &opts)?);
        Ok(self.bf16_twin.get_or_init(|| twin))
    }

    /// Latent channels of the output (AutoencoderKL: of the mean).
    pub fn latent_channels(&self) -> usize {
        match &self.encoder {
            EncoderKind::Kl(k) => k.config.latent_channels,
            EncoderKind::Tae(t) => t.latent_channels,
        }
    }

    /// Resolution levels: the image's, then one per stride-2 conv (the last
    /// is the latent's).
    pub fn levels(&self) -> usize {
        match &self.encoder {
            EncoderKind::Kl(k) => k.levels(),
            EncoderKind::Tae(t) => t.levels(),
        }
    }

    /// Image pixels per latent pixel along each axis.
    pub fn downscale(&self) -> usize {
        1 << (self.levels() - 1)
    }
}

/// Reads an image as [1, 3, H, W] pixel values 0–255 (alpha dropped).
/// Sizes must be multiples of 8, or `pad` extends the right and bottom
/// edges by replication to the next multiple.
pub fn load_image(path: &Path, pad: bool) -> Result<HostTensor> {
    let img = image::open(path)
        .map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            message: format!("not a readable image: {e}"),
        })?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let (pw, ph) = (w.div_ceil(8) * 8, h.div_ceil(8) * 8);
    if (pw, ph) != (w, h) && !pad {
        return Err(Error::BadFile {
            path: path.to_path_buf(),
            message: format!("{w}×{h} is not a multiple of 8 in each dimension; crop it, or pass --pad to extend the edges to {pw}×{ph}"),
        });
    }
    let mut data = vec![0.0f32; 3 * ph * pw];
    for c in 0..3 {
        for y in 0..ph {
            for x in 0..pw {
                let p = img.get_pixel(x.min(w - 1) as u32, y.min(h - 1) as u32);
                data[(c * ph + y) * pw + x] = p[c] as f32;
            }
        }
    }
    HostTensor::new(vec![1, 3, ph, pw], data)
}

/// How one encode runs.
enum Strategy {
    Untiled,
    Exact(ExactPlan),
    Fast { px: usize, overlap: usize },
}

/// Encodes `pixels` [N, 3, H, W] (values 0–255), untiled or tiled as
/// `opts.tiling` says. In a dry-run context nothing runs and only the memory
/// figures are real.
pub fn encode(
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
                "--sample: TAE encoders are deterministic (they output latents, not a distribution); sampling needs an AutoencoderKL encoder".into(),
            ));
        }
    }
    // diffusers: png / 127.5 − 1; TAE: png / 255.
    let x = HostTensor {
        shape: pixels.shape.clone(),
        data: match enc.encoder {
            EncoderKind::Kl(_) => pixels.data.iter().map(|v| v / 127.5 - 1.0).collect(),
            EncoderKind::Tae(_) => pixels.data.iter().map(|v| v / 255.0).collect(),
        },
    };
    let budget = opts.tiling.budget(ctx.caps());
    let base = ctx.pool().stats().allocated_bytes.current;
    let (moments, memory, mut tiling, overflows) =
        match choose_strategy(ctx, enc, &x, opts, budget, base)? {
            Strategy::Untiled => encode_untiled(ctx, enc, &x)?,
            Strategy::Exact(plan) => encode_exact(ctx, enc, &x, plan, opts.progress.clone())?,
            Strategy::Fast { px, overlap } => encode_fast(ctx, enc, &x, px, overlap, opts)?,
        };
    tiling.max_memory = budget;
    if overflows > 0 {
        // Values beyond ±65504 were saturated: the latents are wrong. bf16
        // has f32's range; encode again with a bf16 copy of the encoder.
        let twin = enc.bf16_twin(ctx)?;
        let note = format!(
            "f16 overflow: {overflows} values beyond ±65504 (or NaN) in {}; re-encoded in bf16",
            enc.name
        );
        log::warn!("{note}");
        let mut again = encode(ctx, twin, pixels, opts)?;
        again.f16_overflows = overflows;
        again.precision_note = Some(note);
        return Ok(again);
    }
    let mut out = finish(enc, moments, memory, tiling, opts)?;
    out.dtype = enc.dtype;
    Ok(out)
}

/// (output on the host, pool statistics, tiling report, f16 overflow count).
type EncodeRun = (HostTensor, MemoryStats, TilingReport, u64);

/// Records the upload of encoder input `x` [N, 3, H, W] and the encoder →
/// its output [N, C, H/8, W/8] (AutoencoderKL: the moments, 2·latent channels).
///
/// f16 encoders first allocate the recorder's overflow counter
/// ([`Recorder::track_f16_range`]); read it after the submit.
fn record_encode(rec: &mut Recorder, enc: &VaeEncoder, x: &HostTensor) -> Result<Tensor> {
    if enc.dtype == DType::F16 && rec.range_flag().is_none() {
        rec.track_f16_range()?;
    }
    let input = Tensor::from_f32_in(rec, &x.shape, &x.data, "image")?;
    match &enc.encoder {
        EncoderKind::Kl(k) => k.forward(rec, input),
        EncoderKind::Tae(t) => t.forward(rec, input),
    }
}

/// One untiled encode of `x`: the output on the host (zeros in dry runs)
/// and the pool's statistics over it.
fn encode_untiled(ctx: &Context, enc: &VaeEncoder, x: &HostTensor) -> Result<EncodeRun> {
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let key = match planned {
        Some(p) => ensure_recorded_plan(ctx, p, format!("enc{}:{:?}", enc.id, x.shape), |rec| {
            record_encode(rec, enc, x)
        })?,
        None => None,
    };
    ctx.pool().reset_peak_stats();
    let mut rec = Recorder::new(ctx);
    if let (Some(p), Some(k)) = (planned, &key) {
        p.begin_replay(k)?;
    }
    let recorded = record_encode(&mut rec, enc, x);
    if let Some(p) = planned {
        p.end_replay();
    }
    let out = recorded?;
    let counter = rec.range_flag().cloned();
    rec.submit()?;
    let memory = ctx.pool().stats();
    let (values, overflows) = read_output(ctx, &out, counter.as_ref())?;
    let report = TilingReport {
        mode: "untiled".into(),
        tiles: 1,
        steps: 1,
        ..Default::default()
    };
    Ok((
        HostTensor::new(out.shape().to_vec(), values)?,
        memory,
        report,
        overflows,
    ))
}

/// An encoder output as f32 and the f16 overflow count, in one read back
/// (zeros in dry runs).
fn read_output(ctx: &Context, out: &Tensor, counter: Option<&Tensor>) -> Result<(Vec<f32>, u64)> {
    if ctx.is_dry_run() {
        return Ok((vec![0.0; out.numel()], 0));
    }
    let mut wanted = vec![out];
    wanted.extend(counter);
    let mut back = crate::gpu::read_back(ctx, &wanted)?.into_iter();
    let values = out.f32_from_bytes(&back.next().unwrap_or_default())?;
    let overflows = back.next().map_or(0, |b| crate::gpu::range_count(&b));
    Ok((values, overflows as u64))
}

fn choose_strategy(
    ctx: &Context,
    enc: &VaeEncoder,
    x: &HostTensor,
    opts: &EncodeOptions,
    budget: u64,
    base: u64,
) -> Result<Strategy> {
    let tiling = &opts.tiling;
    let scale = enc.downscale();
    let untiled_fits = |x: &HostTensor| {
        fits_budget(ctx, budget, base, |dry| {
            let mut rec = Recorder::new(dry);
            record_encode(&mut rec, enc, x).map(|_| ())
        })
    };
    match tiling.mode {
        TileMode::Off => Ok(Strategy::Untiled),
        TileMode::Auto if untiled_fits(x)? => Ok(Strategy::Untiled),
        TileMode::Auto | TileMode::Exact => Ok(Strategy::Exact(choose_exact_encode(
            ctx, enc, x, tiling, budget, base,
        )?)),
        TileMode::Fast => {
            let mut px = round_to(tiling.tile_size.unwrap_or(FAST_DEFAULT_TILE), scale);
            loop {
                let overlap = tiling.overlap.unwrap_or(px / 4 / scale * scale);
                if !overlap.is_multiple_of(scale) || overlap >= px {
                    return Err(Error::InvalidInput(format!(
                        "--tile-overlap {overlap}: must be a multiple of {scale} below the tile size {px}"
                    )));
                }
                // The largest tile must encode within the budget.
                let (n, h, w) = (x.shape[0], x.shape[2].min(px), x.shape[3].min(px));
                let probe = HostTensor {
                    shape: vec![n, 3, h, w],
                    data: vec![0.0; n * 3 * h * w],
                };
                if untiled_fits(&probe)? {
                    return Ok(Strategy::Fast { px, overlap });
                }
                if tiling.tile_size.is_some() || px <= 8 * scale {
                    return Err(Error::InvalidInput(format!(
                        "a {px}-pixel fast tile does not encode within the memory budget of {budget} bytes; lower --tile-size or raise --max-memory"
                    )));
                }
                px = round_to(px / 2, scale);
            }
        }
    }
}

/// The exact plan with the largest image tile that fits `budget`.
fn choose_exact_encode(
    ctx: &Context,
    enc: &VaeEncoder,
    x: &HostTensor,
    tiling: &Tiling,
    budget: u64,
    base: u64,
) -> Result<ExactPlan> {
    let scale = enc.downscale();
    let (h, w) = (x.shape[2], x.shape[3]);
    if h % scale != 0 || w % scale != 0 {
        return Err(Error::InvalidInput(format!(
            "a tiled encode needs image sides that are multiples of {scale}, got {h}×{w}"
        )));
    }
    let pyramid = Pyramid {
        levels: enc.levels(),
        scale,
        small: (h / scale, w / scale),
    };
    let run = |dry: &Context, plan: &ExactPlan| {
        run_exact(dry, enc, x, plan.clone(), None).map(|(_, _, report, _)| report)
    };
    choose_exact(
        ctx,
        pyramid,
        tiling,
        budget,
        base,
        "encodes this image",
        &run,
    )
}

/// An exact tiled encode's output shape, its host bytes as f32 (`None` in
/// dry runs), the report and the f16 overflow count.
type ExactRun = ([usize; 4], Option<Vec<u8>>, TilingReport, u64);

/// Runs an exact tiled encode: the output's shape and host bytes (`None` in
/// dry runs), the report and the f16 overflow count.
fn run_exact(
    ctx: &Context,
    enc: &VaeEncoder,
    x: &HostTensor,
    plan: ExactPlan,
    progress: Option<Progress>,
) -> Result<ExactRun> {
    let mut ex = Executor::new(ctx, plan, progress);
    let counter = match enc.dtype {
        DType::F16 => Some(ex.track_f16_range()?),
        _ => None,
    };
    let shape = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let image = ex.host_act(shape, &x.data);
    let out = match &enc.encoder {
        EncoderKind::Kl(k) => k.forward_tiled(&mut ex, image)?,
        EncoderKind::Tae(t) => t.forward_tiled(&mut ex, image)?,
    };
    let shape = [out.n, out.c, out.h, out.w];
    let dtype = out.dtype();
    // Half encoders leave their output in 16 bits: widen to f32 bytes.
    let data = match ex.gather_host(out)? {
        Some(b) => {
            Some(bytemuck::cast_slice(&crate::tensor::f32_from_bytes_of(dtype, &b)?).to_vec())
        }
        None => None,
    };
    let report = ex.finish()?;
    let overflows = match &counter {
        Some(c) => crate::gpu::read_range_flag(ctx, c)? as u64,
        None => 0,
    };
    Ok((shape, data, report, overflows))
}

fn encode_exact(
    ctx: &Context,
    enc: &VaeEncoder,
    x: &HostTensor,
    plan: ExactPlan,
    progress: Option<Progress>,
) -> Result<EncodeRun> {
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let key = match planned {
        Some(p) => {
            let key = format!("enc{}:{:?}:{}", enc.id, x.shape, plan.key());
            ensure_plan_with(ctx, p, key, |dry| {
                run_exact(dry, enc, x, plan.clone(), None).map(|_| ())
            })?
        }
        None => None,
    };
    ctx.pool().reset_peak_stats();
    if let (Some(p), Some(key)) = (planned, &key) {
        p.begin_replay(key)?;
    }
    let result = run_exact(ctx, enc, x, plan, progress);
    if let Some(p) = planned {
        p.end_replay();
    }
    let (shape, data, mut report, overflows) = result?;
    let memory = ctx.pool().stats();
    let (h, w) = (x.shape[2], x.shape[3]);
    let px = report.tile_size.unwrap_or(h.max(w)).max(1);
    report.tiles = h.div_ceil(px) * w.div_ceil(px);
    let values = match data {
        Some(b) => bytemuck::pod_collect_to_vec::<u8, f32>(&b),
        None => vec![0.0; shape.iter().product()],
    };
    Ok((
        HostTensor::new(shape.to_vec(), values)?,
        memory,
        report,
        overflows,
    ))
}

/// Fast tiling as diffusers' `AutoencoderKL._tiled_encode`: image tiles of
/// `px` pixels with a stride of `px - overlap`, each encoded independently
/// (its own GroupNorm statistics and attention), their outputs blended in
/// raster order over `overlap / 8` latent pixels with linear ramps (in place,
/// so later tiles blend with already blended neighbours) and cropped to
/// `(px - overlap) / 8`.
fn encode_fast(
    ctx: &Context,
    enc: &VaeEncoder,
    x: &HostTensor,
    px: usize,
    overlap: usize,
    opts: &EncodeOptions,
) -> Result<EncodeRun> {
    let scale = enc.downscale();
    let [n, _, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let stride = px - overlap;
    let (extent, limit) = (overlap / scale, (px - overlap) / scale);
    let (lh, lw) = (h / scale, w / scale);
    let rows: Vec<usize> = (0..h).step_by(stride).collect();
    let cols: Vec<usize> = (0..w).step_by(stride).collect();
    let total = rows.len() * cols.len();
    let dry = ctx.is_dry_run();
    ctx.pool().reset_peak_stats();
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let mut out: Option<Vec<f32>> = None;
    let mut channels = 0;
    let mut prev: Vec<FastTile> = Vec::new();
    let (mut out_y, mut done, mut readback, mut held_peak) = (0, 0, 0u64, 0u64);
    let mut overflows = 0u64;
    // Host bytes of tile outputs kept for blending (this row and the last).
    let held = |tiles: &[FastTile], planes: usize| -> u64 {
        tiles.iter().map(|t| (planes * t.h * t.w * 4) as u64).sum()
    };
    for &i in &rows {
        let mut row: Vec<FastTile> = Vec::new();
        let (mut out_x, mut crop_h) = (0, 0);
        for (ci, &j) in cols.iter().enumerate() {
            let xt = x.crop(i, (i + px).min(h), j, (j + px).min(w));
            let key = match planned {
                Some(p) => {
                    ensure_recorded_plan(ctx, p, format!("enc{}:{:?}", enc.id, xt.shape), |rec| {
                        record_encode(rec, enc, &xt)
                    })?
                }
                None => None,
            };
            let mut rec = Recorder::new(ctx);
            if let (Some(p), Some(k)) = (planned, &key) {
                p.begin_replay(k)?;
            }
            let recorded = record_encode(&mut rec, enc, &xt);
            if let Some(p) = planned {
                p.end_replay();
            }
            let t = recorded?;
            let counter = rec.range_flag().cloned();
            rec.submit()?;
            let [_, c, th, tw] = crate::models::layers::dims4(&t)?;
            let planes = n * c;
            channels = c;
            readback += t.byte_size();
            let (data, counted) = match dry {
                true => (Vec::new(), 0),
                false => read_output(ctx, &t, counter.as_ref())?,
            };
            overflows += counted;
            let mut tile = FastTile { h: th, w: tw, data };
            drop((t, counter));
            if !dry {
                if let Some(above) = prev.get(ci) {
                    blend_v(above, &mut tile, planes, extent);
                }
                if let Some(left) = row.last() {
                    blend_h(left, &mut tile, planes, extent);
                }
            }
            let (ch, cw) = (limit.min(th), limit.min(tw));
            if !dry {
                let o = out.get_or_insert_with(|| vec![0.0; planes * lh * lw]);
                for p in 0..planes {
                    for y in 0..ch {
                        let src = (p * th + y) * tw;
                        let dst = (p * lh + out_y + y) * lw + out_x;
                        o[dst..dst + cw].copy_from_slice(&tile.data[src..src + cw]);
                    }
                }
            }
            out_x += cw;
            crop_h = ch;
            row.push(tile);
            held_peak = held_peak.max(held(&prev, planes) + held(&row, planes));
            done += 1;
            if let Some(p) = &opts.progress {
                (p.0)(ProgressUpdate {
                    done,
                    total,
                    stage: "fast tile",
                });
            }
        }
        out_y += crop_h;
        prev = row;
    }
    debug_assert!(out_y == lh);
    let memory = ctx.pool().stats();
    let data = out.unwrap_or_else(|| vec![0.0; n * channels * lh * lw]);
    let report = TilingReport {
        mode: "fast".into(),
        tile_size: Some(px),
        overlap: Some(overlap),
        tiles: total,
        steps: total,
        readback_bytes: readback,
        syncs: total,
        host_parked_peak_bytes: held_peak,
        ..Default::default()
    };
    Ok((
        HostTensor::new(vec![n, channels, lh, lw], data)?,
        memory,
        report,
        overflows,
    ))
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
    if !opts.raw_latents {
        let (sf, shift) = (k.config.scaling_factor, k.config.shift());
        z.iter_mut().for_each(|v| *v = (*v - shift) * sf);
    }
    let lshape = vec![n, l, lh, lw];
    Ok(Encoded {
        memory,
        latents: HostTensor::new(lshape.clone(), z)?,
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

/// Predicts the pool's peaks for encoding images of `image_shape`
/// [N, 3, H, W] untiled (see [`crate::decode::estimate_decode`] and
/// [`estimate_encode_with`]).
pub fn estimate_encode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    image_shape: [usize; 4],
) -> Result<crate::decode::MemoryEstimate> {
    estimate_encode_with(caps, policy, vae_spec, load, image_shape, &Tiling::off())
}

/// [`estimate_encode`] of an encode tiled as `tiling` says (the same choices
/// [`encode`] makes with these options on a device with `caps`).
pub fn estimate_encode_with(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    image_shape: [usize; 4],
    tiling: &Tiling,
) -> Result<crate::decode::MemoryEstimate> {
    let dry = Context::dry_run(caps.clone(), policy.new_pool());
    let enc = VaeEncoder::load(&dry, vae_spec, load)?;
    let pixels = HostTensor::new(
        image_shape.to_vec(),
        vec![0.0; image_shape.iter().product()],
    )?;
    let opts = EncodeOptions {
        tiling: tiling.clone(),
        ..Default::default()
    };
    let out = encode(&dry, &enc, &pixels, &opts)?;
    Ok(crate::decode::MemoryEstimate {
        policy: policy.name(),
        model: enc.name.clone(),
        latents_shape: out.latents.shape.clone(),
        image_shape: image_shape.to_vec(),
        weights_bytes: enc.weights_bytes,
        peak_allocated_bytes: out.memory.allocated_bytes.peak,
        peak_reserved_bytes: out.memory.reserved_bytes.peak,
        tiling: out.tiling,
    })
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
