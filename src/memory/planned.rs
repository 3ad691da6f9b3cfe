//! The `planned` policy: for a forward pass whose allocation sequence is
//! known (traced once in a dry run), every tensor gets a fixed offset in a few
//! arena buffers, assigned greedily over tensor lifetimes (best-fitting gap
//! among tensors alive at the same time; largest or earliest first, whichever
//! reserves less).
//! Reserved memory is then the arena sizes, close to peak allocated.
//!
//! Allocations outside a planned forward (weights, constants) get one buffer
//! each, as in the `exact` policy.

use parking_lot::Mutex;
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use super::{
    round_up, Backing, Block, BlockSnapshot, MemoryPool, MemoryStats, PoolSnapshot, SegmentPool,
    SegmentSnapshot,
};
use crate::error::{Error, Result};

/// One allocation of a traced forward pass; `start`/`end` are event indices
/// (allocations and releases counted together).
#[derive(Clone, Debug, Serialize)]
pub struct TraceEntry {
    /// Bytes requested.
    pub bytes: u64,
    /// Event index of the allocation.
    pub start: usize,
    /// `usize::MAX` when still alive at the end of the trace.
    pub end: usize,
    /// The tensor's label.
    pub label: String,
}

/// The allocation sequence of a forward pass.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AllocationTrace {
    /// Allocations in order.
    pub entries: Vec<TraceEntry>,
}

/// Where each traced allocation lives.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    /// Size of each arena buffer.
    pub arenas: Vec<u64>,
    /// `(arena, offset, size)` per trace entry, in allocation order.
    pub placements: Vec<(usize, u64, u64)>,
    /// Peak of concurrently live bytes (the lower bound of any plan).
    pub peak_live: u64,
    /// The trace planned: a replay checks every allocation and release against it.
    #[serde(skip)]
    pub trace: AllocationTrace,
}

impl MemoryPlan {
    /// Bytes the plan reserves (all arenas).
    pub fn reserved(&self) -> u64 {
        self.arenas.iter().sum()
    }
}

/// Greedy placement over tensor lifetimes, tried in two orders (largest
/// first, and earliest allocated first), keeping the plan that reserves less.
/// Each tensor goes to the smallest gap (between tensors whose lifetimes
/// overlap its own) that fits, else to the end of the first arena with room.
/// Largest-first packs one arena best; earliest-first wins when the arena cap
/// forces tensors into several arenas (it colours chains of overlapping
/// lifetimes with two arenas where largest-first can need three). Sizes are
/// rounded to `align`; no arena exceeds `max_arena` bytes.
pub fn plan_greedy(trace: &AllocationTrace, align: u64, max_arena: u64) -> Result<MemoryPlan> {
    let sizes: Vec<u64> = trace
        .entries
        .iter()
        .map(|e| round_up(e.bytes.max(4), align))
        .collect();
    if let Some(i) = (0..sizes.len()).find(|&i| sizes[i] > max_arena) {
        return Err(Error::BufferTooLarge {
            what: format!("planned tensor `{}`", trace.entries[i].label),
            bytes: sizes[i],
            limit: max_arena,
        });
    }
    let mut by_size: Vec<usize> = (0..sizes.len()).collect();
    by_size.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let by_start: Vec<usize> = (0..sizes.len()).collect();
    let (mut arenas, mut placements) = place_greedy(trace, &sizes, &by_size, max_arena)?;
    let (arenas2, placements2) = place_greedy(trace, &sizes, &by_start, max_arena)?;
    // Ties keep largest-first, the order whose plans the figures were measured with.
    if arenas2.iter().sum::<u64>() < arenas.iter().sum::<u64>() {
        (arenas, placements) = (arenas2, placements2);
    }
    // Peak live bytes: sweep the events.
    let mut events: Vec<(usize, i64)> = Vec::new();
    for (e, s) in trace.entries.iter().zip(&sizes) {
        events.push((e.start, *s as i64));
        if e.end != usize::MAX {
            events.push((e.end, -(*s as i64)));
        }
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, d) in events {
        live += d;
        peak = peak.max(live);
    }
    Ok(MemoryPlan {
        arenas,
        placements: placements
            .into_iter()
            .zip(&sizes)
            .map(|((a, o), s)| (a, o, *s))
            .collect(),
        peak_live: peak as u64,
        trace: trace.clone(),
    })
}

