//! Latent forms: what a model's pipelines hand its VAE, and the rules that
//! turn each form into the decoder's input `z`.
//!
//! A model declares its form once, as data ([`LatentForm`]): the channels of
//! the pipeline's latent maps, the image pixels per map position, and how a
//! transformer's token sequence packs those maps ([`TokenPacking`]). The
//! front doors ([`crate::decode()`], the CLI, Python) accept
//! - token sequences N×L×F (3-D), unpacked by the model's rule given the image
//!   size ([`crate::Vae::unpack_tokens`], `--size HxW`) or a square token grid;
//! - pipeline maps N×C×h×w, un-normalised by the model (scaling/shift factors,
//!   or FLUX.2's BatchNorm statistics + 2×2 unpatchify, [`LatentBatchNorm`]);
//! - raw decoder input z (`DecodeOptions::raw_latents`, `--raw-latents`).
//!
//! How a model declares its form (e.g. Qwen-Image: "2×2 patch tokens of
//! 16 channels at 8 pixels per latent"):
//! ```
//! use wgvae::latents::{LatentForm, TokenPacking};
//! let qwen = LatentForm {
//!     map_channels: 16,
//!     pixels_per_position: 8,
//!     tokens: Some(TokenPacking::Patch2x2 { channels: 16 }),
//! };
//! assert_eq!(qwen.token_features(), Some(64));
//! ```

use crate::error::{Error, Result};
use crate::io::HostTensor;

/// How a transformer's token sequence `N × L × F` packs a latent map
/// `N × C × h × w` (token = row · cols + col, row-major over the token grid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenPacking {
    /// Each token holds a 2×2 patch of the map: feature = c·4 + dy·2 + dx,
    /// F = 4·channels, and the map is twice the token grid on each side
    /// (FLUX.1: 16 channels, F = 64; Qwen-Image the same).
    Patch2x2 {
        /// Channels of the unpacked map.
        channels: usize,
    },
    /// One token per map position, feature = channel, F = channels, the map
    /// the size of the token grid (FLUX.2: its 128-channel patchified maps).
    Flat {
        /// Channels of the unpacked map (= features per token).
        channels: usize,
    },
}

// Indexing below stays inside shapes checked at the top of each function.
#[allow(clippy::indexing_slicing)]
impl TokenPacking {
    /// Features per token (F).
    pub fn features(&self) -> usize {
        match *self {
            TokenPacking::Patch2x2 { channels } => 4 * channels,
            TokenPacking::Flat { channels } => channels,
        }
    }

    /// Channels of the unpacked map.
    pub fn channels(&self) -> usize {
        match *self {
            TokenPacking::Patch2x2 { channels } | TokenPacking::Flat { channels } => channels,
        }
    }

    /// Map positions per token along each axis.
    pub fn side(&self) -> usize {
        match self {
            TokenPacking::Patch2x2 { .. } => 2,
            TokenPacking::Flat { .. } => 1,
        }
    }

    /// Tokens `N × L × F` on a `rows × cols` grid → maps `N × C × rows·s × cols·s`.
    pub fn unpack(&self, tokens: &HostTensor, (rows, cols): (usize, usize)) -> Result<HostTensor> {
        let [n, l, f] = <[usize; 3]>::try_from(tokens.shape.as_slice()).map_err(|_| {
            Error::InvalidInput(format!(
                "token sequences are N×L×F; got shape {:?}",
                tokens.shape
            ))
        })?;
        let values = n.checked_mul(l).and_then(|v| v.checked_mul(f));
        if f != self.features()
            || rows.checked_mul(cols) != Some(l)
            || values != Some(tokens.data.len())
        {
            return Err(Error::InvalidInput(format!(
                "tokens of shape {:?} do not fill a {rows}×{cols} grid of {} features",
                tokens.shape,
                self.features()
            )));
        }
        let (c, s) = (self.channels(), self.side());
        let (h, w) = (rows * s, cols * s);
        let mut out = vec![0.0f32; n * c * h * w];
        for b in 0..n {
            for t in 0..l {
                let (r, q) = (t / cols, t % cols);
                let token = &tokens.data[(b * l + t) * f..(b * l + t + 1) * f];
                for (feature, &v) in token.iter().enumerate() {
                    let (ch, dy, dx) = match self {
                        TokenPacking::Patch2x2 { .. } => {
                            (feature / 4, (feature / 2) % 2, feature % 2)
                        }
                        TokenPacking::Flat { .. } => (feature, 0, 0),
                    };
                    let (y, x) = (r * s + dy, q * s + dx);
                    out[((b * c + ch) * h + y) * w + x] = v;
                }
            }
        }
        HostTensor::new(vec![n, c, h, w], out)
    }

