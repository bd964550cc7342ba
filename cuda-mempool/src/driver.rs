//! The driver backend: [`DriverBackend`] implements [`Backend`] over `cuda-core`, and
//! [`DevicePool`] is the pool that serves real GPUs.
//!
//! # Ids and streams
//!
//! * [`DeviceId`]`(n)` is the `CUdevice` ordinal `n` ([`Device::new`]).
//! * The backend's stream type is `cudars_core::Stream`: a request hands one in, which proves
//!   the handle valid, and the pool keeps a clone while blocks made on it are live (see
//!   [`crate::backend`]). Its [`StreamKey`] is [`Stream::identity`]: unique for streams
//!   `cuda-core` created, the handle's value for external streams, 0 for the legacy null
//!   stream. The per-thread default stream names a different stream on every thread: each
//!   thread's gets a key of its own, and the pool uses its handle only from that thread
//!   (a free from another thread, a garbage collector's, leaves the block out of
//!   cross-stream reuse until the owning thread fences it, or until out-of-memory recovery
//!   synchronises the device).
//!
//! # Stream lifetime
//!
//! The pool never keeps a stream longer than it needs: once no block made on a stream is
//! live, it records a fence covering the stream's frees and lets go of its clone, when
//! the stream's owner no longer holds it (an owned stream whose other clones are gone:
//! checked at that free and whenever a new stream appears) or at once for an external
//! stream, which the pool may rely on only while blocks made on it are live. So a program
//! that creates a stream per request and drops it does not leak streams, shards or address
//! space: later streams adopt the idle shards. [`MemoryPool::release_stream`] lets go of
//! an idle stream at once.
//!
//! # Graph captures
//!
//! [`DevicePool::malloc_stream`] (and everything built on it) serves a stream that is being
//! captured into a CUDA graph from a private pool of that capture
//! ([`MemoryPool::malloc_private`]): its memory is reused only by later allocations of the
//! same capture on the same stream, and released once the graph, its clones and every
//! executable graph made from it are destroyed (a CUDA user object owned by the graph tells
//! the pool). Captures begun through `cuda-core`/`cuda-graph` are seen with one atomic load;
//! on external streams (PyTorch's, CuPy's) every allocation asks the driver
//! (`cuStreamGetCaptureInfo`). Captures that foreign code begins on a stream `cuda-core`
//! created are not seen: allocate on such streams through the C ABI or an external
//! wrapper.
//!
//! # Names
//!
//! [`crate::DeviceAddress`] is a bare address, what the pool's algorithm hands out;
//! `cudars_core::DevicePtr` is a view owning its memory, and [`PoolMemory`] converts into it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::graph::CaptureStatus;
use cudars_core::memory::DevicePtr;
use cudars_core::memory::{DeviceAlloc, DeviceMemory, Handover};
use cudars_core::sys::CUdeviceptr;
use cudars_core::vmm::{self, Granularity, PhysicalAllocation, VirtualRange};
use cudars_core::{Device, Event, Stream, StreamKind};

use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, MapRunFailure, StreamKey};
use crate::error::PoolError;
use crate::history::EventKind;
use crate::hooks::{self, MemoryEvent};
use crate::pool::{Allocation, MemoryPool, PrivatePoolId, RawAllocation};

/// The pool over the CUDA driver: [`MemoryPool`] with the [`DriverBackend`].
pub type DevicePool = MemoryPool<DriverBackend>;

/// The pool's [`StreamKey`] of a `cuda-core` stream: [`Stream::identity`] (not
/// `cudars_core::graph::stream_id`, the driver's `cuStreamGetId`).
pub fn stream_key(stream: &Stream) -> StreamKey {
    StreamKey(stream.identity())
}

/// The [`DeviceId`] of a `cuda-core` device: its ordinal.
pub fn device_id(device: &Device) -> DeviceId {
    DeviceId(device.ordinal() as u32)
}

/// A fence of the driver backend: an event (timing disabled) recorded on a stream.
///
/// Opaque: only [`DriverBackend`]'s `record_fence` makes one, it is not `Clone`, and its
/// event cannot be taken out. The backend caches these events and records them again for
/// later fences, so a clone of one held outside would let safe code re-record it and make
/// the pool believe earlier work had completed (a block lent while its last owner's kernel
/// still writes it).
///
/// `Send` and `Sync`, like [`Event`].
#[derive(Debug)]
pub struct DriverFence {
    event: Event,
}

