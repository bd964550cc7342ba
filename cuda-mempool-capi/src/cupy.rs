//! CuPy's `CFunctionAllocator` on CuPy's own current stream, with the stream kept alive in C.
//!
//! CuPy calls a `CFunctionAllocator`'s functions as `void* malloc(void* param, size_t size, int
//! device_id)` and `void free(void* param, void* ptr, int device_id)`, with the GIL held and
//! no stream. [`cuda_mempool_cupy_stream_malloc`] learns the stream by calling back into CuPy
//! through a function pointer the Python module registers with
//! [`cuda_mempool_cupy_set_stream_hooks`]: CuPy's C-level `get_stream_ptr(device)` (exported by
//! `cupy_backends.cuda.stream` in its `__pyx_capi__`; CuPy 14) or `get_current_stream_ptr()`
//! (`cupy.cuda.stream`), a thread-local read with no CUDA call. So one allocation is one C
//! call from CuPy's Cython code, with no Python frame of ours.
//!
//! # Failures as Python exceptions
//!
//! CuPy (from 14.1) declares its allocator's `malloc` type `except +`: its Cython code catches
//! a C++ exception thrown by `malloc`, and then raises the Python exception that is pending,
//! or translates the C++ one. (A pending Python exception alone, without a throw, is not
//! noticed: CuPy 14.2 returns the memory object and Python reports a `SystemError`.) With
//! the optional `make_error` and `set_error` hooks registered, a failed allocation asks
//! `make_error` for the exception to raise (the module builds CuPy's `OutOfMemoryError` with
//! the pool's numbers, from [`crate::cuda_mempool_last_oom`]), sets it with `set_error`
//! (Python's `PyErr_SetObject`) and throws `std::runtime_error` (`src/cupy_error.cpp`).
//! Without them, a failure returns null only, and the caller must check the pointer.
//!
//! # The stream rule, per stream instead of per block
//!
//! The library uses a stream handle until the last block allocated on it is freed (see the
//! crate documentation), so the CuPy `Stream` object must live that long. This module counts
//! the live blocks of this path per stream handle. When a stream's count leaves zero it calls
//! the `hold` hook (the Python module keeps a reference to CuPy's current `Stream` object in
//! a dictionary); when the count returns to zero, after the pool has recorded its fence on the
//! stream, it calls the `release` hook (the module drops that reference, and CuPy may then
//! destroy the stream). The implicit streams (null, `cudaStreamLegacy`,
//! `cudaStreamPerThread`) live for the whole process and are never held.
//!
//! While a stream has live blocks, its validated [`Stream`] wrapper is kept here too, so later
//! allocations on it make no driver call to check the handle (the handle cannot be destroyed
//! meanwhile, by the rule above).
//!
//! Hooks are never called with a lock of this module held: they run Python code, which may
//! let another thread take the GIL, and that thread may be waiting for the same lock. The
//! hooks count holds (a hold that turns out to be a second one for a stream is released at
//! once), so the order in which two threads' hooks run does not matter.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};

use cudars_core::Stream;

use crate::{alloc, device_id, fail, run, wrap_stream, CallError};

/// CuPy's `get_current_stream_ptr` (C signature `intptr_t (void)`): the calling thread's
/// current CuPy stream handle for the current device; -1 with a Python exception set on
/// failure. Needs the GIL.
pub type CurrentStreamFn = unsafe extern "C" fn() -> isize;

/// CuPy's `get_stream_ptr` (C signature `intptr_t (int)`): the calling thread's current CuPy
/// stream handle for `device`; -1 with a Python exception set on failure. Needs the GIL.
pub type DeviceStreamFn = unsafe extern "C" fn(device: c_int) -> isize;

/// Keeps the caller's current stream object for `device` alive (its handle is `stream`);
/// returns 0 on success. Called with the GIL held, on the allocating thread.
pub type HoldStreamFn = unsafe extern "C" fn(device: c_int, stream: *mut c_void) -> c_int;

/// Lets go of one hold taken by [`HoldStreamFn`] for `stream`. Called with the GIL held.
pub type ReleaseStreamFn = unsafe extern "C" fn(stream: *mut c_void);

/// Builds the exception for the calling thread's failed allocation of `size` bytes on
/// `device` and writes its type and value (`PyObject*`, kept alive by the hook) to `out[0]`
/// and `out[1]`; returns 0 on success.
pub type MakeErrorFn = unsafe extern "C" fn(size: usize, device: c_int, out: *mut isize) -> c_int;

/// Sets the calling thread's Python exception (`PyErr_SetObject(type, value)`).
pub type SetErrorFn = unsafe extern "C" fn(kind: *mut c_void, value: *mut c_void);

/// Releases one reference to a Python object (`Py_DecRef`). See
/// [`cuda_mempool_cupy_set_error_release`].
pub type DecRefFn = unsafe extern "C" fn(object: *mut c_void);

