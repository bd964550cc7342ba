//! Thin wrappers over the driver's stream-capture and graph calls, for `cuda-graph` (which
//! builds the capture guards, update policy and examples on top) and for code that needs the
//! raw calls without going to `cuda-sys`.
//!
//! | here | driver |
//! | --- | --- |
//! | [`begin_capture`], [`end_capture`], [`capture_info`] | `cuStreamBeginCapture`, `cuStreamEndCapture`, `cuStreamGetCaptureInfo` |
//! | [`stream_id`] | `cuStreamGetId` |
//! | [`GraphHandle`]: [`clone_graph`](GraphHandle::clone_graph), [`node_count`](GraphHandle::node_count), [`instantiate`](GraphHandle::instantiate), [`write_dot`](GraphHandle::write_dot) | `cuGraphClone`, `cuGraphGetNodes`, `cuGraphInstantiateWithFlags`, `cuGraphDebugDotPrint`, `cuGraphDestroy` |
//! | [`GraphExecHandle`]: [`launch`](GraphExecHandle::launch), [`upload`](GraphExecHandle::upload), [`update`](GraphExecHandle::update) | `cuGraphLaunch`, `cuGraphUpload`, `cuGraphExecUpdate`, `cuGraphExecDestroy` |
//!
//! | [`explicit`] | node-by-node construction, conditional nodes, in-place node updates | `cuGraphAdd*Node`, `cuGraphExec*NodeSetParams`, ... |
//!
//! Both handle types own what they wrap and destroy it on drop. They are `Send` but not
//! `Sync`: the driver does not synchronise access to one graph object, so calls on the same
//! graph from several threads must not overlap, which `&self` methods on a non-`Sync` type
//! guarantee.
//!
//! ```no_run
//! use cudars_core::graph::{self, CaptureMode};
//! use cudars_core::{Device, Stream};
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! // SAFETY: only safe view operations are captured, and the capture is ended below.
//! unsafe { graph::begin_capture(&stream, CaptureMode::ThreadLocal) }?;
//! // ... issue work on `stream` ...
//! let graph = graph::end_capture(&stream)?;
//! let exec = graph.instantiate(graph::InstantiateFlags::NONE)?;
//! exec.launch(&stream)?;
//! stream.synchronize()?;
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use cudars_sys::{
    CUgraph, CUgraphExec, CUgraphExecUpdateResult, CUgraphInstantiate_flags, CUresult,
    CUstreamCaptureMode, CUstreamCaptureStatus,
};

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::memory::DeviceAlloc;
use crate::stream::Stream;
use crate::Device;

pub mod explicit;

use crate::capture_gate::{self, BeginGate};
pub use crate::capture_gate::{
    announce_capture_begin, announce_capture_end, announced_captures_in_progress,
    captures_in_progress,
};

/// Whether `stream` may be being captured now, answered without the driver where this crate
/// can tell: never the legacy stream; streams this crate created only while a capture begun
/// through it runs (one atomic load); streams whose captures are announced
/// ([`Stream::external_announced`](crate::Stream::external_announced)) only while such a
/// capture or one of this crate runs; any other stream (external, per-thread) always. When
/// `true`, [`capture_info`] says whether it is. The cheap gate the library crates ask before
/// they ask the driver.
#[inline]
pub fn may_be_captured(stream: &Stream) -> bool {
    use crate::stream::StreamKind;
    match stream.kind() {
        StreamKind::LegacyNull => false,
        StreamKind::Owned => captures_in_progress(),
        _ if stream.captures_announced() => {
            captures_in_progress() || announced_captures_in_progress()
        }
        _ => true,
    }
}

/// What a graph keeps alive: the owners of the memory its captured operations use.
type KeepAlive = Arc<Vec<Arc<dyn DeviceAlloc>>>;

/// Owners registered per capture id.
type CaptureOwners = Mutex<HashMap<u64, Vec<Arc<dyn DeviceAlloc>>>>;

/// Owners of memory used by safe view operations issued into captures begun through this
/// module, by capture id, until the capture ends and its graph takes them.
fn capture_owners() -> &'static CaptureOwners {
    static OWNERS: std::sync::OnceLock<CaptureOwners> = std::sync::OnceLock::new();
    OWNERS.get_or_init(Default::default)
}

