"""CuPy's legacy IPC cost beside bench_ipc (run both in one session on the GPU machine):
export (runtime.ipcGetMemHandle) per handle in this process, open + close
(runtime.ipcOpenMemHandle / ipcCloseMemHandle) per handle in a child process, 200 buffers of
2 MiB from runtime.malloc. Note: our IpcMapping's close synchronises the device first; CuPy's
does not, so the child here also times open + synchronize + close for a like-for-like row.
"""

import os
import subprocess
import sys
import time

N = 200
BUF = 2 << 20


def child():
    import cupy
    handles = [bytes.fromhex(h) for h in os.environ["BENCH_IPC_CUPY_HANDLES"].split(",")]
    cupy.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for h in handles:
        cupy.cuda.runtime.ipcCloseMemHandle(cupy.cuda.runtime.ipcOpenMemHandle(h))
    plain = (time.perf_counter() - t) * 1e6 / N
    t = time.perf_counter()
    for h in handles:
        p = cupy.cuda.runtime.ipcOpenMemHandle(h)
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.runtime.ipcCloseMemHandle(p)
    synced = (time.perf_counter() - t) * 1e6 / N
    print(f"RESULT open_close_us {plain}")
    print(f"RESULT open_sync_close_us {synced}")


def main():
    if os.environ.get("BENCH_IPC_CUPY_ROLE") == "child":
        child()
        return 0
    import cupy
    ptrs = [cupy.cuda.runtime.malloc(BUF) for _ in range(N)]
    t = time.perf_counter()
    handles = [bytes(cupy.cuda.runtime.ipcGetMemHandle(p)) for p in ptrs]
    export = (time.perf_counter() - t) * 1e6 / N
    env = dict(os.environ, BENCH_IPC_CUPY_ROLE="child",
               BENCH_IPC_CUPY_HANDLES=",".join(h.hex() for h in handles))
    out = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                         timeout=600)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            _, k, v = line.split()
            results[k] = float(v)
    for p in ptrs:
        cupy.cuda.runtime.free(p)
    print(f"cupy legacy export (2 MiB)              {export:10.3f} us")
    for k, v in sorted(results.items()):
        print(f"cupy legacy {k:<28} {v:10.3f} us")
    if out.returncode != 0 or not results:
        print(out.stdout + out.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
