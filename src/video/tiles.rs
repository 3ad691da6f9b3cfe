//! Spatial tiles of a video decode: exact tiles (each layer tile by tile,
//! the time caches parked tile by tile), chosen by [`Tiling`].

use super::VideoDecoder;
use crate::error::{Error, Result};
use crate::io::HostTensor;
use crate::run::video::untiled_chunk_fits;
use crate::tiling::{TileMode, Tiling};

/// Default tile side of an exact tiled video decode, in output pixels.
pub const VIDEO_DEFAULT_TILE: usize = 256;

/// MiniMax-H3's reference tiles (diffusers' defaults): 256 pixels,
/// overlapping by at least `REFERENCE_OVERLAP`.
const REFERENCE_TILE: usize = 256;
const REFERENCE_OVERLAP: usize = 64;

impl VideoDecoder<'_> {
    /// Tiles every frame spatially (set before the first chunk).
    /// [`TileMode::Exact`]: each layer runs tile by tile over its output
    /// with the time caches kept as whole frames parked tile by tile, so the
    /// frames equal the untiled decode up to float rounding (no seams) while
    /// no tensor holds a whole frame at the full resolution: frames larger
    /// than the device's storage binding limit or the memory budget
    /// decode. `tile_size` is in output pixels ([`VIDEO_DEFAULT_TILE`] when
    /// `None`); the budget (`max_memory`) caps the tiles parked on the
    /// device (half of what the weights leave), the rest go to host memory.
    /// [`TileMode::Auto`]: exact tiles only when a null-device dry run of the
    /// untiled first chunk exceeds the budget or a device limit.
    /// [`TileMode::Off`] (the default): untiled. [`TileMode::Fast`] is refused
    /// (its blended tiles would put seams in time as well as space).
    pub fn set_tiling(&mut self, tiling: Tiling) -> Result<()> {
        if self.submitted > 0 {
            return Err(Error::InvalidInput(
                "a VideoDecoder's tiling is set before its first chunk".into(),
            ));
        }
        let model = self.decoder.get();
        if tiling.mode == TileMode::Fast && !model.clip_based() {
            return Err(Error::Unsupported(
                "fast (blended) tiles of a video decode: use exact tiles (`TileMode::Exact`), equal to the untiled decode".into(),
            ));
        }
        if model.clip_based() {
            let up = model.upscale();
            let tile = tiling.tile_size.unwrap_or(REFERENCE_TILE);
            let overlap = tiling.overlap.unwrap_or(REFERENCE_OVERLAP);
            if tile == 0
                || !tile.is_multiple_of(up)
                || !overlap.is_multiple_of(up)
                || overlap >= tile
            {
                return Err(Error::InvalidInput(format!(
                    "tiles of {tile} pixels overlapping by at least {overlap}: the {}'s tiles are whole latent pixels ({up} pixels), the overlap below the tile (its reference: {REFERENCE_TILE} and {REFERENCE_OVERLAP})",
                    model.name()
                )));
            }
        }
        if tiling.mode == TileMode::Exact && self.decoder.get().clip_based() {
            return Err(Error::Unsupported(format!(
                "exact tiles of the {}: its transformer's tokens attend to every other token of a clip, so a tile's pixels depend on the whole frame; it decodes in its reference's blended tiles (`TileMode::Auto`, `TileMode::Fast`) or untiled",
                self.decoder.get().name()
            )));
        }
        if tiling.tile_size == Some(0) {
            return Err(Error::InvalidInput("a tile size of 0 pixels".into()));
        }
        self.tiling = tiling;
        Ok(())
    }

    /// [`VideoDecoder::set_tiling`] as a builder.
    pub fn with_tiling(mut self, tiling: Tiling) -> Result<Self> {
        self.set_tiling(tiling)?;
        Ok(self)
    }

    /// The exact tile side in output pixels once a chunk ran tiled (`None`: untiled).
    pub fn tile_size(&self) -> Option<usize> {
        self.run.tile_size()
    }

    /// What the exact tiles did so far (`None`: untiled): parking peaks,
    /// uploads, syncs, steps; `tiles` and `max_memory` are left at zero.
    pub fn tiling_report(&self) -> Option<crate::tiling::TilingReport> {
        self.run.tiling_report()
    }

    /// Whether the first chunk `[T, C, h, w]` runs exact tiles: always for
    /// [`TileMode::Exact`]; for [`TileMode::Auto`] when the untiled chunk
    /// does not fit the budget or a device limit (a null-device dry run).
    pub(crate) fn wants_tiles(&self, chunk: &HostTensor) -> Result<bool> {
        if self.decoder.get().clip_based() {
            return Ok(false);
        }
        match self.tiling.mode {
            TileMode::Off | TileMode::Fast => Ok(false),
            TileMode::Exact => Ok(true),
            TileMode::Auto => {
                let budget = self.tiling.budget(self.ctx.caps());
                let base = self.ctx.pool().stats().allocated_bytes.current;
                let graph = self.decoder.get().graph();
                let fits = untiled_chunk_fits(&self.ctx, budget, base, graph, chunk)?;
                Ok(!fits)
            }
        }
    }

    /// A clip-based decoder's reference tiles for latent frames `h × w`
    /// (MiniMax-H3, under [`TileMode::Auto`] or [`TileMode::Fast`]): the
    /// tile and least overlap in output pixels; `None` when untiled (tiling
    /// off, or one tile covers the frame: the same values).
    pub fn reference_tiles(&self, hw: (usize, usize)) -> Option<(usize, usize)> {
        self.reference_tiling(hw).map(|(t, o, _)| (t, o))
    }

    /// [`VideoDecoder::reference_tiles`] and the model's upscale.
    pub(super) fn reference_tiling(&self, (h, w): (usize, usize)) -> Option<(usize, usize, usize)> {
        let model = self.decoder.get();
        if !model.clip_based() || !matches!(self.tiling.mode, TileMode::Auto | TileMode::Fast) {
            return None;
        }
        let tile = self.tiling.tile_size.unwrap_or(REFERENCE_TILE);
        let overlap = self.tiling.overlap.unwrap_or(REFERENCE_OVERLAP);
        let up = model.upscale();
        (h * up > tile || w * up > tile).then_some((tile, overlap, up))
    }

    /// Makes this decoder (an estimate's, on a null device) plan its tiles
    /// as those of a video planned by rows, whose frames are a few rows of
    /// ([`crate::run::rows::sample_rows`]).
    pub(crate) fn sample_rows(&mut self) {
        self.run.sample_rows();
    }

    /// Runs the video in exact tiles from its first chunk, whose latent
    /// frames are `h × w`.
    pub(super) fn start_tiles(&mut self, hw: (usize, usize)) -> Result<()> {
        let model = self.decoder.get();
        let px_out = self.tiling.tile_size.unwrap_or(VIDEO_DEFAULT_TILE);
        let budget = self.tiling.budget(self.ctx.caps());
        self.run.start_tiles(
            &self.ctx,
            model.graph(),
            px_out,
            (budget, self.tiling.max_host_memory),
            hw,
        )
    }
}
