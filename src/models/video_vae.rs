//! The video decoders a [`VideoDecoder`](crate::VideoDecoder) runs: the borrowed
//! view ([`VideoModel`]), the owned one ([`VideoVae`]) and loading it.

use crate::error::{Error, Result};
use crate::gpu::Context;
use crate::latents::VideoLayout;
use crate::models::graph::Graph;
use crate::models::hunyuan_video15::HunyuanVideo15Decoder;
use crate::models::ltx2::Ltx2Decoder;
use crate::models::minimax_h3::MiniMaxH3Decoder;
use crate::models::taehv::TaehvDecoder;
use crate::models::video_info::VideoInfo;
use crate::models::wan::WanDecoder;

/// A causal video decoder [`VideoDecoder`](crate::VideoDecoder) and
/// [`decode_video`](crate::decode_video) run: its graph and what it says
/// of itself (latent form, frame arithmetic, output range), borrowed.
#[derive(Clone, Copy)]
pub struct VideoModel<'a> {
    graph: &'a Graph,
    info: VideoInfo<'a>,
}

/// Each video network gives its graph and what it says of itself.
macro_rules! views {
    ($($t:ty),*) => {$(
        impl<'a> From<&'a $t> for VideoModel<'a> {
            fn from(d: &'a $t) -> Self {
                VideoModel {
                    graph: d.graph(),
                    info: d.video_info(),
                }
            }
        }
    )*};
}
views!(
    TaehvDecoder,
    WanDecoder,
    HunyuanVideo15Decoder,
    Ltx2Decoder,
    MiniMaxH3Decoder
);

impl<'a> VideoModel<'a> {
    /// The cooperative-matrix configuration its convolutions run on (`8x8x8 f16->f32`),
    /// `None` on the scalar path.
    pub fn cooperative_matrix(self) -> Option<String> {
        self.graph().matrix_config()
    }

    pub(crate) fn graph(self) -> &'a Graph {
        self.graph
    }
    pub(crate) fn frames_to_trim(&self) -> usize {
        self.info.host_trim
    }
    /// Frames a video of `t` latent frames decodes to.
    pub fn frames_for(&self, t: usize) -> usize {
        self.info.frames_for(t)
    }

    /// Whether a chunk of `chunk` latent frames decodes to frames of
    /// `(h, w)` pixels whose f32 values (the most any chunk of the video
    /// gives) fit `limit` bytes of host memory, where a run holds them.
    pub(crate) fn check_chunk_frames(
        &self,
        chunk: usize,
        (h, w): (usize, usize),
        limit: u64,
    ) -> Result<()> {
        let steady = self
            .frames_for(chunk.saturating_add(1))
            .saturating_sub(self.frames_for(1));
        let frames = self.frames_for(chunk).max(steady).max(1);
        let bytes = (3 * 4u64)
            .saturating_mul(h as u64)
            .saturating_mul(w as u64)
            .saturating_mul(frames as u64);
        if bytes <= limit {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        Err(Error::OverBudget(format!(
            "a chunk of {chunk} latent frames decodes to {frames} frames of {h}x{w}, whose {:.1} GiB of f32 do not fit this host's available memory ({:.1} GiB), where a run holds them: use smaller frames or fewer latent frames per chunk",
            gib(bytes),
            gib(limit)
        )))
    }
    /// True when latents are N×C×T×h×w (Wan, diffusers), false for N×T×C×h×w (TAEHV).
    pub fn channels_first(&self) -> bool {
        self.info.layout == VideoLayout::Ncthw
    }

    /// The latent layout the model takes (TAEHV `ntchw`, Wan `ncthw`).
    pub fn latent_layout(&self) -> VideoLayout {
        self.info.layout
    }

    /// The model's name in messages and reports.
    pub fn name(&self) -> &'a str {
        self.info.name
    }

    /// Channels of one latent frame.
    pub fn latent_channels(&self) -> usize {
        self.info.latent_channels
    }

    /// Output pixels per latent pixel along each axis.
    pub fn upscale(&self) -> usize {
        self.info.upscale
    }

    /// True when its caches grow with the video's length (see
    /// [`crate::models::hunyuan_video15`]): streaming memory is then not flat.
    pub fn cache_grows(&self) -> bool {
        self.info.cache_grows
    }

    /// True when the decoder is not causal (LTX-2): a video decodes in one
    /// chunk, its whole clip.
    pub fn whole_clip(&self) -> bool {
        self.info.whole_clip
    }

    /// How a clip-based decoder (MiniMax-H3) cuts a video into clips.
    pub(crate) fn clip(&self) -> Option<crate::models::video_info::ClipGeometry> {
        self.info.clip
    }

    /// True when it decodes clip by clip (MiniMax-H3): frames come out a
    /// clip at a time, lagging the latent frames pushed.
    pub fn clip_based(&self) -> bool {
        self.info.clip.is_some()
    }

    /// The smallest latent side its padding takes.
    pub(crate) fn min_side(&self) -> usize {
        self.info.min_side
    }

    /// The range of the decoded frames (TAEHV [0, 1], Wan [−1, 1]).
    pub fn range(&self) -> crate::kernels::image::ImageRange {
        self.info.range
    }
}

/// A loaded video decoder, owned (see [`VideoModel`] for the borrowed view
/// [`VideoDecoder`](crate::VideoDecoder) and [`decode_video`](crate::decode_video) take).
pub struct VideoVae(Network);

