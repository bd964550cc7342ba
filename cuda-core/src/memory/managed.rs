//! Managed (unified) memory: `cuMemAllocManaged`, prefetch and advice.

use std::fmt;
use std::ops::BitOr;

use cudars_sys::{CUdeviceptr, CUmemAttach_flags, CUmem_advise};

use super::{DeviceAlloc, DevicePtr, Location};
use crate::cross_device::CrossDeviceUses;
use crate::driver::drv;
use crate::error::Result;
use crate::stream::Stream;
use crate::Device;

/// How managed memory is attached when it is allocated (`CU_MEM_ATTACH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttachFlags(pub u32);

impl AttachFlags {
    /// Accessible from any stream on any device (`CU_MEM_ATTACH_GLOBAL`), the usual choice.
    pub const GLOBAL: AttachFlags = AttachFlags(CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0);
    /// Initially attached to the host only (`CU_MEM_ATTACH_HOST`). On devices with concurrent
    /// managed access (every Pascal or newer GPU on Linux) the device may still access it.
    pub const HOST: AttachFlags = AttachFlags(CUmemAttach_flags::CU_MEM_ATTACH_HOST.0);
}

impl Default for AttachFlags {
    fn default() -> Self {
        AttachFlags::GLOBAL
    }
}

impl BitOr for AttachFlags {
    type Output = AttachFlags;
    fn bitor(self, rhs: AttachFlags) -> AttachFlags {
        AttachFlags(self.0 | rhs.0)
    }
}

/// Advice about how managed memory will be used (`cuMemAdvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Mostly read: the driver may keep read-only copies where it is read.
    SetReadMostly,
    /// Undoes [`SetReadMostly`](Advice::SetReadMostly).
    UnsetReadMostly,
    /// Prefer keeping the pages at the given location.
    SetPreferredLocation,
    /// Undoes [`SetPreferredLocation`](Advice::SetPreferredLocation).
    UnsetPreferredLocation,
    /// The location will access the memory: keep it mapped there.
    SetAccessedBy,
    /// Undoes [`SetAccessedBy`](Advice::SetAccessedBy).
    UnsetAccessedBy,
}

impl Advice {
    /// The driver's `CUmem_advise`.
    pub fn to_raw(self) -> CUmem_advise {
        match self {
            Advice::SetReadMostly => CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY,
            Advice::UnsetReadMostly => CUmem_advise::CU_MEM_ADVISE_UNSET_READ_MOSTLY,
            Advice::SetPreferredLocation => CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            Advice::UnsetPreferredLocation => CUmem_advise::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
            Advice::SetAccessedBy => CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY,
            Advice::UnsetAccessedBy => CUmem_advise::CU_MEM_ADVISE_UNSET_ACCESSED_BY,
        }
    }
}

/// Prefetches `len` bytes of managed memory at `addr` to `to`, ordered on `stream`.
pub(crate) fn prefetch_range(
    addr: CUdeviceptr,
    len: usize,
    to: Location,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let to = to.to_raw()?;
    let _ctx = stream.device().bind()?;
    // SAFETY: the stream's context is current; the driver checks that the range is managed.
    // Prefetching moves pages, it never changes their contents.
    unsafe { drv!(mem_prefetch_async as "cuMemPrefetchAsync" (addr, len, to, 0, stream.raw())) }
}

/// Gives `advice` about `len` bytes of managed memory at `addr`.
pub(crate) fn advise_range(
    device: Device,
    addr: CUdeviceptr,
    len: usize,
    advice: Advice,
    location: Location,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let location = location.to_raw()?;
    let _ctx = device.bind()?;
    // SAFETY: a context is current; advice never changes the memory's contents.
    unsafe { drv!(mem_advise as "cuMemAdvise" (addr, len, advice.to_raw(), location)) }
}

/// Managed (unified) memory, addressable from the host and from every device
/// (`cuMemAllocManaged`, freed with `cuMemFree`; CuPy's `ManagedMemory`).
///
/// The device side goes through [`DevicePtr`] views (copies, memsets) like any device memory;
/// the host side through raw pointers or the `unsafe` [`as_slice`](Self::as_slice), since
/// the device may be writing the memory at any time the host is not synchronised with it.
/// Synchronous memsets and device-to-device copies return before the device is done, so
/// synchronise (the stream, or the device) before reading on the host.
///
/// `ManagedMemory` is `Send` and `Sync`.
///
/// ```no_run
/// use cudars_core::{memory::{AttachFlags, Location, ManagedMemory}, Device, Stream};
///
/// let dev = Device::new(0)?;
/// let mem = ManagedMemory::new(&dev, 1 << 20, AttachFlags::GLOBAL)?;
/// let stream = Stream::new(&dev)?;
/// mem.prefetch(Location::Device(dev), &stream)?;
/// let view = mem.into_ptr();
/// view.memset_async(42, &stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct ManagedMemory {
    ptr: CUdeviceptr,
    size: usize,
    device: Device,
    /// Work of other devices' streams on the memory, waited for before the free.
    cross: CrossDeviceUses,
}