/// If `stream` is being captured (by a capture begun through [`begin_capture`]), keeps
/// `owner` alive for as long as any graph made from that capture, so that replays never
/// write memory that has been freed. Costs one atomic load when no such capture runs.
pub(crate) fn keep_alive_in_capture(stream: &Stream, owner: &Arc<dyn DeviceAlloc>) -> Result<()> {
    if !captures_in_progress() || (stream.raw() as usize) <= 1 {
        return Ok(());
    }
    let info = capture_info(stream)?;
    if let (CaptureStatus::Active | CaptureStatus::Invalidated, Some(id)) = (info.status, info.id) {
        capture_owners()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default()
            .push(Arc::clone(owner));
    }
    Ok(())
}

/// Takes the owners registered for capture `id` (see [`keep_alive_in_capture`]).
fn take_capture_owners(id: Option<u64>) -> KeepAlive {
    let owners = id.and_then(|id| {
        capture_owners()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
    });
    Arc::new(owners.unwrap_or_default())
}

/// How a capture interacts with other threads' "unsafe" calls (`cuMemAlloc`, synchronous
/// calls that may implicitly synchronise with the capturing stream), `CUstreamCaptureMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// Such calls are refused on every thread while the capture is open (the safest; CUDA's
    /// default).
    Global,
    /// Such calls are refused only on the thread that began the capture (the usual choice for
    /// one capture per thread; PyTorch's default).
    #[default]
    ThreadLocal,
    /// Nothing is refused; the caller guarantees no interference.
    Relaxed,
}

