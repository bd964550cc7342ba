//! A C ABI for `cuda-mempool`: one process-wide pool that PyTorch, CuPy and C code can
//! use as their CUDA allocator.
//!
//! The crate builds a shared library (`libcudars_mempool_capi.so`) whose exported C
//! functions all serve one process-wide pool: by default [`cudars_mempool::default_pool`],
//! so Rust code and Python frameworks in the same process share it, or, with
//! [`SEGMENTS_ENV_VAR`] set to `plain`, a pool of the C API's own with plain segments. The C declarations are in
//! `include/cuda_mempool.h`, written by hand and checked against the exports by this
//! crate's tests.
//!
//! # Contents
//!
//! | export | for |
//! | --- | --- |
//! | [`cuda_mempool_alloc`], [`cuda_mempool_free`] | C code, and the CuPy module `python/cuda_mempool_cupy.py` (allocations on CuPy's current stream) |
//! | `cuda_mempool_torch_alloc` (C++, throws on failure), [`cuda_mempool_torch_free`] | PyTorch's `torch.cuda.memory.CUDAPluggableAllocator(path, "cuda_mempool_torch_alloc", "cuda_mempool_torch_free")` |
//! | [`cuda_mempool_cupy_stream_malloc`], [`cuda_mempool_cupy_set_stream_hooks`], [`cuda_mempool_cupy_held_streams`] (module [`cupy`]) | the CuPy module's allocator: CuPy's `CFunctionAllocator` on CuPy's current stream, the stream kept alive per stream |
//! | [`cuda_mempool_cupy_malloc`], [`cuda_mempool_cupy_free`] | CuPy's plain `cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)`: the same allocator as the module's (CuPy's current stream, CuPy's `OutOfMemoryError`), set up on first use through the process's Python |
//! | [`cuda_mempool_set_current_stream`] | the calling thread's current stream of `cuda-core` (Rust code in the process) |
//! | [`cuda_mempool_record_stream`] | marking a block as used on another stream (PyTorch's `record_stream`) |
//! | [`cuda_mempool_used_bytes`], [`cuda_mempool_reserved_bytes`], [`cuda_mempool_free_bytes`], [`cuda_mempool_peak_reserved_bytes`], [`cuda_mempool_n_free_blocks`], [`cuda_mempool_live_allocations`] | statistics |
//! | [`cuda_mempool_free_all_blocks`], [`cuda_mempool_set_limit`], [`cuda_mempool_get_limit`] | control |
//! | [`cuda_mempool_last_error`], [`cuda_mempool_last_oom`], [`cuda_mempool_last_context_lost`], [`cuda_mempool_clear_error`] | errors |
//!
//! Modules: [`error`] (the last-error slot and the panic guard every export runs in),
//! [`registry`] (device pointer to pool allocation), [`cupy`] (CuPy's current stream and the
//! per-stream hold behind [`cuda_mempool_cupy_stream_malloc`]).
//!
//! # Errors
//!
//! Failure crosses the boundary as a null pointer (allocations) or a negative return
//! value (everything else), plus a message that [`cuda_mempool_last_error`] returns on
//! the same thread. No panic unwinds into C: every export catches it and reports it as
//! an error. Frees return nothing (the C shapes of PyTorch and CuPy have no error
//! channel there); a failed free still records its message.
//!
//! # Streams
//!
//! A block belongs to the stream it was allocated on: the pool reuses it on that stream at
//! once and on other streams only after the work issued before its free has completed (see
//! `cudars_mempool`'s crate documentation). What the library guarantees and asks:
//!
//! * It uses a stream handle only while at least one block allocated on that stream is
//!   live: when the last one is freed, it records a fence covering the stream's frees and
//!   never touches the handle again. So the caller must keep a stream valid until every
//!   block allocated on it (or marked with [`cuda_mempool_record_stream`]) has been freed,
//!   and may destroy it afterwards. PyTorch's streams live for the whole process; the CuPy
//!   module keeps CuPy's stream object alive while the stream has live blocks (module
//!   [`cupy`]).
//! * A new stream that gets a destroyed stream's handle value never reuses that stream's
//!   cache before the old stream's fence: its first allocation makes it wait for the fence.
//! * An allocation on a stream that is being captured into a CUDA graph (also by PyTorch's
//!   `torch.cuda.graph` or CuPy's `Graph`) comes from a pool private to that capture, reused
//!   only inside the capture, and released once the graph and every executable graph made
//!   from it are destroyed.
//! * Out of memory leaves the pool as it was before the request: what it reserved while
//!   trying is given back.
//! * The per-thread default stream (`CU_STREAM_PER_THREAD`, CuPy's `Stream.ptds`) has a cache
//!   per thread, fenced and waited on only from its own thread; a block freed on another
//!   thread is reused by other streams only after its thread has fenced it. It cannot mark
//!   another stream's block ([`cuda_mempool_record_stream`] refuses it).
//! * The contract for frameworks: a block is used on the stream it was allocated on, and
//!   [`cuda_mempool_record_stream`] declares use on others; the framework's own work on the
//!   allocating stream (copies from and to the host included) is then ordered after the
//!   memory's previous owner, even when the pool handed over another stream's block, ordered
//!   on the device.
//!
//! # Example (Rust view of the C calls)
//!
//! ```no_run
//! use cudars_mempool_capi::*;
//!
//! // SAFETY: the legacy default stream (null) is always valid.
//! let p = unsafe { cuda_mempool_alloc(1 << 20, 0, std::ptr::null_mut()) };
//! assert!(!p.is_null());
//! assert!(cuda_mempool_used_bytes(0) >= 1 << 20);
//! // SAFETY: `p` is a live block of this library, freed once and not used afterwards.
//! unsafe { cuda_mempool_free(p) };
//! assert_eq!(cuda_mempool_free_all_blocks(), 0);
//! ```

#![deny(missing_docs)]

pub mod cupy;
pub mod error;
pub mod registry;
mod torch_alloc;

pub use cupy::{
    cuda_mempool_cupy_held_streams, cuda_mempool_cupy_set_error_release,
    cuda_mempool_cupy_set_stream_hooks, cuda_mempool_cupy_stream_malloc,
};
pub use torch_alloc::cuda_mempool_torch_alloc;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use std::cell::Cell;

use cudars_core::sys::CUstream;
use cudars_core::Stream;
use cudars_mempool::history::{self, Clock, Recorder};
use cudars_mempool::{
    default_pool, Backend, DeviceId, DevicePool, DriverBackend, Limit, MemoryPool, PoolConfig,
    PoolError,
};

use registry::Registry;

