//! Child processes that integration tests start; never a test of its own.
//!
//! `test_child no-driver`: with `CUDA_DRIVER_LIBRARY` naming a missing library, every call is
//! a clear error (started by `no_driver.rs`).
//! `test_child ipc-event <HEX>`: opens the parent's interprocess event, reports that it is
//! pending, waits on it and reports completion (started by `gpu_stream_event.rs`).
//! `test_child async-fault` (feature `gpu`): futures pending on several streams, then a kernel
//! that faults; every future must fail within a second (started by `gpu_async_fault.rs`).
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
        #[cfg(feature = "gpu")]
        ["async-fault"] => async_fault::run(),
        _ => {
            eprintln!(
                "usage: test_child no-driver <MISSING PATH> | ipc-event <HEX> | rtc <DIR> <SEED> \
                 | async-fault"
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
    // Explicit graphs: the conditional-node check is an error too, not a panic.
    use cudars_core::graph::explicit::{require_conditional, ConditionalKind};
    assert!(matches!(
        require_conditional(ConditionalKind::While),
        Err(cudars_core::Error::Load(_))
    ));
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

#[cfg(feature = "gpu")]
mod async_fault {
    use super::println;
    use std::future::IntoFuture;
    use std::time::{Duration, Instant};

    use cudars_core::completion::{self, WakeStrategy};
    use cudars_core::{Device, Stream};
    use cudars_xfer::{to_host_async, DeviceBuffer, PinnedBuffer};
    use workspace_tests::kernels::Kernels;

    type Outcome = (Instant, Result<(), String>, Option<u32>);

    fn outcome(r: Result<(), cudars_core::Error>) -> Outcome {
        let code = r.as_ref().err().and_then(|e| e.driver()).map(|d| d.code);
        (Instant::now(), r.map_err(|e| e.to_string()), code)
    }

    pub fn run() {
        let dev = Device::new(0).expect("a CUDA device is required");
        let k = Kernels::load(&dev).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_time()
            .build()
            .unwrap();
        // Four streams busy for 5 s: what is queued behind that is pending at the fault.
        let busy: Vec<Stream> = (0..4)
            .map(|_| Stream::builder(&dev).non_blocking(true).build().unwrap())
            .collect();
        let src = DeviceBuffer::<u32>::alloc(&dev, 1 << 16).unwrap();
        for s in &busy {
            k.spin(s, k.cycles_for(Duration::from_secs(5))).unwrap();
        }
        let mut tasks = Vec::new();
        let launched = Instant::now();
        rt.block_on(async {
            for s in &busy {
                for j in 0..50 {
                    let strategy = if j % 2 == 0 {
                        WakeStrategy::Poll
                    } else {
                        WakeStrategy::HostFunction
                    };
                    let c = s.completion_with(strategy).unwrap();
                    tasks.push(tokio::spawn(async move { outcome(c.await) }));
                    let e = s.record(None).unwrap().completion();
                    tasks.push(tokio::spawn(async move { outcome(e.await) }));
                }
                let out = PinnedBuffer::<u32>::zeroed(&dev, 1 << 16).unwrap();
                let t = to_host_async(&src, out, s).unwrap().into_future();
                tasks.push(tokio::spawn(async move {
                    outcome(t.await.map(drop).map_err(cudars_core::Error::from))
                }));
                let fence = s.record(None).unwrap();
                completion::drop_after(&fence, vec![0u8; 1 << 20]).unwrap();
            }
        });
        // The fault: a kernel that spins about 0.3 s, then writes to address 0x10.
        let faulting = Stream::builder(&dev).non_blocking(true).build().unwrap();
        // SAFETY: deliberately invalid, which is the point: it touches no host memory and
        // nothing of this process's but the (then dead) context.
        unsafe {
            k.spin_then_fill_raw(
                &faulting,
                0x10,
                7,
                1,
                k.cycles_for(Duration::from_millis(300)),
            )
        }
        .unwrap();
        let outcomes: Vec<Outcome> = rt.block_on(async {
            let mut v = Vec::new();
            for t in tasks {
                v.push(
                    tokio::time::timeout(Duration::from_secs(20), t)
                        .await
                        .expect("a future still pending 20 s after the fault")
                        .unwrap(),
                );
            }
            v
        });
        let n = outcomes.len();
        let ok = outcomes.iter().filter(|o| o.1.is_ok()).count();
        assert_eq!(ok, 0, "{ok} of {n} futures resolved Ok after a fault");
        let first = outcomes.iter().map(|o| o.0).min().unwrap();
        let last = outcomes.iter().map(|o| o.0).max().unwrap();
        let spread = last - first;
        let mut codes: Vec<u32> = outcomes.iter().filter_map(|o| o.2).collect();
        codes.sort_unstable();
        codes.dedup();
        let sample = outcomes[0].1.as_ref().unwrap_err().clone();
        println!("first error: {sample}");
        assert!(
            outcomes.iter().all(|o| o.2.is_some()),
            "every error is a driver error"
        );
        assert!(
            spread <= Duration::from_secs(1),
            "errors spread over {spread:?}"
        );
        assert!(
            last - launched < Duration::from_secs(4),
            "the errors came {:?} after the launch: the 5 s kernels must not have ended",
            last - launched
        );
        // Values in drop_after are leaked (the device may still use them), never dropped;
        // the reactor lets go of every failed wait.
        let start = Instant::now();
        while completion::stats().waits != 0 && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stats = completion::stats();
        println!(
            "ASYNC_FAULT ok futures={n} first_after_launch_ms={} spread_ms={} codes={codes:?} \
             reactor_waits_left={} failed={}",
            (first - launched).as_millis(),
            spread.as_millis(),
            stats.waits,
            stats.failed
        );
        assert_eq!(stats.waits, 0, "the reactor still holds waits");
        // The context is dead: skip destructors that would only meet its errors.
        std::process::exit(0);
    }
}
