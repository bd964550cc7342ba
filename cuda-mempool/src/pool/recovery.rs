//! The out-of-memory steps: the requesting stream waits for its own `record_stream`
//! frees, the host waits for every fence (and, for frees on other threads' per-thread
//! streams, which no fence of this thread covers, for the whole device when no capture may
//! be running) and the cache is released, each followed by a retry; a request that still fails rolls back what it reserved and reports the shortage.

use crate::backend::Backend;
use crate::error::{OomCause, PoolError};

use super::{Held, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Grows, then recovers (waits for record_stream frees, waits for every fence and
    /// releases the cache) and retries. `Ok(Err(cause))` when memory stays short.
    pub(super) fn grow_with_recovery(
        &self,
        h: &mut Held<'_, '_, B>,
        rounded: u64,
    ) -> Result<Result<u32, OomCause>, PoolError> {
        if let Ok(id) = self.grow(h, rounded, false)? {
            return Ok(Ok(id));
        }
        if h.st.private {
            // During a capture nothing is released to make room (see `malloc_slow`).
            return Ok(Err(OomCause::DeviceMemory));
        }
        // Recovery 1: this stream waits (on the device) for its own record_stream frees.
        h.g.retries += 1;
        if h.st.stream_wait_pending(&self.backend)? {
            if let Ok(id) = self.grow(h, rounded, false)? {
                return Ok(Ok(id));
            }
        }
        // Recovery 2: wait on the host for every fence of the device, release, retry.
        self.quiesce(h)?;
        self.grow(h, rounded, true)
    }

    /// Waits on the host for every fence of the device, so that all free memory is
    /// safe for every stream; in plain mode also releases what that frees.
    fn quiesce(&self, h: &mut Held<'_, '_, B>) -> Result<(), PoolError> {
        h.st.flush_recent();
        h.st.wait_fences(&self.backend)?;
        // Frees on another thread's per-thread default stream get no fence from this thread
        // (the handle names this thread's stream), nor do a lingering stream's (it may be
        // gone): the epochs they reached are noted, and one
        // synchronisation of the device covers them (a garbage collector's frees of blocks
        // made on other threads' per-thread streams, CuPy's `Stream.ptds`).
        let mut uncovered = Vec::new();
        for other in h.other_shards() {
            let mut o = other.state.lock();
            o.flush_recent();
            o.wait_fences(&self.backend)?;
            if let Some(epoch) = o.unfenced_on_other_thread() {
                uncovered.push((other, epoch));
            }
        }
        self.cover_by_device_sync(h.dev.id, uncovered);
        // Releasing also gives back the address ranges of wholly free segments, which is
        // what recovers from running out of address space in virtual-memory mode.
        self.release_device_cache(h)
    }

    /// Frees that no fence can cover (`uncovered`: shards with the epoch each reached, read
    /// before this call) are covered by one synchronisation of the device, and the lingering
    /// shards among them let go of their streams without touching them. Not while a capture
    /// may run on the device (the synchronisation would invalidate it): those frees then stay
    /// out of reach, as a failed synchronisation leaves them.
    pub(super) fn cover_by_device_sync(
        &self,
        device: crate::backend::DeviceId,
        uncovered: Vec<(&super::table::Shard<B>, u64)>,
    ) {
        if !uncovered.is_empty()
            && self.backend.may_synchronize_device(device)
            && self.backend.synchronize_device(device).is_ok()
        {
            for (shard, epoch) in uncovered {
                let mut st = shard.state.lock();
                st.covered_up_to(epoch);
                st.forget_lingering(&self.backend);
            }
        }
    }

    /// After a failed request: returns spare pages and this shard's wholly free address
    /// ranges or segments, so the pool holds no more than before the request.
    pub(super) fn roll_back(&self, h: &mut Held<'_, '_, B>) -> Result<(), PoolError> {
        if h.st.private {
            // Kept for later: nothing goes back to the driver during a capture.
            return Ok(());
        }
        let g = &mut *h.g;
        let released =
            h.st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current);
        self.release_spare(h.dev, g)?;
        released
    }

    /// Counts an out-of-memory failure of the request and describes it.
    pub(super) fn out_of_memory(
        &self,
        h: &mut Held<'_, '_, B>,
        size: u64,
        cause: OomCause,
    ) -> PoolError {
        let used = h.device_used();
        let g = &mut *h.g;
        g.ooms += 1;
        g.oom_causes.count(cause);
        g.last_oom = Some(cause);
        let error = PoolError::OutOfMemory {
            device: h.dev.id,
            requested: size as usize,
            used,
            reserved: g.reserved.current,
            limit: g.limit,
            cause,
        };
        if self.history.is_on() {
            self.note_oom(&error, h.st.key);
        }
        error
    }
}
