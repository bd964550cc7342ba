use super::*;
use crate::sim::{SimCall, SimDevice, SimulatedBackend};
use crate::stats::Stats;

const MIB: usize = 1 << 20;
const S0: StreamKey = StreamKey(10);
const S1: StreamKey = StreamKey(11);
const S2: StreamKey = StreamKey(12);
const D0: DeviceId = DeviceId(0);

fn vm_pool(capacity: usize, page: usize) -> MemoryPool<SimulatedBackend> {
    MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: capacity as u64,
        granularity: Some(page as u64),
    }]))
    .expect("pool")
}

/// A pool that never steals ([`PoolConfig::steal_before_growing`] off): cross-stream reuse
/// only after completed fences.
fn vm_pool_no_steal(capacity: usize, page: usize) -> MemoryPool<SimulatedBackend> {
    let config = PoolConfig {
        steal_before_growing: false,
        ..PoolConfig::default()
    };
    MemoryPool::with_config(
        SimulatedBackend::new(vec![SimDevice {
            total_memory: capacity as u64,
            granularity: Some(page as u64),
        }]),
        config,
    )
    .expect("pool")
}

fn plain_pool(capacity: usize) -> MemoryPool<SimulatedBackend> {
    MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: capacity as u64,
        granularity: None,
    }]))
    .expect("pool")
}

#[test]
fn pool_and_handles_are_send_and_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<MemoryPool<SimulatedBackend>>();
    sync::<MemoryPool<SimulatedBackend>>();
    send::<Allocation<'static, SimulatedBackend>>();
    send::<RawAllocation>();
}

#[test]
fn size_zero_touches_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 0).unwrap();
    assert!(a.is_empty());
    assert!(a.ptr().is_null());
    assert_eq!(pool.backend().calls(), crate::sim::SimCalls::default());
    assert_eq!(pool.stats(D0).unwrap().allocations, 0);
    a.free().unwrap();
    assert_eq!(pool.stats(D0).unwrap().frees, 0);
    // Even on a device that does not exist, as CuPy's empty pointer does not care.
    assert!(pool.malloc(DeviceId(9), &S0, 0).unwrap().is_empty());
}

#[test]
fn bad_input_is_an_error() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    assert!(matches!(
        pool.malloc(DeviceId(1), &S0, 1),
        Err(PoolError::InvalidDevice {
            device: DeviceId(1),
            count: 1
        })
    ));
    assert!(matches!(
        pool.malloc(D0, &S0, usize::MAX),
        Err(PoolError::SizeOverflow { size: usize::MAX })
    ));
    assert!(matches!(
        pool.set_limit(D0, Limit::Fraction(1.5)),
        Err(PoolError::InvalidLimit(_))
    ));
    assert_eq!(pool.get_limit(D0).unwrap(), None);
}

#[test]
fn sizes_are_rounded_to_512_bytes() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 1).unwrap();
    assert_eq!(pool.used_bytes(), 512);
    let b = pool.malloc(D0, &S0, 513).unwrap();
    assert_eq!(pool.used_bytes(), 512 + 1024);
    assert_eq!(b.ptr().0, a.ptr().0 + 512, "small blocks are packed");
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.requested.current, 514);
    assert_eq!(st.active_blocks.current, 2);
}

#[test]
fn split_and_coalesce() {
    let pool = plain_pool(64 * MIB);
    let a = pool.malloc(D0, &S0, 1000).unwrap();
    let b = pool.malloc(D0, &S0, 1000).unwrap();
    let c = pool.malloc(D0, &S0, 1000).unwrap();
    let base = a.ptr().0;
    assert_eq!(b.ptr().0, base + 1024);
    assert_eq!(c.ptr().0, base + 2048);
    // One 2 MiB segment: the remainder after c is the only free block.
    assert_eq!(pool.total_bytes(), 2 * MIB);
    assert_eq!(pool.n_free_blocks(), 1);
    drop(b);
    assert_eq!(pool.n_free_blocks(), 2, "b sits between two live blocks");
    drop(a);
    assert_eq!(pool.n_free_blocks(), 2, "a and b merge");
    drop(c);
    assert_eq!(
        pool.n_free_blocks(),
        1,
        "the whole segment is one block again"
    );
    let d = pool.malloc(D0, &S0, 3 * 1024).unwrap();
    assert_eq!(
        d.ptr().0,
        base,
        "the merged block serves a request for all three"
    );
    assert_eq!(pool.backend().calls().allocate, 1);
}

#[test]
fn best_fit_takes_the_smallest_fitting_block() {
    let pool = plain_pool(64 * MIB);
    let x1 = pool.malloc(D0, &S0, 3072).unwrap();
    let _s1 = pool.malloc(D0, &S0, 512).unwrap();
    let x2 = pool.malloc(D0, &S0, 1024).unwrap();
    let _s2 = pool.malloc(D0, &S0, 512).unwrap();
    let x3 = pool.malloc(D0, &S0, 2048).unwrap();
    let _s3 = pool.malloc(D0, &S0, 512).unwrap();
    let (p1, p2, p3) = (x1.ptr(), x2.ptr(), x3.ptr());
    drop(x1);
    drop(x2);
    drop(x3);
    // Holes of 3072, 1024 and 2048 bytes, and the segment's tail.
    let y = pool.malloc(D0, &S0, 1500).unwrap();
    assert_eq!(y.ptr(), p3, "1536 bytes go into the 2048-byte hole");
    let z = pool.malloc(D0, &S0, 1024).unwrap();
    assert_eq!(z.ptr(), p2, "an exact fit wins");
    let w = pool.malloc(D0, &S0, 2560).unwrap();
    assert_eq!(
        w.ptr(),
        p1,
        "only the 3072-byte hole is left below the tail"
    );
}

#[test]
fn split_remainder_of_a_large_hole_stays_free() {
    let pool = plain_pool(64 * MIB);
    let a = pool.malloc(D0, &S0, 4096).unwrap();
    let _guard = pool.malloc(D0, &S0, 512).unwrap();
    let p = a.ptr().0;
    drop(a);
    let b = pool.malloc(D0, &S0, 1024).unwrap();
    assert_eq!(b.ptr().0, p);
    let c = pool.malloc(D0, &S0, 3072).unwrap();
    assert_eq!(
        c.ptr().0,
        p + 1024,
        "the 3072-byte remainder was kept as a block"
    );
}

#[test]
fn small_and_large_blocks_use_separate_segments() {
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let small = pool.malloc(D0, &S0, 4096).unwrap();
    let large = pool.malloc(D0, &S0, 3 * MIB).unwrap();
    let distance = small.ptr().0.abs_diff(large.ptr().0);
    assert!(
        distance >= policy::SMALL_ADDRESS_RANGE,
        "different address ranges"
    );
    // 1 page for the small block, 2 for the large one.
    assert_eq!(pool.total_bytes(), 3 * 2 * MIB);
}

#[test]
fn same_stream_reuse_is_immediate_and_calls_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.submit_work(D0, S0);
    let a = pool.malloc(D0, &S0, 5 * MIB).unwrap();
    let p = a.ptr();
    sim.submit_work(D0, S0);
    drop(a);
    let calls = sim.calls();
    let b = pool.malloc(D0, &S0, 5 * MIB).unwrap();
    assert_eq!(b.ptr(), p);
    assert_eq!(sim.calls(), calls, "no backend call, no fence, no wait");
    assert_eq!(sim.completed(D0, S0), 0, "nothing waited for the stream");
}

#[test]
fn other_streams_get_memory_only_after_the_fence() {
    let pool = vm_pool_no_steal(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let a_page = sim.translate(D0, a.ptr().0).unwrap().0;
    sim.submit_work(D0, S0); // a kernel on S0 uses `a`
    drop(a);
    assert_eq!(pool.total_bytes(), 8 * MIB);

    // S0's work is pending: S1 must not get those pages, so new ones are created.
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_ne!(sim.translate(D0, b.ptr().0).unwrap().0, a_page);
    assert_eq!(pool.total_bytes(), 16 * MIB);
    assert_eq!(sim.completed(D0, S0), 0, "no host wait");

    // Once S0's work completes, its pages move to S1 instead of growing the pool.
    sim.complete_stream(D0, S0);
    let c = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_eq!(pool.total_bytes(), 16 * MIB);
    let c_pages: Vec<u64> = (0..4)
        .map(|i| {
            sim.translate(D0, c.ptr().0 + (i * 2 * MIB) as u64)
                .unwrap()
                .0
        })
        .collect();
    assert!(c_pages.contains(&a_page), "S0's pages were remapped for S1");
    drop((b, c));
}

#[test]
fn out_of_memory_waits_for_fences_before_failing() {
    let pool = vm_pool_no_steal(8 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(a);
    // The device is full and S0's work pending: the pool waits for S0, then remaps.
    let b = pool.malloc(D0, &S1, 6 * MIB).unwrap();
    assert_eq!(sim.completed(D0, S0), 1, "the pool waited on the host");
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.retries, 1);
    assert_eq!(st.ooms, 0);
    assert_eq!(st.reserved.current, (8 * MIB) as u64);
    drop(b);
}

#[test]
fn out_of_memory_error_carries_the_figures_and_the_pool_keeps_working() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Bytes(8 * MIB)).unwrap();
    let a = pool.malloc(D0, &S0, 6 * MIB).unwrap();
    match pool.malloc(D0, &S0, 4 * MIB) {
        Err(PoolError::OutOfMemory {
            device,
            requested,
            used,
            reserved,
            limit,
            cause,
        }) => {
            assert_eq!(cause, crate::OomCause::Limit);
            assert_eq!(device, D0);
            assert_eq!(requested, 4 * MIB);
            assert_eq!(used, 6 * MIB);
            assert!(reserved <= 8 * MIB);
            assert_eq!(limit, Some(8 * MIB));
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.ooms, 1);
    assert_eq!(st.oom_causes.limit, 1);
    assert_eq!(st.oom_causes.total(), st.ooms);
    assert_eq!(st.last_oom, Some(crate::OomCause::Limit));
    assert!(st.reserved.peak <= (8 * MIB) as u64);
    let b = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    assert_eq!(pool.used_bytes(), 8 * MIB);
    drop((a, b));
}

