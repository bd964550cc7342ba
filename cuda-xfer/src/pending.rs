//! Asynchronous transfers (CuPy's `blocking=False`): queued on a stream, with the host buffer
//! held until the device is done with it.
//!
//! Two shapes, both checked by the compiler:
//! - **owned buffers** ([`to_device_async`], [`copy_to_device_async`], [`to_host_async`]):
//!   the call takes the buffer (a `Vec`, a `Box<[T]>`, a [`PinnedBuffer`](crate::PinnedBuffer),
//!   a registration, ...) and returns a [`Pending`] that gives it back from
//!   [`Pending::wait`]. Nothing else can reach the buffer meanwhile. Dropping the `Pending`
//!   waits. Leaking it (`std::mem::forget`) leaks the buffer too: the device may still write
//!   it, and nobody can read it, so a leak is safe.
//! - **borrowed slices** ([`scope`]): inside `cudars_xfer::scope(|s| ...)`, `s.to_host(..)` and
//!   `s.copy_to_device(..)` borrow the slices for the whole scope, and `scope` returns only
//!   after every transfer it started is complete, even when the closure panics, so the
//!   borrows cannot end early (as with `std::thread::scope`).
//!
//! In async code a [`Pending`] is awaited (`to_host_async(..)?.await?`, through
//! [`IntoFuture`]): the task sleeps instead of the thread, the buffer comes back when the copy
//! is complete, and dropping the future early hands what the device still uses to
//! `cuda-core`'s reactor instead of blocking ([`PendingFuture`]). The borrowed form has no
//! async counterpart: a future can be leaked, a scope cannot (see
//! [`PendingFuture`](PendingFuture#no-borrowed-form)).
//!
//! A stream that is being captured into a graph is refused by every transfer here, with
//! [`Error::Capturing`](crate::Error::Capturing) and before anything is allocated or issued:
//! the graph would keep the host buffer's address, not the buffer (waiting on an event
//! recorded only into a capture does not wait for any launch, and a scope's borrows end
//! whatever), so each launch would read or write memory given back long before.
//!
//! Asynchronous copies of pinned or registered memory overlap with host work. A pageable
//! source larger than the staging threshold is staged before the call returns (its bytes are
//! read; the last DMAs run on); a pageable destination that large is filled before the call
//! returns, as the driver itself does for pageable memory. Pin or register buffers that must
//! overlap.
//!
//! ```no_run
//! use cudars_xfer::{PinnedBuffer, to_device, to_host_async};
//! let dev = cudars_core::Device::new(0)?;
//! let stream = cudars_core::Stream::new(&dev)?;
//! let on_device = to_device(&dev, &vec![1.0f32; 1 << 20])?;
//! let out = PinnedBuffer::<f32>::zeroed(&dev, 1 << 20)?;
//! let pending = to_host_async(&on_device, out, &stream)?;
//! // ... host work overlaps the copy; `out` is unreachable until:
//! let out = pending.wait()?;
//! assert_eq!(out[0], 1.0);
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use bytemuck::Pod;
use cudars_core::memory::DevicePtr;
use cudars_core::{Completion, Event, Stream};

use crate::buffer::DeviceBuffer;
use crate::elements::check_same_len;
use crate::error::Result;
use crate::host::{HostMemoryKind, TransferBuffer};
use crate::staging::{self, Lease};
use crate::transfer::{refuse_capture, route, Route};

/// A transfer queued on a stream, holding its host buffer until the copy is complete.
///
/// [`wait`](Self::wait) blocks until the copy is done and gives the buffer back; dropping the
/// value waits too. If waiting fails (the driver reports an error, which means the context
/// is lost), the buffer is leaked rather than freed, since the device might still be using it.
///
/// `Send` (wait on any thread) when the buffer is; `Sync` when the buffer is.
#[must_use = "dropping a pending transfer blocks until it completes"]
pub struct Pending<B: TransferBuffer> {
    buffer: Option<B>,
    done: Option<Event>,
    /// Device memory of the copy, kept alive until it completes.
    _device: Option<DevicePtr>,
    /// Staging slots still read by DMAs.
    lease: Option<Lease>,
}

