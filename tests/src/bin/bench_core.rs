//! Benchmark: cuda-core's thin wrappers against the raw driver table, in the same run
//! (target: within 3% of raw, issue 14).
//!
//! Scenarios, each issued through cuda-core and through `cudars_sys::driver()` directly:
//! - event record + query (timing disabled, an idle non-blocking stream);
//! - stream create + destroy;
//! - memset issue (`cuMemsetD8Async`, 256 B of device memory);
//! - 4 KiB host-to-device async copy issue (`cuMemcpyHtoDAsync`, pinned source);
//! - kernel launch issue (`cuLaunchKernel`, a one-thread kernel).
//!
//! Each figure is the median over many batches of host-timed calls after a warm-up, with the
//! batches of the two sides interleaved (alternating which goes first) so clock and queue
//! drift hit both equally. Asynchronous work is drained between batches, outside the timing.
//! Run on the GPU machine: `bench_core`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::ffi::c_void;
use std::time::Instant;

use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::sys::{self, CUevent, CUevent_flags, CUresult, CUstream, CUstream_flags};
use cudars_core::{Device, Event, Stream};
use workspace_tests::bench::{median, Report, Target};
use workspace_tests::kernels::Kernels;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const WARMUP_BATCHES: usize = 5;
const BATCHES: usize = 61;

/// Raw driver result to `Result`.
fn raw_ok(r: Result<CUresult, sys::MissingSymbol>, call: &str) -> BoxResult<()> {
    match r {
        Ok(r) if r == CUresult::CUDA_SUCCESS => Ok(()),
        Ok(r) => Err(format!("{call} returned {}", r.0).into()),
        Err(e) => Err(e.into()),
    }
}

/// Median ns per call of `ours` and `raw`: `per_batch` calls a batch, the two sides'
/// batches interleaved, `drain` run after each batch (untimed).
fn compare(
    per_batch: usize,
    mut ours: impl FnMut() -> BoxResult<()>,
    mut raw: impl FnMut() -> BoxResult<()>,
    mut drain: impl FnMut() -> BoxResult<()>,
) -> BoxResult<(f64, f64)> {
    let mut batch = |f: &mut dyn FnMut() -> BoxResult<()>| -> BoxResult<f64> {
        let t = Instant::now();
        for _ in 0..per_batch {
            f()?;
        }
        let ns = t.elapsed().as_nanos() as f64 / per_batch as f64;
        drain()?;
        Ok(ns)
    };
    for _ in 0..WARMUP_BATCHES {
        batch(&mut ours)?;
        batch(&mut raw)?;
    }
    let (mut o, mut r) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    for i in 0..BATCHES {
        if i % 2 == 0 {
            o.push(batch(&mut ours)?);
            r.push(batch(&mut raw)?);
        } else {
            r.push(batch(&mut raw)?);
            o.push(batch(&mut ours)?);
        }
    }
    Ok((median(&mut o), median(&mut r)))
}

/// Runs [`run`]; an error ends the program with its message and status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("bench_core: {e}");
        std::process::exit(1);
    }
}

