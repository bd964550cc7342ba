//! Virtual memory management: thin, documented wrappers over `cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap` and `cuMemSetAccess`, for allocators that grow segments in
//! place and return pages from inside them (as `cuda-mempool` does). Policy (what to reserve,
//! when to map and unmap) belongs to the caller.
//!
//! The pieces:
//! - [`is_supported`] and [`granularity`]: whether the device does VMM, and its page size;
//! - [`VirtualRange`]: reserved address space, no memory behind it (`cuMemAddressReserve`,
//!   freed with `cuMemAddressFree` on drop);
//! - [`PhysicalAllocation`]: device memory without an address (`cuMemCreate`, released with
//!   `cuMemRelease` on drop);
//! - [`VirtualRange::map`] / [`VirtualRange::unmap`] / [`VirtualRange::set_access`] to put
//!   physical memory at an address and make it readable and writable by a device (`unmap`
//!   is `unsafe`: the caller promises that no pending work uses the addresses), and the
//!   `unsafe` raw-address forms [`map`], [`unmap`], [`set_access`].
//!
//! Driver rules worth knowing: sizes and offsets are multiples of the granularity; a mapping
//! is unmapped as a whole (`cuMemUnmap` cannot split one `cuMemMap`); physical memory lives
//! until it is both released and unmapped everywhere, so dropping a [`PhysicalAllocation`]
//! that is still mapped is fine; an address range must have nothing mapped in it when it is
//! freed; newly mapped memory is inaccessible until [`VirtualRange::set_access`].
//!
//! ```no_run
//! use cudars_core::vmm::{self, Granularity, PhysicalAllocation, VirtualRange};
//! use cudars_core::Device;
//!
//! let dev = Device::new(0)?;
//! assert!(vmm::is_supported(&dev)?);
//! let page = vmm::granularity(&dev, Granularity::Minimum)?; // 2 MiB on an H200
//! let range = VirtualRange::reserve(&dev, 4 * page, 0)?;
//! let phys = PhysicalAllocation::new(&dev, page)?;
//! range.map(page, &phys)?;                 // the second page of the range
//! range.set_access(page, page, &dev)?;     // read-write for `dev`
//! // ... use range.base() + page .. + 2 * page as device memory ...
//! // SAFETY: nothing queued on the device uses the page any more.
//! unsafe { range.unmap(page, page) }?;
//! drop(phys); // released now that nothing maps it
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::fmt;

use cudars_sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle,
};

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::memory::device_location;
use crate::Device;

/// Whether `device` supports virtual memory management
/// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
/// Decided by [`crate::features`] ([`Feature::VirtualMemory`](crate::Feature::VirtualMemory)).
pub fn is_supported(device: &Device) -> Result<bool> {
    crate::features::supported(device, crate::Feature::VirtualMemory)
}

/// Which granularity [`granularity`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// The smallest size and alignment the driver accepts (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`).
    Minimum,
    /// The size the driver recommends for performance (`CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`).
    Recommended,
}

/// The properties of pinned device memory on `device`, as `cuMemCreate` takes them.
fn device_prop(device: &Device) -> CUmemAllocationProp {
    device_prop_with(device, CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE)
}

/// As [`device_prop`], requesting the shareable handle types `handles`.
fn device_prop_with(device: &Device, handles: CUmemAllocationHandleType) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handles,
        location: device_location(*device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    }
}

/// The allocation granularity of pinned device memory on `device`
/// (`cuMemGetAllocationGranularity`): sizes, offsets and alignments of this module are
/// multiples of it.
pub fn granularity(device: &Device, which: Granularity) -> Result<usize> {
    let prop = device_prop(device);
    let option = match which {
        Granularity::Minimum => CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        Granularity::Recommended => {
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        }
    };
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer and a fully initialised property struct.
    unsafe { drv!(cuMemGetAllocationGranularity(&mut bytes, &prop, option)) }?;
    Ok(bytes)
}

/// A reserved range of device virtual addresses with nothing behind it until physical memory
/// is mapped into it (`cuMemAddressReserve`); freed with `cuMemAddressFree` on drop.
///
/// Unmap everything mapped into the range before it drops: the driver refuses to free a range
/// with mappings (the failure cannot be reported from `Drop`, and the addresses then stay
/// reserved). A size of 0 reserves nothing and calls no driver function.
///
/// `Send` and `Sync`: it is an address range; the driver calls on it are thread-safe.
pub struct VirtualRange {
    base: CUdeviceptr,
    size: usize,
    device: Device,
}

