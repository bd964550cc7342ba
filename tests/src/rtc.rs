//! CUDA C++ sources the `cuda-rtc` GPU tests, the `test_child` helper and `bench_rtc` compile,
//! and a small deterministic random generator for their data.

/// `saxpy(a, x, y, n)`: `y[i] = a * x[i] + y[i]`.
pub const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

/// `reduce<T, BLOCK>(in, out, n)`: `*out += sum(in[..n])`, one shared-memory tree per block.
pub const REDUCE: &str = r#"
template <typename T, int BLOCK>
__global__ void reduce(const T* in, T* out, unsigned long long n) {
    __shared__ T part[BLOCK];
    unsigned long long i = blockIdx.x * (unsigned long long)BLOCK + threadIdx.x;
    part[threadIdx.x] = i < n ? in[i] : T(0);
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
"#;

/// A kernel over a user header (`polynomial.h`, given in memory).
pub const POLY: &str = r#"
#include "polynomial.h"
extern "C" __global__ void poly(const double* x, double* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = poly3(x[i]);
}
"#;

/// The header [`POLY`] includes: `poly3(x) = 2x^3 - x + 0.5`, by Horner.
pub const POLY_HEADER: &str = r#"
#pragma once
__device__ inline double poly3(double x) { return ((2.0 * x + 0.0) * x - 1.0) * x + 0.5; }
"#;

/// [`POLY_HEADER`]'s polynomial on the host.
pub fn poly3(x: f64) -> f64 {
    ((2.0 * x + 0.0) * x - 1.0) * x + 0.5
}

/// An empty kernel of one pointer and one scalar: what launch-issue benchmarks launch.
pub const EMPTY: &str = r#"
extern "C" __global__ void empty(float* p, unsigned long long n) { if (n == 0xffffffffffffffffull) p[0] = 0; }
"#;

/// A deterministic generator (xorshift64*), so a failing check can be reproduced.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is taken as 1).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float in `[-1, 1)`.
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` floats in `[-1, 1)`.
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}
