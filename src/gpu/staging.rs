//! Double-buffered read-back: a staging range mapped after its chunk's
//! submission, waited for one chunk later (`decode_frames`, the video
//! decoder), so the next chunk runs on the device meanwhile.

use std::sync::mpsc;

use super::Context;
use crate::error::{Error, Result};

/// A staging buffer range on its way to being mapped for reading once the
/// submission that copies into it is done.
pub(crate) struct MapAfter {
    submission: wgpu::SubmissionIndex,
    mapped: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl MapAfter {
    /// Asks to map `slice` (of a `MAP_READ` buffer) for reading after
    /// `submission`, which copies into it.
    pub(crate) fn new(slice: wgpu::BufferSlice<'_>, submission: wgpu::SubmissionIndex) -> Self {
        let (tx, mapped) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        MapAfter { submission, mapped }
    }

    /// Waits for the submission (not for later ones) and the map: the
    /// range is then readable (`get_mapped_range`; unmap it after).
    pub(crate) fn wait(self, ctx: &Context) -> Result<()> {
        ctx.device()
            .poll(wgpu::PollType::Wait {
                submission_index: Some(self.submission),
                timeout: None,
            })
            .map_err(|e| Error::DeviceLost(e.to_string()))?;
        // The wait ran the map callback of this submission; fall back to a
        // full wait should a backend defer it.
        let mapped = match self.mapped.try_recv() {
            Ok(r) => r,
            Err(_) => {
                ctx.wait_idle()?;
                self.mapped
                    .recv()
                    .map_err(|e| Error::Readback(e.to_string()))?
            }
        };
        mapped.map_err(|e| Error::Readback(e.to_string()))
    }
}
