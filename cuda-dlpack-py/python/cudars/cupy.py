"""CuPy on the cudars pool: ``cudars.cupy.install()``.

CuPy's ``CFunctionAllocator`` calls the pool's C functions directly on CuPy's current stream
(no Python frame per allocation where CuPy exports its stream lookup), keeps each stream alive
while it has live blocks, and raises CuPy's ``OutOfMemoryError`` (a subclass with the pool's
figures), or, once a kernel fault lost the device's context, CuPy's ``CUDADriverError`` (the
subclass ``ContextLostError``, whose ``status`` is the error that lost it). The full description is the module ``cudars._cuda_mempool_cupy``.
"""

from . import library_path
from . import _cuda_mempool_cupy as _module

__all__ = ["install", "MemoryPool", "OutOfMemoryError", "ContextLostError"]

MemoryPool = _module.MemoryPool
OutOfMemoryError = _module.OutOfMemoryError
ContextLostError = _module.ContextLostError


def install():
    """Makes the pool CuPy's allocator (``cupy.cuda.set_allocator``); returns a
    :class:`MemoryPool` with ``used_bytes()``, ``total_bytes()``, ``free_all_blocks()`` and
    ``set_limit()`` like CuPy's own."""
    return _module.install(library_path())
