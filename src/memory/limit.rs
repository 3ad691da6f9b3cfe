//! A pool that refuses allocations beyond a limit, so a null-device run that
//! cannot fit its budget stops at the first tensor over it instead of
//! recording the rest of a long tiled trace (planning a huge image tried
//! every candidate tile to the end, for minutes).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Backing, Block, MemoryPool, MemoryStats, PoolSnapshot};
use crate::error::{Error, Result};

/// Wraps a pool; an allocation that takes its allocated bytes over `limit`
/// is released again and fails, and [`LimitedPool::tripped`] turns true.
pub(crate) struct LimitedPool {
    inner: Arc<dyn MemoryPool>,
    limit: u64,
    tripped: AtomicBool,
}

impl LimitedPool {
    pub(crate) fn new(inner: Arc<dyn MemoryPool>, limit: u64) -> Self {
        LimitedPool {
            inner,
            limit,
            tripped: AtomicBool::new(false),
        }
    }

    /// Whether an allocation went over the limit (the run's error is that one).
    pub(crate) fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }
}

impl MemoryPool for LimitedPool {
    fn policy_name(&self) -> &'static str {
        self.inner.policy_name()
    }
    fn allocate(&self, backing: &Backing, bytes: u64, align: u64, label: &str) -> Result<Block> {
        let block = self.inner.allocate(backing, bytes, align, label)?;
        let now = self.inner.stats().allocated_bytes.current;
        if now > self.limit {
            self.inner.release(&block);
            self.tripped.store(true, Ordering::Relaxed);
            return Err(Error::OutOfMemory {
                during: format!("planning (allocating `{label}`)"),
                message: format!(
                    "{now} bytes allocated, over the {} bytes this candidate may use",
                    self.limit
                ),
            });
        }
        Ok(block)
    }
    fn release(&self, block: &Block) {
        self.inner.release(block)
    }
    fn stats(&self) -> MemoryStats {
        self.inner.stats()
    }
    fn reset_peak_stats(&self) {
        self.inner.reset_peak_stats()
    }
    fn empty_cache(&self) {
        self.inner.empty_cache()
    }
    fn snapshot(&self) -> PoolSnapshot {
        self.inner.snapshot()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
}