#[test]
fn limit_below_usage_is_an_error_that_changes_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Bytes(32 * MIB)).unwrap();
    let a = pool.malloc(D0, &S0, 3 * MIB).unwrap(); // touches 2 pages
    let b = pool.malloc(D0, &S0, 4 * MIB).unwrap();
    drop(b);
    let before = pool.total_bytes();
    match pool.set_limit(D0, Limit::Bytes(3 * MIB)) {
        Err(PoolError::LimitBelowUsage {
            limit,
            used,
            in_use,
            ..
        }) => {
            assert_eq!(limit, 3 * MIB);
            assert_eq!(used, 3 * MIB);
            assert_eq!(in_use, 4 * MIB);
        }
        other => panic!("expected LimitBelowUsage, got {other:?}"),
    }
    assert_eq!(pool.get_limit(D0).unwrap(), Some(32 * MIB));
    assert_eq!(pool.total_bytes(), before);
    // A limit between what is in use and what is held releases the cache.
    pool.set_limit(D0, Limit::Bytes(5 * MIB)).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), Some(5 * MIB));
    assert_eq!(pool.total_bytes(), 4 * MIB);
    assert_eq!(pool.backend().physical_bytes(D0), (4 * MIB) as u64);
    drop(a);
}

#[test]
fn limits_by_fraction_and_from_text() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Fraction(0.25)).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), Some(16 * MIB));
    pool.set_limit(D0, Limit::Unlimited).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), None);
    assert_eq!(Limit::parse("50%").unwrap(), Limit::Fraction(0.5));
    assert_eq!(Limit::parse(" 1024 ").unwrap(), Limit::Bytes(1024));
    assert_eq!(Limit::parse("none").unwrap(), Limit::Unlimited);
    assert!(Limit::parse("lots").is_err());
    let config = PoolConfig {
        limit: Limit::Fraction(0.5),
        ..PoolConfig::default()
    };
    let pool = MemoryPool::with_config(SimulatedBackend::h200(2), config).unwrap();
    let half = crate::sim::H200_TOTAL_MEMORY / 2;
    assert_eq!(pool.get_limit(DeviceId(1)).unwrap(), Some(half as usize));
}

#[test]
fn free_all_blocks_returns_free_pages_inside_segments() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 3 * MIB / 2).unwrap(); // [0, 1.5) MiB: page 0
    let b = pool.malloc(D0, &S0, 5 * MIB).unwrap(); // [1.5, 6.5) MiB: pages 0-3
    let c = pool.malloc(D0, &S0, 3 * MIB / 2).unwrap(); // [6.5, 8) MiB: page 3
    assert_eq!(b.ptr().0, a.ptr().0 + (3 * MIB / 2) as u64);
    assert_eq!(c.ptr().0, b.ptr().0 + (5 * MIB) as u64);
    assert_eq!(pool.total_bytes(), 8 * MIB);
    sim.submit_work(D0, S0);
    drop(b);
    pool.free_all_blocks().unwrap();
    // Pages 1 and 2 ([2, 6) MiB) lie wholly in b's free range and were returned;
    // pages 0 and 3 stay, shared by a and c with b's free range.
    assert_eq!(pool.total_bytes(), 4 * MIB);
    assert_eq!(sim.physical_bytes(D0), (4 * MIB) as u64);
    assert_eq!(sim.mapped_pages(D0), 2);
    assert_eq!(
        sim.completed(D0, S0),
        1,
        "free_all_blocks waits for the stream"
    );
    drop((a, c));
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(sim.physical_bytes(D0), 0);
    assert_eq!(
        sim.reserved_address_space(D0),
        0,
        "wholly free ranges are released"
    );
    assert_eq!(pool.n_free_blocks(), 0);
}

#[test]
fn a_request_goes_where_pages_are_still_mapped_inside_a_free_range() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let p = pool.malloc(D0, &S0, 4 * MIB).unwrap(); // pages 0-1
    let q = pool.malloc(D0, &S0, 4 * MIB).unwrap(); // pages 2-3
    let q_ptr = q.ptr();
    sim.submit_work(D0, S0);
    drop(p);
    pool.free_all_blocks().unwrap(); // pages 0-1 unmapped and released
    assert_eq!(sim.mapped_pages(D0), 2);
    drop(q);
    // One free range over the whole segment, mapped only at pages 2-3: both of its ends
    // would need pages, its middle needs none.
    let calls = sim.calls();
    let r = pool.malloc(D0, &S0, 3 * MIB).unwrap();
    assert_eq!(r.ptr(), q_ptr, "placed on the mapped pages");
    assert_eq!(sim.calls().map, calls.map, "nothing mapped");
    assert_eq!(sim.calls().create_physical, calls.create_physical);
    assert_eq!(pool.total_bytes(), 4 * MIB);
    // A request that no mapped run can hold still gets pages, and moves none: the free
    // pages under `r`'s range are not free.
    let big = pool.malloc(D0, &S0, 6 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 0);
    assert_eq!(pool.total_bytes(), 4 * MIB + 6 * MIB);
    drop((r, big));
}

#[test]
fn pages_move_from_the_smallest_mapped_runs_first() {
    // No stealing: the other stream's request must move pages.
    let pool = vm_pool_no_steal(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    // Live blocks separate a one-page run (page 1) and a three-page run (pages 5-7).
    let a = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 0
    let one = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 1
    let b = pool.malloc(D0, &S0, 6 * MIB).unwrap(); // pages 2-4
    let three = pool.malloc(D0, &S0, 6 * MIB).unwrap(); // pages 5-7
    let c = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 8
    let three_ptr = three.ptr();
    drop((one, three));
    sim.complete_all();
    // Another stream needs one page: it takes the lone page, not one of the run that
    // can still serve a 6 MiB request whole.
    let other = pool.malloc(D0, &S1, 2 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 1);
    let maps = sim.calls().map;
    let again = pool.malloc(D0, &S0, 6 * MIB).unwrap();
    assert_eq!(again.ptr(), three_ptr);
    assert_eq!(sim.calls().map, maps, "the three-page run is intact");
    drop((a, b, c, other, again));
}

#[test]
fn pages_are_created_rather_than_moved_within_the_slack_above_the_live_peak() {
    let pool = vm_pool_no_steal(1 << 30, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 64 * MIB).unwrap(); // the live peak: 64 MiB
    drop(a);
    sim.complete_all(); // its 32 pages are free and fenced: they could move
                        // 1/16 of the live peak: 4 MiB.
    let slack = 64 * MIB / policy::MOVE_SLACK as usize;
    // Another stream needs a page: the pool holds 64 MiB, 66 MiB is within the budget of
    // 64 + 4 MiB, so a new page is created and nothing moves.
    let b = pool.malloc(D0, &S1, 2 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 0);
    assert_eq!(pool.total_bytes(), 66 * MIB);
    // Two more pages would make 70 MiB, beyond 64 + 4: they are taken from the free pages.
    assert!(66 * MIB + 4 * MIB > 64 * MIB + slack);
    let c = pool.malloc(D0, &S1, 4 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 2);
    assert_eq!(pool.total_bytes(), 66 * MIB);
    drop((b, c));
}

#[test]
fn a_limit_turns_the_move_slack_off() {
    for limit_after_peak in [false, true] {
        let pool = vm_pool_no_steal(1 << 30, 2 * MIB);
        let sim = pool.backend();
        if !limit_after_peak {
            pool.set_limit(D0, Limit::Bytes(512 * MIB)).unwrap();
        }
        drop(pool.malloc(D0, &S0, 64 * MIB).unwrap());
        sim.complete_all();
        if limit_after_peak {
            pool.set_limit(D0, Limit::Bytes(100 * MIB)).unwrap();
        }
        let b = pool.malloc(D0, &S1, 2 * MIB).unwrap();
        assert_eq!(
            pool.total_bytes(),
            64 * MIB,
            "limit set after the peak: {limit_after_peak}"
        );
        assert_eq!(pool.stats(D0).unwrap().pages_moved, 1);
        drop(b);
    }
}

#[test]
fn the_move_slack_restarts_after_free_all_blocks_and_ignores_failed_requests() {
    let pool = vm_pool_no_steal(128 * MIB, 2 * MIB);
    let sim = pool.backend();
    let live = pool.malloc(D0, &S0, 64 * MIB).unwrap();
    // Never served: it must not raise the live peak the slack is measured from.
    assert!(pool.malloc(D0, &S1, 96 * MIB).is_err());
    drop(live);
    sim.complete_all();
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
    // 8 MiB live at a time, on one stream after another: the pool follows what is live.
    for k in 0..12u64 {
        drop(pool.malloc(D0, &StreamKey(100 + k), 8 * MIB).unwrap());
        sim.complete_all();
    }
    assert!(
        pool.total_bytes() <= 8 * MIB + 8 * MIB / policy::MOVE_SLACK as usize + 2 * MIB,
        "holds {} MiB for 8 MiB live",
        pool.total_bytes() / MIB
    );
}

#[test]
fn on_a_full_device_the_move_slack_gives_its_pages_back_and_moves_instead() {
    let pool = vm_pool_no_steal(66 * MIB, 2 * MIB);
    let sim = pool.backend();
    drop(pool.malloc(D0, &S0, 64 * MIB).unwrap());
    sim.complete_all();
    // Two pages wanted, one left on the device: it is not kept, two pages move.
    let b = pool.malloc(D0, &S1, 4 * MIB).unwrap();
    assert_eq!(pool.total_bytes(), 64 * MIB);
    assert_eq!(sim.physical_bytes(D0), (64 * MIB) as u64);
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 2);
    assert_eq!(
        pool.stats(D0).unwrap().reserved.peak,
        (64 * MIB) as u64,
        "the moment leaves no peak"
    );
    // The device's last page is there for its other users.
    assert!(sim.allocate(D0, (2 * MIB) as u64).unwrap().is_some());
    drop(b);
}