/// Every exported C function, by name, in the order of `include/cuda_mempool.h`.
pub const EXPORTED_FUNCTIONS: &[&str] = &[
    "cuda_mempool_alloc",
    "cuda_mempool_free",
    "cuda_mempool_record_stream",
    "cuda_mempool_last_oom",
    "cuda_mempool_last_context_lost",
    "cuda_mempool_torch_alloc",
    "cuda_mempool_torch_free",
    "cuda_mempool_torch_begin_allocate_to_pool",
    "cuda_mempool_torch_end_allocate_to_pool",
    "cuda_mempool_torch_release_pool",
    "cuda_mempool_torch_announce_captures",
    "cuda_mempool_cupy_malloc",
    "cuda_mempool_cupy_free",
    "cuda_mempool_set_current_stream",
    "cuda_mempool_cupy_set_stream_hooks",
    "cuda_mempool_cupy_set_error_release",
    "cuda_mempool_cupy_stream_malloc",
    "cuda_mempool_cupy_held_streams",
    "cuda_mempool_used_bytes",
    "cuda_mempool_reserved_bytes",
    "cuda_mempool_free_bytes",
    "cuda_mempool_peak_reserved_bytes",
    "cuda_mempool_n_free_blocks",
    "cuda_mempool_live_allocations",
    "cuda_mempool_free_all_blocks",
    "cuda_mempool_set_limit",
    "cuda_mempool_get_limit",
    "cuda_mempool_history_start",
    "cuda_mempool_history_start_backtraces",
    "cuda_mempool_history_stop",
    "cuda_mempool_history_dump",
    "cuda_mempool_last_error",
    "cuda_mempool_clear_error",
];

/// The C API's live allocations, by address.
static LIVE: LazyLock<Registry> = LazyLock::new(Registry::new);

/// An error of the C layer: a message naming the export that failed.
#[derive(Debug)]
struct CallError(String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs an export's body in the panic guard ([`error::guard`]), with this layer's error.
fn run<T>(failure: T, body: impl FnOnce() -> Result<T, CallError>) -> T {
    error::guard(failure, body)
}

fn fail(call: &str, what: impl std::fmt::Display) -> CallError {
    CallError(format!("{call}: {what}"))
}

/// Environment variable choosing the pool the C API serves, read once at the first call:
/// unset or `virtual`: `cudars_mempool::default_pool()` (virtual-memory segments where the
/// device supports them; shared with Rust code in the process); `plain`: a pool of the C
/// API's own with plain `cuMemAlloc` segments.
pub const SEGMENTS_ENV_VAR: &str = "CUDA_MEMPOOL_CAPI_SEGMENTS";

/// Whether [`SEGMENTS_ENV_VAR`] asks for plain segments.
fn wants_plain() -> bool {
    static PLAIN: OnceLock<bool> = OnceLock::new();
    *PLAIN.get_or_init(|| {
        std::env::var(SEGMENTS_ENV_VAR).is_ok_and(|v| v.trim().eq_ignore_ascii_case("plain"))
    })
}

/// The C API's own pool with plain segments, created on first use (a failed creation is
/// not cached: the next call tries again).
fn plain_pool() -> Result<&'static DevicePool, PoolError> {
    static POOL: OnceLock<DevicePool> = OnceLock::new();
    static INIT: Mutex<()> = Mutex::new(());
    if let Some(p) = POOL.get() {
        return Ok(p);
    }
    let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(p) = POOL.get() {
        return Ok(p);
    }
    let backend = DriverBackend::plain().map_err(PoolError::Cuda)?;
    let pool = MemoryPool::with_config(backend, PoolConfig::from_env()?)?;
    Ok(POOL.get_or_init(|| pool))
}

/// The process-wide pool (see [`SEGMENTS_ENV_VAR`]), created on first use.
fn pool(call: &str) -> Result<&'static DevicePool, CallError> {
    let pool = if wants_plain() {
        plain_pool()
    } else {
        default_pool().map(|p| p.as_ref())
    };
    pool.map_err(|e| fail(call, e))
}

fn device_id(call: &str, device: c_int) -> Result<DeviceId, CallError> {
    u32::try_from(device)
        .map(DeviceId)
        .map_err(|_| fail(call, format!("invalid device ordinal {device}")))
}

fn to_c_ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// The out-of-memory figures of this thread's last failure, if it was one:
/// (requested, used, reserved, limit or -1).
type OomInfo = (i64, i64, i64, i64);

thread_local! {
    static LAST_OOM: Cell<Option<OomInfo>> = const { Cell::new(None) };
}

thread_local! {
    /// The lost context of this thread's last failure, if it was one: the device and the
    /// `CUresult` of the error that lost it (0 when the context was reset, not lost).
    static LAST_LOST: Cell<Option<(c_int, c_int)>> = const { Cell::new(None) };
}

/// Forgets this thread's last out-of-memory and lost-context figures (a new request: every
/// allocating export calls it first, so that they describe its own failure or none).
pub(crate) fn clear_last_failure() {
    LAST_OOM.with(|c| c.set(None));
    LAST_LOST.with(|c| c.set(None));
}

/// The failure of `call` on `device` whose context is lost: the message the frameworks show
/// (it starts like PyTorch's own CUDA errors, "CUDA error: " and the driver's text of the
/// error that lost the context), with [`cuda_mempool_last_context_lost`] set.
fn lost_failure(call: &str, device: c_int, first: Option<&cudars_core::DriverError>) -> CallError {
    LAST_LOST.with(|c| c.set(Some((device, first.map_or(0, |d| d.code as c_int)))));
    let what = match first {
        Some(d) => format!(
            "CUDA error: {} ({} ({}), first reported by {})",
            d.message, d.name, d.code, d.call
        ),
        None => "CUDA error: the device was reset".to_string(),
    };
    CallError(format!(
        "{what}: the CUDA context of device {device} is lost, and {call} hands out none of its \
         memory. Every later CUDA call of this process on the device fails; reset it \
         (Device::reset_after_fault) or restart the process"
    ))
}

/// The device an [`cudars_core::Error::ContextLost`] names, if `e` is one.
fn lost_device(e: &cudars_core::Error) -> Option<c_int> {
    match e {
        cudars_core::Error::ContextLost { device, .. } => c_int::try_from(*device).ok(),
        _ => None,
    }
}

/// `fail` for a pool error: a lost context becomes [`lost_failure`] (on the device the
/// error names, else `device`).
fn pool_failure(call: &str, device: c_int, e: PoolError) -> CallError {
    if e.is_context_lost() {
        let named = match &e {
            PoolError::Cuda(core) => lost_device(core),
            PoolError::Backend { source, .. } => source
                .downcast_ref::<cudars_core::Error>()
                .and_then(lost_device),
            _ => None,
        };
        return lost_failure(call, named.unwrap_or(device), e.driver());
    }
    fail(call, e)
}

