//! Private pools: memory that only allocations into the same private pool reuse, released
//! as a whole once nobody holds the pool and none of its blocks is live. Graph captures get
//! one each, in a range of ids of their own ([`PrivatePoolId::CAPTURE_BIT`]), which the
//! public calls refuse: a capture's graph replays into its pool's memory until the graph is
//! destroyed, so only the capture's own allocations may use or hold it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::{Backend, DeviceId, StreamKey};
use crate::error::PoolError;
pub use crate::private_id::PrivatePoolId;

use super::table::Shard;
use super::{lock, Allocation, Device, MemoryPool};

/// The private pools of a device.
#[derive(Default)]
pub(super) struct Privates {
    pub(super) pools: HashMap<PrivatePoolId, PrivateState>,
    /// Source of private shard keys (never reused).
    next_key: u64,
}

pub(super) struct PrivateState {
    /// Holders of the pool: graphs made from captures that allocated from it (their
    /// release callbacks decrement this from a driver thread) and explicit
    /// [`MemoryPool::retain_private_pool`] holds. Released once 0 and no block is live.
    holds: Arc<AtomicUsize>,
    /// Stream key -> the private shard key of that stream's shard in this pool.
    pub(super) shards: HashMap<StreamKey, StreamKey>,
}

/// A holder's counter of a private pool: decrement it (once) when the holder is gone.
/// Safe to use from any thread, including a driver callback thread (it only decrements an
/// atomic); the pool releases the private pool on its next call that looks at private pools.
///
/// Not `Clone`: one hold is released once ([`release`](Self::release) takes it by value),
/// so no holder can release another's hold. Dropping it without `release` keeps the hold
/// (the private pool stays reserved).
#[derive(Debug)]
pub struct PrivateHold(Arc<AtomicUsize>);

impl PrivateHold {
    /// The holder is gone.
    pub fn release(self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

impl<B: Backend> MemoryPool<B> {
    /// Allocates `size` bytes on `device` for use on `stream` from private pool `pool`
    /// (created on first use): memory that only later allocations into the same private
    /// pool on the same stream reuse, in stream order, and that is released as a whole
    /// once every hold on the pool is released ([`retain_private_pool`](Self::retain_private_pool))
    /// and no block of it is live. This is what allocations during a CUDA graph capture
    /// need: a graph replays into the memory its captured work used, so that memory must
    /// not go to anyone else while the graph lives. The driver layer
    /// ([`DevicePool::malloc_stream`](crate::DevicePool::malloc_stream) and the C ABI)
    /// does this by itself for streams being captured.
    ///
    /// Ids with [`PrivatePoolId::CAPTURE_BIT`] set belong to graph captures and are refused
    /// with [`PoolError::CapturePrivatePool`].
    #[track_caller]
    pub fn malloc_private(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
        stream: &B::Stream,
        size: usize,
    ) -> Result<Allocation<'_, B>, PoolError> {
        if pool.is_capture_pool() {
            return Err(PoolError::CapturePrivatePool { pool: pool.0 });
        }
        self.malloc_in_private(device, pool, stream, size)
    }

    /// [`malloc_private`](Self::malloc_private) without the check of the id: the driver
    /// layer's allocations of a capture into the capture's own pool.
    #[track_caller]
    pub(crate) fn malloc_in_private(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
        stream: &B::Stream,
        size: usize,
    ) -> Result<Allocation<'_, B>, PoolError> {
        let size = size as u64;
        let dev = self.device(device)?;
        if size == 0 {
            return self.malloc_in(dev, &dev.private, Some(StreamKey(0)), stream, 0);
        }
        let stream_key = self.backend.stream_key(stream)?;
        let key = {
            let mut p = lock(&dev.privates);
            let Privates { pools, next_key } = &mut *p;
            if self.history.is_on() && !pools.contains_key(&pool) {
                self.note_private(device, pool, true);
            }
            let state = pools.entry(pool).or_insert_with(|| PrivateState {
                holds: Arc::new(AtomicUsize::new(0)),
                shards: HashMap::new(),
            });
            *state.shards.entry(stream_key).or_insert_with(|| {
                *next_key += 1;
                StreamKey(*next_key)
            })
        };
        let mut a = self.malloc_in(dev, &dev.private, Some(key), stream, size)?;
        a.raw.private = true;
        if self.history.is_on() {
            // After its Malloc; the caller holds the block, so its Free comes later.
            self.note_private_block(&a.raw, pool);
        }
        Ok(a)
    }

