//! Where does an address live? Device memory (of which device), page-locked host memory,
//! pageable host memory or managed memory, from the driver's pointer attributes
//! (`cuPointerGetAttributes`), as a [`Location`] (the workspace's one such enum, defined in
//! [`memory`](crate::memory)). The Rust home of CuPy's `get_array_module`, made useful for raw
//! pointers: copy routines use it to pick a direct DMA copy or a staging path.
//!
//! ```no_run
//! use cudars_core::pointer::locate;
//! use cudars_core::Location;
//!
//! let v = vec![0u8; 64];
//! assert_eq!(locate(v.as_ptr())?, Location::PageableHost);
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::ffi::c_void;

use cudars_sys::{CUdeviceptr, CUmemorytype, CUpointer_attribute, CUresult};

use crate::driver::drv;
use crate::error::{Error, Result};
pub use crate::memory::Location;
use crate::Device;

/// The driver's pointer attributes of an address, as far as it knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerAttributes {
    /// Where the address lives.
    pub location: Location,
    /// The ordinal of the device whose context owns the memory, when the driver reports one
    /// (device, managed and pinned memory).
    pub device_ordinal: Option<usize>,
    /// The address to use on the device (`CU_POINTER_ATTRIBUTE_DEVICE_POINTER`), when any.
    pub device_pointer: Option<CUdeviceptr>,
    /// The address to use on the host (`CU_POINTER_ATTRIBUTE_HOST_POINTER`), when any.
    pub host_pointer: Option<usize>,
    /// Start and length of the allocation containing the address
    /// (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, `_RANGE_SIZE`), when the driver reports it.
    pub range: Option<(CUdeviceptr, usize)>,
}

/// The driver's attributes of `addr` (`cuPointerGetAttributes`). Addresses the driver does not
/// know (a `Vec`, a stack variable, 0) answer [`Location::PageableHost`], not an error.
///
/// Asks the location first, then the pointers and the allocation range, each of which is
/// `None` when the driver does not report it for this kind of memory. [`locate`] asks only
/// the location (one driver call). Errors only when the driver cannot be reached.
pub fn attributes(addr: CUdeviceptr) -> Result<PointerAttributes> {
    use CUpointer_attribute as A;
    let (location, device_ordinal) = location_of(addr)?;
    if location == Location::PageableHost {
        return Ok(unknown());
    }
    // The device pointer is reported for the current context: make the owner's current.
    let _ctx = match device_ordinal.map(crate::Device::new) {
        Some(Ok(dev)) => Some(dev.bind()?),
        _ => None,
    };
    let mut slots = [0u64; 7];
    let mut one = |attr: A| {
        slots = [0; 7];
        query(addr, &[attr], &mut slots)
            .ok()
            .and_then(|()| (slots[0] != 0).then_some(slots[0]))
    };
    let device_pointer = one(A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER);
    let host_pointer = if location.is_host_accessible() {
        one(A::CU_POINTER_ATTRIBUTE_HOST_POINTER).map(|p| p as usize)
    } else {
        None
    };
    let mut slots = [0u64; 7];
    let range = query(
        addr,
        &[
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ],
        &mut slots,
    )
    .ok()
    .and_then(|()| (slots[1] != 0).then_some((slots[0], slots[1] as usize)));
    Ok(PointerAttributes {
        location,
        device_ordinal,
        device_pointer,
        host_pointer,
        range,
    })
}

/// The location and the owning device's ordinal: one `cuPointerGetAttributes` call.
fn location_of(addr: CUdeviceptr) -> Result<(Location, Option<usize>)> {
    use CUpointer_attribute as A;
    const ESSENTIAL: [CUpointer_attribute; 3] = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    if addr == 0 {
        return Ok((Location::PageableHost, None));
    }
    // Each slot is 8 zeroed bytes, wide enough for every attribute asked (at most a pointer
    // or a size_t); narrower values (unsigned int, int, bool) land in the low bytes.
    let mut slots = [0u64; 7];
    match query(addr, &ESSENTIAL, &mut slots) {
        Ok(()) => {}
        // The plural call reports unknown pointers as defaults; should a driver reject one
        // instead, it is still memory CUDA does not know.
        Err(Error::Driver(e)) if e.result() == CUresult::CUDA_ERROR_INVALID_VALUE => {
            return Ok((Location::PageableHost, None));
        }
        Err(e) => return Err(e),
    }
    let memory_type = CUmemorytype(slots[0] as u32);
    let is_managed = slots[1] as u8 != 0;
    let ordinal = slots[2] as u32 as i32;
    let ordinal = (ordinal >= 0).then_some(ordinal as usize);
    let location = if is_managed || memory_type == CUmemorytype::CU_MEMORYTYPE_UNIFIED {
        Location::Managed
    } else if memory_type == CUmemorytype::CU_MEMORYTYPE_DEVICE
        || memory_type == CUmemorytype::CU_MEMORYTYPE_ARRAY
    {
        Location::Device(Device::new(ordinal.unwrap_or(0))?)
    } else if memory_type == CUmemorytype::CU_MEMORYTYPE_HOST {
        Location::PinnedHost
    } else {
        return Ok((Location::PageableHost, None));
    };
    Ok((location, ordinal))
}

fn unknown() -> PointerAttributes {
    PointerAttributes {
        location: Location::PageableHost,
        device_ordinal: None,
        device_pointer: None,
        host_pointer: None,
        range: None,
    }
}

fn query(addr: CUdeviceptr, attrs: &[CUpointer_attribute], slots: &mut [u64; 7]) -> Result<()> {
    let n = attrs.len().min(slots.len());
    let mut kinds = [CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE; 7];
    kinds[..n].copy_from_slice(&attrs[..n]);
    let mut data = [std::ptr::null_mut::<c_void>(); 7];
    for (d, s) in data.iter_mut().zip(slots.iter_mut()) {
        *d = (s as *mut u64).cast();
    }
    // SAFETY: `kinds` and `data` hold at least `n` entries; each data pointer addresses 8
    // writable bytes, at least the size of every requested attribute's value. The call reads
    // no memory at `addr`.
    unsafe {
        drv!(cuPointerGetAttributes(
            n as u32,
            kinds.as_mut_ptr(),
            data.as_mut_ptr(),
            addr
        ))
    }
}

/// Where the memory at `ptr` lives; see [`attributes`].
pub fn locate<T: ?Sized>(ptr: *const T) -> Result<Location> {
    Ok(location_of(ptr.cast::<u8>() as usize as CUdeviceptr)?.0)
}

/// Where device address `addr` lives; see [`attributes`].
pub fn locate_device(addr: CUdeviceptr) -> Result<Location> {
    Ok(location_of(addr)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_not_driver_memory_even_without_a_driver() {
        let a = attributes(0).unwrap();
        assert_eq!(a.location, Location::PageableHost);
        assert_eq!(a.device_ordinal, None);
        assert!(a.location.is_host_accessible());
        assert!(!a.location.is_dma_ready());
        assert!(!Location::Device(Device::test_only(0)).is_host_accessible());
        assert!(Location::Managed.is_dma_ready());
    }
}