/// `fail` for a `cuda-core` error: a lost context becomes [`lost_failure`] (on the device
/// the error names, else `device`).
fn core_failure(call: &str, device: c_int, e: cudars_core::Error) -> CallError {
    if e.is_context_lost() {
        return lost_failure(call, lost_device(&e).unwrap_or(device), e.driver());
    }
    fail(call, e)
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A `Stream` for a C stream handle of `device` (null: the legacy default stream).
///
/// # Safety
///
/// `stream` is null, an implicit handle, or a valid stream of `device` that stays valid while
/// blocks allocated on (or marked with) it are live.
unsafe fn wrap_stream(
    call: &str,
    device: DeviceId,
    stream: *mut c_void,
) -> Result<Stream, CallError> {
    // SAFETY: the caller's contract.
    unsafe { wrap_stream_as(call, device, stream, false, None) }
}

/// Whether PyTorch's capture hooks are installed ([`cuda_mempool_torch_announce_captures`]):
/// then the PyTorch entry points wrap their streams as streams whose captures are announced.
static TORCH_ANNOUNCES: AtomicBool = AtomicBool::new(false);

/// How many wrapped handles each thread remembers.
const MEMO_SLOTS: usize = 4;

thread_local! {
    /// The calling thread's last wrapped explicit handles of announced streams
    /// ([`Stream::external_announced`]): (device, handle, the `Stream`), most recent first. An
    /// entry is used again only while a block made on its stream is live, or when the driver's
    /// id of the stream the handle names now is the one the entry was made with: a handle
    /// reused by a new stream is wrapped (and checked) anew.
    static MEMO: std::cell::RefCell<Vec<(u32, usize, Stream)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The calling thread's remembered wrapper of `handle` on `device`, if any (not yet checked
/// against the stream the handle names now).
fn remembered(device: DeviceId, handle: usize) -> Option<Stream> {
    MEMO.try_with(|m| {
        m.borrow()
            .iter()
            .find(|(d, h, _)| *d == device.0 && *h == handle)
            .map(|(.., s)| s.clone())
    })
    .ok()
    .flatten()
}

/// [`wrap_stream`], with `announced` (the caller's captures of the stream are announced:
/// [`Stream::external_announced`]). For an announced explicit handle while no capture that
/// could be its stream's runs, `memo` (the calling thread's remembered wrapper, from
/// [`remembered`]) is reused when the driver's id of the stream the handle names now is the
/// one it was made with (one `cuStreamGetId`): no capture question, no device question.
///
/// # Safety
///
/// As [`wrap_stream`]; with `announced`, every capture of the stream is announced
/// ([`cuda_mempool_torch_announce_captures`]).
unsafe fn wrap_stream_as(
    call: &str,
    device: DeviceId,
    stream: *mut c_void,
    announced: bool,
    memo: Option<Stream>,
) -> Result<Stream, CallError> {
    let ordinal = device.0 as c_int;
    let dev = pool(call)?
        .backend()
        .device(device)
        .map_err(|e| core_failure(call, ordinal, e))?;
    if stream.is_null() {
        return Ok(Stream::null(&dev));
    }
    let raw = stream as CUstream;
    let handle = stream as usize;
    // The memo serves announced streams while no capture that could be theirs runs: the
    // driver's id may not be asked of a stream being captured (that invalidates the capture),
    // and whether another stream is, only a capture question would tell (the wrapper below
    // asks it first).
    let no_capture = announced
        && !cudars_core::graph::captures_in_progress()
        && !cudars_core::graph::announced_captures_in_progress();
    if let (true, Some(s)) = (no_capture, memo) {
        // SAFETY: the caller's contract: a valid explicit stream of `device` (the memo holds
        // explicit handles only), announced, so not being captured while no announced
        // capture runs.
        if unsafe { cudars_core::stream::external_uid(&dev, raw) } == Some(s.identity()) {
            return Ok(s);
        }
    }
    let s = if announced {
        // SAFETY: the caller's contract (captures announced).
        unsafe { Stream::external_announced(&dev, raw) }
    } else {
        // SAFETY: the caller's contract is wrap_stream's.
        unsafe { Stream::external(&dev, raw) }
    }
    .map_err(|e| core_failure(call, ordinal, e))?;
    if announced && s.identity_is_unique() {
        let _ = MEMO.try_with(|m| {
            let mut m = m.borrow_mut();
            m.retain(|(d, h, _)| !(*d == device.0 && *h == handle));
            m.insert(0, (device.0, handle, s.clone()));
            m.truncate(MEMO_SLOTS);
        });
    }
    Ok(s)
}

/// PyTorch's fast path: a block for the stream `memo` this thread remembers for the handle,
/// served while a block made on that stream is live, with no driver call: its owner may not
/// destroy the stream before that block is freed, and a handle names one stream at a time
/// (the caller vouches for it during this call), so the remembered stream is still this
/// handle's ([`DevicePool::malloc_stream_if_busy`], which also checks that no capture can run
/// on it). `Ok(None)` when the path does not apply: the caller takes the general one.
fn alloc_remembered(
    call: &str,
    memo: &Stream,
    size: usize,
) -> Result<Option<*mut c_void>, CallError> {
    let pool = pool(call)?;
    let Some(a) = pool
        .malloc_stream_if_busy(memo, size)
        .map_err(|e| pool_failure(call, memo.device().ordinal() as c_int, e))?
    else {
        return Ok(None);
    };
    record(call, a.into_raw(), None, memo.raw() as usize).map(Some)
}

/// Allocates from the pool on `stream` and records the block (with `hold`, the stream handle
/// the [`cupy`] module holds for it); null for size 0.
fn alloc(
    call: &str,
    stream: &Stream,
    size: u64,
    hold: Option<usize>,
) -> Result<*mut c_void, CallError> {
    clear_last_failure();
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let pool = pool(call)?;
    let size_usize =
        usize::try_from(size).map_err(|_| fail(call, format!("size {size} does not fit")))?;
    let raw = match pool.malloc_stream(stream, size_usize) {
        Ok(a) => a.into_raw(),
        Err(e) => {
            if let PoolError::OutOfMemory {
                requested,
                used,
                reserved,
                limit,
                ..
            } = &e
            {
                let info = (
                    clamp(*requested as u64),
                    clamp(*used),
                    clamp(*reserved),
                    limit.map_or(-1, clamp),
                );
                LAST_OOM.with(|c| c.set(Some(info)));
            }
            return Err(pool_failure(call, stream.device().ordinal() as c_int, e));
        }
    };
    record(call, raw, hold, stream.raw() as usize)
}

/// Records a block just served (with `hold`, the stream handle the [`cupy`] module holds for
/// it, and `handle`, the stream it was allocated on) and returns its address.
fn record(
    call: &str,
    raw: cudars_mempool::RawAllocation,
    hold: Option<usize>,
    handle: usize,
) -> Result<*mut c_void, CallError> {
    let addr = raw.ptr().0;
    if let Some(stale) = LIVE.insert_with(raw, hold, handle) {
        // The pool handed out an address the registry still holds: the pool and the
        // registry disagree. Keep the new block recorded, report, and leave the stale
        // entry's memory to the pool.
        return Err(fail(
            call,
            format!(
                "internal error: address {:#x} handed out while still recorded (stream {})",
                stale.ptr().0,
                stale.stream()
            ),
        ));
    }
    Ok(to_c_ptr(addr))
}

/// Whether `handle` (of `device`, valid for this call) names the stream a live block was
/// allocated on, whose handle was `own`: the per-thread default stream by the pool's key of
/// the calling thread's stream, any other handle by its value (the legacy stream under either
/// name). Equal values name the same stream: the block is live, so its stream has not been
/// destroyed and its handle not reused. No driver call.
fn is_own_stream(
    call: &str,
    device: DeviceId,
    handle: *mut c_void,
    own: usize,
    raw: &cudars_mempool::RawAllocation,
) -> Result<bool, CallError> {
    if handle as usize == cudars_core::stream::PER_THREAD_HANDLE {
        let pool = pool(call)?;
        let dev = pool.backend().device(device).map_err(|e| fail(call, e))?;
        let key = pool
            .backend()
            .stream_key(&Stream::per_thread(&dev))
            .map_err(|e| fail(call, e))?;
        return Ok(key == raw.stream());
    }
    let ident = |h: usize| cudars_core::stream::external_identity(h as CUstream);
    Ok(ident(handle as usize) == ident(own))
}

/// Frees the block at `ptr`. With `stream` (a device and a stream handle, valid for this
/// call), the block is first marked as used on that stream when it is not the block's own,
/// so its reuse also waits for it; a handle equal to the block's own stream is not touched
/// (no wrapper, no driver call).
fn free(
    call: &str,
    ptr: *mut c_void,
    stream: Option<(DeviceId, *mut c_void)>,
) -> Result<(), CallError> {
    if ptr.is_null() {
        return Ok(());
    }
    let addr = ptr as usize as u64;
    let (raw, hold, own_handle) = LIVE.remove_with(addr).ok_or_else(|| {
        fail(
            call,
            format!("{addr:#x} is not a live allocation of this pool (double free, or another allocator's pointer)"),
        )
    })?;
    let own = match stream {
        Some((device, handle)) => match is_own_stream(call, device, handle, own_handle, &raw) {
            Ok(own) => own,
            Err(e) => {
                LIVE.insert_with(raw, hold, own_handle);
                return Err(e);
            }
        },
        None => true,
    };
    let other = match stream {
        Some((device, handle)) if !own => {
            // SAFETY: the caller's contract: `handle` is valid during this call; the wrapper
            // (and a record_stream mark's clone of it) is dropped by the free below.
            match unsafe { wrap_stream(call, device, handle) } {
                Ok(s) => Some(s),
                Err(e) => {
                    // The block stays live (and recorded): freeing it unmarked could hand it
                    // out while the other stream still uses it.
                    LIVE.insert_with(raw, hold, own_handle);
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    let pool = pool(call)?;
    let mut marked = Ok(());
    if let Some(s) = &other {
        marked = pool.record_stream_raw(&raw, s);
        if marked.is_err() {
            // The pool refuses to mark a block with a per-thread stream other than its own
            // (the handle names the calling thread's stream, and a later fence could be
            // recorded from another thread). This thread's per-thread stream is valid here
            // and now: wait for it on the host, so the block is freed with its work done.
            // If even that fails the block stays live: freed unmarked, it could be handed
            // out while that stream still uses it.
            if s.synchronize().is_err() {
                LIVE.insert_with(raw, hold, own_handle);
                return marked.map_err(|e| fail(call, e));
            }
            marked = Ok(());
        }
    }
    pool.free_raw(raw).map_err(|e| fail(call, e))?;
    // After the free: the pool has recorded its fence on the stream, and never touches the
    // handle again once it was the stream's last block. (A failed free keeps the hold.)
    if let Some(handle) = hold {
        cupy::unhold(handle);
    }
    marked.map_err(|e| fail(call, e))
}

/// `size` bytes on `device` for use on `stream` (a `CUstream` / `cudaStream_t`; null: the
/// legacy default stream). Null with a last-error message on failure (invalid device, a
/// stream of another device, out of memory: see [`cuda_mempool_last_oom`], no driver); null
/// without one for size 0. Out of memory leaves the pool as it was. On a stream being
/// captured into a CUDA graph the block comes from the capture's private pool.
///
/// # Safety
///
/// `stream` must be null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` (the calling thread's
/// per-thread default stream: the pool keeps a cache per thread and uses that handle only
/// from its own thread), or a valid stream of `device` that stays valid until every block
/// allocated on it has been freed (the library never touches it after that).
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    const CALL: &str = "cuda_mempool_alloc";
    clear_last_failure();
    run(std::ptr::null_mut(), || {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let id = device_id(CALL, device)?;
        // SAFETY: the caller's contract is wrap_stream's.
        let s = unsafe { wrap_stream(CALL, id, stream) }?;
        alloc(CALL, &s, size as u64, None)
    })
}

/// The allocation behind `cuda_mempool_torch_alloc` (called by its C++ half, not exported in
/// the header): as [`cuda_mempool_alloc`], with the stream wrapped as one whose captures
/// PyTorch announces once [`cuda_mempool_torch_announce_captures`] was called.
///
/// # Safety
///
/// As [`cuda_mempool_alloc`].
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_torch_alloc_inner(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    const CALL: &str = "cuda_mempool_torch_alloc";
    clear_last_failure();
    run(std::ptr::null_mut(), || {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let id = device_id(CALL, device)?;
        let announced = TORCH_ANNOUNCES.load(Ordering::Acquire);
        let explicit = stream as usize > cudars_core::stream::PER_THREAD_HANDLE;
        let memo = (announced && explicit)
            .then(|| remembered(id, stream as usize))
            .flatten();
        if let Some(m) = &memo {
            clear_last_failure();
            if let Some(p) = alloc_remembered(CALL, m, size)? {
                return Ok(p);
            }
        }
        // SAFETY: the caller's contract is wrap_stream's; with `announced`, PyTorch's hooks
        // announce its captures (cuda_mempool_torch_announce_captures' contract).
        let s = unsafe { wrap_stream_as(CALL, id, stream, announced, memo) }?;
        alloc(CALL, &s, size as u64, None)
    })
}

/// PyTorch's `beginAllocateToPool` hook (`allocator._allocator.set_begin_allocate_to_pool`):
/// PyTorch calls it before it begins a graph capture (`torch.cuda.graph`, `torch.compile`'s
/// CUDA graphs). Its C++ type is `void(int, std::pair<uint64_t, uint64_t>,
/// std::function<bool(cudaStream_t)>)`: on x86-64 Linux the pool id arrives as two 64-bit
/// values and the filter as a pointer to the caller's object, which is not used (the caller
/// destroys it). Counts the capture as announced: until its end, every allocation through
/// `cuda_mempool_torch_alloc` asks the driver whether its stream is being captured.
#[no_mangle]
pub extern "C" fn cuda_mempool_torch_begin_allocate_to_pool(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
    filter: *mut c_void,
) {
    let _ = (device, pool_a, pool_b, filter);
    cudars_core::graph::announce_capture_begin();
}

/// PyTorch's `endAllocateToPool` hook (`set_end_allocate_to_pool_fn`), called after the
/// capture ended: ends the announcement of
/// [`cuda_mempool_torch_begin_allocate_to_pool`].
///
/// # Safety
///
/// Called once for each begin, after its capture ended (PyTorch's calls are). An end too many
/// would let allocations on a stream PyTorch is capturing skip the capture question.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_torch_end_allocate_to_pool(
    device: c_int,
    pool_a: u64,
    pool_b: u64,
) {
    let _ = (device, pool_a, pool_b);
    // SAFETY: the caller's contract: the end of a capture PyTorch announced, after it ended.
    unsafe { cudars_core::graph::announce_capture_end() };
}

/// PyTorch's `releasePool` hook (`set_release_pool`): nothing to do. A capture's private pool
/// is released when its graph and every executable graph made from it are destroyed, which
/// the pool learns from the graph itself.
#[no_mangle]
pub extern "C" fn cuda_mempool_torch_release_pool(device: c_int, pool_a: u64, pool_b: u64) {
    let _ = (device, pool_a, pool_b);
}

/// Declares that PyTorch announces its captures: from now on `cuda_mempool_torch_alloc` asks
/// the driver whether its stream is being captured only while an announced capture (or one
/// begun through `cuda-core`) runs, instead of at every allocation. Returns 0.
///
/// # Safety
///
/// Call it only after setting the three hooks above on the allocator PyTorch uses, while no
/// capture runs; and capture the streams PyTorch allocates on only through PyTorch's graph API
/// (`torch.cuda.graph`, `torch.cuda.CUDAGraph`, `torch.compile`), which announces them, as
/// PyTorch's own allocator requires. A capture begun directly (`cudaStreamBeginCapture` on a
/// PyTorch stream) would be served cached memory that a replay then overwrites.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_torch_announce_captures() -> c_int {
    TORCH_ANNOUNCES.store(true, Ordering::Release);
    0
}

/// Gives back a block from any allocating function of this library. Null is ignored; an
/// unknown pointer changes nothing and records a last-error message.
///
/// # Safety
///
/// `ptr` is null or a live block of this library, freed once: no work issued after this
/// call uses it (work issued before it on the block's streams is waited for by the pool),
/// and no copy of the pointer is used or freed again. (An address that is no block of this
/// library is refused, but one that is someone else's live block would free *their* block.)
/// A safe Rust program cannot call it:
///
/// ```compile_fail,E0133
/// cudars_mempool_capi::cuda_mempool_free(std::ptr::null_mut());
/// ```
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_free(ptr: *mut c_void) {
    run((), || free("cuda_mempool_free", ptr, None));
}

/// PyTorch's pluggable-allocator `free`: gives back a block. `size` is not needed. If
/// `stream` (PyTorch passes the block's own stream) is another one, the block is marked as
/// used on it first, so that no stream reuses it before the work issued to `stream` so far
/// has completed. Null is ignored. An unknown pointer changes nothing and records a
/// last-error message.
///
/// # Safety
///
/// `stream` must be null or a valid stream of `device` (it is used during this call only).
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    const CALL: &str = "cuda_mempool_torch_free";
    let _ = size;
    run((), || {
        if ptr.is_null() {
            return Ok(());
        }
        let id = device_id(CALL, device)?;
        // The stream is used during this call only (the caller's contract), and only when
        // it is not the block's own (PyTorch passes the block's own stream).
        free(CALL, ptr, Some((id, stream)))
    });
}

/// CuPy's `CFunctionAllocator` `malloc` (`void* malloc(void* param, size_t size, int
/// device_id)`), the plain route: `size` bytes on `device` for use on CuPy's current stream of
/// the calling thread, exactly as the CuPy module's allocator
/// ([`cuda_mempool_cupy_stream_malloc`]). The first call registers the CuPy module's hooks
/// when nobody has: it imports `cuda_mempool_cupy` (or runs the copy embedded in this
/// library) through the Python interpreter of the process and calls its `_plain_route`, which
/// learns CuPy's C-level current-stream lookup and registers it, with the hooks that keep a
/// stream's CuPy object alive while it has live blocks and raise CuPy's `OutOfMemoryError`.
/// `param` is not used.
///
/// On failure: with CuPy 14.1 or later (whose Cython code declares this function `except +`),
/// a Python exception is left pending (`OutOfMemoryError` for an out of memory) and a C++
/// `std::runtime_error` is thrown, which CuPy turns into that exception; with an older CuPy,
/// or when called without the GIL (through `ctypes.CDLL`: the function then takes the GIL for
/// CuPy's lookup), null with a last-error message. Without a Python interpreter, or when
/// CuPy's current stream cannot be learnt, it refuses (null, last error): it never hands out
/// memory on a stream that is not the one CuPy will use it on. Null without an error for
/// size 0.
#[no_mangle]
pub extern "C-unwind" fn cuda_mempool_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let _ = param;
    if size == 0 {
        return std::ptr::null_mut();
    }
    cupy::plain_malloc("cuda_mempool_cupy_malloc", size, device)
}

/// CuPy's `CFunctionAllocator` `free` (`void free(void* param, void* ptr, int
/// device_id)`): gives back a block from [`cuda_mempool_cupy_malloc`] or
/// [`cuda_mempool_cupy_stream_malloc`] to the stream it was allocated on (and lets go of
/// that stream's CuPy object after its last block). `param` and `device` are not needed; null is ignored; an unknown
/// pointer changes nothing and records a last-error message.
///
/// # Safety
///
/// As [`cuda_mempool_free`]: `ptr` is null or a live block of this library, freed once,
/// and not used after this call. A safe Rust program cannot call it:
///
/// ```compile_fail,E0133
/// cudars_mempool_capi::cuda_mempool_cupy_free(std::ptr::null_mut(), std::ptr::null_mut(), 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_cupy_free(
    param: *mut c_void,
    ptr: *mut c_void,
    device: c_int,
) {
    const CALL: &str = "cuda_mempool_cupy_free";
    let _ = (param, device);
    run((), || free(CALL, ptr, None));
}

