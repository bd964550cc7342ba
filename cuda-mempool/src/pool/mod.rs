//! [`MemoryPool`]: the stream-ordered caching pool, one instance for every device.
//!
//! # Map
//!
//! | file | what it answers |
//! | --- | --- |
//! | `mod.rs` | the public face and the hot path: what a device holds, stream keys, `malloc` served from the cache, `free` |
//! | `config.rs` | how a pool is built: [`Limit`], [`PoolConfig`] |
//! | `handle.rs` | what a caller holds: [`Allocation`], [`RawAllocation`], and the block a raw handle names |
//! | `streams.rs` | which shard serves a stream: created or adopted at its first request, let go of when idle |
//! | `slow_path.rs` | a miss, in the order it tries: the cache, lending from another stream, growing, out of memory |
//! | `grow.rs` | growing a shard: a free block, a new address range or plain segment, its pages mapped |
//! | `supply.rs` | where pages and segments come from and go back (the move slack) |
//! | `recovery.rs` | the out-of-memory steps: wait, release, retry, roll back, report |
//! | `private.rs` | private pools (graph captures): [`PrivatePoolId`], [`PrivateHold`], and their release |
//! | `accounting.rs` | `free_all_*`, limits and statistics |
//! | `history.rs` | recording a live pool's history: start, stop, the baseline, the pool's own events |
//! | `table.rs` | the per-device table of stream shards |
//! | `lock.rs` | the shard lock |
//! | `shard/` | the state of one (device, stream) shard: its blocks, segments, pages and fences (a map of its own) |
//! | `tests/` | the pool's unit tests on the simulated backend, a file per concept |
//!
//! # Structure
//!
//! * Per device: a table of *shards*, one per stream, each behind its own lock, and a
//!   device lock over what is shared (physical pages, limit, reserved bytes).
//! * The hot path (`malloc` served from the cache, `free`) takes only its shard's lock.
//! * A miss drops the shard lock, takes the device lock, then the shard lock again.
//!   Only a thread holding the device lock ever holds more than one shard lock, so the
//!   locks cannot deadlock.
//!
//! # Stream ordering
//!
//! A block freed on stream A is cached in A's shard and reused by A at once: A's own
//! order makes that safe. Before the pool grows for a request on stream B, B may take
//! a free block of A's cache as it is, by waiting for A's fence on the device
//! ([`policy::STEAL_BEFORE_GROWING`]): the block is *lent* (it stays in A's shard; its
//! free records a fence on B, and A waits for that fence on the device before using it
//! again). Otherwise, in virtual-memory mode other streams receive A's *pages*: when B
//! needs memory and A holds free pages whose frees a completed fence covers, the pages
//! are unmapped from A's range and mapped into B's. In plain-segment mode, wholly free
//! segments whose fences have completed are returned to the backend and allocated anew.
//! Every cross-stream reuse thus happens after a fence recorded after the free has
//! completed, or after the receiving stream was made to wait for it.
//!
//! Lending takes the lender's shard lock while the borrower's is held; it happens only
//! on the slow path, under the device lock, so the lock rule below still holds.
//!
//! # Out of memory
//!
//! When a request cannot be served, the pool (1) makes the requesting stream wait on
//! its own pending `record_stream` frees, (2) waits on the host for every outstanding
//! fence of the device and releases what that frees, retrying after each step, and
//! only then (3) fails with [`PoolError::OutOfMemory`]. These host waits happen only on
//! this path, never when a request can be served.

mod accounting;
mod config;
mod grow;
mod handle;
mod history;
mod lock;
mod private;
mod recovery;
mod shard;
mod slow_path;
mod streams;
mod supply;
mod table;

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, StreamKey};
use crate::error::{OomCause, PoolError};
use crate::observe::Observed;
use crate::policy;
use crate::stats::{OomCounts, Stat};

use lock::ShardGuard;
use private::Privates;
use shard::{Choice, ShardState};
use table::{Shard, ShardTable};

pub use config::{Limit, PoolConfig, LIMIT_ENV_VAR};
pub use handle::{Allocation, RawAllocation};
pub use private::{PrivateHold, PrivatePoolId};

/// A number that identifies the calling thread while it lives (the address of a
/// thread-local): which host thread drives a stream, for [`policy::STEAL_BEFORE_GROWING`].
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| std::ptr::from_ref(t) as usize)
}

