//! Progress on a terminal: image decodes and encodes, video frames.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use wgvae::gpu::PipelineCache;
use wgvae::tiling::Progress;

/// What an image decode or encode is doing, on a terminal (nothing
/// otherwise): a spinner with the elapsed time and the GPU pipelines compiled
/// so far — a first run compiles each kernel variant at its first dispatch,
/// seconds each on a CPU adapter, and an untiled decode is one recorded
/// forward with nothing else to count — turning into a bar when the run is
/// tiled. Exact tiling counts tile steps (one layer on one tile, so far more
/// than the tiles); fast tiling counts tiles. Cleared when dropped.
pub(crate) struct Activity {
    state: Arc<State>,
    poll: Option<std::thread::JoinHandle<()>>,
}

struct State {
    bar: ProgressBar,
    what: &'static str,
    pipelines: PipelineCache,
    /// Pipelines ready when the run started (loaded from an earlier run's cache included).
    before: usize,
    /// Tile steps done / in total (0: untiled so far).
    done: AtomicUsize,
    total: AtomicUsize,
    stop: AtomicBool,
}

impl State {
    fn compiled(&self) -> usize {
        self.pipelines.len().saturating_sub(self.before)
    }

    /// The message for now (also called by the poll thread).
    fn refresh(&self) {
        let compiled = match self.compiled() {
            0 => String::new(),
            1 => " · 1 pipeline compiled".into(),
            n => format!(" · {n} pipelines compiled"),
        };
        let total = self.total.load(Ordering::Relaxed);
        if total == 0 {
            self.bar.set_message(format!("{}{compiled}", self.what));
        } else {
            self.bar.set_length(total as u64);
            self.bar
                .set_position(self.done.load(Ordering::Relaxed) as u64);
            self.bar
                .set_message(compiled.trim_start_matches(" · ").to_string());
        }
    }
}

impl Activity {
    /// `what` runs on `pipelines`' device; shown when not `quiet` and stderr is a terminal.
    pub(crate) fn start(quiet: bool, what: &'static str, pipelines: &PipelineCache) -> Self {
        use std::io::IsTerminal;
        let shown = !quiet && std::io::stderr().is_terminal();
        let bar = if shown {
            ProgressBar::new_spinner()
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        let state = Arc::new(State {
            bar,
            what,
            pipelines: pipelines.clone(),
            before: pipelines.len(),
            done: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        state.refresh();
        let poll = shown.then(|| {
            state.bar.enable_steady_tick(Duration::from_millis(120));
            let state = state.clone();
            std::thread::spawn(move || {
                while !state.stop.load(Ordering::Relaxed) {
                    state.refresh();
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        });
        Activity { state, poll }
    }

    /// The callback a tiled run reports its tile steps to.
    pub(crate) fn progress(&self) -> Progress {
        let state = self.state.clone();
        Progress(Arc::new(move |u| {
            if state.total.swap(u.total, Ordering::Relaxed) == 0 {
                let prefix = if u.stage == "fast tile" {
                    "tiles"
                } else {
                    "tile steps (layer × tile)"
                };
                state.bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} {prefix} {bar:40} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                state.bar.set_prefix(format!("{} {prefix}", state.what));
            }
            state.done.store(u.done, Ordering::Relaxed);
            state.refresh();
        }))
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(poll) = self.poll.take() {
            let _ = poll.join();
        }
        self.state.bar.finish_and_clear();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An untiled decode counts the pipelines it compiles; a tiled one turns
    /// the spinner into a bar of its tile steps.
    #[test]
    fn activity_counts_compiles_and_tile_steps() {
        let Some(shared) = wgvae::testing::shared_dir() else {
            return;
        };
        // A context of its own: its pipelines are all compiled by this test.
        let ctx = wgvae::gpu::Context::new(&Default::default()).unwrap();
        let dir = shared.join("golden/aekl-tiny-sd");
        let vae = wgvae::Vae::load(&ctx, dir.to_str().unwrap(), &Default::default()).unwrap();
        let z = wgvae::io::HostTensor::new(vec![1, 4, 5, 7], vec![0.25; 140]).unwrap();
        let activity = Activity::start(true, "decoding", ctx.pipelines());
        assert_eq!(activity.state.bar.message(), "decoding");
        let opts = wgvae::DecodeOptions {
            raw_latents: true,
            progress: Some(activity.progress()),
            ..Default::default()
        };
        wgvae::decode(&ctx, &vae, &z, &opts).unwrap();
        activity.state.refresh();
        let compiled = activity.state.compiled();
        assert!(
            compiled > 0 && compiled == ctx.pipelines().len(),
            "{compiled}"
        );
        let msg = activity.state.bar.message();
        assert!(
            msg.starts_with("decoding · ") && msg.ends_with("pipelines compiled"),
            "{msg}"
        );
        assert_eq!(activity.state.bar.length(), None, "untiled: a spinner");

        let tiled = wgvae::DecodeOptions {
            tiling: wgvae::tiling::Tiling {
                mode: wgvae::tiling::TileMode::Exact,
                tile_size: Some(16),
                ..Default::default()
            },
            ..opts
        };
        let again = Activity::start(true, "decoding", ctx.pipelines());
        let tiled = wgvae::DecodeOptions {
            progress: Some(again.progress()),
            ..tiled
        };
        wgvae::decode(&ctx, &vae, &z, &tiled).unwrap();
        let total = again.state.total.load(Ordering::Relaxed);
        assert!(total > 1, "{total}");
        assert_eq!(again.state.bar.length(), Some(total as u64));
        assert_eq!(again.state.bar.position(), total as u64);
    }
}
