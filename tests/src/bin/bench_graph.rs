//! Benchmark: 100 small operations issued one by one against one replay of their captured
//! graph, in the same run (target: replay >= 10x faster), and the cost of our launch wrapper
//! against the raw `cuGraphLaunch`.
//!
//! For each workload (100 memsets of 4 KiB; 100 one-block kernels) three figures are given:
//! - issue: host time until the 100 calls (or the one launch) have returned, work queued;
//! - end-to-end: host time from the first call until `cuStreamSynchronize` returns;
//! - GPU span: events recorded before and after, `cuEventElapsedTime`.
//!
//! Each figure is the median over many repetitions after a warm-up. Run on the GPU machine:
//! `bench_graph` (or through `run.sh bench`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::time::Instant;

use cuda_core::kernels::Kernels;
use cuda_core::memory::DevicePtr;
use cuda_core::{Device, Event, Stream};
use cuda_graph::{CaptureMode, GraphExec};
use tests::bench::{median, Report, Target};

const OPS: usize = 100;
const WARMUP: usize = 30;
const REPS: usize = 300;
/// Bytes per memset.
const MEMSET_BYTES: usize = 4096;
/// Elements per kernel (one block).
const KERNEL_ELEMS: u64 = 256;

type Issue<'a> = dyn Fn(&Stream) -> cuda_core::Result<()> + 'a;

struct Timing {
    issue_us: f64,
    end_to_end_us: f64,
    gpu_us: f64,
}

