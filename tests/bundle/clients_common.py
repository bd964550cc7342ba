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
