//! Benchmark: cuda-mempool's `MemoryPool` on the GPU (driver backend) against the driver's
//! own allocators, in the same run.
//!
//! Rows (all medians after a warm-up):
//! - `pool_pair_{512B,1MiB,64MiB}`: ns per same-size `malloc_stream`+drop pair on one thread; raw
//!   column: a warm `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` pair on a driver pool with
//!   the release threshold at `u64::MAX`. Target <= 50 ns.
//! - `raw_cumemalloc_pair_1MiB`: `cuMemAlloc` + `cuMemFree`, for context.
//! - `async_pool_pair_{512B,1MiB,64MiB}`: cuda-mempool's `AsyncPool`, raw column as above.
//! - `pool_scaling_{1,2,4,8,16}t`: million 1 MiB pairs per second, each thread on its own
//!   stream; 16 threads >= 12x one thread.
//! - `replay_<trace>`: peak reserved / peak requested of the trace replayed through the
//!   driver backend on the GPU; raw column: the same replay on the simulated backend (the
//!   two must agree). Target <= 1.05. Plus `replay_<trace>_ns_per_op`. Traces are read from
//!   `$CUDA_RS_TRACES` (default `../shared/traces`).
//! - `pinned_pool_pair`: ns per 4 KiB pinned malloc+free pair; raw: `cuMemHostAlloc` +
//!   `cuMemFreeHost`. Target <= 100 ns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cuda_core::async_pool::{self, MemPool};
use cuda_core::memory::{DeviceMemory, PinnedFlags, PinnedMemory};
use cuda_core::{Device, Stream};
use cuda_mempool::async_pool::{AsyncPool, AsyncPoolSource};
use cuda_mempool::driver::device_id;
use cuda_mempool::pinned::PinnedMemoryPool;
use cuda_mempool::replay::{self, ReplayOptions, TraceOp};
use cuda_mempool::DevicePool;
use tests::bench::{median, ns_per_call, Report, Target};

type BoxError = Box<dyn std::error::Error>;

const MIB: usize = 1 << 20;

fn raw_async_pair(pool: &MemPool, stream: &Stream, size: usize) -> f64 {
    ns_per_call(2_000, 15, 20_000, || {
        let p = pool
            .alloc_async(size, stream)
            .expect("cuMemAllocFromPoolAsync");
        // SAFETY: p was just allocated from the pool on `stream` and nothing uses it.
        unsafe { async_pool::free_async(p, stream) }.expect("cuMemFreeAsync");
    })
}

