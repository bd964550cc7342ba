//! cuRAND (host API) on `cuda-core`'s streams and views: Philox, XORWOW, MRG32k3a and Sobol
//! generators filling device memory with uniform, normal, log-normal and Poisson numbers,
//! every length, alignment and device checked before the library writes.
//!
//! cuRAND is opened at run time (`cuda-rand-sys`: `$CUDA_CURAND_LIBRARY`, else
//! `libcurand.so.10`); nothing here links against CUDA, and nothing panics without it: the
//! first call that needs the library returns [`Error::Load`] listing every path tried.
//!
//! | item | what | CuPy / PyTorch |
//! | --- | --- | --- |
//! | [`Generator::new`], [`Generator::with_seed`] | a generator of a [`RngKind`] on a [`Stream`](cudars_core::Stream) (`curandCreateGenerator`, `curandSetStream`); `new` seeds from the OS | `cupy.random.RandomState(seed, method)` |
//! | [`RngKind`] | [`Xorwow`](RngKind::Xorwow) (the default, CuPy's), [`Philox`](RngKind::Philox) (PyTorch's), [`Mrg32k3a`](RngKind::Mrg32k3a), [`Sobol32`](RngKind::Sobol32), [`ScrambledSobol32`](RngKind::ScrambledSobol32), [`Sobol64`](RngKind::Sobol64), [`ScrambledSobol64`](RngKind::ScrambledSobol64) | `method=` |
//! | [`set_seed`](Generator::set_seed), [`set_offset`](Generator::set_offset) | seed (pseudo-random only; resets the offset to 0, as CuPy) and absolute offset | `RandomState.seed` |
//! | [`set_stream`](Generator::set_stream) | issue later work on another stream of the same device, ordered after the old one | - |
//! | [`set_ordering`](Generator::set_ordering), [`set_dimensions`](Generator::set_dimensions) | [`RngOrdering`]; Sobol dimensions (1 to 20,000) | - |
//! | [`uniform::<T>`](Generator::uniform) | (0, 1] in `f32` or `f64` ([`RandFloat`]) | `random_sample`, `torch.rand` |
//! | [`normal::<T>`](Generator::normal), [`standard_normal::<T>`](Generator::standard_normal) | normal, mean and standard deviation | `normal`, `standard_normal`, `torch.randn` |
//! | [`log_normal::<T>`](Generator::log_normal) | `exp` of a normal | `lognormal` |
//! | [`poisson`](Generator::poisson) | `u32` Poisson numbers, mean in (0, 400,000] | `poisson` |
//! | [`bits_u32`](Generator::bits_u32), [`bits_u64`](Generator::bits_u64) | raw bits (`u64` from 64-bit Sobol only) | - |
//! | [`destroy_failures`], [`deferred_destroys`] | generators leaked because their destruction failed; dropped generators waiting (inside a host function, during a capture) to be destroyed | - |
//! | [`Error`] | typed refusals naming the argument, cuRAND's status, `cuda-core`'s errors | - |
//!
//! # What every fill checks, and how it issues
//!
//! A fill writes exactly the view it is given: the element count is the view's length over
//! the element size. Before anything is issued, and without a library call, it checks that
//! the view belongs to the generator's device, is a whole number of elements aligned to them,
//! and suits the generator (an even count for normal and log-normal numbers of a pseudo-random
//! generator, whole points for Sobol), and that `mean`, `std` and `lambda` are what cuRAND
//! takes; a refusal is a typed [`Error`] naming the argument (`"out"`, `"std"`, ...). Then it
//! issues as every launcher of the workspace does: [`Stream::issue`](cudars_core::Stream::issue)
//! (the stream's device, the capture gate), [`DevicePtr::record_stream`](cudars_core::DevicePtr::record_stream)
//! on the view (the ordering rule: a pool block is not reused before the numbers are written,
//! and the stream waits for its earlier owner), then the cuRAND call. So a pool block of
//! `cuda-mempool` (a `DevicePtr`) is filled like any other view. Streams being captured into
//! graphs are refused ([`Error::Capturing`]).
//!
//! # Defaults
//!
//! As `cupy.random`: [`RngKind::default()`] is XORWOW (`CURAND_RNG_PSEUDO_DEFAULT`), and
//! [`Generator::new`] seeds from `/dev/urandom` as `RandomState(seed=None)` does with
//! `os.urandom`. Uniform numbers are cuRAND's, in (0, 1]. PyTorch's generator is Philox.
//!
//! ```no_run
//! use cudars_core::{Device, DevicePtr, Stream};
//! use cudars_rand::{Generator, RngKind};
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let mut gen = Generator::with_seed(RngKind::Philox, &stream, 1234)?;
//! let n = 1 << 20;
//! let x = DevicePtr::alloc(&dev, n * 4)?;
//! gen.normal::<f32>(&x, 0.0, 2.0)?;           // n f32, mean 0, std 2
//! let counts = DevicePtr::alloc(&dev, n * 4)?;
//! gen.poisson(&counts, 3.5)?;                 // n u32, mean 3.5
//! let odd = x.slice(..12)?;                   // 3 f32: normal numbers come in pairs
//! assert!(matches!(gen.normal::<f32>(&odd, 0.0, 1.0), Err(cudars_rand::Error::OddCount { .. })));
//! stream.synchronize()?;
//! let mut host = vec![0f32; n];
//! x.copy_to_host(&mut host)?;
//! # Ok::<(), cudars_rand::Error>(())
//! ```

mod check;
pub mod error;
mod float;
pub mod generator;
pub mod kind;

pub use check::{MAX_DIMENSIONS, MAX_POISSON_LAMBDA};
pub use error::{Error, Result};
pub use float::RandFloat;
pub use generator::{deferred_destroys, destroy_failures, Generator};
pub use kind::{RngKind, RngOrdering};

/// The raw bindings, for what this crate does not wrap.
pub use cudars_rand_sys as sys;
