//! [`PoolError`], the crate's one error type.
//!
//! # Across crates
//!
//! `PoolError` converts into `cudars_core::Error` (as `cudars_core::Error::Crate`, displaying the
//! same, with the same `source` chain and the `CUresult` of a driver failure in
//! `cudars_core::Error::driver`), as `cudars_xfer::Error` and `cudars_graph::Error` do. So one
//! function can use `?` on all four crates by returning `cudars_core::Result`; no crate of
//! the workspace depends on a sibling for it (`cudars_core::error` explains the choice).
//!
//! ```no_run
//! use cudars_core::{Device, DevicePtr, Stream};
//! use cudars_mempool::{DevicePool, PoolError};
//! use std::sync::Arc;
//!
//! // `?` on cuda-core and cuda-mempool calls alike (cuda-xfer and cuda-graph too: see the
//! // example in `cudars_graph::error`, which chains all four).
//! fn zeroed(pool: &Arc<DevicePool>, bytes: usize) -> cudars_core::Result<DevicePtr> {
//!     let dev = Device::new(0)?;                                     // cuda-core
//!     let stream = Stream::new(&dev)?;
//!     let block: DevicePtr = pool.malloc_shared(&stream, bytes)?.into(); // cuda-mempool
//!     block.memset_async(0, &stream)?;
//!     stream.synchronize()?;
//!     Ok(block)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = Arc::new(DevicePool::new_driver()?);
//! match zeroed(&pool, 1 << 40) {
//!     Ok(_) => {}
//!     Err(e) => {
//!         // The pool's own error is still there, and so is the driver's code.
//!         if let Some(PoolError::OutOfMemory { cause, .. }) = e.downcast_ref::<PoolError>() {
//!             eprintln!("out of memory: {cause}");
//!         }
//!         if let Some(driver) = e.driver() {
//!             eprintln!("CUresult {}", driver.code);
//!         }
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use crate::device_id::DeviceId;

/// A limit printed for humans: a byte count, or "none".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitDisplay(pub Option<u64>);

impl std::fmt::Display for LimitDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(bytes) => write!(f, "{bytes} bytes"),
            None => f.write_str("none"),
        }
    }
}

/// What ran out when a request failed with [`PoolError::OutOfMemory`]. Non-exhaustive: a
/// pool that learns to tell another cause apart adds a variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OomCause {
    /// The device's limit ([`MemoryPool::set_limit`](crate::MemoryPool::set_limit)) cannot
    /// take the request.
    Limit,
    /// The device has no more memory (or the request is larger than the device).
    DeviceMemory,
    /// No address range could be reserved for the request (virtual-memory segments).
    AddressSpace,
}

impl std::fmt::Display for OomCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OomCause::Limit => "limit reached",
            OomCause::DeviceMemory => "device memory exhausted",
            OomCause::AddressSpace => "address space exhausted",
        })
    }
}

