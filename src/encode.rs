//! The other direction: images → latents (img2img, inpainting, video-to-video).

use std::path::Path;

use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context, Recorder};
use crate::io::HostTensor;
use crate::memory::{PlannedPool, Policy};
use crate::models::config::AutoencoderKlConfig;
use crate::models::encoder::{AutoencoderKlEncoder, TaeEncoder};
use crate::models::{Layout, LoadOptions, WeightStore};
use crate::tensor::Tensor;

/// The encoder behind a [`VaeEncoder`].
pub enum EncoderKind {
    Kl(AutoencoderKlEncoder),
    Tae(TaeEncoder),
}

/// A loaded VAE encoder, weights on the device.
pub struct VaeEncoder {
    pub encoder: EncoderKind,
    pub name: String,
    /// Bytes of weights uploaded.
    pub weights_bytes: u64,
    /// Process-unique id (memory plans are cached per model and shape).
    id: u64,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Options for [`encode`].
#[derive(Clone, Debug, Default)]
pub struct EncodeOptions {
    /// Sample `mean + std·ε` with this seed instead of returning the mean (AutoencoderKL).
    pub sample: Option<u64>,
    /// Return raw latents (skip `(z − shift_factor) · scaling_factor`).
    pub raw_latents: bool,
}

/// What an encode produced.
pub struct Encoded {
    /// Pool statistics, peaks over this encode (weights included).
    pub memory: crate::memory::MemoryStats,
    /// Latents [N, C, H/8, W/8]: pipeline latents unless `raw_latents`.
    pub latents: HostTensor,
    /// The distribution's raw mean and std (AutoencoderKL only).
    pub mean: Option<HostTensor>,
    pub std: Option<HostTensor>,
}

impl VaeEncoder {
    /// Loads an encoder: a diffusers folder or a .safetensors file with an
    /// AutoencoderKL encoder (diffusers or LDM keys), or a TAE encoder file.
    pub fn load(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        let before = ctx.pool().stats().allocated_bytes.current;
        let mut enc = Self::load_inner(ctx, spec, opts)?;
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
            return Ok(VaeEncoder {
                encoder: EncoderKind::Kl(AutoencoderKlEncoder::load(ctx, &cfg, &store)?),
                name: format!("{name} preset encoder (random weights, seed {})", opts.seed),
                weights_bytes: 0,
                id: next_id(),
            });
        }
        let (weights, config) = crate::models::locate_weights(Path::new(spec), opts)?;
        let store = WeightStore::from_safetensors(&weights)?;
        if store.layout() == Layout::Tae {
            store.set_dtype(opts.precision.resolve(true));
            let tae = TaeEncoder::load(ctx, &store)?;
            return Ok(VaeEncoder {
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
        store.set_dtype(opts.precision.resolve(cfg.is_f16_safe()));
        Ok(VaeEncoder {
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

    pub fn latent_channels(&self) -> usize {
        match &self.encoder {
            EncoderKind::Kl(k) => k.config.latent_channels,
            EncoderKind::Tae(t) => t.latent_channels,
        }
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

/// Encodes `pixels` [N, 3, H, W] (values 0–255).
pub fn encode(
    ctx: &Context,
    enc: &VaeEncoder,
    pixels: &HostTensor,
    opts: &EncodeOptions,
) -> Result<Encoded> {
    let &[n, c, h, w] = pixels.shape.as_slice() else {
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
    // diffusers: png / 127.5 − 1; TAE: png / 255.
    let x: Vec<f32> = match enc.encoder {
        EncoderKind::Kl(_) => pixels.data.iter().map(|v| v / 127.5 - 1.0).collect(),
        EncoderKind::Tae(_) => pixels.data.iter().map(|v| v / 255.0).collect(),
    };
    let record = |rec: &mut Recorder| -> Result<Tensor> {
        let input = Tensor::from_f32_in(rec, &pixels.shape, &x, "image")?;
        match &enc.encoder {
            EncoderKind::Kl(k) => k.forward(rec, input),
            EncoderKind::Tae(t) => t.forward(rec, input),
        }
    };
    let planned = ctx.pool().as_any().downcast_ref::<PlannedPool>();
    let key = match planned {
        Some(p) => crate::decode::ensure_recorded_plan(
            ctx,
            p,
            format!("enc{}:{:?}", enc.id, pixels.shape),
            record,
        )?,
        None => None,
    };
    ctx.pool().reset_peak_stats();
    let mut rec = Recorder::new(ctx);
    if let (Some(p), Some(k)) = (planned, &key) {
        p.begin_replay(k)?;
    }
    let recorded = record(&mut rec);
    if let Some(p) = planned {
        p.end_replay();
    }
    let out = recorded?;
    rec.submit()?;
    let shape = out.shape().to_vec();
    let memory = ctx.pool().stats();
    let values = if ctx.is_dry_run() {
        vec![0.0; out.numel()]
    } else {
        out.to_f32(ctx)?
    };
    let (lh, lw) = (h / 8, w / 8);
    let EncoderKind::Kl(k) = &enc.encoder else {
        return Ok(Encoded {
            memory,
            latents: HostTensor::new(shape, values)?,
            mean: None,
            std: None,
        });
    };
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
            let u = crate::testing::rand_vec(2 * mean.len(), seed, 1.0);
            // Box–Muller on uniforms in (0, 1].
            mean.iter()
                .zip(&std)
                .enumerate()
                .map(|(i, (m, s))| {
                    let (u1, u2) = ((u[2 * i] * 0.5 + 0.5).max(1e-7), u[2 * i + 1] * 0.5 + 0.5);
                    let eps = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                    m + s * eps
                })
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
    })
}

/// Predicts the pool's peaks for encoding images of `image_shape`
/// [N, 3, H, W] (see [`crate::decode::estimate_decode`]).
pub fn estimate_encode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    image_shape: [usize; 4],
) -> Result<crate::decode::MemoryEstimate> {
    let dry = Context::dry_run(caps.clone(), policy.new_pool());
    let enc = VaeEncoder::load(&dry, vae_spec, load)?;
    let pixels = HostTensor::new(
        image_shape.to_vec(),
        vec![0.0; image_shape.iter().product()],
    )?;
    let out = encode(&dry, &enc, &pixels, &EncodeOptions::default())?;
    Ok(crate::decode::MemoryEstimate {
        policy: policy.name(),
        model: enc.name.clone(),
        latents_shape: out.latents.shape.clone(),
        image_shape: image_shape.to_vec(),
        weights_bytes: enc.weights_bytes,
        peak_allocated_bytes: out.memory.allocated_bytes.peak,
        peak_reserved_bytes: out.memory.reserved_bytes.peak,
        tiling: Default::default(),
    })
}
