#!/usr/bin/env python3
"""Issue 49: which PyTorch route should `cudars.torch.install()` take? Probe (not a test).

Two routes, each in a fresh process (PyTorch picks its allocator once):
  current  cudars.torch.install(): our allocator replaces PyTorch's (change_current_allocator)
  mempool  PyTorch's caching allocator stays; a torch.cuda.MemPool whose allocator is ours
           (torch.cuda.MemPool(CUDAPluggableAllocator(...)._allocator)); tensors made under
           torch.cuda.use_mem_pool(pool) come from PyTorch's cache of our segments
Per route: (1) out of memory (our limit 256 MiB, then a 1 GiB tensor): the exception's type;
(2) torch.cuda.graph: a small MLP training step captured and replayed, its losses against eager
steps; (3) torch.empty(1 MiB) + del on a torch.cuda.Stream, ns a pair (median of 5 batches);
(4) whether our pool saw the memory (cudars.stats()).

Usage: python3 torch_mempool_probe.py            (runs both routes, prints one line per result)
       needs the cudars wheel importable (PYTHONPATH)
"""

import json
import os
import statistics
import subprocess
import sys
import time


def pair_ns(make, batches=5, pairs=20000):
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(pairs // batches):
            make()
        out.append((time.perf_counter_ns() - t0) / (pairs // batches))
    return statistics.median(out)


def child(route):
    import ctypes

    import torch

    import cudars
    import cudars.torch

    res = {"route": route}
    pool = None
    if route == "current":
        cudars.torch.install()
    else:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            cudars.library_path(), "cuda_mempool_torch_alloc", "cuda_mempool_torch_free")
        try:
            pool = torch.cuda.MemPool(alloc._allocator)
        except Exception as e:  # noqa: BLE001
            res["mempool_error"] = f"{type(e).__name__}: {e}"[:300]
            print("RESULT " + json.dumps(res))
            return

    import contextlib

    def scope():
        return torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()

    dev = torch.device("cuda", 0)
    so = cudars.library()
    side = torch.cuda.Stream()
    # (3) the pair
    with scope(), torch.cuda.stream(side):
        torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        res["pair_stream_ns"] = pair_ns(lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev))
        keep = torch.empty(8 << 20, dtype=torch.uint8, device=dev)
        res["pool_used_bytes_with_8MiB_live"] = cudars.stats()["used_bytes"]
        del keep
    torch.cuda.synchronize()
    # (2) graph
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 4)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 64, device=dev)
        y = torch.randint(0, 4, (32,), device=dev)
        loss_fn = torch.nn.CrossEntropyLoss()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        kw = {"pool": pool.id} if pool is not None else {}
        with scope(), torch.cuda.graph(g, **kw):
            static_loss = loss_fn(model(x), y)
            static_loss.backward()
            opt.step()
        losses = []
        for _ in range(10):
            g.replay()
            losses.append(static_loss.item())
        res["graph"] = "ok" if all(a == a for a in losses) and losses[-1] < losses[0] else \
            f"losses do not fall: {losses}"
        del g
    except Exception as e:  # noqa: BLE001
        res["graph"] = f"{type(e).__name__}: {str(e)[:300]}"
    torch.cuda.synchronize()
    # (1) out of memory
    if so.cuda_mempool_set_limit(0, 256 << 20) != 0:
        res["oom"] = "set_limit failed"
    else:
        try:
            with scope():
                t = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
            res["oom"] = f"no error (tensor at {t.data_ptr():#x})"
        except Exception as e:  # noqa: BLE001
            res["oom"] = f"{type(e).__module__}.{type(e).__name__}"
            res["oom_is_torch_OutOfMemoryError"] = isinstance(e, torch.OutOfMemoryError)
            res["oom_message"] = str(e)[:160]
        so.cuda_mempool_set_limit(0, 0)
    print("RESULT " + json.dumps(res), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    for route in ("current", "mempool"):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", route],
                           capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            print(f"{route}: no result (exit {p.returncode}): {p.stderr[-1500:]}")
            continue
        r = json.loads(lines[-1][7:])
        for k, v in r.items():
            print(f"{route:8} {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