/// Arena sizes and each trace entry's `(arena, offset)`.
type Placed = (Vec<u64>, Vec<(usize, u64)>);

/// Places every tensor in `order`; returns the arena sizes and each entry's
/// `(arena, offset)`. Every size is at most `max_arena` (checked by the caller).
fn place_greedy(
    trace: &AllocationTrace,
    sizes: &[u64],
    order: &[usize],
    max_arena: u64,
) -> Result<Placed> {
    let mut placements: Vec<Option<(usize, u64)>> = vec![None; sizes.len()];
    let mut arena_ends: Vec<u64> = Vec::new();
    let alive_together = |a: &TraceEntry, b: &TraceEntry| a.start < b.end && b.start < a.end;
    for &i in order {
        let size = sizes[i];
        let e = &trace.entries[i];
        let mut arena = 0;
        let placed = loop {
            // Tensors already placed in this arena and alive with this one, by offset.
            let mut busy: Vec<(u64, u64)> = placements
                .iter()
                .enumerate()
                .filter_map(|(j, p)| match p {
                    Some((a, off)) if *a == arena && alive_together(e, &trace.entries[j]) => {
                        Some((*off, sizes[j]))
                    }
                    _ => None,
                })
                .collect();
            busy.sort_unstable();
            let mut best: Option<(u64, u64)> = None; // (gap, offset)
            let mut cursor = 0u64;
            for (off, sz) in busy {
                if off > cursor {
                    let gap = off - cursor;
                    if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                        best = Some((gap, cursor));
                    }
                }
                cursor = cursor.max(off + sz);
            }
            if let Some((_, off)) = best {
                break (arena, off);
            }
            if cursor + size <= max_arena {
                break (arena, cursor);
            }
            arena += 1;
        };
        if arena_ends.len() <= placed.0 {
            arena_ends.resize(placed.0 + 1, 0);
        }
        arena_ends[placed.0] = arena_ends[placed.0].max(placed.1 + size);
        placements[i] = Some(placed);
    }
    // Every index is in `order` exactly once; a gap would misplace every later tensor.
    let placements = placements
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Internal("a traced tensor was left unplaced".into()))?;
    Ok((arena_ends, placements))
}

#[derive(Default)]
struct Stats {
    stats: MemoryStats,
    next_id: u64,
}

impl Stats {
    fn on_alloc(&mut self, size: u64, requested: u64, new_segment: Option<u64>) -> u64 {
        self.next_id += 1;
        self.stats.on_alloc(size, requested, new_segment);
        self.next_id
    }
    fn on_release(&mut self, block: &Block) {
        self.stats.on_release(block.size, block.requested);
    }
    fn drop_segment(&mut self, size: u64) {
        self.stats.on_segment_freed(size);
    }
}

/// Records the allocation sequence of a dry run (blocks have no buffers).
#[derive(Default)]
pub struct TracingPool {
    state: Mutex<TracingState>,
}

#[derive(Default)]
struct TracingState {
    trace: AllocationTrace,
    event: usize,
    /// Open allocations: their trace entry (or, peak only, their rounded size).
    open: HashMap<u64, usize>,
    stats: Stats,
    /// Most entries the trace may hold; one more allocation fails.
    max_entries: Option<usize>,
    overflowed: bool,
    /// Peak only: no trace is kept, only the peak of live bytes with every
    /// size rounded up to this alignment (as a planned replay rounds them).
    peak_align: Option<u64>,
    live: u64,
    peak: u64,
    largest: u64,
}

