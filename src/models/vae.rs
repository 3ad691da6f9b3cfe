//! The one model handle: every loaded decoder and encoder, image or video,
//! is a [`Vae`]. The front doors ([`crate::decode()`], [`crate::encode()`],
//! [`crate::decode_video`], [`crate::VideoDecoder`], [`crate::video_encode`],
//! [`crate::Engine`]) take it and refuse a model of the wrong kind by name.

use std::fmt;
use std::sync::Arc;

use super::image_decoder::ImageDecoder;
use super::taehv_encoder::TaehvEncoder;
use super::vae_encoder::VaeEncoder;
use super::video_vae::{VideoModel, VideoVae};
use super::{AutoencoderKlConfig, LoadOptions, WeightStore};
use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::io::HostTensor;
use crate::kernels::image::ImageRange;
use crate::latents::{LatentForm, VideoLayout};
use crate::tensor::DType;

/// What a loaded [`Vae`] is: which front doors take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// Image latents → images ([`crate::decode()`], [`crate::decode_frames`], [`crate::Engine`]).
    ImageDecoder,
    /// Images → latents ([`crate::encode()`]).
    ImageEncoder,
    /// Video latents → frames ([`crate::decode_video`], [`crate::VideoDecoder`]).
    VideoDecoder,
    /// Video frames → latents ([`crate::video_encode`]).
    VideoEncoder,
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelKind::ImageDecoder => "an image decoder",
            ModelKind::ImageEncoder => "an image encoder",
            ModelKind::VideoDecoder => "a video decoder",
            ModelKind::VideoEncoder => "a video encoder",
        })
    }
}

/// A loaded model, weights on the device: an image or video decoder
/// ([`Vae::load`]) or encoder ([`Vae::load_encoder`]). Its kind, latent
/// form, frame arithmetic and normalisation are read through accessors;
/// what was loaded does not change after loading.
pub struct Vae {
    model: Loaded,
    /// Bytes of weights uploaded.
    weights_bytes: u64,
    /// True for `preset:NAME` (seeded random weights).
    random_weights: bool,
    /// Storage dtype of weights and activations.
    dtype: DType,
}

// One per loaded model: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Loaded {
    ImageDecoder(ImageDecoder),
    ImageEncoder(VaeEncoder),
    // Shared: a streaming decoder or encoder may outlive the borrow of its handle.
    VideoDecoder(Arc<VideoVae>),
    VideoEncoder(Arc<TaehvEncoder>),
}

#[doc(hidden)]
impl From<ImageDecoder> for Vae {
    fn from(d: ImageDecoder) -> Self {
        Vae {
            weights_bytes: d.weights_bytes(),
            random_weights: d.random_weights(),
            dtype: d.dtype(),
            model: Loaded::ImageDecoder(d),
        }
    }
}

#[doc(hidden)]
impl From<VaeEncoder> for Vae {
    fn from(e: VaeEncoder) -> Self {
        Vae {
            weights_bytes: e.weights_bytes(),
            random_weights: false,
            dtype: e.dtype(),
            model: Loaded::ImageEncoder(e),
        }
    }
}

#[doc(hidden)]
impl From<VideoVae> for Vae {
    fn from(v: VideoVae) -> Self {
        Vae {
            weights_bytes: 0,
            random_weights: false,
            dtype: v.model().graph().weights_dtype(),
            model: Loaded::VideoDecoder(Arc::new(v)),
        }
    }
}

#[doc(hidden)]
impl From<TaehvEncoder> for Vae {
    fn from(e: TaehvEncoder) -> Self {
        Vae {
            weights_bytes: 0,
            random_weights: false,
            dtype: e.graph().weights_dtype(),
            model: Loaded::VideoEncoder(Arc::new(e)),
        }
    }
}

macro_rules! video_networks {
    ($($t:ty),*) => {$(
        #[doc(hidden)]
        impl From<$t> for Vae {
            fn from(d: $t) -> Self {
                Vae::from(VideoVae::from(d))
            }
        }
    )*};
}
video_networks!(
    super::taehv::TaehvDecoder,
    super::wan::WanDecoder,
    super::hunyuan_video15::HunyuanVideo15Decoder,
    super::ltx2::Ltx2Decoder,
    super::minimax_h3::MiniMaxH3Decoder
);

