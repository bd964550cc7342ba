//! Memory registered with a communicator: NCCL's zero-copy paths.
//!
//! | call | NCCL | what it gives |
//! | --- | --- | --- |
//! | [`alloc`] | (`ncclMemAlloc`'s kind of memory) | shareable virtual memory (`cuMemCreate` with a POSIX file descriptor handle), the memory NCCL can map into its peers |
//! | [`Communicator::register`] | `ncclCommRegister` / `ncclCommDeregister` | a view of the memory registered with the communicator: collectives on it copy straight between the ranks' buffers, without NCCL's staging buffers |
//! | [`Communicator::register_window`] | `ncclCommWindowRegister` | a symmetric window (NCCL 2.27+), registered by every rank together, with the same size: NCCL's symmetric kernels |
//!
//! Registration pays on small and medium messages, where NCCL's copy through its own
//! buffers is a fair part of the time. Memory from [`alloc`] registers for the zero-copy path
//! between processes; `cuMemAlloc` memory ([`DevicePtr::alloc`]) registers too, but NCCL only
//! uses its zero-copy path for it with `NCCL_LEGACY_CUDA_REGISTER=1`.
//!
//! # Lifetime and ordering
//!
//! The registered view owns a clone of the memory's view, so the memory lives as long as the
//! registration. When the registered view's last clone drops (on any thread, inside a host
//! function too), the registration is *retired*: the communicator deregisters it on its own
//! thread (NCCL's calls on a communicator are not thread-safe) at its next call (a collective,
//! [`Communicator::wait`], another registration), once every collective it issued before that
//! moment, on every stream, has completed (`ncclCommDeregister` unmaps what NCCL mapped of the
//! peers' buffers, which a running kernel may read). Until then the memory stays allocated.
//! A graph that captured a collective on the registered view keeps the view (and so the
//! registration) alive as long as the graph lives; NCCL keeps its own count for the buffers
//! its captured kernels use.
//!
//! When the communicator is destroyed or aborted, NCCL drops all of its registrations, and
//! the retired memory is freed after that.
//!
//! Windows are registered and deregistered by every rank together (both are collective), so
//! a retired window is kept until the communicator is destroyed: register windows once, at
//! start-up, as arenas.
//!
//! ```no_run
//! use cudars_core::Stream;
//! use cudars_nccl::{register, CommConfig, Communicator, ReduceOp};
//!
//! let (comm, _job) = Communicator::from_env(&CommConfig::default())?;
//! let stream = Stream::new(&comm.device())?;
//! let mem = register::alloc(&comm.device(), 1 << 20)?;
//! let buf = comm.register(&mem)?; // a view of `mem`, registered
//! comm.all_reduce_in_place::<f32>(&buf, 1024, ReduceOp::Sum, &stream)?;
//! comm.wait(&stream, std::time::Duration::from_secs(60))?;
//! # Ok::<(), cudars_nccl::Error>(())
//! ```

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ThreadId;

use cudars_core::ipc::SharedMapping;
use cudars_core::memory::DeviceAlloc;
use cudars_core::{Device, DevicePtr, Event, Stream, StreamKind};
use cudars_nccl_sys::{ncclWindow_t, NCCL_WIN_COLL_SYMMETRIC};

use crate::comm::Communicator;
use crate::dtype::ReduceOp;
use crate::error::{check, library, Error, Result};
use crate::group;

/// Allocates at least `size` bytes of device memory on `device` that NCCL can register for
/// its zero-copy paths and map into other processes: shareable virtual memory
/// ([`SharedMapping::new`], a POSIX file descriptor handle, rounded up to the granularity),
/// the kind `ncclMemAlloc` makes. A size of 0 is [`Error::InvalidArgument`].
pub fn alloc(device: &Device, size: usize) -> Result<DevicePtr> {
    if size == 0 {
        return Err(Error::InvalidArgument(
            "register::alloc of 0 bytes: nothing to register".into(),
        ));
    }
    Ok(SharedMapping::new(device, size)?.into_ptr())
}

