#!/usr/bin/env python3
"""Benchmark (not a test): the PyTorch and CuPy workloads through the C ABI, each allocator in
fresh processes, runs interleaved, with medians, spreads and verdicts.

PyTorch (torch_workload.py's training loop: a 4-layer transformer LM, varying sequence
lengths): three allocators, one process a run (the allocator is chosen once a process):
  ours        libcudars_mempool_capi.so through torch.cuda.memory.CUDAPluggableAllocator
  default     PyTorch's caching allocator
  expandable  PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
CuPy (cupy_workload.py's loop: matmuls, FFTs, sorts, reductions of varying sizes):
  ours        lib/cuda_mempool_cupy.py installed (its C path: CuPy's CFunctionAllocator calling
              the library, CuPy's current stream learnt in C)
  cupy        CuPy's own MemoryPool
With --with-plain, both also run "ours-plain": ours on the C API's own pool of plain cuMemAlloc
segments (CUDA_MEMPOOL_CAPI_SEGMENTS=plain) instead of the default pool's virtual-memory ones.

--runs rounds; each round runs every allocator once, in an order rotated from round to round
(so no allocator always runs first or last). Per run: the median step time of the steps after
the first --warmup (they include library loading, kernel compilation, cuBLAS/cuFFT plans and
the pool's growth), and the peak reserved memory as the driver sees it (cudaMemGetInfo: total -
free, minus the process's baseline before its first allocation, sampled after every step).
Per allocator: the median over runs and the interquartile range (IQR, q3 - q1) of both.

Verdicts: for a target "ours <= k x peer", the difference d = median(ours) - k * median(peer)
is compared with the spread s = max(IQR(ours), k * IQR(peer)): d < -s: met ("yes"); d > s:
missed ("NO"); otherwise "within spread" (the runs cannot tell). Each process also measures its
allocator's own cost (1 MiB allocation + free, ns a pair) after its workload.

Rows go to $BENCH_OUT/results.csv (bench "workload_torch" / "workload_cupy", the peer's median
in the raw column) for `cargo xtask bench-report`, and everything per run to
$BENCH_OUT/workloads.json.

Usage: python3 workload_bench.py [--lib PATH] [--runs 8] [--torch-steps 40] [--cupy-steps 60]
           [--warmup 10] [--only torch|cupy] [--budget SECONDS]
--budget stops starting new rounds once that much time has passed (the rows then say how many
runs they have). Every run is pinned to the same CPUs (--cpus), so that runs do not differ by
where the scheduler put them. PyTorch runs are forked from this process after it imported torch
(CUDA untouched, so each child still picks its allocator before CUDA starts; --spawn starts a new
interpreter instead): a spawned run spent most of its ~10 s importing torch on the H200 machine.
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
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


CPUS = None  # the CPU set every run is pinned to (main sets it)


def parse_output(stdout):
    result, path = None, None
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        elif line.startswith("MODULE_PATH "):
            path = line.split()[1]
    if result is not None and path:
        result["module_path"] = path
    return result


def child_env(env_extra):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0",
               NCCL_NVLS_ENABLE="0")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # only the runs that ask for it get it
    env.update(env_extra)
    return env


def pin():
    if CPUS:
        os.sched_setaffinity(0, CPUS)


def run_child(cmd, env_extra):
    out = subprocess.run(cmd, env=child_env(env_extra), capture_output=True, text=True,
                         preexec_fn=pin)
    result = parse_output(out.stdout)
    if out.returncode != 0 or result is None:
        sys.stdout.write(out.stdout[-3000:] + out.stderr[-3000:])
        return None
    return result


def _forked_torch_run(conn, mode, env_extra, lib, steps):
    """A PyTorch run in a child forked from this process, which imported torch (without
    initialising CUDA): the import, the larger part of a run's start, is paid once."""
    import contextlib
    import io
    import traceback

    buf = io.StringIO()
    try:
        pin()
        os.environ.clear()
        os.environ.update(child_env(env_extra))
        import torch
        import torch_workload

        conf = env_extra.get("PYTORCH_CUDA_ALLOC_CONF")
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if conf and setter is not None:
            # The caching allocator may have read its settings at import, in the parent.
            setter(conf)
        with contextlib.redirect_stdout(buf):
            torch_workload.child(mode, lib, steps)
        conn.send(buf.getvalue())
    except BaseException:
        conn.send(buf.getvalue() + "\nERROR " + traceback.format_exc())
    finally:
        conn.close()


def run_torch_forked(name, lib, steps):
    import multiprocessing as mp

    mode, env = TORCH[name]
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_forked_torch_run, args=(child, mode, env, lib, steps))
    p.start()
    child.close()
    try:
        text = parent.recv()
    except EOFError:
        text = ""
    p.join()
    result = parse_output(text)
    if p.exitcode != 0 or result is None:
        sys.stdout.write(text[-4000:] + f"\n(exit {p.exitcode})\n")
        return None
    return result


