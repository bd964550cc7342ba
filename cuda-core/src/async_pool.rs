//! Stream-ordered allocation: thin wrappers over the driver's memory pools (`cuMemPool*`,
//! `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`). `cuda-mempool`'s
//! `AsyncPool` (CuPy's `MemoryAsyncPool`) builds its policy on these.
//!
//! - [`MemPool`]: a device's default pool, its current pool, a new pool (with a maximum size),
//!   or an existing handle; attributes (release threshold, reserved and used bytes), trim.
//!   Only pools created here are destroyed on drop.
//! - [`StreamOrderedMemory`]: an RAII allocation freed on its stream (CuPy's `MemoryAsync`),
//!   usable through [`DevicePtr`](crate::memory::DevicePtr) views.
//! - [`alloc_async`] / [`free_async`]: the raw calls, for allocators that track their own
//!   pointers.
//!
//! The driver's default release threshold is 0: memory goes back to the device at every
//! synchronisation, and the next allocation pays for it again. Set a threshold
//! ([`MemPool::set_release_threshold`]) to keep memory cached.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cudars_core::{async_pool::{MemPool, StreamOrderedMemory}, memory::DevicePtr, Device, Stream};
//!
//! let dev = Device::new(0)?;
//! let pool = MemPool::default_for(&dev)?;
//! pool.set_release_threshold(u64::MAX)?; // keep freed memory cached
//! let stream = Arc::new(Stream::new(&dev)?);
//! let mem = StreamOrderedMemory::from_pool(&pool, 1 << 20, &stream)?;
//! let view = DevicePtr::new(mem);
//! view.memset_async(0, &stream)?;
//! drop(view); // freed on `stream`, after the memset
//! stream.synchronize()?;
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::fmt;
use std::sync::Arc;

use cudars_sys::{
    CUdeviceptr, CUmemAllocationHandleType, CUmemAllocationType, CUmemPool_attribute, CUmemoryPool,
};

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::memory::{device_location, DeviceAlloc};
use crate::stream::Stream;
use crate::Device;

/// Whether `device` supports stream-ordered allocation
/// (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`).
/// Decided by [`crate::features`].
pub fn is_supported(device: &Device) -> Result<bool> {
    crate::features::supported(device, crate::Feature::StreamOrderedAllocation)
}

