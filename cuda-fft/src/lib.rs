//! cuFFT on `cuda-core`'s streams, `cuda-mempool`'s pool and `cuda-graph`'s captures:
//! CuPy's `cupy.cuda.cufft` and `cupy.fft` for Rust.
//!
//! | item | what | CuPy |
//! | --- | --- | --- |
//! | [`Geometry`] | a transform: [`Transform`] (C2C, R2C, C2R), [`Precision`], a 1-, 2- or 3-D shape, a batch, and each side's [`Layout`] (`cufftPlanMany`'s embedding, stride, distance), checked | `cufft.PlanNd(...)` arguments |
//! | [`Plan`] | one plan: work areas from the pool (and from the capture's private pool when captured), bound to a stream and rebound safely | `cufft.Plan1d`, `cufft.PlanNd` |
//! | [`c2c`], [`r2c`], [`c2r`], [`exec`] | one call: the plan from the cache, then the execution | `cupy.fft.fft`, `rfft`, `irfft`, `fftn` |
//! | [`cache`] | the bounded plan cache, per device | `cupy.fft.config.get_plan_cache()` |
//!
//! Complex numbers are interleaved pairs (`[f16; 2]`, `[f32; 2]`, `[f64; 2]`, `num_complex`
//! layouts). Half precision ([`Precision::Half`], `half::f16`) plans through cuFFT's
//! `cufftXtMakePlanMany`: every dimension a power of two (refused otherwise, before cuFFT sees
//! it). The inverse transform is unnormalised, as cuFFT's: `inverse(forward(x)) = n x`.
//!
//! Every view is checked on the host before cuFFT sees it: the device, the element alignment,
//! the bytes the layout reaches from each view's start, how input and output share memory
//! (in place only for C2C, on the same address with the same layout), and that the output
//! layout writes each element once. C2R may overwrite its input (cuFFT's rule), so its input
//! layout must also reach each element once.
//!
//! ```no_run
//! use cudars_core::{Device, Stream};
//! use cudars_fft::Direction;
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let n = 1 << 20;
//! let x = cudars_mempool::driver::malloc(&stream, n * 4)?; // n reals
//! let spectrum = cudars_mempool::driver::malloc(&stream, (n / 2 + 1) * 8)?; // n/2 + 1 complex
//! cudars_fft::r2c::<f32>(&stream, &x, &spectrum, &[n], 1)?;
//! cudars_fft::c2r::<f32>(&stream, &spectrum, &x, &[n], 1)?; // n times the input
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cache;
pub mod error;
pub mod layout;
pub mod plan;

#[cfg(test)]
mod tests;

use cudars_core::{DevicePtr, Stream};

pub use error::{Error, Result};
pub use layout::{Direction, Geometry, Layout, Precision, Real, Transform};
pub use plan::Plan;

/// Runs `geometry` on `stream` with the cached plan ([`cache::plan`]).
pub fn exec(
    stream: &Stream,
    geometry: &Geometry,
    input: &DevicePtr,
    output: &DevicePtr,
    dir: Direction,
) -> Result<()> {
    let plan = cache::for_stream(stream, || cache::plan(&stream.device(), geometry))?;
    run(&plan, stream, input, output, dir)
}

fn run(
    plan: &cache::SharedPlan,
    stream: &Stream,
    input: &DevicePtr,
    output: &DevicePtr,
    dir: Direction,
) -> Result<()> {
    let mut plan = plan
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    plan.exec(stream, input, output, dir)
}

/// `batch` packed complex-to-complex transforms of `shape` (1 to 3 dimensions) in precision
/// `T`, from `input` into `output` (the same view runs in place).
pub fn c2c<T: Real>(
    stream: &Stream,
    input: &DevicePtr,
    output: &DevicePtr,
    shape: &[usize],
    batch: usize,
    dir: Direction,
) -> Result<()> {
    let plan = cache::for_stream(stream, || {
        cache::packed(&stream.device(), Transform::C2C, T::PRECISION, shape, batch)
    })?;
    run(&plan, stream, input, output, dir)
}

/// `batch` packed real-to-complex transforms of `shape`: `input` holds the reals, `output`
/// the Hermitian halves (the last dimension `n / 2 + 1`).
pub fn r2c<T: Real>(
    stream: &Stream,
    input: &DevicePtr,
    output: &DevicePtr,
    shape: &[usize],
    batch: usize,
) -> Result<()> {
    let plan = cache::for_stream(stream, || {
        cache::packed(&stream.device(), Transform::R2C, T::PRECISION, shape, batch)
    })?;
    run(&plan, stream, input, output, Direction::Forward)
}

/// `batch` packed complex-to-real transforms of `shape` (the real side's shape): `input`
/// holds the Hermitian halves (and may be overwritten), `output` receives the reals.
pub fn c2r<T: Real>(
    stream: &Stream,
    input: &DevicePtr,
    output: &DevicePtr,
    shape: &[usize],
    batch: usize,
) -> Result<()> {
    let plan = cache::for_stream(stream, || {
        cache::packed(&stream.device(), Transform::C2R, T::PRECISION, shape, batch)
    })?;
    run(&plan, stream, input, output, Direction::Inverse)
}
