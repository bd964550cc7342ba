"""The peers of bench_rtc: cold compile + load and warm (disk cache) load of the same saxpy
kernel through CuPy's RawKernel (empty, then warm CUPY_CACHE_DIR) and cuda.core's Program
(compile to cubin, then its program cache when this cuda.core has one), each measurement in a
fresh process so no in-memory cache helps. Rows go to stdout and, with BENCH_OUT, to
$BENCH_OUT/peers.csv (scenario, peer, value, unit), beside bench_rtc's results.csv rows of the
same scenario names.

Usage: python3 rtc_peers.py [--runs N]
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''

ROWS = []
SEEN = set()


def row(scenario, peer, value, unit):
    ROWS.append((scenario, peer, value, unit))
    print(f"{scenario:<34} | {peer:<9} | {value:12.3f} {unit}", flush=True)


def child(kind):
    """One measurement in this (fresh) process: prints {"us": ...}."""
    if kind == "cupy":
        import cupy
        cupy.cuda.Device(0).use()
        cupy.cuda.runtime.free(0)  # context up before the clock starts
        t = time.perf_counter()
        k = cupy.RawKernel(SAXPY, "saxpy", backend="nvrtc")
        k.compile()
        _ = k.attributes  # the module is loaded
        us = (time.perf_counter() - t) * 1e6
    else:
        try:  # cuda.core 1.x exports these at the top; 0.x under .experimental
            from cuda.core import Device, Program, ProgramOptions
            import cuda.core as _core
        except ImportError:
            from cuda.core.experimental import Device, Program, ProgramOptions
            import cuda.core.experimental as _core
        dev = Device(0)
        dev.set_current()
        arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
        cache = None
        found = []
        for modname in ("utils", None):  # a persistent program cache, where it has one
            try:
                m = getattr(_core, modname) if modname else _core
            except AttributeError:
                try:
                    m = __import__(_core.__name__ + "." + modname, fromlist=["_"])
                except Exception:
                    continue
            found += [f"{m.__name__}.{n}" for n in dir(m) if "Cache" in n]
            for name in ("ProgramCache", "FileStreamProgramCache", "PersistentProgramCache"):
                if cache is None and hasattr(m, name):
                    try:
                        cache = getattr(m, name)(os.environ["RTC_PEER_CACHE"])
                    except Exception as e:
                        found.append(f"{name}: {e}")
        print(json.dumps({"cache_classes": found}), file=sys.stderr)
        t = time.perf_counter()
        prog = Program(SAXPY, code_type="c++", options=ProgramOptions(arch=arch))
        if cache is not None and hasattr(prog, "compile"):
            try:
                mod = prog.compile("cubin", cache=cache)
            except TypeError:
                mod = prog.compile("cubin")
        else:
            mod = prog.compile("cubin")
        mod.get_kernel("saxpy")
        us = (time.perf_counter() - t) * 1e6
        print(json.dumps({"cache": cache is not None}), file=sys.stderr)
    print(json.dumps({"us": us}))


def measure(kind, env, runs):
    out = []
    for _ in range(runs):
        p = subprocess.run([sys.executable, __file__, "--child", kind], env=env,
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed")
        for line in p.stderr.splitlines():  # what the peer offers for caching, once
            if line.startswith('{"cache') and line not in SEEN:
                SEEN.add(line)
                print(f"  ({kind}: {line})", flush=True)
        out.append(json.loads(p.stdout.strip().splitlines()[-1])["us"])
    out.sort()
    return out[len(out) // 2]


def main():
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 7
    for kind, peer in (("cupy", "CuPy"), ("cuda.core", "cuda.core")):
        try:
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, CUPY_CACHE_DIR=d, RTC_PEER_CACHE=d)
                cold = []
                for _ in range(runs):  # empty cache each time
                    for f in os.listdir(d):
                        p = os.path.join(d, f)
                        if os.path.isfile(p):
                            os.remove(p)
                    cold.append(measure(kind, env, 1))
                cold.sort()
                row("rtc cold compile+load (saxpy)", peer, cold[len(cold) // 2] / 1e3, "ms")
                measure(kind, env, 1)  # fill the cache
                row("rtc warm disk load (saxpy)", peer, measure(kind, env, runs), "us")
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"{peer}: not measured ({e})", flush=True)
    out = os.environ.get("BENCH_OUT")
    if out:
        path = os.path.join(out, "peers.csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["scenario", "peer", "value", "unit"])
            w.writerows(ROWS)


if __name__ == "__main__":
    main()