#[test]
fn free_all_blocks_returns_free_plain_segments() {
    let pool = plain_pool(256 * MIB);
    let a = pool.malloc(D0, &S0, 512).unwrap();
    let b = pool.malloc(D0, &S0, 3 * MIB).unwrap();
    let c = pool.malloc(D0, &S1, 40 * MIB).unwrap();
    assert_eq!(pool.total_bytes(), 2 * MIB + 20 * MIB + 40 * MIB);
    drop((b, c));
    pool.free_all_free().unwrap();
    assert_eq!(pool.total_bytes(), 2 * MIB);
    assert_eq!(pool.backend().physical_bytes(D0), (2 * MIB) as u64);
    drop(a);
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn plain_mode_falls_back_to_an_exact_segment_under_the_limit() {
    let pool = plain_pool(256 * MIB);
    pool.set_limit(D0, Limit::Bytes(3 * MIB)).unwrap();
    // A 2.5 MiB request would normally get a 20 MiB segment.
    let a = pool.malloc(D0, &S0, 5 * MIB / 2).unwrap();
    assert_eq!(pool.total_bytes(), 5 * MIB / 2);
    drop(a);
}

#[test]
fn record_stream_delays_reuse_until_that_stream_is_done() {
    let pool = vm_pool_no_steal(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    let p = a.ptr();
    a.record_stream(&S2).unwrap();
    sim.submit_work(D0, S2); // S2 reads `a`
    a.free().unwrap();
    assert_eq!(
        pool.n_free_blocks(),
        1,
        "pending frees count as free blocks"
    );
    let b = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    assert_ne!(b.ptr(), p, "S2 may still read the block");
    sim.complete_stream(D0, S2);
    let c = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    assert_eq!(c.ptr(), p, "reused once S2's fence completed");
    drop((b, c));
}

#[test]
fn a_stream_steals_before_growing_by_waiting_on_the_device() {
    for page in [Some(2 * MIB as u64), None] {
        let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
            total_memory: (256 * MIB) as u64,
            granularity: page,
        }]))
        .unwrap();
        let sim = pool.backend();
        let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
        let p = a.ptr();
        let v0 = sim.submit_work(D0, S0); // a kernel on S0 uses `a`
        drop(a);
        let reserved = pool.total_bytes();

        // S1 takes S0's free memory instead of growing: it waits for S0 on the device.
        let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
        assert_eq!(b.ptr(), p, "S0's block lent to S1 ({page:?})");
        assert_eq!(pool.total_bytes(), reserved, "no growth ({page:?})");
        assert!(sim.waited(D0, S1, S0) >= v0, "S1 waits for S0's use");
        assert_eq!(sim.completed(D0, S0), 0, "no host wait");
        assert_eq!(pool.stats(D0).unwrap().active_blocks.current, 1);

        // S1's free gives it back; S0 waits for S1 on the device and reuses it.
        let v1 = sim.submit_work(D0, S1);
        drop(b);
        let c = pool.malloc(D0, &S0, 8 * MIB).unwrap();
        assert_eq!(c.ptr(), p, "the block came back to S0 ({page:?})");
        assert!(sim.waited(D0, S0, S1) >= v1, "S0 waits for S1's use");
        assert_eq!(sim.completed(D0, S1), 0, "no host wait");
        assert_eq!(pool.total_bytes(), reserved);
        drop(c);
    }
}

#[test]
fn stealing_off_keeps_streams_independent() {
    let pool = vm_pool_no_steal(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(a);
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_eq!(sim.waited(D0, S1, S0), 0);
    assert_eq!(pool.total_bytes(), 16 * MIB, "grown instead");
    drop(b);
}

#[test]
fn a_failed_wait_hands_out_no_stolen_block() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let p = a.ptr();
    sim.submit_work(D0, S0);
    drop(a);
    sim.inject_failure(crate::sim::SimCall::StreamWaitFence, 1);
    assert!(matches!(
        pool.malloc(D0, &S1, 8 * MIB),
        Err(PoolError::Backend {
            op: "stream_wait_fence",
            ..
        })
    ));
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.active_blocks.current, 0, "nothing handed out");
    assert_eq!(st.used.current, 0);
    // The block is still S0's and still free: S0 takes it back at once, and S1 can steal
    // once the wait succeeds.
    let c = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    assert_eq!(c.ptr(), p);
    drop(c);
    let d = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_eq!(d.ptr(), p);
    drop(d);
}

#[test]
fn a_lender_stream_can_go_while_its_block_is_lent() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.borrow_stream(S0);
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(a);
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    let p = b.ptr();
    // S0 has no block of its own live: the pool lets go of it (the lent block does not keep
    // it), and its owner destroys it; the simulator fails any later use of S0.
    pool.release_stream(D0, &S0).unwrap();
    sim.destroy_stream(S0);
    let v1 = sim.submit_work(D0, S1);
    b.free().unwrap();
    let c = pool.malloc(D0, &S2, 8 * MIB).unwrap();
    if c.ptr() == p {
        assert!(sim.waited(D0, S2, S1) >= v1 || sim.completed(D0, S1) >= v1);
    }
    drop(c);
    sim.complete_all();
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn record_stream_block_is_reused_by_waiting_when_memory_is_short() {
    let pool = vm_pool(2 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    let p = a.ptr();
    a.record_stream(&S2).unwrap();
    let v = sim.submit_work(D0, S2);
    drop(a);
    let b = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    assert_eq!(b.ptr(), p);
    assert!(sim.waited(D0, S0, S2) >= v, "S0 waits for S2 on the device");
    assert_eq!(sim.completed(D0, S2), 0, "the host did not wait");
    drop(b);
}

#[test]
fn stats_track_peaks_and_counts() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 1000).unwrap();
    let b = pool.malloc(D0, &S0, 2000).unwrap();
    let c = pool.malloc(D0, &S1, 4 * MIB).unwrap();
    drop(b);
    let d = pool.malloc(D0, &S0, 100).unwrap();
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.used.current, (1024 + 512 + 4 * MIB) as u64);
    assert_eq!(
        st.used.peak,
        ((1024 + 2048) + 4 * MIB) as u64,
        "sum of the shards' peaks"
    );
    assert_eq!(st.requested.current, (1000 + 100 + 4 * MIB) as u64);
    assert_eq!(st.active_blocks.current, 3);
    assert_eq!(st.active_blocks.peak, 3);
    assert_eq!(st.allocations, 4);
    assert_eq!(st.frees, 1);
    assert_eq!(st.reserved.current, (2 * MIB + 4 * MIB) as u64);
    assert_eq!(st.free_bytes(), st.reserved.current - st.used.current);
    assert!(st.fragmentation() > 0.0 && st.fragmentation() < 1.0);
    let s0 = pool.stream_stats(D0, S0).unwrap();
    assert_eq!(s0.used.peak, 1024 + 2048);
    assert_eq!(s0.active_blocks.peak, 2);
    assert_eq!(
        pool.stream_stats(D0, StreamKey(99)).unwrap(),
        Stats::default()
    );
    assert_eq!(pool.used_bytes() + pool.free_bytes(), pool.total_bytes());
    drop((a, c, d));
}

#[test]
fn raw_handles_are_checked() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let raw = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(pool.used_bytes(), 4096, "a raw allocation stays allocated");
    pool.record_stream_raw(&raw, &S1).unwrap();
    let addr = raw.ptr();
    pool.free_raw(raw).unwrap();
    pool.synchronize_free_blocks().unwrap();
    // The same block handed out again: a forged handle with the old generation must not
    // free it (a real one cannot exist: `free_raw` consumed it, and the type is not Copy).
    let again = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(again.ptr(), addr);
    let stale = again.forge_stale_for_tests();
    assert!(matches!(
        pool.free_raw(stale),
        Err(PoolError::InvalidHandle { .. })
    ));
    assert_eq!(pool.used_bytes(), 4096);
    pool.free_raw(again).unwrap();
    assert_eq!(pool.used_bytes(), 0);
}

#[test]
fn a_generation_jumped_past_u32_still_refuses_stale_handles() {
    // 26.5: with a u32 generation, 2^32 reuses of a slot made a stale copy valid again.
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let first = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    let stale = first.forge_copy_for_tests();
    pool.free_raw(first).unwrap();
    // 2^32 - 1 reuses later (a u32 generation would now be one short of wrapping):
    pool.jump_generations_for_tests(D0, &S0, u64::from(u32::MAX));
    let live = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(live.ptr(), stale.ptr(), "the same slot, reused");
    assert!(matches!(
        pool.free_raw(stale),
        Err(PoolError::InvalidHandle { .. })
    ));
    assert_eq!(pool.used_bytes(), 4096, "the live block was not freed");
    pool.free_raw(live).unwrap();
}

