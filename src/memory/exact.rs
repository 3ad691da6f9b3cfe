use std::collections::BTreeMap;
use std::sync::Mutex;

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
            self.state.lock().expect("pool poisoned").0.num_ooms += 1;
        })?;
        let mut s = self.state.lock().expect("pool poisoned");
        s.1 += 1;
        let id = s.1;
        self.live
            .lock()
            .expect("pool poisoned")
            .insert(id, (size, bytes));
        let st = &mut s.0;
        st.num_allocs += 1;
        st.num_device_alloc += 1;
        st.allocated_bytes.add(size);
        st.active_bytes.add(size);
        st.reserved_bytes.add(size);
        st.requested_bytes.add(bytes);
        st.allocation.add(1);
        st.segment.add(1);
        Ok(Block {
            buffer,
            offset: 0,
            size,
            requested: bytes,
            id,
            segment: id,
        })
    }

    fn release(&self, block: &Block) {
        // Dropping (not destroying) the handle: commands recorded but not yet
        // submitted may still use it, and wgpu frees it when they complete.
        let mut s = self.state.lock().expect("pool poisoned");
        self.live.lock().expect("pool poisoned").remove(&block.id);
        let st = &mut s.0;
        st.num_device_free += 1;
        st.allocated_bytes.sub(block.size);
        st.active_bytes.sub(block.size);
        st.reserved_bytes.sub(block.size);
        st.requested_bytes.sub(block.requested);
        st.allocation.sub(1);
        st.segment.sub(1);
    }

    fn stats(&self) -> MemoryStats {
        self.state.lock().expect("pool poisoned").0.clone()
    }

    fn reset_peak_stats(&self) {
        let mut s = self.state.lock().expect("pool poisoned");
        let st = &mut s.0;
        for x in [
            &mut st.allocated_bytes,
            &mut st.reserved_bytes,
            &mut st.active_bytes,
            &mut st.inactive_split_bytes,
            &mut st.requested_bytes,
            &mut st.allocation,
            &mut st.segment,
        ] {
            x.reset_peak();
        }
    }

    fn empty_cache(&self) {}

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// One segment per live tensor.
    fn snapshot(&self) -> PoolSnapshot {
        let s = self.state.lock().expect("pool poisoned");
        let live = self.live.lock().expect("pool poisoned");
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
