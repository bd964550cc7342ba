//! record_stream, stealing before growing, lending between streams.

use super::*;

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
        let reserved = pool.total_bytes() as usize;

        // S1 takes S0's free memory instead of growing: it waits for S0 on the device.
        let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
        assert_eq!(b.ptr(), p, "S0's block lent to S1 ({page:?})");
        assert_eq!(
            (pool.total_bytes() as usize),
            reserved,
            "no growth ({page:?})"
        );
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
        assert_eq!((pool.total_bytes() as usize), reserved);
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
    assert_eq!((pool.total_bytes() as usize), 16 * MIB, "grown instead");
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
    assert_eq!((pool.total_bytes() as usize), 0);
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
