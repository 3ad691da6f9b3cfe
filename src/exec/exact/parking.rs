//! Parked activations: tiles kept on the device within the plan's cap, or
//! read back to host memory; windows gathered (and uploaded) from them.

use std::sync::{Arc, Mutex, MutexGuard};

use super::grid::Grid;
use super::Executor;
use crate::error::{Error, Result};
use crate::gpu::{read_back_host, HostBytes};
use crate::kernels::tensor_ops::{copy_window, Window};
use crate::tensor::{DType, Tensor};

#[derive(Default)]
pub(super) struct Counters {
    pub(super) device: u64,
    pub(super) device_peak: u64,
    pub(super) host: u64,
    pub(super) host_peak: u64,
}

/// Counters shared by an executor and its parked pieces. A mutex, not a
/// `RefCell`, so an executor (kept by a streaming `VideoDecoder` between
/// chunks) can move to another thread.
#[derive(Clone, Default)]
pub(super) struct Shared(Arc<Mutex<Counters>>);

impl Shared {
    /// The counters; a panic elsewhere cannot leave them half-updated (plain
    /// integer updates), so a poisoned lock is taken as is.
    pub(super) fn borrow_mut(&self) -> MutexGuard<'_, Counters> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn borrow(&self) -> MutexGuard<'_, Counters> {
        self.borrow_mut()
    }
}

/// A tile kept on the device; its bytes count against the parking cap.
pub(super) struct DevicePiece {
    tensor: Option<Tensor>,
    counters: Shared,
}

impl DevicePiece {
    pub(super) fn new(t: Tensor, counters: &Shared) -> Self {
        {
            let mut c = counters.borrow_mut();
            c.device += t.byte_size();
            c.device_peak = c.device_peak.max(c.device);
        }
        DevicePiece {
            tensor: Some(t),
            counters: counters.clone(),
        }
    }
    pub(super) fn tensor(&self) -> &Tensor {
        self.tensor.as_ref().expect("present until dropped")
    }
    pub(super) fn into_tensor(mut self) -> Tensor {
        let t = self.tensor.take().expect("present until dropped");
        self.counters.borrow_mut().device -= t.byte_size();
        t
    }
}

impl Drop for DevicePiece {
    fn drop(&mut self) {
        if let Some(t) = &self.tensor {
            self.counters.borrow_mut().device -= t.byte_size();
        }
    }
}

/// A tile in host memory, counted as parked unless it is the caller's input.
pub(super) struct HostPiece {
    data: HostBytes,
    counters: Option<Shared>,
}

impl HostPiece {
    pub(super) fn new(data: HostBytes, counters: Option<&Shared>) -> Self {
        let bytes = data.len();
        if let Some(counters) = counters {
            let mut c = counters.borrow_mut();
            c.host += bytes;
            c.host_peak = c.host_peak.max(c.host);
        }
        HostPiece {
            data,
            counters: counters.cloned(),
        }
    }
}

impl Drop for HostPiece {
    fn drop(&mut self) {
        if let Some(c) = &self.counters {
            c.borrow_mut().host -= self.data.len();
        }
    }
}

pub(super) enum Piece {
    Empty,
    Device(DevicePiece),
    Host(HostPiece),
}

/// An activation `[N, C, H, W]` (4-byte elements) parked tile by tile.
pub(crate) struct Act {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub(super) dtype: DType,
    pub(super) grid: Grid,
    pub(super) pieces: Vec<Piece>,
}

impl Act {
    /// Whether tile `i` is parked in host memory.
    pub(super) fn on_host(&self, i: usize) -> bool {
        matches!(self.pieces[i], Piece::Host(_))
    }
    /// Storage dtype of the parked tiles (and of [`Executor::gather_host`]'s bytes).
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }
    pub(super) fn shape_of(&self, win: &Window) -> [usize; 4] {
        [self.n, self.c, win.h, win.w]
    }
    pub(super) fn bytes_of(&self, win: &Window) -> u64 {
        Tensor::bytes_for(&self.shape_of(win), self.dtype)
    }
    /// Bytes of its tiles parked on the device and in host memory.
    pub(super) fn parked_bytes(&self) -> (u64, u64) {
        self.pieces.iter().fold((0, 0), |(d, h), p| match p {
            Piece::Device(t) => (d + t.tensor().byte_size(), h),
            Piece::Host(t) => (d, h + t.data.len()),
            Piece::Empty => (d, h),
        })
    }
}

/// Row-copies the overlap `o` (image coordinates) from a host block laid
/// out `[planes, src.h, src.w]` at `src` into `[planes, dst.h, dst.w]` at `dst`;
/// elements of `e` bytes.
#[allow(clippy::too_many_arguments)]
pub(super) fn host_copy(
    planes: usize,
    e: usize,
    from: &[u8],
    src: &Window,
    to: &mut [u8],
    dst: &Window,
    o: &Window,
) {
    for p in 0..planes {
        for y in o.y..o.bottom() {
            let s = ((p * src.h + y - src.y) * src.w + o.x - src.x) * e;
            let d = ((p * dst.h + y - dst.y) * dst.w + o.x - dst.x) * e;
            to[d..d + o.w * e].copy_from_slice(&from[s..s + o.w * e]);
        }
    }
}

