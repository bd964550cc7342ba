//! Page-locked host memory: allocated by the driver (`cuMemHostAlloc`) or an existing buffer
//! registered with it (`cuMemHostRegister`).

use std::ffi::c_void;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{BitOr, Deref, DerefMut};
use std::ptr::NonNull;

use cudars_sys::CUdeviceptr;

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::Device;

/// Flags of [`PinnedMemory::new`] (`CU_MEMHOSTALLOC_*`); combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PinnedFlags(pub u32);

impl PinnedFlags {
    /// No flag: pinned for the allocating context.
    pub const NONE: PinnedFlags = PinnedFlags(0);
    /// Pinned for every context, not only the allocating one (`CU_MEMHOSTALLOC_PORTABLE`).
    pub const PORTABLE: PinnedFlags = PinnedFlags(cudars_sys::CU_MEMHOSTALLOC_PORTABLE);
    /// Mapped into the device's address space: kernels and device memsets can address it
    /// through [`PinnedMemory::device_ptr`] (`CU_MEMHOSTALLOC_DEVICEMAP`).
    pub const DEVICE_MAP: PinnedFlags = PinnedFlags(cudars_sys::CU_MEMHOSTALLOC_DEVICEMAP);
    /// Write-combined: faster host-to-device transfers, very slow host reads
    /// (`CU_MEMHOSTALLOC_WRITECOMBINED`).
    pub const WRITE_COMBINED: PinnedFlags = PinnedFlags(cudars_sys::CU_MEMHOSTALLOC_WRITECOMBINED);