/// A memory pool attribute (`CUmemPool_attribute`), read and written as a `u64`
/// (the three reuse flags are booleans: 0 or 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAttribute {
    /// Bytes the pool keeps reserved when it could release them
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`); default 0.
    ReleaseThreshold,
    /// Bytes of device memory the pool holds now (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ReservedCurrent,
    /// High watermark of [`ReservedCurrent`](Self::ReservedCurrent); can only be reset to 0.
    ReservedHigh,
    /// Bytes handed out and not yet freed (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    UsedCurrent,
    /// High watermark of [`UsedCurrent`](Self::UsedCurrent); can only be reset to 0.
    UsedHigh,
    /// Reuse memory freed on another stream once an event dependency orders it
    /// (`CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`).
    ReuseFollowEventDependencies,
    /// Reuse memory whose free has completed, across streams
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`).
    ReuseAllowOpportunistic,
    /// Let the driver insert dependencies to reuse memory
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`).
    ReuseAllowInternalDependencies,
}

impl PoolAttribute {
    /// The driver's attribute.
    pub fn to_raw(self) -> CUmemPool_attribute {
        use CUmemPool_attribute as A;
        match self {
            PoolAttribute::ReleaseThreshold => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            PoolAttribute::ReservedCurrent => A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            PoolAttribute::ReservedHigh => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            PoolAttribute::UsedCurrent => A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            PoolAttribute::UsedHigh => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            PoolAttribute::ReuseFollowEventDependencies => {
                A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            }
            PoolAttribute::ReuseAllowOpportunistic => A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
            PoolAttribute::ReuseAllowInternalDependencies => {
                A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
            }
        }
    }

    /// `true` for the attributes the driver stores as an `int` (the reuse flags); the others
    /// are `cuuint64_t`.
    fn is_int(self) -> bool {
        matches!(
            self,
            PoolAttribute::ReuseFollowEventDependencies
                | PoolAttribute::ReuseAllowOpportunistic
                | PoolAttribute::ReuseAllowInternalDependencies
        )
    }
}

/// A driver memory pool (`CUmemoryPool`) of one device.
///
/// Pools from [`MemPool::new`] are owned and destroyed on drop (`cuMemPoolDestroy`; the driver
/// defers the release of memory still allocated from it until that memory is freed). Default,
/// current and wrapped pools are borrowed handles and are never destroyed.
///
/// `Send` and `Sync`: pool handles may be used from any thread.
pub struct MemPool {
    raw: CUmemoryPool,
    device: Device,
    owned: bool,
}

// SAFETY: a pool handle is usable from any thread; the driver's pool calls are thread-safe.
unsafe impl Send for MemPool {}
// SAFETY: as above; every method maps to a thread-safe driver call.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// The device's default pool (`cuDeviceGetDefaultMemPool`), which `cuMemAllocAsync` uses
    /// unless another pool was made current. Not destroyed on drop.
    pub fn default_for(device: &Device) -> Result<MemPool> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let _ctx = device.bind()?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device.
        unsafe { drv!(cuDeviceGetDefaultMemPool(&mut raw, device.raw())) }?;
        Ok(MemPool {
            raw,
            device: *device,
            owned: false,
        })
    }

    /// The device's current pool (`cuDeviceGetMemPool`), the one `cuMemAllocAsync` uses. Not
    /// destroyed on drop.
    pub fn current(device: &Device) -> Result<MemPool> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let _ctx = device.bind()?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device.
        unsafe { drv!(cuDeviceGetMemPool(&mut raw, device.raw())) }?;
        Ok(MemPool {
            raw,
            device: *device,
            owned: false,
        })
    }

    /// A new pool of pinned device memory on `device` (`cuMemPoolCreate`), holding at most
    /// `max_size` bytes when given (`CUmemPoolProps::maxSize`; 0 or `None`: no limit beyond
    /// the device's memory). Destroyed on drop.
    pub fn new(device: &Device, max_size: Option<usize>) -> Result<MemPool> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        // `maxSize` needs a 12.2 driver: `Error::DriverTooOld` before, unless no limit is asked.
        let props = crate::driver::api()?.mem_pool_props(
            CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            device_location(*device),
            max_size.unwrap_or(0),
        )?;
        let _ctx = device.bind()?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a fully initialised property struct (reserved zeroed).
        unsafe { drv!(cuMemPoolCreate(&mut raw, &props)) }?;
        Ok(MemPool {
            raw,
            device: *device,
            owned: true,
        })
    }

    /// Wraps an existing pool handle of `device` without owning it (CuPy's integer
    /// `pool_handles`).
    ///
    /// # Safety
    ///
    /// `raw` must be a live pool whose memory is on `device`, and stay live while this value
    /// (and memory allocated through it) is used.
    pub unsafe fn from_raw(raw: CUmemoryPool, device: Device) -> MemPool {
        MemPool {
            raw,
            device,
            owned: false,
        }
    }

    /// The driver handle.
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// The device the pool's memory is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// `true` for a pool created by [`MemPool::new`], destroyed on drop.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Makes this pool the device's current pool (`cuDeviceSetMemPool`), the one
    /// `cuMemAllocAsync` uses. When an owned pool that is current is destroyed, the driver
    /// makes the default pool current again.
    pub fn make_current(&self) -> Result<()> {
        let _ctx = self.device.bind()?;
        // SAFETY: a live pool of this device; its context is current.
        unsafe { drv!(cuDeviceSetMemPool(self.device.raw(), self.raw)) }
    }

    /// Reads an attribute (`cuMemPoolGetAttribute`).
    pub fn attribute(&self, attr: PoolAttribute) -> Result<u64> {
        if attr.is_int() {
            let mut v: i32 = 0;
            // SAFETY: a live pool; an int-typed attribute written into an i32.
            unsafe {
                drv!(cuMemPoolGetAttribute(
                    self.raw,
                    attr.to_raw(),
                    (&mut v as *mut i32).cast()
                ))
            }?;
            Ok(v as u64)
        } else {
            let mut v: u64 = 0;
            // SAFETY: a live pool; a cuuint64_t-typed attribute written into a u64.
            unsafe {
                drv!(cuMemPoolGetAttribute(
                    self.raw,
                    attr.to_raw(),
                    (&mut v as *mut u64).cast()
                ))
            }?;
            Ok(v)
        }
    }

    /// Writes an attribute (`cuMemPoolSetAttribute`). The current byte counts are read-only
    /// and the high watermarks accept only 0 (the driver rejects anything else); the reuse
    /// flags take 0 or 1.
    pub fn set_attribute(&self, attr: PoolAttribute, value: u64) -> Result<()> {
        if attr.is_int() {
            let mut v: i32 = i32::from(value != 0);
            // SAFETY: a live pool; an int-typed attribute read from an i32.
            unsafe {
                drv!(cuMemPoolSetAttribute(
                    self.raw,
                    attr.to_raw(),
                    (&mut v as *mut i32).cast()
                ))
            }
        } else {
            let mut v = value;
            // SAFETY: a live pool; a cuuint64_t-typed attribute read from a u64.
            unsafe {
                drv!(cuMemPoolSetAttribute(
                    self.raw,
                    attr.to_raw(),
                    (&mut v as *mut u64).cast()
                ))
            }
        }
    }

    /// Bytes kept reserved at synchronisation points ([`PoolAttribute::ReleaseThreshold`]).
    pub fn release_threshold(&self) -> Result<u64> {
        self.attribute(PoolAttribute::ReleaseThreshold)
    }

    /// Sets the release threshold; `u64::MAX` keeps everything cached.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set_attribute(PoolAttribute::ReleaseThreshold, bytes)
    }

    /// Bytes of device memory the pool holds now.
    pub fn reserved_current(&self) -> Result<u64> {
        self.attribute(PoolAttribute::ReservedCurrent)
    }

    /// Most bytes the pool has held since creation or the last reset.
    pub fn reserved_high(&self) -> Result<u64> {
        self.attribute(PoolAttribute::ReservedHigh)
    }

    /// Bytes allocated from the pool and not yet freed.
    pub fn used_current(&self) -> Result<u64> {
        self.attribute(PoolAttribute::UsedCurrent)
    }

    /// Most bytes in use since creation or the last reset.
    pub fn used_high(&self) -> Result<u64> {
        self.attribute(PoolAttribute::UsedHigh)
    }

    /// Resets both high watermarks to the current values.
    pub fn reset_high_watermarks(&self) -> Result<()> {
        self.set_attribute(PoolAttribute::ReservedHigh, 0)?;
        self.set_attribute(PoolAttribute::UsedHigh, 0)
    }

    /// Releases cached memory until the pool holds at most `min_bytes_to_keep` bytes
    /// beyond what is allocated (`cuMemPoolTrimTo`). Memory whose free is still pending on a
    /// stream is not released: synchronise first to release everything.
    pub fn trim_to(&self, min_bytes_to_keep: usize) -> Result<()> {
        // SAFETY: a live pool.
        unsafe { drv!(cuMemPoolTrimTo(self.raw, min_bytes_to_keep)) }
    }

    /// Allocates `size` bytes from this pool, ordered on `stream` (`cuMemAllocFromPoolAsync`).
    /// The memory may be used by work on `stream` (or ordered after it) and must be freed
    /// with [`free_async`]. The stream must belong to the pool's device. Size 0 returns
    /// address 0 without a driver call.
    pub fn alloc_async(&self, size: usize, stream: &Stream) -> Result<CUdeviceptr> {
        stream.expect_device(self.device)?;
        if size == 0 {
            return Ok(0);
        }
        let mut ptr: CUdeviceptr = 0;
        let _ctx = self.device.bind()?;
        // SAFETY: a live pool and a stream of its device; valid out-pointer.
        unsafe {
            drv!(cuMemAllocFromPoolAsync(
                &mut ptr,
                size,
                self.raw,
                stream.raw()
            ))
        }?;
        Ok(ptr)
    }
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("raw", &self.raw)
            .field("device", &self.device.ordinal())
            .field("owned", &self.owned)
            .finish()
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Without the device's context (the driver is gone) the pool is leaked.
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we created the pool; the driver defers releasing memory that is still
            // allocated from it.
            let _ = unsafe { drv!(cuMemPoolDestroy(self.raw)) };
        }
    }
}

/// Allocates `size` bytes from the current pool of `stream`'s device, ordered on `stream`
/// (`cuMemAllocAsync`); free with [`free_async`]. Size 0 returns 0 without a driver call.
pub fn alloc_async(size: usize, stream: &Stream) -> Result<CUdeviceptr> {
    if size == 0 {
        return Ok(0);
    }
    let mut ptr: CUdeviceptr = 0;
    let _ctx = stream.device().bind()?;
    // SAFETY: the stream's context is current; valid out-pointer.
    unsafe { drv!(cuMemAllocAsync(&mut ptr, size, stream.raw())) }?;
    Ok(ptr)
}

/// Frees stream-ordered memory when `stream` reaches this point (`cuMemFreeAsync`). Address 0
/// is a no-op.
///
/// # Safety
///
/// `ptr` must come from [`alloc_async`] / [`MemPool::alloc_async`] (or `cuMemAllocAsync`) and
/// not be freed already; no work ordered after the free, on any stream, may use it.
pub unsafe fn free_async(ptr: CUdeviceptr, stream: &Stream) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    let _ctx = stream.device().bind()?;
    // SAFETY: the caller guarantees a live stream-ordered allocation.
    unsafe { drv!(cuMemFreeAsync(ptr, stream.raw())) }
}

/// Stream-ordered device memory (CuPy's `MemoryAsync`): allocated on a stream, freed on that
/// same stream when dropped, so the free is ordered after the work queued before it.
///
/// It holds its stream through an `Arc`, so the stream outlives it. Use it through
/// [`DevicePtr`](crate::memory::DevicePtr) views; work on other streams must be ordered after
/// the allocation (and before the drop) with events. `Send` and `Sync`.
pub struct StreamOrderedMemory {
    ptr: CUdeviceptr,
    size: usize,
    stream: Arc<Stream>,
    /// Other streams that used the memory ([`DeviceAlloc::record_stream`]): the free waits
    /// for their work too. Clones keep them alive until then.
    used_on: std::sync::Mutex<Vec<Stream>>,
    /// The driver's pool reuses memory in stream order (and across streams through internal
    /// dependencies): uses outside `stream` wait for the earlier owner's work through it.
    handover: crate::memory::Handover,
}

/// A stream being captured gets graph memory from `cuMemAllocAsync`: an address backed only
/// while the graph runs, which no eager owner may hand out.
fn refuse_capture(stream: &Stream) -> Result<()> {
    let may = match stream.kind() {
        crate::StreamKind::LegacyNull => false,
        crate::StreamKind::External => true,
        crate::StreamKind::Owned | crate::StreamKind::PerThread => {
            crate::capture_gate::captures_in_progress()
        }
    };
    if may && crate::graph::capture_info(stream)?.status != crate::graph::CaptureStatus::None {
        return Err(Error::InvalidArgument(
            "stream-ordered memory cannot be allocated on a stream being captured: the driver \
             would hand out graph memory, backed only while the graph runs; allocate before \
             the capture, or use a pool that serves captures (cudars_mempool)"
                .into(),
        ));
    }
    Ok(())
}

/// The per-thread default stream names a different stream on every thread, so memory freed
/// "on" it from another thread would be freed on the wrong stream.
fn refuse_per_thread(stream: &Stream) -> Result<()> {
    if stream.kind() == crate::StreamKind::PerThread {
        return Err(Error::InvalidArgument(
            "stream-ordered memory cannot live on the per-thread default stream: it names a \
             different stream on every thread, so the free could be ordered on the wrong one; \
             use a created stream"
                .into(),
        ));
    }
    Ok(())
}

impl StreamOrderedMemory {
    /// Allocates `size` bytes from the current pool of `stream`'s device (`cuMemAllocAsync`).
    /// The per-thread default stream is refused ([`Error::InvalidArgument`]).
    ///
    /// A stream being captured into a graph is refused too ([`Error::InvalidArgument`]): the
    /// driver would return graph memory, which exists only while the graph runs.
    pub fn new(size: usize, stream: &Arc<Stream>) -> Result<StreamOrderedMemory> {
        refuse_per_thread(stream)?;
        refuse_capture(stream)?;
        let handover = crate::memory::Handover::new(stream)?;
        let ptr = alloc_async(size, stream)?;
        Ok(StreamOrderedMemory {
            ptr,
            size,
            stream: stream.clone(),
            used_on: std::sync::Mutex::new(Vec::new()),
            handover,
        })
    }

    /// Allocates `size` bytes from `pool` on `stream` (`cuMemAllocFromPoolAsync`).
    pub fn from_pool(
        pool: &MemPool,
        size: usize,
        stream: &Arc<Stream>,
    ) -> Result<StreamOrderedMemory> {
        refuse_per_thread(stream)?;
        refuse_capture(stream)?;
        let handover = crate::memory::Handover::new(stream)?;
        let ptr = pool.alloc_async(size, stream)?;
        Ok(StreamOrderedMemory {
            ptr,
            size,
            stream: stream.clone(),
            used_on: std::sync::Mutex::new(Vec::new()),
            handover,
        })
    }

    /// The address.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream it was allocated on and will be freed on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }
}

impl fmt::Debug for StreamOrderedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrderedMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("stream", &self.stream.raw())
            .finish()
    }
}

/// Whether work issued to `stream` now would be captured: `touches_capture` for the legacy
/// stream (a blocking stream's capture takes it in), the capture status otherwise; an error
/// when the driver cannot say.
fn capture_state(stream: &Stream) -> Result<bool> {
    if stream.kind() == crate::StreamKind::LegacyNull {
        return Ok(crate::graph::touches_capture(stream));
    }
    crate::graph::is_capturing(stream)
}

impl StreamOrderedMemory {
    /// The allocation moved into a value the release thread frees later; `self` is left
    /// empty (its drop does nothing).
    fn moved_out(&mut self) -> StreamOrderedMemory {
        let keep = crate::memory::Handover::completed(&self.stream);
        StreamOrderedMemory {
            ptr: std::mem::take(&mut self.ptr),
            size: self.size,
            stream: Arc::clone(&self.stream),
            used_on: std::sync::Mutex::new(std::mem::take(
                &mut *self
                    .used_on
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )),
            handover: std::mem::replace(&mut self.handover, keep),
        }
    }
}

impl Drop for StreamOrderedMemory {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // Not inside a host function (no CUDA call there). And not while the allocating
        // stream, or a stream that used the memory, is being captured (by anyone): the
        // `cuMemFreeAsync` and the events that order it would be recorded into the graph
        // (the driver refuses a free of eager memory there, which leaked it), not made now.
        // Later, on the release thread: at once for a host function, else at its next poll
        // where no capture touches them. The capture gate, held to the free, keeps a capture
        // of this crate from beginning between the check and the free.
        if crate::release::inside_host_function() {
            let moved = self.moved_out();
            crate::release::defer(Box::new(moved), crate::release::When::Now);
            return;
        }
        let _gate = crate::capture_gate::issue_guard();
        let captured = {
            let used = self
                .used_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::iter::once(&*self.stream)
                .chain(used.iter())
                .map(capture_state)
                .try_fold(false, |any, s| s.map(|c| any || c))
        };
        match captured {
            Ok(false) => {}
            Ok(true) => {
                let moved = self.moved_out();
                crate::release::defer(Box::new(moved), crate::release::When::Poll);
                return;
            }
            // The stream cannot be asked (destroyed under an external handle, a failed
            // context): its work may still run, so the memory is leaked, never freed early.
            Err(_) => {
                crate::release::note_leak();
                return;
            }
        }
        let others = std::mem::take(
            &mut *self
                .used_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for other in &others {
            // Order the free after the other stream's work: an event recorded there now,
            // waited for by the allocating stream. If that cannot be arranged, wait on the
            // host instead; if even that fails, leak the memory rather than free it early.
            let ordered = Event::new(&other.device())
                .and_then(|e| e.record(other).map(|()| e))
                .and_then(|e| self.stream.wait_event(&e));
            if ordered.is_err() && other.synchronize().is_err() {
                crate::release::note_leak();
                return;
            }
        }
        // SAFETY: we own the allocation from cuMemAlloc(FromPool)Async; the free is ordered
        // on the allocating stream, after the work queued on it and (above) after the work
        // of every other stream that used it. A failure cannot be reported from Drop.
        let _ = unsafe { free_async(self.ptr, &self.stream) };
    }
}

// SAFETY: a stream-ordered allocation of `size` bytes on the stream's device, owned by this
// value; device memory is never aliased by host references; the fields never change.
unsafe impl DeviceAlloc for StreamOrderedMemory {
    fn device(&self) -> Device {
        self.stream.device()
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        if *stream == *self.stream {
            return Ok(());
        }
        refuse_per_thread(stream)?;
        self.handover.order_stream(stream)?;
        let mut used = self
            .used_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !used.contains(stream) {
            used.push(stream.clone());
        }
        Ok(())
    }
    fn prepare_synchronous_use(&self) -> Result<()> {
        self.handover.wait_host()
    }
}

impl From<StreamOrderedMemory> for crate::memory::DevicePtr {
    fn from(mem: StreamOrderedMemory) -> Self {
        crate::memory::DevicePtr::new(mem)
    }
}

// Compile-time check of the documented auto traits.
const _: fn() = || {
    fn check<T: Send + Sync>() {}
    check::<MemPool>();
    check::<StreamOrderedMemory>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_flags_are_ints_and_byte_counts_are_u64() {
        assert!(PoolAttribute::ReuseAllowOpportunistic.is_int());
        assert!(!PoolAttribute::ReleaseThreshold.is_int());
        assert_eq!(
            PoolAttribute::UsedHigh.to_raw(),
            CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH
        );
    }
}
