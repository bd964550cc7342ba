//! Benchmark: cuda-mempool's `MemoryPool` on the GPU (driver backend) against the driver's
//! own allocators, in the same run.
//!
//! Rows (all medians after a warm-up):
//! - `pool_pair_{512B,1MiB,64MiB}`: ns per same-size `malloc_stream`+drop pair on one thread; raw
//!   column: a warm `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` pair on a driver pool with
//!   the release threshold at `u64::MAX`. Target <= 50 ns.
//! - `raw_cumemalloc_pair_1MiB`: `cuMemAlloc` + `cuMemFree`, for context.
//! - `async_pool_pair_{512B,1MiB,64MiB}`: cuda-mempool's `AsyncPool`, raw column as above.
//! - `pool_pair_history_on_1MiB`: the 1 MiB pair while the memory history records (issue 37);
//!   raw: the same pair with the recording off (the `pool_pair_1MiB` figure).
//! - `pool_scaling_{1,2,4,8,16}t`: million 1 MiB pairs per second, each thread on its own
//!   stream, threads released together by a barrier; 16 threads >= 14x one thread. Raw
//!   column: a CPU-bound loop that shares nothing, on the same threads, scaled to the
//!   pool's one-thread figure (the machine's own scaling: turbo, SMT). Beside it, to find
//!   where the pool loses: `pool_scaling_generic_malloc_*` (`MemoryPool::malloc`, no capture
//!   check or hooks), `pool_scaling_pool_per_thread_*` (one pool per thread: nothing of the
//!   pool shared) and `pool_scaling_cpu_loop_*` (the loop itself).
//! - `replay_<trace>`: peak reserved / peak requested of the trace replayed through the
//!   driver backend on the GPU with no forced synchronisation (`FenceRule::Never`: fences
//!   complete when the GPU completes them); raw column: the same replay on the simulated
//!   backend, whose device completes nothing by itself. Target <= 1.05. Plus
//!   `replay_<trace>_ns_per_op` (the replay loop's host time per operation) and
//!   `replay_<trace>_no_steal` (the same with `PoolConfig::steal_before_growing` off).
//!   Traces are read from `$CUDA_RS_TRACES` (default `traces`).
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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cudars_core::async_pool::{self, MemPool};
use cudars_core::memory::{DeviceMemory, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Stream};
use cudars_mempool::async_pool::{AsyncPool, AsyncPoolSource};
use cudars_mempool::driver::device_id;
use cudars_mempool::history::{Clock, Recorder};
use cudars_mempool::pinned::PinnedMemoryPool;
use cudars_mempool::replay::{self, ReplayOptions, TraceOp};
use cudars_mempool::DevicePool;
use workspace_tests::bench::{median, ns_per_call, Report, Target};

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

