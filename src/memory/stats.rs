use serde::Serialize;

/// A statistic with its current value and its peak since the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// Value now.
    pub current: u64,
    /// Largest value since the last reset.
    pub peak: u64,
}

impl Stat {
    /// Adds `n`, raising the peak if needed.
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
    }
    /// Subtracts `n`.
    pub fn sub(&mut self, n: u64) {
        debug_assert!(self.current >= n, "memory stat underflow");
        self.current = self.current.saturating_sub(n);
    }
    /// Sets the peak to the current value.
    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Pool statistics, named after `torch.cuda.memory_stats` where a counterpart exists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStats {
    /// Bytes in blocks held by live tensors (after the policy's rounding).
    pub allocated_bytes: Stat,
    /// Bytes of device buffers the pool holds.
    pub reserved_bytes: Stat,
    /// Bytes in active blocks (equal to allocated for our policies).
    pub active_bytes: Stat,
    /// Free bytes inside segments that also hold live blocks (fragmentation).
    pub inactive_split_bytes: Stat,
    /// Bytes the callers asked for, before rounding.
    pub requested_bytes: Stat,
    /// Number of allocation requests served.
    pub num_allocs: u64,
    /// Number of live blocks.
    pub allocation: Stat,
    /// Number of device buffers (segments) held.
    pub segment: Stat,
    /// Device buffers created.
    pub num_device_alloc: u64,
    /// Device buffers destroyed.
    pub num_device_free: u64,
    /// Allocations retried after freeing the cache.
    pub num_alloc_retries: u64,
    /// Allocations that failed for lack of memory.
    pub num_ooms: u64,
}

/// Bookkeeping shared by the pools.
impl MemoryStats {
    /// A block of `size` bytes (`requested` asked for) handed out; `new_segment`:
    /// the bytes of a device buffer created for it.
    pub(crate) fn on_alloc(&mut self, size: u64, requested: u64, new_segment: Option<u64>) {
        self.num_allocs += 1;
        self.allocated_bytes.add(size);
        self.active_bytes.add(size);
        self.requested_bytes.add(requested);
        self.allocation.add(1);
        if let Some(seg) = new_segment {
            self.on_segment_created(seg);
        }
    }

    /// A device buffer of `size` bytes created.
    pub(crate) fn on_segment_created(&mut self, size: u64) {
        self.reserved_bytes.add(size);
        self.segment.add(1);
        self.num_device_alloc += 1;
    }

    /// A block of `size` bytes (`requested` asked for) given back.
    pub(crate) fn on_release(&mut self, size: u64, requested: u64) {
        self.allocated_bytes.sub(size);
        self.active_bytes.sub(size);
        self.requested_bytes.sub(requested);
        self.allocation.sub(1);
    }

    /// A device buffer of `size` bytes destroyed.
    pub(crate) fn on_segment_freed(&mut self, size: u64) {
        self.reserved_bytes.sub(size);
        self.segment.sub(1);
        self.num_device_free += 1;
    }

    /// Peaks back to the current values.
    pub(crate) fn reset_peaks(&mut self) {
        for x in [
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.allocation,
            &mut self.segment,
        ] {
            x.reset_peak();
        }
    }
}