impl TracingPool {
    /// An empty tracer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracer whose allocation past `n` entries fails (and
    /// [`TracingPool::overflowed`] turns true): a trace too long to plan
    /// stops there instead of running to its end.
    pub(crate) fn with_max_entries(n: usize) -> Self {
        let pool = Self::default();
        pool.state.lock().max_entries = Some(n);
        pool
    }

    /// A tracer that keeps no trace, only [`TracingPool::aligned_peak`] and
    /// [`TracingPool::largest`]: the same figures a kept trace gives, without
    /// storing millions of entries for a long tiled dry run.
    pub(crate) fn peak_only(align: u64) -> Self {
        let pool = Self::default();
        pool.state.lock().peak_align = Some(align.max(1));
        pool
    }

    /// Whether this is a [`TracingPool::peak_only`] tracer.
    pub(crate) fn is_peak_only(&self) -> bool {
        self.state.lock().peak_align.is_some()
    }

    /// Whether an allocation failed for passing the entry limit.
    pub(crate) fn overflowed(&self) -> bool {
        self.state.lock().overflowed
    }

    /// Peak only: the peak of live bytes, sizes rounded as a replay rounds them.
    pub(crate) fn aligned_peak(&self) -> u64 {
        self.state.lock().peak
    }

    /// Peak only: the largest allocation requested (bytes).
    pub(crate) fn largest(&self) -> u64 {
        self.state.lock().largest
    }

    /// The trace so far (allocations still alive end at `usize::MAX`;
    /// empty for a [`TracingPool::peak_only`] tracer).
    pub fn trace(&self) -> AllocationTrace {
        self.state.lock().trace.clone()
    }
}

impl MemoryPool for TracingPool {
    fn policy_name(&self) -> &'static str {
        "trace"
    }
    fn allocate(&self, _backing: &Backing, bytes: u64, _align: u64, label: &str) -> Result<Block> {
        let mut s = self.state.lock();
        if s.max_entries.is_some_and(|n| s.trace.entries.len() >= n) {
            s.overflowed = true;
            return Err(Error::OutOfMemory {
                during: format!("tracing (allocating `{label}`)"),
                message: "the trace is longer than a plan may be".into(),
            });
        }
        let size = round_up(bytes.max(4), 4);
        let id = s.stats.on_alloc(size, bytes, Some(size));
        let start = s.event;
        s.event += 1;
        if let Some(align) = s.peak_align {
            let aligned = round_up(bytes.max(4), align);
            s.live += aligned;
            s.peak = s.peak.max(s.live);
            s.largest = s.largest.max(bytes);
            s.open.insert(id, aligned as usize);
            return Ok(Block::whole(None, size, bytes, id));
        }
        let index = s.trace.entries.len();
        s.trace.entries.push(TraceEntry {
            bytes,
            start,
            end: usize::MAX,
            label: label.to_string(),
        });
        s.open.insert(id, index);
        Ok(Block::whole(None, size, bytes, id))
    }
    fn release(&self, block: &Block) {
        let mut s = self.state.lock();
        s.stats.on_release(block);
        s.stats.drop_segment(block.size);
        let event = s.event;
        s.event += 1;
        match (s.open.remove(&block.id), s.peak_align) {
            (Some(aligned), Some(_)) => s.live -= aligned as u64,
            (Some(i), None) => s.trace.entries[i].end = event,
            (None, _) => {}
        }
    }
    fn stats(&self) -> MemoryStats {
        self.state.lock().stats.stats.clone()
    }
    fn reset_peak_stats(&self) {
        self.state.lock().stats.stats.reset_peaks();
    }
    fn empty_cache(&self) {}
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Arena {
    buffer: Option<wgpu::Buffer>,
    size: u64,
    segment: u64,
}

/// A plan being replayed: allocations and releases must follow its trace
/// event by event.
struct Replay {
    key: String,
    plan: Arc<MemoryPlan>,
    /// Index of the next trace entry to allocate.
    next: usize,
    /// Events (allocations and releases of this replay's blocks) so far.
    event: usize,
    /// Trace entry of each block this replay handed out, by block id.
    entry_of: HashMap<u64, usize>,
}

