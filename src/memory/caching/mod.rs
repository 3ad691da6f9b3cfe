//! PyTorch's CUDA caching allocator, on wgpu buffers.
//!
//! Device buffers (*segments*) are kept after their tensors drop and cut into
//! blocks for later requests, so a decode that allocates the same shapes over
//! and over touches the device allocator only while it warms up. The rules
//! (sizes, pools, best fit, splitting, coalescing, retry after freeing the
//! cache) are those of `c10/cuda/CUDACachingAllocator.cpp`, so `reserved` and
//! `allocated` mean here what they mean in `torch.cuda.memory_stats()`.
//!
//! With [`Backing::Virtual`] the pool creates no buffer and otherwise behaves
//! identically: a dry run predicts the reserved memory of a real run.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    round_up, Backing, Block, BlockSnapshot, MemoryPool, MemoryStats, PoolSnapshot, SegmentPool,
    SegmentSnapshot, Stat,
};
use crate::error::{Error, Result};

/// Every block size is a multiple of this (PyTorch `kMinBlockSize`); it is
/// also the largest offset alignment the pool can honour.
pub(crate) const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served from the small pool (`kSmallSize`).
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (`kSmallBuffer`).
pub(crate) const SMALL_SEGMENT: u64 = 2 << 20;
/// Segment size of the large pool for requests under [`MIN_LARGE_ALLOC`] (`kLargeBuffer`).
pub(crate) const LARGE_SEGMENT: u64 = 20 << 20;
/// Requests from this size up get a segment of their own size (`kMinLargeAlloc`)...
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// ...rounded up to a multiple of this (`kRoundLarge`).
pub(crate) const ROUND_LARGE: u64 = 2 << 20;

/// Distinguishes pools in device-buffer labels (wgpu's allocator report and
/// validation errors name buffers by label).
static NEXT_POOL_NUMBER: AtomicU64 = AtomicU64::new(1);

/// Block size for a request: rounded up to 512 bytes, never below 512.
pub fn block_size_for(bytes: u64) -> u64 {
    round_up(bytes.max(1), MIN_BLOCK_SIZE)
}

/// The pool serving a block of `size` (already rounded by [`block_size_for`]).
pub(crate) fn pool_for(size: u64) -> SegmentPool {
    if size <= SMALL_SIZE {
        SegmentPool::Small
    } else {
        SegmentPool::Large
    }
}

/// Size of the segment created for a block of `size` when no cached block
/// fits (PyTorch `get_allocation_size`).
pub(crate) fn segment_size_for(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_SEGMENT
    } else if size < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// True when a free block of `block` bytes handed out for `size` bytes is
/// split, the remainder staying cached (PyTorch `should_split`).
pub fn should_split(pool: SegmentPool, block: u64, size: u64) -> bool {
    let remaining = block - size;
    match pool {
        SegmentPool::Small => remaining >= MIN_BLOCK_SIZE,
        _ => remaining > SMALL_SIZE,
    }
}

/// PyTorch-style caching allocator (see the module docs).
///
/// Optional `capacity`: a budget for reserved bytes. A segment that would
/// raise `reserved_bytes` above it fails like a device out-of-memory would
/// (free the cache, retry once, then [`Error::OutOfMemory`]). It emulates a
/// device's VRAM in dry runs and caps what a real run may reserve.
pub struct CachingPool {
    state: Mutex<State>,
    capacity: Option<u64>,
    pool_number: u64,
}

/// Cached free block, ordered for best fit: smallest, then segment, then offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FreeKey {
    size: u64,
    segment: u64,
    offset: u64,
}

#[derive(Clone, Copy, Debug)]
struct SegBlock {
    size: u64,
    requested: u64,
    /// `Some(block id)` while allocated.
    id: Option<u64>,
}

