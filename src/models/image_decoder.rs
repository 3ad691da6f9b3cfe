//! A loaded image decoder: the network and what it says of its latents
//! (form, scaling, normalisation), behind the [`Vae`](super::Vae) handle.

use std::borrow::Cow;
use std::path::Path;

use super::{
    apply_overrides, check_unscaled, locate_weights, next_vae_id, qwen_image, qwen_image21,
    resolve_config, weights_loaded_by, AutoencoderKl, AutoencoderKlConfig, Bf16Twin, Layout,
    LoadOptions, QwenImage21Decoder, QwenImageDecoder, TaeDecoder, TaehvDecoder, WeightStore,
};
use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::kernels::image::ImageRange;
use crate::latents::{LatentForm, TokenPacking};
use crate::models::graph;
use crate::tensor::DType;

/// The decoder behind a [`ImageDecoder`].
// One per loaded model: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Decoder {
    /// An AutoencoderKL decoder.
    Kl(AutoencoderKl),
    /// A TAE decoder.
    Tae(TaeDecoder),
    /// The Qwen-Image VAE (the Wan 2.1 VAE on one frame).
    QwenImage(QwenImageDecoder),
    /// The Qwen-Image 2.1 VAE (the residual Wan decoder on one frame).
    QwenImage21(QwenImage21Decoder),
}

/// A loaded VAE decoder, weights on the device. Its fields are read through
/// accessors: what was loaded does not change after loading.
pub struct ImageDecoder {
    /// The network.
    pub(crate) decoder: Decoder,
    /// Human-readable description: preset or variant and source.
    pub(crate) name: String,
    /// True for `preset:NAME` (seeded random weights).
    pub(crate) random_weights: bool,
    /// Bytes of weights uploaded.
    pub(crate) weights_bytes: u64,
    /// Process-unique id (memory plans are cached per model and shape).
    pub(crate) id: u64,
    /// Storage dtype of weights and activations.
    pub(crate) dtype: DType,
    /// The same model in bf16, loaded on the first f16 overflow.
    bf16_twin: Bf16Twin<ImageDecoder>,
}

impl ImageDecoder {
    /// The network.
    #[doc(hidden)]
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Human-readable description: preset or variant and source.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for `preset:NAME` (seeded random weights).
    pub fn random_weights(&self) -> bool {
        self.random_weights
    }

