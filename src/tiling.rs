//! Tiled decoding: exact (global GroupNorm statistics, layer-synchronous
//! tiles) and fast (independent overlapping tiles blended like diffusers).
//!
//! # Exact tiling
//! Every decoder layer runs tile by tile over its *output*: a conv reads its
//! input window (the tile plus the halo its kernel needs, clamped to the
//! image; the conv's own zero padding applies only at image borders, so the
//! result is the whole-image conv restricted to the tile), and the tile is
//! *parked*: kept on the device while the budget allows, else read back to
//! host memory. A GroupNorm's statistics are accumulated per tile
//! ([`group_norm_partials`]) while its input is produced and merged exactly
//! (Chan's formula) after the last tile ([`group_norm_combine`]); the next
//! conv then applies the global affine (and activation) while loading. The
//! mid-block attention computes K and V per tile, parks them, and streams
//! them block by block through each query tile's online-softmax state
//! ([`flash_attention_block`]). Nothing is recomputed: each conv output pixel is
//! computed once (2× upsample convs compute at most one extra row and column
//! per tile side).
//!
//! Each resolution level has its own tile grid: level `l` (the latent is
//! level 0, every 2× upsample adds one) uses tiles of `tile_size >> (L - l)`
//! pixels so tiles nest across levels; a level smaller than its tile runs
//! whole.
//!
//! Encoders run on the same executor in the other direction (image → latent
//! level): a stride-2 conv reads the input span `conv_span` names for its
//! output tile (halo plus the whole-image padding where the tile touches a
//! border, e.g. diffusers' asymmetric (0, 1, 0, 1) pad).
//!
//! # Video
//! Causal video decoders (time as the batch dimension) run on the same
//! executor ([`crate::VideoDecoder::set_tiling`]): their time caches are
//! whole-frame activations parked tile by tile and kept between chunks, a
//! causal conv's output tile reads its halo window from the chunk and from
//! the cache, and a cache is replaced only after the layer's last tile, so
//! the result is the untiled decode's up to float rounding. Video plans are
//! not fitted by dry runs: parked device tiles get half the budget left
//! after the weights, the rest parks in host memory.
//!
//! # Memory
//! `max_memory` bounds the pool's peak *allocated* bytes of the whole decode,
//! weights included. The plan is found with dry runs of the same code
//! ([`Context::null`]): first with every tile parked on the host, whose
//! peak is the working set `W` of the largest step; then parked device bytes
//! are capped at `max_memory - (already allocated) - W` and a second dry run
//! checks the peak. Parking decisions depend only on byte counts, so the real
//! run allocates exactly what the dry run did.
//!
//! The exact executor lives in `crate::exec::exact`; this module holds the
//! options and the report.
//!
//! [`group_norm_partials`]: crate::kernels::group_norm::group_norm_partials
//! [`group_norm_combine`]: crate::kernels::group_norm::group_norm_combine
//! [`flash_attention_block`]: crate::kernels::attention::flash_attention_block
//! [`Context::null`]: crate::gpu::Context::null

use serde::Serialize;

pub(crate) use crate::exec::exact::{Act, ExactPlan, Executor, STAGING_LIMIT};
pub use crate::exec::report::{Progress, ProgressUpdate, TilingReport};
use crate::gpu::Capabilities;

/// How a decode is split into tiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TileMode {
    /// Untiled when the whole decode fits `max_memory` and the device's
    /// binding/buffer limits, otherwise `Exact` with the largest tile that fits.
    #[default]
    Auto,
    /// Never tile (errors name the limit a too-large decode exceeds).
    Off,
    /// Tiles whose output equals the untiled decode up to float rounding.
    Exact,
    /// Independent overlapping tiles blended with linear ramps (the
    /// diffusers / ComfyUI behaviour): seams and tone shifts possible.
    Fast,
}

impl TileMode {
    /// The mode's command-line name.
    pub fn name(self) -> &'static str {
        crate::named::Named::name(self)
    }
}

crate::named::named!(TileMode, "tile mode", {
    Auto => "auto",
    Off => "off",
    Exact => "exact",
    Fast => "fast",
});

/// Default tile side of `fast` mode in output pixels (diffusers' SD default).
#[doc(hidden)]
pub const FAST_DEFAULT_TILE: usize = 512;