/// The bit that marks a [`StreamKey`] as the key of one thread's per-thread default stream
/// ([`per_thread_key`]), with bit 63 clear. Keys of other streams never look like that: 0
/// for the legacy stream, a handle's value (a user-space address, below bit 47) for an
/// external stream, a serial number with bit 63 set for a stream `cuda-core` created.
pub(crate) const PER_THREAD_KEY_BIT: u64 = 1 << 62;

/// The key of the calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`): the
/// handle names a different stream on every thread, so each thread's stream gets a key of its
/// own, [`PER_THREAD_KEY_BIT`] with a serial number of the thread, never reused in the
/// process (a new thread never inherits an exited thread's cache as its own stream's).
pub(crate) fn per_thread_key() -> StreamKey {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        // No destructor: readable for the whole life of the thread, even while it exits.
        static SERIAL: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    StreamKey(PER_THREAD_KEY_BIT | SERIAL.with(|s| *s))
}

/// Whether `key` is a per-thread default stream's key ([`per_thread_key`]).
pub(crate) fn is_per_thread_key(key: StreamKey) -> bool {
    // Bit 63 marks the identities of streams cuda-core creates; external handles are
    // user-space addresses, far below bit 62.
    key.0 >> 62 == 1
}

/// Whether `key` is the per-thread default stream of a thread other than the calling one.
/// Its handle would name the *calling* thread's stream here, so the pool records no fence
/// on it, makes it wait for nothing and asks nothing about it from this thread: that waits
/// for a call of the owning thread (frees from other threads stay out of cross-stream reuse
/// until then).
pub(crate) fn is_other_threads_stream(key: StreamKey) -> bool {
    is_per_thread_key(key) && key != per_thread_key()
}

/// Locks a mutex, ignoring poisoning: no code of this crate panics while holding a
/// lock, and the state is consistent between statements that could.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a device shares between its shards, behind the device lock.
struct Global<B: Backend> {
    limit: Option<u64>,
    reserved: Stat,
    /// Physical pages held but mapped nowhere (virtual-memory mode).
    spare: Vec<B::Physical>,
    /// Pages unmapped from free memory to be mapped under another request.
    pages_moved: u64,
    /// The most live bytes (with the request served) seen when pages were needed, since the
    /// cache was last released (`free_all_blocks`, out-of-memory recovery): the base of
    /// [`policy::move_slack_budget`].
    live_high: u64,
    retries: u64,
    ooms: u64,
    oom_causes: OomCounts,
    last_oom: Option<OomCause>,
}

struct Device<B: Backend> {
    id: DeviceId,
    info: DeviceInfo,
    /// Page size when this device uses virtual-memory segments.
    page: Option<u64>,
    global: Mutex<Global<B>>,
    shards: ShardTable<B>,
    /// Shards of private pools (graph captures), keyed by private shard keys; never
    /// searched for pages or released by the device's cache management.
    private: ShardTable<B>,
    privates: Mutex<Privates>,
}

impl<B: Backend> Device<B> {
    /// Every shard of the device: its streams' and its private pools'.
    fn all_shards(&self) -> impl Iterator<Item = &Shard<B>> + '_ {
        self.shards.iter().chain(self.private.iter())
    }
}

/// The locks a miss holds, with what they guard: the device lock (`g`) and the lock of the
/// requesting stream's shard (`st`), taken in that order by `malloc_slow`. Every step of
/// the slow path (`slow_path.rs`, `grow.rs`, `supply.rs`, `recovery.rs`) takes this one
/// context instead of the four pieces.
struct Held<'h, 'p, B: Backend> {
    dev: &'p Device<B>,
    g: &'h mut Global<B>,
    /// The requesting shard, locked as `st`.
    shard: &'p Shard<B>,
    st: &'h mut ShardState<B>,
}

impl<'p, B: Backend> Held<'_, 'p, B> {
    /// The device's stream shards other than the locked one (private shards are never
    /// searched for memory).
    fn other_shards(&self) -> impl Iterator<Item = &'p Shard<B>> + 'p {
        let shard = self.shard;
        self.dev
            .shards
            .iter()
            .filter(move |s| !std::ptr::eq(*s, shard))
    }

    /// Bytes in live blocks of the device (the locked shard's read through `st`).
    fn device_used(&self) -> u64 {
        self.dev
            .all_shards()
            .map(|s| {
                if std::ptr::eq(s, self.shard) {
                    self.st.stats.used.current
                } else {
                    s.state.lock().stats.used.current
                }
            })
            .sum()
    }
}

