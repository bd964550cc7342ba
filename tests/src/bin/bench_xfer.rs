//! Benchmark: host <-> device bandwidth through `cuda-xfer` against the raw driver copy
//! (`cuMemcpyHtoD` / `cuMemcpyDtoH` on the same buffers), in the same run.
//!
//! Rows: H2D and D2H, 4 KiB to 1 GiB in powers of 4, from pageable (`Vec`), pinned
//! (`PinnedBuffer`) and registered (`register`) host memory. Each figure is the median
//! over repetitions after a warm-up, ours and raw alternating. A copy to the device is timed
//! until the data is on the device (both sides then synchronise the legacy stream, which the
//! driver's pageable `cuMemcpyHtoD` would otherwise not wait for).
//!
//! Targets (design brief, section 6, and issue 14): pageable >= 25 GB/s at 4 MiB and >= 40 GB/s
//! from 16 MiB up, both directions; pinned and registered >= 98% of the raw copy.
//!
//! Output: one line per row, `scenario | size | ours GB/s | raw GB/s | ratio`; the same rows
//! as CSV to `--csv PATH` (or `$BENCH_XFER_CSV`, or `$BENCH_OUT/xfer.csv`); then the
//! target summary in the shared format of `workspace_tests::bench`, from which `cargo xtask
//! bench-report` draws the bandwidth-against-size plots. `--no-sweep` skips the staging
//! configuration sweep at the end.
//!
//! Before the rows (issue 25 and issue 14's mid sizes): the landing cost (what "done when
//! it returns" costs `copy_to_device` against the bare driver call, and the stream-ordered
//! `copy_to_device_on_stream`); the landing race (how many of 10,000 pageable uploads are
//! not yet on the device for a non-blocking stream after the bare `cuMemcpyHtoD`, and after
//! `copy_to_device`); the mid-size probe (4 and 16 MiB through the staging pipeline with
//! `staging::probe` on: wall and pipeline time, first submission, helpers joined and when,
//! host-copy rate per thread, time spent waiting for slots and submitting, back to back and
//! with 3 ms gaps; the configuration before streaming copies and early submits too); raw
//! pinned DMAs cut in eight; and a sweep of chunk count, helpers, streaming copies and early
//! submits at 4 and 16 MiB. `--mid-only` stops after these.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use cudars_core::{Device, Stream};
use cudars_xfer::staging::probe::{self, Step, StepKind};
use cudars_xfer::staging::{self, StagingConfig};
use cudars_xfer::{
    copy_device, copy_device_async, copy_to_device, copy_to_device_on_stream, register,
    to_host_into, DeviceBuffer, PinnedBuffer, Registered,
};
use workspace_tests::bench::{median, Report, Target};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

type BoxError = Box<dyn std::error::Error>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    H2D,
    D2H,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::H2D => "H2D",
            Dir::D2H => "D2H",
        }
    }
}

struct Row {
    dir: Dir,
    memory: &'static str,
    bytes: usize,
    ours: f64,
    raw: f64,
}

struct Args {
    csv: Option<PathBuf>,
    sweep: bool,
    main: bool,
}

fn args() -> Args {
    let mut a = Args {
        csv: std::env::var_os("BENCH_XFER_CSV").map(PathBuf::from),
        sweep: true,
        main: true,
    };
    let out = std::env::var_os("BENCH_OUT").map(PathBuf::from);
    if a.csv.is_none() {
        a.csv = out.as_ref().map(|d| d.join("xfer.csv"));
    }
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--csv" => a.csv = it.next().map(PathBuf::from),
            "--no-sweep" => a.sweep = false,
            "--mid-only" => a.main = false,
            _ => eprintln!("bench_xfer: ignoring argument {arg}"),
        }
    }
    a
}

