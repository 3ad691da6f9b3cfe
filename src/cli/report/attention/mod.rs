//! `wgvae bench attention`: two attention workloads with the metadata
//! header of [`super::bench::Metadata`].
//!
//! - **Frame sweep** (the shape of a published VGGT "VRAM sweep", read at run
//!   time from `../shared/reference/vggt_vram_sweep.csv`): frames × tokens
//!   per frame, embed 128 in 16 heads of 8, f32, for global attention,
//!   one-shot windowed attention (sink + window mask, tiles outside skipped)
//!   and windowed attention streamed frame by frame through a
//!   [`RingKvCache`]. Cells run when their predicted time fits a budget;
//!   memory of every cell is predicted by a dry run of the same code
//!   ([`Context::null`]) and measured from the pool where the cell runs.
//! - **Streaming** (LongLive-shaped): chunks of 3 frames attend to 3 sink
//!   frames + a 9-frame window, 12 heads × 128, with a naive concatenating
//!   cache, the static ring cache, or the ring with int8 K/V; per-chunk
//!   latency (wall time, submit to done), memory per chunk.

mod mid_block;
mod stream;
mod sweep;

use super::MIB;
pub(crate) use mid_block::*;
pub(crate) use stream::*;
pub(crate) use sweep::*;

pub(super) fn fmt_ms(ms: f64) -> String {
    if ms.is_finite() {
        format!("{ms:.1}")
    } else {
        "-".into()
    }
}

pub(super) fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / MIB)
}
