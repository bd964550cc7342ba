#!/usr/bin/env python3
"""The cost of one DLPack exchange through lib/cudars_dlpack.abi3.so, each direction, beside the
frameworks' own exchanges in the same process: PyTorch -> CuPy (cupy.from_dlpack(torch_tensor))
and JAX -> PyTorch (torch.from_dlpack(jax_array)).

One exchange = the consumer's import call plus dropping what it made (so the producer's
deleter runs): the capsule, the checks, the stream argument and the release. Each figure is
the median over batches of 2,000 calls (after a warm-up), in nanoseconds a call; each row
prints our figure, the peer's and their ratio (ours / peer: below 1 is faster).

Rows:
  torch -> ours, __dlpack__, stream=1          cudars_dlpack.from_dlpack(t, stream=1): the
                                              consumer on the legacy stream, as CuPy's default
                                              (PyTorch then records no event)
  torch -> ours, __dlpack__, our stream        from_dlpack(t): our non-blocking consumer stream
                                              (PyTorch records an event and our stream waits)
  torch -> ours, C exchange API                from_dlpack(t, c_api=True, stream=1), where torch
                                              has __dlpack_c_exchange_api__ (DLPack 1.3)
  ours -> torch, torch.from_dlpack             beside JAX -> torch
  ours -> cupy, cupy.from_dlpack               beside torch -> cupy
  ours -> ours, C exchange API                 our Tensor's __dlpack_c_exchange_api__, beside
                                              the same exchange through __dlpack__
  capsule only                                 ours.__dlpack__(...) made and dropped, beside
                                              torch_tensor.__dlpack__(...)

Usage: python3 bench_dlpack.py [--lib DIR] [--batches N] [--per-batch N]
Rows are appended to $BENCH_OUT/dlpack.csv when BENCH_OUT is set.
"""

import argparse
import csv
import os
import statistics
import sys
import time

ROWS = []


def ns_per_call(f, warmup=500, batches=15, per_batch=2000):
    for _ in range(warmup):
        f()
    samples = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        for _ in range(per_batch):
            f()
        samples.append((time.perf_counter_ns() - t) / per_batch)
    return statistics.median(samples)


def measure(name, f, args):
    try:
        return ns_per_call(f, batches=args.batches, per_batch=args.per_batch)
    except Exception as e:  # noqa: BLE001
        print(f"FAIL: {name}: {type(e).__name__}: {e}", flush=True)
        return None


def row(ours_name, ours, peer_name, peer):
    ratio = (ours / peer) if ours and peer else None
    def fmt(v):
        return f"{v:10.0f} ns" if v is not None else "       n/a"

    shown = f"{ratio:.2f}" if ratio is not None else "n/a"
    print(f"{ours_name:<42} {fmt(ours)} | {peer_name:<36} {fmt(peer)} | ratio {shown}", flush=True)
    ROWS.append((ours_name, ours, peer_name, peer, ratio))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"),
                    help="folder holding cudars_dlpack.abi3.so")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--per-batch", type=int, default=2000)
    args = ap.parse_args()
    lib = args.lib if os.path.isdir(args.lib) else os.path.dirname(os.path.abspath(args.lib))
    sys.path.insert(0, lib)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import cudars_dlpack as cd
    import torch

    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        print(f"FAIL: import cupy: {e}")
        cupy = None
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        print(f"FAIL: import jax: {e}")
        jax = None

    print(f"torch {torch.__version__}, cupy {getattr(cupy, '__version__', '-')}, "
          f"jax {getattr(jax, '__version__', '-')}, device {torch.cuda.get_device_name(0)}", flush=True)
    x = torch.ones(1024, device="cuda")
    buf = cd.pool_alloc(4096)
    ours = buf.tensor("float32", (1024,))
    torch.cuda.synchronize()

    peer_torch_cupy = measure("torch -> cupy", lambda: cupy.from_dlpack(x), args) if cupy else None
    row("torch -> ours, __dlpack__, stream=1", measure("torch -> ours", lambda: cd.from_dlpack(x, stream=1), args),
        "torch -> cupy, cupy.from_dlpack", peer_torch_cupy)
    row("torch -> ours, __dlpack__, our stream", measure("torch -> ours (stream)", lambda: cd.from_dlpack(x), args),
        "torch -> cupy, cupy.from_dlpack", peer_torch_cupy)
    if cd.has_c_exchange_api(x):
        row("torch -> ours, C exchange API, stream=1",
            measure("torch -> ours (C API)", lambda: cd.from_dlpack(x, c_api=True, stream=1), args),
            "torch -> cupy, cupy.from_dlpack", peer_torch_cupy)
        row("torch -> ours, C exchange API, unordered",
            measure("torch -> ours (C API, -1)", lambda: cd.from_dlpack(x, c_api=True, stream=-1), args),
            "torch -> cupy, cupy.from_dlpack", peer_torch_cupy)
    else:
        print(f"INFO: torch {torch.__version__} has no __dlpack_c_exchange_api__: no C exchange API row", flush=True)

    peer_jax_torch = None
    if jax is not None:
        ja = jnp.ones(1024, dtype=jnp.float32)
        ja.block_until_ready()
        peer_jax_torch = measure("jax -> torch", lambda: torch.from_dlpack(ja), args)
    row("ours -> torch, torch.from_dlpack", measure("ours -> torch", lambda: torch.from_dlpack(ours), args),
        "jax -> torch, torch.from_dlpack", peer_jax_torch)
    if cupy is not None:
        row("ours -> cupy, cupy.from_dlpack", measure("ours -> cupy", lambda: cupy.from_dlpack(ours), args),
            "torch -> cupy, cupy.from_dlpack", peer_torch_cupy)
    row("ours -> ours, C exchange API, stream=1",
        measure("ours -> ours (C API)", lambda: cd.from_dlpack(ours, c_api=True, stream=1), args),
        "ours -> ours, __dlpack__, stream=1",
        measure("ours -> ours", lambda: cd.from_dlpack(ours, stream=1), args))
    row("capsule only: ours.__dlpack__",
        measure("ours capsule", lambda: ours.__dlpack__(stream=1, max_version=(1, 3)), args),
        "capsule only: torch.__dlpack__",
        measure("torch capsule", lambda: x.__dlpack__(stream=1, max_version=(1, 3)), args))
    torch.cuda.synchronize()
    s = cd.stats()
    print(f"stats after the run: {s}", flush=True)
    if s["live_exports"] != 0:
        print(f"FAIL: {s['live_exports']} exports still live after the run", flush=True)

    out = os.environ.get("BENCH_OUT")
    if out:
        path = os.path.join(out, "dlpack.csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["ours", "ours_ns", "peer", "peer_ns", "ratio"])
            w.writerows(ROWS)


if __name__ == "__main__":
    main()
