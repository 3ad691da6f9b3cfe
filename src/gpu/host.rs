//! Host copies of device data (parked tiles, gathered outputs). On a null
//! device nothing ran, so only their length is kept: a dry run walks the
//! same code and counts the same bytes without holding any.

use super::{read_back, Context};
use crate::error::Result;
use crate::gpu::tensor::Tensor;

/// Bytes in host memory, or just their length on a null device.
pub struct HostBytes {
    len: u64,
    data: Option<Vec<u8>>,
}

impl HostBytes {
    /// Length in bytes (also on a null device).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The bytes; `None` on a null device.
    pub fn data(&self) -> Option<&[u8]> {
        self.data.as_deref()
    }

    /// The bytes; `None` on a null device.
    pub(crate) fn into_data(self) -> Option<Vec<u8>> {
        self.data
    }

    /// Runs `copy(from, to)` with `src`'s bytes and these (a no-op on a null device).
    pub(crate) fn copy_from(&mut self, src: &HostBytes, copy: impl FnOnce(&[u8], &mut [u8])) {
        if let (Some(from), Some(to)) = (src.data.as_deref(), self.data.as_deref_mut()) {
            copy(from, to);
        }
    }
}

impl Context {
    /// `len` zero bytes in host memory.
    pub(crate) fn host_zeros(&self, len: u64) -> HostBytes {
        HostBytes {
            len,
            data: (!self.is_null()).then(|| vec![0; len as usize]),
        }
    }

    /// A host copy of `bytes`.
    pub(crate) fn host_copy_of(&self, bytes: &[u8]) -> HostBytes {
        HostBytes {
            len: bytes.len() as u64,
            data: (!self.is_null()).then(|| bytes.to_vec()),
        }
    }
}

/// [`read_back`] into [`HostBytes`] (one submit, one wait; nothing on a null device).
pub fn read_back_host(ctx: &Context, tensors: &[&Tensor]) -> Result<Vec<HostBytes>> {
    if ctx.is_null() {
        return Ok(tensors
            .iter()
            .map(|t| HostBytes {
                len: t.byte_size(),
                data: None,
            })
            .collect());
    }
    Ok(read_back(ctx, tensors)?
        .into_iter()
        .map(|d| HostBytes {
            len: d.len() as u64,
            data: Some(d),
        })
        .collect())
}

/// `MemAvailable` of /proc/meminfo in bytes (`None` where unreadable): the
/// host memory a run may still fill.
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