fn run() -> BoxResult<()> {
    let dev = Device::new(0)?;
    println!(
        "bench_core on {} (driver CUDA {}), median of {BATCHES} interleaved batches",
        dev.name()?,
        cudars_core::driver_version()?
    );
    let d = sys::driver()?;
    // The raw side runs with the device's context current, as a raw-driver program would;
    // cuda-core's side finds it current too (its bind() then pushes nothing).
    let _scope = dev.scope()?;
    let mut report = Report::new("bench_core");
    let target = Target::RatioAtMost(1.03);

    let stream = Stream::builder(&dev).non_blocking(true).build()?;
    let raw_stream = {
        let mut s: CUstream = std::ptr::null_mut();
        raw_ok(
            // SAFETY: context current; valid out-pointer.
            unsafe { d.cuStreamCreate(&mut s, CUstream_flags::CU_STREAM_NON_BLOCKING.0) },
            "cuStreamCreate",
        )?;
        s
    };
    let sync_raw = || -> BoxResult<()> {
        // SAFETY: live stream.
        raw_ok(
            unsafe { d.cuStreamSynchronize(raw_stream) },
            "cuStreamSynchronize",
        )
    };
    let sync_both = || -> BoxResult<()> {
        stream.synchronize()?;
        sync_raw()
    };

    // 0. For reference: the context check every wrapper makes (Device::bind with the context
    // already current, against one raw cuCtxGetCurrent).
    {
        let (ours, raw) = compare(
            2000,
            || {
                let _ctx = dev.bind()?;
                Ok(())
            },
            || {
                let mut c: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                raw_ok(unsafe { d.cuCtxGetCurrent(&mut c) }, "cuCtxGetCurrent")
            },
            || Ok(()),
        )?;
        report.row(
            "context check (info)",
            "ns",
            ours,
            Some(raw),
            "cuCtxGetCurrent",
            Target::None,
        );
    }

    // 1. Event record + query.
    {
        let event = Event::new(&dev)?;
        let mut raw_event: CUevent = std::ptr::null_mut();
        raw_ok(
            // SAFETY: context current; valid out-pointer.
            unsafe { d.cuEventCreate(&mut raw_event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) },
            "cuEventCreate",
        )?;
        let (ours, raw) = compare(
            2000,
            || {
                event.record(&stream)?;
                let _done = event.query()?;
                Ok(())
            },
            || {
                raw_ok(
                    // SAFETY: live event and stream of the current context.
                    unsafe { d.cuEventRecord(raw_event, raw_stream) },
                    "cuEventRecord",
                )?;
                // SAFETY: live event.
                let r = unsafe { d.cuEventQuery(raw_event) }?;
                if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_NOT_READY {
                    return Err(format!("cuEventQuery returned {}", r.0).into());
                }
                Ok(())
            },
            sync_both,
        )?;
        report.row(
            "event record+query",
            "ns",
            ours,
            Some(raw),
            "cuEventRecord+Query",
            target,
        );
        // SAFETY: we created it; idle.
        raw_ok(unsafe { d.cuEventDestroy(raw_event) }, "cuEventDestroy")?;
    }

    // 2. Stream create + destroy.
    {
        let (ours, raw) = compare(
            200,
            || {
                let s = Stream::new(&dev)?;
                drop(s);
                Ok(())
            },
            || {
                let mut s: CUstream = std::ptr::null_mut();
                // SAFETY: context current; valid out-pointer.
                raw_ok(unsafe { d.cuStreamCreate(&mut s, 0) }, "cuStreamCreate")?;
                // SAFETY: just created, idle.
                raw_ok(unsafe { d.cuStreamDestroy(s) }, "cuStreamDestroy")
            },
            || Ok(()),
        )?;
        report.row(
            "stream create+destroy",
            "ns",
            ours,
            Some(raw),
            "cuStreamCreate+Destroy",
            target,
        );
    }

    // 3. Memset issue, 256 B.
    let memset_bytes = 256;
    {
        let ours_buf = DevicePtr::alloc(&dev, memset_bytes)?;
        let raw_buf = DevicePtr::alloc(&dev, memset_bytes)?;
        let raw_addr = raw_buf.as_raw();
        let (ours, raw) = compare(
            200,
            || Ok(ours_buf.memset_async(0x5a, &stream)?),
            || {
                // SAFETY: live device range of the current context; live stream.
                raw_ok(
                    unsafe { d.cuMemsetD8Async(raw_addr, 0x5a, memset_bytes, raw_stream) },
                    "cuMemsetD8Async",
                )
            },
            sync_both,
        )?;
        report.row(
            "memset issue 256 B",
            "ns",
            ours,
            Some(raw),
            "cuMemsetD8Async",
            target,
        );
    }

    // 4. 4 KiB async copy issue, pinned host to device.
    let copy_bytes = 4096;
    {
        let host = PinnedMemory::new(&dev, copy_bytes, PinnedFlags::NONE)?;
        let ours_dst = DevicePtr::alloc(&dev, copy_bytes)?;
        let raw_dst = DevicePtr::alloc(&dev, copy_bytes)?;
        let raw_addr = raw_dst.as_raw();
        let src: &[u8] = &host;
        let (ours, raw) = compare(
            200,
            || {
                // SAFETY: `host` is pinned and outlives the copies (drained after each batch);
                // nothing writes it.
                unsafe { ours_dst.copy_from_host_async(src, &stream) }?;
                Ok(())
            },
            || {
                // SAFETY: as above; live device range and stream.
                raw_ok(
                    unsafe {
                        d.cuMemcpyHtoDAsync(
                            raw_addr,
                            src.as_ptr() as *const c_void,
                            copy_bytes,
                            raw_stream,
                        )
                    },
                    "cuMemcpyHtoDAsync",
                )
            },
            sync_both,
        )?;
        report.row(
            "4 KiB H2D async copy issue",
            "ns",
            ours,
            Some(raw),
            "cuMemcpyHtoDAsync",
            target,
        );
    }

    // 5. Kernel launch issue.
    {
        let kernels = Kernels::load(&dev)?;
        let spin = kernels.module().function(workspace_tests::kernels::SPIN)?;
        let raw_fn = spin.raw();
        let (ours, raw) = compare(
            200,
            || {
                let mut cycles = 0u64;
                let mut params = [&mut cycles as *mut u64 as *mut c_void];
                // SAFETY: `spin` takes one u64 and touches no memory.
                unsafe { spin.launch(&stream.issue_any(), (1, 1, 1), (1, 1, 1), 0, &mut params) }?;
                Ok(())
            },
            || {
                let mut cycles = 0u64;
                let mut params = [&mut cycles as *mut u64 as *mut c_void];
                // SAFETY: as above; the function's context is current.
                raw_ok(
                    unsafe {
                        d.cuLaunchKernel(
                            raw_fn,
                            1,
                            1,
                            1,
                            1,
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
            },
            sync_both,
        )?;
        report.row(
            "kernel launch issue",
            "ns",
            ours,
            Some(raw),
            "cuLaunchKernel",
            target,
        );
    }

    sync_both()?;
    // SAFETY: we created it; idle.
    raw_ok(unsafe { d.cuStreamDestroy(raw_stream) }, "cuStreamDestroy")?;
    Ok(())
}
