//! Where does memory live? CuPy's `get_array_module`, made useful: not "numpy or cupy" but
//! which device, pinned or pageable host, or managed memory, from the driver's pointer
//! attributes (through [`cudars_core::pointer`]).
//!
//! ```no_run
//! use cudars_xfer::location::{locate_slice, Location};
//! let dev = cudars_core::Device::new(0)?;
//! let host = vec![0u8; 1 << 20];
//! assert_eq!(locate_slice(&host)?, Location::PageableHost);
//! let pinned = cudars_xfer::PinnedBuffer::<u8>::zeroed(&dev, 1 << 20)?;
//! assert_eq!(locate_slice(&pinned)?, Location::PinnedHost);
//! let on_device = cudars_xfer::to_device(&dev, &host)?;
//! assert_eq!(cudars_xfer::location::locate_buffer(&on_device)?, Location::Device(dev));
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use cudars_core::pointer;
use cudars_core::sys::CUdeviceptr;

use crate::buffer::DeviceBuffer;
use crate::error::Result;

/// Where memory lives: `cuda-core`'s one [`Location`] enum (device of which device, pinned or
/// pageable host, managed), re-exported here.
pub use cudars_core::Location;

/// Where the byte at `ptr` lives. Addresses the driver does not know (and null) are
/// [`Location::PageableHost`]. Errors only when the driver cannot be reached.
pub fn locate<T: ?Sized>(ptr: *const T) -> Result<Location> {
    Ok(pointer::locate(ptr)?)
}

/// Where a device address lives (device memory of which device, managed, or mapped host
/// memory).
pub fn locate_device_address(addr: CUdeviceptr) -> Result<Location> {
    Ok(pointer::locate_device(addr)?)
}

/// Where a host slice lives, considering all of it: [`Location::PinnedHost`] only when its
/// first and last bytes are both page-locked (a slice that runs past a registered range is
/// pageable for the purpose of copying it). An empty slice is [`Location::PageableHost`].
pub fn locate_slice<T>(slice: &[T]) -> Result<Location> {
    locate_range(slice.as_ptr().cast::<u8>(), std::mem::size_of_val(slice))
}

/// Where the `bytes` bytes at `start` live, as [`locate_slice`] answers for a slice; for raw
/// buffers (FFI, memory maps). Reads no memory.
pub fn locate_range(start: *const u8, bytes: usize) -> Result<Location> {
    if bytes == 0 {
        return Ok(Location::PageableHost);
    }
    let head = pointer::attributes(start as usize as CUdeviceptr)?;
    let location = head.location;
    if bytes == 1 || location == Location::PageableHost {
        return Ok(location);
    }
    // The driver reports the allocation's range for most kinds of memory: use it when it
    // covers the slice, else ask about the last byte too.
    let first = start as usize as u64;
    let end = first.saturating_add(bytes as u64);
    if let Some((range_start, range_len)) = head.range {
        if range_start <= first && end <= range_start.saturating_add(range_len as u64) {
            return Ok(location);
        }
    }
    let last = (end - 1) as CUdeviceptr;
    let tail = pointer::attributes(last)?.location;
    Ok(if tail == location {
        location
    } else {
        Location::PageableHost
    })
}

/// Where a device buffer's memory lives: normally [`Location::Device`], or
/// [`Location::Managed`] for managed memory.
pub fn locate_buffer<T: bytemuck::Pod>(buffer: &DeviceBuffer<T>) -> Result<Location> {
    if buffer.is_empty() {
        return Ok(Location::Device(buffer.device()));
    }
    locate_device_address(buffer.as_raw())
}

/// What kind of host memory a range is, for routing a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostDma {
    /// Ordinary pageable memory (or a range only partly known to the driver).
    Pageable,
    /// Page-locked (allocated pinned or registered): the driver copies it by DMA directly,
    /// and its synchronous copies to the device are complete when they return.
    Pinned,
    /// Managed memory (or any other driver memory): copied by DMA directly, but a
    /// synchronous copy may return before it has landed.
    Managed,
}

/// How the driver can copy `bytes > 0` bytes at `host`: pinned, registered or managed
/// memory covering the whole range, or pageable. The transfers' routing test.
pub(crate) fn host_dma(host: *const u8, bytes: usize) -> Result<HostDma> {
    let class = |l: Location| match l {
        Location::PageableHost => HostDma::Pageable,
        Location::PinnedHost => HostDma::Pinned,
        _ => HostDma::Managed,
    };
    if bytes == 0 {
        return Ok(HostDma::Pinned);
    }
    let start = host as usize as u64;
    let head = pointer::attributes(start as CUdeviceptr)?;
    if !head.location.is_dma_ready() {
        return Ok(HostDma::Pageable);
    }
    let end = start.saturating_add(bytes as u64);
    if let Some((range_start, range_len)) = head.range {
        if range_start <= start && end <= range_start.saturating_add(range_len as u64) {
            return Ok(class(head.location));
        }
    }
    let tail = pointer::attributes((end - 1) as CUdeviceptr)?;
    Ok(if tail.location.is_dma_ready() {
        class(head.location).max_wait(class(tail.location))
    } else {
        HostDma::Pageable
    })
}

impl HostDma {
    /// Of two driver-memory classes, the one that needs the landing wait.
    fn max_wait(self, other: HostDma) -> HostDma {
        if self == HostDma::Pinned {
            other
        } else {
            self
        }
    }
}
