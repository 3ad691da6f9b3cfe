//! Executors: what runs a model's graph ([`crate::models::graph`]).
//!
//! - [`untiled`]: the whole graph recorded into one [`crate::gpu::Recorder`]
//!   (also what fast tiles run per tile);
//! - [`exact`]: layer-synchronous tiles with global GroupNorm statistics;
//! - [`video_ops`]: the video ops both run whole (LTX-2's non-causal time
//!   convs, HunyuanVideo 1.5's block-causal attention);
//! - [`token_ops`]: a transformer decoder's token ops and the cross-fade of
//!   a clip-chunked video decode (untiled only).

pub(crate) mod exact;
pub(crate) use exact::{ByRows, FOLD_TILES};
pub mod report;
pub(crate) mod token_ops;
pub(crate) mod untiled;
pub(crate) mod video_ops;

// The dry-run switches live with the null device they steer.
pub(crate) use crate::gpu::{full_dry_runs, full_plan};
