//! CUDA C++ compiled at run time: NVRTC and nvJitLink (opened at run time by
//! `cuda-rtc-sys`), a cache in memory and on disk that is safe across processes, and
//! launches with typed arguments checked against the kernel's parameters.
//!
//! | module | what | CuPy / cuda.core |
//! | --- | --- | --- |
//! | [`program`] | [`Program`]: source, in-memory headers, options, name expressions, architecture from a [`Device`](cudars_core::Device) or given; [`Compiled`] with the log and lowered names | `RawModule(code=...)`, `cuda.core.Program` |
//! | [`cache`] | [`Cache`]: in memory, and on disk in `$CUDA_RTC_CACHE_DIR` (default `~/.cache/cudars-rtc`), keyed by SHA-256 of everything that decides the output, the files its includes reach included; written by rename, checksummed, read only from a directory and files of this user's that no one else may write | `compile_with_cache`, `CUPY_CACHE_DIR` |
//! | [`includes`] | what a program's `#include`s can reach on disk, for the key | - |
//! | [`kernel`] | [`KernelModule`] (a loaded program), [`Kernel`]: lookup by name or name expression, parameter info, occupancy, checked and unchecked launches | `RawKernel` |
//! | [`args`] | [`KernelArg`], [`KernelArgs`]: device views as pointers (marked on the stream), scalars and [`ByValue`] structs by value | - |
//! | [`output`] | [`Output`]: PTX, cubin, LTO-IR, or LTO-IR linked into a cubin | - |
//! | [`link`] | [`Linker`]: nvJitLink over cubin, PTX and LTO-IR | `cuda.core.Linker` |
//! | [`arch`] | [`Arch`]: `sm_90`, `sm_90a`, `compute_100f` | - |
//! | [`compiler`] | [`Compiler`]: the opened NVRTC, its version and architectures | - |
//! | [`error`] | [`Error`], converting into `cudars_core::Error` | - |
//!
//! Nothing here panics without NVRTC, nvJitLink or a GPU: each call returns an [`Error`]
//! ([`Error::Load`] lists every library path tried).
//!
//! ```no_run
//! use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
//! use cudars_rtc::Program;
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let module = Program::new(r#"
//!     extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
//!         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//!         if (i < n) y[i] = a * x[i] + y[i];
//!     }"#)
//!     .device(&dev)?
//!     .compile()? // NVRTC the first time; memory or disk afterwards
//!     .load(&dev)?;
//! let saxpy = module.kernel("saxpy")?;
//! let n = 1 << 20;
//! let x = DevicePtr::alloc(&dev, n * 4)?;
//! let y = DevicePtr::alloc(&dev, n * 4)?;
//! x.copy_from_host(&vec![1.0f32; n])?;
//! y.copy_from_host(&vec![2.0f32; n])?;
//! let cfg = saxpy.config_for_elements(n as u64, 0)?; // block size by occupancy
//! // SAFETY: saxpy reads x and writes y at indices below n, and both hold n floats.
//! unsafe { saxpy.launch(&stream, &cfg, (3.0f32, &x, &y, n as u64))? };
//! stream.synchronize()?;
//! # Ok::<(), cudars_rtc::Error>(())
//! ```

pub mod arch;
pub mod args;
pub mod cache;
pub mod compiler;
pub mod error;
pub mod includes;
pub mod kernel;
pub mod link;
pub mod output;
pub mod program;

pub use arch::Arch;
pub use args::{ByValue, KernelArg, KernelArgs};
pub use cache::{Cache, CacheKey, CacheStats, Origin, CACHE_DIR_ENV};
pub use compiler::Compiler;
pub use cudars_core::module::{LaunchConfig, ParamInfo};
pub use error::{Error, Result};
pub use kernel::{Kernel, KernelModule};
pub use link::Linker;
pub use output::Output;
pub use program::{Compiled, Program};

/// The raw bindings, for what this crate does not wrap.
pub use cudars_rtc_sys as sys;
