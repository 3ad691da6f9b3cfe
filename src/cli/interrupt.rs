//! SIGINT / SIGTERM. The first asks the run to stop at its next chunk,
//! frame ([`check`]) or tile ([`flag`], `Context::with_cancel`); unwinding
//! drops the staged outputs, which remove their temporary files, and `main`
//! exits 130 / 143. A second signal exits at once after killing the child
//! processes ([`child`]: ffmpeg) and removing the temporary files still
//! registered here ([`Live`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

/// The first signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Set with [`SIGNAL`]: the library's tiled runs stop at their next tile
/// (`Context::with_cancel`).
static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// The flag a signal sets, for `Context::with_cancel`.
pub(crate) fn flag() -> Arc<AtomicBool> {
    STOP.get_or_init(Arc::default).clone()
}

/// Temporary files that exist now. A process-wide list because the signal
/// thread must find them whatever the run is doing.
static LIVE: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::const_mutex(Vec::new());

/// Child processes that run now (ffmpeg writing a video): a second signal
/// kills them before exiting, so none goes on writing a removed file.
static CHILDREN: parking_lot::Mutex<Vec<std::sync::Weak<parking_lot::Mutex<std::process::Child>>>> =
    parking_lot::const_mutex(Vec::new());

/// Registers `child` (spawned in its own process group: a terminal's Ctrl-C
/// reaches wgvae alone, which stops it) for the second signal to kill; it is
/// forgotten when dropped.
pub(crate) fn child(child: std::process::Child) -> Arc<parking_lot::Mutex<std::process::Child>> {
    let child = Arc::new(parking_lot::Mutex::new(child));
    let mut children = CHILDREN.lock();
    children.retain(|c| c.strong_count() > 0);
    children.push(Arc::downgrade(&child));
    child
}

/// Kills the registered children (the signal thread, before exiting).
fn kill_children() {
    for c in CHILDREN.lock().iter().filter_map(std::sync::Weak::upgrade) {
        // Never held long (see `FfmpegWriter`): a poll, a kill, a reap.
        if let Some(mut c) = c.try_lock_for(std::time::Duration::from_millis(500)) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the thread that takes SIGINT and SIGTERM (once, at start-up).
pub(crate) fn install() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("cannot handle SIGINT/SIGTERM ({e}): an interrupted run may leave `.wgvae-*` temporary files");
                return;
            }
        };
        std::thread::spawn(move || {
            for sig in signals.forever() {
                if SIGNAL
                    .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    kill_children();
                    // Holding the lock until exit: no new temporary file
                    // can appear after the sweep.
                    let mut live = LIVE.lock();
                    for p in live.drain(..) {
                        let _ = std::fs::remove_file(p);
                    }
                    std::process::exit(128 + sig);
                }
                flag().store(true, Ordering::SeqCst);
                eprintln!(
                    "wgvae: {} received: stopping after the current chunk or tile (send it again to stop now)",
                    name(sig)
                );
            }
        });
    }
}

fn name(sig: i32) -> &'static str {
    #[cfg(unix)]
    if sig == signal_hook::consts::SIGTERM {
        return "SIGTERM";
    }
    let _ = sig;
    "SIGINT"
}

/// An error when a signal asked the run to stop (call between chunks).
pub(crate) fn check() -> wgvae::Result<()> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => Ok(()),
        sig => Err(wgvae::Error::InvalidInput(format!(
            "interrupted by {}",
            name(sig)
        ))),
    }
}

/// The conventional exit code (128 + signal) and the signal's name, once a
/// signal arrived.
pub(crate) fn exit_code() -> Option<(u8, &'static str)> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        sig => Some((u8::try_from(128 + sig).unwrap_or(130), name(sig))),
    }
}

/// The registry of temporary files, locked: create a file and [`Live::add`]
/// it under one lock so the signal thread sees every file that exists.
pub(crate) struct Live(parking_lot::MutexGuard<'static, Vec<PathBuf>>);

impl Live {
    pub(crate) fn lock() -> Live {
        Live(LIVE.lock())
    }

    pub(crate) fn add(&mut self, path: &Path) {
        self.0.push(path.to_path_buf());
    }
}

/// Forgets `path` (renamed into place or removed).
pub(crate) fn forget(path: &Path) {
    LIVE.lock().retain(|p| p != path);
}
