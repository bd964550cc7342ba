//! An iterative solver whose loop runs on the device, as a while node, checked against the
//! same loop driven from the host.
//!
//! The system: `2.1 x[i] - x[i-1] - x[i+1] = b[i]` (tridiagonal, diagonally dominant), solved
//! by Jacobi iteration until the largest change of an iteration is below a tolerance. One
//! iteration is three nodes: a memset that zeroes the max-change word, the Jacobi kernel
//! (which also folds `|x_new - x|` into that word with an integer `atomicMax`, so the result
//! does not depend on the order of the threads), a copy `x := x_new`, and a check kernel that
//! counts the iteration and decides whether to go on.
//!
//! - Device loop: those nodes are the body of a while node; the check kernel sets the
//!   condition with `cudaGraphSetConditional`. One launch runs the whole solve.
//! - Host loop: the same nodes in a plain graph, launched once per iteration; the host reads
//!   the decision back after each launch.
//!
//! Both must stop after the same number of iterations with bit-identical solutions.
//! Kernels are compiled with NVRTC (`cudars-rtc`); run with `cargo run --example while_solver`
//! on a machine with a CUDA 12.3+ driver and libnvrtc.

use std::ffi::c_void;
use std::time::Instant;

use cudars_core::{Device, DevicePtr, Function, LaunchConfig, Stream};
use cudars_graph::{GraphBuilder, NodeId, SET_CONDITIONAL_PRELUDE};

const SOURCE: &str = r#"
extern "C" __global__ void jacobi(float* x_new, const float* x, const float* b,
                                  unsigned* max_change, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float left = i > 0 ? x[i - 1] : 0.0f;
    float right = i + 1 < n ? x[i + 1] : 0.0f;
    float v = (b[i] + left + right) / 2.1f;
    x_new[i] = v;
    // Non-negative floats order like their bit patterns.
    atomicMax(max_change, __float_as_uint(fabsf(v - x[i])));
}
extern "C" __global__ void check(cudaGraphConditionalHandle h, const unsigned* max_change,
                                 unsigned* iterations, unsigned* go, float tol, unsigned max_iters) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned it = *iterations + 1;
    *iterations = it;
    unsigned cont = __uint_as_float(*max_change) > tol && it < max_iters;
    *go = cont;
    if (h != 0) cudaGraphSetConditional(h, cont);
}
"#;

const N: usize = 1 << 20;
const TOL: f32 = 1e-5;
const MAX_ITERS: u32 = 10_000;

struct Buffers {
    x: DevicePtr,
    x_new: DevicePtr,
    b: DevicePtr,
    max_change: DevicePtr,
    iterations: DevicePtr,
    go: DevicePtr,
}

/// Adds one iteration (memset, jacobi, copy, check) to `g`; `handle` 0 for the host loop.
fn add_iteration(
    g: &mut GraphBuilder<'_>,
    jacobi: &Function,
    check: &Function,
    buf: &Buffers,
    handle: u64,
) -> cudars_graph::Result<NodeId> {
    let zero = g.add_memset_u32(&[], &buf.max_change, 0)?;
    let (mut xn, mut x, mut b, mut mc, mut n) = (
        buf.x_new.as_raw(),
        buf.x.as_raw(),
        buf.b.as_raw(),
        buf.max_change.as_raw(),
        N as u64,
    );
    let mut params = [
        &mut xn as *mut u64 as *mut c_void,
        &mut x as *mut u64 as *mut c_void,
        &mut b as *mut u64 as *mut c_void,
        &mut mc as *mut u64 as *mut c_void,
        &mut n as *mut u64 as *mut c_void,
    ];
    let keep = [&buf.x_new, &buf.x, &buf.b, &buf.max_change];
    // SAFETY: the parameters are jacobi's (four pointers, one 64-bit count); every buffer
    // holds N floats (max_change one u32) and is kept alive by the graph; one thread per
    // element, each writing its own x_new[i].
    let step = unsafe {
        g.add_kernel(
            &[zero],
            jacobi,
            &LaunchConfig::for_elements(N as u64, 256),
            &mut params,
            &keep,
        )
    }?;
    let copy = g.add_memcpy(&[step], &buf.x, &buf.x_new)?;
    let (mut h, mut mc, mut it, mut go, mut tol, mut max) = (
        handle,
        buf.max_change.as_raw(),
        buf.iterations.as_raw(),
        buf.go.as_raw(),
        TOL,
        MAX_ITERS,
    );
    let mut params = [
        &mut h as *mut u64 as *mut c_void,
        &mut mc as *mut u64 as *mut c_void,
        &mut it as *mut u64 as *mut c_void,
        &mut go as *mut u64 as *mut c_void,
        &mut tol as *mut f32 as *mut c_void,
        &mut max as *mut u32 as *mut c_void,
    ];
    let keep = [&buf.max_change, &buf.iterations, &buf.go];
    // SAFETY: check's parameters (a handle, three pointers to one u32 each, a float, a u32);
    // one thread; the buffers are kept by the graph.
    unsafe {
        g.add_kernel(
            &[copy],
            check,
            &LaunchConfig::new((1, 1, 1), (1, 1, 1)),
            &mut params,
            &keep,
        )
    }
}

