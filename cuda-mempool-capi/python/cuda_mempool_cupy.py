"""cuda-mempool's pool as CuPy's allocator, stream-correct, with CuPy's out-of-memory error.

Usage::

    import cuda_mempool_cupy          # lives beside libcudars_mempool_capi.so
    pool = cuda_mempool_cupy.install()
    # ... CuPy code as usual; pool.used_bytes(), pool.free_all_blocks(), pool.set_limit(...)

The library is found, in this order: the ``lib`` argument of :func:`load`/:func:`install`,
the ``CUDA_MEMPOOL_CAPI_LIB`` environment variable, ``libcudars_mempool_capi.so`` in this
file's folder.

How an allocation runs (the C path, used when CuPy exports what it needs): CuPy's own
``cupy.cuda.memory.CFunctionAllocator`` calls the library's ``cuda_mempool_cupy_stream_malloc``
and ``cuda_mempool_cupy_free`` directly, from CuPy's Cython code, with no Python frame of ours
in between. A failed allocation raises ``OutOfMemoryError`` (this module's subclass of CuPy's,
with the pool's numbers): CuPy 14.1 and later declare the allocator's ``malloc`` ``except +``,
so their Cython code catches a C++ exception from it and raises the Python exception that is
pending; the library sets that exception (it asks this module's ``make_error`` hook for it and
sets it with ``PyErr_SetObject``) and throws. After a kernel fault lost the device's CUDA
context (an illegal address, a trap; seen first by CuPy's calls or by the library's), the pool
hands out none of its memory, and an allocation raises ``ContextLostError``: CuPy's
``cupy.cuda.driver.CUDADriverError`` (a subclass of it), whose ``status`` is the error that
lost the context and whose message starts with that error's text. With an older CuPy, which would not catch the
C++ exception, the library only returns NULL, and a small Python function checks the pointer
and raises (``MemoryPool.path`` is then ``"c+check"``; CuPy would otherwise hand out an array
at address 0).

How the library learns CuPy's *current* stream (a ``CFunctionAllocator`` gets only a size and a
device): CuPy 14's ``cupy_backends.cuda.stream`` exports its C-level ``get_stream_ptr(device)``
(``intptr_t (int)``, a thread-local read, no CUDA call) in its ``__pyx_capi__`` table, and
``cupy.cuda.stream`` exports ``get_current_stream_ptr()``; this module hands the first it finds to
the library (``cuda_mempool_cupy_set_stream_hooks``), which calls it at each allocation (CuPy
holds the GIL then). It is the same lookup CuPy's own pool makes.

The stream rule (the library uses a stream handle until the last block allocated on it is
freed, so the CuPy ``Stream`` object must live that long) is kept once a stream, not once a
block: when a stream gets its first live block of this path, the library calls this module's
``hold`` hook, which keeps a reference to CuPy's current ``Stream`` object; when the stream's
last block is freed (after the pool has recorded its fence), it calls ``release``, which drops
it. The implicit streams (null, legacy, per-thread) are never held.
``MemoryPool.held_streams()`` says how many streams are held now. At interpreter exit the held
streams are kept (never destroyed), since the order in which Python then drops arrays and
streams is not known.

Set ``CUDA_MEMPOOL_CUPY_PATH=python`` to use the older all-Python allocator instead (each block
owned by a small Python object that keeps its stream; ctypes calls both ways); it is also used
when CuPy does not export ``get_current_stream_ptr``. ``MemoryPool.path`` says which is in use
(``"c"``, ``"c+check"`` or ``"python"``).

Blocks freed on one stream are reused on another only once that stream is ordered after the
work issued before the free: after a fence has completed, or with the other stream made to
wait for it on the device. A block is used on the stream it was allocated on (CuPy's current
stream at the allocation, which CuPy's own calls such as ``ndarray.set``/``get`` and
``cupy.asarray`` use too); work on another stream needs that stream ordered after the
allocating one, as with CuPy's own pool.

CuPy's per-thread default stream (``cupy.cuda.Stream.ptds``, or
``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` for a whole program) works: its handle
(``cudaStreamPerThread``) names each thread's own stream, and the pool keeps a cache per thread
that it uses, and fences, from that thread only. A block freed by another thread (the garbage
collector) is reused at once by its own thread's stream, and by other streams only after its
thread has fenced it (at that thread's next free of its last live block).

The plain route (CuPy's documented four lines, ``CFunctionAllocator`` over the library's
``cuda_mempool_cupy_malloc`` and ``cuda_mempool_cupy_free``) is the same allocator: at its first
allocation the library imports this module (or runs the copy of it embedded in the library)
and calls :func:`_plain_route`, which registers CuPy's stream lookup and this module's hooks as
:func:`install` does, without changing CuPy's allocator or its default pool object.

``install()`` also makes ``cupy.get_default_memory_pool()`` return this module's pool object
(pass ``replace_default_pool=False`` to keep CuPy's): code that already calls
``cupy.get_default_memory_pool().free_all_blocks()``/``used_bytes()``/``set_limit()`` then
reaches the pool that actually holds the memory, and so does CuPy itself, whose cuFFT plan
creation calls ``cupy.get_default_memory_pool().free_all_blocks()`` to retry after an out of
memory. CuPy's own ``MemoryPool`` would otherwise report zeros while our pool holds the memory.
:func:`uninstall` restores both.
"""

