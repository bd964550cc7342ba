//! What a caller holds: [`Allocation`], [`RawAllocation`], and the block a raw handle names.

use crate::backend::{Backend, DeviceAddress, DeviceId, StreamKey};
use crate::error::PoolError;
#[cfg(doc)]
use crate::policy;

use super::shard::ShardState;
use super::table::{RetiringGuard, Shard, RETIRED};
use super::MemoryPool;

/// A block of device memory from a [`MemoryPool`]; dropping it frees the block.
///
/// The block is freed on the stream it was allocated on: it is reused on that stream
/// at once, and on others only under the fence rule. If the memory was used on other
/// streams too, call [`record_stream`](Self::record_stream) before freeing.
/// Zero-sized allocations have a null pointer and touch nothing.
#[must_use = "dropping an allocation frees it at once"]
pub struct Allocation<'p, B: Backend> {
    pub(super) pool: &'p MemoryPool<B>,
    pub(super) shard: Option<&'p Shard<B>>,
    /// The block, as [`into_raw`](Self::into_raw) hands it out.
    pub(super) raw: RawAllocation,
}

/// An allocation detached from the pool's lifetime by [`Allocation::into_raw`]; give it
/// back with [`MemoryPool::free_raw`], which consumes it. It frees nothing when dropped
/// (the memory stays allocated until `free_raw`, or until the pool is dropped).
///
/// Neither `Copy` nor `Clone`: one handle, one free. A handle that no longer names a live
/// block (its block was freed through another path) is refused by a 64-bit generation
/// that cannot wrap in practice.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RawAllocation {
    pub(super) ptr: DeviceAddress,
    pub(super) size: u64,
    pub(super) device: DeviceId,
    pub(super) key: StreamKey,
    /// The key of the shard holding the block: `key`, or the lender's for a lent block
    /// (see [`Allocation::held_by`]).
    pub(super) shard_key: StreamKey,
    pub(super) private: bool,
    pub(super) id: u32,
    pub(super) generation: u64,
}

impl RawAllocation {
    /// The device address.
    pub fn ptr(&self) -> DeviceAddress {
        self.ptr
    }
    /// The size asked for, in bytes.
    pub fn size(&self) -> usize {
        self.size as usize
    }
    /// The device.
    pub fn device(&self) -> DeviceId {
        self.device
    }
    /// The key of the stream it was allocated on (for a private pool's block, the key
    /// of its private shard).
    pub fn stream(&self) -> StreamKey {
        self.key
    }
}

impl<B: Backend> MemoryPool<B> {
    /// The shard a raw handle names, locked (retiring on unlock, see
    /// [`Shard::lock_retiring`]) and checked live under its lock.
    ///
    /// A block lent to another stream ([`policy::STEAL_BEFORE_GROWING`]) stays in its
    /// lender's shard, which may retire (taken out of the key lookup) while the block is
    /// lent. Such a block is still found: on a miss the device's retired shards are searched
    /// for the live block at the handle's address (one live block per address, so at most
    /// one matches). This path runs only for handles the key lookup cannot place.
    fn raw_shard(&self, raw: &RawAllocation) -> Result<RetiringGuard<'_, B>, PoolError> {
        let dev = self.device(raw.device)?;
        let table = if raw.private {
            &dev.private
        } else {
            &dev.shards
        };
        let is_it = |st: &ShardState<B>| {
            st.live_range(raw.id, raw.generation).map(|r| r.0) == Some(raw.ptr.0)
        };
        if let Some(shard) = table.get(raw.shard_key) {
            let st = shard.lock_retiring();
            if st.key == raw.shard_key && is_it(&st) {
                return Ok(st);
            }
        }
        for shard in table.iter() {
            if shard.key() != RETIRED {
                continue;
            }
            let st = shard.lock_retiring();
            if st.key == RETIRED && st.retired && is_it(&st) {
                return Ok(st);
            }
        }
        Err(PoolError::InvalidHandle { ptr: raw.ptr.0 })
    }

    /// Frees an allocation detached with [`Allocation::into_raw`]. Fails with
    /// [`PoolError::InvalidHandle`], changing nothing, if it is not live in this pool.
    pub fn free_raw(&self, raw: RawAllocation) -> Result<(), PoolError> {
        if raw.size == 0 {
            return Ok(());
        }
        let mut st = self.raw_shard(&raw)?;
        if self.history.is_on() {
            // Under the shard's lock: the free comes before any reuse of the address.
            self.note_free(raw.device, raw.key, raw.size, raw.ptr);
        }
        st.release(&self.backend, raw.id, raw.generation)
    }

    /// Marks a detached allocation as used on `stream` too (see
    /// [`Allocation::record_stream`]).
    pub fn record_stream_raw(
        &self,
        raw: &RawAllocation,
        stream: &B::Stream,
    ) -> Result<(), PoolError> {
        if raw.size == 0 {
            return Ok(());
        }
        let key = self.backend.stream_key(stream)?;
        let mut st = self.raw_shard(raw)?;
        st.record_stream(&self.backend, raw.id, raw.generation, stream, key)?;
        if self.history.is_on() {
            self.note_record_stream(raw, key);
        }
        Ok(())
    }
}

