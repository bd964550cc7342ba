//! Foreign streams that linger (issue 49): a recurring foreign stream keeps its shard past the
//! free of its last block, with no fence and no driver call, and nothing is ever recorded on it
//! again until the same stream (the same never-reused key) comes back.

use super::*;

/// A borrowed stream named by its never-reused identity, and the pool's pair made on it twice
/// (the first last free detaches with its fence; the second attach makes it recurring).
fn recurring(pool: &MemoryPool<SimulatedBackend>, handle: u64) -> StreamKey {
    let sim = pool.backend();
    sim.borrow_stream(StreamKey(handle));
    let s = sim.stream_uid(StreamKey(handle));
    drop(pool.malloc(D0, &s, MIB).unwrap());
    drop(pool.malloc(D0, &s, MIB).unwrap());
    s
}

#[test]
fn a_recurring_foreign_stream_lingers_without_driver_calls() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let s = recurring(&pool, 0x7f00);
    let before = sim.calls();
    for _ in 0..100 {
        let a = pool.malloc(D0, &s, MIB).unwrap();
        sim.submit_use(D0, s, a.ptr().0, MIB as u64);
        drop(a);
    }
    let after = sim.calls();
    assert_eq!(
        after.record_fence, before.record_fence,
        "no fence at the last frees"
    );
    assert_eq!(
        after.stream_wait_fence, before.stream_wait_fence,
        "no wait at the attaches"
    );
    assert_eq!(
        after.stream_released, before.stream_released,
        "the stream is kept"
    );
    assert_eq!(pool.stats(D0).unwrap().attached_streams, 1);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn a_temporary_foreign_stream_still_detaches_with_its_fence() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let h = StreamKey(0x7f00);
    sim.borrow_stream(h);
    let s = sim.stream_uid(h);
    let fences = sim.calls().record_fence;
    let a = pool.malloc(D0, &s, MIB).unwrap();
    sim.submit_use(D0, s, a.ptr().0, MIB as u64);
    drop(a);
    assert_eq!(
        sim.calls().record_fence,
        fences + 1,
        "its first last free fences it"
    );
    assert_eq!(pool.stats(D0).unwrap().attached_streams, 0);
}