#[test]
fn devices_are_independent() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![
        SimDevice {
            total_memory: (16 * MIB) as u64,
            granularity: Some((2 * MIB) as u64),
        },
        SimDevice {
            total_memory: (16 * MIB) as u64,
            granularity: None,
        },
    ]))
    .unwrap();
    assert!(pool.uses_virtual_memory(D0).unwrap());
    assert!(!pool.uses_virtual_memory(DeviceId(1)).unwrap());
    let a = pool.malloc(D0, &S0, 16 * MIB).unwrap();
    let b = pool.malloc(DeviceId(1), &S0, 2 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().used.current, (16 * MIB) as u64);
    assert_eq!(
        pool.stats(DeviceId(1)).unwrap().used.current,
        (2 * MIB) as u64
    );
    assert!(matches!(
        pool.malloc(D0, &S1, 512),
        Err(PoolError::OutOfMemory { device: D0, .. })
    ));
    drop((a, b));
}

#[test]
fn many_frees_coalesce_back_into_one_block() {
    let pool = plain_pool(64 * MIB);
    let blocks: Vec<_> = (1..=40u64)
        .map(|i| pool.malloc(D0, &S0, (i * 512) as usize).unwrap())
        .collect();
    for b in blocks.into_iter().rev().step_by(1) {
        drop(b);
    }
    assert_eq!(pool.n_free_blocks(), 1);
}

#[test]
fn threads_on_their_own_and_on_shared_streams_never_overlap() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    let pool = vm_pool(512 * MIB, 2 * MIB);
    let live: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, live) = (&pool, &live);
            s.spawn(move || {
                // Threads 0 and 1 share a stream; 2 and 3 have their own.
                let stream = StreamKey(t.max(1));
                let mut mine = Vec::new();
                let mut x = t + 1;
                for _ in 0..3000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if mine.len() < 8 && x % 3 != 0 {
                        let size = 512 + (x >> 40) % (3 * MIB) as u64;
                        let a = pool.malloc(D0, &stream, size as usize).unwrap();
                        let mut l = live.lock().unwrap();
                        let start = a.ptr().0;
                        let end = start + size;
                        if let Some((&s, &e)) = l.range(..end).next_back() {
                            assert!(e <= start || s >= end, "overlap");
                        }
                        l.insert(start, end);
                        drop(l);
                        mine.push(a);
                    } else if !mine.is_empty() {
                        let a = mine.swap_remove((x >> 20) as usize % mine.len());
                        live.lock().unwrap().remove(&a.ptr().0);
                        drop(a);
                    }
                }
                for a in mine {
                    live.lock().unwrap().remove(&a.ptr().0);
                }
            });
        }
    });
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.stats(D0).unwrap().active_blocks.current, 0);
}

// ----- streams that come and go, rollback, private pools (issues 18, 22) ---------------------

#[test]
fn a_dropped_stream_is_released_fenced_and_its_shard_adopted() {
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let mut addrs = Vec::new();
    for i in 0..1000u64 {
        if i % 2 == 0 {
            // The GPU keeps up with every other stream; the others' shards are adopted busy.
            sim.complete_all();
        }
        let s = StreamKey(1000 + i);
        let a = pool.malloc(D0, &s, 3 * MIB).unwrap();
        sim.submit_work(D0, s);
        addrs.push(a.ptr());
        drop(a);
        // The user drops the stream: the pool lets go of it at the next new stream (or at
        // once on the free of its last block when the drop came first).
        sim.drop_stream(s);
    }
    let st = pool.stats(D0).unwrap();
    assert!(
        st.shards <= crate::policy::ADOPT_BUSY_SHARDS_ABOVE as u64 + 1,
        "shards are adopted, not accumulated: {st:?}"
    );
    assert!(st.attached_streams <= 1, "{st:?}");
    let per_shard = (1u64 << 30) + (256 * MIB) as u64; // a small-block range and a large one
    assert!(
        st.address_space <= st.shards * per_shard,
        "address space stays bounded: {st:?}"
    );
    assert!(st.reserved.current <= (16 * MIB) as u64, "{st:?}");
    // Every dropped stream was destroyed only after the pool let go of it, and never used
    // after (the simulator fails such calls, which would have failed a malloc above).
    assert!(sim.is_destroyed(StreamKey(1000)));
    assert!(sim.calls().stream_released >= 999);
}

#[test]
fn a_new_stream_with_a_reused_handle_waits_for_the_old_streams_fence() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let h = StreamKey(0x7f00);
    sim.borrow_stream(h); // a foreign stream, as through the C ABI
    let a = pool.malloc(D0, &h, MIB).unwrap();
    let addr = a.ptr();
    sim.submit_work(D0, h); // a kernel still writes the block...
    drop(a); // ...when it is freed: the last block, so the pool records a fence and lets go.
    assert_eq!(pool.stats(D0).unwrap().attached_streams, 0);
    sim.destroy_stream(h); // allowed: no block made on it is live
    sim.create_stream(h); // a new stream gets the same handle value
    let waits = sim.calls().stream_wait_fence;
    let b = pool.malloc(D0, &h, MIB).unwrap();
    assert_eq!(b.ptr(), addr, "the cache is reused...");
    assert_eq!(
        sim.calls().stream_wait_fence,
        waits + 1,
        "...only after the new stream was made to wait for the old stream's fence"
    );
    assert_eq!(
        sim.waited(D0, h, h),
        0,
        "the new timeline waits on the old one, not itself"
    );
}

#[test]
fn the_pool_never_uses_a_borrowed_stream_after_its_last_block_is_freed() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let (h1, h2) = (StreamKey(0x1000), StreamKey(0x2000));
    sim.borrow_stream(h1);
    let a = pool.malloc(D0, &h1, 4 * MIB).unwrap();
    sim.submit_work(D0, h1);
    drop(a);
    sim.destroy_stream(h1);
    // Other streams now need memory: the pool moves h1's pages once the fence it recorded
    // at the free completes, and never records a new fence on the destroyed h1.
    let big = pool.malloc(D0, &h2, 60 * MIB);
    assert!(big.is_ok(), "{big:?}");
    drop(big);
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn out_of_memory_leaves_reserved_bytes_as_they_were() {
    // Virtual memory: a request larger than the device fails at once.
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let keep = pool.malloc(D0, &S0, 10 * MIB).unwrap();
    let cached = pool.malloc(D0, &S0, 4 * MIB).unwrap();
    drop(cached);
    let before = pool.stats(D0).unwrap();
    let calls = pool.backend().calls();
    match pool.malloc(D0, &S1, 128 * MIB) {
        Err(PoolError::OutOfMemory {
            cause, reserved, ..
        }) => {
            assert_eq!(cause, crate::OomCause::DeviceMemory);
            assert_eq!(reserved, before.reserved.current as usize);
        }
        other => panic!("{other:?}"),
    }
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.reserved, before.reserved);
    assert_eq!(st.oom_causes.device_memory, 1);
    assert_eq!(st.oom_causes.get(crate::OomCause::DeviceMemory), 1);
    assert_eq!(st.last_oom, Some(crate::OomCause::DeviceMemory));
    assert_eq!(
        pool.backend().calls().create_physical,
        calls.create_physical
    );
    // A request that fits the device but not beside what is live: pages created while
    // trying are given back, and the peak does not count them.
    let err = pool.malloc(D0, &S1, 56 * MIB).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { .. }), "{err}");
    let after = pool.stats(D0).unwrap();
    assert!(
        after.reserved.current <= before.reserved.current,
        "{after:?}"
    );
    assert_eq!(after.reserved.peak, before.reserved.peak);
    assert_eq!(after.reserved.current, pool.backend().physical_bytes(D0));
    // The pool keeps serving.
    let ok = pool.malloc(D0, &S1, 40 * MIB).unwrap();
    drop((ok, keep));
}

#[test]
fn out_of_memory_in_plain_mode_rolls_back_too() {
    let pool = plain_pool(64 * MIB);
    let keep = pool.malloc(D0, &S0, 20 * MIB).unwrap();
    let before = pool.total_bytes();
    assert!(matches!(
        pool.malloc(D0, &S1, 50 * MIB),
        Err(PoolError::OutOfMemory { .. })
    ));
    assert!(pool.total_bytes() <= before);
    assert_eq!(
        pool.total_bytes(),
        pool.backend().physical_bytes(D0) as usize
    );
    drop(keep);
}

#[test]
fn private_pool_memory_is_reused_only_inside_it_and_released_with_its_holds() {
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let p = PrivatePoolId(7);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    let a_addr = a.ptr();
    drop(a);
    // Reused inside the private pool, on the same stream, in order:
    let b = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    assert_eq!(b.ptr(), a_addr);
    drop(b);
    // Never by the stream's ordinary allocations, even with every fence complete:
    pool.backend().complete_all();
    let c = pool.malloc(D0, &S0, 4 * MIB).unwrap();
    assert_ne!(c.ptr(), a_addr);
    let under_pressure = pool.malloc(D0, &S1, 200 * MIB).unwrap();
    let range = under_pressure.ptr().0..under_pressure.ptr().0 + (200 * MIB) as u64;
    assert!(!range.contains(&a_addr.0));
    assert!(pool.has_private_pool(D0, p).unwrap());
    drop((c, under_pressure));
    let with_private = pool.total_bytes();
    // The graph is gone: its hold is released; the pool's memory goes back.
    hold.release();
    assert!(!pool.has_private_pool(D0, p).unwrap());
    assert!(pool.total_bytes() < with_private);
    assert_eq!(
        pool.total_bytes(),
        pool.backend().physical_bytes(D0) as usize
    );
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes(), 0);
}