import atexit
import ctypes
import os
import threading

import cupy
from cupy.cuda import driver as _cupy_driver
from cupy.cuda import memory as _cupy_memory
from cupy.cuda import runtime as _runtime
from cupy.cuda import stream as _cupy_stream

try:
    from cupy_backends.cuda import stream as _backends_stream
except ImportError:  # not CuPy 14's layout: the cupy.cuda.stream lookup is used
    _backends_stream = None

__all__ = ["load", "install", "uninstall", "MemoryPool", "OutOfMemoryError", "ContextLostError",
           "library"]

LIB_NAME = "libcudars_mempool_capi.so"
_HERE = os.path.dirname(os.path.abspath(__file__))

_lib = None
_pool = None
_saved = None


class OutOfMemoryError(_cupy_memory.OutOfMemoryError):
    """CuPy's ``OutOfMemoryError`` (a subclass of it), with the pool's numbers.

    Attributes: ``requested``, ``used``, ``reserved``, ``limit`` (bytes; limit 0 = none).
    """

    def __init__(self, requested, used, reserved, limit):
        super().__init__(requested, used, max(limit, 0))
        self.requested, self.used, self.reserved = requested, used, reserved
        self.limit = max(limit, 0)
        self.args = (
            f"Out of memory allocating {requested:,} bytes in cuda-mempool "
            f"(allocated so far: {used:,} bytes, reserved: {reserved:,} bytes, limit: "
            + (f"{limit:,} bytes" if limit > 0 else "none")
            + "); the pool kept nothing it reserved for this request.",
        )

    def __str__(self):
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.requested, self.used, self.reserved, self.limit))


class ContextLostError(_cupy_driver.CUDADriverError):
    """CuPy's ``CUDADriverError`` (a subclass of it) for an allocation on a device whose CUDA
    context a kernel fault lost: the pool hands out none of its memory, and every later CUDA
    call of the process on the device fails.

    Attributes: ``status`` (the ``CUresult`` of the error that lost the context, as CuPy's
    ``CUDADriverError`` has it; 0 when the device was reset instead), ``device``.
    """

    def __init__(self, status, device, message):
        super().__init__(status)
        self.device = device
        self.args = (message,)

    def __str__(self):
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.status, self.device, self.args[0]))


def _find_library(lib=None):
    for path in (lib, os.environ.get("CUDA_MEMPOOL_CAPI_LIB"), os.path.join(_HERE, LIB_NAME)):
        if path:
            return path
    return os.path.join(_HERE, LIB_NAME)