impl CaptureMode {
    /// The driver's value.
    pub fn to_raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Whether a stream is being captured (`CUstreamCaptureStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not capturing: work runs when issued.
    None,
    /// Capturing: work is recorded into a graph instead of running.
    Active,
    /// Capturing, but an illegal operation broke the capture: it must be ended (which yields
    /// no graph) before the stream works normally again.
    Invalidated,
}

impl std::fmt::Display for CaptureStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureStatus::None => "not capturing",
            CaptureStatus::Active => "capturing",
            CaptureStatus::Invalidated => "capture invalidated",
        })
    }
}

/// A stream's capture state, from [`capture_info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaptureInfo {
    /// Capturing or not.
    pub status: CaptureStatus,
    /// The capture sequence's id, unique in the process, while `status` is not `None`.
    /// Streams joined into one capture (fork/join) report the same id.
    pub id: Option<u64>,
}

fn status_from_raw(raw: CUstreamCaptureStatus) -> CaptureStatus {
    if raw == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        CaptureStatus::Active
    } else if raw == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED {
        CaptureStatus::Invalidated
    } else {
        CaptureStatus::None
    }
}

/// Starts capturing `stream`: work issued to it afterwards is recorded, not run, until
/// [`end_capture`]. `cuda-graph`'s capture guard is the safe way to do this.
///
/// The legacy null stream cannot be captured: that is refused here with
/// [`Error::InvalidArgument`], without a driver call. The per-thread default stream can be.
/// Beginning a capture on a stream that is already capturing is the driver's
/// `CUDA_ERROR_ILLEGAL_STATE`.
///
/// # Safety
///
/// Graphs made from the capture keep alive the memory of every safe view operation
/// ([`DevicePtr`](crate::memory::DevicePtr)'s asynchronous copies and memsets) captured on
/// the stream. Any other address captured (a kernel argument of
/// [`Function::launch`](crate::Function::launch), a [`raw`](crate::memory::raw) call, a
/// library call) must stay allocated, and must not be reused for anything else, for as long
/// as a graph made from the capture, or an executable graph made from one, can run. The
/// capture must be ended with [`end_capture`] (on the thread that began it, in the
/// non-relaxed modes).
pub unsafe fn begin_capture(stream: &Stream, mode: CaptureMode) -> Result<()> {
    // The legacy stream: null, or the CU_STREAM_LEGACY handle (1).
    if (stream.raw() as usize) <= 1 {
        return Err(Error::InvalidArgument(
            "the legacy null stream cannot be captured; capture a created stream".into(),
        ));
    }
    let _ctx = stream.device().bind()?;
    let _gate = BeginGate::wait();
    // SAFETY: a live, non-null stream of the current context.
    let begun = unsafe { drv!(cuStreamBeginCapture(stream.raw(), mode.to_raw())) };
    if begun.is_ok() {
        capture_gate::count_begun();
    }
    begun
}

/// Ends the capture of `stream` and returns the graph recorded.
///
/// The capture ends whatever happens. When it was invalidated (an illegal call during the
/// capture) the driver returns `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph; with
/// a forked stream not joined back, `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`. In non-relaxed modes
/// it must be called on the thread that began the capture
/// (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` otherwise).
pub fn end_capture(stream: &Stream) -> Result<GraphHandle> {
    let _ctx = stream.device().bind()?;
    let id = capture_info(stream).ok().and_then(|i| i.id);
    let mut raw: CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointer.
    let result = unsafe { drv!(cuStreamEndCapture(stream.raw(), &mut raw)) };
    // Count the capture as over only when it really is: not when the stream was not
    // capturing at all (ILLEGAL_STATE), and not when the driver refused to end it (a call
    // from another thread gets WRONG_THREAD while the capture stays open).
    let ended = match &result {
        Ok(()) => true,
        Err(Error::Driver(e)) if e.result() == CUresult::CUDA_ERROR_ILLEGAL_STATE => false,
        Err(_) => capture_info(stream).is_ok_and(|i| i.status == CaptureStatus::None),
    };
    let keep = if ended {
        if capture_gate::count_ended() {
            // Frees deferred while captures ran may go now.
            crate::release::captures_ended();
        }
        take_capture_owners(id)
    } else {
        Arc::default()
    };
    match result {
        Ok(()) if !raw.is_null() => Ok(GraphHandle {
            raw,
            device: stream.device(),
            keep,
        }),
        Ok(()) => Err(Error::InvalidArgument(
            "cuStreamEndCapture returned no graph".into(),
        )),
        Err(e) => {
            if !raw.is_null() {
                // SAFETY: a graph the driver handed us and nobody else holds.
                let _ = unsafe { drv!(cuGraphDestroy(raw)) };
            }
            Err(e)
        }
    }
}

/// `stream`'s capture status and capture id (`cuStreamGetCaptureInfo`).
pub fn capture_info(stream: &Stream) -> Result<CaptureInfo> {
    let _ctx = stream.device().bind()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cudars_sys::cuuint64_t = 0;
    // SAFETY: a live stream; valid out-pointers for status and id; the optional graph,
    // dependency and edge outputs are null, which the driver allows.
    unsafe {
        drv!(stream_get_capture_info as "cuStreamGetCaptureInfo" (
            stream.raw(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ))
    }?;
    let status = status_from_raw(status);
    Ok(CaptureInfo {
        status,
        id: (status != CaptureStatus::None).then_some(id),
    })
}

/// Whether work recorded on `stream` now would touch a capture: `stream` is being captured,
/// or it is the legacy null stream while a blocking stream of its context is captured (the
/// legacy stream synchronises with every blocking stream, so a fence or wait there would
/// join the capture and invalidate it). The legacy case asks `cuStreamIsCapturing`, which
/// answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` then and invalidates nothing. Any error
/// counts as `true`: the caller then leaves the stream alone.
pub fn touches_capture(stream: &Stream) -> bool {
    if stream.kind() != crate::StreamKind::LegacyNull {
        return !matches!(is_capturing(stream), Ok(false));
    }
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let asked = stream.with_context(|_| {
        // SAFETY: the legacy stream of a context made current by `with_context`; a valid
        // out-pointer for the status.
        unsafe { drv!(cuStreamIsCapturing(stream.raw(), &mut status)) }
    });
    !matches!(asked, Ok(())) || status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// `true` while `stream` is being captured into a graph (status active or invalidated),
/// whoever began the capture (this crate, `cuda-graph`, the CUDA runtime, PyTorch): work
/// issued to it now is recorded, to run at every launch of the graph made from it, not now.
/// The legacy null stream is never captured: `false` without a driver call.
///
/// Functions that hand the driver an address whose lifetime they do not control past the
/// call (a borrowed host slice, say) use this to refuse a capturing stream: the graph would
/// read or write that address at each replay, long after the borrow ended.
pub fn is_capturing(stream: &Stream) -> Result<bool> {
    if (stream.raw() as usize) <= 1 {
        return Ok(false);
    }
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cudars_sys::cuuint64_t = 0;
    stream.with_context(|_| {
        // SAFETY: a live stream (an implicit handle has its device's context current);
        // valid out-pointers for status and id; the optional outputs are null.
        unsafe {
            drv!(stream_get_capture_info as "cuStreamGetCaptureInfo" (
                stream.raw(),
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ))
        }
    })?;
    Ok(status_from_raw(status) != CaptureStatus::None)
}

/// What [`on_capture_graph_release`] keeps with the graph: the callback and whether it is
/// armed (it runs only if the graph took its reference).
struct ReleaseHook {
    armed: std::sync::atomic::AtomicBool,
    callback: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// The user object's destructor: runs the armed callback once, never unwinding.
unsafe extern "C" fn release_hook_trampoline(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Arc<ReleaseHook>` turned into a raw pointer by
    // `on_capture_graph_release`; the driver calls the destructor once, so the reference
    // is reclaimed once.
    let hook = unsafe { Arc::from_raw(data as *const ReleaseHook) };
    if hook.armed.load(Ordering::Acquire) {
        let callback = hook
            .callback
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(callback) = callback {
            // What the callback drops releases on the release thread, not here.
            let _inside = crate::release::HostFunctionScope::enter();
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback));
        }
    }
}

/// While `stream` is being captured (by anyone: this crate, the CUDA runtime, PyTorch,
/// CuPy), ties `on_release` to the graph being captured: it runs once that graph, every
/// clone of it and every executable graph made from it have been destroyed and their
/// launches have completed (a CUDA user object the graph owns). Returns `Ok(false)`, and
/// never runs `on_release`, when the stream is not capturing; on an error `on_release`
/// never runs either.
///
/// `on_release` runs on a driver thread: it must not call CUDA (set a flag, decrement a
/// counter). A panic in it is caught.
pub fn on_capture_graph_release(
    stream: &Stream,
    on_release: Box<dyn FnOnce() + Send>,
) -> Result<bool> {
    if (stream.raw() as usize) <= 1 {
        return Ok(false);
    }
    let _ctx = stream.device().bind()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: cudars_sys::cuuint64_t = 0;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; valid out-pointers; the dependency outputs are null.
    unsafe {
        drv!(stream_get_capture_info as "cuStreamGetCaptureInfo" (
            stream.raw(),
            &mut status,
            &mut id,
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ))
    }?;
    if status_from_raw(status) != CaptureStatus::Active || graph.is_null() {
        return Ok(false);
    }
    let hook = Arc::new(ReleaseHook {
        armed: std::sync::atomic::AtomicBool::new(false),
        callback: Mutex::new(Some(on_release)),
    });
    let data = Arc::into_raw(Arc::clone(&hook)) as *mut std::ffi::c_void;
    let mut object: cudars_sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `data` stays valid until the destructor reclaims it; the
    // trampoline matches CUhostFn; NO_DESTRUCTOR_SYNC is the flag the driver requires.
    let created = unsafe {
        drv!(cuUserObjectCreate(
            &mut object,
            data,
            Some(release_hook_trampoline),
            1,
            cudars_sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
        ))
    };
    if let Err(e) = created {
        // SAFETY: the driver did not take `data`: reclaim the reference made above once.
        drop(unsafe { Arc::from_raw(data as *const ReleaseHook) });
        return Err(e);
    }
    // SAFETY: `graph` is the graph being captured (the driver permits everything but
    // destroying it and removing nodes during the capture); MOVE hands our reference over.
    let retained = unsafe {
        drv!(cuGraphRetainUserObject(
            graph,
            object,
            1,
            cudars_sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
        ))
    };
    match retained {
        Ok(()) => {
            hook.armed.store(true, Ordering::Release);
            Ok(true)
        }
        Err(e) => {
            // Unarmed: the destructor this release triggers does not run the callback.
            // SAFETY: we own the one reference of the object we just created.
            let _ = unsafe { drv!(cuUserObjectRelease(object, 1)) };
            Err(e)
        }
    }
}

/// Makes the calling thread's capture interaction mode relaxed while it lives
/// (`cuThreadExchangeStreamCaptureMode`), restoring the previous mode on drop. Allocators
/// use it around `cuMemAlloc`, `cuMemCreate`, `cuMemMap`, event queries and the like, which
/// a capture in global mode (PyTorch's `torch.cuda.graph`, CUDA's default) on any thread
/// would otherwise refuse and be invalidated by. Not `Send`: the mode is per thread.
#[derive(Debug)]
#[must_use = "the previous mode is restored when the guard drops"]
pub struct RelaxedCaptureMode {
    previous: CUstreamCaptureMode,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl RelaxedCaptureMode {
    /// Switches the calling thread to the relaxed mode.
    pub fn new() -> Result<RelaxedCaptureMode> {
        let mut mode = CaptureMode::Relaxed.to_raw();
        // SAFETY: valid in/out pointer; the call only exchanges a per-thread setting.
        unsafe { drv!(cuThreadExchangeStreamCaptureMode(&mut mode)) }?;
        Ok(RelaxedCaptureMode {
            previous: mode,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for RelaxedCaptureMode {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in `new`; restores the mode this guard replaced.
        let _ = unsafe { drv!(cuThreadExchangeStreamCaptureMode(&mut mode)) };
    }
}

/// The stream's id, unique in the process (`cuStreamGetId`); the legacy null stream has a
/// fixed id of its own. The driver refuses this call on a stream that is being captured
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the capture is invalidated): ask before.
pub fn stream_id(stream: &Stream) -> Result<u64> {
    let _ctx = stream.device().bind()?;
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: a live stream; valid out-pointer.
    unsafe { drv!(cuStreamGetId(stream.raw(), &mut id)) }?;
    Ok(id)
}

/// Flags of [`GraphHandle::instantiate`] (`CUgraphInstantiate_flags`), combined with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InstantiateFlags(pub u64);

impl InstantiateFlags {
    /// No flag.
    pub const NONE: InstantiateFlags = InstantiateFlags(0);
    /// Memory allocated by the graph's allocation nodes and not freed inside the graph is freed
    /// automatically at the next launch (instead of the launch failing).
    pub const AUTO_FREE_ON_LAUNCH: InstantiateFlags = InstantiateFlags(
        CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64,
    );
    /// Launches use the priorities of the graph's kernel nodes rather than the stream's.
    pub const USE_NODE_PRIORITY: InstantiateFlags = InstantiateFlags(
        CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0 as u64,
    );
}

impl std::ops::BitOr for InstantiateFlags {
    type Output = InstantiateFlags;
    fn bitor(self, rhs: InstantiateFlags) -> InstantiateFlags {
        InstantiateFlags(self.0 | rhs.0)
    }
}

/// An owned `CUgraph` (a recorded graph, not yet executable), destroyed on drop.
///
/// `Send`, not `Sync` (see the [module documentation](self)).
pub struct GraphHandle {
    raw: CUgraph,
    device: Device,
    /// Owners of the memory the captured operations use; shared with clones and
    /// executable graphs.
    keep: KeepAlive,
}

// SAFETY: a graph may be used from any thread, one at a time; the type is not Sync, so calls
// through `&self` never overlap.
unsafe impl Send for GraphHandle {}

impl std::fmt::Debug for GraphHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphHandle")
            .field("raw", &self.raw)
            .field("device", &self.device.ordinal())
            .field("kept_alive", &self.keep.len())
            .finish()
    }
}

impl GraphHandle {
    /// The driver handle (still owned by `self`).
    pub fn raw(&self) -> CUgraph {
        self.raw
    }

    /// The device whose stream was captured.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A deep copy (`cuGraphClone`).
    pub fn clone_graph(&self) -> Result<GraphHandle> {
        let _ctx = self.device.bind()?;
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: a live graph; valid out-pointer.
        unsafe { drv!(cuGraphClone(&mut raw, self.raw)) }?;
        Ok(GraphHandle {
            raw,
            device: self.device,
            keep: Arc::clone(&self.keep),
        })
    }

    /// Number of nodes (`cuGraphGetNodes` with no output array).
    pub fn node_count(&self) -> Result<usize> {
        crate::health::usable(&self.device)?;
        let mut count = 0usize;
        // SAFETY: a live graph; a null node array asks for the count only.
        unsafe { drv!(cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut count)) }?;
        Ok(count)
    }

    /// An executable graph made from this one (`cuGraphInstantiateWithFlags`). The graph can
    /// be changed or dropped afterwards without affecting the executable one.
    pub fn instantiate(&self, flags: InstantiateFlags) -> Result<GraphExecHandle> {
        let _ctx = self.device.bind()?;
        let mut raw: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph; the device's context is current; valid out-pointer.
        unsafe { drv!(cuGraphInstantiateWithFlags(&mut raw, self.raw, flags.0)) }?;
        Ok(GraphExecHandle {
            raw,
            device: self.device,
            keep: Arc::clone(&self.keep),
        })
    }

    /// Writes the graph in Graphviz DOT form to `path` (`cuGraphDebugDotPrint`); `verbose`
    /// adds every node's parameters. A path with a NUL byte is [`Error::InvalidArgument`].
    pub fn write_dot(&self, path: impl AsRef<Path>, verbose: bool) -> Result<()> {
        crate::health::usable(&self.device)?;
        let path = path.as_ref();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::InvalidArgument(format!("path {} contains a NUL byte", path.display()))
        })?;
        let flags = if verbose {
            cudars_sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE.0
        } else {
            0
        };
        // SAFETY: a live graph; a NUL-terminated path valid for the call.
        unsafe { drv!(cuGraphDebugDotPrint(self.raw, c_path.as_ptr(), flags)) }
    }
}

impl Drop for GraphHandle {
    fn drop(&mut self) {
        // A graph of an ended context generation was destroyed with its context.
        if crate::health::is_stale(&self.device) {
            return;
        }
        // SAFETY: we own the graph; executable graphs made from it do not depend on it.
        let _ = unsafe { drv!(cuGraphDestroy(self.raw)) };
    }
}

/// Why [`GraphExecHandle::update`] refused an update (`CUgraphExecUpdateResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateRefusal {
    /// The graphs' nodes or edges differ.
    TopologyChanged,
    /// A node changed type (a memset became a kernel, ...).
    NodeTypeChanged,
    /// A kernel node's function changed in a way that cannot be updated.
    FunctionChanged,
    /// A node's parameters changed in a way that cannot be updated (a memset of another
    /// size or element width, a copy between other kinds of memory, ...).
    ParametersChanged,
    /// Something in the graph does not support update.
    NotSupported,
    /// A kernel node's function changed to one that cannot replace it.
    UnsupportedFunctionChange,
    /// A node's attributes changed in a way that cannot be updated.
    AttributesChanged,
    /// Another refusal (the driver's `CUgraphExecUpdateResult` value).
    Other(u32),
}

impl std::fmt::Display for UpdateRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpdateRefusal::TopologyChanged => f.write_str("the topology changed"),
            UpdateRefusal::NodeTypeChanged => f.write_str("a node's type changed"),
            UpdateRefusal::FunctionChanged => f.write_str("a kernel's function changed"),
            UpdateRefusal::ParametersChanged => {
                f.write_str("a node's parameters changed in a way that cannot be updated")
            }
            UpdateRefusal::NotSupported => f.write_str("the graph does not support update"),
            UpdateRefusal::UnsupportedFunctionChange => {
                f.write_str("a kernel's function changed to one that cannot replace it")
            }
            UpdateRefusal::AttributesChanged => f.write_str("a node's attributes changed"),
            UpdateRefusal::Other(code) => write!(f, "update refused (result {code})"),
        }
    }
}

fn refusal_from_raw(raw: CUgraphExecUpdateResult) -> UpdateRefusal {
    type R = CUgraphExecUpdateResult;
    match raw {
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => UpdateRefusal::TopologyChanged,
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => UpdateRefusal::NodeTypeChanged,
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED => UpdateRefusal::FunctionChanged,
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => {
            UpdateRefusal::ParametersChanged
        }
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => UpdateRefusal::NotSupported,
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE => {
            UpdateRefusal::UnsupportedFunctionChange
        }
        r if r == R::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED => {
            UpdateRefusal::AttributesChanged
        }
        r => UpdateRefusal::Other(r.0),
    }
}

/// An owned `CUgraphExec` (an executable graph), destroyed on drop (a launch still in flight
/// completes first: the driver frees it afterwards).
///
/// `Send`, not `Sync` (see the [module documentation](self)).
pub struct GraphExecHandle {
    raw: CUgraphExec,
    device: Device,
    /// Kept alive for as long as this executable graph can run (see [`GraphHandle`]).
    keep: KeepAlive,
}

// SAFETY: an executable graph may be used from any thread, one at a time; the type is not
// Sync, so calls through `&self` never overlap.
unsafe impl Send for GraphExecHandle {}

impl std::fmt::Debug for GraphExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExecHandle")
            .field("raw", &self.raw)
            .field("device", &self.device.ordinal())
            .field("kept_alive", &self.keep.len())
            .finish()
    }
}

