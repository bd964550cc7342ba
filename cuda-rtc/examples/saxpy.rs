//! `y = a * x + y` over a million floats: CUDA C++ compiled at run time for this GPU (a cubin),
//! cached on disk, launched with typed arguments and a block size from the occupancy
//! calculator, and checked against the same computation on the host.
//!
//! Run with `cargo run --release -p cudars-rtc --example saxpy`. The first run compiles; the
//! next ones load the cubin from the disk cache (`$CUDA_RTC_CACHE_DIR`, default
//! `~/.cache/cudars-rtc`), and say so. Exits 1 with the error on a machine without a GPU or
//! NVRTC.

mod common;
use common::println;

use std::process::ExitCode;

use cudars_core::{Device, DevicePtr, Stream};
use cudars_rtc::Program;

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Random floats in [-1, 1) from a fixed seed (xorshift64*).
fn random(n: usize, mut s: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    let compiled = Program::new(SAXPY)
        .name("saxpy.cu")
        .device(&dev)?
        .compile()?;
    println!(
        "saxpy for {}: {:?} ({} bytes of {:?})",
        compiled.arch(),
        compiled.origin(),
        compiled.image().len(),
        compiled.output()
    );
    let saxpy = compiled.load(&dev)?.kernel("saxpy")?;

    let n = 1usize << 20;
    let a = 2.5f32;
    let (x, y) = (random(n, 1), random(n, 2));
    let dx = DevicePtr::alloc(&dev, n * 4)?;
    let dy = DevicePtr::alloc(&dev, n * 4)?;
    dx.copy_from_host(&x)?;
    dy.copy_from_host(&y)?;
    let stream = Stream::new(&dev)?;
    let cfg = saxpy.config_for_elements(n as u64, 0)?;
    println!("launch: {} blocks of {} threads", cfg.grid.0, cfg.block.0);
    // SAFETY: saxpy reads x[i] and writes y[i] for i < n only, and both hold n floats.
    unsafe { saxpy.launch(&stream, &cfg, (a, &dx, &dy, n as u64))? };
    stream.synchronize()?;

    let mut out = vec![0f32; n];
    dy.copy_to_host(&mut out)?;
    let worst = out
        .iter()
        .zip(x.iter().zip(&y))
        .map(|(&got, (&x, &y))| (got - a.mul_add(x, y)).abs())
        .fold(0f32, f32::max);
    println!("largest difference from the host: {worst:e}");
    if worst > 1e-5 {
        return Err(format!("saxpy differs from the host by {worst}").into());
    }
    println!("saxpy ok");
    Ok(())
}
