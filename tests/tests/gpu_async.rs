//! GPU: awaiting the device (`cudars_core::completion`, `cudars_xfer::PendingFuture`) on
//! tokio runtimes, every test in both wake modes (parked, the default, and warm, set for the
//! whole process while the test runs).
//!
//! - 10,000 concurrent futures (both wake strategies, stream and event completions) on a
//!   multi-threaded runtime resolve only once their kernel's write is visible to the host;
//!   warm, with a budget longer than the wait, they all spin at once, and the threads that
//!   spin are never more than the runtime's workers;
//! - a future awaited while a slow kernel runs leaves the runtime free: another task on a
//!   single-threaded runtime counts its turns meanwhile (warm: while the future spins through
//!   the whole kernel, a bounded slice per poll);
//! - futures and transfer futures dropped mid-flight are collected by the reactor and free
//!   their buffers after the device is done (run by `run.sh sanitize` too: memcheck must
//!   find nothing, since no buffer is freed under a DMA);
//! - awaited transfers give their buffers back with the right data; `drop_after`.
//!
//! The device-fault case kills the context, so it runs in a child process of its own
//! binary, `gpu_async_fault`.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cudars_core::completion::{self, WakeMode, WakeStrategy, WarmConfig};
use cudars_core::memory::{PinnedFlags, PinnedMemory};
use cudars_core::{DevicePtr, Stream};
use cudars_xfer::{to_device_async, to_host_async, DeviceBuffer, PinnedBuffer};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

fn multi_thread(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .build()
        .unwrap()
}

