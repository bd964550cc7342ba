//! [`AsyncPool`]: a policy layer over the driver's stream-ordered allocator
//! (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`), CuPy's `MemoryAsyncPool`.
//!
//! The driver's release threshold defaults to 0, which returns every cached byte to the
//! device at each synchronisation, so the first allocation after a sync pays for a fresh
//! mapping (130 µs to 2.4 ms). An `AsyncPool` sets the threshold to its limit, or to
//! `u64::MAX` without one, so memory stays cached until [`AsyncPool::free_all_blocks`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudars_core::async_pool::{MemPool, StreamOrderedMemory};
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};

use crate::backend::DeviceId;
use crate::error::PoolError;
use crate::pool::Limit;

/// Which driver pool an [`AsyncPool`] allocates from (CuPy's `pool_handles`).
#[derive(Debug)]
pub enum AsyncPoolSource {
    /// The device's current pool (`cuDeviceGetMemPool`, CuPy's `'current'`).
    Current,
    /// The device's default pool (`cuDeviceGetDefaultMemPool`, CuPy's `'default'`).
    Default,
    /// A new pool owned by the `AsyncPool`, holding at most `max_size` bytes when given.
    New {
        /// The pool's maximum size in bytes (`CUmemPoolProps::maxSize`), if any.
        max_size: Option<usize>,
    },
    /// An existing pool (for example from [`MemPool::from_raw`]).
    Handle(MemPool),
}

/// A stream-ordered pool of one device over a driver memory pool: CuPy's
/// `MemoryAsyncPool`. Allocations are [`StreamOrderedMemory`] (freed on their stream when
/// dropped), which converts into `cudars_core`'s `DevicePtr` view.
///
/// `Send` and `Sync`: a pool handle and atomics.
///
/// ```no_run
/// use std::sync::Arc;
/// use cudars_core::{Device, Stream};
/// use cudars_mempool::async_pool::{AsyncPool, AsyncPoolSource};
///
/// let dev = Device::new(0)?;
/// let pool = AsyncPool::new(&dev, AsyncPoolSource::New { max_size: None })?;
/// let stream = Arc::new(Stream::new(&dev)?);
/// let block = pool.malloc(&stream, 1 << 20)?;
/// assert!(pool.used_bytes()? >= 1 << 20);
/// drop(block);
/// pool.free_all_blocks()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AsyncPool {
    pool: MemPool,
    device: Device,
    /// The limit in bytes; `u64::MAX` for none.
    limit: AtomicU64,
}

impl AsyncPool {
    /// An async pool on `device` over the pool `source` names. Sets the pool's release
    /// threshold to `u64::MAX` (see the [module documentation](self)).
    pub fn new(device: &Device, source: AsyncPoolSource) -> Result<AsyncPool, PoolError> {
        // The driver and the device decide, before any pool call (cudars_core::features).
        cudars_core::features::require(device, cudars_core::Feature::StreamOrderedAllocation)
            .map_err(PoolError::Cuda)?;
        let pool = match source {
            AsyncPoolSource::Current => MemPool::current(device),
            AsyncPoolSource::Default => MemPool::default_for(device),
            AsyncPoolSource::New { max_size } => MemPool::new(device, max_size),
            AsyncPoolSource::Handle(p) => {
                if p.device() != *device {
                    return Err(PoolError::InvalidDevice {
                        device: DeviceId(p.device().ordinal() as u32),
                        count: 1,
                    });
                }
                Ok(p)
            }
        }
        .map_err(PoolError::Cuda)?;
        pool.set_release_threshold(u64::MAX)
            .map_err(PoolError::Cuda)?;
        Ok(AsyncPool {
            pool,
            device: *device,
            limit: AtomicU64::new(u64::MAX),
        })
    }

    /// The driver pool.
    pub fn mem_pool(&self) -> &MemPool {
        &self.pool
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Allocates `size` bytes ordered on `stream` (which must belong to the pool's device).
    /// Size 0 gives an empty allocation without a driver call. Beyond the limit, or when the
    /// driver is out of memory, fails with [`PoolError::OutOfMemory`].
    pub fn malloc(
        &self,
        stream: &Arc<Stream>,
        size: usize,
    ) -> Result<StreamOrderedMemory, PoolError> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit != u64::MAX && size != 0 {
            let used = self.used_bytes()?;
            if used.saturating_add(size as u64) > limit {
                return Err(self.oom(size, Some(limit)));
            }
        }
        match StreamOrderedMemory::from_pool(&self.pool, size, stream) {
            Ok(m) => Ok(m),
            Err(e) if e.is_out_of_memory() => {
                Err(self.oom(size, (limit != u64::MAX).then_some(limit)))
            }
            Err(e) => Err(PoolError::Cuda(e)),
        }
    }

    /// As [`malloc`](Self::malloc), as a `cudars_core` `DevicePtr` view.
    pub fn malloc_ptr(&self, stream: &Arc<Stream>, size: usize) -> Result<DevicePtr, PoolError> {
        Ok(self.malloc(stream, size)?.into())
    }

    fn oom(&self, size: usize, limit: Option<u64>) -> PoolError {
        PoolError::OutOfMemory {
            cause: crate::OomCause::DeviceMemory,
            device: DeviceId(self.device.ordinal() as u32),
            requested: size,
            used: self.used_bytes().unwrap_or(0),
            reserved: self.total_bytes().unwrap_or(0),
            limit,
        }
    }

    /// Caps the bytes in use (a byte count or a fraction of the device's memory); the
    /// release threshold follows the limit, so the pool caches at most that much.
    pub fn set_limit(&self, limit: Limit) -> Result<(), PoolError> {
        let total = self.device.total_memory().map_err(PoolError::Cuda)?;
        let bytes = limit.resolve(total)?.map_or(u64::MAX, |b| b as u64);
        self.pool
            .set_release_threshold(bytes)
            .map_err(PoolError::Cuda)?;
        self.limit.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The limit in bytes, if one is set.
    pub fn get_limit(&self) -> Option<usize> {
        let l = self.limit.load(Ordering::Relaxed);
        (l != u64::MAX).then_some(l as usize)
    }

    /// Synchronises the device and returns every cached byte (`cuMemPoolTrimTo(0)`).
    pub fn free_all_blocks(&self) -> Result<(), PoolError> {
        self.device.synchronize().map_err(PoolError::Cuda)?;
        self.pool.trim_to(0).map_err(PoolError::Cuda)
    }

    /// Bytes handed out and not yet freed (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub fn used_bytes(&self) -> Result<u64, PoolError> {
        self.pool.used_current().map_err(PoolError::Cuda)
    }

    /// Bytes the pool holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn total_bytes(&self) -> Result<u64, PoolError> {
        self.pool.reserved_current().map_err(PoolError::Cuda)
    }

    /// Bytes held but not in use: `total_bytes - used_bytes`.
    pub fn free_bytes(&self) -> Result<u64, PoolError> {
        Ok(self.total_bytes()?.saturating_sub(self.used_bytes()?))
    }
}