/// Makes `stream` the calling thread's current stream for `device` (null: the legacy
/// null stream again), as `cuda-core`'s `Stream::make_current` does: the stream that Rust
/// code of the process allocates on by default. The CuPy entry points do not use it (they
/// allocate on CuPy's current stream). Returns 0, or -1 with a last-error message (invalid device, a
/// stream of another device, no driver).
///
/// # Safety
///
/// `stream` must be null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, or a valid stream
/// of `device` that stays alive while it is current and while the pool caches blocks
/// allocated on it.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_set_current_stream(
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    const CALL: &str = "cuda_mempool_set_current_stream";
    run(-1, || {
        let id = device_id(CALL, device)?;
        let dev = pool(CALL)?
            .backend()
            .device(id)
            .map_err(|e| fail(CALL, e))?;
        let s = if stream.is_null() {
            Stream::null(&dev)
        } else {
            // SAFETY: the caller guarantees `stream` is a valid stream of `device` (or an
            // implicit handle) that outlives its use as the current stream.
            unsafe { Stream::external(&dev, stream.cast()) }.map_err(|e| fail(CALL, e))?
        };
        s.make_current();
        Ok(0)
    })
}

/// Marks the live block at `ptr` as used on `stream` too (PyTorch's `record_stream`):
/// when it is freed, no stream reuses it before the work issued to `stream` up to the
/// free has completed. Returns 0, or -1 with a last-error message (unknown pointer, a
/// stream of another device).
///
/// # Safety
///
/// `stream` must be null or a valid stream of the block's device that stays valid until
/// the block is freed.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_record_stream(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    const CALL: &str = "cuda_mempool_record_stream";
    run(-1, || {
        let addr = ptr as usize as u64;
        let pool = pool(CALL)?;
        let marked = LIVE.with(addr, |raw| {
            // SAFETY: the caller's contract is wrap_stream's.
            let s = unsafe { wrap_stream(CALL, raw.device(), stream) }?;
            pool.record_stream_raw(raw, &s).map_err(|e| fail(CALL, e))
        });
        match marked {
            Some(r) => r.map(|()| 0),
            None => Err(fail(
                CALL,
                format!("{addr:#x} is not a live allocation of this pool"),
            )),
        }
    })
}