#[cfg(test)]
impl RawAllocation {
    /// A second handle to the same block with the generation before its last reuse: what
    /// a stale copy would be if the type were `Copy` (tests of the generation check).
    pub(crate) fn forge_stale_for_tests(&self) -> RawAllocation {
        RawAllocation {
            generation: self.generation.wrapping_sub(1),
            ..*self
        }
    }

    /// An exact copy: what `Copy` would make (tests of the generation check).
    pub(crate) fn forge_copy_for_tests(&self) -> RawAllocation {
        RawAllocation { ..*self }
    }
}

#[cfg(test)]
impl<B: Backend> MemoryPool<B> {
    /// Adds `by` to the generation of every block of `stream`'s shard (tests of wrapping).
    pub(crate) fn jump_generations_for_tests(&self, device: DeviceId, stream: &B::Stream, by: u64) {
        let (Ok(dev), Ok(key)) = (self.device(device), self.backend.stream_key(stream)) else {
            return;
        };
        if let Some(shard) = dev.shards.get(key) {
            shard.state.lock().jump_generations_for_tests(by);
        }
    }
}

impl<'p, B: Backend> Allocation<'p, B> {
    /// The device address (null for a zero-sized allocation).
    pub fn ptr(&self) -> DeviceAddress {
        self.raw.ptr
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> usize {
        self.raw.size as usize
    }

    /// Whether this is a zero-sized allocation.
    pub fn is_empty(&self) -> bool {
        self.raw.size == 0
    }

    /// The device.
    pub fn device(&self) -> DeviceId {
        self.raw.device
    }

    /// The key of the stream the block was allocated on and will be freed on (for a
    /// private pool's block, of its private shard).
    pub fn stream(&self) -> StreamKey {
        self.raw.key
    }

    /// The key of the stream whose cache holds the block, and whose statistics
    /// ([`MemoryPool::stream_stats`]) count it: [`stream`](Self::stream), or, for a block
    /// another stream's cache lent to this request (see
    /// [`policy::STEAL_BEFORE_GROWING`]), the lender's.
    pub fn held_by(&self) -> StreamKey {
        self.raw.shard_key
    }

    /// The pool the block came from.
    pub fn pool(&self) -> &'p MemoryPool<B> {
        self.pool
    }

    /// Marks the block as used on `stream` too (PyTorch's `record_stream`): when it
    /// is freed, a fence is recorded on `stream` and the block is not reused, by any
    /// stream, before that fence has completed.
    pub fn record_stream(&self, stream: &B::Stream) -> Result<(), PoolError> {
        match self.shard {
            Some(shard) => {
                let key = self.pool.backend.stream_key(stream)?;
                let mut st = shard.state.lock();
                st.record_stream(
                    &self.pool.backend,
                    self.raw.id,
                    self.raw.generation,
                    stream,
                    key,
                )?;
                if self.pool.history.is_on() {
                    // Under the shard lock, as every note of a block.
                    self.pool.note_record_stream(&self.raw, key);
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Frees the block now, reporting errors that dropping would swallow (a failed
    /// fence record for a `record_stream` block; the block is still freed safely).
    pub fn free(mut self) -> Result<(), PoolError> {
        match self.shard.take() {
            Some(shard) => {
                let r = &self.raw;
                self.pool.free_block(shard, r.id, r.generation, r.key)
            }
            None => Ok(()),
        }
    }

    /// Detaches the allocation from the pool's lifetime; free it with
    /// [`MemoryPool::free_raw`].
    pub fn into_raw(mut self) -> RawAllocation {
        let raw = RawAllocation { ..self.raw };
        self.shard = None;
        raw
    }
}

impl<B: Backend> Drop for Allocation<'_, B> {
    #[inline]
    fn drop(&mut self) {
        // Reads the handle without writing it (no `take`): a handle written here would be
        // copied out of the caller's result first (see `MemoryPool::free_block`).
        if let Some(shard) = self.shard {
            let r = &self.raw;
            let _ = self.pool.free_block(shard, r.id, r.generation, r.key);
        }
    }
}

impl<B: Backend> std::fmt::Debug for Allocation<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.raw.ptr)
            .field("size", &self.raw.size)
            .field("device", &self.raw.device)
            .field("stream", &self.raw.key)
            .field("private", &self.raw.private)
            .finish()
    }
}