impl<B: TransferBuffer> Pending<B> {
    fn new(buffer: B, done: Option<Event>, device: DevicePtr, lease: Option<Lease>) -> Self {
        Pending {
            buffer: Some(buffer),
            done,
            _device: Some(device),
            lease,
        }
    }

    /// `true` once the copy is complete (`wait` will not block).
    pub fn is_complete(&self) -> Result<bool> {
        match &self.done {
            Some(event) => Ok(event.query()?),
            None => Ok(true),
        }
    }

    /// Blocks until the copy is complete and gives the host buffer back (holding the data,
    /// for a copy to the host).
    pub fn wait(mut self) -> Result<B> {
        self.settle()?;
        match self.buffer.take() {
            Some(buffer) => Ok(buffer),
            // Only `wait` and `drop` take the buffer, and each consumes the value.
            None => Err(crate::Error::InvalidConfig(
                "pending transfer without its buffer".into(),
            )),
        }
    }

    /// Waits for the fence; on failure leaks what the device may still use.
    fn settle(&mut self) -> Result<()> {
        let result = match &self.done {
            Some(event) => event.synchronize().map_err(crate::Error::from),
            None => Ok(()),
        };
        match result {
            Ok(()) => {
                self.done = None;
                Ok(())
            }
            Err(e) => {
                std::mem::forget(self.buffer.take());
                if let Some(lease) = self.lease.take() {
                    lease.leak();
                }
                Err(e)
            }
        }
    }
}

impl<B: TransferBuffer> Drop for Pending<B> {
    fn drop(&mut self) {
        // The error has nowhere to go; `settle` leaked the buffer if the wait failed.
        let _ = self.settle();
    }
}

impl<B: TransferBuffer> IntoFuture for Pending<B> {
    type Output = Result<B>;
    type IntoFuture = PendingFuture<B>;

    /// The transfer as a future: `pending.await` gives the buffer back once the copy is
    /// complete, without blocking a thread (see [`PendingFuture`]).
    fn into_future(mut self) -> PendingFuture<B> {
        let event = self.done.take();
        let parts = Parts {
            buffer: self.buffer.take(),
            _device: self._device.take(),
            lease: self.lease.take(),
        };
        // `self` is empty now: its Drop has nothing to wait for.
        PendingFuture {
            completion: event.as_ref().map(Event::completion),
            event,
            parts: Some(parts),
        }
    }
}

/// What a transfer holds until its copy is complete.
struct Parts<B> {
    buffer: Option<B>,
    _device: Option<DevicePtr>,
    lease: Option<Lease>,
}

impl<B> Parts<B> {
    /// The copy failed (the context is lost): leak what the device may still use.
    fn leak(self) {
        std::mem::forget(self.buffer);
        if let Some(lease) = self.lease {
            lease.leak();
        }
    }
}