impl VirtualRange {
    /// Reserves `size` bytes of address space (a multiple of the [`granularity`]) aligned to
    /// `alignment` (0: the granularity). `device`'s context is current for the call; the
    /// addresses are valid for every device (unified addressing).
    pub fn reserve(device: &Device, size: usize, alignment: usize) -> Result<VirtualRange> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let mut base: CUdeviceptr = 0;
        if size != 0 {
            let _ctx = device.bind()?;
            // SAFETY: valid out-pointer; no fixed address requested; flags must be 0.
            unsafe { drv!(cuMemAddressReserve(&mut base, size, alignment, 0, 0)) }?;
        }
        Ok(VirtualRange {
            base,
            size,
            device: *device,
        })
    }

    /// Takes ownership of a range reserved with `cuMemAddressReserve`.
    ///
    /// # Safety
    ///
    /// `base..base + size` must be exactly one reservation, owned by nobody else.
    pub unsafe fn from_raw(device: Device, base: CUdeviceptr, size: usize) -> VirtualRange {
        VirtualRange { base, size, device }
    }

    /// Gives up ownership; the caller frees the range with `cuMemAddressFree`.
    pub fn into_raw(self) -> (CUdeviceptr, usize) {
        let this = std::mem::ManuallyDrop::new(self);
        (this.base, this.size)
    }

    /// The first address.
    pub fn base(&self) -> CUdeviceptr {
        self.base
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device whose context reserved it.
    pub fn device(&self) -> Device {
        self.device
    }

    fn check(&self, offset: usize, len: usize) -> Result<CUdeviceptr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size && len != 0 => Ok(self.base + offset as CUdeviceptr),
            Some(_) => Err(Error::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
            None => Err(Error::SizeOverflow("virtual range offset + length")),
        }
    }

    /// Maps all of `physical` at `base() + offset` (`cuMemMap`). The memory is not yet
    /// accessible: call [`set_access`](Self::set_access). [`Error::OutOfRange`] when it does
    /// not fit in the range; the driver rejects unaligned offsets and occupied addresses.
    pub fn map(&self, offset: usize, physical: &PhysicalAllocation) -> Result<()> {
        let addr = self.check(offset, physical.size)?;
        // SAFETY: the target lies inside this reservation, which this value owns.
        unsafe { map(addr, physical, 0, physical.size) }
    }

    /// Unmaps `len` bytes at `base() + offset` (`cuMemUnmap`); they must be whole mappings.
    /// Not stream-ordered. [`Error::OutOfRange`] when the bytes do not lie inside the range.
    ///
    /// # Safety
    ///
    /// No device work that uses these addresses may still be pending (queued or running on
    /// any stream, or captured in a graph that will be launched), and no view (such as an
    /// `UnownedMemory` over them) may be used to reach them afterwards: device access to
    /// unmapped addresses is a fault, and if other memory is mapped there later it is
    /// silently read or overwritten.
    pub unsafe fn unmap(&self, offset: usize, len: usize) -> Result<()> {
        let addr = self.check(offset, len)?;
        let _ctx = self.device.bind()?;
        // SAFETY: the target lies inside this reservation, which this value owns; nothing
        // pending or live uses it (our caller's contract).
        unsafe { unmap(addr, len) }
    }

    /// Makes `len` mapped bytes at `base() + offset` readable and writable by `device`
    /// (`cuMemSetAccess`).
    pub fn set_access(&self, offset: usize, len: usize, device: &Device) -> Result<()> {
        let addr = self.check(offset, len)?;
        set_access(addr, len, device)
    }
}

impl fmt::Debug for VirtualRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualRange")
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for VirtualRange {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the reservation; the driver rejects it if mappings remain.
            let _ = unsafe { drv!(cuMemAddressFree(self.base, self.size)) };
        }
    }
}

/// Physical device memory with no address (`cuMemCreate`, pinned on one device), released
/// with `cuMemRelease` on drop. The memory itself stays alive while it is mapped anywhere.
///
/// `Send` and `Sync`: a driver handle.
pub struct PhysicalAllocation {
    handle: CUmemGenericAllocationHandle,
    size: usize,
    device: Device,
}

