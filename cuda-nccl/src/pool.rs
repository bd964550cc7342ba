//! A memory pool whose segments are registered with a communicator (feature `mempool`):
//! what PyTorch gives with a `torch.cuda.MemPool` of the NCCL backend's allocator registered
//! through `ProcessGroupNCCL.register_mem_pool`.
//!
//! [`Communicator::registered_pool`] makes a [`DevicePool`]
//! whose plain segments are shareable virtual memory ([`register::alloc`](crate::register::alloc)),
//! each registered with the communicator (`ncclCommRegister`) as the pool makes it, and
//! deregistered (`ncclCommDeregister`) before the pool frees it, on every path that frees a
//! segment: a trim (`free_all_blocks`, a limit), out-of-memory recovery, the pool's drop.
//! Collectives on its blocks take NCCL's zero-copy path. Segments of other devices than the
//! communicator's are shareable memory, not registered.
//!
//! The pool may make or free a segment on any thread, and NCCL's calls on a communicator are
//! not thread-safe: every NCCL call that reads or changes the communicator's state (its
//! collectives and their settling, the end of a group that uses it, registrations, split,
//! destroy, abort) takes the communicator's call lock, and so do the pool's registrations.
//! The one call left outside is the polling of `ncclCommGetAsyncError`, which NCCL lets any
//! thread make (PyTorch's watchdog does). A segment is freed only once every piece of work on its
//! blocks has completed (the pool's fences), so the deregistration never unmaps what a
//! running kernel reads.
//!
//! When the communicator is destroyed or aborted, NCCL drops every registration with it; the
//! pool goes on serving (its segments are then plain shareable memory) and frees its segments
//! without calling NCCL.
//!
//! ```no_run
//! use cudars_core::Stream;
//! use cudars_nccl::{CommConfig, Communicator, ReduceOp};
//!
//! let (comm, _job) = Communicator::from_env(&CommConfig::default())?;
//! let stream = Stream::new(&comm.device())?;
//! let (pool, _segments) = comm.registered_pool()?;
//! let grads: cudars_core::DevicePtr = pool.malloc_shared(&stream, 4 << 20)?.into();
//! comm.all_reduce_in_place::<f32>(&grads, 1 << 20, ReduceOp::Sum, &stream)?;
//! comm.wait(&stream, std::time::Duration::from_secs(60))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::{Device, DevicePtr};
use cudars_mempool::{DevicePool, SegmentSource};

use crate::comm::Communicator;
use crate::error::{library, Error, Result};
use crate::register::Registry;

/// The [`SegmentSource`] of [`Communicator::registered_pool`]: shareable memory, registered
/// with one communicator on its device.
pub struct RegisteredSegments {
    device: Device,
    /// The communicator's handle; used only under its call lock while the registry is open.
    raw: usize,
    registry: Arc<Registry>,
    /// Live segments by address: the memory and NCCL's handle (0: not registered).
    segments: Mutex<HashMap<u64, (DevicePtr, usize)>>,
}

impl fmt::Debug for RegisteredSegments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredSegments")
            .field("device", &self.device.ordinal())
            .field("segments", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl RegisteredSegments {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (DevicePtr, usize)>> {
        self.segments.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many live segments are registered with the communicator.
    pub fn registered(&self) -> usize {
        self.lock().values().filter(|(_, h)| *h != 0).count()
    }

    /// How many live segments the source holds.
    pub fn segments(&self) -> usize {
        self.lock().len()
    }

    /// `ncclCommDeregister` under the call lock; nothing when the communicator is gone.
    /// `false` when NCCL refused (the memory must then be kept).
    fn deregister(&self, handle: usize) -> bool {
        if handle == 0 {
            return true;
        }
        let Ok(nccl) = library() else { return false };
        let _calls = self.registry.lock_calls();
        if self.registry.is_closed() {
            return true;
        }
        let Ok(_held) = cudars_core::health::hold(&self.device) else {
            return false;
        };
        let Ok(_bound) = self.device.scope() else {
            return false;
        };
        // SAFETY: the communicator is live (its registry is open, and it closes only under
        // the call lock we hold) and no other NCCL call on it runs (the call lock); `handle`
        // came from ncclCommRegister on it and is deregistered once; the pool's contract
        // says no work uses the segment any more, so nothing reads what NCCL unmaps.
        let r = unsafe {
            nccl.ncclCommDeregister(
                self.raw as cudars_nccl_sys::ncclComm_t,
                handle as *mut c_void,
            )
        };
        matches!(r, Ok(code) if code.is_success())
    }
}

fn to_core(e: Error) -> cudars_core::Error {
    match e {
        Error::Cuda(e) => e,
        other => {
            cudars_core::Error::InvalidArgument(format!("registering a pool segment: {other}"))
        }
    }
}

// SAFETY: every segment is `size` bytes (or more, rounded to the granularity) of shareable
// device memory of `device` from `SharedMapping`, distinct from every other live
// allocation, kept in `segments` until `deallocate` (the map owns the only view); freed by
// dropping that view, after NCCL's deregistration.
unsafe impl SegmentSource for RegisteredSegments {
    fn allocate(&self, device: &Device, size: usize) -> cudars_core::Result<Option<u64>> {
        let mem = match crate::register::alloc(device, size) {
            Ok(m) => m,
            Err(Error::Cuda(e)) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(to_core(e)),
        };
        let handle = if device.ordinal() == self.device.ordinal() {
            crate::register::register_raw(
                &self.registry,
                self.raw as cudars_nccl_sys::ncclComm_t,
                &self.device,
                &mem,
            )
            .map_err(to_core)?
        } else {
            0
        };
        let addr = mem.as_raw();
        self.lock().insert(addr, (mem, handle));
        Ok(Some(addr))
    }

    unsafe fn deallocate(
        &self,
        _device: &Device,
        addr: u64,
        _size: usize,
    ) -> cudars_core::Result<()> {
        let Some((mem, handle)) = self.lock().remove(&addr) else {
            return Err(cudars_core::Error::InvalidArgument(format!(
                "no segment of this source at {addr:#x}"
            )));
        };
        if !self.deregister(handle) {
            // NCCL may still map it: kept for good.
            std::mem::forget(mem);
        }
        Ok(())
    }
}

impl Communicator {
    /// A pool whose segments are registered with this communicator as they are made (see
    /// the [module](crate::pool)). The pool serves every device; segments of this
    /// communicator's device are registered. Returns the pool and its segment source (for
    /// its counts).
    pub fn registered_pool(&self) -> Result<(Arc<DevicePool>, Arc<RegisteredSegments>)> {
        self.check_usable()?;
        let source = Arc::new(RegisteredSegments {
            device: self.device(),
            raw: self.raw() as usize,
            registry: Arc::clone(self.registry()),
            segments: Mutex::default(),
        });
        let pool = DevicePool::with_segments(Arc::clone(&source) as Arc<dyn SegmentSource>)
            .map_err(|e| Error::InvalidArgument(format!("the registered pool: {e}")))?;
        Ok((Arc::new(pool), source))
    }
}
