#!/usr/bin/env python3
"""Run a CuPy workload twice, on CuPy's default MemoryPool and on cuda-mempool's pool
(libcudars_mempool_capi.so through cupy.cuda.memory.CFunctionAllocator), and compare:
results step by step (exact equality), peak memory reserved as the driver sees it
(cudaMemGetInfo: total - free, minus the baseline before the first allocation, sampled
after every step), and median step time.

The workload: a loop of varying-size array operations on random data from a fixed seed
(matmuls, FFTs, reductions, elementwise chains, sorts), each step reduced to a few
numbers copied to the host. Each allocator runs in its own process, REPEATS times,
alternating.

Usage (from the GPU bundle, lib/ beside this script):
    python3 cupy_workload.py [--lib PATH] [--steps N] [--repeats N]
Exit status 0 when both runs complete with identical results, 1 otherwise (peak memory
and time are reported, not judged).
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
SEED = 4321
WARMUP = 5


def child(mode, lib, steps):
    import ctypes

    import cupy as cp
    import numpy as np

    so = None
    if mode in ("pool", "pool-history"):
        so = ctypes.CDLL(lib)
        malloc = ctypes.cast(so.cuda_mempool_cupy_malloc, ctypes.c_void_p).value
        free = ctypes.cast(so.cuda_mempool_cupy_free, ctypes.c_void_p).value
        # param is unused by the library; `so` keeps the functions alive.
        allocator = cp.cuda.memory.CFunctionAllocator(0, malloc, free, so)
        cp.cuda.set_allocator(allocator.malloc)
    if mode == "pool-history":
        # Issue 37 (history_workload.py): the recording starts before the first allocation.
        from history_workload import record_start

        record_start(so)
    # Both modes: no pinned pool difference, the default one in each.

    cp.cuda.Device(0).use()
    free0, total = cp.cuda.runtime.memGetInfo()  # creates the context
    baseline = total - free0

    host_rng = np.random.default_rng(SEED)
    rs = cp.random.RandomState(SEED)
    results, scans, times, shapes, peak = [], [], [], [], 0
    # Per step: the host's issue time (until the last operation is queued, before the final
    # copy that waits) and the GPU's span of the step (events around the same operations).
    issue_times, gpu_times = [], []
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    for step in range(steps):
        n = int(host_rng.integers(128, 2049))
        m = int(host_rng.integers(1 << 14, 1 << 21))
        k = int(host_rng.integers(2, 9))
        shapes.append([n, m, k])
        cp.cuda.Device(0).synchronize()
        start = time.perf_counter()
        ev0.record()
        a = rs.standard_normal((n, n), dtype=cp.float32)
        b = rs.standard_normal((n, n // 2 + 1), dtype=cp.float32)
        c = a @ b
        for _ in range(k):
            c = (cp.tanh(c @ b.T) @ b) * (1.0 / n)
        v = rs.standard_normal(m, dtype=cp.float64)
        spec = cp.fft.rfft(v)
        power = cp.abs(spec) ** 2
        w = cp.sort(v[: m // 4])
        parts = cp.stack([
            c.sum(dtype=cp.float64),
            (a * a).mean(dtype=cp.float64),
            power.sum(),
            w[w.size // 2],
            v.max(),
        ])
        # Not compared: CuPy's cumsum of a large float array goes through CUB's
        # decoupled look-back scan, whose rounding may vary from run to run.
        scan = cp.cumsum(v)[-1]
        ev1.record()
        issue_times.append(time.perf_counter() - start)
        values = cp.asnumpy(parts)  # synchronises
        scan_value = float(scan)
        del a, b, c, v, spec, power, w, parts, scan
        cp.cuda.Device(0).synchronize()
        times.append(time.perf_counter() - start)
        gpu_times.append(cp.cuda.get_elapsed_time(ev0, ev1) / 1e3)
        results.append([float(x).hex() for x in values])
        scans.append(scan_value.hex())
        free_now, _ = cp.cuda.runtime.memGetInfo()
        peak = max(peak, total - free_now - baseline)

    history = {}
    if mode == "pool-history":
        from history_workload import record_finish

        cp.cuda.Device(0).synchronize()
        history = record_finish(so, "cupy")
    # The allocator's own cost in this process, after the workload: cupy.empty + del of
    # 1 MiB on the current stream; ns a pair (median of 5 batches of 4000).
    samples = []
    for _ in range(1000):
        cp.empty(1 << 20, dtype=cp.uint8)
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(4000):
            cp.empty(1 << 20, dtype=cp.uint8)
        samples.append((time.perf_counter_ns() - t0) / 4000)
    extra = {"pair_ns": statistics.median(samples), **history}
    if so is not None:
        for name in ("used_bytes", "reserved_bytes", "peak_reserved_bytes"):
            fn = getattr(so, "cuda_mempool_" + name)
            fn.restype = ctypes.c_int64
            extra["pool_" + name] = fn(0)
        so.cuda_mempool_live_allocations.restype = ctypes.c_int64
        extra["pool_live_allocations"] = so.cuda_mempool_live_allocations()
        so.cuda_mempool_last_error.restype = ctypes.c_char_p
        err = so.cuda_mempool_last_error()
        extra["pool_last_error"] = err.decode() if err else None
    else:
        pool = cp.get_default_memory_pool()
        extra["cupy_pool_total_bytes"] = pool.total_bytes()
        extra["cupy_pool_used_bytes"] = pool.used_bytes()
    print("RESULT " + json.dumps({
        "mode": mode, "results": results, "scans": scans, "times": times, "shapes": shapes,
        "issue_times": issue_times, "gpu_times": gpu_times,
        "peak_reserved": peak, "baseline": baseline, **extra,
    }), flush=True)


def run_child(mode, lib, steps):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--lib", lib,
           "--steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    result = None
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    if out.returncode != 0 or result is None:
        sys.stdout.write(out.stdout)
        sys.stdout.write(out.stderr[-6000:])
        print(f"run '{mode}' failed with exit status {out.returncode}")
        return None
    return result


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", choices=["cupy", "pool", "pool-history"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.lib, args.steps)
        return 0
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found")
        return 1

    runs = {"cupy": [], "pool": []}
    for r in range(args.repeats):
        for mode in ("cupy", "pool"):
            res = run_child(mode, args.lib, args.steps)
            if res is None:
                print(f"FAIL: the '{mode}' run {r + 1} did not complete")
                return 1
            runs[mode].append(res)

    ref = runs["cupy"][0]
    print(f"cupy_workload: {args.steps} steps, {args.repeats} runs per allocator")
    for i, (a, b) in enumerate(zip(ref["results"], runs["pool"][0]["results"])):
        n, m, k = ref["shapes"][i]
        print(f"{i:4d} n={n:4d} m={m:7d} k={k}  sum(c)={float.fromhex(a[0]):+.6e} "
              f"fft power={float.fromhex(a[2]):.6e}  {'equal' if a == b else 'DIFFERENT'}")
    summary = {}
    for mode, rs in runs.items():
        steady = [t for r in rs for t in r["times"][WARMUP:]]
        summary[mode] = {
            "median": statistics.median(steady),
            "peak": max(r["peak_reserved"] for r in rs),
        }
        name = "CuPy MemoryPool" if mode == "cupy" else "cuda-mempool"
        stats = {k: v for k, v in rs[-1].items() if k.startswith(("pool_", "cupy_"))}
        print(f"{name}: median step {summary[mode]['median'] * 1e3:.3f} ms, peak reserved "
              f"(driver) {mib(summary[mode]['peak'])} (per run: "
              + ", ".join(mib(r["peak_reserved"]) for r in rs) + "); " + ", ".join(
                  f"{k} = {v}" for k, v in stats.items()))

    names = ["sum(c)", "mean(a*a)", "sum|rfft(v)|^2", "median(sort)", "max(v)"]
    all_results = [r["results"] for rs in runs.values() for r in rs]
    equal = all(x == ref["results"] for x in all_results)
    for mode, rs in runs.items():
        for j, r in enumerate(rs):
            diff = [f"step {i} {names[q]}" for i, (x, y) in enumerate(zip(ref["results"], r["results"]))
                    for q in range(len(names)) if x[q] != y[q]]
            print(f"{mode} run {j + 1} vs cupy run 1: {len(diff)} values differ"
                  + (": " + ", ".join(diff[:10]) if diff else ""))
    scan_var = {mode: sum(a != b for a, b in zip(rs[0]["scans"], rs[-1]["scans"]))
                for mode, rs in runs.items()}
    print(f"INFO (not judged): cumsum(v)[-1] differs between the first and last run of the same "
          f"allocator in {scan_var['cupy']} steps (CuPy pool) and {scan_var['pool']} steps (ours)")
    ratio_t = summary["pool"]["median"] / summary["cupy"]["median"]
    ratio_m = summary["pool"]["peak"] / max(summary["cupy"]["peak"], 1)
    print(f"{'PASS' if equal else 'FAIL'}: results identical step by step in all "
          f"{len(all_results)} runs")
    print(f"INFO: peak reserved ours {mib(summary['pool']['peak'])} vs CuPy's "
          f"{mib(summary['cupy']['peak'])} (ratio {ratio_m:.3f}); "
          f"{'PASS' if ratio_m <= 1.0 else 'higher'}")
    print(f"INFO: median step time ours {summary['pool']['median'] * 1e3:.3f} ms vs CuPy's "
          f"{summary['cupy']['median'] * 1e3:.3f} ms (ratio {ratio_t:.4f}); "
          f"{'within 3%' if ratio_t <= 1.03 else 'slower by more than 3%'}")
    print(f"cupy_workload: {'PASS' if equal else 'FAIL'}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