#[test]
fn a_private_pool_with_a_live_block_outlives_its_holds() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let p = PrivatePoolId(1);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let out = pool.malloc_private(D0, p, &S0, MIB).unwrap().into_raw();
    hold.release();
    assert!(
        pool.has_private_pool(D0, p).unwrap(),
        "a graph output is still live"
    );
    pool.free_raw(out).unwrap();
    assert!(!pool.has_private_pool(D0, p).unwrap());
}

#[test]
fn a_record_stream_free_is_covered_by_its_own_streams_detach_fence() {
    // Review finding: a free with record_stream marks used to take no epoch, so the detach
    // recorded no fence for the owning stream's work on that block.
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let (a, c) = (StreamKey(0x100), StreamKey(0x200));
    sim.borrow_stream(a);
    let x = pool.malloc(D0, &a, MIB).unwrap();
    sim.submit_work(D0, a); // a kernel on A writes the block
    x.record_stream(&c).unwrap();
    let fences = sim.calls().record_fence;
    drop(x); // last block of A: fence on C for the mark, and A's detach fence
    assert_eq!(sim.calls().record_fence, fences + 2);
    sim.destroy_stream(a);
    sim.create_stream(a); // a new stream with A's handle value
    sim.complete_stream(D0, c);
    let waits = sim.calls().stream_wait_fence;
    let y = pool.malloc(D0, &a, MIB).unwrap();
    assert_eq!(
        sim.calls().stream_wait_fence,
        waits + 1,
        "the new stream waits for the old stream's work before reusing its cache"
    );
    drop(y);
}

#[test]
fn record_stream_on_a_private_block_is_not_taken_for_its_own_stream() {
    // Private shard keys are small numbers (1, 2, ...) that real stream keys may equal: a
    // block of private shard 1 marked as used on stream 1 must still wait for stream 1.
    let pool = plain_pool(64 * MIB);
    let _hold = pool.retain_private_pool(D0, PrivatePoolId(1)).unwrap();
    let a = pool.malloc_private(D0, PrivatePoolId(1), &S2, 1).unwrap();
    assert_eq!(
        a.stream(),
        StreamKey(1),
        "the private shard key this test is about"
    );
    let p = a.ptr();
    pool.backend().submit_work(D0, StreamKey(1));
    a.record_stream(&StreamKey(1)).unwrap();
    a.free().unwrap();
    let b = pool.malloc_private(D0, PrivatePoolId(1), &S2, 1).unwrap();
    assert_ne!(b.ptr(), p, "stream 1 may still use the block");
}

#[test]
fn streams_of_other_threads_are_not_stolen_from() {
    // A stream another host thread drives runs concurrently by design: the pool grows
    // rather than make it wait (a steal per request between two looping threads cost 30x
    // in throughput on the H200).
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(a);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
            assert_eq!(b.held_by(), S1, "not lent");
            assert_eq!(pool.backend().waited(D0, S1, S0), 0);
        });
    });
    assert_eq!(pool.total_bytes(), 16 * MIB, "grown instead");
}

#[test]
fn stats_count_streams_shards_and_address_space_reserved_and_mapped() {
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let empty = pool.stats(D0).unwrap();
    assert_eq!(
        (
            empty.shards,
            empty.attached_streams,
            empty.address_space,
            empty.mapped
        ),
        (0, 0, 0, 0)
    );
    assert_eq!((empty.last_oom, empty.oom_causes.total()), (None, 0));

    let a = pool.malloc(D0, &S0, 3 * MIB).unwrap();
    let b = pool.malloc(D0, &S1, 5 * MIB).unwrap();
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.shards, 2);
    assert_eq!(st.attached_streams, 2);
    let backend = pool.backend();
    assert_eq!(st.address_space, backend.reserved_address_space(D0));
    assert_eq!(st.mapped, backend.mapped_pages(D0) as u64 * 2 * MIB as u64);
    // 3 MiB and 5 MiB touch two and three 2 MiB pages.
    assert_eq!(st.mapped, (10 * MIB) as u64);
    assert!(st.mapped <= st.reserved.current && st.mapped <= st.address_space);

    // Freed blocks keep their pages mapped in the cache until released.
    drop((a, b));
    let cached = pool.stats(D0).unwrap();
    assert_eq!(
        cached.mapped,
        backend.mapped_pages(D0) as u64 * 2 * MIB as u64
    );
    pool.free_all_blocks().unwrap();
    let released = pool.stats(D0).unwrap();
    assert_eq!(released.mapped, 0);
    assert_eq!(released.reserved.current, 0);

    // Plain segments: everything reserved is mapped, no address space is reserved.
    let plain = plain_pool(64 * MIB);
    let c = plain.malloc(D0, &S0, 3 * MIB).unwrap();
    let st = plain.stats(D0).unwrap();
    assert_eq!(st.mapped, st.reserved.current);
    assert!(st.mapped >= (3 * MIB) as u64);
    assert_eq!(st.address_space, 0);
    drop(c);
}

#[test]
fn a_block_lent_by_a_shard_that_retires_is_still_freed_through_its_raw_handle() {
    // S0 lends a block to S1, then S0's shard retires (its last own block is freed while
    // neither a fence nor a synchronisation of S0 works): the lent block stays in the
    // retired shard, taken out of the key lookup, and S1's raw handle must still free it.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.borrow_stream(S0);
    let keep = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let x = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(x);
    let lent = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_eq!(lent.held_by(), S0, "lent by S0");
    let raw = lent.into_raw();
    sim.inject_failure(SimCall::RecordFence, 1);
    sim.inject_failure(SimCall::SynchronizeStream, 1);
    let _ = keep.free();
    sim.clear_failures();
    sim.submit_work(D0, S1);
    pool.free_raw(raw).unwrap();
    assert_eq!(pool.stats(D0).unwrap().active_blocks.current, 0);
}

#[test]
fn a_failed_request_lets_go_of_a_borrowed_stream_with_no_live_block() {
    // S1 (a foreign stream, as through the C ABI) has no live block once its huge request
    // fails: its owner may destroy it, so the pool must not touch it afterwards.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.borrow_stream(S1);
    let y = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    sim.submit_work(D0, S1);
    drop(y);
    let lent = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    assert_eq!(lent.held_by(), S1, "S1's block lent to S0");
    assert!(matches!(
        pool.malloc(D0, &S1, 1024 * MIB),
        Err(PoolError::OutOfMemory { .. })
    ));
    assert_eq!(
        pool.stats(D0).unwrap().attached_streams,
        1,
        "only S0 (its borrowed block is live) is still held"
    );
    sim.destroy_stream(S1);
    sim.submit_work(D0, S0);
    lent.free().unwrap();
    let z = pool.malloc(D0, &S2, 8 * MIB).unwrap();
    drop(z);
    let again = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    drop(again);
    pool.free_all_blocks().unwrap();
}

/// A backend whose device completes all work at the k-th `fence_completed` poll after being
/// armed: a real GPU finishing work between two polls made for one request.
struct LateSim {
    inner: SimulatedBackend,
    countdown: std::sync::atomic::AtomicI64,
}
// SAFETY: every method forwards to the simulated backend, which keeps the contract; the
// extra `complete_all` only completes work early in the model, which no fence outlives.
unsafe impl crate::backend::Backend for LateSim {
    type Stream = StreamKey;
    type Fence = crate::sim::SimFence;
    type Physical = crate::sim::SimPage;
    type Error = crate::sim::SimError;
    fn device_count(&self) -> Result<u32, Self::Error> {
        self.inner.device_count()
    }
    fn device_info(&self, d: DeviceId) -> Result<DeviceInfo, Self::Error> {
        self.inner.device_info(d)
    }
    fn allocate(&self, d: DeviceId, s: u64) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.allocate(d, s)
    }
    unsafe fn deallocate(&self, d: DeviceId, p: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.deallocate(d, p, s) }
    }
    fn reserve_address_range(
        &self,
        d: DeviceId,
        s: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.reserve_address_range(d, s)
    }
    unsafe fn release_address_range(
        &self,
        d: DeviceId,
        b: DeviceAddress,
        s: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_address_range(d, b, s) }
    }
    fn create_physical(&self, d: DeviceId, s: u64) -> Result<Option<Self::Physical>, Self::Error> {
        self.inner.create_physical(d, s)
    }
    unsafe fn release_physical(&self, d: DeviceId, p: Self::Physical) -> Result<(), Self::Error> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_physical(d, p) }
    }
    unsafe fn map(
        &self,
        d: DeviceId,
        a: DeviceAddress,
        p: &Self::Physical,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.map(d, a, p) }
    }
    unsafe fn map_run(
        &self,
        d: DeviceId,
        a: DeviceAddress,
        ps: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), crate::backend::MapRunFailure<Self::Error>> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.map_run(d, a, ps, pages) }
    }
    unsafe fn unmap(&self, d: DeviceId, a: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        // SAFETY: forwarded with the caller's contract.
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.unmap(d, a, s) }
    }
    fn stream_key(&self, s: &StreamKey) -> Result<StreamKey, PoolError> {
        self.inner.stream_key(s)
    }
    fn may_release_stream(&self, s: &StreamKey) -> bool {
        self.inner.may_release_stream(s)
    }
    fn retain_stream(&self, s: &StreamKey) -> StreamKey {
        self.inner.retain_stream(s)
    }
    fn stream_released(&self, s: StreamKey) {
        self.inner.stream_released(s)
    }
    fn record_fence(&self, d: DeviceId, s: &StreamKey) -> Result<Self::Fence, Self::Error> {
        self.inner.record_fence(d, s)
    }
    fn synchronize_stream(&self, s: &StreamKey) -> Result<(), Self::Error> {
        self.inner.synchronize_stream(s)
    }
    fn fence_completed(&self, f: &Self::Fence) -> Result<bool, Self::Error> {
        if self
            .countdown
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.inner.complete_all();
        }
        self.inner.fence_completed(f)
    }
    fn wait_fence(&self, f: &Self::Fence) -> Result<(), Self::Error> {
        self.inner.wait_fence(f)
    }
    fn stream_wait_fence(
        &self,
        d: DeviceId,
        s: &StreamKey,
        f: &Self::Fence,
    ) -> Result<(), Self::Error> {
        self.inner.stream_wait_fence(d, s, f)
    }
    fn is_capturing(&self, s: &StreamKey) -> bool {
        self.inner.is_capturing(s)
    }
    fn release_fence(&self, f: Self::Fence) {
        self.inner.release_fence(f)
    }
}