impl GraphExecHandle {
    /// The driver handle (still owned by `self`).
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }

    /// The device the graph runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Runs the graph on `stream`, after the stream's earlier work and the graph's previous
    /// launches (`cuGraphLaunch`). Any stream of the graph's device works, the legacy null
    /// stream included; a stream of another device is [`Error::WrongDevice`].
    ///
    /// A stream that is being captured is refused with [`Error::Unsupported`], before
    /// anything is issued (the capture goes on unharmed): the launch would become a node of
    /// the graph being captured, and that graph keeps neither this executable graph nor the
    /// memory it uses alive. (The driver refuses it too, today: `cuGraphLaunch` on a
    /// capturing stream is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` on driver 580, and
    /// invalidates the capture.)
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let _issue = stream.issue(self.device)?;
        if is_capturing(stream)? {
            return Err(Error::Unsupported(
                "launching an executable graph on a stream that is being captured (the \
                 captured graph would keep neither it nor its memory alive)",
            ));
        }
        // The memory the graph uses is used on `stream` now: its owners' frees (after the
        // last graph holding them is dropped) wait for this launch too.
        for owner in self.keep.iter() {
            owner.record_stream(stream)?;
        }
        // The device's context is current for every stream: the null and per-thread handles
        // (0, 1, 2) mean "of the current context", and the crate's rule is that every driver
        // call runs inside the context it works on.
        let _ctx = self.device.bind()?;
        // SAFETY: a live executable graph and a stream of its device, whose context is current.
        unsafe { drv!(cuGraphLaunch(self.raw, stream.raw())) }
    }

    /// Uploads the graph's work descriptions to the device on `stream` ahead of the first
    /// launch, so that launch does not pay for it (`cuGraphUpload`).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        stream.expect_device(self.device)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live executable graph and a stream of its device; its context is current.
        unsafe { drv!(cuGraphUpload(self.raw, stream.raw())) }
    }

    /// Replaces the parameters of this executable graph's nodes with those of `graph`, which
    /// must have the same topology (`cuGraphExecUpdate`). The change applies to later launches.
    ///
    /// `Ok(Ok(()))` when updated; `Ok(Err(refusal))` when the driver refused (this executable
    /// graph is then unchanged and still valid); `Err` for any other failure.
    pub fn update(
        &mut self,
        graph: &GraphHandle,
    ) -> Result<std::result::Result<(), UpdateRefusal>> {
        Ok(self.update_detailed(graph)?.map_err(|f| f.refusal))
    }
}