/// [`Backend`] over the CUDA driver, through `cuda-core`:
///
/// | backend method | driver |
/// | --- | --- |
/// | `allocate` / `deallocate` | `cuMemAlloc` / `cuMemFree` ([`DeviceMemory`]) |
/// | `reserve_address_range` / `release_address_range` | `cuMemAddressReserve` / `cuMemAddressFree` ([`VirtualRange`]) |
/// | `create_physical` / `release_physical` | `cuMemCreate` / `cuMemRelease` ([`PhysicalAllocation`]) |
/// | `map` / `unmap` | `cuMemMap` + `cuMemSetAccess` / `cuMemUnmap` |
/// | `record_fence` / `fence_completed` / `wait_fence` | `cuEventRecord` / `cuEventQuery` / `cuEventSynchronize` |
/// | `stream_wait_fence` | `cuStreamWaitEvent` |
///
/// Events are cached per device and reused, so a fence costs no `cuEventCreate` once the
/// pool is warm. Virtual-memory segments are used where the device reports
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, with the minimum
/// granularity (2 MiB on an H200) as page size. Running out of memory in any allocating
/// call is reported as `Ok(None)`; other driver failures as errors.
///
/// `Send` and `Sync`: it holds device handles and a mutex-protected event cache. See the
/// [module documentation](self) for how streams map to [`StreamKey`]s and how long they
/// must live.
///
/// Building one is safe, and so is [`MemoryPool::backend`] handing out the pool's: the
/// methods that act on an address or a page (`deallocate`, `release_address_range`,
/// `release_physical`, `map`, `map_run`, `unmap`) are `unsafe fn` of [`Backend`], and the
/// safe ones only make new memory (which the caller may leak) or work on fences and
/// streams without reaching the pool's events.
#[derive(Debug)]
pub struct DriverBackend {
    devices: Vec<Device>,
    events: Vec<Mutex<Vec<Event>>>,
    /// (device, capture id) pairs whose private pool holds a reference from the capture's
    /// graph; removed when the graph releases it.
    captures: Arc<Mutex<HashSet<(u32, u64)>>>,
    virtual_memory: bool,
    /// Where plain segments come from instead of `cuMemAlloc` ([`Self::with_segments`]).
    segments: Option<Arc<dyn SegmentSource>>,
}

/// Where a driver pool's plain segments come from, instead of `cuMemAlloc`: memory a library
/// needs in a form of its own, made and given back one segment at a time (`cudars-nccl`'s
/// registered pool registers each segment with a communicator as it is made, and
/// deregisters it before it is freed). See [`DriverBackend::with_segments`] and
/// [`MemoryPool::with_segments`].
///
/// # Safety
///
/// [`allocate`](Self::allocate) returns `Ok(Some(addr))` only for `size` bytes at `addr` of
/// device memory of `device` (readable and writable by its copies, memsets and kernels,
/// aligned to at least 512 bytes) that no other live allocation overlaps and that stay valid
/// until given to [`deallocate`](Self::deallocate); `Ok(None)` when the device is out of
/// memory. Its free may rely on the pool's promise below: nothing uses the memory any more.
/// [`export_fd`](Self::export_fd) returns `Some` only for the live segment holding `addr`:
/// `base <= addr < base + size`, and the descriptor is exactly the physical memory mapped at
/// `base..base + size` (the pool hands the importer that memory, and lends the rest of it to
/// others).
pub unsafe trait SegmentSource: Send + Sync + std::fmt::Debug + 'static {
    /// Makes a segment of `size` bytes on `device`.
    fn allocate(&self, device: &Device, size: usize) -> cudars_core::Result<Option<u64>>;

    /// Gives back a segment.
    ///
    /// # Safety
    ///
    /// `addr` and `size` are exactly a segment that [`allocate`](Self::allocate) of this
    /// source made on `device` and that was not given back since; every piece of work that
    /// used it has completed, and nothing will use it again.
    unsafe fn deallocate(&self, device: &Device, addr: u64, size: usize)
        -> cudars_core::Result<()>;

    /// The live segment holding `addr`, exported as a POSIX file descriptor
    /// (`cuMemExportToShareableHandle`): the descriptor, the segment's first address and its
    /// size. `Ok(None)` when no segment of this source holds `addr` or its segments cannot be
    /// shared (the default).
    fn export_fd(&self, addr: u64) -> cudars_core::Result<Option<ExportedSegment>> {
        let _ = addr;
        Ok(None)
    }
}

/// A segment exported as a file descriptor ([`SegmentSource::export_fd`]).
#[derive(Debug)]
pub struct ExportedSegment {
    /// The descriptor of the segment's physical memory.
    pub fd: std::os::fd::OwnedFd,
    /// The segment's first address in this process.
    pub base: u64,
    /// The size of the physical memory (what the importer maps).
    pub size: usize,
}

impl DriverBackend {
    /// A backend over every device of the machine.
    pub fn new() -> cudars_core::Result<DriverBackend> {
        Self::with_devices(Device::all()?)
    }

    /// A backend over every device that uses plain `cuMemAlloc` segments only, even where
    /// virtual memory management is supported.
    pub fn plain() -> cudars_core::Result<DriverBackend> {
        let mut b = Self::new()?;
        b.virtual_memory = false;
        Ok(b)
    }

    /// A backend over every device whose plain segments come from `segments` (and never
    /// virtual-memory segments: the source makes each segment whole).
    pub fn with_segments(segments: Arc<dyn SegmentSource>) -> cudars_core::Result<DriverBackend> {
        let mut b = Self::plain()?;
        b.segments = Some(segments);
        Ok(b)
    }

    fn with_devices(devices: Vec<Device>) -> cudars_core::Result<DriverBackend> {
        let events = devices.iter().map(|_| Mutex::new(Vec::new())).collect();
        Ok(DriverBackend {
            devices,
            events,
            captures: Arc::default(),
            virtual_memory: true,
            segments: None,
        })
    }

    /// Whether plain segments come from a [`SegmentSource`].
    pub(crate) fn has_segment_source(&self) -> bool {
        self.segments.is_some()
    }

