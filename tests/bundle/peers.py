#!/usr/bin/env python3
"""The benchmark scenarios of the Rust suite, run through CuPy and PyTorch on the same GPU.

Usage: python3 peers.py [--traces DIR] [--replay-only]   (BENCH_OUT=DIR appends rows to DIR/peers.csv)

`--replay-only` runs only the trace replays. The replays run twice, each in a fresh process
(the allocator's settings are read when torch is first imported): peer "PyTorch" with the
default settings, and peer "PyTorch-expandable" with
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; `cargo xtask bench-report` shows the
second as its own column.

Each row: scenario, peer, value, unit -- the scenario names match the Rust benchmarks' rows, so
`cargo xtask bench-report` can put ours, the raw driver's, CuPy's and PyTorch's figures side by
side. Host-side costs are medians of batches after warm-up; device work is synchronised before
the host clock is read.
"""
import csv
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROWS = []


def row(scenario, peer, value, unit):
    ROWS.append((scenario, peer, value, unit))
    print(f"{scenario:<34} | {peer:<8} | {value:12.3f} {unit}", flush=True)


def ns_per_call(f, warmup=200, batches=15, per_batch=2000):
    for _ in range(warmup):
        f()
    samples = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        for _ in range(per_batch):
            f()
        samples.append((time.perf_counter_ns() - t) / per_batch)
    return statistics.median(samples)


def gbps(nbytes, f, sync, reps=5):
    f()
    sync()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        sync()
        samples.append(time.perf_counter() - t)
    return nbytes / statistics.median(samples) / 1e9


SIZES = [("512B", 512), ("1MiB", 1 << 20), ("64MiB", 64 << 20)]
XFER_SIZES = [("4KiB", 4 << 10), ("1MiB", 1 << 20), ("64MiB", 64 << 20), ("256MiB", 256 << 20), ("1GiB", 1 << 30)]


def guarded(name, fn):
    try:
        fn()
    except Exception as exc:  # one failing scenario group must not hide the others
        print(f"peers: {name} failed: {exc!r}", flush=True)


def cupy_rows():
    import cupy as cp

    for name, fn in (("CuPy pools", cupy_pools), ("CuPy wrappers", cupy_wrappers), ("CuPy graph", cupy_graph), ("CuPy transfers", cupy_transfers)):
        guarded(name, lambda: fn(cp))


def cupy_pools(cp):
    pool = cp.cuda.MemoryPool()
    for name, size in SIZES:
        row(f"pool_pair_{name}", "CuPy", ns_per_call(lambda: pool.malloc(size)), "ns")
    apool = cp.cuda.MemoryAsyncPool()
    for name, size in SIZES:
        row(f"async_pool_pair_{name}", "CuPy", ns_per_call(lambda: apool.malloc(size)), "ns")
    ppool = cp.cuda.PinnedMemoryPool()
    row("pinned_pool_pair", "CuPy", ns_per_call(lambda: ppool.malloc(4096)), "ns")
    pool.free_all_blocks()


def cupy_wrappers(cp):
    import cupyx

    s = cp.cuda.Stream(non_blocking=True)
    e = cp.cuda.Event(disable_timing=True)

    def rec_query():
        e.record(s)
        e.done

    row("event_record_query", "CuPy", ns_per_call(rec_query), "ns")
    row("stream_create_destroy", "CuPy", ns_per_call(lambda: cp.cuda.Stream(non_blocking=True), per_batch=500), "ns")
    mem = cp.cuda.alloc(4096)
    row("memset_issue", "CuPy", ns_per_call(lambda: mem.memset_async(0, 4096, s)), "ns")
    host = cupyx.empty_pinned((4096,), dtype=np.uint8)
    hptr = host.ctypes.data
    row("copy_4KiB_issue", "CuPy", ns_per_call(lambda: mem.copy_from_host_async(hptr, 4096, s)), "ns")
    s.synchronize()


def cupy_graph(cp):
    # 100 small operations: direct issue vs one graph replay.
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(1024, dtype=cp.float32)
    with s:
        def ops():
            for _ in range(100):
                x.fill(1.0)
        s.begin_capture()
        ops()
        g = s.end_capture()
        if hasattr(g, "upload"):
            g.upload(s)

        def direct():
            ops()
            s.synchronize()

        def replay():
            g.launch(s)
            s.synchronize()

        row("graph_100_ops_direct", "CuPy", ns_per_call(direct, warmup=20, batches=9, per_batch=20) / 1e3, "us")
        row("graph_100_ops", "CuPy", ns_per_call(replay, warmup=20, batches=9, per_batch=20) / 1e3, "us")


def cupy_transfers(cp):
    import cupyx

    dev = cp.cuda.Device(0)
    for name, size in XFER_SIZES:
        host = np.ones(size, dtype=np.uint8)
        d = cp.empty(size, dtype=cp.uint8)
        sync = dev.synchronize
        row(f"h2d_pageable_{name}", "CuPy", gbps(size, lambda: d.set(host), sync), "GB/s")
        row(f"d2h_pageable_{name}", "CuPy", gbps(size, lambda: d.get(out=host), sync), "GB/s")
        pinned = cupyx.empty_pinned((size,), dtype=np.uint8)
        row(f"h2d_pinned_{name}", "CuPy", gbps(size, lambda: d.set(pinned), sync), "GB/s")
        row(f"d2h_pinned_{name}", "CuPy", gbps(size, lambda: d.get(out=pinned), sync), "GB/s")
        del d, pinned, host


