//! Progress bars on a terminal.

use wgvae::tiling::Progress;

/// A progress bar on a terminal (nothing otherwise). Exact tiling counts
/// tile steps (one layer on one tile, so far more than the tiles); fast
/// tiling counts tiles. The label says which.
pub(crate) fn progress_bar(quiet: bool) -> Option<Progress> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {prefix} {bar:40} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(Progress(std::sync::Arc::new(move |u| {
        bar.set_prefix(if u.stage == "fast tile" {
            "tiles"
        } else {
            "tile steps (layer × tile)"
        });
        bar.set_length(u.total as u64);
        bar.set_position(u.done as u64);
        bar.set_message(u.stage);
        if u.done >= u.total {
            bar.finish_and_clear();
        }
    })))
}

/// A per-frame progress bar of `total` frames on a terminal (nothing otherwise).
pub(crate) fn frame_bar(quiet: bool, total: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} frames {bar:40} {pos}/{len} {per_sec} [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(bar)
}
