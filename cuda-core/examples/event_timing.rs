//! Event timing: measure device work with events (CuPy's `Event()`, `record`,
//! `synchronize`, `get_elapsed_time`), the errors for events that cannot time, and an event
//! used only for ordering between two streams.
//!
//! Run with `cargo run --release -p cudars-core --example event_timing`; exits 0 on a machine
//! with a GPU, prints the error and exits 1 otherwise.

mod common;
use common::println;

use std::process::ExitCode;

use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Error, Event, Stream};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gb_per_s(bytes: usize, ms: f32) -> f64 {
    bytes as f64 / (f64::from(ms) / 1e3) / 1e9
}

fn run() -> cudars_core::Result<()> {
    let dev = Device::new(0)?;
    println!("{}", dev.name()?);
    let stream = Stream::builder(&dev).non_blocking(true).build()?;

    // Time a 256 MiB memset.
    let bytes = 256 << 20;
    let buf = DevicePtr::alloc(&dev, bytes)?;
    buf.memset_async(0, &stream)?; // warm-up
    let start = Event::timed(&dev)?;
    let end = Event::timed(&dev)?;
    start.record(&stream)?;
    buf.memset_async(0xab, &stream)?;
    end.record(&stream)?;
    end.synchronize()?;
    let ms = Event::elapsed_ms(&start, &end)?;
    println!(
        "memset of 256 MiB: {:?} ({:.1} GB/s)",
        Event::elapsed(&start, &end)?,
        gb_per_s(bytes, ms)
    );

    // Time a 64 MiB host-to-device copy from pinned memory, events from `Stream::record`.
    let copy_bytes = 64 << 20;
    let host = PinnedMemory::new(&dev, copy_bytes, PinnedFlags::NONE)?;
    let dst = buf.slice(..copy_bytes)?;
    let start = stream.record_timed()?; // a new timed event, like CuPy's `stream.record()`
                                        // SAFETY: `host` is pinned and not modified until the stream is synchronised below.
    unsafe { dst.copy_from_host_async(&host[..], &stream) }?;
    let end = stream.record_timed()?;
    stream.synchronize()?;
    let ms = Event::elapsed_ms(&start, &end)?;
    println!(
        "pinned H2D copy of 64 MiB: {ms:.3} ms ({:.1} GB/s)",
        gb_per_s(copy_bytes, ms)
    );

    // Events without timing are cheaper, and cannot time: a clear error.
    let fence = Event::new(&dev)?;
    match Event::elapsed(&start, &fence) {
        Err(Error::TimingDisabled) => println!("untimed event: {}", Error::TimingDisabled),
        other => println!("unexpected: {other:?}"),
    }
    let never = Event::timed(&dev)?;
    match Event::elapsed(&start, &never) {
        Err(e @ Error::EventNotRecorded) => println!("unrecorded event: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    // An untimed event orders work across streams: `other` waits for `stream`'s memset.
    let other = Stream::builder(&dev).non_blocking(true).build()?;
    buf.memset_async(1, &stream)?;
    fence.record(&stream)?;
    other.wait_event(&fence)?;
    buf.memset_async(2, &other)?; // runs after the memset to 1
    other.synchronize()?;
    let mut first = [0u8; 4];
    buf.slice(..4)?.copy_to_host(&mut first)?;
    println!("after ordered memsets the buffer holds {first:?} (expected [2, 2, 2, 2])");
    if first != [2; 4] {
        return Err(Error::InvalidArgument("event ordering failed".into()));
    }
    Ok(())
}
