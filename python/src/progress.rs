//! `progress=`: a Python callable `(done, total, stage) -> Optional[bool]`
//! the library calls between tiles, and the cancel flag it drives.
//!
//! The device work runs with the GIL released; each call re-acquires it.
//! Returning `False`, raising, or a pending signal (Ctrl-C, seen through
//! `check_signals`) sets the flag of `Context::with_cancel`, so the run stops
//! at its next tile; [`Watch::finish`] then raises the callable's exception,
//! `KeyboardInterrupt` or `wgvae.Cancelled`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;

use wgvae::gpu::Context;
use wgvae::tiling::{Progress, ProgressUpdate};

pyo3::create_exception!(
    _wgvae,
    Cancelled,
    PyRuntimeError,
    "A run stopped because its progress callback returned False."
);

/// One run's callback, cancel flag and the exception that stopped it.
pub(crate) struct Watch {
    callback: Option<Arc<Py<PyAny>>>,
    flag: Arc<AtomicBool>,
    error: Arc<Mutex<Option<PyErr>>>,
}

impl Watch {
    /// `None` (or Python's None): no callback, nothing watched.
    pub(crate) fn new(callback: Option<Bound<'_, PyAny>>) -> PyResult<Self> {
        let callback = match callback {
            Some(c) if !c.is_none() => {
                if !c.is_callable() {
                    return Err(PyTypeError::new_err(format!(
                        "progress: expected a callable (done, total, stage) -> Optional[bool], got {}",
                        c.get_type().name()?
                    )));
                }
                Some(Arc::new(c.unbind()))
            }
            _ => None,
        };
        Ok(Watch {
            callback,
            flag: Arc::default(),
            error: Arc::default(),
        })
    }

    /// `ctx` sharing its device, stopping at the next tile once the
    /// callback asks (the same context when there is no callback).
    pub(crate) fn context(&self, ctx: &Context) -> Context {
        match self.callback {
            Some(_) => ctx.with_cancel(Arc::clone(&self.flag)),
            None => ctx.clone(),
        }
    }

    /// The library's progress callback calling the Python one.
    pub(crate) fn progress(&self) -> Option<Progress> {
        let callback = Arc::clone(self.callback.as_ref()?);
        let (flag, error) = (Arc::clone(&self.flag), Arc::clone(&self.error));
        Some(Progress(Arc::new(move |u: ProgressUpdate| {
            if flag.load(Ordering::SeqCst) {
                return;
            }
            Python::attach(|py| {
                let stopped = match callback.call1(py, (u.done, u.total, u.stage)) {
                    // Only False stops: None (no return) goes on.
                    Ok(v) => matches!(v.extract::<bool>(py), Ok(false)),
                    Err(e) => {
                        *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        true
                    }
                };
                let stopped = stopped
                    || match py.check_signals() {
                        Ok(()) => false,
                        Err(e) => {
                            *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                            true
                        }
                    };
                if stopped {
                    flag.store(true, Ordering::SeqCst);
                }
            });
        })))
    }

    /// The run's result, or why it was stopped: the callback's exception,
    /// `KeyboardInterrupt`, or `Cancelled` when it returned False (even if
    /// that was on the last tile and the run completed).
    pub(crate) fn finish<T>(&self, result: PyResult<T>) -> PyResult<T> {
        if !self.flag.load(Ordering::SeqCst) {
            return result;
        }
        let error = self.error.lock().unwrap_or_else(|e| e.into_inner()).take();
        Err(error
            .unwrap_or_else(|| Cancelled::new_err("stopped: the progress callback returned False")))
    }
}
