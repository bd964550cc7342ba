#!/usr/bin/env python3
"""Train a small transformer language model twice, on PyTorch's own caching allocator and
on cuda-mempool's pool (libcudars_mempool_capi.so through CUDAPluggableAllocator), and
compare: losses step by step (exact equality), peak memory reserved as the driver sees it
(cuMemGetInfo: total - free, minus the baseline before the first allocation, sampled after
every step), and median step time.

Each run is a separate process (an allocator can be swapped only before CUDA is used).
The two allocators are run alternately, REPEATS times each; losses must be identical in
every run, the peak is the highest of an allocator's runs, and the step time is the
median over all steps of all its runs after WARMUP steps.

Usage (from the GPU bundle, lib/ beside this script):
    python3 torch_workload.py [--lib PATH] [--steps N] [--repeats N]
Exit status 0 when every criterion passes, 1 otherwise.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = os.path.join(HERE, "lib", "libcudars_mempool_capi.so")

SEED = 1234
VOCAB = 2048
D_MODEL = 512
HEADS = 8
LAYERS = 4
D_FF = 2048
BATCH = 16
MIN_LEN, MAX_LEN = 48, 512
WARMUP = 5
TIME_TOLERANCE = 1.03


PAIRS = 20000


def alloc_pair_ns(make, batches=5, pairs=PAIRS):
    """Median ns of one allocation + free made by `make` (the object dropped at once)."""
    import time as _time

    for _ in range(1000):
        make()
    samples = []
    for _ in range(batches):
        t0 = _time.perf_counter_ns()
        for _ in range(pairs // batches):
            make()
        samples.append((_time.perf_counter_ns() - t0) / (pairs // batches))
    return statistics.median(samples)


def child(mode, lib, steps):
    # The allocator must be swapped before anything initialises CUDA in PyTorch.
    import torch

    history_so = None
    if mode == "wheel":
        # The installed `cudars` wheel's one call (record_stream, empty_cache, capture hooks).
        import cudars.torch

        cudars.torch.install()
        lib = cudars.library_path()
    if mode in ("pool", "pool-history"):
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            lib, "cuda_mempool_torch_alloc", "cuda_mempool_torch_free"
        )
        torch.cuda.memory.change_current_allocator(alloc)
    if mode == "pool-history":
        # Issue 37 (history_workload.py): the recording starts before the first allocation.
        import ctypes

        from history_workload import record_start

        history_so = ctypes.CDLL(lib)  # the library instance PyTorch loaded
        record_start(history_so)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    dev = torch.device("cuda", 0)

    free0, total = torch.cuda.mem_get_info(dev)  # creates the context, allocates nothing
    baseline = total - free0

    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(SEED)  # CPU generator: same data in every run

    def param(*shape, scale):
        return torch.nn.Parameter((torch.randn(*shape, generator=gen) * scale).to(dev))

    emb = param(VOCAB, D_MODEL, scale=0.02)
    pos = param(MAX_LEN, D_MODEL, scale=0.02)
    layers = []
    for _ in range(LAYERS):
        layers.append(
            {
                "ln1_w": torch.nn.Parameter(torch.ones(D_MODEL, device=dev)),
                "ln1_b": torch.nn.Parameter(torch.zeros(D_MODEL, device=dev)),
                "qkv": param(3 * D_MODEL, D_MODEL, scale=D_MODEL ** -0.5),
                "proj": param(D_MODEL, D_MODEL, scale=D_MODEL ** -0.5 / math.sqrt(2 * LAYERS)),
                "ln2_w": torch.nn.Parameter(torch.ones(D_MODEL, device=dev)),
                "ln2_b": torch.nn.Parameter(torch.zeros(D_MODEL, device=dev)),
                "fc1": param(D_FF, D_MODEL, scale=D_MODEL ** -0.5),
                "fc2": param(D_MODEL, D_FF, scale=D_FF ** -0.5 / math.sqrt(2 * LAYERS)),
            }
        )
    lnf_w = torch.nn.Parameter(torch.ones(D_MODEL, device=dev))
    lnf_b = torch.nn.Parameter(torch.zeros(D_MODEL, device=dev))
    params = [emb, pos, lnf_w, lnf_b] + [p for l in layers for p in l.values()]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)

    def forward(tokens, targets):
        b, t = tokens.shape
        # One-hot products instead of embedding lookups and gathers: every backward is
        # a matmul or elementwise, deterministic without special kernels.
        onehot = F.one_hot(tokens, VOCAB).to(emb.dtype)
        x = onehot @ emb + pos[:t]
        mask = torch.ones(t, t, device=dev, dtype=torch.bool).triu(1)
        hd = D_MODEL // HEADS
        for l in layers:
            h = F.layer_norm(x, (D_MODEL,), l["ln1_w"], l["ln1_b"])
            q, k, v = (h @ l["qkv"].t()).split(D_MODEL, dim=-1)
            q = q.view(b, t, HEADS, hd).transpose(1, 2)
            k = k.view(b, t, HEADS, hd).transpose(1, 2)
            v = v.view(b, t, HEADS, hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (hd ** -0.5)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, D_MODEL)
            x = x + y @ l["proj"].t()
            h = F.layer_norm(x, (D_MODEL,), l["ln2_w"], l["ln2_b"])
            x = x + F.gelu(h @ l["fc1"].t()) @ l["fc2"].t()
        x = F.layer_norm(x, (D_MODEL,), lnf_w, lnf_b)
        logits = x @ emb.t()
        logp = logits.log_softmax(dim=-1)
        target_onehot = F.one_hot(targets, VOCAB).to(logp.dtype)
        return -(logp * target_onehot).sum(dim=-1).mean()

    losses, times, lengths, peak = [], [], [], 0
    for step in range(steps):
        t = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=gen))
        seq = torch.randint(0, VOCAB, (BATCH, t + 1), generator=gen)
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        seq = seq.to(dev)
        loss = forward(seq[:, :-1], seq[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronises
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - start)
        losses.append(value)
        lengths.append(t)
        free, _ = torch.cuda.mem_get_info(dev)
        peak = max(peak, total - free - baseline)

    history = {}
    if history_so is not None:
        from history_workload import record_finish

        torch.cuda.synchronize(dev)
        history = record_finish(history_so, "torch")
    # The allocator's own cost in this process, after the workload: torch.empty + del of
    # 1 MiB on the current (default) stream, PAIRS times; ns a pair (median of 5 batches).
    extra = {"pair_ns": alloc_pair_ns(lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev)),
             **history}
    # The same on a stream PyTorch created (torch.cuda.Stream: a handle the allocator did not
    # make, what issue 49's fast path serves).
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        extra["pair_stream_ns"] = alloc_pair_ns(
            lambda: torch.empty(1 << 20, dtype=torch.uint8, device=dev))
    if mode in ("pool", "pool-history", "wheel"):
        import ctypes

        so = ctypes.CDLL(lib)  # the same library instance PyTorch loaded
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
        extra["torch_max_memory_reserved"] = torch.cuda.max_memory_reserved(dev)
    print(
        "RESULT "
        + json.dumps(
            {
                "mode": mode,
                "losses": [float.hex(v) for v in losses],
                "times": times,
                "lengths": lengths,
                "peak_reserved": peak,
                "baseline": baseline,
                **extra,
            }
        ),
        flush=True,
    )


def run_child(mode, lib, steps):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
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


def show(key, value):
    """A statistic for printing: byte counts also in MiB."""
    if isinstance(value, int) and ("bytes" in key or "reserved" in key):
        return f"{value} ({mib(value)})"
    return value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", choices=["torch", "pool", "pool-history"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.lib, args.steps)
        return 0
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found")
        return 1

    runs = {"torch": [], "pool": []}
    for r in range(args.repeats):
        for mode in ("torch", "pool"):
            res = run_child(mode, args.lib, args.steps)
            if res is None:
                print(f"FAIL: the '{mode}' run {r + 1} did not complete")
                return 1
            runs[mode].append(res)

    ref = runs["torch"][0]
    print(f"torch_workload: {LAYERS} layers, d_model {D_MODEL}, vocab {VOCAB}, batch {BATCH}, "
          f"{args.steps} steps, sequence lengths {MIN_LEN}..{MAX_LEN}, {args.repeats} runs each")
    print(f"sequence lengths: {ref['lengths']}")
    print("step  len  loss(torch allocator)       loss(cuda-mempool)          equal")
    for i, (a, b) in enumerate(zip(ref["losses"], runs["pool"][0]["losses"])):
        fa, fb = float.fromhex(a), float.fromhex(b)
        print(f"{i:4d} {ref['lengths'][i]:4d}  {fa:.10f} ({a})  {fb:.10f} ({b})  "
              f"{'yes' if a == b else 'NO'}")

    summary = {}
    for mode, rs in runs.items():
        steady = [t for r in rs for t in r["times"][WARMUP:]]
        summary[mode] = {
            "median": statistics.median(steady),
            "medians": [statistics.median(r["times"][WARMUP:]) for r in rs],
            "peak": max(r["peak_reserved"] for r in rs),
            "peaks": [r["peak_reserved"] for r in rs],
        }
        for k, v in rs[-1].items():
            if k.startswith("pool_") or k.startswith("torch_"):
                summary[mode][k] = v
    for mode, name in (("torch", "PyTorch caching allocator"), ("pool", "cuda-mempool")):
        s = summary[mode]
        print(f"{name}: median step {s['median'] * 1e3:.3f} ms (per run: "
              + ", ".join(f"{m * 1e3:.3f}" for m in s["medians"])
              + f"), peak reserved (driver) {mib(s['peak'])} (per run: "
              + ", ".join(mib(p) for p in s["peaks"]) + ")")
        details = {k: v for k, v in s.items() if k.startswith(("pool_", "torch_"))}
        if details:
            print("    " + ", ".join(f"{k} = {show(k, v)}" for k, v in details.items()))

    pairs = [statistics.median(p["times"][WARMUP:]) / statistics.median(t["times"][WARMUP:])
             for t, p in zip(runs["torch"], runs["pool"])]
    print("step time ratio ours/PyTorch per pair of runs: " + ", ".join(f"{x:.4f}" for x in pairs))
    all_losses = [r["losses"] for rs in runs.values() for r in rs]
    losses_equal = all(l == ref["losses"] for l in all_losses)
    mismatches = sum(a != b for a, b in zip(ref["losses"], runs["pool"][0]["losses"]))
    peak_ok = summary["pool"]["peak"] <= summary["torch"]["peak"]
    ratio = summary["pool"]["median"] / summary["torch"]["median"]
    time_ok = ratio <= TIME_TOLERANCE
    print(f"{'PASS' if losses_equal else 'FAIL'}: losses identical step by step in all "
          f"{len(all_losses)} runs ({mismatches} of {len(ref['losses'])} steps differ between the "
          f"first torch and pool runs)")
    print(f"{'PASS' if peak_ok else 'FAIL'}: peak reserved ours {mib(summary['pool']['peak'])} <= "
          f"PyTorch's {mib(summary['torch']['peak'])} "
          f"(ratio {summary['pool']['peak'] / max(summary['torch']['peak'], 1):.3f})")
    print(f"{'PASS' if time_ok else 'FAIL'}: median step time ours "
          f"{summary['pool']['median'] * 1e3:.3f} ms vs PyTorch's "
          f"{summary['torch']['median'] * 1e3:.3f} ms, ratio {ratio:.4f} (limit {TIME_TOLERANCE})")
    ok = losses_equal and peak_ok and time_ok
    print(f"torch_workload: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
