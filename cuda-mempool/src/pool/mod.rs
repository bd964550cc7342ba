//! [`MemoryPool`]: the stream-ordered caching pool, one instance for every device.
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

mod lock;
mod pages;
mod shard;
mod table;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, StreamId};
use crate::error::{OomCause, PoolError};
use crate::policy::{self, size_class};
use crate::stats::{OomCounts, Stat, Stats};

use shard::{Choice, ShardState};
use table::{Inserted, Shard, ShardTable, RETIRED};

/// Environment variable read by [`PoolConfig::from_env`]: a limit applied to every
/// device, in the syntax of [`Limit::parse`] (for example `8589934592` or `50%`).
pub const LIMIT_ENV_VAR: &str = "CUDA_MEMPOOL_LIMIT";

/// A number that identifies the calling thread while it lives (the address of a
/// thread-local): which host thread drives a stream, for [`policy::STEAL_BEFORE_GROWING`].
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| std::ptr::from_ref(t) as usize)
}

/// The bit that marks a [`StreamId`] as the key of one thread's per-thread default stream
/// ([`per_thread_key`]), with bit 63 clear. Keys of other streams never look like that: 0
/// for the legacy stream, a handle's value (a user-space address, below bit 47) for an
/// external stream, a serial number with bit 63 set for a stream `cuda-core` created.
pub(crate) const PER_THREAD_KEY_BIT: u64 = 1 << 62;

/// The key of the calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`): the
/// handle names a different stream on every thread, so each thread's stream gets a key of its
/// own, [`PER_THREAD_KEY_BIT`] with a serial number of the thread, never reused in the
/// process (a new thread never inherits an exited thread's cache as its own stream's).
pub(crate) fn per_thread_key() -> StreamId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        // No destructor: readable for the whole life of the thread, even while it exits.
        static SERIAL: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    StreamId(PER_THREAD_KEY_BIT | SERIAL.with(|s| *s))
}

/// Whether `key` is a per-thread default stream's key ([`per_thread_key`]).
pub(crate) fn is_per_thread_key(key: StreamId) -> bool {
    // Bit 63 marks the identities of streams cuda-core creates; external handles are
    // user-space addresses, far below bit 62.
    key.0 >> 62 == 1
}

/// Whether `key` is the per-thread default stream of a thread other than the calling one.
/// Its handle would name the *calling* thread's stream here, so the pool records no fence
/// on it, makes it wait for nothing and asks nothing about it from this thread: that waits
/// for a call of the owning thread (frees from other threads stay out of cross-stream reuse
/// until then).
pub(crate) fn is_other_threads_stream(key: StreamId) -> bool {
    is_per_thread_key(key) && key != per_thread_key()
}

/// Locks a mutex, ignoring poisoning: no code of this crate panics while holding a
/// lock, and the state is consistent between statements that could.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hard cap on the physical memory the pool may hold on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// No cap.
    Unlimited,
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction (in `[0, 1]`) of the device's total memory.
    Fraction(f64),
}

impl Limit {
    /// Parses a limit: `none` (or an empty string) for no cap, a byte count
    /// (`1073741824`), or a percentage of device memory (`50%`).
    pub fn parse(text: &str) -> Result<Limit, PoolError> {
        let t = text.trim();
        if t.is_empty() || t.eq_ignore_ascii_case("none") {
            return Ok(Limit::Unlimited);
        }
        if let Some(pct) = t.strip_suffix('%') {
            let p: f64 = pct
                .trim()
                .parse()
                .map_err(|_| PoolError::InvalidLimit(format!("not a percentage: {text:?}")))?;
            return Ok(Limit::Fraction(p / 100.0));
        }
        t.parse::<u64>().map(Limit::Bytes).map_err(|_| {
            PoolError::InvalidLimit(format!("not a byte count or percentage: {text:?}"))
        })
    }

    /// The cap in bytes on a device of `total_memory` bytes (`None`: no cap).
    pub fn resolve(self, total_memory: u64) -> Result<Option<u64>, PoolError> {
        match self {
            Limit::Unlimited => Ok(None),
            Limit::Bytes(b) => Ok(Some(b)),
            Limit::Fraction(f) if (0.0..=1.0).contains(&f) => {
                Ok(Some((total_memory as f64 * f).floor() as u64))
            }
            Limit::Fraction(f) => Err(PoolError::InvalidLimit(format!(
                "fraction {f} is not in [0, 1]"
            ))),
        }
    }
}

/// How a pool is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolConfig {
    /// Use virtual-memory segments on devices that support them (the default). When
    /// `false`, or on devices without support, plain segments are used.
    pub virtual_memory: bool,
    /// A limit applied to every device when the pool is built.
    pub limit: Limit,
    /// Before growing, serve a request with free memory other streams' work may still be
    /// using, by making the requesting stream wait for that work on the device (default
    /// [`policy::STEAL_BEFORE_GROWING`], which explains the trade).
    pub steal_before_growing: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            virtual_memory: true,
            limit: Limit::Unlimited,
            steal_before_growing: policy::STEAL_BEFORE_GROWING,
        }
    }
}

