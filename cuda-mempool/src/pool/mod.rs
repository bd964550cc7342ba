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
//! order makes that safe. Other streams never receive A's blocks directly. In
//! virtual-memory mode they receive A's *pages*: when B needs memory and A holds free
//! pages whose frees a completed fence covers, the pages are unmapped from A's range
//! and mapped into B's. In plain-segment mode, wholly free segments whose fences have
//! completed are returned to the backend and allocated anew. Either way cross-stream
//! reuse happens only after a fence recorded after the free has completed (or, for
//! `record_stream` frees, after the owning stream was made to wait on the fences).
//!
//! # Out of memory
//!
//! When a request cannot be served, the pool (1) makes the requesting stream wait on
//! its own pending `record_stream` frees, (2) waits on the host for every outstanding
//! fence of the device and releases what that frees, retrying after each step, and
//! only then (3) fails with [`PoolError::OutOfMemory`]. These host waits happen only on
//! this path, never when a request can be served.

mod lock;
mod shard;
mod table;

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::backend::{Backend, DeviceId, DeviceInfo, DevicePtr, StreamId};
use crate::error::PoolError;
use crate::policy::{self, size_class};
use crate::stats::{Stat, Stats};

use shard::{Choice, ShardState};
use table::{Shard, ShardTable};

/// Environment variable read by [`PoolConfig::from_env`]: a limit applied to every
/// device, in the syntax of [`Limit::parse`] (for example `8589934592` or `50%`).
pub const LIMIT_ENV_VAR: &str = "CUDA_MEMPOOL_LIMIT";

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
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            virtual_memory: true,
            limit: Limit::Unlimited,
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
    retries: u64,
    ooms: u64,
}

struct Device<B: Backend> {
    id: DeviceId,
    info: DeviceInfo,
    /// Page size when this device uses virtual-memory segments.
    page: Option<u64>,
    global: Mutex<Global<B>>,
    shards: ShardTable<B>,
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
/// let a = pool.malloc(dev, stream, 1000).unwrap();
/// assert_eq!(pool.used_bytes(), 1024); // rounded to 512 bytes
/// let addr = a.ptr();
/// drop(a); // back into the cache of stream 7
/// let b = pool.malloc(dev, stream, 1000).unwrap();
/// assert_eq!(b.ptr(), addr); // reused at once on the same stream
/// ```
pub struct MemoryPool<B: Backend> {
    backend: B,
    devices: Box<[Device<B>]>,
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
    generation: u32,
    ptr: DevicePtr,
    size: u64,
    device: DeviceId,
    stream: StreamId,
}

/// An allocation detached from the pool's lifetime by [`Allocation::into_raw`]; give it
/// back with [`MemoryPool::free_raw`]. It frees nothing when dropped (the memory stays
/// allocated until `free_raw`, or until the pool is dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawAllocation {
    ptr: DevicePtr,
    size: u64,
    device: DeviceId,
    stream: StreamId,
    id: u32,
    generation: u32,
}

