"""cudars: the cuda-mempool caching pool for Python programs, PyTorch's and CuPy's allocator.

One pip-installable package, no CUDA toolkit needed (the library opens ``libcuda`` at run
time)::

    import cudars
    cudars.torch.install()      # PyTorch allocates from the pool (call before any CUDA tensor)
    cudars.cupy.install()       # CuPy allocates from the pool
    cudars.stats()              # {"used_bytes": ..., "reserved_bytes": ..., ...}
    cudars.record_history()     # then cudars.dump_history("mem.html")
    t = cudars.dlpack.pool_alloc(1 << 20)   # DLPack exchange (cudars.dlpack, see its docs)

What the package holds: ``libcudars_mempool_capi.so`` (the C ABI of the pool, which PyTorch
and CuPy call), the CuPy module over it, and ``cudars_dlpack`` (the DLPack extension).

Errors are :class:`CudarsError` and its subclasses: :class:`DriverNotFound` when the CUDA
driver cannot be loaded (a machine without a GPU), :class:`OutOfMemoryError` when the pool
cannot serve a request.
"""

import ctypes
import importlib
import os

__all__ = [
    "__version__",
    "CudarsError",
    "DriverNotFound",
    "OutOfMemoryError",
    "library_path",
    "library",
    "driver_available",
    "stats",
    "free_all_blocks",
    "set_limit",
    "get_limit",
    "record_history",
    "stop_history",
    "dump_history",
    "torch",
    "cupy",
    "dlpack",
]

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libcudars_mempool_capi.so"
_lib = None


class CudarsError(RuntimeError):
    """An error of the pool's library: the message is the library's last error."""


class DriverNotFound(CudarsError):
    """The CUDA driver (``libcuda.so.1``) cannot be loaded or has no usable device."""


class OutOfMemoryError(CudarsError, MemoryError):
    """The pool could not serve a request; it is as it was before the request."""


def library_path():
    """The path of the bundled ``libcudars_mempool_capi.so`` (what PyTorch's and CuPy's
    allocator hooks load)."""
    return os.path.join(_HERE, _LIB_NAME)


def library():
    """The bundled library as a ``ctypes.CDLL``, loaded once, with its prototypes set
    (needs neither PyTorch nor CuPy). Loading it needs no CUDA driver: the library opens
    ``libcuda`` at its first call."""
    global _lib
    if _lib is not None:
        return _lib
    so = ctypes.CDLL(library_path())
    vp, i64, cint, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    for name, res, args in (
        ("cuda_mempool_alloc", vp, [size, cint, vp]),
        ("cuda_mempool_free", None, [vp]),
        ("cuda_mempool_record_stream", cint, [vp, vp]),
        ("cuda_mempool_used_bytes", i64, [cint]),
        ("cuda_mempool_reserved_bytes", i64, [cint]),
        ("cuda_mempool_free_bytes", i64, [cint]),
        ("cuda_mempool_peak_reserved_bytes", i64, [cint]),
        ("cuda_mempool_n_free_blocks", i64, []),
        ("cuda_mempool_live_allocations", i64, []),
        ("cuda_mempool_free_all_blocks", cint, []),
        ("cuda_mempool_set_limit", cint, [cint, size]),
        ("cuda_mempool_get_limit", i64, [cint]),
        ("cuda_mempool_history_start", cint, [size]),
        ("cuda_mempool_history_start_backtraces", cint, [size]),
        ("cuda_mempool_history_stop", cint, []),
        ("cuda_mempool_history_dump", cint, [ctypes.c_char_p, cint]),
        ("cuda_mempool_last_error", ctypes.c_char_p, []),
        ("cuda_mempool_clear_error", None, []),
        ("cuda_mempool_torch_announce_captures", cint, []),
    ):
        fn = getattr(so, name)
        fn.restype, fn.argtypes = res, args
    _lib = so
    return so


def _error(what):
    msg = library().cuda_mempool_last_error()
    text = f"{what}: {msg.decode(errors='replace') if msg else 'no error message recorded'}"
    low = text.lower()
    if "libcuda" in low or "driver" in low:
        return DriverNotFound(text)
    if "out of memory" in low:
        return OutOfMemoryError(text)
    return CudarsError(text)


def driver_available():
    """Whether the CUDA driver loads and has a device (asks the pool's library)."""
    so = library()
    ok = so.cuda_mempool_used_bytes(0) >= 0
    so.cuda_mempool_clear_error()
    return ok


def _stat(name, device):
    v = getattr(library(), "cuda_mempool_" + name)(device)
    if v < 0:
        raise _error(f"cudars.stats(device={device})")
    return v


def stats(device=0):
    """The pool's figures for ``device``: bytes in live blocks, reserved from the driver,
    cached free, the peak reserved, and the live allocations of the C ABI."""
    so = library()
    out = {
        "used_bytes": _stat("used_bytes", device),
        "reserved_bytes": _stat("reserved_bytes", device),
        "free_bytes": _stat("free_bytes", device),
        "peak_reserved_bytes": _stat("peak_reserved_bytes", device),
        "live_allocations": so.cuda_mempool_live_allocations(),
        "free_blocks": so.cuda_mempool_n_free_blocks(),
    }
    limit = so.cuda_mempool_get_limit(device)
    out["limit_bytes"] = None if limit < 0 else limit
    return out


def free_all_blocks():
    """Gives every cached free block back to the driver (``torch.cuda.empty_cache``)."""
    if library().cuda_mempool_free_all_blocks() != 0:
        raise _error("cudars.free_all_blocks")


def set_limit(size, device=0):
    """Caps the pool's reserved bytes on ``device`` (``0`` or ``None``: no limit)."""
    if library().cuda_mempool_set_limit(device, int(size or 0)) != 0:
        raise _error(f"cudars.set_limit({size!r}, device={device})")


def get_limit(device=0):
    """The limit set on ``device``, or ``None``."""
    v = library().cuda_mempool_get_limit(device)
    return None if v < 0 else v


def record_history(max_events=100_000, backtraces=False):
    """Starts recording the pool's allocations and frees (the last ``max_events``), with
    Python-free native backtraces when ``backtraces``."""
    so = library()
    fn = so.cuda_mempool_history_start_backtraces if backtraces else so.cuda_mempool_history_start
    if fn(int(max_events)) != 0:
        raise _error("cudars.record_history")


def stop_history():
    """Stops recording (what was recorded stays available to :func:`dump_history`)."""
    if library().cuda_mempool_history_stop() != 0:
        raise _error("cudars.stop_history")


_FORMATS = {"html": 0, "torch": 1, "pickle": 1}


def dump_history(path, format="html"):
    """Writes the recorded history to ``path``: ``"html"`` (the pool's self-contained memory
    timeline page) or ``"torch"`` (PyTorch's memory snapshot pickle, for PyTorch's viewer at
    pytorch.org/memory_viz)."""
    if format not in _FORMATS:
        raise ValueError(f"format must be one of {sorted(_FORMATS)}, not {format!r}")
    if library().cuda_mempool_history_dump(os.fsencode(path), _FORMATS[format]) != 0:
        raise _error(f"cudars.dump_history({path!r})")


def __getattr__(name):
    # Submodules load on first use: `import cudars` needs neither PyTorch nor CuPy.
    if name in ("torch", "cupy"):
        return importlib.import_module("." + name, __name__)
    if name == "dlpack":
        return importlib.import_module(".cudars_dlpack", __name__)
    raise AttributeError(f"module 'cudars' has no attribute {name!r}")