struct Segment {
    size: u64,
    pool: SegmentPool,
    buffer: Option<wgpu::Buffer>,
    /// Blocks by offset; they tile the segment without gaps.
    blocks: BTreeMap<u64, SegBlock>,
    /// Sum of the sizes of the allocated blocks.
    allocated: u64,
}

impl Segment {
    /// Free bytes counted as `inactive_split_bytes`: only in segments that
    /// also hold allocated blocks (an entirely free segment is one block).
    fn inactive_split(&self) -> u64 {
        if self.allocated > 0 {
            self.size - self.allocated
        } else {
            0
        }
    }
}

#[derive(Default)]
struct State {
    stats: MemoryStats,
    segments: BTreeMap<u64, Segment>,
    free_small: BTreeSet<FreeKey>,
    free_large: BTreeSet<FreeKey>,
    next_id: u64,
}

/// Moves `stat` from `before` to `after`.
fn shift(stat: &mut Stat, before: u64, after: u64) {
    if after >= before {
        stat.add(after - before);
    } else {
        stat.sub(before - after);
    }
}

impl State {
    fn free_set(&mut self, pool: SegmentPool) -> &mut BTreeSet<FreeKey> {
        match pool {
            SegmentPool::Small => &mut self.free_small,
            _ => &mut self.free_large,
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Frees every entirely free segment; returns how many and their bytes.
    fn release_cached_segments(&mut self) -> (u64, u64) {
        let idle: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.allocated == 0)
            .map(|(&id, _)| id)
            .collect();
        let mut bytes = 0;
        for id in &idle {
            let Some(seg) = self.segments.remove(id) else {
                continue; // unreachable: `idle` lists live segments
            };
            let key = FreeKey {
                size: seg.size,
                segment: *id,
                offset: 0,
            };
            let removed = self.free_set(seg.pool).remove(&key);
            debug_assert!(removed, "an idle segment is one cached free block");
            // Dropping (never destroying) the buffer: wgpu frees it once
            // submitted work using it completes.
            drop(seg.buffer);
            self.stats.on_segment_freed(seg.size);
            bytes += seg.size;
        }
        (idle.len() as u64, bytes)
    }

    /// Marks the free block `key` allocated for a request of `size` bytes
    /// (`requested` asked), splitting off the remainder when the rules say so.
    fn take_block(&mut self, key: FreeKey, size: u64, requested: u64) -> Block {
        let id = self.new_id();
        #[allow(clippy::expect_used)] // free keys are removed with their segment
        let seg = self
            .segments
            .get_mut(&key.segment)
            .expect("free key of a live segment");
        let pool = seg.pool;
        let inactive_before = seg.inactive_split();
        let mut block_size = key.size;
        let mut remainder = None;
        if should_split(pool, key.size, size) {
            block_size = size;
            let rest = FreeKey {
                size: key.size - size,
                segment: key.segment,
                offset: key.offset + size,
            };
            seg.blocks.insert(
                rest.offset,
                SegBlock {
                    size: rest.size,
                    requested: 0,
                    id: None,
                },
            );
            remainder = Some(rest);
        }
        seg.blocks.insert(
            key.offset,
            SegBlock {
                size: block_size,
                requested,
                id: Some(id),
            },
        );
        seg.allocated += block_size;
        let inactive_after = seg.inactive_split();
        let buffer = seg.buffer.clone();

        let set = self.free_set(pool);
        set.remove(&key);
        if let Some(rest) = remainder {
            set.insert(rest);
        }
        let st = &mut self.stats;
        st.on_alloc(block_size, requested, None);
        shift(
            &mut st.inactive_split_bytes,
            inactive_before,
            inactive_after,
        );
        Block {
            buffer,
            offset: key.offset,
            size: block_size,
            requested,
            id,
            segment: key.segment,
        }
    }
}

impl Default for CachingPool {
    fn default() -> Self {
        Self::new()
    }
}

impl CachingPool {
    /// A pool without a reserved-memory budget (only the device limits it).
    pub fn new() -> Self {
        CachingPool {
            state: Mutex::new(State::default()),
            capacity: None,
            pool_number: NEXT_POOL_NUMBER.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A pool whose reserved bytes never exceed `capacity` (see [`CachingPool`]).
    pub fn with_capacity(capacity: u64) -> Self {
        CachingPool {
            capacity: Some(capacity),
            ..Self::new()
        }
    }

    /// The reserved-memory budget, if any.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Every device buffer of this pool has a label starting with this,
    /// followed by `<pool>-segment-<id>`: how they appear in wgpu's
    /// allocator report and validation errors.
    pub fn buffer_label_prefix(&self) -> String {
        format!("wgvae-caching-pool-{}/", self.pool_number)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not turn every later tensor drop into one.
        self.state.lock()
    }

    /// Statistics and every segment with its blocks, taken together.
    pub fn snapshot(&self) -> PoolSnapshot {
        MemoryPool::snapshot(self)
    }

    /// Creates a segment of `size` bytes for `pool`, within the capacity.
    fn create_segment(
        &self,
        st: &mut State,
        backing: &Backing,
        size: u64,
        pool: SegmentPool,
        label: &str,
    ) -> Result<FreeKey> {
        let reserved = st.stats.reserved_bytes.current;
        if let Some(cap) = self.capacity {
            if reserved + size > cap {
                return Err(Error::OutOfMemory {
                    during: format!("allocating {label}"),
                    message: format!(
                        "a new {size}-byte {} segment would raise reserved memory from {reserved} to {} bytes, over the pool capacity of {cap} bytes",
                        pool.name(),
                        reserved + size
                    ),
                });
            }
        }
        let id = st.new_id();
        let buffer_label = format!(
            "{}{}-segment-{id} (for {label})",
            self.buffer_label_prefix(),
            pool.name()
        );
        let buffer = backing.create_buffer(size, &buffer_label)?;
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            SegBlock {
                size,
                requested: 0,
                id: None,
            },
        );
        st.segments.insert(
            id,
            Segment {
                size,
                pool,
                buffer,
                blocks,
                allocated: 0,
            },
        );
        let key = FreeKey {
            size,
            segment: id,
            offset: 0,
        };
        st.free_set(pool).insert(key);
        st.stats.on_segment_created(size);
        Ok(key)
    }
}

impl MemoryPool for CachingPool {
    fn policy_name(&self) -> &'static str {
        "caching"
    }