def load(lib=None):
    """Loads (once) and returns the ``ctypes.CDLL`` of libcudars_mempool_capi.so."""
    global _lib
    if _lib is not None:
        return _lib
    so = ctypes.CDLL(_find_library(lib))
    vp, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    sigs = {
        "cuda_mempool_alloc": (vp, [ctypes.c_size_t, cint, vp]),
        "cuda_mempool_free": (None, [vp]),
        "cuda_mempool_record_stream": (cint, [vp, vp]),
        "cuda_mempool_last_oom": (cint, [ctypes.POINTER(i64)] * 4),
        "cuda_mempool_last_context_lost": (cint, [ctypes.POINTER(cint)] * 2),
        "cuda_mempool_used_bytes": (i64, [cint]),
        "cuda_mempool_reserved_bytes": (i64, [cint]),
        "cuda_mempool_free_bytes": (i64, [cint]),
        "cuda_mempool_peak_reserved_bytes": (i64, [cint]),
        "cuda_mempool_n_free_blocks": (i64, []),
        "cuda_mempool_live_allocations": (i64, []),
        "cuda_mempool_free_all_blocks": (cint, []),
        "cuda_mempool_set_limit": (cint, [cint, ctypes.c_size_t]),
        "cuda_mempool_get_limit": (i64, [cint]),
        "cuda_mempool_last_error": (ctypes.c_char_p, []),
        "cuda_mempool_clear_error": (None, []),
        "cuda_mempool_set_current_stream": (cint, [cint, vp]),
        "cuda_mempool_cupy_set_stream_hooks": (cint, [vp] * 6),
        "cuda_mempool_cupy_held_streams": (i64, []),
        "cuda_mempool_history_start": (cint, [ctypes.c_size_t]),
        "cuda_mempool_history_start_backtraces": (cint, [ctypes.c_size_t]),
        "cuda_mempool_history_stop": (cint, []),
        "cuda_mempool_history_dump": (cint, [ctypes.c_char_p, cint]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(so, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = so
    return so


def library():
    """The loaded library (``ctypes.CDLL``); loads it if needed."""
    return load()


def _last_error(so):
    err = so.cuda_mempool_last_error()
    return err.decode(errors="replace") if err else "no error message recorded"


def _failure(so, size, device):
    """The exception for this thread's failed allocation: ``ContextLostError`` after a fault,
    ``OutOfMemoryError`` with the pool's numbers, or ``RuntimeError`` with the library's
    message."""
    lost = [ctypes.c_int() for _ in range(2)]
    if so.cuda_mempool_last_context_lost(*[ctypes.byref(v) for v in lost]) == 1:
        return ContextLostError(lost[1].value, lost[0].value, _last_error(so))
    vals = [ctypes.c_int64() for _ in range(4)]
    if so.cuda_mempool_last_oom(*[ctypes.byref(v) for v in vals]) == 1:
        requested, used, reserved, limit = (v.value for v in vals)
        return OutOfMemoryError(requested, used, reserved, limit)
    return RuntimeError(
        f"cuda-mempool allocation of {size} bytes on device {device} failed: {_last_error(so)}")


def _raise_failure(so, size, device):
    raise _failure(so, size, device)


class _Block:
    """Owner of one pool block: frees it when CuPy drops the memory. Holds the CuPy stream
    the block was allocated on, so that stream outlives the block."""

    __slots__ = ("ptr", "stream", "free")

    def __init__(self, ptr, stream, free):
        self.ptr = ptr
        self.stream = stream
        self.free = free

    def __del__(self):
        ptr, self.ptr = self.ptr, 0
        if ptr:
            try:
                self.free(ptr)
            except Exception:  # interpreter shutdown: nothing left to free into
                pass
        self.stream = None


def _make_python_malloc(so):
    """The all-Python allocator (``CUDA_MEMPOOL_CUPY_PATH=python``, or CuPy without the C API
    this module needs): ctypes calls, one owner object a block."""
    alloc = so.cuda_mempool_alloc
    free = so.cuda_mempool_free
    get_device = _runtime.getDevice
    current_stream = _cupy_stream.get_current_stream
    Unowned = _cupy_memory.UnownedMemory
    MemoryPointer = _cupy_memory.MemoryPointer

    def malloc(size):
        device = get_device()
        if size == 0:
            return MemoryPointer(Unowned(0, 0, None, device), 0)
        stream = current_stream(device)
        size = (size + _ROUND - 1) & -_ROUND  # the block's real size, as CuPy's pool reports
        ptr = alloc(size, device, stream.ptr)
        if not ptr:
            _raise_failure(so, size, device)
        return MemoryPointer(Unowned(ptr, size, _Block(ptr, stream, free), device), 0)

    return malloc


# The pool's rounding (cuda-mempool's policy::ROUND): every block is a multiple of it, and
# ``mem.size`` reports the rounded size, as CuPy's MemoryPool does.
_ROUND = 512

# The C path's held streams: handle -> [CuPy Stream object, number of holds]. The library
# holds a stream once while it has live blocks (a second hold can come from a race between
# threads, and is released at once).
_held = {}
_exiting = False
# (current_stream, device_stream, hold, release, make_error, set_error): the registered
# functions; the ctypes callbacks among them stay referenced for the life of the process.
_hooks = None


def _hold(device, handle):
    try:
        stream = _cupy_stream.get_current_stream(device)
        if stream.ptr != handle:
            return 1
        entry = _held.get(handle)
        if entry is None:
            _held[handle] = [stream, 1]
            if _exiting:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(stream))
        else:
            entry[1] += 1
        return 0
    except BaseException:  # an exception must not cross into C
        return 1


def _release(handle):
    try:
        entry = _held.get(handle)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _held[handle]  # CuPy may now destroy the stream
    except BaseException:
        pass


def _capi_function(module, name, signature):
    """The address of the C function ``name`` that the Cython ``module`` exports in its
    ``__pyx_capi__`` table, if its C signature is ``signature``; else None."""
    try:
        capsule = module.__pyx_capi__[name]
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        got = api.PyCapsule_GetName(capsule)
        if got is None or got.split(b" except")[0].strip() != signature:
            return None
        return api.PyCapsule_GetPointer(capsule, got) or None
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _cupy_checks_malloc_errors():
    """Whether CuPy's CFunctionAllocator catches a C++ exception thrown by its malloc and
    raises the pending Python exception (CuPy 14.1 and later: the malloc function type is
    declared ``except +``). An older CuPy would let the C++ exception end the process."""
    # As the library reads it: the leading digits of the first two parts ("14.1.0rc1" is
    # 14.1).
    import re

    m = re.match(r"(\d+)\.(\d+)", cupy.__version__)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (14, 1)


# Whether the library releases the references _make_error hands over
# (cuda_mempool_cupy_set_error_release registered with Py_DecRef). Otherwise the exception each
# thread's last failed allocation raised is kept here until that thread's next failure.
_owned_errors = False
_errors = {}


def _make_error(size, device, out):
    try:
        exc = _failure(_lib, size, device)
        if _owned_errors:
            # Owned references for the library, which releases them once the exception is set:
            # nothing of ours keeps the exception (its traceback, its frames' arrays) alive.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(type(exc)))
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(exc))
        else:
            _errors[threading.get_ident()] = exc
        out[0] = id(type(exc))
        out[1] = id(exc)
        return 0
    except BaseException:  # an exception must not cross into C
        return 1


def _register(so, release=True):
    current, device_stream, hold, rel, make_error, set_error = _hooks
    vp = lambda f: None if f is None else ctypes.cast(f, ctypes.c_void_p)  # noqa: E731
    return so.cuda_mempool_cupy_set_stream_hooks(
        current, device_stream, vp(hold), vp(rel) if release else None, vp(make_error),
        set_error)


def _at_exit():
    """Interpreter exit: holds are no longer released, and the held streams are kept for
    good (arrays and streams are then dropped in no known order)."""
    global _exiting
    _exiting = True
    if _hooks is not None and _lib is not None:
        _register(_lib, release=False)
    for stream, _ in list(_held.values()):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(stream))


