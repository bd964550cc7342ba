//! `bench_fft`: `cuda-fft` beside the bare library and (through `fft_peers.py`) PyTorch and
//! CuPy.
//!
//! Rows (C2C, f32, forward, out of place, packed):
//! * `fft 2^24`: one transform of 2^24 complex numbers, ms (median of 20, events around
//!   each call on the stream);
//! * `fft 4096x1024`: a batch of 4,096 transforms of 1,024, ms;
//! * `cache hit`: host microseconds per call of `cudars_fft::c2c` (plan from the cache,
//!   checks, execution) on 256 complex numbers, against `cufftExecC2C` called bare on the
//!   same plan handle; 20,000 calls each, interleaved in 10 rounds, the median round.
//!
//! `fft_peers.py` prints `torch.fft.fft` and `cupy.fft.fft` for the first two rows.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

use std::time::Instant;

use cudars_core::{Device, DevicePtr, Event, Stream};
use cudars_fft::{cache, Direction, Geometry, Precision, Transform};
use workspace_tests::bench::median;

fn buf(stream: &Stream, bytes: usize) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, bytes).unwrap();
    p.memset_async(0, stream).unwrap();
    p
}

fn time_ms(stream: &Stream, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    stream.synchronize().unwrap();
    let mut t = Vec::new();
    for _ in 0..20 {
        let a = stream.record_timed().unwrap();
        f();
        let b = stream.record_timed().unwrap();
        b.synchronize().unwrap();
        t.push(f64::from(Event::elapsed_ms(&a, &b).unwrap()));
    }
    median(&mut t)
}

fn main() {
    let dev = Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    for (name, n, batch) in [
        ("fft 2^24", 1usize << 24, 1usize),
        ("fft 4096x1024", 1024, 4096),
    ] {
        let x = buf(&stream, n * batch * 8);
        let y = buf(&stream, n * batch * 8);
        let ms = time_ms(&stream, || {
            cudars_fft::c2c::<f32>(&stream, &x, &y, &[n], batch, Direction::Forward).unwrap();
        });
        println!("{name}: ours {ms:.4} ms");
    }
    // The cache-hit cost against a bare cufftExecC2C on the same plan.
    let n = 256;
    let x = buf(&stream, n * 8);
    let y = buf(&stream, n * 8);
    let g = Geometry::packed(Transform::C2C, Precision::Single, &[n], 1).unwrap();
    cudars_fft::exec(&stream, &g, &x, &y, Direction::Forward).unwrap();
    let plan = cache::plan(&dev, &g).unwrap();
    let raw = plan.lock().unwrap().as_raw();
    let lib = cudars_fft_sys::cufft().unwrap();
    stream.synchronize().unwrap();
    let calls = 20_000;
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let t0 = Instant::now();
        for _ in 0..calls {
            cudars_fft::c2c::<f32>(&stream, &x, &y, &[n], 1, Direction::Forward).unwrap();
        }
        stream.synchronize().unwrap();
        ours.push(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
        let t0 = Instant::now();
        for _ in 0..calls {
            // SAFETY: the cached plan's handle, bound to `stream` with its work area by the
            // call above; both buffers hold 256 complex f32; no other thread uses the plan.
            let s =
                unsafe { lib.cufftExecC2C(raw, x.as_raw() as *mut _, y.as_raw() as *mut _, -1) }
                    .unwrap();
            assert!(s.is_success());
        }
        stream.synchronize().unwrap();
        bare.push(t0.elapsed().as_secs_f64() * 1e6 / calls as f64);
    }
    let (o, b) = (median(&mut ours), median(&mut bare));
    println!(
        "cache hit (c2c of 256, host us per call): ours {o:.3} us, bare cufftExecC2C {b:.3} us, ratio {:.3} (target <= 1.05)",
        o / b
    );
    breakdown(&stream, &g, &x, &y);
}

/// Where a cache hit's host time goes, interleaved in 10 rounds of 20,000 calls (medians):
/// the bare `cufftExecC2C`, the plan's `exec` with its lock held outside the loop (our
/// checks, marks and bindings), `exec` through the shared plan's lock, and the one-call
/// `c2c` (the cache lookup on top).
fn breakdown(stream: &Stream, g: &Geometry, x: &DevicePtr, y: &DevicePtr) {
    let dev = stream.device();
    let shared = cache::plan(&dev, g).unwrap();
    let raw = shared.lock().unwrap().as_raw();
    let lib = cudars_fft_sys::cufft().unwrap();
    let n = g.shape()[0];
    let calls = 20_000;
    let mut rows: [Vec<f64>; 4] = Default::default();
    let time = |f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        for _ in 0..calls {
            f();
        }
        stream.synchronize().unwrap();
        t0.elapsed().as_secs_f64() * 1e6 / calls as f64
    };
    for _ in 0..10 {
        rows[0].push(time(&mut || {
            // SAFETY: the cached plan's handle, bound to `stream` with its work area; both
            // buffers hold `n` complex f32; no other thread uses the plan.
            let s =
                unsafe { lib.cufftExecC2C(raw, x.as_raw() as *mut _, y.as_raw() as *mut _, -1) }
                    .unwrap();
            assert!(s.is_success());
        }));
        {
            let mut held = shared.lock().unwrap();
            rows[1].push(time(&mut || {
                held.exec(stream, x, y, Direction::Forward).unwrap();
            }));
        }
        rows[2].push(time(&mut || {
            shared
                .lock()
                .unwrap()
                .exec(stream, x, y, Direction::Forward)
                .unwrap();
        }));
        rows[3].push(time(&mut || {
            cudars_fft::c2c::<f32>(stream, x, y, &[n], 1, Direction::Forward).unwrap();
        }));
    }
    let [bare, held, locked, one] = rows.map(|mut r| median(&mut r));
    println!(
        "cache hit breakdown (host us per call, interleaved): bare {bare:.3}, exec with the lock held {held:.3} (+{:.3}), through the lock {locked:.3} (+{:.3}), c2c {one:.3} (+{:.3} lookup)",
        held - bare,
        locked - held,
        one - locked
    );
}
