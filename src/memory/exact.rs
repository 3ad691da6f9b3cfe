use parking_lot::Mutex;
use std::collections::BTreeMap;

use super::{
    round_up, Backing, Block, BlockSnapshot, MemoryPool, MemoryStats, PoolSnapshot, SegmentPool,
    SegmentSnapshot,
};
use crate::error::Result;

/// One device buffer per tensor, destroyed when the tensor drops:
/// reserved == allocated at every moment. The reference policy.
#[derive(Default)]
pub struct ExactPool {
    state: Mutex<(MemoryStats, u64)>,
    /// Live blocks by id: (size, requested), for snapshots.
    live: Mutex<BTreeMap<u64, (u64, u64)>>,
}

impl ExactPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MemoryPool for ExactPool {
    fn policy_name(&self) -> &'static str {
        "exact"
    }

    fn allocate(&self, backing: &Backing, bytes: u64, _align: u64, label: &str) -> Result<Block> {
        // wgpu needs sizes that are multiples of 4 for copies; never zero-sized.
        let size = round_up(bytes.max(4), 4);
        let buffer = backing.create_buffer(size, label).inspect_err(|_| {
            self.state.lock().0.num_ooms += 1;
        })?;
        let mut s = self.state.lock();
        s.1 += 1;
        let id = s.1;
        self.live.lock().insert(id, (size, bytes));
        s.0.on_alloc(size, bytes, Some(size));
        Ok(Block::whole(buffer, size, bytes, id))
    }

    fn release(&self, block: &Block) {
        // Dropping (not destroying) the handle: commands recorded but not yet
        // submitted may still use it, and wgpu frees it when they complete.
        let mut s = self.state.lock();
        self.live.lock().remove(&block.id);
        s.0.on_release(block.size, block.requested);
        s.0.on_segment_freed(block.size);
    }

    fn stats(&self) -> MemoryStats {
        self.state.lock().0.clone()
    }

    fn reset_peak_stats(&self) {
        self.state.lock().0.reset_peaks();
    }

    fn empty_cache(&self) {}

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// One segment per live tensor.
    fn snapshot(&self) -> PoolSnapshot {
        let s = self.state.lock();
        let live = self.live.lock();
        PoolSnapshot {
            policy: self.policy_name().to_string(),
            stats: s.0.clone(),
            segments: live
                .iter()
                .map(|(&id, &(size, requested))| SegmentSnapshot {
                    id,
                    size,
                    pool: SegmentPool::Dedicated,
                    blocks: vec![BlockSnapshot {
                        offset: 0,
                        size,
                        requested,
                        allocated: true,
                    }],
                })
                .collect(),
        }
    }
}
