use super::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const VIRTUAL: Backing<'static> = Backing::Virtual {
    max_buffer_size: 1 << 30,
};

fn alloc(pool: &CachingPool, bytes: u64) -> Block {
    pool.allocate(&VIRTUAL, bytes, 256, "test")
        .expect("allocation")
}

/// (offset, size, allocated) of every block of segment `id`.
fn layout(pool: &CachingPool, id: u64) -> Vec<(u64, u64, bool)> {
    let snap = pool.snapshot();
    let seg = snap.segments.iter().find(|s| s.id == id).expect("segment");
    seg.blocks
        .iter()
        .map(|b| (b.offset, b.size, b.allocated))
        .collect()
}

#[test]
fn size_rules() {
    assert_eq!(block_size_for(0), 512);
    assert_eq!(block_size_for(1), 512);
    assert_eq!(block_size_for(512), 512);
    assert_eq!(block_size_for(513), 1024);
    assert_eq!(pool_for(MIB), SegmentPool::Small);
    assert_eq!(pool_for(MIB + 512), SegmentPool::Large);
    assert_eq!(segment_size_for(512), 2 * MIB);
    assert_eq!(segment_size_for(MIB + 512), 20 * MIB);
    assert_eq!(segment_size_for(10 * MIB - 512), 20 * MIB);
    assert_eq!(segment_size_for(10 * MIB), 10 * MIB);
    assert_eq!(segment_size_for(11 * MIB + 512), 12 * MIB);
    assert!(should_split(SegmentPool::Small, 1024, 512));
    assert!(!should_split(SegmentPool::Small, 1024, 1024));
    assert!(!should_split(SegmentPool::Large, 3 * MIB, 2 * MIB));
    assert!(should_split(SegmentPool::Large, 3 * MIB + 512, 2 * MIB));
}

#[test]
fn small_request_gets_512_bytes_of_a_2mib_segment() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 100);
    assert_eq!((a.offset, a.size, a.requested), (0, 512, 100));
    assert!(a.buffer.is_none(), "virtual backing creates no buffer");
    let b = alloc(&pool, 0);
    assert_eq!((b.segment, b.offset, b.size), (a.segment, 512, 512));
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.current, 2 * MIB);
    assert_eq!(s.allocated_bytes.current, 1024);
    assert_eq!(s.active_bytes.current, 1024);
    assert_eq!(s.requested_bytes.current, 100);
    assert_eq!(s.inactive_split_bytes.current, 2 * MIB - 1024);
    assert_eq!((s.allocation.current, s.segment.current), (2, 1));
    assert_eq!((s.num_allocs, s.num_device_alloc), (2, 1));
    let snap = pool.snapshot();
    assert_eq!(snap.segments[0].pool, SegmentPool::Small);
    assert_eq!(
        layout(&pool, a.segment),
        vec![
            (0, 512, true),
            (512, 512, true),
            (1024, 2 * MIB - 1024, false)
        ]
    );
}

#[test]
fn three_mib_splits_a_20mib_large_segment() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 3 * MIB);
    let b = alloc(&pool, 3 * MIB - 100);
    assert_eq!((a.offset, a.size), (0, 3 * MIB));
    assert_eq!((b.segment, b.offset, b.size), (a.segment, 3 * MIB, 3 * MIB));
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.current, 20 * MIB);
    assert_eq!(s.inactive_split_bytes.current, 14 * MIB);
    assert_eq!(pool.snapshot().segments[0].pool, SegmentPool::Large);
}

#[test]
fn twelve_mib_gets_a_segment_of_its_own() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 12 * MIB);
    assert_eq!((a.offset, a.size), (0, 12 * MIB));
    // 11 MiB + 1 B: segment rounded to 12 MiB; the remainder (1 MiB - 512)
    // is not > 1 MiB, so the whole segment is handed out.
    let b = alloc(&pool, 11 * MIB + 1);
    assert_ne!(a.segment, b.segment);
    assert_eq!((b.size, b.requested), (12 * MIB, 11 * MIB + 1));
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.current, 24 * MIB);
    assert_eq!(s.allocated_bytes.current, 24 * MIB);
    assert_eq!(s.requested_bytes.current, 23 * MIB + 1);
    assert_eq!(s.inactive_split_bytes.current, 0);
}

#[test]
fn large_remainder_of_at_most_1mib_is_not_split() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 3 * MIB);
    // The cached 17 MiB block serves 16 MiB; 1 MiB left: handed out whole.
    let b = alloc(&pool, 16 * MIB);
    assert_eq!(
        (b.segment, b.offset, b.size),
        (a.segment, 3 * MIB, 17 * MIB)
    );
    assert_eq!(pool.stats().allocated_bytes.current, 20 * MIB);
    assert_eq!(pool.stats().requested_bytes.current, 19 * MIB);
    pool.release(&b);
    // 1 MiB + 512 left: split.
    let c = alloc(&pool, 16 * MIB - 512);
    assert_eq!(c.size, 16 * MIB - 512);
    assert_eq!(
        layout(&pool, a.segment),
        vec![
            (0, 3 * MIB, true),
            (3 * MIB, 16 * MIB - 512, true),
            (19 * MIB - 512, MIB + 512, false)
        ]
    );
    assert_eq!(pool.stats().segment.current, 1);
}