fn reset(buf: &Buffers, rhs: &[f32]) -> Result<(), Box<dyn std::error::Error>> {
    buf.x.memset_u32(0)?;
    buf.b.copy_from_host(rhs)?;
    buf.iterations.memset_u32(0)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let module = cudars_rtc::Program::new(format!("{SET_CONDITIONAL_PRELUDE}{SOURCE}"))
        .name("while_solver.cu")
        .device(&dev)?
        .compile()?
        .load(&dev)?;
    let jacobi = module.kernel("jacobi")?.function().clone();
    let check = module.kernel("check")?.function().clone();
    let alloc = |bytes| DevicePtr::alloc(&dev, bytes);
    let buf = Buffers {
        x: alloc(N * 4)?,
        x_new: alloc(N * 4)?,
        b: alloc(N * 4)?,
        max_change: alloc(4)?,
        iterations: alloc(4)?,
        go: alloc(4)?,
    };
    let rhs: Vec<f32> = (0..N)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect();

    // The device loop: one launch.
    let mut g = GraphBuilder::new(&dev)?;
    let h = g.conditional_handle(Some(1))?;
    g.add_while(&[], h, |body| {
        add_iteration(body, &jacobi, &check, &buf, h.raw())?;
        Ok(())
    })?;
    let device_loop = g.finish()?.instantiate()?;
    reset(&buf, &rhs)?;
    device_loop.upload(&stream)?;
    let t = Instant::now();
    device_loop.launch(&stream)?;
    stream.synchronize()?;
    let device_time = t.elapsed();
    let mut device_iters = [0u32];
    buf.iterations.copy_to_host(&mut device_iters)?;
    let mut device_x = vec![0f32; N];
    buf.x.copy_to_host(&mut device_x)?;

    // The host loop: one launch per iteration, the decision read back each time.
    let mut g = GraphBuilder::new(&dev)?;
    add_iteration(&mut g, &jacobi, &check, &buf, 0)?;
    let step = g.finish()?.instantiate()?;
    reset(&buf, &rhs)?;
    let t = Instant::now();
    let mut host_iters = 0u32;
    loop {
        step.launch(&stream)?;
        host_iters += 1;
        let mut go = [0u32];
        // SAFETY: `go` outlives the synchronize just below.
        unsafe { buf.go.copy_to_host_async(&mut go, &stream) }?;
        stream.synchronize()?;
        if go[0] == 0 {
            break;
        }
    }
    let host_time = t.elapsed();
    let mut host_x = vec![0f32; N];
    buf.x.copy_to_host(&mut host_x)?;

    // Checks: the same iterations, the same bits, and a small residual.
    assert_eq!(device_iters[0], host_iters, "iteration counts differ");
    assert!(
        device_x
            .iter()
            .zip(&host_x)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the device loop and the host loop disagree"
    );
    let residual = (0..N)
        .map(|i| {
            let left = if i > 0 { device_x[i - 1] } else { 0.0 };
            let right = if i + 1 < N { device_x[i + 1] } else { 0.0 };
            (2.1 * device_x[i] - left - right - rhs[i]).abs()
        })
        .fold(0f32, f32::max);
    assert!(residual < 1e-3, "residual {residual}");
    println!(
        "{N} unknowns, {host_iters} Jacobi iterations to a max change < {TOL}; residual {residual:.2e}"
    );
    println!(
        "device loop (while node, 1 launch): {:.3} ms; host loop ({host_iters} launches, read-back each): {:.3} ms; {:.2}x",
        device_time.as_secs_f64() * 1e3,
        host_time.as_secs_f64() * 1e3,
        host_time.as_secs_f64() / device_time.as_secs_f64()
    );
    Ok(())
}
