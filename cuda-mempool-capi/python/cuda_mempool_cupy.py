"""cuda-mempool's pool as CuPy's allocator, stream-correct, with CuPy's out-of-memory error.

Usage::

    import cuda_mempool_cupy          # lives beside libcuda_mempool_capi.so
    pool = cuda_mempool_cupy.install()
    # ... CuPy code as usual; pool.used_bytes(), pool.free_all_blocks(), pool.set_limit(...)

The library is found, in this order: the ``lib`` argument of :func:`load`/:func:`install`,
the ``CUDA_MEMPOOL_CAPI_LIB`` environment variable, ``libcuda_mempool_capi.so`` in this
file's folder.

Why not ``cupy.cuda.memory.CFunctionAllocator`` over ``cuda_mempool_cupy_malloc``: CuPy
gives such an allocator only a size and a device, so every block lands on one stream, and
CuPy does not check the returned pointer, so out of memory gives an array at address 0. This
module allocates on CuPy's *current* stream and raises.

How the current stream is learnt (CuPy 14): CuPy keeps the current stream per thread and per
device in ``cupy.cuda.stream``; the C-level ``get_current_stream_ptr`` there (and in
``cupy_backends.cuda.stream``) is ``cdef``, not reachable from Python. The cheapest
Python-reachable call is ``cupy.cuda.stream.get_current_stream(device_id)`` (a ``cpdef``):
given the device id, it is a thread-local lookup plus a list index and makes no CUDA call
(without the id it first calls ``cudaGetDevice``). The allocator needs the device anyway, so
it calls ``cupy.cuda.runtime.getDevice()`` once and passes the id. It also returns the Stream
*object*, which is what we need: the block's owner keeps a reference to it until the block is
freed, so a CuPy ``Stream`` cannot be destroyed (its handle released and possibly reused)
while a block allocated on it is live, which is exactly the library's stream rule.

Frees: the allocation is returned to CuPy as ``MemoryPointer(UnownedMemory(ptr, size,
owner, device), 0)``; the owner is a tiny ``__slots__`` object whose finaliser calls
``cuda_mempool_free`` when CuPy drops the last reference to the memory. Blocks freed on one
stream are reused on another only after the work issued before the free completes (the
library records the fence at the free).

Limits: with CuPy's per-thread default stream (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``)
every thread's default stream has the same handle value (``cudaStreamPerThread``), which the
library cannot tell apart between threads; use explicit streams across threads there.

``install()`` also makes ``cupy.get_default_memory_pool()`` return this module's pool object
(pass ``replace_default_pool=False`` to keep CuPy's): code that already calls
``cupy.get_default_memory_pool().free_all_blocks()``/``used_bytes()``/``set_limit()`` then
reaches the pool that actually holds the memory, and so does CuPy itself, whose cuFFT plan
creation calls ``cupy.get_default_memory_pool().free_all_blocks()`` to retry after an out of
memory. CuPy's own ``MemoryPool`` would otherwise report zeros while our pool holds the memory.
:func:`uninstall` restores both.
"""

import ctypes
import os

import cupy
from cupy.cuda import memory as _cupy_memory
from cupy.cuda import runtime as _runtime
from cupy.cuda import stream as _cupy_stream

__all__ = ["load", "install", "uninstall", "MemoryPool", "OutOfMemoryError", "library"]

LIB_NAME = "libcuda_mempool_capi.so"
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


def _find_library(lib=None):
    for path in (lib, os.environ.get("CUDA_MEMPOOL_CAPI_LIB"), os.path.join(_HERE, LIB_NAME)):
        if path:
            return path
    return os.path.join(_HERE, LIB_NAME)


def load(lib=None):
    """Loads (once) and returns the ``ctypes.CDLL`` of libcuda_mempool_capi.so."""
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


def _raise_failure(so, size, device):
    vals = [ctypes.c_int64() for _ in range(4)]
    if so.cuda_mempool_last_oom(*[ctypes.byref(v) for v in vals]) == 1:
        requested, used, reserved, limit = (v.value for v in vals)
        raise OutOfMemoryError(requested, used, reserved, limit)
    raise RuntimeError(
        f"cuda_mempool_alloc of {size} bytes on device {device} failed: {_last_error(so)}")


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


def _make_malloc(so):
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
        ptr = alloc(size, device, stream.ptr)
        if not ptr:
            _raise_failure(so, size, device)
        return MemoryPointer(Unowned(ptr, size, _Block(ptr, stream, free), device), 0)

    return malloc


class MemoryPool:
    """The cuda-mempool pool, shaped like ``cupy.cuda.MemoryPool``. The per-device figures
    are for the current device, as CuPy's are. One pool serves the whole process, so every
    instance shows the same pool."""

    def __init__(self, lib=None):
        self._so = load(lib)
        self.malloc = _make_malloc(self._so)

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

    def live_allocations(self):
        return self._value(self._so.cuda_mempool_live_allocations(), "live_allocations")


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
