//! The driver backend: [`DriverBackend`] implements [`Backend`] over `cuda-core`, and
//! [`DevicePool`] is the pool that serves real GPUs.
//!
//! # Ids
//!
//! * [`DeviceId`]`(n)` is the `CUdevice` ordinal `n` ([`Device::new`]).
//! * [`StreamId`] is the raw `CUstream` handle as an integer ([`stream_id`]):
//!   `StreamId(0)` is the legacy null stream, `StreamId(2)` the per-thread default
//!   stream (`CU_STREAM_PER_THREAD`). The pool never dereferences an id; the backend
//!   turns it back into a non-owning [`Stream`] when it records a fence or makes a
//!   stream wait.
//!
//! # Stream lifetime
//!
//! Fences are recorded lazily (see [`crate::backend`]), so the backend may record an
//! event on a stream some time after the last block of that stream was freed. The stream
//! handle must then still be valid. The `Stream`-taking entry points
//! ([`DevicePool::malloc_stream`], [`DevicePool::malloc_shared`], [`malloc`]) therefore
//! keep a clone of every stream they see for the life of the pool (a clone of an owned
//! `cuda_core::Stream` keeps the stream from being destroyed). Callers that use
//! [`MemoryPool::malloc`] with raw [`StreamId`]s must keep those streams alive themselves
//! while the pool caches their blocks. The legacy and per-thread default streams are never
//! destroyed.
//!
//! # Name clash
//!
//! This crate's [`crate::DevicePtr`] is a bare address; `cuda_core::DevicePtr` is a view
//! owning its memory. This module calls the latter `CoreDevicePtr`; [`PoolMemory`]
//! converts into it.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cuda_core::memory::DevicePtr as CoreDevicePtr;
use cuda_core::memory::{DeviceAlloc, DeviceMemory};
use cuda_core::sys::{CUdeviceptr, CUstream};
use cuda_core::vmm::{self, Granularity, PhysicalAllocation, VirtualRange};
use cuda_core::{Device, Event, Stream};

use crate::backend::{Backend, DeviceId, DeviceInfo, DevicePtr, StreamId};
use crate::error::PoolError;
use crate::hooks::{self, MemoryEvent};
use crate::pool::{Allocation, MemoryPool, RawAllocation};

/// The pool over the CUDA driver: [`MemoryPool`] with the [`DriverBackend`].
pub type DevicePool = MemoryPool<DriverBackend>;

/// The [`StreamId`] of a `cuda-core` stream: its raw handle as an integer (0 for the
/// legacy null stream).
pub fn stream_id(stream: &Stream) -> StreamId {
    StreamId(stream.raw() as usize as u64)
}

/// The [`DeviceId`] of a `cuda-core` device: its ordinal.
pub fn device_id(device: &Device) -> DeviceId {
    DeviceId(device.ordinal() as u32)
}

/// A fence of the driver backend: an event (timing disabled) recorded on a stream.
///
/// `Send` and `Sync`, like [`Event`].
#[derive(Debug)]
pub struct DriverFence {
    event: Event,
}

impl DriverFence {
    /// The recorded event.
    pub fn event(&self) -> &Event {
        &self.event
    }
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
/// [module documentation](self) for how streams map to [`StreamId`]s and how long they
/// must live.
#[derive(Debug)]
pub struct DriverBackend {
    devices: Vec<Device>,
    events: Vec<Mutex<Vec<Event>>>,
    /// Streams seen through the `Stream`-taking entry points, kept alive (see the module
    /// documentation), by handle.
    streams: RwLock<HashMap<u64, Stream>>,
    virtual_memory: bool,
    /// Unique among the backends of this process (for the per-thread retain cache).
    id: u64,
}

/// Source of [`DriverBackend`] ids; 0 is never handed out.
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// `(backend id, stream handle)` this thread last retained: a repeat costs no lock.
    static LAST_RETAINED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

impl DriverBackend {
    /// A backend over every device of the machine.
    pub fn new() -> cuda_core::Result<DriverBackend> {
        Self::with_devices(Device::all()?)
    }

