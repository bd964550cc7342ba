//! A capture/replay loop: one "step" (a memset, a few kernels, a copy) recorded once and
//! replayed many times, with its parameter changed between epochs by updating the executable
//! graph in place instead of re-capturing from scratch.
//!
//! The kernel is PTX text JIT-compiled by the driver, so nothing needs `nvcc`. Run with
//! `cargo run --release --example capture_replay`.

mod common;
use common::println;

use std::ffi::c_void;
use std::time::Instant;

use cuda_core::module::{Function, Module};
use cuda_core::{memory::DevicePtr, Device, Stream};
use cuda_graph::{CaptureMode, Graph, UpdateOutcome};

/// `add_u32(u32* p, u32 v, u64 n)`: `p[i] += v` for `i < n`, one element per thread.
const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry add_u32(.param .u64 p, .param .u32 v, .param .u64 n)
{
    .reg .pred %q;
    .reg .b32 %r<6>;
    .reg .b64 %d<6>;
    ld.param.u64 %d1, [p];
    ld.param.u32 %r1, [v];
    ld.param.u64 %d2, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.u64.u32 %d3, %r5;
    setp.ge.u64 %q, %d3, %d2;
    @%q bra DONE;
    cvta.to.global.u64 %d1, %d1;
    shl.b64 %d4, %d3, 2;
    add.s64 %d5, %d1, %d4;
    ld.global.u32 %r2, [%d5];
    add.s32 %r2, %r2, %r1;
    st.global.u32 [%d5], %r2;
DONE:
    ret;
}
"#;

const N: usize = 4096;
const KERNELS_PER_STEP: u32 = 8;
const STEPS: usize = 1000;

fn add(kernel: &Function, stream: &Stream, buf: &DevicePtr, value: u32) -> cuda_core::Result<()> {
    let (mut p, mut v, mut n) = (buf.as_raw(), value, N as u64);
    let mut params = [
        &mut p as *mut _ as *mut c_void,
        &mut v as *mut _ as *mut c_void,
        &mut n as *mut _ as *mut c_void,
    ];
    let blocks = N.div_ceil(256) as u32;
    // SAFETY: the parameters match add_u32's (u64, u32, u64); `buf` holds N u32s and lives
    // until the stream has run the kernel (the caller synchronises before dropping it).
    unsafe { kernel.launch(stream, (blocks, 1, 1), (256, 1, 1), 0, &mut params) }
}

/// One step: reset `work` to `seed`, add 1 to it KERNELS_PER_STEP times, copy it to `out`.
fn step(
    kernel: &Function,
    stream: &Stream,
    work: &DevicePtr,
    out: &DevicePtr,
    seed: u32,
) -> cuda_core::Result<()> {
    work.memset_u32_async(seed, stream)?;
    for _ in 0..KERNELS_PER_STEP {
        add(kernel, stream, work, 1)?;
    }
    out.copy_from_device_async(work, stream)
}

fn capture_step(
    kernel: &Function,
    stream: &Stream,
    work: &DevicePtr,
    out: &DevicePtr,
    seed: u32,
) -> cuda_graph::Result<Graph> {
    cuda_graph::capture(stream, CaptureMode::ThreadLocal, |s| {
        Ok(step(kernel, s, work, out, seed)?)
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("capture_replay: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), cuda_graph::Error> {
    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let kernel = Module::from_ptx(&dev, PTX)?.function("add_u32")?;
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

fn check(out: &DevicePtr, expected: u32) -> Result<(), cuda_graph::Error> {
    let mut host = vec![0u32; N];
    out.copy_to_host(&mut host)?;
    if let Some((i, &x)) = host.iter().enumerate().find(|(_, &x)| x != expected) {
        return Err(cuda_graph::Error::other(format!(
            "out[{i}] = {x}, expected {expected}"
        )));
    }
    Ok(())
}
