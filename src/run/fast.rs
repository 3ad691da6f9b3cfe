//! Fast tiling as diffusers does it (`tiled_decode` / `_tiled_encode`):
//! overlapping tiles run independently, their outputs blended in raster
//! order with linear ramps (in place, so later tiles blend with already
//! blended neighbours) and cropped.

use crate::error::Result;
use crate::io::HostTensor;
use crate::tiling::{Progress, ProgressUpdate, TilingReport};

/// A tile's output `[N, C, h, w]` on the host.
pub(crate) struct FastTile {
    pub h: usize,
    pub w: usize,
    pub data: Vec<f32>,
}

/// One tile's run: its output, its channels and the bytes read back.
pub(crate) struct TileRun {
    pub tile: FastTile,
    pub channels: usize,
    pub readback: u64,
}

/// The geometry of a fast tiling: tiles of `tile` input pixels every
/// `stride`; outputs blended over `extent` output pixels and cropped to `limit`.
pub(crate) struct FastGrid {
    pub tile: usize,
    pub stride: usize,
    pub extent: usize,
    pub limit: usize,
    /// Output `(height, width)`.
    pub out: (usize, usize),
}

/// The assembled output and what it took.
pub(crate) struct FastOutput {
    /// `[N, C, H, W]` as f32.
    pub data: Vec<f32>,
    pub channels: usize,
    pub tiles: usize,
    /// Tiles per row.
    pub cols: usize,
    pub readback: u64,
    /// Host bytes of tile outputs kept for blending (this row and the last).
    pub held_peak: u64,
}

impl FastOutput {
    /// The report of a fast tiling of `px`-pixel tiles overlapping by
    /// `overlap` that parked `host_parked` bytes on the host.
    pub(crate) fn report(&self, px: usize, overlap: usize, host_parked: u64) -> TilingReport {
        TilingReport {
            mode: "fast".into(),
            tile_size: Some(px),
            overlap: Some(overlap),
            tiles: self.tiles,
            steps: self.tiles,
            readback_bytes: self.readback,
            syncs: self.tiles,
            host_parked_peak_bytes: host_parked,
            ..Default::default()
        }
    }
}

/// Runs every tile of input `x` `[N, C, H, W]` with `run` and blends the
/// outputs into one image.
pub(crate) fn run_fast(
    x: &HostTensor,
    grid: &FastGrid,
    progress: Option<&Progress>,
    mut run: impl FnMut(&HostTensor) -> Result<TileRun>,
) -> Result<FastOutput> {
    let [n, h, w] = [x.shape[0], x.shape[2], x.shape[3]];
    let (oh, ow) = grid.out;
    let rows: Vec<usize> = (0..h).step_by(grid.stride).collect();
    let cols: Vec<usize> = (0..w).step_by(grid.stride).collect();
    let total = rows.len() * cols.len();
    let mut out: Option<Vec<f32>> = None;
    let mut prev: Vec<FastTile> = Vec::new();
    let (mut out_y, mut done, mut readback, mut held_peak, mut channels) = (0, 0, 0, 0, 0);
    let held = |tiles: &[FastTile], planes: usize| -> u64 {
        tiles.iter().map(|t| (planes * t.h * t.w * 4) as u64).sum()
    };
    for &i in &rows {
        let mut row: Vec<FastTile> = Vec::new();
        let (mut out_x, mut crop_h) = (0, 0);
        for (ci, &j) in cols.iter().enumerate() {
            let xt = x.crop(i, (i + grid.tile).min(h), j, (j + grid.tile).min(w));
            let r = run(&xt)?;
            let (planes, mut t) = (n * r.channels, r.tile);
            channels = r.channels;
            readback += r.readback;
            if let Some(above) = prev.get(ci) {
                blend_v(above, &mut t, planes, grid.extent);
            }
            if let Some(left) = row.last() {
                blend_h(left, &mut t, planes, grid.extent);
            }
            let (ch, cw) = (grid.limit.min(t.h), grid.limit.min(t.w));
            let o = out.get_or_insert_with(|| vec![0.0; planes * oh * ow]);
            for p in 0..planes {
                for y in 0..ch {
                    let src = (p * t.h + y) * t.w;
                    let dst = (p * oh + out_y + y) * ow + out_x;
                    o[dst..dst + cw].copy_from_slice(&t.data[src..src + cw]);
                }
            }
            out_x += cw;
            crop_h = ch;
            row.push(t);
            held_peak = held_peak.max(held(&prev, planes) + held(&row, planes));
            done += 1;
            if let Some(p) = progress {
                (p.0)(ProgressUpdate {
                    done,
                    total,
                    stage: "fast tile",
                });
            }
        }
        out_y += crop_h;
        prev = row;
    }
    debug_assert_eq!(out_y, oh);
    Ok(FastOutput {
        data: out.unwrap_or_default(),
        channels,
        tiles: total,
        cols: cols.len(),
        readback,
        held_peak,
    })
}

/// diffusers' `blend_v`: the first rows of `b` fade in over the last rows of `a`.
fn blend_v(a: &FastTile, b: &mut FastTile, planes: usize, extent: usize) {
    let e = a.h.min(b.h).min(extent);
    for y in 0..e {
        let (wa, wb) = ramp(y, e);
        for p in 0..planes {
            let ra = (p * a.h + a.h - e + y) * a.w;
            let rb = (p * b.h + y) * b.w;
            for x in 0..b.w.min(a.w) {
                b.data[rb + x] = a.data[ra + x] * wa + b.data[rb + x] * wb;
            }
        }
    }
}

/// diffusers' `blend_h`: the first columns of `b` fade in over the last columns of `a`.
fn blend_h(a: &FastTile, b: &mut FastTile, planes: usize, extent: usize) {
    let e = a.w.min(b.w).min(extent);
    for p in 0..planes {
        for y in 0..b.h.min(a.h) {
            let ra = (p * a.h + y) * a.w;
            let rb = (p * b.h + y) * b.w;
            for x in 0..e {
                let (wa, wb) = ramp(x, e);
                b.data[rb + x] = a.data[ra + a.w - e + x] * wa + b.data[rb + x] * wb;
            }
        }
    }
}

/// Weights `(1 - i/e, i/e)` as PyTorch applies Python floats to f32 tensors.
fn ramp(i: usize, e: usize) -> (f32, f32) {
    let t = i as f64 / e as f64;
    ((1.0 - t) as f32, t as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// diffusers' blend on a 1-plane example, computed by hand.
    #[test]
    fn blends_follow_diffusers() {
        let tile = |h: usize, w: usize, v: f32| FastTile {
            h,
            w,
            data: vec![v; h * w],
        };
        let a = tile(4, 2, 1.0);
        let mut b = tile(3, 2, 0.0);
        blend_v(&a, &mut b, 1, 2);
        // y = 0: a weight 1; y = 1: a weight 0.5; y = 2 untouched.
        assert_eq!(b.data, vec![1.0, 1.0, 0.5, 0.5, 0.0, 0.0]);
        let mut c = tile(3, 2, 0.0);
        blend_h(&b, &mut c, 1, 4);
        assert_eq!(c.data, vec![1.0, 0.5, 0.5, 0.25, 0.0, 0.0]);
    }
}
