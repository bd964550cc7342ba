"""The installed `cudars` wheel, on a machine with or without a CUDA driver (issue 49).

Run with the Python of the environment the wheel was installed into, from outside the source
tree:  python wheel_cpu_test.py --expect-driver {absent,present}

Checks: the package imports without PyTorch or CuPy; its version is the workspace's; the C ABI
library it carries exports every function of the C header; the DLPack extension loads; without
a driver every call fails with DriverNotFound naming libcuda (nothing crashes), with one the
statistics read; bad arguments raise clear errors before anything reaches the library.
"""

import argparse
import ctypes
import os
import re
import sys

FAILED = []


def check(name, cond, detail=""):
    print(f"{'ok  ' if cond else 'FAIL'} {name}{(': ' + detail) if detail else ''}")
    if not cond:
        FAILED.append(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-driver", choices=["absent", "present"], required=True)
    args = ap.parse_args()

    import cudars

    here = os.path.dirname(os.path.abspath(cudars.__file__))
    # Installed (site-packages, or pip's --target folder), not the source tree's package.
    check("imported from the installed package",
          os.path.join("cuda-dlpack-py", "python") not in here, here)
    check("no framework imported by `import cudars`",
          "torch" not in sys.modules and "cupy" not in sys.modules)
    check("version", re.fullmatch(r"\d+\.\d+\.\d+", cudars.__version__) is not None,
          cudars.__version__)
    lib = cudars.library_path()
    check("C ABI library in the package", os.path.isfile(lib), lib)
    so = ctypes.CDLL(lib)
    exported = [
        "cuda_mempool_alloc", "cuda_mempool_free", "cuda_mempool_record_stream",
        "cuda_mempool_torch_alloc", "cuda_mempool_torch_free",
        "cuda_mempool_torch_begin_allocate_to_pool", "cuda_mempool_torch_end_allocate_to_pool",
        "cuda_mempool_torch_release_pool", "cuda_mempool_torch_announce_captures",
        "cuda_mempool_cupy_malloc", "cuda_mempool_cupy_free", "cuda_mempool_cupy_stream_malloc",
        "cuda_mempool_used_bytes", "cuda_mempool_history_dump", "cuda_mempool_last_error",
    ]
    missing = [n for n in exported if not hasattr(so, n)]
    check("C ABI exports", not missing, ", ".join(missing))
    stubs = [f for f in os.listdir(here) if f.endswith(".pyi")]
    check("type hints shipped", "__init__.pyi" in stubs and "py.typed" in os.listdir(here),
          ", ".join(sorted(stubs)))

    dl = cudars.dlpack
    check("DLPack extension loads", tuple(dl.DLPACK_VERSION) == (1, 3), repr(dl.DLPACK_VERSION))

    try:
        cudars.dump_history("/nonexistent/x", format="xml")
        check("bad history format refused", False)
    except ValueError as e:
        check("bad history format refused", "format" in str(e), str(e))

    if args.expect_driver == "absent":
        check("driver_available() is False", cudars.driver_available() is False)
        for name, call in (
            ("stats", lambda: cudars.stats()),
            ("free_all_blocks", cudars.free_all_blocks),
            ("set_limit", lambda: cudars.set_limit(1 << 30)),
        ):
            try:
                call()
                check(f"{name} without a driver raises", False)
            except cudars.DriverNotFound as e:
                check(f"{name} without a driver raises DriverNotFound",
                      "libcuda" in str(e), str(e)[:120])
            except Exception as e:  # noqa: BLE001 - any other type is the failure
                check(f"{name} without a driver raises DriverNotFound", False,
                      f"{type(e).__name__}: {e}")
    else:
        check("driver_available() is True", cudars.driver_available() is True)
        st = cudars.stats()
        check("stats read", st["reserved_bytes"] >= 0 and st["used_bytes"] >= 0, repr(st))
        p = so.cuda_mempool_alloc
        p.restype, p.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        f = so.cuda_mempool_free
        f.argtypes = [ctypes.c_void_p]
        ptr = p(1 << 20, 0, None)
        check("a block through the wheel's library", bool(ptr))
        check("stats see it", cudars.stats()["used_bytes"] >= 1 << 20)
        f(ptr)
        cudars.free_all_blocks()

    print(f"wheel CPU test: {'FAILED ' + str(len(FAILED)) if FAILED else 'passed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