    /// The inverse of [`TokenPacking::unpack`]: maps `N × C × h × w` → tokens.
    pub fn pack(&self, maps: &HostTensor) -> Result<HostTensor> {
        let [n, c, h, w] = <[usize; 4]>::try_from(maps.shape.as_slice()).map_err(|_| {
            Error::InvalidInput(format!("maps are N×C×h×w; got shape {:?}", maps.shape))
        })?;
        let s = self.side();
        if c != self.channels() || h % s != 0 || w % s != 0 {
            return Err(Error::InvalidInput(format!(
                "maps of shape {:?} cannot be packed as {self:?}",
                maps.shape
            )));
        }
        let (rows, cols, f) = (h / s, w / s, self.features());
        let mut out = vec![0.0f32; n * rows * cols * f];
        for b in 0..n {
            for ch in 0..c {
                for y in 0..h {
                    for x in 0..w {
                        let t = (y / s) * cols + x / s;
                        let feature = match self {
                            TokenPacking::Patch2x2 { .. } => ch * 4 + (y % 2) * 2 + x % 2,
                            TokenPacking::Flat { .. } => ch,
                        };
                        out[(b * rows * cols + t) * f + feature] =
                            maps.data[((b * c + ch) * h + y) * w + x];
                    }
                }
            }
        }
        HostTensor::new(vec![n, rows * cols, f], out)
    }
}

/// A model's pipeline latent form (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatentForm {
    /// Channels of the pipeline's latent maps (FLUX.2: 128, FLUX.1: 16, SD: 4).
    pub map_channels: usize,
    /// Image pixels per map position along each axis (FLUX.2: 16, others 8).
    pub pixels_per_position: usize,
    /// How the model's transformer packs the maps into tokens (`None`: its
    /// pipelines never pack).
    pub tokens: Option<TokenPacking>,
}

impl LatentForm {
    /// Features per token, when the model's pipelines pack.
    pub fn token_features(&self) -> Option<usize> {
        self.tokens.map(|t| t.features())
    }

    /// Image pixels per token along each axis.
    fn pixels_per_token(&self, t: TokenPacking) -> usize {
        self.pixels_per_position * t.side()
    }

    /// True when a 3-D array is a token sequence for this model rather than
    /// one C×h×w map: its last axis is the token width and, where its first
    /// axis is the map channels too, an image size was given.
    pub fn is_tokens(&self, shape: &[usize], size: Option<(usize, usize)>) -> bool {
        match (self.tokens, shape) {
            (Some(t), &[first, _, f]) => {
                f == t.features() && (first != self.map_channels || size.is_some())
            }
            _ => false,
        }
    }

    /// Tokens N×L×F → the pipeline's maps, on the grid given by `size`
    /// (image pixels, H×W) or, without it, a square grid.
    pub fn unpack_tokens(
        &self,
        tokens: &HostTensor,
        size: Option<(usize, usize)>,
        model: &str,
    ) -> Result<HostTensor> {
        let Some(t) = self.tokens else {
            return Err(Error::InvalidInput(format!(
                "latents of shape {:?} look like a token sequence, but {model} has no packed-token form; give N×C×h×w maps",
                tokens.shape
            )));
        };
        let &[_, l, f] = tokens.shape.as_slice() else {
            return Err(Error::InvalidInput(format!(
                "token sequences are N×L×F; got shape {:?}",
                tokens.shape
            )));
        };
        if f != t.features() {
            return Err(Error::InvalidInput(format!(
                "tokens of shape {:?} have {f} features, but {model}'s tokens have {} ({:?})",
                tokens.shape,
                t.features(),
                t
            )));
        }
        let px = self.pixels_per_token(t);
        let grid = match size {
            Some((hp, wp)) => {
                if hp == 0 || wp == 0 || hp % px != 0 || wp % px != 0 {
                    return Err(Error::InvalidInput(format!(
                        "image size {hp}×{wp} is not a positive multiple of {px} pixels, the size of one {model} token"
                    )));
                }
                let (rows, cols) = (hp / px, wp / px);
                if rows.checked_mul(cols) != Some(l) {
                    return Err(Error::InvalidInput(format!(
                        "{l} tokens do not fit a {hp}×{wp} image: it holds {rows}×{cols} = {} tokens of {px}×{px} pixels; check the image size (`Vae::unpack_tokens`'s size)",
                        rows.saturating_mul(cols)
                    )));
                }
                (rows, cols)
            }
            None => {
                let side = (l as f64).sqrt().round() as usize;
                if side == 0 || side * side != l {
                    return Err(Error::InvalidInput(format!(
                        "{l} tokens (shape {:?}) do not form a square grid, so the image size is needed to unpack them: give it (`Vae::unpack_tokens`'s size; Python `size=(H, W)`) in pixels, multiples of {px}",
                        tokens.shape
                    )));
                }
                (side, side)
            }
        };
        t.unpack(tokens, grid)
    }
}

