//! Benchmark (not a test): sharing device memory between processes (`cudars_core::ipc`).
//!
//! The binary re-executes itself as the importer (`BENCH_IPC_ROLE=importer`, its stdin a
//! Unix socket for the file descriptors). Rows:
//! - legacy handles: export (`cuIpcGetMemHandle`) per handle in the exporter; open + close
//!   (`IpcMapping::open` and its drop, which synchronises the device first) per handle in
//!   the importer; 2 MiB `cuMemAlloc` buffers;
//! - shareable handles: export (`cuMemExportToShareableHandle`) per handle, send over the
//!   socket, and import + map + set access + unmap (`SharedMapping`) per handle, 2 MiB;
//! - the importer's read bandwidth of an imported 1 GiB buffer (device-to-device copy into
//!   a local buffer, timed with events) against the same copy from a local 1 GiB buffer
//!   (target: >= 0.98x).
//!
//! CuPy's `ipcGetMemHandle` / `ipcOpenMemHandle` for the same sizes: `bench_ipc_cupy.py`
//! beside `run.sh` (run it in the same session).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark/example code: a failed check panics with its message"
)]

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Instant;

use cudars_core::ipc::{self, IpcMapping, IpcMemHandle, SharedMapping};
use cudars_core::memory::{DeviceMemory, DevicePtr};
use cudars_core::vmm::PhysicalAllocation;
use cudars_core::{Device, Event, Stream};
use workspace_tests::bench::{Report, Target};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const ROLE: &str = "BENCH_IPC_ROLE";
const HANDLES: &str = "BENCH_IPC_HANDLES";
const BIG_HANDLE: &str = "BENCH_IPC_BIG";
const N: usize = 200;
const BUF: usize = 2 << 20;
const BIG: usize = 1 << 30;
const REPS: usize = 10;

fn gbps(bytes: usize, ms: f32) -> f64 {
    bytes as f64 / (f64::from(ms) * 1e-3) / 1e9
}

/// GB/s of `REPS` copies from `src` into `dst` on `stream` (events around them).
fn copy_gbps(dev: &Device, stream: &Stream, dst: &DevicePtr, src: &DevicePtr) -> BoxResult<f64> {
    dst.copy_from_device_async(src, stream)?; // warm-up
    let (a, b) = (Event::timed(dev)?, Event::timed(dev)?);
    a.record(stream)?;
    for _ in 0..REPS {
        dst.copy_from_device_async(src, stream)?;
    }
    b.record(stream)?;
    b.synchronize()?;
    Ok(gbps(src.len() * REPS, Event::elapsed_ms(&a, &b)?))
}

fn importer() -> BoxResult<()> {
    let dev = Device::new(0)?;
    // The socket carries only descriptors; handles come in the environment.
    let socket = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    // Legacy open + close.
    let handles: Vec<IpcMemHandle> = std::env::var(HANDLES)?
        .split(',')
        .map(IpcMemHandle::from_hex)
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    for h in &handles {
        drop(IpcMapping::open(&dev, h)?);
    }
    println!(
        "RESULT legacy_open_close_us {}",
        t.elapsed().as_secs_f64() * 1e6 / N as f64
    );
    // Shareable import + map + unmap.
    let mut fds: Vec<(OwnedFd, u64)> = Vec::with_capacity(N);
    for _ in 0..N {
        fds.push(ipc::recv_fd(&socket)?);
    }
    let t = Instant::now();
    for (fd, size) in &fds {
        let physical = PhysicalAllocation::import_fd(&dev, fd.as_fd(), *size as usize)?;
        drop(SharedMapping::map(&dev, physical)?);
    }
    println!(
        "RESULT shareable_import_map_unmap_us {}",
        t.elapsed().as_secs_f64() * 1e6 / N as f64
    );
    // Read bandwidth: imported vs local.
    let big = IpcMemHandle::from_hex(&std::env::var(BIG_HANDLE)?)?;
    let imported = DevicePtr::from_arc(IpcMapping::open(&dev, &big)?).slice(..BIG)?;
    let local = DevicePtr::alloc(&dev, BIG)?;
    let dst = DevicePtr::alloc(&dev, BIG)?;
    let stream = Stream::new(&dev)?;
    let local_gbps = copy_gbps(&dev, &stream, &dst, &local)?;
    let imported_gbps = copy_gbps(&dev, &stream, &dst, &imported)?;
    println!("RESULT read_imported_gbps {imported_gbps}");
    println!("RESULT read_local_gbps {local_gbps}");
    Ok(())
}

fn main() -> BoxResult<()> {
    if std::env::var(ROLE).as_deref() == Ok("importer") {
        return importer();
    }
    let dev = Device::new(0)?;
    let mut report = Report::new("bench_ipc");
    let buffers = (0..N)
        .map(|_| DeviceMemory::new(&dev, BUF))
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    let handles = buffers
        .iter()
        .map(DeviceMemory::ipc_handle)
        .collect::<Result<Vec<_>, _>>()?;
    let export_us = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    let text: Vec<String> = handles.iter().map(IpcMemHandle::to_hex).collect();

    let mappings = (0..N)
        .map(|_| SharedMapping::new(&dev, BUF))
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    let fds = mappings
        .iter()
        .map(|m| m.physical().export_fd())
        .collect::<Result<Vec<_>, _>>()?;
    let export_fd_us = t.elapsed().as_secs_f64() * 1e6 / N as f64;

    let big = DeviceMemory::new(&dev, BIG)?;
    let big_handle = big.ipc_handle()?;
    let big = big.into_ptr();
    big.memset(1)?;
    dev.synchronize()?;

    let (ours, theirs) = UnixStream::pair()?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(ROLE, "importer")
        .env(HANDLES, text.join(","))
        .env(BIG_HANDLE, big_handle.to_hex())
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .spawn()?;
    for (fd, m) in fds.iter().zip(&mappings) {
        ipc::send_fd(&ours, fd.as_fd(), m.size() as u64)?;
    }

    let mut results = std::collections::HashMap::new();
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("RESULT ") {
            if let Some((k, v)) = rest.split_once(' ') {
                results.insert(k.to_string(), v.parse::<f64>()?);
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("importer failed: {status}").into());
    }
    let get = |k: &str| {
        results
            .get(k)
            .copied()
            .ok_or(format!("importer gave no {k}"))
    };
    report.row(
        "legacy export (2 MiB)",
        "us",
        export_us,
        None,
        "-",
        Target::None,
    );
    report.row(
        "legacy open+close (2 MiB)",
        "us",
        get("legacy_open_close_us")?,
        None,
        "-",
        Target::None,
    );
    report.row(
        "shareable export fd (2 MiB)",
        "us",
        export_fd_us,
        None,
        "-",
        Target::None,
    );
    report.row(
        "shareable import+map+unmap (2 MiB)",
        "us",
        get("shareable_import_map_unmap_us")?,
        None,
        "-",
        Target::None,
    );
    report.row(
        "read imported 1 GiB (D2D)",
        "GB/s",
        get("read_imported_gbps")?,
        Some(get("read_local_gbps")?),
        "local 1 GiB",
        Target::RatioAtLeast(0.98),
    );
    drop((big, mappings, buffers));
    Ok(())
}