    fn allocate(&self, backing: &Backing, bytes: u64, align: u64, label: &str) -> Result<Block> {
        // Every block offset is a multiple of 512 (all sizes are), which
        // satisfies any alignment dividing 512; wgpu never asks for more
        // than 256.
        let align = align.max(1);
        if !MIN_BLOCK_SIZE.is_multiple_of(align) {
            return Err(Error::Unsupported(format!(
                "caching pool: {label} asks for {align}-byte alignment; only powers of two up to {MIN_BLOCK_SIZE} are supported"
            )));
        }
        let size = block_size_for(bytes);
        let pool = pool_for(size);
        backing.check_size(size, label)?;
        let limit = backing.max_buffer_size();
        // A segment never exceeds the device's buffer limit: on a device
        // with a small limit the segment shrinks (still >= size).
        let segment_size = segment_size_for(size).min(limit / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE);

        let mut st = self.lock();
        let best_fit = st
            .free_set(pool)
            .range(
                FreeKey {
                    size,
                    segment: 0,
                    offset: 0,
                }..,
            )
            .next()
            .copied();
        let key = match best_fit {
            Some(key) => key,
            None => match self.create_segment(&mut st, backing, segment_size, pool, label) {
                Ok(key) => key,
                Err(first) => {
                    // PyTorch: free every cached segment and retry once.
                    log::debug!("caching pool: {first}; freeing cached segments and retrying");
                    let (freed, freed_bytes) = st.release_cached_segments();
                    st.stats.num_alloc_retries += 1;
                    match self.create_segment(&mut st, backing, segment_size, pool, label) {
                        Ok(key) => key,
                        Err(second) => {
                            st.stats.num_ooms += 1;
                            let pool_state = format!(
                                "after freeing {freed} cached segments ({freed_bytes} bytes) and retrying; the pool holds {} bytes allocated, {} reserved",
                                st.stats.allocated_bytes.current, st.stats.reserved_bytes.current
                            );
                            return Err(match second {
                                Error::OutOfMemory { during, message } => Error::OutOfMemory {
                                    during: format!("{during} ({bytes} bytes, caching pool)"),
                                    message: format!("{message}; {pool_state}"),
                                },
                                other => other,
                            });
                        }
                    }
                }
            },
        };
        Ok(st.take_block(key, size, bytes))
    }