/// A pending free that completes between two polls of one request (after the block for the
/// request was claimed, while pages are being found for it) must not coalesce with the
/// claimed block: it did, and the claimed block was then handed out inside a free range
/// (found by an independent review; two live blocks overlapped at k = 3).
#[test]
fn a_pending_free_completing_while_pages_are_found_leaves_the_claimed_block_alone() {
    for k in 1..8 {
        let config = PoolConfig {
            steal_before_growing: false,
            ..PoolConfig::default()
        };
        let pool = MemoryPool::with_config(
            LateSim {
                inner: SimulatedBackend::new(vec![SimDevice {
                    total_memory: (64 * MIB) as u64,
                    granularity: Some((2 * MIB) as u64),
                }]),
                countdown: std::sync::atomic::AtomicI64::new(i64::MAX),
            },
            config,
        )
        .unwrap();
        let sim = &pool.backend().inner;
        let a = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 0
        let b = pool.malloc(D0, &S0, 4 * MIB).unwrap(); // pages 1-2
        let c = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 3
        drop(b);
        sim.complete_all();
        pool.free_all_blocks().unwrap(); // pages 1-2 unmapped
        a.record_stream(&S1).unwrap();
        sim.submit_work(D0, S1);
        drop(a); // pending on S1
        pool.backend()
            .countdown
            .store(k, std::sync::atomic::Ordering::SeqCst);
        let r = pool.malloc(D0, &S0, 4 * MIB).unwrap();
        pool.backend()
            .countdown
            .store(i64::MAX, std::sync::atomic::Ordering::SeqCst);
        let big = pool.malloc(D0, &S0, 6 * MIB).unwrap();
        let (r0, r1) = (r.ptr().addr(), r.ptr().addr() + (4 * MIB) as u64);
        let (b0, b1) = (big.ptr().addr(), big.ptr().addr() + (6 * MIB) as u64);
        assert!(r1 <= b0 || b1 <= r0, "k={k}: live blocks overlap");
        drop((r, big, c));
    }
}

#[test]
fn a_private_pool_is_released_only_after_another_streams_work_on_its_blocks() {
    // A private block used on another stream (record_stream) and freed while that stream's
    // kernel still runs: the private pool must not give its memory back before that work
    // completes (it used to drop the other stream with no fence at the free).
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let p = PrivatePoolId(9);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    a.record_stream(&S1).unwrap();
    let work = sim.submit_work(D0, S1);
    drop(a);
    hold.release();
    // The release happens at the next collection; whenever the pool's pages go back, the
    // other stream's kernel must be done.
    pool.free_all_blocks().unwrap();
    assert!(
        sim.completed(D0, S1) >= work,
        "private pool released while stream 1's work on its block was pending"
    );
    assert!(!pool.has_private_pool(D0, p).unwrap());
}

#[test]
fn a_private_shard_let_go_of_during_another_capture_waits_for_the_device_before_release() {
    // The block of capture 1's pool is used eagerly on its stream after capture 1, then
    // freed while the same stream is captured into graph 2: no fence can cover the eager
    // work, so the pool's release waits for the device.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let p = PrivatePoolId(11);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    let eager = sim.submit_work(D0, S0);
    sim.set_capturing(S0, true);
    drop(a);
    sim.set_capturing(S0, false);
    hold.release();
    pool.free_all_blocks().unwrap();
    assert!(
        sim.completed(D0, S0) >= eager,
        "private pool released while eager work on its block was pending"
    );
}

/// The per-thread default stream (issue "Reused pool memory is safe for every use", item 3):
/// its handle names the calling thread's stream, so the pool uses a per-thread stream's
/// handle only from the thread whose stream it is. A free on another thread (a garbage
/// collector) records no fence there and detaches nothing: that memory stays out of
/// cross-stream reuse (no wait with that handle either) until the owner fences it, or out of
/// memory synchronises the device; the owner's own frees are fenced as any borrowed stream's.
#[test]
fn another_threads_per_thread_stream_is_never_used_from_this_thread() {
    // A per-thread key of no thread of this process (serial numbers start at 1).
    let foreign = StreamKey(PER_THREAD_KEY_BIT | (u64::MAX >> 2));
    let own = per_thread_key();
    assert!(is_other_threads_stream(foreign));
    assert!(!is_other_threads_stream(own) && is_per_thread_key(own));
    assert!(!is_per_thread_key(S0) && !is_per_thread_key(StreamKey(0)));
    // The identities cuda-core gives the streams it creates (bit 63 and a serial number)
    // and external handles (user-space addresses) are never per-thread keys: the H200 run
    // caught the first colliding with an earlier choice of bit.
    assert!(!is_per_thread_key(StreamKey((1 << 63) | 5)));
    assert!(!is_per_thread_key(StreamKey(0x7f12_3456_7000)));

    let pool = vm_pool(8 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.borrow_stream(foreign);
    sim.borrow_stream(own);
    let a = pool.malloc(D0, &foreign, 8 * MIB).unwrap();
    sim.submit_work(D0, foreign);
    let before = sim.calls();
    drop(a); // freed here, not on the stream's thread
    let after = sim.calls();
    assert_eq!(
        after.record_fence, before.record_fence,
        "no fence on another thread's stream"
    );
    // The owner thread's stream reuses its own frees at once.
    let b = pool.malloc(D0, &foreign, 8 * MIB).unwrap();
    drop(b);
    // The device is full: S1 can have that memory only after the foreign stream's work. No
    // fence can be recorded there from this thread (the handle names this thread's stream),
    // and the pool neither records on nor waits with the foreign handle: out-of-memory
    // recovery synchronises the whole device instead.
    let work = sim.submitted(D0, foreign);
    let c = pool.malloc(D0, &S1, 6 * MIB).unwrap();
    assert_eq!(sim.calls().record_fence, before.record_fence);
    assert_eq!(sim.waited(D0, S1, foreign), 0);
    assert_eq!(
        sim.completed(D0, foreign),
        work,
        "the device synchronisation covered the foreign stream's work"
    );
    sim.check_handout(D0, S1, c.ptr().0, c.size() as u64);
    drop(c);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());

    // This thread's own per-thread stream: its last free records the detach fence, and another
    // stream then gets the memory once the fence completes.
    let pool = vm_pool(8 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.borrow_stream(own);
    let c = pool.malloc(D0, &own, 8 * MIB).unwrap();
    sim.submit_work(D0, own);
    let before = sim.calls().record_fence;
    drop(c);
    assert_eq!(
        sim.calls().record_fence,
        before + 1,
        "the owner's detach fence"
    );
    let work = sim.submitted(D0, own);
    let d = pool.malloc(D0, &S1, 6 * MIB).unwrap();
    assert!(
        sim.is_ordered_after(D0, S1, own, work) || sim.completed(D0, own) == work,
        "S1 got the memory only after the owner's work"
    );
    drop(d);
}

/// A per-thread default stream can mark only its own (unlent) blocks: another stream's block
/// marked with it would need a fence on it at a free that may come from any thread.
#[test]
fn record_stream_refuses_a_per_thread_stream_that_is_not_the_blocks_own() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let own = per_thread_key();
    let a = pool.malloc(D0, &S0, MIB).unwrap();
    assert!(matches!(
        a.record_stream(&own),
        Err(PoolError::PerThreadStream)
    ));
    let b = pool.malloc(D0, &own, MIB).unwrap();
    b.record_stream(&own).unwrap();
    b.record_stream(&S1).unwrap();
    drop((a, b));
}

#[test]
fn per_thread_blocks_freed_by_another_thread_are_reused_by_their_own_thread() {
    // CuPy's garbage collector frees blocks of a thread's per-thread stream on another
    // thread: the owning thread must still reuse them (stream order on its own stream), or
    // the pool grows without bound (the H200 client run reached 142 GiB).
    let pool = vm_pool(1 << 40, 2 * MIB);
    let sim = pool.backend();
    std::thread::scope(|sc| {
        // Bounded, so that live blocks cannot pile up while the collector is not scheduled.
        let (tx, rx) = std::sync::mpsc::sync_channel::<RawAllocation>(8);
        let collector = sc.spawn(|| {
            for raw in rx {
                pool.free_raw(raw).unwrap();
            }
        });
        let own = per_thread_key();
        for i in 0..2000u64 {
            let a = pool.malloc(D0, &own, (1 + i % 16) as usize * MIB).unwrap();
            sim.submit_work(D0, own);
            tx.send(a.into_raw()).unwrap();
        }
        drop(tx);
        collector.join().unwrap();
    });
    let reserved = pool.stats(D0).unwrap().reserved.peak;
    assert!(
        reserved <= (256 * MIB) as u64,
        "the owner's cache grew to {} MiB: blocks freed on another thread were not reused",
        reserved / MIB as u64
    );
}

