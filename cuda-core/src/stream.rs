//! Streams: ordered queues of device work (CuPy's `Stream`, `ExternalStream`,
//! `get_current_stream`, `with stream:`).
//!
//! A [`Stream`] is one of four kinds ([`StreamKind`]): a stream this crate created and
//! destroys ([`Stream::new`], [`Stream::builder`]), the legacy null stream ([`Stream::null`]),
//! the per-thread default stream ([`Stream::per_thread`]), or a foreign stream wrapped without
//! being owned ([`Stream::external`]).
//!
//! Each thread has a *current stream* per device ([`Stream::current`], CuPy's
//! `get_current_stream`): the legacy null stream until [`Stream::scope`] (CuPy's
//! `with stream:`) or [`Stream::make_current`] says otherwise.
//!
//! ```no_run
//! use cudars_core::{Device, Stream};
//! let dev = Device::new(0)?;
//! let stream = Stream::builder(&dev).non_blocking(true).greatest_priority().build()?;
//! {
//!     let _scope = stream.scope(); // like `with stream:`
//!     assert_eq!(Stream::current(&dev), stream);
//!     // ... work queued on Stream::current(&dev) ...
//! }
//! assert_eq!(Stream::current(&dev), Stream::null(&dev));
//! stream.add_callback(|status| println!("all work before me is done: {status:?}"))?;
//! stream.synchronize()?;
//! # Ok::<(), cudars_core::Error>(())
//! ```
//!
//! # Host callbacks and panics
//!
//! [`Stream::add_callback`] runs a Rust closure on a driver thread once the work queued
//! before it is done, and hands it the stream's status. A panic inside the closure is caught
//! there (it never unwinds into the driver) and kept for the stream: the next
//! [`Stream::synchronize`] on that stream returns [`Error::CallbackPanicked`] with the panic
//! message, or [`Stream::take_callback_panic`] collects it without synchronising.
//!
//! # What a host callback captures is dropped off the driver's thread
//!
//! CUDA forbids CUDA calls inside a host function, and dropping a captured value can make
//! some: the last [`DevicePtr`](crate::DevicePtr) of pool memory records an event and frees,
//! the last clone of a [`Stream`] destroys it. So the closure is an `FnMut` called once, which
//! cannot move its captures out, and after it returns the closure, with everything it
//! captured (and a panic's payload), is handed to the [release thread](crate::release) of
//! this crate, started at the first [`Stream::add_callback`], which drops it there. Values
//! are therefore dropped a little after the callback ran, never inside it. A value the
//! closure drops anyway (taken out of a captured `Option`) is caught too: the callback runs
//! in a [`HostFunctionScope`](crate::release::HostFunctionScope), and the types the
//! [release](crate::release) module lists (views, streams, events, this crate's device,
//! managed, pinned and stream-ordered memory, IPC mappings) release on the release thread
//! when dropped there.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudars_sys::{CUcontext, CUresult, CUstream, CUstream_flags, Driver};

use crate::driver::{api, check, drv};
use crate::error::{DriverError, Error, Result};
use crate::Device;

/// The driver's handle for the per-thread default stream (`CU_STREAM_PER_THREAD` in `cuda.h`).
pub const PER_THREAD_HANDLE: usize = 0x2;
/// The driver's explicit handle for the legacy null stream (`CU_STREAM_LEGACY` in `cuda.h`).
pub const LEGACY_HANDLE: usize = 0x1;

/// The [`Stream::identity`] of a stream known only by its handle (an external stream): 0 for
/// the legacy null stream under either name (null, [`LEGACY_HANDLE`]), the handle's value
/// otherwise ([`PER_THREAD_HANDLE`] for the per-thread default stream). No driver call; the
/// rule [`Stream::external`] applies, for code that has only the handle (the C ABI).
#[inline]
pub fn external_identity(raw: CUstream) -> u64 {
    if raw as usize == LEGACY_HANDLE {
        0
    } else {
        raw as usize as u64
    }
}

/// The tag of an external stream's [`Stream::identity`] when it is the driver's id of the
/// stream, its two top bits: it keeps those identities apart from handle values (user-space
/// addresses, below 2^47), from the identities of streams this crate creates (the top bit
/// alone) and from the keys a pool gives per-thread default streams (the next bit alone).
pub const EXTERNAL_UID_TAG: u64 = 3 << 62;

/// The [`Stream::identity`] that [`Stream::external`] gives the explicit handle `raw` on a
/// driver that numbers its streams (`cuStreamGetId`, CUDA 12.0): the driver's id, tagged with
/// [`EXTERNAL_UID_TAG`]. `None` where the driver cannot say. One driver call (made with a
/// context current, as every call of this crate): for code that has only the handle and must
/// tell whether it still names the stream it named before (the C ABI's per-thread memo of
/// wrapped handles).
///
/// # Safety
///
/// `raw` is a valid explicit stream handle of `device` (not null, `CU_STREAM_LEGACY` or
/// `CU_STREAM_PER_THREAD`) during the call, and is not being captured: the driver refuses the
/// question during a capture and invalidates the capture (a capture in global mode even when
/// another thread asks).
#[inline]
pub unsafe fn external_uid(device: &Device, raw: CUstream) -> Option<u64> {
    if is_implicit(raw) {
        return None;
    }
    let mut id: std::ffi::c_ulonglong = 0;
    let asked = with_context(*device, false, |d| {
        // SAFETY: the caller's contract: a valid explicit handle; a valid out-pointer.
        check(unsafe { d.cuStreamGetId(raw, &mut id) }?, "cuStreamGetId")
    });
    (asked.is_ok() && id < 1 << 62).then_some(id | EXTERNAL_UID_TAG)
}

