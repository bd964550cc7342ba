//! Streams that come and go, rollback after out of memory, private pools (issues 18, 22).

use super::*;

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
    assert_eq!((pool.total_bytes() as usize), 0);
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
            assert_eq!(reserved, before.reserved.current);
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
    let before = pool.total_bytes() as usize;
    assert!(matches!(
        pool.malloc(D0, &S1, 50 * MIB),
        Err(PoolError::OutOfMemory { .. })
    ));
    assert!((pool.total_bytes() as usize) <= before);
    assert_eq!(
        (pool.total_bytes() as usize),
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
    let with_private = pool.total_bytes() as usize;
    // The graph is gone: its hold is released; the pool's memory goes back.
    hold.release();
    assert!(!pool.has_private_pool(D0, p).unwrap());
    assert!((pool.total_bytes() as usize) < with_private);
    assert_eq!(
        (pool.total_bytes() as usize),
        pool.backend().physical_bytes(D0) as usize
    );
    pool.free_all_blocks().unwrap();
    assert_eq!((pool.total_bytes() as usize), 0);
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
    assert_eq!((pool.total_bytes() as usize), 16 * MIB, "grown instead");
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
