//! The handle cache: one cuBLAS handle (and, on first use, one cuBLASLt handle) per (device,
//! stream), as PyTorch keeps them, with a workspace from the pool.
//!
//! * **Per (device, stream).** A handle works on the one stream it was made for
//!   (`cublasSetStream` once, at creation); the per-thread default stream gets one per thread
//!   (it names a different stream on each). So a call never creates a handle after the first
//!   on its stream, and two threads on two streams never share one. A mutex per handle
//!   serialises threads that share a stream.
//! * **Workspace.** cuBLAS without a workspace of its own allocates one itself (inside a
//!   capture: memory nodes, PyTorch #83461); so each handle binds one from the pool
//!   ([`cudars_mempool::allocator::alloc_on`]) on its stream, [`workspace_bytes`] long
//!   (`$CUDARS_BLAS_WORKSPACE_BYTES`, else 32 MiB on compute capability 9.0 and later, 4 MiB
//!   before, PyTorch's sizes). The same buffer serves cuBLASLt's calls on that stream.
//! * **Captures.** While the stream is being captured, calls use the stream's capture
//!   workspace: taken from the pool during the first capture (so from its private pool, and
//!   no memory node is recorded) and kept for every later capture of the stream, so repeated
//!   captures do not grow memory (PyTorch keeps one workspace per handle and stream the same
//!   way). Every graph made from a capture begun through `cuda-core`/`cuda-graph` keeps it
//!   alive; one captured by foreign code (PyTorch, CuPy) cannot be seen, so a workspace such a
//!   capture used is never freed. The eager workspace is never written by a replay. Graphs
//!   captured on one stream share its capture workspace: replay them in one stream's order
//!   (as one replays PyTorch's graphs of one capture stream), not at the same time on
//!   different streams. Rebinding is one `cublasSetWorkspace` when the mode changes.
//! * **Bounded.** At most [`MAX_HANDLES_PER_DEVICE`] handles per device: when a new stream
//!   needs one beyond that, the handles of streams nobody else holds any more are destroyed
//!   first, then the least recently used. [`clear`] destroys all of them.
//! * **Destroy errors** are counted ([`destroy_failures`]), never panic. `cublasDestroy`
//!   synchronises the device, which would invalidate another thread's capture: while a capture
//!   begun through `cuda-core` (or announced by a framework) runs, dropped handles wait
//!   ([`handles_awaiting_destruction`]) and are destroyed at the next handle creation or
//!   [`clear`] after it. Creation runs in the relaxed capture mode for the same reason.
//!   Captures that foreign code begins without announcing them are not seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudars_blas_sys::{
    cublas, cublasHandle_t, cublasLtHandle_t, cublasMath_t, cublasPointerMode_t, cublaslt,
    cudaStream_t,
};
use cudars_core::graph::{self, CaptureStatus};
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Issue, Stream, StreamKind};

use crate::error::{check, Error, Result};

/// Handles kept per device before unused ones are destroyed.
pub const MAX_HANDLES_PER_DEVICE: usize = 64;

/// The variable that sets the workspace size in bytes (`0`: no workspace of our own; cuBLAS
/// then runs the algorithms that need none).
pub const WORKSPACE_ENV: &str = "CUDARS_BLAS_WORKSPACE_BYTES";

static DESTROY_FAILURES: AtomicU64 = AtomicU64::new(0);
static CREATED: AtomicU64 = AtomicU64::new(0);

/// How many handle destructions (cuBLAS or cuBLASLt) have failed in this process; a failure
/// is counted and the handle forgotten, never a panic.
pub fn destroy_failures() -> u64 {
    DESTROY_FAILURES.load(Ordering::Relaxed)
}

/// How many cuBLAS handles this crate has created in this process (the cache's misses).
pub fn handles_created() -> u64 {
    CREATED.load(Ordering::Relaxed)
}

/// The workspace size for `device`: [`WORKSPACE_ENV`] when set to a number, else 32 MiB on
/// compute capability 9.0 and later and 4 MiB before.
pub fn workspace_bytes(device: &Device) -> usize {
    if let Some(n) = std::env::var(WORKSPACE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return n;
    }
    match device.compute_capability() {
        Ok((major, _)) if major >= 9 => 32 << 20,
        _ => 4 << 20,
    }
}

/// Which workspace the handle has bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// cuBLAS's own (nothing set yet).
    Library,
    /// The eager workspace.
    Eager,
    /// The capture workspace.
    Capture,
}

