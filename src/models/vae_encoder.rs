//! A loaded VAE encoder (AutoencoderKL or TAE), the model behind
//! [`crate::encode::encode`].

use std::path::Path;

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::models::config::AutoencoderKlConfig;
use crate::models::encoder::{AutoencoderKlEncoder, TaeEncoder};
use crate::models::graph::Graph;
use crate::models::{Bf16Twin, Layout, LoadOptions, TaePart, WeightStore};
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
    pub(crate) encoder: EncoderKind,
    /// Human-readable description: kind and source.
    pub(crate) name: String,
    /// Bytes of weights uploaded.
    pub(crate) weights_bytes: u64,
    /// Storage dtype of weights and activations.
    pub(crate) dtype: DType,
    /// Process-unique id (memory plans are cached per model and shape).
    pub(crate) id: u64,
    /// (latent channels, resolution levels) of the network.
    shape: (usize, usize),
    /// The same encoder in bf16, loaded on the first f16 overflow.
    bf16_twin: Bf16Twin<VaeEncoder>,
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
        enc.bf16_twin.loaded_from(spec, opts);
        enc.weights_bytes = bytes;
        Ok(enc)
    }

    fn load_inner(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<VaeEncoder> {
        if crate::models::qwen_image::is_qwen_image(spec, opts.config.as_deref()) {
            return Err(Error::Unsupported(format!(
                "`{spec}` is a Qwen-Image VAE: its encoder (the Wan 2.1 encoder on one frame) is not implemented; wgvae decodes Qwen-Image latents only"
            )));
        }
        if crate::models::qwen_image21::is_qwen_image21(spec, opts.config.as_deref()) {
            return Err(Error::Unsupported(format!(
                "`{spec}` is a Qwen-Image 2.1 VAE: its encoder (RGBA in, `in_channels` 4) is not implemented; wgvae decodes Qwen-Image 2.1 latents only"
            )));
        }
        if let Some(name) = spec.strip_prefix("preset:") {
            let cfg = AutoencoderKlConfig::preset(name)?;
            let store = crate::models::weights::WeightStore::random_for(ctx, opts.seed);
            store.set_dtype(opts.precision.resolve(cfg.is_f16_safe(), ctx.caps()));
            let mut enc = Self::from_kl_config(ctx, &cfg, &store)?;
            enc.name = format!("{name} preset encoder (random weights, seed {})", opts.seed);
            return Ok(enc);
        }
        let (weights, config) = crate::models::locate_weights(Path::new(spec), opts)?;
        let store = WeightStore::from_safetensors_part(&weights, TaePart::Encoder)?;
        if store.layout() == Layout::Taehv {
            return Err(Error::Unsupported(format!(
                "`{}` holds a TAEHV video encoder: it encodes video frames (`Vae::load_encoder` of the TAEHV file, `wgvae::video_encode::encode_video`), not images",
                weights.display()
            )));
        }
        if store.layout() == Layout::Tae {
            let dtype = opts.precision.resolve(true, ctx.caps());
            store.set_dtype(dtype);
            let tae = TaeEncoder::load(ctx, &store)?;
            let name = format!(
                "TAE encoder, {} latent channels ({})",
                tae.latent_channels,
                weights.display()
            );
            return Ok(VaeEncoder::new(EncoderKind::Tae(tae), name, dtype));
        }
        let cfg = crate::models::resolve_config(&store, config.as_deref(), opts)?;
        let dtype = opts.precision.resolve(cfg.is_f16_safe(), ctx.caps());
        store.set_dtype(dtype);
        let kl = AutoencoderKlEncoder::load(ctx, &cfg, &store)?;
        let name = format!(
            "AutoencoderKL encoder ({:?} layout, {})",
            store.layout(),
            weights.display()
        );
        Ok(VaeEncoder::new(EncoderKind::Kl(kl), name, dtype))
    }

    fn new(encoder: EncoderKind, name: String, dtype: DType) -> VaeEncoder {
        let shape = match &encoder {
            EncoderKind::Kl(k) => (k.config.latent_channels, k.levels),
            EncoderKind::Tae(t) => (t.latent_channels, t.levels),
        };
        VaeEncoder {
            encoder,
            shape,
            name,
            weights_bytes: 0,
            dtype,
            id: next_id(),
            bf16_twin: Default::default(),
        }
    }

    /// An AutoencoderKL encoder of `config` with the weights in `store`
    /// (diffusers names), e.g. [`WeightStore::random`] for tests and studies.
    pub fn from_kl_config(
        ctx: &Context,
        config: &AutoencoderKlConfig,
        store: &WeightStore,
    ) -> Result<VaeEncoder> {
        let (kl, bytes) = crate::models::weights_loaded_by(ctx, || {
            AutoencoderKlEncoder::load(ctx, config, store)
        })?;
        let name = format!("AutoencoderKL encoder ({})", store.origin());
        let mut enc = VaeEncoder::new(EncoderKind::Kl(kl), name, store.dtype());
        enc.weights_bytes = bytes;
        Ok(enc)
    }

    /// This encoder in bf16 (loaded once, on first use, from the same file
    /// or preset): where an f16 encode overflowed.
    pub(crate) fn bf16_twin(&self, ctx: &Context) -> Result<&VaeEncoder> {
        self.bf16_twin
            .get("encoder", |spec, opts| VaeEncoder::load(ctx, spec, opts))
    }

    /// Human-readable description: kind and source.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of weights uploaded.
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }

    /// Storage dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// A TAE encoder (outputs latents directly; no moments to sample from).
    pub fn is_tae(&self) -> bool {
        matches!(self.encoder, EncoderKind::Tae(_))
    }

    /// AutoencoderKL: `(scaling_factor, shift_factor)` its scaled latents
    /// apply (`(z − shift) · scale`); TAE: `None` (latents as they come).
    pub fn scaling(&self) -> Option<(f32, f32)> {
        match &self.encoder {
            EncoderKind::Kl(k) => Some((k.config.scaling_factor, k.config.shift())),
            EncoderKind::Tae(_) => None,
        }
    }

    /// Latent channels of the output (AutoencoderKL: of the mean).
    pub fn latent_channels(&self) -> usize {
        self.shape.0
    }

    /// Resolution levels: the image's, then one per stride-2 conv (the last
    /// is the latent's).
    pub fn levels(&self) -> usize {
        self.shape.1
    }

    /// Image pixels per latent pixel along each axis.
    pub fn downscale(&self) -> usize {
        1 << (self.levels() - 1)
    }
}