/// Runs [`run`]; an error ends the program with its message and status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("bench_pool: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let dev = Device::new(0)?;
    let id = device_id(&dev);
    let mut report = Report::new("bench_pool");
    let stream = Stream::new(&dev)?;
    let all_streams: Vec<Stream> = (0..16)
        .map(|_| Stream::new(&dev))
        .collect::<Result<_, _>>()?;
    let pool = DevicePool::new_driver()?;

    let raw_pool = MemPool::new(&dev, None)?;
    raw_pool.set_release_threshold(u64::MAX)?;
    let astream = Arc::new(Stream::new(&dev)?);
    let apool = AsyncPool::new(&dev, AsyncPoolSource::New { max_size: None })?;
    for (name, size) in [("512B", 512usize), ("1MiB", MIB), ("64MiB", 64 * MIB)] {
        let ours = ns_per_call(10_000, 21, 100_000, || {
            drop(pool.malloc_stream(&stream, size).expect("pool malloc"));
        });
        let raw = raw_async_pair(&raw_pool, &stream, size);
        report.row(
            &format!("pool_pair_{name}"),
            "ns",
            ours,
            Some(raw),
            "cuMemAllocAsync",
            Target::AtMost(50.0),
        );
        // The same pair without the capture check and hooks of `malloc_stream` (the generic
        // `MemoryPool::malloc`): the detection's cost is the difference, in the same run.
        let plain = ns_per_call(10_000, 21, 100_000, || {
            drop(pool.malloc(id, &stream, size as u64).expect("pool malloc"));
        });
        report.row(
            &format!("pool_pair_without_capture_check_{name}"),
            "ns",
            plain,
            Some(ours),
            "malloc_stream (with the check)",
            Target::None,
        );
        if size == MIB {
            // A foreign stream (what the C ABI gets from PyTorch / CuPy): each allocation asks
            // the driver whether the stream is being captured (cuStreamGetCaptureInfo).
            // SAFETY: `stream` outlives the wrapper and every block made on it here.
            let foreign = unsafe { Stream::external(&dev, stream.raw()) }?;
            let ext = ns_per_call(10_000, 21, 100_000, || {
                drop(pool.malloc_stream(&foreign, size).expect("pool malloc"));
            });
            report.row(
                "pool_pair_external_stream_1MiB",
                "ns",
                ext,
                Some(raw),
                "cuMemAllocAsync",
                Target::None,
            );
        }
        let asy = ns_per_call(2_000, 15, 20_000, || {
            drop(apool.malloc(&astream, size).expect("async malloc"));
        });
        report.row(
            &format!("async_pool_pair_{name}"),
            "ns",
            asy,
            Some(raw),
            "cuMemAllocAsync",
            Target::None,
        );
    }
    stream.synchronize()?;
    astream.synchronize()?;
    let raw_alloc = ns_per_call(20, 11, 100, || {
        drop(DeviceMemory::new(&dev, MIB).expect("cuMemAlloc"));
    });
    report.row(
        "raw_cumemalloc_pair_1MiB",
        "ns",
        raw_alloc,
        None,
        "-",
        Target::None,
    );

    // Scaling: each thread its own stream, 1 MiB pairs.
    let pairs_per_thread = 200_000usize;
    let mut one_thread = 0.0;
    for threads in [1usize, 2, 4, 8, 16] {
        let streams = &all_streams[..threads];
        let mut runs = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            std::thread::scope(|sc| {
                for s in streams {
                    let pool = &pool;
                    sc.spawn(move || {
                        for _ in 0..pairs_per_thread {
                            drop(pool.malloc_stream(s, MIB).expect("pool malloc"));
                        }
                    });
                }
            });
            let secs = t.elapsed().as_secs_f64();
            runs.push((threads * pairs_per_thread) as f64 / secs / 1e6);
        }
        let rate = median(&mut runs);
        if threads == 1 {
            one_thread = rate;
        }
        let target = if threads == 16 {
            Target::AtLeast(12.0 * one_thread)
        } else {
            Target::None
        };
        report.row(
            &format!("pool_scaling_{threads}t"),
            "Mpairs/s",
            rate,
            None,
            "-",
            target,
        );
    }
    pool.free_all_blocks()?;

    // Trace replays.
    let dir = std::env::var_os("CUDA_RS_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/traces"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read traces in {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    for path in files {
        let trace = replay::load_trace(&path)?;
        let options = ReplayOptions::default();
        let sim = replay::replay(&trace, &options)?;
        // Map the trace's stream numbers onto real streams.
        let mut real: HashMap<u64, Stream> = HashMap::new();
        for op in &trace.ops {
            if let TraceOp::Alloc { stream, .. } = op {
                if let std::collections::hash_map::Entry::Vacant(e) = real.entry(stream.0) {
                    e.insert(Stream::new(&dev)?);
                }
            }
        }
        let gpu_pool =
            DevicePool::with_config(cuda_mempool::DriverBackend::new()?, options.config)?;
        let null = Stream::null(&dev);
        let gpu = replay::replay_on(
            &gpu_pool,
            id,
            &trace,
            options.fence_rule,
            |s| real.get(&s.0).cloned().unwrap_or_else(|| null.clone()),
            |_| {},
        )?;
        report.row(
            &format!("replay_{}", trace.name),
            "x",
            gpu.ratio,
            Some(sim.ratio),
            "simulated backend",
            Target::AtMost(1.05),
        );
        report.row(
            &format!("replay_{}_ns_per_op", trace.name),
            "ns",
            gpu.ns_per_op,
            Some(sim.ns_per_op),
            "simulated backend",
            Target::None,
        );
        println!(
            "  {}: peak requested {} B, reserved {} B on the GPU, {} B simulated",
            trace.name, gpu.peak_requested, gpu.peak_reserved, sim.peak_reserved
        );
        gpu_pool.free_all_blocks()?;
        drop(gpu_pool);
        drop(real);
    }

    // Pinned pool.
    let ppool = PinnedMemoryPool::new();
    let ours = ns_per_call(10_000, 21, 100_000, || {
        drop(ppool.malloc(&dev, 4096).expect("pinned malloc"));
    });
    let raw = ns_per_call(10, 11, 50, || {
        drop(PinnedMemory::new(&dev, 4096, PinnedFlags::PORTABLE).expect("cuMemHostAlloc"));
    });
    report.row(
        "pinned_pool_pair",
        "ns",
        ours,
        Some(raw),
        "cuMemHostAlloc",
        Target::AtMost(100.0),
    );
    Ok(())
}