/// The registered [`DecRefFn`] as an address (0: none).
static ERROR_RELEASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Registers `decref` (Python's `Py_DecRef`), or unregisters it (null). While one is
/// registered, the `make_error` hook of [`cuda_mempool_cupy_set_stream_hooks`] hands over
/// *owned* references to the type and value it writes, and the library releases both with
/// `decref` once `set_error` has set the exception (which takes references of its own).
/// Nothing then keeps a raised exception, and with it its traceback and the arrays of its
/// frames, alive after the caller has handled it. Without one the objects are the hook's to
/// keep alive. Returns 0.
///
/// # Safety
///
/// `decref` stays callable for the rest of the process and is called with the GIL held, on
/// the allocating thread, right after `set_error`; `make_error` must hand over owned
/// references from the moment this is registered.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_cupy_set_error_release(decref: Option<DecRefFn>) -> c_int {
    ERROR_RELEASE.store(decref.map_or(0, |f| f as usize), Ordering::Release);
    0
}

/// The registered [`DecRefFn`], if any.
fn error_release() -> Option<DecRefFn> {
    let f = ERROR_RELEASE.load(Ordering::Acquire);
    // SAFETY: a non-zero value was stored from a `DecRefFn` by the function above.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, DecRefFn>(f) })
}

/// How the current stream is learnt.
#[derive(Clone, Copy)]
enum Lookup {
    Current(CurrentStreamFn),
    ForDevice(DeviceStreamFn),
}

/// The registered callbacks.
#[derive(Clone, Copy)]
pub(crate) struct Hooks {
    lookup: Lookup,
    hold: HoldStreamFn,
    release: Option<ReleaseStreamFn>,
    error: Option<(MakeErrorFn, SetErrorFn)>,
}

/// The registered hooks: null, or a leaked `Box<Hooks>` (never freed: another thread may be
/// reading an older value while a new one is stored; a few words a registration).
static HOOKS: AtomicPtr<Hooks> = AtomicPtr::new(std::ptr::null_mut());

pub(crate) fn hooks() -> Option<Hooks> {
    let p = HOOKS.load(Ordering::Acquire);
    // SAFETY: a non-null value is a leaked box, never freed, written before it was stored.
    (!p.is_null()).then(|| unsafe { *p })
}

/// A held stream: its live blocks on this path and its validated wrapper.
struct Held {
    blocks: u64,
    stream: Stream,
}