    /// Adds a hold on private pool `pool` of `device` (creating it if needed), released
    /// with [`PrivateHold::release`]: the pool's memory stays reserved at least until then.
    ///
    /// Ids with [`PrivatePoolId::CAPTURE_BIT`] set belong to graph captures and are refused
    /// with [`PoolError::CapturePrivatePool`]: only the capture's graph holds its pool.
    pub fn retain_private_pool(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
    ) -> Result<PrivateHold, PoolError> {
        if pool.is_capture_pool() {
            return Err(PoolError::CapturePrivatePool { pool: pool.0 });
        }
        self.retain_any_private_pool(device, pool)
    }

    /// [`retain_private_pool`](Self::retain_private_pool) without the check of the id: the
    /// driver layer's hold of a capture's pool, given to the capture's graph.
    pub(crate) fn retain_any_private_pool(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
    ) -> Result<PrivateHold, PoolError> {
        let dev = self.device(device)?;
        let mut p = lock(&dev.privates);
        if self.history.is_on() && !p.pools.contains_key(&pool) {
            self.note_private(device, pool, true);
        }
        let state = p.pools.entry(pool).or_insert_with(|| PrivateState {
            holds: Arc::new(AtomicUsize::new(0)),
            shards: HashMap::new(),
        });
        state.holds.fetch_add(1, Ordering::AcqRel);
        Ok(PrivateHold(Arc::clone(&state.holds)))
    }

    /// Whether private pool `pool` of `device` still exists (holds or live blocks).
    pub fn has_private_pool(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
    ) -> Result<bool, PoolError> {
        let dev = self.device(device)?;
        self.collect_private_pools(dev);
        Ok(lock(&dev.privates).pools.contains_key(&pool))
    }

    /// Releases every private pool of `dev` that nobody holds and that has no live block:
    /// its memory goes back to the device (pages to the backend, ranges and segments
    /// freed) once the work that used it is done.
    pub(super) fn collect_private_pools(&self, dev: &Device<B>) {
        let mut p = lock(&dev.privates);
        if p.pools.is_empty() {
            return;
        }
        let done: Vec<PrivatePoolId> = p
            .pools
            .iter()
            .filter(|(_, st)| st.holds.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let Some(state) = p.pools.get(&id) else {
                continue;
            };
            let shards: Vec<&Shard<B>> = state
                .shards
                .values()
                .filter_map(|k| dev.private.get(*k))
                .collect();
            let mut g = lock(&dev.global);
            // Every shard of the pool stays locked from the idle check to its release, so no
            // allocation can slip in between.
            let mut locked: Vec<_> = shards.iter().map(|s| s.state.lock()).collect();
            if locked.iter().any(|st| !st.is_idle()) {
                continue;
            }
            // Graph replays are over (the graph's release says so); eager work on the pool's
            // blocks after the capture is covered by the fences of the shards' detaches.
            // A shard with frees no completed fence covers (another thread's per-thread
            // stream, a capture, a retired shard) is released only after the whole device
            // is idle; if even that cannot be waited for, the pool stays for a later call.
            let unfenced = locked
                .iter_mut()
                .any(|st| st.wait_fences(&self.backend).is_err() || !st.fully_fenced());
            if unfenced && self.backend.synchronize_device(dev.id).is_err() {
                continue;
            }
            let mut spare = std::mem::take(&mut g.spare);
            for st in locked.iter_mut() {
                let released = st.release_everything(&self.backend, &mut spare);
                g.reserved.sub(released);
            }
            drop(locked);
            g.spare = spare;
            {
                p.pools.remove(&id);
                if self.history.is_on() {
                    self.note_private(dev.id, id, false);
                }
                // A failed release leaves the page leaked and counted; nothing to report here.
                let _ = self.release_spare(dev, &mut g);
            }
        }
    }
}