    /// A backend over every device that uses plain `cuMemAlloc` segments only, even where
    /// virtual memory management is supported.
    pub fn plain() -> cuda_core::Result<DriverBackend> {
        let mut b = Self::new()?;
        b.virtual_memory = false;
        Ok(b)
    }

    fn with_devices(devices: Vec<Device>) -> cuda_core::Result<DriverBackend> {
        let events = devices.iter().map(|_| Mutex::new(Vec::new())).collect();
        Ok(DriverBackend {
            devices,
            events,
            streams: RwLock::new(HashMap::new()),
            virtual_memory: true,
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Keeps a clone of `stream` for the life of the backend, so that fences recorded on
    /// it later find a live handle. Implicit streams (legacy, per-thread) need none.
    pub fn retain_stream(&self, stream: &Stream) {
        if stream.is_implicit() {
            return;
        }
        let key = stream_id(stream).0;
        // The hot path: this thread retained this stream in this backend last time. The
        // handle cannot have been reused since, because the backend holds the stream.
        if LAST_RETAINED.with(|last| last.get()) == (self.id, key) {
            return;
        }
        let known = self
            .streams
            .read()
            .map(|m| m.contains_key(&key))
            .unwrap_or(false);
        if !known {
            match self.streams.write() {
                Ok(mut m) => {
                    m.entry(key).or_insert_with(|| stream.clone());
                }
                // A poisoned map cannot record the stream: leave the cache alone so the next
                // call tries again.
                Err(_) => return,
            }
        }
        LAST_RETAINED.with(|last| last.set((self.id, key)));
    }

    /// The `cuda-core` device behind `id`.
    pub fn device(&self, id: DeviceId) -> cuda_core::Result<Device> {
        self.devices
            .get(id.0 as usize)
            .copied()
            .ok_or_else(|| cuda_core::Error::InvalidArgument(format!("no device {id}")))
    }

    /// A non-owning [`Stream`] for `id` on `device`.
    fn stream(&self, device: Device, id: StreamId) -> cuda_core::Result<Stream> {
        if id.0 == 0 {
            return Ok(Stream::null(&device));
        }
        if let Some(s) = self.streams.read().ok().and_then(|m| m.get(&id.0).cloned()) {
            return Ok(s);
        }
        // SAFETY: a StreamId other than 0 is a CUstream handle the user passed to the pool
        // (through `stream_id`), which the module documentation requires to stay alive while
        // the pool caches blocks of it; the wrapper does not own or destroy it.
        unsafe { Stream::external(&device, id.0 as usize as CUstream) }
    }
}

/// `Ok(None)` for an out-of-memory error, else the error.
fn oom_to_none<T>(r: cuda_core::Result<T>) -> cuda_core::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_out_of_memory() => Ok(None),
        Err(e) => Err(e),
    }
}

fn alloc_event(device: DeviceId, size: u64) -> MemoryEvent {
    MemoryEvent {
        device: device.0,
        size,
        ptr: 0,
        stream: 0,
        location: None,
    }
}

fn to_usize(size: u64) -> cuda_core::Result<usize> {
    usize::try_from(size).map_err(|_| cuda_core::Error::SizeOverflow("pool segment size"))
}

impl Backend for DriverBackend {
    type Fence = DriverFence;
    type Physical = PhysicalAllocation;
    type Error = cuda_core::Error;

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

    fn allocate(&self, device: DeviceId, size: u64) -> Result<Option<DevicePtr>, Self::Error> {
        let dev = self.device(device)?;
        let hooked = hooks::any_installed();
        let mut ev = alloc_event(device, size);
        if hooked {
            hooks::each(|h| h.alloc_pre(&ev));
        }
        let mem = oom_to_none(DeviceMemory::new(&dev, to_usize(size)?))?;
        let ptr = mem.map(|m| DevicePtr(m.into_raw()));
        if hooked {
            ev.ptr = ptr.map_or(0, |p| p.0);
            hooks::each(|h| h.alloc_post(&ev));
        }
        Ok(ptr)
    }

