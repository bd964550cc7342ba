//! Stream-based asynchronous operations: the Rust version of the seed's CuPy example
//! (two streams doing independent work, `with stream:` scopes, synchronising each stream,
//! and events timing a span of work), plus a host callback.
//!
//! The CuPy example multiplies random matrices; `cuda-core` has no array library, so each
//! stream runs a small PTX kernel (JIT-compiled by the driver, no `nvcc` needed) over a
//! million-element buffer instead, then copies the result back asynchronously.
//!
//! Run with `cargo run --release -p cudars-core --example streams`; exits 0 on a machine with a
//! GPU, prints the error and exits 1 otherwise.

mod common;
use common::println;

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::mpsc;

use cuda_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cuda_core::module::{Function, Module};
use cuda_core::{Device, Event, Stream};

/// `fill_u32(u32* ptr, u32 value, u64 n)`: `ptr[i] = value` for `i < n`, grid-stride.
const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry fill_u32(.param .u64 p_ptr, .param .u32 p_value, .param .u64 p_n)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<8>;
    ld.param.u64        %rd1, [p_ptr];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u32        %r1, [p_value];
    ld.param.u64        %rd2, [p_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd7, %rd1, %rd6;
    st.global.u32       [%rd7], %r1;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             LOOP;
DONE:
    ret;
}
"#;

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

/// Queues `fill_u32(buf, value, N)` on the thread's current stream of the buffer's device.
fn fill_on_current_stream(fill: &Function, buf: &DevicePtr, value: u32) -> cuda_core::Result<()> {
    let stream = Stream::current(&buf.device());
    let (mut ptr, mut value, mut n) = (buf.as_raw(), value, N as u64);
    let mut params = [
        &mut ptr as *mut _ as *mut c_void,
        &mut value as *mut u32 as *mut c_void,
        &mut n as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match `fill_u32(u32*, u32, u64)`; `buf` holds N u32 and is kept
    // alive by the caller until the stream is synchronised.
    unsafe { fill.launch(&stream, (256, 1, 1), (256, 1, 1), 0, &mut params) }
}

fn run() -> cuda_core::Result<()> {
    let dev = Device::new(0)?;
    let fill = Module::from_ptx(&dev, PTX)?.function("fill_u32")?;

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
        .map_err(|e| cuda_core::Error::InvalidArgument(e.to_string()))?;
    println!("stream1's callback saw status {callback_status:?}");

    let ok1 = host1.chunks_exact(4).all(|c| c == 1u32.to_ne_bytes());
    let ok2 = host2.chunks_exact(4).all(|c| c == 2u32.to_ne_bytes());
    println!("stream1 result correct: {ok1}; stream2 result correct: {ok2}");
    if !(ok1 && ok2) {
        return Err(cuda_core::Error::InvalidArgument("wrong results".into()));
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