    /// The segment of this backend's [`SegmentSource`] holding `addr`, exported as a file
    /// descriptor; `Ok(None)` without a source or when it cannot share. Crate-private: only
    /// an exported block (which keeps its block out of reuse) hands a segment out.
    pub(crate) fn export_segment_fd(
        &self,
        addr: u64,
    ) -> cudars_core::Result<Option<ExportedSegment>> {
        match &self.segments {
            Some(source) => source.export_fd(addr),
            None => Ok(None),
        }
    }

    /// The `cuda-core` device behind `id`.
    pub fn device(&self, id: DeviceId) -> cudars_core::Result<Device> {
        self.devices
            .get(id.0 as usize)
            .copied()
            .ok_or_else(|| cudars_core::Error::InvalidArgument(format!("no device {id}")))
    }
}

/// `Ok(None)` for an out-of-memory error, else the error.
fn oom_to_none<T>(r: cudars_core::Result<T>) -> cudars_core::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_out_of_memory() => Ok(None),
        Err(e) => Err(e),
    }
}

fn to_usize(size: u64) -> cudars_core::Result<usize> {
    usize::try_from(size).map_err(|_| cudars_core::Error::SizeOverflow("pool segment size"))
}

// SAFETY: the contract of `Backend` (its `# Safety`) holds: memory, ranges and pages come
// from cuMemAlloc / cuMemAddressReserve / cuMemCreate and are given back only through the
// unsafe methods; fences are cuEventRecord on the stream asked for, on events that never
// leave the backend (`DriverFence` is opaque, not `Clone`, constructible only here, and
// `release_fence` therefore only receives events this backend created); `stream_key` is
// `Stream::identity`; `is_capturing` asks the driver (errors count as capturing); the safe
// methods free, unmap or re-record nothing a caller hands in.
unsafe impl Backend for DriverBackend {
    type Stream = Stream;
    type Fence = DriverFence;
    type Physical = PhysicalAllocation;
    type Error = cudars_core::Error;

    #[inline]
    fn stream_key(&self, stream: &Stream) -> Result<StreamKey, PoolError> {
        // A lost context, or one reset since this backend (or the stream) was made: the
        // pool hands out nothing of it, cached blocks included (every allocation and
        // record_stream asks for the key first). The old segments stay with the old
        // generation's devices, whose frees the generation check turns into nothing.
        let device = stream.device();
        if let Some(own) = self.devices.get(device.ordinal()) {
            cudars_core::health::usable(own)?;
        }
        // A fault only the framework's calls saw (PyTorch, CuPy through the C ABI): asked of
        // the driver at most once a millisecond per device, a clock read otherwise.
        cudars_core::health::watch(stream)?;
        if stream.kind() == StreamKind::PerThread {
            // CU_STREAM_PER_THREAD names the calling thread's own stream: its cache is that
            // thread's, and the pool uses the handle from that thread only (see
            // `pool::per_thread_key`).
            return Ok(crate::pool::per_thread_key());
        }
        Ok(StreamKey(stream.identity()))
    }

    /// A foreign stream known by the driver's id of it (never reused, so a later request
    /// under the same key is the same stream, valid again), with no keep-alive owner. No
    /// driver call: a lingering stream is used again only by its own requests, in its own
    /// order, as a stream whose last block is not yet freed is (a free during a capture
    /// included).
    #[inline]
    fn may_linger(&self, stream: &Stream) -> bool {
        stream.kind() == StreamKind::External
            && stream.identity_is_unique()
            && stream.clone_count().is_none()
    }

    #[inline]
    fn may_release_stream(&self, stream: &Stream) -> bool {
        match stream.kind() {
            StreamKind::LegacyNull => false,
            // Let go once its blocks are freed, as an external stream: the detach fence is
            // recorded by the owning thread (a free on another thread leaves the shard
            // attached until the owner's next last free).
            StreamKind::PerThread => true,
            // Our clone is the last one: the owner dropped the stream.
            StreamKind::Owned => stream.clone_count() == Some(1),
            // A foreign stream is relied on only while blocks made on it are live, unless
            // a keep-alive owner travels with it (then as an owned one).
            StreamKind::External => stream.clone_count().is_none_or(|n| n == 1),
        }
    }

    fn device_count(&self) -> Result<u32, Self::Error> {
        Ok(self.devices.len() as u32)
    }

    fn device_info(&self, device: DeviceId) -> Result<DeviceInfo, Self::Error> {
        let dev = self.device(device)?;
        let total_memory = dev.total_memory()? as u64;
        let granularity = if self.virtual_memory && vmm::is_supported(&dev)? {
            Some(vmm::granularity(&dev, Granularity::Minimum)? as u64)
        } else {
            None
        };
        Ok(DeviceInfo {
            total_memory,
            granularity,
        })
    }