impl Vae {
    /// Loads the decoder at `spec`: `preset:NAME` (random weights), a
    /// diffusers folder (or a pipeline folder with `vae/`), or a
    /// `.safetensors` file in diffusers, LDM or TAE layout — an image
    /// decoder, or a video decoder (TAEHV, Wan, HunyuanVideo 1.5, LTX-2,
    /// MiniMax-H3) told apart by its files.
    pub fn load(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<Vae> {
        if Self::image_spec(spec, opts) {
            return Self::load_image_decoder(ctx, spec, opts);
        }
        if opts.scaling_factor.is_some() || opts.shift_factor.is_some() || opts.config.is_some() {
            return Err(Error::InvalidInput(format!(
                "`{spec}` is a video decoder: it reads its configuration from its own files and normalises latents per channel; drop `LoadOptions::config`, `scaling_factor` and `shift_factor` (they apply to image VAEs)"
            )));
        }
        let (dec, bytes) = super::weights_loaded_by(ctx, || {
            super::video_vae::load_video_decoder(ctx, spec, opts)
        })?;
        let dtype = dec.dtype_for(opts.precision, ctx.caps());
        let mut vae = Vae::from(dec);
        vae.weights_bytes = bytes;
        vae.random_weights = spec.starts_with("preset:");
        vae.dtype = dtype;
        Ok(vae)
    }

    /// [`Vae::load`] for hosts that decode images only: a video decoder is
    /// refused from its files' names, config and tensor names, before any weight is uploaded.
    pub fn load_image_decoder(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<Vae> {
        Ok(ImageDecoder::load(ctx, spec, opts)?.into())
    }

    /// True unless `spec` names a video model. A Qwen-Image VAE has a Wan
    /// VAE's keys: its name or config says it is an image model.
    fn image_spec(spec: &str, opts: &LoadOptions) -> bool {
        let config = opts.config.as_deref();
        super::qwen_image::is_qwen_image(spec, config)
            || super::qwen_image21::is_qwen_image21(spec, config)
            || !super::video_vae::is_video_vae(spec)
    }

    /// Loads the encoder at `spec`: an AutoencoderKL's (its diffusers
    /// folder or file, which also hold the decoder), a TAE encoder file, or
    /// a TAEHV file's video encoder.
    pub fn load_encoder(ctx: &Context, spec: &str, opts: &LoadOptions) -> Result<Vae> {
        if Self::image_spec(spec, opts) {
            let mut vae = Vae::from(VaeEncoder::load(ctx, spec, opts)?);
            vae.random_weights = spec.starts_with("preset:");
            return Ok(vae);
        }
        let (enc, bytes) = super::weights_loaded_by(ctx, || {
            super::taehv_encoder::load_video_encoder(ctx, spec, opts)
        })?;
        let mut vae = Vae::from(enc);
        vae.weights_bytes = bytes;
        vae.random_weights = spec.starts_with("preset:");
        // TAEHV is f16-safe (as its decoder).
        vae.dtype = opts.precision.resolve(true, ctx.caps());
        Ok(vae)
    }

    /// An AutoencoderKL decoder of a custom configuration from `store` (its
    /// weights in `store.dtype()`); without a file to reload, it has no bf16
    /// twin, so an f16 overflow is reported, not redone.
    #[doc(hidden)]
    pub fn from_kl_config(
        ctx: &Context,
        config: &AutoencoderKlConfig,
        store: &WeightStore,
        name: &str,
    ) -> Result<Vae> {
        Ok(ImageDecoder::kl_from_store(ctx, (config, store), name)?.into())
    }

    /// An AutoencoderKL encoder of `config` with the weights in `store`
    /// (diffusers names), e.g. [`WeightStore::random`] for tests and studies.
    #[doc(hidden)]
    pub fn encoder_from_kl_config(
        ctx: &Context,
        config: &AutoencoderKlConfig,
        store: &WeightStore,
    ) -> Result<Vae> {
        let mut vae = Vae::from(VaeEncoder::from_kl_config(ctx, config, store)?);
        vae.random_weights = store.origin().starts_with("random");
        Ok(vae)
    }

    /// What it is: which front doors take it.
    pub fn kind(&self) -> ModelKind {
        match &self.model {
            Loaded::ImageDecoder(_) => ModelKind::ImageDecoder,
            Loaded::ImageEncoder(_) => ModelKind::ImageEncoder,
            Loaded::VideoDecoder(_) => ModelKind::VideoDecoder,
            Loaded::VideoEncoder(_) => ModelKind::VideoEncoder,
        }
    }

    /// Human-readable description: preset or variant and source.
    pub fn name(&self) -> &str {
        match &self.model {
            Loaded::ImageDecoder(d) => d.name(),
            Loaded::ImageEncoder(e) => e.name(),
            Loaded::VideoDecoder(v) => v.model().name(),
            Loaded::VideoEncoder(e) => e.variant_name(),
        }
    }

    /// True for `preset:NAME` (seeded random weights).
    pub fn random_weights(&self) -> bool {
        self.random_weights
    }

    /// Bytes of weights uploaded (0 for a network built outside the loaders).
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }

    /// Storage dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Channels of one latent (frame): what a decoder takes, an encoder gives.
    pub fn latent_channels(&self) -> usize {
        match &self.model {
            Loaded::ImageDecoder(d) => d.latent_channels(),
            Loaded::ImageEncoder(e) => e.latent_channels(),
            Loaded::VideoDecoder(v) => v.model().latent_channels(),
            Loaded::VideoEncoder(e) => e.latent_channels(),
        }
    }

    /// Image pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        match &self.model {
            Loaded::ImageDecoder(d) => d.upscale(),
            Loaded::ImageEncoder(e) => e.downscale(),
            Loaded::VideoDecoder(v) => v.model().upscale(),
            Loaded::VideoEncoder(e) => e.downscale(),
        }
    }

    /// Channels of the images: 3 (RGB), or 4 for Qwen-Image 2.1's RGBA decoder.
    pub fn image_channels(&self) -> usize {
        match &self.model {
            Loaded::ImageDecoder(d) => d.image_channels(),
            _ => 3,
        }
    }

    /// The range of its images: what a decoder outputs, what an encoder
    /// takes (TAE, TAEHV: [0, 1]; the others [−1, 1]).
    pub fn output_range(&self) -> ImageRange {
        match &self.model {
            Loaded::ImageDecoder(d) => d.output_range(),
            Loaded::ImageEncoder(e) if e.is_tae() => ImageRange::ZeroToOne,
            Loaded::ImageEncoder(_) => ImageRange::MinusOneToOne,
            Loaded::VideoDecoder(v) => v.model().range(),
            Loaded::VideoEncoder(_) => ImageRange::ZeroToOne,
        }
    }

    /// The cooperative-matrix (tensor-core) configuration its convolutions
    /// run on, as `8x8x8 f16->f32`; `None` on the scalar path (no usable
    /// configuration, cooperative matrices off, or a model not in f16).
    pub fn cooperative_matrix(&self) -> Option<String> {
        match &self.model {
            Loaded::ImageDecoder(d) => d.cooperative_matrix(),
            Loaded::ImageEncoder(e) => e.encoder.graph().matrix_config(),
            Loaded::VideoDecoder(v) => v.model().cooperative_matrix(),
            Loaded::VideoEncoder(e) => e.graph().matrix_config(),
        }
    }

    /// The form of an image decoder's pipeline latents (see [`crate::latents`]).
    pub fn latent_form(&self) -> Result<LatentForm> {
        Ok(self.image_decoder("latent forms")?.latent_form())
    }

    /// FLUX.2's latent normalisation (`Some` for an `AutoencoderKLFlux2`
    /// decoder).
    pub fn flux2(&self) -> Option<super::config::Flux2Latents> {
        match &self.model {
            Loaded::ImageDecoder(d) => d.flux2(),
            _ => None,
        }
    }

    /// `(scaling_factor, shift_factor)` of pipeline latents: an image
    /// decoder's (TAE, Qwen-Image: 1, 0), an AutoencoderKL encoder's; `None`
    /// for the others (TAE encoders give latents as they are; video models
    /// normalise per channel, [`Vae::unnormalize`]).
    pub fn latent_scaling(&self) -> Option<(f32, f32)> {
        match &self.model {
            Loaded::ImageDecoder(d) => Some(d.latent_scaling()),
            Loaded::ImageEncoder(e) => e.scaling(),
            Loaded::VideoDecoder(_) | Loaded::VideoEncoder(_) => None,
        }
    }

    /// An image decoder's per-channel `(latents_mean, latents_std)` of
    /// pipeline latents (Qwen-Image); `None`: a scalar [`Vae::latent_scaling`].
    pub fn latent_normalization(&self) -> Option<(&[f32], &[f32])> {
        match &self.model {
            Loaded::ImageDecoder(d) => d.latent_normalization(),
            _ => None,
        }
    }

    /// Token sequences `N × L × F` → an image decoder's pipeline maps, on
    /// the grid of an image of `size` = (H, W) pixels (`None`: a square
    /// grid). FLUX.1: N×L×64 → N×16×H/8×W/8; FLUX.2: N×L×128 → N×128×H/16×W/16.
    pub fn unpack_tokens(
        &self,
        tokens: &HostTensor,
        size: Option<(usize, usize)>,
    ) -> Result<HostTensor> {
        self.image_decoder("token sequences")?
            .unpack_tokens(tokens, size)
    }

    /// Any latent form an image decoder accepts → its input z `[N, C, h, w]`:
    /// token sequences (3-D, see [`LatentForm::is_tokens`]) are unpacked on
    /// the grid of `size`; pipeline latents un-normalised unless `raw`
    /// (FLUX.2: `unpatchify(x · sqrt(var + eps) + mean)`; the others
    /// `x / scaling_factor + shift_factor`). Shapes, channels and values are
    /// checked here, with errors naming the model and the expected form.
    pub fn decoder_input(
        &self,
        latents: &HostTensor,
        raw: bool,
        size: Option<(usize, usize)>,
    ) -> Result<HostTensor> {
        self.image_decoder("decoder inputs")?
            .decoder_input(latents, raw, size)
    }

    /// Pipeline latents → the raw z a decoder takes, in place, as diffusers
    /// pipelines do: image decoders `latents / scaling_factor +
    /// shift_factor` (Qwen-Image per channel); video decoders per channel
    /// (Wan: `latents · latents_std + latents_mean`; TAEHV: as they are).
    pub fn unnormalize(&self, latents: &mut HostTensor) -> Result<()> {
        match &self.model {
            Loaded::ImageDecoder(d) => d.unscale_latents(latents),
            Loaded::VideoDecoder(v) => v.unnormalize(latents),
            _ => Err(self.wrong_kind("un-normalising pipeline latents", ModelKind::ImageDecoder)),
        }
    }

    /// The latent layout of a video model (TAEHV `ntchw`, Wan `ncthw`);
    /// `None` for image models.
    pub fn latent_layout(&self) -> Option<VideoLayout> {
        match &self.model {
            Loaded::VideoDecoder(v) => Some(v.model().latent_layout()),
            Loaded::VideoEncoder(_) => Some(VideoLayout::Ntchw),
            _ => None,
        }
    }

    /// Frames a video decoder decodes `latent_frames` latent frames to:
    /// `1 + t_upscale (t − 1)` for the causal ones (TAEHV and Wan: 4 output
    /// frames per latent frame, one for the first); an error for other kinds.
    pub fn frames_for(&self, latent_frames: usize) -> Result<usize> {
        Ok(self
            .video_decoder("counting video frames")?
            .frames_for(latent_frames))
    }

    /// Where a video decoder's latent mean/std came from when its files do
    /// not give them (a Wan config without them), else `None`.
    pub fn latents_stats_note(&self) -> Option<&str> {
        match &self.model {
            Loaded::VideoDecoder(v) => v.latents_stats_note(),
            _ => None,
        }
    }

    /// The image decoder, or an error naming `what` needs one.
    #[doc(hidden)]
    pub fn image_decoder(&self, what: &str) -> Result<&ImageDecoder> {
        match &self.model {
            Loaded::ImageDecoder(d) => Ok(d),
            _ => Err(self.wrong_kind(what, ModelKind::ImageDecoder)),
        }
    }

    /// The image encoder, or an error naming `what` needs one.
    pub(crate) fn image_encoder(&self, what: &str) -> Result<&VaeEncoder> {
        match &self.model {
            Loaded::ImageEncoder(e) => Ok(e),
            _ => Err(self.wrong_kind(what, ModelKind::ImageEncoder)),
        }
    }

    /// The video decoder's view the runner takes, or an error naming `what`
    /// needs one.
    #[doc(hidden)]
    pub fn video_decoder(&self, what: &str) -> Result<VideoModel<'_>> {
        match &self.model {
            Loaded::VideoDecoder(v) => Ok(v.model()),
            _ => Err(self.wrong_kind(what, ModelKind::VideoDecoder)),
        }
    }

    /// The video decoder, shared, or an error naming `what` needs one.
    pub(crate) fn shared_video_decoder(&self, what: &str) -> Result<Arc<VideoVae>> {
        match &self.model {
            Loaded::VideoDecoder(v) => Ok(Arc::clone(v)),
            _ => Err(self.wrong_kind(what, ModelKind::VideoDecoder)),
        }
    }

    /// The video encoder, shared, or an error naming `what` needs one.
    pub(crate) fn video_encoder(&self, what: &str) -> Result<Arc<TaehvEncoder>> {
        match &self.model {
            Loaded::VideoEncoder(e) => Ok(Arc::clone(e)),
            _ => Err(self.wrong_kind(what, ModelKind::VideoEncoder)),
        }
    }

    /// `what` needs a model of kind `wanted`, not this one: the error
    /// names what this one is, the door that takes it and how to load what
    /// `what` needs.
    fn wrong_kind(&self, what: &str, wanted: ModelKind) -> Error {
        use ModelKind::*;
        const VIDEO_MODELS: &str =
            "a TAEHV file, or a Wan, HunyuanVideo 1.5, LTX-2 or MiniMax-H3 VAE";
        let instead = match (self.kind(), wanted) {
            (ImageDecoder, ImageEncoder) => "it decodes image latents (`wgvae::decode`); load its encoder with `Vae::load_encoder` (for AutoencoderKL the same file or folder, for TAE its encoder file)".to_string(),
            (ImageDecoder, _) => format!("it decodes image latents (`wgvae::decode`); video needs a video model ({VIDEO_MODELS}) from `Vae::load` / `Vae::load_encoder`"),
            (ImageEncoder, ImageDecoder) => "it encodes images (`wgvae::encode`); load the decoder with `Vae::load`".to_string(),
            (ImageEncoder, _) => format!("it encodes images (`wgvae::encode`); video needs a video model ({VIDEO_MODELS}) from `Vae::load` / `Vae::load_encoder`"),
            (VideoDecoder, VideoEncoder) => "it decodes video latents (`wgvae::decode_video` / `VideoDecoder`); load the encoder of a TAEHV file with `Vae::load_encoder` (the video encoders implemented)".to_string(),
            (VideoDecoder, _) => "it decodes video latents (`wgvae::decode_video` / `VideoDecoder`; CLI: --frames-out), not images; image models are AutoencoderKL, TAE and Qwen-Image VAEs".to_string(),
            (VideoEncoder, VideoDecoder) => "it encodes video frames (`wgvae::video_encode::encode_video`); load the decoder of the same file with `Vae::load`".to_string(),
            (VideoEncoder, _) => "it encodes video frames N×T×3×H×W (`wgvae::video_encode::encode_video`), not images; image models are AutoencoderKL, TAE and Qwen-Image VAEs".to_string(),
        };
        let qwen = match &self.model {
            Loaded::VideoDecoder(v) if v.is_wan() && wanted == ImageDecoder => format!(
                ". A Qwen-Image VAE file has a Wan VAE's keys: name it qwen_image_vae.safetensors or give its config.json (`{}`, `LoadOptions::config`) to decode images with it",
                super::qwen_image::CLASS_NAME
            ),
            _ => String::new(),
        };
        Error::InvalidInput(format!(
            "{what}: `{}` is {}: {instead}{qwen}",
            self.name(),
            self.kind()
        ))
    }
}