/// A block held by a caller.
struct LiveBlock {
    segment: u64,
    offset: u64,
    size: u64,
    requested: u64,
    in_arena: bool,
}

#[derive(Default)]
struct PlannedState {
    stats: Stats,
    plans: HashMap<String, Arc<MemoryPlan>>,
    /// Arenas of the plan last replayed (kept, like a cache, until another
    /// plan needs different sizes or `empty_cache`).
    arenas: Vec<Arena>,
    arenas_for: Option<String>,
    replay: Option<Replay>,
    /// Every live block by id (arena and dedicated).
    live: BTreeMap<u64, LiveBlock>,
    /// Live blocks per arena segment (an arena is not dropped while one is alive).
    live_in_arena: HashMap<u64, usize>,
    next_segment: u64,
    divergences: u64,
    last_divergence: Option<String>,
}

impl PlannedState {
    /// Free bytes of arenas that hold live blocks (fragmentation a plan leaves).
    fn recount_inactive_split(&mut self) {
        let mut used: HashMap<u64, u64> = HashMap::new();
        for b in self.live.values().filter(|b| b.in_arena) {
            *used.entry(b.segment).or_insert(0) += b.size;
        }
        let inactive: u64 = self
            .arenas
            .iter()
            .filter_map(|a| used.get(&a.segment).map(|u| a.size.saturating_sub(*u)))
            .sum();
        let stat = &mut self.stats.stats.inactive_split_bytes;
        if inactive >= stat.current {
            stat.add(inactive - stat.current);
        } else {
            stat.sub(stat.current - inactive);
        }
    }

    /// The running forward no longer follows its trace: stop replaying (later
    /// allocations get buffers of their own, which cannot overlap anything).
    fn diverge(&mut self, why: String) {
        log::warn!("{why}; allocating separate buffers for the rest of this forward");
        self.divergences += 1;
        self.last_divergence = Some(why);
        self.replay = None;
    }

    /// Checks that the next planned allocation is exactly this one and that
    /// its planned place is free; its `(arena, offset, size)` if so.
    fn planned_place(
        &self,
        bytes: u64,
        align: u64,
        label: &str,
    ) -> std::result::Result<(usize, u64, u64), String> {
        #[allow(clippy::expect_used)] // only called while replaying a plan
        let r = self.replay.as_ref().expect("replaying");
        let index = r.next;
        let Some(entry) = r.plan.trace.entries.get(index) else {
            return Err(format!(
                "memory plan `{}` has {index} allocations; allocation `{label}` ({bytes} bytes) is extra",
                r.key
            ));
        };
        if entry.bytes != bytes || entry.label != label || entry.start != r.event {
            return Err(format!(
                "memory plan `{}` expected allocation {index} `{}` ({} bytes) at event {}, got `{label}` ({bytes} bytes) at event {}",
                r.key, entry.label, entry.bytes, entry.start, r.event
            ));
        }
        let (arena, offset, size) = r.plan.placements[index];
        if offset % align.max(1) != 0 {
            return Err(format!(
                "memory plan `{}` placed `{label}` at offset {offset}, not aligned to {align}",
                r.key
            ));
        }
        if self.arenas_for.as_deref() == Some(r.key.as_str()) {
            let segment = self.arenas[arena].segment;
            if let Some((_, b)) = self.live.iter().find(|(_, b)| {
                b.in_arena
                    && b.segment == segment
                    && b.offset < offset + size
                    && offset < b.offset + b.size
            }) {
                return Err(format!(
                    "memory plan `{}`: `{label}` would overlap a live block at {}..{} of arena {arena}",
                    r.key,
                    b.offset,
                    b.offset + b.size
                ));
            }
        }
        Ok((arena, offset, size))
    }
}

