//! Typed host <-> device transfers: CuPy's `asnumpy` / `asarray` family for Rust, synchronous
//! and asynchronous, and fast for ordinary (pageable) memory.
//!
//! | module | what | CuPy |
//! | --- | --- | --- |
//! | [`transfer`] | [`to_device`], [`copy_to_device`], [`to_host`], [`to_host_into`], [`copy_device`], [`to_device_of`] (peer): done when they return, for every stream; [`copy_to_device_on_stream`], [`copy_device_async`]: ordered on a stream | `asarray`, `asnumpy(a, out=)` |
//! | [`pending`] | [`to_device_async`], [`copy_to_device_async`], [`to_host_async`] and their [`Pending`] handle, awaitable ([`PendingFuture`]); [`scope`] for borrowed slices | `asnumpy(a, stream, blocking=False)` |
//! | [`matrix`], [`layout`] | 2-D transfers in row-major or column-major order, pitched layouts | `asnumpy(a, order=)` |
//! | `array` (feature `ndarray`) | `ndarray` arrays in and out | `numpy.ndarray` |
//! | [`location`] | where memory lives: which device, pinned or pageable host, managed | `get_array_module` |
//! | [`host`] | [`PinnedBuffer`], [`register`], the [`TransferBuffer`] trait | `alloc_pinned_memory` |
//! | [`buffer`] | [`DeviceBuffer<T>`]: typed device memory | `ndarray` (the memory part) |
//! | [`staging`] | the pinned staging pipeline for pageable memory, and its configuration | (none) |
//! | [`elements`] | size and alignment rules | dtype itemsize |
//!
//! Elements are any [`bytemuck::Pod`] type: integers, floats, [`half::f16`], [`half::bf16`],
//! `#[derive(Pod)]` structs.
//!
//! # Speed
//!
//! The driver copies pageable host memory through one small bounce buffer, several times
//! slower than page-locked memory. Here, pinned, registered and managed memory (detected from
//! the driver's pointer attributes, or known from the buffer type) is copied by the driver
//! directly, small transfers too; large pageable transfers go through a pipeline of pinned
//! staging buffers, with host copies spread over several threads and overlapped with the DMA
//! of the previous chunk ([`staging`]).
//!
//! # Safety of asynchronous transfers
//!
//! An asynchronous transfer holds its host buffer until the device is done with it, and the
//! type system enforces it: [`to_host_async`] takes an owned buffer and gives it back only
//! from [`Pending::wait`] or from awaiting it ([`PendingFuture`]); [`scope`] lends borrowed slices to transfers that all complete
//! before the scope returns. Leaking a [`Pending`] leaks its buffer, it never frees memory
//! the device may still write.
//!
//! ```no_run
//! use cudars_xfer::{to_device, to_host};
//! let dev = cudars_core::Device::new(0)?;
//! let data: Vec<f32> = (0..1 << 24).map(|i| i as f32).collect();
//! let on_device = to_device(&dev, &data)?; // 64 MiB, staged: tens of GB/s
//! let back = to_host(&on_device)?;
//! assert_eq!(back, data);
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

#[cfg(feature = "ndarray")]
pub mod array;
pub mod buffer;
pub mod elements;
pub mod error;
pub mod host;
pub mod layout;
pub mod location;
pub mod matrix;
pub mod pending;
pub mod staging;
pub mod transfer;

pub use bytemuck;
pub use half;
#[cfg(feature = "ndarray")]
pub use ndarray;

pub use buffer::DeviceBuffer;
pub use error::{Error, Result};
pub use host::{register, HostMemoryKind, PinnedBuffer, Registered, TransferBuffer};
pub use layout::{Layout2, Order};
pub use location::{locate, locate_range, locate_slice, Location};
pub use matrix::DeviceMatrix;
pub use pending::{
    copy_to_device_async, scope, to_device_async, to_host_async, Pending, PendingFuture, Scope,
};
pub use transfer::{
    copy_device, copy_device_async, copy_to_device, copy_to_device_on_stream, to_device,
    to_device_of, to_device_on_stream, to_host, to_host_into,
};
