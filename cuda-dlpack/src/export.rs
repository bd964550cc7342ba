//! Export: a view of device memory, with a shape, strides, element type and byte offset,
//! becomes an owning DLPack tensor ([`ExportedTensor`]) whose deleter keeps the memory's
//! owner alive until the consumer calls it.
//!
//! The owner is any `Send + 'static` value, kept in the tensor's heap context: a
//! `cudars_core` [`DevicePtr`] (and so a `DeviceMemory`, a `cuda-mempool` pool block, an IPC
//! mapping, anything that implements [`DeviceAlloc`]), or, through the `unsafe`
//! [`ExportedTensor::from_raw_parts`], any value that keeps some device range alive. The
//! deleter drops it exactly once, on whichever thread the consumer calls it from (hence
//! `Send`), and a pool block so exported stays out of reuse until then.
//!
//! Every export is checked when it is made: the shape, strides and offset must stay inside
//! the owner's bytes (negative strides too), with no overflow, and the first element must be
//! aligned for the element type. Each refusal is an [`Error`] variant.
//!
//! The byte offset is folded into the data pointer (`data = base + offset`, `byte_offset =
//! 0`), as PyTorch and CuPy export theirs: some consumers ignore `byte_offset`.
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device};
//! use cudars_dlpack::{ExportedTensor, TensorSpec};
//!
//! let dev = Device::new(0)?;
//! let buf = DevicePtr::alloc(&dev, 6 * 4)?;
//! let tensor = ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([2, 3]))?;
//! assert_eq!(tensor.shape(), &[2, 3]);
//! let raw = tensor.into_raw(); // hand it to a consumer, which calls its deleter once
//! # let _ = raw;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use cudars_core::memory::{DeviceAlloc, DevicePtr};

use crate::dtype::{DlElem, ElemType};
use crate::error::{Error, Result};
use crate::ffi::{
    device_type, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    DlpackFlags, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
};
use crate::layout;

/// What an export describes: element type, shape, strides (compact row-major unless given),
/// byte offset into the view, and whether the consumer may write.
///
/// ```
/// use cudars_dlpack::{ElemType, TensorSpec};
/// let spec = TensorSpec::new(ElemType::F32, [4, 4]).strides([1, 4]).byte_offset(64);
/// assert_eq!(spec.elem(), ElemType::F32);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    elem: ElemType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: usize,
    read_only: bool,
}

impl TensorSpec {
    /// A compact row-major tensor of `shape` with elements `elem`, at offset 0, writable.
    pub fn new(elem: ElemType, shape: impl Into<Vec<i64>>) -> TensorSpec {
        TensorSpec {
            elem,
            shape: shape.into(),
            strides: None,
            byte_offset: 0,
            read_only: false,
        }
    }

    /// As [`new`](Self::new) with the element type of `T`.
    pub fn of<T: DlElem>(shape: impl Into<Vec<i64>>) -> TensorSpec {
        TensorSpec::new(T::TYPE, shape)
    }

    /// Strides in elements, one per dimension (may be negative or zero).
    pub fn strides(mut self, strides: impl Into<Vec<i64>>) -> TensorSpec {
        self.strides = Some(strides.into());
        self
    }

    /// The first element's offset in bytes from the start of the view.
    pub fn byte_offset(mut self, bytes: usize) -> TensorSpec {
        self.byte_offset = bytes;
        self
    }

    /// Marks the export read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`; a legacy tensor cannot
    /// carry it).
    pub fn read_only(mut self, read_only: bool) -> TensorSpec {
        self.read_only = read_only;
        self
    }