/// The `planned` policy (see the module docs).
///
/// A replay is strict: the n-th allocation must have exactly the size, label
/// and position among the events of the traced n-th one, releases must come
/// in traced order, and a planned place must not overlap a live block. At
/// the first mismatch the replay stops ([`PlannedPool::divergences`] counts
/// it, a warning names it) and the rest of the forward gets one buffer per
/// tensor, so a forward that drifts from its trace costs memory, never
/// correctness.
#[derive(Default)]
pub struct PlannedPool {
    state: Mutex<PlannedState>,
}

impl PlannedPool {
    /// A pool with no plans.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when a plan is installed under `key`.
    pub fn has_plan(&self, key: &str) -> bool {
        self.state.lock().plans.contains_key(key)
    }

    /// Installs `plan` under `key`.
    pub fn install_plan(&self, key: &str, plan: MemoryPlan) {
        self.state
            .lock()
            .plans
            .insert(key.to_string(), Arc::new(plan));
    }

    /// The plan installed under `key`.
    pub fn plan(&self, key: &str) -> Option<Arc<MemoryPlan>> {
        self.state.lock().plans.get(key).cloned()
    }

    /// Following allocations take their places from plan `key`, in order.
    pub fn begin_replay(&self, key: &str) -> Result<()> {
        let mut s = self.state.lock();
        let Some(plan) = s.plans.get(key).cloned() else {
            return Err(Error::Unsupported(format!("no memory plan `{key}`")));
        };
        s.replay = Some(Replay {
            key: key.to_string(),
            plan,
            next: 0,
            event: 0,
            entry_of: HashMap::new(),
        });
        Ok(())
    }

    /// Back to one buffer per allocation.
    pub fn end_replay(&self) {
        self.state.lock().replay = None;
    }

    /// Replays that stopped because the forward did not follow its trace.
    pub fn divergences(&self) -> u64 {
        self.state.lock().divergences
    }

    /// Why the last replay stopped early, if one did.
    pub fn last_divergence(&self) -> Option<String> {
        self.state.lock().last_divergence.clone()
    }

    fn new_segment_id(s: &mut PlannedState) -> u64 {
        s.next_segment += 1;
        s.next_segment
    }

    /// Makes sure the arenas of `key` exist (dropping unused ones of another plan).
    fn ensure_arenas(s: &mut PlannedState, backing: &Backing, key: &str) -> Result<()> {
        if s.arenas_for.as_deref() == Some(key) {
            return Ok(());
        }
        let busy = s
            .arenas
            .iter()
            .any(|a| s.live_in_arena.get(&a.segment).copied().unwrap_or(0) > 0);
        if busy {
            return Err(Error::Unsupported(
                "a planned forward started while tensors of another planned forward are alive"
                    .into(),
            ));
        }
        for a in std::mem::take(&mut s.arenas) {
            s.stats.drop_segment(a.size);
            s.live_in_arena.remove(&a.segment);
        }
        s.arenas_for = None;
        let plan = s.plans[key].clone();
        for &size in &plan.arenas {
            let buffer = backing.create_buffer(size.max(4), "wgvae planned arena")?;
            let segment = Self::new_segment_id(s);
            s.stats.stats.reserved_bytes.add(size.max(4));
            s.stats.stats.segment.add(1);
            s.stats.stats.num_device_alloc += 1;
            s.arenas.push(Arena {
                buffer,
                size: size.max(4),
                segment,
            });
        }
        s.arenas_for = Some(key.to_string());
        Ok(())
    }
}

