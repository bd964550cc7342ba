//! Plain device memory (`cuMemAlloc`) and foreign device memory kept alive by an owner.

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudars_sys::CUdeviceptr;

use super::{DeviceAlloc, DevicePtr};
use crate::cross_device::CrossDeviceUses;
use crate::driver::drv;
use crate::error::Result;
use crate::stream::Stream;
use crate::Device;

/// Device memory from `cuMemAlloc`, freed with `cuMemFree` on drop (CuPy's `Memory`).
///
/// A size of 0 is an empty allocation with a null address; the driver is not called.
/// `DeviceMemory` is `Send` and `Sync`: it owns an address range that any thread may use
/// through the driver, and it has no methods that write through `&self` other than driver
/// calls.
///
/// ```no_run
/// use cudars_core::{memory::DeviceMemory, Device};
///
/// let dev = Device::new(0)?;
/// let mem = DeviceMemory::new(&dev, 1 << 20)?;
/// assert_eq!(mem.size(), 1 << 20);
/// let view = mem.into_ptr(); // a DevicePtr over the whole allocation
/// view.memset(0xff)?;
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct DeviceMemory {
    ptr: CUdeviceptr,
    size: usize,
    device: Device,
    /// Work of other devices' streams on the memory, waited for before the free.
    cross: CrossDeviceUses,
}

impl DeviceMemory {
    /// Allocates `size` bytes on `device` (`cuMemAlloc`). Out of memory is a driver error for
    /// which [`Error::is_out_of_memory`](crate::Error::is_out_of_memory) is `true`.
    pub fn new(device: &Device, size: usize) -> Result<DeviceMemory> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let mut ptr: CUdeviceptr = 0;
        if size != 0 {
            let _ctx = device.bind()?;
            // SAFETY: the device's context is current; valid out-pointer.
            unsafe { drv!(cuMemAlloc(&mut ptr, size)) }?;
        }
        Ok(DeviceMemory {
            ptr,
            size,
            device: *device,
            cross: CrossDeviceUses::default(),
        })
    }

    /// Takes ownership of memory allocated with `cuMemAlloc` in `device`'s primary context.
    ///
    /// # Safety
    ///
    /// `ptr` must come from `cuMemAlloc` (or be 0 with `size` 0), hold at least `size` bytes,
    /// and be owned by nobody else: it is freed when the value drops.
    pub unsafe fn from_raw(device: Device, ptr: CUdeviceptr, size: usize) -> DeviceMemory {
        DeviceMemory {
            ptr,
            size,
            device,
            cross: CrossDeviceUses::default(),
        }
    }

    /// Gives up ownership: returns the address, which the caller must free with `cuMemFree`
    /// (or hand back to [`from_raw`](Self::from_raw)). Waits first for the work that streams
    /// of other devices queued on the memory through [`DevicePtr`] views (see
    /// [`DeviceAlloc::record_stream`]), as dropping the value does.
    pub fn into_raw(self) -> CUdeviceptr {
        let me = ManuallyDrop::new(self);
        // A failed wait cannot be reported here; freeing the address is the caller's
        // `unsafe` business from now on.
        let _ = me.cross.wait_all();
        me.ptr
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The address of the first byte (0 for an empty allocation).
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `true` for a zero-byte allocation.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// A [`DevicePtr`] view over the whole allocation, which now owns it.
    pub fn into_ptr(self) -> DevicePtr {
        DevicePtr::new(self)
    }
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("cross_device_uses", &self.cross.len())
            .finish()
    }
}

impl DeviceMemory {
    /// The allocation moved into a value the release thread frees later; `self` is left
    /// empty (its drop does nothing).
    fn moved_out(&mut self) -> DeviceMemory {
        DeviceMemory {
            ptr: std::mem::take(&mut self.ptr),
            size: std::mem::take(&mut self.size),
            device: self.device,
            cross: std::mem::take(&mut self.cross),
        }
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.size == 0 || self.ptr == 0 {
            return;
        }
        // `cuMemFree` relies on the device's implicit wait for the work that still uses the
        // memory. Inside a host function it is forbidden; while a capture begun through this
        // crate runs, the wait is one a capture forbids (the driver documents nothing for
        // it). Either way the free is made later, on the release thread.
        let Some(_gate) = crate::release::gate_or_defer(|| Box::new(self.moved_out())) else {
            return;
        };
        // Other devices' work first: `cuMemFree` waits for this device's work only. If a
        // wait fails that work may still run: the memory is leaked, never freed under it.
        if !self.cross.wait_all() {
            crate::release::note_leak();
            return;
        }
        // A failure cannot be reported from Drop; the memory then stays allocated. A capture
        // that foreign code began (this crate cannot see it) would refuse the free and be
        // invalidated: relax this thread's mode.
        let _relaxed = crate::graph::RelaxedCaptureMode::new();
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the allocation, made by cuMemAlloc in this device's context,
            // which is current.
            let _ = unsafe { drv!(cuMemFree(self.ptr)) };
        }
    }
}