impl Drop for GraphExecHandle {
    fn drop(&mut self) {
        // Without the device's context (the driver is gone) the graph is leaked.
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: we own the executable graph; the driver defers freeing while it runs.
            let _ = unsafe { drv!(cuGraphExecDestroy(self.raw)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_statuses_map_to_the_driver_values() {
        assert_eq!(CaptureMode::Global.to_raw().0, 0);
        assert_eq!(CaptureMode::ThreadLocal.to_raw().0, 1);
        assert_eq!(CaptureMode::Relaxed.to_raw().0, 2);
        assert_eq!(CaptureMode::default(), CaptureMode::ThreadLocal);
        assert_eq!(
            status_from_raw(CUstreamCaptureStatus(0)),
            CaptureStatus::None
        );
        assert_eq!(
            status_from_raw(CUstreamCaptureStatus(1)),
            CaptureStatus::Active
        );
        assert_eq!(
            status_from_raw(CUstreamCaptureStatus(2)),
            CaptureStatus::Invalidated
        );
    }

    #[test]
    fn refusals_map_and_unknown_codes_are_kept() {
        assert_eq!(
            refusal_from_raw(CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED),
            UpdateRefusal::TopologyChanged
        );
        assert_eq!(
            refusal_from_raw(
                CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED
            ),
            UpdateRefusal::ParametersChanged
        );
        assert_eq!(
            refusal_from_raw(CUgraphExecUpdateResult(999)),
            UpdateRefusal::Other(999)
        );
        assert_eq!(
            (InstantiateFlags::AUTO_FREE_ON_LAUNCH | InstantiateFlags::USE_NODE_PRIORITY).0,
            InstantiateFlags::AUTO_FREE_ON_LAUNCH.0 | InstantiateFlags::USE_NODE_PRIORITY.0
        );
    }
}