/// A [`Pending`] transfer as a future (`pending.await`, or
/// [`IntoFuture::into_future`]): resolves to the host buffer once the copy is complete, or
/// to the error that stopped the device; no thread blocks meanwhile. Runtime-agnostic: it
/// waits through [`cudars_core::Completion`] (see [`cudars_core::completion`]).
///
/// - The buffer stays unreachable until the future resolves, as with [`Pending::wait`].
/// - **Dropping the future early does not block** (unlike dropping a [`Pending`]): the
///   buffer, the device memory and any staging slots are handed to `cuda-core`'s reactor
///   ([`cudars_core::completion::drop_after`]), which drops them once the copy is complete,
///   on its own thread.
/// - On an error (a device fault: the copy may still be running) the buffer is leaked,
///   never freed, as [`Pending::wait`] does.
/// - Leaking the future leaks the buffer: safe, as for `Pending`.
///
/// ```no_run
/// # async fn demo() -> cudars_xfer::Result<()> {
/// use cudars_xfer::{to_device, to_host_async, PinnedBuffer};
/// let dev = cudars_core::Device::new(0)?;
/// let stream = cudars_core::Stream::new(&dev)?;
/// let on_device = to_device(&dev, &vec![1.0f32; 1 << 20])?;
/// let out = PinnedBuffer::<f32>::zeroed(&dev, 1 << 20)?;
/// let out = to_host_async(&on_device, out, &stream)?.await?;
/// assert_eq!(out[0], 1.0);
/// # Ok(()) }
/// ```
///
/// # No borrowed form
///
/// There is no `async` counterpart of [`scope`]: a future that lent a borrowed slice to the
/// device could be leaked (`std::mem::forget`, or a task that is never polled again and
/// never dropped), which safe code may do; the borrow would end while the DMA still reads or
/// writes the slice. `scope` is sound because it returns only after every transfer, and a
/// future cannot promise that. Await owned buffers (`Vec`, [`PinnedBuffer`](crate::PinnedBuffer),
/// registrations) instead.
#[must_use = "a transfer future does nothing unless awaited (dropping it is safe)"]
pub struct PendingFuture<B: TransferBuffer> {
    completion: Option<Completion>,
    /// The copy's fence, kept to hand the parts over on an early drop.
    event: Option<Event>,
    parts: Option<Parts<B>>,
}

// The buffer is never pinned (nothing projects a `Pin<&mut B>`): moving the future moves
// only the owning handle, whose memory stays in place (`TransferBuffer`'s contract).
impl<B: TransferBuffer> Unpin for PendingFuture<B> {}

impl<B: TransferBuffer> Future for PendingFuture<B> {
    type Output = Result<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        let this = self.get_mut();
        if let Some(completion) = &mut this.completion {
            let outcome = match Pin::new(completion).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(outcome) => outcome,
            };
            this.completion = None;
            this.event = None;
            if let Err(e) = outcome {
                if let Some(parts) = this.parts.take() {
                    parts.leak();
                }
                return Poll::Ready(Err(e.into()));
            }
        }
        let buffer = this.parts.take().and_then(|mut parts| parts.buffer.take());
        Poll::Ready(buffer.ok_or_else(|| {
            crate::Error::InvalidConfig("transfer future polled after it resolved".into())
        }))
    }
}

impl<B: TransferBuffer> Drop for PendingFuture<B> {
    fn drop(&mut self) {
        drop(self.completion.take());
        if let (Some(event), Some(parts)) = (self.event.take(), self.parts.take()) {
            // Still in flight, or not yet seen complete: the reactor drops the parts after
            // the copy (or leaks them if it fails), nothing blocks here.
            let _ = cudars_core::completion::drop_after(&event, parts);
        }
    }
}

impl<B: TransferBuffer> std::fmt::Debug for PendingFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFuture")
            .field("buffer", &std::any::type_name::<B>())
            .field("in_flight", &self.completion.is_some())
            .finish()
    }
}

impl<B: TransferBuffer> std::fmt::Debug for Pending<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("buffer", &std::any::type_name::<B>())
            .field("fenced", &self.done.is_some())
            .field("staged", &self.lease.is_some())
            .finish()
    }
}

/// Waits for `stream` after a failure part-way through an issued copy, then drops `buffer`;
/// leaks it if even that fails.
fn settle_after_error<B>(buffer: B, stream: &Stream) {
    if stream.synchronize().is_err() {
        std::mem::forget(buffer);
    }
}

