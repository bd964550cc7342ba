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
//! * **Kept, and bounded.** The cache holds a clone of each stream it served (and its
//!   workspaces live on that stream) until the handle goes: at most
//!   [`MAX_HANDLES_PER_DEVICE`] per device, the least recently used going first when a new
//!   stream needs one; [`release`] drops one stream's handle (do it before an external
//!   stream's owner destroys it), [`clear`] all. A program that makes a stream per task keeps
//!   up to that many handles with their workspaces (PyTorch keeps every one).
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

/// The oldest cuBLAS major version the bindings are used with (CUDA 12's; the headers are CUDA
/// 13's, whose entry points CUDA 12's library has with the same signatures, or lacks).
pub const MIN_CUBLAS_MAJOR: i32 = 12;

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
    /// `with_raw_handle` could not put the handle back as the crate needs it: refuse calls.
    tainted: bool,
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

/// The cache key: device, its context generation, stream identity, and for the per-thread
/// default stream the thread. The generation keeps a handle made before a
/// `Device::reset_after_fault` (its context destroyed) from serving the implicit streams of
/// the new context, whose identities are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    device: usize,
    generation: u32,
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
        generation: stream.device().generation(),
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

/// Drops every cached handle from the cache and their workspaces back into the pool (each
/// once no call uses it, and once other threads' last-handle memos let go: their next call on
/// another stream). Later calls create new ones.
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

/// The handle state of `stream`, created on first use. The global map's lock is held only to
/// look up and insert: the handle is created, and evicted handles dropped, outside it.
fn shared(stream: &Stream) -> Result<Shared> {
    let k = key(stream);
    let hit = LAST.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(lk, _)| *lk == k)
            .map(|(_, s)| Arc::clone(s))
    });
    if let Some(s) = hit {
        return Ok(s);
    }
    let found = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&k)
        .cloned();
    let s = match found {
        Some(s) => s,
        None => {
            let made = Arc::new(Mutex::new(State::new(stream)?));
            let (s, evicted) = {
                let mut map = cache().lock().unwrap_or_else(PoisonError::into_inner);
                match map.get(&k) {
                    // Another thread made one meanwhile: use it (ours drops below).
                    Some(theirs) => (Arc::clone(theirs), vec![made]),
                    None => {
                        let evicted = evict(&mut map, k.device);
                        map.insert(k, Arc::clone(&made));
                        (made, evicted)
                    }
                }
            };
            drop(evicted);
            bury();
            s
        }
    };
    LAST.with(|l| *l.borrow_mut() = Some((k, Arc::clone(&s))));
    Ok(s)
}

/// Makes room for one more handle of `device`: beyond [`MAX_HANDLES_PER_DEVICE`], the least
/// recently used handles leave the map (returned, to be dropped outside its lock).
fn evict(map: &mut HashMap<Key, Shared>, device: usize) -> Vec<Shared> {
    let mut out = Vec::new();
    while map.keys().filter(|k| k.device == device).count() >= MAX_HANDLES_PER_DEVICE {
        let oldest = map
            .iter()
            .filter(|(k, _)| k.device == device)
            .min_by_key(|(_, s)| s.try_lock().map(|st| st.last_used).unwrap_or(u64::MAX))
            .map(|(k, _)| *k);
        match oldest.and_then(|k| map.remove(&k)) {
            Some(s) => out.push(s),
            None => break,
        }
    }
    out
}

/// Drops `stream`'s cached handle and its workspaces (once no call uses them): what to call
/// before an external stream (one of [`Stream::external`](cudars_core::Stream::external)) is
/// destroyed by its owner, since the cache holds a clone of every stream it served. Other
/// threads' last-handle memos are cleared lazily: their next call on another stream lets go.
/// Returns whether a handle was cached.
pub fn release(stream: &Stream) -> bool {
    let k = key(stream);
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        if l.as_ref().is_some_and(|(lk, _)| *lk == k) {
            *l = None;
        }
    });
    let removed = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&k);
    let found = removed.is_some();
    drop(removed);
    bury();
    found
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
        let mut major = 0;
        // SAFETY: a valid out-pointer; the property needs no handle.
        let asked = unsafe {
            lib.cublasGetProperty(
                cudars_blas_sys::libraryPropertyType::MAJOR_VERSION,
                &mut major,
            )
        };
        if check(asked, "cublasGetProperty").is_err() || major < MIN_CUBLAS_MAJOR {
            // SAFETY: the handle just created; nothing used it.
            let _ = unsafe { lib.cublasDestroy_v2(raw) };
            return Err(Error::Unsupported {
                routine: "cuBLAS",
                why: format!(
                    "{} is cuBLAS {major}; these bindings (CUDA 13 headers) take cuBLAS {MIN_CUBLAS_MAJOR} or later",
                    lib.path()
                ),
            });
        }
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
            tainted: false,
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
    if !graph::may_be_captured(stream) {
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
    // The capture gate first, then the handle: a thread that holds an issue (another call's,
    // or its own) and waits for this handle never waits for a thread that holds this handle
    // and waits for the gate.
    let device = stream.device();
    let issue = stream.issue(device)?;
    let shared = shared(stream)?;
    let _held = Held::enter(&shared)?;
    let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
    if state.tainted {
        return Err(Error::Unsupported {
            routine: "cuBLAS call",
            why: "this stream's handle could not be restored after with_raw_handle; \
                  handle::release(&stream) drops it and the next call makes a new one"
                .into(),
        });
    }
    state.last_used = CLOCK.fetch_add(1, Ordering::Relaxed);
    // The handle's own context generation too (the key holds it; never use a handle whose
    // context a reset destroyed).
    cudars_core::health::usable(&state.device)?;
    let _ctx = device.bind()?;
    let capture = capture_of(stream)?;
    bind_workspace(&mut state, &issue, capture)?;
    let mut call = Call {
        state,
        issue,
        capture,
    };
    f(&mut call)
}