    fn allocate(&self, device: DeviceId, size: u64) -> Result<Option<DeviceAddress>, Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        if let Some(source) = &self.segments {
            return Ok(source.allocate(&dev, to_usize(size)?)?.map(DeviceAddress));
        }
        let mem = oom_to_none(DeviceMemory::new(&dev, to_usize(size)?))?;
        Ok(mem.map(|m| DeviceAddress(m.into_raw())))
    }

    unsafe fn deallocate(
        &self,
        device: DeviceId,
        ptr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        if let Some(source) = &self.segments {
            // SAFETY: the caller's contract: exactly a segment that `allocate` made through
            // this source (the source never changes), which nothing uses any more.
            return unsafe { source.deallocate(&dev, ptr.0, to_usize(size)?) };
        }
        // SAFETY: the caller's contract: exactly a segment that `allocate` made with
        // cuMemAlloc and detached with `into_raw`, which nothing uses any more. Dropping
        // frees it.
        drop(unsafe { DeviceMemory::from_raw(dev, ptr.0 as CUdeviceptr, to_usize(size)?) });
        Ok(())
    }

    fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        let range = oom_to_none(VirtualRange::reserve(&dev, to_usize(size)?, 0))?;
        Ok(range.map(|r| DeviceAddress(r.into_raw().0)))
    }

    unsafe fn release_address_range(
        &self,
        device: DeviceId,
        base: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        // SAFETY: the caller's contract: exactly one reservation made by
        // `reserve_address_range` (detached with `into_raw`); nothing is mapped in it.
        drop(unsafe { VirtualRange::from_raw(dev, base.0 as CUdeviceptr, to_usize(size)?) });
        Ok(())
    }

    fn create_physical(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<Self::Physical>, Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        oom_to_none(PhysicalAllocation::new(&dev, to_usize(size)?))
    }

    unsafe fn release_physical(
        &self,
        device: DeviceId,
        page: Self::Physical,
    ) -> Result<(), Self::Error> {
        let _ = device;
        let _relaxed = relaxed()?;
        drop(page);
        Ok(())
    }

    unsafe fn map(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page: &Self::Physical,
    ) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        let addr = addr.0 as CUdeviceptr;
        // SAFETY: the caller's contract: a granularity-aligned address inside a range it
        // reserved through this backend and holds, where nothing is mapped.
        unsafe { vmm::map(addr, page, 0, page.size()) }?;
        if let Err(e) = vmm::set_access(addr, page.size(), &dev) {
            let _ctx = dev.bind();
            // SAFETY: the mapping was made just above and nothing uses it yet.
            let _ = unsafe { vmm::unmap(addr, page.size()) };
            return Err(e);
        }
        Ok(())
    }

    unsafe fn map_run(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page_size: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), MapRunFailure<Self::Error>> {
        let fail = |error| MapRunFailure {
            error,
            left_mapped: Vec::new(),
        };
        let _relaxed = relaxed().map_err(fail)?;
        let dev = self.device(device).map_err(fail)?;
        let base = addr.0 as CUdeviceptr;
        let step = to_usize(page_size).map_err(fail)?;
        // Unmaps pages 0..n of the run; the ones that cannot be unmapped stay mapped.
        let undo = |n: usize| -> Vec<usize> {
            let _ctx = dev.bind();
            (0..n)
                .filter(|&j| {
                    // SAFETY: page j of this run was mapped just above and nothing uses it yet.
                    unsafe { vmm::unmap(base + (j * step) as CUdeviceptr, step) }.is_err()
                })
                .collect()
        };
        for (i, page) in pages.iter().enumerate() {
            if let Err(error) =
                // SAFETY: the caller's contract: granularity-aligned addresses inside a range
                // it reserved through this backend and holds, where nothing is mapped.
                unsafe { vmm::map(base + (i * step) as CUdeviceptr, page, 0, page.size()) }
            {
                let left_mapped = undo(i);
                return Err(MapRunFailure { error, left_mapped });
            }
        }
        // One access grant over the whole run.
        if let Err(error) = vmm::set_access(base, step * pages.len(), &dev) {
            let left_mapped = undo(pages.len());
            return Err(MapRunFailure { error, left_mapped });
        }
        Ok(())
    }

    unsafe fn unmap(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        let dev = self.device(device)?;
        let _ctx = dev.bind()?;
        // SAFETY: the caller's contract: exactly one page it mapped, every fence covering
        // work on it completed, no live block touching it.
        unsafe { vmm::unmap(addr.0 as CUdeviceptr, to_usize(size)?) }?;
        Ok(())
    }

    fn record_fence(&self, device: DeviceId, stream: &Stream) -> Result<Self::Fence, Self::Error> {
        let _ = device;
        // The event belongs to the stream's device (a stream of another device can use a
        // block through a peer copy).
        let dev = stream.device();
        let cached = self
            .events
            .get(dev.ordinal())
            .and_then(|c| c.lock().ok().and_then(|mut v| v.pop()));
        let event = match cached {
            Some(e) => e,
            None => Event::new(&dev)?,
        };
        event.record(stream)?;
        Ok(DriverFence { event })
    }

    fn synchronize_stream(&self, stream: &Stream) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        stream.synchronize()
    }

    fn fence_completed(&self, fence: &Self::Fence) -> Result<bool, Self::Error> {
        let _relaxed = relaxed()?;
        fence.event.query()
    }

    fn wait_fence(&self, fence: &Self::Fence) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        fence.event.synchronize()
    }

    fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: &Stream,
        fence: &Self::Fence,
    ) -> Result<(), Self::Error> {
        let _ = device;
        stream.wait_event(&fence.event)
    }

    fn capture_id(&self, stream: &Stream) -> Option<u64> {
        if stream.kind() == StreamKind::LegacyNull {
            return cudars_core::graph::touches_capture(stream).then_some(0);
        }
        match capture_of(stream) {
            Ok(id) => id,
            // An unanswerable question counts as a capture, of no known id.
            Err(_) => Some(0),
        }
    }

    fn synchronize_device(&self, device: DeviceId) -> Result<(), Self::Error> {
        let _relaxed = relaxed()?;
        self.device(device)?.synchronize()
    }

    fn may_synchronize_device(&self, device: DeviceId) -> bool {
        // Captures this process began through cuda-core, those announced (PyTorch's, through
        // the C ABI), and those that allocated from the pool (their graphs still hold private
        // pools): a foreign capture that never allocated here is unknown (see the C header).
        !cudars_core::graph::captures_in_progress()
            && !cudars_core::graph::announced_captures_in_progress()
            && !self
                .captures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .any(|(d, _)| *d == device.0)
    }

    fn is_capturing(&self, stream: &Stream) -> bool {
        if stream.kind() == StreamKind::LegacyNull {
            // No fence on the legacy stream while a blocking stream of its context is
            // captured: it would join the capture (CuPy's captures of blocking streams).
            return cudars_core::graph::touches_capture(stream);
        }
        !matches!(capture_of(stream), Ok(None))
    }

    fn release_fence(&self, fence: Self::Fence) {
        let ordinal = fence.event.device().ordinal();
        if let Some(Ok(mut cache)) = self.events.get(ordinal).map(|c| c.lock()) {
            cache.push(fence.event);
        }
    }
}

