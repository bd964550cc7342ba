"""The peers of bench_rand: 1 GiB (2^28 float32) of standard normal numbers through
torch.randn (device cuda, float32: PyTorch's Philox kernel) and cupy.random.standard_normal
(float32: cuRAND's XORWOW through CuPy's RandomState), timed as bench_rand times its fills:
three warm-up calls, then RUNS calls each between two CUDA events on the current stream; best
and median GB/s (10^9 bytes written per second).

Output: `name: value unit` lines, the same scenario names as bench_rand's with the peer in
the name (`rand normal f32 1GiB philox torch.randn: ...`). With BENCH_OUT, rows go to
$BENCH_OUT/peers.csv (scenario, peer, value, unit) under bench_rand's scenario names.

Ratios (ours / peer, the target is >= 0.98): when `--ours PATH` names bench_rand (it is run
here first) or a file holding its output, or when $BENCH_OUT/results.csv holds bench_rand's
rows of this run, the lines `rand normal f32 1GiB ratio <ours> / <peer>: R x` follow.

Usage: python3 rand_peers.py [--runs N] [--ours PATH]
"""
import csv
import os
import subprocess
import sys

BYTES = 1 << 30
COUNT = BYTES // 4
BASE = "rand normal f32 1GiB"
ROWS = []


def row(name, value, unit="GB/s", scenario=None, peer=None):
    print(f"{name}: {value:.2f} {unit}", flush=True)
    if scenario is not None:
        ROWS.append((scenario, peer, value, unit))


def stats(ms_list):
    rates = sorted(BYTES / (ms * 1e-3) / 1e9 for ms in ms_list)
    return rates[-1], rates[len(rates) // 2]


def time_torch(runs):
    import torch

    torch.cuda.init()
    stream = torch.cuda.current_stream()
    for _ in range(3):
        x = torch.randn(COUNT, device="cuda", dtype=torch.float32)
        del x
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        x = torch.randn(COUNT, device="cuda", dtype=torch.float32)
        end.record(stream)
        end.synchronize()
        out.append(start.elapsed_time(end))
        del x
    return stats(out), f"torch {torch.__version__}"


def time_cupy(runs):
    import cupy

    for _ in range(3):
        x = cupy.random.standard_normal(COUNT, dtype=cupy.float32)
        del x
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(runs):
        start = cupy.cuda.Event()
        end = cupy.cuda.Event()
        start.record()
        x = cupy.random.standard_normal(COUNT, dtype=cupy.float32)
        end.record()
        end.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, end))
        del x
    return stats(out), f"cupy {cupy.__version__}"


def parse_ours(lines):
    """bench_rand's `name: value GB/s` lines -> {name: value}."""
    ours = {}
    for line in lines:
        name, sep, rest = line.rpartition(": ")
        parts = rest.split()
        if sep and name.startswith(BASE) and len(parts) == 2 and parts[1] == "GB/s":
            try:
                ours[name] = float(parts[0])
            except ValueError:
                pass
    return ours


def ours_from(path):
    if path is None:
        out = os.environ.get("BENCH_OUT")
        results = os.path.join(out, "results.csv") if out else None
        if results and os.path.exists(results):
            with open(results, newline="") as f:
                return {r["scenario"]: float(r["ours"]) for r in csv.DictReader(f)
                        if r.get("bench") == "bench_rand"}
        return {}
    if os.access(path, os.X_OK) and not path.endswith((".txt", ".log")):
        print(f"=== {path}", flush=True)
        env = {k: v for k, v in os.environ.items() if k != "BENCH_OUT"}
        p = subprocess.run([path], capture_output=True, text=True, timeout=600, env=env)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            print(f"bench_rand: exit {p.returncode}: {p.stderr.strip()}", flush=True)
        return parse_ours(p.stdout.splitlines())
    with open(path) as f:
        return parse_ours(f.read().splitlines())


def main():
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 20
    ours_path = sys.argv[sys.argv.index("--ours") + 1] if "--ours" in sys.argv else None
    ours = ours_from(ours_path)
    peers = {}
    for label, algo, timer in (("torch.randn", "philox", time_torch),
                               ("cupy.random.standard_normal", "xorwow", time_cupy)):
        try:
            (best, median), version = timer(runs)
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"{label}: not measured ({type(e).__name__}: {e})", flush=True)
            continue
        peer = "PyTorch" if label.startswith("torch") else "CuPy"
        print(f"{label} version: {version}", flush=True)
        row(f"{BASE} {algo} {label}", best, scenario=f"{BASE} {algo}", peer=peer)
        row(f"{BASE} {algo} {label} median", median,
            scenario=f"{BASE} {algo} median", peer=peer)
        peers[label] = (best, median)
    if ours:
        # Ours: the best of the kinds bench_rand measured, and the like-for-like kind.
        best_name = max((n for n in ours if "raw curand" not in n and not n.endswith("median")),
                        key=lambda n: ours[n], default=None)
        for label, algo in (("torch.randn", "philox"),
                            ("cupy.random.standard_normal", "xorwow")):
            if label not in peers:
                continue
            theirs = peers[label][0]
            same = f"{BASE} {algo}"
            if same in ours:
                row(f"{BASE} ratio {algo} / {label}", ours[same] / theirs, "x")
            if best_name is not None and best_name != same:
                kind = best_name[len(BASE):].strip()
                row(f"{BASE} ratio {kind} / {label}", ours[best_name] / theirs, "x")
    else:
        print("(no bench_rand figures: pass --ours PATH or set BENCH_OUT after bench_rand "
              "ran, for the ratio lines)", flush=True)
    out = os.environ.get("BENCH_OUT")
    if out and ROWS:
        path = os.path.join(out, "peers.csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["scenario", "peer", "value", "unit"])
            w.writerows(ROWS)


if __name__ == "__main__":
    main()