    fn release(&self, block: &Block) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(seg) = st.segments.get_mut(&block.segment) else {
            log::error!(
                "caching pool: release of block {} of unknown segment {}",
                block.id,
                block.segment
            );
            debug_assert!(false, "release of a block of an unknown segment");
            return;
        };
        let Some(b) = seg
            .blocks
            .get(&block.offset)
            .copied()
            .filter(|b| b.id == Some(block.id))
        else {
            log::error!(
                "caching pool: release of block {} that is not allocated (double release?)",
                block.id
            );
            debug_assert!(false, "release of a block that is not allocated");
            return;
        };
        let pool = seg.pool;
        let inactive_before = seg.inactive_split();
        seg.allocated -= b.size;

        // Coalesce with free neighbours (blocks tile the segment, so the
        // previous and next entries are adjacent).
        let mut start = block.offset;
        let mut size = b.size;
        let mut merged = Vec::new();
        if let Some((&off, prev)) = seg.blocks.range(..block.offset).next_back() {
            if prev.id.is_none() {
                merged.push(FreeKey {
                    size: prev.size,
                    segment: block.segment,
                    offset: off,
                });
                start = off;
                size += prev.size;
            }
        }
        let next_offset = block.offset + b.size;
        if let Some(next) = seg.blocks.get(&next_offset).copied() {
            if next.id.is_none() {
                merged.push(FreeKey {
                    size: next.size,
                    segment: block.segment,
                    offset: next_offset,
                });
                size += next.size;
            }
        }
        for key in &merged {
            seg.blocks.remove(&key.offset);
        }
        seg.blocks.remove(&block.offset);
        seg.blocks.insert(
            start,
            SegBlock {
                size,
                requested: 0,
                id: None,
            },
        );
        let inactive_after = seg.inactive_split();

        let set = st.free_set(pool);
        for key in &merged {
            set.remove(key);
        }
        set.insert(FreeKey {
            size,
            segment: block.segment,
            offset: start,
        });
        let stats = &mut st.stats;
        stats.on_release(b.size, b.requested);
        shift(
            &mut stats.inactive_split_bytes,
            inactive_before,
            inactive_after,
        );
    }

    fn stats(&self) -> MemoryStats {
        self.lock().stats.clone()
    }

    fn reset_peak_stats(&self) {
        self.lock().stats.reset_peaks();
    }

    fn empty_cache(&self) {
        self.lock().release_cached_segments();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn snapshot(&self) -> PoolSnapshot {
        let st = self.lock();
        PoolSnapshot {
            policy: self.policy_name().to_string(),
            stats: st.stats.clone(),
            segments: st
                .segments
                .iter()
                .map(|(&id, seg)| SegmentSnapshot {
                    id,
                    size: seg.size,
                    pool: seg.pool,
                    blocks: seg
                        .blocks
                        .iter()
                        .map(|(&offset, b)| BlockSnapshot {
                            offset,
                            size: b.size,
                            requested: b.requested,
                            allocated: b.id.is_some(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