    /// The element type.
    pub fn elem(&self) -> ElemType {
        self.elem
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The strides given, if any.
    pub fn strides_given(&self) -> Option<&[i64]> {
        self.strides.as_deref()
    }

    /// The byte offset.
    pub fn offset(&self) -> usize {
        self.byte_offset
    }

    /// Whether the export is read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Checks the spec against an allocation of `size` bytes at `base`: the strides (given or
    /// compact) and the offset keep every element inside it, the first element is aligned.
    /// Returns the strides.
    pub fn check(&self, base: u64, size: usize) -> Result<Vec<i64>> {
        layout::check_shape(&self.shape)?;
        let strides = match &self.strides {
            Some(s) if s.len() != self.shape.len() => {
                return Err(Error::StrideCount {
                    ndim: self.shape.len(),
                    strides: s.len(),
                })
            }
            Some(s) => s.clone(),
            None => layout::compact_strides(&self.shape)?,
        };
        layout::check_bounds(
            &self.shape,
            &strides,
            self.elem.size(),
            self.byte_offset,
            size,
        )?;
        let first = base
            .checked_add(self.byte_offset as u64)
            .ok_or(Error::Overflow("data address"))?;
        if layout::numel(&self.shape)? != 0 && !first.is_multiple_of(self.elem.align() as u64) {
            return Err(Error::Misaligned {
                addr: first,
                align: self.elem.align(),
            });
        }
        Ok(strides)
    }
}

/// The heap context of one export: both DLPack structs (one is handed out), shape and
/// strides, and the owner. `manager_ctx` of each struct points here.
struct Holder<O> {
    versioned: DLManagedTensorVersioned,
    legacy: DLManagedTensor,
    /// Shape, then strides; its heap buffer never moves. Read through the structs' pointers.
    _dims: Box<[i64]>,
    /// Kept for its drop, in the deleter.
    _owner: O,
}

/// Frees a holder: drops the owner and the dims, once. A panic in the owner's drop stops
/// here (it must not unwind into the consumer's C code); the holder's memory is freed anyway.
///
/// # Safety
///
/// `holder` came from `Box::into_raw` of a `Holder<O>` and is not used again.
unsafe fn free_holder<O>(holder: *mut Holder<O>) {
    // SAFETY: the caller's contract.
    let boxed = unsafe { Box::from_raw(holder) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

unsafe extern "C" fn delete_versioned<O>(tensor: *mut DLManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: the consumer calls the deleter with the tensor it was given, once (the DLPack
    // contract); its manager_ctx is the holder that `ExportedTensor::build` leaked.
    unsafe { free_holder::<O>((*tensor).manager_ctx.cast::<Holder<O>>()) }
}

unsafe extern "C" fn delete_legacy<O>(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`.
    unsafe { free_holder::<O>((*tensor).manager_ctx.cast::<Holder<O>>()) }
}

/// An owning DLPack tensor made here, not yet handed to a consumer.
///
/// [`into_raw`](Self::into_raw) (a `DLManagedTensorVersioned`) or
/// [`into_raw_legacy`](Self::into_raw_legacy) (a `DLManagedTensor`, for consumers older
/// than DLPack 1.0) hands it over: the consumer then owns it and calls its deleter once,
/// from any thread, which drops the owner. Dropping an `ExportedTensor` that was never
/// handed over calls the deleter itself.
///
/// `Send` and `Sync`: the owner is `Send` and is reached only by the deleter; the rest is
/// plain data.
pub struct ExportedTensor {
    versioned: NonNull<DLManagedTensorVersioned>,
    legacy: NonNull<DLManagedTensor>,
}

// SAFETY: the holder is owned by this value alone; its owner is `Send` (required by every
// constructor) and only dropped by the deleter; the DLPack structs are plain data.
unsafe impl Send for ExportedTensor {}
// SAFETY: `&ExportedTensor` only reads the DLPack structs, which nothing mutates while it is
// shared (the setters take `&mut self`).
unsafe impl Sync for ExportedTensor {}

impl ExportedTensor {
    /// Exports `spec` over `view`, keeping a clone of the view (and so its allocation) alive
    /// until the consumer calls the deleter. The device is `kDLCUDA` with the view's ordinal.
    pub fn from_view(view: &DevicePtr, spec: &TensorSpec) -> Result<ExportedTensor> {
        let device = DLDevice {
            device_type: device_type::CUDA,
            device_id: view.device().ordinal() as i32,
        };
        // SAFETY: a DevicePtr's range is live device memory of its device for as long as the
        // view (the owner below) lives: DeviceAlloc's contract.
        unsafe {
            ExportedTensor::from_raw_parts(device, view.as_raw(), view.len(), view.clone(), spec)
        }
    }

    /// Exports `spec` over the whole of `alloc` (a `DeviceMemory`, a pool block, an IPC
    /// mapping, ...), which the tensor now owns.
    pub fn from_alloc<A: DeviceAlloc + 'static>(
        alloc: A,
        spec: &TensorSpec,
    ) -> Result<ExportedTensor> {
        ExportedTensor::from_view(&DevicePtr::new(alloc), spec)
    }

    /// Exports `spec` over `size` bytes at `data` on `device`, keeping `owner` alive until
    /// the deleter runs. The checks are those of [`from_view`](Self::from_view).
    ///
    /// This is also how the bookkeeping is tested without a device: a fake owner and an
    /// address that nobody dereferences.
    ///
    /// # Safety
    ///
    /// `data..data + size` must be memory of `device` that stays allocated while `owner`
    /// lives, and that a consumer may read and write as the spec describes (its producer
    /// being done with it, or ordered before the consumer: see [`crate::stream`]).
    pub unsafe fn from_raw_parts<O: Send + 'static>(
        device: DLDevice,
        data: u64,
        size: usize,
        owner: O,
        spec: &TensorSpec,
    ) -> Result<ExportedTensor> {
        let strides = spec.check(data, size)?;
        let first = data + spec.byte_offset as u64; // checked by `check`
        let ndim = spec.shape.len();
        let mut dims = Vec::with_capacity(2 * ndim);
        dims.extend_from_slice(&spec.shape);
        dims.extend_from_slice(&strides);
        let mut dims = dims.into_boxed_slice();
        let shape_ptr = if ndim == 0 {
            std::ptr::null_mut()
        } else {
            dims.as_mut_ptr()
        };
        let strides_ptr = if ndim == 0 {
            std::ptr::null_mut()
        } else {
            // SAFETY: `ndim` is within the 2 * ndim elements of `dims`.
            unsafe { dims.as_mut_ptr().add(ndim) }
        };
        let tensor = DLTensor {
            data: first as usize as *mut c_void,
            device,
            ndim: ndim as i32, // at most MAX_DIMS, checked
            dtype: spec.elem.to_dl(),
            shape: shape_ptr,
            strides: strides_ptr,
            byte_offset: 0,
        };
        let flags = if spec.read_only {
            DlpackFlags::READ_ONLY
        } else {
            DlpackFlags::empty()
        };
        let holder = Box::into_raw(Box::new(Holder {
            versioned: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: DLPACK_MAJOR_VERSION,
                    minor: DLPACK_MINOR_VERSION,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned::<O>),
                flags,
                dl_tensor: tensor,
            },
            legacy: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy::<O>),
            },
            _dims: dims,
            _owner: owner,
        }));
        // SAFETY: `holder` is a live, exclusively owned allocation from `Box::into_raw`; the
        // field pointers below stay valid until the deleter frees it.
        unsafe {
            (*holder).versioned.manager_ctx = holder.cast();
            (*holder).legacy.manager_ctx = holder.cast();
            Ok(ExportedTensor {
                versioned: NonNull::new_unchecked(&raw mut (*holder).versioned),
                legacy: NonNull::new_unchecked(&raw mut (*holder).legacy),
            })
        }
    }

    fn managed(&self) -> &DLManagedTensorVersioned {
        // SAFETY: the holder lives until this value is dropped or handed over (consumed).
        unsafe { self.versioned.as_ref() }
    }

    /// The `DLTensor` handed out.
    pub fn dl_tensor(&self) -> &DLTensor {
        &self.managed().dl_tensor
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        let t = self.dl_tensor();
        if t.ndim == 0 {
            return &[];
        }
        // SAFETY: `shape` points to `ndim` elements of the holder's dims.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[i64] {
        let t = self.dl_tensor();
        if t.ndim == 0 {
            return &[];
        }
        // SAFETY: `strides` points to `ndim` elements of the holder's dims.
        unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }
    }

    /// The address of the first element.
    pub fn data(&self) -> u64 {
        self.dl_tensor().data as u64
    }

    /// The version the versioned struct carries.
    pub fn version(&self) -> DLPackVersion {
        self.managed().version
    }

    /// The flags the versioned struct carries.
    pub fn flags(&self) -> DlpackFlags {
        self.managed().flags
    }

    /// Lowers the minor version the tensor reports (a consumer that asked for
    /// `max_version = (1, minor)` with `minor` below this crate's). The structs are the same
    /// for every 1.x; strides are always set, as 1.2 requires.
    pub fn set_minor_version(&mut self, minor: u32) {
        // SAFETY: exclusively borrowed, not handed over yet.
        unsafe { self.versioned.as_mut().version.minor = minor.min(DLPACK_MINOR_VERSION) };
    }

    /// Hands the versioned tensor over: the caller (the consumer) now owns it and must call
    /// its deleter exactly once.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let ptr = self.versioned.as_ptr();
        std::mem::forget(self);
        ptr
    }

    /// Hands the tensor over as a legacy `DLManagedTensor` (no version, no flags): the caller
    /// now owns it and must call its deleter exactly once.
    pub fn into_raw_legacy(self) -> *mut DLManagedTensor {
        let ptr = self.legacy.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl Drop for ExportedTensor {
    fn drop(&mut self) {
        // SAFETY: never handed over (`into_raw*` forget `self`), so the deleter is ours to
        // call, once, with the struct it belongs to.
        unsafe {
            if let Some(deleter) = self.versioned.as_ref().deleter {
                deleter(self.versioned.as_ptr());
            }
        }
    }
}

impl std::fmt::Debug for ExportedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.dl_tensor();
        f.debug_struct("ExportedTensor")
            .field("device", &(t.device.device_type.0, t.device.device_id))
            .field("data", &format_args!("{:#x}", self.data()))
            .field("dtype", &ElemType::from_dl(t.dtype).ok())
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("flags", &self.flags())
            .finish()
    }
}