/// Waits up to `limit` for the reactor to hold no wait (nothing leaked).
fn reactor_drains(limit: Duration) {
    let start = Instant::now();
    while completion::stats().waits != 0 {
        assert!(
            start.elapsed() < limit,
            "the reactor still holds {} waits after {limit:?}",
            completion::stats().waits
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sets the process's wake mode while it lives (the tests run one at a time: `serial`).
struct ProcessMode(WakeMode);

impl ProcessMode {
    fn set(mode: WakeMode) -> ProcessMode {
        let previous = completion::wake_mode();
        completion::set_wake_mode(mode);
        ProcessMode(previous)
    }
}

impl Drop for ProcessMode {
    fn drop(&mut self) {
        completion::set_wake_mode(self.0);
    }
}

/// Warm with a spin budget of `budget`.
fn warm(budget: Duration) -> WakeMode {
    WakeMode::Warm(WarmConfig::new(budget).unwrap())
}

/// Polls `f` once with a waker that does nothing; `true` when it resolved.
fn poll_once<F: Future + Unpin>(f: &mut F) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(f).poll(&mut cx), Poll::Ready(_))
}

#[test]
fn ten_thousand_concurrent_futures_complete_with_correct_results_parked() {
    let _serial = serial();
    let _mode = ProcessMode::set(WakeMode::Parked);
    ten_thousand_concurrent_futures(false);
}

#[test]
fn ten_thousand_concurrent_warm_futures_spin_on_no_more_threads_than_the_workers() {
    let _serial = serial();
    // A budget longer than the test: every future spins until its kernel is done.
    let _mode = ProcessMode::set(warm(Duration::from_secs(10)));
    ten_thousand_concurrent_futures(true);
}

/// `n` futures (10,000 by default) of each kind on 4 workers, pending together behind a
/// gate; `warm`: checks the spinning threads.
fn ten_thousand_concurrent_futures(warm: bool) {
    // `run.sh sanitize` asks for fewer: every launch is instrumented there.
    let n: usize = std::env::var("CUDA_RS_ASYNC_FUTURES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    const STREAMS: usize = 16;
    const WORKERS: usize = 4;
    let dev = dev0();
    let k = Arc::new(Kernels::load(&dev).unwrap());
    let streams: Arc<Vec<Stream>> = Arc::new(
        (0..STREAMS)
            .map(|_| Stream::builder(&dev).non_blocking(true).build().unwrap())
            .collect(),
    );
    // Mapped pinned memory: the kernel writes it, the task reads it right after its await.
    let mapped = Arc::new(PinnedMemory::new(&dev, n * 4, PinnedFlags::DEVICE_MAP).unwrap());
    let dev_base = mapped.device_ptr().expect("mapped");
    let host_base = mapped.as_ptr() as usize;
    // SAFETY: n * 4 bytes of live pinned memory; nothing runs on the device yet.
    unsafe { std::ptr::write_bytes(host_base as *mut u8, 0, n * 4) };
    // A gate: every stream first runs a `wait_flag` kernel on a mapped word, so no fill can
    // finish before the host opens it. The host opens it once every task is parked on its
    // future (or arrivals stall for 500 ms: a stream's launch queue may be full, and a
    // launch blocks until the device drains it). The futures are then pending together, on
    // any machine and however fast the launches are.
    let gate = PinnedMemory::new(&dev, 4, PinnedFlags::DEVICE_MAP).unwrap();
    let gate_dev = gate.device_ptr().expect("mapped");
    let gate_host = gate.as_ptr() as usize;
    // SAFETY: 4 bytes of live pinned memory; no kernel reads it yet.
    unsafe { std::ptr::write_volatile(gate_host as *mut u32, 0) };
    for s in streams.iter() {
        // SAFETY: the gate is mapped pinned memory that outlives every kernel (dropped after
        // the runtime is done and the streams drained).
        unsafe { k.wait_flag_raw(s, gate_dev, k.cycles_for(Duration::from_secs(30))) }.unwrap();
    }

    let arrived = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let rt = multi_thread(WORKERS);
    let before = completion::stats();
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (k, streams) = (Arc::clone(&k), Arc::clone(&streams));
            let (arrived, in_flight, peak) = (
                Arc::clone(&arrived),
                Arc::clone(&in_flight),
                Arc::clone(&peak),
            );
            rt.spawn(async move {
                let stream = &streams[i % STREAMS];
                let value = i as u32 + 1;
                // SAFETY: element i of the mapped buffer, alive until every task ended.
                unsafe { k.fill_u32_raw(stream, dev_base + 4 * i as u64, value, 1) }.unwrap();
                let done = match i % 3 {
                    0 => stream.completion_with(WakeStrategy::Poll).unwrap(),
                    1 => stream.completion_with(WakeStrategy::HostFunction).unwrap(),
                    _ => stream.record(None).unwrap().completion(),
                };
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                arrived.fetch_add(1, Ordering::SeqCst);
                done.await.unwrap();
                in_flight.fetch_sub(1, Ordering::SeqCst);
                // SAFETY: in bounds; the device wrote it before the completion.
                let seen = unsafe { std::ptr::read_volatile((host_base as *const u32).add(i)) };
                seen != value
            })
        })
        .collect();
    // Open the gate once all have arrived, or arrivals stalled for 500 ms (bounded: 30 s).
    let (mut last, mut since) = (0, Instant::now());
    while arrived.load(Ordering::SeqCst) < n && start.elapsed() < Duration::from_secs(30) {
        let a = arrived.load(Ordering::SeqCst);
        if a != last {
            (last, since) = (a, Instant::now());
        } else if since.elapsed() > Duration::from_millis(500) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let parked = arrived.load(Ordering::SeqCst);
    // SAFETY: 4 bytes of live pinned memory; the kernels only read it.
    unsafe { std::ptr::write_volatile(gate_host as *mut u32, 1) };
    let wrong = rt.block_on(async {
        let mut wrong = 0;
        for t in tasks {
            wrong += usize::from(t.await.unwrap());
        }
        wrong
    });
    let took = start.elapsed();
    let stats = completion::stats();
    println!(
        "{n} futures in {took:?}; {parked} parked before the gate opened; at most {} pending \
         at once; reactor: {stats:?}",
        peak.load(Ordering::SeqCst)
    );
    assert_eq!(
        wrong, 0,
        "futures resolved before their kernel's write was visible"
    );
    assert_eq!(in_flight.load(Ordering::SeqCst), 0);
    assert!(
        peak.load(Ordering::SeqCst) >= (n / 10).min(1000),
        "the futures were not concurrent"
    );
    if warm {
        let spun = stats.warm_threads - before.warm_threads;
        let resolved = stats.warm_resolved - before.warm_resolved;
        let parked = stats.warm_parked - before.warm_parked;
        println!(
            "warm: {spun} threads spun, at most {} at once; {resolved} futures resolved in \
             their spin, {parked} parked",
            stats.warm_spinning_peak
        );
        assert!(
            (1..=WORKERS).contains(&spun),
            "{spun} threads spun for warm waits; the runtime has {WORKERS} workers"
        );
        assert!(
            stats.warm_spinning_peak <= WORKERS,
            "{} threads spun at once",
            stats.warm_spinning_peak
        );
        assert!(
            resolved >= (n / 10) as u64,
            "only {resolved} of {n} futures resolved while spinning"
        );
        assert_eq!(stats.warm_spinning, 0, "a thread still counts as spinning");
    }
    for s in streams.iter() {
        s.synchronize().unwrap();
    }
    drop(gate);
    reactor_drains(Duration::from_secs(2));
    drop(mapped);
}

#[test]
fn a_future_awaited_while_a_slow_kernel_runs_leaves_the_runtime_free_parked() {
    let _serial = serial();
    let _mode = ProcessMode::set(WakeMode::Parked);
    a_future_awaited_while_a_slow_kernel_runs_leaves_the_runtime_free(false);
}

#[test]
fn a_future_awaited_while_a_slow_kernel_runs_leaves_the_runtime_free_warm() {
    let _serial = serial();
    // Spinning through the whole 500 ms kernel, in slices of 50 us a poll (the default).
    let _mode = ProcessMode::set(warm(Duration::from_secs(2)));
    a_future_awaited_while_a_slow_kernel_runs_leaves_the_runtime_free(true);
}

fn a_future_awaited_while_a_slow_kernel_runs_leaves_the_runtime_free(warm: bool) {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    for strategy in [WakeStrategy::Poll, WakeStrategy::HostFunction] {
        let before = completion::stats();
        // One runtime thread: if the await blocked it, the other task could not run.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let turns = Arc::new(AtomicU64::new(0));
        let finished = Arc::new(AtomicBool::new(false));
        let (waited, counted) = rt.block_on(async {
            let counter = {
                let (turns, finished) = (Arc::clone(&turns), Arc::clone(&finished));
                tokio::spawn(async move {
                    while !finished.load(Ordering::Acquire) {
                        turns.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                })
            };
            k.spin(&stream, k.cycles_for(Duration::from_millis(500)))
                .unwrap();
            let start = Instant::now();
            stream.completion_with(strategy).unwrap().await.unwrap();
            let waited = start.elapsed();
            let counted = turns.load(Ordering::Relaxed);
            finished.store(true, Ordering::Release);
            counter.await.unwrap();
            (waited, counted)
        });
        println!(
            "{strategy:?}: waited {waited:?} for a 500 ms kernel; the other task ran {counted} \
             turns meanwhile"
        );
        assert!(
            waited >= Duration::from_millis(400),
            "resolved before the kernel ended"
        );
        // Parked: the other task has the thread to itself. Warm: it runs between two polls
        // of the spinning future (each at most `poll_spin`, 50 us): at least one turn in
        // two polls.
        let least = if warm {
            waited.as_micros() as u64 / (2 * WarmConfig::default().poll_spin().as_micros() as u64)
        } else {
            10_000
        };
        assert!(
            counted >= least,
            "the runtime was blocked: {counted} turns (at least {least})"
        );
        if warm {
            let after = completion::stats();
            assert_eq!(
                after.warm_resolved - before.warm_resolved,
                1,
                "the future resolved in its spin"
            );
            assert_eq!(after.warm_parked, before.warm_parked, "it never parked");
        }
    }
    reactor_drains(Duration::from_secs(2));
}

#[test]
fn futures_dropped_mid_flight_are_collected_and_their_buffers_outlive_the_device_work_parked() {
    let _serial = serial();
    let _mode = ProcessMode::set(WakeMode::Parked);
    futures_dropped_mid_flight(false);
}

#[test]
fn futures_dropped_mid_flight_are_collected_and_their_buffers_outlive_the_device_work_warm() {
    let _serial = serial();
    // Dropped mid-spin: polled once, budget left.
    let _mode = ProcessMode::set(warm(Duration::from_secs(10)));
    futures_dropped_mid_flight(true);
}

fn futures_dropped_mid_flight(warm: bool) {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let len = 1 << 20;
    let src = DeviceBuffer::<u32>::alloc(&dev, len).unwrap();
    k.fill(&stream, src.as_ptr(), 7).unwrap();
    let before = completion::stats();
    // Gates: mapped words the host opens. Work queued behind a closed gate cannot finish, so
    // every future below is pending when polled and dropped, whatever the timing (a spin
    // kernel of a fixed length lost that race once on an H200). Two per round.
    const ROUNDS: usize = 20;
    let gates = PinnedMemory::new(&dev, 8 * ROUNDS, PinnedFlags::DEVICE_MAP).unwrap();
    let gates_dev = gates.device_ptr().expect("mapped");
    let gates_host = gates.as_ptr() as usize as *mut u32;
    // SAFETY: 8 * ROUNDS bytes of live pinned memory; no kernel reads it yet.
    unsafe { std::ptr::write_bytes(gates_host, 0, 2 * ROUNDS) };
    let bound = k.cycles_for(Duration::from_secs(30));
    let close = |i: usize| {
        // SAFETY: word `i` of the gates, which outlive every kernel (dropped after the stream
        // is drained below).
        unsafe { k.wait_flag_raw(&stream, gates_dev + 4 * i as u64, bound) }.unwrap();
    };
    // SAFETY: word `i` of the live gates; the device only reads it.
    let open = |i: usize| unsafe { std::ptr::write_volatile(gates_host.add(i), 1) };
    for round in 0..ROUNDS {
        // The last round's buffers are freed first: freeing pinned memory waits for the whole
        // device, which would wait for the gate this round closes.
        reactor_drains(Duration::from_secs(10));
        close(2 * round);
        // Never polled: nothing registered.
        drop(stream.completion_with(WakeStrategy::Poll).unwrap());
        // Polled once, then dropped, for each kind of wait.
        let mut polled = stream.completion_with(WakeStrategy::Poll).unwrap();
        assert!(!poll_once(&mut polled));
        drop(polled);
        let mut host = stream.completion_with(WakeStrategy::HostFunction).unwrap();
        assert!(!poll_once(&mut host));
        drop(host);
        let mut on_event = stream.record(None).unwrap().completion();
        assert!(!poll_once(&mut on_event));
        drop(on_event);
        // A staged upload may wait on the host for its own chunks: the gate opens first.
        open(2 * round);
        // Transfers: the device reads the Vec and writes the pinned buffer after the
        // futures are gone; the reactor keeps both until then.
        let (on_device, up) = to_device_async(vec![round as u32; len], &stream).unwrap();
        let mut up = up.into_future();
        // A staged source is read before the call returns; its last DMA may or may not be
        // done by now: either way the drop must be safe.
        let _ = poll_once(&mut up);
        drop(up);
        close(2 * round + 1);
        let out = PinnedBuffer::<u32>::zeroed(&dev, len).unwrap();
        let mut down = to_host_async(&src, out, &stream).unwrap().into_future();
        assert!(!poll_once(&mut down));
        drop(down);
        // And a value handed over directly.
        let done = stream.record(None).unwrap();
        completion::drop_after(&done, on_device).unwrap();
        if round + 1 < ROUNDS {
            open(2 * round + 1);
        }
    }
    // The last round's work is still behind its gate: the reactor must hold it.
    let held = completion::stats().waits;
    open(2 * ROUNDS - 1);
    println!("held after the drops: {held} waits");
    assert!(
        held > 0,
        "the reactor holds the dropped work until it is done"
    );
    let rt = multi_thread(2);
    rt.block_on(async { stream.completion().unwrap().await.unwrap() });
    drop(gates);
    // Host-function waits are collected at the next health check (100 ms).
    reactor_drains(Duration::from_secs(2));
    let after = completion::stats();
    println!("reactor before {before:?}, after {after:?}");
    assert_eq!(after.failed, before.failed, "nothing failed");
    if warm {
        assert_eq!(after.warm_spinning, 0, "a thread still counts as spinning");
        assert!(
            after.warm_resolved > before.warm_resolved,
            "no future resolved in its spin (the last await)"
        );
        assert_eq!(
            after.warm_parked, before.warm_parked,
            "a future dropped mid-spin parked"
        );
    }
}

#[test]
fn awaited_transfers_give_their_buffers_back_with_the_data_parked() {
    let _serial = serial();
    let _mode = ProcessMode::set(WakeMode::Parked);
    awaited_transfers_give_their_buffers_back_with_the_data();
}

#[test]
fn awaited_transfers_give_their_buffers_back_with_the_data_warm() {
    let _serial = serial();
    let _mode = ProcessMode::set(WakeMode::warm());
    let before = completion::stats();
    awaited_transfers_give_their_buffers_back_with_the_data();
    let after = completion::stats();
    assert!(
        after.warm_resolved + after.warm_parked > before.warm_resolved + before.warm_parked,
        "no future took the warm path: {after:?}"
    );
}

fn awaited_transfers_give_their_buffers_back_with_the_data() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let rt = multi_thread(2);
    rt.block_on(async {
        for len in [0usize, 1, 1000, 1 << 20] {
            let data: Vec<u32> = (0..len as u32).collect();
            let (on_device, pending) = to_device_async(data.clone(), &stream).unwrap();
            let back = pending.await.unwrap();
            assert_eq!(back, data, "the source comes back untouched");
            if len > 0 {
                k.add(&stream, on_device.as_ptr(), 5).unwrap();
            }
            let out = PinnedBuffer::<u32>::zeroed(&dev, len).unwrap();
            let out = to_host_async(&on_device, out, &stream)
                .unwrap()
                .await
                .unwrap();
            let want: Vec<u32> = data.iter().map(|x| x + 5).collect();
            assert_eq!(&out[..], &want[..]);
            // A pageable destination too.
            let out = to_host_async(&on_device, vec![0u32; len], &stream)
                .unwrap()
                .await
                .unwrap();
            assert_eq!(out, want);
        }
        // A completed event resolves on the first poll; one never recorded too (as
        // cuEventQuery says).
        let done = stream.record(None).unwrap();
        done.synchronize().unwrap();
        let mut c = done.completion();
        assert!(poll_once(&mut c), "done work resolves on the first poll");
        let never_recorded = cudars_core::Event::new(&dev).unwrap();
        let mut c = never_recorded.completion();
        assert!(poll_once(&mut c), "an unrecorded event is complete");
    });
    // drop_after: the view is freed once the memset is done.
    let scratch = DevicePtr::alloc(&dev, 1 << 20).unwrap();
    k.spin(&stream, k.cycles_for(Duration::from_millis(10)))
        .unwrap();
    scratch.memset_async(0, &stream).unwrap();
    let done = stream.record(None).unwrap();
    completion::drop_after(&done, scratch).unwrap();
    stream.synchronize().unwrap();
    reactor_drains(Duration::from_secs(2));
}