/// Million calls per second of `threads` threads together, each calling its own `make(i)`
/// closure `SCALING_CALLS` times: the median of 5 runs. The threads are started first and
/// released together by a barrier; the clock runs from the release to the last thread's
/// end, so neither thread creation nor a late start counts.
fn scaling<F: FnMut() + Send>(threads: usize, mut make: impl FnMut(usize) -> F) -> f64 {
    const SCALING_CALLS: usize = 1_000_000;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let fs: Vec<F> = (0..threads).map(&mut make).collect();
        let barrier = Barrier::new(threads + 1);
        let secs = std::thread::scope(|sc| {
            let handles: Vec<_> = fs
                .into_iter()
                .map(|mut f| {
                    let barrier = &barrier;
                    sc.spawn(move || {
                        for _ in 0..1_000 {
                            f();
                        }
                        barrier.wait();
                        for _ in 0..SCALING_CALLS {
                            f();
                        }
                        Instant::now()
                    })
                })
                .collect();
            barrier.wait();
            let t = Instant::now();
            let end = handles
                .into_iter()
                .map(|h| h.join().expect("scaling thread"))
                .max()
                .unwrap_or(t);
            end.duration_since(t).as_secs_f64()
        });
        runs.push((threads * SCALING_CALLS) as f64 / secs / 1e6);
    }
    median(&mut runs)
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
            drop(pool.malloc(id, &stream, size).expect("pool malloc"));
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
            // Where the external-stream pair's time goes (issue 49 asks for the breakdown
            // before any change), each part alone in the same run:
            // 1. the capture question every allocation on a foreign stream asks the driver;
            let query = ns_per_call(10_000, 21, 100_000, || {
                std::hint::black_box(
                    cudars_core::graph::capture_info(&foreign).expect("capture info"),
                );
            });
            report.row(
                "external_part_capture_query",
                "ns",
                query,
                Some(ext),
                "pool_pair_external_stream_1MiB",
                Target::None,
            );
            // 2. the pair with another block kept live on the stream: the stream's shard
            //    stays attached, so no detach (fence record) and re-attach per pair;
            let keep = pool.malloc_stream(&foreign, size).expect("pool malloc");
            let held = ns_per_call(10_000, 21, 100_000, || {
                drop(pool.malloc_stream(&foreign, size).expect("pool malloc"));
            });
            drop(keep);
            report.row(
                "external_part_pair_stream_held",
                "ns",
                held,
                Some(ext),
                "pool_pair_external_stream_1MiB",
                Target::None,
            );
            // 3. wrapping the handle as the C ABI does on every call (`Stream::external`: it
            //    asks the driver the stream's capture status and device);
            let wrap = ns_per_call(10_000, 21, 100_000, || {
                // SAFETY: `stream` outlives the wrapper, which is dropped at once.
                std::hint::black_box(
                    unsafe { Stream::external(&dev, stream.raw()) }.expect("wrap"),
                );
            });
            report.row(
                "external_part_wrap_handle",
                "ns",
                wrap,
                Some(ext),
                "pool_pair_external_stream_1MiB",
                Target::None,
            );
            // 4. the C ABI's pair, as PyTorch's pluggable allocator makes it (its own pool,
            //    the library's global one): cuda_mempool_alloc + cuda_mempool_torch_free on
            //    the raw handle;
            let raw_handle = stream.raw().cast::<std::ffi::c_void>();
            let ordinal = dev.ordinal() as std::ffi::c_int;
            let capi = ns_per_call(10_000, 21, 100_000, || {
                // SAFETY: a live stream of device `ordinal`; the block is freed at once, on
                // the stream it was made on.
                unsafe {
                    let p = cudars_mempool_capi::cuda_mempool_alloc(size, ordinal, raw_handle);
                    assert!(!p.is_null(), "C ABI alloc");
                    cudars_mempool_capi::cuda_mempool_torch_free(
                        p,
                        size as isize,
                        ordinal,
                        raw_handle,
                    );
                }
            });
            report.row(
                "capi_pair_alloc_torch_free_1MiB",
                "ns",
                capi,
                Some(raw),
                "cuMemAllocAsync",
                Target::None,
            );
            // Issue 49's fast path, through the entry points PyTorch calls: the pair on a
            // stream the framework created, against the pool's pair on its own stream
            // (`ours`, target: at most 2x, and at most 150 ns). PyTorch's route
            // (cuda_mempool_torch_alloc + cuda_mempool_torch_free) before and after the
            // capture hooks are installed (cuda_mempool_torch_announce_captures: the driver is
            // asked about captures only while PyTorch's run), the plain C route, and the two
            // driver calls that bound it from below.
            // PyTorch's route on a stream of its own (a stream that reaches the pool through
            // one route only, as in a PyTorch program: the pool keeps the wrapper of the request
            // that attached it).
            let torch_stream = Stream::new(&dev)?;
            let torch_handle = torch_stream.raw().cast::<std::ffi::c_void>();
            let torch_pair = || {
                ns_per_call(10_000, 21, 100_000, || {
                    // SAFETY: a live stream of device `ordinal`; freed at once, on its stream.
                    unsafe {
                        let p = cudars_mempool_capi::cuda_mempool_torch_alloc(
                            size as isize,
                            ordinal,
                            torch_handle,
                        );
                        assert!(!p.is_null(), "torch alloc");
                        cudars_mempool_capi::cuda_mempool_torch_free(
                            p,
                            size as isize,
                            ordinal,
                            torch_handle,
                        );
                    }
                })
            };
            let unannounced = torch_pair();
            report.row(
                "capi_torch_pair_1MiB",
                "ns",
                unannounced,
                Some(ours),
                "pool_pair_1MiB",
                Target::None,
            );
            // SAFETY: no capture runs in this program; nothing here captures PyTorch streams.
            unsafe { cudars_mempool_capi::cuda_mempool_torch_announce_captures() };
            let announced = torch_pair();
            report.row(
                "capi_torch_pair_announced_1MiB",
                "ns",
                announced,
                Some(ours),
                "pool_pair_1MiB",
                Target::AtMost(150.0),
            );
            // The same with another block live on the stream (a training step's tensors):
            // SAFETY: a live stream of device `ordinal`; the block is freed below.
            let keep = unsafe {
                cudars_mempool_capi::cuda_mempool_torch_alloc(size as isize, ordinal, torch_handle)
            };
            let busy = torch_pair();
            // SAFETY: a live block of this library, freed once.
            unsafe { cudars_mempool_capi::cuda_mempool_free(keep) };
            report.row(
                "capi_torch_pair_announced_stream_busy_1MiB",
                "ns",
                busy,
                Some(ours),
                "pool_pair_1MiB",
                Target::AtMost(150.0),
            );
            let plain_c = ns_per_call(10_000, 21, 100_000, || {
                // SAFETY: as above.
                unsafe {
                    let p = cudars_mempool_capi::cuda_mempool_alloc(size, ordinal, raw_handle);
                    assert!(!p.is_null(), "C ABI alloc");
                    cudars_mempool_capi::cuda_mempool_free(p);
                }
            });
            report.row(
                "capi_plain_pair_1MiB",
                "ns",
                plain_c,
                Some(ours),
                "pool_pair_1MiB",
                Target::None,
            );
            // The parts of the torch route's pair, each alone: the pool's pair on the stream
            // wrapped as PyTorch's route wraps it (announced: no capture question; lingering
            // at the last free), the same through into_raw/free_raw (what the C layer calls),
            // and with the C layer's registry insert and remove around it.
            // SAFETY: `stream` outlives the wrapper and every block made on it here; nothing
            // captures it.
            let announced_stream = unsafe { Stream::external_announced(&dev, torch_stream.raw()) }?;
            let part_pool = ns_per_call(10_000, 21, 100_000, || {
                drop(
                    pool.malloc_stream(&announced_stream, size)
                        .expect("pool malloc"),
                );
            });
            report.row(
                "capi_part_pool_pair_announced",
                "ns",
                part_pool,
                Some(announced),
                "capi_torch_pair_announced_1MiB",
                Target::None,
            );
            let part_raw = ns_per_call(10_000, 21, 100_000, || {
                let raw = pool
                    .malloc_stream(&announced_stream, size)
                    .expect("pool malloc")
                    .into_raw();
                pool.free_raw(raw).expect("free_raw");
            });
            report.row(
                "capi_part_raw_pair",
                "ns",
                part_raw,
                Some(announced),
                "capi_torch_pair_announced_1MiB",
                Target::None,
            );
            let registry = cudars_mempool_capi::registry::Registry::new();
            let part_reg = ns_per_call(10_000, 21, 100_000, || {
                let raw = pool
                    .malloc_stream(&announced_stream, size)
                    .expect("pool malloc")
                    .into_raw();
                let addr = raw.ptr().0;
                assert!(registry.insert_with(raw, None, 1).is_none());
                let (raw, _, _) = registry.remove_with(addr).expect("recorded");
                pool.free_raw(raw).expect("free_raw");
            });
            report.row(
                "capi_part_raw_pair_registry",
                "ns",
                part_reg,
                Some(announced),
                "capi_torch_pair_announced_1MiB",
                Target::None,
            );
            let uid = ns_per_call(10_000, 21, 100_000, || {
                // SAFETY: a live explicit stream of `dev`.
                std::hint::black_box(unsafe {
                    cudars_core::stream::external_uid(&dev, torch_stream.raw())
                });
            });
            report.row(
                "driver_floor_cuStreamGetId",
                "ns",
                uid,
                Some(announced),
                "capi_torch_pair_announced_1MiB",
                Target::None,
            );
            report.row(
                "driver_floor_capture_query",
                "ns",
                query,
                Some(announced),
                "capi_torch_pair_announced_1MiB",
                Target::None,
            );
            // 5. a fence record on the stream (what a detach records) alone.
            let fence = cudars_core::Event::new(&dev)?;
            let record = ns_per_call(10_000, 21, 100_000, || {
                fence.record(&foreign).expect("event record");
            });
            report.row(
                "external_part_event_record",
                "ns",
                record,
                Some(ext),
                "pool_pair_external_stream_1MiB",
                Target::None,
            );
            // The memory history recording (issue 37): the same pair with a recorder on,
            // against the pair with it off (the first row: one relaxed load per call).
            let rec = Arc::new(Recorder::new(1 << 20, Clock::Real));
            pool.start_history(rec);
            let recorded = ns_per_call(10_000, 21, 100_000, || {
                drop(pool.malloc_stream(&stream, size).expect("pool malloc"));
            });
            pool.stop_history();
            report.row(
                "pool_pair_history_on_1MiB",
                "ns",
                recorded,
                Some(ours),
                "history off",
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

    // Scaling: each thread its own stream, 1 MiB pairs (see `scaling`).
    let mut one = [0.0f64; 4];
    for threads in [1usize, 2, 4, 8, 16] {
        let streams = &all_streams[..threads];
        let shared = scaling(threads, |i| {
            let s = &streams[i];
            let pool = &pool;
            move || drop(pool.malloc_stream(s, MIB).expect("pool malloc"))
        });
        let generic = scaling(threads, |i| {
            let s = &streams[i];
            let pool = &pool;
            move || drop(pool.malloc(id, s, MIB).expect("pool malloc"))
        });
        // One pool per thread: nothing of the pool is shared between the threads.
        let own_pools: Vec<DevicePool> = (0..threads)
            .map(|_| DevicePool::new_driver())
            .collect::<Result<_, _>>()?;
        let separate = scaling(threads, |i| {
            let s = &streams[i];
            let pool = &own_pools[i];
            move || drop(pool.malloc_stream(s, MIB).expect("pool malloc"))
        });
        drop(own_pools);
        // The machine's own scaling: a loop of about a pair's cost that shares nothing (a
        // lock word of its own, a block of arithmetic), so turbo and SMT show alone.
        let cpu = scaling(threads, |_| {
            let word = Box::new(std::sync::atomic::AtomicU64::new(0));
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            move || {
                for _ in 0..24 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                }
                let _ = word.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed);
                word.store(0, Ordering::Release);
                std::hint::black_box(x);
            }
        });
        let rates = [shared, generic, separate, cpu];
        if threads == 1 {
            one = rates;
        }
        let target = if threads == 16 {
            Target::AtLeast(14.0 * one[0])
        } else {
            Target::None
        };
        report.row(
            &format!("pool_scaling_{threads}t"),
            "Mpairs/s",
            shared,
            Some(cpu * one[0] / one[3]),
            "CPU-bound loop, same threads, scaled to 1t",
            target,
        );
        for (name, rate) in [
            ("generic_malloc", generic),
            ("pool_per_thread", separate),
            ("cpu_loop", cpu),
        ] {
            report.row(
                &format!("pool_scaling_{name}_{threads}t"),
                "Mpairs/s",
                rate,
                None,
                "-",
                Target::None,
            );
        }
        println!(
            "  {threads} threads, speed-up over 1 thread: pool {:.2}x, generic malloc {:.2}x, \
             pool per thread {:.2}x, CPU-bound loop {:.2}x",
            shared / one[0],
            generic / one[1],
            separate / one[2],
            cpu / one[3]
        );
    }
    pool.free_all_blocks()?;

    // Trace replays.
    let dir = std::env::var_os("CUDA_RS_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("traces"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read traces in {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    for path in files {
        let trace = replay::load_trace(&path)?;
        for steal in [true, false] {
            let mut options = ReplayOptions::default();
            options.config.steal_before_growing = steal;
            let suffix = if steal { "" } else { "_no_steal" };
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
                DevicePool::with_config(cudars_mempool::DriverBackend::new()?, options.config)?;
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
                &format!("replay_{}{suffix}", trace.name),
                "x",
                gpu.ratio,
                Some(sim.ratio),
                "simulated backend",
                if steal {
                    Target::AtMost(1.05)
                } else {
                    Target::None
                },
            );
            report.row(
                &format!("replay_{}{suffix}_ns_per_op", trace.name),
                "ns",
                gpu.ns_per_op,
                Some(sim.ns_per_op),
                "simulated backend",
                Target::None,
            );
            println!(
                "  {}{suffix} ({}): peak requested {} B, reserved {} B on the GPU, {} B simulated; pages moved {} on the GPU",
                trace.name,
                gpu.fence_rule,
                gpu.peak_requested,
                gpu.peak_reserved,
                sim.peak_reserved,
                gpu.stats.pages_moved
            );
            gpu_pool.free_all_blocks()?;
            drop(gpu_pool);
            drop(real);
        }
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
