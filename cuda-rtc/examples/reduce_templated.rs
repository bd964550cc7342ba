//! A templated block reduction, instantiated for `float` and `unsigned long long` through
//! NVRTC name expressions and looked up by those expressions (their lowered, mangled names
//! are found for you), summing random data and checked against the host.
//!
//! Run with `cargo run --release -p cudars-rtc --example reduce_templated`.

mod common;
use common::println;

use std::process::ExitCode;

use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
use cudars_rtc::Program;

const REDUCE: &str = r#"
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
    let float_sum = "reduce<float, 256>";
    let int_sum = "reduce<unsigned long long, 512>";
    let compiled = Program::new(REDUCE)
        .name("reduce.cu")
        .std(17)
        .name_expression(float_sum)
        .name_expression(int_sum)
        .device(&dev)?
        .compile()?;
    for (expr, lowered) in compiled.lowered_names() {
        println!("{expr:<34} -> {lowered}");
    }
    let module = compiled.load(&dev)?;
    let stream = Stream::new(&dev)?;
    let n = 5_000_000usize;

    // Integers: the sum must be exact.
    let data: Vec<u64> = (0..n as u64).map(|i| (i * 2_654_435_761) % 1000).collect();
    let input = DevicePtr::alloc(&dev, n * 8)?;
    input.copy_from_host(&data)?;
    let out = DevicePtr::alloc(&dev, 8)?;
    out.memset_async(0, &stream)?;
    let k = module.kernel(int_sum)?;
    // SAFETY: reads in[i] for i < n (n u64s) and adds into out[0]; blocks of 512 as instantiated.
    unsafe {
        k.launch(
            &stream,
            &LaunchConfig::for_elements(n as u64, 512),
            (&input, &out, n as u64),
        )?
    };
    let mut total = [0u64];
    stream.synchronize()?;
    out.copy_to_host(&mut total)?;
    let want: u64 = data.iter().sum();
    println!("{int_sum}: {} (host {want})", total[0]);
    if total[0] != want {
        return Err("the integer sum differs from the host".into());
    }

    // Floats: within rounding of a double-precision host sum.
    let floats: Vec<f32> = data.iter().map(|&v| v as f32 / 1000.0 - 0.5).collect();
    let input = DevicePtr::alloc(&dev, n * 4)?;
    input.copy_from_host(&floats)?;
    let out = DevicePtr::alloc(&dev, 4)?;
    out.memset_async(0, &stream)?;
    let k = module.kernel(float_sum)?;
    // SAFETY: as above, over n floats with blocks of 256.
    unsafe {
        k.launch(
            &stream,
            &LaunchConfig::for_elements(n as u64, 256),
            (&input, &out, n as u64),
        )?
    };
    let mut sum = [0f32];
    stream.synchronize()?;
    out.copy_to_host(&mut sum)?;
    let want: f64 = floats.iter().map(|&v| f64::from(v)).sum();
    println!("{float_sum}: {} (host {want:.3})", sum[0]);
    if (f64::from(sum[0]) - want).abs() > 1.0 {
        return Err("the float sum differs from the host".into());
    }
    println!("reduce_templated ok");
    Ok(())
}
