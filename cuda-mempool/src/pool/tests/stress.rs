//! The per-thread default stream with the driver's handle semantics, under stress; recordings under the hot path.

use super::*;

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