/// `bytes` in GiB, or MiB below one.
fn gib(bytes: u64) -> String {
    match bytes as f64 / 1073741824.0 {
        g if g >= 1.0 => format!("{g:.1} GiB"),
        g => format!("{:.1} MiB", g * 1024.0),
    }
}

impl Executor {
    /// Parks tile `i` of `act`: on the device while the cap allows, else in
    /// host memory (read back now, so no device bytes wait for a transfer).
    pub(super) fn park(&mut self, act: &mut Act, i: usize, t: Tensor) -> Result<()> {
        debug_assert_eq!(t.shape(), act.shape_of(&act.grid.rect(i)));
        let bytes = t.byte_size();
        let device = self.counters.borrow().device;
        act.pieces[i] = if device + bytes <= self.plan.device_cap {
            Piece::Device(DevicePiece::new(t, &self.counters))
        } else {
            let parked = self.counters.borrow().host;
            if let Some(limit) = self.host_limit.filter(|&l| parked + bytes > l) {
                let (whose, raise) = match self.plan.max_host {
                    Some(_) => (
                        "`Tiling::max_host_memory`",
                        ", raise `Tiling::max_host_memory`",
                    ),
                    None => ("MemAvailable in /proc/meminfo when the run started", ""),
                };
                let device = match self.plan.device_cap {
                    0 => "",
                    _ => ", or a larger `Tiling::max_memory` (more tiles parked on the device)",
                };
                return Err(Error::OverBudget(format!(
                    "exact tiles already park {} in host memory and the next tile would pass the {} this run may use ({whose}): use smaller frames or images or fewer latent frames per chunk (video){raise}{device}",
                    gib(parked),
                    gib(limit),
                )));
            }
            self.submit()?;
            let waiting = std::time::Instant::now();
            let data = read_back_host(&self.ctx, &[&t])?.pop().ok_or_else(|| {
                Error::Internal("read-back of a parked tile returned nothing".into())
            })?;
            self.stats.wait_ms += waiting.elapsed().as_secs_f64() * 1e3;
            // The read-back waited for the device: upload staging is free.
            self.staging = 0;
            self.staging_peak = self.staging_peak.max(readback_staging(&[bytes]));
            self.report.syncs += 1;
            self.report.readback_bytes += bytes;
            Piece::Host(HostPiece::new(data, Some(&self.counters)))
        };
        Ok(())
    }

    /// Uploads host bytes of `shape` into a new tensor.
    /// Staging in flight stays within the plan's `staging_limit`: the
    /// executor waits for the device first when it would not, and a
    /// tensor larger than the limit goes in pieces with waits between.
    pub(super) fn upload(
        &mut self,
        shape: &[usize],
        dtype: DType,
        data: Option<&HostBytes>,
    ) -> Result<Tensor> {
        let t = Tensor::empty(&self.ctx, shape, dtype, "tile upload")?;
        let data = data.and_then(HostBytes::data);
        self.stage_upload(t.byte_size(), data.map(|d| (&t, d)))?;
        Ok(t)
    }

    /// Stages `bytes` of upload, copying `data` into `dst` when given (a
    /// null device has no data): counts the staging, waits and bytes.
    pub(super) fn stage_upload(&mut self, bytes: u64, dst: Option<(&Tensor, &[u8])>) -> Result<()> {
        let piece = (self.plan.staging_limit / 4 * 4).max(4);
        let mut at = 0u64;
        while at < bytes {
            let len = piece.min(bytes - at);
            if self.staging > 0 && self.staging + len > self.plan.staging_limit {
                self.sync()?;
            }
            if let Some((t, d)) = dst {
                let end = ((at + len) as usize).min(d.len());
                self.rec().upload_at(t, at, &d[at as usize..end])?;
            }
            self.staging += len;
            self.staging_peak = self.staging_peak.max(self.staging);
            at += len;
        }
        self.report.uploaded_bytes += bytes;
        Ok(())
    }

