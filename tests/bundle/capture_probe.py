"""Which call of a CuPy program on cuda-mempool invalidates a stream capture? Prints the
capture status (0 none, 1 active, 2 invalidated) after each step of a capture like CuPy's
test_graph.py, on a non-blocking and on a blocking stream.

Usage: python3 capture_probe.py LIB (CUDA_MEMPOOL_CAPI_SEGMENTS=plain for plain segments)
"""
import os
import sys

import cupy
from cupy.cuda import runtime

lib = sys.argv[1]
sys.path.insert(0, os.path.dirname(lib))
import cuda_mempool_cupy  # noqa: E402

pool = cuda_mempool_cupy.install(lib)


def status(s):
    try:
        return runtime.streamIsCapturing(s.ptr)
    except Exception as e:  # noqa: BLE001
        return f"error {e}"


for nb in (True, False):
    s = cupy.cuda.Stream(non_blocking=nb)
    a = cupy.random.random((100,))
    cupy.cuda.Device().synchronize()
    steps = []
    with s:
        s.begin_capture()
        steps.append(("begin", status(s)))
        b = cupy.empty((1000,), dtype=cupy.float32)
        steps.append(("alloc 4 KB", status(s)))
        c = b * 2
        steps.append(("kernel", status(s)))
        d = cupy.empty((1 << 20,), dtype=cupy.float32)
        steps.append(("alloc 4 MiB", status(s)))
        del b
        steps.append(("free", status(s)))
        e = a * 100
        steps.append(("kernel on a", status(s)))
        try:
            g = s.end_capture()
            steps.append(("end", "ok"))
        except Exception as ex:  # noqa: BLE001
            steps.append(("end", f"error {ex}"))
    print(f"non_blocking={nb}: " + "; ".join(f"{k}: {v}" for k, v in steps), flush=True)

# The loop of CuPy's test_capture_run_on_same_stream: three captures in a row on one stream,
# each graph replaced by the next (its private pool released), the last one running an FFT.
s = cupy.cuda.Stream(non_blocking=True)
a = cupy.random.random((100,))
cupy.cuda.get_current_stream().synchronize()
for n in range(3):
    steps = []
    with s:
        s.begin_capture()
        steps.append(("begin", status(s)))
        x = a * 2
        steps.append(("mul", status(s)))
        if n == 2:
            y = a.astype(cupy.complex128)
            steps.append(("astype", status(s)))
            z = cupy.fft.fft(a)
            steps.append(("fft", status(s)))
        try:
            g = s.end_capture()
            g.launch()
            steps.append(("end+launch", "ok"))
        except Exception as ex:  # noqa: BLE001
            steps.append(("end", f"error {ex}"))
    s.synchronize()
    print(f"loop {n}: " + "; ".join(f"{k}: {v}" for k, v in steps), flush=True)