impl MemoryPool for PlannedPool {
    fn policy_name(&self) -> &'static str {
        "planned"
    }

    fn allocate(&self, backing: &Backing, bytes: u64, align: u64, label: &str) -> Result<Block> {
        let mut s = self.state.lock();
        if s.replay.is_some() {
            match s.planned_place(bytes, align, label) {
                Ok((arena, offset, size)) => {
                    let key = s.replay.as_ref().map(|r| r.key.clone()).unwrap_or_default();
                    Self::ensure_arenas(&mut s, backing, &key)?;
                    let a = &s.arenas[arena];
                    let (buffer, segment) = (a.buffer.clone(), a.segment);
                    *s.live_in_arena.entry(segment).or_insert(0) += 1;
                    let id = s.stats.on_alloc(size, bytes, None);
                    s.live.insert(
                        id,
                        LiveBlock {
                            segment,
                            offset,
                            size,
                            requested: bytes,
                            in_arena: true,
                        },
                    );
                    if let Some(r) = s.replay.as_mut() {
                        r.entry_of.insert(id, r.next);
                        r.next += 1;
                        r.event += 1;
                    }
                    s.recount_inactive_split();
                    return Ok(Block {
                        buffer,
                        offset,
                        size,
                        requested: bytes,
                        id,
                        segment,
                    });
                }
                Err(why) => s.diverge(why),
            }
        }
        let size = round_up(bytes.max(4), 4);
        let buffer = backing
            .create_buffer(size, label)
            .inspect_err(|_| s.stats.stats.num_ooms += 1)?;
        let segment = Self::new_segment_id(&mut s);
        let id = s.stats.on_alloc(size, bytes, Some(size));
        s.live.insert(
            id,
            LiveBlock {
                segment,
                offset: 0,
                size,
                requested: bytes,
                in_arena: false,
            },
        );
        Ok(Block {
            buffer,
            offset: 0,
            size,
            requested: bytes,
            id,
            segment,
        })
    }

    fn release(&self, block: &Block) {
        let mut s = self.state.lock();
        s.stats.on_release(block);
        s.live.remove(&block.id);
        if let Some(n) = s.live_in_arena.get_mut(&block.segment) {
            *n -= 1;
            s.recount_inactive_split();
        } else {
            s.stats.drop_segment(block.size);
        }
        let traced = s.replay.as_mut().and_then(|r| {
            let entry = r.entry_of.remove(&block.id)?;
            Some((
                r.key.clone(),
                entry,
                r.plan.trace.entries[entry].end,
                r.event,
            ))
        });
        if let Some((key, entry, planned_end, event)) = traced {
            if planned_end == event {
                if let Some(r) = s.replay.as_mut() {
                    r.event += 1;
                }
            } else {
                s.diverge(format!(
                    "memory plan `{key}`: allocation {entry} released at event {event}, traced at {}",
                    if planned_end == usize::MAX {
                        "never".to_string()
                    } else {
                        planned_end.to_string()
                    }
                ));
            }
        }
    }

    fn stats(&self) -> MemoryStats {
        self.state.lock().stats.stats.clone()
    }

    fn reset_peak_stats(&self) {
        self.state.lock().stats.stats.reset_peaks();
    }

    fn empty_cache(&self) {
        let mut s = self.state.lock();
        let busy = s
            .arenas
            .iter()
            .any(|a| s.live_in_arena.get(&a.segment).copied().unwrap_or(0) > 0);
        if busy {
            return;
        }
        for a in std::mem::take(&mut s.arenas) {
            s.stats.drop_segment(a.size);
            s.live_in_arena.remove(&a.segment);
        }
        s.arenas_for = None;
    }

    /// Arenas (live blocks and the free gaps between them, in offset order)
    /// and one dedicated segment per tensor allocated outside a replay.
    fn snapshot(&self) -> PoolSnapshot {
        let s = self.state.lock();
        let mut segments = Vec::new();
        for a in &s.arenas {
            let mut inside: Vec<&LiveBlock> = s
                .live
                .values()
                .filter(|b| b.in_arena && b.segment == a.segment)
                .collect();
            inside.sort_by_key(|b| b.offset);
            let mut blocks = Vec::new();
            let mut cursor = 0;
            for b in inside {
                if b.offset > cursor {
                    blocks.push(BlockSnapshot {
                        offset: cursor,
                        size: b.offset - cursor,
                        requested: 0,
                        allocated: false,
                    });
                }
                blocks.push(BlockSnapshot {
                    offset: b.offset,
                    size: b.size,
                    requested: b.requested,
                    allocated: true,
                });
                cursor = cursor.max(b.offset + b.size);
            }
            if cursor < a.size {
                blocks.push(BlockSnapshot {
                    offset: cursor,
                    size: a.size - cursor,
                    requested: 0,
                    allocated: false,
                });
            }
            segments.push(SegmentSnapshot {
                id: a.segment,
                size: a.size,
                pool: SegmentPool::Arena,
                blocks,
            });
        }
        for b in s.live.values().filter(|b| !b.in_arena) {
            segments.push(SegmentSnapshot {
                id: b.segment,
                size: b.size,
                pool: SegmentPool::Dedicated,
                blocks: vec![BlockSnapshot {
                    offset: 0,
                    size: b.size,
                    requested: b.requested,
                    allocated: true,
                }],
            });
        }
        segments.sort_by_key(|g| g.id);
        PoolSnapshot {
            policy: self.policy_name().to_string(),
            stats: s.stats.stats.clone(),
            segments,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: u64, start: usize, end: usize) -> TraceEntry {
        TraceEntry {
            bytes,
            start,
            end,
            label: String::new(),
        }
    }

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let trace = AllocationTrace {
            entries: vec![entry(100, 0, 2), entry(100, 3, 5), entry(50, 1, 4)],
        };
        let plan = plan_greedy(&trace, 4, 1 << 20).unwrap();
        assert_eq!(plan.arenas, vec![152]); // 50 rounds up to 52
        assert_eq!(
            plan.placements[0].1, plan.placements[1].1,
            "same offset reused"
        );
        assert_eq!(plan.peak_live, 152);
    }

    #[test]
    fn placements_never_overlap_in_space_and_time() {
        let v = crate::testing::rand_vec(600, 9, 1.0);
        let mut entries = Vec::new();
        for i in 0..200 {
            let start = i * 2;
            let len = 1 + ((v[3 * i].abs() * 40.0) as usize);
            let bytes = 4 + (v[3 * i + 1].abs() * 10_000.0) as u64;
            entries.push(entry(bytes, start, start + len));
        }
        let trace = AllocationTrace { entries };
        let plan = plan_greedy(&trace, 256, 300_000).unwrap();
        for i in 0..trace.entries.len() {
            for j in i + 1..trace.entries.len() {
                let (a, b) = (&trace.entries[i], &trace.entries[j]);
                let (pa, pb) = (plan.placements[i], plan.placements[j]);
                let time = a.start < b.end && b.start < a.end;
                let space = pa.0 == pb.0 && pa.1 < pb.1 + pb.2 && pb.1 < pa.1 + pa.2;
                assert!(!(time && space), "{i} and {j} collide");
            }
        }
        for (arena, off, size) in &plan.placements {
            assert!(off + size <= plan.arenas[*arena]);
            assert_eq!(off % 256, 0);
        }
        assert!(plan.reserved() >= plan.peak_live);
        assert!(plan.arenas.iter().all(|&a| a <= 300_000));
    }

    #[test]
    fn chains_over_half_the_arena_cap_use_two_arenas() {
        // Each tensor is just over half the cap, so overlapping ones need
        // separate arenas: largest-first fills arenas 0 and 1 so that the
        // 2nd tensor overlaps both and opens a 3rd; earliest-first
        // alternates two (the case proptest found).
        let trace = AllocationTrace {
            entries: vec![
                entry(33_775_361, 0, 6),
                entry(33_333_249, 5, 8),
                entry(33_775_361, 7, 14),
                entry(33_775_617, 12, 22),
                entry(34_216_961, 23, usize::MAX),
            ],
        };
        let plan = plan_greedy(&trace, 256, 64 << 20).unwrap();
        assert_eq!(plan.arenas.len(), 2, "{:?}", plan.arenas);
        assert_eq!(plan.reserved(), 34_217_216 + 33_775_872);
    }

    #[test]
    fn oversized_tensor_is_an_error() {
        let trace = AllocationTrace {
            entries: vec![entry(1000, 0, 1)],
        };
        assert!(matches!(
            plan_greedy(&trace, 4, 512),
            Err(Error::BufferTooLarge { .. })
        ));
    }
}