/// FLUX.2's latent BatchNorm (`AutoencoderKLFlux2.bn`, no affine): pipeline
/// latents are `(patchify(z) − mean) / sqrt(var + eps)` over 4·32 channels.
#[derive(Clone, Debug, PartialEq)]
pub struct LatentBatchNorm {
    /// `bn.running_mean`, one per patchified channel.
    pub mean: Vec<f32>,
    /// `sqrt(bn.running_var + batch_norm_eps)` in f32, as the pipeline computes it.
    pub std: Vec<f32>,
}

#[allow(clippy::indexing_slicing)]
impl LatentBatchNorm {
    /// Pipeline maps N×4C×h×w → z N×C×2h×2w: `x · std + mean`, then the 2×2
    /// unpatchify (patchified channel = 4c + 2·dy + dx), in f32 as diffusers.
    pub fn to_z(&self, maps: &HostTensor) -> Result<HostTensor> {
        let [n, c4, h, w] = <[usize; 4]>::try_from(maps.shape.as_slice()).map_err(|_| {
            Error::InvalidInput(format!("expected N×C×h×w maps, got {:?}", maps.shape))
        })?;
        if c4 != self.mean.len() || c4 % 4 != 0 {
            return Err(Error::InvalidInput(format!(
                "FLUX.2 pipeline latents have {} channels; got shape {:?}",
                self.mean.len(),
                maps.shape
            )));
        }
        let c = c4 / 4;
        let (h2, w2) = (2 * h, 2 * w);
        let mut z = vec![0.0f32; n * c * h2 * w2];
        for b in 0..n {
            for (pc, (&m, &s)) in self.mean.iter().zip(&self.std).enumerate() {
                let (ch, dy, dx) = (pc / 4, (pc / 2) % 2, pc % 2);
                let src = &maps.data[(b * c4 + pc) * h * w..(b * c4 + pc + 1) * h * w];
                for y in 0..h {
                    for x in 0..w {
                        let v = src[y * w + x] * s + m;
                        z[((b * c + ch) * h2 + 2 * y + dy) * w2 + 2 * x + dx] = v;
                    }
                }
            }
        }
        HostTensor::new(vec![n, c, h2, w2], z)
    }

    /// z N×C×h×w (h, w even) → pipeline maps N×4C×h/2×w/2:
    /// `(patchify(z) − mean) / std` (what `Flux2Pipeline` does to an encoded image).
    pub fn from_z(&self, z: &HostTensor) -> Result<HostTensor> {
        let [n, c, h2, w2] = <[usize; 4]>::try_from(z.shape.as_slice()).map_err(|_| {
            Error::InvalidInput(format!("expected N×C×h×w latents, got {:?}", z.shape))
        })?;
        if 4 * c != self.mean.len() || h2 % 2 != 0 || w2 % 2 != 0 {
            return Err(Error::InvalidInput(format!(
                "FLUX.2's pipeline form patchifies z N×{}×h×w in 2×2 patches: h and w must be even (images: multiples of 16 pixels, or `EncodeOptions::raw_latents`); got shape {:?}",
                self.mean.len() / 4,
                z.shape
            )));
        }
        let (h, w, c4) = (h2 / 2, w2 / 2, 4 * c);
        let mut out = vec![0.0f32; n * c4 * h * w];
        for b in 0..n {
            for (pc, (&m, &s)) in self.mean.iter().zip(&self.std).enumerate() {
                let (ch, dy, dx) = (pc / 4, (pc / 2) % 2, pc % 2);
                for y in 0..h {
                    for x in 0..w {
                        let v = z.data[((b * c + ch) * h2 + 2 * y + dy) * w2 + 2 * x + dx];
                        out[((b * c4 + pc) * h + y) * w + x] = (v - m) / s;
                    }
                }
            }
        }
        HostTensor::new(vec![n, c4, h, w], out)
    }
}

