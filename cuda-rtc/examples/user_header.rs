//! A kernel that includes a header of the program's own, given in memory (no file on disk):
//! `#include "complex_mul.h"` resolves to the text passed with `Program::header`. The
//! kernel multiplies complex numbers elementwise; the result is checked against the host.
//!
//! Run with `cargo run --release -p cudars-rtc --example user_header`.

mod common;
use common::println;

use std::process::ExitCode;

use cudars_core::{Device, DevicePtr, Stream};
use cudars_rtc::{ByValue, Program};

const HEADER: &str = r#"
#pragma once
struct cplx { float re, im; };
__device__ inline cplx mul(cplx a, cplx b) {
    return cplx{a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}
struct scale_t { float factor; unsigned int pad; };
"#;

const KERNEL: &str = r#"
#include "complex_mul.h"
extern "C" __global__ void cmul(const cplx* a, const cplx* b, cplx* c, scale_t s, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) {
        cplx p = mul(a[i], b[i]);
        c[i] = cplx{p.re * s.factor, p.im * s.factor};
    }
}
"#;

/// The header's `scale_t`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Scale {
    factor: f32,
    pad: u32,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    let kernel = Program::new(KERNEL)
        .name("cmul.cu")
        .header("complex_mul.h", HEADER)
        .device(&dev)?
        .compile()?
        .load(&dev)?
        .kernel("cmul")?;
    let n = 100_000usize;
    // Interleaved (re, im) pairs.
    let a: Vec<f32> = (0..2 * n).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    let b: Vec<f32> = (0..2 * n).map(|i| (i % 13) as f32 * 0.5 - 3.0).collect();
    let (da, db, dc) = (
        DevicePtr::alloc(&dev, n * 8)?,
        DevicePtr::alloc(&dev, n * 8)?,
        DevicePtr::alloc(&dev, n * 8)?,
    );
    da.copy_from_host(&a)?;
    db.copy_from_host(&b)?;
    let stream = Stream::new(&dev)?;
    let scale = Scale {
        factor: 0.5,
        pad: 0,
    };
    let cfg = kernel.config_for_elements(n as u64, 0)?;
    // SAFETY: cmul reads a[i], b[i] and writes c[i] for i < n; each holds n complex floats.
    unsafe { kernel.launch(&stream, &cfg, (&da, &db, &dc, ByValue(scale), n as u64))? };
    stream.synchronize()?;
    let mut c = vec![0f32; 2 * n];
    dc.copy_to_host(&mut c)?;
    for i in 0..n {
        let (ar, ai, br, bi) = (a[2 * i], a[2 * i + 1], b[2 * i], b[2 * i + 1]);
        let (re, im) = ((ar * br - ai * bi) * 0.5, (ar * bi + ai * br) * 0.5);
        if (c[2 * i] - re).abs() > 1e-4 || (c[2 * i + 1] - im).abs() > 1e-4 {
            return Err(format!(
                "element {i}: ({}, {}) != ({re}, {im})",
                c[2 * i],
                c[2 * i + 1]
            )
            .into());
        }
    }
    println!("user_header ok: {n} complex products through complex_mul.h");
    Ok(())
}