impl MemoryPool<DriverBackend> {
    /// A pool over every device of the machine (virtual-memory segments where supported),
    /// configured from the environment ([`PoolConfig::from_env`](crate::PoolConfig::from_env)).
    ///
    /// ```no_run
    /// use cudars_core::{Device, Stream};
    /// use cudars_mempool::DevicePool;
    ///
    /// let pool = DevicePool::new_driver()?;
    /// let stream = Stream::new(&Device::new(0)?)?;
    /// let block = pool.malloc_stream(&stream, 1 << 20)?;
    /// assert_eq!(block.size(), 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_driver() -> Result<DevicePool, PoolError> {
        let backend = DriverBackend::new().map_err(PoolError::Cuda)?;
        MemoryPool::with_config(backend, crate::PoolConfig::from_env()?)
    }

    /// A pool over every device whose segments come from `segments` (plain segments, the
    /// limit and the rest from the environment): see [`SegmentSource`].
    pub fn with_segments(segments: Arc<dyn SegmentSource>) -> Result<DevicePool, PoolError> {
        let backend = DriverBackend::with_segments(segments).map_err(PoolError::Cuda)?;
        let config = crate::PoolConfig {
            virtual_memory: false,
            ..crate::PoolConfig::from_env()?
        };
        MemoryPool::with_config(backend, config)
    }

    /// Allocates `size` bytes on `stream`'s device for use on `stream`. Runs the
    /// `malloc` hooks ([`crate::hooks`]) with the caller's location.
    ///
    /// On a stream being captured into a CUDA graph the block comes from the capture's
    /// private pool (see the [module documentation](self)). The per-thread default stream gets
    /// a cache per thread (see the module documentation).
    #[track_caller]
    #[inline]
    pub fn malloc_stream(
        &self,
        stream: &Stream,
        size: usize,
    ) -> Result<Allocation<'_, DriverBackend>, PoolError> {
        // The hot path: no hooks, and no capture to ask about (one atomic load each).
        if !hooks::any_installed() && !may_be_capturing(stream) {
            return self.malloc(device_id(&stream.device()), stream, size);
        }
        self.malloc_stream_checked(stream, size, std::panic::Location::caller())
    }

    /// [`MemoryPool::malloc_if_busy`] on `stream`'s device, when no hook is installed and no
    /// capture can be running on `stream` (the questions [`malloc_stream`](Self::malloc_stream)
    /// asks, with the same cheap answers); `Ok(None)` otherwise, nothing done. For a caller
    /// that remembers a wrapper of a foreign stream (the C ABI's per-thread memo) and may use
    /// it without asking the driver while a block made on the stream is live.
    #[inline]
    pub fn malloc_stream_if_busy(
        &self,
        stream: &Stream,
        size: usize,
    ) -> Result<Option<Allocation<'_, DriverBackend>>, PoolError> {
        if hooks::any_installed() || may_be_capturing(stream) {
            return Ok(None);
        }
        self.malloc_if_busy(device_id(&stream.device()), stream, size)
    }

    /// [`malloc_stream`](Self::malloc_stream) with hooks or a possible capture.
    #[inline(never)]
    #[track_caller]
    fn malloc_stream_checked(
        &self,
        stream: &Stream,
        size: usize,
        location: &'static std::panic::Location<'static>,
    ) -> Result<Allocation<'_, DriverBackend>, PoolError> {
        let dev = device_id(&stream.device());
        // The event (and the stream key it names) only when a hook will read it: this path
        // also serves every allocation on a foreign or per-thread stream.
        let mut ev = hooks::any_installed().then(|| MemoryEvent {
            kind: EventKind::Malloc,
            device: dev,
            stream: Backend::stream_key(self.backend(), stream).ok(),
            size: size as u64,
            addr: DeviceAddress(0),
            location: Some(location),
        });
        if let Some(ev) = &ev {
            hooks::each(|h| h.malloc_pre(ev));
        }
        let a = match capture_of(stream)? {
            None => self.malloc(dev, stream, size)?,
            Some(capture) => self.malloc_captured(stream, capture, size)?,
        };
        if let Some(ev) = &mut ev {
            ev.addr = a.ptr();
            hooks::each(|h| h.malloc_post(ev));
        }
        Ok(a)
    }

    /// Allocates on a stream being captured (capture id `capture`) from the capture's
    /// private pool, tying the pool's lifetime to the graph on the first allocation.
    #[inline(never)]
    #[track_caller]
    fn malloc_captured(
        &self,
        stream: &Stream,
        capture: u64,
        size: usize,
    ) -> Result<Allocation<'_, DriverBackend>, PoolError> {
        let dev = device_id(&stream.device());
        let pool_id = PrivatePoolId::of_capture(capture);
        let registry = &self.backend().captures;
        let first = registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((dev.0, capture));
        if first {
            // One hold, released once: by the graph's release callback, or here if the graph
            // cannot take it (the callback then never runs).
            let hold = Arc::new(Mutex::new(Some(
                self.retain_any_private_pool(dev, pool_id)?,
            )));
            let graph_hold = Arc::clone(&hold);
            let registry2 = Arc::clone(registry);
            let tied = cudars_core::graph::on_capture_graph_release(
                stream,
                Box::new(move || {
                    registry2
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&(dev.0, capture));
                    let taken = graph_hold
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    if let Some(h) = taken {
                        h.release();
                    }
                }),
            );
            if !matches!(tied, Ok(true)) {
                let taken = hold.lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some(h) = taken {
                    h.release();
                }
                registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&(dev.0, capture));
                return Err(match tied {
                    Err(e) => PoolError::Cuda(e),
                    Ok(_) => PoolError::CaptureInProgress {
                        handle: stream.raw() as usize as u64,
                    },
                });
            }
        }
        self.malloc_in_private(dev, pool_id, stream, size)
    }

    /// Allocates `size` bytes on `stream`'s device as a [`PoolMemory`] that keeps the pool
    /// alive and converts into a `cudars_core` view (`DevicePtr`).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use cudars_core::{memory::DevicePtr, Device, Stream};
    /// use cudars_mempool::DevicePool;
    ///
    /// let pool = Arc::new(DevicePool::new_driver()?);
    /// let stream = Stream::new(&Device::new(0)?)?;
    /// let view: DevicePtr = pool.malloc_shared(&stream, 4096)?.into();
    /// view.memset_async(0, &stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[track_caller]
    pub fn malloc_shared(
        self: &Arc<Self>,
        stream: &Stream,
        size: usize,
    ) -> Result<PoolMemory, PoolError> {
        let block = self.malloc_stream(stream, size)?;
        // After the allocation: the pool may have made the stream wait for other streams'
        // fences, and a fence recorded now (on the per-thread stream, at once) covers them.
        // On error the block is freed as it drops.
        let handover = Handover::new(stream).map_err(PoolError::Cuda)?;
        let raw = block.into_raw();
        Ok(PoolMemory {
            pool: Arc::clone(self),
            ptr: raw.ptr().0,
            size: raw.size(),
            key: raw.stream(),
            raw: Some(raw),
            device: stream.device(),
            handover: Some(handover),
        })
    }
}

