#!/usr/bin/env python3
"""Issue 37 on the GPU: the PyTorch and CuPy workloads (torch_workload.py, cupy_workload.py) on
cuda-mempool's pool through the C ABI, with the memory history recording and without,
alternately, each in its own process.

With recording (mode "pool-history"), `cuda_mempool_history_start` runs before the workload's
first allocation; after the last step the recording is stopped and dumped
(`cuda_mempool_history_dump`: the HTML report and PyTorch's snapshot pickle) into --out.

Checks, per workload: the results are identical with and without recording; each report's
peak reserved equals the pool's own peak (`cuda_mempool_peak_reserved_bytes`) and its peak
active is positive and no higher; nothing was dropped from the ring; PyTorch's memory_viz
reads the snapshot. Measures the step time of each side (median over every step after the
warm-up of every run, and the interquartile range) and prints the recording's cost; a cost
counts only where the difference of the medians exceeds the spread.

Usage (from the GPU bundle): python3 history_workload.py [--lib PATH] [--steps N]
    [--repeats N] [--out DIR] [--only torch|cupy]
Prints PASS/FAIL lines and "N passed, N failed"; exit status 1 on any failure.
"""

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.join(HERE, "lib", "libcudars_mempool_capi.so")


def record_start(so):
    """In a workload's child: starts the recording (the pool's default ring, 1,000,000)."""
    so.cuda_mempool_history_start.restype = ctypes.c_int
    so.cuda_mempool_history_start.argtypes = [ctypes.c_size_t]
    if so.cuda_mempool_history_start(0) != 0:
        so.cuda_mempool_last_error.restype = ctypes.c_char_p
        raise RuntimeError(f"cuda_mempool_history_start: {so.cuda_mempool_last_error()}")


def record_finish(so, tag):
    """In a workload's child: stops the recording, dumps it into $CUDARS_HISTORY_OUT as
    TAG.html and TAG.pickle, and returns the figures to compare."""
    out = os.environ.get("CUDARS_HISTORY_OUT") or "."
    os.makedirs(out, exist_ok=True)
    so.cuda_mempool_peak_reserved_bytes.restype = ctypes.c_int64
    pool_peak = so.cuda_mempool_peak_reserved_bytes(0)
    so.cuda_mempool_history_stop()
    html, pickle_path = os.path.join(out, tag + ".html"), os.path.join(out, tag + ".pickle")
    so.cuda_mempool_history_dump.argtypes = [ctypes.c_char_p, ctypes.c_int]
    for path, fmt in ((html, 0), (pickle_path, 1)):
        if so.cuda_mempool_history_dump(os.fsencode(path), fmt) != 0:
            so.cuda_mempool_last_error.restype = ctypes.c_char_p
            raise RuntimeError(f"cuda_mempool_history_dump: {so.cuda_mempool_last_error()}")
    text = open(html, encoding="utf-8").read()

    def field(name):
        m = re.search(r'"%s":(\d+)' % name, text)
        return int(m.group(1)) if m else -1

    return {"history_pool_peak_reserved": pool_peak,
            "history_peak_reserved": field("peak_reserved"),
            "history_peak_active": field("peak_active"),
            "history_events": field("events"), "history_dropped": field("dropped"),
            "history_report": html, "history_snapshot": pickle_path,
            "history_report_bytes": len(text)}


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "history-out"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import cupy_workload
    import torch_workload

    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("PASS: " if ok else "FAIL: ") + what, flush=True)
        passed, failed = passed + bool(ok), failed + (not ok)

    workloads = [("torch", torch_workload, "losses", torch_workload.WARMUP),
                 ("cupy", cupy_workload, "results", cupy_workload.WARMUP)]
    for name, module, key, warmup in workloads:
        if args.only and args.only != name:
            continue
        print(f"=== {name}: {args.repeats} runs each, {args.steps} steps, alternating", flush=True)
        runs = {"pool": [], "pool-history": []}
        for r in range(args.repeats):
            order = ["pool", "pool-history"] if r % 2 == 0 else ["pool-history", "pool"]
            for mode in order:
                os.environ["CUDARS_HISTORY_OUT"] = os.path.join(args.out, f"{name}_{r}")
                res = module.run_child(mode, os.path.abspath(args.lib), args.steps)
                if res is None:
                    check(False, f"{name} {mode} run {r} completed")
                    continue
                runs[mode].append(res)
        if not runs["pool"] or not runs["pool-history"]:
            check(False, f"{name}: both sides ran")
            continue
        first = runs["pool"][0][key]
        same = all(r[key] == first for side in runs.values() for r in side)
        check(same, f"{name}: results identical with and without recording "
                    f"({len(runs['pool']) + len(runs['pool-history'])} runs)")
        for i, h in enumerate(runs["pool-history"]):
            print(f"INFO: {name} recording {i}: {h['history_events']} events, report "
                  f"{h['history_report_bytes']} bytes, peak active {h['history_peak_active']}, "
                  f"peak reserved {h['history_peak_reserved']}, pool's peak reserved "
                  f"{h['history_pool_peak_reserved']}", flush=True)
            check(h["history_peak_reserved"] == h["history_pool_peak_reserved"],
                  f"{name} recording {i}: the report's peak reserved is the pool's "
                  f"({h['history_peak_reserved']} = {h['history_pool_peak_reserved']})")
            check(0 < h["history_peak_active"] <= h["history_peak_reserved"],
                  f"{name} recording {i}: peak active {h['history_peak_active']} within it")
            check(h["history_dropped"] == 0, f"{name} recording {i}: nothing dropped")
        last = runs["pool-history"][-1]["history_snapshot"]
        v = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", last],
                           capture_output=True, text=True, timeout=300)
        check(v.returncode == 0, f"{name}: PyTorch's memory_viz reads the snapshot "
                                 f"({(v.stdout + v.stderr).strip().splitlines()[:1]})")
        steps = {m: [t for r in side for t in r["times"][warmup:]] for m, side in runs.items()}
        q_off, q_on = quartiles(steps["pool"]), quartiles(steps["pool-history"])
        spread = max(q_off[2] - q_off[0], q_on[2] - q_on[0])
        diff = q_on[1] - q_off[1]
        verdict = ("exceeds the spread" if abs(diff) > spread else "within the spread")
        print(f"ROW {name} step time: recording off median {q_off[1] * 1e3:.3f} ms "
              f"(IQR {q_off[0] * 1e3:.3f}-{q_off[2] * 1e3:.3f}), on median {q_on[1] * 1e3:.3f} ms "
              f"(IQR {q_on[0] * 1e3:.3f}-{q_on[2] * 1e3:.3f}), ratio {q_on[1] / q_off[1]:.3f}, "
              f"difference {diff * 1e3:+.3f} ms: {verdict}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