/// Which published latent a channel count suggests, for error messages.
pub(crate) fn channels_hint(c: usize) -> &'static str {
    match c {
        4 => " (4 channels: SD 1.x / SDXL latents)",
        16 => " (16 channels: FLUX.1 / SD3 latents, or Qwen-Image's)",
        32 => " (32 channels: FLUX.2 raw latents z, or TAEF2's)",
        64 => " (64 features: FLUX.1 / Qwen-Image packed tokens? give them as N×L×64)",
        128 => " (128 channels: FLUX.2 pipeline latents, 2×2-patchified and BatchNorm-normalised)",
        48 => " (48 channels: Wan 2.2 latents)",
        _ => "",
    }
}

/// How the axes of 5-D video latents are ordered. Each video model
/// declares its own (TAEHV: [`VideoLayout::Ntchw`]; diffusers' video VAEs
/// such as Wan's: [`VideoLayout::Ncthw`]); a front end may override it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VideoLayout {
    /// `N×T×C×h×w`: frames outermost (TAEHV's `decode_video`).
    Ntchw,
    /// `N×C×T×h×w`: channels before time (diffusers / PyTorch Conv3d).
    Ncthw,
}

impl VideoLayout {
    /// The flag spelling (`ntchw`, `ncthw`).
    pub fn name(self) -> &'static str {
        match self {
            VideoLayout::Ntchw => "ntchw",
            VideoLayout::Ncthw => "ncthw",
        }
    }

    /// `[N, T, C, h, w]` of a 5-D `shape` in this layout.
    pub fn dims(self, shape: [usize; 5]) -> [usize; 5] {
        let [n, a, b, h, w] = shape;
        match self {
            VideoLayout::Ntchw => [n, a, b, h, w],
            VideoLayout::Ncthw => [n, b, a, h, w],
        }
    }

    /// 5-D latents in this layout, reordered to `N×T×C×h×w` (a copy only
    /// for [`VideoLayout::Ncthw`]).
    pub fn to_ntchw(self, latents: HostTensor) -> Result<HostTensor> {
        let shape: [usize; 5] = latents.shape.as_slice().try_into().map_err(|_| {
            Error::InvalidInput(format!(
                "video latents are 5-D ({}), got shape {:?}",
                self.describe(),
                latents.shape
            ))
        })?;
        let [n, t, c, h, w] = self.dims(shape);
        if self == VideoLayout::Ntchw {
            return Ok(latents);
        }
        let plane = h * w;
        let mut data = Vec::with_capacity(latents.data.len());
        for v in 0..n {
            for f in 0..t {
                for ch in 0..c {
                    let at = ((v * c + ch) * t + f) * plane;
                    let src = latents.data.get(at..at + plane).ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "{} values do not fill video latents of shape {:?}",
                            latents.data.len(),
                            latents.shape
                        ))
                    })?;
                    data.extend_from_slice(src);
                }
            }
        }
        HostTensor::new(vec![n, t, c, h, w], data)
    }

    /// `N×T×C×h×w` or `N×C×T×h×w`.
    pub fn describe(self) -> &'static str {
        match self {
            VideoLayout::Ntchw => "N×T×C×h×w",
            VideoLayout::Ncthw => "N×C×T×h×w",
        }
    }
}

impl std::str::FromStr for VideoLayout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "ntchw" => Ok(VideoLayout::Ntchw),
            "ncthw" => Ok(VideoLayout::Ncthw),
            _ => Err(Error::InvalidInput(format!(
                "unknown video latent layout `{s}`: use ntchw (N×T×C×h×w, TAEHV) or ncthw (N×C×T×h×w, diffusers/Wan)"
            ))),
        }
    }
}

