//! CPU benchmark of the pool's hot path on the simulated backend.
//!
//! ```text
//! cargo bench -p cudars-mempool --bench hot_path
//! ```
//!
//! * same-size `malloc`+`free` pairs on one thread at 512 B, 1 MiB and 64 MiB
//!   (target on the GPU: <= 50 ns a pair; the hot path makes no backend call, so the
//!   simulated backend measures the same code);
//! * 1, 2, 4, 8, 16 threads, each on its own stream (target: 16 threads >= 12x one
//!   thread's pairs per second, on a machine with 16 cores).
//!
//! The GPU bundle runs the same scenarios with the driver backend beside
//! `cuMemAllocAsync`; these figures are for the CPU side only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};

const PAIRS: u64 = 2_000_000;

fn pairs(pool: &MemoryPool<SimulatedBackend>, stream: StreamKey, size: u64, n: u64) -> Duration {
    let dev = DeviceId(0);
    // Warm the cache of this stream.
    drop(
        pool.malloc(dev, &stream, size as usize)
            .expect("warm-up allocation"),
    );
    let start = Instant::now();
    for _ in 0..n {
        let a = pool
            .malloc(dev, &stream, size as usize)
            .expect("allocation");
        black_box(a.ptr());
        drop(a);
    }
    start.elapsed()
}

fn main() {
    let pool = MemoryPool::new(SimulatedBackend::h200(1)).expect("pool");
    println!("single thread, same-size malloc+free pairs");
    for (label, size) in [("512 B", 512u64), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)] {
        let best = (0..5)
            .map(|_| pairs(&pool, StreamKey(1), size, PAIRS))
            .min()
            .unwrap_or_default();
        println!(
            "  {label:>7}: {:6.1} ns/pair",
            best.as_nanos() as f64 / PAIRS as f64
        );
    }

    println!("scaling, 512 B pairs, one stream per thread (best of 3 runs)");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut one = 0.0;
    for threads in [1usize, 2, 4, 8, 16] {
        let rate = (0..3)
            .map(|_| scaling_run(&pool, threads))
            .fold(0.0, f64::max);
        if threads == 1 {
            one = rate;
        }
        println!(
            "  {threads:>2} threads: {:8.1} M pairs/s ({:4.1}x one thread){}",
            rate / 1e6,
            rate / one,
            if threads > cores {
                "  [more threads than cores]"
            } else {
                ""
            }
        );
    }
}

/// Pairs per second of `threads` threads, each on its own stream: all pairs over the
/// wall time from the common start to the last thread's end.
fn scaling_run(pool: &MemoryPool<SimulatedBackend>, threads: usize) -> f64 {
    let per_thread = PAIRS / 2;
    let barrier = Barrier::new(threads + 1);
    let start = std::thread::scope(|s| {
        for t in 0..threads {
            let barrier = &barrier;
            s.spawn(move || {
                let stream = StreamKey(100 + t as u64);
                drop(pool.malloc(DeviceId(0), &stream, 512).expect("warm-up"));
                barrier.wait();
                pairs(pool, stream, 512, per_thread);
            });
        }
        barrier.wait();
        Instant::now()
        // The scope joins every thread before returning.
    });
    let wall = start.elapsed();
    (per_thread * threads as u64) as f64 / wall.as_secs_f64()
}