#[test]
fn eight_per_thread_streams_with_a_collector_stay_bounded() {
    // The CuPy client scenario on the simulated device: 8 threads on their per-thread
    // streams, each keeping 4 blocks and handing one block per iteration to a collector
    // thread that frees it.
    let pool = vm_pool(1 << 40, 2 * MIB);
    std::thread::scope(|sc| {
        // Bounded, so that live blocks cannot pile up while the collector is not scheduled.
        let (tx, rx) = std::sync::mpsc::sync_channel::<RawAllocation>(8);
        let pool = &pool;
        sc.spawn(move || {
            for raw in rx {
                pool.free_raw(raw).unwrap();
            }
        });
        for t in 0..8u64 {
            let tx = tx.clone();
            sc.spawn(move || {
                let own = per_thread_key();
                let sim = pool.backend();
                let mut kept = std::collections::VecDeque::new();
                for i in 0..400u64 {
                    let x = pool
                        .malloc(D0, &own, (1 + (i * 7 + t) % 16) as usize * MIB)
                        .unwrap();
                    sim.submit_work(D0, own);
                    tx.send(x.into_raw()).unwrap();
                    let y = pool
                        .malloc(D0, &own, (1 + (i * 5 + t) % 16) as usize * MIB)
                        .unwrap();
                    sim.submit_work(D0, own);
                    kept.push_back(y.into_raw());
                    if kept.len() > 4 {
                        pool.free_raw(kept.pop_front().unwrap()).unwrap();
                    }
                    if i % 50 == 0 {
                        sim.complete_stream(D0, own);
                    }
                }
                for raw in kept {
                    pool.free_raw(raw).unwrap();
                }
            });
        }
        drop(tx);
    });
    let s = pool.stats(D0).unwrap();
    assert!(
        s.reserved.peak <= (8 * 200 * MIB) as u64,
        "reserved peaked at {} MiB for 8 threads of at most ~7 x 16 MiB live each",
        s.reserved.peak / MIB as u64
    );
}

// ----- regression tests from the second independent review -----

/// Forwards to a shared simulated backend; `deallocate`/`unmap` note whether S0 still had
/// incomplete work at the time.
struct Watch {
    inner: std::sync::Arc<SimulatedBackend>,
    bad: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
impl Watch {
    fn check(&self) {
        if self.inner.completed(D0, S0) < self.inner.submitted(D0, S0) {
            self.bad.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
// SAFETY: forwards (test probe).
unsafe impl crate::backend::Backend for Watch {
    type Stream = StreamKey;
    type Fence = crate::sim::SimFence;
    type Physical = crate::sim::SimPage;
    type Error = crate::sim::SimError;
    fn device_count(&self) -> Result<u32, Self::Error> {
        self.inner.device_count()
    }
    fn device_info(&self, d: DeviceId) -> Result<DeviceInfo, Self::Error> {
        self.inner.device_info(d)
    }
    fn allocate(&self, d: DeviceId, s: u64) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.allocate(d, s)
    }
    unsafe fn deallocate(&self, d: DeviceId, p: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        self.check();
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.deallocate(d, p, s) }
    }
    fn reserve_address_range(
        &self,
        d: DeviceId,
        s: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.reserve_address_range(d, s)
    }
    unsafe fn release_address_range(
        &self,
        d: DeviceId,
        b: DeviceAddress,
        s: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_address_range(d, b, s) }
    }
    fn create_physical(&self, d: DeviceId, s: u64) -> Result<Option<Self::Physical>, Self::Error> {
        self.inner.create_physical(d, s)
    }
    unsafe fn release_physical(&self, d: DeviceId, p: Self::Physical) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_physical(d, p) }
    }
    unsafe fn map(
        &self,
        d: DeviceId,
        a: DeviceAddress,
        p: &Self::Physical,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.map(d, a, p) }
    }
    unsafe fn unmap(&self, d: DeviceId, a: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        self.check();
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.unmap(d, a, s) }
    }
    fn stream_key(&self, s: &StreamKey) -> Result<StreamKey, PoolError> {
        self.inner.stream_key(s)
    }
    fn may_release_stream(&self, s: &StreamKey) -> bool {
        self.inner.may_release_stream(s)
    }
    fn retain_stream(&self, s: &StreamKey) -> StreamKey {
        self.inner.retain_stream(s)
    }
    fn stream_released(&self, s: StreamKey) {
        self.inner.stream_released(s)
    }
    fn record_fence(&self, d: DeviceId, s: &StreamKey) -> Result<Self::Fence, Self::Error> {
        self.inner.record_fence(d, s)
    }
    fn synchronize_stream(&self, s: &StreamKey) -> Result<(), Self::Error> {
        self.inner.synchronize_stream(s)
    }
    fn fence_completed(&self, f: &Self::Fence) -> Result<bool, Self::Error> {
        self.inner.fence_completed(f)
    }
    fn wait_fence(&self, f: &Self::Fence) -> Result<(), Self::Error> {
        self.inner.wait_fence(f)
    }
    fn stream_wait_fence(
        &self,
        d: DeviceId,
        s: &StreamKey,
        f: &Self::Fence,
    ) -> Result<(), Self::Error> {
        self.inner.stream_wait_fence(d, s, f)
    }
    fn is_capturing(&self, s: &StreamKey) -> bool {
        self.inner.is_capturing(s)
    }
    fn synchronize_device(&self, d: DeviceId) -> Result<(), Self::Error> {
        self.inner.synchronize_device(d)
    }
    fn release_fence(&self, f: Self::Fence) {
        self.inner.release_fence(f)
    }
}

/// A shard detached while its stream was captured (release_stream) is retired with
/// unfenced frees: the pool's Drop must not deallocate or unmap its memory while the work
/// that used it still runs (it counted a detached shard as fenced).
#[test]
fn dropping_the_pool_waits_for_the_work_of_a_retired_shard() {
    for granularity in [None, Some(2 * MIB as u64)] {
        let inner = std::sync::Arc::new(SimulatedBackend::new(vec![SimDevice {
            total_memory: 1 << 30,
            granularity,
        }]));
        let bad = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pool = MemoryPool::new(Watch {
            inner: inner.clone(),
            bad: bad.clone(),
        })
        .unwrap();
        let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
        inner.submit_work(D0, S0); // a kernel writing `a`, still running
        drop(a); // free on S0 (stream kept: the user holds it)
        inner.set_capturing(S0, true); // a capture begins on S0
        pool.release_stream(D0, &S0).unwrap(); // detached while captured: retired
        inner.set_capturing(S0, false);
        drop(pool);
        assert!(
            !bad.load(std::sync::atomic::Ordering::SeqCst),
            "{granularity:?}: memory released under running work"
        );
    }
}

struct Bomb;
impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("payload drop panics");
        }
    }
}
struct BombHook;
impl crate::hooks::MemoryHook for BombHook {
    fn alloc_post(&self, _: &crate::hooks::MemoryEvent) {
        std::panic::panic_any(Bomb);
    }
}

/// A hook whose panic payload panics again when dropped must not unwind into the pool.
#[test]
fn a_hook_panic_payload_that_panics_on_drop_stays_out_of_the_pool() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: 1 << 30,
        granularity: Some((2 * MIB) as u64),
    }]))
    .unwrap();
    let escaped = {
        let _g = crate::hooks::install(std::sync::Arc::new(BombHook));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let a = pool.malloc(D0, &S0, 8 * MIB);
            drop(a);
        }))
        .is_err()
    };
    assert!(!escaped, "a hook's panic escaped malloc");
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    drop((a, b));
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.backend().mapped_pages(D0), 0);
}

#[test]
fn a_private_pool_made_and_freed_inside_one_capture_is_released_without_a_device_wait() {
    // CuPy's captures free their temporaries during the capture: the release of such a pool
    // must not wait for the whole device, which during another capture (the next test's)
    // would invalidate that capture.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let other = sim.submit_work(D0, S1); // unrelated work, still running
    let p = PrivatePoolId(13);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    sim.set_capturing(S0, true);
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    drop(a);
    sim.set_capturing(S0, false);
    hold.release();
    sim.set_capturing(S2, true); // another capture runs while the pool is collected
    pool.free_all_blocks().unwrap();
    sim.set_capturing(S2, false);
    assert!(!pool.has_private_pool(D0, p).unwrap(), "released");
    assert!(
        sim.completed(D0, S1) < other,
        "the release waited for the whole device"
    );
}

// ----- the per-thread default stream with the driver's handle semantics -----

