//! Safe access to the CUDA driver: the one layer over [`cudars_sys`] that every other crate of
//! the workspace calls.
//!
//! | module | what | CuPy |
//! | --- | --- | --- |
//! | crate root | [`is_available`], [`device_count`], [`driver_version`], [`bindings_version`] | `is_available`, `get_local_runtime_version` |
//! | [`features`] | what the running driver supports (CUDA 12.0 through 13.x), [`Feature`] checks | - |
//! | [`device`] | [`Device`], scopes, attributes, peer access | `Device` |
//! | [`health`] | surviving a device fault: a lost context detected at its first sticky error, [`Error::ContextLost`] from every call, [`Device::health`], [`Device::reset_after_fault`] and generations that make old handles fail closed | - |
//! | [`stream`] | [`Stream`], builder, current stream per thread, host callbacks | `Stream`, `ExternalStream`, `get_current_stream` |
//! | [`event`] | [`Event`], builder, timing, interprocess handles | `Event`, `get_elapsed_time` |
//! | [`completion`] | awaiting the GPU: [`Completion`] futures from [`Event::completion`] and [`Stream::completion`], one reactor thread, faults reach every waiter, [`completion::drop_after`] | - |
//! | [`module`] | [`Module`] from PTX text, cubin or fatbin; [`Function`]: parameter info, occupancy, attributes, launch with a [`LaunchConfig`] (clusters too) | `RawModule` |
//! | [`kernels`] | ready-made PTX kernels to try the workspace: fill, add, copy, checksum, spin, a slow writer for ordering tests | - |
//! | [`memory`] | [`DeviceMemory`], [`ManagedMemory`], [`PinnedMemory`], [`HostRegistration`], [`UnownedMemory`], the [`DevicePtr`] view | `Memory`, `ManagedMemory`, `PinnedMemory`, `UnownedMemory`, `MemoryPointer` |
//! | [`pointer`](mod@pointer) | the [`Location`] of any address | `get_array_module` |
//! | [`vmm`] | virtual address ranges, physical allocations, map/unmap | - |
//! | [`ipc`] | sharing device memory between processes: legacy IPC handles, VMM file descriptors over Unix sockets | `runtime.ipcGetMemHandle`, `ipcOpenMemHandle` |
//! | [`async_pool`] | the driver's stream-ordered pools (`cuMemPool*`) | `MemoryAsyncPool`, `MemoryAsync` |
//! | [`graph`] | thin capture / instantiate / launch wrappers (the `cuda-graph` crate builds on them) | `Graph` |
//! | [`profiler`] | start/stop and a guard; `initialize` is unsupported since CUDA 12 | `cuda.profile()`, `profiler` |
//! | [`release`] | releases deferred out of host functions and past captures: one release thread, [`release::deferred_count`], [`release::release_deferred`] | - |
//! | [`nvtx`] | marks, ranges and range guards with optional colour | `nvtx` |
//! | `handles` (feature `library-handles`) | per-device cuBLAS / cuSOLVER handles, libraries opened at run time | `get_cublas_handle` |
//! | [`error`] | [`Error`], [`DriverError`], [`CrateError`]: the error every crate of the workspace converts into, so `?` works across crates | `CUDARuntimeError` |
//!
//! Nothing here panics on a machine without a driver: every call returns an [`Error`]
//! (`Error::Load` lists each library path that was tried).
//!
//! ```no_run
//! for dev in cudars_core::Device::all()? {
//!     println!("{}: {}", dev.ordinal(), dev.name()?);
//! }
//! # Ok::<(), cudars_core::Error>(())
//! ```

mod driver;
mod version;

pub mod async_pool;
mod capture_gate;
pub mod completion;
mod context_note;
mod cross_device;
pub mod device;
pub mod error;
pub mod event;
pub mod features;
pub mod graph;
#[cfg(feature = "library-handles")]
pub mod handles;
pub mod health;
#[cfg(unix)]
pub mod ipc;
pub mod issue;
pub mod kernels;
pub mod memory;
pub mod module;
pub mod nvtx;
pub mod pointer;
pub mod profiler;
pub mod release;
pub mod stream;
pub mod vmm;

pub use completion::Completion;
pub use cudars_sys as sys;
pub use device::{ContextBinding, Device, DeviceScope, Uuid};
pub use driver::{bindings_version, device_count, driver_version, is_available, CudaVersion};
pub use error::{CrateError, DriverError, Error, Result};
pub use event::{Event, EventBuilder, IpcEventHandle};
pub use features::Feature;
pub use health::Health;
pub use issue::Issue;
pub use memory::{
    DeviceAlloc, DeviceMemory, DevicePtr, HostRegistration, Location, ManagedMemory, PinnedMemory,
    UnownedMemory,
};
pub use module::{Function, LaunchConfig, Module, ParamInfo};
pub use stream::{Stream, StreamBuilder, StreamKind, StreamScope};