/// The networks a [`VideoVae`] may hold.
enum Network {
    Taehv(TaehvDecoder),
    Wan(WanDecoder),
    HunyuanVideo15(HunyuanVideo15Decoder),
    Ltx2(Ltx2Decoder),
    MiniMaxH3(MiniMaxH3Decoder),
}

impl From<MiniMaxH3Decoder> for VideoVae {
    fn from(d: MiniMaxH3Decoder) -> Self {
        VideoVae(Network::MiniMaxH3(d))
    }
}

impl From<Ltx2Decoder> for VideoVae {
    fn from(d: Ltx2Decoder) -> Self {
        VideoVae(Network::Ltx2(d))
    }
}

impl From<HunyuanVideo15Decoder> for VideoVae {
    fn from(d: HunyuanVideo15Decoder) -> Self {
        VideoVae(Network::HunyuanVideo15(d))
    }
}

impl From<TaehvDecoder> for VideoVae {
    fn from(d: TaehvDecoder) -> Self {
        VideoVae(Network::Taehv(d))
    }
}

impl From<WanDecoder> for VideoVae {
    fn from(d: WanDecoder) -> Self {
        VideoVae(Network::Wan(d))
    }
}

impl VideoVae {
    /// The dtype `precision` gives this model on `caps` (TAEHV is f16-safe;
    /// Wan takes bf16 under `auto` on a GPU).
    pub fn dtype_for(
        &self,
        precision: crate::models::Precision,
        caps: &crate::gpu::Capabilities,
    ) -> crate::tensor::DType {
        precision.resolve(matches!(self.0, Network::Taehv(_)), caps)
    }

    /// Pipeline latents `[N, C, T, h, w]` → the raw z the decoder takes, in
    /// place: Wan's `latents · latents_std + latents_mean` (from its config);
    /// TAEHV decodes pipeline latents as they are.
    pub fn unnormalize(&self, latents: &mut crate::io::HostTensor) -> Result<()> {
        match &self.0 {
            Network::Wan(d) => d.unnormalize(latents),
            Network::HunyuanVideo15(d) => d.unnormalize(latents),
            Network::Ltx2(d) => d.unnormalize(latents),
            Network::MiniMaxH3(d) => d.unnormalize(latents),
            Network::Taehv(_) => Ok(()),
        }
    }

    /// Where the latents' mean/std came from when the model's files do not
    /// give them (a Wan config without them), else `None`.
    pub fn latents_stats_note(&self) -> Option<&str> {
        match &self.0 {
            Network::Wan(d) => d.latents_stats_note.as_deref(),
            Network::Taehv(_)
            | Network::HunyuanVideo15(_)
            | Network::Ltx2(_)
            | Network::MiniMaxH3(_) => None,
        }
    }

    /// True for a Wan VAE (whose files have a Qwen-Image VAE's keys).
    pub(crate) fn is_wan(&self) -> bool {
        matches!(self.0, Network::Wan(_))
    }

    /// The borrowed view the decoders run.
    pub fn model(&self) -> VideoModel<'_> {
        match &self.0 {
            Network::Taehv(d) => d.into(),
            Network::Wan(d) => d.into(),
            Network::HunyuanVideo15(d) => d.into(),
            Network::Ltx2(d) => d.into(),
            Network::MiniMaxH3(d) => d.into(),
        }
    }
}

pub use crate::models::wan::is_wan_video as is_wan;

/// True when `spec` names a video decoder (TAEHV file or Wan VAE), read from
/// headers and configs only.
pub fn is_video_vae(spec: &str) -> bool {
    let path = std::path::Path::new(spec);
    (path.is_file() && TaehvDecoder::is_taehv_file(path))
        || is_wan(spec)
        || crate::models::hunyuan_video15::is_hunyuan_video15(spec)
        || crate::models::ltx2::is_ltx2(spec)
        || crate::models::minimax_h3::is_minimax_h3(spec)
}

/// Loads the video decoder at `spec` (a TAEHV `.safetensors` file, a Wan
/// diffusers folder or file, or `preset:wan21` with weights from
/// `load.seed`) in the storage precision `load` asks for.
pub fn load_video_decoder(
    ctx: &Context,
    spec: &str,
    load: &crate::models::LoadOptions,
) -> Result<VideoVae> {
    if crate::models::minimax_h3::is_minimax_h3(spec) {
        let dtype = load.precision.resolve(false, ctx.caps());
        let dec = MiniMaxH3Decoder::open(ctx, spec, dtype, load.seed)?;
        return Ok(VideoVae::from(dec));
    }
    if crate::models::ltx2::is_ltx2(spec) {
        let dtype = load.precision.resolve(false, ctx.caps());
        return Ok(VideoVae::from(Ltx2Decoder::open(
            ctx, spec, dtype, load.seed,
        )?));
    }
    if crate::models::hunyuan_video15::is_hunyuan_video15(spec) {
        let dtype = load.precision.resolve(false, ctx.caps());
        let dec = HunyuanVideo15Decoder::open(ctx, spec, dtype, load.seed)?;
        return Ok(VideoVae::from(dec));
    }
    if is_wan(spec) {
        let dtype = load.precision.resolve(false, ctx.caps());
        return Ok(VideoVae::from(WanDecoder::open(
            ctx, spec, dtype, load.seed,
        )?));
    }
    let store = crate::models::WeightStore::from_safetensors(std::path::Path::new(spec))?;
    store.set_dtype(load.precision.resolve(true, ctx.caps()));
    Ok(VideoVae::from(TaehvDecoder::load(ctx, &store)?))
}