/// Runs `f` on the statistics of `device`, as an `int64_t` (-1 on failure).
fn stat(call: &str, device: c_int, f: impl FnOnce(&cudars_mempool::Stats) -> u64) -> i64 {
    run(-1, || {
        let id = device_id(call, device)?;
        let stats = pool(call)?.stats(id).map_err(|e| fail(call, e))?;
        i64::try_from(f(&stats)).map_err(|_| fail(call, "value does not fit in int64_t"))
    })
}

/// Bytes in live blocks on `device` (at the pool's 512-byte rounding; CuPy's
/// `used_bytes`), or -1 with a last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_used_bytes(device: c_int) -> i64 {
    stat("cuda_mempool_used_bytes", device, |s| s.used.current)
}

/// Physical bytes the pool holds on `device` (CuPy's `total_bytes`, PyTorch's
/// "reserved"), or -1 with a last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_reserved_bytes(device: c_int) -> i64 {
    stat("cuda_mempool_reserved_bytes", device, |s| {
        s.reserved.current
    })
}

/// Bytes the pool holds on `device` but not in live blocks (CuPy's `free_bytes`), or -1
/// with a last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_free_bytes(device: c_int) -> i64 {
    stat("cuda_mempool_free_bytes", device, |s| s.free_bytes())
}