/// Video latents `[N, C, T, h, w]` mapped in place channel by channel:
/// `v → f(channel, v)` (a video VAE's pipeline form to its raw z), after
/// checking they are 5-D with the `c` channels `model` takes.
pub(crate) fn map_ncthw_channels(
    latents: &mut crate::io::HostTensor,
    model: &str,
    c: usize,
    f: impl Fn(usize, f32) -> f32,
) -> crate::error::Result<()> {
    use crate::error::Error;
    let plane = match latents.shape[..] {
        [_, lc, t, h, w] if lc == c => t * h * w,
        [_, lc, _, _, _] => {
            return Err(Error::InvalidInput(format!(
                "latents have {lc} channels; this {model} takes {c} (latents are N×C×T×h×w)"
            )))
        }
        _ => {
            return Err(Error::InvalidInput(format!(
                "{model} latents are N×C×T×h×w, got shape {:?}",
                latents.shape
            )))
        }
    };
    for (i, chunk) in latents.data.chunks_mut(plane.max(1)).enumerate() {
        let ch = i % c.max(1);
        chunk.iter_mut().for_each(|v| *v = f(ch, *v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(shape: &[usize]) -> HostTensor {
        let n = shape.iter().product();
        HostTensor::new(shape.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
    }

    /// FLUX.1's rule: token (r, q) feature c·4 + dy·2 + dx is map pixel
    /// (c, 2r + dy, 2q + dx); pack inverts unpack.
    #[test]
    fn patch2x2_follows_flux1_and_round_trips() {
        let p = TokenPacking::Patch2x2 { channels: 3 };
        let maps = ramp(&[2, 3, 4, 6]);
        let tokens = p.pack(&maps).unwrap();
        assert_eq!(tokens.shape, [2, 6, 12]);
        // batch 1, token row 1 col 2 (t = 1·3 + 2 = 5), channel 2, dy 1, dx 0.
        let t = &tokens.data[(6 + 5) * 12..(6 + 6) * 12];
        assert_eq!(t[2 * 4 + 2], maps.data[((3 + 2) * 4 + 3) * 6 + 4]);
        assert_eq!(p.unpack(&tokens, (2, 3)).unwrap(), maps);
        let flat = TokenPacking::Flat { channels: 3 };
        let t = flat.pack(&maps).unwrap();
        assert_eq!(t.shape, [2, 24, 3]);
        assert_eq!(
            t.data[(24 + 7) * 3 + 1],
            maps.data[((3 + 1) * 4 + 1) * 6 + 1]
        );
        assert_eq!(flat.unpack(&t, (4, 6)).unwrap(), maps);
    }

    #[test]
    fn token_grids_need_a_size_unless_square() {
        let form = LatentForm {
            map_channels: 16,
            pixels_per_position: 8,
            tokens: Some(TokenPacking::Patch2x2 { channels: 16 }),
        };
        let tokens = ramp(&[1, 6, 64]);
        let e = form
            .unpack_tokens(&tokens, None, "FLUX.1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unpack_tokens"), "{e}");
        let maps = form.unpack_tokens(&tokens, Some((32, 48)), "m").unwrap();
        assert_eq!(maps.shape, [1, 16, 4, 6]);
        let e = form
            .unpack_tokens(&tokens, Some((48, 48)), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 tokens") && e.contains("9 tokens"), "{e}");
        let e = form
            .unpack_tokens(&tokens, Some((30, 48)), "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of 16"), "{e}");
        let square = ramp(&[1, 9, 64]);
        assert_eq!(
            form.unpack_tokens(&square, None, "m").unwrap().shape,
            [1, 16, 6, 6]
        );
        assert!(form.is_tokens(&[1, 9, 64], None));
        assert!(!form.is_tokens(&[16, 9, 64], None), "C×h×w with w = 64");
        assert!(form.is_tokens(&[16, 9, 64], Some((48, 48))));
    }

    #[test]
    fn batch_norm_round_trips() {
        let bn = LatentBatchNorm {
            mean: (0..8).map(|i| i as f32 * 0.1).collect(),
            std: (0..8).map(|i| 1.0 + i as f32 * 0.5).collect(),
        };
        let z = ramp(&[1, 2, 4, 6]);
        let maps = bn.from_z(&z).unwrap();
        assert_eq!(maps.shape, [1, 8, 2, 3]);
        // patchified channel 4c + 2dy + dx: c 1, dy 1, dx 0 at (0, 1) is z (1, 1, 2).
        let pc = 4 + 2;
        let want = (z.data[(4 + 1) * 6 + 2] - bn.mean[pc]) / bn.std[pc];
        assert_eq!(maps.data[pc * 6 + 1], want);
        let back = bn.to_z(&maps).unwrap();
        for (a, b) in back.data.iter().zip(&z.data) {
            assert!((a - b).abs() < 1e-4, "{a} {b}");
        }
    }
}