fn size_label(bytes: usize) -> String {
    if bytes >= GIB {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

/// Median seconds of `ours` and `raw`, alternating, after a warm-up.
fn measure(
    reps: usize,
    mut ours: impl FnMut() -> Result<(), BoxError>,
    mut raw: impl FnMut() -> Result<(), BoxError>,
) -> Result<(f64, f64), BoxError> {
    let warmup = (reps / 5).max(2);
    for _ in 0..warmup {
        ours()?;
        raw()?;
    }
    let (mut o, mut r) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let t = Instant::now();
        ours()?;
        o.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        raw()?;
        r.push(t.elapsed().as_secs_f64());
    }
    Ok((median(&mut o), median(&mut r)))
}

fn reps_for(bytes: usize) -> usize {
    (GIB / bytes).clamp(5, 2000)
}

fn check(
    r: Result<cudars_core::sys::CUresult, cudars_core::sys::MissingSymbol>,
    call: &str,
) -> Result<(), BoxError> {
    match r {
        Ok(code) if code.is_success() => Ok(()),
        Ok(code) => Err(format!("{call} failed: {}", code.0).into()),
        Err(e) => Err(format!("{call}: {e}").into()),
    }
}

/// The host buffers of one kind of memory, each `GIB` bytes.
struct Host {
    name: &'static str,
    src: Box<dyn std::ops::DerefMut<Target = [u8]>>,
    dst: Box<dyn std::ops::DerefMut<Target = [u8]>>,
}

fn pageable(bytes: usize) -> Vec<u8> {
    // Touched, so page faults are not part of the copies.
    (0..bytes).map(|i| (i * 7) as u8).collect()
}

fn bench_kind(
    dev: &Device,
    host: &mut Host,
    device: &DeviceBuffer<u8>,
    sizes: &[usize],
    rows: &mut Vec<Row>,
) -> Result<(), BoxError> {
    let driver = cudars_core::sys::driver()?;
    let null = Stream::null(dev);
    for &n in sizes {
        let d = device.slice(..n)?;
        let dptr = d.as_raw();
        let reps = reps_for(n);
        // H2D
        let src = &host.src[..n];
        let (ours, raw) = measure(
            reps,
            || {
                copy_to_device(src, &d)?;
                null.synchronize()?;
                Ok(())
            },
            || {
                check(
                    // SAFETY: `src` holds `n` bytes, `dptr` `n` bytes of device memory; the
                    // device's context is current (main's scope).
                    unsafe { driver.cuMemcpyHtoD(dptr, src.as_ptr().cast(), n) },
                    "cuMemcpyHtoD",
                )?;
                null.synchronize()?;
                Ok(())
            },
        )?;
        push(rows, Dir::H2D, host.name, n, ours, raw);
        // D2H
        let dst_ptr = host.dst[..n].as_mut_ptr();
        let (ours, raw) = measure(
            reps,
            || {
                // SAFETY: `dst_ptr` addresses `n` bytes of `host.dst`, which nothing else
                // borrows while the closures (which run one after the other) use it.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst_ptr, n) };
                Ok(to_host_into(&d, dst)?)
            },
            || {
                // SAFETY: as above; the device's context is current.
                check(
                    unsafe { driver.cuMemcpyDtoH(dst_ptr.cast(), dptr, n) },
                    "cuMemcpyDtoH",
                )
            },
        )?;
        push(rows, Dir::D2H, host.name, n, ours, raw);
    }
    Ok(())
}

fn push(
    rows: &mut Vec<Row>,
    dir: Dir,
    memory: &'static str,
    bytes: usize,
    ours_s: f64,
    raw_s: f64,
) {
    let row = Row {
        dir,
        memory,
        bytes,
        ours: bytes as f64 / ours_s / 1e9,
        raw: bytes as f64 / raw_s / 1e9,
    };
    println!(
        "{:<16} | {:>8} | {:>9.2} | {:>9.2} | {:>6.3}",
        format!("{} {}", dir.name(), memory),
        size_label(bytes),
        row.ours,
        row.raw,
        row.ours / row.raw
    );
    rows.push(row);
}

/// Host memcpy bandwidth with `threads` threads over `bytes` (diagnostic: the staging
/// pipeline cannot beat the host's copy rate).
fn memcpy_gbps(src: &[u8], dst: &mut [u8], threads: usize) -> f64 {
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let part = src.len().div_ceil(threads);
        std::thread::scope(|s| {
            for (d, sr) in dst.chunks_mut(part).zip(src.chunks(part)) {
                s.spawn(move || d.copy_from_slice(sr));
            }
        });
        samples.push(src.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    median(&mut samples)
}

/// Appends to `line` the pageable H2D and D2H figures of the first `n` bytes through the
/// staging path, in GB/s (median of `reps`).
fn pageable_pair(
    line: &mut String,
    device: &DeviceBuffer<u8>,
    host: &mut Host,
    null: &Stream,
    n: usize,
    reps: usize,
) -> Result<(), BoxError> {
    let d = device.slice(..n)?;
    let src = &host.src[..n];
    let (h2d, _) = measure(
        reps,
        || {
            copy_to_device(src, &d)?;
            null.synchronize()?;
            Ok(())
        },
        || Ok(()),
    )?;
    let dst = &mut host.dst[..n];
    let (d2h, _) = measure(reps, || Ok(to_host_into(&d, &mut *dst)?), || Ok(()))?;
    let _ = write!(
        line,
        " {:>6.1} {:>6.1} |",
        n as f64 / h2d / 1e9,
        n as f64 / d2h / 1e9
    );
    Ok(())
}

fn sweep(dev: &Device, device: &DeviceBuffer<u8>, host: &mut Host) -> Result<(), BoxError> {
    let base = staging::config();
    let sizes = [64 * MIB, 256 * MIB, GIB];
    println!();
    println!("staging sweep, pageable (GB/s, medians):");
    println!(
        "{:<34} | {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>6}",
        "chunk / part / slots / helpers / min",
        "H 64M",
        "D 64M",
        "H 256M",
        "D 256M",
        "H 1G",
        "D 1G"
    );
    // (chunk, part, slots, helpers, min_chunks): the default first, then one change each.
    let d = (
        base.chunk_bytes,
        base.part_bytes,
        base.slots,
        base.helpers,
        base.min_chunks,
    );
    let configs = [
        d,
        (d.0, d.1, d.2, 7, d.4),
        (d.0, d.1, d.2, 15, d.4),
        (4 * MIB, d.1, d.2, d.3, d.4),
        (16 * MIB, d.1, d.2, d.3, d.4),
        (d.0, MIB, d.2, d.3, d.4),
        (d.0, 256 * KIB, d.2, d.3, d.4),
        (d.0, d.1, 6, d.3, d.4),
        (d.0, d.1, d.2, d.3, 1),
        (d.0, d.1, d.2, d.3, 16),
    ];
    let null = Stream::null(dev);
    for (chunk, part, slots, helpers, min_chunks) in configs {
        staging::set_config(StagingConfig {
            chunk_bytes: chunk,
            part_bytes: part,
            slots,
            helpers,
            min_chunks,
            ..base
        })?;
        let mut line = format!(
            "{:<34} |",
            format!(
                "{} / {} / {slots} / {helpers} / {min_chunks}",
                size_label(chunk),
                size_label(part)
            )
        );
        for &n in &sizes {
            let reps = if n >= GIB { 5 } else { 9 };
            pageable_pair(&mut line, device, host, &null, n, reps)?;
        }
        println!("{line}");
        staging::release_cached();
    }
    staging::set_config(base)?;
    Ok(())
}

/// Issue 25: what "done when it returns" costs. Per call, median microseconds, pageable
/// source: `copy_to_device` (waits until the data has landed), the bare `cuMemcpyHtoD` (what
/// the old code did below the staging threshold: returns before the last DMA lands),
/// `copy_to_device_on_stream` on a non-blocking stream (stream-ordered, no wait), and the
/// bare call followed by a legacy-stream sync. Then `copy_device` against the bare
/// `cuMemcpyDtoD` (which returns before the device has run it).
fn landing_cost(dev: &Device, device: &DeviceBuffer<u8>, host: &Host) -> Result<(), BoxError> {
    let driver = cudars_core::sys::driver()?;
    let null = Stream::null(dev);
    let nb = Stream::builder(dev).non_blocking(true).build()?;
    println!();
    println!("landing cost (issue 25), pageable H2D, us per call (medians):");
    println!(
        "{:>8} | {:>9} | {:>9} | {:>9} | {:>9} | {:>8}",
        "size", "done", "bare", "on_stream", "bare+sync", "cost"
    );
    for n in [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1023 * KIB, 4 * MIB] {
        let d = device.slice(..n)?;
        let dptr = d.as_raw();
        let src = &host.src[..n];
        let bare = || {
            // SAFETY: `src` holds `n` bytes, `dptr` `n` bytes of device memory; the device's
            // context is current (run's scope).
            check(
                unsafe { driver.cuMemcpyHtoD(dptr, src.as_ptr().cast(), n) },
                "cuMemcpyHtoD",
            )
        };
        // Each call timed alone, every stream idle before it (the waits are not timed).
        let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for rep in 0..330 {
            let mut time = |i: usize, f: &mut dyn FnMut() -> Result<(), BoxError>| {
                null.synchronize()?;
                nb.synchronize()?;
                let at = Instant::now();
                f()?;
                if rep >= 30 {
                    t[i].push(at.elapsed().as_secs_f64());
                }
                Ok::<(), BoxError>(())
            };
            time(0, &mut || Ok(copy_to_device(src, &d)?))?;
            time(1, &mut || bare())?;
            time(2, &mut || Ok(copy_to_device_on_stream(src, &d, &nb)?))?;
            time(3, &mut || {
                bare()?;
                null.synchronize()?;
                Ok(())
            })?;
        }
        let [done, raw, ordered, raw_sync] = t.map(|mut v| median(&mut v));
        println!(
            "{:>8} | {:>9.2} | {:>9.2} | {:>9.2} | {:>9.2} | {:>8.2}",
            size_label(n),
            done * 1e6,
            raw * 1e6,
            ordered * 1e6,
            raw_sync * 1e6,
            (done - raw) * 1e6
        );
    }
    for n in [4 * KIB, 64 * MIB] {
        let a = device.slice(..n)?;
        let b = device.slice(n..2 * n)?;
        let (mut o, mut r) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            null.synchronize()?;
            let at = Instant::now();
            copy_device(&a, &b)?;
            o.push(at.elapsed().as_secs_f64());
            null.synchronize()?;
            let at = Instant::now();
            // SAFETY: two disjoint ranges of `n` bytes of live device memory.
            let r0 = unsafe { driver.cuMemcpyDtoD(b.as_raw(), a.as_raw(), n) };
            check(r0, "cuMemcpyDtoD")?;
            r.push(at.elapsed().as_secs_f64());
        }
        let (ours, raw) = (median(&mut o), median(&mut r));
        null.synchronize()?;
        println!(
            "copy_device {:>8}: done {:.2} us, bare cuMemcpyDtoD {:.2} us (returns before the copy ran)",
            size_label(n),
            ours * 1e6,
            raw * 1e6
        );
    }
    Ok(())
}

/// Issue 25's race, counted: `iterations` pageable uploads of random sizes below the staging
/// threshold, each followed at once by a device-to-device copy on a non-blocking stream, read
/// back; returns how many copies saw stale bytes, for the bare `cuMemcpyHtoD` (the old path)
/// and for `copy_to_device`.
fn landing_race(dev: &Device, iterations: usize) -> Result<(usize, usize), BoxError> {
    let driver = cudars_core::sys::driver()?;
    let nb = Stream::builder(dev).non_blocking(true).build()?;
    let max = MIB - 1;
    let target = DeviceBuffer::<u8>::alloc(dev, max)?;
    let out = DeviceBuffer::<u8>::alloc(dev, max)?;
    let mut src = vec![0u8; max];
    let mut back = vec![0u8; max];
    let mut seed = 0x2525u64;
    let mut stale = [0usize; 2];
    for i in 0..iterations * 2 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = 1 + (seed >> 33) as usize % max;
        let fill = (seed >> 13) as u8 | 1;
        src[..n].fill(fill);
        let (t, o) = (target.slice(..n)?, out.slice(..n)?);
        if i % 2 == 0 {
            // SAFETY: `src` holds `n` bytes, `t` is `n` bytes of device memory.
            let r0 = unsafe { driver.cuMemcpyHtoD(t.as_raw(), src.as_ptr().cast(), n) };
            check(r0, "cuMemcpyHtoD")?;
        } else {
            copy_to_device(&src[..n], &t)?;
        }
        copy_device_async(&t, &o, &nb)?;
        nb.synchronize()?;
        to_host_into(&o, &mut back[..n])?;
        if back[..n] != src[..n] {
            stale[i % 2] += 1;
        }
        // Clear the target so a stale read shows.
        t.as_ptr().memset(0)?;
        Stream::null(dev).synchronize()?;
    }
    Ok((stale[0], stale[1]))
}