/// A cached handle and its settings.
pub(crate) struct State {
    raw: cublasHandle_t,
    lt: cublasLtHandle_t,
    device: Device,
    stream: Stream,
    workspace_bytes: usize,
    eager: Option<DevicePtr>,
    /// The workspace of captured calls, taken from the pool during the first capture (so from
    /// its private pool) and kept for every later capture of this stream.
    capture: Option<DevicePtr>,
    /// The capture whose graphs were last asked to keep `capture` alive.
    capture_id: Option<u64>,
    /// A capture did not keep `capture` alive (one begun by foreign code): its graphs may
    /// replay into it for as long as they live, which nothing here can see, so it is never
    /// freed.
    capture_unkept: bool,
    bound: Bound,
    math: cublasMath_t,
    pointer_mode: cublasPointerMode_t,
    last_used: u64,
    /// cuBLASLt plans of this handle, by shape (see `lt`).
    pub(crate) lt_plans: crate::lt::PlanCache,
}

// SAFETY: the raw handles are used only while the state's mutex is held, by one thread at a
// time, with the handle's device bound: cuBLAS allows a handle to move between host threads
// so long as calls do not overlap.
unsafe impl Send for State {}

/// Capture workspaces that foreign graphs may still replay into: never freed.
fn forever() -> &'static Mutex<Vec<DevicePtr>> {
    static FOREVER: Mutex<Vec<DevicePtr>> = Mutex::new(Vec::new());
    &FOREVER
}

impl Drop for State {
    fn drop(&mut self) {
        self.lt_plans.clear();
        if self.capture_unkept {
            if let Some(p) = self.capture.take() {
                forever()
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(p);
            }
        }
        let raw = Raw {
            blas: self.raw,
            lt: self.lt,
            device: self.device,
        };
        // cublasDestroy synchronises the device: inside another thread's capture that would
        // invalidate it. While a capture may run, the handles wait in the graveyard (their
        // workspaces go back to the pool now, in stream order, which is capture-safe).
        if capture_may_run() {
            grave()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(raw);
        } else {
            raw.destroy();
        }
    }
}

/// The raw handles of a dropped state.
struct Raw {
    blas: cublasHandle_t,
    lt: cublasLtHandle_t,
    device: Device,
}

// SAFETY: raw handles nobody uses any more, destroyed once by whichever thread buries them.
unsafe impl Send for Raw {}

