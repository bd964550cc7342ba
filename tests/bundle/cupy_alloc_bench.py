#!/usr/bin/env python3
"""Benchmark (not a test): the cost of CuPy allocations through cuda-mempool.

1. Per-allocation cost, one process, same run: malloc + free of 1 MiB through
   (a) lib/cuda_mempool_cupy.py's allocator, (b) cupy.cuda.memory.CFunctionAllocator over
   cuda_mempool_cupy_malloc/free, (c) CuPy's own MemoryPool. Each: --iters pairs timed as one
   batch, --repeats batches, interleaved; median and interquartile range per pair.
2. The CuPy workload of cupy_workload.py (same steps, one process per run): median step time
   through the module vs CuPy's pool, --runs runs each, interleaved; median of the runs'
   medians and interquartile range. A verdict only where the difference exceeds the spread.

Usage: python3 cupy_alloc_bench.py [--lib PATH] [--iters N] [--repeats N] [--runs N] [--steps N]
       [--pairs-only]
(workload_bench.py runs part 1 with --pairs-only and part 2 itself, beside the PyTorch runs.)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.join(HERE, "lib", "libcudars_mempool_capi.so")
MIB = 1 << 20


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 4:
        return xs[0], statistics.median(xs), xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[1], q[2]


def pair_costs(args):
    import ctypes

    import cupy as cp

    if os.environ.get("CUDARS_FROM_WHEEL") == "1":
        from cudars import _cuda_mempool_cupy as cmp
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.lib)))
        import cuda_mempool_cupy as cmp

    cp.cuda.Device(0).use()
    module_pool = cmp.MemoryPool(args.lib)
    so = cmp.library()
    cfa = cp.cuda.memory.CFunctionAllocator(
        0, ctypes.cast(so.cuda_mempool_cupy_malloc, ctypes.c_void_p).value,
        ctypes.cast(so.cuda_mempool_cupy_free, ctypes.c_void_p).value, so)
    cupy_pool = cp.cuda.MemoryPool()
    allocs = {
        f"module ({module_pool.path} path)": module_pool.malloc,
    }
    # The C path's CuPy allocator without the module's size-rounding wrapper, to show what
    # that wrapper (mem.size reported at the pool's 512-byte rounding) costs.
    inner = [c.cell_contents for c in (module_pool.malloc.__closure__ or ())
             if type(c.cell_contents).__name__ == "builtin_function_or_method"]
    if inner:
        allocs[f"module ({module_pool.path} path, unwrapped)"] = inner[0]
    allocs |= {
        "module (python path)": cmp._make_python_malloc(so),
        "plain CFunctionAllocator": cfa.malloc,
        "CuPy MemoryPool": cupy_pool.malloc,
    }
    size = MIB
    for fn in allocs.values():  # warm: one block cached in each
        for _ in range(1000):
            fn(size)
    times = {k: [] for k in allocs}
    for _ in range(args.repeats):
        for name, fn in allocs.items():
            t0 = time.perf_counter_ns()
            for _ in range(args.iters):
                m = fn(size)
                del m
            times[name].append((time.perf_counter_ns() - t0) / args.iters)
    print(f"\nmalloc + free of 1 MiB, {args.iters} pairs x {args.repeats} repeats (ns a pair)")
    print(f"{'allocator':<36} {'median':>9} {'q1':>9} {'q3':>9} {'vs CuPy':>8}")
    ref = statistics.median(times["CuPy MemoryPool"])
    out = {}
    for name, ts in times.items():
        q1, med, q3 = quartiles(ts)
        out[name] = (q1, med, q3)
        print(f"{name:<36} {med:9.1f} {q1:9.1f} {q3:9.1f} {med / ref:7.2f}x")
    return out


def workload_child(mode, lib, steps):
    """One run of cupy_workload.py's workload; prints RESULT with its median step time."""
    sys.path.insert(0, HERE)
    libdir = os.path.dirname(os.path.abspath(lib))
    if not os.path.exists(os.path.join(libdir, "__init__.py")):
        # The bundle's lib/ (cuda_mempool_cupy.py). Never the installed wheel's package
        # folder: its cupy.py and torch.py would shadow the frameworks.
        sys.path.insert(0, libdir)
    import cupy as cp

    if mode == "module":
        import cuda_mempool_cupy as cmp

        pool = cmp.install(lib)
        print(f"MODULE_PATH {pool.path}", flush=True)
    elif mode == "wheel":
        import cudars.cupy

        pool = cudars.cupy.install()
        print(f"MODULE_PATH {pool.path} (cudars wheel)", flush=True)
    import cupy_workload

    # cupy_workload.child installs the CFunctionAllocator only for mode "pool"; "cupy" leaves
    # the current allocator (ours, when installed above) in place.
    cp.cuda.Device(0).use()
    cupy_workload.child("cupy", lib, steps)


def run_workload(mode, lib, steps):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", NCCL_NVLS_ENABLE="0")
    cmd = [sys.executable, os.path.abspath(__file__), "--workload-child", mode, "--lib", lib,
           "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            steady = res["times"][5:]
            return statistics.median(steady), res["peak_reserved"]
    sys.stdout.write(out.stdout[-3000:] + out.stderr[-3000:])
    raise SystemExit(f"workload run '{mode}' failed ({out.returncode})")


def workload(args):
    meds = {"module": [], "cupy": []}
    peaks = {"module": [], "cupy": []}
    for _ in range(args.runs):
        for mode in ("module", "cupy"):
            med, peak = run_workload(mode, args.lib, args.steps)
            meds[mode].append(med)
            peaks[mode].append(peak)
    print(f"\nCuPy workload (cupy_workload.py, {args.steps} steps), {args.runs} interleaved runs "
          "each: median step time (ms) of each run")
    print(f"{'allocator':<30} {'median':>9} {'q1':>9} {'q3':>9} {'IQR':>8} {'peak MiB':>9}")
    stats = {}
    for mode, label in (("module", "module (cuda_mempool_cupy)"), ("cupy", "CuPy MemoryPool")):
        q1, med, q3 = quartiles(meds[mode])
        stats[mode] = (q1, med, q3)
        print(f"{label:<30} {med * 1e3:9.3f} {q1 * 1e3:9.3f} {q3 * 1e3:9.3f} "
              f"{(q3 - q1) * 1e3:8.3f} {max(peaks[mode]) / MIB:9.1f}")
    ratio = stats["module"][1] / stats["cupy"][1]
    diff = stats["module"][1] - stats["cupy"][1]
    spread = max(stats["module"][2] - stats["module"][0], stats["cupy"][2] - stats["cupy"][0])
    if abs(diff) <= spread:
        verdict = "no difference beyond the spread"
    else:
        verdict = "module slower" if diff > 0 else "module faster"
    print(f"ratio module / CuPy {ratio:.4f}; difference {diff * 1e3:+.3f} ms, spread (larger IQR) "
          f"{spread * 1e3:.3f} ms: {verdict}")
    print(f"peak reserved ratio module / CuPy {max(peaks['module']) / max(max(peaks['cupy']), 1):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--iters", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workload-child")
    ap.add_argument("--pairs-only", action="store_true",
                    help="only part 1; ends with a line 'PAIRS <json>' (q1, median, q3 in ns)")
    args = ap.parse_args()
    if args.workload_child:
        workload_child(args.workload_child, args.lib, args.steps)
        return 0
    pairs = pair_costs(args)
    if args.pairs_only:
        print("PAIRS " + json.dumps(pairs), flush=True)
        return 0
    workload(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
