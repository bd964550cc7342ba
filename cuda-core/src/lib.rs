//! Safe access to the CUDA driver: the one layer over [`cuda_sys`] that every other crate of
//! the workspace calls.
//!
//! | module | what | CuPy |
//! | --- | --- | --- |
//! | [`driver`](crate::is_available) functions | [`is_available`], [`device_count`], [`driver_version`], [`bindings_version`] | `is_available`, `get_local_runtime_version` |
//! | [`device`] | [`Device`], scopes, attributes, peer access | `Device` |
//! | [`error`] | [`Error`], [`DriverError`] | `CUDARuntimeError` |
//!
//! Nothing here panics on a machine without a driver: every call returns an [`Error`]
//! (`Error::Load` lists each library path that was tried).
//!
//! ```no_run
//! for dev in cuda_core::Device::all()? {
//!     println!("{}: {}", dev.ordinal(), dev.name()?);
//! }
//! # Ok::<(), cuda_core::Error>(())
//! ```

#![warn(missing_docs)]

pub mod device;
mod driver;
pub mod error;

pub use cuda_sys as sys;
pub use device::{ContextBinding, Device, DeviceScope, Uuid};
pub use driver::{bindings_version, device_count, driver_version, is_available, CudaVersion};
pub use error::{DriverError, Error, Result};