    /// `true` when every flag of `other` is set in `self`.
    pub fn contains(self, other: PinnedFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for PinnedFlags {
    type Output = PinnedFlags;
    fn bitor(self, rhs: PinnedFlags) -> PinnedFlags {
        PinnedFlags(self.0 | rhs.0)
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed with `cuMemFreeHost` on drop (CuPy's
/// `PinnedMemory`). Copies between it and the device run at full DMA speed and can be truly
/// asynchronous.
///
/// It dereferences to `[u8]` (zero-filled is not guaranteed: the driver returns whatever the
/// pages held, which on Linux are fresh, zeroed pages). Typed views through
/// [`as_slice_of`](Self::as_slice_of). A size of 0 is an empty buffer without a driver call.
///
/// `PinnedMemory` is `Send` and `Sync`, like a `Vec<u8>`: it owns its buffer, and host access
/// goes through Rust references. The device can only write it through operations that are
/// `unsafe` (asynchronous copies into it, or views built on [`device_ptr`](Self::device_ptr)).
///
/// ```no_run
/// use cudars_core::{memory::{PinnedFlags, PinnedMemory}, Device};
///
/// let dev = Device::new(0)?;
/// let mut buf = PinnedMemory::new(&dev, 4096, PinnedFlags::PORTABLE | PinnedFlags::DEVICE_MAP)?;
/// buf.fill(7);
/// let floats: &[f32] = buf.as_slice_of()?;
/// assert_eq!(floats.len(), 1024);
/// assert!(buf.device_ptr().is_some());
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct PinnedMemory {
    ptr: NonNull<u8>,
    size: usize,
    flags: PinnedFlags,
    device_ptr: Option<CUdeviceptr>,
    device: Device,
}

// SAFETY: the value owns its buffer exclusively, like a Vec<u8>; host access follows Rust's
// borrowing rules, and the driver calls it makes (free) may come from any thread.
unsafe impl Send for PinnedMemory {}
// SAFETY: `&PinnedMemory` only gives shared `&[u8]` access.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// Allocates `size` bytes of pinned host memory in `device`'s context with `flags`.
    pub fn new(device: &Device, size: usize, flags: PinnedFlags) -> Result<PinnedMemory> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        if size == 0 {
            return Ok(PinnedMemory {
                ptr: NonNull::dangling(),
                size: 0,
                flags,
                device_ptr: None,
                device: *device,
            });
        }
        let _ctx = device.bind()?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: the device's context is current; valid out-pointer; the driver checks flags.
        unsafe { drv!(cuMemHostAlloc(&mut raw, size, flags.0)) }?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(Error::InvalidArgument(
                "cuMemHostAlloc returned a null pointer".into(),
            ));
        };
        crate::health::host_allocation_made(device.ordinal());
        let mut mem = PinnedMemory {
            ptr,
            size,
            flags,
            device_ptr: None,
            device: *device,
        };
        if flags.contains(PinnedFlags::DEVICE_MAP) {
            let mut dptr: CUdeviceptr = 0;
            // SAFETY: `raw` is a mapped pinned allocation of this context; valid out-pointer.
            // On error `mem` drops and frees the allocation.
            unsafe { drv!(cuMemHostGetDevicePointer(&mut dptr, raw, 0)) }?;
            mem.device_ptr = Some(dptr);
        }
        Ok(mem)
    }

    /// Takes ownership of a `cuMemHostAlloc` allocation (for pools that keep raw blocks).
    ///
    /// # Safety
    ///
    /// `ptr` must come from `cuMemHostAlloc` in `device`'s context with `flags`, hold `size`
    /// bytes, and be owned by nobody else (it is freed with `cuMemFreeHost` on drop); or be
    /// null with `size` 0.
    pub unsafe fn from_raw(
        device: Device,
        ptr: *mut u8,
        size: usize,
        flags: PinnedFlags,
    ) -> Result<PinnedMemory> {
        let Some(nn) = NonNull::new(ptr).filter(|_| size != 0) else {
            return Ok(PinnedMemory {
                ptr: NonNull::dangling(),
                size: 0,
                flags,
                device_ptr: None,
                device,
            });
        };
        let mut device_ptr = None;
        if flags.contains(PinnedFlags::DEVICE_MAP) {
            let _ctx = device.bind()?;
            let mut dptr: CUdeviceptr = 0;
            // SAFETY: the caller guarantees a mapped pinned allocation; valid out-pointer.
            unsafe { drv!(cuMemHostGetDevicePointer(&mut dptr, ptr.cast(), 0)) }?;
            device_ptr = Some(dptr);
        }
        crate::health::host_allocation_made(device.ordinal());
        Ok(PinnedMemory {
            ptr: nn,
            size,
            flags,
            device_ptr,
            device,
        })
    }

    /// Gives up ownership: returns the host address and size, which the caller must free
    /// with `cuMemFreeHost` (or hand back to [`from_raw`](Self::from_raw)). Null for an empty
    /// buffer.
    pub fn into_raw(self) -> (*mut u8, usize) {
        let this = ManuallyDrop::new(self);
        if this.size == 0 {
            (std::ptr::null_mut(), 0)
        } else {
            // No longer this crate's: a device reset no longer waits for it (the raw
            // pointer's holder answers for it, as for any raw pointer).
            crate::health::host_allocation_gone(this.device.ordinal());
            (this.ptr.as_ptr(), this.size)
        }
    }

    /// The device whose context allocated the memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The flags it was allocated with.
    pub fn flags(&self) -> PinnedFlags {
        self.flags
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    /// `true` for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device address of mapped memory ([`PinnedFlags::DEVICE_MAP`]), from
    /// `cuMemHostGetDevicePointer`; `None` otherwise.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.device_ptr
    }

    /// The buffer's host address (dangling, never null, when empty).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The buffer's host address, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `size` bytes owned by `self` (or a dangling, aligned pointer with length 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }

    /// The buffer as `&[T]`; [`Error::InvalidArgument`] when its size is not a multiple of
    /// `size_of::<T>()` (pinned memory is page-aligned, so alignment always holds).
    pub fn as_slice_of<T: bytemuck::Pod>(&self) -> Result<&[T]> {
        bytemuck::try_cast_slice(self.as_slice()).map_err(cast_error::<T>)
    }

    /// The buffer as `&mut [T]`; same rules as [`as_slice_of`](Self::as_slice_of).
    pub fn as_mut_slice_of<T: bytemuck::Pod>(&mut self) -> Result<&mut [T]> {
        bytemuck::try_cast_slice_mut(self.as_mut_slice()).map_err(cast_error::<T>)
    }
}

fn cast_error<T>(e: bytemuck::PodCastError) -> Error {
    Error::InvalidArgument(format!(
        "cannot view the buffer as [{}]: {e:?}",
        std::any::type_name::<T>()
    ))
}

impl Deref for PinnedMemory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PinnedMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for PinnedMemory {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for PinnedMemory {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("flags", &self.flags)
            .field("device_ptr", &self.device_ptr.map(|p| format!("{p:#x}")))
            .finish()
    }
}

impl PinnedMemory {
    /// The allocation moved into a value the release thread frees later; `self` is left
    /// empty (its drop does nothing).
    fn moved_out(&mut self) -> PinnedMemory {
        PinnedMemory {
            ptr: self.ptr,
            size: std::mem::take(&mut self.size),
            flags: self.flags,
            device_ptr: self.device_ptr,
            device: self.device,
        }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        // `cuMemFreeHost` synchronises: not inside a host function, nor while a capture of
        // this crate runs (see `DeviceMemory`'s drop); later, on the release thread.
        let Some(_gate) = crate::release::gate_or_defer(|| Box::new(self.moved_out())) else {
            return;
        };
        // A capture in global or thread-local mode (this thread's or another's) would refuse
        // the free and be invalidated by it: relax this thread's mode for the call.
        let _relaxed = crate::graph::RelaxedCaptureMode::new();
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the allocation from cuMemHostAlloc; no reference outlives self.
            let _ = unsafe { drv!(cuMemFreeHost(self.ptr.as_ptr().cast())) };
        }
        // Freed, or left to the context (lost or reset): no reference to it is left.
        crate::health::host_allocation_gone(self.device.ordinal());
    }
}

/// Flags of [`HostRegistration::new`] (`CU_MEMHOSTREGISTER_*`); combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RegisterFlags(pub u32);

impl RegisterFlags {
    /// No flag: pinned for the registering context.
    pub const NONE: RegisterFlags = RegisterFlags(0);
    /// Pinned for every context (`CU_MEMHOSTREGISTER_PORTABLE`).
    pub const PORTABLE: RegisterFlags = RegisterFlags(cudars_sys::CU_MEMHOSTREGISTER_PORTABLE);
    /// Mapped into the device's address space (`CU_MEMHOSTREGISTER_DEVICEMAP`).
    pub const DEVICE_MAP: RegisterFlags = RegisterFlags(cudars_sys::CU_MEMHOSTREGISTER_DEVICEMAP);
    /// The device will only read it (`CU_MEMHOSTREGISTER_READ_ONLY`).
    pub const READ_ONLY: RegisterFlags = RegisterFlags(cudars_sys::CU_MEMHOSTREGISTER_READ_ONLY);

