//! Kernels for the explicit-graph tests, benchmark and comparisons: compiled with NVRTC, they
//! set conditional-node conditions on the device (`cudaGraphSetConditional`).

use cudars_core::Device;
use cudars_rtc::{KernelModule, Program};

/// The CUDA C++ of the graph tests' kernels (after `cudars_graph::SET_CONDITIONAL_PRELUDE`).
pub const GRAPH_KERNELS: &str = r#"
extern "C" __global__ void axpb(float* y, const float* x, float a, float b, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void add_u32(unsigned* p, unsigned v, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
// The condition from a value in device memory.
extern "C" __global__ void set_cond(cudaGraphConditionalHandle h, const unsigned* value) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(h, *value);
}
// One loop step: counts an iteration, decrements the counter, continues while it is > 0.
extern "C" __global__ void loop_step(unsigned* counter, unsigned* iterations, cudaGraphConditionalHandle h) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned c = *counter;
        if (c > 0) { *counter = c - 1; *iterations += 1; }
        cudaGraphSetConditional(h, *counter > 0);
    }
}
// The condition: counter > 0 (before a while node).
extern "C" __global__ void cond_positive(cudaGraphConditionalHandle h, const unsigned* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(h, *counter > 0);
}
// A step that does nothing but count (the benchmark's loop body).
extern "C" __global__ void count_step(unsigned* iterations) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *iterations += 1;
}
// loop_step without a condition: counts and decrements while the counter is > 0.
extern "C" __global__ void guarded_step(unsigned* counter, unsigned* iterations) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned c = *counter;
        if (c > 0) { *counter = c - 1; *iterations += 1; }
    }
}
"#;

/// [`GRAPH_KERNELS`] compiled for `dev` and loaded (NVRTC, no cache).
pub fn graph_kernels(dev: &Device) -> KernelModule {
    let source = format!("{}{}", cudars_graph::SET_CONDITIONAL_PRELUDE, GRAPH_KERNELS);
    Program::new(source)
        .name("graph_kernels.cu")
        .device(dev)
        .expect("arch of device 0")
        .no_cache()
        .compile()
        .unwrap_or_else(|e| panic!("compiling the graph kernels: {e}"))
        .load(dev)
        .expect("loading the graph kernels")
}