/// One request on the slow path: the stream's key, the stream, the size asked for and
/// the size rounded to the pool's unit.
struct Request<'s, B: Backend> {
    key: StreamKey,
    stream: &'s B::Stream,
    size: u64,
    rounded: u64,
}

/// A stream-ordered caching memory pool serving every device of its backend.
///
/// See the [crate documentation](crate) for the semantics and the
/// [module documentation](self) for the structure. `MemoryPool` is `Send + Sync`:
/// share it by reference (or in an `Arc`) between threads; threads working on
/// different streams do not contend on the hot path.
///
/// ```
/// use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};
///
/// let pool = MemoryPool::new(SimulatedBackend::h200(1)).unwrap();
/// let (dev, stream) = (DeviceId(0), StreamKey(7));
/// let a = pool.malloc(dev, &stream, 1000).unwrap();
/// assert_eq!(pool.used_bytes(), 1024); // rounded to 512 bytes
/// let addr = a.ptr();
/// drop(a); // back into the cache of stream 7
/// let b = pool.malloc(dev, &stream, 1000).unwrap();
/// assert_eq!(b.ptr(), addr); // reused at once on the same stream
/// ```
pub struct MemoryPool<B: Backend> {
    /// The backend, inside the pool's one observation seam (hooks and history).
    backend: Observed<B>,
    devices: Box<[Device<B>]>,
    /// [`PoolConfig::steal_before_growing`].
    steal: bool,
    /// The history recorder, when a recording is on ([`MemoryPool::start_history`]).
    history: crate::history::RecorderSlot,
    /// Serializes [`MemoryPool::start_history`] and [`MemoryPool::stop_history`].
    history_control: Mutex<()>,
}

impl<B: Backend> MemoryPool<B> {
    /// A pool over every device of `backend`, with the default configuration.
    pub fn new(backend: B) -> Result<Self, PoolError> {
        Self::with_config(backend, PoolConfig::default())
    }

    /// A pool over every device of `backend`.
    pub fn with_config(backend: B, config: PoolConfig) -> Result<Self, PoolError> {
        let count = backend
            .device_count()
            .map_err(PoolError::backend("device_count"))?;
        let mut devices = Vec::with_capacity(count as usize);
        for d in 0..count {
            let id = DeviceId(d);
            let info = backend
                .device_info(id)
                .map_err(PoolError::backend("device_info"))?;
            let page = match info.granularity {
                Some(g) if config.virtual_memory => {
                    if g == 0 || g % policy::ROUND != 0 {
                        return Err(PoolError::Backend {
                            op: "device_info",
                            source: format!("granularity {g} is not a positive multiple of 512")
                                .into(),
                        });
                    }
                    Some(g)
                }
                _ => None,
            };
            let limit = config
                .limit
                .resolve(info.total_memory as usize)?
                .map(|l| l as u64);
            devices.push(Device {
                id,
                info,
                page,
                global: Mutex::new(Global {
                    limit,
                    reserved: Stat::default(),
                    spare: Vec::new(),
                    pages_moved: 0,
                    live_high: 0,
                    retries: 0,
                    ooms: 0,
                    oom_causes: OomCounts::default(),
                    last_oom: None,
                }),
                shards: ShardTable::new(),
                private: ShardTable::new(),
                privates: Mutex::new(Privates::default()),
            });
        }
        Ok(MemoryPool {
            backend: Observed::new(backend),
            devices: devices.into_boxed_slice(),
            steal: config.steal_before_growing,
            history: Default::default(),
            history_control: Mutex::new(()),
        })
    }

    /// The backend (for example to drive a [`SimulatedBackend`](crate::SimulatedBackend)'s clock).
    pub fn backend(&self) -> &B {
        self.backend.inner()
    }

    /// Records only what the pool asks of its backend (segments, pages, fences) into
    /// `recorder` (`None`: stop), not the pool's own mallocs and frees: for the trace replay,
    /// which records those itself in the trace's terms.
    pub(crate) fn record_backend_calls(
        &self,
        recorder: Option<std::sync::Arc<crate::history::Recorder>>,
    ) {
        self.backend.set_recorder(recorder);
    }

