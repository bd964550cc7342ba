"""The peers of bench_blas: PyTorch (torch.matmul, torch.cuda.graph) and CuPy (cupy.matmul) on
the same GPU, the same shapes and timing rule (median of 15 event-timed runs after 3 warm-ups).
Writes `torch <row> <value>` / `cupy <row> <value>` lines to the file given as argv[1] and
prints them. PyTorch's matmul defaults: TF32 off for f32 (torch.backends.cuda.matmul
.allow_tf32 = False) except the tf32 rows, which turn it on."""
import statistics
import sys
import time

out = []


def emit(name, value):
    line = f"{name} {value:.6f}"
    print(line, flush=True)
    out.append(line)


def timed(torch, f):
    for _ in range(3):
        f()
    ts = []
    for _ in range(15):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def torch_rows():
    import torch
    dev = "cuda"
    for n in (4096, 8192):
        for name, dt, tf32 in (("bf16", torch.bfloat16, False), ("f16", torch.float16, False),
                               ("tf32", torch.float32, True), ("f32", torch.float32, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.zeros(n, n, device=dev, dtype=dt)
            b = torch.zeros(n, n, device=dev, dtype=dt)
            c = torch.empty(n, n, device=dev, dtype=dt)
            s = timed(torch, lambda: torch.matmul(a, b, out=c))
            emit(f"torch gemm {n}^3 {name} TFLOP/s", 2 * n ** 3 / s / 1e12)
            del a, b, c
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, dt in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        a = torch.zeros(64, 512, 512, device=dev, dtype=dt)
        b = torch.zeros(64, 512, 512, device=dev, dtype=dt)
        c = torch.empty(64, 512, 512, device=dev, dtype=dt)
        s = timed(torch, lambda: torch.bmm(a, b, out=c))
        emit(f"torch batched 64x512^3 {name} TFLOP/s", 2 * 512 ** 3 * 64 / s / 1e12)
    a = torch.zeros(64, 64, device=dev)
    b = torch.zeros(64, 64, device=dev)
    c = torch.empty(64, 64, device=dev)
    per = []
    for _ in range(44):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(200):
            torch.matmul(a, b, out=c)
        per.append((time.perf_counter_ns() - t) / 200)
        torch.cuda.synchronize()
    per = per[3:]
    emit("torch small gemm 64^3 f32 issue ns/call", statistics.median(per))
    n = 512
    a = torch.zeros(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.zeros(n, n, device=dev, dtype=torch.bfloat16)
    cs = [torch.empty(n, n, device=dev, dtype=torch.bfloat16) for _ in range(100)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in cs:
            torch.matmul(a, b, out=c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in cs:
            torch.matmul(a, b, out=c)
    emit("torch graph of 100 gemm 512^3 bf16 replay us", timed(torch, g.replay) * 1e6)


def cupy_rows():
    import cupy as cp
    import torch  # only for its event timer helper shape; CuPy events below
    _ = torch

    def ctimed(f):
        for _ in range(3):
            f()
        ts = []
        for _ in range(15):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            f()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
        return statistics.median(ts)

    for n in (4096, 8192):
        for name, dt in (("f16", cp.float16), ("f32", cp.float32)):
            a = cp.zeros((n, n), dtype=dt)
            b = cp.zeros((n, n), dtype=dt)
            c = cp.empty((n, n), dtype=dt)
            s = ctimed(lambda: cp.matmul(a, b, out=c))
            emit(f"cupy gemm {n}^3 {name} TFLOP/s", 2 * n ** 3 / s / 1e12)
            del a, b, c
    a = cp.zeros((64, 64), dtype=cp.float32)
    b = cp.zeros((64, 64), dtype=cp.float32)
    c = cp.empty((64, 64), dtype=cp.float32)
    per = []
    for _ in range(44):
        cp.cuda.Device().synchronize()
        t = time.perf_counter_ns()
        for _ in range(200):
            cp.matmul(a, b, out=c)
        per.append((time.perf_counter_ns() - t) / 200)
        cp.cuda.Device().synchronize()
    per = per[3:]
    emit("cupy small gemm 64^3 f32 issue ns/call", statistics.median(per))


for f in (torch_rows, cupy_rows):
    try:
        f()
    except Exception as e:  # a missing peer is reported, not fatal
        print(f"{f.__name__}: {type(e).__name__}: {e}", flush=True)

if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        fh.write("\n".join(out) + "\n")
