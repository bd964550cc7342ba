//! `bench_rand`: `cuda-rand` filling 1 GiB (2^28 `f32`) with standard normal numbers.
//!
//! For Philox (PyTorch's generator), XORWOW (CuPy's) and Philox with the dynamic ordering:
//! three warm-up fills, then `RUNS` fills each timed with a pair of events around the call
//! on the generator's stream; the rows are the best and the median, in GB/s
//! (10^9 bytes written per second). Beside each, the same fill through the raw
//! `curandGenerateNormal` on the same generator handle (what the safe layer costs on top).
//!
//! `rand_peers.py` prints `torch.randn` (Philox) and `cupy.random.standard_normal` (XORWOW)
//! on the same buffer size, in the same format, and the ratios when given this program's
//! output (`--ours`) or `$BENCH_OUT/results.csv`.
//!
//! Output: one `name: value unit` line per figure; with `BENCH_OUT`, the same rows appended
//! to `$BENCH_OUT/results.csv` in the benchmarks' shared columns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::io::Write as _;

use cudars_core::{Device, DevicePtr, Event, Stream};
use cudars_rand::sys::{curand, curandStatus_t};
use cudars_rand::{Generator, RngKind, RngOrdering};
use workspace_tests::bench::median;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const BYTES: usize = 1 << 30;
const WARMUP: usize = 3;
const RUNS: usize = 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_rand: {e}");
        std::process::exit(1);
    }
}

/// GB/s of one 1 GiB fill that took `ms` milliseconds.
fn gbps(ms: f32) -> f64 {
    BYTES as f64 / (f64::from(ms) * 1e-3) / 1e9
}

/// Times `fill` on `stream`: warm-up, then (best, median) GB/s over `RUNS` runs.
fn time(stream: &Stream, mut fill: impl FnMut() -> BoxResult<()>) -> BoxResult<(f64, f64)> {
    for _ in 0..WARMUP {
        fill()?;
    }
    stream.synchronize()?;
    let mut rates = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = stream.record_timed()?;
        fill()?;
        let end = stream.record_timed()?;
        end.synchronize()?;
        rates.push(gbps(Event::elapsed_ms(&start, &end)?));
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    Ok((best, median(&mut rates)))
}

/// Prints `name: value GB/s` and appends the row to `$BENCH_OUT/results.csv`.
fn row(name: &str, value: f64) {
    println!("{name}: {value:.2} GB/s");
    if let Some(dir) = std::env::var_os("BENCH_OUT").filter(|d| !d.is_empty()) {
        let path = std::path::Path::new(&dir).join("results.csv");
        let new = !path.exists();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            if new {
                let _ = writeln!(f, "bench,scenario,unit,ours,raw,raw_label,ratio,target,met");
            }
            let _ = writeln!(f, "bench_rand,{name},GB/s,{value},,-,,-,-");
        }
    }
}

fn run() -> BoxResult<()> {
    let dev = Device::new(0)?;
    let lib = curand()?;
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    let status = unsafe { lib.curandGetVersion(&mut version) }?;
    assert!(status.is_success(), "curandGetVersion: {}", status.name());
    println!("device: {}", dev.name()?);
    println!("curand version: {version}");
    let stream = Stream::builder(&dev).non_blocking(true).build()?;
    let out = DevicePtr::alloc(&dev, BYTES)?;
    let count = BYTES / 4;
    for (label, kind, ordering) in [
        ("philox", RngKind::Philox, None),
        ("xorwow", RngKind::Xorwow, None),
        (
            "philox dynamic",
            RngKind::Philox,
            Some(RngOrdering::PseudoDynamic),
        ),
    ] {
        let mut gen = Generator::with_seed(kind, &stream, 42)?;
        if let Some(o) = ordering {
            gen.set_ordering(o)?;
        }
        let (best, med) = time(&stream, || Ok(gen.normal::<f32>(&out, 0.0, 1.0)?))?;
        row(&format!("rand normal f32 1GiB {label}"), best);
        row(&format!("rand normal f32 1GiB {label} median"), med);
        let raw = gen.as_raw();
        let addr = out.as_raw();
        let _ctx = dev.bind()?;
        let (best, med) = time(&stream, || {
            // SAFETY: the generator is live and issues on `stream`; `out` holds `count` f32 at
            // an aligned address, lives to the end of `run`, and is written by nothing else.
            let status =
                unsafe { lib.curandGenerateNormal(raw, addr as *mut f32, count, 0.0, 1.0) }?;
            if status == curandStatus_t::CURAND_STATUS_SUCCESS {
                Ok(())
            } else {
                Err(format!("curandGenerateNormal: {}", status.name()).into())
            }
        })?;
        row(&format!("rand normal f32 1GiB {label} raw curand"), best);
        row(
            &format!("rand normal f32 1GiB {label} raw curand median"),
            med,
        );
        // The numbers are standard normal: a quick look at the first million.
        stream.synchronize()?;
        let mut head = vec![0f32; 1 << 20];
        out.slice(..head.len() * 4)?.copy_to_host(&mut head)?;
        let mean = head.iter().map(|&x| f64::from(x)).sum::<f64>() / head.len() as f64;
        assert!(mean.abs() < 0.01, "{label}: mean {mean}");
    }
    Ok(())
}