/// Everything that can go wrong in the pool. Every failing call leaves the pool as it
/// was before the call, except that cached memory may have been released: a failed
/// allocation gives back whatever it reserved or mapped while trying.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A `cuda-core` call outside the [`Backend`](crate::Backend) failed (an event, a
    /// stream, a capture query, IPC): the error as `cuda-core` gave it.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// An allocation on a stream that is being captured into a CUDA graph: the graph would
    /// keep using the block after it is freed and handed to someone else. Allocate before
    /// the capture, or use `AsyncPool`, whose allocations become graph memory nodes.
    #[error("stream {handle:#x} is being captured into a CUDA graph: MemoryPool does not allocate during capture (use AsyncPool, or allocate before capturing)")]
    CaptureInProgress {
        /// The capturing stream's raw handle (`CUstream` as an integer; not a stream key).
        handle: u64,
    },
    /// The per-thread default stream used where it cannot be ordered: it names a different
    /// stream on every thread, so a block cannot be marked with another thread's (or for
    /// another block's) per-thread stream, and a C allocator's block cannot live on it. The
    /// pool itself serves the per-thread stream with a cache per thread.
    #[error("the per-thread default stream names a different stream on every thread: it cannot order this use (mark blocks with it only on their own thread, or use a created stream)")]
    PerThreadStream,
    /// The request could not be served even after releasing every cached block the
    /// pool could release.
    #[error(
        "out of memory on device {device} ({cause}): requested {requested} bytes with {used} \
         bytes in use, {reserved} bytes reserved, limit {limit}",
        limit = LimitDisplay(*limit)
    )]
    OutOfMemory {
        /// The device.
        device: DeviceId,
        /// The size asked for, before rounding.
        requested: usize,
        /// Bytes in live blocks on the device (rounded sizes).
        used: u64,
        /// Physical bytes the pool holds on the device after its attempts.
        reserved: u64,
        /// The device's limit, if one is set.
        limit: Option<u64>,
        /// What ran out.
        cause: OomCause,
    },

    /// `set_limit` was asked for less than the live blocks need. Nothing was changed.
    #[error(
        "limit of {limit} bytes on device {device} is below what is in use: live blocks use \
         {used} bytes and need {in_use} bytes of physical memory"
    )]
    LimitBelowUsage {
        /// The device.
        device: DeviceId,
        /// The limit asked for, in bytes.
        limit: u64,
        /// Bytes in live blocks (rounded sizes).
        used: u64,
        /// Physical bytes the live blocks occupy (whole pages or whole segments).
        in_use: u64,
    },

    /// A limit that is not a byte count or a fraction in `[0, 1]`, or an unparsable
    /// limit string.
    #[error("invalid limit: {0}")]
    InvalidLimit(String),

    /// The size, rounded up to the pool's unit, does not fit in 64 bits.
    #[error("requested size {size} bytes overflows when rounded up")]
    SizeOverflow {
        /// The size asked for.
        size: usize,
    },

    /// The device id is not one the backend reported.
    #[error("device {device} does not exist: the pool serves {count} devices")]
    InvalidDevice {
        /// The id passed in.
        device: DeviceId,
        /// How many devices the pool serves.
        count: usize,
    },

    /// A raw allocation handed to [`MemoryPool::free_raw`](crate::MemoryPool::free_raw)
    /// that is not live in this pool (already freed, or from another pool).
    #[error("allocation at {ptr:#x} is not live in this pool")]
    InvalidHandle {
        /// The address of the handle.
        ptr: u64,
    },

    /// A block that cannot be shared with another process (a pool with virtual-memory
    /// segments, an empty block): see `cudars_mempool::ipc`.
    #[error("pool block cannot be exported: {reason}")]
    NotExportable {
        /// Why.
        reason: String,
    },

    /// A private pool id reserved for graph captures
    /// ([`PrivatePoolId::CAPTURE_BIT`](crate::PrivatePoolId::CAPTURE_BIT)) handed to a
    /// public private-pool call: only the capture's own allocations use or hold that pool.
    #[error("private pool {pool:#x} belongs to a graph capture: only the capture allocates from or holds it")]
    CapturePrivatePool {
        /// The id passed in.
        pool: u64,
    },

    /// `ExportedBlock::release_after` was given an event that is not interprocess, so not
    /// one the importer recorded (see `cudars_mempool::ipc`). The block stays out of reuse.
    #[error("release_after needs the importer's interprocess event (opened with Event::open_ipc); the block was not released")]
    NotInterprocessEvent,

    /// The backend failed (a driver error for the driver backend).
    #[error("backend call {op} failed: {source}")]
    Backend {
        /// The method that failed, by its name in its trait and nothing else: a
        /// [`Backend`](crate::Backend) method (`record_fence`, `create_physical`, `map_run`,
        /// ...), or `alloc` for a [`PinnedAllocator`](crate::pinned::PinnedAllocator) that returned
        /// less than it was asked for. Never a driver entry point (the driver's error in
        /// `source` names that), a Rust path or free text. A `cuda-core` call made outside
        /// the traits fails as [`PoolError::Cuda`] instead.
        op: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl PoolError {
    /// The driver error at the root of this one, if any (a [`PoolError::Backend`] failure of
    /// the driver backend): its `CUresult` is `DriverError::result`.
    pub fn driver(&self) -> Option<&cudars_core::DriverError> {
        let source = match self {
            PoolError::Cuda(e) => return e.driver(),
            PoolError::Backend { source, .. } => source,
            _ => return None,
        };
        if let Some(core) = source.downcast_ref::<cudars_core::Error>() {
            return core.driver();
        }
        source.downcast_ref::<cudars_core::DriverError>()
    }

    /// `true` when the device's context is lost ([`cudars_core::Error::ContextLost`], or a
    /// sticky driver error, as this error or at the root of a backend failure): the pool
    /// hands out none of its memory until the device is reset.
    pub fn is_context_lost(&self) -> bool {
        match self {
            PoolError::Cuda(e) => e.is_context_lost(),
            PoolError::Backend { source, .. } => {
                if let Some(core) = source.downcast_ref::<cudars_core::Error>() {
                    return core.is_context_lost();
                }
                source
                    .downcast_ref::<cudars_core::DriverError>()
                    .is_some_and(|d| cudars_core::health::is_sticky(d.result()))
            }
            _ => false,
        }
    }

    /// Wraps a backend error, naming the backend method that failed.
    pub(crate) fn backend<E: std::error::Error + Send + Sync + 'static>(
        op: &'static str,
    ) -> impl FnOnce(E) -> PoolError {
        move |e| PoolError::Backend {
            op,
            source: Box::new(e),
        }
    }
}

