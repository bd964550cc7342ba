"""PyTorch on the cudars pool: ``cudars.torch.install()``.

It swaps PyTorch's CUDA allocator for the pool through PyTorch's pluggable-allocator API
(``torch.cuda.memory.CUDAPluggableAllocator`` and ``change_current_allocator``), with the hooks
PyTorch offers set too:

* ``record_stream`` -> the pool marks the block as used on that stream;
* ``empty_cache`` -> the pool gives its cached blocks back;
* the CUDA-graph hooks (``begin/end_allocate_to_pool``): PyTorch announces each capture
  (``torch.cuda.graph``, ``torch.compile``'s CUDA graphs), so an allocation asks the driver
  whether its stream is being captured only while one runs, as PyTorch's own allocator does.

With those announcements, a stream PyTorch allocates on must be captured through PyTorch's
graph API only. A capture begun by other code on a stream PyTorch also allocates on (say a
``torch.cuda.ExternalStream`` over a CuPy stream that CuPy captures) would be served cached
memory that the graph's replays then overwrite. A program that mixes captures that way calls
``install(announce_captures=False)``: every allocation then asks the driver (about 100 ns
more a call).

Call it before the first CUDA tensor (PyTorch refuses to change a used allocator).
"""

import ctypes

from . import CudarsError, library, library_path

__all__ = ["install", "installed"]

_installed = None
_announced = None


def installed():
    """Whether :func:`install` has run in this process."""
    return _installed is not None


def install(announce_captures=True):
    """Makes the pool PyTorch's CUDA allocator; returns the ``CUDAPluggableAllocator``.
    With ``announce_captures`` (the default) PyTorch's capture hooks gate the capture
    question (see the module's docs); ``False`` asks the driver at every allocation. Raises
    :class:`cudars.CudarsError` if PyTorch has allocated CUDA memory already."""
    global _installed, _announced
    if _installed is not None:
        if announce_captures != _announced:
            raise CudarsError(
                f"cudars.torch.install(announce_captures={announce_captures}): already "
                f"installed with announce_captures={_announced}")
        return _installed
    import torch

    so = library()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "cuda_mempool_torch_alloc", "cuda_mempool_torch_free")
    hooks = alloc._allocator
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    hooks.set_record_stream_fn(addr(so.cuda_mempool_record_stream))
    hooks.set_reset_fn(addr(so.cuda_mempool_free_all_blocks))
    # The capture hooks go in either way: they also tell the pool not to synchronise the
    # device while a PyTorch capture runs. Only the announcement makes allocations trust them.
    hooked = all(
        hasattr(hooks, n)
        for n in ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
    )
    announced = announce_captures and hooked
    if hooked:
        hooks.set_begin_allocate_to_pool(addr(so.cuda_mempool_torch_begin_allocate_to_pool))
        hooks.set_end_allocate_to_pool_fn(addr(so.cuda_mempool_torch_end_allocate_to_pool))
        hooks.set_release_pool(addr(so.cuda_mempool_torch_release_pool))
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise CudarsError(f"cudars.torch.install: {e}") from e
    if announced:
        # After the hooks are in place and before any capture can run.
        so.cuda_mempool_torch_announce_captures()
    _installed = alloc
    _announced = announce_captures
    return alloc