impl PoolConfig {
    /// The default configuration, with the limit taken from [`LIMIT_ENV_VAR`] when it
    /// is set.
    pub fn from_env() -> Result<PoolConfig, PoolError> {
        let limit = match std::env::var(LIMIT_ENV_VAR) {
            Ok(v) => Limit::parse(&v)?,
            Err(_) => Limit::Unlimited,
        };
        Ok(PoolConfig {
            limit,
            ..PoolConfig::default()
        })
    }
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

/// The private pools of a device.
#[derive(Default)]
struct Privates {
    pools: HashMap<PrivatePoolId, PrivateState>,
    /// Source of private shard keys (never reused).
    next_key: u64,
}

struct PrivateState {
    /// Holders of the pool: graphs made from captures that allocated from it (their
    /// release callbacks decrement this from a driver thread) and explicit
    /// [`MemoryPool::retain_private_pool`] holds. Released once 0 and no block is live.
    holds: Arc<AtomicUsize>,
    /// Stream key -> the private shard key of that stream's shard in this pool.
    shards: HashMap<StreamId, StreamId>,
}

/// What the slow path hands back: the shard holding the block (the requesting stream's,
/// or the lender's), that shard's key, the block id and (address, generation).
type Served<'p, B> = (&'p Shard<B>, StreamId, u32, (u64, u64));

/// The id of a private pool: memory that only allocations into the same private pool
/// reuse, released as a whole. The driver layer gives each graph capture its own, in a
/// range of ids reserved for it (those with [`PrivatePoolId::CAPTURE_BIT`] set), which the
/// public [`MemoryPool::retain_private_pool`] and [`MemoryPool::malloc_private`] refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrivatePoolId(pub u64);

impl PrivatePoolId {
    /// The bit that marks the private pools of graph captures (the driver layer's, id
    /// `CAPTURE_BIT | capture id`). A capture's graph replays into its pool's memory until
    /// the graph is destroyed, so only the capture's own allocations may use or hold it:
    /// an outside hold released twice, or an outside allocation reusing a block the capture
    /// freed, would let the pool lend memory a graph still writes.
    pub const CAPTURE_BIT: u64 = 1 << 63;

    /// The private pool of graph capture `capture`.
    pub(crate) fn of_capture(capture: u64) -> PrivatePoolId {
        PrivatePoolId(capture | Self::CAPTURE_BIT)
    }

    /// Whether this id is in the range reserved for graph captures.
    pub fn is_capture_pool(self) -> bool {
        self.0 & Self::CAPTURE_BIT != 0
    }
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

/// A stream-ordered caching memory pool serving every device of its backend.
///
/// See the [crate documentation](crate) for the semantics and the
/// [module documentation](self) for the structure. `MemoryPool` is `Send + Sync`:
/// share it by reference (or in an `Arc`) between threads; threads working on
/// different streams do not contend on the hot path.
///
/// ```
/// use cuda_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamId};
///
/// let pool = MemoryPool::new(SimulatedBackend::h200(1)).unwrap();
/// let (dev, stream) = (DeviceId(0), StreamId(7));
/// let a = pool.malloc(dev, &stream, 1000).unwrap();
/// assert_eq!(pool.used_bytes(), 1024); // rounded to 512 bytes
/// let addr = a.ptr();
/// drop(a); // back into the cache of stream 7
/// let b = pool.malloc(dev, &stream, 1000).unwrap();
/// assert_eq!(b.ptr(), addr); // reused at once on the same stream
/// ```
pub struct MemoryPool<B: Backend> {
    backend: B,
    devices: Box<[Device<B>]>,
    /// [`PoolConfig::steal_before_growing`].
    steal: bool,
}

/// A block of device memory from a [`MemoryPool`]; dropping it frees the block.
///
/// The block is freed on the stream it was allocated on: it is reused on that stream
/// at once, and on others only under the fence rule. If the memory was used on other
/// streams too, call [`record_stream`](Self::record_stream) before freeing.
/// Zero-sized allocations have a null pointer and touch nothing.
#[must_use = "dropping an allocation frees it at once"]
pub struct Allocation<'p, B: Backend> {
    pool: &'p MemoryPool<B>,
    shard: Option<&'p Shard<B>>,
    id: u32,
    generation: u64,
    ptr: DeviceAddress,
    size: u64,
    device: DeviceId,
    key: StreamId,
    /// The key of the shard holding the block: `key`, or the lender's for a lent block.
    shard_key: StreamId,
    private: bool,
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
    ptr: DeviceAddress,
    size: u64,
    device: DeviceId,
    key: StreamId,
    /// The key of the shard holding the block (see [`Allocation::held_by`]).
    shard_key: StreamId,
    private: bool,
    id: u32,
    generation: u64,
}