/// Cached free blocks on every device (CuPy's `n_free_blocks`). Never fails once the pool
/// exists (-1 with a last-error message when it cannot be created).
#[no_mangle]
pub extern "C" fn cuda_mempool_n_free_blocks() -> i64 {
    const CALL: &str = "cuda_mempool_n_free_blocks";
    run(-1, || Ok(clamp(pool(CALL)?.n_free_blocks() as u64)))
}

/// The highest [`cuda_mempool_reserved_bytes`] of `device` so far, or -1 with a
/// last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_peak_reserved_bytes(device: c_int) -> i64 {
    stat("cuda_mempool_peak_reserved_bytes", device, |s| {
        s.reserved.peak
    })
}

/// The number of blocks handed out through this C API and not yet freed, on all
/// devices. Never fails and touches no driver.
#[no_mangle]
pub extern "C" fn cuda_mempool_live_allocations() -> i64 {
    run(-1, || {
        i64::try_from(LIVE.len()).map_err(|_| fail("cuda_mempool_live_allocations", "overflow"))
    })
}

/// Returns every cached block the pool can give back to the driver, on every device
/// (CuPy's `free_all_blocks`, PyTorch's `empty_cache`). Waits on the host for the work
/// that used the freed memory; frees that no fence can cover (lingering streams, other
/// threads' per-thread streams) are covered by one synchronisation of the device when no
/// capture the pool knows of may run. Like the frameworks' own, it must not be called during
/// a capture the pool does not know of. Returns 0, or -1 with a last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_free_all_blocks() -> c_int {
    const CALL: &str = "cuda_mempool_free_all_blocks";
    run(-1, || {
        pool(CALL)?.free_all_blocks().map_err(|e| fail(CALL, e))?;
        Ok(0)
    })
}

/// Sets a hard cap of `bytes` on the physical memory the pool holds on `device`; 0 removes
/// the cap (as CuPy's `set_limit(size=0)`). Returns 0, or -1 with a last-error message,
/// changing nothing, when live blocks already need more or the device is invalid.
#[no_mangle]
pub extern "C" fn cuda_mempool_set_limit(device: c_int, bytes: usize) -> c_int {
    const CALL: &str = "cuda_mempool_set_limit";
    run(-1, || {
        let id = device_id(CALL, device)?;
        let limit = if bytes == 0 {
            Limit::Unlimited
        } else {
            Limit::Bytes(bytes)
        };
        pool(CALL)?
            .set_limit(id, limit)
            .map_err(|e: PoolError| fail(CALL, e))?;
        Ok(0)
    })
}

