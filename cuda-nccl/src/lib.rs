//! NCCL collectives for Rust programs on `cuda-core`: what CuPy's `cupy.cuda.nccl` and
//! `cupyx.distributed` give Python, with RAII, typed buffers and no hangs.
//!
//! NCCL (`libnccl.so.2`) is opened at run time by `cuda-nccl-sys`; a machine without it gets a
//! [`Error::Load`] naming what was tried, never a panic.
//!
//! | module | what |
//! | --- | --- |
//! | [`id`] | [`UniqueId`]: the 128-byte token that names a communicator, as bytes or text |
//! | [`comm`] | [`Communicator`]: one rank on one GPU; `init_rank`, `init_all`, `split`, accessors, RAII destroy, [`Communicator::wait`] with a timeout that aborts |
//! | [`collectives`] | typed collectives on a cuda-core [`Stream`](cudars_core::Stream): all_reduce, broadcast, reduce, all_gather, reduce_scatter, send/recv, all_to_all, in-place forms; checked, marked on the stream, then issued |
//! | [`dtype`] | [`NcclType`]: the element types NCCL reduces (i8 ... f64, `half::f16`, `half::bf16`); [`ReduceOp`] |
//! | [`group`] | [`GroupGuard`] / [`group`](group::group): `ncclGroupStart`/`End` that always ends, holding the buffers and communicators of its calls until then |
//! | [`register`] | memory registered with a communicator: [`register::alloc`], [`Communicator::register`] (`ncclCommRegister`), [`Communicator::register_window`] (symmetric windows) |
//! | `pool` | (feature `mempool`) `Communicator::registered_pool`: a `cudars-mempool` pool whose segments are registered with the communicator as they are made |
//! | [`rendezvous`] | [`JobEnv`] from torchrun / Slurm / Open MPI variables; rank 0 hands the id to the others over TCP |
//! | [`launch`] | [`Launcher`]: starts N local processes with the torchrun variables set |
//! | [`error`] | [`Error`], one type for the crate |
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device, Stream};
//! use cudars_nccl::{group, Communicator, ReduceOp};
//!
//! // Every GPU of this process, one communicator each.
//! let devices = Device::all()?;
//! let comms = Communicator::init_all(&devices)?;
//! let n = 1 << 20;
//! let bufs = devices
//!     .iter()
//!     .map(|d| DevicePtr::alloc(d, n * 4))
//!     .collect::<Result<Vec<_>, _>>()?;
//! let streams = devices.iter().map(Stream::new).collect::<Result<Vec<_>, _>>()?;
//! group::group(|| {
//!     for ((c, b), s) in comms.iter().zip(&bufs).zip(&streams) {
//!         c.all_reduce_in_place::<f32>(b, n, ReduceOp::Sum, s)?;
//!     }
//!     Ok(())
//! })?;
//! for (c, s) in comms.iter().zip(&streams) {
//!     c.wait(s, std::time::Duration::from_secs(60))?;
//! }
//! # Ok::<(), cudars_nccl::Error>(())
//! ```
//!
//! NVLink multicast (NVLS) is NCCL's choice, not this crate's; the tests, examples and
//! benchmarks of this workspace run with `NCCL_NVLS_ENABLE=0`.

pub mod collectives;
pub mod comm;
pub mod dtype;
pub mod error;
pub mod group;
pub mod id;
pub mod launch;
#[cfg(feature = "mempool")]
pub mod pool;
pub mod register;
pub mod rendezvous;

pub use comm::{CommConfig, Communicator};
pub use dtype::{DataType, NcclType, ReduceOp};
pub use error::{Error, NcclError, Result};
pub use group::GroupGuard;
pub use id::UniqueId;
pub use launch::Launcher;
pub use register::Registrations;
pub use rendezvous::{JobEnv, RendezvousError};

/// The raw bindings, for what this crate does not wrap.
pub use cudars_nccl_sys as sys;

/// NCCL's version as `(major, minor, patch)`, from the loaded library (`ncclGetVersion`).
///
/// ```no_run
/// let (major, minor, patch) = cudars_nccl::version()?;
/// println!("NCCL {major}.{minor}.{patch}");
/// # Ok::<(), cudars_nccl::Error>(())
/// ```
pub fn version() -> Result<(u32, u32, u32)> {
    let nccl = error::library()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    error::check(unsafe { nccl.ncclGetVersion(&mut v) }?, "ncclGetVersion")?;
    let v = v.max(0) as u32;
    // NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
    Ok(if v >= 10000 {
        (v / 10000, (v / 100) % 100, v % 100)
    } else {
        (v / 1000, (v / 100) % 10, v % 100)
    })
}

/// `true` when `libnccl` can be opened (see [`sys::nccl`]).
pub fn is_available() -> bool {
    sys::nccl().is_ok()
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    #[test]
    fn communicator_is_send() {
        fn is_send<T: Send>() {}
        is_send::<crate::Communicator>();
        is_send::<crate::UniqueId>();
    }
}
