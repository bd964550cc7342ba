"""Shared by the clients_*.py GPU tests: options, one subprocess per scenario (optionally
under compute-sanitizer), PASS/FAIL counting and the final "N passed, N failed" line.

A scenario runs in a child process (`script --child NAME ...`) that prints "PASS: ..." and
"FAIL: ..." lines; the parent counts them. A child that crashes, times out or prints no
verdict at all counts as one failure. Nothing here passes without a GPU: the children need
CUDA, and a child that cannot start CUDA fails.
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# CUDARS_FROM_WHEEL=1: the clients run from the installed `cudars` wheel (issue 49): its library,
# its CuPy module and its `cudars.torch.install()`, nothing from the bundle's lib/.
FROM_WHEEL = os.environ.get("CUDARS_FROM_WHEEL") == "1"
if FROM_WHEEL:
    import cudars

    DEFAULT_LIB = cudars.library_path()
else:
    DEFAULT_LIB = os.path.join(HERE, "lib", "libcudars_mempool_capi.so")
SANITIZER = ["compute-sanitizer", "--tool", "memcheck", "--target-processes", "all",
             "--error-exitcode", "86", "--print-limit", "20", "--report-api-errors", "no"]


def parser(doc, seconds=60, streams=10000):
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB, help="path of libcudars_mempool_capi.so")
    ap.add_argument("--seconds", type=float, default=seconds, help="length of timed stress runs")
    ap.add_argument("--streams", type=int, default=streams, help="streams in the churn test")
    ap.add_argument("--sanitize", action="store_true",
                    help="run each scenario under compute-sanitizer memcheck, shortened")
    ap.add_argument("--only", default="", help="run only scenarios whose name contains this")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="pool", help=argparse.SUPPRESS)
    return ap


def child_env(lib):
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    env["CUDA_MEMPOOL_CAPI_LIB"] = os.path.abspath(lib)
    libdir = os.path.dirname(os.path.abspath(lib))
    if not FROM_WHEEL:
        env["PYTHONPATH"] = libdir + os.pathsep + env.get("PYTHONPATH", "")
    return env


# A kernel that writes `v` to the address `p`: given 0x10, an illegal address, which faults and
# loses the CUDA context (the fault tests' injected fault).
POKE_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry poke(.param .u64 p, .param .u32 v) {
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  ld.param.u32 %r1, [v];
  st.global.u32 [%rd2], %r1;
  ret;
}
\0"""


def launch_illegal_address(stream_handle):
    """Launches, through libcuda alone, one thread that writes to address 0x10 on the stream
    `stream_handle` (an integer `CUstream`) of the context current on this thread (the
    framework's primary context). Returns at once; the kernel faults on the device. Raises
    when a driver call fails before the launch."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    for call, r in (("cuModuleLoadData", cu.cuModuleLoadData(ctypes.byref(mod), POKE_PTX)),
                    ("cuModuleGetFunction",
                     cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"poke"))):
        if r != 0:
            raise RuntimeError(f"{call} failed: CUresult {r}")
    p, v = ctypes.c_uint64(0x10), ctypes.c_uint32(7)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p),
                                   ctypes.cast(ctypes.byref(v), ctypes.c_void_p))
    r = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(stream_handle), params, None)
    if r != 0:
        raise RuntimeError(f"cuLaunchKernel failed: CUresult {r}")


def refused_after_fault(allocate, limit_s=1.0):
    """Calls `allocate()` (one allocation through the pool) until it raises, for at most
    `limit_s` seconds; returns (the exception or None, allocations served before it, seconds
    until it)."""
    import time

    t0 = time.perf_counter()
    served = 0
    keep = []
    while time.perf_counter() - t0 < limit_s:
        try:
            keep.append(allocate())
        except Exception as e:  # noqa: BLE001
            return e, served, time.perf_counter() - t0
        served += 1
        if len(keep) > 64:
            keep.clear()
    return None, served, time.perf_counter() - t0


class Report:
    """Counts verdicts inside a child; `check` prints one PASS/FAIL line."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
            print(f"PASS: {what}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL: {what}", flush=True)
        return ok

    def info(self, what):
        print(f"INFO: {what}", flush=True)


def run_scenarios(script, args, scenarios, timeout=1200):
    """Parent side: runs each (name, extra_args) scenario as a child, prints its output and
    the final count; returns the exit status."""
    passed = failed = 0
    for name, extra in scenarios:
        if args.only and args.only not in name:
            continue
        cmd = [sys.executable, script, "--child", name, "--lib", args.lib,
               "--seconds", str(args.seconds), "--streams", str(args.streams)] + list(extra)
        if args.sanitize:
            cmd = SANITIZER + cmd + ["--sanitize"]
        start = time.time()
        print(f"=== {name}{' (compute-sanitizer memcheck)' if args.sanitize else ''}", flush=True)
        try:
            out = subprocess.run(cmd, env=child_env(args.lib), capture_output=True, text=True,
                                 timeout=timeout)
            text, rc = out.stdout + out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            rc = "timeout"
        p = sum(1 for l in text.splitlines() if l.startswith("PASS:"))
        f = sum(1 for l in text.splitlines() if l.startswith("FAIL:"))
        for line in text.splitlines():
            print("    " + line)
        if rc != 0 and (f == 0 or rc == "timeout"):
            f += 1
            print(f"FAIL: scenario {name} ended with status {rc}")
        if args.sanitize and "ERROR SUMMARY: 0 errors" not in text:
            f += 1
            print(f"FAIL: scenario {name}: compute-sanitizer did not report 0 errors")
        if p + f == 0:
            f = 1
            print(f"FAIL: scenario {name} printed no verdict")
        passed += p
        failed += f
        print(f"--- {name}: {p} passed, {f} failed, {time.time() - start:.1f} s", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


def finish(report):
    """Child side: exit status from the report."""
    sys.stdout.flush()
    return 0 if report.failed == 0 and report.passed > 0 else 1
