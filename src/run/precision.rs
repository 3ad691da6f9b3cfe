//! The f16-overflow fallback: an f16 run whose convolutions stored values
//! beyond ±65504 (or NaN) produced a wrong result; bf16 has f32's range, so
//! the run is done again with a bf16 copy of the model.

use crate::error::Result;

/// Runs `redo` (the same run with the model's bf16 twin) after `overflows`
/// values overflowed in `model`; returns its result and the note saying so
/// (`done`: "re-decoded", "re-encoded"), also logged as a warning.
pub(crate) fn redo_in_bf16<T>(
    overflows: u64,
    model: &str,
    done: &str,
    redo: impl FnOnce() -> Result<T>,
) -> Result<(T, String)> {
    let note = format!(
        "f16 overflow: {overflows} values beyond ±65504 (or NaN) in {model}; {done} in bf16"
    );
    log::warn!("{note}");
    Ok((redo()?, note))
}