impl ManagedMemory {
    /// Allocates `size` bytes of managed memory in `device`'s context.
    pub fn new(device: &Device, size: usize, attach: AttachFlags) -> Result<ManagedMemory> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let mut ptr: CUdeviceptr = 0;
        if size != 0 {
            let _ctx = device.bind()?;
            // SAFETY: the device's context is current; valid out-pointer; the driver checks
            // the flags.
            unsafe { drv!(cuMemAllocManaged(&mut ptr, size, attach.0)) }?;
            crate::health::host_allocation_made(device.ordinal());
        }
        Ok(ManagedMemory {
            ptr,
            size,
            device: *device,
            cross: CrossDeviceUses::default(),
        })
    }

    /// The device whose context allocated the memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The address, the same on the host and on devices.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The address as a host pointer (null for an empty allocation).
    pub fn as_host_ptr(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `true` for a zero-byte allocation.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The memory as a host byte slice.
    ///
    /// # Safety
    ///
    /// No device work that writes this memory may be pending or start while the slice lives
    /// (synchronise first), and no `&mut` to it may exist.
    pub unsafe fn as_slice(&self) -> &[u8] {
        if self.size == 0 {
            return &[];
        }
        // SAFETY: a live allocation of `size` bytes, host-accessible; the caller rules out
        // concurrent writers.
        unsafe { std::slice::from_raw_parts(self.as_host_ptr(), self.size) }
    }

    /// The memory as a mutable host byte slice.
    ///
    /// # Safety
    ///
    /// No device work that reads or writes this memory may be pending or start while the
    /// slice lives (synchronise first).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.size == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` rules out other host references.
        unsafe { std::slice::from_raw_parts_mut(self.as_host_ptr(), self.size) }
    }

    /// Migrates the whole allocation to `to` (a device or the host), ordered on `stream`
    /// (`cuMemPrefetchAsync`). Needs a device with concurrent managed access.
    pub fn prefetch(&self, to: Location, stream: &Stream) -> Result<()> {
        // A stream of another device: the free waits for the prefetch too.
        self.cross.record(self.device, stream)?;
        prefetch_range(self.ptr, self.size, to, stream)
    }

    /// Advises the driver how the whole allocation will be used (`cuMemAdvise`). The
    /// location is ignored by the read-mostly advice.
    pub fn advise(&self, advice: Advice, location: Location) -> Result<()> {
        advise_range(self.device, self.ptr, self.size, advice, location)
    }

    /// A [`DevicePtr`] view over the whole allocation, which now owns it.
    pub fn into_ptr(self) -> DevicePtr {
        DevicePtr::new(self)
    }
}

impl fmt::Debug for ManagedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedMemory")
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("cross_device_uses", &self.cross.len())
            .finish()
    }
}

impl ManagedMemory {
    /// The allocation moved into a value the release thread frees later; `self` is left
    /// empty (its drop does nothing).
    fn moved_out(&mut self) -> ManagedMemory {
        ManagedMemory {
            ptr: std::mem::take(&mut self.ptr),
            size: std::mem::take(&mut self.size),
            device: self.device,
            cross: std::mem::take(&mut self.cross),
        }
    }
}

impl Drop for ManagedMemory {
    fn drop(&mut self) {
        if self.size == 0 || self.ptr == 0 {
            return;
        }
        // Not inside a host function, nor while a capture of this crate runs (see
        // `DeviceMemory`'s drop): later, on the release thread.
        let Some(_gate) = crate::release::gate_or_defer(|| Box::new(self.moved_out())) else {
            return;
        };
        // Other devices' work first (`cuMemFree` waits for this device's only); leaked if a
        // wait fails, since that work may still run.
        // Freed or leaked below, no reference to it is left: a reset need not wait for it.
        crate::health::host_allocation_gone(self.device.ordinal());
        if !self.cross.wait_all() {
            crate::release::note_leak();
            return;
        }
        // Relaxed, so that a capture running now is neither refused nor invalidated.
        let _relaxed = crate::graph::RelaxedCaptureMode::new();
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the allocation, made by cuMemAllocManaged in this context. No
            // host slice outlives `self` (they borrow it).
            let _ = unsafe { drv!(cuMemFree(self.ptr)) };
        }
    }
}

// SAFETY: a managed allocation of `size` bytes owned by this value; host references to it
// only come from the `unsafe` accessors, whose contract excludes concurrent device access.
// The free waits for all work that uses the memory (see `record_stream`).
unsafe impl DeviceAlloc for ManagedMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    /// A stream of the allocating device: nothing, `cuMemFree` in `Drop` waits for that
    /// device's work. Managed memory is reachable from every device, and `cuMemFree` does not
    /// wait for the others: a stream of another device is noted (as for
    /// [`DeviceMemory`](super::DeviceMemory)), and `Drop` waits for the work queued on it by
    /// then before freeing. Nothing while `stream` is captured (the graph's launches note
    /// their own use).
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.cross.record(self.device, stream)
    }
}
