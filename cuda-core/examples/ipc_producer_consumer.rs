//! Two processes sharing device memory (`cudars_core::ipc`): run it without arguments and it
//! is the producer, which re-executes itself as the consumer.
//!
//! * producer: allocates a buffer, fills it on a stream, records an interprocess event and
//!   starts the consumer with the memory and event handles (hex) in its environment;
//! * consumer: opens both, makes its stream wait on the event, and reads the buffer in place
//!   (a device-to-device copy out of the mapping), then checks it.
//!
//! Modes for other clients (the CuPy interop script `tests/bundle/clients_ipc.py`):
//!
//! * `--export-legacy SIZE SEED`: exports a buffer holding `(i * 131 + SEED) mod 256`, prints
//!   `HANDLE <hex>`, and keeps it until a line arrives on stdin;
//! * `--open-legacy HEX SIZE SEED`: opens a handle another process exported, checks the
//!   same pattern, prints `OK` (exit status 0) or what differs (status 1).
//!
//! ```text
//! cargo run -p cuda-core --example ipc_producer_consumer
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark/example code: a failed check panics with its message"
)]

use std::io::BufRead;
use std::process::Command;

use cudars_core::ipc::{IpcMapping, IpcMemHandle};
use cudars_core::memory::{DeviceMemory, DevicePtr};
use cudars_core::{Device, Event, IpcEventHandle, Stream};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const MEM_ENV: &str = "IPC_EXAMPLE_MEM";
const EVENT_ENV: &str = "IPC_EXAMPLE_EVENT";
const SIZE: usize = 64 << 20;
const VALUE: u32 = 0xC0DE_CAFE;

fn pattern(size: usize, seed: u64) -> Vec<u8> {
    (0..size as u64)
        .map(|i| (i.wrapping_mul(131).wrapping_add(seed) % 256) as u8)
        .collect()
}

fn producer(dev: &Device) -> Res<()> {
    let stream = Stream::new(dev)?;
    let mem = DeviceMemory::new(dev, SIZE)?;
    let handle = mem.ipc_handle()?;
    let buf = mem.into_ptr();
    let event = Event::builder(dev)
        .disable_timing(true)
        .interprocess(true)
        .build()?;
    buf.memset_u32_async(VALUE, &stream)?;
    event.record(&stream)?;
    println!("producer: {SIZE} bytes filled on a stream, event recorded; starting the consumer");
    let status = Command::new(std::env::current_exe()?)
        .env(MEM_ENV, handle.to_hex())
        .env(EVENT_ENV, event.ipc_handle()?.to_hex())
        .status()?;
    // The buffer must stay allocated until the consumer has closed its mapping.
    stream.synchronize()?;
    drop(buf);
    if !status.success() {
        return Err(format!("consumer failed: {status}").into());
    }
    println!("producer: the consumer read the buffer");
    Ok(())
}

fn consumer(dev: &Device, mem_hex: &str, event_hex: &str) -> Res<()> {
    let mapping = IpcMapping::open(dev, &IpcMemHandle::from_hex(mem_hex)?)?;
    let event = Event::open_ipc(dev, &IpcEventHandle::from_hex(event_hex)?)?;
    let shared = DevicePtr::from_arc(mapping).slice(..SIZE)?;
    let stream = Stream::new(dev)?;
    stream.wait_event(&event)?;
    // Read in place: a device-to-device copy out of the mapping, ordered after the event.
    let local = DevicePtr::alloc(dev, SIZE)?;
    local.copy_from_device_async(&shared, &stream)?;
    stream.synchronize()?;
    let mut host = vec![0u32; SIZE / 4];
    local.copy_to_host(&mut host)?;
    if let Some(i) = host.iter().position(|&x| x != VALUE) {
        return Err(format!("consumer: word {i} is {:#x}, expected {VALUE:#x}", host[i]).into());
    }
    println!("consumer: all {SIZE} bytes are the producer's");
    Ok(())
}

fn export_legacy(dev: &Device, size: usize, seed: u64) -> Res<()> {
    let mem = DeviceMemory::new(dev, size)?;
    let handle = mem.ipc_handle()?;
    let buf = mem.into_ptr();
    buf.copy_from_host(&pattern(size, seed))?;
    dev.synchronize()?;
    println!("HANDLE {}", handle.to_hex());
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    drop(buf);
    Ok(())
}

fn open_legacy(dev: &Device, hex: &str, size: usize, seed: u64) -> Res<()> {
    let mapping = IpcMapping::open(dev, &IpcMemHandle::from_hex(hex)?)?;
    let view = DevicePtr::from_arc(mapping).slice(..size)?;
    let mut host = vec![0u8; size];
    view.copy_to_host(&mut host)?;
    let expected = pattern(size, seed);
    match host.iter().zip(&expected).position(|(a, b)| a != b) {
        None => {
            println!("OK");
            Ok(())
        }
        Some(i) => Err(format!("byte {i} is {}, expected {}", host[i], expected[i]).into()),
    }
}

fn main() -> Res<()> {
    let dev = Device::new(0)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> Res<u64> { Ok(args.get(i).ok_or("missing argument")?.parse::<u64>()?) };
    match args.first().map(String::as_str) {
        Some("--export-legacy") => export_legacy(&dev, num(1)? as usize, num(2)?),
        Some("--open-legacy") => open_legacy(
            &dev,
            args.get(1).ok_or("missing handle")?,
            num(2)? as usize,
            num(3)?,
        ),
        Some(other) => Err(format!("unknown mode {other}").into()),
        None => match (std::env::var(MEM_ENV), std::env::var(EVENT_ENV)) {
            (Ok(mem), Ok(event)) => consumer(&dev, &mem, &event),
            _ => producer(&dev),
        },
    }
}