    /// `true` when every flag of `other` is set in `self`.
    pub fn contains(self, other: RegisterFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for RegisterFlags {
    type Output = RegisterFlags;
    fn bitor(self, rhs: RegisterFlags) -> RegisterFlags {
        RegisterFlags(self.0 | rhs.0)
    }
}

/// A host buffer that can be page-locked with [`HostRegistration`]: a slice of plain data
/// whose address does not change while the buffer is moved.
///
/// Implemented for `&mut [T]`, `Vec<T>` and `Box<[T]>` with `T: bytemuck::Pod`.
///
/// # Safety
///
/// `as_slice` and `as_mut_slice` must return the same memory every time, and that memory must
/// stay where it is when the buffer value is moved, until the buffer is dropped.
pub unsafe trait HostBuffer {
    /// The element type.
    type Elem: bytemuck::Pod;
    /// The elements.
    fn as_slice(&self) -> &[Self::Elem];
    /// The elements, mutably.
    fn as_mut_slice(&mut self) -> &mut [Self::Elem];
}

// SAFETY: a mutable borrow of a slice points to the same memory wherever the borrow moves.
unsafe impl<T: bytemuck::Pod> HostBuffer for &mut [T] {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

// SAFETY: a Vec's heap buffer does not move with the Vec, and only `push`-like methods (not
// reachable through this trait or the registration) reallocate it.
unsafe impl<T: bytemuck::Pod> HostBuffer for Vec<T> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

// SAFETY: a boxed slice's heap buffer does not move with the box.
unsafe impl<T: bytemuck::Pod> HostBuffer for Box<[T]> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

/// An existing host buffer page-locked with `cuMemHostRegister` for as long as this value
/// lives, then unregistered (`cuMemHostUnregister`) on drop.
///
/// The registration holds the buffer (a `&mut [T]` borrow, or an owned `Vec<T>` /
/// `Box<[T]>`), so it cannot be reallocated or freed while registered; access it through
/// [`as_slice`](Self::as_slice) / [`as_mut_slice`](Self::as_mut_slice), and get it back with
/// [`into_inner`](Self::into_inner). An empty buffer is not registered (no driver call).
///
/// `Send` and `Sync` when the buffer is.
///
/// ```no_run
/// use cudars_core::{memory::{HostRegistration, RegisterFlags}, Device};
///
/// let dev = Device::new(0)?;
/// let mut data = vec![0u32; 1 << 20];
/// {
///     let mut reg = HostRegistration::new(&dev, &mut data[..], RegisterFlags::PORTABLE)?;
///     reg.as_mut_slice()[0] = 1; // copies from/to `reg` now run at pinned speed
/// } // unregistered here
/// assert_eq!(data[0], 1);
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct HostRegistration<B: HostBuffer> {
    buffer: ManuallyDrop<B>,
    registered: Option<NonNull<u8>>,
    bytes: usize,
    device_ptr: Option<CUdeviceptr>,
    device: Device,
}

// SAFETY: the registration adds only the registered address (derived from the buffer) to
// the buffer; moving it to another thread is as safe as moving the buffer.
unsafe impl<B: HostBuffer + Send> Send for HostRegistration<B> {}
// SAFETY: `&HostRegistration` gives only `&[T]` access to the buffer.
unsafe impl<B: HostBuffer + Sync> Sync for HostRegistration<B> {}

impl<B: HostBuffer> HostRegistration<B> {
    /// Page-locks `buffer` in `device`'s context with `flags`. On error the buffer is
    /// dropped (pass a `&mut` borrow to keep it).
    pub fn new(device: &Device, mut buffer: B, flags: RegisterFlags) -> Result<Self> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let slice = buffer.as_mut_slice();
        let bytes = std::mem::size_of_val(slice);
        let ptr = slice.as_mut_ptr().cast::<u8>();
        let mut reg = HostRegistration {
            buffer: ManuallyDrop::new(buffer),
            registered: None,
            bytes,
            device_ptr: None,
            device: *device,
        };
        if bytes == 0 {
            return Ok(reg);
        }
        let _ctx = device.bind()?;
        // SAFETY: `ptr..ptr + bytes` is the buffer, which `reg` holds (so it stays allocated
        // and in place) until it unregisters it.
        unsafe { drv!(cuMemHostRegister(ptr.cast(), bytes, flags.0)) }?;
        reg.registered = NonNull::new(ptr);
        if flags.contains(RegisterFlags::DEVICE_MAP) {
            let mut dptr: CUdeviceptr = 0;
            // SAFETY: a registered, mapped range; valid out-pointer. On error `reg` drops and
            // unregisters.
            unsafe { drv!(cuMemHostGetDevicePointer(&mut dptr, ptr.cast(), 0)) }?;
            reg.device_ptr = Some(dptr);
        }
        Ok(reg)
    }

    /// The registered elements.
    pub fn as_slice(&self) -> &[B::Elem] {
        self.buffer.as_slice()
    }

    /// The registered elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [B::Elem] {
        self.buffer.as_mut_slice()
    }

    /// Registered size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The device address of the buffer when registered with
    /// [`RegisterFlags::DEVICE_MAP`]; `None` otherwise.
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.device_ptr
    }