/// The cap set on `device` in bytes, 0 when there is none, or -1 with a last-error
/// message.
#[no_mangle]
pub extern "C" fn cuda_mempool_get_limit(device: c_int) -> i64 {
    const CALL: &str = "cuda_mempool_get_limit";
    run(-1, || {
        let id = device_id(CALL, device)?;
        let limit = pool(CALL)?.get_limit(id).map_err(|e| fail(CALL, e))?;
        i64::try_from(limit.unwrap_or(0)).map_err(|_| fail(CALL, "limit does not fit in int64_t"))
    })
}

/// Starts recording the pool's memory history (PyTorch's `_record_memory_history`): what
/// the pool holds now, then every malloc, free, segment, page, fence, limit change and
/// out-of-memory failure, keeping the newest `max_events` (at least one; 0 means 1,000,000).
/// A recording already on is replaced (its events are dropped). Returns 0, or -1 with a
/// last-error message when the pool cannot be created.
#[no_mangle]
pub extern "C" fn cuda_mempool_history_start(max_events: usize) -> c_int {
    history_start("cuda_mempool_history_start", max_events, false)
}

/// Starts a recording of `max_events` (0: 1,000,000), with call stacks or not.
fn history_start(call: &str, max_events: usize, backtraces: bool) -> c_int {
    run(-1, || {
        let capacity = if max_events == 0 {
            1_000_000
        } else {
            max_events
        };
        let recorder = Recorder::new(capacity, Clock::Real).with_backtraces(backtraces);
        pool(call)?.start_history(Arc::new(recorder));
        Ok(0)
    })
}

/// [`cuda_mempool_history_start`], capturing the native call stack of each allocation and
/// out-of-memory failure too (the report's call sites and the snapshot's `frames` then name
/// the caller's functions: the framework's C++ or the interpreter's, not Python lines). A
/// capture costs microseconds per allocation, and resolving the frames at the dump much more
/// (once per stack): for finding where memory goes, not for timing.
#[no_mangle]
pub extern "C" fn cuda_mempool_history_start_backtraces(max_events: usize) -> c_int {
    history_start("cuda_mempool_history_start_backtraces", max_events, true)
}

/// Stops the recording, keeping its events for [`cuda_mempool_history_dump`]. Returns 0
/// (also when none was on), or -1 with a last-error message.
#[no_mangle]
pub extern "C" fn cuda_mempool_history_stop() -> c_int {
    const CALL: &str = "cuda_mempool_history_stop";
    run(-1, || {
        if let Some(r) = pool(CALL)?.stop_history() {
            *STOPPED.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
        }
        Ok(0)
    })
}

/// Writes the recording (on, or the last one stopped) to the file `path` (any bytes, NUL
/// terminated): `format` 0 is the self-contained HTML report, 1 PyTorch's memory snapshot
/// pickle (what `torch.cuda.memory._dump_snapshot` writes; open it at
/// pytorch.org/memory_viz or with `python -m torch.cuda._memory_viz`). The file is written
/// to a new temporary file beside it and renamed, so a reader never sees half of it.
/// The segments and live blocks are the pool's at the time of the dump; the timeline holds
/// the newest `max_events` events. Returns 0, or -1 with a last-error message (no
/// recording, a bad format or path, an I/O error).
///
/// # Safety
///
/// `path` is null (refused) or points to a NUL-terminated string that stays valid for the
/// call.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_history_dump(path: *const c_char, format: c_int) -> c_int {
    const CALL: &str = "cuda_mempool_history_dump";
    run(-1, || {
        if path.is_null() {
            return Err(fail(CALL, "path is null"));
        }
        // SAFETY: the caller's contract: a NUL-terminated string valid for the call.
        let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
        // Any bytes the file system takes (Python passes `os.fsencode(path)`).
        let path = std::path::Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes),
        );
        if format != 0 && format != 1 {
            return Err(fail(
                CALL,
                format!("format {format}: 0 (HTML) or 1 (PyTorch pickle)"),
            ));
        }
        let recorder = match pool(CALL)?.history_recorder() {
            Some(r) => r,
            None => STOPPED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .ok_or_else(|| {
                    fail(
                        CALL,
                        "no history recorded: call cuda_mempool_history_start first",
                    )
                })?,
        };
        let history = recorder.history();
        // The segments and blocks from the pool itself: a ring that dropped its oldest
        // events no longer holds what the pool had when it started.
        let snapshot = pool(CALL)?.snapshot();
        // The pickle is streamed to the file, event by event (a million events would
        // otherwise be a gigabyte in memory); the report is one page.
        write_new_then_rename(path, |f| match format {
            0 => std::io::Write::write_all(
                f,
                history::report::html(&history, &snapshot, &Default::default()).as_bytes(),
            ),
            _ => history::torch::write_torch_snapshot(&history, &snapshot, f),
        })
        .map_err(|e| fail(CALL, format!("{}: {e}", path.display())))?;
        Ok(0)
    })
}

/// Writes a new file beside `path` with `write` (created exclusively: never an existing file
/// or a link someone placed there; buffered), then renames it to `path`.
fn write_new_then_rename(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{serial}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            write(&mut w)?;
            w.into_inner()
                .map_err(std::io::IntoInnerError::into_error)?
                .sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The recorder of the last [`cuda_mempool_history_stop`].
static STOPPED: Mutex<Option<Arc<Recorder>>> = Mutex::new(None);

/// The message of the most recent failure of this API on the calling thread, or null
/// when there has been none (or since [`cuda_mempool_clear_error`]). The string stays
/// valid until the next failure on this thread or the next
/// [`cuda_mempool_clear_error`]; successful calls leave it unchanged.
#[no_mangle]
pub extern "C" fn cuda_mempool_last_error() -> *const c_char {
    run(std::ptr::null(), || Ok(error::last_error_ptr()))
}

/// Whether this thread's most recent failed allocation ran out of memory: 1, and the four
/// figures written where the pointers are not null (the size asked for, bytes in live
/// blocks, bytes the pool holds, the limit or -1), else 0. For a Python wrapper that raises
/// its framework's out-of-memory error with the pool's numbers.
///
/// # Safety
///
/// Each pointer is null or valid for writing one `int64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_last_oom(
    requested: *mut i64,
    used: *mut i64,
    reserved: *mut i64,
    limit: *mut i64,
) -> c_int {
    run(0, || {
        let Some((r, u, res, l)) = LAST_OOM.with(Cell::get) else {
            return Ok::<c_int, CallError>(0);
        };
        for (p, v) in [(requested, r), (used, u), (reserved, res), (limit, l)] {
            if !p.is_null() {
                // SAFETY: the caller's contract: non-null pointers are writable.
                unsafe { p.write(v) };
            }
        }
        Ok(1)
    })
}

