//! "Efficient Data Transfer Patterns" from CuPy's documentation, in Rust.
//!
//! The CuPy original:
//!
//! ```python
//! stream = cp.cuda.Stream()
//! cpu_data = np.random.random((10000, 1000))
//! gpu_data = cp.asarray(cpu_data)                 # synchronous by default
//! gpu_buffer = cp.empty_like(cpu_data)            # ... async memcpy into it ...
//! with stream:
//!     result_gpu = cp.dot(gpu_data, gpu_data.T)
//! result_cpu = cp.asnumpy(result_gpu, stream=stream, blocking=False)
//! stream.synchronize()
//! ```
//!
//! Here the asynchronous copy is a real API (`copy_to_device_async`), the non-blocking
//! `asnumpy` returns a `Pending` that owns the host buffer until the copy is done (so the
//! result cannot be read too early), and the "computation" on the stream is a
//! device-to-device copy and a column-major read-back, since this crate has no BLAS.
//!
//! Run with `cargo run --release -p cudars-xfer --example transfer_patterns`. Exits 0 on a
//! machine with a GPU, 1 (with the driver's error) without.

mod common;
use common::println;

use std::process::ExitCode;
use std::time::Instant;

use cudars_core::{Device, Stream};
use cudars_xfer::layout::{Layout2, Order};
use cudars_xfer::matrix::{matrix_to_host, DeviceMatrix};
use cudars_xfer::staging;
use cudars_xfer::{
    copy_device_async, copy_to_device_async, register, scope, to_device, to_host_async,
    DeviceBuffer, PinnedBuffer,
};

const ROWS: usize = 10_000;
const COLS: usize = 1_000;

/// `np.random.random` stand-in: uniform in [0, 1) from a xorshift generator.
fn random(n: usize, mut seed: u64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

fn gbps(bytes: usize, since: Instant) -> f64 {
    bytes as f64 / since.elapsed().as_secs_f64() / 1e9
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    println!("device 0: {}", dev.name()?);
    let stream = Stream::new(&dev)?;

    // cpu_data = np.random.random((10000, 1000))
    let cpu_data = random(ROWS * COLS, 0x2545_F491_4F6C_DD1D);
    let bytes = std::mem::size_of_val(&cpu_data[..]);

    // gpu_data = cp.asarray(cpu_data): synchronous; pageable memory goes through the
    // pinned staging pipeline.
    staging::prepare(&dev)?;
    let t = Instant::now();
    let gpu_data = to_device(&dev, &cpu_data)?;
    println!(
        "asarray (sync, pageable, {} MB): {:.1} GB/s",
        bytes / 1_000_000,
        gbps(bytes, t)
    );

    // gpu_buffer = cp.empty_like(cpu_data), then a truly asynchronous copy into it from a
    // registered (page-locked) buffer. The Pending owns the buffer until the copy is done.
    let gpu_buffer = DeviceBuffer::<f64>::alloc(&dev, ROWS * COLS)?;
    let registered = register(&dev, cpu_data.clone())?;
    let t = Instant::now();
    let pending_upload = copy_to_device_async(registered, &gpu_buffer, &stream)?;
    println!(
        "async copy queued in {:.1} us; complete yet: {}",
        t.elapsed().as_secs_f64() * 1e6,
        pending_upload.is_complete()?
    );

    // with stream: result_gpu = ... (work queued on the stream after the upload).
    let result_gpu = DeviceBuffer::<f64>::alloc(&dev, ROWS * COLS)?;
    copy_device_async(&gpu_buffer, &result_gpu, &stream)?;

    // result_cpu = cp.asnumpy(result_gpu, stream=stream, blocking=False)
    let out = PinnedBuffer::<f64>::zeroed(&dev, ROWS * COLS)?;
    let t = Instant::now();
    let pending_result = to_host_async(&result_gpu, out, &stream)?;
    let issue_us = t.elapsed().as_secs_f64() * 1e6;
    // ... the host is free meanwhile; `out` cannot be touched until:
    // stream.synchronize()
    let result_cpu = pending_result.wait()?;
    println!(
        "asnumpy(blocking=False): queued in {issue_us:.1} us, data on the host after {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let registered = pending_upload.wait()?;
    if result_cpu[..] != cpu_data[..] || registered.as_slice() != &cpu_data[..] {
        return Err("round trip through the stream changed the data".into());
    }

    // The same with borrowed buffers: a scope waits for its transfers before returning.
    let mut back = vec![0f64; ROWS * COLS];
    scope(|s| s.to_host(&gpu_data, &mut back, &stream))??;
    if back != cpu_data {
        return Err("scoped read-back differs".into());
    }

    // asnumpy(a, order='F'): the same matrix, column-major on the host.
    let matrix = DeviceMatrix::new(gpu_data, Layout2::contiguous(ROWS, COLS, Order::RowMajor))?;
    let fortran = matrix_to_host(&matrix, Order::ColumnMajor)?;
    if fortran[1] != cpu_data[COLS] || fortran[ROWS] != cpu_data[1] {
        return Err("column-major read-back misplaced elements".into());
    }

    let stats = staging::route_stats();
    println!(
        "routes: {} direct ({} MB), {} staged ({} MB)",
        stats.direct,
        stats.direct_bytes / 1_000_000,
        stats.staged,
        stats.staged_bytes / 1_000_000
    );
    println!("all transfers verified");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer_patterns: {e}");
            ExitCode::FAILURE
        }
    }
}