/// Queues a copy of `src` into a new device buffer on `stream`'s device. The device buffer
/// can be used at once by later work on `stream` (stream order); the host buffer comes back
/// from the [`Pending`].
///
/// On error the host buffer is dropped (after any copy already issued has finished).
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let stream = cudars_core::Stream::new(&dev)?;
/// let (on_device, pending) = cudars_xfer::to_device_async(vec![7u32; 1 << 20], &stream)?;
/// // ... launch kernels reading `on_device` on `stream` ...
/// let host_again: Vec<u32> = pending.wait()?;
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_device_async<B: TransferBuffer>(
    src: B,
    stream: &Stream,
) -> Result<(DeviceBuffer<B::Elem>, Pending<B>)> {
    // Before the allocation, which a capture would refuse too (and be invalidated by).
    let _gate = refuse_capture(stream, "to_device_async")?;
    let dst = DeviceBuffer::alloc(&stream.device(), src.as_slice().len())?;
    let pending = copy_to_device_async(src, &dst, stream)?;
    Ok((dst, pending))
}

/// Queues a copy of `src` into `dst` (same length) on `stream`, a stream of `dst`'s device.
/// Errors for bad input come before anything is queued.
pub fn copy_to_device_async<B: TransferBuffer>(
    src: B,
    dst: &DeviceBuffer<B::Elem>,
    stream: &Stream,
) -> Result<Pending<B>> {
    check_same_len("copy_to_device_async", dst.len(), src.as_slice().len())?;
    check_stream(stream, dst)?;
    let _gate = refuse_capture(stream, "copy_to_device_async")?;
    let device_mem = dst.as_ptr().clone();
    let bytes: &[u8] = bytemuck::cast_slice(src.as_slice());
    if bytes.is_empty() {
        return Ok(Pending::new(src, None, device_mem, None));
    }
    let cfg = staging::config();
    let lease = match route(bytes.as_ptr(), bytes.len(), src.kind(), &cfg)? {
        Route::Direct(_) => {
            // SAFETY: `src` is owned by the Pending returned below (or settled on error) and
            // is not reachable by anyone until the event recorded after the copy completes.
            let issued = unsafe { device_mem.copy_from_host_async(bytes, stream) };
            if let Err(e) = issued {
                settle_after_error(src, stream);
                return Err(e.into());
            }
            None
        }
        Route::Staged => {
            // SAFETY: `src` holds `bytes.len()` bytes and outlives the call.
            let staged = unsafe { staging::to_device(bytes.as_ptr(), &device_mem, stream, &cfg) };
            match staged {
                Ok(lease) => Some(lease),
                // The host buffer is read by no DMA (the slots are; `to_device` leaked them
                // if a DMA was issued).
                Err(e) => return Err(e),
            }
        }
    };
    fence(src, stream, device_mem, lease)
}

/// Queues a copy of `src` into `dst` (same length) on `stream`, a stream of `src`'s device;
/// the filled buffer comes back from [`Pending::wait`] (CuPy's
/// `asnumpy(a, stream=s, out=dst, blocking=False)`). Errors for bad input come before
/// anything is queued.
pub fn to_host_async<B: TransferBuffer>(
    src: &DeviceBuffer<B::Elem>,
    mut dst: B,
    stream: &Stream,
) -> Result<Pending<B>> {
    check_same_len("to_host_async", dst.as_slice().len(), src.len())?;
    check_stream(stream, src)?;
    let _gate = refuse_capture(stream, "to_host_async")?;
    let device_mem = src.as_ptr().clone();
    let kind = dst.kind();
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst.as_mut_slice());
    if bytes.is_empty() {
        return Ok(Pending::new(dst, None, device_mem, None));
    }
    let cfg = staging::config();
    match route(bytes.as_ptr(), bytes.len(), kind, &cfg)? {
        Route::Direct(_) => {
            // SAFETY: `dst` is owned by the Pending returned below (or settled on error) and
            // is not reachable by anyone until the event recorded after the copy completes.
            let issued = unsafe { device_mem.copy_to_host_async(bytes, stream) };
            if let Err(e) = issued {
                settle_after_error(dst, stream);
                return Err(e.into());
            }
            fence(dst, stream, device_mem, None)
        }
        Route::Staged => {
            // SAFETY: `bytes` is an exclusive borrow of `src.byte_len()` bytes for the call.
            unsafe { staging::to_host(&device_mem, bytes.as_mut_ptr(), stream, &cfg) }?;
            // Complete: every chunk was waited for.
            Ok(Pending::new(dst, None, device_mem, None))
        }
    }
}

