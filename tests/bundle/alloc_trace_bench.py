"""Replay an allocation trace (cudars_mempool::replay format) through CuPy's allocator interface,
with no kernels, and print the median time per operation over 7 passes after a warm one: the
allocator's own cost on a real program's sequence of sizes.

Usage: python3 alloc_trace_bench.py cupy|ours TRACE
  cupy  CuPy's own MemoryPool
  ours  lib/cuda_mempool_cupy.py installed (CUDA_MEMPOOL_CAPI_SEGMENTS=plain for plain segments)
"""
import sys, time, statistics, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
mode, path = sys.argv[1], sys.argv[2]
import cupy as cp
if mode == "ours":
    import cuda_mempool_cupy
    cuda_mempool_cupy.install()
ops = []
for line in open(path):
    f = line.split()
    if not f or f[0].startswith("#"):
        continue
    ops.append((f[0], int(f[1]), int(f[2]) if f[0] == "a" else 0))
cp.cuda.Device(0).use()
live = {}
def run():
    for k, i, s in ops:
        if k == "a":
            live[i] = cp.cuda.alloc(s)
        else:
            live.pop(i, None)
    live.clear()
run()
ts = []
for _ in range(7):
    t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
print(mode, "median us/op %.3f" % (statistics.median(ts) / len(ops) * 1e6), "ops", len(ops))