def _make_c_malloc(so, lib_owner):
    """The C path: CuPy's CFunctionAllocator over the library, on CuPy's current stream; with
    the path's name (``"c"``: failures raised through CuPy, ``"c+check"``: through a Python
    check of the pointer). None when CuPy exports no stream lookup."""
    global _hooks
    if _hooks is None:
        device_stream = None
        if _backends_stream is not None:
            device_stream = _capi_function(_backends_stream, "get_stream_ptr", b"intptr_t (int)")
        current = None
        if device_stream is None:
            current = _capi_function(_cupy_stream, "get_current_stream_ptr", b"intptr_t (void)")
            if current is None:
                return None
        make_error = set_error = None
        if _cupy_checks_malloc_errors():
            make_error = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_ssize_t))(_make_error)
            set_error = ctypes.cast(ctypes.pythonapi.PyErr_SetObject, ctypes.c_void_p).value
        hold = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(_hold)
        release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release)
        _hooks = (current, device_stream, hold, release, make_error, set_error)
        atexit.register(_at_exit)
    global _owned_errors
    if _hooks[4] is not None and hasattr(so, "cuda_mempool_cupy_set_error_release"):
        decref = ctypes.cast(ctypes.pythonapi.Py_DecRef, ctypes.c_void_p)
        so.cuda_mempool_cupy_set_error_release.argtypes = [ctypes.c_void_p]
        _owned_errors = so.cuda_mempool_cupy_set_error_release(decref) == 0
    if _register(so) != 0:
        raise RuntimeError(f"cuda_mempool_cupy_set_stream_hooks: {_last_error(so)}")
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    cfa = _cupy_memory.CFunctionAllocator(
        0, addr(so.cuda_mempool_cupy_stream_malloc), addr(so.cuda_mempool_cupy_free), lib_owner)
    cfa_malloc = cfa.malloc
    if _hooks[4] is not None:
        def malloc(size):
            # The block's real size (the pool rounds to 512 bytes), so that ``mem.size`` is
            # what CuPy's own pool reports: CuPy's code and tests rely on it.
            return cfa_malloc((size + 511) & -512)

        return malloc, "c"
    get_device = _runtime.getDevice

    def malloc(size):
        size = (size + 511) & -512
        mem = cfa_malloc(size)
        if mem.ptr or not size:
            return mem
        _raise_failure(so, size, get_device())

    return malloc, "c+check"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _library_path(address):
    """The file of the shared library that holds ``address`` (``dladdr``)."""
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) \
            or not info.dli_fname:
        raise RuntimeError(f"dladdr found no library at {address:#x}")
    return os.fsdecode(info.dli_fname)