// SAFETY: `as_raw()..+size()` is a cuMemAlloc allocation of `device`, owned by this value,
// never aliased by host references; the fields never change. The free waits for all work
// that uses the memory (see `record_stream`).
unsafe impl DeviceAlloc for DeviceMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    /// A stream of the memory's own device: nothing to do, `cuMemFree` in `Drop` waits for
    /// that device's work (the driver's implicit synchronisation of a free). A stream of
    /// another device (a peer copy queued there, a kernel using peer memory): the stream is
    /// noted (a clone of it; the device, for the per-thread and external streams) and `Drop`
    /// waits for the work queued on it by then before `cuMemFree`, which does not wait for
    /// other devices; a noted stream being captured at the drop leaks the memory instead.
    /// Nothing while `stream` is captured: the work runs at the graph's launches, which note
    /// their own use.
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.cross.record(self.device, stream)
    }
}

/// Device memory that something else allocated and frees (a foreign pointer from PyTorch, a
/// DLPack tensor, an IPC mapping), kept alive by an optional owner (CuPy's `UnownedMemory`).
///
/// The owner, any `Arc<dyn Any + Send + Sync>`, is held as long as the `UnownedMemory` (and
/// every [`DevicePtr`] view of it) lives, and dropped after it. `UnownedMemory` is `Send` and
/// `Sync`; the owner must be too.
///
/// ```no_run
/// use std::sync::Arc;
/// use cudars_core::{memory::{DeviceMemory, DevicePtr, UnownedMemory}, Device};
///
/// let dev = Device::new(0)?;
/// let foreign = Arc::new(DeviceMemory::new(&dev, 4096)?); // stands for a foreign buffer
/// // SAFETY: the range is device memory of `dev`, kept alive by the owner.
/// let unowned = unsafe {
///     UnownedMemory::new(dev, foreign.as_raw(), foreign.size(), Some(foreign.clone()))
/// };
/// let view = DevicePtr::new(unowned);
/// view.memset(1)?;
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct UnownedMemory {
    ptr: CUdeviceptr,
    size: usize,
    device: Device,
    owner: Option<Arc<dyn Any + Send + Sync>>,
    /// Work of other devices' streams on the memory, waited for before the owner drops.
    cross: CrossDeviceUses,
}

impl UnownedMemory {
    /// Wraps `size` bytes at `ptr` on `device`, keeping `owner` alive meanwhile.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` must be memory the driver can copy to and from in `device`'s context
    /// (device memory, managed memory, or mapped host memory that no Rust reference aliases)
    /// and must stay allocated as long as `owner` (or, with no owner, as long as this value
    /// and its views) lives.
    pub unsafe fn new(
        device: Device,
        ptr: CUdeviceptr,
        size: usize,
        owner: Option<Arc<dyn Any + Send + Sync>>,
    ) -> UnownedMemory {
        UnownedMemory {
            ptr,
            size,
            device,
            owner,
            cross: CrossDeviceUses::default(),
        }
    }

    /// The keep-alive owner.
    pub fn owner(&self) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.owner.as_ref()
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The address of the first byte.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A [`DevicePtr`] view over the whole range, which now owns this value.
    pub fn into_ptr(self) -> DevicePtr {
        DevicePtr::new(self)
    }
}

impl fmt::Debug for UnownedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnownedMemory")
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("has_owner", &self.owner.is_some())
            .field("cross_device_uses", &self.cross.len())
            .finish()
    }
}

impl Drop for UnownedMemory {
    fn drop(&mut self) {
        // The owner's free (whatever it is) is not known to wait for other devices' work:
        // wait for it before the owner may go. If a wait fails, that work may still run:
        // the owner is leaked, never dropped under it.
        if !self.cross.wait_all() {
            std::mem::forget(self.owner.take());
        }
    }
}

// SAFETY: the constructor's contract is this trait's contract; the fields never change.
// Uses by streams of other devices are waited for before the owner drops (see
// `record_stream`).
unsafe impl DeviceAlloc for UnownedMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    /// A stream of the memory's own device: nothing, as the trait's default (the owner's
    /// free is taken to wait for that device, the constructor's contract). A stream of
    /// another device: the stream is noted (as for [`DeviceMemory`]), and dropping this value
    /// waits for the work queued on it by then before the keep-alive owner is dropped, since
    /// no free is known to wait for other devices' work. Nothing while `stream` is captured
    /// (the graph's launches note their own use).
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.cross.record(self.device, stream)
    }
}
