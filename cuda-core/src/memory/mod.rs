//! Device, managed and pinned memory, and views into device memory.
//!
//! | type | what | CuPy |
//! | --- | --- | --- |
//! | [`DeviceMemory`] | `cuMemAlloc` / `cuMemFree` | `Memory` |
//! | [`ManagedMemory`] | `cuMemAllocManaged`, prefetch, advise | `ManagedMemory` |
//! | [`UnownedMemory`] | a foreign device pointer and a keep-alive owner | `UnownedMemory` |
//! | [`PinnedMemory`] | `cuMemHostAlloc` (portable / mapped / write-combined) | `PinnedMemory` |
//! | [`HostRegistration`] | `cuMemHostRegister` of an existing buffer | (`cudaHostRegister`) |
//! | [`DevicePtr`] | shared owner + offset + length: copies and memsets | `MemoryPointer` |
//! | [`DeviceAlloc`] | what every owner of device memory implements | (`BaseMemory`) |
//! | [`Handover`] | orders every use of reused memory after its earlier owner's work | |
//! | [`raw`] | `unsafe` copies and memsets on raw addresses | (`cupy.cuda.runtime`) |
//!
//! Every owner is RAII: the memory is returned to the driver when the owner drops. A size of
//! 0 gives an empty allocation (null address) without calling the driver, as CuPy does.
//!
//! [`DevicePtr`] is the one view type over any [`DeviceAlloc`]: device, managed, unowned and
//! stream-ordered memory here, and the blocks of the pools in `cuda-mempool`, which implement
//! [`DeviceAlloc`] for their own block type.
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device};
//!
//! let dev = Device::new(0)?;
//! let buf = DevicePtr::alloc(&dev, 1024)?;
//! buf.copy_from_host(&[7u8; 1024])?;
//! let tail = buf.slice(512..)?; // a sub-view sharing the allocation
//! tail.memset(0)?;
//! let mut host = vec![0u8; 1024];
//! buf.copy_to_host(&mut host)?;
//! assert_eq!(&host[..512], &[7u8; 512][..]);
//! assert_eq!(&host[512..], &[0u8; 512][..]);
//! # Ok::<(), cudars_core::Error>(())
//! ```

use cudars_sys::{CUdeviceptr, CUmemLocation, CUmemLocationType};

use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::Device;

mod device;
mod handover;
mod managed;
mod pinned;
pub mod raw;
mod view;

pub use device::{DeviceMemory, UnownedMemory};
pub use handover::Handover;
pub use managed::{Advice, AttachFlags, ManagedMemory};
pub use pinned::{HostBuffer, HostRegistration, PinnedFlags, PinnedMemory, RegisterFlags};
pub use view::DevicePtr;

/// An owner of a contiguous range of device-accessible memory: what a [`DevicePtr`] view
/// holds (through an `Arc`) to keep the memory alive.
///
/// Implemented by [`DeviceMemory`], [`ManagedMemory`], [`UnownedMemory`] and
/// [`StreamOrderedMemory`](crate::async_pool::StreamOrderedMemory); memory pools implement it
/// for their blocks so they can hand out the same [`DevicePtr`] views.
///
/// # Safety
///
/// Implementors promise, for as long as the value lives:
/// - `as_raw()..as_raw() + size()` is one range of memory that the driver's copy and memset
///   calls may read and write on [`device`](DeviceAlloc::device) (device or managed memory of
///   that device's context, or memory mapped for it), and no Rust reference (`&[u8]`,
///   `&mut [u8]`) to host memory aliases it;
/// - `device()`, `as_raw()` and `size()` always return the same values;
/// - `size() == 0` is allowed (then `as_raw()` may be 0);
/// - if dropping the value gives the memory back without waiting for all device work that
///   uses it (a stream-ordered free, a pool that reuses blocks by stream order),
///   [`record_stream`](DeviceAlloc::record_stream) makes that free, and any reuse of the
///   memory, wait for the work issued to the given stream before the drop. The default does
///   nothing, which is right only for memory whose free waits for every device that used
///   it (`cuMemFree`, for its own device's streams);
/// - if the memory may still be used by an earlier owner's work when the value is made (a
///   block reused in stream order), [`record_stream`](DeviceAlloc::record_stream) also
///   orders the given stream after that work, and
///   [`prepare_synchronous_use`](DeviceAlloc::prepare_synchronous_use) makes the host wait
///   for it ([`Handover`] does both). The defaults do nothing, which is right only for
///   memory that no earlier owner's work can touch.
///
/// Views write through `&self`: device memory is not Rust memory, and every access to it goes
/// through the driver.
pub unsafe trait DeviceAlloc: Send + Sync {
    /// The device whose context the memory belongs to.
    fn device(&self) -> Device;
    /// The first address of the range.
    fn as_raw(&self) -> CUdeviceptr;
    /// Length of the range in bytes.
    fn size(&self) -> usize;
    /// Notes that work issued to `stream` uses the memory (PyTorch's `record_stream`), so
    /// that the memory is not freed or reused before that work is done. Every safe
    /// asynchronous operation of a [`DevicePtr`] calls it before it issues work, and
    /// [`DevicePtr::record_stream`] calls it on demand. An error means the use could not be
    /// recorded: the operation is then not issued.
    ///
    /// It also orders `stream` after any work of the memory's earlier owners (a reused pool
    /// block, see [`Handover`]), so the use comes after it.
    ///
    /// The default does nothing: right for memory whose free waits for the device and that
    /// no earlier owner's work can touch.
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// Blocks the host until no earlier owner's work can touch the memory any more: every
    /// synchronous operation of a [`DevicePtr`] calls it before it issues (synchronous calls
    /// run on the legacy default stream, which the memory's allocation stream need not
    /// order). An error means the wait could not be made: the operation is then not issued.
    ///
    /// The default does nothing: right for memory that no earlier owner's work can touch.
    fn prepare_synchronous_use(&self) -> Result<()> {
        Ok(())
    }
}