def torch_rows(_trace_dir):
    import torch

    for name, size in SIZES:
        row(f"pool_pair_{name}", "PyTorch", ns_per_call(lambda: torch.empty(size, dtype=torch.uint8, device="cuda")), "ns")
    row("pinned_pool_pair", "PyTorch", ns_per_call(lambda: torch.empty(4096, dtype=torch.uint8, pin_memory=True)), "ns")
    s = torch.cuda.Stream()
    e = torch.cuda.Event()

    def rec_query():
        e.record(s)
        e.query()

    row("event_record_query", "PyTorch", ns_per_call(rec_query), "ns")
    row("stream_create_destroy", "PyTorch", ns_per_call(lambda: torch.cuda.Stream(), per_batch=500), "ns")

    x = torch.zeros(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            for _ in range(100):
                x.fill_(1.0)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=side):
            for _ in range(100):
                x.fill_(1.0)

    def direct():
        for _ in range(100):
            x.fill_(1.0)
        torch.cuda.synchronize()

    def replay():
        g.replay()
        torch.cuda.synchronize()

    row("graph_100_ops_direct", "PyTorch", ns_per_call(direct, warmup=20, batches=9, per_batch=20) / 1e3, "us")
    row("graph_100_ops", "PyTorch", ns_per_call(replay, warmup=20, batches=9, per_batch=20) / 1e3, "us")

    for name, size in XFER_SIZES:
        d = torch.empty(size, dtype=torch.uint8, device="cuda")
        host = torch.ones(size, dtype=torch.uint8)
        pinned = torch.ones(size, dtype=torch.uint8).pin_memory()
        sync = torch.cuda.synchronize
        row(f"h2d_pageable_{name}", "PyTorch", gbps(size, lambda: d.copy_(host), sync), "GB/s")
        row(f"d2h_pageable_{name}", "PyTorch", gbps(size, lambda: host.copy_(d), sync), "GB/s")
        row(f"h2d_pinned_{name}", "PyTorch", gbps(size, lambda: d.copy_(pinned, non_blocking=True), sync), "GB/s")
        row(f"d2h_pinned_{name}", "PyTorch", gbps(size, lambda: pinned.copy_(d, non_blocking=True), sync), "GB/s")
        del d, host, pinned



def torch_traces(trace_dir, peer="PyTorch"):
    import torch

    # The recorded traces through PyTorch's caching allocator: peak reserved / peak requested.
    for trace in sorted(os.listdir(trace_dir)) if trace_dir and os.path.isdir(trace_dir) else []:
        if not trace.endswith(".trace"):
            continue
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        streams, live, sizes = {}, {}, {}
        requested = peak_requested = 0
        t0 = time.perf_counter()
        n = 0
        with open(os.path.join(trace_dir, trace)) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                parts = line.split()
                n += 1
                if parts[0] == "a":
                    sid = int(parts[3])
                    if sid not in streams:
                        streams[sid] = torch.cuda.current_stream() if sid == 0 else torch.cuda.Stream()
                    with torch.cuda.stream(streams[sid]):
                        live[parts[1]] = torch.empty(int(parts[2]), dtype=torch.uint8, device="cuda")
                    sizes[parts[1]] = int(parts[2])
                    requested += int(parts[2])
                    peak_requested = max(peak_requested, requested)
                else:
                    live.pop(parts[1], None)
                    requested -= sizes.pop(parts[1], 0)
        torch.cuda.synchronize()
        ns_op = (time.perf_counter() - t0) * 1e9 / max(n, 1)
        live.clear()
        ratio = torch.cuda.max_memory_reserved() / max(peak_requested, 1)
        name = trace[: -len(".trace")]
        row(f"replay_{name}", peer, ratio, "x")
        row(f"replay_{name}_ns_per_op", peer, ns_op, "ns")
        torch.cuda.empty_cache()


# The allocator settings of each replay process: (peer name, PYTORCH_CUDA_ALLOC_CONF or None).
REPLAY_PEERS = [("PyTorch", None), ("PyTorch-expandable", "expandable_segments:True")]


def replay_in_fresh_processes(trace_dir):
    """Each replay in its own process, the allocator configured before torch is imported."""
    for peer, conf in REPLAY_PEERS:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        cmd = [sys.executable, os.path.abspath(__file__), "--replay-child", peer]
        if trace_dir:
            cmd += ["--traces", trace_dir]
        r = subprocess.run(cmd, env=env)
        if r.returncode != 0:
            print(f"peers: replay as {peer} exited with {r.returncode}", flush=True)


def main():
    trace_dir = None
    if "--traces" in sys.argv:
        trace_dir = sys.argv[sys.argv.index("--traces") + 1]
    if "--replay-child" in sys.argv:
        # A child of `replay_in_fresh_processes`: its rows go to peers.csv like the parent's.
        peer = sys.argv[sys.argv.index("--replay-child") + 1]
        guarded(f"{peer} traces", lambda: torch_traces(trace_dir, peer))
    elif "--replay-only" in sys.argv:
        replay_in_fresh_processes(trace_dir)
    else:
        guarded("CuPy", cupy_rows)
        guarded("PyTorch", lambda: torch_rows(trace_dir))
        replay_in_fresh_processes(trace_dir)
    out = os.environ.get("BENCH_OUT")
    if out:
        path = os.path.join(out, "peers.csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["scenario", "peer", "value", "unit"])
            w.writerows(ROWS)


if __name__ == "__main__":
    main()
