//! Child processes that integration tests start; never a test of its own.
//!
//! `test_child no-driver`: with `CUDA_DRIVER_LIBRARY` naming a missing library, every call is
//! a clear error (started by `no_driver.rs`).
//! `test_child ipc-event <HEX>`: opens the parent's interprocess event, reports that it is
//! pending, waits on it and reports completion (started by `gpu_stream_event.rs`).
//!
//! `test_child rtc <CACHE DIR> <SEED>`: compiles `workspace_tests::rtc::SAXPY` through a disk
//! cache in that directory, prints where the program came from (`RTC origin=Disk`), runs it on
//! random data and checks it against the host (started by `gpu_rtc.rs`).
//!
//! Exit status 0 when every check holds; a failed check panics with its message (exit 101),
//! and the parent test fails on that status.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test helper: a failed check is a panic the parent test reports"
)]

mod common;
use common::println;

use std::io::Write as _;

use cudars_core::event::IpcEventHandle;
use cudars_core::{Device, Event, Stream};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["no-driver", missing] => no_driver(missing),
        ["ipc-event", hex] => ipc_event(hex),
        ["rtc", dir, seed] => rtc(dir, seed.parse().expect("a numeric seed")),
        _ => {
            eprintln!(
                "usage: test_child no-driver <MISSING PATH> | ipc-event <HEX> | rtc <DIR> <SEED>"
            );
            std::process::exit(2);
        }
    }
}

fn no_driver(missing: &str) {
    assert_eq!(std::env::var("CUDA_DRIVER_LIBRARY").as_deref(), Ok(missing));
    assert!(!cudars_core::is_available());
    let err = cudars_core::device_count().unwrap_err();
    assert!(matches!(err, cudars_core::Error::Load(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(missing), "{text}");
    assert!(matches!(
        cudars_core::Device::new(0),
        Err(cudars_core::Error::Load(_))
    ));
    assert!(cudars_core::driver_version().is_err());
    assert!(cudars_core::Device::current().is_err());
    println!("NO_DRIVER ok");
}

fn ipc_event(hex: &str) {
    let handle = IpcEventHandle::from_hex(hex).unwrap();
    let dev = Device::new(0).expect("a CUDA device is required");
    let event = Event::open_ipc(&dev, &handle).unwrap();
    assert!(event.is_interprocess() && !event.timing_enabled());
    let pending = !event.query().unwrap();
    println!("IPC_CHILD pending={pending}");
    std::io::stdout().flush().unwrap();
    assert!(pending);
    // Wait through a stream of our own, then on the event itself.
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    stream.wait_event(&event).unwrap();
    let after = stream.record(None).unwrap();
    after.synchronize().unwrap();
    assert!(event.query().unwrap());
    event.synchronize().unwrap();
    println!("IPC_CHILD completed");
}

fn rtc(dir: &str, seed: u64) {
    use cudars_core::{DevicePtr, LaunchConfig};
    use cudars_rtc::{Cache, Program};
    use workspace_tests::rtc::{Rng, SAXPY};

    let dev = Device::new(0).expect("a CUDA device is required");
    let cache = Cache::in_dir(dir);
    let compiled = Program::new(SAXPY)
        .name("saxpy.cu")
        .device(&dev)
        .unwrap()
        .cache(&cache)
        .compile()
        .unwrap();
    println!(
        "RTC origin={:?} key={}",
        compiled.origin(),
        compiled.key().hex()
    );
    let kernel = compiled.load(&dev).unwrap().kernel("saxpy").unwrap();
    let n = 100_003usize;
    let mut rng = Rng::new(seed);
    let (x, y) = (rng.f32s(n), rng.f32s(n));
    let (dx, dy) = (
        DevicePtr::alloc(&dev, n * 4).unwrap(),
        DevicePtr::alloc(&dev, n * 4).unwrap(),
    );
    dx.copy_from_host(&x).unwrap();
    dy.copy_from_host(&y).unwrap();
    let stream = Stream::new(&dev).unwrap();
    // SAFETY: saxpy touches x[i] and y[i] for i < n only; both hold n floats.
    unsafe {
        kernel
            .launch(
                &stream,
                &LaunchConfig::for_elements(n as u64, 256),
                (1.5f32, &dx, &dy, n as u64),
            )
            .unwrap()
    };
    stream.synchronize().unwrap();
    let mut out = vec![0f32; n];
    dy.copy_to_host(&mut out).unwrap();
    for i in 0..n {
        let want = 1.5f32.mul_add(x[i], y[i]);
        assert!(
            (out[i] - want).abs() <= 1e-5,
            "y[{i}] = {} != {want}",
            out[i]
        );
    }
    println!("RTC ok");
}