thread_local! {
    /// The handles this thread holds now (their states' addresses).
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// This thread's hold of a handle, for the length of one call: a second call on the same
/// handle from inside the first (a `with_raw_handle` closure calling back into the crate on
/// its stream) is refused instead of waiting for itself.
struct Held(usize);

impl Held {
    fn enter(shared: &Shared) -> Result<Held> {
        let addr = Arc::as_ptr(shared) as usize;
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.contains(&addr) {
                return Err(Error::Unsupported {
                    routine: "cuBLAS call",
                    why: "called from inside a call on the same stream's handle (a \
                          with_raw_handle closure): it would wait for itself"
                        .into(),
                });
            }
            h.push(addr);
            Ok(Held(addr))
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|a| *a == self.0) {
                h.remove(i);
            }
        });
    }
}

/// A workspace from the thread's allocator (any `Allocator` a program installs): on the
/// handle's device, as long as asked, aligned to 256 bytes (cuBLAS's rule), or refused.
fn checked_workspace(p: DevicePtr, state: &State) -> Result<DevicePtr> {
    if p.device() != state.device
        || p.len() < state.workspace_bytes
        || !p.as_raw().is_multiple_of(256)
    {
        return Err(Error::Unsupported {
            routine: "cuBLAS workspace",
            why: format!(
                "the allocator gave {} bytes at {:#x} on device {}; the handle needs {} bytes, \
                 256-byte aligned, on device {}",
                p.len(),
                p.as_raw(),
                p.device().ordinal(),
                state.workspace_bytes,
                state.device.ordinal()
            ),
        });
    }
    Ok(p)
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
                state.eager = Some(checked_workspace(p, state)?);
            }
            Bound::Eager
        }
        Some(id) => {
            if state.capture.is_none() {
                // Taken during the capture: from its private pool.
                let p = cudars_mempool::allocator::alloc_on(&state.stream, state.workspace_bytes)
                    .map_err(|e| Error::pool("cuBLAS workspace (capture)", e))?;
                state.capture = Some(checked_workspace(p, state)?);
            }
            if state.capture_id != Some(id) {
                if let Some(p) = &state.capture {
                    // Marked, the workspace is kept alive by the capture's graphs when a
                    // capture begun through cuda-core runs (then cuda-core keeps the owners of
                    // marked memory, for this capture's graphs, or for good when the capture
                    // is foreign). No such capture can begin while the issue is held, so one
                    // running after the mark ran during it; when none runs, the mark kept
                    // nothing, the capture is foreign, and the workspace is never freed.
                    p.record_stream(issue)?;
                    if !graph::captures_in_progress() {
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
            // SAFETY: a live handle under its mutex; the workspace is a live block of the
            // handle's device, at least `len` bytes, 256-byte aligned (checked_workspace),
            // held by the state for as long as it is bound (and by the capture's graphs when
            // captured).
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
/// is captured), and the capture gate held by the [`Issue`] `f` gets. `f` must not call this
/// crate on the same stream (refused: it would wait for itself).
///
/// Calling cuBLAS with the handle is `unsafe` in `f`, and its contract is the caller's: every
/// view the call reads or writes must be valid for it, and marked with the issue first
/// (`view.record_stream(issue)`, the ordering rule of pool blocks). Whatever `f` changes is put
/// back when it returns or panics (the stream, host pointers, the default math mode, the
/// workspace), so the crate's own calls stay right; if that fails, the handle refuses every
/// later call until [`release`] drops it.
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
        // Whatever `f` does, and however it ends (a panic included), the handle is put back
        // before anything else uses it.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(raw, &call.issue)));
        let restored = restore(&mut call.state);
        if restored.is_err() {
            call.state.tainted = true;
        }
        match out {
            Ok(v) => restored.map(|()| v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Puts a lent handle back: its own stream, host pointers, the default math mode, and the
/// workspace bound again at the next call (a stream change resets it).
fn restore(state: &mut State) -> Result<()> {
    let lib = cublas()?;
    let raw = state.raw;
    state.bound = Bound::Library;
    check(
        // SAFETY: a live handle under its mutex; its own stream, held by the state.
        unsafe { lib.cublasSetStream_v2(raw, state.stream.raw() as cudaStream_t) },
        "cublasSetStream_v2",
    )?;
    check(
        // SAFETY: a live handle under its mutex.
        unsafe { lib.cublasSetPointerMode_v2(raw, cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST) },
        "cublasSetPointerMode_v2",
    )?;
    state.pointer_mode = cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST;
    check(
        // SAFETY: a live handle under its mutex.
        unsafe { lib.cublasSetMathMode(raw, cublasMath_t::CUBLAS_DEFAULT_MATH) },
        "cublasSetMathMode",
    )?;
    state.math = cublasMath_t::CUBLAS_DEFAULT_MATH;
    Ok(())
}
