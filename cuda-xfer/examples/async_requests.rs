//! A tokio service: many concurrent requests, each an upload, a kernel and a download, on a
//! few streams, every step awaited and no runtime thread ever blocked.
//!
//! Each request takes a slot (two pinned host buffers and a device buffer; the slots are
//! made once, since allocating pinned or device memory is a synchronous driver call), fills
//! its input, queues on its stream `copy_to_device_async` -> an `add_u32` kernel (CUDA C++
//! compiled at run time by `cudars-rtc`) -> `to_host_async`, and awaits the two transfers
//! (`Pending` is
//! `IntoFuture`): the buffers come back when the device is done with them, and the task
//! sleeps meanwhile. A ticker task measures how late the runtime runs it: a blocked worker
//! would show up there.
//!
//! Run with `cargo run --release -p cudars-xfer --example async_requests`. Exits 0 on a
//! machine with a GPU and NVRTC (`$CUDA_NVRTC_LIBRARY`), 1 (with the error) without.

mod common;
use common::println;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudars_core::completion;
use cudars_core::{Device, LaunchConfig, Stream};
use cudars_rtc::{Kernel, Program};
use cudars_xfer::{copy_to_device_async, to_host_async, DeviceBuffer, PinnedBuffer};

const REQUESTS: usize = 2_000;
const SLOTS: usize = 64;
const STREAMS: usize = 4;
/// Elements of one request (256 KiB of u32).
const LEN: usize = 64 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `p[i] += v` for `i < n`, one thread per element.
const ADD_U32: &str = r#"
extern "C" __global__ void add_u32(unsigned* p, unsigned v, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
"#;

/// What one request in flight holds.
struct Slot {
    input: PinnedBuffer<u32>,
    output: PinnedBuffer<u32>,
    device: DeviceBuffer<u32>,
}

struct Service {
    add: Kernel,
    /// One thread per element of a request.
    add_config: LaunchConfig,
    streams: Vec<Stream>,
    slots: Mutex<Vec<Slot>>,
    free: tokio::sync::Semaphore,
}

impl Service {
    /// One request: `input[j] = id + j`, the kernel adds `id`, the answer must be
    /// `2 * id + j`. Returns the request's latency.
    async fn handle(&self, id: usize) -> Result<Duration, BoxError> {
        let start = Instant::now();
        let permit = self.free.acquire().await?;
        let mut slot = self
            .slots
            .lock()
            .map_err(|_| "slot list poisoned")?
            .pop()
            .ok_or("no free slot")?;
        let stream = &self.streams[id % STREAMS];
        for (j, x) in slot.input.iter_mut().enumerate() {
            *x = (id + j) as u32;
        }
        // Queue the three steps; none of these calls waits for the device.
        let upload = copy_to_device_async(slot.input, &slot.device, stream)?;
        // SAFETY: `add_u32` reads and writes `p[i]` for `i < LEN` only, one thread each, and
        // the device buffer holds LEN u32s; the launch marks it as used by `stream`.
        unsafe {
            self.add.launch(
                stream,
                &self.add_config,
                (slot.device.as_ptr(), id as u32, LEN as u64),
            )
        }?;
        let download = to_host_async(&slot.device, slot.output, stream)?;
        // Await them: the task sleeps, the worker thread serves other requests.
        slot.input = upload.await?;
        slot.output = download.await?;
        for (j, &x) in slot.output.iter().enumerate() {
            if x != (2 * id + j) as u32 {
                return Err(format!("request {id}: element {j} is {x}").into());
            }
        }
        self.slots
            .lock()
            .map_err(|_| "slot list poisoned")?
            .push(slot);
        drop(permit);
        Ok(start.elapsed())
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BoxError> {
    let dev = Device::new(0)?;
    let add = Program::new(ADD_U32)
        .name("add_u32.cu")
        .device(&dev)?
        .compile()? // NVRTC the first time; the disk cache afterwards
        .load(&dev)?
        .kernel("add_u32")?;
    let service = Arc::new(Service {
        add_config: add.config_for_elements(LEN as u64, 0)?,
        add,
        streams: (0..STREAMS)
            .map(|_| Stream::builder(&dev).non_blocking(true).build())
            .collect::<Result<_, _>>()?,
        slots: Mutex::new(
            (0..SLOTS)
                .map(|_| {
                    Ok(Slot {
                        input: PinnedBuffer::zeroed(&dev, LEN)?,
                        output: PinnedBuffer::zeroed(&dev, LEN)?,
                        device: DeviceBuffer::alloc(&dev, LEN)?,
                    })
                })
                .collect::<Result<_, cudars_xfer::Error>>()?,
        ),
        free: tokio::sync::Semaphore::new(SLOTS),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()?;
    let (took, mut latencies, late) = rt.block_on(async {
        // The ticker: wakes every millisecond and notes how late it runs.
        let ticking = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let ticker = {
            let ticking = Arc::clone(&ticking);
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while ticking.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                worst
            })
        };
        let start = Instant::now();
        let requests: Vec<_> = (0..REQUESTS)
            .map(|id| {
                let s = Arc::clone(&service);
                tokio::spawn(async move { s.handle(id).await })
            })
            .collect();
        let mut latencies = Vec::with_capacity(REQUESTS);
        for r in requests {
            latencies.push(r.await??);
        }
        let took = start.elapsed();
        ticking.store(false, std::sync::atomic::Ordering::Relaxed);
        let late = ticker.await?;
        Ok::<_, BoxError>((took, latencies, late))
    })?;
    latencies.sort();
    let mib = (REQUESTS * LEN * 4 * 2) as f64 / (1 << 20) as f64;
    println!(
        "{REQUESTS} requests ({SLOTS} in flight at most, {STREAMS} streams, {} KiB each way) in \
         {took:?}: {:.0} requests/s, {:.1} GiB/s moved",
        LEN * 4 / 1024,
        REQUESTS as f64 / took.as_secs_f64(),
        mib / 1024.0 / took.as_secs_f64()
    );
    println!(
        "latency median {:?}, p99 {:?}; the 1 ms ticker ran at most {late:?} late",
        latencies[REQUESTS / 2],
        latencies[REQUESTS * 99 / 100]
    );
    println!("reactor: {:?}", completion::stats());
    Ok(())
}
