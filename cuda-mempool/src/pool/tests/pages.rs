//! Virtual-memory pages: release, placement, moves and the move slack; plain segments.

use super::*;

#[test]
fn free_all_blocks_returns_free_pages_inside_segments() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 3 * MIB / 2).unwrap(); // [0, 1.5) MiB: page 0
    let b = pool.malloc(D0, &S0, 5 * MIB).unwrap(); // [1.5, 6.5) MiB: pages 0-3
    let c = pool.malloc(D0, &S0, 3 * MIB / 2).unwrap(); // [6.5, 8) MiB: page 3
    assert_eq!(b.ptr().0, a.ptr().0 + (3 * MIB / 2) as u64);
    assert_eq!(c.ptr().0, b.ptr().0 + (5 * MIB) as u64);
    assert_eq!((pool.total_bytes() as usize), 8 * MIB);
    sim.submit_work(D0, S0);
    drop(b);
    pool.free_all_blocks().unwrap();
    // Pages 1 and 2 ([2, 6) MiB) lie wholly in b's free range and were returned;
    // pages 0 and 3 stay, shared by a and c with b's free range.
    assert_eq!((pool.total_bytes() as usize), 4 * MIB);
    assert_eq!(sim.physical_bytes(D0), (4 * MIB) as u64);
    assert_eq!(sim.mapped_pages(D0), 2);
    assert_eq!(
        sim.completed(D0, S0),
        1,
        "free_all_blocks waits for the stream"
    );
    drop((a, c));
    pool.free_all_blocks().unwrap();
    assert_eq!((pool.total_bytes() as usize), 0);
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
    assert_eq!((pool.total_bytes() as usize), 4 * MIB);
    // A request that no mapped run can hold still gets pages, and moves none: the free
    // pages under `r`'s range are not free.
    let big = pool.malloc(D0, &S0, 6 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 0);
    assert_eq!((pool.total_bytes() as usize), 4 * MIB + 6 * MIB);
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
    assert_eq!((pool.total_bytes() as usize), 66 * MIB);
    // Two more pages would make 70 MiB, beyond 64 + 4: they are taken from the free pages.
    assert!(66 * MIB + 4 * MIB > 64 * MIB + slack);
    let c = pool.malloc(D0, &S1, 4 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().pages_moved, 2);
    assert_eq!((pool.total_bytes() as usize), 66 * MIB);
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
            (pool.total_bytes() as usize),
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
    assert_eq!((pool.total_bytes() as usize), 0);
    // 8 MiB live at a time, on one stream after another: the pool follows what is live.
    for k in 0..12u64 {
        drop(pool.malloc(D0, &StreamKey(100 + k), 8 * MIB).unwrap());
        sim.complete_all();
    }
    assert!(
        (pool.total_bytes() as usize) <= 8 * MIB + 8 * MIB / policy::MOVE_SLACK as usize + 2 * MIB,
        "holds {} MiB for 8 MiB live",
        (pool.total_bytes() as usize) / MIB
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
    assert_eq!((pool.total_bytes() as usize), 64 * MIB);
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
    assert_eq!((pool.total_bytes() as usize), 2 * MIB + 20 * MIB + 40 * MIB);
    drop((b, c));
    pool.free_all_free().unwrap();
    assert_eq!((pool.total_bytes() as usize), 2 * MIB);
    assert_eq!(pool.backend().physical_bytes(D0), (2 * MIB) as u64);
    drop(a);
    pool.free_all_blocks().unwrap();
    assert_eq!((pool.total_bytes() as usize), 0);
}

#[test]
fn plain_mode_falls_back_to_an_exact_segment_under_the_limit() {
    let pool = plain_pool(256 * MIB);
    pool.set_limit(D0, Limit::Bytes(3 * MIB)).unwrap();
    // A 2.5 MiB request would normally get a 20 MiB segment.
    let a = pool.malloc(D0, &S0, 5 * MIB / 2).unwrap();
    assert_eq!((pool.total_bytes() as usize), 5 * MIB / 2);
    drop(a);
}