/// Per-transfer figures from the probe's steps of one staged transfer.
#[derive(Default, Clone, Copy)]
struct Probed {
    run: f64,
    first_submit: f64,
    first_copy_end: f64,
    joined: f64,
    first_join: f64,
    last_join: f64,
    copy_gbps: f64,
    wait: f64,
    submit: f64,
    submits: f64,
}

fn analyse(steps: &[Step]) -> Vec<Probed> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        if !(steps[i].kind == StepKind::Start && steps[i].thread == 0) {
            i += 1;
            continue;
        }
        let t0 = steps[i].at.as_secs_f64();
        let mut p = Probed {
            first_submit: f64::NAN,
            first_copy_end: f64::NAN,
            first_join: f64::NAN,
            ..Probed::default()
        };
        let mut open: std::collections::HashMap<(usize, u8), f64> = Default::default();
        let (mut copy_t, mut copy_b) = (0.0, 0.0);
        let mut j = i + 1;
        while j < steps.len() && !(steps[j].kind == StepKind::End && steps[j].thread == 0) {
            let s = steps[j];
            let t = s.at.as_secs_f64() - t0;
            match s.kind {
                StepKind::Join => {
                    p.joined += 1.0;
                    if p.first_join.is_nan() {
                        p.first_join = t;
                    }
                    p.last_join = t;
                }
                StepKind::CopyStart => {
                    open.insert((s.thread, 0), t);
                }
                StepKind::CopyEnd => {
                    if let Some(st) = open.remove(&(s.thread, 0)) {
                        copy_t += t - st;
                        copy_b += s.index as f64;
                    }
                    if p.first_copy_end.is_nan() {
                        p.first_copy_end = t;
                    }
                }
                StepKind::WaitStart => {
                    open.insert((s.thread, 1), t);
                }
                StepKind::WaitEnd => {
                    if let Some(st) = open.remove(&(s.thread, 1)) {
                        p.wait += t - st;
                    }
                }
                StepKind::SubmitStart => {
                    if p.first_submit.is_nan() {
                        p.first_submit = t;
                    }
                    open.insert((s.thread, 2), t);
                }
                StepKind::SubmitEnd => {
                    if let Some(st) = open.remove(&(s.thread, 2)) {
                        p.submit += t - st;
                        p.submits += 1.0;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        if j < steps.len() {
            p.run = steps[j].at.as_secs_f64() - t0;
            p.copy_gbps = if copy_t > 0.0 {
                copy_b / copy_t / 1e9
            } else {
                0.0
            };
            out.push(p);
        }
        i = j + 1;
    }
    out
}

fn med(v: &[Probed], f: impl Fn(&Probed) -> f64) -> f64 {
    let mut x: Vec<f64> = v.iter().map(f).filter(|x| !x.is_nan()).collect();
    if x.is_empty() {
        return f64::NAN;
    }
    median(&mut x)
}

/// Mid-sized pageable transfers (issue 14: >= 25 GB/s at 4 MiB, >= 40 GB/s at 16 MiB):
/// where the time goes (the staging probe), then a sweep of the plan's knobs.
fn mid_sizes(dev: &Device, device: &DeviceBuffer<u8>, host: &mut Host) -> Result<(), BoxError> {
    let base = staging::config();
    let null = Stream::null(dev);
    let driver = cudars_core::sys::driver()?;
    println!();
    println!("mid-size probe, pageable (medians over 40 transfers; times in us from the pipeline's start):");
    println!(
        "{:<44} | {:>6} | {:>6} {:>6} | {:>6} | {:>5} {:>6} {:>6} | {:>6} | {:>6} | {:>7}",
        "config / dir / size / gap",
        "GB/s",
        "wall",
        "run",
        "1st sub",
        "join",
        "1st j",
        "last j",
        "copy/t",
        "wait",
        "sub(n)"
    );
    // The configuration before streaming copies (issue 14, first attempt).
    let old = StagingConfig {
        min_chunks: 8,
        streaming_to_device: false,
        streaming_to_host: false,
        early_submits: usize::MAX,
        ..base
    };
    let probe_cfgs: Vec<(&str, StagingConfig)> = vec![
        ("default", base),
        ("old", old),
        (
            "old + stream H2D",
            StagingConfig {
                streaming_to_device: true,
                ..old
            },
        ),
        (
            "old + early 1",
            StagingConfig {
                early_submits: 1,
                ..old
            },
        ),
        (
            "default + stream D2H",
            StagingConfig {
                streaming_to_host: true,
                ..base
            },
        ),
        (
            "default + min_chunks 8",
            StagingConfig {
                min_chunks: 8,
                ..base
            },
        ),
    ];
    for (name, cfg) in &probe_cfgs {
        staging::set_config(*cfg)?;
        for n in [4 * MIB, 16 * MIB] {
            for dir in [Dir::H2D, Dir::D2H] {
                for gap_ms in [0u64, 3] {
                    if gap_ms > 0 && *name != "default" && *name != "old" {
                        continue;
                    }
                    let d = device.slice(..n)?;
                    // Warm up (helpers started, staging set cached, pages touched).
                    for _ in 0..5 {
                        match dir {
                            Dir::H2D => copy_to_device(&host.src[..n], &d)?,
                            Dir::D2H => to_host_into(&d, &mut host.dst[..n])?,
                        }
                    }
                    let mut walls = Vec::new();
                    probe::set_enabled(true);
                    for _ in 0..40 {
                        if gap_ms > 0 {
                            std::thread::sleep(std::time::Duration::from_millis(gap_ms));
                        }
                        let t = Instant::now();
                        match dir {
                            Dir::H2D => copy_to_device(&host.src[..n], &d)?,
                            Dir::D2H => to_host_into(&d, &mut host.dst[..n])?,
                        }
                        walls.push(t.elapsed().as_secs_f64());
                    }
                    probe::set_enabled(false);
                    let p = analyse(&probe::take());
                    let wall = median(&mut walls);
                    println!(
                        "{:<44} | {:>6.1} | {:>6.0} {:>6.0} | {:>6.0} | {:>5.1} {:>6.0} {:>6.0} | {:>6.1} | {:>6.0} | {:>4.0}({:.0})",
                        format!("{name} / {} / {} / gap {gap_ms} ms", dir.name(), size_label(n)),
                        n as f64 / wall / 1e9,
                        wall * 1e6,
                        med(&p, |x| x.run) * 1e6,
                        med(&p, |x| if dir == Dir::H2D { x.first_submit } else { x.first_copy_end }) * 1e6,
                        med(&p, |x| x.joined),
                        med(&p, |x| x.first_join) * 1e6,
                        med(&p, |x| x.last_join) * 1e6,
                        med(&p, |x| x.copy_gbps),
                        med(&p, |x| x.wait) * 1e6,
                        med(&p, |x| x.submit) * 1e6,
                        med(&p, |x| x.submits),
                    );
                }
            }
        }
    }
    staging::set_config(base)?;

    // Raw pieces: one pinned DMA of n bytes; n bytes cut in 8 async DMAs with an event each.
    {
        let pinned = PinnedBuffer::<u8>::zeroed(dev, 16 * MIB)?;
        let nb = Stream::builder(dev).non_blocking(true).build()?;
        let ev = cudars_core::Event::builder(dev)
            .disable_timing(true)
            .build()?;
        for n in [512 * KIB, 4 * MIB, 16 * MIB] {
            let d = device.slice(..n)?;
            let (one, eight) = measure(
                50,
                || {
                    // SAFETY: pinned source of `n` bytes, live device range.
                    let r0 = unsafe {
                        driver.cuMemcpyHtoDAsync(d.as_raw(), pinned.as_ptr().cast(), n, nb.raw())
                    };
                    check(r0, "HtoDAsync")?;
                    nb.synchronize()?;
                    Ok(())
                },
                || {
                    for k in 0..8 {
                        let c = n / 8;
                        // SAFETY: as above, the k-th eighth.
                        let r0 = unsafe {
                            driver.cuMemcpyHtoDAsync(
                                d.as_raw() + (k * c) as u64,
                                pinned.as_ptr().add(k * c).cast(),
                                c,
                                nb.raw(),
                            )
                        };
                        check(r0, "HtoDAsync")?;
                        ev.record(&nb)?;
                    }
                    ev.synchronize()?;
                    Ok(())
                },
            )?;
            println!(
                "raw pinned DMA {:>7}: one copy {:.0} us ({:.1} GB/s), 8 copies + 8 events {:.0} us ({:.1} GB/s)",
                size_label(n), one * 1e6, n as f64 / one / 1e9, eight * 1e6, n as f64 / eight / 1e9
            );
        }
    }

    println!();
    println!("mid-size sweep, pageable GB/s (medians of 60, back to back); S = streaming stores (H2D, D2H), E = early submits (D2H):");
    println!(
        "{:<40} | {:>6} {:>6} | {:>6} {:>6}",
        "part / min_chunks / helpers / S / E", "H 4M", "D 4M", "H 16M", "D 16M"
    );
    let mut grid = Vec::new();
    // Mid-sized parts are at most `MID_PART_BYTES` (128 KiB) whatever `part_bytes` says.
    for part in [128 * KIB] {
        for min_chunks in [4, 8] {
            for helpers in [4, 5, 7] {
                for (sh, sd, early) in [
                    (false, false, usize::MAX),
                    (true, false, usize::MAX),
                    (false, false, 1),
                    (true, true, 1),
                    (true, false, 0),
                ] {
                    grid.push((part, min_chunks, helpers, sh, sd, early));
                }
            }
        }
    }
    for (part, min_chunks, helpers, sh, sd, early) in grid {
        staging::set_config(StagingConfig {
            part_bytes: part,
            min_chunks,
            helpers,
            streaming_to_device: sh,
            streaming_to_host: sd,
            early_submits: early,
            ..base
        })?;
        let early = if early == usize::MAX {
            "all".to_string()
        } else {
            early.to_string()
        };
        let line0 = format!(
            "{} / {min_chunks} / {helpers} / {}{} / {early}",
            size_label(part),
            u8::from(sh),
            u8::from(sd)
        );
        let mut line = format!("{line0:<40} |");
        for n in [4 * MIB, 16 * MIB] {
            pageable_pair(&mut line, device, host, &null, n, 60)?;
        }
        println!("{line}");
    }
    staging::set_config(base)?;
    Ok(())
}

fn write_outputs(args: &Args, rows: &[Row]) -> Result<(), BoxError> {
    if let Some(path) = &args.csv {
        let mut csv = String::from("direction,memory,bytes,ours_gbps,raw_gbps,ratio\n");
        for r in rows {
            let _ = writeln!(
                csv,
                "{},{},{},{:.4},{:.4},{:.4}",
                r.dir.name(),
                r.memory,
                r.bytes,
                r.ours,
                r.raw,
                r.ours / r.raw
            );
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, csv)?;
        println!("bench_xfer: CSV written to {}", path.display());
    }
    Ok(())
}

fn summary(rows: &[Row]) {
    let mut report = Report::new("bench_xfer");
    println!();
    for r in rows {
        let target = match r.memory {
            "pageable" if r.bytes >= 16 * MIB => Target::AtLeast(40.0),
            "pageable" if r.bytes >= 4 * MIB => Target::AtLeast(25.0),
            "pinned" | "registered" => Target::RatioAtLeast(0.98),
            _ => Target::None,
        };
        report.row(
            &format!("{} {} {}", r.dir.name(), r.memory, size_label(r.bytes)),
            "GB/s",
            r.ours,
            Some(r.raw),
            if r.dir == Dir::H2D {
                "cuMemcpyHtoD"
            } else {
                "cuMemcpyDtoH"
            },
            target,
        );
    }
}

fn run() -> Result<(), BoxError> {
    let args = args();
    let started = Instant::now();
    let dev = Device::new(0)?;
    let _scope = dev.scope()?;
    println!(
        "bench_xfer on {} ({} cores here); staging {:?}",
        dev.name()?,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        staging::config()
    );
    let sizes: Vec<usize> = (0..)
        .map(|k| (4 * KIB) << (2 * k))
        .take_while(|&n| n <= GIB)
        .collect();
    let device = DeviceBuffer::<u8>::alloc(&dev, GIB)?;
    staging::prepare(&dev)?;

    let mut kinds = Vec::new();
    kinds.push(Host {
        name: "pageable",
        src: Box::new(pageable(GIB)),
        dst: Box::new(pageable(GIB)),
    });
    {
        let src = PinnedBuffer::from_slice(&dev, &pageable(GIB))?;
        let dst = PinnedBuffer::<u8>::zeroed(&dev, GIB)?;
        kinds.push(Host {
            name: "pinned",
            src: Box::new(src),
            dst: Box::new(dst),
        });
    }
    {
        let src: Registered<Vec<u8>> = register(&dev, pageable(GIB))?;
        let dst: Registered<Vec<u8>> = register(&dev, pageable(GIB))?;
        kinds.push(Host {
            name: "registered",
            src: Box::new(src),
            dst: Box::new(dst),
        });
    }
    println!("setup: {:.1} s", started.elapsed().as_secs_f64());

    {
        let host = &mut kinds[0];
        let n = 256 * MIB;
        let (src, dst) = (&host.src[..n], &mut host.dst[..n]);
        println!(
            "host memcpy, pageable, 256 MiB: 1 thread {:.1} GB/s, 4 threads {:.1} GB/s, 8 threads {:.1} GB/s",
            memcpy_gbps(src, dst, 1),
            memcpy_gbps(src, dst, 4),
            memcpy_gbps(src, dst, 8)
        );
    }

    landing_cost(&dev, &device, &kinds[0])?;
    let (bare, ours) = landing_race(&dev, 10_000)?;
    println!(
        "landing race, 10000 pageable uploads < 1 MiB then a non-blocking-stream copy each: stale after bare cuMemcpyHtoD {bare}, after copy_to_device {ours}"
    );
    mid_sizes(&dev, &device, &mut kinds[0])?;
    if !args.main {
        println!("bench_xfer: {:.1} s", started.elapsed().as_secs_f64());
        return Ok(());
    }
    println!();
    println!(
        "{:<16} | {:>8} | {:>9} | {:>9} | {:>6}",
        "scenario", "size", "ours GB/s", "raw GB/s", "ratio"
    );
    let mut rows = Vec::new();
    for host in &mut kinds {
        bench_kind(&dev, host, &device, &sizes, &mut rows)?;
    }
    write_outputs(&args, &rows)?;
    summary(&rows);
    if args.sweep {
        sweep(&dev, &device, &mut kinds[0])?;
    }
    println!("bench_xfer: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_xfer: {e}");
            ExitCode::FAILURE
        }
    }
}
