//! The per-thread default stream: its handle names the calling thread's stream.

use super::*;

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