impl RawAllocation {
    /// The device address.
    pub fn ptr(&self) -> DeviceAddress {
        self.ptr
    }
    /// The size asked for.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// The device.
    pub fn device(&self) -> DeviceId {
        self.device
    }
    /// The key of the stream it was allocated on (for a private pool's block, the key
    /// of its private shard).
    pub fn stream(&self) -> StreamId {
        self.key
    }
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
            let limit = config.limit.resolve(info.total_memory)?;
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
            backend,
            devices: devices.into_boxed_slice(),
            steal: config.steal_before_growing,
        })
    }

    /// The backend (for example to drive a [`SimulatedBackend`](crate::SimulatedBackend)'s clock).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The number of devices the pool serves.
    pub fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Whether `device` uses virtual-memory segments.
    pub fn uses_virtual_memory(&self, device: DeviceId) -> Result<bool, PoolError> {
        Ok(self.device(device)?.page.is_some())
    }

    fn device(&self, device: DeviceId) -> Result<&Device<B>, PoolError> {
        self.devices
            .get(device.0 as usize)
            .ok_or(PoolError::InvalidDevice {
                device,
                count: self.devices.len() as u32,
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
    pub fn malloc(
        &self,
        device: DeviceId,
        stream: &B::Stream,
        size: u64,
    ) -> Result<Allocation<'_, B>, PoolError> {
        if size == 0 {
            // As CuPy's empty pointer: nothing is looked at, not even the device.
            return Ok(self.empty_allocation(device));
        }
        let dev = self.device(device)?;
        self.malloc_in(dev, &dev.shards, None, stream, size)
    }

    /// The allocation of 0 bytes: the null address, owned by no shard.
    fn empty_allocation(&self, device: DeviceId) -> Allocation<'_, B> {
        Allocation {
            pool: self,
            shard: None,
            id: 0,
            generation: 0,
            ptr: DeviceAddress::NULL,
            size: 0,
            device,
            key: StreamId(0),
            shard_key: StreamId(0),
            private: false,
        }
    }

    /// The allocation path of [`malloc`](Self::malloc) and
    /// [`malloc_private`](Self::malloc_private): `key` is `None` for the stream's own
    /// shard in `table`, or a private shard key.
    fn malloc_in<'p>(
        &'p self,
        dev: &'p Device<B>,
        table: &'p ShardTable<B>,
        private_key: Option<StreamId>,
        stream: &B::Stream,
        size: u64,
    ) -> Result<Allocation<'p, B>, PoolError> {
        if size == 0 {
            return Ok(self.empty_allocation(dev.id));
        }
        let rounded = policy::round_size(size).ok_or(PoolError::SizeOverflow { size })?;
        let stream_key = self.backend.stream_key(stream)?;
        let key = private_key.unwrap_or(stream_key);
        loop {
            let found = table.get_home(key).or_else(|| table.get(key));
            let Some(shard) = found else {
                self.insert_shard(dev, table, key, stream, private_key.is_some())?;
                continue;
            };
            let fast = {
                let mut st = shard.state.lock();
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
                self.take_cached(&mut st, rounded)?
                    .map(|id| (id, st.mark_live(id, size)))
            };
            let stream_key_of_alloc = key;
            let (shard, shard_key, id, (addr, generation)) = match fast {
                Some((id, served)) => (shard, key, id, served),
                None => match self.malloc_slow(dev, shard, key, stream, size, rounded)? {
                    Some(x) => x,
                    None => continue,
                },
            };
            return Ok(Allocation {
                pool: self,
                shard: Some(shard),
                id,
                generation,
                ptr: DeviceAddress(addr),
                size,
                device: dev.id,
                key: stream_key_of_alloc,
                shard_key,
                private: false,
            });
        }
    }

    /// Creates (or adopts) the shard of `key` in `table` and attaches `stream` to it.
    #[inline(never)]
    fn insert_shard(
        &self,
        dev: &Device<B>,
        table: &ShardTable<B>,
        key: StreamId,
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
            let mut st = shard.state.lock();
            if st.is_attached() && st.stream_idle() {
                let _ = st.detach_if_released(&self.backend);
                if st.retired {
                    shard.retire(&mut st);
                }
            }
        }
    }

    /// Lets the pool forget `stream` now (it detaches from it where no block made on it
    /// is live), instead of at the next new stream. Call it before destroying a foreign
    /// stream whose blocks are all freed, or to bound what the pool holds. Memory the
    /// stream freed stays cached, fenced, for other streams.
    pub fn release_stream(&self, device: DeviceId, stream: &B::Stream) -> Result<(), PoolError> {
        let dev = self.device(device)?;
        let key = self.backend.stream_key(stream)?;
        if let Some(shard) = dev.shards.get(key) {
            let mut st = shard.state.lock();
            if st.key == key && st.stream_idle() {
                let r = st.detach(&self.backend);
                if st.retired {
                    shard.retire(&mut st);
                }
                r?;
            }
        }
        Ok(())
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

    /// The slow path: grows the shard, recovers from memory pressure, or fails with
    /// out of memory after rolling back what it reserved. `Ok(None)` when the shard was
    /// adopted by another key or detached while the lock was dropped: start again.
    #[inline(never)]
    fn malloc_slow<'p>(
        &self,
        dev: &'p Device<B>,
        shard: &'p Shard<B>,
        key: StreamId,
        stream: &B::Stream,
        size: u64,
        rounded: u64,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        // A private shard serves a capture: nothing goes back to the driver now (unmapping
        // or freeing memory during a capture invalidates it: CuPy's test_graph.py).
        let capturing = shard.state.lock().private;
        if !capturing {
            self.collect_private_pools(dev);
        }
        let mut g = lock(&dev.global);
        let mut st = shard.state.lock();
        if st.key != key {
            return Ok(None);
        }
        if st.stream.is_none() {
            st.attach(&self.backend, stream, key)?;
        }
        let served = self.serve_slow(dev, &mut g, shard, &mut st, key, stream, size, rounded);
        if served.is_err() {
            // A failed request may leave no block made on the stream: the shard must not
            // keep a stream its owner may destroy once this call returns (a C caller may).
            self.let_go_if_idle(shard, &mut st);
        }
        served
    }

    /// Lets go of the shard's stream when no block made on it is live and the backend says
    /// it may go (retiring the shard if that fails in a way that leaves its cache unusable).
    fn let_go_if_idle(&self, shard: &Shard<B>, st: &mut ShardState<B>) {
        if st.is_attached() && st.stream_idle() {
            let _ = st.detach_if_released(&self.backend);
            if st.retired {
                shard.retire(st);
            }
        }
    }

    /// [`malloc_slow`](Self::malloc_slow) once the shard is attached: the cache, stealing,
    /// growth, out of memory. Device lock and shard lock held.
    #[allow(clippy::too_many_arguments)]
    fn serve_slow<'p>(
        &self,
        dev: &'p Device<B>,
        g: &mut Global<B>,
        shard: &'p Shard<B>,
        st: &mut ShardState<B>,
        key: StreamId,
        stream: &B::Stream,
        size: u64,
        rounded: u64,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        let thread = thread_token();
        st.thread = thread;
        if let Some(id) = self.take_cached(st, rounded)? {
            return Ok(Some((shard, key, id, st.mark_live(id, size))));
        }
        // A per-thread default stream never borrows: the fence that a borrowed block's free
        // records on the borrower could then be due on a thread that is not the stream's own
        // (a garbage collector freeing it).
        if self.steal
            && !st.private
            && !is_per_thread_key(key)
            && !self.backend.is_capturing(stream)
        {
            if let Some(served) =
                self.steal(dev, g, shard, st, key, stream, size, rounded, thread)?
            {
                // Served from another stream's cache: this shard holds no block made on the
                // stream, so it must not keep a stream its owner may now destroy.
                self.let_go_if_idle(shard, st);
                return Ok(Some(served));
            }
        }
        // A request the device (or its limit) could never hold fails at once, before
        // anything is reserved or released.
        let footprint = policy::round_up(rounded, dev.page.unwrap_or(1)).unwrap_or(u64::MAX);
        let cause = if g.limit.is_some_and(|l| footprint > l) {
            Some(OomCause::Limit)
        } else if footprint > dev.info.total_memory {
            Some(OomCause::DeviceMemory)
        } else {
            None
        };
        if let Some(cause) = cause {
            return Err(self.out_of_memory(dev, g, shard, st, size, cause));
        }
        let peak_before = g.reserved.peak;
        let outcome = self.grow_with_recovery(dev, g, shard, st, rounded);
        match outcome {
            Ok(Ok(id)) => Ok(Some((shard, key, id, st.mark_live(id, size)))),
            Ok(Err(cause)) => {
                // Give back whatever this attempt reserved or mapped and is not in use; the
                // attempt leaves no trace in the peak either.
                let _ = self.roll_back(dev, g, st);
                g.reserved.restore_peak(peak_before);
                Err(self.out_of_memory(dev, g, shard, st, size, cause))
            }
            Err(e) => {
                let _ = self.roll_back(dev, g, st);
                g.reserved.restore_peak(peak_before);
                Err(e)
            }
        }
    }

    /// Serves a request, before the pool grows, with memory other streams' work may still
    /// be using, by making `stream` wait for it on the device (see
    /// [`policy::STEAL_BEFORE_GROWING`]): first this shard's frees pending on other
    /// streams' fences, then mapped free blocks of the device's other shards whose streams
    /// this thread drives (`thread`, see the policy). Nothing is
    /// taken when spare pages already cover what this shard's own cache lacks (growing
    /// then costs no new memory). Device lock and shard lock held.
    #[allow(clippy::too_many_arguments)]
    fn steal<'p>(
        &self,
        dev: &'p Device<B>,
        g: &mut Global<B>,
        shard: &'p Shard<B>,
        st: &mut ShardState<B>,
        key: StreamId,
        stream: &B::Stream,
        size: u64,
        rounded: u64,
        thread: usize,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        if st.has_waitable_pending(&self.backend) {
            st.stream_wait_pending(&self.backend)?;
            if let Some(id) = self.take_cached(st, rounded)? {
                return Ok(Some((shard, key, id, st.mark_live(id, size))));
            }
        }
        if let Choice::Fit { unmapped, .. } = st.choose_block(rounded) {
            if unmapped <= g.spare.len() {
                return Ok(None);
            }
        }
        for other in dev.shards.iter() {
            if std::ptr::eq(other, shard) {
                continue;
            }
            let mut o = other.state.lock();
            if let Some((id, served)) = o.lend(&self.backend, rounded, size, stream, key, thread)? {
                return Ok(Some((other, o.key, id, served)));
            }
        }
        Ok(None)
    }

    /// Grows, then recovers (waits for record_stream frees, waits for every fence and
    /// releases the cache) and retries. `Ok(Err(cause))` when memory stays short.
    fn grow_with_recovery(
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

    /// After a failed request: returns spare pages and this shard's wholly free address
    /// ranges or segments, so the pool holds no more than before the request.
    fn roll_back(
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

    /// Returns every spare (unmapped) page of `dev` to the backend, counting each one off
    /// `reserved` as it goes; a page whose release fails is leaked and stays counted.
    fn release_spare(&self, dev: &Device<B>, g: &mut Global<B>) -> Result<(), PoolError> {
        let Some(page) = dev.page else {
            return Ok(());
        };
        while let Some(p) = g.spare.pop() {
            // SAFETY: spare pages were made by `create_physical` for this device and are
            // mapped nowhere (they go to the spare list only unmapped).
            unsafe { self.backend.release_physical(dev.id, p) }
                .map_err(PoolError::backend("release_physical"))?;
            g.reserved.sub(page);
        }
        Ok(())
    }

    fn out_of_memory(
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

    /// Serves a request from the cache, mapping pages or adding a segment as needed.
    /// `Ok(Err(cause))` when memory is short. Device lock and shard lock held.
    fn grow(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        rounded: u64,
        last_resort: bool,
    ) -> Result<Result<u32, OomCause>, PoolError> {
        let (id, unmapped) = match st.choose_block(rounded) {
            Choice::Ready(id) => return Ok(Ok(id)),
            Choice::Fit { id, addr, unmapped } => (st.claim(id, addr, rounded), unmapped),
            Choice::None => match dev.page {
                Some(page) => {
                    let size = policy::address_range_size(rounded, dev.info.total_memory, page)
                        .ok_or(PoolError::SizeOverflow { size: rounded })?;
                    let base = self
                        .backend
                        .reserve_address_range(dev.id, size)
                        .map_err(PoolError::backend("reserve_address_range"))?;
                    let Some(base) = base else {
                        return Ok(Err(OomCause::AddressSpace));
                    };
                    let first = st.add_segment(base.0, size, size_class(rounded));
                    let unmapped = rounded.div_ceil(page) as usize;
                    (st.claim(first, base.0, rounded), unmapped)
                }
                None => {
                    let seg_size = policy::plain_segment_size(rounded, last_resort)
                        .ok_or(PoolError::SizeOverflow { size: rounded })?;
                    let base = match self.allocate_plain(dev, g, shard, st, seg_size)? {
                        Ok(base) => base,
                        Err(cause) => return Ok(Err(cause)),
                    };
                    let first = st.add_segment(base.0, seg_size, size_class(rounded));
                    (st.claim(first, base.0, rounded), 0)
                }
            },
        };
        if unmapped == 0 {
            return Ok(Ok(id));
        }
        if let Err(cause) = self.provide_pages(dev, g, shard, st, unmapped)? {
            st.unclaim(id);
            return Ok(Err(cause));
        }
        match st.map_block(&self.backend, id, &mut g.spare) {
            Ok(true) => Ok(Ok(id)),
            Ok(false) => {
                st.unclaim(id);
                Ok(Err(OomCause::DeviceMemory))
            }
            Err(e) => {
                st.unclaim(id);
                Err(e)
            }
        }
    }

    /// Makes `g.spare` hold at least `want` pages, within the limit: by reclaiming fenced
    /// free pages (this shard's, then the device's other shards'), or by creating new ones.
    /// Reclaiming comes first, which keeps the footprint at the pages live blocks touch,
    /// unless the device has no limit and the pool holds less than [`policy::MOVE_SLACK`]
    /// allows above the most live memory the device has served: then new pages are created
    /// first; if creating falls short (the device is full), those pages go back and the
    /// request reclaims as it would without the slack.
    fn provide_pages(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        want: usize,
    ) -> Result<Result<(), OomCause>, PoolError> {
        let Some(page) = dev.page else {
            return Ok(Ok(()));
        };
        if g.spare.len() >= want {
            return Ok(Ok(()));
        }
        let bytes = |pages: usize| (pages as u64).saturating_mul(page);
        // Recorded only once the request is served: a request that fails does not raise it.
        let live_high = g
            .live_high
            .max(self.device_used(dev, shard, st).saturating_add(bytes(want)));
        let after = g
            .reserved
            .current
            .saturating_add(bytes(want.saturating_sub(g.spare.len())));
        // A capture's request never moves pages: unmapping during a capture invalidates it.
        let create_first =
            st.private || (g.limit.is_none() && after <= policy::move_slack_budget(live_high));
        let mut moved = 0;
        if !create_first {
            moved += self.reclaim_for(dev, &mut g.spare, shard, st, want)?;
        }
        // Create nothing when the limit cannot take every missing page: pages created
        // for a request that fails anyway would only inflate the footprint.
        let missing = bytes(want.saturating_sub(g.spare.len()));
        if g.limit
            .is_some_and(|l| g.reserved.current.saturating_add(missing) > l)
        {
            return Ok(Err(OomCause::Limit));
        }
        let peak_before = g.reserved.peak;
        let created = self.create_pages(dev, g, want)?;
        if g.spare.len() < want && create_first && !st.private {
            // The device is full: the pages created for this request go back (they are the
            // last pushed), for the device's other users (cuBLAS, NCCL, other processes), and
            // the request moves pages as it would without the slack.
            for _ in 0..created {
                if let Some(p) = g.spare.pop() {
                    // SAFETY: a spare page, made by `create_physical` for this device just
                    // above and mapped nowhere.
                    unsafe { self.backend.release_physical(dev.id, p) }
                        .map_err(PoolError::backend("release_physical"))?;
                    g.reserved.sub(page);
                }
            }
            // Pages held only for a moment leave no trace in the peak.
            g.reserved.restore_peak(peak_before);
            moved += self.reclaim_for(dev, &mut g.spare, shard, st, want)?;
            self.create_pages(dev, g, want)?;
        }
        if g.spare.len() >= want {
            // Counted once the request has every page it needs: a failed request's
            // reclaimed pages are released by the roll-back, not mapped elsewhere.
            g.pages_moved += moved;
            g.live_high = live_high;
            Ok(Ok(()))
        } else {
            Ok(Err(OomCause::DeviceMemory))
        }
    }

    /// Creates pages into `g.spare` until it holds `want` or the device has no more;
    /// returns how many it created.
    fn create_pages(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        want: usize,
    ) -> Result<usize, PoolError> {
        let Some(page) = dev.page else {
            return Ok(0);
        };
        let mut created = 0;
        while g.spare.len() < want {
            let made = self
                .backend
                .create_physical(dev.id, page)
                .map_err(PoolError::backend("create_physical"))?;
            let Some(p) = made else {
                break;
            };
            g.spare.push(p);
            g.reserved.add(page);
            created += 1;
        }
        Ok(created)
    }

    /// Unmaps fenced free pages into `spare` until it holds `want`: this shard's, then
    /// the device's other shards'. Returns the number of pages it added.
    fn reclaim_for(
        &self,
        dev: &Device<B>,
        spare: &mut Vec<B::Physical>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        want: usize,
    ) -> Result<u64, PoolError> {
        let before = spare.len();
        st.reclaim_pages(&self.backend, spare, want)?;
        for other in dev.shards.iter() {
            if spare.len() >= want {
                break;
            }
            if !std::ptr::eq(other, shard) {
                other
                    .state
                    .lock()
                    .reclaim_pages(&self.backend, spare, want)?;
            }
        }
        Ok(spare.len().saturating_sub(before) as u64)
    }

    /// Allocates a plain segment of `size` bytes within the limit, releasing wholly
    /// free fenced segments of the device first when the limit or the backend says no.
    fn allocate_plain(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        size: u64,
    ) -> Result<Result<DeviceAddress, OomCause>, PoolError> {
        let fits = |g: &Global<B>| {
            g.limit
                .is_none_or(|l| g.reserved.current.saturating_add(size) <= l)
        };
        let mut released = false;
        if !fits(g) {
            self.release_device_cache(dev, g, shard, st)?;
            released = true;
            if !fits(g) {
                return Ok(Err(OomCause::Limit));
            }
        }
        loop {
            let ptr = self
                .backend
                .allocate(dev.id, size)
                .map_err(PoolError::backend("allocate"))?;
            if let Some(p) = ptr {
                g.reserved.add(size);
                return Ok(Ok(p));
            }
            if released {
                return Ok(Err(OomCause::DeviceMemory));
            }
            self.release_device_cache(dev, g, shard, st)?;
            released = true;
        }
    }

    /// Releases every fenced cached segment or page of the device (no host waits).
    fn release_device_cache(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
    ) -> Result<(), PoolError> {
        if st.private {
            // Nothing goes back to the driver during a capture (see `malloc_slow`).
            return Ok(());
        }
        // Memory is short: the slack above the live peak restarts from what is live now.
        g.live_high = 0;
        // Counts are updated call by call, so an error midway leaves them exact.
        st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current)?;
        for other in dev.shards.iter() {
            if !std::ptr::eq(other, shard) {
                other.state.lock().release_cached(
                    &self.backend,
                    &mut g.spare,
                    &mut g.reserved.current,
                )?;
            }
        }
        Ok(())
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

    /// Bytes in live blocks of the device, while `shard` is locked as `st`.
    fn device_used(&self, dev: &Device<B>, shard: &Shard<B>, st: &ShardState<B>) -> u64 {
        dev.shards
            .iter()
            .chain(dev.private.iter())
            .map(|s| {
                if std::ptr::eq(s, shard) {
                    st.stats.used.current
                } else {
                    s.state.lock().stats.used.current
                }
            })
            .sum()
    }

    fn free_block(&self, shard: &Shard<B>, id: u32, generation: u64) -> Result<(), PoolError> {
        let mut st = shard.state.lock();
        let r = st.release(&self.backend, id, generation);
        if st.retired {
            shard.retire(&mut st);
        }
        r
    }

    /// The shard a raw handle names, checked live under the shard's lock.
    fn raw_shard(
        &self,
        raw: &RawAllocation,
    ) -> Result<lock::ShardGuard<'_, ShardState<B>>, PoolError> {
        self.raw_shard_and_guard(raw).map(|(_, st)| st)
    }

    /// The shard a raw handle names and its guard, checked live under the shard's lock.
    ///
    /// A block lent to another stream ([`policy::STEAL_BEFORE_GROWING`]) stays in its
    /// lender's shard, which may retire (taken out of the key lookup) while the block is
    /// lent. Such a block is still found: on a miss the device's retired shards are searched
    /// for the live block at the handle's address (one live block per address, so at most
    /// one matches). This path runs only for handles the key lookup cannot place.
    fn raw_shard_and_guard(
        &self,
        raw: &RawAllocation,
    ) -> Result<(&Shard<B>, lock::ShardGuard<'_, ShardState<B>>), PoolError> {
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
            let st = shard.state.lock();
            if st.key == raw.shard_key && is_it(&st) {
                return Ok((shard, st));
            }
        }
        for shard in table.iter() {
            if shard.key() != RETIRED {
                continue;
            }
            let st = shard.state.lock();
            if st.key == RETIRED && st.retired && is_it(&st) {
                return Ok((shard, st));
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
        let (shard, mut st) = self.raw_shard_and_guard(&raw)?;
        let r = st.release(&self.backend, raw.id, raw.generation);
        if st.retired {
            shard.retire(&mut st);
        }
        r
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
        st.record_stream(&self.backend, raw.id, raw.generation, stream, key)
    }

    // ----- private pools (graph captures) ------------------------------------------------

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
    pub fn malloc_private(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
        stream: &B::Stream,
        size: u64,
    ) -> Result<Allocation<'_, B>, PoolError> {
        if pool.is_capture_pool() {
            return Err(PoolError::CapturePrivatePool { pool: pool.0 });
        }
        self.malloc_in_private(device, pool, stream, size)
    }

    /// [`malloc_private`](Self::malloc_private) without the check of the id: the driver
    /// layer's allocations of a capture into the capture's own pool.
    pub(crate) fn malloc_in_private(
        &self,
        device: DeviceId,
        pool: PrivatePoolId,
        stream: &B::Stream,
        size: u64,
    ) -> Result<Allocation<'_, B>, PoolError> {
        let dev = self.device(device)?;
        if size == 0 {
            return self.malloc_in(dev, &dev.private, Some(StreamId(0)), stream, 0);
        }
        let stream_key = self.backend.stream_key(stream)?;
        let key = {
            let mut p = lock(&dev.privates);
            let Privates { pools, next_key } = &mut *p;
            let state = pools.entry(pool).or_insert_with(|| PrivateState {
                holds: Arc::new(AtomicUsize::new(0)),
                shards: HashMap::new(),
            });
            *state.shards.entry(stream_key).or_insert_with(|| {
                *next_key += 1;
                StreamId(*next_key)
            })
        };
        let mut a = self.malloc_in(dev, &dev.private, Some(key), stream, size)?;
        a.private = true;
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
    fn collect_private_pools(&self, dev: &Device<B>) {
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
                // A failed release leaves the page leaked and counted; nothing to report here.
                let _ = self.release_spare(dev, &mut g);
            }
        }
    }

    /// Returns every cached segment and page to the backend: wholly free segments,
    /// and in virtual-memory segments every page no live block touches (CuPy's
    /// `free_all_blocks`).
    ///
    /// This waits on the host for the fences of all freed memory first, since memory
    /// can be returned only once no work uses it; it is meant for phase changes, not
    /// the hot path.
    pub fn free_all_blocks(&self) -> Result<(), PoolError> {
        for dev in self.devices.iter() {
            self.collect_private_pools(dev);
            let mut g = lock(&dev.global);
            self.free_device_blocks(dev, &mut g)?;
        }
        Ok(())
    }

    fn free_device_blocks(&self, dev: &Device<B>, g: &mut Global<B>) -> Result<(), PoolError> {
        // The slack above the live peak restarts from what is live after this
        // (`policy::MOVE_SLACK`): a program that empties its cache after a transient peak gets
        // a footprint that follows its memory from then on.
        g.live_high = 0;
        for shard in dev.shards.iter() {
            let mut st = shard.state.lock();
            st.flush_recent();
            st.wait_fences(&self.backend)?;
            st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current)?;
        }
        self.release_spare(dev, g)
    }

    /// The same as [`free_all_blocks`](Self::free_all_blocks) (CuPy keeps both names).
    pub fn free_all_free(&self) -> Result<(), PoolError> {
        self.free_all_blocks()
    }

    /// Blocks the host until all work that used the currently cached (freed) memory
    /// has finished, on every device and stream, so that this memory becomes reusable
    /// by every stream (its pages may be moved) without further waiting.
    ///
    /// Useful after a phase of work on many streams; the trace replay calls it to model
    /// a device that keeps up with the host (see [`crate::replay`]).
    pub fn synchronize_free_blocks(&self) -> Result<(), PoolError> {
        for dev in self.devices.iter() {
            for shard in dev.shards.iter() {
                let mut st = shard.state.lock();
                if st.has_unfenced_frees() {
                    st.wait_fences(&self.backend)?;
                }
            }
        }
        Ok(())
    }

    /// Sets the hard cap on the physical memory the pool holds on `device`.
    ///
    /// Fails with [`PoolError::LimitBelowUsage`], changing nothing, when the live
    /// blocks alone need more. Otherwise the limit is set and, if the pool holds more
    /// than the new limit, cached memory is released as by
    /// [`free_all_blocks`](Self::free_all_blocks) for this device.
    pub fn set_limit(&self, device: DeviceId, limit: Limit) -> Result<(), PoolError> {
        let dev = self.device(device)?;
        let bytes = limit.resolve(dev.info.total_memory)?;
        let mut g = lock(&dev.global);
        if let Some(b) = bytes {
            let mut in_use = 0;
            let mut used = 0;
            for shard in dev.shards.iter().chain(dev.private.iter()) {
                let st = shard.state.lock();
                in_use += st.live_footprint();
                used += st.stats.used.current;
            }
            if b < in_use {
                return Err(PoolError::LimitBelowUsage {
                    device,
                    limit: b,
                    used,
                    in_use,
                });
            }
        }
        g.limit = bytes;
        if bytes.is_some_and(|b| g.reserved.current > b) {
            self.free_device_blocks(dev, &mut g)?;
        }
        Ok(())
    }

    /// The limit of `device` in bytes, `None` when unlimited.
    pub fn get_limit(&self, device: DeviceId) -> Result<Option<u64>, PoolError> {
        Ok(lock(&self.device(device)?.global).limit)
    }

    /// Statistics of one device (see [`Stats`] for how peaks of totals are defined).
    pub fn stats(&self, device: DeviceId) -> Result<Stats, PoolError> {
        let dev = self.device(device)?;
        let g = lock(&dev.global);
        let spare_bytes = (g.spare.len() as u64).saturating_mul(dev.page.unwrap_or(0));
        let mut s = Stats {
            reserved: g.reserved,
            retries: g.retries,
            pages_moved: g.pages_moved,
            ooms: g.ooms,
            oom_causes: g.oom_causes,
            last_oom: g.last_oom,
            mapped: g.reserved.current.saturating_sub(spare_bytes),
            ..Stats::default()
        };
        drop(g);
        for shard in dev.shards.iter().chain(dev.private.iter()) {
            let st = shard.state.lock();
            s.merge_shard(&st.stats);
            s.shards += 1;
            s.attached_streams += u64::from(st.is_attached());
            s.address_space += st.address_space();
        }
        s.private_pools = lock(&dev.privates).pools.len() as u64;
        Ok(s)
    }

    /// Statistics of one (device, stream) shard, with exact peaks. All zero for a
    /// stream the pool has not seen. A block another stream borrowed from this stream's
    /// cache counts here, in the lender's figures ([`Allocation::held_by`]).
    pub fn stream_stats(&self, device: DeviceId, stream: StreamId) -> Result<Stats, PoolError> {
        let dev = self.device(device)?;
        Ok(dev
            .shards
            .get(stream)
            .map(|s| s.state.lock().stats)
            .unwrap_or_default())
    }

    /// Bytes in live blocks on all devices (CuPy's `used_bytes`).
    pub fn used_bytes(&self) -> u64 {
        self.devices
            .iter()
            .flat_map(|d| d.shards.iter().chain(d.private.iter()))
            .map(|s| s.state.lock().stats.used.current)
            .sum()
    }

    /// Physical bytes the pool holds on all devices (CuPy's `total_bytes`).
    pub fn total_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| lock(&d.global).reserved.current)
            .sum()
    }

    /// Bytes held but not in live blocks on all devices: `total_bytes - used_bytes`
    /// (CuPy's `free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| {
                let g = lock(&d.global);
                let used: u64 = d
                    .shards
                    .iter()
                    .chain(d.private.iter())
                    .map(|s| s.state.lock().stats.used.current)
                    .sum();
                g.reserved.current.saturating_sub(used)
            })
            .sum()
    }

    /// The number of free blocks holding memory on all devices (CuPy's
    /// `n_free_blocks`): coalesced free blocks, counting in virtual-memory segments
    /// only those with mapped memory under them, plus frees waiting for
    /// `record_stream` fences.
    pub fn n_free_blocks(&self) -> usize {
        self.devices
            .iter()
            .flat_map(|d| d.shards.iter())
            .map(|s| s.state.lock().count_free_blocks())
            .sum()
    }
}