#[test]
fn small_remainder_of_512_is_split() {
    let pool = CachingPool::new();
    let a = alloc(&pool, MIB);
    let b = alloc(&pool, MIB - 512);
    let c = alloc(&pool, 1);
    assert_eq!((b.offset, b.size), (MIB, MIB - 512));
    assert_eq!(
        (c.segment, c.offset, c.size),
        (a.segment, 2 * MIB - 512, 512)
    );
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB);
    assert_eq!(pool.stats().inactive_split_bytes.current, 0);
}

#[test]
fn best_fit_takes_the_smallest_free_block_then_lowest_offset() {
    let pool = CachingPool::new();
    let blocks: Vec<Block> = [4 * KIB, 512, KIB, 512, KIB, 512]
        .iter()
        .map(|&n| alloc(&pool, n))
        .collect();
    for i in [0, 2, 4] {
        pool.release(&blocks[i]);
    }
    // Free: 4 KiB at 0, 1 KiB at 4.5 KiB, 1 KiB at 6 KiB, the tail.
    let x = alloc(&pool, 1000);
    assert_eq!((x.offset, x.size), (blocks[2].offset, KIB));
    let y = alloc(&pool, 600);
    assert_eq!((y.offset, y.size), (blocks[4].offset, KIB));
    let z = alloc(&pool, 2 * KIB);
    assert_eq!((z.offset, z.size), (0, 2 * KIB));
}

#[test]
fn pools_do_not_share_blocks() {
    let pool = CachingPool::new();
    let small = alloc(&pool, 512);
    pool.release(&small);
    // 2 MiB of cached small-pool memory cannot serve a large request...
    let large = alloc(&pool, MIB + 1);
    assert_ne!(large.segment, small.segment);
    pool.release(&large);
    // ...and cached large-pool memory cannot serve a small one.
    let small2 = alloc(&pool, 100);
    assert_eq!(small2.segment, small.segment);
    assert_eq!(pool.stats().reserved_bytes.current, 22 * MIB);
}

#[test]
fn free_blocks_coalesce_with_free_neighbours() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 512);
    let b = alloc(&pool, 1024);
    let c = alloc(&pool, 512);
    let d = alloc(&pool, 512);
    pool.release(&a);
    pool.release(&c);
    assert_eq!(
        layout(&pool, a.segment),
        vec![
            (0, 512, false),
            (512, 1024, true),
            (1536, 512, false),
            (2048, 512, true),
            (2560, 2 * MIB - 2560, false)
        ]
    );
    pool.release(&b);
    assert_eq!(
        layout(&pool, a.segment),
        vec![
            (0, 2048, false),
            (2048, 512, true),
            (2560, 2 * MIB - 2560, false)
        ]
    );
    assert_eq!(pool.stats().inactive_split_bytes.current, 2 * MIB - 512);
    pool.release(&d);
    assert_eq!(layout(&pool, a.segment), vec![(0, 2 * MIB, false)]);
    let s = pool.stats();
    assert_eq!(s.inactive_split_bytes.current, 0);
    assert_eq!(s.allocated_bytes.current, 0);
    assert_eq!(s.reserved_bytes.current, 2 * MIB, "cached, not freed");
    assert_eq!(s.num_device_free, 0);
    // The coalesced segment serves a request of its whole size.
    let e = alloc(&pool, MIB);
    assert_eq!((e.segment, e.offset), (a.segment, 0));
}

#[test]
fn empty_cache_frees_only_entirely_free_segments() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 512);
    let c = alloc(&pool, 12 * MIB);
    let b = alloc(&pool, 3 * MIB);
    pool.release(&a);
    pool.release(&c);
    // Best fit: the free 12 MiB segment, not the 17 MiB rest of b's.
    let d = alloc(&pool, 3 * MIB);
    assert_eq!((d.segment, d.offset), (c.segment, 0));
    pool.release(&b);
    pool.empty_cache();
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.current, 12 * MIB);
    assert_eq!(
        (s.segment.current, s.num_device_alloc, s.num_device_free),
        (1, 3, 2)
    );
    assert_eq!(s.reserved_bytes.peak, 34 * MIB);
    pool.release(&d);
    pool.empty_cache();
    let s = pool.stats();
    assert_eq!((s.reserved_bytes.current, s.segment.current), (0, 0));
    assert!(pool.snapshot().segments.is_empty());
}