impl PhysicalAllocation {
    /// Creates `size` bytes (a non-zero multiple of the [`granularity`]) of device memory on
    /// `device`. A size of 0 is an [`Error::InvalidArgument`] (there is no empty handle).
    pub fn new(device: &Device, size: usize) -> Result<PhysicalAllocation> {
        Self::create(device, size, device_prop(device))
    }

    /// As [`new`](Self::new), and exportable to other processes as a POSIX file descriptor
    /// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, which must be asked for at creation):
    /// see [`PhysicalAllocation::export_fd`] in [`crate::ipc`]. Linux only.
    pub fn new_shareable(device: &Device, size: usize) -> Result<PhysicalAllocation> {
        let prop = device_prop_with(
            device,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        );
        Self::create(device, size, prop)
    }

    fn create(
        device: &Device,
        size: usize,
        prop: CUmemAllocationProp,
    ) -> Result<PhysicalAllocation> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        if size == 0 {
            return Err(Error::InvalidArgument(
                "a physical allocation of 0 bytes".into(),
            ));
        }
        let mut handle: CUmemGenericAllocationHandle = 0;
        let _ctx = device.bind()?;
        // SAFETY: valid out-pointer and property struct; flags must be 0.
        unsafe { drv!(cuMemCreate(&mut handle, size, &prop, 0)) }?;
        Ok(PhysicalAllocation {
            handle,
            size,
            device: *device,
        })
    }

    /// Takes ownership of a handle from `cuMemCreate`.
    ///
    /// # Safety
    ///
    /// `handle` must be a live handle of `size` bytes on `device`, released by nobody else.
    pub unsafe fn from_raw(
        device: Device,
        handle: CUmemGenericAllocationHandle,
        size: usize,
    ) -> PhysicalAllocation {
        PhysicalAllocation {
            handle,
            size,
            device,
        }
    }

    /// Gives up ownership; the caller releases the handle with `cuMemRelease`.
    pub fn into_raw(self) -> CUmemGenericAllocationHandle {
        std::mem::ManuallyDrop::new(self).handle
    }

    /// The driver handle. Stays owned by `self`.
    pub fn raw(&self) -> CUmemGenericAllocationHandle {
        self.handle
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device holding the memory.
    pub fn device(&self) -> Device {
        self.device
    }
}

impl fmt::Debug for PhysicalAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhysicalAllocation")
            .field("handle", &format_args!("{:#x}", self.handle))
            .field("size", &self.size)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Drop for PhysicalAllocation {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the handle; mappings keep the memory alive past the release.
            let _ = unsafe { drv!(cuMemRelease(self.handle)) };
        }
    }
}

/// Maps `len` bytes of `physical`, from `physical_offset`, at `addr` (`cuMemMap`).
///
/// # Safety
///
/// `addr..addr + len` must lie inside an address reservation that the caller owns and in
/// which nothing else is mapped there.
pub unsafe fn map(
    addr: CUdeviceptr,
    physical: &PhysicalAllocation,
    physical_offset: usize,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Err(Error::InvalidArgument("a mapping of 0 bytes".into()));
    }
    let _ctx = physical.device.bind()?;
    // SAFETY: the caller owns the target addresses; the handle is live; flags must be 0.
    unsafe { drv!(cuMemMap(addr, len, physical_offset, physical.handle, 0)) }
}

/// Unmaps `len` bytes at `addr` (`cuMemUnmap`): one or more whole mappings.
///
/// # Safety
///
/// The caller owns the mappings, and no pending device work or live view uses them.
pub unsafe fn unmap(addr: CUdeviceptr, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: the caller owns the mappings.
    unsafe { drv!(cuMemUnmap(addr, len)) }
}

/// Makes `len` mapped bytes at `addr` readable and writable by `device` (`cuMemSetAccess`
/// with `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
pub fn set_access(addr: CUdeviceptr, len: usize, device: &Device) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let desc = CUmemAccessDesc {
        location: device_location(*device),
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let _ctx = device.bind()?;
    // SAFETY: one valid descriptor; the driver checks that the range is mapped. Granting
    // access never changes memory contents.
    unsafe { drv!(cuMemSetAccess(addr, len, &desc, 1)) }
}