# Why the plain route's last setup failed (None: it has not failed).
_plain_error = None


def _plain_route(address):
    """Called by the library at the plain route's first allocation (``cuda_mempool_cupy_malloc``
    with no hooks registered), with the GIL held: loads the library that holds ``address`` and
    registers CuPy's current-stream lookup and this module's hooks, as :func:`install` does,
    leaving CuPy's allocator and default pool object as they are. Returns 0. On failure: raises
    when CuPy's ``malloc`` catches C++ exceptions (CuPy 14.1 and later: the library then throws
    and CuPy raises this exception), else returns 1 (the library returns NULL) and keeps the
    exception in ``_plain_error``."""
    global _plain_error
    try:
        so = load(_library_path(address))
        if _make_c_malloc(so, so) is None:
            raise RuntimeError(
                "cuda-mempool: CuPy exports no C-level current-stream lookup "
                "(cupy_backends.cuda.stream.get_stream_ptr or cupy.cuda.stream."
                "get_current_stream_ptr); the plain route cannot learn CuPy's stream")
        _plain_error = None
        return 0
    except Exception as e:  # noqa: BLE001 - handed to the library's caller
        _plain_error = e
        if _cupy_checks_malloc_errors():
            raise
        return 1


def _make_malloc(so):
    """The allocator and the name of its path (``"c"``, ``"c+check"`` or ``"python"``)."""
    if os.environ.get("CUDA_MEMPOOL_CUPY_PATH", "").strip().lower() != "python":
        made = _make_c_malloc(so, so)
        if made is not None:
            return made
    return _make_python_malloc(so), "python"


