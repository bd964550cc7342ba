//! The [`Backend`] trait: what the pool needs from a device.
//!
//! The pool's algorithm never talks to the CUDA driver itself. It asks a backend for
//! address ranges, physical memory and stream-ordering fences, and everything else
//! (splitting, coalescing, reuse rules, accounting) happens on the CPU. Two backends
//! exist or are planned:
//!
//! * [`SimulatedBackend`](crate::SimulatedBackend), in this crate: fake addresses,
//!   a configurable capacity and a virtual clock, for model tests and trace replays;
//! * the driver backend (built on `cuda-core`), where each method maps onto one or a
//!   few driver calls, as listed on each method below.
//!
//! Devices and streams are opaque ids to the pool ([`DeviceId`], [`StreamKey`]); the
//! backend knows what they stand for (a `CUdevice` ordinal and a `CUstream` handle).
//!
//! # Two ways to back a segment
//!
//! * **Plain segments** ([`Backend::allocate`] / [`Backend::deallocate`],
//!   `cuMemAlloc` / `cuMemFree`): one allocation is one segment; it can only be
//!   returned whole.
//! * **Virtual-memory segments** (when [`DeviceInfo::granularity`] is `Some`): the
//!   pool reserves a large address range ([`Backend::reserve_address_range`],
//!   `cuMemAddressReserve`), creates physical pages of exactly one granularity each
//!   ([`Backend::create_physical`], `cuMemCreate`) and maps them where blocks need them
//!   ([`Backend::map`], `cuMemMap` + `cuMemSetAccess`). A page no live block touches
//!   can be unmapped ([`Backend::unmap`], `cuMemUnmap`) and mapped again elsewhere, in
//!   the same segment or another one, or released ([`Backend::release_physical`],
//!   `cuMemRelease`). Segments thereby grow in place, and the pool's footprint is the
//!   number of physical pages it holds, not the address space it reserved.
//!
//! # Streams and fences
//!
//! The pool never turns a number into a stream. Every request comes with a
//! [`Backend::Stream`] (for the driver backend a `cudars_core::Stream`, whose existence
//! proves the handle valid), and the pool keeps a clone of it, *attached* to the stream's
//! cache, only while it may need it. It lets go of it (*detaches*) when no block made on
//! the stream is live any more and [`Backend::may_release_stream`] says the owner may
//! destroy the stream: first it records a fence covering every free on the stream, so
//! that nothing it caches from that stream is ever reused without that fence, then it
//! hands the clone back ([`Backend::stream_released`]). A stream is used only between
//! the call that handed it in and that detach; a later request on the same key (the
//! same stream, or a new stream that got the old handle's value) re-attaches and first
//! makes its stream wait for the detach fence if it has not completed.
//!
//! A fence is a point in one stream's work (`cuEventRecord`). While a stream is
//! attached, the pool records its fences lazily, on its slow path, never on the hot path
//! of `malloc`/`free`: a fence recorded *after* a free covers all the work issued before
//! that free, so a late fence is as safe as one recorded at the free itself, only more
//! conservative.

use std::fmt;

pub use crate::device_id::DeviceId;

/// The key of a stream's cache in the pool ([`Backend::stream_key`]): for the driver
/// backend `cudars_core::Stream::identity` (unique for streams `cuda-core` created, the
/// handle's value for external streams, 0 for the legacy default stream). The pool never
/// turns a key back into a stream; it only compares keys. It is not the driver's stream id
/// (`cuStreamGetId`, `cudars_core::graph::stream_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamKey(pub u64);

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A bare device address (`CUdeviceptr`): what the pool's algorithm hands out and what
/// [`Allocation::ptr`](crate::Allocation::ptr) returns. It owns nothing; the view that owns
/// its memory is `cudars_core::DevicePtr` (see [`PoolMemory`](crate::PoolMemory)).
/// `DeviceAddress(0)` is the null address that zero-sized allocations carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DeviceAddress(pub u64);

