//! Memory pools: property tests of the accounting invariants on random
//! alloc/free sequences (virtual backing), and the caching pool on the real
//! device against wgpu's own allocator report.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use wgvae::memory::{
    plan_greedy, Backing, Block, CachingPool, ExactPool, MemoryPool, PlannedPool, PoolSnapshot,
    SegmentPool, Stat, TracingPool,
};
use wgvae::{Error, Tensor};

const MIB: u64 = 1 << 20;
/// Virtual device limit of the property tests; some requests exceed it.
const MAX_BUFFER: u64 = 64 * MIB;
const VIRTUAL: Backing<'static> = Backing::Virtual {
    max_buffer_size: MAX_BUFFER,
};

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        bytes: u64,
        align: u64,
    },
    /// Frees the live block at this index (modulo the live count).
    Free(usize),
    EmptyCache,
    ResetPeaks,
}

/// Request sizes around every boundary of the caching rules (512 B, 1 MiB,
/// 10 MiB, the buffer limit), mostly small like a decoder's.
fn bytes() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => 0u64..=4096,
        3 => 0u64..=MIB + 4096,
        2 => MIB..10 * MIB + 4096,
        1 => 10 * MIB..MAX_BUFFER + 4 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (bytes(), prop::sample::select(vec![1u64, 4, 16, 64, 256, 512]))
            .prop_map(|(bytes, align)| Op::Alloc { bytes, align }),
        8 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeaks),
    ]
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

fn ensure_stat(name: &str, stat: Stat, recount: u64) -> Result<(), TestCaseError> {
    ensure(stat.current == recount, || {
        format!(
            "{name}: stats say {} but a recount gives {recount}",
            stat.current
        )
    })?;
    ensure(stat.peak >= stat.current, || {
        format!("{name}: peak {} below current {}", stat.peak, stat.current)
    })
}

/// Checks every invariant of a pool against the blocks the caller holds
/// (`live`, with the alignment each was asked with).
fn check(
    pool: &dyn MemoryPool,
    live: &[(Block, u64)],
    successful_allocs: u64,
) -> Result<(), TestCaseError> {
    let snap: PoolSnapshot = pool.snapshot();
    let st = &snap.stats;
    ensure(&pool.stats() == st, || {
        "stats() differs from the snapshot's stats".into()
    })?;
    ensure(
        st.allocated_bytes.current <= st.reserved_bytes.current,
        || {
            format!(
                "allocated {} > reserved {}",
                st.allocated_bytes.current, st.reserved_bytes.current
            )
        },
    )?;
    ensure(st.num_allocs == successful_allocs, || {
        format!(
            "num_allocs {} but {successful_allocs} allocations succeeded",
            st.num_allocs
        )
    })?;
    ensure(
        st.num_device_alloc - st.num_device_free == st.segment.current,
        || {
            format!(
                "{} device allocs - {} frees != {} segments",
                st.num_device_alloc, st.num_device_free, st.segment.current
            )
        },
    )?;

    // Segments: blocks tile each one exactly; freed neighbours are coalesced.
    let mut by_segment = BTreeMap::new();
    let (mut reserved, mut inactive_split, mut allocated_in_snapshot) = (0, 0, 0);
    for seg in &snap.segments {
        let mut next = 0;
        for (i, b) in seg.blocks.iter().enumerate() {
            ensure(b.offset == next && b.size > 0, || {
                format!("segment {} blocks do not tile it: {:?}", seg.id, seg.blocks)
            })?;
            next += b.size;
            if i > 0 {
                ensure(b.allocated || seg.blocks[i - 1].allocated, || {
                    format!(
                        "segment {} has adjacent free blocks: {:?}",
                        seg.id, seg.blocks
                    )
                })?;
            }
        }
        ensure(next == seg.size, || {
            format!("segment {} blocks sum to {next}, not {}", seg.id, seg.size)
        })?;
        reserved += seg.size;
        if seg.blocks.iter().any(|b| b.allocated) {
            inactive_split += seg
                .blocks
                .iter()
                .filter(|b| !b.allocated)
                .map(|b| b.size)
                .sum::<u64>();
        }
        allocated_in_snapshot += seg.blocks.iter().filter(|b| b.allocated).count();
        by_segment.insert(seg.id, seg);
    }

    // Live blocks: aligned, inside their segment, as the snapshot lists them.
    for (b, align) in live {
        ensure(b.offset % align == 0, || {
            format!("block {b:?} not aligned to {align}")
        })?;
        ensure(b.size >= b.requested, || {
            format!("block {b:?} smaller than requested")
        })?;
        let seg = by_segment
            .get(&b.segment)
            .ok_or_else(|| TestCaseError::fail(format!("block {b:?} in no live segment")))?;
        ensure(b.offset + b.size <= seg.size, || {
            format!("block {b:?} overruns segment of {}", seg.size)
        })?;
        let listed = seg.blocks.iter().find(|s| s.offset == b.offset);
        ensure(
            listed.is_some_and(|s| s.allocated && s.size == b.size && s.requested == b.requested),
            || format!("block {b:?} listed as {listed:?}"),
        )?;
    }
    ensure(allocated_in_snapshot == live.len(), || {
        format!(
            "snapshot lists {allocated_in_snapshot} allocated blocks, caller holds {}",
            live.len()
        )
    })?;

    // No two live blocks overlap.
    let mut ranges: Vec<(u64, u64, u64)> = live
        .iter()
        .map(|(b, _)| (b.segment, b.offset, b.size))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        ensure(w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1, || {
            format!("live blocks overlap: {:?} and {:?}", w[0], w[1])
        })?;
    }

    // Stats equal a recount.
    let allocated: u64 = live.iter().map(|(b, _)| b.size).sum();
    let requested: u64 = live.iter().map(|(b, _)| b.requested).sum();
    ensure_stat("allocated_bytes", st.allocated_bytes, allocated)?;
    ensure_stat("active_bytes", st.active_bytes, allocated)?;
    ensure_stat("requested_bytes", st.requested_bytes, requested)?;
    ensure_stat("reserved_bytes", st.reserved_bytes, reserved)?;
    ensure_stat(
        "inactive_split_bytes",
        st.inactive_split_bytes,
        inactive_split,
    )?;
    ensure_stat("allocation", st.allocation, live.len() as u64)?;
    ensure_stat("segment", st.segment, snap.segments.len() as u64)?;
    Ok(())
}