    /// The number of devices the pool serves.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Whether `device` uses virtual-memory segments.
    pub fn uses_virtual_memory(&self, device: DeviceId) -> Result<bool, PoolError> {
        Ok(self.device(device)?.page.is_some())
    }

    #[inline]
    fn device(&self, device: DeviceId) -> Result<&Device<B>, PoolError> {
        self.devices
            .get(device.0 as usize)
            .ok_or_else(|| PoolError::InvalidDevice {
                device,
                count: self.devices.len(),
            })
    }

    /// Allocates `size` bytes on `device` for use on `stream`.
    ///
    /// The size is rounded up to 512 bytes. Size 0 returns an empty allocation (null
    /// pointer) without touching the pool. The memory may be in use by earlier work of
    /// `stream` that freed it: stream order makes that safe for work issued to
    /// `stream` after this call; to use the block on another stream, order that stream
    /// after `stream` (for example with an event) and mark it with
    /// [`Allocation::record_stream`], as with any stream-ordered memory.
    ///
    /// The pool keeps a clone of `stream` while blocks made on it are live (see the
    /// crate's `backend` module), and never uses it after letting go of it.
    #[track_caller]
    #[inline]
    pub fn malloc(
        &self,
        device: DeviceId,
        stream: &B::Stream,
        size: usize,
    ) -> Result<Allocation<'_, B>, PoolError> {
        if size == 0 {
            // As CuPy's empty pointer: nothing is looked at, not even the device.
            return Ok(self.empty_allocation(device));
        }
        let dev = self.device(device)?;
        self.malloc_in(dev, &dev.shards, None, stream, size as u64)
    }

    /// The allocation of 0 bytes: the null address, owned by no shard.
    fn empty_allocation(&self, device: DeviceId) -> Allocation<'_, B> {
        Allocation {
            pool: self,
            shard: None,
            raw: RawAllocation {
                id: 0,
                generation: 0,
                ptr: DeviceAddress::NULL,
                size: 0,
                device,
                key: StreamKey(0),
                shard_key: StreamKey(0),
                private: false,
            },
        }
    }

    /// The allocation path of [`malloc`](Self::malloc) and
    /// [`malloc_private`](Self::malloc_private): `key` is `None` for the stream's own
    /// shard in `table`, or a private shard key.
    ///
    /// Inlined into [`malloc`](Self::malloc) for its hot path: the stream's shard in its
    /// home slot serves a block of the same size it freed recently, and the handle is built
    /// with no error value in sight (an error built eagerly, by `ok_or`, was constructed and
    /// dropped on every call). Every other case continues, with the shard still locked, in
    /// [`malloc_search`](Self::malloc_search). The pool pair this path and
    /// [`free_block`](Self::free_block) make was measured in `bench_pool` on the H200
    /// machine: 29 ns, against 57 ns before (one core, interleaved runs).
    #[inline(always)]
    #[track_caller]
    fn malloc_in<'p>(
        &'p self,
        dev: &'p Device<B>,
        table: &'p ShardTable<B>,
        private_key: Option<StreamKey>,
        stream: &B::Stream,
        size: u64,
    ) -> Result<Allocation<'p, B>, PoolError> {
        if size == 0 || self.history.is_on() {
            return self.malloc_search(dev, table, private_key, stream, size, None);
        }
        let (Some(rounded), Ok(stream_key)) =
            (policy::round_size(size), self.backend.stream_key(stream))
        else {
            return self.malloc_search(dev, table, private_key, stream, size, None);
        };
        let key = private_key.unwrap_or(stream_key);
        if let Some(shard) = table.get_home(key) {
            let mut st = shard.state.lock();
            // History again under the lock: a recording started meanwhile has this shard in
            // its baseline, and its malloc must be noted (the search does).
            if !st.retired && st.key == key && st.stream.is_some() && !self.history.is_on() {
                if let Some(id) = st.take_recent(rounded) {
                    // The key names this stream alone (a lingering one's does): it is back.
                    st.resume();
                    let served = st.mark_live(id, size);
                    drop(st);
                    return Ok(self.handle(dev.id, shard, key, key, (id, served), size));
                }
            }
            return self.malloc_search(dev, table, private_key, stream, size, Some((shard, st)));
        }
        self.malloc_search(dev, table, private_key, stream, size, None)
    }

    /// [`malloc_in`](Self::malloc_in) past its hot path; `locked` is the shard the hot path
    /// found and locked, if any (looked at again here as on any first visit).
    #[inline(never)]
    #[track_caller]
    fn malloc_search<'p>(
        &'p self,
        dev: &'p Device<B>,
        table: &'p ShardTable<B>,
        private_key: Option<StreamKey>,
        stream: &B::Stream,
        size: u64,
        locked: Option<(&'p Shard<B>, ShardGuard<'p, ShardState<B>>)>,
    ) -> Result<Allocation<'p, B>, PoolError> {
        let served = self.malloc_search_in(dev, table, private_key, stream, size, locked);
        if served.is_err() && private_key.is_none() {
            self.settle_after_failure(table, stream);
        }
        served
    }

    /// After a request that failed (out of memory, a backend error): the stream's shard may
    /// have attached or resumed the stream and now holds no live block made on it, so its
    /// owner may destroy the stream once this call returns. Let go of it now, while the
    /// caller vouches for it, as a last free does: only a stream the backend says may go
    /// (a kept stream stays), lingering or detaching with its fence.
    #[cold]
    fn settle_after_failure(&self, table: &ShardTable<B>, stream: &B::Stream) {
        let Ok(key) = self.backend.stream_key(stream) else {
            return;
        };
        if let Some(shard) = table.get(key) {
            let mut st = shard.lock_retiring();
            if st.key == key
                && st.is_attached()
                && !st.lingering
                && st.stream_idle()
                && st.may_detach(&self.backend)
            {
                let _ = st.let_go(&self.backend);
            }
        }
    }

    /// [`malloc_search`](Self::malloc_search)'s body.
    #[inline(always)]
    #[track_caller]
    fn malloc_search_in<'p>(
        &'p self,
        dev: &'p Device<B>,
        table: &'p ShardTable<B>,
        private_key: Option<StreamKey>,
        stream: &B::Stream,
        size: u64,
        mut locked: Option<(&'p Shard<B>, ShardGuard<'p, ShardState<B>>)>,
    ) -> Result<Allocation<'p, B>, PoolError> {
        if size == 0 {
            return Ok(self.empty_allocation(dev.id));
        }
        let rounded = policy::round_size(size).ok_or_else(|| PoolError::SizeOverflow {
            size: size as usize,
        })?;
        let stream_key = self.backend.stream_key(stream)?;
        let key = private_key.unwrap_or(stream_key);
        loop {
            let (shard, mut st) = match locked.take() {
                Some(found) => found,
                None => {
                    let found = table.get_home(key).or_else(|| table.get(key));
                    let Some(shard) = found else {
                        self.insert_shard(dev, table, key, stream, private_key.is_some())?;
                        continue;
                    };
                    (shard, shard.state.lock())
                }
            };
            let fast = {
                if st.retired {
                    shard.retire(&mut st);
                    continue;
                }
                if st.key != key {
                    // Adopted by another stream since the lookup: look again.
                    continue;
                }
                if st.stream.is_none() {
                    st.attach(&self.backend, stream, key)?;
                }
                st.resume();
                let r = self
                    .take_cached(&mut st, rounded)?
                    .map(|id| (id, st.mark_live(id, size)));
                if let (true, Some((_, (addr, _)))) = (self.history.is_on(), r) {
                    // Under the shard lock: start_history's baseline is either before or after.
                    let site = std::panic::Location::caller();
                    self.note_malloc(dev.id, key, size, addr, site);
                }
                drop(st);
                r
            };
            let stream_key_of_alloc = key;
            let (shard, shard_key, id, (addr, generation)) = match fast {
                Some((id, served)) => (shard, key, id, served),
                None => match self.malloc_slow(dev, shard, key, stream, size, rounded)? {
                    Some(x) => x,
                    None => continue,
                },
            };
            return Ok(self.handle(
                dev.id,
                shard,
                stream_key_of_alloc,
                shard_key,
                (id, (addr, generation)),
                size,
            ));
        }
    }

    /// The handle of a block just served: `key` is the stream it was made on, `shard_key` the
    /// shard holding it (the lender's for a lent block), `served` its id, address and
    /// generation.
    #[inline(always)]
    fn handle<'p>(
        &'p self,
        device: DeviceId,
        shard: &'p Shard<B>,
        key: StreamKey,
        shard_key: StreamKey,
        (id, (addr, generation)): (u32, (u64, u64)),
        size: u64,
    ) -> Allocation<'p, B> {
        Allocation {
            pool: self,
            shard: Some(shard),
            raw: RawAllocation {
                id,
                generation,
                ptr: DeviceAddress(addr),
                size,
                device,
                key,
                shard_key,
                private: false,
            },
        }
    }

    /// Serves a request from the shard's cache without mapping anything, if possible.
    #[inline]
    fn take_cached(&self, st: &mut ShardState<B>, rounded: u64) -> Result<Option<u32>, PoolError> {
        if let Some(id) = st.take_recent(rounded) {
            return Ok(Some(id));
        }
        if st.has_returns() {
            // Blocks this stream lent out and got back: it waits for their borrowers (on
            // the device) before choosing, so that they coalesce with the free memory
            // around them (see `policy::STEAL_BEFORE_GROWING`).
            st.stream_wait_returns(&self.backend);
        }
        match st.choose_free(rounded) {
            Choice::Ready(id) => Ok(Some(id)),
            Choice::Fit {
                id,
                addr,
                unmapped: 0,
            } => Ok(Some(st.claim(id, addr, rounded))),
            _ => self.take_cached_after_pending(st, rounded),
        }
    }

    #[inline(never)]
    fn take_cached_after_pending(
        &self,
        st: &mut ShardState<B>,
        rounded: u64,
    ) -> Result<Option<u32>, PoolError> {
        if !st.has_pending() {
            return Ok(None);
        }
        st.poll_pending(&self.backend)?;
        match st.choose_block(rounded) {
            Choice::Ready(id) => Ok(Some(id)),
            Choice::Fit {
                id,
                addr,
                unmapped: 0,
            } => Ok(Some(st.claim(id, addr, rounded))),
            _ => Ok(None),
        }
    }

    /// The free of a block handle: the hot path's other half, called from the handle's
    /// drop with three of the handle's fields as values (`key`: the stream it was made
    /// on). Given a reference, or a copy of more fields, the caller kept the handle in
    /// memory and copied it there out of the `Result` that `malloc` returned: wide loads of
    /// fields just stored one by one, which cost about 10 ns a pair on the H200 machines'
    /// Intel CPUs through store-to-load forwarding stalls.
    #[inline(never)]
    fn free_block(
        &self,
        shard: &Shard<B>,
        id: u32,
        generation: u64,
        key: StreamKey,
    ) -> Result<(), PoolError> {
        let mut st = shard.lock_retiring();
        if self.history.is_on() {
            // The block's address and size are the handle's while it is live.
            if let Some((addr, size)) = st.live_extent(id, generation) {
                self.note_free(st.device, key, size, DeviceAddress(addr));
            }
        }
        st.release(&self.backend, id, generation)
    }
}

