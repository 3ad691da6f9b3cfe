//! Memory estimates: the front ends' runs on a null device, whose pool
//! replays the allocation sequence of a real run without running a kernel.

use serde::Serialize;

use crate::decode::{decode_checked, DecodeOptions};
use crate::encode::{encode_image, EncodeOptions};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Context};
use crate::io::HostTensor;
use crate::memory::{MemoryStats, Policy};
use crate::models::vae_encoder::VaeEncoder;
use crate::models::{ImageDecoder, LoadOptions};
use crate::tiling::{Tiling, TilingReport};

mod video;

pub use video::{VideoMemoryEstimate, VideoPeakBreakdown, MAX_VIDEO_FRAMES};

/// Predicted memory of a decode.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    /// Memory policy the estimate is for.
    pub policy: &'static str,
    /// The model's description.
    pub model: String,
    /// Latent shape `[N, C, h, w]`.
    pub latents_shape: Vec<usize>,
    /// Image shape `[N, C, H, W]` (C: the decoder's image channels, or the
    /// encoder's input's 3).
    pub image_shape: Vec<usize>,
    /// Bytes of weights (part of the peaks).
    pub weights_bytes: u64,
    /// Peaks over the decode, weights included.
    pub peak_allocated_bytes: u64,
    /// Predicted peak reserved bytes (pool capacity, weights included).
    pub peak_reserved_bytes: u64,
    /// How the decode would be tiled (host bytes for parking included).
    pub tiling: TilingReport,
}

/// What a run on the null device tells: (model name, weight bytes),
/// (latents shape, image shape), its memory and its tiling.
type NullRun = (
    (String, u64),
    (Vec<usize>, Vec<usize>),
    MemoryStats,
    TilingReport,
);

impl MemoryEstimate {
    /// Runs `job` on a null device with a fresh pool of `policy`.
    fn predict(
        caps: &Capabilities,
        policy: Policy,
        job: impl FnOnce(&Context) -> Result<NullRun>,
    ) -> Result<Self> {
        let null = Context::null(caps.clone(), policy.new_pool());
        let ((model, weights_bytes), (latents_shape, image_shape), memory, tiling) = job(&null)?;
        Ok(MemoryEstimate {
            policy: policy.name(),
            model,
            latents_shape,
            image_shape,
            weights_bytes,
            peak_allocated_bytes: memory.allocated_bytes.peak,
            peak_reserved_bytes: memory.reserved_bytes.peak,
            tiling,
        })
    }
}

/// Zeros of `shape`: the input a real run would hold on the host. A shape
/// whose values could not exist on this host is an error, before anything
/// is allocated (sizes with no real input behind them, e.g. a batch of 2^64).
fn zeros(shape: [usize; 4]) -> Result<HostTensor> {
    let bytes = shape
        .iter()
        .try_fold(4usize, |a, &d| a.checked_mul(d))
        .map(|b| b as u64);
    let limit = crate::tiling::host_memory_available().unwrap_or(u64::MAX);
    match bytes {
        Some(b) if b <= limit => {
            HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()])
        }
        _ => Err(Error::OverBudget(format!(
            "an input of shape {shape:?} ({}) does not fit this host's available memory ({:.1} GiB); a run of that size needs it in host memory, so no estimate is made",
            bytes.map_or("over 2^64 bytes".to_string(), |b| format!("{:.1} GiB of f32", b as f64 / (1u64 << 30) as f64)),
            limit as f64 / (1u64 << 30) as f64
        ))),
    }
}

/// A memory prediction: a model (`vae`, loaded with `load`) on a device
/// with `caps` under `policy`, tiled as `tiling` says. [`Estimate::decode`]
/// and [`Estimate::encode`] run the front end on a null device
/// ([`Context::null`]) whose pool replays the allocation sequence, without
/// running a kernel or allocating device memory; the choices are the ones
/// [`crate::decode()`] / [`crate::encode::encode()`] make with these options on such a device.
#[derive(Clone, Debug)]
pub struct Estimate<'a> {
    /// The device the run is predicted for.
    pub caps: &'a Capabilities,
    /// Memory policy of the pool.
    pub policy: Policy,
    /// The model, as [`Vae::load`](crate::Vae::load) takes it.
    pub vae: &'a str,
    /// How it is loaded (precision, config overrides, preset seed).
    pub load: &'a LoadOptions,
    /// How the run is tiled (untiled unless [`Estimate::tiled`]).
    pub tiling: Tiling,
}

impl<'a> Estimate<'a> {
    /// An untiled run of `vae` on `caps` under `policy`.
    pub fn new(
        caps: &'a Capabilities,
        policy: Policy,
        vae: &'a str,
        load: &'a LoadOptions,
    ) -> Self {
        Estimate {
            caps,
            policy,
            vae,
            load,
            tiling: Tiling::off(),
        }
    }

    /// The same run tiled as `tiling` says.
    pub fn tiled(mut self, tiling: &Tiling) -> Self {
        self.tiling = tiling.clone();
        self
    }

    /// Peaks of decoding latents of `latent_shape` `[N, C, h, w]`.
    pub fn decode(&self, latent_shape: [usize; 4]) -> Result<MemoryEstimate> {
        let latents = zeros(latent_shape)?;
        MemoryEstimate::predict(self.caps, self.policy, |null| {
            let vae = ImageDecoder::load(null, self.vae, self.load)?;
            let opts = DecodeOptions {
                raw_latents: true,
                tiling: self.tiling.clone(),
                ..Default::default()
            };
            // Zeros: nothing to scan for non-finite values.
            let out = decode_checked(null, &vae, &latents, &opts, false)?;
            let image = vec![latent_shape[0], out.channels, out.height, out.width];
            let model = (vae.name().to_string(), vae.weights_bytes());
            let shapes = (latent_shape.to_vec(), image);
            Ok((model, shapes, out.memory, out.tiling))
        })
    }

    /// Peaks of encoding images of `image_shape` `[N, 3, H, W]`.
    pub fn encode(&self, image_shape: [usize; 4]) -> Result<MemoryEstimate> {
        let image = zeros(image_shape)?;
        MemoryEstimate::predict(self.caps, self.policy, |null| {
            let enc = VaeEncoder::load(null, self.vae, self.load)?;
            let opts = EncodeOptions {
                tiling: self.tiling.clone(),
                ..Default::default()
            };
            let out = encode_image(null, &enc, &image, &opts)?;
            let model = (enc.name.clone(), enc.weights_bytes);
            let shapes = (out.latents.shape.clone(), image_shape.to_vec());
            Ok((model, shapes, out.memory, out.tiling))
        })
    }
}