class MemoryPool:
    """The cuda-mempool pool, shaped like ``cupy.cuda.MemoryPool``. The per-device figures
    are for the current device, as CuPy's are. One pool serves the whole process, so every
    instance shows the same pool."""

    def __init__(self, lib=None):
        self._so = load(lib)
        self.malloc, self.path = _make_malloc(self._so)

    def _dev(self):
        return _runtime.getDevice()

    def _value(self, v, what):
        if v < 0:
            raise RuntimeError(f"cuda_mempool_{what}: {_last_error(self._so)}")
        return v

    def used_bytes(self):
        return self._value(self._so.cuda_mempool_used_bytes(self._dev()), "used_bytes")

    def total_bytes(self):
        return self._value(self._so.cuda_mempool_reserved_bytes(self._dev()), "reserved_bytes")

    def free_bytes(self):
        return self._value(self._so.cuda_mempool_free_bytes(self._dev()), "free_bytes")

    def peak_total_bytes(self):
        return self._value(self._so.cuda_mempool_peak_reserved_bytes(self._dev()),
                           "peak_reserved_bytes")

    def n_free_blocks(self):
        return self._value(self._so.cuda_mempool_n_free_blocks(), "n_free_blocks")

    def free_all_blocks(self, stream=None):
        """Gives every cached block back to the driver (all streams; ``stream`` is accepted
        for CuPy's signature and ignored)."""
        self._value(self._so.cuda_mempool_free_all_blocks(), "free_all_blocks")

    def free_all_free(self):
        self.free_all_blocks()

    def set_limit(self, size=None, fraction=None):
        """CuPy's ``set_limit``: ``size`` bytes or ``fraction`` of the device's memory for the
        current device; neither removes the limit. Unlike CuPy, a limit below what live
        blocks use raises ``ValueError`` (the pool keeps its previous limit)."""
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                _, total = _runtime.memGetInfo()
                size = int(total * fraction)
        else:
            if fraction is not None:
                raise ValueError("size and fraction cannot be specified at one time")
            if size < 0:
                raise ValueError(f"memory limit size out of range: {size}")
        if self._so.cuda_mempool_set_limit(self._dev(), size) != 0:
            raise ValueError(f"cuda_mempool_set_limit({size}): {_last_error(self._so)}")

    def get_limit(self):
        return self._value(self._so.cuda_mempool_get_limit(self._dev()), "get_limit")

    def held_streams(self):
        """Streams the C path keeps alive now (they have live blocks); 0 on the Python path."""
        return self._value(self._so.cuda_mempool_cupy_held_streams(), "cupy_held_streams")

    def live_allocations(self):
        return self._value(self._so.cuda_mempool_live_allocations(), "live_allocations")

    def record_history(self, enabled=True, max_events=0, backtraces=False):
        """Starts (or, ``enabled=False``, stops) recording the pool's memory history, as
        ``torch.cuda.memory._record_memory_history`` does for PyTorch: what the pool holds
        now, then every malloc, free, segment, page, fence, limit change and out-of-memory
        failure, the newest ``max_events`` kept (0: one million). With ``backtraces=True``
        the native call stack of each allocation is captured too (slower). Starting again
        replaces the recording. Write it out with :meth:`dump_report` or
        :meth:`dump_snapshot`."""
        if enabled and backtraces:
            self._value(self._so.cuda_mempool_history_start_backtraces(max_events),
                        "history_start_backtraces")
        elif enabled:
            self._value(self._so.cuda_mempool_history_start(max_events), "history_start")
        else:
            self._value(self._so.cuda_mempool_history_stop(), "history_stop")

    def _dump(self, path, fmt):
        if self._so.cuda_mempool_history_dump(os.fsencode(path), fmt) != 0:
            raise RuntimeError(f"cuda_mempool_history_dump: {_last_error(self._so)}")

    def dump_report(self, path):
        """Writes the recording (running, or the last one stopped) as one self-contained HTML
        file: active memory over time by allocation, reserved against used, the segment and
        page map, out-of-memory events. It opens offline in any browser."""
        self._dump(path, 0)

    def dump_snapshot(self, path):
        """Writes the recording as PyTorch's memory snapshot pickle (what
        ``torch.cuda.memory._dump_snapshot`` writes): open it at pytorch.org/memory_viz or
        with ``python -m torch.cuda._memory_viz``."""
        self._dump(path, 1)


def install(lib=None, replace_default_pool=True):
    """Makes the pool CuPy's allocator (``cupy.cuda.set_allocator``) and returns its
    :class:`MemoryPool`. With ``replace_default_pool`` (the default),
    ``cupy.get_default_memory_pool()`` returns that object too (see the module doc)."""
    global _pool, _saved
    pool = _pool if _pool is not None else MemoryPool(lib)
    if _saved is None:
        _saved = (_cupy_memory.get_allocator(), cupy.get_default_memory_pool)
    cupy.cuda.set_allocator(pool.malloc)
    if replace_default_pool:
        cupy.get_default_memory_pool = lambda: pool
    _pool = pool
    return pool


def uninstall():
    """Restores the allocator and ``cupy.get_default_memory_pool`` that :func:`install`
    replaced. Live blocks stay valid and are freed into the pool when CuPy drops them."""
    global _saved
    if _saved is not None:
        allocator, get_pool = _saved
        cupy.cuda.set_allocator(allocator)
        cupy.get_default_memory_pool = get_pool
        _saved = None