/// The result of the pool's fallible calls.
pub type Result<T, E = PoolError> = std::result::Result<T, E>;

impl From<PoolError> for cudars_core::Error {
    /// Carries the pool's error as `cudars_core::Error::Crate` (see the module documentation);
    /// a wrapped `cuda-core` error ([`PoolError::Cuda`]) comes back as itself.
    fn from(error: PoolError) -> Self {
        if let PoolError::Cuda(e) = error {
            return e;
        }
        let driver = error.driver().copied();
        cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-mempool", error, driver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_context_is_recognised_however_it_is_wrapped() {
        let sticky = cudars_core::DriverError {
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS",
            message: "an illegal memory access was encountered",
            call: "cuStreamQuery",
        };
        let oom = cudars_core::DriverError {
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            message: "out of memory",
            call: "cuMemCreate",
        };
        let lost = || cudars_core::Error::ContextLost {
            device: 0,
            first: Some(Box::new(sticky)),
        };
        assert!(PoolError::Cuda(lost()).is_context_lost());
        assert!(PoolError::Cuda(cudars_core::Error::Driver(sticky)).is_context_lost());
        for (source, expect) in [
            (
                Box::new(lost()) as Box<dyn std::error::Error + Send + Sync>,
                true,
            ),
            (Box::new(sticky), true),
            (Box::new(cudars_core::Error::Driver(oom)), false),
            (Box::new(oom), false),
        ] {
            let e = PoolError::Backend {
                op: "create_physical",
                source,
            };
            assert_eq!(e.is_context_lost(), expect, "{e}");
        }
        assert!(!PoolError::Cuda(cudars_core::Error::Driver(oom)).is_context_lost());
        assert!(!PoolError::PerThreadStream.is_context_lost());
    }

    #[test]
    fn converts_into_cuda_core_error_keeping_source_and_driver_code() {
        let driver = cudars_core::DriverError {
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            message: "out of memory",
            call: "cuMemCreate",
        };
        let pool = PoolError::Backend {
            op: "create_physical",
            source: Box::new(cudars_core::Error::Driver(driver)),
        };
        let text = pool.to_string();
        let core: cudars_core::Error = pool.into();
        assert_eq!(core.to_string(), text);
        assert_eq!(core.driver(), Some(&driver));
        assert!(matches!(
            core.downcast_ref::<PoolError>(),
            Some(PoolError::Backend {
                op: "create_physical",
                ..
            })
        ));
        let source = std::error::Error::source(&core).map(ToString::to_string);
        assert_eq!(source, Some(cudars_core::Error::Driver(driver).to_string()));

        let oom: cudars_core::Error = PoolError::OutOfMemory {
            device: DeviceId(0),
            requested: 1,
            used: 0,
            reserved: 0,
            limit: Some(0),
            cause: OomCause::Limit,
        }
        .into();
        assert!(oom.driver().is_none());
        assert!(matches!(
            oom.downcast_ref::<PoolError>(),
            Some(PoolError::OutOfMemory {
                cause: OomCause::Limit,
                ..
            })
        ));
    }
}
