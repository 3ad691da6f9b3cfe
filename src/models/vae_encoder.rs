//! A loaded VAE encoder (AutoencoderKL or TAE), the model behind
//! [`crate::encode::encode`].

use std::path::Path;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::models::config::AutoencoderKlConfig;
use crate::models::encoder::{AutoencoderKlEncoder, TaeEncoder};
use crate::models::graph::Graph;
use crate::models::{Layout, LoadOptions, TaePart, WeightStore};
use crate::tensor::DType;

/// The encoder behind a [`VaeEncoder`].
// One per loaded model: the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum EncoderKind {
    /// An AutoencoderKL encoder: outputs the moments (mean, log-variance).
    Kl(AutoencoderKlEncoder),
    /// A TAE encoder: outputs the latents directly (deterministic).
    Tae(TaeEncoder),
}

impl EncoderKind {
    /// The network's graph (every executor runs it).
    pub(crate) fn graph(&self) -> &Graph {
        match self {
            EncoderKind::Kl(k) => &k.graph,
            EncoderKind::Tae(t) => &t.graph,
        }
    }
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
    pub(crate) id: u64,
    /// What was loaded, to load it again in bf16 after an f16 overflow.
    source: Option<(String, LoadOptions)>,
    /// The same encoder in bf16, loaded on the first f16 overflow.
    bf16_twin: std::sync::OnceLock<Box<VaeEncoder>>,
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl VaeEncoder {
    /// Loads an encoder: a diffusers folder or a .safetensors file with an
    /// AutoencoderKL encoder (diffusers or LDM keys), or a TAE encoder file.
    pub fn load(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        let (mut enc, bytes) =
            crate::models::weights_loaded_by(ctx, || Self::load_inner(ctx, spec, opts))?;
        enc.source = Some((spec.to_string(), opts.clone()));
        enc.weights_bytes = bytes;
        Ok(enc)
    }

    fn load_inner(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        if let Some(name) = spec.strip_prefix("preset:") {
            let cfg = AutoencoderKlConfig::preset(name)?;
            let store = crate::models::weights::WeightStore::random(opts.seed);
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
            EncoderKind::Kl(k) => k.levels,
            EncoderKind::Tae(t) => t.levels,
        }
    }

    /// Image pixels per latent pixel along each axis.
    pub fn downscale(&self) -> usize {
        1 << (self.levels() - 1)
    }
}
