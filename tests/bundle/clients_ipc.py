"""CuPy <-> cuda-core legacy IPC: a real client opens our handle, and we open CuPy's.

Scenarios (each a child process, see clients_common.py):
  cupy_opens_ours   the bundle's `examples/ipc_producer_consumer --export-legacy SIZE SEED`
                    exports a buffer holding (i * 131 + SEED) mod 256; this CuPy process opens
                    it with cupy.cuda.runtime.ipcOpenMemHandle and checks every byte in place
                    (read on the device, compared on the host).
  ours_opens_cupys  CuPy allocates (runtime.malloc), writes the pattern, exports with
                    runtime.ipcGetMemHandle; `ipc_producer_consumer --open-legacy HEX SIZE
                    SEED` opens it with cudars_core::ipc::IpcMapping and checks every byte.
Sizes: 1 B, 4097 B, 1 MiB + 3, 256 MiB. Prints "N passed, N failed" last.
"""

import os
import subprocess
import sys

from clients_common import HERE, Report, finish, parser, run_scenarios

EXAMPLE = os.path.join(HERE, "examples", "ipc_producer_consumer")
SIZES = [1, 4097, (1 << 20) + 3, 256 << 20]


def pattern(np, size, seed):
    return ((np.arange(size, dtype=np.uint64) * 131 + seed) % 256).astype(np.uint8)


def device_bytes(cupy, ptr, size, owner=None):
    mem = cupy.cuda.UnownedMemory(ptr, size, owner)
    return cupy.ndarray((size,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))


def cupy_opens_ours(report):
    import cupy
    import numpy as np
    for i, size in enumerate(SIZES):
        seed = 7 + i
        proc = subprocess.Popen([EXAMPLE, "--export-legacy", str(size), str(seed)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline().strip()
            if not report.check(line.startswith("HANDLE "), f"{size} B: exporter printed a handle ({line!r})"):
                continue
            handle = bytes.fromhex(line.split()[1])
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            try:
                got = device_bytes(cupy, ptr, size)
                expected = cupy.asarray(pattern(np, size, seed))
                same = bool((got == expected).all())
                report.check(same, f"{size} B: CuPy reads exactly our bytes through ipcOpenMemHandle")
            finally:
                cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        finally:
            try:
                proc.stdin.write("done\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass
            rc = proc.wait(timeout=120)
        report.check(rc == 0, f"{size} B: exporter exited cleanly ({rc})")


def ours_opens_cupys(report):
    import cupy
    import numpy as np
    for i, size in enumerate(SIZES):
        seed = 99 + i
        ptr = cupy.cuda.runtime.malloc(size)
        try:
            device_bytes(cupy, ptr, size).set(pattern(np, size, seed))
            cupy.cuda.runtime.deviceSynchronize()
            handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr))
            out = subprocess.run([EXAMPLE, "--open-legacy", handle.hex(), str(size), str(seed)],
                                 capture_output=True, text=True, timeout=120)
            text = (out.stdout + out.stderr).strip()
            report.check(out.returncode == 0 and "OK" in out.stdout,
                         f"{size} B: IpcMapping::open reads exactly CuPy's bytes ({text[-200:]!r})")
        finally:
            cupy.cuda.runtime.free(ptr)


SCENARIOS = {"cupy_opens_ours": cupy_opens_ours, "ours_opens_cupys": ours_opens_cupys}


def main():
    args = parser(__doc__).parse_args()
    if args.child:
        report = Report()
        if not report.check(os.access(EXAMPLE, os.X_OK), f"{EXAMPLE} is in the bundle"):
            return finish(report)
        SCENARIOS[args.child](report)
        return finish(report)
    return run_scenarios(os.path.abspath(__file__), args, [(n, []) for n in SCENARIOS])


if __name__ == "__main__":
    sys.exit(main())