TORCH = {
    "ours": ("pool", {}),
    "default": ("torch", {}),
    "expandable": ("torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
}
CUPY = {"ours": ("module", {}), "cupy": ("cupy", {})}
# --with-plain: ours once more, on the C API's own pool of plain cuMemAlloc segments (instead of
# the default pool's virtual-memory segments), to tell the segment kind's share of a gap.
PLAIN = {"CUDA_MEMPOOL_CAPI_SEGMENTS": "plain"}


def torch_cmd(name, lib, steps):
    mode, env = TORCH[name]
    return [sys.executable, os.path.join(HERE, "torch_workload.py"), "--child", mode, "--lib", lib,
            "--steps", str(steps)], env


def torch_forked(name, lib, steps):
    """A run's result (forked from this process), not a command."""
    return run_torch_forked(name, lib, steps)


def cupy_cmd(name, lib, steps):
    mode, env = CUPY[name]
    return [sys.executable, os.path.join(HERE, "cupy_alloc_bench.py"), "--workload-child",
            mode, "--lib", lib, "--steps", str(steps)], env


def interleave(label, names, make_cmd, args, steps, deadline):
    """Runs the rounds; returns {name: [per-run summary]}."""
    runs = {n: [] for n in names}
    for r in range(args.runs):
        if time.time() > deadline and r >= 2:
            print(f"{label}: budget reached after {r} rounds", flush=True)
            break
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0 = time.time()
            made = make_cmd(name, args.lib, steps)
            res = made if isinstance(made, dict) or made is None else run_child(*made)
            if res is None:
                print(f"{label}: run {r + 1} of '{name}' failed", flush=True)
                continue
            steady = res["times"][args.warmup:]
            summary = {
                "step_ms": statistics.median(steady) * 1e3,
                "peak_mib": res["peak_reserved"] / MIB,
                "pair_ns": res.get("pair_ns"),
                "pair_stream_ns": res.get("pair_stream_ns"),
                "wall_s": time.time() - t0,
                "results": res.get("losses") or res.get("results"),
            }
            # CuPy runs: the host's issue time and the GPU's span of each step (medians).
            for k, key in (("issue_times", "issue_ms"), ("gpu_times", "gpu_ms")):
                if res.get(k):
                    summary[key] = statistics.median(res[k][args.warmup:]) * 1e3
            for k in ("module_path", "torch_max_memory_reserved", "pool_peak_reserved_bytes",
                      "pool_last_error"):
                if k in res:
                    summary[k] = res[k]
            runs[name].append(summary)
            print(f"{label} round {r + 1} {name:<10} step {summary['step_ms']:8.3f} ms  peak "
                  f"{summary['peak_mib']:8.1f} MiB  pair {summary['pair_ns'] or 0:8.0f} ns  "
                  f"({summary['wall_s']:.1f} s)"
                  + (f"  issue {summary['issue_ms']:.3f} ms  GPU span {summary['gpu_ms']:.3f} ms"
                     if "gpu_ms" in summary else ""), flush=True)
    return runs


def stats(runs, key):
    return quartiles([r[key] for r in runs])


def verdict(ours, peer, k):
    """(ratio, difference, spread, met) for the target ours <= k x peer on (q1, med, q3)."""
    d = ours[1] - k * peer[1]
    s = max(ours[2] - ours[0], k * (peer[2] - peer[0]))
    met = "yes" if d < -s else ("NO" if d > s else "within spread")
    return ours[1] / peer[1] if peer[1] else float("nan"), d, s, met


def table(label, runs, names):
    print(f"\n{label}: per allocator, over runs (q1 / median / q3)")
    print(f"{'allocator':<12} {'runs':>4} {'step ms q1':>10} {'median':>9} {'q3':>9} {'IQR':>7} "
          f"{'peak MiB q1':>11} {'median':>8} {'q3':>8} {'IQR':>6} {'pair ns':>8}")
    for n in names:
        rs = runs[n]
        if not rs:
            print(f"{n:<12} no run completed")
            continue
        t, m = stats(rs, "step_ms"), stats(rs, "peak_mib")
        pair = statistics.median([r["pair_ns"] for r in rs if r["pair_ns"] is not None] or [0])
        print(f"{n:<12} {len(rs):>4} {t[0]:10.3f} {t[1]:9.3f} {t[2]:9.3f} {t[2] - t[0]:7.3f} "
              f"{m[0]:11.1f} {m[1]:8.1f} {m[2]:8.1f} {m[2] - m[0]:6.1f} {pair:8.0f}")
        if all("gpu_ms" in r for r in rs):
            i, g = stats(rs, "issue_ms"), stats(rs, "gpu_ms")
            print(f"{'':<12} {'':>4} host issue ms q1/median/q3 {i[0]:.3f} / {i[1]:.3f} / "
                  f"{i[2]:.3f}; GPU span ms {g[0]:.3f} / {g[1]:.3f} / {g[2]:.3f}")


def write_row(rows, bench, scenario, unit, ours, peer, peer_label, k, n_runs):
    ratio, d, s, met = verdict(ours, peer, k) if k else (ours[1] / peer[1], 0, 0, "-")
    target = f"ratio <= {k:.2f}" if k else "-"
    label = (f"{peer_label} (median of {n_runs} runs; IQR ours {ours[2] - ours[0]:.3g} / peer "
             f"{peer[2] - peer[0]:.3g} {unit})")
    rows.append((bench, scenario, unit, round(ours[1], 4), round(peer[1], 4), label,
                 round(ratio, 4), target, met))
    extra = f"; difference to target {d:+.3f} {unit}, spread {s:.3f} {unit}" if k else ""
    print(f"{scenario:<44} ours {ours[1]:9.3f} {unit}  {peer_label} {peer[1]:9.3f} {unit}  ratio "
          f"{ratio:6.3f}  target {target:<13} {met}{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--torch-steps", type=int, default=40)
    ap.add_argument("--cupy-steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--only", choices=["torch", "cupy"])
    ap.add_argument("--budget", type=float, default=240.0,
                    help="seconds after which no new round starts (each part gets its share)")
    ap.add_argument("--pair-iters", type=int, default=50000)
    ap.add_argument("--with-plain", action="store_true",
                    help="also run ours with CUDA_MEMPOOL_CAPI_SEGMENTS=plain ('ours-plain')")
    ap.add_argument("--spawn", action="store_true",
                    help="start each PyTorch run as a new interpreter (default: fork it from "
                         "this one after importing torch, without CUDA)")
    ap.add_argument("--cpus", default="auto",
                    help="CPU list every run is pinned to (e.g. 4-7), 'auto' (4 CPUs from the "
                         "middle of the allowed set), or 'none'")
    ap.add_argument("--from-wheel", action="store_true",
                    help="ours from the installed cudars wheel (cudars.torch.install(), "
                         "cudars.cupy.install()) instead of the bundle's lib/")
    args = ap.parse_args()
    global CPUS
    if args.from_wheel:
        import cudars

        args.lib = cudars.library_path()
        TORCH["ours"] = ("wheel", {})
        CUPY["ours"] = ("wheel", {"CUDARS_FROM_WHEEL": "1"})
    if args.with_plain:
        TORCH["ours-plain"] = ("pool", PLAIN)
        CUPY["ours-plain"] = ("module", PLAIN)
    allowed = sorted(os.sched_getaffinity(0))
    if args.cpus == "auto":
        CPUS = set(allowed[len(allowed) // 2:len(allowed) // 2 + 4]) if len(allowed) >= 8 else None
    elif args.cpus != "none":
        lo, _, hi = args.cpus.partition("-")
        CPUS = set(range(int(lo), int(hi or lo) + 1))
    print(f"workload_bench: runs pinned to CPUs {sorted(CPUS) if CPUS else 'none (all allowed)'}; "
          f"PyTorch runs {'spawned' if args.spawn else 'forked after import torch'}", flush=True)
    if not os.path.exists(args.lib):
        print(f"workload_bench: {args.lib} not found")
        return 1
    start = time.time()
    rows, record = [], {"args": vars(args)}
    if args.only != "torch":
        # Allocation cost through each CuPy path, one process, same run.
        out = subprocess.run([sys.executable, os.path.join(HERE, "cupy_alloc_bench.py"),
                              "--pairs-only", "--lib", args.lib, "--iters", str(args.pair_iters),
                              "--repeats", "7"], capture_output=True, text=True,
                             env=dict(os.environ, **({"CUDARS_FROM_WHEEL": "1"}
                                                     if args.from_wheel else {})))
        sys.stdout.write(out.stdout)
        pairs = None
        for line in out.stdout.splitlines():
            if line.startswith("PAIRS "):
                pairs = json.loads(line[len("PAIRS "):])
        if pairs is None:
            sys.stdout.write(out.stderr[-3000:])
        else:
            record["cupy_pairs_ns"] = pairs
            peer = pairs["CuPy MemoryPool"]
            for name, q in pairs.items():
                if name.startswith("module") or name.startswith("plain"):
                    write_row(rows, "workload_cupy", f"cupy malloc+free 1 MiB {name}", "ns", q,
                              peer, "CuPy MemoryPool", None, 7)
        share = args.budget * (0.3 if args.only is None else 1.0)
        cupy_runs = interleave("cupy", list(CUPY), cupy_cmd, args, args.cupy_steps,
                               time.time() + share)
        record["cupy"] = cupy_runs
        table("CuPy workload", cupy_runs, list(CUPY))
        if all(cupy_runs[n] for n in CUPY):
            n = min(len(v) for v in cupy_runs.values())
            paths = {r.get("module_path") for r in cupy_runs["ours"]}
            print(f"CuPy module path in the 'ours' runs: {', '.join(map(str, paths))}")
            same = all(r["results"] == cupy_runs["cupy"][0]["results"]
                       for v in cupy_runs.values() for r in v)
            print(f"CuPy workload results identical step by step in every run: {same}")
            o, c = stats(cupy_runs["ours"], "step_ms"), stats(cupy_runs["cupy"], "step_ms")
            write_row(rows, "workload_cupy", "cupy workload step time", "ms", o, c,
                      "CuPy MemoryPool", 1.0, n)
            o, c = stats(cupy_runs["ours"], "peak_mib"), stats(cupy_runs["cupy"], "peak_mib")
            write_row(rows, "workload_cupy", "cupy workload peak reserved", "MiB", o, c,
                      "CuPy MemoryPool", 0.95, n)
            if "ours-plain" in cupy_runs:
                for key, unit, what in (("step_ms", "ms", "step time"), ("peak_mib", "MiB", "peak reserved")):
                    write_row(rows, "workload_cupy", f"cupy workload {what} ours plain segments",
                              unit, stats(cupy_runs["ours-plain"], key), stats(cupy_runs["cupy"], key),
                              "CuPy MemoryPool", None, n)
    if args.only != "cupy":
        deadline = start + args.budget
        make = torch_cmd
        if not args.spawn:
            try:
                sys.path.insert(0, HERE)
                import torch  # noqa: F401  (no CUDA call: the children choose their allocator)

                make = torch_forked
            except ImportError as e:
                print(f"torch import failed ({e}); spawning runs instead")
        torch_runs = interleave("torch", list(TORCH), make, args, args.torch_steps, deadline)
        record["torch"] = torch_runs
        table("PyTorch workload", torch_runs, list(TORCH))
        if all(torch_runs[n] for n in TORCH):
            n = min(len(v) for v in torch_runs.values())
            same = all(r["results"] == torch_runs["default"][0]["results"]
                       for v in torch_runs.values() for r in v)
            print(f"PyTorch losses identical step by step in every run: {same}")
            ours_t, ours_m = stats(torch_runs["ours"], "step_ms"), stats(torch_runs["ours"], "peak_mib")
            for peer, label, k_time, k_mem in (("default", "PyTorch default", 1.0, 0.75),
                                               ("expandable", "PyTorch expandable", None, 1.0)):
                pt, pm = stats(torch_runs[peer], "step_ms"), stats(torch_runs[peer], "peak_mib")
                write_row(rows, "workload_torch", f"torch workload step time vs {peer}", "ms",
                          ours_t, pt, label, k_time, n)
                write_row(rows, "workload_torch", f"torch workload peak reserved vs {peer}", "MiB",
                          ours_m, pm, label, k_mem, n)
            if "ours-plain" in torch_runs:
                for key, unit, what in (("step_ms", "ms", "step time"), ("peak_mib", "MiB", "peak reserved")):
                    write_row(rows, "workload_torch", f"torch workload {what} ours plain segments",
                              unit, stats(torch_runs["ours-plain"], key),
                              stats(torch_runs["default"], key), "PyTorch default", None, n)
            pairs = {k: statistics.median([r["pair_ns"] for r in v]) for k, v in torch_runs.items()}
            print("torch.empty(1 MiB) + del, ns a pair (median over runs): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in pairs.items()))
            side = {k: quartiles([r["pair_stream_ns"] for r in v if r.get("pair_stream_ns")])
                    for k, v in torch_runs.items() if any(r.get("pair_stream_ns") for r in v)}
            print("torch.empty(1 MiB) + del on a torch.cuda.Stream, ns a pair (q1 / median / q3 "
                  "over runs): " + ", ".join(f"{k} {v[0]:.0f} / {v[1]:.0f} / {v[2]:.0f}"
                                             for k, v in side.items()))
    out_dir = os.environ.get("BENCH_OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "results.csv")
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write("bench,scenario,unit,ours,raw,raw_label,ratio,target,met\n")
            for r in rows:
                f.write(",".join(str(x).replace(",", ";") for x in r) + "\n")
        for part in ("cupy", "torch"):
            for rs in record.get(part, {}).values():
                for r in rs:
                    r.pop("results", None)
        with open(os.path.join(out_dir, "workloads.json"), "w") as f:
            json.dump(record, f, indent=1)
    print(f"workload_bench: {len(rows)} rows in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