impl DeviceAddress {
    /// The null device pointer.
    pub const NULL: DeviceAddress = DeviceAddress(0);

    /// The address as an integer.
    pub fn addr(self) -> u64 {
        self.0
    }

    /// Whether this is the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for DeviceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// What the pool needs to know about a device, asked once when the pool is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Total device memory in bytes (`cuDeviceTotalMem`); the base of fractional limits
    /// and the size of the address range reserved for large blocks.
    pub total_memory: u64,
    /// The page size of virtual-memory segments (`cuMemGetAllocationGranularity`,
    /// 2 MiB on an H200), or `None` when the device does not support virtual memory
    /// management and the pool must use plain segments. Must be a multiple of 512.
    pub granularity: Option<u64>,
}

/// Everything the pool asks of a device: memory, address space and fences.
///
/// Implementations must be cheap to call concurrently (`Sync`); the pool calls them
/// only on its slow path (misses, releases, record-stream frees), never on the hot
/// path of a cached `malloc`/`free`.
///
/// Errors: a method returns `Err` for a failure of the backend itself (a driver
/// error). Running out of memory is not an error: the allocating methods return
/// `Ok(None)`, so the pool can release cached memory and retry.
///
/// # Who may call what
///
/// [`MemoryPool::backend`](crate::MemoryPool::backend) hands the pool's backend to anyone,
/// so every *safe* method of this trait can be called by any code, with any arguments, at
/// any time, also while the pool serves blocks. The methods that act on an address or a
/// page handed in ([`deallocate`](Self::deallocate),
/// [`release_address_range`](Self::release_address_range),
/// [`release_physical`](Self::release_physical), [`map`](Self::map),
/// [`map_run`](Self::map_run), [`unmap`](Self::unmap)) are `unsafe fn`: each one's
/// `# Safety` section says what its caller promises, and the pool's calls keep it (each
/// call carries a `SAFETY` comment saying why).
///
/// # Safety
///
/// The pool turns what a backend tells it into memory it hands out as owned (for the driver
/// backend, `cudars_core::DevicePtr` views), so an implementation must keep these promises:
///
/// * **Memory.** [`allocate`](Self::allocate) returns a range of at least `size` bytes that
///   no other live allocation of the device overlaps and that stays valid until it is given
///   to [`deallocate`](Self::deallocate); [`reserve_address_range`](Self::reserve_address_range)
///   returns address space nothing else uses until
///   [`release_address_range`](Self::release_address_range);
///   [`create_physical`](Self::create_physical) returns a page of exactly `size` bytes that
///   only its holder can map; [`map`](Self::map) / [`map_run`](Self::map_run) make the pages
///   readable and writable by the device at exactly the addresses asked for, or report that
///   they did not ([`MapRunFailure::left_mapped`] is exact).
/// * **Fences.** A fence returned by [`record_fence`](Self::record_fence) completes
///   ([`fence_completed`](Self::fence_completed), [`wait_fence`](Self::wait_fence),
///   [`stream_wait_fence`](Self::stream_wait_fence)) only after all work issued to the
///   stream before the call; [`synchronize_stream`](Self::synchronize_stream) returns only
///   after all of it. Nothing safe code can do from outside the backend can make a fence the
///   pool holds complete earlier: [`Self::Fence`] values cannot be forged, and whatever a
///   fence stands on (the driver backend's cached events) cannot be reached, cloned or
///   recorded again from outside; [`release_fence`](Self::release_fence) accepts any
///   `Self::Fence` value, so every such value must be one the backend made.
/// * **Streams.** [`stream_key`](Self::stream_key) gives equal keys only to streams whose
///   work is ordered (the same stream, or one that took a destroyed one's handle value, which
///   the pool orders after the old one's fence); [`may_linger`](Self::may_linger) is `true`
///   only for a stream whose key no other stream ever gets, not even after it is destroyed
///   (the pool hands a lingering stream's unfenced cache to the next request with that key);
///   [`is_capturing`](Self::is_capturing) is `true` whenever work issued to the stream is
///   recorded into a graph rather than run.
/// * **Safe methods are harmless.** Calling any safe method from outside the pool, with any
///   arguments, changes nothing the pool relies on: it neither frees, unmaps nor remaps
///   memory or address space the pool holds, nor changes the meaning of a fence the pool
///   holds. (Leaking what it returns is fine.)
/// * `Send`/`Sync` types are honest: the pool calls every method from any thread.
pub unsafe trait Backend: Send + Sync + 'static {
    /// A stream the pool may record fences on and make wait: what a request hands in and
    /// what the pool keeps (cloned) while it needs it (a `cudars_core::Stream` for the
    /// driver backend, a [`StreamKey`] for the simulated one).
    type Stream: Clone + Send + Sync + 'static;
    /// A stream-ordering fence (a recorded `CUevent` for the driver backend).
    type Fence: Send + 'static;
    /// One physical page of a virtual-memory segment
    /// (a `CUmemGenericAllocationHandle`).
    type Physical: Send + 'static;
    /// The backend's error type.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The number of devices; the pool serves ids `0..device_count()`.
    fn device_count(&self) -> Result<u32, Self::Error>;

    /// Capacity and virtual-memory support of one device.
    fn device_info(&self, device: DeviceId) -> Result<DeviceInfo, Self::Error>;

    /// Allocates a plain segment of `size` bytes (`cuMemAlloc`), aligned to at least
    /// 512 bytes. `Ok(None)` when the device is out of memory.
    fn allocate(&self, device: DeviceId, size: u64) -> Result<Option<DeviceAddress>, Self::Error>;

    /// Returns a plain segment (`cuMemFree`). The pool calls it only once every fence
    /// covering work on the segment has completed.
    ///
    /// # Safety
    ///
    /// `ptr` and `size` are exactly a segment that [`allocate`](Self::allocate) of this
    /// backend returned for `device` and that was not deallocated since; nothing uses its
    /// memory any more (no live block, no pending device work), and nothing will.
    unsafe fn deallocate(
        &self,
        device: DeviceId,
        ptr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error>;

    /// Reserves `size` bytes of address space, aligned to the granularity, with no
    /// memory behind it (`cuMemAddressReserve`). `Ok(None)` when the address space is
    /// exhausted. `size` is a multiple of the granularity.
    fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error>;

    /// Gives back an address range from [`reserve_address_range`](Self::reserve_address_range)
    /// (`cuMemAddressFree`); nothing is mapped in it any more.
    ///
    /// # Safety
    ///
    /// `base` and `size` are exactly a range that
    /// [`reserve_address_range`](Self::reserve_address_range) of this backend returned for
    /// `device` and that was not released since; no page is mapped in it, and nothing uses
    /// an address of it any more.
    unsafe fn release_address_range(
        &self,
        device: DeviceId,
        base: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error>;

    /// Creates one physical page of `size` bytes, the device's granularity
    /// (`cuMemCreate`). `Ok(None)` when the device is out of memory.
    fn create_physical(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<Self::Physical>, Self::Error>;

    /// Releases a physical page that is mapped nowhere (`cuMemRelease`).
    ///
    /// # Safety
    ///
    /// `page` was made by [`create_physical`](Self::create_physical) of this backend for
    /// `device`, and is mapped nowhere.
    unsafe fn release_physical(
        &self,
        device: DeviceId,
        page: Self::Physical,
    ) -> Result<(), Self::Error>;

    /// Maps `page` at `addr` (granularity-aligned, inside a reserved range) and makes it
    /// readable and writable by the device (`cuMemMap` + `cuMemSetAccess`).
    ///
    /// # Safety
    ///
    /// `addr` is granularity-aligned, inside a range the caller reserved through
    /// [`reserve_address_range`](Self::reserve_address_range) of this backend for `device`
    /// and still holds, and nothing is mapped at it; `page` is a page of this backend for
    /// `device` that is mapped nowhere.
    unsafe fn map(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page: &Self::Physical,
    ) -> Result<(), Self::Error>;

    /// Maps `pages` at consecutive addresses `page_size` apart from `addr`, all of them
    /// readable and writable by the device. All or nothing, as far as the backend can: on
    /// error, [`MapRunFailure::left_mapped`] lists the pages (indices into `pages`) that
    /// stay mapped because undoing them failed too; the pool then keeps them as mapped.
    ///
    /// The default maps one page at a time with [`map`](Self::map); the driver backend
    /// overrides it to grant access once over the whole run (one `cuMemSetAccess` instead
    /// of one per page, which is what makes growing a segment expensive).
    ///
    /// # Safety
    ///
    /// As [`map`](Self::map), for every page of the run: the whole run
    /// `addr..addr + pages.len() * page_size` lies in one range the caller holds, nothing is
    /// mapped in it, `page_size` is the device's granularity, and every page is mapped
    /// nowhere.
    unsafe fn map_run(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page_size: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), MapRunFailure<Self::Error>> {
        for (i, page) in pages.iter().enumerate() {
            // SAFETY: page `i` of the run, at its address: the caller's contract covers it.
            let mapped =
                unsafe { self.map(device, DeviceAddress(addr.0 + i as u64 * page_size), page) };
            if let Err(error) = mapped {
                let left_mapped = (0..i)
                    .filter(|&j| {
                        // SAFETY: page `j` was mapped just above, at this address, and
                        // nothing uses it yet: the run is not handed to the pool.
                        unsafe {
                            self.unmap(
                                device,
                                DeviceAddress(addr.0 + j as u64 * page_size),
                                page_size,
                            )
                        }
                        .is_err()
                    })
                    .collect();
                return Err(MapRunFailure { error, left_mapped });
            }
        }
        Ok(())
    }

    /// Unmaps the one page mapped at `addr` (`cuMemUnmap`). The pool calls it only
    /// when every fence covering work on that page has completed on the host side:
    /// unmapping is not stream-ordered.
    ///
    /// # Safety
    ///
    /// A page of `size` bytes (the device's granularity) that the caller mapped at `addr`
    /// through this backend is mapped there; no live block touches it and every fence
    /// covering work on it has completed, so nothing uses it any more.
    unsafe fn unmap(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error>;

    /// The key of `stream`'s cache. Errors for a stream the pool must not cache on (the
    /// driver backend refuses the per-thread default stream, which names a different
    /// stream on every thread).
    fn stream_key(&self, stream: &Self::Stream) -> Result<StreamKey, crate::PoolError>;

    /// Whether the pool may let go of its clone of `stream` now that no block made on it
    /// is live: `true` when nobody else keeps the stream (an owned stream whose other
    /// clones are gone) or when the pool may rely on it only while blocks are live (a
    /// foreign stream); `false` to keep it (the legacy default stream, a stream the user
    /// still holds). Called on the free of a stream's last live block, so it must be cheap.
    fn may_release_stream(&self, stream: &Self::Stream) -> bool;

    /// Whether the pool may keep `stream` past the free of its last live block without a
    /// fence, *lingering*, when [`may_release_stream`](Self::may_release_stream) says it may
    /// go: only for a stream whose [`stream_key`](Self::stream_key) names it alone for the
    /// life of the process (so a request under that key proves the same stream is back and
    /// valid). A lingering stream is never used again until such a request comes: its owner
    /// may destroy it. Called on the free of a stream's last live block, so it must be cheap.
    /// The default never lingers.
    fn may_linger(&self, stream: &Self::Stream) -> bool {
        let _ = stream;
        false
    }

    /// The pool keeps a clone of `stream` (attaching it to a shard, or marking a block with
    /// it); every such clone is given back through [`stream_released`](Self::stream_released).
    /// The default clones.
    fn retain_stream(&self, stream: &Self::Stream) -> Self::Stream {
        stream.clone()
    }

    /// The pool gives back its clone of a stream (after recording the fence that covers
    /// every free on it). The default drops it.
    fn stream_released(&self, stream: Self::Stream) {
        drop(stream);
    }

    /// Records a fence on `stream`: it completes once all work issued to the stream so
    /// far has completed (`cuEventRecord`, events created with timing disabled).
    fn record_fence(
        &self,
        device: DeviceId,
        stream: &Self::Stream,
    ) -> Result<Self::Fence, Self::Error>;

    /// Blocks the host until all work issued to `stream` has completed
    /// (`cuStreamSynchronize`): the fallback when a fence cannot be recorded on a stream the
    /// pool is about to let go of.
    fn synchronize_stream(&self, stream: &Self::Stream) -> Result<(), Self::Error>;

    /// Whether the fence has completed, without blocking (`cuEventQuery`).
    fn fence_completed(&self, fence: &Self::Fence) -> Result<bool, Self::Error>;

    /// Blocks the host until the fence has completed (`cuEventSynchronize`). The pool
    /// uses it only off the hot path: out of memory, `free_all_blocks`, `set_limit`,
    /// and the explicit [`MemoryPool::synchronize_free_blocks`](crate::MemoryPool::synchronize_free_blocks).
    fn wait_fence(&self, fence: &Self::Fence) -> Result<(), Self::Error>;

    /// Makes all work issued to `stream` from now on wait for the fence, without
    /// blocking the host (`cuStreamWaitEvent`).
    fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: &Self::Stream,
        fence: &Self::Fence,
    ) -> Result<(), Self::Error>;

    /// Whether `stream` is being captured into a graph now (work issued to it is recorded,
    /// not run, so a fence recorded there would be part of the graph). Errors count as
    /// capturing. The default: streams are never captured.
    fn is_capturing(&self, stream: &Self::Stream) -> bool {
        let _ = stream;
        false
    }

    /// The id of the capture `stream` is part of now, if it is being captured (unique in the
    /// process while the capture runs). The default knows no ids: `Some(0)` whenever
    /// [`is_capturing`](Self::is_capturing) says so.
    fn capture_id(&self, stream: &Self::Stream) -> Option<u64> {
        self.is_capturing(stream).then_some(0)
    }

    /// Blocks the host until all work issued to `device` so far, on every stream, has
    /// completed (`cuCtxSynchronize`): what releasing a graph's private pool falls back to
    /// when some eager work on its memory is covered by no fence. The default does nothing,
    /// which is right only for a backend whose work is always complete.
    fn synchronize_device(&self, device: DeviceId) -> Result<(), Self::Error> {
        let _ = device;
        Ok(())
    }

    /// Whether [`synchronize_device`](Self::synchronize_device) may run now as an
    /// optional step (the out-of-memory recovery's): `false` while a capture may be running
    /// on the device, since a device-wide wait fails during any capture in the context and
    /// invalidates it, whatever the calling thread's capture mode. The default: `true`.
    fn may_synchronize_device(&self, device: DeviceId) -> bool {
        let _ = device;
        true
    }

    /// Gives a fence back once the pool no longer needs it (`cuEventDestroy`, or back
    /// into the backend's own cache of events). Cannot fail from the pool's point of view.
    /// Safe: a `Self::Fence` value is always one the backend made (see the trait's
    /// `# Safety`), and once given back nothing outside the backend can reach it.
    fn release_fence(&self, fence: Self::Fence);
}

/// A failed [`Backend::map_run`]: the error, and the pages left mapped.
#[derive(Debug)]
pub struct MapRunFailure<E> {
    /// What failed.
    pub error: E,
    /// Indices (into the `pages` argument) of pages that stay mapped at their address.
    pub left_mapped: Vec<usize>,
}
