//! Recording a live pool's history: start and stop, the baseline a recording starts
//! from, and the events the pool itself records (its backend calls are recorded by the
//! observation seam, `observe.rs`).
//!
//! Off, the hot path pays one relaxed load of the slot's flag in `malloc` and in `free`.

use std::sync::Arc;

use crate::backend::{Backend, DeviceAddress, DeviceId, StreamKey};
use crate::error::PoolError;
use std::collections::HashMap;

use crate::history::{Clock, EventKind, Recorder, Snapshot};

use super::lock::ShardGuard;
use super::shard::ShardState;
use super::{lock, MemoryPool, PrivatePoolId, RawAllocation};

impl<B: Backend> MemoryPool<B> {
    /// Starts recording this pool's history into `recorder` (PyTorch's
    /// `torch.cuda.memory._record_memory_history`): first what the pool holds now (its
    /// segments, mapped pages and spare pages, and its live blocks, as if made at this
    /// instant), then every malloc and free, out-of-memory failure, limit change and
    /// private pool, and the backend's segment, page and fence calls (through the pool's
    /// observation seam, whatever the backend). A recorder already in is replaced and
    /// returned.
    ///
    /// The baseline is taken with every device's lock and every shard's lock held, and the
    /// pool notes a block's malloc, free and `record_stream` under its shard's lock (a grow
    /// under the device lock), so no allocation, free or growth falls between the baseline
    /// and the events that follow. Starts and stops are serialized.
    ///
    /// The ring keeps the newest events: once it has dropped some
    /// ([`History::dropped`](crate::history::History::dropped)), the baseline is gone and a
    /// snapshot rebuilt from the history is incomplete; size the recorder for the run.
    ///
    /// While the baseline is taken, every device's lock is held together: a thread that holds
    /// one device's lock while it waits on the host for another device's work (a
    /// multi-device program with host-side dependencies between devices) delays the start
    /// until that work is done, and allocations on the other devices wait meanwhile.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cudars_mempool::history::{Clock, Recorder};
    /// use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};
    ///
    /// let pool = MemoryPool::new(SimulatedBackend::h200(1))?;
    /// let before = pool.malloc(DeviceId(0), &StreamKey(1), 4096)?;
    /// let rec = Arc::new(Recorder::new(1 << 16, Clock::Real));
    /// pool.start_history(Arc::clone(&rec));
    /// let after = pool.malloc(DeviceId(0), &StreamKey(1), 1 << 20)?;
    /// let snapshot = rec.history().snapshot();
    /// assert_eq!(snapshot.active_bytes(), 4096 + (1 << 20));
    /// # drop((before, after));
    /// # Ok::<(), cudars_mempool::PoolError>(())
    /// ```
    pub fn start_history(&self, recorder: Arc<Recorder>) -> Option<Arc<Recorder>> {
        let _control = lock(&self.history_control);
        self.with_everything_locked(
            || {
                self.backend.set_recorder(Some(Arc::clone(&recorder)));
                self.history.set(Some(Arc::clone(&recorder)))
            },
            &recorder,
        )
    }

