//! Which shard serves a stream: created or adopted at the stream's first request, and
//! let go of once no block made on the stream is live.

use crate::backend::{Backend, DeviceId, StreamKey};
use crate::error::PoolError;
use crate::policy;

use super::shard::ShardState;
use super::table::{Inserted, ShardTable};
use super::{Allocation, Device, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Creates (or adopts) the shard of `key` in `table` and attaches `stream` to it.
    #[inline(never)]
    pub(super) fn insert_shard(
        &self,
        dev: &Device<B>,
        table: &ShardTable<B>,
        key: StreamKey,
        stream: &B::Stream,
        private: bool,
    ) -> Result<(), PoolError> {
        let _insert = table.insert_lock();
        // A new stream is the moment to let go of streams whose owners dropped them while
        // their shards were idle: bounded work, and it is what lets shards be adopted.
        self.detach_released(table);
        let backend = &self.backend;
        let crowded = table.iter().count() >= policy::ADOPT_BUSY_SHARDS_ABOVE;
        let inserted = table.insert(key, dev.id, dev.page, &mut |st| {
            // Adopt memory that costs the new stream no wait, or any idle shard once the
            // device holds many (see the policy constant).
            crowded || st.is_settled(backend)
        });
        match inserted {
            Inserted::Existing => Ok(()),
            Inserted::Created(shard) | Inserted::Adopted(shard) => {
                let mut st = shard.state.lock();
                st.private = private;
                // A request on the same key may have attached it since `insert` returned.
                if st.key == key && st.stream.is_none() {
                    st.attach(backend, stream, key)?;
                }
                Ok(())
            }
        }
    }

    /// Detaches every idle shard of `table` whose stream the backend says may go (best
    /// effort: a shard whose fence cannot be recorded stays attached).
    fn detach_released(&self, table: &ShardTable<B>) {
        for shard in table.iter() {
            let mut st = shard.lock_retiring();
            if st.is_attached() && st.stream_idle() {
                let _ = st.detach_if_released(&self.backend);
            }
        }
    }

    /// The fast path of a caller that remembers `stream` but cannot tell, without asking the
    /// driver, whether its handle still names the stream it remembers (the C ABI's memo):
    /// serves `size` bytes from the stream's recently freed blocks only while a block made on
    /// the stream is live, since its owner may not destroy the stream before that block is
    /// freed, so the handle still names it. `Ok(None)`, with nothing done, otherwise (no live
    /// block, no recent block of that size, a memory history recording): the caller then
    /// checks the stream and takes the general path. One lookup and one lock, no backend call.
    #[inline]
    pub fn malloc_if_busy(
        &self,
        device: DeviceId,
        stream: &B::Stream,
        size: usize,
    ) -> Result<Option<Allocation<'_, B>>, PoolError> {
        let dev = self.device(device)?;
        let (Some(rounded), Ok(key)) = (
            policy::round_size(size as u64),
            self.backend.stream_key(stream),
        ) else {
            return Ok(None);
        };
        let Some(shard) = dev.shards.get_home(key) else {
            return Ok(None);
        };
        let mut st = shard.state.lock();
        if size == 0
            || st.retired
            || st.key != key
            || st.private
            || st.stream.is_none()
            || st.stream_idle()
            || self.history.is_on()
        {
            return Ok(None);
        }
        let Some(id) = st.take_recent(rounded) else {
            return Ok(None);
        };
        let served = st.mark_live(id, size as u64);
        drop(st);
        Ok(Some(self.handle(
            dev.id,
            shard,
            key,
            key,
            (id, served),
            size as u64,
        )))
    }

    /// Lets the pool forget `stream` now (it detaches from it where no block made on it
    /// is live), instead of at the next new stream. Call it before destroying a foreign
    /// stream whose blocks are all freed, or to bound what the pool holds. Memory the
    /// stream freed stays cached, fenced, for other streams.
    pub fn release_stream(&self, device: DeviceId, stream: &B::Stream) -> Result<(), PoolError> {
        let dev = self.device(device)?;
        let key = self.backend.stream_key(stream)?;
        if let Some(shard) = dev.shards.get(key) {
            let mut st = shard.lock_retiring();
            if st.key == key && st.stream_idle() {
                // The owner hands the stream in, valid now: a lingering shard may fence it.
                st.resume();
                st.detach(&self.backend)?;
            }
        }
        Ok(())
    }

    /// Lets go of the shard's stream when no block made on it is live and the backend says
    /// it may go (the shard retires when `st`, a
    /// [`Shard::lock_retiring`](super::table::Shard::lock_retiring) guard, is dropped, if
    /// that fails in a way that leaves its cache unusable).
    pub(super) fn let_go_if_idle(&self, st: &mut ShardState<B>) {
        if st.is_attached() && st.stream_idle() {
            let _ = st.detach_if_released(&self.backend);
        }
    }
}
