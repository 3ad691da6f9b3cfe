//! Memory estimates: the front ends' runs on a null device, whose pool
//! replays the allocation sequence of a real run without running a kernel.

use serde::Serialize;

use crate::decode::{decode, DecodeOptions};
use crate::encode::{encode, EncodeOptions, VaeEncoder};
use crate::error::Result;
use crate::gpu::{Capabilities, Context};
use crate::io::HostTensor;
use crate::memory::{MemoryStats, Policy};
use crate::models::{LoadOptions, Vae};
use crate::tiling::{Tiling, TilingReport};

/// Predicted memory of a decode.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryEstimate {
    /// Memory policy the estimate is for.
    pub policy: &'static str,
    /// The model's description.
    pub model: String,
    /// Latent shape `[N, C, h, w]`.
    pub latents_shape: Vec<usize>,
    /// Image shape `[N, 3, H, W]`.
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

/// Zeros of `shape`.
fn zeros(shape: [usize; 4]) -> Result<HostTensor> {
    HostTensor::new(shape.to_vec(), vec![0.0; shape.iter().product()])
}

/// Predicts the pool's peaks for decoding latents of `latent_shape` with
/// `vae_spec` under `policy` on a device with `caps`, without running any
/// kernel or allocating device memory: the decode runs on a null device
/// ([`Context::null`]) and the pool replays its allocation sequence.
/// Untiled (as [`Tiling::off`]); see [`estimate_decode_with`].
pub fn estimate_decode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    latent_shape: [usize; 4],
) -> Result<MemoryEstimate> {
    estimate_decode_with(caps, policy, vae_spec, load, latent_shape, &Tiling::off())
}

/// [`estimate_decode`] of a decode tiled as `tiling` says (the same
/// choices [`decode`] makes with these options on a device with `caps`).
pub fn estimate_decode_with(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    latent_shape: [usize; 4],
    tiling: &Tiling,
) -> Result<MemoryEstimate> {
    MemoryEstimate::predict(caps, policy, |null| {
        let vae = Vae::load(null, vae_spec, load)?;
        let opts = DecodeOptions {
            raw_latents: true,
            tiling: tiling.clone(),
            ..Default::default()
        };
        let out = decode(null, &vae, &zeros(latent_shape)?, &opts)?;
        let image = vec![latent_shape[0], 3, out.height, out.width];
        let model = (vae.name.clone(), vae.weights_bytes);
        Ok((
            model,
            (latent_shape.to_vec(), image),
            out.memory,
            out.tiling,
        ))
    })
}

/// Predicts the pool's peaks for encoding images of `image_shape`
/// [N, 3, H, W] untiled (see [`estimate_decode`] and [`estimate_encode_with`]).
pub fn estimate_encode(
    caps: &Capabilities,
    policy: Policy,
    vae_spec: &str,
    load: &LoadOptions,
    image_shape: [usize; 4],
) -> Result<MemoryEstimate> {
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
) -> Result<MemoryEstimate> {
    MemoryEstimate::predict(caps, policy, |null| {
        let enc = VaeEncoder::load(null, vae_spec, load)?;
        let opts = EncodeOptions {
            tiling: tiling.clone(),
            ..Default::default()
        };
        let out = encode(null, &enc, &zeros(image_shape)?, &opts)?;
        let model = (enc.name.clone(), enc.weights_bytes);
        let shapes = (out.latents.shape.clone(), image_shape.to_vec());
        Ok((model, shapes, out.memory, out.tiling))
    })
}
