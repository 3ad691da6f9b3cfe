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
    /// `exact`, estimates only: planned on a few rows of tiles (every kind
    /// of tile the image has) and the counts above extrapolated to all rows;
    /// the peaks are those of the whole run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub extrapolated: bool,
    /// Whole rows of query tiles per attention pass (0: one pass, or parts of a row).
    #[serde(skip)]
    pub(crate) attention_rows_per_pass: usize,
}

/// The counts of a [`TilingReport`] that grow with the image (the peaks
/// other than host parking do not): what a plan made on a few rows of tiles
/// extrapolates to all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Counts {
    pub host_parked_peak_bytes: u64,
    pub uploaded_bytes: u64,
    pub readback_bytes: u64,
    pub syncs: u64,
    pub steps: u64,
    pub window_copies: u64,
}

impl Counts {
    pub(crate) fn of(r: &TilingReport) -> Counts {
        Counts {
            host_parked_peak_bytes: r.host_parked_peak_bytes,
            uploaded_bytes: r.uploaded_bytes,
            readback_bytes: r.readback_bytes,
            syncs: r.syncs as u64,
            steps: r.steps as u64,
            window_copies: r.window_copies as u64,
        }
    }

    /// `r` with these counts, marked extrapolated.
    pub(crate) fn apply(&self, r: &mut TilingReport) {
        r.host_parked_peak_bytes = self.host_parked_peak_bytes;
        r.uploaded_bytes = self.uploaded_bytes;
        r.readback_bytes = self.readback_bytes;
        r.syncs = self.syncs as usize;
        r.steps = self.steps as usize;
        r.window_copies = self.window_copies as usize;
        r.extrapolated = true;
    }

    /// The counts at `x` of the quadratic through `at` = the counts at 0, 1
    /// and 2 (a count grows with the rows of tiles at most quadratically:
    /// attention passes × key tiles), clamped at 0.
    pub(crate) fn quadratic(at: [Counts; 3], x: u64) -> Counts {
        let f = |g: fn(&Counts) -> u64| -> u64 {
            let [a, b, c] = at.map(|k| g(&k) as i128);
            let x = x as i128;
            let v = a + x * (b - a) + x * (x - 1) / 2 * (c - 2 * b + a);
            v.clamp(0, u64::MAX as i128) as u64
        };
        Counts {
            host_parked_peak_bytes: f(|k| k.host_parked_peak_bytes),
            uploaded_bytes: f(|k| k.uploaded_bytes),
            readback_bytes: f(|k| k.readback_bytes),
            syncs: f(|k| k.syncs),
            steps: f(|k| k.steps),
            window_copies: f(|k| k.window_copies),
        }
    }
}