/// Tiling options of a decode or encode (a field of [`crate::DecodeOptions`]
/// and [`crate::encode::EncodeOptions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tiling {
    /// How to tile.
    pub mode: TileMode,
    /// Tile side in image pixels (decode output, encode input), rounded up
    /// to a multiple of the model's scale (8). `None`: the largest that fits `max_memory` (exact, auto),
    /// [`FAST_DEFAULT_TILE`] (fast).
    pub tile_size: Option<usize>,
    /// `fast` only: overlap of neighbouring tiles in image pixels, a
    /// multiple of 8 below the tile size (default a quarter of the tile, as
    /// diffusers). Exact tiles need no overlap: their halos are exact.
    pub overlap: Option<usize>,
    /// Peak pool-allocated bytes of the decode or encode, weights included.
    /// `None`: [`default_max_memory`] of the device.
    pub max_memory: Option<u64>,
    /// `exact`: tile the latent-resolution level (the AutoencoderKL
    /// mid-block, TAE's latent-resolution blocks) even when it fits whole (tests).
    pub tile_mid_block: bool,
    /// Most host bytes tiles may be parked in. `None`: the host's
    /// `MemAvailable` (/proc/meminfo) for real runs, unlimited for dry runs
    /// (estimates for another machine). A plan over it fails before any
    /// kernel runs; an exact tiled video (whose tile size is given, not
    /// planned) fails when its next parked tile would pass it.
    pub max_host_memory: Option<u64>,
}

impl Tiling {
    /// Never tile.
    pub fn off() -> Self {
        Tiling {
            mode: TileMode::Off,
            ..Default::default()
        }
    }
    /// Exact tiles (equal to the untiled result up to rounding).
    pub fn exact() -> Self {
        Tiling {
            mode: TileMode::Exact,
            ..Default::default()
        }
    }
    /// Fast, independently decoded overlapping tiles (diffusers' tiling).
    pub fn fast() -> Self {
        Tiling {
            mode: TileMode::Fast,
            ..Default::default()
        }
    }
    /// Tiles of `px` pixels.
    pub fn with_tile_size(mut self, px: usize) -> Self {
        self.tile_size = Some(px);
        self
    }
    /// Fast tiles overlapping by `px` pixels.
    pub fn with_overlap(mut self, px: usize) -> Self {
        self.overlap = Some(px);
        self
    }
    /// A memory budget of `bytes`.
    pub fn with_max_memory(mut self, bytes: u64) -> Self {
        self.max_memory = Some(bytes);
        self
    }
    /// A limit of `bytes` on tiles parked in host memory.
    pub fn with_max_host_memory(mut self, bytes: u64) -> Self {
        self.max_host_memory = Some(bytes);
        self
    }
    /// The memory budget on a device.
    pub fn budget(&self, caps: &Capabilities) -> u64 {
        self.max_memory.unwrap_or_else(|| default_max_memory(caps))
    }
}

/// The default memory budget. On a discrete GPU whose backend reports its device-local
/// memory (Vulkan's heaps, with `VK_EXT_memory_budget` where the driver has it; see
/// [`crate::gpu::device_memory`]) it is 90 % of what the process may allocate there, at
/// least 1 GiB. Elsewhere (other backends, integrated and CPU adapters, whose "device" memory
/// is the host's, and the reference GPU of `--reference-gpu`) the rule is the fallback: three
/// quarters of `max_buffer_size`, the largest single buffer, which Vulkan drivers derive from
/// their allocation limits (wgpu caps it at 2 GiB on Mesa; the reference 24 GB GPU reports 24
/// GiB), clamped to [1 GiB, 16 GiB]: never less than what a 1024² decode needs tiled.
pub fn default_max_memory(caps: &Capabilities) -> u64 {
    match caps.device_memory {
        Some(m) if caps.device_type == wgpu::DeviceType::DiscreteGpu => {
            m.usable_bytes().max(1 << 30)
        }
        _ => (caps.max_buffer_size / 4 * 3).clamp(1 << 30, 16 << 30),
    }
}

#[doc(hidden)]
pub use crate::gpu::host_memory_available;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::device_memory::DeviceMemory;

    /// Discrete GPUs that report their memory plan for 90 % of it; everything else keeps
    /// three quarters of `max_buffer_size` within [1, 16] GiB.
    #[test]
    fn default_budget_follows_the_cards_memory() {
        let gib = 1u64 << 30;
        let mut caps = Capabilities::reference_gpu();
        assert_eq!(default_max_memory(&caps), 16 * gib);
        caps.device_memory = Some(DeviceMemory {
            heap_bytes: 8 * gib,
            budget_bytes: Some(7 * gib),
        });
        assert_eq!(default_max_memory(&caps), 7 * gib / 10 * 9);
        caps.device_memory = Some(DeviceMemory {
            heap_bytes: 80 * gib,
            budget_bytes: None,
        });
        assert_eq!(default_max_memory(&caps), 80 * gib / 10 * 9);
        caps.device_type = wgpu::DeviceType::Cpu;
        assert_eq!(default_max_memory(&caps), 16 * gib);
        caps.device_type = wgpu::DeviceType::DiscreteGpu;
        caps.device_memory = Some(DeviceMemory {
            heap_bytes: 512 << 20,
            budget_bytes: None,
        });
        assert_eq!(default_max_memory(&caps), gib);
    }
}