/// If the calling thread's most recent failure was an allocation on a device whose CUDA
/// context is lost (a kernel faulted: an illegal address, a trap, an uncorrectable ECC
/// error; whoever saw it first, this library or the framework), returns 1 and stores the
/// device and the `CUresult` of the error that lost the context (0 when it was reset
/// instead); otherwise returns 0 and stores nothing. The pool hands out no memory of a lost
/// context. The PyTorch entry point throws, and the CuPy module raises, their framework's
/// CUDA error with the message of [`cuda_mempool_last_error`].
///
/// # Safety
///
/// Each pointer is null or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_last_context_lost(
    device: *mut c_int,
    code: *mut c_int,
) -> c_int {
    run(0, || {
        let Some((d, c)) = LAST_LOST.with(Cell::get) else {
            return Ok::<c_int, CallError>(0);
        };
        for (p, v) in [(device, d), (code, c)] {
            if !p.is_null() {
                // SAFETY: the caller's contract: non-null pointers are writable.
                unsafe { p.write(v) };
            }
        }
        Ok(1)
    })
}

/// Forgets the calling thread's last error, so that [`cuda_mempool_last_error`] returns
/// null until the next failure.
#[no_mangle]
pub extern "C" fn cuda_mempool_clear_error() {
    run((), || {
        error::clear_last_error();
        clear_last_failure();
        Ok::<(), CallError>(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{clear_last_error, last_error_message};

    /// Failures that are decided before the pool is reached need no driver.
    #[test]
    fn bad_input_fails_before_touching_the_driver() {
        clear_last_error();
        // SAFETY: a null stream is the legacy default stream.
        assert!(unsafe { cuda_mempool_alloc(64, -1, std::ptr::null_mut()) }.is_null());
        let msg = last_error_message().unwrap_or_default();
        assert!(
            msg.contains("cuda_mempool_alloc") && msg.contains("invalid device ordinal -1"),
            "{msg}"
        );
        assert_eq!(cuda_mempool_used_bytes(-3), -1);
        assert!(last_error_message().unwrap_or_default().contains("-3"));
        assert_eq!(cuda_mempool_set_limit(-1, 10), -1);
        // SAFETY: null out-pointers are allowed.
        let oom = unsafe {
            cuda_mempool_last_oom(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(oom, 0, "a bad device is not an out-of-memory");
    }

    #[test]
    fn a_lost_context_is_reported_for_its_own_failure_only() {
        let first = cudars_core::DriverError {
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS",
            message: "an illegal memory access was encountered",
            call: "cuStreamQuery",
        };
        let lost = cudars_core::Error::ContextLost {
            device: 1,
            first: Some(Box::new(first)),
        };
        // The device the error names wins over the caller's.
        let e = pool_failure("cuda_mempool_alloc", 0, PoolError::Cuda(lost));
        assert!(
            e.0.starts_with("CUDA error: an illegal memory access was encountered"),
            "{}",
            e.0
        );
        assert!(e.0.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && e.0.contains("device 1"));
        let (mut d, mut c) = (-1, -1);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { cuda_mempool_last_context_lost(&mut d, &mut c) }, 1);
        assert_eq!((d, c), (1, 700));
        // A later failure of another kind (a bad device, decided before the pool) is not
        // reported as a lost context.
        // SAFETY: a null stream is the legacy default stream.
        assert!(unsafe { cuda_mempool_alloc(64, -1, std::ptr::null_mut()) }.is_null());
        // SAFETY: null out-pointers are allowed.
        let again =
            unsafe { cuda_mempool_last_context_lost(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(again, 0);
        // Nor is any error that is not a lost context.
        let oom = cudars_core::DriverError {
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            message: "out of memory",
            call: "cuMemCreate",
        };
        let e = core_failure("x", 0, cudars_core::Error::Driver(oom));
        assert!(!e.0.starts_with("CUDA error"));
        // SAFETY: null out-pointers are allowed.
        let none =
            unsafe { cuda_mempool_last_context_lost(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(none, 0);
    }

    #[test]
    fn size_zero_and_null_are_no_ops_without_an_error() {
        clear_last_error();
        assert!(cuda_mempool_cupy_malloc(std::ptr::null_mut(), 0, 0).is_null());
        // SAFETY: null is allowed.
        unsafe { cuda_mempool_free(std::ptr::null_mut()) };
        // SAFETY: null pointer and null stream.
        unsafe { cuda_mempool_torch_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut()) };
        // SAFETY: null is allowed.
        unsafe { cuda_mempool_cupy_free(std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        assert_eq!(last_error_message(), None);
        assert!(cuda_mempool_last_error().is_null());
    }

    /// The plain route needs CuPy's current stream: in a process without a Python
    /// interpreter (this test binary) it refuses, before touching the pool or the driver.
    #[test]
    fn the_plain_cupy_route_refuses_without_python() {
        clear_last_error();
        let live = cuda_mempool_live_allocations();
        assert!(cuda_mempool_cupy_malloc(std::ptr::null_mut(), 4096, 0).is_null());
        let msg = last_error_message().unwrap_or_default();
        assert!(
            msg.contains("cuda_mempool_cupy_malloc") && msg.contains("no Python interpreter"),
            "{msg}"
        );
        assert_eq!(cuda_mempool_live_allocations(), live);
    }

    #[test]
    fn freeing_an_unknown_pointer_is_reported_and_changes_nothing() {
        clear_last_error();
        let before = cuda_mempool_live_allocations();
        // SAFETY: an address that is no block at all (the process has no live allocation
        // there): refused, nothing freed.
        unsafe { cuda_mempool_cupy_free(std::ptr::null_mut(), 0xdead_0000 as *mut c_void, 0) };
        let msg = last_error_message().unwrap_or_default();
        assert!(
            msg.contains("0xdead0000") && msg.contains("not a live allocation"),
            "{msg}"
        );
        clear_last_error();
        // SAFETY: as above, an address that is no block: refused, nothing freed.
        unsafe { cuda_mempool_free(0xbeef_0200 as *mut c_void) };
        assert!(last_error_message()
            .unwrap_or_default()
            .contains("0xbeef0200"));
        // SAFETY: the pointer is only looked up; the null stream is never used here.
        let r =
            unsafe { cuda_mempool_record_stream(0xbeef_0200 as *mut c_void, std::ptr::null_mut()) };
        assert_eq!(r, -1);
        assert_eq!(cuda_mempool_live_allocations(), before);
        cuda_mempool_clear_error();
        assert!(cuda_mempool_last_error().is_null());
    }
}