/// What kind of registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `ncclCommRegister`.
    Local,
    /// `ncclCommWindowRegister`.
    Window,
}

/// A registration whose view was dropped: deregistered on the communicator's thread.
struct Retired {
    kind: Kind,
    handle: usize,
    /// Events recorded at the drop on every stream the view was marked on (graph launches,
    /// copies, kernels): deregistered only once they have completed.
    fences: Vec<Event>,
    /// A use that no fence covers (a stream that could not be fenced): kept until the
    /// communicator ends.
    unfenced: bool,
    /// The memory, freed after the deregistration (or after the communicator's end).
    _mem: DevicePtr,
}

/// The registrations of one communicator, shared by the communicator, its registered views
/// and the graphs that keep the communicator.
pub(crate) struct Registry {
    /// The communicator's group hold, whose call lock every NCCL call on it takes.
    hold: Arc<group::Hold>,
    /// Registrations not yet retired, local and windows.
    live: AtomicUsize,
    /// Local registrations not yet retired (while 0 and nothing is retired, collectives
    /// record no fences: windows are never deregistered alone).
    live_local: AtomicUsize,
    /// A local registration waits in `retired`.
    retired_any: AtomicBool,
    /// Groups whose collectives used registered memory and have not ended yet (a failed end
    /// leaks its hold, and this count stays up: nothing is deregistered any more).
    open_groups: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The live registered views, which a capture of a collective keeps alive.
    live_views: Vec<std::sync::Weak<Registered>>,
    /// The communicator was destroyed or aborted: NCCL dropped its registrations.
    closed: bool,
    retired: Vec<Retired>,
    /// Per stream (and, for per-thread default streams, per thread): an event recorded after
    /// the last collective issued there while registrations were live.
    fences: Vec<(u64, Option<ThreadId>, Event)>,
}

impl Registry {
    pub(crate) fn new(hold: Arc<group::Hold>) -> Registry {
        Registry {
            hold,
            live: AtomicUsize::new(0),
            live_local: AtomicUsize::new(0),
            retired_any: AtomicBool::new(false),
            open_groups: AtomicUsize::new(0),
            state: Mutex::default(),
        }
    }