impl<B: Backend> Drop for MemoryPool<B> {
    /// Waits for the fences of all freed memory and returns everything to the
    /// backend. Raw allocations not yet freed are returned too.
    fn drop(&mut self) {
        for dev in self.devices.iter() {
            let mut g = lock(&dev.global);
            let mut spare = std::mem::take(&mut g.spare);
            for shard in dev.all_shards() {
                let mut st = shard.state.lock();
                // A drop has nowhere to report errors. Frees no completed fence covers
                // (a fence that failed, a stream this thread may not fence) are waited for
                // with the whole device; if even that fails, the shard's memory is leaked
                // rather than unmapped under work that may still use it.
                let fenced = st.wait_fences(&self.backend).is_ok() && st.fully_fenced();
                if !fenced && self.backend.synchronize_device(dev.id).is_err() {
                    continue;
                }
                let released = st.release_everything(&self.backend, &mut spare);
                g.reserved.sub(released);
            }
            for p in spare {
                if let Some(page) = dev.page {
                    // SAFETY: spare pages are this device's, from `create_physical`, unmapped.
                    let _ = unsafe { self.backend.release_physical(dev.id, p, page) };
                    g.reserved.sub(page);
                }
            }
        }
    }
}

impl<B: Backend> std::fmt::Debug for MemoryPool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