    fn deallocate(&self, device: DeviceId, ptr: DevicePtr, size: u64) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        // SAFETY: the pool hands back exactly a segment that `allocate` made with cuMemAlloc
        // and detached with `into_raw`; nobody else owns it. Dropping frees it.
        drop(unsafe { DeviceMemory::from_raw(dev, ptr.0 as CUdeviceptr, to_usize(size)?) });
        Ok(())
    }

    fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DevicePtr>, Self::Error> {
        let dev = self.device(device)?;
        let range = oom_to_none(VirtualRange::reserve(&dev, to_usize(size)?, 0))?;
        Ok(range.map(|r| DevicePtr(r.into_raw().0)))
    }

    fn release_address_range(
        &self,
        device: DeviceId,
        base: DevicePtr,
        size: u64,
    ) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        // SAFETY: the pool hands back exactly one reservation made by
        // `reserve_address_range` (detached with `into_raw`); nothing is mapped in it.
        drop(unsafe { VirtualRange::from_raw(dev, base.0 as CUdeviceptr, to_usize(size)?) });
        Ok(())
    }

    fn create_physical(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<Self::Physical>, Self::Error> {
        let dev = self.device(device)?;
        let hooked = hooks::any_installed();
        let mut ev = alloc_event(device, size);
        if hooked {
            hooks::each(|h| h.alloc_pre(&ev));
        }
        let page = oom_to_none(PhysicalAllocation::new(&dev, to_usize(size)?))?;
        if hooked {
            ev.ptr = page.as_ref().map_or(0, |p| p.handle());
            hooks::each(|h| h.alloc_post(&ev));
        }
        Ok(page)
    }

    fn release_physical(&self, _device: DeviceId, page: Self::Physical) -> Result<(), Self::Error> {
        drop(page);
        Ok(())
    }

    fn map(
        &self,
        device: DeviceId,
        addr: DevicePtr,
        page: &Self::Physical,
    ) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        let addr = addr.0 as CUdeviceptr;
        // SAFETY: the pool maps a page only at a granularity-aligned address inside a range
        // it reserved through this backend and where nothing is mapped.
        unsafe { vmm::map(addr, page, 0, page.size()) }?;
        if let Err(e) = vmm::set_access(addr, page.size(), &dev) {
            let _ctx = dev.bind();
            // SAFETY: the mapping was made just above and nothing uses it yet.
            let _ = unsafe { vmm::unmap(addr, page.size()) };
            return Err(e);
        }
        Ok(())
    }

    fn map_run(
        &self,
        device: DeviceId,
        addr: DevicePtr,
        page_size: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        let base = addr.0 as CUdeviceptr;
        let step = to_usize(page_size)?;
        let undo = |n: usize| {
            let _ctx = dev.bind();
            for j in 0..n {
                // SAFETY: page j of this run was mapped just above and nothing uses it yet.
                let _ = unsafe { vmm::unmap(base + (j * step) as CUdeviceptr, step) };
            }
        };
        for (i, page) in pages.iter().enumerate() {
            if let Err(e) =
                // SAFETY: the pool maps pages only at granularity-aligned addresses inside a
                // range it reserved through this backend and where nothing is mapped.
                unsafe { vmm::map(base + (i * step) as CUdeviceptr, page, 0, page.size()) }
            {
                undo(i);
                return Err(e);
            }
        }
        // One access grant over the whole run.
        if let Err(e) = vmm::set_access(base, step * pages.len(), &dev) {
            undo(pages.len());
            return Err(e);
        }
        Ok(())
    }