impl<B: Backend> Drop for MemoryPool<B> {
    /// Waits for the fences of all freed memory and returns everything to the
    /// backend. Raw allocations not yet freed are returned too.
    fn drop(&mut self) {
        for dev in self.devices.iter() {
            let mut g = lock(&dev.global);
            let mut spare = std::mem::take(&mut g.spare);
            for shard in dev.shards.iter().chain(dev.private.iter()) {
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
                // SAFETY: spare pages are this device's, from `create_physical`, unmapped.
                let _ = unsafe { self.backend.release_physical(dev.id, p) };
                if let Some(page) = dev.page {
                    g.reserved.sub(page);
                }
            }
        }
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
        self.ptr
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether this is a zero-sized allocation.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The key of the stream the block was allocated on and will be freed on (for a
    /// private pool's block, of its private shard).
    pub fn stream(&self) -> StreamId {
        self.key
    }

    /// The key of the stream whose cache holds the block, and whose statistics
    /// ([`MemoryPool::stream_stats`]) count it: [`stream`](Self::stream), or, for a block
    /// another stream's cache lent to this request (see
    /// [`policy::STEAL_BEFORE_GROWING`]), the lender's.
    pub fn held_by(&self) -> StreamId {
        self.shard_key
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
                shard.state.lock().record_stream(
                    &self.pool.backend,
                    self.id,
                    self.generation,
                    stream,
                    key,
                )
            }
            None => Ok(()),
        }
    }

    /// Frees the block now, reporting errors that dropping would swallow (a failed
    /// fence record for a `record_stream` block; the block is still freed safely).
    pub fn free(mut self) -> Result<(), PoolError> {
        match self.shard.take() {
            Some(shard) => self.pool.free_block(shard, self.id, self.generation),
            None => Ok(()),
        }
    }

    /// Detaches the allocation from the pool's lifetime; free it with
    /// [`MemoryPool::free_raw`].
    pub fn into_raw(mut self) -> RawAllocation {
        let raw = RawAllocation {
            ptr: self.ptr,
            size: self.size,
            device: self.device,
            key: self.key,
            shard_key: self.shard_key,
            private: self.private,
            id: self.id,
            generation: self.generation,
        };
        self.shard = None;
        raw
    }
}

impl<B: Backend> Drop for Allocation<'_, B> {
    fn drop(&mut self) {
        if let Some(shard) = self.shard.take() {
            // The only possible error is a failed fence record for a record_stream
            // block, which stays safely pending; `free()` reports it.
            let _ = self.pool.free_block(shard, self.id, self.generation);
        }
    }
}

impl<B: Backend> std::fmt::Debug for Allocation<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("stream", &self.key)
            .field("private", &self.private)
            .finish()
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
