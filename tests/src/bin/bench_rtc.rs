//! `bench_rtc`: `cuda-rtc` on the GPU.
//!
//! - cold compile + load of `workspace_tests::rtc::SAXPY` to a cubin (NVRTC, then
//!   `cuModuleLoadData`), no cache;
//! - warm load from the disk cache: a fresh `Cache` over a directory that holds the entry (as
//!   a new process sees it: read, checksum, load), and from this process's memory;
//! - launch issue through typed, checked arguments (`Kernel::launch`) and unchecked ones,
//!   against raw `cuLaunchKernel` of the same function with the same arguments: 301 rounds of
//!   a 200-launch batch of each, in rotating order; the ratio is the median of the rounds'
//!   ratios (ours over the same round's raw batch), printed with its interquartile range.
//!
//! `rtc_peers.py` (run by `run.sh bench` and `run.sh rtc-bench`) measures the same compile
//! and warm-load scenarios through CuPy's `RawKernel` and `cuda.core`'s `Program`, in fresh
//! processes, into `peers.csv`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::ffi::c_void;
use std::time::Instant;

use cudars_core::sys::{self, CUresult, CUstream};
use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
use cudars_rtc::{Cache, Origin, Program};
use workspace_tests::bench::{median, ns_per_call, Report, Target};
use workspace_tests::rtc::{EMPTY, SAXPY};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const COLD_RUNS: usize = 7;
const WARM_RUNS: usize = 41;
const LAUNCH_BATCHES: usize = 301;
const LAUNCHES_PER_BATCH: usize = 200;

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_rtc: {e}");
        std::process::exit(1);
    }
}

fn raw_ok(r: Result<CUresult, sys::MissingSymbol>, call: &str) -> BoxResult<()> {
    match r {
        Ok(r) if r == CUresult::CUDA_SUCCESS => Ok(()),
        Ok(r) => Err(format!("{call} returned {}", r.0).into()),
        Err(e) => Err(e.into()),
    }
}