    /// What the pool holds now (PyTorch's `torch.cuda.memory._snapshot()`): its live blocks,
    /// its segments with their mapped pages, and the free memory between blocks, read with
    /// every device's lock and every shard's lock held (so, one instant), whether or not a
    /// recording is on. A dump of a long recording whose ring dropped its beginning takes
    /// its segments from here.
    ///
    /// ```
    /// use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};
    ///
    /// let pool = MemoryPool::new(SimulatedBackend::h200(1))?;
    /// let a = pool.malloc(DeviceId(0), &StreamKey(1), 4096)?;
    /// let snap = pool.snapshot();
    /// assert_eq!(snap.live.len(), 1);
    /// assert_eq!(snap.live[0].addr, a.ptr());
    /// assert_eq!(snap.backed_bytes(), pool.stats(DeviceId(0))?.reserved.current);
    /// # Ok::<(), cudars_mempool::PoolError>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let rec = Recorder::new(usize::MAX, Clock::Virtual);
        self.with_everything_locked(|| (), &rec);
        let mut snapshot = rec.history().snapshot();
        // Numbered by this throw-away recorder, the blocks' `seq` name no event of any
        // recording: exporters find a block's malloc by its address instead.
        for b in &mut snapshot.live {
            b.seq = None;
        }
        snapshot
    }

    /// With every device's lock and then every shard's lock held (the pool's lock order):
    /// records what the pool holds into `recorder` (spare pages, limits, each shard's
    /// segments, pages and live blocks), then runs `then`.
    fn with_everything_locked<R>(&self, then: impl FnOnce() -> R, recorder: &Recorder) -> R {
        let mut privates = Vec::with_capacity(self.devices.len());
        let mut globals = Vec::with_capacity(self.devices.len());
        let mut shards: Vec<ShardGuard<'_, ShardState<B>>> = Vec::new();
        // Which private pool each private shard serves, by shard key.
        let mut pool_of: HashMap<(DeviceId, StreamKey), PrivatePoolId> = HashMap::new();
        for dev in self.devices.iter() {
            // The private pools, the device lock, then its shards (the pool's lock order).
            let p = lock(&dev.privates);
            for (id, state) in p.pools.iter() {
                recorder.record_private_pool(dev.id, None, *id, true);
                for key in state.shards.values() {
                    pool_of.insert((dev.id, *key), *id);
                }
            }
            privates.push(p);
            globals.push((dev, lock(&dev.global)));
            shards.extend(dev.all_shards().map(|s| s.state.lock()));
        }
        for (dev, g) in &globals {
            if let Some(page) = dev.page {
                for _ in &g.spare {
                    let none = DeviceAddress(0);
                    recorder.event(EventKind::PageCreate, dev.id, None, page, none, None);
                }
            }
            recorder.record_limit(dev.id, g.limit);
        }
        for st in &shards {
            st.record_baseline(recorder);
            if let Some(id) = pool_of.get(&(st.device, st.key)).filter(|_| st.private) {
                st.record_private_blocks(recorder, *id);
            }
        }
        let r = then();
        drop(shards);
        drop(globals);
        drop(privates);
        r
    }

    /// Stops recording and returns the recorder (`None` if none was in). The recorder
    /// keeps its events: render them with [`history::report`](crate::history::report) or
    /// [`history::torch`](crate::history::torch).
    pub fn stop_history(&self) -> Option<Arc<Recorder>> {
        let _control = lock(&self.history_control);
        // The pool's notes first: a block noted after the backend stopped would lie in a
        // segment the history never saw.
        let old = self.history.set(None);
        self.backend.set_recorder(None);
        old
    }

    /// The recorder in use, if a recording is on.
    pub fn history_recorder(&self) -> Option<Arc<Recorder>> {
        self.history.get()
    }

    /// Records a block handed out: `key` is the stream it was made on, `site` the caller of
    /// the pool's `malloc` (through `#[track_caller]`: `DevicePool::malloc_stream`'s caller).
    #[cold]
    pub(super) fn note_malloc(
        &self,
        device: DeviceId,
        key: StreamKey,
        size: u64,
        addr: u64,
        site: &'static std::panic::Location<'static>,
    ) {
        self.history
            .with(|r| r.malloc(device, key, size, DeviceAddress(addr), Some(site)));
    }

    /// Records the free of a block, before it is released (so that the free comes before
    /// any later malloc of the same address).
    #[cold]
    pub(super) fn note_free(
        &self,
        device: DeviceId,
        key: StreamKey,
        size: u64,
        ptr: DeviceAddress,
    ) {
        self.history.with(|r| r.free(device, key, size, ptr));
    }

    /// Records that a block is used on stream `key` too.
    #[cold]
    pub(super) fn note_record_stream(&self, raw: &RawAllocation, key: StreamKey) {
        if let Some(r) = self.history.get() {
            r.event(
                EventKind::RecordStream,
                raw.device,
                Some(key),
                raw.size,
                raw.ptr,
                None,
            );
        }
    }

    /// Records that a block just handed out belongs to private pool `pool`.
    #[cold]
    pub(super) fn note_private_block(&self, raw: &RawAllocation, pool: PrivatePoolId) {
        if let Some(r) = self.history.get() {
            let kind = EventKind::PrivateBlock(pool);
            r.event(kind, raw.device, Some(raw.key), raw.size, raw.ptr, None);
        }
    }

    /// Records an out-of-memory failure with the device's figures then.
    #[cold]
    pub(super) fn note_oom(&self, error: &PoolError, stream: StreamKey) {
        let (
            Some(r),
            PoolError::OutOfMemory {
                device,
                requested,
                used,
                reserved,
                cause,
                ..
            },
        ) = (self.history.get(), error)
        else {
            return;
        };
        r.out_of_memory(
            *device,
            Some(stream),
            *requested as u64,
            *cause,
            *used,
            *reserved,
        );
    }

    /// Records a limit change.
    #[cold]
    pub(super) fn note_limit(&self, device: DeviceId, limit: Option<u64>) {
        if let Some(r) = self.history.get() {
            r.record_limit(device, limit);
        }
    }

    /// Records the creation or release of a private pool.
    #[cold]
    pub(super) fn note_private(&self, device: DeviceId, id: PrivatePoolId, created: bool) {
        if let Some(r) = self.history.get() {
            r.record_private_pool(device, None, id, created);
        }
    }
}