fn check_stream<T: Pod>(stream: &Stream, buffer: &DeviceBuffer<T>) -> Result<()> {
    Ok(stream.expect_device(buffer.device())?)
}

/// Records the completion event after an issued copy and wraps everything in a `Pending`.
fn fence<B: TransferBuffer>(
    buffer: B,
    stream: &Stream,
    device_mem: DevicePtr,
    lease: Option<Lease>,
) -> Result<Pending<B>> {
    let event = Event::new(&stream.device()).and_then(|e| e.record(stream).map(|()| e));
    match event {
        Ok(event) => Ok(Pending::new(buffer, Some(event), device_mem, lease)),
        Err(e) => {
            if stream.synchronize().is_err() {
                std::mem::forget(buffer);
            }
            // An error after the slots' DMAs were issued: never reuse them, even if the
            // stream's wait succeeded.
            if let Some(lease) = lease {
                lease.leak();
            }
            Err(e.into())
        }
    }
}

/// Transfers started in a [`scope`], waited for when it ends.
struct Fence {
    event: Option<Event>,
    stream: Stream,
    _device: DevicePtr,
    /// Staging slots still read by DMAs.
    lease: Option<Lease>,
}

/// Asynchronous transfers of borrowed slices (see [`scope`]).
///
/// `Sync`: transfers may be started from threads spawned inside the scope.
pub struct Scope<'scope, 'env: 'scope> {
    fences: Mutex<Vec<Fence>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// Runs `f` with a [`Scope`] in which asynchronous transfers may borrow host slices; returns
/// once every transfer started in it is complete (also when `f` panics: the panic resumes
/// after the wait).
///
/// The slices stay borrowed until `scope` returns, so they cannot be read or reused while the
/// device uses them. Returns `f`'s value, or the first error met while waiting.
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let stream = cudars_core::Stream::new(&dev)?;
/// let a = cudars_xfer::to_device(&dev, &[1u32; 4096])?;
/// let b = cudars_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4096)?;
/// let (mut out_a, out_b) = (vec![0u32; 4096], [2u32; 4096]);
/// cudars_xfer::scope(|s| {
///     s.to_host(&a, &mut out_a, &stream)?;
///     s.copy_to_device(&out_b, &b, &stream)?;
///     // `out_a` and `out_b` cannot be touched here
///     Ok::<(), cudars_xfer::Error>(())
/// })??;
/// assert_eq!(out_a[0], 1);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn scope<'env, F, R>(f: F) -> Result<R>
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
{
    let scope = Scope {
        fences: Mutex::new(Vec::new()),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| f(&scope)));
    let waited = scope.wait_all();
    match outcome {
        Err(panic) => resume_unwind(panic),
        Ok(value) => waited.map(|()| value),
    }
}