/// What a [`Stream`] is and who destroys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// Created by this crate; destroyed when the last clone drops.
    Owned,
    /// The legacy default stream (handle `NULL`): synchronises with every blocking stream of
    /// its device.
    LegacyNull,
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`): one implicit stream per host
    /// thread, which does not synchronise with the legacy null stream's blocking semantics.
    PerThread,
    /// A foreign `CUstream` wrapped without being owned (CuPy's `ExternalStream`).
    External,
}

/// Keeps an owned stream alive; destroys it when the last [`Stream`] clone drops.
struct Owner {
    raw: CUstream,
    device: Device,
    destroy: bool,
    /// Made at the first host callback: most streams never get one.
    panics: OnceLock<Arc<PanicSlot>>,
    _keep_alive: Option<Box<dyn Any + Send + Sync>>,
}

// SAFETY: a CUstream may be used and destroyed from any thread; the keep-alive value is
// Send + Sync by its bound.
unsafe impl Send for Owner {}
// SAFETY: as above; Owner exposes nothing but the handle.
unsafe impl Sync for Owner {}

impl Drop for Owner {
    fn drop(&mut self) {
        if self.destroy && crate::release::inside_host_function() {
            // No cuStreamDestroy inside a host function: a copy of this owner destroys the
            // stream on the release thread.
            self.destroy = false;
            let moved = Owner {
                raw: self.raw,
                device: self.device,
                destroy: true,
                panics: std::mem::take(&mut self.panics),
                _keep_alive: self._keep_alive.take(),
            };
            crate::release::defer(Box::new(moved), crate::release::When::Now);
            return;
        }
        if self.destroy {
            let raw = self.raw;
            // SAFETY: we created the stream and this is the last reference to it; the driver
            // lets queued work (and callbacks) finish after destruction.
            let _ = with_context(self.device, false, |_| unsafe {
                drv!(cuStreamDestroy(raw))
            });
        }
    }
}

/// A CUDA stream of one device.
///
/// Cloning is cheap and shares the stream; an owned stream is destroyed when its last clone
/// drops (work already queued still runs). `Send` and `Sync`: the driver's stream calls are
/// thread-safe. Two `Stream`s compare equal when they name the same driver stream of the
/// same device.
#[derive(Clone)]
pub struct Stream {
    raw: CUstream,
    device: Device,
    kind: StreamKind,
    owner: Option<Arc<Owner>>,
    /// See [`Stream::identity`].
    identity: u64,
    /// See [`Stream::external_announced`].
    announced: bool,
}

/// Identities of streams this crate creates: the top bit set, so they never collide with a
/// handle value (user-space addresses) that external streams use as their identity.
static NEXT_OWNED_IDENTITY: AtomicU64 = AtomicU64::new(1 << 63);

// SAFETY: a CUstream is a handle the driver lets any thread use; the struct holds no
// thread-affine state (the owner is Send + Sync).
unsafe impl Send for Stream {}
// SAFETY: as above; every method takes &self and maps to a thread-safe driver call.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.raw)
            .field("device", &self.device.ordinal())
            .field("kind", &self.kind)
            .finish()
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        self.raw == other.raw && self.device == other.device
    }
}

impl Eq for Stream {}

/// Builds a [`Stream`] (CuPy's `Stream(null=False, non_blocking=False, priority=0)`).
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// let dev = Device::new(0)?;
/// let (least, greatest) = dev.stream_priority_range()?;
/// let urgent = Stream::builder(&dev).priority(greatest).build()?;
/// let background = Stream::builder(&dev).non_blocking(true).priority(least).build()?;
/// assert!(Stream::builder(&dev).priority(greatest - 1).build().is_err());
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use = "a builder does nothing until build() is called"]
pub struct StreamBuilder {
    device: Device,
    non_blocking: bool,
    priority: PriorityRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PriorityRequest {
    Default,
    Value(i32),
    Greatest,
    Least,
}

impl StreamBuilder {
    /// `true`: the stream does not synchronise with the legacy null stream
    /// (`CU_STREAM_NON_BLOCKING`). Default `false`.
    pub fn non_blocking(mut self, non_blocking: bool) -> Self {
        self.non_blocking = non_blocking;
        self
    }

    /// Scheduling priority; numerically lower is more urgent. Must lie within the device's
    /// [`Device::stream_priority_range`] (`greatest <= priority <= least`), otherwise
    /// [`build`](Self::build) fails with [`Error::InvalidArgument`] and creates nothing.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = PriorityRequest::Value(priority);
        self
    }

    /// The device's most urgent priority.
    pub fn greatest_priority(mut self) -> Self {
        self.priority = PriorityRequest::Greatest;
        self
    }

    /// The device's least urgent priority (the default one).
    pub fn least_priority(mut self) -> Self {
        self.priority = PriorityRequest::Least;
        self
    }

    /// Creates the stream.
    pub fn build(self) -> Result<Stream> {
        let flags = if self.non_blocking {
            CUstream_flags::CU_STREAM_NON_BLOCKING.0
        } else {
            CUstream_flags::CU_STREAM_DEFAULT.0
        };
        let _ctx = self.device.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        if self.priority == PriorityRequest::Default {
            // SAFETY: the device's context is current; valid out-pointer.
            unsafe { drv!(cuStreamCreate(&mut raw, flags)) }?;
        } else {
            let range = self.device.stream_priority_range()?;
            let priority = resolve_priority(self.priority, range)?;
            // SAFETY: the device's context is current; valid out-pointer; priority in range.
            unsafe { drv!(cuStreamCreateWithPriority(&mut raw, flags, priority)) }?;
        }
        Ok(Stream::owned(raw, self.device))
    }
}

/// The priority a request stands for, given the device's `(least, greatest)` range.
fn resolve_priority(request: PriorityRequest, (least, greatest): (i32, i32)) -> Result<i32> {
    match request {
        PriorityRequest::Default | PriorityRequest::Least => Ok(least),
        PriorityRequest::Greatest => Ok(greatest),
        PriorityRequest::Value(p) if p >= greatest && p <= least => Ok(p),
        PriorityRequest::Value(p) => Err(Error::InvalidArgument(format!(
            "stream priority {p} is outside the device's range {greatest} (greatest) ..= {least} (least)"
        ))),
    }
}

impl Stream {
    fn owned(raw: CUstream, device: Device) -> Stream {
        Stream {
            raw,
            device,
            kind: StreamKind::Owned,
            identity: NEXT_OWNED_IDENTITY.fetch_add(1, Ordering::Relaxed),
            announced: false,
            owner: Some(Arc::new(Owner {
                raw,
                device,
                destroy: true,
                panics: OnceLock::new(),
                _keep_alive: None,
            })),
        }
    }

    /// A new blocking stream on `device` (it synchronises with the legacy null stream), like
    /// CuPy's `Stream()`. [`Stream::builder`] gives the other options.
    pub fn new(device: &Device) -> Result<Stream> {
        Stream::builder(device).build()
    }

    /// A builder for a stream on `device`.
    pub fn builder(device: &Device) -> StreamBuilder {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        StreamBuilder {
            device: *device,
            non_blocking: false,
            priority: PriorityRequest::Default,
        }
    }

    /// The legacy default (null) stream of `device` (CuPy's `Stream.null`). Never destroyed.
    pub fn null(device: &Device) -> Stream {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        Stream {
            raw: std::ptr::null_mut(),
            device: *device,
            kind: StreamKind::LegacyNull,
            owner: None,
            identity: 0,
            announced: false,
        }
    }

    /// The per-thread default stream of `device` (`CU_STREAM_PER_THREAD`, CuPy's
    /// `Stream.ptds`): each host thread that uses it gets its own implicit stream.
    pub fn per_thread(device: &Device) -> Stream {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        Stream {
            raw: PER_THREAD_HANDLE as CUstream,
            device: *device,
            kind: StreamKind::PerThread,
            owner: None,
            identity: PER_THREAD_HANDLE as u64,
            announced: false,
        }
    }

    /// Wraps a stream created elsewhere (by CuPy, PyTorch, a C library) without owning it:
    /// dropping the `Stream` leaves it alive (CuPy's `ExternalStream`).
    ///
    /// A stream of another device is rejected with [`Error::WrongDevice`] (`cuStreamGetDevice`
    /// on 12.8+ drivers; before, emulated exactly through the stream's context).
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of `device` (or one of the implicit handles `NULL`,
    /// `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) and must stay valid for as long as this
    /// `Stream` or any clone of it is used. [`Stream::external_with_owner`] can tie that
    /// lifetime to a value. Pools keep a clone of a stream while they hold live allocations
    /// made on it and let go of it once the last of those is freed (see `cuda-mempool`), so a
    /// foreign stream handed to a pool must stay valid until every allocation made on it has
    /// been freed. If foreign code begins a graph capture on this stream, memory used by work
    /// captured there must be kept alive by the caller for as long as the graph can run
    /// (captures begun through [`crate::graph`] do that themselves).
    pub unsafe fn external(device: &Device, raw: CUstream) -> Result<Stream> {
        Stream::wrap_external(device, raw, None, false)
    }

    /// As [`Stream::external`], for a stream whose every graph capture is announced to this
    /// crate: begun between [`graph::announce_capture_begin`](crate::graph::announce_capture_begin)
    /// and [`graph::announce_capture_end`](crate::graph::announce_capture_end) (PyTorch tells
    /// its allocator when its captures begin and end; the `cuda-mempool` C ABI relays that).
    /// Allocators then ask the driver whether the stream is being captured only while an
    /// announced capture (or one begun through [`crate::graph`]) runs, instead of at every
    /// allocation: see [`Stream::captures_announced`].
    ///
    /// # Safety
    ///
    /// As [`Stream::external`]; and no capture of `raw` (by any code) begins or runs outside
    /// an announced window while this `Stream` or a clone of it is used. Otherwise a pool could
    /// hand a capture memory it also hands to other work, which a replay then overwrites.
    pub unsafe fn external_announced(device: &Device, raw: CUstream) -> Result<Stream> {
        Stream::wrap_external(device, raw, None, true)
    }

    /// As [`Stream::external`], keeping `owner` alive (dropped with the last clone) so that
    /// whatever keeps the foreign stream alive lives as long as the wrapper.
    ///
    /// # Safety
    ///
    /// As [`Stream::external`], except that the stream need only stay valid while `owner`
    /// is alive.
    pub unsafe fn external_with_owner<O: Any + Send + Sync>(
        device: &Device,
        raw: CUstream,
        owner: O,
    ) -> Result<Stream> {
        Stream::wrap_external(device, raw, Some(Box::new(owner)), false)
    }

    fn wrap_external(
        device: &Device,
        raw: CUstream,
        keep_alive: Option<Box<dyn Any + Send + Sync>>,
        announced: bool,
    ) -> Result<Stream> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        // The driver refuses to say a stream's device or id while the stream is being
        // captured (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, which also invalidates the capture):
        // then the caller's word is taken for the device, and the handle's value is the
        // identity (not unique: see `identity_is_unique`).
        let capturing = !is_implicit(raw) && is_capturing(*device, raw);
        if !is_implicit(raw) && !capturing {
            let mut actual = 0;
            let asked = with_context(*device, false, |_| {
                // SAFETY: the caller vouches for the handle; valid out-pointer.
                unsafe { drv!(stream_get_device as "cuStreamGetDevice" (raw, &mut actual)) }
            });
            match asked {
                Ok(()) if actual != device.raw() => {
                    return Err(Error::WrongDevice {
                        what: "external stream",
                        expected: device.ordinal(),
                        // On every current driver a `CUdevice` equals its ordinal.
                        actual: usize::try_from(actual).unwrap_or(usize::MAX),
                    });
                }
                Ok(()) | Err(Error::MissingSymbol(_) | Error::DriverTooOld { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // CU_STREAM_LEGACY is the legacy null stream under another name. An explicit handle
        // is known by the driver's id of the stream where the driver has one (never reused,
        // unlike the handle's value), else by its value.
        let identity = if is_implicit(raw) || capturing {
            external_identity(raw)
        } else {
            // SAFETY: the caller vouches for the handle, which is not being captured.
            unsafe { external_uid(device, raw) }.unwrap_or_else(|| external_identity(raw))
        };
        // The implicit handles keep their meaning: CU_STREAM_LEGACY is the legacy null
        // stream, CU_STREAM_PER_THREAD the calling thread's own stream.
        let kind = match raw as usize {
            LEGACY_HANDLE => StreamKind::LegacyNull,
            PER_THREAD_HANDLE => StreamKind::PerThread,
            _ => StreamKind::External,
        };
        Ok(Stream {
            raw,
            device: *device,
            kind,
            identity,
            announced: announced && kind == StreamKind::External,
            owner: keep_alive.map(|k| {
                Arc::new(Owner {
                    raw,
                    device: *device,
                    destroy: false,
                    panics: OnceLock::new(),
                    _keep_alive: Some(k),
                })
            }),
        })
    }

    /// The driver handle (CuPy's `Stream.ptr`): `NULL` for the legacy null stream,
    /// `CU_STREAM_PER_THREAD` for the per-thread one.
    #[inline]
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The device the stream belongs to.
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }

    /// What kind of stream this is.
    #[inline]
    pub fn kind(&self) -> StreamKind {
        self.kind
    }

    /// A number that identifies this stream while it lives, for caches keyed by stream:
    /// unique in the process and never reused for streams this crate created (clones share
    /// it); for an external stream, the driver's id of the stream (`cuStreamGetId`, never
    /// reused either) tagged with [`EXTERNAL_UID_TAG`], or, on a driver without that call,
    /// the handle's value (which the driver may give to a new stream once the old one is
    /// destroyed: see [`Stream::identity_is_unique`]); 0 for the legacy null stream (also under
    /// its `CU_STREAM_LEGACY` handle); [`PER_THREAD_HANDLE`] for the per-thread default
    /// stream, which names a different stream on every thread.
    #[inline]
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// Whether [`identity`](Self::identity) names this stream alone for the life of the
    /// process: a stream this crate created, or an external one known by the driver's id. A
    /// cache keyed by such an identity can never meet another stream under the same key.
    #[inline]
    pub fn identity_is_unique(&self) -> bool {
        match self.kind {
            StreamKind::Owned => true,
            StreamKind::External => self.identity & EXTERNAL_UID_TAG == EXTERNAL_UID_TAG,
            StreamKind::LegacyNull | StreamKind::PerThread => false,
        }
    }

    /// Whether every capture of this stream is announced (made by
    /// [`Stream::external_announced`]): then "no capture is in progress"
    /// ([`graph::captures_in_progress`](crate::graph::captures_in_progress) and
    /// [`graph::announced_captures_in_progress`](crate::graph::announced_captures_in_progress)
    /// both false) means this stream is not being captured, without asking the driver.
    #[inline]
    pub fn captures_announced(&self) -> bool {
        self.announced
    }

    /// How many `Stream` values share this stream's owner (this one included): `Some(1)`
    /// when no other clone exists, so dropping this value destroys an owned stream. `None`
    /// for streams without an owner (null, per-thread, external without owner).
    #[inline]
    pub fn clone_count(&self) -> Option<usize> {
        self.owner.as_ref().map(Arc::strong_count)
    }

    /// `true` for the implicit streams (legacy null, per-thread), whose handle means "the
    /// current context's stream": operations on them make the device current first.
    #[inline]
    pub fn is_implicit(&self) -> bool {
        is_implicit(self.raw)
    }

    /// Runs a driver call on this stream's handle with the right context current (see
    /// [`with_context`]).
    #[inline]
    pub(crate) fn with_context<T>(
        &self,
        call: impl FnMut(&'static Driver) -> Result<T>,
    ) -> Result<T> {
        with_context(self.device, self.is_implicit(), call)
    }

    /// Blocks until all work queued on the stream is done.
    ///
    /// Returns [`Error::CallbackPanicked`] when a host callback of this stream panicked since
    /// the last report (the work itself is then done).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream (or an implicit handle with its device current).
        self.with_context(|_| unsafe { drv!(cuStreamSynchronize(self.raw)) })?;
        match self.take_callback_panic() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `true` when all work queued on the stream is done (CuPy's `Stream.done`).
    pub fn is_done(&self) -> Result<bool> {
        self.with_context(|d| {
            // SAFETY: a live stream (or an implicit handle with its device current).
            let r = unsafe { d.cuStreamQuery(self.raw) }?;
            if r == CUresult::CUDA_ERROR_NOT_READY {
                Ok(false)
            } else {
                check(r, "cuStreamQuery").map(|()| true)
            }
        })
    }

    /// The stream's priority (numerically lower is more urgent).
    pub fn priority(&self) -> Result<i32> {
        let mut priority = 0;
        self.with_context(|_| {
            // SAFETY: a live stream; valid out-pointer.
            unsafe { drv!(cuStreamGetPriority(self.raw, &mut priority)) }
        })?;
        Ok(priority)
    }

    /// The stream's creation flags (`CU_STREAM_DEFAULT` or `CU_STREAM_NON_BLOCKING`).
    pub fn flags(&self) -> Result<CUstream_flags> {
        let mut flags = 0;
        self.with_context(|_| {
            // SAFETY: a live stream; valid out-pointer.
            unsafe { drv!(cuStreamGetFlags(self.raw, &mut flags)) }
        })?;
        Ok(CUstream_flags(flags))
    }

    /// `true` when the stream does not synchronise with the legacy null stream.
    pub fn is_non_blocking(&self) -> Result<bool> {
        let flags = self.flags()?;
        Ok(flags.0 & CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0)
    }

    /// Queues `callback` to run on a driver thread once all work queued before it is done
    /// (CuPy's `Stream.add_callback`); later work on the stream waits for it. The closure
    /// receives the stream's status: `Ok(())`, or the sticky driver error that failed the
    /// work before it.
    ///
    /// The closure must not call the CUDA driver (the driver forbids it in callbacks and may
    /// deadlock or fail); it may signal threads, write host memory, and so on. A panic in it
    /// is caught and reported by the next [`Stream::synchronize`] (or
    /// [`Stream::take_callback_panic`]) on this stream; it never unwinds into the driver.
    ///
    /// It is called exactly once, and is an `FnMut` so that it cannot move what it captured
    /// out and drop it in the callback: the closure and its captures are dropped after it
    /// returns, on the release thread of this crate (see the
    /// [module documentation](self#what-a-host-callback-captures-is-dropped-off-the-drivers-thread)),
    /// so capturing a [`DevicePtr`](crate::DevicePtr) of pool memory, an event or a stream,
    /// whose drop calls the driver, is fine. Taking such a value out with `Option::take` and
    /// dropping it inside is caught as well for the types the [release](crate::release)
    /// module lists (a [`DevicePtr`](crate::DevicePtr), a [`Stream`], an [`Event`](crate::Event), this
    /// crate's memory owners): they release on the release thread. Should that thread fail to
    /// start, the closures are leaked instead.
    ///
    /// ```no_run
    /// use std::sync::mpsc;
    /// use cudars_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let stream = Stream::new(&dev)?;
    /// let (tx, rx) = mpsc::channel();
    /// stream.add_callback(move |status| { let _ = tx.send(status.is_ok()); })?;
    /// assert!(rx.recv().unwrap());
    /// # Ok::<(), cudars_core::Error>(())
    /// ```
    pub fn add_callback<F>(&self, callback: F) -> Result<()>
    where
        F: FnMut(Result<()>) + Send + 'static,
    {
        // Start the release thread here, on the caller's thread, not inside the callback.
        cleanup_thread();
        let payload = Box::new(CallbackPayload {
            callback: Box::new(callback),
            panics: self.panic_slot(),
        });
        let data = Box::into_raw(payload) as *mut c_void;
        let added = self.with_context(|_| {
            // SAFETY: a live stream; `trampoline` matches CUstreamCallback and takes
            // ownership of `data` exactly once when the driver runs it.
            unsafe { drv!(cuStreamAddCallback(self.raw, Some(trampoline), data, 0)) }
        });
        if added.is_err() {
            // SAFETY: the driver did not take the callback, so `data` is still ours, from the
            // Box::into_raw above, and reclaimed once.
            drop(unsafe { Box::from_raw(data as *mut CallbackPayload) });
        }
        added
    }

    /// The panic of a host callback of this stream not yet reported, as
    /// [`Error::CallbackPanicked`] (the oldest first), without synchronising.
    pub fn take_callback_panic(&self) -> Option<Error> {
        let slot = match &self.owner {
            Some(owner) => owner.panics.get().cloned(),
            None if SHARED_SLOTS_USED.load(Ordering::Acquire) => {
                let map = shared_slots()
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                map.get(&self.slot_key()).cloned()
            }
            None => None,
        }?;
        slot.take().map(Error::CallbackPanicked)
    }

    fn slot_key(&self) -> (i32, usize) {
        (self.device.ordinal() as i32, self.raw as usize)
    }

    /// Where this stream's callback panics are kept: the owner's slot, or a process-wide
    /// slot per (device, handle) for streams without an owner.
    fn panic_slot(&self) -> Arc<PanicSlot> {
        if let Some(owner) = &self.owner {
            return Arc::clone(owner.panics.get_or_init(Arc::default));
        }
        let mut map = shared_slots()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        SHARED_SLOTS_USED.store(true, Ordering::Release);
        Arc::clone(map.entry(self.slot_key()).or_default())
    }

    /// The thread's current stream for `device` (CuPy's `get_current_stream`): the stream of
    /// the innermost live [`Stream::scope`] or the last [`Stream::make_current`] on this
    /// thread, else the legacy null stream.
    pub fn current(device: &Device) -> Stream {
        let ordinal = device.ordinal();
        CURRENT
            .try_with(|cur| cur.borrow().get(ordinal).cloned().flatten())
            .ok()
            .flatten()
            .unwrap_or_else(|| Stream::null(device))
    }

    /// Makes this stream the thread's current stream for its device until changed (CuPy's
    /// `Stream.use()`). The stream is kept alive while it is current.
    pub fn make_current(&self) {
        set_current(self.device.ordinal(), Some(self.clone()));
    }

    /// Makes this stream the thread's current stream for its device until the guard drops,
    /// which restores the previous one (CuPy's `with stream:`). Guards nest. The current
    /// device is not changed. The guard is not `Send`: the current stream is per thread.
    pub fn scope(&self) -> StreamScope {
        let ordinal = self.device.ordinal();
        let previous = set_current(ordinal, Some(self.clone()));
        StreamScope {
            ordinal,
            previous,
            _not_send: PhantomData,
        }
    }
}

/// Whether the stream behind `raw` is being captured (errors count as capturing, which only
/// skips a check).
fn is_capturing(device: Device, raw: CUstream) -> bool {
    let mut status = cudars_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cudars_sys::cuuint64_t = 0;
    let asked = with_context(device, false, |_| {
        // SAFETY: the caller of `external` vouches for the handle; valid out-pointers; the
        // optional outputs are null.
        unsafe {
            drv!(stream_get_capture_info as "cuStreamGetCaptureInfo" (
                raw,
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ))
        }
    });
    !matches!(asked, Ok(()))
        || status != cudars_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// `true` for the handles that mean "an implicit stream of the current context".
#[inline]
fn is_implicit(raw: CUstream) -> bool {
    (raw as usize) <= PER_THREAD_HANDLE
}

fn is_invalid_context(e: &Error) -> bool {
    e.driver()
        .is_some_and(|d| d.result() == CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// Runs a driver call on handles of `device` with a context current on the calling thread.
///
/// The driver must never be called on a thread with no current context (some entry points
/// crash there instead of failing). An implicit stream handle (`implicit`) means "the current
/// context's stream", so `device`'s context is made current for it. Explicit streams and
/// events carry their context: any current context will do. Should the driver still answer
/// `CUDA_ERROR_INVALID_CONTEXT`, the call is retried once with `device`'s context current.
///
/// # The per-thread cache
///
/// Asking the driver (`cuCtxGetCurrent`, 15-20 ns) before every call on an explicit handle
/// cost 5-8% of an event record+query pair. So each thread remembers that it has seen a
/// context current ([`context_seen`]) and skips the question while that holds. The cache is
/// cleared whenever this crate pops or replaces the current context ([`forget_context`]), so
/// only foreign code (a `cuCtxPopCurrent` or `cuCtxSetCurrent(NULL)` of its own) can leave it
/// stale. For that case the cache is revalidated by the driver's own answer: the calls made
/// through this function on explicit handles answer `CUDA_ERROR_INVALID_CONTEXT` on a thread
/// without a context (they do not crash: the GPU test
/// `explicit_handles_survive_a_foreign_context_pop` pops the context behind the cache's back
/// and runs every one of them), and that answer clears the cache and retries with `device`'s
/// context pushed.
#[inline]
pub(crate) fn with_context<T>(
    device: Device,
    implicit: bool,
    mut call: impl FnMut(&'static Driver) -> Result<T>,
) -> Result<T> {
    let d = api()?;
    // A handle of an ended generation, or a lost context: refused here, before the driver.
    let _call = crate::health::enter(&device)?;
    let binding = if implicit {
        Some(device.bind()?)
    } else if crate::context_note::context_seen() {
        None
    } else {
        let mut current: CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer.
            unsafe { d.cuCtxGetCurrent(&mut current) }?,
            "cuCtxGetCurrent",
        )?;
        if current.is_null() {
            Some(device.bind()?)
        } else {
            crate::context_note::remember_context();
            None
        }
    };
    match call(d) {
        Err(e) if !implicit && is_invalid_context(&e) => {
            crate::context_note::forget_context();
            drop(binding);
            let _ctx = device.bind()?;
            call(d)
        }
        other => other,
    }
}

/// Runs a kernel launch (`call`) of a function of `device`'s primary context, with that
/// context current.
///
/// A launch needs the function's context current, and asking the driver which one is
/// (`cuCtxGetCurrent`, 15-20 ns) on every launch was a measurable part of the launch
/// overhead. So each thread remembers the context it last saw current here and launches
/// without asking while that holds. The note is cleared whenever this crate pops or replaces
/// the context ([`forget_context`]); only foreign code can leave it stale, and then the driver
/// refuses the launch (`CUDA_ERROR_INVALID_CONTEXT` with no context current,
/// `CUDA_ERROR_INVALID_HANDLE` or `CUDA_ERROR_INVALID_CONTEXT` with another one: a refused
/// launch queues nothing), which clears the note and retries with the context pushed for the
/// call (also `CUDA_ERROR_CONTEXT_IS_DESTROYED`, a destroyed foreign context left current). The
/// GPU test `launches_survive_a_foreign_context_change` makes these changes behind the note's
/// back.
///
/// The note is used only for a stream this crate created while no capture begun through it
/// runs: a launch refused on a stream being captured could invalidate the capture, and foreign
/// code captures foreign streams (and the implicit ones) without telling this crate.
#[inline]
pub(crate) fn launch_in_context(
    device: Device,
    stream: &Stream,
    mut call: impl FnMut() -> Result<()>,
) -> Result<()> {
    // The stream's generation was checked by the caller's `Issue` (`Stream::issue`).
    let _call = crate::health::enter(&device)?;
    let target = device.primary_context()? as usize;
    let noted = stream.kind() == StreamKind::Owned
        && !crate::capture_gate::captures_in_progress()
        && crate::context_note::known_context() == Some(target);
    if noted {
        match call() {
            Err(e) if is_stale_context(&e) => crate::context_note::forget_context(),
            other => return other,
        }
    }
    let binding = device.bind()?;
    if !binding.pushed() {
        crate::context_note::note_known_context(target);
    }
    call()
}

/// What the driver answers a launch made with another context current than the function's,
/// or none, or a destroyed one.
fn is_stale_context(e: &Error) -> bool {
    e.driver().is_some_and(|d| {
        [
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ]
        .contains(&d.result())
    })
}

/// The thread's current stream for `device`; shorthand for [`Stream::current`] (CuPy's
/// `get_current_stream`).
pub fn current_stream(device: &Device) -> Stream {
    Stream::current(device)
}

thread_local! {
    /// The thread's current stream per device ordinal (`None`: the legacy null stream).
    static CURRENT: RefCell<Vec<Option<Stream>>> = const { RefCell::new(Vec::new()) };
}

/// Sets the thread's current stream for `ordinal`, returning the previous setting.
fn set_current(ordinal: usize, stream: Option<Stream>) -> Option<Stream> {
    CURRENT
        .try_with(|cur| {
            let mut cur = cur.borrow_mut();
            if cur.len() <= ordinal {
                cur.resize(ordinal + 1, None);
            }
            std::mem::replace(&mut cur[ordinal], stream)
        })
        .ok()
        .flatten()
}

/// Restores the thread's previous current stream of a device when dropped (see
/// [`Stream::scope`]). Not `Send`: the current stream is per thread.
#[must_use = "the previous current stream is restored when the guard drops"]
pub struct StreamScope {
    ordinal: usize,
    previous: Option<Stream>,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for StreamScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamScope")
            .field("device", &self.ordinal)
            .field("previous", &self.previous)
            .finish()
    }
}

impl Drop for StreamScope {
    fn drop(&mut self) {
        // Dropping the replaced stream may destroy it: do that outside the TLS borrow.
        let replaced = set_current(self.ordinal, self.previous.take());
        drop(replaced);
    }
}

/// Panic messages of host callbacks, waiting to be reported.
#[derive(Default)]
struct PanicSlot {
    pending: AtomicUsize,
    messages: Mutex<Vec<String>>,
}

impl PanicSlot {
    fn push(&self, message: String) {
        let mut messages = self
            .messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        messages.push(message);
        self.pending.fetch_add(1, Ordering::Release);
    }

    fn take(&self) -> Option<String> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut messages = self
            .messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if messages.is_empty() {
            return None;
        }
        self.pending.fetch_sub(1, Ordering::Release);
        Some(messages.remove(0))
    }
}

static SHARED_SLOTS_USED: AtomicBool = AtomicBool::new(false);

type SlotMap = Mutex<HashMap<(i32, usize), Arc<PanicSlot>>>;

fn shared_slots() -> &'static SlotMap {
    static SLOTS: OnceLock<SlotMap> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

struct CallbackPayload {
    callback: Box<dyn FnMut(Result<()>) + Send>,
    panics: Arc<PanicSlot>,
}

/// Something to drop off the driver's thread.
type Deferred = Box<dyn Send>;

/// Starts the release thread (on the caller's thread, never inside a callback).
fn cleanup_thread() {
    crate::release::start();
}

/// Drops `value` on the release thread, never on the calling (driver) thread; leaks it when
/// that thread is not running.
fn drop_off_thread(value: Deferred) {
    crate::release::defer(value, crate::release::When::Now);
}

/// The `CUstreamCallback` every host callback goes through: reclaims the payload, runs the
/// closure under `catch_unwind`, keeps a panic's message for the stream, and hands the
/// closure (with its captures) and any panic payload to the release thread, so that no
/// captured value is dropped inside the driver's callback (see the module documentation).
unsafe extern "C" fn trampoline(_stream: CUstream, status: CUresult, data: *mut c_void) {
    // SAFETY: `data` came from Box::into_raw in add_callback and the driver calls each
    // callback exactly once.
    let payload = unsafe { Box::from_raw(data as *mut CallbackPayload) };
    let CallbackPayload {
        mut callback,
        panics,
    } = *payload;
    let status = if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver(DriverError::new(
            status,
            "stream work before a callback",
        )))
    };
    // Called through `&mut`: the closure's captures outlive the call, whatever it does.
    // Inside the scope, a value of this crate that the closure drops anyway (taken out of
    // an `Option` it captured) releases on the release thread, not here.
    let outcome = {
        let _inside = crate::release::HostFunctionScope::enter();
        catch_unwind(AssertUnwindSafe(|| callback(status)))
    };
    drop_off_thread(Box::new(callback));
    if let Err(panic) = outcome {
        let message = panic_message(&*panic);
        drop_off_thread(Box::new(panic));
        let _ = catch_unwind(AssertUnwindSafe(|| panics.push(message)));
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_identity_names_the_legacy_stream_zero_and_keeps_other_handles() {
        assert_eq!(external_identity(std::ptr::null_mut()), 0);
        assert_eq!(external_identity(LEGACY_HANDLE as CUstream), 0);
        assert_eq!(
            external_identity(PER_THREAD_HANDLE as CUstream),
            PER_THREAD_HANDLE as u64
        );
        assert_eq!(external_identity(0x7f00_1000 as CUstream), 0x7f00_1000);
    }

    #[test]
    fn priority_within_range_is_kept() {
        let range = (0, -5);
        assert_eq!(resolve_priority(PriorityRequest::Value(-3), range), Ok(-3));
        assert_eq!(resolve_priority(PriorityRequest::Value(0), range), Ok(0));
        assert_eq!(resolve_priority(PriorityRequest::Value(-5), range), Ok(-5));
    }

    #[test]
    fn priority_outside_range_is_rejected() {
        let range = (0, -5);
        for p in [1, -6, i32::MIN, i32::MAX] {
            let err = resolve_priority(PriorityRequest::Value(p), range).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains(&p.to_string())));
        }
    }

    #[test]
    fn named_priorities_follow_the_range() {
        let range = (2, -7);
        assert_eq!(resolve_priority(PriorityRequest::Greatest, range), Ok(-7));
        assert_eq!(resolve_priority(PriorityRequest::Least, range), Ok(2));
        assert_eq!(resolve_priority(PriorityRequest::Default, range), Ok(2));
    }

    #[test]
    fn implicit_handles_are_recognised() {
        assert!(is_implicit(std::ptr::null_mut()));
        assert!(is_implicit(LEGACY_HANDLE as CUstream));
        assert!(is_implicit(PER_THREAD_HANDLE as CUstream));
        assert!(!is_implicit(0x1000 as CUstream));
    }

    #[test]
    fn panic_slot_reports_in_order_once() {
        let slot = PanicSlot::default();
        assert_eq!(slot.take(), None);
        slot.push("first".into());
        slot.push("second".into());
        assert_eq!(slot.take().as_deref(), Some("first"));
        assert_eq!(slot.take().as_deref(), Some("second"));
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn trampoline_catches_a_panic_and_keeps_its_message() {
        let slot = Arc::new(PanicSlot::default());
        let payload = Box::new(CallbackPayload {
            callback: Box::new(|_| panic!("boom in callback")),
            panics: Arc::clone(&slot),
        });
        // SAFETY: the payload comes from Box::into_raw, as the driver would pass it.
        unsafe {
            trampoline(
                std::ptr::null_mut(),
                CUresult::CUDA_SUCCESS,
                Box::into_raw(payload) as *mut c_void,
            )
        };
        assert_eq!(slot.take().as_deref(), Some("boom in callback"));
    }

    /// Sends the id of the thread that drops it.
    struct DropProbe(mpsc::Sender<std::thread::ThreadId>);

    impl Drop for DropProbe {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    use std::sync::mpsc;

    #[test]
    fn trampoline_drops_captures_and_panic_payloads_off_its_thread() {
        let slot = Arc::new(PanicSlot::default());
        let (tx, rx) = mpsc::channel();
        let (ran_tx, ran_rx) = mpsc::channel();
        let probe = DropProbe(tx.clone());
        let payload = Box::new(CallbackPayload {
            callback: Box::new(move |_| {
                // The capture is alive inside the call ...
                let _ = &probe;
                let _ = ran_tx.send(std::thread::current().id());
            }),
            panics: Arc::clone(&slot),
        });
        cleanup_thread();
        // SAFETY: the payload comes from Box::into_raw, as the driver would pass it.
        unsafe {
            trampoline(
                std::ptr::null_mut(),
                CUresult::CUDA_SUCCESS,
                Box::into_raw(payload) as *mut c_void,
            )
        };
        let here = std::thread::current().id();
        assert_eq!(
            ran_rx.recv().unwrap(),
            here,
            "the closure runs in the callback"
        );
        let dropped_on = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert_ne!(dropped_on, here, "a capture was dropped in the callback");

        // A panic's payload is dropped off the callback's thread too.
        let payload = Box::new(CallbackPayload {
            callback: Box::new(move |_| std::panic::panic_any(DropProbe(tx.clone()))),
            panics: Arc::clone(&slot),
        });
        // SAFETY: as above.
        unsafe {
            trampoline(
                std::ptr::null_mut(),
                CUresult::CUDA_SUCCESS,
                Box::into_raw(payload) as *mut c_void,
            )
        };
        assert_eq!(
            slot.take().as_deref(),
            Some("(non-string panic payload)"),
            "the panic is still reported"
        );
        let dropped_on = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert_ne!(
            dropped_on, here,
            "a panic payload was dropped in the callback"
        );
        // Every sender is gone then: the second closure (holding `tx`) was dropped too.
        assert!(rx.recv_timeout(std::time::Duration::from_secs(10)).is_err());
    }

    #[test]
    fn trampoline_passes_success_status() {
        let slot = Arc::new(PanicSlot::default());
        let seen = Arc::new(Mutex::new(None));
        let seen2 = Arc::clone(&seen);
        let payload = Box::new(CallbackPayload {
            callback: Box::new(move |status| *seen2.lock().unwrap() = Some(status)),
            panics: Arc::clone(&slot),
        });
        // SAFETY: as above.
        unsafe {
            trampoline(
                std::ptr::null_mut(),
                CUresult::CUDA_SUCCESS,
                Box::into_raw(payload) as *mut c_void,
            )
        };
        assert_eq!(*seen.lock().unwrap(), Some(Ok(())));
        assert_eq!(slot.take(), None);
    }
}
