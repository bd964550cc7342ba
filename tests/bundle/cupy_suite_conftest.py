"""conftest.py of cupy_own_tests.sh: CuPy's own stream, graph and DLPack tests run twice, on
CuPy's memory pool and on cuda-mempool.

With CUDA_MEMPOOL_CUPY_SUITE=ours, cuda_mempool_cupy.install() (lib/ on PYTHONPATH, the library
from CUDA_MEMPOOL_CAPI_LIB) makes the pool CuPy's allocator and cupy.get_default_memory_pool()
before any test runs (tests that swap the allocator restore get_default_memory_pool().malloc,
which is then ours). With CUDA_MEMPOOL_CUPY_SUITE=plain, CuPy's documented CFunctionAllocator
lines over cuda_mempool_cupy_malloc / cuda_mempool_cupy_free are used instead. Otherwise (cupy)
nothing changes: CuPy's own pool.
"""

import ctypes
import os

import pytest

_MODE = os.environ.get("CUDA_MEMPOOL_CUPY_SUITE", "cupy")

if _MODE == "ours" and os.environ.get("CUDARS_FROM_WHEEL") == "1":
    # The installed cudars wheel (issue 49): its one call.
    import cudars.cupy

    _POOL = cudars.cupy.install()
elif _MODE == "ours":
    import cuda_mempool_cupy

    _POOL = cuda_mempool_cupy.install(os.environ["CUDA_MEMPOOL_CAPI_LIB"])
elif _MODE == "plain":
    import cupy

    _SO = ctypes.CDLL(os.environ["CUDA_MEMPOOL_CAPI_LIB"])
    _ADDR = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    _ALLOC = cupy.cuda.memory.CFunctionAllocator(
        0, _ADDR(_SO.cuda_mempool_cupy_malloc), _ADDR(_SO.cuda_mempool_cupy_free), _SO)
    cupy.cuda.set_allocator(_ALLOC.malloc)
elif _MODE != "cupy":
    raise RuntimeError(f"CUDA_MEMPOOL_CUPY_SUITE={_MODE!r}: expected cupy, ours or plain")


def pytest_report_header(config):
    import cupy

    alloc = cupy.cuda.get_allocator()
    return [f"cuda-mempool suite mode: {_MODE}; CuPy {cupy.__version__}; allocator {alloc!r}"]


@pytest.fixture(autouse=True)
def _allocator_is_kept():
    """Each test starts on the suite's allocator (a test that swaps it must restore it)."""
    import cupy

    before = cupy.cuda.get_allocator()
    yield
    after = cupy.cuda.get_allocator()
    if _MODE != "cupy" and after is not before:
        cupy.cuda.set_allocator(before)