    fn unmap(&self, device: DeviceId, addr: DevicePtr, size: u64) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        let _ctx = dev.bind()?;
        // SAFETY: the pool unmaps exactly one page it mapped, after every fence covering
        // work on it has completed, and no live block touches it.
        unsafe { vmm::unmap(addr.0 as CUdeviceptr, to_usize(size)?) }
    }

    fn record_fence(&self, device: DeviceId, stream: StreamId) -> Result<Self::Fence, Self::Error> {
        let dev = self.device(device)?;
        let cached = self
            .events
            .get(device.0 as usize)
            .and_then(|c| c.lock().ok().and_then(|mut v| v.pop()));
        let event = match cached {
            Some(e) => e,
            None => Event::new(&dev)?,
        };
        event.record(&self.stream(dev, stream)?)?;
        Ok(DriverFence { event })
    }

    fn fence_completed(&self, fence: &Self::Fence) -> Result<bool, Self::Error> {
        fence.event.query()
    }

    fn wait_fence(&self, fence: &Self::Fence) -> Result<(), Self::Error> {
        fence.event.synchronize()
    }

    fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: StreamId,
        fence: &Self::Fence,
    ) -> Result<(), Self::Error> {
        let dev = self.device(device)?;
        self.stream(dev, stream)?.wait_event(&fence.event)
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
    /// use cuda_core::{Device, Stream};
    /// use cuda_mempool::DevicePool;
    ///
    /// let pool = DevicePool::new_driver()?;
    /// let stream = Stream::new(&Device::new(0)?)?;
    /// let block = pool.malloc_stream(&stream, 1 << 20)?;
    /// assert_eq!(block.size(), 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_driver() -> Result<DevicePool, PoolError> {
        let backend = DriverBackend::new().map_err(PoolError::backend("DriverBackend::new"))?;
        MemoryPool::with_config(backend, crate::PoolConfig::from_env()?)
    }

    /// Allocates `size` bytes on `stream`'s device for use on `stream`. Runs the
    /// `malloc` hooks ([`crate::hooks`]) with the caller's location.
    #[track_caller]
    pub fn malloc_stream(
        &self,
        stream: &Stream,
        size: usize,
    ) -> Result<Allocation<'_, DriverBackend>, PoolError> {
        let (dev, sid) = (device_id(&stream.device()), stream_id(stream));
        // One atomic load unless a capture is running somewhere; then ask about this stream.
        if cuda_core::graph::captures_in_progress()
            && cuda_core::graph::capture_info(stream)
                .is_ok_and(|info| info.status != cuda_core::graph::CaptureStatus::None)
        {
            return Err(PoolError::CaptureInProgress { stream: sid.0 });
        }
        self.backend().retain_stream(stream);
        if !hooks::any_installed() {
            return self.malloc(dev, sid, size as u64);
        }
        let mut ev = MemoryEvent {
            device: dev.0,
            size: size as u64,
            ptr: 0,
            stream: sid.0,
            location: Some(std::panic::Location::caller()),
        };
        hooks::each(|h| h.malloc_pre(&ev));
        let a = self.malloc(dev, sid, size as u64)?;
        ev.ptr = a.ptr().0;
        hooks::each(|h| h.malloc_post(&ev));
        Ok(a)
    }

    /// Allocates `size` bytes on `stream`'s device as a [`PoolMemory`] that keeps the pool
    /// alive and converts into a `cuda_core` view (`DevicePtr`).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use cuda_core::{memory::DevicePtr, Device, Stream};
    /// use cuda_mempool::DevicePool;
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
        let raw = self.malloc_stream(stream, size)?.into_raw();
        Ok(PoolMemory {
            pool: Arc::clone(self),
            raw,
            device: stream.device(),
        })
    }
}

/// A block of a shared [`DevicePool`], owning its pool through an `Arc`: what
/// [`DevicePool::malloc_shared`] and [`malloc`] return. It implements `cuda_core`'s
/// [`DeviceAlloc`], so it converts into a `cuda_core::memory::DevicePtr` view (the same
/// view type as `cuda-core`'s own memory). Dropping it (or the last view of it) frees the
/// block on the stream it was allocated on.
///
/// `Send` and `Sync`: an address and an `Arc` of a `Sync` pool.
#[derive(Debug)]
pub struct PoolMemory {
    pool: Arc<DevicePool>,
    raw: RawAllocation,
    device: Device,
}