/// Median issue, end-to-end and GPU times of `issue` on `stream`.
fn time(stream: &Stream, issue: &Issue<'_>) -> cuda_core::Result<Timing> {
    let dev = stream.device();
    let (start, end) = (Event::timed(&dev)?, Event::timed(&dev)?);
    for _ in 0..WARMUP {
        issue(stream)?;
    }
    stream.synchronize()?;
    let (mut issue_s, mut e2e, mut gpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS {
        // Issue only.
        let t = Instant::now();
        issue(stream)?;
        issue_s.push(t.elapsed().as_secs_f64() * 1e6);
        stream.synchronize()?;
        // End to end.
        let t = Instant::now();
        issue(stream)?;
        stream.synchronize()?;
        e2e.push(t.elapsed().as_secs_f64() * 1e6);
        // GPU span.
        start.record(stream)?;
        issue(stream)?;
        end.record(stream)?;
        end.synchronize()?;
        gpu.push(Event::elapsed_ms(&start, &end)? as f64 * 1e3);
    }
    Ok(Timing {
        issue_us: median(&mut issue_s),
        end_to_end_us: median(&mut e2e),
        gpu_us: median(&mut gpu),
    })
}

fn compare(
    report: &mut Report,
    name: &str,
    stream: &Stream,
    direct: &Issue<'_>,
    exec: &GraphExec,
) -> Result<(), cuda_graph::Error> {
    let replay = |s: &Stream| exec.handle().launch(s);
    let d = time(stream, direct)?;
    let g = time(stream, &replay)?;
    report.row(
        &format!("{name}: issue (host)"),
        "us",
        g.issue_us,
        Some(d.issue_us),
        "one by one",
        Target::RatioAtMost(0.1),
    );
    report.row(
        &format!("{name}: end-to-end"),
        "us",
        g.end_to_end_us,
        Some(d.end_to_end_us),
        "one by one",
        Target::RatioAtMost(0.1),
    );
    report.row(
        &format!("{name}: GPU span (events)"),
        "us",
        g.gpu_us,
        Some(d.gpu_us),
        "one by one",
        Target::None,
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_graph: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), cuda_graph::Error> {
    let dev = Device::new(0)?;
    println!(
        "bench_graph on {} (driver CUDA {}): {OPS} operations one by one vs one graph replay; \
         median of {REPS} after {WARMUP} warm-up; ratio = graph / one-by-one",
        dev.name()?,
        cuda_core::driver_version()?
    );
    // The device is current on this thread, as in a typical program: no call below pays for
    // binding its context.
    dev.make_current()?;
    let stream = Stream::new(&dev)?;
    let kernels = Kernels::load(&dev)?;
    let mut report = Report::new("bench_graph");

    // 100 memsets of 4 KiB, each into its own slice of one buffer.
    let buf = DevicePtr::alloc(&dev, OPS * MEMSET_BYTES)?;
    let slices: Vec<DevicePtr> = (0..OPS)
        .map(|i| buf.slice(i * MEMSET_BYTES..(i + 1) * MEMSET_BYTES))
        .collect::<cuda_core::Result<_>>()?;
    let memsets = |s: &Stream| -> cuda_core::Result<()> {
        for (i, slice) in slices.iter().enumerate() {
            slice.memset_u32_async(i as u32, s)?;
        }
        Ok(())
    };
    let graph = cuda_graph::capture(&stream, CaptureMode::ThreadLocal, |s| Ok(memsets(s)?))?;
    assert_eq!(graph.node_count()?, OPS);
    let exec = graph.instantiate()?;
    exec.upload(&stream)?;
    compare(&mut report, "100 memsets 4 KiB", &stream, &memsets, &exec)?;

    // 100 one-block kernels (add 1 to 256 u32s), all on the same data.
    let data = DevicePtr::alloc(&dev, KERNEL_ELEMS as usize * 4)?;
    data.memset_u32(0)?;
    let adds = |s: &Stream| -> cuda_core::Result<()> {
        for _ in 0..OPS {
            // SAFETY: `data` holds KERNEL_ELEMS u32s and outlives every launch (the benchmark
            // synchronises before it ends); only this stream touches it.
            unsafe { kernels.add_u32_raw(s, data.as_raw(), 1, KERNEL_ELEMS)? };
        }
        Ok(())
    };
    let kgraph = cuda_graph::capture(&stream, CaptureMode::ThreadLocal, |s| Ok(adds(s)?))?;
    assert_eq!(kgraph.node_count()?, OPS);
    let kexec = kgraph.instantiate()?;
    kexec.upload(&stream)?;
    compare(&mut report, "100 kernels 1 block", &stream, &adds, &kexec)?;
    stream.synchronize()?;
    // Every issue above added OPS to each element; check the kernels really ran.
    let mut host = vec![0u32; KERNEL_ELEMS as usize];
    data.copy_to_host(&mut host)?;
    let runs_per_timing = (WARMUP + 3 * REPS) as u32;
    let expected = 2 * runs_per_timing * OPS as u32;
    if host.iter().any(|&x| x != expected) {
        return Err(cuda_graph::Error::other(format!(
            "kernel results wrong: {} != {expected}",
            host[0]
        )));
    }

    // 100 independent one-block kernels spread over 4 streams (fork/join through events),
    // issued one by one in that pattern vs the graph captured from the same pattern, in which
    // the four branches run concurrently.
    const BRANCHES: usize = 4;
    let wide = DevicePtr::alloc(&dev, OPS * KERNEL_ELEMS as usize * 4)?;
    wide.memset_u32(0)?;
    let parts: Vec<DevicePtr> = (0..OPS)
        .map(|i| {
            let bytes = KERNEL_ELEMS as usize * 4;
            wide.slice(i * bytes..(i + 1) * bytes)
        })
        .collect::<cuda_core::Result<_>>()?;
    let sides: Vec<Stream> = (1..BRANCHES)
        .map(|_| Stream::new(&dev))
        .collect::<cuda_core::Result<_>>()?;
    let fork = Event::new(&dev)?;
    let joins: Vec<Event> = (1..BRANCHES)
        .map(|_| Event::new(&dev))
        .collect::<cuda_core::Result<_>>()?;
    let branched = |main: &Stream| -> cuda_core::Result<()> {
        fork.record(main)?;
        for side in &sides {
            side.wait_event(&fork)?;
        }
        for (i, part) in parts.iter().enumerate() {
            let s = match i % BRANCHES {
                0 => main,
                b => &sides[b - 1],
            };
            // SAFETY: each part holds KERNEL_ELEMS u32s, is written by one kernel per issue,
            // and outlives the work; the joins below order everything before `main`'s later work.
            unsafe { kernels.add_u32_raw(s, part.as_raw(), 1, KERNEL_ELEMS)? };
        }
        for (side, join) in sides.iter().zip(&joins) {
            join.record(side)?;
            main.wait_event(join)?;
        }
        Ok(())
    };
    let bgraph = cuda_graph::capture(&stream, CaptureMode::ThreadLocal, |s| Ok(branched(s)?))?;
    assert_eq!(bgraph.node_count()?, OPS);
    let bexec = bgraph.instantiate()?;
    bexec.upload(&stream)?;
    compare(
        &mut report,
        "100 kernels on 4 streams (fork/join)",
        &stream,
        &branched,
        &bexec,
    )?;
    stream.synchronize()?;
    let mut host = vec![0u32; OPS * KERNEL_ELEMS as usize];
    wide.copy_to_host(&mut host)?;
    let expected = 2 * runs_per_timing;
    if host.iter().any(|&x| x != expected) {
        return Err(cuda_graph::Error::other(format!(
            "branched kernel results wrong: {} != {expected}",
            host[0]
        )));
    }

    // Our launch wrapper against the raw driver call, per launch (a one-node graph).
    let one = cuda_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        // SAFETY: as above.
        unsafe { kernels.add_u32_raw(s, data.as_raw(), 1, 1)? };
        Ok(())
    })?;
    let one = one.instantiate()?;
    one.upload(&stream)?;
    let driver = cuda_core::sys::driver().map_err(cuda_core::Error::from)?;
    let raw_exec = one.handle().raw();
    let raw_stream = stream.raw();
    let per_launch = |f: &dyn Fn() -> bool| -> Result<f64, cuda_graph::Error> {
        let mut samples = Vec::new();
        for rep in 0..(WARMUP + REPS) {
            let t = Instant::now();
            for _ in 0..OPS {
                if !f() {
                    return Err(cuda_graph::Error::other("launch failed"));
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / OPS as f64;
            stream.synchronize()?;
            if rep >= WARMUP {
                samples.push(ns);
            }
        }
        Ok(median(&mut samples))
    };
    let ours = per_launch(&|| one.launch(&stream).is_ok())?;
    let raw = per_launch(&|| {
        // SAFETY: a live executable graph and stream of the same device.
        unsafe { driver.cuGraphLaunch(raw_exec, raw_stream) }.is_ok_and(|r| r.is_success())
    })?;
    report.row(
        "graph launch (1 node), per call",
        "ns",
        ours,
        Some(raw),
        "cuGraphLaunch",
        Target::RatioAtMost(1.05),
    );
    Ok(())
}
