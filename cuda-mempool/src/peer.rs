//! Pools on several GPUs: access to one device's pool blocks from another device.
//!
//! One [`MemoryPool`] serves every device, with per-device limits
//! ([`MemoryPool::set_limit`]) and statistics ([`MemoryPool::stats`]). A kernel on device A
//! may use a block of device B once A has access to it:
//!
//! * virtual-memory segments: `cuMemSetAccess` for A on the pages under the block. The
//!   grant lives as long as those pages stay mapped, that is while the block (or another
//!   block on the same pages) lives; a page the pool unmaps and maps again later is
//!   accessible to its own device only, so grant access for each block that needs it;
//! * plain segments: peer access of A's context to B's (`cuCtxEnablePeerAccess`), which
//!   covers every allocation of B.
//!
//! What the pool does not do: grant peers access to every future segment automatically.

use cudars_core::memory::DevicePtr;
use cudars_core::vmm::{self, Granularity};
use cudars_core::Device;

use crate::driver::{device_id, DriverBackend};
use crate::error::PoolError;
use crate::pool::MemoryPool;

impl MemoryPool<DriverBackend> {
    /// Lets `peer` read and write `block` (a view of a block of this pool on another
    /// device), as the [module documentation](self) says. `peer` equal to the block's
    /// device does nothing. Devices without peer access to each other are
    /// `PoolError::Backend` with `cudars_core::Error::InvalidArgument`.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use cudars_core::{memory::DevicePtr, Device, Stream};
    /// use cudars_mempool::DevicePool;
    /// let (d0, d1) = (Device::new(0)?, Device::new(1)?);
    /// let pool = Arc::new(DevicePool::new_driver()?);
    /// let on_d1: DevicePtr = pool.malloc_shared(&Stream::new(&d1)?, 1 << 20)?.into();
    /// pool.grant_peer_access(&on_d1, &d0)?; // a kernel on d0 may now use on_d1
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grant_peer_access(&self, block: &DevicePtr, peer: &Device) -> Result<(), PoolError> {
        let owner = block.device();
        if *peer == owner || block.is_empty() {
            return Ok(());
        }
        let fail = PoolError::backend;
        if !peer
            .can_access_peer(&owner)
            .map_err(fail("cuDeviceCanAccessPeer"))?
        {
            return Err(fail("cuDeviceCanAccessPeer")(
                cudars_core::Error::InvalidArgument(format!(
                    "device {} has no peer access to device {}",
                    peer.ordinal(),
                    owner.ordinal()
                )),
            ));
        }
        if self.uses_virtual_memory(device_id(&owner))? {
            let page = vmm::granularity(&owner, Granularity::Minimum)
                .map_err(fail("cuMemGetAllocationGranularity"))?
                .max(1) as u64;
            let start = block.as_raw() / page * page;
            let end = (block.as_raw() + block.len() as u64).div_ceil(page) * page;
            vmm::set_access(start, (end - start) as usize, peer).map_err(fail("cuMemSetAccess"))
        } else {
            peer.enable_peer_access(&owner)
                .map_err(fail("cuCtxEnablePeerAccess"))
        }
    }
}
