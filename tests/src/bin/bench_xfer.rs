//! Benchmark: host <-> device bandwidth through `cuda-xfer` against the raw driver copy
//! (`cuMemcpyHtoD` / `cuMemcpyDtoH` on the same buffers), in the same run.
//!
//! Rows: H2D and D2H, 4 KiB to 1 GiB in powers of 4, from pageable (`Vec`), pinned
//! (`PinnedBuffer`) and registered (`register`) host memory. Each figure is the median
//! over repetitions after a warm-up, ours and raw alternating. A copy to the device is timed
//! until the data is on the device (both sides then synchronise the legacy stream, which the
//! driver's pageable `cuMemcpyHtoD` would otherwise not wait for).
//!
//! Targets (design brief, section 6): pageable >= 40 GB/s from 64 MiB up; pinned >= 98% of
//! the raw copy.
//!
//! Output: one line per row, `scenario | size | ours GB/s | raw GB/s | ratio`; the same rows
//! as CSV to `--csv PATH` (or `$BENCH_XFER_CSV`, or `$BENCH_OUT/xfer.csv`); then the
//! target summary in the shared format of `tests::bench`, from which `cargo xtask
//! bench-report` draws the bandwidth-against-size plots. `--no-sweep` skips the staging
//! configuration sweep at the end.
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

use cuda_core::{Device, Stream};
use cuda_xfer::staging::{self, StagingConfig};
use cuda_xfer::{copy_to_device, register, to_host_into, DeviceBuffer, PinnedBuffer, Registered};
use tests::bench::{median, Report, Target};

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
}

fn args() -> Args {
    let mut a = Args {
        csv: std::env::var_os("BENCH_XFER_CSV").map(PathBuf::from),
        sweep: true,
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
    r: Result<cuda_core::sys::CUresult, cuda_core::sys::MissingSymbol>,
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
    let driver = cuda_core::sys::driver()?;
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
            let d = device.slice(..n)?;
            let reps = if n >= GIB { 5 } else { 9 };
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
        }
        println!("{line}");
        staging::release_cached();
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
            "pageable" if r.bytes >= 64 * MIB => Target::AtLeast(40.0),
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