/// A block of a shared [`DevicePool`], owning its pool through an `Arc`: what
/// [`DevicePool::malloc_shared`] and [`malloc`] return. It implements `cudars_core`'s
/// [`DeviceAlloc`], so it converts into a `cudars_core::memory::DevicePtr` view (the same
/// view type as `cuda-core`'s own memory). Dropping it (or the last view of it) frees the
/// block on the stream it was allocated on.
///
/// # Ordering
///
/// A block may come from the cache with an earlier owner's work still running on it
/// (ordered before the allocation on its stream only). Every safe use through a `DevicePtr`
/// comes after that work, by the one rule of `cudars_core::memory::Handover`:
/// - on the allocation stream: stream order, nothing more;
/// - on another stream (every asynchronous view operation, `cuda-xfer`, the safe kernel
///   launchers, NCCL collectives, [`record_stream`](Self::record_stream)): that stream first
///   waits on the device for a fence on the allocation stream, once, and is marked so the
///   block's free waits for it;
/// - a synchronous call (the view's `memset`, `copy_from_host`, `copy_to_host`,
///   `copy_from_device`, and anything that calls `DevicePtr::prepare_synchronous_use`):
///   the host waits for that fence, once.
///
/// Once the fence is seen complete, later uses cost one atomic load. Code that takes the
/// bare address ([`as_raw`](Self::as_raw)) into its own unsafe calls must do the same:
/// mark it before work on another stream (through a `DevicePtr` view, `view.record_stream(&
/// issue)` with the `Issue` the work is issued with, which also keeps the block alive in a
/// graph being captured; [`record_stream`](Self::record_stream) here is the pool-level mark
/// alone), `prepare_synchronous_use` before a synchronous call.
///
/// `Send` and `Sync`: an address and an `Arc` of a `Sync` pool.
#[derive(Debug)]
pub struct PoolMemory {
    pool: Arc<DevicePool>,
    /// `Some` until dropped.
    raw: Option<RawAllocation>,
    /// Copied out of `raw` for the accessors.
    ptr: u64,
    size: usize,
    key: StreamKey,
    device: Device,
    /// `Some` until dropped: taken out before the free, so the pool sees the stream's
    /// clones as they are without this one.
    handover: Option<Handover>,
}

