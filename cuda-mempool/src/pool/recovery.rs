//! The out-of-memory steps: the requesting stream waits for its own `record_stream`
//! frees, the host waits for every fence and the cache is released, each followed by a
//! retry; a request that still fails rolls back what it reserved and reports the shortage.

use crate::backend::Backend;
use crate::error::{OomCause, PoolError};

use super::shard::ShardState;
use super::table::Shard;
use super::{Device, Global, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Grows, then recovers (waits for record_stream frees, waits for every fence and
    /// releases the cache) and retries. `Ok(Err(cause))` when memory stays short.
    pub(super) fn grow_with_recovery(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        rounded: u64,
    ) -> Result<Result<u32, OomCause>, PoolError> {
        if let Ok(id) = self.grow(dev, g, shard, st, rounded, false)? {
            return Ok(Ok(id));
        }
        if st.private {
            // During a capture nothing is released to make room (see `malloc_slow`).
            return Ok(Err(OomCause::DeviceMemory));
        }
        // Recovery 1: this stream waits (on the device) for its own record_stream frees.
        g.retries += 1;
        if st.stream_wait_pending(&self.backend)? {
            if let Ok(id) = self.grow(dev, g, shard, st, rounded, false)? {
                return Ok(Ok(id));
            }
        }
        // Recovery 2: wait on the host for every fence of the device, release, retry.
        self.quiesce(dev, g, shard, st)?;
        self.grow(dev, g, shard, st, rounded, true)
    }

    /// Waits on the host for every fence of the device, so that all free memory is
    /// safe for every stream; in plain mode also releases what that frees.
    fn quiesce(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
    ) -> Result<(), PoolError> {
        st.flush_recent();
        st.wait_fences(&self.backend)?;
        for other in dev.shards.iter() {
            if !std::ptr::eq(other, shard) {
                let mut o = other.state.lock();
                o.flush_recent();
                o.wait_fences(&self.backend)?;
            }
        }
        // Releasing also gives back the address ranges of wholly free segments, which is
        // what recovers from running out of address space in virtual-memory mode.
        self.release_device_cache(dev, g, shard, st)
    }

    /// After a failed request: returns spare pages and this shard's wholly free address
    /// ranges or segments, so the pool holds no more than before the request.
    pub(super) fn roll_back(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        st: &mut ShardState<B>,
    ) -> Result<(), PoolError> {
        if st.private {
            // Kept for later: nothing goes back to the driver during a capture.
            return Ok(());
        }
        let released = st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current);
        self.release_spare(dev, g)?;
        released
    }

    pub(super) fn out_of_memory(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &ShardState<B>,
        size: u64,
        cause: OomCause,
    ) -> PoolError {
        g.ooms += 1;
        g.oom_causes.count(cause);
        g.last_oom = Some(cause);
        let used = self.device_used(dev, shard, st);
        PoolError::OutOfMemory {
            device: dev.id,
            requested: size,
            used,
            reserved: g.reserved.current,
            limit: g.limit,
            cause,
        }
    }
}
