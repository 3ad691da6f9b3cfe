//! What an executor reports while and after it runs tiles: progress callbacks and the
//! tiling report (re-exported by [`crate::tiling`], which plans the tiles).

use std::sync::Arc;

use serde::Serialize;

/// One tile step done.
#[derive(Clone, Copy, Debug)]
pub struct ProgressUpdate {
    /// Steps done.
    pub done: usize,
    /// Steps in total.
    pub total: usize,
    /// The layer being run.
    pub stage: &'static str,
}

/// A progress callback (called once per tile step of a tiled decode or encode).
#[derive(Clone)]
pub struct Progress(pub Arc<dyn Fn(ProgressUpdate) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}

/// How a decode or encode was tiled, and what tiling cost.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TilingReport {
    /// `untiled`, `exact` or `fast`.
    pub mode: String,
    /// The memory budget (bytes, weights included).
    pub max_memory: u64,
    /// Tile side in image pixels (decode output, encode input).
    pub tile_size: Option<usize>,
    /// `fast`: overlap in image pixels.
    pub overlap: Option<usize>,
    /// Tiles of the image.
    pub tiles: usize,
    /// `exact`: tile side per resolution level, latent first (`None`: whole).
    pub level_tiles: Vec<Option<usize>>,
    /// `exact`: the mid-block (latent level) ran tile by tile.
    pub mid_block_tiled: bool,
    /// `exact`: the most device bytes parked tiles could use.
    pub device_parking_cap: u64,
    /// Peak bytes of tiles parked on the device.
    pub device_parked_peak_bytes: u64,
    /// Peak bytes of tiles parked in host memory (the latents excluded).
    pub host_parked_peak_bytes: u64,
    /// Host → device bytes uploaded for windows of host-parked tiles.
    pub uploaded_bytes: u64,
    /// Device → host bytes read back (parking and output).
    pub readback_bytes: u64,
    /// Waits for the device (read-backs, staging limits).
    pub syncs: usize,
    /// Tile steps (one layer on one tile).
    pub steps: usize,
    /// Window copies recorded (halo gathers and crops).
    pub window_copies: usize,
    /// `exact`: peak bytes of staging buffers (uploads in flight, or one
    /// read-back), outside the pool; pool peak + this stays within the budget.
    pub staging_peak_bytes: u64,
}