fn run() -> BoxResult<()> {
    let dev = Device::new(0)?;
    let compiler = cudars_rtc::Compiler::global()?;
    println!(
        "bench_rtc on {} (driver CUDA {}), NVRTC {}.{} from {}",
        dev.name()?,
        cudars_core::driver_version()?,
        compiler.version().0,
        compiler.version().1,
        compiler.path()
    );
    let _scope = dev.scope()?;
    let mut report = Report::new("bench_rtc");

    // 1. Cold: NVRTC + module load, nothing cached.
    let mut cold = Vec::new();
    for _ in 0..COLD_RUNS {
        let t = Instant::now();
        let k = Program::new(SAXPY)
            .name("saxpy.cu")
            .device(&dev)?
            .no_cache()
            .compile()?
            .load(&dev)?
            .kernel("saxpy")?;
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        drop(k);
    }
    report.row(
        "rtc cold compile+load (saxpy)",
        "ms",
        median(&mut cold),
        None,
        "-",
        Target::None,
    );

    // 2. Warm from disk: a fresh cache (empty memory) over a directory holding the entry.
    let dir = std::env::temp_dir().join(format!("bench-rtc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = Cache::in_dir(&dir);
    let program = || Program::new(SAXPY).name("saxpy.cu");
    program().device(&dev)?.cache(&first).compile()?;
    let mut disk = Vec::new();
    for _ in 0..WARM_RUNS {
        let fresh = Cache::in_dir(&dir);
        let t = Instant::now();
        let compiled = program().device(&dev)?.cache(&fresh).compile()?;
        let k = compiled.load(&dev)?.kernel("saxpy")?;
        disk.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(compiled.origin(), Origin::Disk);
        drop(k);
    }
    report.row(
        "rtc warm disk load (saxpy)",
        "us",
        median(&mut disk),
        None,
        "-",
        Target::None,
    );
    let mut mem = Vec::new();
    for _ in 0..WARM_RUNS {
        let t = Instant::now();
        let compiled = program().device(&dev)?.cache(&first).compile()?;
        let k = compiled.load(&dev)?.kernel("saxpy")?;
        mem.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(compiled.origin(), Origin::Memory);
        drop(k);
    }
    report.row(
        "rtc warm memory load (saxpy)",
        "us",
        median(&mut mem),
        None,
        "-",
        Target::None,
    );
    let _ = std::fs::remove_dir_all(&dir);

    // 3. Launch issue: typed + checked, typed unchecked, raw cuLaunchKernel.
    let module = Program::new(EMPTY)
        .device(&dev)?
        .cache(&Cache::memory_only())
        .compile()?
        .load(&dev)?;
    let kernel = module.kernel("empty")?;
    let raw_fn = kernel.function().raw();
    let buf = DevicePtr::alloc(&dev, 1024)?;
    let stream = Stream::builder(&dev).non_blocking(true).build()?;
    let d = sys::driver()?;
    let cfg = LaunchConfig::new((1, 1, 1), (32, 1, 1));
    let raw_stream: CUstream = stream.raw();
    let mut typed = || -> BoxResult<()> {
        // SAFETY: `empty` writes nothing unless n is u64::MAX; buf is live device memory.
        unsafe { kernel.launch(&stream, &cfg, (&buf, 256u64)) }?;
        Ok(())
    };
    let mut unchecked = || -> BoxResult<()> {
        // SAFETY: as above; the arguments are the kernel's parameters.
        unsafe { kernel.launch_unchecked(&stream, &cfg, (&buf, 256u64)) }?;
        Ok(())
    };
    let addr = buf.as_raw();
    let mut raw = || -> BoxResult<()> {
        let (mut p, mut n) = (addr, 256u64);
        let mut params = [
            &mut p as *mut u64 as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
        ];
        // SAFETY: the function's context is current; the parameters match `empty`.
        raw_ok(
            unsafe {
                d.cuLaunchKernel(
                    raw_fn,
                    1,
                    1,
                    1,
                    32,
                    1,
                    1,
                    0,
                    raw_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    };
    let batch = |f: &mut dyn FnMut() -> BoxResult<()>| -> BoxResult<f64> {
        let t = Instant::now();
        for _ in 0..LAUNCHES_PER_BATCH {
            f()?;
        }
        let ns = t.elapsed().as_nanos() as f64 / LAUNCHES_PER_BATCH as f64;
        stream.synchronize()?;
        Ok(ns)
    };
    for _ in 0..5 {
        batch(&mut typed)?;
        batch(&mut unchecked)?;
        batch(&mut raw)?;
    }
    let (mut t_s, mut u_s, mut r_s) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..LAUNCH_BATCHES {
        // Rotate the order so no side always runs right after a drain.
        match i % 3 {
            0 => {
                t_s.push(batch(&mut typed)?);
                u_s.push(batch(&mut unchecked)?);
                r_s.push(batch(&mut raw)?);
            }
            1 => {
                r_s.push(batch(&mut raw)?);
                t_s.push(batch(&mut typed)?);
                u_s.push(batch(&mut unchecked)?);
            }
            _ => {
                u_s.push(batch(&mut unchecked)?);
                r_s.push(batch(&mut raw)?);
                t_s.push(batch(&mut typed)?);
            }
        }
    }
    // Paired: each round's typed (unchecked) batch against the raw batch of the same round,
    // which cancels the drift between rounds (launch cost moves by several percent over a
    // run); the row's figure is the raw median times the median of those ratios.
    let raw_ns = median(&mut r_s.clone());
    let ratios = |ours: &[f64]| -> Vec<f64> {
        let mut q: Vec<f64> = ours.iter().zip(&r_s).map(|(o, r)| o / r).collect();
        q.sort_by(f64::total_cmp);
        q
    };
    for (name, ours) in [
        ("rtc launch issue, typed+checked", &t_s),
        ("rtc launch issue, typed unchecked", &u_s),
    ] {
        let q = ratios(ours);
        let (lo, mid, hi) = (q[q.len() / 4], q[q.len() / 2], q[3 * q.len() / 4]);
        println!(
            "{name}: per-round ratio median {mid:.3}, interquartile {lo:.3}-{hi:.3} over {} rounds",
            q.len()
        );
        report.row(
            name,
            "ns",
            raw_ns * mid,
            Some(raw_ns),
            "cuLaunchKernel",
            Target::RatioAtMost(1.03),
        );
    }
    // The host-side parts of a typed launch, each alone (no raw figure: they are what the
    // launch rows' overhead is made of): the issue guard, and preparing the arguments (device
    // checks, the buffer's `record_stream`).
    let guard = ns_per_call(10_000, 21, 200_000, || {
        drop(std::hint::black_box(stream.issue(dev).expect("issue")));
    });
    report.row(
        "rtc launch part: stream.issue (device check, capture gate)",
        "ns",
        guard,
        None,
        "-",
        Target::None,
    );
    let prepare = ns_per_call(10_000, 21, 200_000, || {
        let args = std::hint::black_box((&buf, 256u64));
        let issue = stream.issue(dev).expect("issue");
        cudars_rtc::KernelArgs::prepare(&args, &issue).expect("prepare");
    });
    report.row(
        "rtc launch part: issue + prepare (&DevicePtr, u64)",
        "ns",
        prepare,
        None,
        "-",
        Target::None,
    );
    stream.synchronize()?;
    Ok(())
}
