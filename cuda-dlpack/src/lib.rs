//! DLPack 1.x for `cudars_core` device memory: zero-copy exchange of CUDA tensors with
//! PyTorch, CuPy, JAX and any other DLPack producer or consumer.
//!
//! | module | what |
//! | --- | --- |
//! | [`ffi`] | the DLPack C structs (from `dlpark`), with layout tests against `dlpack.h` |
//! | [`dtype`] | [`ElemType`] (the dtypes known here) and [`DlElem`] (the Rust types for them) |
//! | [`layout`] | shapes, strides, compactness, the bytes a layout reaches |
//! | [`export`] | a `DevicePtr` (any owner) as an owning [`ExportedTensor`]; [`TensorSpec`] |
//! | [`stream`] | the producer's side of the `stream` argument: [`ConsumerStream`], [`prepare_for_consumer`] |
//! | [`import`] | a producer's tensor as an [`ImportedTensor`], checked into a [`TensorView`] ([`Expect`]) |
//! | [`error`] | [`Error`]: one variant per refusal |
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device};
//! use cudars_dlpack::{Expect, ExportedTensor, ImportedTensor, TensorSpec};
//!
//! let dev = Device::new(0)?;
//! let buf = DevicePtr::alloc(&dev, 4 * 1024)?;
//! buf.memset_u32(7)?;
//! // Export (what a `__dlpack__` hands to a consumer) ...
//! let exported = ExportedTensor::from_view(&buf, &TensorSpec::of::<u32>([32, 32]))?;
//! // ... and import (what `from_dlpack` does with what it got).
//! // SAFETY: a tensor just made by `into_raw`, owned by nobody else; its data is complete
//! // (the memset was synchronous), as `into_device_ptr(.., None)` below takes it to be.
//! let imported = unsafe { ImportedTensor::from_versioned(exported.into_raw())? };
//! let view = imported.into_view::<u32>(&Expect::new().device(0).contiguous(true))?;
//! let mut host = vec![0u32; 1024];
//! view.into_device_ptr(&dev, None)?.copy_to_host(&mut host)?; // the deleter runs as it drops
//! assert!(host.iter().all(|&x| x == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The Python side (a PyO3 extension speaking `__dlpack__` / `from_dlpack` with PyTorch,
//! CuPy and JAX) is the `cudars-dlpack-py` crate beside this one.

pub mod dtype;
mod elem;
pub mod error;
pub mod export;
pub mod ffi;
pub mod import;
pub mod layout;
pub mod stream;

pub use dtype::{DlElem, ElemType};
pub use error::{Error, Result};
pub use export::{ExportedTensor, TensorSpec};
pub use import::{Expect, ImportedTensor, Layout, TensorView, UntypedView};
pub use stream::{order_after, prepare_for_consumer, ConsumerStream};

#[cfg(test)]
mod tests;
