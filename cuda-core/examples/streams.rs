//! Stream-based asynchronous operations: the Rust version of the seed's CuPy example
//! (two streams doing independent work, `with stream:` scopes, synchronising each stream,
//! and events timing a span of work), plus a host callback.
//!
//! The CuPy example multiplies random matrices; `cuda-core` has no array library, so each
//! stream runs the fill kernel of `cudars_core::kernels` (PTX JIT-compiled by the driver, no
//! `nvcc` needed) over a million-element buffer instead, then copies the result back
//! asynchronously. The kernel stays hand-written PTX here: `cuda-core` has no compiler of its
//! own (`cudars-rtc`, which compiles CUDA C++, depends on `cuda-core`, not the reverse).
//!
//! Run with `cargo run --release -p cudars-core --example streams`; exits 0 on a machine with a
//! GPU, prints the error and exits 1 otherwise.

mod common;
use common::println;

use std::process::ExitCode;
use std::sync::mpsc;

use cudars_core::kernels::Kernels;
use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Event, Stream};

const N: usize = 1000 * 1000;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Queues `fill_u32(buf, value)` on the thread's current stream of the buffer's device.
fn fill_on_current_stream(
    kernels: &Kernels,
    buf: &DevicePtr,
    value: u32,
) -> cudars_core::Result<()> {
    kernels.fill(&Stream::current(&buf.device()), buf, value)
}

fn run() -> cudars_core::Result<()> {
    let dev = Device::new(0)?;
    let fill = Kernels::load(&dev)?;

    // Create streams for concurrent execution.
    let stream1 = Stream::new(&dev)?;
    let stream2 = Stream::new(&dev)?;

    let buf1 = DevicePtr::alloc(&dev, N * 4)?;
    let buf2 = DevicePtr::alloc(&dev, N * 4)?;
    let mut host1 = PinnedMemory::new(&dev, N * 4, PinnedFlags::NONE)?;
    let mut host2 = PinnedMemory::new(&dev, N * 4, PinnedFlags::NONE)?;

    // Perform operations on different streams: inside each scope, the current stream is
    // that stream (`with stream1:`), so work queued on `Stream::current` lands there.
    {
        let _s = stream1.scope();
        fill_on_current_stream(&fill, &buf1, 1)?;
        // SAFETY: `host1` is pinned and not touched until stream1 is synchronised below.
        unsafe { buf1.copy_to_host_async(&mut host1[..], &Stream::current(&dev)) }?;
    }
    {
        let _s = stream2.scope();
        fill_on_current_stream(&fill, &buf2, 2)?;
        // SAFETY: as above, for stream2.
        unsafe { buf2.copy_to_host_async(&mut host2[..], &Stream::current(&dev)) }?;
    }
    // Outside the scopes the current stream is the legacy null stream again.
    assert_eq!(Stream::current(&dev), Stream::null(&dev));

    // A host callback runs once stream1's work before it is done.
    let (tx, rx) = mpsc::channel();
    stream1.add_callback(move |status| {
        let _ = tx.send(status);
    })?;

    // Synchronize streams.
    stream1.synchronize()?;
    stream2.synchronize()?;
    let callback_status = rx
        .recv()
        .map_err(|e| cudars_core::Error::InvalidArgument(e.to_string()))?;
    println!("stream1's callback saw status {callback_status:?}");

    let ok1 = host1.chunks_exact(4).all(|c| c == 1u32.to_ne_bytes());
    let ok2 = host2.chunks_exact(4).all(|c| c == 2u32.to_ne_bytes());
    println!("stream1 result correct: {ok1}; stream2 result correct: {ok2}");
    if !(ok1 && ok2) {
        return Err(cudars_core::Error::InvalidArgument("wrong results".into()));
    }

    // Events for timing and synchronization.
    let start_event = Event::timed(&dev)?;
    let end_event = Event::timed(&dev)?;
    start_event.record_current()?;
    for value in 0..10 {
        fill_on_current_stream(&fill, &buf1, value)?;
    }
    end_event.record_current()?;
    end_event.synchronize()?;
    let elapsed = Event::elapsed_ms(&start_event, &end_event)?;
    println!("Operation took {elapsed:.2} ms");
    Ok(())
}