/// A small deterministic generator for the stress tests.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// CuPy's per-thread client on the simulated device as the GPU runs it: 8 threads allocate on
/// the per-thread handle (which names each thread's own stream in every call), launch work
/// using each block, hand blocks to a collector thread that frees them, and now and then use
/// a stream of their own too (lending between streams of one thread); a device thread
/// completes work in the background. Returns the violations the device saw: memory unmapped
/// under running work (an illegal address on the GPU) or a block handed to a stream not
/// ordered after its previous users (wrong data).
fn per_thread_handle_stress(seed: u64, pool: &MemoryPool<SimulatedBackend>) -> Vec<String> {
    use std::sync::atomic::{AtomicBool, Ordering as O};
    let pt = SimulatedBackend::PER_THREAD;
    let done = AtomicBool::new(false);
    let keys = std::sync::Mutex::new(Vec::<StreamKey>::new());
    /// Stops the device thread however the scope ends (a worker's panic included).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, O::Relaxed);
        }
    }
    std::thread::scope(|sc| {
        let _stop = Stop(&done);
        let (tx, rx) = std::sync::mpsc::sync_channel::<RawAllocation>(32);
        let pool_ref = pool;
        sc.spawn(move || {
            let mut r = Lcg(seed ^ 0xc011);
            for raw in rx {
                if r.next(4) == 0 {
                    std::thread::yield_now();
                }
                pool_ref.free_raw(raw).unwrap();
            }
        });
        let (done, keys) = (&done, &keys);
        sc.spawn(move || {
            let sim = pool_ref.backend();
            let mut r = Lcg(seed ^ 0xdef1ce);
            while !done.load(O::Relaxed) {
                let ks = keys.lock().unwrap().clone();
                for k in ks {
                    let to = sim.completed(D0, k) + r.next(3);
                    sim.complete_up_to(D0, k, to);
                }
                for t in 0..8u64 {
                    let k = StreamKey(100 + t);
                    let to = sim.completed(D0, k) + r.next(3);
                    sim.complete_up_to(D0, k, to);
                }
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..8u64)
            .map(|t| {
                let tx = tx.clone();
                sc.spawn(move || {
                    let sim = pool_ref.backend();
                    keys.lock().unwrap().push(sim.stream_key(&pt).unwrap());
                    let own = StreamKey(100 + t);
                    let mut r = Lcg(seed.wrapping_mul(31).wrapping_add(t));
                    let mut kept = std::collections::VecDeque::new();
                    let use_block = |s: StreamKey, a: &RawAllocation| {
                        let (addr, len) = (a.ptr().0, a.size() as u64);
                        sim.check_handout(D0, s, addr, len);
                        sim.submit_use(D0, s, addr, len);
                    };
                    for i in 0..300u64 {
                        let x = pool_ref
                            .malloc(D0, &pt, (1 + r.next(16)) as usize * MIB)
                            .unwrap()
                            .into_raw();
                        use_block(pt, &x);
                        tx.send(x).unwrap();
                        let y = pool_ref
                            .malloc(D0, &pt, (1 + r.next(16)) as usize * MIB)
                            .unwrap()
                            .into_raw();
                        use_block(pt, &y);
                        kept.push_back(y);
                        if kept.len() > 4 {
                            tx.send(kept.pop_front().unwrap()).unwrap();
                        }
                        if r.next(3) == 0 {
                            let z = pool_ref
                                .malloc(D0, &own, (1 + r.next(16)) as usize * MIB)
                                .unwrap()
                                .into_raw();
                            use_block(own, &z);
                            if r.next(2) == 0 {
                                tx.send(z).unwrap();
                            } else {
                                pool_ref.free_raw(z).unwrap();
                            }
                        }
                        if i % 8 == 0 {
                            // The thread synchronizes its own stream (CuPy's check).
                            sim.synchronize_stream(&pt).unwrap();
                        }
                    }
                    for y in kept {
                        tx.send(y).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        for w in workers {
            w.join().unwrap();
        }
    });
    pool.backend().violations()
}

#[test]
fn per_thread_handle_blocks_freed_by_a_collector_are_never_unmapped_or_lent_under_work() {
    // 2 GiB leaves room for the most the test keeps live (8 x 7 blocks of up to 16 MiB, and
    // 32 in the collector's queue), and no more: pages move between the threads' caches.
    for seed in 0..4u64 {
        for capacity in [1usize << 40, 2 << 30] {
            let pool = vm_pool(capacity, 2 * MIB);
            let v = per_thread_handle_stress(seed, &pool);
            assert!(
                v.is_empty(),
                "seed {seed}, capacity {capacity}: {} violations, first: {:?}",
                v.len(),
                &v[..v.len().min(3)]
            );
            assert_eq!(pool.stats(D0).unwrap().used.current, 0);
        }
    }
}

/// The same hand-over while a capture runs on the device: the recovery does not synchronise
/// the device (that would invalidate the capture), so the request fails with out of memory
/// and nothing is handed out under the other thread's work.
#[test]
fn out_of_memory_does_not_synchronise_the_device_during_a_capture() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let pt = SimulatedBackend::PER_THREAD;
    let sim = pool.backend();
    let blocks = std::thread::scope(|sc| {
        sc.spawn(|| {
            let key = sim.stream_key(&pt).unwrap();
            let blocks: Vec<_> = (0..4)
                .map(|_| pool.malloc(D0, &pt, 16 * MIB).unwrap().into_raw())
                .collect();
            for b in &blocks {
                sim.submit_use(D0, key, b.ptr().0, b.size() as u64);
            }
            (key, blocks)
        })
        .join()
        .unwrap()
    });
    let (key, blocks) = blocks;
    for b in blocks {
        pool.free_raw(b).unwrap();
    }
    sim.set_capturing(S2, true);
    let work = sim.submitted(D0, key);
    let err = pool.malloc(D0, &S0, 32 * MIB).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { .. }), "{err}");
    assert!(
        sim.completed(D0, key) < work,
        "no device-wide wait during the capture"
    );
    sim.set_capturing(S2, false);
    // Once the capture is over, the same request is served after that work.
    let mine = pool.malloc(D0, &S0, 32 * MIB).unwrap();
    sim.check_handout(D0, S0, mine.ptr().0, mine.size() as u64);
    drop(mine);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn out_of_memory_recovers_what_a_collector_freed_on_another_threads_per_thread_stream() {
    // Another thread fills the device on its per-thread stream, uses every block there, and
    // hands them to this thread, which frees them: no fence covers those frees (this thread
    // cannot record one on the other thread's stream), and the other thread keeps its stream.
    // This thread's request then needs that memory: the recovery synchronises the device and
    // reuses it, after the other thread's work.
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let pt = SimulatedBackend::PER_THREAD;
    let (blocks_tx, blocks_rx) = std::sync::mpsc::channel::<RawAllocation>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|sc| {
        // Dropped however this closure ends, so that the other thread never waits forever.
        let done_tx = done_tx;
        let pool = &pool;
        sc.spawn(move || {
            let sim = pool.backend();
            let key = sim.stream_key(&pt).unwrap();
            let blocks: Vec<_> = (0..4)
                .map(|_| pool.malloc(D0, &pt, 16 * MIB).unwrap().into_raw())
                .collect();
            for b in blocks {
                sim.submit_use(D0, key, b.ptr().0, b.size() as u64);
                blocks_tx.send(b).unwrap();
            }
            drop(blocks_tx);
            // Alive, with its stream attached, until the other thread is done (or failed).
            let _ = done_rx.recv();
        });
        for b in blocks_rx {
            pool.free_raw(b).unwrap();
        }
        let mine = pool
            .malloc(D0, &S0, 32 * MIB)
            .expect("the collector's frees are recovered");
        pool.backend()
            .check_handout(D0, S0, mine.ptr().0, mine.size() as u64);
        drop(mine);
        done_tx.send(()).unwrap();
    });
    assert!(
        pool.backend().violations().is_empty(),
        "{:?}",
        pool.backend().violations()
    );
}

/// A recording started while another thread allocates on the hot path: every free recorded
/// has its malloc recorded (or the block in the baseline). The hot path once read "no
/// recording" before taking the shard lock and handed out a block the baseline had just
/// listed as free, without noting its malloc (found by review; most of 2,000 recordings).
#[test]
fn a_recording_started_under_the_hot_path_misses_no_malloc() {
    use crate::history::{Clock, EventKind, Recorder};
    use std::sync::atomic::{AtomicBool, Ordering as O};
    use std::sync::Arc;
    /// Stops the allocating thread however the scope ends (a failed check included).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, O::Relaxed);
        }
    }
    let pool = vm_pool(64 * MIB, 2 * MIB);
    // The hot path's case: S1's shard holds a recent 4 KiB block.
    drop(pool.malloc(D0, &S1, 4096).unwrap());
    let stop = AtomicBool::new(false);
    let (mut unmatched, mut checked) = (0usize, 0usize);
    std::thread::scope(|sc| {
        let _stop = Stop(&stop);
        sc.spawn(|| {
            while !stop.load(O::Relaxed) {
                drop(pool.malloc(D0, &S1, 4096).unwrap());
            }
        });
        for _ in 0..300 {
            let rec = Arc::new(Recorder::new(1 << 16, Clock::Virtual));
            pool.start_history(Arc::clone(&rec));
            std::thread::yield_now();
            pool.stop_history();
            let history = rec.history();
            if history.dropped != 0 {
                // The ring overflowed (this thread was descheduled): its start is gone.
                continue;
            }
            checked += 1;
            let mut live = std::collections::HashSet::new();
            for e in history.events {
                match e.kind {
                    EventKind::Malloc => {
                        live.insert(e.addr.0);
                    }
                    EventKind::Free if !live.remove(&e.addr.0) => unmatched += 1,
                    _ => {}
                }
            }
        }
    });
    assert!(checked > 0, "every recording overflowed its ring");
    assert_eq!(
        unmatched, 0,
        "frees recorded whose malloc the recording lacks"
    );
}