#[test]
fn capacity_failure_frees_the_cache_and_retries_once() {
    let pool = CachingPool::with_capacity(20 * MIB);
    let a = alloc(&pool, 3 * MIB);
    pool.release(&a);
    // A small segment does not fit beside the cached 20 MiB one: the
    // cache is freed and the retry succeeds.
    let b = alloc(&pool, 512);
    let s = pool.stats();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (1, 0));
    assert_eq!((s.reserved_bytes.current, s.num_device_free), (2 * MIB, 1));
    // Nothing cached can be freed now: the retry fails too.
    let err = pool
        .allocate(&VIRTUAL, 19 * MIB, 256, "big activation")
        .expect_err("over capacity");
    let msg = err.to_string();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
    assert!(
        msg.contains("big activation") && msg.contains("capacity"),
        "{msg}"
    );
    let s = pool.stats();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (2, 1));
    assert_eq!(
        (s.reserved_bytes.current, s.allocated_bytes.current),
        (2 * MIB, 512)
    );
    pool.release(&b);
    // Exactly at capacity is allowed (2 MiB cached + 18 MiB).
    let c = alloc(&pool, 18 * MIB);
    let s = pool.stats();
    assert_eq!(
        (s.reserved_bytes.current, s.num_alloc_retries),
        (20 * MIB, 2)
    );
    pool.release(&c);
}

#[test]
fn buffer_limit_caps_segments_and_rejects_larger_requests() {
    let backing = Backing::Virtual {
        max_buffer_size: 4 * MIB,
    };
    let pool = CachingPool::new();
    // The 20 MiB segment a 3 MiB request would get shrinks to the limit.
    let a = pool.allocate(&backing, 3 * MIB, 4, "a").unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 4 * MIB);
    let err = pool
        .allocate(&backing, 4 * MIB + 1, 4, "huge tensor")
        .expect_err("over the buffer limit");
    assert!(
        matches!(&err, Error::BufferTooLarge { what, bytes, limit }
            if what == "huge tensor" && *bytes == 4 * MIB + 512 && *limit == 4 * MIB),
        "{err}"
    );
    // Not an out-of-memory: no retry could help.
    let s = pool.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.segment.current),
        (0, 0, 1)
    );
    pool.release(&a);
}

#[test]
fn alignment_up_to_512_is_honoured_and_larger_is_an_error() {
    let pool = CachingPool::new();
    for align in [0, 1, 4, 64, 256, 512] {
        let b = pool.allocate(&VIRTUAL, 100, align, "t").unwrap();
        assert_eq!(b.offset % align.max(1), 0);
    }
    for align in [1024, 3, 768] {
        let err = pool
            .allocate(&VIRTUAL, 100, align, "t")
            .expect_err("bad align");
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
    }
    assert_eq!(pool.stats().num_allocs, 6);
}

#[test]
fn peaks_follow_currents_and_reset() {
    let pool = CachingPool::new();
    let a = alloc(&pool, 3 * MIB);
    let b = alloc(&pool, 3 * MIB);
    pool.release(&a);
    pool.release(&b);
    let s = pool.stats();
    assert_eq!(
        (s.allocated_bytes.current, s.allocated_bytes.peak),
        (0, 6 * MIB)
    );
    assert_eq!(s.inactive_split_bytes.peak, 17 * MIB);
    assert_eq!(s.allocation.peak, 2);
    pool.reset_peak_stats();
    let s = pool.stats();
    assert_eq!(s.allocated_bytes.peak, 0);
    assert_eq!(s.reserved_bytes.peak, 20 * MIB);
    assert_eq!(s.inactive_split_bytes.peak, 0);
}

#[test]
fn snapshot_serializes_to_json() {
    let pool = CachingPool::new();
    let _a = alloc(&pool, 100);
    let json: serde_json::Value = serde_json::from_str(&pool.snapshot().to_json()).unwrap();
    assert_eq!(json["policy"], "caching");
    assert_eq!(json["stats"]["reserved_bytes"]["current"], 2 * MIB);
    let seg = &json["segments"][0];
    assert_eq!(seg["pool"], "small");
    assert_eq!(seg["size"], 2 * MIB);
    assert_eq!(seg["blocks"][0]["requested"], 100);
    assert_eq!(seg["blocks"][0]["allocated"], true);
    assert_eq!(seg["blocks"][1]["allocated"], false);
}

#[test]
fn pool_is_send_and_sync_and_usable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CachingPool>();
    let pool = std::sync::Arc::new(CachingPool::new());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let b = alloc(&pool, (i * 997 + t * 31) % (3 * MIB));
                    pool.release(&b);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!((s.allocated_bytes.current, s.allocation.current), (0, 0));
    assert_eq!(s.num_allocs, 800);
}
