use serde::Serialize;

use super::MemoryStats;

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentPool {
    /// Caching pool: 2 MiB segments serving requests of at most 1 MiB.
    Small,
    /// Caching pool: segments serving requests over 1 MiB.
    Large,
    /// One device buffer per tensor (exact pool; planned pool outside a replay).
    Dedicated,
    /// Planned pool: an arena holding the tensors of a replayed plan.
    Arena,
}

impl SegmentPool {
    /// The pool's name in snapshots.
    pub fn name(self) -> &'static str {
        match self {
            SegmentPool::Small => "small",
            SegmentPool::Large => "large",
            SegmentPool::Dedicated => "dedicated",
            SegmentPool::Arena => "arena",
        }
    }
}

/// A byte range of a segment: held by a tensor (`allocated`) or cached free.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// Byte offset in the segment.
    pub offset: u64,
    /// Bytes of the block (what `allocated_bytes` counts while it is allocated).
    pub size: u64,
    /// Bytes the caller asked for (0 for a free block).
    pub requested: u64,
    /// True when the block is in use.
    pub allocated: bool,
}

/// One device buffer of a pool and the blocks it is cut into, in offset order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// Pool-unique id (the `segment` of the blocks it holds).
    pub id: u64,
    /// Bytes of the device buffer.
    pub size: u64,
    /// Which pool the segment belongs to.
    pub pool: SegmentPool,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// A pool's state at one moment, like `torch.cuda.memory_snapshot()`:
/// statistics and every segment, taken together (consistent with each other).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolSnapshot {
    /// The pool's `policy_name`.
    pub policy: String,
    /// The pool's statistics when the snapshot was taken.
    pub stats: MemoryStats,
    /// Segments in id order; empty for policies that do not track them.
    pub segments: Vec<SegmentSnapshot>,
}

impl PoolSnapshot {
    /// Pretty-printed JSON of the snapshot.
    pub fn to_json(&self) -> String {
        // Plain fields and string keys: serializing to a String cannot fail.
        #[allow(clippy::expect_used)]
        serde_json::to_string_pretty(self).expect("a pool snapshot always serializes")
    }
}