impl RawAllocation {
    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
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
    /// The stream it was allocated on.
    pub fn stream(&self) -> StreamId {
        self.stream
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
                    retries: 0,
                    ooms: 0,
                }),
                shards: ShardTable::new(),
            });
        }
        Ok(MemoryPool {
            backend,
            devices: devices.into_boxed_slice(),
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
    /// after `stream` (for example with an event) as with any stream-ordered memory.
    pub fn malloc(
        &self,
        device: DeviceId,
        stream: StreamId,
        size: u64,
    ) -> Result<Allocation<'_, B>, PoolError> {
        if size == 0 {
            return Ok(Allocation {
                pool: self,
                shard: None,
                id: 0,
                generation: 0,
                ptr: DevicePtr::NULL,
                size: 0,
                device,
                stream,
            });
        }
        let rounded = policy::round_size(size).ok_or(PoolError::SizeOverflow { size })?;
        let dev = self.device(device)?;
        let shard = dev.shards.get_or_insert(stream, dev.id, dev.page);
        let fast = {
            let mut st = shard.state.lock();
            self.take_cached(&mut st, rounded)?
                .map(|id| (id, st.mark_live(id, size)))
        };
        let (id, (addr, generation)) = match fast {
            Some(x) => x,
            None => self.malloc_slow(dev, shard, size, rounded)?,
        };
        Ok(Allocation {
            pool: self,
            shard: Some(shard),
            id,
            generation,
            ptr: DevicePtr(addr),
            size,
            device,
            stream,
        })
    }

    /// Serves a request from the shard's cache without mapping anything, if possible.
    #[inline]
    fn take_cached(&self, st: &mut ShardState<B>, rounded: u64) -> Result<Option<u32>, PoolError> {
        match st.choose_block(rounded) {
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

    #[inline(never)]
    fn malloc_slow(
        &self,
        dev: &Device<B>,
        shard: &Shard<B>,
        size: u64,
        rounded: u64,
    ) -> Result<(u32, (u64, u32)), PoolError> {
        let mut g = lock(&dev.global);
        let mut st = shard.state.lock();
        if let Some(id) = self.take_cached(&mut st, rounded)? {
            return Ok((id, st.mark_live(id, size)));
        }
        if let Some(id) = self.grow(dev, &mut g, shard, &mut st, rounded, false)? {
            return Ok((id, st.mark_live(id, size)));
        }
        // Recovery 1: this stream waits (on the device) for its own record_stream frees.
        g.retries += 1;
        if st.stream_wait_pending(&self.backend)? {
            if let Some(id) = self.grow(dev, &mut g, shard, &mut st, rounded, false)? {
                return Ok((id, st.mark_live(id, size)));
            }
        }
        // Recovery 2: wait on the host for every fence of the device, release, retry.
        self.quiesce(dev, &mut g, shard, &mut st)?;
        if let Some(id) = self.grow(dev, &mut g, shard, &mut st, rounded, true)? {
            return Ok((id, st.mark_live(id, size)));
        }
        g.ooms += 1;
        let used = self.device_used(dev, shard, &st);
        Err(PoolError::OutOfMemory {
            device: dev.id,
            requested: size,
            used,
            reserved: g.reserved.current,
            limit: g.limit,
        })
    }

    /// Serves a request from the cache, mapping pages or adding a segment as needed.
    /// `Ok(None)` when memory is short. Device lock and shard lock held.
    fn grow(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        rounded: u64,
        last_resort: bool,
    ) -> Result<Option<u32>, PoolError> {
        let (id, unmapped) = match st.choose_block(rounded) {
            Choice::Ready(id) => return Ok(Some(id)),
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
                        return Ok(None);
                    };
                    let first = st.add_segment(base.0, size, size_class(rounded));
                    let unmapped = rounded.div_ceil(page) as usize;
                    (st.claim(first, base.0, rounded), unmapped)
                }
                None => {
                    let seg_size = policy::plain_segment_size(rounded, last_resort)
                        .ok_or(PoolError::SizeOverflow { size: rounded })?;
                    let Some(base) = self.allocate_plain(dev, g, shard, st, seg_size)? else {
                        return Ok(None);
                    };
                    let first = st.add_segment(base.0, seg_size, size_class(rounded));
                    (st.claim(first, base.0, rounded), 0)
                }
            },
        };
        if unmapped == 0 {
            return Ok(Some(id));
        }
        if !self.provide_pages(dev, g, shard, st, unmapped)? {
            st.unclaim(id);
            return Ok(None);
        }
        match st.map_block(&self.backend, id, &mut g.spare) {
            Ok(true) => Ok(Some(id)),
            Ok(false) => {
                st.unclaim(id);
                Ok(None)
            }
            Err(e) => {
                st.unclaim(id);
                Err(e)
            }
        }
    }

    /// Makes `g.spare` hold at least `want` pages: reclaims fenced free pages of this
    /// shard, then of the device's other shards, then creates new pages within the
    /// limit. Reclaiming before creating is what keeps the footprint at the pages that
    /// live blocks touch.
    fn provide_pages(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        shard: &Shard<B>,
        st: &mut ShardState<B>,
        want: usize,
    ) -> Result<bool, PoolError> {
        let Some(page) = dev.page else {
            return Ok(true);
        };
        if g.spare.len() < want {
            st.reclaim_pages(&self.backend, &mut g.spare, want)?;
        }
        for other in dev.shards.iter() {
            if g.spare.len() >= want {
                break;
            }
            if std::ptr::eq(other, shard) {
                continue;
            }
            other
                .state
                .lock()
                .reclaim_pages(&self.backend, &mut g.spare, want)?;
        }
        // Create nothing when the limit cannot take every missing page: pages created
        // for a request that fails anyway would only inflate the footprint.
        let missing = (want.saturating_sub(g.spare.len()) as u64).saturating_mul(page);
        if g.limit
            .is_some_and(|l| g.reserved.current.saturating_add(missing) > l)
        {
            return Ok(false);
        }
        while g.spare.len() < want {
            let created = self
                .backend
                .create_physical(dev.id, page)
                .map_err(PoolError::backend("create_physical"))?;
            let Some(p) = created else {
                break;
            };
            g.spare.push(p);
            g.reserved.add(page);
        }
        Ok(g.spare.len() >= want)
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
    ) -> Result<Option<DevicePtr>, PoolError> {
        let fits = |g: &Global<B>| {
            g.limit
                .is_none_or(|l| g.reserved.current.saturating_add(size) <= l)
        };
        let mut released = false;
        if !fits(g) {
            self.release_device_cache(dev, g, shard, st)?;
            released = true;
            if !fits(g) {
                return Ok(None);
            }
        }
        loop {
            let ptr = self
                .backend
                .allocate(dev.id, size)
                .map_err(PoolError::backend("allocate"))?;
            if let Some(p) = ptr {
                g.reserved.add(size);
                return Ok(Some(p));
            }
            if released {
                return Ok(None);
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
        let mut reserved = g.reserved.current;
        st.release_cached(&self.backend, &mut g.spare, &mut reserved)?;
        for other in dev.shards.iter() {
            if !std::ptr::eq(other, shard) {
                other
                    .state
                    .lock()
                    .release_cached(&self.backend, &mut g.spare, &mut reserved)?;
            }
        }
        g.reserved.current = reserved;
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
        if dev.page.is_none() {
            self.release_device_cache(dev, g, shard, st)?;
        }
        Ok(())
    }

    /// Bytes in live blocks of the device, while `shard` is locked as `st`.
    fn device_used(&self, dev: &Device<B>, shard: &Shard<B>, st: &ShardState<B>) -> u64 {
        dev.shards
            .iter()
            .map(|s| {
                if std::ptr::eq(s, shard) {
                    st.stats.used.current
                } else {
                    s.state.lock().stats.used.current
                }
            })
            .sum()
    }

    fn free_block(&self, shard: &Shard<B>, id: u32, generation: u32) -> Result<(), PoolError> {
        shard.state.lock().release(&self.backend, id, generation)
    }

    /// Frees an allocation detached with [`Allocation::into_raw`]. Fails with
    /// [`PoolError::InvalidHandle`], changing nothing, if it is not live in this pool.
    pub fn free_raw(&self, raw: RawAllocation) -> Result<(), PoolError> {
        if raw.size == 0 {
            return Ok(());
        }
        let shard = self
            .device(raw.device)?
            .shards
            .get(raw.stream)
            .ok_or(PoolError::InvalidHandle { ptr: raw.ptr.0 })?;
        let mut st = shard.state.lock();
        if st.live_range(raw.id, raw.generation).map(|r| r.0) != Some(raw.ptr.0) {
            return Err(PoolError::InvalidHandle { ptr: raw.ptr.0 });
        }
        st.release(&self.backend, raw.id, raw.generation)
    }

    /// Marks a detached allocation as used on `stream` too (see
    /// [`Allocation::record_stream`]).
    pub fn record_stream_raw(
        &self,
        raw: &RawAllocation,
        stream: StreamId,
    ) -> Result<(), PoolError> {
        if raw.size == 0 {
            return Ok(());
        }
        let shard = self
            .device(raw.device)?
            .shards
            .get(raw.stream)
            .ok_or(PoolError::InvalidHandle { ptr: raw.ptr.0 })?;
        let mut st = shard.state.lock();
        if st.live_range(raw.id, raw.generation).map(|r| r.0) != Some(raw.ptr.0) {
            return Err(PoolError::InvalidHandle { ptr: raw.ptr.0 });
        }
        st.record_stream(raw.id, raw.generation, stream)
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
            let mut g = lock(&dev.global);
            self.free_device_blocks(dev, &mut g)?;
        }
        Ok(())
    }

    fn free_device_blocks(&self, dev: &Device<B>, g: &mut Global<B>) -> Result<(), PoolError> {
        let mut reserved = g.reserved.current;
        for shard in dev.shards.iter() {
            let mut st = shard.state.lock();
            st.flush_recent();
            st.wait_fences(&self.backend)?;
            st.release_cached(&self.backend, &mut g.spare, &mut reserved)?;
        }
        g.reserved.current = reserved;
        if let Some(page) = dev.page {
            while let Some(p) = g.spare.pop() {
                self.backend
                    .release_physical(dev.id, p)
                    .map_err(PoolError::backend("release_physical"))?;
                g.reserved.sub(page);
            }
        }
        Ok(())
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
            for shard in dev.shards.iter() {
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
        let mut s = Stats {
            reserved: g.reserved,
            retries: g.retries,
            ooms: g.ooms,
            ..Stats::default()
        };
        for shard in dev.shards.iter() {
            s.merge_shard(&shard.state.lock().stats);
        }
        Ok(s)
    }

    /// Statistics of one (device, stream) shard, with exact peaks. All zero for a
    /// stream the pool has not seen.
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
            .flat_map(|d| d.shards.iter())
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
            for shard in dev.shards.iter() {
                let mut st = shard.state.lock();
                // Errors are ignored: a drop has nowhere to report them, and the
                // memory goes back to the driver with the context in any case.
                let _ = st.wait_fences(&self.backend);
                let released = st.release_everything(&self.backend, &mut spare);
                g.reserved.sub(released);
            }
            for p in spare {
                let _ = self.backend.release_physical(dev.id, p);
                if let Some(page) = dev.page {
                    g.reserved.sub(page);
                }
            }
        }
    }
}

impl<'p, B: Backend> Allocation<'p, B> {
    /// The device address (null for a zero-sized allocation).
    pub fn ptr(&self) -> DevicePtr {
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

    /// The stream the block was allocated on and will be freed on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The pool the block came from.
    pub fn pool(&self) -> &'p MemoryPool<B> {
        self.pool
    }

    /// Marks the block as used on `stream` too (PyTorch's `record_stream`): when it
    /// is freed, a fence is recorded on `stream` and the block is not reused, by any
    /// stream, before that fence has completed.
    pub fn record_stream(&self, stream: StreamId) -> Result<(), PoolError> {
        match self.shard {
            Some(shard) => shard
                .state
                .lock()
                .record_stream(self.id, self.generation, stream),
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
            stream: self.stream,
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
            .field("stream", &self.stream)
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
