#!/usr/bin/env python3
"""GPU smoke test of the C API through ctypes (no framework): allocation, statistics,
errors with messages, limits, free_all_blocks. Run on a machine with a GPU:

    python3 gpu_smoke.py path/to/libcudars_mempool_capi.so

Exit status 0 when every check passes; each failed check is printed.
"""

import ctypes
import sys

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def main(path):
    so = ctypes.CDLL(path)
    vp, i64, cint, szt = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    so.cuda_mempool_torch_alloc.restype = vp
    so.cuda_mempool_torch_alloc.argtypes = [ctypes.c_ssize_t, cint, vp]
    so.cuda_mempool_torch_free.restype = None
    so.cuda_mempool_torch_free.argtypes = [vp, ctypes.c_ssize_t, cint, vp]
    so.cuda_mempool_cupy_malloc.restype = vp
    so.cuda_mempool_cupy_malloc.argtypes = [vp, szt, cint]
    so.cuda_mempool_cupy_free.restype = None
    so.cuda_mempool_cupy_free.argtypes = [vp, vp, cint]
    for name in ("used_bytes", "reserved_bytes", "peak_reserved_bytes", "get_limit"):
        getattr(so, "cuda_mempool_" + name).restype = i64
        getattr(so, "cuda_mempool_" + name).argtypes = [cint]
    so.cuda_mempool_live_allocations.restype = i64
    so.cuda_mempool_set_limit.argtypes = [cint, szt]
    so.cuda_mempool_last_error.restype = ctypes.c_char_p
    so.cuda_mempool_record_stream.argtypes = [vp, vp]

    def err():
        e = so.cuda_mempool_last_error()
        return e.decode() if e else None

    p = so.cuda_mempool_torch_alloc(3 << 20, 0, None)
    check(bool(p) and p % 512 == 0, f"torch_alloc 3 MiB -> {p and hex(p)} ({err()})")
    q = so.cuda_mempool_cupy_malloc(None, 1000, 0)
    check(bool(q) and q != p, f"cupy_malloc 1000 B -> {q and hex(q)}")
    check(so.cuda_mempool_used_bytes(0) == (3 << 20) + 1024,
          f"used_bytes = {so.cuda_mempool_used_bytes(0)} (3 MiB + 1024)")
    check(so.cuda_mempool_reserved_bytes(0) >= (3 << 20) + 1024,
          f"reserved_bytes = {so.cuda_mempool_reserved_bytes(0)}")
    check(so.cuda_mempool_live_allocations() == 2, "two live allocations")
    check(so.cuda_mempool_record_stream(p, None) == 0, "record_stream on a live block")

    so.cuda_mempool_torch_free(p, 3 << 20, 0, None)
    so.cuda_mempool_cupy_free(None, q, 0)
    check(so.cuda_mempool_used_bytes(0) == 0, "used_bytes back to 0")
    check(so.cuda_mempool_live_allocations() == 0, "no live allocations")
    p2 = so.cuda_mempool_torch_alloc(3 << 20, 0, None)
    check(p2 == p, "the freed block is reused on the same stream")
    so.cuda_mempool_torch_free(p2, 3 << 20, 0, None)

    so.cuda_mempool_clear_error()
    so.cuda_mempool_torch_free(p2, 3 << 20, 0, None)
    e = err()
    check(e is not None and "not a live allocation" in e, f"double free reported: {e}")

    check(so.cuda_mempool_free_all_blocks() == 0, "free_all_blocks")
    check(so.cuda_mempool_reserved_bytes(0) == 0,
          f"reserved after free_all_blocks = {so.cuda_mempool_reserved_bytes(0)}")
    check(so.cuda_mempool_peak_reserved_bytes(0) >= (3 << 20),
          f"peak_reserved = {so.cuda_mempool_peak_reserved_bytes(0)}")

    check(so.cuda_mempool_set_limit(0, 64 << 20) == 0, "set_limit 64 MiB")
    check(so.cuda_mempool_get_limit(0) == 64 << 20, "get_limit 64 MiB")
    big = so.cuda_mempool_torch_alloc(100 << 20, 0, None)
    e = err()
    check(not big and e is not None and "out of memory" in e, f"over the limit: null, {e}")
    check(so.cuda_mempool_set_limit(0, 0) == 0 and so.cuda_mempool_get_limit(0) == 0,
          "limit removed")
    big = so.cuda_mempool_torch_alloc(100 << 20, 0, None)
    check(bool(big), "100 MiB after removing the limit")
    so.cuda_mempool_clear_error()
    check(so.cuda_mempool_set_limit(0, 1 << 20) == -1 and "below" in (err() or ""),
          f"a limit below usage is refused: {err()}")
    so.cuda_mempool_torch_free(big, 100 << 20, 0, None)

    check(not so.cuda_mempool_torch_alloc(1 << 20, 7, None) and "device" in (err() or ""),
          f"invalid device: {err()}")
    check(so.cuda_mempool_free_all_blocks() == 0 and so.cuda_mempool_reserved_bytes(0) == 0,
          "everything returned at the end")
    print(f"gpu_smoke: {'PASS' if not failures else 'FAIL'} ({len(failures)} failed)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