impl<'scope> Scope<'scope, '_> {
    fn push(&self, fence: Fence) {
        self.fences
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fence);
    }

    /// Waits for every transfer. A failed event wait falls back to the stream, then to the
    /// whole device; when even that fails the context is lost and the device runs nothing
    /// more, the case in which the borrows end with an error.
    fn wait_all(&self) -> Result<()> {
        let fences =
            std::mem::take(&mut *self.fences.lock().unwrap_or_else(PoisonError::into_inner));
        let mut first = Ok(());
        for fence in fences {
            let Some(event) = &fence.event else { continue };
            if let Err(e) = event.synchronize() {
                if first.is_ok() {
                    first = Err(e.into());
                }
                if fence.stream.synchronize().is_err() {
                    let _ = fence.stream.device().synchronize();
                }
                // A DMA from staging slots may still run: never reuse them.
                if let Some(lease) = fence.lease {
                    lease.leak();
                }
            }
        }
        first
    }

    /// Queues a copy of `src` into `dst` (same length) on `stream` (a stream of `dst`'s
    /// device); `src` stays borrowed until the scope ends.
    pub fn copy_to_device<T: Pod>(
        &'scope self,
        src: &'scope [T],
        dst: &DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        check_same_len("copy_to_device", dst.len(), src.len())?;
        check_stream(stream, dst)?;
        let _gate = refuse_capture(stream, "Scope::copy_to_device")?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        if bytes.is_empty() {
            return Ok(());
        }
        let device_mem = dst.as_ptr().clone();
        let cfg = staging::config();
        let lease = match route(bytes.as_ptr(), bytes.len(), HostMemoryKind::Unknown, &cfg)? {
            Route::Direct(_) => {
                // SAFETY: `src` is borrowed until the scope ends, which waits for the event
                // recorded after this copy (or for the stream, if recording fails).
                let issued = unsafe { device_mem.copy_from_host_async(bytes, stream) };
                if let Err(e) = issued {
                    let _ = stream.synchronize();
                    return Err(e.into());
                }
                None
            }
            Route::Staged => {
                // SAFETY: `src` holds the bytes and outlives the call.
                Some(unsafe { staging::to_device(bytes.as_ptr(), &device_mem, stream, &cfg) }?)
            }
        };
        self.fence(stream, device_mem, lease)
    }

    /// Queues a copy of `src` into `dst` (same length) on `stream` (a stream of `src`'s
    /// device); `dst` stays borrowed until the scope ends, and holds the data then.
    pub fn to_host<T: Pod>(
        &'scope self,
        src: &DeviceBuffer<T>,
        dst: &'scope mut [T],
        stream: &Stream,
    ) -> Result<()> {
        check_same_len("to_host", dst.len(), src.len())?;
        check_stream(stream, src)?;
        let _gate = refuse_capture(stream, "Scope::to_host")?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if bytes.is_empty() {
            return Ok(());
        }
        let device_mem = src.as_ptr().clone();
        let cfg = staging::config();
        match route(bytes.as_ptr(), bytes.len(), HostMemoryKind::Unknown, &cfg)? {
            Route::Direct(_) => {
                // SAFETY: `dst` is borrowed until the scope ends, which waits for the event
                // recorded after this copy (or for the stream, if recording fails).
                let issued = unsafe { device_mem.copy_to_host_async(bytes, stream) };
                if let Err(e) = issued {
                    let _ = stream.synchronize();
                    return Err(e.into());
                }
                self.fence(stream, device_mem, None)
            }
            Route::Staged => {
                // SAFETY: `bytes` is exclusively borrowed for the call; complete on return.
                unsafe { staging::to_host(&device_mem, bytes.as_mut_ptr(), stream, &cfg) }
            }
        }
    }

    fn fence(&self, stream: &Stream, device_mem: DevicePtr, lease: Option<Lease>) -> Result<()> {
        let event = Event::new(&stream.device()).and_then(|e| e.record(stream).map(|()| e));
        let (event, lease, result) = match event {
            Ok(e) => (Some(e), lease, Ok(())),
            Err(e) => {
                // No event: wait for the stream now (the scope's end would have nothing to
                // wait on). An error after the slots' DMAs were issued: never reuse them.
                let _ = stream.synchronize();
                if let Some(lease) = lease {
                    lease.leak();
                }
                (None, None, Err(e.into()))
            }
        };
        self.push(Fence {
            event,
            stream: stream.clone(),
            _device: device_mem,
            lease,
        });
        result
    }
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.fences.lock().map_or(0, |fences| fences.len());
        f.debug_struct("Scope").field("transfers", &n).finish()
    }
}