    /// The device whose context registered the buffer.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Unregisters the buffer and gives it back.
    pub fn into_inner(self) -> B {
        let mut this = ManuallyDrop::new(self);
        this.unregister();
        // SAFETY: `this` is never dropped, so the buffer is moved out exactly once.
        unsafe { ManuallyDrop::take(&mut this.buffer) }
    }

    fn unregister(&mut self) {
        if let Some(ptr) = self.registered.take() {
            // A failure cannot be reported from here; the pages then stay locked. The mode is
            // relaxed so that a capture running now is neither refused nor invalidated.
            let _relaxed = crate::graph::RelaxedCaptureMode::new();
            if let Ok(_ctx) = self.device.bind() {
                // SAFETY: `ptr` was registered by `new` and not unregistered since.
                let _ = unsafe { drv!(cuMemHostUnregister(ptr.as_ptr().cast())) };
            }
        }
    }
}

impl<B: HostBuffer> fmt::Debug for HostRegistration<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegistration")
            .field("ptr", &self.registered)
            .field("bytes", &self.bytes)
            .field("device_ptr", &self.device_ptr.map(|p| format!("{p:#x}")))
            .finish()
    }
}

impl<B: HostBuffer> Drop for HostRegistration<B> {
    fn drop(&mut self) {
        self.unregister();
        // SAFETY: the buffer is dropped exactly once, here, after it was unregistered.
        unsafe { ManuallyDrop::drop(&mut self.buffer) };
    }
}
