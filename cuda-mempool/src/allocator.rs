//! Pluggable allocators (CuPy's `set_allocator` / `using_allocator` and the allocator
//! classes): "give me `size` bytes on this device for this stream".
//!
//! * [`Allocator`]: the trait; an allocation is a `cudars_core` `DevicePtr` view owning its
//!   memory, so every allocator's memory is used the same way.
//! * [`DirectAllocator`]: `cuMemAlloc` per request, no caching.
//! * [`PoolAllocator`]: a shared [`DevicePool`] (the default: the process-wide
//!   [`default_pool`]).
//! * [`FnAllocator`]: any Rust closure (CuPy's `PythonFunctionAllocator`).
//! * [`CFunctionAllocator`]: C function pointers with a context pointer (CuPy's
//!   `CFunctionAllocator`).
//! * The thread-local current allocator: [`set_allocator`], [`get_allocator`],
//!   [`using_allocator`] (a scoped guard), and [`alloc`] through it on the current
//!   device's current stream.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudars_core::memory::{DeviceAlloc, DeviceMemory, DevicePtr, Handover};
use cudars_core::sys::{CUdeviceptr, CUstream};
use cudars_core::{Device, Stream, StreamKind};

use crate::driver::{default_pool, device_id, DevicePool};
use crate::error::PoolError;
use crate::hooks::{self, MemoryEvent};

/// Gives `size` bytes on `stream`'s device, for use on `stream`. Size 0 gives an empty
/// view. `Send + Sync`: allocators are shared between threads through `Arc`.
pub trait Allocator: Send + Sync {
    /// Allocates `size` bytes for `stream`.
    fn allocate(&self, stream: &Stream, size: usize) -> Result<DevicePtr, PoolError>;
}

/// `cuMemAlloc` for every request and `cuMemFree` when the last view drops; no caching.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectAllocator;

impl Allocator for DirectAllocator {
    fn allocate(&self, stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
        let dev = stream.device();
        match DeviceMemory::new(&dev, size) {
            Ok(m) => Ok(m.into_ptr()),
            Err(e) if e.is_out_of_memory() => Err(PoolError::OutOfMemory {
                cause: crate::OomCause::DeviceMemory,
                device: device_id(&dev),
                requested: size,
                used: 0,
                reserved: 0,
                limit: None,
            }),
            Err(e) => Err(PoolError::Cuda(e)),
        }
    }
}

/// Allocates from a shared [`DevicePool`].
#[derive(Debug, Clone)]
pub struct PoolAllocator(pub Arc<DevicePool>);

impl Allocator for PoolAllocator {
    #[track_caller]
    fn allocate(&self, stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
        Ok(self.0.malloc_shared(stream, size)?.into())
    }
}

/// An allocator from a Rust closure (CuPy's `PythonFunctionAllocator`).
///
/// ```
/// use cudars_mempool::allocator::{Allocator, DirectAllocator, FnAllocator};
/// let counting = FnAllocator::new(|stream: &cudars_core::Stream, size: usize| {
///     DirectAllocator.allocate(stream, size)
/// });
/// # let _ = counting;
/// ```
pub struct FnAllocator<F>(F);

impl<F> FnAllocator<F>
where
    F: Fn(&Stream, usize) -> Result<DevicePtr, PoolError> + Send + Sync,
{
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        FnAllocator(f)
    }
}

impl<F> std::fmt::Debug for FnAllocator<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnAllocator")
    }
}

impl<F> Allocator for FnAllocator<F>
where
    F: Fn(&Stream, usize) -> Result<DevicePtr, PoolError> + Send + Sync,
{
    fn allocate(&self, stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
        (self.0)(stream, size)
    }
}

/// The C allocation function of a [`CFunctionAllocator`]: returns the address of `size`
/// bytes on device `device` for `stream`, or 0 on failure.
pub type CMallocFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    size: usize,
    device: i32,
    stream: CUstream,
) -> CUdeviceptr;
/// The C free function of a [`CFunctionAllocator`].
pub type CFreeFn =
    unsafe extern "C" fn(ctx: *mut c_void, ptr: CUdeviceptr, device: i32, stream: CUstream);

struct CFunctions {
    ctx: *mut c_void,
    malloc: CMallocFn,
    free: CFreeFn,
    _owner: Option<Box<dyn Any + Send + Sync>>,
}

