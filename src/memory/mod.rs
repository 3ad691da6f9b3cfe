//! The memory pool every tensor buffer comes from, and its statistics.
//!
//! A [`MemoryPool`] hands out [`Block`]s: an aligned byte range inside a
//! `wgpu::Buffer` it owns. It knows at every moment how many bytes are
//! *allocated* (held by live tensors) and how many are *reserved* (device
//! buffers it holds), like PyTorch's caching allocator. Policies differ only in
//! how blocks map onto device buffers; kernels never see the difference.

mod caching;
mod exact;
mod limit;
#[doc(hidden)]
pub mod planned;
mod snapshot;
mod stats;

pub use caching::CachingPool;
pub use exact::ExactPool;
pub(crate) use limit::LimitedPool;
pub use planned::PlannedPool;
#[doc(hidden)]
pub use planned::{plan_greedy, AllocationTrace, MemoryPlan, TracingPool};
pub use snapshot::{BlockSnapshot, PoolSnapshot, SegmentPool, SegmentSnapshot};
pub use stats::{MemoryStats, Stat};

use crate::error::{Error, Result};

/// Usage flags of every pool buffer: bound as storage, copied to and from.
pub(crate) const POOL_BUFFER_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Where a pool's device buffers come from: a real device, or nowhere (a
/// dry run that replays allocations to predict memory without a GPU).
#[derive(Clone, Copy, Debug)]
pub enum Backing<'a> {
    /// Buffers from this device.
    Device(&'a wgpu::Device),
    /// No buffers (dry run).
    Virtual {
        /// Buffer sizes are checked against this limit.
        max_buffer_size: u64,
    },
}

impl Backing<'_> {
    /// The largest buffer this backing can create.
    pub fn max_buffer_size(&self) -> u64 {
        match self {
            Backing::Device(d) => d.limits().max_buffer_size,
            Backing::Virtual { max_buffer_size } => *max_buffer_size,
        }
    }

    /// A buffer of `size` bytes for `label` is within the device's limit.
    pub(crate) fn check_size(&self, size: u64, label: &str) -> Result<()> {
        let limit = self.max_buffer_size();
        if size > limit {
            return Err(Error::BufferTooLarge {
                what: label.to_string(),
                bytes: size,
                limit,
            });
        }
        Ok(())
    }

    /// Creates one pool buffer of `size` bytes (`None` when virtual). Sizes
    /// over the device limit and device out-of-memory are errors, not panics.
    pub fn create_buffer(&self, size: u64, label: &str) -> Result<Option<wgpu::Buffer>> {
        self.check_size(size, label)?;
        let Backing::Device(device) = self else {
            return Ok(None);
        };
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: POOL_BUFFER_USAGE,
            mapped_at_creation: false,
        });
        match pollster::block_on(oom.pop()) {
            Some(e) => Err(Error::from_wgpu(
                &format!("allocating {label} ({size} bytes)"),
                e,
            )),
            None => Ok(Some(buffer)),
        }
    }
}

/// A byte range handed out by a pool.
#[derive(Clone, Debug)]
pub struct Block {
    /// The device buffer (a whole segment for sub-allocating pools);
    /// `None` in dry runs.
    pub buffer: Option<wgpu::Buffer>,
    /// Byte offset in `buffer`, a multiple of the storage offset alignment.
    pub offset: u64,
    /// Bytes reserved for this block (rounded as the policy rounds).
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Pool-unique id.
    pub id: u64,
    /// Pool-unique id of the device buffer (segment) holding the block.
    pub segment: u64,
}

impl Block {
    /// A block that is a whole device buffer of its own (its own segment).
    pub(crate) fn whole(buffer: Option<wgpu::Buffer>, size: u64, requested: u64, id: u64) -> Block {
        Block {
            buffer,
            offset: 0,
            size,
            requested,
            id,
            segment: id,
        }
    }
}

/// A buffer allocator with allocated-vs-reserved accounting.
pub trait MemoryPool: Send + Sync {
    /// `exact`, `caching` or `planned`.
    fn policy_name(&self) -> &'static str;
    /// A block of at least `bytes` bytes, offset aligned to `align`.
    fn allocate(&self, backing: &Backing, bytes: u64, align: u64, label: &str) -> Result<Block>;
    /// Returns a block; called once, when the last tensor using it drops.
    fn release(&self, block: &Block);
    /// Current statistics.
    fn stats(&self) -> MemoryStats;
    /// Resets peak figures to the current ones.
    fn reset_peak_stats(&self);
    /// Returns every cached, unused device buffer to the device.
    fn empty_cache(&self);
    /// Statistics and segments at this moment (JSON via [`PoolSnapshot::to_json`]).
    /// The default lists no segments: for policies that do not track them.
    fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            policy: self.policy_name().to_string(),
            stats: self.stats(),
            segments: Vec::new(),
        }
    }
    /// For policies with extra controls (e.g. [`PlannedPool`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The allocation policies, selectable at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// One device buffer per tensor: reserved == allocated (the reference).
    Exact,
    /// PyTorch CUDACachingAllocator semantics.
    Caching,
    /// Offsets planned over tensor lifetimes: reserved ≈ peak allocated.
    Planned,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 3] = [Policy::Exact, Policy::Caching, Policy::Planned];

    /// The policy's command-line name.
    pub fn name(self) -> &'static str {
        crate::named::Named::name(self)
    }

    /// A fresh pool of this policy.
    pub fn new_pool(self) -> std::sync::Arc<dyn MemoryPool> {
        match self {
            Policy::Exact => std::sync::Arc::new(ExactPool::new()),
            Policy::Caching => std::sync::Arc::new(CachingPool::new()),
            Policy::Planned => std::sync::Arc::new(PlannedPool::new()),
        }
    }
}

crate::named::named!(Policy, "memory policy", {
    Exact => "exact",
    Caching => "caching",
    Planned => "planned",
});

/// Rounds `x` up to a multiple of `to` (a power of two or any positive number).
pub(crate) fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}