impl PoolMemory {
    /// The device address (0 for an empty block).
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr as CUdeviceptr
    }

    /// The size asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The key of the stream it was allocated on.
    pub fn stream(&self) -> StreamKey {
        self.key
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<DevicePool> {
        &self.pool
    }

    /// Marks the block as used on `stream` too, so its reuse also waits for that stream's
    /// work issued before the free (CuPy's `record_stream`-like behaviour).
    ///
    /// It first orders `stream` after the block's earlier owner's work, when `stream` is not
    /// the allocation stream (see the type's Ordering): call it before issuing the work.
    pub fn record_stream(&self, stream: &Stream) -> Result<(), PoolError> {
        match (&self.raw, &self.handover) {
            (Some(raw), Some(handover)) => {
                handover.order_stream(stream).map_err(PoolError::Cuda)?;
                self.pool.record_stream_raw(raw, stream)
            }
            _ => Ok(()),
        }
    }

    /// Blocks the host until the block's earlier owner's work is done (see the type's
    /// Ordering): call it before a synchronous call of your own on the address.
    pub fn prepare_synchronous_use(&self) -> Result<(), PoolError> {
        match &self.handover {
            Some(h) => h.wait_host().map_err(PoolError::Cuda),
            None => Ok(()),
        }
    }
}

// SAFETY: the range is one live pool block of `device`'s memory (plain or mapped with
// read-write access for the device) for as long as this value lives, since it is freed only
// in Drop; the fields never change; no host reference aliases device memory. The pool
// frees in stream order, and `record_stream` marks other streams on the block, so its
// reuse waits for their work (DeviceAlloc's stream-ordered-free rule).
unsafe impl DeviceAlloc for PoolMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr as CUdeviceptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn record_stream(&self, stream: &Stream) -> cudars_core::Result<()> {
        PoolMemory::record_stream(self, stream).map_err(cudars_core::Error::from)
    }
    fn prepare_synchronous_use(&self) -> cudars_core::Result<()> {
        PoolMemory::prepare_synchronous_use(self).map_err(cudars_core::Error::from)
    }
}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        let hooked = hooks::any_installed();
        // The hand-over's clone of the stream goes first: the free decides whether the pool
        // may let go of the stream by counting its clones.
        drop(self.handover.take());
        let Some(raw) = self.raw.take() else {
            return;
        };
        let ev = MemoryEvent {
            kind: EventKind::Free,
            device: raw.device(),
            stream: Some(raw.stream()),
            size: raw.size() as u64,
            addr: raw.ptr(),
            location: None,
        };
        if hooked {
            hooks::each(|h| h.free_pre(&ev));
        }
        // The block is live in this pool by construction; an error (a failed fence record of
        // a record_stream block) leaves it pending, which is safe.
        let _ = self.pool.free_raw(raw);
        if hooked {
            hooks::each(|h| h.free_post(&ev));
        }
    }
}

impl From<PoolMemory> for DevicePtr {
    fn from(m: PoolMemory) -> DevicePtr {
        DevicePtr::new(m)
    }
}

/// The current default pool (null: not made yet). Pools replaced after a reset are leaked,
/// never freed: `default_pool` hands out `&'static` references.
static DEFAULT_POOL: AtomicPtr<Arc<DevicePool>> = AtomicPtr::new(std::ptr::null_mut());
static DEFAULT_POOL_INIT: Mutex<()> = Mutex::new(());

/// [`cudars_core::health::resets`] when the current default pool was made or last found
/// current: while unchanged, no device of the pool can have been reset (one load on every
/// allocation through the default pool, and the C ABI's).
static DEFAULT_POOL_RESETS: AtomicUsize = AtomicUsize::new(0);

/// `true` while every device of `pool` is of its live context generation.
fn current_generation(pool: &DevicePool) -> bool {
    let resets = cudars_core::health::resets();
    if DEFAULT_POOL_RESETS.load(Ordering::Acquire) == resets {
        return true;
    }
    let current = !pool
        .backend()
        .devices
        .iter()
        .any(cudars_core::health::is_stale);
    if current {
        // Another device's reset: this pool is still current.
        DEFAULT_POOL_RESETS.store(resets, Ordering::Release);
    }
    current
}