    /// The communicator's call lock (see `group::Hold`).
    pub(crate) fn lock_calls(&self) -> group::CallGuard<'_> {
        self.hold.lock_calls()
    }

    /// Whether NCCL dropped the registrations (the communicator is gone).
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether collectives must record fences (some registration is live or retired).
    #[inline]
    pub(crate) fn tracking(&self) -> bool {
        self.live_local.load(Ordering::Acquire) > 0 || self.retired_any.load(Ordering::Acquire)
    }

    /// The communicator is gone (destroyed, aborted, or left alone after a lost context):
    /// its registrations with it. Called with the call lock held, right after the NCCL
    /// call that ended the handle (so no other thread calls NCCL with it afterwards); the
    /// retired memory is returned, to be dropped once the lock is let go.
    #[must_use = "drop the retired memory after letting go of the call lock"]
    pub(crate) fn close(&self) -> Closed {
        let mut s = self.lock();
        s.closed = true;
        s.fences.clear();
        self.retired_any.store(false, Ordering::Release);
        Closed(std::mem::take(&mut s.retired))
    }

    /// Records the fence of `stream` after a collective issued on it (eager, not in a group).
    pub(crate) fn fence(&self, stream: &Stream) -> Result<()> {
        let key = stream.identity();
        let thread = (stream.kind() == StreamKind::PerThread).then(|| std::thread::current().id());
        // An entry is reused only for a stream whose key names it alone (a handle value
        // that a later stream may take would re-record the old stream's fence early).
        let reusable = stream.identity_is_unique()
            || matches!(
                stream.kind(),
                StreamKind::PerThread | StreamKind::LegacyNull
            );
        let mut s = self.lock();
        if s.closed {
            return Ok(());
        }
        if reusable {
            if let Some((_, _, e)) = s.fences.iter().find(|(k, t, _)| *k == key && *t == thread) {
                e.record(stream)?;
                return Ok(());
            }
        }
        let e = Event::new(&stream.device())?;
        e.record(stream)?;
        s.fences.push((key, thread, e));
        Ok(())
    }

    /// A group used registered memory: the fences are recorded after its outermost end,
    /// when the returned value is dropped (the group's hold keeps it until then).
    pub(crate) fn group_fence(self: &Arc<Self>, stream: &Stream) -> GroupFence {
        self.open_groups.fetch_add(1, Ordering::AcqRel);
        GroupFence {
            registry: Arc::clone(self),
            stream: stream.clone(),
        }
    }

    /// A collective's fence could not be recorded: nothing is deregistered any more (the
    /// memory waits for the communicator's end).
    pub(crate) fn poison(&self) {
        self.open_groups.fetch_add(1, Ordering::AcqRel);
    }

    fn retire(&self, r: Retired) {
        let mut s = self.lock();
        if s.closed {
            drop(s);
            drop(r);
            return;
        }
        let local = r.kind == Kind::Local;
        s.retired.push(r);
        if local {
            self.retired_any.store(true, Ordering::Release);
        }
    }

    /// While a capture records a collective of the communicator: every live registered view
    /// is kept alive by the capture's graphs (NCCL's captured kernels may use any
    /// registration; a deregistration under a live graph would unmap what it reads).
    pub(crate) fn keep_in_capture(&self, issue: &cudars_core::Issue<'_>) -> Result<()> {
        if self.live_local.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let views: Vec<Arc<Registered>> = {
            let s = self.lock();
            s.live_views
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .collect()
        };
        for v in views {
            DevicePtr::from_arc(v as Arc<dyn DeviceAlloc>).record_stream(issue)?;
        }
        Ok(())
    }

    /// On the communicator's thread: deregisters what was retired, once every fence has
    /// completed. Windows wait for the communicator's end.
    pub(crate) fn drain(&self, comm: &Communicator) {
        if !self.retired_any.load(Ordering::Acquire)
            || group::in_group()
            || self.open_groups.load(Ordering::Acquire) > 0
        {
            return;
        }
        let done = |e: &Event| matches!(e.query(), Ok(true));
        let mut s = self.lock();
        if s.closed || !s.retired.iter().any(|r| r.kind == Kind::Local) {
            return;
        }
        // Every collective issued before now, on every stream, has completed. A fence whose
        // query fails (a lost context) keeps everything retired until the communicator ends.
        if !s.fences.iter().all(|(_, _, e)| done(e)) {
            return;
        }
        // All done: later collectives record fresh fences.
        s.fences.clear();
        let Ok(nccl) = library() else { return };
        // Ready: local, fenced, and every other use of its view done.
        let (local, rest): (Vec<Retired>, Vec<Retired>) = s
            .retired
            .drain(..)
            .partition(|r| r.kind == Kind::Local && !r.unfenced && r.fences.iter().all(done));
        s.retired = rest;
        let waiting = s
            .retired
            .iter()
            .any(|r| r.kind == Kind::Local && !r.unfenced);
        self.retired_any.store(waiting, Ordering::Release);
        drop(s);
        if local.is_empty() {
            return;
        }
        let Ok(_held) = cudars_core::health::hold(&comm.device()) else {
            // A lost context: the communicator is left alone, and so is its registration
            // cache; the memory goes when the communicator does.
            let mut s = self.lock();
            s.retired.extend(local);
            self.retired_any.store(true, Ordering::Release);
            return;
        };
        let mut freed = Vec::with_capacity(local.len());
        {
            let _calls = self.lock_calls();
            for r in local {
                // SAFETY: `handle` came from ncclCommRegister on this communicator, which is
                // live (the registry is not closed; only this thread or a destroy under the
                // call lock closes it); no other NCCL call on it runs (the call lock); every
                // collective issued on it before now has completed (the registry's fences)
                // and so has every other use of the view (the retired fences), and a graph
                // that captured a collective meanwhile kept the view alive, so no kernel
                // reads what the deregistration unmaps; it is deregistered once.
                let r_done =
                    unsafe { nccl.ncclCommDeregister(comm.raw(), r.handle as *mut c_void) };
                if matches!(r_done, Ok(code) if code.is_success()) {
                    freed.push(r);
                } else {
                    // NCCL may still hold mappings of the memory: keep it for good.
                    std::mem::forget(r);
                }
            }
        }
        // The memory goes after the lock (its free may reach a pool, whose own segment
        // source takes the lock).
        drop(freed);
    }
}