/// Where memory lives, or where it should go: the workspace's one classification of memory
/// places (re-exported as `cudars_core::Location` and by `cuda-xfer`).
///
/// * As an answer ([`pointer::locate`](crate::pointer::locate), `cudars_xfer::locate`): which
///   device's memory, page-locked or pageable host memory, or managed memory.
/// * As a target (prefetch and advice of managed memory, `cuMemLocation`): a device, or the
///   host, named by either host variant ([`Location::HOST`] reads best); [`Location::Managed`]
///   is no place and is refused with [`Error::InvalidArgument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Device memory (`cuMemAlloc`, pools, virtual memory) of this device.
    Device(Device),
    /// Page-locked host memory: allocated by `cuMemHostAlloc`/`cuMemAllocHost` or registered
    /// with `cuMemHostRegister`. The driver copies it by DMA directly.
    PinnedHost,
    /// Memory the driver does not know: ordinary (pageable) host memory such as a `Vec`, the
    /// stack or a file mapping, or any address CUDA did not hand out. Large copies of it are
    /// staged through pinned buffers.
    PageableHost,
    /// Managed (unified) memory from `cuMemAllocManaged`, addressable by host and devices.
    Managed,
}

impl Location {
    /// The host as a prefetch or advice target (`CU_MEM_LOCATION_TYPE_HOST`).
    pub const HOST: Location = Location::PageableHost;

    /// `true` for device memory (CuPy's `get_array_module` would answer `cupy`).
    pub fn is_device(self) -> bool {
        matches!(self, Location::Device(_))
    }

    /// `true` for memory the host can address directly (pinned, managed or pageable host).
    pub fn is_host_accessible(self) -> bool {
        !self.is_device()
    }

    /// `true` for memory the driver copies by DMA without staging (device, pinned, managed).
    pub fn is_dma_ready(self) -> bool {
        !matches!(self, Location::PageableHost)
    }

    /// The driver's `CUmemLocation` for this target; [`Error::InvalidArgument`] for
    /// [`Location::Managed`], which is no place.
    pub fn to_raw(self) -> Result<CUmemLocation> {
        match self {
            Location::Device(dev) => Ok(device_location(dev)),
            Location::PinnedHost | Location::PageableHost => Ok(cudars_sys::compat::mem_location(
                cudars_sys::compat::MEM_LOCATION_TYPE_HOST,
                0,
            )),
            Location::Managed => Err(Error::InvalidArgument(
                "managed memory is no prefetch or advice target: name a device or the host".into(),
            )),
        }
    }
}

/// The `CUmemLocation` of `device`'s memory.
pub(crate) fn device_location(device: Device) -> CUmemLocation {
    cudars_sys::compat::mem_location(
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        device.ordinal() as i32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudars_sys::CUmem_advise;

    #[test]
    fn flags_combine_and_test() {
        let f = PinnedFlags::PORTABLE | PinnedFlags::DEVICE_MAP;
        assert!(f.contains(PinnedFlags::PORTABLE) && f.contains(PinnedFlags::DEVICE_MAP));
        assert!(!f.contains(PinnedFlags::WRITE_COMBINED));
        assert!(f.contains(PinnedFlags::NONE));
        assert_eq!(
            f.0,
            cudars_sys::CU_MEMHOSTALLOC_PORTABLE | cudars_sys::CU_MEMHOSTALLOC_DEVICEMAP
        );
        let r = RegisterFlags::READ_ONLY | RegisterFlags::DEVICE_MAP;
        assert!(r.contains(RegisterFlags::READ_ONLY) && !r.contains(RegisterFlags::PORTABLE));
        assert_eq!(AttachFlags::default(), AttachFlags::GLOBAL);
        assert_ne!(AttachFlags::GLOBAL, AttachFlags::HOST);
    }

    #[test]
    fn host_location_maps_to_the_driver_type() {
        for host in [Location::HOST, Location::PinnedHost, Location::PageableHost] {
            let host = host.to_raw().unwrap();
            assert_eq!(host.type_, cudars_sys::compat::MEM_LOCATION_TYPE_HOST);
        }
        assert!(matches!(
            Location::Managed.to_raw(),
            Err(Error::InvalidArgument(_))
        ));
        let dev = Location::Device(Device::test_only(1)).to_raw().unwrap();
        assert_eq!(dev.type_, CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
        // SAFETY: `mem_location` initialised the id.
        assert_eq!(unsafe { cudars_sys::compat::mem_location_id(&dev) }, 1);
        assert_eq!(
            Advice::SetPreferredLocation.to_raw(),
            CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION
        );
        assert_eq!(
            Advice::UnsetAccessedBy.to_raw(),
            CUmem_advise::CU_MEM_ADVISE_UNSET_ACCESSED_BY
        );
    }
}