/// Streams with live blocks of this path, by handle.
static HELD: LazyLock<Mutex<HashMap<usize, Held>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn held() -> std::sync::MutexGuard<'static, HashMap<usize, Held>> {
    // Only map operations run under the lock: a poisoned lock still guards a consistent map.
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The implicit handles (null, `CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2) name
/// streams that live as long as the context: they are never held.
fn is_implicit(handle: usize) -> bool {
    handle <= 2
}

/// Counts one more block on `handle`: returns the stream's wrapper, taking a hold on it
/// through the hook first when the stream had no live block of this path.
fn acquire(call: &str, hooks: &Hooks, device: c_int, handle: usize) -> Result<Stream, CallError> {
    if let Some(h) = held().get_mut(&handle) {
        h.blocks += 1;
        return Ok(h.stream.clone());
    }
    let id = device_id(call, device)?;
    // SAFETY: `handle` is CuPy's current stream of this thread, alive during this call (its
    // Stream object is the thread's current one); it is held below before the block is
    // handed out, so it stays valid while blocks allocated on it are live.
    let stream = unsafe { wrap_stream(call, id, handle as *mut c_void) }?;
    // SAFETY: the hook's registration contract (cuda_mempool_cupy_set_stream_hooks); this
    // thread holds the GIL (CuPy calls its allocator with it); no lock of ours is held.
    if unsafe { (hooks.hold)(device, handle as *mut c_void) } != 0 {
        return Err(fail(
            call,
            format!("could not keep CuPy's stream {handle:#x} alive (the hold hook failed)"),
        ));
    }
    let extra = {
        let mut map = held();
        let h = map.entry(handle).or_insert(Held {
            blocks: 0,
            stream: stream.clone(),
        });
        h.blocks += 1;
        h.blocks > 1
    };
    if extra {
        // Another thread took the stream's hold meanwhile: this one is one too many.
        if let Some(release) = hooks.release {
            // SAFETY: as for hold above.
            unsafe { release(handle as *mut c_void) };
        }
    }
    Ok(stream)
}

/// One block fewer on `handle`; after the last, the hold is released through the hook.
pub(crate) fn unhold(handle: usize) {
    let last = {
        let mut map = held();
        match map.get_mut(&handle) {
            Some(h) if h.blocks > 1 => {
                h.blocks -= 1;
                false
            }
            Some(_) => {
                map.remove(&handle);
                true
            }
            None => false,
        }
    };
    if last {
        if let Some(release) = hooks().and_then(|h| h.release) {
            // SAFETY: the hook's registration contract; frees of this path come from CuPy's
            // memory objects being deallocated, with the GIL held; no lock of ours is held.
            unsafe { release(handle as *mut c_void) };
        }
    }
}

/// Registers CuPy's stream lookup and the hooks used by [`cuda_mempool_cupy_stream_malloc`]:
/// `device_stream` (preferred) or `current_stream` learns CuPy's current stream, `hold` and
/// `release` keep a stream object alive while it has live blocks of this path, and the
/// optional pair `make_error`/`set_error` turns a failed allocation into a pending Python
/// exception (see the module documentation). With neither lookup function, the hooks are
/// unregistered (that allocator then fails). `release` may be null: holds are then never
/// released (for interpreter exit, where the streams may as well outlive the process's last
/// frees). Returns 0, or -1 when a lookup is given without `hold`, or only one of
/// `make_error` and `set_error` is given.
///
/// # Safety
///
/// The functions stay callable for the rest of the process. They are called on the thread
/// that calls [`cuda_mempool_cupy_stream_malloc`] or frees a block of it, with whatever they
/// need held by that thread (for CuPy's and Python's functions: the GIL, which CuPy holds
/// when it calls its allocator). `set_error` receives the two pointers `make_error` wrote.
#[no_mangle]
pub unsafe extern "C" fn cuda_mempool_cupy_set_stream_hooks(
    current_stream: Option<CurrentStreamFn>,
    device_stream: Option<DeviceStreamFn>,
    hold: Option<HoldStreamFn>,
    release: Option<ReleaseStreamFn>,
    make_error: Option<MakeErrorFn>,
    set_error: Option<SetErrorFn>,
) -> c_int {
    const CALL: &str = "cuda_mempool_cupy_set_stream_hooks";
    run(-1, || {
        let lookup = match (device_stream, current_stream) {
            (Some(f), _) => Lookup::ForDevice(f),
            (None, Some(f)) => Lookup::Current(f),
            (None, None) => {
                HOOKS.store(std::ptr::null_mut(), Ordering::Release);
                return Ok(0);
            }
        };
        let hold = hold.ok_or_else(|| fail(CALL, "a stream lookup needs a hold hook"))?;
        let error = match (make_error, set_error) {
            (Some(m), Some(s)) => Some((m, s)),
            (None, None) => None,
            _ => return Err(fail(CALL, "make_error and set_error go together")),
        };
        let new = Box::into_raw(Box::new(Hooks {
            lookup,
            hold,
            release,
            error,
        }));
        HOOKS.store(new, Ordering::Release);
        Ok(0)
    })
}

/// CuPy's `CFunctionAllocator` `malloc`: `size` bytes on `device` for use on CuPy's current
/// stream of the calling thread, learnt through the registered hooks (see the module
/// documentation). `param` is not used. Free with [`crate::cuda_mempool_cupy_free`].
///
/// Returns null with a last-error message on failure (hooks not registered, CuPy's stream
/// lookup failed, out of memory: see [`crate::cuda_mempool_last_oom`]); null without one for
/// size 0. With the error hooks registered, a failure instead leaves a Python exception
/// pending and throws a C++ `std::runtime_error` (hence `"C-unwind"`): CuPy 14.1 and later
/// declare their allocator's `malloc` `except +`, and Cython then raises the pending Python
/// exception (or, with none, a `RuntimeError` carrying the message).
#[no_mangle]
pub extern "C-unwind" fn cuda_mempool_cupy_stream_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    const CALL: &str = "cuda_mempool_cupy_stream_malloc";
    let _ = param;
    if size == 0 {
        return std::ptr::null_mut();
    }
    let hooks = hooks();
    match stream_malloc(CALL, hooks.as_ref(), size, device) {
        Ok(ptr) => ptr,
        Err(cupy_failed) => match hooks.and_then(|h| h.error) {
            Some(error) => raise(error, size, device, cupy_failed),
            None => std::ptr::null_mut(),
        },
    }
}

/// One allocation on CuPy's current stream through `hooks`; on failure (last error recorded)
/// `Err(true)` when CuPy's own lookup failed (its Python exception is then pending).
pub(crate) fn stream_malloc(
    call: &str,
    hooks: Option<&Hooks>,
    size: usize,
    device: c_int,
) -> Result<*mut c_void, bool> {
    crate::clear_last_failure();
    // Whether CuPy's lookup failed: its Python exception is then already pending.
    let mut cupy_failed = false;
    let ptr = run(std::ptr::null_mut(), || {
        let hooks = hooks.ok_or_else(|| {
            fail(
                call,
                "no stream hooks registered (cuda_mempool_cupy_set_stream_hooks)",
            )
        })?;
        // SAFETY: the registration contract: callable on this thread, which holds the GIL.
        let handle = unsafe {
            match hooks.lookup {
                Lookup::ForDevice(f) => f(device),
                Lookup::Current(f) => f(),
            }
        };
        if handle == -1 {
            cupy_failed = true;
            return Err(fail(
                call,
                "CuPy's current-stream lookup failed (its Python exception is pending)",
            ));
        }
        let handle = handle as usize;
        if is_implicit(handle) {
            let id = device_id(call, device)?;
            // SAFETY: an implicit handle (null, legacy, per-thread: the pool keeps a cache
            // per thread for the last and uses its handle only from its own thread).
            let stream = unsafe { wrap_stream(call, id, handle as *mut c_void) }?;
            return alloc(call, &stream, size as u64, None);
        }
        let stream = acquire(call, hooks, device, handle)?;
        let ptr = alloc(call, &stream, size as u64, Some(handle));
        if ptr.is_err() {
            unhold(handle);
        }
        ptr
    });
    if ptr.is_null() {
        Err(cupy_failed)
    } else {
        Ok(ptr)
    }
}

/// Raises the calling thread's failed allocation as a Python exception (unless CuPy's lookup
/// already left one pending) and throws the C++ exception that makes CuPy's Cython code
/// raise it.
fn raise(error: (MakeErrorFn, SetErrorFn), size: usize, device: c_int, cupy_failed: bool) -> ! {
    let (make_error, set_error) = error;
    if !cupy_failed {
        let mut out = [0isize; 2];
        let release = error_release();
        // SAFETY: the registration contract; `out` has the two slots the hook writes; no lock
        // of ours is held; the last error and out-of-memory figures are recorded.
        let made = unsafe { make_error(size, device, out.as_mut_ptr()) };
        if made == 0 && out[0] != 0 && out[1] != 0 {
            // SAFETY: the two objects make_error produced (owned or kept alive).
            unsafe { set_error(out[0] as *mut c_void, out[1] as *mut c_void) };
        }
        if let (0, Some(decref)) = (made, release) {
            for object in out.into_iter().filter(|&o| o != 0) {
                // SAFETY: with a release function registered, make_error handed over one
                // owned reference per object it wrote; set_error took its own.
                unsafe { decref(object as *mut c_void) };
            }
        }
    }
    // Nothing of this frame needs dropping. The C++ exception tells CuPy's Cython code
    // (`except +`) to raise: the pending Python exception if there is one, else a
    // RuntimeError with the last-error message.
    // SAFETY: the registration contract of the error hooks: the caller catches C++
    // exceptions; the message is the thread's last error (or null), copied by C++.
    unsafe { cuda_mempool_throw_runtime_error(crate::error::last_error_ptr()) }
}

/// Which thread runs the plain route's one-time setup now, if any (see [`ensure_registered`]).
static SETUP: std::sync::Mutex<Option<std::thread::ThreadId>> = std::sync::Mutex::new(None);

/// Makes sure the CuPy module's hooks are registered, running the setup
/// ([`python::register_hooks`]) on this thread when nobody has: one thread at a time. The
/// setup runs Python code, which lets other threads run; one that allocates meanwhile waits,
/// with the GIL released, until the setup has finished, rather than run a second setup beside
/// it (which found the module half executed, failed, and handed CuPy a null pointer that
/// CuPy took for memory at address 0: an illegal address on the GPU, seen with 8 threads
/// making their first allocations at once). An allocation made by the setup itself, on this
/// thread, is refused. Needs the GIL; `Err` as [`python::register_hooks`].
fn ensure_registered(py: &python::Api, call: &str) -> Result<(), bool> {
    let me = std::thread::current().id();
    let waited = std::time::Instant::now();
    loop {
        if hooks().is_some() {
            return Ok(());
        }
        let busy = {
            let mut s = SETUP
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let busy = *s;
            if busy.is_none() {
                *s = Some(me);
            }
            busy
        };
        match busy {
            None => {
                let done = python::register_hooks(py, call);
                *SETUP
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                return done;
            }
            Some(t) if t == me => {
                return run(Err(false), || {
                    Err(fail(
                        call,
                        "an allocation during the plain route's own setup (the CuPy module \
                         allocated while it was being imported)",
                    ))
                });
            }
            Some(_) => {
                if waited.elapsed() > SETUP_WAIT {
                    return run(Err(false), || {
                        Err(fail(
                            call,
                            format!(
                                "the plain route's setup on another thread has not finished \
                                 in {} s",
                                SETUP_WAIT.as_secs()
                            ),
                        ))
                    });
                }
                python::wait_without_gil(py)
            }
        }
    }
}

/// How long an allocation waits for another thread's setup of the plain route (an import
/// that takes longer is stuck: the allocation fails rather than hang with it).
const SETUP_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The plain route's allocation ([`crate::cuda_mempool_cupy_malloc`]): as
/// [`cuda_mempool_cupy_stream_malloc`], first registering the hooks through the CuPy module
/// when nobody has (see [`python`]). Called without the GIL (through `ctypes.CDLL`, say), it
/// takes the GIL for CuPy's lookup and never throws: a failure is null, with the last error.
pub(crate) fn plain_malloc(call: &str, size: usize, device: c_int) -> *mut c_void {
    crate::clear_last_failure();
    let Some(py) = python::api() else {
        return run(std::ptr::null_mut(), || {
            Err(fail(
                call,
                "CuPy's current stream cannot be learnt: no Python interpreter in this process \
                 (this function is CuPy's CFunctionAllocator malloc; C code allocates with \
                 cuda_mempool_alloc on its stream)",
            ))
        });
    };
    // SAFETY: Python is initialised (python::api checked it); the GIL state functions may be
    // called from any thread.
    let caller_holds_gil = unsafe { (py.gil_check)() } == 1;
    // SAFETY: as above; released below, on every path that returns (none throws while held).
    let gil = (!caller_holds_gil).then(|| unsafe { (py.gil_ensure)() });
    let mut result = Ok(std::ptr::null_mut());
    let registered = match ensure_registered(py, call) {
        Ok(()) => true,
        Err(pending) => {
            result = Err(pending);
            false
        }
    };
    let hooks = hooks();
    if registered {
        result = stream_malloc(call, hooks.as_ref(), size, device);
    }
    match (result, gil) {
        (Ok(ptr), None) => ptr,
        (Ok(ptr), Some(state)) => {
            // SAFETY: the state from gil_ensure above, on this thread.
            unsafe { (py.gil_release)(state) };
            ptr
        }
        // CuPy called (the GIL held): raise as the stream route does. A pending Python
        // exception (CuPy's lookup failed, or the setup raised) is raised as it is.
        (Err(pending), None) => match hooks {
            Some(h) => match h.error {
                Some(error) => raise(error, size, device, pending),
                // An older CuPy, which would not catch a C++ exception: null, with a Python
                // exception pending (CuPy's own, or one with the message).
                None => {
                    if !pending {
                        python::set_runtime_error(py);
                    }
                    std::ptr::null_mut()
                }
            },
            // The module's setup raised, which it does only when CuPy catches C++ exceptions.
            None if pending => python::throw_pending(py),
            // No hooks, no exception pending: a CuPy that catches C++ exceptions gets one
            // (Cython raises a RuntimeError with the message), never a null pointer, which it
            // would take for memory at address 0.
            None if python::cupy_catches(py) => python::throw_pending(py),
            None => {
                python::set_runtime_error(py);
                std::ptr::null_mut()
            }
        },
        (Err(pending), Some(state)) => {
            if pending {
                // Nobody here can receive it: the message is in the last error.
                // SAFETY: this thread holds the GIL (gil_ensure above).
                unsafe { (py.err_clear)() };
            }
            // SAFETY: the state from gil_ensure above, on this thread.
            unsafe { (py.gil_release)(state) };
            std::ptr::null_mut()
        }
    }
}

/// The Python C API, found at run time in the process (the plain route needs CuPy's
/// current stream, and only the CuPy module can register the lookup; the library does not link
/// against Python, so it loads and works in processes without one).
pub(crate) mod python {
    use std::ffi::{c_char, c_int, c_long, c_ulonglong, c_void};
    use std::sync::OnceLock;

    use crate::{fail, CallError};

    /// `PyObject*`.
    type Obj = *mut c_void;

    /// The functions the plain route's setup calls (all in CPython's stable ABI).
    pub(crate) struct Api {
        initialized: unsafe extern "C" fn() -> c_int,
        pub(crate) gil_check: unsafe extern "C" fn() -> c_int,
        pub(crate) gil_ensure: unsafe extern "C" fn() -> c_int,
        pub(crate) gil_release: unsafe extern "C" fn(c_int),
        pub(crate) err_clear: unsafe extern "C" fn(),
        err_occurred: unsafe extern "C" fn() -> Obj,
        import: unsafe extern "C" fn(*const c_char) -> Obj,
        compile: unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> Obj,
        exec_module: unsafe extern "C" fn(*const c_char, Obj, *const c_char) -> Obj,
        get_attr: unsafe extern "C" fn(Obj, *const c_char) -> Obj,
        call: unsafe extern "C" fn(Obj, Obj) -> Obj,
        tuple_new: unsafe extern "C" fn(isize) -> Obj,
        tuple_set: unsafe extern "C" fn(Obj, isize, Obj) -> c_int,
        long_from: unsafe extern "C" fn(c_ulonglong) -> Obj,
        long_as: unsafe extern "C" fn(Obj) -> c_long,
        decref: unsafe extern "C" fn(Obj),
        save_thread: unsafe extern "C" fn() -> *mut c_void,
        restore_thread: unsafe extern "C" fn(*mut c_void),
        utf8: unsafe extern "C" fn(Obj, *mut isize) -> *const c_char,
        err_set_string: unsafe extern "C" fn(Obj, *const c_char),
        /// `PyExc_RuntimeError`: the address of the interpreter's `PyObject *` variable.
        runtime_error: usize,
    }

    extern "C" {
        /// `dlsym(3)` (glibc: libc, or libdl before 2.34; the standard library links it).
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }

    /// `RTLD_DEFAULT`: the process's global symbol scope.
    const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

    /// `Py_file_input`.
    const FILE_INPUT: c_int = 257;

    /// The CuPy module's source, run when `import cuda_mempool_cupy` finds no module (the
    /// plain route, with the module nowhere on `sys.path`). NUL-terminated.
    const MODULE_SOURCE: &str = concat!(include_str!("../python/cuda_mempool_cupy.py"), "\0");

    /// Looks `name` (NUL-terminated) up in the process's global symbol scope.
    fn symbol(name: &str) -> Option<*mut c_void> {
        // SAFETY: `name` is NUL-terminated; dlsym reads it and returns an address or null.
        let p = unsafe { dlsym(RTLD_DEFAULT, name.as_ptr().cast()) };
        (!p.is_null()).then_some(p)
    }

    fn find() -> Option<Api> {
        macro_rules! f {
            ($name:literal as $ty:ty) => {{
                let p = symbol(concat!($name, "\0"))?;
                // SAFETY: CPython exports this function with the signature the field declares
                // (its stable ABI); a data pointer and a function pointer have the same size
                // and representation on the platforms this library builds for.
                unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        Some(Api {
            initialized: f!("Py_IsInitialized" as unsafe extern "C" fn() -> c_int),
            gil_check: f!("PyGILState_Check" as unsafe extern "C" fn() -> c_int),
            gil_ensure: f!("PyGILState_Ensure" as unsafe extern "C" fn() -> c_int),
            gil_release: f!("PyGILState_Release" as unsafe extern "C" fn(c_int)),
            err_clear: f!("PyErr_Clear" as unsafe extern "C" fn()),
            err_occurred: f!("PyErr_Occurred" as unsafe extern "C" fn() -> Obj),
            import: f!("PyImport_ImportModule" as unsafe extern "C" fn(*const c_char) -> Obj),
            compile: f!("Py_CompileString"
                as unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> Obj),
            exec_module: f!("PyImport_ExecCodeModuleEx"
                as unsafe extern "C" fn(*const c_char, Obj, *const c_char) -> Obj),
            get_attr: f!(
                "PyObject_GetAttrString" as unsafe extern "C" fn(Obj, *const c_char) -> Obj
            ),
            call: f!("PyObject_CallObject" as unsafe extern "C" fn(Obj, Obj) -> Obj),
            tuple_new: f!("PyTuple_New" as unsafe extern "C" fn(isize) -> Obj),
            tuple_set: f!("PyTuple_SetItem" as unsafe extern "C" fn(Obj, isize, Obj) -> c_int),
            long_from: f!("PyLong_FromUnsignedLongLong" as unsafe extern "C" fn(c_ulonglong) -> Obj),
            long_as: f!("PyLong_AsLong" as unsafe extern "C" fn(Obj) -> c_long),
            decref: f!("Py_DecRef" as unsafe extern "C" fn(Obj)),
            save_thread: f!("PyEval_SaveThread" as unsafe extern "C" fn() -> *mut c_void),
            restore_thread: f!("PyEval_RestoreThread" as unsafe extern "C" fn(*mut c_void)),
            utf8: f!(
                "PyUnicode_AsUTF8AndSize" as unsafe extern "C" fn(Obj, *mut isize) -> *const c_char
            ),
            err_set_string: f!("PyErr_SetString" as unsafe extern "C" fn(Obj, *const c_char)),
            runtime_error: symbol("PyExc_RuntimeError\0")? as usize,
        })
    }

    /// The Python C API of this process, when it has an initialised interpreter.
    pub(crate) fn api() -> Option<&'static Api> {
        static API: OnceLock<Option<Api>> = OnceLock::new();
        let api = API.get_or_init(find).as_ref()?;
        // SAFETY: Py_IsInitialized may be called at any time, from any thread.
        (unsafe { (api.initialized)() } != 0).then_some(api)
    }

    /// Registers CuPy's stream lookup and the CuPy module's hooks, as the module's `install()`
    /// does, without changing CuPy's allocator: imports `cuda_mempool_cupy` (or runs the copy
    /// embedded in this library) and calls its `_plain_route(address)`, which finds this
    /// library from the address of one of its functions. `Err(true)`: the module raised, and
    /// its Python exception is pending (it raises only when CuPy's `malloc` catches C++
    /// exceptions); `Err(false)`: the last error says why. Needs the GIL.
    pub(crate) fn register_hooks(py: &Api, call: &str) -> Result<(), bool> {
        let mut raised = false;
        let done = crate::run(false, || setup(py, call, &mut raised).map(|()| true));
        match (done, raised) {
            (true, _) => Ok(()),
            (false, raised) => Err(raised),
        }
    }

    /// [`register_hooks`]: `Err` with the message; `raised` set when the module's exception
    /// is left pending.
    fn setup(py: &Api, call: &str, raised: &mut bool) -> Result<(), CallError> {
        // Any other pending exception is cleared: the caller may not catch C++ exceptions.
        let failed = |what: &str| {
            // SAFETY: the caller holds the GIL.
            unsafe { (py.err_clear)() };
            fail(call, format!("the CuPy module could not be set up: {what}"))
        };
        // SAFETY: every call below is made with the GIL held (the caller's); the arguments are
        // NUL-terminated strings or objects this function owns a reference to; each new
        // reference is released once.
        unsafe {
            let mut module = (py.import)(c"cuda_mempool_cupy".as_ptr());
            if module.is_null() {
                (py.err_clear)();
                let code = (py.compile)(
                    MODULE_SOURCE.as_ptr().cast(),
                    c"cuda_mempool_cupy.py (embedded in libcudars_mempool_capi.so)".as_ptr(),
                    FILE_INPUT,
                );
                if code.is_null() {
                    return Err(failed("its embedded source does not compile"));
                }
                module = (py.exec_module)(c"cuda_mempool_cupy".as_ptr(), code, std::ptr::null());
                (py.decref)(code);
                if module.is_null() {
                    return Err(failed("importing it raised (is CuPy importable?)"));
                }
            }
            let func = (py.get_attr)(module, c"_plain_route".as_ptr());
            (py.decref)(module);
            if func.is_null() {
                return Err(failed(
                    "it has no _plain_route (a cuda_mempool_cupy.py older than this library)",
                ));
            }
            let address = crate::cuda_mempool_cupy_malloc as *const () as usize as c_ulonglong;
            let args = (py.tuple_new)(1);
            let arg = if args.is_null() {
                std::ptr::null_mut()
            } else {
                (py.long_from)(address)
            };
            // PyTuple_SetItem steals the reference to `arg`, even when it fails.
            let set = !arg.is_null() && (py.tuple_set)(args, 0, arg) == 0;
            let result = if set {
                (py.call)(func, args)
            } else {
                std::ptr::null_mut()
            };
            if !args.is_null() {
                (py.decref)(args);
            }
            (py.decref)(func);
            if !set {
                return Err(failed("no memory for the call's arguments"));
            }
            if result.is_null() {
                *raised = true;
                return Err(fail(
                    call,
                    "the CuPy module could not register CuPy's current-stream lookup (its Python \
                     exception is pending)",
                ));
            }
            let status = (py.long_as)(result);
            (py.decref)(result);
            if status == -1 && !(py.err_occurred)().is_null() {
                return Err(failed("_plain_route returned no int"));
            }
            if status != 0 {
                return Err(fail(
                    call,
                    "the CuPy module could not register CuPy's current-stream lookup \
                     (cuda_mempool_cupy._plain_error says why)",
                ));
            }
            Ok(())
        }
    }

    /// Lets other Python threads run for a moment: releases the GIL, sleeps, takes it back.
    /// Needs the GIL (held by this thread: the caller's or ensured).
    pub(crate) fn wait_without_gil(py: &Api) {
        // SAFETY: this thread holds the GIL; the state is restored on the same thread, and no
        // Python object is touched while it is released.
        unsafe {
            let state = (py.save_thread)();
            std::thread::sleep(std::time::Duration::from_micros(200));
            (py.restore_thread)(state);
        }
    }

    /// Whether the process's CuPy catches a C++ exception thrown by a `CFunctionAllocator`'s
    /// `malloc` (CuPy 14.1 and later declare it `except +`), read once from
    /// `cupy.__version__`; false when that cannot be read. Needs the GIL; clears what its own
    /// lookups raise.
    pub(crate) fn cupy_catches(py: &Api) -> bool {
        // 0: not known yet, 1: catches, 2: does not. No lock: the lookup runs Python code,
        // which may let another thread in here (it then looks too); a lookup that fails is
        // not remembered.
        static CATCHES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        match CATCHES.load(std::sync::atomic::Ordering::Relaxed) {
            1 => return true,
            2 => return false,
            _ => {}
        }
        // SAFETY: the caller holds the GIL; each new reference is released once; the UTF-8
        // buffer belongs to the string object and is read before its release.
        let version = unsafe {
            let module = (py.import)(c"cupy".as_ptr());
            if module.is_null() {
                (py.err_clear)();
                return false;
            }
            let version = (py.get_attr)(module, c"__version__".as_ptr());
            (py.decref)(module);
            if version.is_null() {
                (py.err_clear)();
                return false;
            }
            let mut len = 0isize;
            let text = (py.utf8)(version, &mut len);
            let parsed = if text.is_null() || len < 0 {
                (py.err_clear)();
                None
            } else {
                let bytes = std::slice::from_raw_parts(text.cast::<u8>(), len as usize);
                std::str::from_utf8(bytes).ok().and_then(super::major_minor)
            };
            (py.decref)(version);
            parsed
        };
        let Some(version) = version else {
            return false;
        };
        let catches = version >= (14, 1);
        CATCHES.store(
            if catches { 1 } else { 2 },
            std::sync::atomic::Ordering::Relaxed,
        );
        catches
    }

    /// Leaves a Python `RuntimeError` with the last error's message pending (for a caller
    /// that returns null to a CuPy that does not catch C++ exceptions: the interpreter then
    /// raises it at its next check, rather than CuPy going on with address 0 unawares).
    /// Needs the GIL.
    pub(crate) fn set_runtime_error(py: &Api) {
        // SAFETY: the caller holds the GIL; `runtime_error` is the address of the
        // interpreter's `PyExc_RuntimeError` variable (set at its start, never changed), so
        // reading it gives a valid exception type; the message is NUL-terminated and copied
        // by the call.
        unsafe {
            let kind = *(py.runtime_error as *const Obj);
            (py.err_set_string)(kind, crate::error::last_error_ptr());
        }
    }

    /// Throws the C++ exception that makes CuPy's Cython code raise the pending Python
    /// exception (with none pending, a `RuntimeError` with the last error's message). Needs
    /// the GIL, held by a caller that catches C++ exceptions (CuPy's
    /// `malloc`, declared `except +` from CuPy 14.1: the module raises only then).
    pub(crate) fn throw_pending(py: &Api) -> ! {
        let _ = py;
        // SAFETY: the caller catches C++ exceptions (above); the message is copied by C++.
        unsafe { super::cuda_mempool_throw_runtime_error(crate::error::last_error_ptr()) }
    }
}

/// `(major, minor)` of a version string such as `14.2.0` or `14.1.0rc1`.
fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor: String = it
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

unsafe extern "C-unwind" {
    /// `src/cupy_error.cpp`: throws `std::runtime_error(what)` (a null `what`: a fixed text).
    fn cuda_mempool_throw_runtime_error(what: *const std::ffi::c_char) -> !;
}

/// The number of CuPy streams this path holds alive now (streams with live blocks of
/// [`cuda_mempool_cupy_stream_malloc`]). Never fails and touches no driver.
#[no_mangle]
pub extern "C" fn cuda_mempool_cupy_held_streams() -> i64 {
    run(-1, || {
        i64::try_from(held().len()).map_err(|_| fail("cuda_mempool_cupy_held_streams", "overflow"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cupy_versions_parse_to_major_and_minor() {
        assert_eq!(major_minor("14.2.0"), Some((14, 2)));
        assert_eq!(major_minor("14.1.0rc1"), Some((14, 1)));
        assert_eq!(major_minor("13.6.0"), Some((13, 6)));
        assert_eq!(major_minor("15.0b1"), Some((15, 0)));
        assert_eq!(major_minor("dev"), None);
        assert_eq!(major_minor("14"), None);
        assert_eq!(major_minor("14.x"), None);
    }
    use crate::error::{clear_last_error, last_error_message};

    unsafe extern "C" fn current() -> isize {
        -1
    }
    unsafe extern "C" fn for_device(_: c_int) -> isize {
        -1
    }
    unsafe extern "C" fn hold(_: c_int, _: *mut c_void) -> c_int {
        0
    }
    unsafe extern "C" fn make_error(_: usize, _: c_int, _: *mut isize) -> c_int {
        1
    }

    /// One test, since the hooks are process-wide.
    #[test]
    fn the_stream_malloc_needs_registered_hooks_and_a_stream() {
        let none = || {
            // SAFETY: unregistering needs no function.
            unsafe { cuda_mempool_cupy_set_stream_hooks(None, None, None, None, None, None) }
        };
        assert_eq!(none(), 0);
        clear_last_error();
        assert!(cuda_mempool_cupy_stream_malloc(std::ptr::null_mut(), 0, 0).is_null());
        assert_eq!(last_error_message(), None, "size 0 is no error");
        assert!(cuda_mempool_cupy_stream_malloc(std::ptr::null_mut(), 512, 0).is_null());
        let msg = last_error_message().unwrap_or_default();
        assert!(msg.contains("no stream hooks registered"), "{msg}");

        clear_last_error();
        // SAFETY: the functions above are plain and callable from any thread.
        let r = unsafe {
            cuda_mempool_cupy_set_stream_hooks(Some(current), None, None, None, None, None)
        };
        assert_eq!(r, -1);
        assert!(last_error_message()
            .unwrap_or_default()
            .contains("needs a hold hook"));
        // SAFETY: as above.
        let r = unsafe {
            cuda_mempool_cupy_set_stream_hooks(
                None,
                Some(for_device),
                Some(hold),
                None,
                Some(make_error),
                None,
            )
        };
        assert_eq!(r, -1, "make_error without set_error");
        for (cur, dev) in [
            (Some(current as CurrentStreamFn), None),
            (None, Some(for_device as DeviceStreamFn)),
        ] {
            // SAFETY: as above.
            let r = unsafe {
                cuda_mempool_cupy_set_stream_hooks(cur, dev, Some(hold), None, None, None)
            };
            assert_eq!(r, 0);
            clear_last_error();
            // CuPy's lookup failing (-1) fails the allocation before any driver call.
            assert!(cuda_mempool_cupy_stream_malloc(std::ptr::null_mut(), 512, 0).is_null());
            let msg = last_error_message().unwrap_or_default();
            assert!(msg.contains("lookup failed"), "{msg}");
        }
        assert_eq!(none(), 0);
        assert_eq!(cuda_mempool_cupy_held_streams(), 0);
    }

    #[test]
    fn unhold_of_an_unknown_stream_changes_nothing() {
        let before = cuda_mempool_cupy_held_streams();
        unhold(0xdead_beef);
        assert_eq!(cuda_mempool_cupy_held_streams(), before);
    }
}
