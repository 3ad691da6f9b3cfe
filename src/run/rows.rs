//! Runs made on a few full-width rows of their tiles: an image or video of
//! more tiles than a plan walks one by one is planned (or estimated) on
//! three samples of a few rows, whose peaks are the whole run's and whose
//! counts extrapolate to every row.

use crate::error::{Error, Result};

/// Rows of tiles that stand for any number of them: the first, interior
/// ones (with interior rows on both sides), the last but one and the last.
const MIN_ROWS: usize = 4;

/// Latent rows of the first `rows` rows of tiles of side `t` of a latent
/// `h` rows high, its last row as high as the whole latent's last row.
pub(crate) fn rows_latent(h: usize, t: usize, rows: usize) -> usize {
    h.saturating_sub(h.div_ceil(t).saturating_sub(rows) * t)
}

/// What [`sample_rows`] found.
pub(crate) enum Sampled<S> {
    /// Too few rows to sample, or samples that did not peak alike: run
    /// every tile.
    Every,
    /// A sample did not fit (its walk returned `None`).
    Over,
    /// Samples of `rows`, `rows + q` and `rows + 2q` rows of tiles, which
    /// stand for the whole run: its counts are theirs extrapolated to `x`
    /// ([`crate::exec::report::Counts::quadratic`]).
    Rows {
        samples: [S; 3],
        rows: usize,
        x: u64,
    },
}

/// A run over `rows × cols` tiles made on a few full rows of them:
/// `walk(n)` runs the first `n` rows (`None`: over the budget). Runs of
/// `r`, `r + q` and `r + 2q` rows (`q = pass_rows` of a first sample, the
/// rows of an attention pass, at least 1; `r` ≥ [`MIN_ROWS`], one pass
/// more than `q`, enough tiles to fill a GroupNorm scratch, and ≡ the rows
/// mod `q`) must have the same `peak`, which is then the whole run's; the
/// counts grow at most quadratically in the rows.
pub(crate) fn sample_rows<S: Clone, P: PartialEq + std::fmt::Debug>(
    (rows, cols): (usize, usize),
    mut walk: impl FnMut(usize) -> Result<Option<S>>,
    pass_rows: impl Fn(&S) -> usize,
    peak: impl Fn(&S) -> P,
) -> Result<Sampled<S>> {
    // Enough tiles to fill a GroupNorm scratch (which then folds).
    let first = MIN_ROWS.max(crate::exec::FOLD_TILES / cols.max(1) + 1);
    if first + 2 >= rows {
        return Ok(Sampled::Every);
    }
    let Some(sample) = walk(first)? else {
        return Ok(Sampled::Over);
    };
    let m = pass_rows(&sample);
    let q = m.max(1);
    let low = first.max(m.saturating_add(2));
    if low.saturating_add(3 * q) >= rows {
        return Ok(Sampled::Every);
    }
    let r = low + (rows - low) % q;
    if r + 2 * q >= rows {
        return Ok(Sampled::Every);
    }
    let mut samples = Vec::with_capacity(3);
    for rr in [r, r + q, r + 2 * q] {
        let s = match rr == first {
            true => sample.clone(),
            false => match walk(rr)? {
                Some(s) => s,
                None => return Ok(Sampled::Over),
            },
        };
        samples.push(s);
    }
    let peaks: Vec<P> = samples.iter().map(&peak).collect();
    if peaks.iter().any(|p| *p != peaks[0]) {
        log::warn!(
            "a plan on {r}, {} and {} of {rows} rows of tiles peaked at {peaks:?}: planning every tile",
            r + q,
            r + 2 * q,
        );
        return Ok(Sampled::Every);
    }
    match <[S; 3]>::try_from(samples) {
        Ok(samples) => Ok(Sampled::Rows {
            samples,
            rows: r,
            x: ((rows - r) / q) as u64,
        }),
        Err(_) => Err(Error::Internal("three row samples expected".into())),
    }
}