impl PoolMemory {
    /// The device address (0 for an empty block).
    pub fn as_raw(&self) -> CUdeviceptr {
        self.raw.ptr().0 as CUdeviceptr
    }

    /// The size asked for.
    pub fn size(&self) -> usize {
        self.raw.size() as usize
    }

    /// The stream it was allocated on.
    pub fn stream(&self) -> StreamId {
        self.raw.stream()
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<DevicePool> {
        &self.pool
    }

    /// Marks the block as used on `stream` too, so its reuse also waits for that stream's
    /// work issued before the free (CuPy's `record_stream`-like behaviour).
    pub fn record_stream(&self, stream: &Stream) -> Result<(), PoolError> {
        self.pool.backend().retain_stream(stream);
        self.pool.record_stream_raw(&self.raw, stream_id(stream))
    }
}

// SAFETY: the range is one live pool block of `device`'s memory (plain or mapped with
// read-write access for the device) for as long as this value lives, since it is freed only
// in Drop; the fields never change; no host reference aliases device memory.
unsafe impl DeviceAlloc for PoolMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.raw.ptr().0 as CUdeviceptr
    }
    fn size(&self) -> usize {
        self.raw.size() as usize
    }
}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        let hooked = hooks::any_installed();
        let ev = MemoryEvent {
            device: self.raw.device().0,
            size: self.raw.size(),
            ptr: self.raw.ptr().0,
            stream: self.raw.stream().0,
            location: None,
        };
        if hooked {
            hooks::each(|h| h.free_pre(&ev));
        }
        // The block is live in this pool by construction; an error (a failed fence record of
        // a record_stream block) leaves it pending, which is safe.
        let _ = self.pool.free_raw(self.raw);
        if hooked {
            hooks::each(|h| h.free_post(&ev));
        }
    }
}

impl From<PoolMemory> for CoreDevicePtr {
    fn from(m: PoolMemory) -> CoreDevicePtr {
        CoreDevicePtr::new(m)
    }
}

static DEFAULT_POOL: OnceLock<Arc<DevicePool>> = OnceLock::new();
static DEFAULT_POOL_INIT: Mutex<()> = Mutex::new(());

/// The process-wide default pool (CuPy's `get_default_memory_pool`), created on first use
/// over every device, configured from the environment (see
/// [`LIMIT_ENV_VAR`](crate::LIMIT_ENV_VAR)).
///
/// ```no_run
/// let pool = cuda_mempool::default_pool()?;
/// println!("{} bytes cached", pool.free_bytes());
/// # Ok::<(), cuda_mempool::PoolError>(())
/// ```
pub fn default_pool() -> Result<&'static Arc<DevicePool>, PoolError> {
    if let Some(p) = DEFAULT_POOL.get() {
        return Ok(p);
    }
    // A failed creation is not cached: the next call tries again.
    let _guard = DEFAULT_POOL_INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = DEFAULT_POOL.get() {
        return Ok(p);
    }
    let pool = Arc::new(DevicePool::new_driver()?);
    Ok(DEFAULT_POOL.get_or_init(|| pool))
}

/// Allocates `size` bytes on `stream` from the [`default_pool`], as a `cuda_core` view.
///
/// ```no_run
/// use cuda_core::{Device, Stream};
/// let stream = Stream::new(&Device::new(0)?)?;
/// let buf = cuda_mempool::driver::malloc(&stream, 1 << 20)?;
/// buf.memset_async(0, &stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[track_caller]
pub fn malloc(stream: &Stream, size: usize) -> Result<CoreDevicePtr, PoolError> {
    Ok(default_pool()?.malloc_shared(stream, size)?.into())
}