#[test]
fn a_handle_reused_after_its_lingering_stream_was_destroyed_never_meets_the_old_cache_unordered() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let h = StreamKey(0x7f00);
    let old = recurring(&pool, h.0);
    let a = pool.malloc(D0, &old, MIB).unwrap();
    let addr = a.ptr();
    sim.submit_use(D0, old, addr.0, MIB as u64); // a kernel still writes the block...
    drop(a); // ...when its last block is freed: the stream lingers, unfenced.
    sim.destroy_stream(h); // allowed: no block made on it is live
    sim.create_stream(h); // a new stream gets the same handle value
    let new = sim.stream_uid(h);
    assert_ne!(
        new, old,
        "a new stream under the same handle is another key"
    );
    let b = pool.malloc(D0, &new, MIB).unwrap();
    assert!(
        sim.check_handout(D0, new, b.ptr().0, MIB as u64),
        "{:?}",
        sim.violations()
    );
    assert_ne!(b.ptr(), addr, "the lingering cache is covered by no fence");
    drop(b);
    // Out of memory, the device is synchronised (no capture runs) and the lingering cache,
    // now covered, serves the new stream; the destroyed stream is never touched (the
    // simulator fails any call on it).
    let mut held = Vec::new();
    loop {
        match pool.malloc(D0, &new, 2 * MIB) {
            Ok(x) => {
                sim.submit_use(D0, new, x.ptr().0, 2 * MIB as u64);
                held.push(x);
            }
            Err(PoolError::OutOfMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        held.len() * 2 * MIB,
        64 * MIB,
        "the lingering cache is reached after the device-wide synchronisation"
    );
    for x in &held {
        assert!(sim.check_handout(D0, new, x.ptr().0, 2 * MIB as u64));
    }
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn the_same_stream_coming_back_takes_its_lingering_cache_in_its_own_order() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let s = recurring(&pool, 0x7f00);
    let a = pool.malloc(D0, &s, MIB).unwrap();
    let addr = a.ptr();
    sim.submit_use(D0, s, addr.0, MIB as u64);
    drop(a);
    // Another stream does not get the unfenced memory...
    let other = StreamKey(0x9000);
    let o = pool.malloc(D0, &other, MIB).unwrap();
    assert_ne!(o.ptr(), addr);
    assert!(sim.check_handout(D0, other, o.ptr().0, MIB as u64));
    // ...the same stream does, at once.
    let b = pool.malloc(D0, &s, MIB).unwrap();
    assert_eq!(b.ptr(), addr);
    assert!(sim.check_handout(D0, s, b.ptr().0, MIB as u64));
    drop((o, b));
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn a_capture_begun_between_two_allocations_gets_private_memory_and_no_fence() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let s = recurring(&pool, 0x7f00);
    let a = pool.malloc(D0, &s, MIB).unwrap();
    let a_addr = a.ptr();
    sim.submit_use(D0, s, a_addr.0, MIB as u64);
    // A capture begins on the stream between this allocation and the next: the next comes
    // from the capture's private pool (as the driver layer routes it), never from the stream's
    // cache; the free of the eager block during the capture records nothing into the capture
    // (the stream lingers, untouched, as any stream whose last block is freed).
    sim.set_capturing(s, true);
    let id = PrivatePoolId(7);
    let hold = pool.retain_private_pool(D0, id).unwrap();
    let p = pool.malloc_private(D0, id, &s, MIB).unwrap();
    assert_ne!(p.ptr(), a_addr);
    let calls = sim.calls();
    drop(a);
    let after = sim.calls();
    assert_eq!(
        after.record_fence, calls.record_fence,
        "nothing recorded into the capture"
    );
    assert_eq!(after.stream_wait_fence, calls.stream_wait_fence);
    let q = pool.malloc_private(D0, id, &s, MIB).unwrap();
    assert_ne!(q.ptr(), a_addr, "the eager cache never serves the capture");
    drop((p, q));
    sim.set_capturing(s, false);
    drop(hold);
    // After the capture, the stream's own cache serves it again, in its own order: the block
    // freed during the capture lingered (a stream that let go of a capturing stream's cache
    // would have retired it, and served another address).
    let b = pool.malloc(D0, &s, MIB).unwrap();
    assert_eq!(b.ptr(), a_addr);
    assert!(sim.check_handout(D0, s, b.ptr().0, MIB as u64));
    drop(b);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn the_busy_fast_path_serves_only_a_busy_stream_from_its_recent_blocks() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let s = recurring(&pool, 0x7f00);
    assert!(
        pool.malloc_if_busy(D0, &s, MIB).unwrap().is_none(),
        "no live block: the handle may name another stream now"
    );
    let keep = pool.malloc(D0, &s, 2 * MIB).unwrap();
    let a = pool.malloc(D0, &s, MIB).unwrap();
    let addr = a.ptr();
    drop(a);
    let calls = sim.calls();
    let b = pool
        .malloc_if_busy(D0, &s, MIB)
        .unwrap()
        .expect("busy, a recent block");
    assert_eq!(b.ptr(), addr, "the stream's own recent block, in its order");
    assert_eq!(sim.calls(), calls, "no backend call");
    assert!(
        pool.malloc_if_busy(D0, &s, 8 * MIB).unwrap().is_none(),
        "no recent block of that size: the general path"
    );
    assert!(pool
        .malloc_if_busy(D0, &StreamKey(0x9000), MIB)
        .unwrap()
        .is_none());
    drop(b);
    pool.start_history(std::sync::Arc::new(crate::history::Recorder::new(
        16,
        crate::history::Clock::Real,
    )));
    assert!(
        pool.malloc_if_busy(D0, &s, MIB).unwrap().is_none(),
        "a recording takes the general path, which notes the allocation"
    );
    pool.stop_history();
    drop(keep);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn lingering_streams_are_bounded_and_the_rest_detach_with_their_fence() {
    // No stealing: each stream's blocks are its own shard's, so each last free is its own.
    let pool = vm_pool_no_steal(1 << 30, 2 * MIB);
    let sim = pool.backend();
    let max = crate::policy::MAX_LINGERING_STREAMS as u64;
    let streams: Vec<StreamKey> = (0..max + 8)
        .map(|i| recurring(&pool, 0x10_0000 + i))
        .collect();
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.attached_streams, max, "{st:?}");
    // The streams past the bound detach at every last free, with their fence.
    let before = sim.calls().record_fence;
    for s in &streams {
        let a = pool.malloc(D0, s, MIB).unwrap();
        sim.submit_use(D0, *s, a.ptr().0, MIB as u64);
        drop(a);
    }
    assert_eq!(sim.calls().record_fence - before, 8);
    // A lingering one coming back leaves room for another. (The stream past the bound comes
    // back once first: its detached shard may have been adopted by a newer stream meanwhile,
    // and a stream is recurring only once it came back to its own shard.)
    let back = pool.malloc(D0, &streams[0], MIB).unwrap();
    let extra = streams[max as usize];
    drop(pool.malloc(D0, &extra, MIB).unwrap());
    let a = pool.malloc(D0, &extra, MIB).unwrap();
    sim.submit_use(D0, extra, a.ptr().0, MIB as u64);
    let before = sim.calls().record_fence;
    drop(a);
    assert_eq!(
        sim.calls().record_fence,
        before,
        "it lingers now, with no fence"
    );
    drop(back);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn free_all_blocks_gives_back_the_cache_of_a_destroyed_lingering_stream() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let h = StreamKey(0x7f00);
    let s = recurring(&pool, h.0);
    let a = pool.malloc(D0, &s, 8 * MIB).unwrap();
    sim.submit_use(D0, s, a.ptr().0, 8 * MIB as u64);
    drop(a); // lingers, unfenced
    sim.destroy_stream(h);
    assert!(sim.physical_bytes(D0) >= 8 * MIB as u64);
    pool.free_all_blocks().unwrap();
    assert_eq!(
        sim.physical_bytes(D0),
        0,
        "one device synchronisation covers it"
    );
    assert_eq!(pool.stats(D0).unwrap().attached_streams, 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn a_failed_request_leaves_no_stream_attached_that_its_owner_may_destroy() {
    for (what, fail) in [
        ("out of memory", None),
        (
            "a backend error while growing",
            Some(crate::sim::SimCall::CreatePhysical),
        ),
        (
            "a fence query failing",
            Some(crate::sim::SimCall::FenceCompleted),
        ),
    ] {
        let pool = vm_pool(64 * MIB, 2 * MIB);
        let sim = pool.backend();
        let h = StreamKey(0x7f00);
        let s = recurring(&pool, h.0);
        if fail == Some(crate::sim::SimCall::FenceCompleted) {
            // A whole page freed while marked with another stream: its free waits for that
            // stream's fence, which the next request polls (and the poll fails).
            let b = pool.malloc(D0, &s, 2 * MIB).unwrap();
            b.record_stream(&StreamKey(0x9100)).unwrap();
            sim.submit_work(D0, StreamKey(0x9100));
            drop(b);
        }
        // The lingering stream comes back with a request that fails...
        let size = match fail {
            Some(crate::sim::SimCall::FenceCompleted) => {
                sim.inject_failure(crate::sim::SimCall::FenceCompleted, 1);
                2 * MIB
            }
            Some(call) => {
                sim.inject_failure(call, 1);
                8 * MIB
            }
            None => 128 * MIB,
        };
        assert!(pool.malloc(D0, &s, size).is_err(), "{what}");
        sim.clear_failures();
        // ...so no block made on it is live and its owner destroys it. Nothing may touch it
        // afterwards: not the next new stream's clean-up, not a free_all_blocks.
        sim.destroy_stream(h);
        let t = StreamKey(0x9000);
        drop(pool.malloc(D0, &t, MIB).unwrap());
        pool.free_all_blocks().unwrap();
        assert!(
            sim.violations().is_empty(),
            "{what}: {:?}",
            sim.violations()
        );
    }
}

#[test]
fn the_simulator_counts_a_capture_question_about_a_destroyed_stream_as_a_violation() {
    let sim = SimulatedBackend::h200(1);
    let h = StreamKey(0x7f00);
    sim.borrow_stream(h);
    let s = sim.stream_uid(h);
    assert!(!sim.is_capturing(&s));
    assert!(sim.violations().is_empty());
    sim.destroy_stream(h);
    sim.create_stream(h);
    let _ = sim.capture_id(&s); // the old stream, by its stale uid
    assert_eq!(sim.violations().len(), 1, "{:?}", sim.violations());
    let _ = sim.is_capturing(&s);
    assert_eq!(sim.violations().len(), 2, "{:?}", sim.violations());
}