// SAFETY: `CFunctionAllocator::new`'s contract makes the functions callable from any
// thread with `ctx`; `ctx` is only passed back to them.
unsafe impl Send for CFunctions {}
// SAFETY: as above.
unsafe impl Sync for CFunctions {}

/// An allocator from C function pointers with a context pointer (CuPy's
/// `CFunctionAllocator`), for allocators written in C or another language.
///
/// `Send` and `Sync` by the contract of [`new`](Self::new).
#[derive(Clone)]
pub struct CFunctionAllocator {
    inner: Arc<CFunctions>,
}

impl std::fmt::Debug for CFunctionAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CFunctionAllocator")
            .field("ctx", &self.inner.ctx)
            .finish()
    }
}

impl CFunctionAllocator {
    /// Wraps `malloc` and `free` with the context pointer `ctx` passed to both; `owner` is
    /// kept alive as long as the allocator or any of its allocations (whatever `ctx`
    /// points into).
    ///
    /// # Safety
    ///
    /// `malloc` and `free` must be callable from any thread with `ctx` for as long as the
    /// allocator or any allocation from it lives; `malloc` must return 0 or the address of
    /// at least `size` bytes of device memory of `device` usable on `stream`, which stays
    /// valid until `free` is called with it.
    pub unsafe fn new(
        ctx: *mut c_void,
        malloc: CMallocFn,
        free: CFreeFn,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> CFunctionAllocator {
        CFunctionAllocator {
            inner: Arc::new(CFunctions {
                ctx,
                malloc,
                free,
                _owner: owner,
            }),
        }
    }
}

/// A block of a C allocator. The allocator may reuse memory in stream order (as this
/// workspace's own C ABI does), so the block is treated like a pool block: it keeps its
/// allocation stream alive (a clone, handed back to `free`), orders every use outside that
/// stream after the earlier owner's work ([`Handover`]), and makes its free wait for the
/// other streams that used it.
struct CMemory {
    ptr: CUdeviceptr,
    size: usize,
    device: Device,
    stream: Stream,
    handover: Handover,
    /// Other streams that used the block: the free waits for their work.
    used_on: std::sync::Mutex<Vec<Stream>>,
    functions: Arc<CFunctions>,
}

// SAFETY: an address and size, streams and a mutex (all Send + Sync); the C functions are
// thread-safe by `new`'s contract.
unsafe impl Send for CMemory {}
// SAFETY: as above.
unsafe impl Sync for CMemory {}

// SAFETY: `new`'s contract: `ptr..ptr + size` is device memory of `device` until `free`,
// which only Drop calls; the fields never change; uses on other streams are ordered after the
// earlier owner (the hand-over) and the free waits for them (Drop).
unsafe impl DeviceAlloc for CMemory {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn record_stream(&self, stream: &Stream) -> cudars_core::Result<()> {
        if *stream == self.stream {
            return Ok(());
        }
        if stream.kind() == StreamKind::PerThread {
            return Err(cudars_core::Error::InvalidArgument(
                "a C allocator's block cannot be marked with the per-thread default stream: it \
                 names a different stream on every thread"
                    .into(),
            ));
        }
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
    fn prepare_synchronous_use(&self) -> cudars_core::Result<()> {
        self.handover.wait_host()
    }
}

impl Drop for CMemory {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let others = std::mem::take(
            &mut *self
                .used_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for other in &others {
            // The free is ordered on the allocation stream: make it wait for the other
            // stream's work, or wait on the host; if neither works, leak rather than free.
            let ordered = cudars_core::Event::new(&other.device())
                .and_then(|e| e.record(other).map(|()| e))
                .and_then(|e| self.stream.wait_event(&e));
            if ordered.is_err() && other.synchronize().is_err() {
                return;
            }
        }
        let f = &self.functions;
        // SAFETY: `ptr` came from `malloc` with this context and is freed once, with the
        // stream it was allocated on (kept alive by our clone).
        unsafe {
            (f.free)(
                f.ctx,
                self.ptr,
                self.device.ordinal() as i32,
                self.stream.raw(),
            )
        };
    }
}

impl Allocator for CFunctionAllocator {
    fn allocate(&self, stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
        let device = stream.device();
        if stream.kind() == StreamKind::PerThread {
            // Freed on another thread, the handle would name that thread's stream.
            return Err(PoolError::PerThreadStream);
        }
        let ptr = if size == 0 {
            0
        } else {
            let f = &self.inner;
            // SAFETY: `new`'s contract.
            let p = unsafe { (f.malloc)(f.ctx, size, device.ordinal() as i32, stream.raw()) };
            if p == 0 {
                return Err(PoolError::OutOfMemory {
                    cause: crate::OomCause::DeviceMemory,
                    device: device_id(&device),
                    requested: size,
                    used: 0,
                    reserved: 0,
                    limit: None,
                });
            }
            p
        };
        // After the C malloc, which may have made the stream wait for earlier owners.
        let handover = match Handover::new(stream) {
            Ok(h) => h,
            Err(e) => {
                if ptr != 0 {
                    let f = &self.inner;
                    // SAFETY: `ptr` came from `malloc` just above and is freed once, on the
                    // stream it was allocated on; nothing used it.
                    unsafe { (f.free)(f.ctx, ptr, device.ordinal() as i32, stream.raw()) };
                }
                return Err(PoolError::Cuda(e));
            }
        };
        Ok(DevicePtr::new(CMemory {
            ptr,
            size,
            device,
            stream: stream.clone(),
            handover,
            used_on: std::sync::Mutex::new(Vec::new()),
            functions: Arc::clone(&self.inner),
        }))
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn Allocator>>> = const { RefCell::new(None) };
}

/// Sets the current thread's allocator; `None` restores the default (the
/// [`default_pool`]). CuPy's `set_allocator`.
pub fn set_allocator(allocator: Option<Arc<dyn Allocator>>) {
    CURRENT.with(|c| *c.borrow_mut() = allocator);
}

/// The current thread's allocator, if one was set (`None`: the default pool). CuPy's
/// `get_allocator`.
pub fn get_allocator() -> Option<Arc<dyn Allocator>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Restores the previous allocator of the thread when dropped. Not `Send`.
#[must_use = "the allocator is restored when the guard drops"]
pub struct AllocatorGuard {
    previous: Option<Arc<dyn Allocator>>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for AllocatorGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatorGuard").finish_non_exhaustive()
    }
}

impl Drop for AllocatorGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Uses `allocator` on the current thread until the guard drops (CuPy's
/// `using_allocator`).
///
/// ```no_run
/// use std::sync::Arc;
/// use cudars_mempool::allocator::{self, DirectAllocator};
///
/// {
///     let _g = allocator::using_allocator(Arc::new(DirectAllocator));
///     let buf = allocator::alloc(1 << 20)?; // cuMemAlloc
/// #   drop(buf);
/// }
/// let pooled = allocator::alloc(1 << 20)?; // the default pool again
/// # drop(pooled);
/// # Ok::<(), cudars_mempool::PoolError>(())
/// ```
pub fn using_allocator(allocator: Arc<dyn Allocator>) -> AllocatorGuard {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(allocator));
    AllocatorGuard {
        previous,
        _not_send: PhantomData,
    }
}

/// Allocates `size` bytes through the current thread's allocator, on the current device's
/// current stream ([`Stream::current`]). Runs the `malloc` hooks ([`crate::hooks`]) with the
/// caller's location (the default pool's own hooks see the same location).
#[track_caller]
pub fn alloc(size: usize) -> Result<DevicePtr, PoolError> {
    let device = Device::current().map_err(PoolError::Cuda)?;
    alloc_on(&Stream::current(&device), size)
}

/// As [`alloc`], on `stream`.
#[track_caller]
pub fn alloc_on(stream: &Stream, size: usize) -> Result<DevicePtr, PoolError> {
    match get_allocator() {
        None => Ok(default_pool()?.malloc_shared(stream, size)?.into()),
        Some(a) => {
            if !hooks::any_installed() {
                return a.allocate(stream, size);
            }
            let mut ev = MemoryEvent {
                kind: crate::history::EventKind::Malloc,
                device: crate::driver::device_id(&stream.device()),
                stream: Some(if stream.kind() == cudars_core::StreamKind::PerThread {
                    crate::pool::per_thread_key()
                } else {
                    crate::backend::StreamKey(stream.identity())
                }),
                size: size as u64,
                addr: crate::DeviceAddress(0),
                location: Some(std::panic::Location::caller()),
            };
            hooks::each(|h| h.malloc_pre(&ev));
            let p = a.allocate(stream, size)?;
            ev.addr = crate::DeviceAddress(p.as_raw());
            hooks::each(|h| h.malloc_post(&ev));
            Ok(p)
        }
    }
}
