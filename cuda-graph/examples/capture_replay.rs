//! A capture/replay loop: one "step" (a memset, a few kernels, a copy) recorded once and
//! replayed many times, with its parameter changed between epochs by updating the executable
//! graph in place instead of re-capturing from scratch.
//!
//! The kernel is `add_u32`, CUDA C++ compiled at run time by `cudars-rtc` (NVRTC, so nothing
//! needs `nvcc`; `$CUDA_NVRTC_LIBRARY` names the library when it is not on the loader's
//! path). Run with `cargo run --release --example capture_replay`.

mod common;
use common::println;

use std::time::Instant;

use cudars_core::{memory::DevicePtr, Device, LaunchConfig, Stream};
use cudars_graph::{CaptureMode, Graph, UpdateOutcome};
use cudars_rtc::{Kernel, Program};

const N: usize = 4096;
const KERNELS_PER_STEP: u32 = 8;
const STEPS: usize = 1000;

/// `p[i] += v` for `i < n`, one thread per element.
const ADD_U32: &str = r#"
extern "C" __global__ void add_u32(unsigned* p, unsigned v, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
"#;

/// The add kernel, and its launch over `N` elements.
struct Add {
    kernel: Kernel,
    config: LaunchConfig,
}

impl Add {
    fn load(dev: &Device) -> cudars_core::Result<Add> {
        let kernel = Program::new(ADD_U32)
            .name("add_u32.cu")
            .device(dev)?
            .compile()? // NVRTC the first time; the disk cache afterwards
            .load(dev)?
            .kernel("add_u32")?;
        let config = kernel.config_for_elements(N as u64, 0)?;
        Ok(Add { kernel, config })
    }

    /// Queues `work[i] += v` for every element of `work` (`N` u32s).
    fn add(&self, stream: &Stream, work: &DevicePtr, v: u32) -> cudars_core::Result<()> {
        if work.len() != N * 4 {
            return Err(cudars_core::Error::InvalidArgument(format!(
                "add: {} bytes, not {N} u32s",
                work.len()
            )));
        }
        // SAFETY: `add_u32` reads and writes `p[i]` for `i < N` only, one thread each, and
        // `work` holds N u32s (checked above); the launch marks it as used by `stream` (and
        // keeps it alive in a graph being captured).
        unsafe {
            self.kernel
                .launch(stream, &self.config, (work, v, N as u64))
        }?;
        Ok(())
    }
}

/// One step: reset `work` to `seed`, add 1 to it KERNELS_PER_STEP times, copy it to `out`.
fn step(
    kernel: &Add,
    stream: &Stream,
    work: &DevicePtr,
    out: &DevicePtr,
    seed: u32,
) -> cudars_core::Result<()> {
    work.memset_u32_async(seed, stream)?;
    for _ in 0..KERNELS_PER_STEP {
        kernel.add(stream, work, 1)?;
    }
    out.copy_from_device_async(work, stream)
}

fn capture_step(
    kernel: &Add,
    stream: &Stream,
    work: &DevicePtr,
    out: &DevicePtr,
    seed: u32,
) -> cudars_graph::Result<Graph> {
    cudars_graph::capture(stream, CaptureMode::ThreadLocal, |s| {
        Ok(step(kernel, s, work, out, seed)?)
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("capture_replay: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), cudars_graph::Error> {
    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let kernel = Add::load(&dev)?;
    let work = DevicePtr::alloc(&dev, N * 4)?;
    let out = DevicePtr::alloc(&dev, N * 4)?;

    // Direct issue, for comparison.
    let t = Instant::now();
    for _ in 0..STEPS {
        step(&kernel, &stream, &work, &out, 0)?;
    }
    stream.synchronize()?;
    let direct = t.elapsed();

    // Capture once, replay STEPS times.
    let graph = capture_step(&kernel, &stream, &work, &out, 0)?;
    println!(
        "one step = {} graph nodes ({} operations)",
        graph.node_count()?,
        KERNELS_PER_STEP + 2
    );
    let mut exec = graph.instantiate()?;
    exec.upload(&stream)?;
    let t = Instant::now();
    for _ in 0..STEPS {
        exec.launch(&stream)?;
    }
    stream.synchronize()?;
    let replay = t.elapsed();
    check(&out, KERNELS_PER_STEP)?;
    println!(
        "{STEPS} steps: direct issue {direct:?}, graph replay {replay:?} ({:.1}x)",
        direct.as_secs_f64() / replay.as_secs_f64()
    );

    // New epochs: re-capture with a new seed and update the executable graph in place.
    for epoch in 1..=3u32 {
        let seed = epoch * 100;
        let next = capture_step(&kernel, &stream, &work, &out, seed)?;
        match exec.update(&next)? {
            UpdateOutcome::Updated => println!("epoch {epoch}: updated in place (seed {seed})"),
            UpdateOutcome::Reinstantiated(why) => {
                println!("epoch {epoch}: re-instantiated ({why})")
            }
        }
        for _ in 0..10 {
            exec.launch(&stream)?;
        }
        stream.synchronize()?;
        check(&out, seed + KERNELS_PER_STEP)?;
    }
    println!("every replay produced the expected values");
    Ok(())
}

fn check(out: &DevicePtr, expected: u32) -> Result<(), cudars_graph::Error> {
    let mut host = vec![0u32; N];
    out.copy_to_host(&mut host)?;
    if let Some((i, &x)) = host.iter().enumerate().find(|(_, &x)| x != expected) {
        return Err(cudars_graph::Error::other(format!(
            "out[{i}] = {x}, expected {expected}"
        )));
    }
    Ok(())
}