/// The process-wide default pool (CuPy's `get_default_memory_pool`), created on first use
/// over every device, configured from the environment (see
/// [`LIMIT_ENV_VAR`](crate::LIMIT_ENV_VAR)).
///
/// After a [`Device::reset_after_fault`](cudars_core::Device::reset_after_fault) the next
/// call makes a new default pool: the old one keeps failing closed with
/// `ContextLost` for the reset device (its blocks and segments belong to the old context,
/// and dropping them frees nothing), and what it caches on other devices stays cached there.
///
/// ```no_run
/// let pool = cudars_mempool::default_pool()?;
/// println!("{} bytes cached", pool.free_bytes());
/// # Ok::<(), cudars_mempool::PoolError>(())
/// ```
pub fn default_pool() -> Result<&'static Arc<DevicePool>, PoolError> {
    let known = DEFAULT_POOL.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is a leaked Box, never freed.
    if let Some(p) = unsafe { known.as_ref() } {
        if current_generation(p) {
            return Ok(p);
        }
    }
    // A failed creation is not cached: the next call tries again.
    let _guard = DEFAULT_POOL_INIT.lock().unwrap_or_else(|e| e.into_inner());
    let known = DEFAULT_POOL.load(Ordering::Acquire);
    // SAFETY: as above.
    if let Some(p) = unsafe { known.as_ref() } {
        if current_generation(p) {
            return Ok(p);
        }
    }
    let resets = cudars_core::health::resets();
    let pool: &'static Arc<DevicePool> = Box::leak(Box::new(Arc::new(DevicePool::new_driver()?)));
    DEFAULT_POOL_RESETS.store(resets, Ordering::Release);
    DEFAULT_POOL.store(std::ptr::from_ref(pool).cast_mut(), Ordering::Release);
    Ok(pool)
}

/// Allocates `size` bytes on `stream` from the [`default_pool`], as a `cudars_core` view.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// let stream = Stream::new(&Device::new(0)?)?;
/// let buf = cudars_mempool::driver::malloc(&stream, 1 << 20)?;
/// buf.memset_async(0, &stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn malloc(stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
    Ok(default_pool()?.malloc_shared(stream, size)?.into())
}

/// Whether `stream` may be being captured: streams this crate created only while a capture
/// begun through `cuda-core` runs (one atomic load); external streams always, since foreign
/// code captures them, except those whose captures are announced
/// ([`Stream::external_announced`]: PyTorch's, through the C ABI), only while an announced
/// capture or one of `cuda-core` runs; the legacy stream never.
#[inline]
fn may_be_capturing(stream: &Stream) -> bool {
    capture_question(
        stream.kind(),
        stream.is_implicit(),
        stream.captures_announced(),
        cudars_core::graph::captures_in_progress(),
        cudars_core::graph::announced_captures_in_progress(),
    )
}

/// [`may_be_capturing`]'s rule, as a function of what it reads.
#[inline]
fn capture_question(
    kind: StreamKind,
    implicit: bool,
    announced: bool,
    ours_running: bool,
    announced_running: bool,
) -> bool {
    match kind {
        StreamKind::LegacyNull => false,
        StreamKind::External if announced => ours_running || announced_running,
        StreamKind::External => !implicit,
        // CuPy captures its per-thread stream (`Stream.ptds`): foreign code, so ask.
        StreamKind::PerThread => true,
        StreamKind::Owned => ours_running,
    }
}

/// The id of the capture `stream` is part of, if it is being captured (see
/// [`may_be_capturing`] for when the driver is asked).
#[inline]
fn capture_of(stream: &Stream) -> Result<Option<u64>, PoolError> {
    if !may_be_capturing(stream) {
        return Ok(None);
    }
    let info = cudars_core::graph::capture_info(stream).map_err(PoolError::Cuda)?;
    Ok(match info.status {
        CaptureStatus::None => None,
        CaptureStatus::Active | CaptureStatus::Invalidated => info.id,
    })
}

/// Relaxes the calling thread's capture mode for a backend call: the pool's allocating driver
/// calls must neither fail nor invalidate a capture in global mode that another thread (or
/// this one, for a private pool) has running. (A device-wide synchronisation is not made safe
/// by this: `cuCtxSynchronize` fails during any capture in the context and invalidates it;
/// see [`Backend::may_synchronize_device`].)
fn relaxed() -> cudars_core::Result<cudars_core::graph::RelaxedCaptureMode> {
    cudars_core::graph::RelaxedCaptureMode::new()
}

#[cfg(test)]
mod tests {
    use super::{capture_question, StreamKind};

    #[test]
    fn the_capture_question_is_skipped_only_where_a_capture_would_have_been_seen() {
        use StreamKind::*;
        // (kind, implicit, announced, ours running, announced running) -> ask the driver?
        let cases = [
            (LegacyNull, true, false, true, true, false),
            (PerThread, true, false, false, false, true),
            (Owned, false, false, false, false, false),
            (Owned, false, false, true, false, true),
            // An announced foreign capture says nothing about streams this crate created,
            // whose captures all go through cuda-core.
            (Owned, false, false, false, true, false),
            // Unannounced foreign streams: always, whatever runs.
            (External, false, false, false, false, true),
            (External, true, false, false, false, false),
            // Announced streams: only while some capture that could be theirs runs.
            (External, false, true, false, false, false),
            (External, false, true, false, true, true),
            (External, false, true, true, false, true),
        ];
        for (kind, implicit, announced, ours, theirs, ask) in cases {
            assert_eq!(
                capture_question(kind, implicit, announced, ours, theirs),
                ask,
                "{kind:?} implicit={implicit} announced={announced} ours={ours} theirs={theirs}"
            );
        }
    }
}