/// Replays `ops` on `pool`, checking after every step; then frees
/// everything and empties the cache.
fn run_sequence(pool: &dyn MemoryPool, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut live: Vec<(Block, u64)> = Vec::new();
    let mut successes = 0;
    for op in ops {
        match *op {
            Op::Alloc { bytes, align } => {
                let before = pool.stats();
                match pool.allocate(&VIRTUAL, bytes, align, "prop") {
                    Ok(block) => {
                        ensure(bytes <= MAX_BUFFER, || {
                            format!("{bytes} bytes over the limit allocated")
                        })?;
                        successes += 1;
                        live.push((block, align));
                    }
                    Err(Error::BufferTooLarge {
                        bytes: b, limit, ..
                    }) => {
                        ensure(
                            b > limit && limit == MAX_BUFFER && bytes > MAX_BUFFER,
                            || format!("BufferTooLarge for {bytes} bytes ({b} > {limit})"),
                        )?;
                    }
                    Err(Error::OutOfMemory { .. }) => {
                        // Only a capacity-limited pool: the retry freed the cache.
                        let after = pool.stats();
                        ensure(after.num_ooms == before.num_ooms + 1, || {
                            "OOM not counted".into()
                        })?;
                        ensure(
                            after.num_alloc_retries == before.num_alloc_retries + 1,
                            || "retry not counted".into(),
                        )?;
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
                }
            }
            Op::Free(i) => {
                if !live.is_empty() {
                    let (block, _) = live.swap_remove(i % live.len());
                    pool.release(&block);
                }
            }
            Op::EmptyCache => pool.empty_cache(),
            Op::ResetPeaks => {
                pool.reset_peak_stats();
                let s = pool.stats();
                ensure(s.allocated_bytes.peak == s.allocated_bytes.current, || {
                    "peak not reset".into()
                })?;
            }
        }
        check(pool, &live, successes)?;
    }
    while let Some((block, _)) = live.pop() {
        pool.release(&block);
        check(pool, &live, successes)?;
    }
    pool.empty_cache();
    check(pool, &live, successes)?;
    let s = pool.stats();
    ensure(
        s.reserved_bytes.current == 0 && s.segment.current == 0,
        || format!("after freeing all and empty_cache: {s:?}"),
    )?;
    ensure(
        s.allocated_bytes.current == 0 && s.requested_bytes.current == 0,
        || format!("after freeing all: {s:?}"),
    )?;
    Ok(())
}

// 3 000 + 5 000 + 2 000 = 10 000 random sequences of up to 40-60 steps.
proptest! {
    #![proptest_config(config(3000))]
    #[test]
    fn exact_pool_invariants(ops in prop::collection::vec(op(), 1..40)) {
        run_sequence(&ExactPool::new(), &ops)?;
    }
}

proptest! {
    #![proptest_config(config(5000))]
    #[test]
    fn caching_pool_invariants(ops in prop::collection::vec(op(), 1..60)) {
        run_sequence(&CachingPool::new(), &ops)?;
    }
}

proptest! {
    #![proptest_config(config(2000))]
    /// A 96 MiB budget: out-of-memory, retries and failed retries happen often.
    #[test]
    fn caching_pool_with_capacity_invariants(ops in prop::collection::vec(op(), 1..60)) {
        let pool = CachingPool::with_capacity(96 * MIB);
        run_sequence(&pool, &ops)?;
        prop_assert!(pool.stats().reserved_bytes.peak <= 96 * MIB);
    }
}

/// One step of a forward pass: allocate a tensor (label `t{label}`) or free
/// the live one at this index (modulo the live count).
#[derive(Clone, Debug)]
enum TraceOp {
    Alloc { bytes: u64, label: u8 },
    Free(usize),
}

fn trace_op() -> impl Strategy<Value = TraceOp> {
    prop_oneof![
        5 => (prop_oneof![3 => 1u64..=4096, 2 => 4096u64..=4 * MIB, 1 => 4 * MIB..=MAX_BUFFER], 0u8..4)
            .prop_map(|(bytes, label)| TraceOp::Alloc { bytes, label }),
        4 => any::<usize>().prop_map(TraceOp::Free),
    ]
}

/// How a replayed forward departs from its trace.
#[derive(Clone, Copy, Debug)]
enum Drift {
    None,
    /// The n-th allocation asks for 4 more bytes.
    Grow(usize),
    /// The n-th allocation has another label.
    Relabel(usize),
    /// The n-th free happens only at the end of the forward.
    LateFree(usize),
}

const PLAN_ALIGN: u64 = 256;

/// Runs `ops` on `pool`, holding blocks as a forward would; with `check_every`
/// checks the pool invariants after each step. Returns the live blocks left.
fn run_forward(
    pool: &dyn MemoryPool,
    ops: &[TraceOp],
    drift: Drift,
    check_every: bool,
) -> Result<Vec<(Block, u64)>, TestCaseError> {
    let mut live: Vec<(Block, u64)> = Vec::new();
    let mut late: Vec<(Block, u64)> = Vec::new();
    let (mut allocs, mut frees) = (0usize, 0usize);
    for op in ops {
        match *op {
            TraceOp::Alloc { bytes, label } => {
                let bytes = bytes
                    + if matches!(drift, Drift::Grow(n) if n == allocs) {
                        4
                    } else {
                        0
                    };
                let label = if matches!(drift, Drift::Relabel(n) if n == allocs) {
                    "other".to_string()
                } else {
                    format!("t{label}")
                };
                let block = pool
                    .allocate(&VIRTUAL, bytes, PLAN_ALIGN, &label)
                    .map_err(|e| TestCaseError::fail(format!("allocate: {e}")))?;
                allocs += 1;
                live.push((block, PLAN_ALIGN));
            }
            TraceOp::Free(i) => {
                if live.is_empty() {
                    continue;
                }
                let held = live.swap_remove(i % live.len());
                if matches!(drift, Drift::LateFree(n) if n == frees) {
                    late.push(held);
                } else {
                    pool.release(&held.0);
                }
                frees += 1;
            }
        }
        if check_every {
            let all: Vec<(Block, u64)> = live.iter().chain(&late).cloned().collect();
            check(pool, &all, allocs as u64)?;
        }
    }
    for (b, _) in late.drain(..) {
        pool.release(&b);
    }
    Ok(live)
}

/// Traces `ops`, plans them, replays them (with `drift`) through a planned
/// pool checking every invariant at every step; then frees all.
/// Returns the plan's reserved bytes, live peak, arena count and the replay's
/// divergences.
fn plan_and_replay(ops: &[TraceOp], drift: Drift) -> Result<(u64, u64, usize, u64), TestCaseError> {
    let tracer = TracingPool::new();
    for (b, _) in run_forward(&tracer, ops, Drift::None, false)? {
        tracer.release(&b);
    }
    let trace = tracer.trace();
    let plan = plan_greedy(&trace, PLAN_ALIGN, MAX_BUFFER)
        .map_err(|e| TestCaseError::fail(format!("plan: {e}")))?;
    let pool = PlannedPool::new();
    pool.install_plan("forward", plan.clone());
    pool.begin_replay("forward")
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let left = run_forward(&pool, ops, drift, true)?;
    pool.end_replay();
    let peak = pool.stats();
    let snap = pool.snapshot();
    ensure(
        snap.segments
            .iter()
            .all(|s| s.pool != SegmentPool::Arena || plan.arenas.contains(&s.size)),
        || {
            format!(
                "arena sizes {:?} not the plan's {:?}",
                snap.segments, plan.arenas
            )
        },
    )?;
    let mut live = left;
    while let Some((b, _)) = live.pop() {
        pool.release(&b);
        check(&pool, &live, peak.num_allocs)?;
    }
    pool.empty_cache();
    let s = pool.stats();
    ensure(
        s.reserved_bytes.current == 0 && s.allocated_bytes.current == 0,
        || format!("after freeing all and empty_cache: {s:?}"),
    )?;
    Ok((
        plan.reserved(),
        plan.peak_live,
        plan.arenas.len(),
        pool.divergences(),
    ))
}

fn traced_ops() -> impl Strategy<Value = Vec<TraceOp>> {
    prop::collection::vec(trace_op(), 1..50)
}

fn allocs_in(ops: &[TraceOp]) -> usize {
    ops.iter()
        .filter(|o| matches!(o, TraceOp::Alloc { .. }))
        .count()
}

/// Effective events (allocations and frees of a live block), as
/// `true` for a free.
fn events_of(ops: &[TraceOp]) -> Vec<bool> {
    let mut live = 0usize;
    let mut events = Vec::new();
    for o in ops {
        match o {
            TraceOp::Alloc { .. } => {
                live += 1;
                events.push(false);
            }
            TraceOp::Free(_) if live > 0 => {
                live -= 1;
                events.push(true);
            }
            TraceOp::Free(_) => {}
        }
    }
    events
}

proptest! {
    #![proptest_config(config(10_000))]
    /// 10 000 random forwards replayed exactly as traced: no live blocks
    /// overlap, offsets aligned, stats equal a recount at every step, the
    /// replay never falls back, and the arenas stay close to the peak.
    #[test]
    fn planned_pool_replay_invariants(ops in traced_ops()) {
        let (reserved, peak_live, arenas, divergences) = plan_and_replay(&ops, Drift::None)?;
        prop_assert_eq!(divergences, 0);
        prop_assert!(reserved >= peak_live);
        // Greedy placement is not optimal on adversarial random traces. In one
        // arena it stayed within 1.39x of the live peak (plus one tensor's
        // rounding) over 600 000 cases; when tensors near the arena cap force
        // several arenas, packing them is bin packing and the worst seen was
        // 1.49x (a 1.5x bound failed CI once: the saved regressions).
        let bound = if arenas <= 1 { 1.5 } else { 2.0 };
        prop_assert!(
            reserved as f64 <= bound * peak_live as f64 + PLAN_ALIGN as f64,
            "reserved {} vs peak live {} in {} arenas", reserved, peak_live, arenas
        );
    }
}

proptest! {
    #![proptest_config(config(3000))]
    /// Forwards that drift from their trace (a size, a label, a late free):
    /// the replay notices, falls back to separate buffers, and no two live
    /// blocks ever overlap.
    #[test]
    fn planned_pool_drifting_replay_never_overlaps(
        ops in traced_ops(),
        kind in 0u8..3,
        at in any::<usize>(),
    ) {
        let events = events_of(&ops);
        let frees = events.iter().filter(|&&f| f).count();
        let allocs = allocs_in(&ops);
        let drift = match kind {
            0 if allocs > 0 => Drift::Grow(at % allocs),
            1 if allocs > 0 => Drift::Relabel(at % allocs),
            2 if frees > 0 => Drift::LateFree(at % frees),
            _ => Drift::None,
        };
        let (_, _, _, divergences) = plan_and_replay(&ops, drift)?;
        // Delaying the last event of a forward changes nothing.
        let late_free_is_last_event = match drift {
            Drift::LateFree(n) => events.iter().rposition(|&f| f) == Some(events.len() - 1)
                && frees == n + 1,
            _ => false,
        };
        if !matches!(drift, Drift::None) && !late_free_is_last_event {
            prop_assert!(divergences >= 1, "{:?} not noticed", drift);
        }
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Minimal failing sequences are saved here and replayed first.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/memory_pools.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// A fixed sequence exercising small, large, split, unsplit and coalesced blocks.
fn scripted_sequence(pool: &CachingPool, backing: &Backing) -> Vec<Block> {
    let sizes = [
        100,
        3 * MIB,
        12 * MIB,
        600 << 10,
        3 * MIB - 7,
        11 * MIB + 1,
        4096,
        5 * MIB,
    ];
    let mut blocks: Vec<Block> = sizes
        .iter()
        .map(|&n| {
            pool.allocate(backing, n, 256, "scripted")
                .expect("allocation")
        })
        .collect();
    for i in [1, 5, 6] {
        pool.release(&blocks[i]);
    }
    blocks = blocks
        .into_iter()
        .enumerate()
        .filter(|(i, _)| ![1, 5, 6].contains(i))
        .map(|(_, b)| b)
        .collect();
    blocks.push(
        pool.allocate(backing, 2 * MIB, 256, "scripted")
            .expect("allocation"),
    );
    blocks
}

/// Bytes of wgpu's allocations for the device buffers of `pool` (by label).
fn reported_bytes(report: &wgpu::AllocatorReport, pool: &CachingPool) -> (usize, u64) {
    let prefix = pool.buffer_label_prefix();
    let ours: Vec<_> = report
        .allocations
        .iter()
        .filter(|a| a.name.starts_with(&prefix))
        .collect();
    (ours.len(), ours.iter().map(|a| a.size).sum())
}

#[test]
fn caching_pool_on_the_device_matches_wgpu_and_virtual() {
    let ctx = wgvae::testing::test_context();
    let device = ctx.device();
    let backing = Backing::Device(device);
    let pool = CachingPool::new();
    let blocks = scripted_sequence(&pool, &backing);
    let snap = pool.snapshot();
    for b in &blocks {
        let buffer = b.buffer.as_ref().expect("device backing creates buffers");
        let seg = snap.segments.iter().find(|s| s.id == b.segment).unwrap();
        assert_eq!(
            buffer.size(),
            seg.size,
            "a segment is one buffer of its size"
        );
    }

    // A dry run replays the same sequence into the same layout and stats.
    let virtual_pool = CachingPool::new();
    let virtual_blocks = scripted_sequence(
        &virtual_pool,
        &Backing::Virtual {
            max_buffer_size: backing.max_buffer_size(),
        },
    );
    assert_eq!(
        virtual_pool.snapshot(),
        snap,
        "virtual and device pools diverge"
    );
    assert!(virtual_blocks.iter().all(|b| b.buffer.is_none()));

    let reserved = pool.stats().reserved_bytes.current;
    match device.generate_allocator_report() {
        Some(report) => {
            let (count, bytes) = reported_bytes(&report, &pool);
            for a in &report.allocations {
                if a.name.starts_with(&pool.buffer_label_prefix()) {
                    println!("  wgpu allocation {:?}: {} bytes", a.name, a.size);
                }
            }
            println!(
                "wgpu allocator report: our {count} buffers take {bytes} bytes; pool reserved {reserved} bytes in {} segments (device total reserved {})",
                snap.segments.len(),
                report.total_reserved_bytes
            );
            assert_eq!(count, snap.segments.len(), "one wgpu allocation per segment");
            // The driver may pad an allocation to its memory alignment.
            assert!(
                bytes >= reserved && bytes - reserved <= count as u64 * 64 * 1024,
                "wgpu reports {bytes} bytes for our buffers, we count {reserved}"
            );
            assert!(report.total_reserved_bytes >= reserved);
        }
        None => println!(
            "SKIPPED wgpu allocator comparison: generate_allocator_report() returned None on this backend ({:?})",
            ctx.caps().backend
        ),
    }

    for b in &blocks {
        pool.release(b);
    }
    pool.empty_cache();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    drop(blocks);
    ctx.wait_idle().unwrap();
    if let Some(report) = device.generate_allocator_report() {
        assert_eq!(
            reported_bytes(&report, &pool),
            (0, 0),
            "empty_cache must give the buffers back to the device"
        );
    }
}

#[test]
fn caching_pool_blocks_are_bindable_at_their_offsets() {
    let base = wgvae::testing::test_context();
    let pool = Arc::new(CachingPool::new());
    let ctx = base.with_pool(pool.clone());
    let shape = [3, 7, 5];
    let n = 3 * 7 * 5;
    let xs = wgvae::testing::rand_vec(n, 1, 1.0);
    let ys = wgvae::testing::rand_vec(n, 2, 1.0);
    let x = Tensor::from_f32(&ctx, &shape, &xs, "x").unwrap();
    let y = Tensor::from_f32(&ctx, &shape, &ys, "y").unwrap();
    let out = Tensor::empty(&ctx, &shape, wgvae::DType::F32, "out").unwrap();
    // Three tensors in one small segment, at non-zero offsets.
    assert_eq!(x.block().segment, out.block().segment);
    assert_eq!(
        (x.block().offset, y.block().offset, out.block().offset),
        (0, 512, 1024)
    );
    let mut rec = wgvae::gpu::Recorder::new(&ctx);
    wgvae::kernels::elementwise::add(&mut rec, &x, &y, &out).unwrap();
    rec.submit().unwrap();
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a + b).collect();
    wgvae::testing::assert_close(&out.to_f32(&ctx).unwrap(), &want, 0.0, 1e-6, "x + y");
    assert_eq!(x.to_f32(&ctx).unwrap(), xs, "neighbouring blocks untouched");

    // A tensor-sized pattern written into a large block and read back.
    let big = Tensor::empty(&ctx, &[3 * (1 << 18)], wgvae::DType::F32, "big").unwrap();
    let pattern: Vec<u8> = (0..big.byte_size()).map(|i| (i * 7 % 251) as u8).collect();
    big.write_bytes(&ctx, &pattern);
    assert_eq!(big.to_bytes(&ctx).unwrap(), pattern);
    drop((x, y, out, big));
    assert_eq!(pool.stats().allocated_bytes.current, 0);
    assert!(
        pool.stats().reserved_bytes.current > 0,
        "cached after the tensors drop"
    );
}

#[test]
fn allocation_over_the_device_limit_is_a_clear_error() {
    let ctx = wgvae::testing::test_context();
    let backing = Backing::Device(ctx.device());
    let limit = backing.max_buffer_size();
    let pools: [Box<dyn MemoryPool>; 2] =
        [Box::new(CachingPool::new()), Box::new(ExactPool::new())];
    for pool in pools {
        let err = pool
            .allocate(&backing, limit + 1, 256, "oversized activation")
            .expect_err("over the limit");
        let msg = err.to_string();
        assert!(
            matches!(&err, Error::BufferTooLarge { what, limit: l, .. } if what == "oversized activation" && *l == limit),
            "{}: {msg}",
            pool.policy_name()
        );
        assert!(
            msg.contains("oversized activation") && msg.contains(&limit.to_string()),
            "{msg}"
        );
        assert_eq!(pool.stats().reserved_bytes.current, 0);
    }
}