    /// The window `win` of `act` as a tensor `[N, C, win.h, win.w]`: the
    /// parked tile itself when `win` is exactly a device tile (do not
    /// modify it), else gathered from the tiles it overlaps.
    pub(crate) fn read_window(&mut self, act: &Act, win: Window) -> Result<Tensor> {
        let parts = act.grid.overlapping(&win);
        if let [i] = parts[..] {
            if act.grid.rect(i) == win {
                match &act.pieces[i] {
                    Piece::Device(d) => return Ok(d.tensor().clone()),
                    Piece::Host(h) => {
                        return self.upload(&act.shape_of(&win), act.dtype, Some(&h.data));
                    }
                    Piece::Empty => {}
                }
            }
        }
        let shape = act.shape_of(&win);
        let planes = act.n * act.c;
        let any_host = parts
            .iter()
            .any(|&i| matches!(act.pieces[i], Piece::Host(_)));
        let out = if any_host {
            let mut bytes = self.ctx.host_zeros(act.bytes_of(&win));
            let e = act.dtype.size() as usize;
            for &i in &parts {
                if let Piece::Host(h) = &act.pieces[i] {
                    let r = act.grid.rect(i);
                    let o = r.intersect(&win).expect("overlapping tile");
                    bytes.copy_from(&h.data, |src, buf| {
                        host_copy(planes, e, src, &r, buf, &win, &o)
                    });
                }
            }
            self.upload(&shape, act.dtype, Some(&bytes))?
        } else {
            Tensor::empty(&self.ctx, &shape, act.dtype, "tile window")?
        };
        for &i in &parts {
            let r = act.grid.rect(i);
            let o = r.intersect(&win).expect("overlapping tile");
            match &act.pieces[i] {
                Piece::Device(d) => {
                    let src = d.tensor().clone();
                    copy_window(
                        self.rec(),
                        &src,
                        (o.y - r.y, o.x - r.x),
                        &out,
                        (o.y - win.y, o.x - win.x),
                        (o.h, o.w),
                    )?;
                    self.report.window_copies += 1;
                }
                Piece::Host(_) => {}
                Piece::Empty => {
                    return Err(Error::Internal(format!(
                        "tiled decode read tile {i} of an activation before it was computed"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Moves tile `i` out of `act` as a device tensor (for in-place use).
    pub(super) fn take_piece(&mut self, act: &mut Act, i: usize) -> Result<Tensor> {
        let win = act.grid.rect(i);
        match std::mem::replace(&mut act.pieces[i], Piece::Empty) {
            Piece::Device(d) => Ok(d.into_tensor()),
            Piece::Host(h) => self.upload(&act.shape_of(&win), act.dtype, Some(&h.data)),
            Piece::Empty => Err(Error::Internal(format!("tiled decode took tile {i} twice"))),
        }
    }

    /// Gathers an activation in host memory: one read-back of its device
    /// tiles, host tiles copied.
    pub(crate) fn gather_host(&mut self, act: Act) -> Result<HostBytes> {
        self.submit()?;
        let whole = Window::new(0, 0, act.h, act.w);
        let device: Vec<usize> = (0..act.pieces.len())
            .filter(|&i| matches!(act.pieces[i], Piece::Device(_)))
            .collect();
        let bytes: u64 = device
            .iter()
            .map(|&i| act.bytes_of(&act.grid.rect(i)))
            .sum();
        self.report.readback_bytes += bytes;
        if !device.is_empty() {
            self.report.syncs += 1;
        }
        // Staging of the largest read-back group (as grouped below).
        let mut group: Vec<u64> = Vec::new();
        for &i in &device {
            let b = act.bytes_of(&act.grid.rect(i));
            group.push(b);
            if group.len() > 1 && readback_staging(&group) > self.plan.staging_limit {
                group = vec![b];
            }
            self.staging_peak = self.staging_peak.max(readback_staging(&group));
        }
        let tensors: Vec<&Tensor> = device
            .iter()
            .map(|&i| match &act.pieces[i] {
                Piece::Device(d) => d.tensor(),
                _ => unreachable!("filtered"),
            })
            .collect();
        // Read back in groups of tiles within the staging limit (a tile
        // over the limit alone), not the whole output at once.
        let mut data = Vec::with_capacity(tensors.len());
        let mut group: Vec<&Tensor> = Vec::new();
        for t in tensors {
            let sizes: Vec<u64> = group.iter().chain([&t]).map(|t| t.byte_size()).collect();
            if !group.is_empty() && readback_staging(&sizes) > self.plan.staging_limit {
                data.extend(read_back_host(&self.ctx, &group)?);
                group.clear();
            }
            group.push(t);
        }
        if !group.is_empty() {
            data.extend(read_back_host(&self.ctx, &group)?);
        }
        let mut out = self.ctx.host_zeros(act.bytes_of(&whole));
        let planes = act.n * act.c;
        let esize = act.dtype.size() as usize;
        let mut next = data.into_iter();
        for (i, piece) in act.pieces.iter().enumerate() {
            let r = act.grid.rect(i);
            match piece {
                Piece::Device(_) => {
                    let d = next.next().expect("one read-back per device tile");
                    out.copy_from(&d, |d, out| {
                        host_copy(planes, esize, d, &r, out, &whole, &r)
                    });
                }
                Piece::Host(h) => {
                    out.copy_from(&h.data, |d, out| {
                        host_copy(planes, esize, d, &r, out, &whole, &r)
                    });
                }
                Piece::Empty => {
                    return Err(Error::Internal(
                        "tiled decode output has an uncomputed tile".into(),
                    ))
                }
            }
        }
        Ok(out)
    }
}

/// Bytes of the staging buffer [`read_back_host`] creates for tensors of `sizes`.
pub(super) fn readback_staging(sizes: &[u64]) -> u64 {
    sizes.iter().map(|&b| crate::memory::round_up(b, 256)).sum()
}