    /// Bytes of weights uploaded.
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }

    /// Process-unique id (memory plans are cached per model and shape).
    #[doc(hidden)]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Storage dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Loads `spec`: `preset:NAME` (random weights), a diffusers folder (or a
    /// pipeline folder with `vae/`), or a `.safetensors` file in diffusers, LDM
    /// or TAE layout.
    pub fn load(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<ImageDecoder> {
        let (mut vae, bytes) = weights_loaded_by(ctx, || Self::load_inner(ctx, spec, opts))?;
        vae.bf16_twin.loaded_from(spec, opts);
        vae.weights_bytes = bytes;
        Ok(vae)
    }

    fn new(decoder: Decoder, name: String, dtype: DType, random_weights: bool) -> ImageDecoder {
        ImageDecoder {
            decoder,
            name,
            random_weights,
            weights_bytes: 0,
            id: next_vae_id(),
            dtype,
            bf16_twin: Default::default(),
        }
    }

    fn load_inner(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<ImageDecoder> {
        if qwen_image21::is_qwen_image21(spec, opts.config.as_deref()) {
            if opts.scaling_factor.is_some() || opts.shift_factor.is_some() {
                return Err(Error::InvalidInput(format!(
                    "`{spec}` is a Qwen-Image 2.1 VAE: its pipeline latents are un-normalised per channel with latents_mean / latents_std (from config.json, `LoadOptions::config`), not a scaling or shift factor; drop `LoadOptions::scaling_factor` / `LoadOptions::shift_factor`"
                )));
            }
            let dtype = opts.precision.resolve(false, ctx.caps());
            let config = opts.config.as_deref();
            let dec = QwenImage21Decoder::open(ctx, spec, config, dtype, opts.seed)?;
            let random = spec.starts_with("preset:");
            let name = format!("{} [{}]", dec.name, dec.latent_stats);
            return Ok(ImageDecoder::new(
                Decoder::QwenImage21(dec),
                name,
                dtype,
                random,
            ));
        }
        if qwen_image::is_qwen_image(spec, opts.config.as_deref()) {
            if opts.scaling_factor.is_some() || opts.shift_factor.is_some() {
                return Err(Error::InvalidInput(format!(
                    "`{spec}` is a Qwen-Image VAE: its pipeline latents are un-normalised per channel with latents_mean / latents_std (from config.json, `LoadOptions::config`), not a scaling or shift factor; drop `LoadOptions::scaling_factor` / `LoadOptions::shift_factor`"
                )));
            }
            let dtype = opts.precision.resolve(false, ctx.caps());
            let config = opts.config.as_deref();
            let dec = QwenImageDecoder::open(ctx, spec, config, dtype, opts.seed)?;
            let random = spec.starts_with("preset:");
            let name = format!("{} [{}]", dec.name, dec.latent_stats);
            return Ok(ImageDecoder::new(
                Decoder::QwenImage(dec),
                name,
                dtype,
                random,
            ));
        }
        if crate::models::minimax_h3::is_minimax_h3(spec) {
            return Err(Error::InvalidInput(format!(
                "`{spec}` is a MiniMax-H3 video VAE: it decodes video latents N×C×T×h×w (`wgvae::decode_video` / `VideoDecoder`; CLI: --frames-out), not images"
            )));
        }
        if crate::models::ltx2::is_ltx2(spec) {
            return Err(Error::InvalidInput(format!(
                "`{spec}` is an LTX-2 video VAE: it decodes video latents N×C×T×h×w (`wgvae::decode_video` / `VideoDecoder`; CLI: --frames-out), not images"
            )));
        }
        if crate::models::hunyuan_video15::is_hunyuan_video15(spec) {
            return Err(Error::InvalidInput(format!(
                "`{spec}` is a HunyuanVideo 1.5 video VAE: it decodes video latents N×C×T×h×w (`wgvae::decode_video` / `VideoDecoder`; CLI: --frames-out), not images"
            )));
        }
        if crate::models::wan::is_wan_video(spec) {
            return Err(Error::InvalidInput(format!(
                "`{spec}` is a Wan video VAE: it decodes video latents N×C×T×h×w with `WanDecoder` and `wgvae::decode_video` / `VideoDecoder` (CLI: --frames-out), not images. A Qwen-Image VAE file has the same keys: name it qwen_image_vae.safetensors or give its config.json (`{}`, `LoadOptions::config`) to decode images with it",
                qwen_image::CLASS_NAME
            )));
        }
        if let Some(name) = spec.strip_prefix("preset:") {
            let mut cfg = AutoencoderKlConfig::preset(name)?;
            apply_overrides(&mut cfg, opts)?;
            let store = WeightStore::random_for(ctx, opts.seed);
            let dtype = opts.precision.resolve(cfg.is_f16_safe(), ctx.caps());
            store.set_dtype(dtype);
            let kl = AutoencoderKl::load(ctx, &cfg, &store)?;
            let name = format!("{name} preset (random weights, seed {})", opts.seed);
            return Ok(ImageDecoder::new(Decoder::Kl(kl), name, dtype, true));
        }
        let (weights, config) = locate_weights(Path::new(spec), opts)?;
        let store = WeightStore::from_safetensors(&weights)?;
        if TaehvDecoder::detect(&store) {
            return Err(Error::InvalidInput(format!(
                "`{}` is a TAEHV video decoder (256-wide first conv, MemBlocks): it decodes video latents N×T×C×h×w with `wgvae::decode_video` / `VideoDecoder`, not images",
                weights.display()
            )));
        }
        if store.layout() == Layout::Tae {
            let dtype = opts.precision.resolve(true, ctx.caps());
            store.set_dtype(dtype);
            let tae = TaeDecoder::load(ctx, &store)?;
            let name = format!("{} ({})", tae.variant_name(), weights.display());
            return Ok(ImageDecoder::new(Decoder::Tae(tae), name, dtype, false));
        }
        let cfg = resolve_config(&store, config.as_deref(), opts)?;
        let dtype = opts.precision.resolve(cfg.is_f16_safe(), ctx.caps());
        store.set_dtype(dtype);
        let kl = AutoencoderKl::load(ctx, &cfg, &store)?;
        let name = format!(
            "{} ({:?} layout, {})",
            if cfg.flux2.is_some() {
                "FLUX.2 AutoencoderKL"
            } else {
                "AutoencoderKL"
            },
            store.layout(),
            weights.display()
        );
        Ok(ImageDecoder::new(Decoder::Kl(kl), name, dtype, false))
    }

    /// [`Vae::from_kl_config`](super::Vae::from_kl_config)'s decoder.
    pub(crate) fn kl_from_store(
        ctx: &Context,
        (config, store): (&AutoencoderKlConfig, &WeightStore),
        name: &str,
    ) -> Result<ImageDecoder> {
        let (kl, bytes) = weights_loaded_by(ctx, || AutoencoderKl::load(ctx, config, store))?;
        let random = store.origin().starts_with("random");
        let mut vae = ImageDecoder::new(Decoder::Kl(kl), name.to_string(), store.dtype(), random);
        vae.weights_bytes = bytes;
        Ok(vae)
    }

    /// This model in bf16 (loaded once, on first use): where an f16 decode
    /// overflowed. Weights are read again from the same source.
    pub(crate) fn bf16_twin(&self, ctx: &Context) -> Result<&ImageDecoder> {
        self.bf16_twin
            .get("model", |spec, opts| ImageDecoder::load(ctx, spec, opts))
    }

    /// Latent channels the decoder expects.
    pub fn latent_channels(&self) -> usize {
        match &self.decoder {
            Decoder::Kl(k) => k.config.latent_channels,
            Decoder::Tae(t) => t.latent_channels,
            Decoder::QwenImage(q) => q.latent_channels(),
            Decoder::QwenImage21(q) => q.latent_channels(),
        }
    }

    /// Channels of the decoded images: 3 (RGB; alpha 255 in RGBA8 pixels)
    /// or 4 (RGBA: Qwen-Image 2.1, its alpha in RGBA8 pixels and raw output).
    pub fn image_channels(&self) -> usize {
        match &self.decoder {
            Decoder::Kl(k) => k.config.out_channels,
            Decoder::Tae(_) | Decoder::QwenImage(_) => 3,
            Decoder::QwenImage21(q) => q.image_channels(),
        }
    }

    /// Output pixels per latent along each axis.
    pub fn upscale(&self) -> usize {
        match &self.decoder {
            Decoder::Kl(k) => k.config.upscale(),
            Decoder::Tae(_) => 8,
            Decoder::QwenImage(q) => q.upscale(),
            Decoder::QwenImage21(q) => q.upscale(),
        }
    }

    /// Resolution levels of the decoder: the latent and one per 2× upsample.
    #[doc(hidden)]
    pub fn levels(&self) -> usize {
        match &self.decoder {
            Decoder::Kl(k) => k.levels(),
            Decoder::Tae(_) => 4,
            Decoder::QwenImage(q) => q.levels(),
            Decoder::QwenImage21(q) => q.levels(),
        }
    }

    /// The cooperative-matrix (tensor-core) configuration the decoder's convolutions run on,
    /// as `8x8x8 f16->f32`; `None` on the scalar path (no usable configuration, cooperative
    /// matrices off, or a model not in f16).
    pub fn cooperative_matrix(&self) -> Option<String> {
        self.graph().matrix_config()
    }

    /// The decoder's layers.
    pub(crate) fn graph(&self) -> &graph::Graph {
        match &self.decoder {
            Decoder::Kl(k) => k.graph(),
            Decoder::Tae(t) => t.graph(),
            Decoder::QwenImage(q) => q.graph(),
            Decoder::QwenImage21(q) => q.graph(),
        }
    }

    /// How the raw output maps to pixels.
    pub fn output_range(&self) -> ImageRange {
        match &self.decoder {
            Decoder::Kl(_) | Decoder::QwenImage(_) | Decoder::QwenImage21(_) => {
                ImageRange::MinusOneToOne
            }
            Decoder::Tae(_) => ImageRange::ZeroToOne,
        }
    }

    /// `(scaling_factor, shift_factor)` of pipeline latents (TAE: 1, 0;
    /// Qwen-Image: 1, 0 — its latents are normalised per channel, see
    /// [`ImageDecoder::latent_normalization`]).
    pub fn latent_scaling(&self) -> (f32, f32) {
        match &self.decoder {
            Decoder::Kl(k) => (k.config.scaling_factor, k.config.shift()),
            Decoder::Tae(_) | Decoder::QwenImage(_) | Decoder::QwenImage21(_) => (1.0, 0.0),
        }
    }

    /// Per-channel `(latents_mean, latents_std)` of pipeline latents
    /// (Qwen-Image: `z = latents / (1 / std) + mean`); `None`: a scalar
    /// [`ImageDecoder::latent_scaling`].
    pub fn latent_normalization(&self) -> Option<(&[f32], &[f32])> {
        match &self.decoder {
            Decoder::QwenImage(q) => Some((&q.config.latents_mean, &q.config.latents_std)),
            Decoder::QwenImage21(q) => {
                Some((&q.config.wan.latents_mean, &q.config.wan.latents_std))
            }
            _ => None,
        }
    }

    /// True when the raw output is clamped to [−1, 1] as diffusers returns
    /// it (Qwen-Image); the pixels are clamped for every model.
    pub(crate) fn clamps_output(&self) -> bool {
        matches!(
            self.decoder,
            Decoder::QwenImage(_) | Decoder::QwenImage21(_)
        )
    }

    /// Checks latents for this decoder (N×C×h×w after this; C×h×w becomes
    /// 1×C×h×w; Qwen-Image also takes one frame N×C×1×h×w).
    #[doc(hidden)]
    pub fn check_latents(&self, t: &mut HostTensor) -> std::result::Result<(), String> {
        match &self.decoder {
            Decoder::QwenImage(q) => q.check_latents(t),
            Decoder::QwenImage21(q) => q.check_latents(t),
            _ => crate::io::validate_latents(t, self.latent_channels()),
        }
    }

    /// The form of this model's pipeline latents (see [`crate::latents`]):
    /// FLUX.2 128-channel maps at 16 pixels packed one token per position;
    /// 16-channel AutoencoderKLs (FLUX.1) and TAEF1 2×2-patch tokens of 64
    /// features; the others maps only.
    pub fn latent_form(&self) -> LatentForm {
        let c = self.latent_channels();
        if self.flux2().is_some() {
            return LatentForm {
                map_channels: 4 * c,
                pixels_per_position: 2 * self.upscale(),
                tokens: Some(TokenPacking::Flat { channels: 4 * c }),
            };
        }
        if let Decoder::QwenImage21(_) = self.decoder {
            // One token per latent position (`QwenImage21Pipeline._pack_latents`).
            return LatentForm {
                map_channels: c,
                pixels_per_position: self.upscale(),
                tokens: Some(TokenPacking::Flat { channels: c }),
            };
        }
        LatentForm {
            map_channels: c,
            pixels_per_position: self.upscale(),
            tokens: (c == 16).then_some(TokenPacking::Patch2x2 { channels: 16 }),
        }
    }

    /// FLUX.2's latent normalisation (`Some` for an `AutoencoderKLFlux2`).
    pub fn flux2(&self) -> Option<crate::models::config::Flux2Latents> {
        match &self.decoder {
            Decoder::Kl(k) => k.config.flux2,
            Decoder::Tae(_) | Decoder::QwenImage(_) | Decoder::QwenImage21(_) => None,
        }
    }

    /// A short name of the model family for messages.
    fn family(&self) -> String {
        match (&self.decoder, self.flux2()) {
            (Decoder::Kl(_), Some(_)) => "the FLUX.2 VAE".into(),
            (Decoder::Kl(k), None) => format!(
                "this AutoencoderKL ({} latent channels)",
                k.config.latent_channels
            ),
            (Decoder::Tae(t), _) => format!("this TAE ({} latent channels)", t.latent_channels),
            (Decoder::QwenImage(_), _) => "the Qwen-Image VAE (16 latent channels)".into(),
            (Decoder::QwenImage21(q), _) => format!(
                "the Qwen-Image 2.1 VAE ({} latent channels)",
                q.latent_channels()
            ),
        }
    }

    /// Token sequences `N × L × F` → this model's pipeline maps, on the grid
    /// of an image of `size` = (H, W) pixels (`None`: a square grid). FLUX.1:
    /// N×L×64 → N×16×H/8×W/8; FLUX.2: N×L×128 → N×128×H/16×W/16.
    pub fn unpack_tokens(
        &self,
        tokens: &HostTensor,
        size: Option<(usize, usize)>,
    ) -> Result<HostTensor> {
        self.latent_form()
            .unpack_tokens(tokens, size, &self.family())
    }

    /// [`Vae::decoder_input`](super::Vae::decoder_input) of this decoder.
    pub(crate) fn decoder_input(
        &self,
        x: &HostTensor,
        raw: bool,
        size: Option<(usize, usize)>,
    ) -> Result<HostTensor> {
        self.decoder_input_cow(x, raw, size, true)
            .map(Cow::into_owned)
    }

    /// [`ImageDecoder::decoder_input`], borrowing `latents` when they already are z
    /// (raw N×C×h×w maps of an image decoder): no copy of large inputs;
    /// `check_values` false: such latents are known to be finite (an
    /// estimate's zeros) and are not scanned.
    pub(crate) fn decoder_input_cow<'t>(
        &self,
        latents: &'t HostTensor,
        raw: bool,
        size: Option<(usize, usize)>,
        check_values: bool,
    ) -> Result<Cow<'t, HostTensor>> {
        let plain = raw
            && latents.shape.len() == 4
            && latents.shape.get(1) == Some(&self.latent_channels())
            && !matches!(
                self.decoder,
                Decoder::QwenImage(_) | Decoder::QwenImage21(_)
            )
            && !self.latent_form().is_tokens(&latents.shape, size);
        if plain {
            if size.is_some() {
                log::info!(
                    "the image size applies to token sequences only; these latents are maps {:?}",
                    latents.shape
                );
            }
            // Unscanned, empty latents are still an error.
            if check_values || latents.data.is_empty() {
                crate::io::check_latent_values(latents, self.latent_channels())
                    .map_err(Error::InvalidInput)?;
            }
            return Ok(Cow::Borrowed(latents));
        }
        self.decoder_input_owned(latents, raw, size).map(Cow::Owned)
    }

    fn decoder_input_owned(
        &self,
        latents: &HostTensor,
        raw: bool,
        size: Option<(usize, usize)>,
    ) -> Result<HostTensor> {
        let form = self.latent_form();
        let mut t = latents.clone();
        if form.is_tokens(&t.shape, size) {
            if raw && self.flux2().is_some() {
                return Err(Error::InvalidInput(format!(
                    "latents of shape {:?} are FLUX.2 tokens (the pipeline's normalised form), not raw z; drop `DecodeOptions::raw_latents`",
                    t.shape
                )));
            }
            t = form.unpack_tokens(&t, size, &self.family())?;
        } else if size.is_some() && t.shape.len() == 4 {
            log::info!(
                "the image size applies to token sequences only; these latents are maps {:?}",
                t.shape
            );
        }
        let (want, what) = match (self.flux2(), raw) {
            (Some(_), false) => (form.map_channels, "pipeline latents: 2×2-patchified, BatchNorm-normalised maps N×128×h/2×w/2 (raw z has 32: pass `DecodeOptions::raw_latents`)"),
            (Some(_), true) => (self.latent_channels(), "raw latents z N×32×h×w"),
            (None, _) => (self.latent_channels(), "N×C×h×w or C×h×w"),
        };
        let c = match t.shape.len() {
            3 => t.shape.first().copied(),
            4 => t.shape.get(1).copied(),
            _ => None,
        };
        if let Some(c) = c.filter(|&c| c != want) {
            let tokens = match form.token_features() {
                Some(f) => format!(", or tokens N×L×{f}"),
                None => String::new(),
            };
            return Err(Error::InvalidInput(format!(
                "latents of shape {:?} have {c} channels{}, but {} expects {want} ({what}{tokens})",
                t.shape,
                crate::latents::channels_hint(c),
                self.family(),
            )));
        }
        match &self.decoder {
            // One frame N×16×1×h×w or N×16×h×w (its own checks and messages).
            Decoder::QwenImage(q) => q.check_latents(&mut t),
            Decoder::QwenImage21(q) => q.check_latents(&mut t),
            _ => crate::io::validate_latents(&mut t, want),
        }
        .map_err(Error::InvalidInput)?;
        if raw {
            return Ok(t);
        }
        if self.flux2().is_some() {
            return self.latent_batch_norm()?.to_z(&t);
        }
        self.unscale_latents(&mut t)?;
        Ok(t)
    }

    /// FLUX.2's latent BatchNorm statistics (an error naming the fix when
    /// the weights hold none: pipeline latents cannot be un-normalised).
    pub(crate) fn latent_batch_norm(&self) -> Result<&crate::latents::LatentBatchNorm> {
        let bn = match &self.decoder {
            Decoder::Kl(k) => k.latent_bn.as_ref(),
            Decoder::Tae(_) | Decoder::QwenImage(_) | Decoder::QwenImage21(_) => None,
        };
        bn.ok_or_else(|| {
            Error::InvalidInput(format!(
                "{}: the weights hold no `bn.running_mean` / `bn.running_var`, which FLUX.2 pipeline latents need to be un-normalised; decode raw latents z (N×32×h×w) with `DecodeOptions::raw_latents`, or load the full VAE file",
                self.name
            ))
        })
    }

    /// Pipeline latents → decoder input, as diffusers pipelines do:
    /// `latents / scaling_factor + shift_factor` (f32, same operation order);
    /// Qwen-Image per channel, `latents / (1 / latents_std) + latents_mean`.
    /// Finite latents can overflow f32 here (huge values, a tiny scaling
    /// factor): that is an error naming the cause, not an all-NaN image.
    #[doc(hidden)]
    pub fn unscale_latents(&self, latents: &mut HostTensor) -> Result<()> {
        if let Decoder::QwenImage(q) = &self.decoder {
            return q.unnormalize(latents);
        }
        if let Decoder::QwenImage21(q) = &self.decoder {
            return q.unnormalize(latents);
        }
        let (scale, shift) = self.latent_scaling();
        if scale == 1.0 && shift == 0.0 {
            return Ok(());
        }
        for v in &mut latents.data {
            *v = *v / scale + shift;
        }
        check_unscaled(&latents.data, scale, shift)
    }
}