/// `ncclCommRegister` of `mem` with the communicator `raw` on `device`, under its call lock
/// (for [`Communicator::register`] and a registered pool's segments, on any thread). `Ok(0)`
/// when the registry is closed: the communicator is gone, nothing is registered.
pub(crate) fn register_raw(
    registry: &Registry,
    raw: cudars_nccl_sys::ncclComm_t,
    device: &Device,
    mem: &DevicePtr,
) -> Result<usize> {
    let nccl = library()?;
    let _held = cudars_core::health::hold(device)?;
    let _bound = device.scope()?;
    let _calls = registry.lock_calls();
    if registry.is_closed() {
        return Ok(0);
    }
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: the communicator is live (its registry is open, and it closes only under the
    // call lock held here, right after the call that ends the handle) and no other NCCL call
    // on it runs (the call lock); `mem` is `len` bytes of device memory of its device, which
    // the caller keeps allocated until NCCL deregisters it; `handle` is a valid out-pointer;
    // the device's context is current (NCCL asks the driver about the address).
    let r =
        unsafe { nccl.ncclCommRegister(raw, mem.as_raw() as *mut c_void, mem.len(), &mut handle) }?;
    check(r, "ncclCommRegister")?;
    Ok(handle as usize)
}

/// The retired memory of a closed registry, freed when dropped.
pub(crate) struct Closed(#[allow(dead_code, reason = "held only to be dropped")] Vec<Retired>);

/// Records a group's fences when the group's hold lets it go (after the outermost end).
pub(crate) struct GroupFence {
    registry: Arc<Registry>,
    stream: Stream,
}

impl Drop for GroupFence {
    fn drop(&mut self) {
        // An error asking counts as captured.
        let captured = crate::collectives::captured(&self.stream).unwrap_or(true);
        // A capture begun before the end took the group's work into a graph, and a fence
        // that could not be recorded covers nothing: both leave the count up, and nothing
        // is deregistered any more (the memory waits for the communicator's end).
        if !captured && self.registry.fence(&self.stream).is_ok() {
            self.registry.open_groups.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The owner behind a registered view: the memory's view and the registration.
struct Registered {
    mem: DevicePtr,
    kind: Kind,
    handle: usize,
    registry: Arc<Registry>,
    /// The streams the view was marked on (with the marking thread, for per-thread default
    /// streams), fenced when it drops.
    uses: Mutex<Vec<(Stream, Option<ThreadId>)>>,
}

impl Registered {
    /// Events on every stream the view was used on, recorded now; `None` when one cannot be
    /// fenced (a per-thread stream of another thread, a stream being captured, an error).
    fn fence_uses(&self) -> Option<Vec<Event>> {
        let uses = std::mem::take(&mut *self.uses.lock().unwrap_or_else(PoisonError::into_inner));
        let me = std::thread::current().id();
        let mut fences = Vec::with_capacity(uses.len());
        for (stream, thread) in uses {
            if thread.is_some_and(|t| t != me) {
                return None;
            }
            if crate::collectives::captured(&stream).unwrap_or(true) {
                return None;
            }
            let e = Event::new(&stream.device()).ok()?;
            e.record(&stream).ok()?;
            fences.push(e);
        }
        Some(fences)
    }
}

// SAFETY: the range is exactly `mem`'s, whose owner it keeps alive (the clone) and whose
// promises it forwards (`record_stream`, `prepare_synchronous_use`); the values never change.
unsafe impl DeviceAlloc for Registered {
    fn device(&self) -> Device {
        self.mem.device()
    }
    fn as_raw(&self) -> cudars_core::sys::CUdeviceptr {
        self.mem.as_raw()
    }
    fn size(&self) -> usize {
        self.mem.len()
    }
    fn record_stream(&self, stream: &Stream) -> cudars_core::Result<()> {
        self.mem.owner().record_stream(stream)?;
        if self.kind == Kind::Local {
            let thread =
                (stream.kind() == StreamKind::PerThread).then(|| std::thread::current().id());
            let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
            if !uses.iter().any(|(s, t)| {
                s.identity() == stream.identity() && s.kind() == stream.kind() && *t == thread
            }) {
                uses.push((stream.clone(), thread));
            }
        }
        Ok(())
    }
    fn prepare_synchronous_use(&self) -> cudars_core::Result<()> {
        self.mem.owner().prepare_synchronous_use()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.live.fetch_sub(1, Ordering::AcqRel);
        if self.kind == Kind::Local {
            self.registry.live_local.fetch_sub(1, Ordering::AcqRel);
        }
        let mem = self.mem.clone();
        let (fences, unfenced) = match self.kind {
            Kind::Local => match self.fence_uses() {
                Some(f) => (f, false),
                None => (Vec::new(), true),
            },
            Kind::Window => (Vec::new(), false),
        };
        self.registry.retire(Retired {
            kind: self.kind,
            handle: self.handle,
            fences,
            unfenced,
            _mem: mem,
        });
    }
}

/// How many registrations a communicator has ([`Communicator::registrations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registrations {
    /// Registered views (local and windows) with a clone still alive.
    pub live: usize,
    /// Local registrations whose views dropped, waiting to be deregistered (their work not
    /// done yet, or no call of the communicator since).
    pub retired: usize,
    /// Windows whose views dropped, kept until the communicator ends.
    pub retired_windows: usize,
}

impl Communicator {
    /// Its registrations: live, and retired but not yet deregistered (see the
    /// [module](crate::register)).
    pub fn registrations(&self) -> Registrations {
        let r = self.registry();
        let s = r.lock();
        let windows = s.retired.iter().filter(|x| x.kind == Kind::Window).count();
        Registrations {
            live: r.live.load(Ordering::Acquire),
            retired: s.retired.len() - windows,
            retired_windows: windows,
        }
    }

    fn check_registrable(&self, mem: &DevicePtr, what: &'static str) -> Result<()> {
        self.check_usable()?;
        self.hold().check_here(what)?;
        if group::in_group() {
            return Err(Error::InvalidArgument(format!(
                "{what} inside an NCCL group: register before the group"
            )));
        }
        if mem.device().ordinal() != self.device().ordinal() {
            return Err(Error::WrongDevice {
                what: "the memory",
                expected: self.device().ordinal(),
                actual: mem.device().ordinal(),
            });
        }
        if mem.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{what} of an empty view: nothing to register"
            )));
        }
        Ok(())
    }

    /// Registers `mem` with this communicator (`ncclCommRegister`) and returns a view of it
    /// that is registered: collectives on that view (or on any view of the same pages) take
    /// NCCL's zero-copy path where the memory allows (see the [module](crate::register)).
    /// The registration ends when the returned view's last clone drops; `mem` stays
    /// allocated until then. Local: no other rank takes part.
    ///
    /// Errors: memory of another device ([`Error::WrongDevice`]), an empty view, a call
    /// inside an open group, an aborted communicator, NCCL's own refusal.
    pub fn register(&self, mem: &DevicePtr) -> Result<DevicePtr> {
        self.check_registrable(mem, "register")?;
        self.registry().drain(self);
        let handle = register_raw(self.registry(), self.raw(), &self.device(), mem)?;
        Ok(self.registered(mem, Kind::Local, handle as usize))
    }

    fn registered(&self, mem: &DevicePtr, kind: Kind, handle: usize) -> DevicePtr {
        let registry = Arc::clone(self.registry());
        registry.live.fetch_add(1, Ordering::AcqRel);
        if kind == Kind::Local {
            registry.live_local.fetch_add(1, Ordering::AcqRel);
        }
        let view = Arc::new(Registered {
            mem: mem.clone(),
            kind,
            handle,
            registry: Arc::clone(&registry),
            uses: Mutex::default(),
        });
        if kind == Kind::Local {
            let mut s = registry.lock();
            s.live_views.retain(|w| w.strong_count() > 0);
            s.live_views.push(Arc::downgrade(&view));
        }
        DevicePtr::from_arc(view)
    }

    /// Registers `mem` as a symmetric window (`ncclCommWindowRegister` with
    /// `NCCL_WIN_COLL_SYMMETRIC`, NCCL 2.27+): **collective**, every rank calls it with
    /// memory of the same size, in the same order as its other collectives. Collectives whose
    /// buffers lie at the same offset of the window on every rank can then use NCCL's
    /// symmetric kernels. `mem` should come from [`alloc`] (NCCL needs shareable virtual
    /// memory, aligned to its granularity).
    ///
    /// The sizes are compared first (one small all-reduce on an internal stream): when they
    /// differ, every rank gets [`Error::InvalidArgument`] and nothing is registered. The
    /// window is kept until the communicator ends, even after the view drops (deregistering
    /// is collective too). A loaded NCCL older than 2.27 is [`Error::MissingSymbol`].
    pub fn register_window(&self, mem: &DevicePtr) -> Result<DevicePtr> {
        self.check_registrable(mem, "register_window")?;
        let nccl = library()?;
        self.agree_on_size(mem.len())?;
        let _held = cudars_core::health::hold(&self.device())?;
        let _bound = self.device().scope()?;
        let mut win: ncclWindow_t = std::ptr::null_mut();
        let calls = self.hold().lock_calls();
        // SAFETY: as `register`; `win` is a valid out-pointer; every rank registers the
        // same size (checked above).
        let r = unsafe {
            nccl.ncclCommWindowRegister(
                self.raw(),
                mem.as_raw() as *mut c_void,
                mem.len(),
                &mut win,
                NCCL_WIN_COLL_SYMMETRIC as i32,
            )
        }?;
        // A non-blocking registration goes on in the background: settled under the lock.
        self.settle(r, "ncclCommWindowRegister")?;
        drop(calls);
        Ok(self.registered(mem, Kind::Window, win as usize))
    }

    /// Every rank learns whether all ranks passed the same `len` (max and min by one
    /// all-reduce of `[len, !len]` with `Max`), and all refuse together when not.
    fn agree_on_size(&self, len: usize) -> Result<()> {
        let dev = self.device();
        let stream = Stream::new(&dev)?;
        let buf = DevicePtr::alloc(&dev, 16)?;
        let mine = [len as u64, !(len as u64)];
        buf.copy_from_host(&mine)?;
        self.all_reduce_in_place::<u64>(&buf, 2, ReduceOp::Max, &stream)?;
        self.wait(&stream, self.config().get_timeout())?;
        let mut all = [0u64; 2];
        buf.copy_to_host(&mut all)?;
        let (max, min) = (all[0], !all[1]);
        if max != min {
            return Err(Error::InvalidArgument(format!(
                "register_window: the ranks register windows of different sizes ({min} to \
                 {max} bytes); every rank must pass the same size"
            )));
        }
        Ok(())
    }
}