impl Raw {
    fn destroy(self) {
        let Ok(_ctx) = self.device.bind() else {
            DESTROY_FAILURES.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let _relaxed = graph::RelaxedCaptureMode::new();
        if !self.lt.is_null() {
            if let Ok(lt) = cublaslt() {
                // SAFETY: a cuBLASLt handle a state created and never destroyed.
                if check(unsafe { lt.cublasLtDestroy(self.lt) }, "cublasLtDestroy").is_err() {
                    DESTROY_FAILURES.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Ok(lib) = cublas() {
            // SAFETY: a cuBLAS handle a state created and never destroyed; its device's
            // context is current. Work it queued stays ordered on its stream.
            let status = unsafe { lib.cublasDestroy_v2(self.blas) };
            if check(status, "cublasDestroy_v2").is_err() {
                DESTROY_FAILURES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Whether a capture may be running anywhere in the process (begun through `cuda-core` or
/// announced by a framework).
fn capture_may_run() -> bool {
    graph::captures_in_progress() || graph::announced_captures_in_progress()
}

fn grave() -> &'static Mutex<Vec<Raw>> {
    static GRAVE: Mutex<Vec<Raw>> = Mutex::new(Vec::new());
    &GRAVE
}

/// Destroys the handles that waited for captures to end, when none may run now.
fn bury() {
    if capture_may_run() {
        return;
    }
    let dead: Vec<Raw> =
        std::mem::take(&mut *grave().lock().unwrap_or_else(PoisonError::into_inner));
    for r in dead {
        r.destroy();
    }
}

/// Handles waiting for captures to end before they are destroyed.
pub fn handles_awaiting_destruction() -> usize {
    grave().lock().unwrap_or_else(PoisonError::into_inner).len()
}

/// The cache key: device, stream identity, and for the per-thread default stream the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    device: usize,
    stream: u64,
    thread: u64,
}

fn key(stream: &Stream) -> Key {
    let thread = if stream.kind() == StreamKind::PerThread {
        thread_key()
    } else {
        0
    };
    Key {
        device: stream.device().ordinal(),
        stream: stream.identity(),
        thread,
    }
}

fn thread_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

type Shared = Arc<Mutex<State>>;

fn cache() -> &'static Mutex<HashMap<Key, Shared>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Shared>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

static CLOCK: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The thread's last handle, so a run of calls on one stream skips the global map.
    static LAST: std::cell::RefCell<Option<(Key, Shared)>> = const { std::cell::RefCell::new(None) };
}

/// How many handles the cache holds.
pub fn cached_handles() -> usize {
    cache().lock().unwrap_or_else(PoisonError::into_inner).len()
}

/// Destroys every cached handle (each once no call is using it) and drops their workspaces
/// back into the pool. Later calls create new ones.
pub fn clear() {
    LAST.with(|l| l.borrow_mut().take());
    let all: Vec<Shared> = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain()
        .map(|(_, v)| v)
        .collect();
    drop(all);
    bury();
}

/// The handle state of `stream`, created on first use.
fn shared(stream: &Stream) -> Result<Shared> {
    let k = key(stream);
    // The thread's last handle; only a stream whose identity is unique (or the per-thread and
    // legacy streams, which the key pins) can be found this way.
    let hit = LAST.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(lk, _)| *lk == k)
            .map(|(_, s)| Arc::clone(s))
    });
    if let Some(s) = hit {
        return Ok(s);
    }
    let mut map = cache().lock().unwrap_or_else(PoisonError::into_inner);
    let found = map.get(&k).filter(|s| same_stream(s, stream)).cloned();
    let s = match found {
        Some(s) => s,
        None => {
            evict(&mut map, k.device);
            let s = Arc::new(Mutex::new(State::new(stream)?));
            bury();
            map.insert(k, Arc::clone(&s));
            s
        }
    };
    drop(map);
    LAST.with(|l| *l.borrow_mut() = Some((k, Arc::clone(&s))));
    Ok(s)
}

/// Whether a cached state was made for this stream (an external stream known by its handle
/// value may be a new stream with an old value).
fn same_stream(s: &Shared, stream: &Stream) -> bool {
    stream.identity_is_unique()
        || s.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stream
            .raw()
            == stream.raw()
}

/// Before a new handle of `device` is made: drops the handles of streams nobody else holds
/// any more (their owners dropped every clone; the stream dies with the handle), then, beyond
/// [`MAX_HANDLES_PER_DEVICE`], the least recently used.
fn evict(map: &mut HashMap<Key, Shared>, device: usize) {
    map.retain(|k, s| {
        k.device != device
            || Arc::strong_count(s) > 1
            || s.try_lock()
                .map(|st| st.stream.clone_count() != Some(1))
                .unwrap_or(true)
    });
    while map.keys().filter(|k| k.device == device).count() >= MAX_HANDLES_PER_DEVICE {
        let oldest = map
            .iter()
            .filter(|(k, _)| k.device == device)
            .min_by_key(|(_, s)| s.try_lock().map(|st| st.last_used).unwrap_or(u64::MAX))
            .map(|(k, _)| *k);
        match oldest {
            Some(k) => {
                map.remove(&k);
            }
            None => break,
        }
    }
}

impl State {
    fn new(stream: &Stream) -> Result<State> {
        let lib = cublas()?;
        let device = stream.device();
        let _ctx = device.bind()?;
        // cublasCreate allocates: inside another thread's capture in global mode that call
        // would be refused and invalidate the capture.
        let _relaxed = graph::RelaxedCaptureMode::new()?;
        let mut raw: cublasHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the device's primary context is current, which is the
        // context cuBLAS's runtime binds the handle to.
        check(unsafe { lib.cublasCreate_v2(&mut raw) }, "cublasCreate_v2")?;
        CREATED.fetch_add(1, Ordering::Relaxed);
        let state = State {
            raw,
            lt: std::ptr::null_mut(),
            device,
            stream: stream.clone(),
            workspace_bytes: workspace_bytes(&device),
            eager: None,
            capture: None,
            capture_id: None,
            capture_unkept: false,
            bound: Bound::Library,
            math: cublasMath_t::CUBLAS_DEFAULT_MATH,
            pointer_mode: cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST,
            last_used: 0,
            lt_plans: crate::lt::PlanCache::default(),
        };
        check(
            // SAFETY: a live handle; the stream is a live stream of the handle's device (held by
            // the state for the handle's life). (On failure `state` drops and destroys the handle.)
            unsafe { lib.cublasSetStream_v2(raw, stream.raw() as cudaStream_t) },
            "cublasSetStream_v2",
        )?;
        Ok(state)
    }
}

/// What a routine gets while it issues its call: the handles, the workspace, and the
/// [`Issue`] that holds the capture gate (mark every operand with it first).
pub(crate) struct Call<'a, 's> {
    pub(crate) state: MutexGuard<'a, State>,
    pub(crate) issue: Issue<'s>,
    /// The capture this call is recorded into, if any.
    pub(crate) capture: Option<u64>,
}

impl Call<'_, '_> {
    /// The cuBLAS handle.
    pub(crate) fn raw(&self) -> cublasHandle_t {
        self.state.raw
    }

    /// The bound workspace's address and size (0 and 0 when none).
    pub(crate) fn workspace(&self) -> (u64, usize) {
        let ws = match self.state.bound {
            Bound::Eager => self.state.eager.as_ref(),
            Bound::Capture => self.state.capture.as_ref(),
            Bound::Library => None,
        };
        ws.map_or((0, 0), |p| (p.as_raw(), p.len()))
    }

    /// The cuBLASLt handle, created on first use.
    pub(crate) fn lt(&mut self) -> Result<cublasLtHandle_t> {
        if self.state.lt.is_null() {
            let lt = cublaslt()?;
            let mut raw: cublasLtHandle_t = std::ptr::null_mut();
            let _relaxed = graph::RelaxedCaptureMode::new()?;
            // SAFETY: a valid out-pointer; the handle's device is current (the call bound it).
            check(unsafe { lt.cublasLtCreate(&mut raw) }, "cublasLtCreate")?;
            self.state.lt = raw;
        }
        Ok(self.state.lt)
    }

    /// The handle's cuBLASLt plans.
    pub(crate) fn plans(&mut self) -> &mut crate::lt::PlanCache {
        &mut self.state.lt_plans
    }

    /// Sets the math mode when it differs from the handle's.
    pub(crate) fn set_math(&mut self, math: cublasMath_t) -> Result<()> {
        if self.state.math != math {
            let lib = cublas()?;
            check(
                // SAFETY: a live handle, used under its mutex.
                unsafe { lib.cublasSetMathMode(self.state.raw, math) },
                "cublasSetMathMode",
            )?;
            self.state.math = math;
        }
        Ok(())
    }

    /// Sets the pointer mode when it differs from the handle's.
    pub(crate) fn set_pointer_mode(&mut self, mode: cublasPointerMode_t) -> Result<()> {
        if self.state.pointer_mode != mode {
            let lib = cublas()?;
            check(
                // SAFETY: a live handle, used under its mutex.
                unsafe { lib.cublasSetPointerMode_v2(self.state.raw, mode) },
                "cublasSetPointerMode_v2",
            )?;
            self.state.pointer_mode = mode;
        }
        Ok(())
    }
}

/// The capture `stream` is recorded into, asking the driver only when a capture may be
/// running on it: streams this crate's callers created are captured through `cuda-core`
/// (one atomic load while none runs); external and per-thread streams are asked each time.
fn capture_of(stream: &Stream) -> Result<Option<u64>> {
    let ask = match stream.kind() {
        StreamKind::LegacyNull => false,
        StreamKind::Owned => graph::captures_in_progress(),
        _ if stream.captures_announced() => {
            graph::captures_in_progress() || graph::announced_captures_in_progress()
        }
        _ => true,
    };
    if !ask {
        return Ok(None);
    }
    let info = graph::capture_info(stream)?;
    match info.status {
        CaptureStatus::None => Ok(None),
        CaptureStatus::Active => Ok(info.id),
        CaptureStatus::Invalidated => Err(Error::Unsupported {
            routine: "cuBLAS call",
            why: "the stream's capture has been invalidated; end it before issuing more work"
                .into(),
        }),
    }
}

/// Runs `f` with `stream`'s handle locked, its device current, the capture gate held and the
/// right workspace bound (see the [module documentation](self)). Everything the routine
/// checks must be checked before: this takes the handle, maybe a workspace, and the gate.
pub(crate) fn with_call<R>(
    stream: &Stream,
    f: impl FnOnce(&mut Call<'_, '_>) -> Result<R>,
) -> Result<R> {
    let shared = shared(stream)?;
    let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
    state.last_used = CLOCK.fetch_add(1, Ordering::Relaxed);
    let device = state.device;
    let _ctx = device.bind()?;
    let issue = stream.issue(device)?;
    let capture = capture_of(stream)?;
    bind_workspace(&mut state, &issue, capture)?;
    let mut call = Call {
        state,
        issue,
        capture,
    };
    f(&mut call)
}

/// Binds the eager workspace (outside a capture) or the capture workspace (inside), taking
/// each from the pool on first need.
fn bind_workspace(state: &mut State, issue: &Issue<'_>, capture: Option<u64>) -> Result<()> {
    if state.workspace_bytes == 0 {
        return Ok(());
    }
    let want = match capture {
        None => {
            if state.eager.is_none() {
                let p = cudars_mempool::allocator::alloc_on(&state.stream, state.workspace_bytes)
                    .map_err(|e| Error::pool("cuBLAS workspace", e))?;
                state.eager = Some(p);
            }
            Bound::Eager
        }
        Some(id) => {
            if state.capture.is_none() {
                // Taken during the capture: from its private pool.
                let p = cudars_mempool::allocator::alloc_on(&state.stream, state.workspace_bytes)
                    .map_err(|e| Error::pool("cuBLAS workspace (capture)", e))?;
                state.capture = Some(p);
            }
            if state.capture_id != Some(id) {
                if let Some(p) = &state.capture {
                    // Each capture's graphs keep the workspace alive (captures begun through
                    // cuda-core take a reference); one that does not is foreign, and the
                    // workspace is then never freed.
                    let before = Arc::strong_count(p.owner());
                    p.record_stream(issue)?;
                    if Arc::strong_count(p.owner()) == before {
                        state.capture_unkept = true;
                    }
                }
                state.capture_id = Some(id);
            }
            Bound::Capture
        }
    };
    if state.bound != want {
        let (addr, len) = match want {
            Bound::Eager => state.eager.as_ref(),
            _ => state.capture.as_ref(),
        }
        .map_or((0, 0), |p| (p.as_raw(), p.len()));
        let lib = cublas()?;
        check(
            // SAFETY: a live handle under its mutex; the workspace is a live pool block of the
            // handle's device, `len` bytes, 512-byte aligned (cuBLAS asks 256), held by the
            // state for as long as it is bound (and by the capture's graphs when captured).
            unsafe { lib.cublasSetWorkspace_v2(state.raw, addr as *mut std::ffi::c_void, len) },
            "cublasSetWorkspace_v2",
        )?;
        state.bound = want;
    }
    Ok(())
}

/// Runs `f` with `stream`'s cached cuBLAS handle, for the cuBLAS routines this crate does not
/// wrap: the handle locked for the call (no other thread uses it meanwhile), its device
/// current, bound to `stream` with the right workspace (the capture workspace while `stream`
/// is captured), and the capture gate held by the [`Issue`] `f` gets.
///
/// Calling cuBLAS with the handle is `unsafe` in `f`, and its contract is the caller's: every
/// view the call reads or writes must be valid for it, and marked with the issue first
/// (`view.record_stream(issue)`, the ordering rule of pool blocks). Settings `f` changes are
/// read back afterwards (pointer mode, math mode) or restored (the stream, the workspace), so
/// the crate's own calls stay right.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let version = cudars_blas::handle::with_raw_handle(&stream, |handle, _issue| {
///     let lib = cudars_blas_sys::cublas().expect("opened by the handle");
///     let mut v = 0;
///     // SAFETY: a live handle and a valid out-pointer.
///     let status = unsafe { lib.cublasGetVersion_v2(handle, &mut v) };
///     status.map(|s| (s.is_success(), v))
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn with_raw_handle<R>(
    stream: &Stream,
    f: impl FnOnce(cublasHandle_t, &Issue<'_>) -> R,
) -> Result<R> {
    with_call(stream, |call| {
        let raw = call.raw();
        let out = f(raw, &call.issue);
        let lib = cublas()?;
        let state = &mut *call.state;
        let mut bound_stream: cudaStream_t = std::ptr::null_mut();
        // SAFETY: a live handle under its mutex; valid out-pointers.
        let asked = unsafe {
            (
                lib.cublasGetStream_v2(raw, &mut bound_stream),
                lib.cublasGetPointerMode_v2(raw, &mut state.pointer_mode),
                lib.cublasGetMathMode(raw, &mut state.math),
            )
        };
        check(asked.0, "cublasGetStream_v2")?;
        check(asked.1, "cublasGetPointerMode_v2")?;
        check(asked.2, "cublasGetMathMode")?;
        if bound_stream != state.stream.raw() as cudaStream_t {
            check(
                // SAFETY: a live handle; its own stream, held by the state.
                unsafe { lib.cublasSetStream_v2(raw, state.stream.raw() as cudaStream_t) },
                "cublasSetStream_v2",
            )?;
        }
        // The workspace may have been changed (or reset by a stream change): bind it again
        // at the next call.
        state.bound = Bound::Library;
        Ok(out)
    })
}
