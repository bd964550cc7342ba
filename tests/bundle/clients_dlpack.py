#!/usr/bin/env python3
"""DLPack through lib/cudars_dlpack.abi3.so (cudars-dlpack-py) with PyTorch, CuPy and JAX on the
real GPU: zero copy both ways, the stream argument, pool blocks, deleters, memory.

Scenarios (each in its own process; --only NAME runs a subset):
  torch_export     a cudars pool block and a cuMemAlloc buffer to torch.from_dlpack: the same
                   address, our data read by torch, torch's writes read by us, versioned
                   capsule; the deleter runs exactly once when torch lets go.
  torch_import     torch tensors to cudars_dlpack.from_dlpack: same address, data both ways,
                   a legacy capsule (torch.utils.dlpack.to_dlpack), strides of a transposed
                   tensor, contiguous=True refusing it, dtypes (float16, bfloat16, bool, int64),
                   the producer's memory freed only at release(), released once; the DLPack
                   1.3 C exchange API (c_api=True) where torch offers __dlpack_c_exchange_api__.
  cupy_both        CuPy arrays imported (same address, data) and our tensors exported to
                   cupy.from_dlpack (same address, CuPy's writes read by us).
  jax_both         JAX arrays imported (same address, data) and our tensors exported to
                   jax.dlpack.from_dlpack (same address, data).
  stream_export    a ~0.1 s kernel on our producer stream writes the block; PyTorch (on a
                   non-default stream, and on its default stream, twice with new work in
                   between) and CuPy (on a non-blocking stream) import it at once and read it
                   on their own streams: every element holds the kernel's value.
  stream_import    torch.cuda._sleep then a fill on a torch stream, and a CuPy RawKernel spin
                   then fill on a CuPy stream; we import at once (our consumer stream passed
                   as the stream argument) and read on our stream: every element is final.
                   A CuPy Stream object passed as from_dlpack's stream is kept alive by the
                   import (its CUstream is destroyed with it) and let go with it.
  pool_block       a pool block handed to PyTorch is never handed out again while the torch
                   tensor lives (even after our own handle is gone), and is released when it
                   goes (pool used bytes back to the baseline).
  threads          torch tensors of our exports dropped on other threads, our imports released
                   and dropped on other threads: every deleter once.
  c_api_self       our own Tensor type's __dlpack_c_exchange_api__ (DLPack 1.3): imported
                   through it (same address, data, one deleter), its current_work_stream
                   ordering a slow producer kernel before our read; dltensor_from_py_object_no_sync
                   (through ctypes) refusing a read-only tensor.
  c_api_to_py      managed_tensor_to_py_object_no_sync (called through ctypes) wraps a tensor
                   as an import on our producer stream; a fill queued on it behind slow work
                   is seen by torch on its default stream (the legacy-stream export counts it).
  refusals         CPU tensors, dl_device of another device, copy=True, stream=0 or
                   3..0xffff (no handle), an unsupported dtype (complex64), an out-of-bounds
                   view, a read-only tensor asked for as a legacy capsule: each a clear error;
                   an unconsumed capsule runs the deleter itself.
  flat             100,000 exchanges each way (2,000 under --sanitize): every deleter ran,
                   torch's allocated memory, our pool's used bytes and the device's free memory
                   (cuMemGetInfo) unchanged.

Usage: python3 clients_dlpack.py [--lib PATH/libcudars_mempool_capi.so] [--sanitize] [--only X]
The extension is found in the --lib file's folder (lib/cudars_dlpack.abi3.so).
Prints PASS/FAIL lines and "N passed, N failed"; exit status 1 on any failure.
"""

import gc
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clients_common as common  # noqa: E402

MIB = 1 << 20
SLOW_CYCLES = 200_000_000  # about 0.1 s of SM clocks on an H200

SCENARIOS = ["torch_export", "torch_import", "cupy_both", "jax_both", "stream_export",
             "stream_import", "pool_block", "threads", "c_api_self", "c_api_to_py", "refusals",
             "flat"]

SPIN_SRC = r"""
extern "C" __global__ void spin_fill(int* p, long long n, int v, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        p[i] = v;
    }
}
"""


def load_ext(args):
    libdir = os.path.dirname(os.path.abspath(args.lib))
    if libdir not in sys.path:
        sys.path.insert(0, libdir)
    import cudars_dlpack

    return cudars_dlpack


def delta(cd, before, key):
    return cd.stats()[key] - before[key]


def wait_for(pred, timeout=5.0):
    """Polls `pred` (a deleter some frameworks run asynchronously, JAX's on its own thread)."""
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            return False
        gc.collect()
        time.sleep(0.01)
    return True


def raises(fn, exc_types):
    try:
        fn()
    except exc_types as e:  # noqa: PERF203
        return f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        return f"WRONG {type(e).__name__}: {e}"
    return None


def check_raises(rep, fn, exc_types, what):
    got = raises(fn, exc_types)
    rep.check(got is not None and not got.startswith("WRONG"), f"{what} ({got or 'no error'})")


def torch_export(args, rep):
    import torch

    cd = load_ext(args)
    for kind in ("pool", "alloc"):
        buf = cd.pool_alloc(4 * MIB) if kind == "pool" else cd.alloc(4 * MIB)
        buf.fill_u32(0x01020304)
        before = cd.stats()
        t = torch.from_dlpack(buf.tensor("int32", (MIB,)))
        rep.check(t.data_ptr() == buf.ptr, f"{kind}: torch sees our address ({t.data_ptr():#x} vs {buf.ptr:#x})")
        rep.check(t.is_cuda and t.dtype == torch.int32 and tuple(t.shape) == (MIB,), f"{kind}: dtype/shape {t.dtype} {tuple(t.shape)}")
        rep.check(bool((t == 0x01020304).all().item()), f"{kind}: torch reads our fill")
        t.add_(1)
        torch.cuda.synchronize()
        got = memoryview(buf.read()).cast("i")
        rep.check(all(got[i] == 0x01020305 for i in (0, MIB // 2, MIB - 1)), f"{kind}: we read torch's writes")
        rep.check(delta(cd, before, "exports") == 1, f"{kind}: one export made")
        rep.check(delta(cd, before, "export_deleters") == 0, f"{kind}: deleter not run while torch holds it")
        del t
        gc.collect()
        rep.check(delta(cd, before, "export_deleters") == 1, f"{kind}: deleter ran exactly once after torch let go")
    # 2-D with strides and an offset.
    buf = cd.pool_alloc(64 * 64 * 4)
    raw = bytearray(64 * 64 * 4)
    mv = memoryview(raw).cast("f")
    for i in range(64 * 64):
        mv[i] = float(i)
    buf.write(bytes(raw))
    t = torch.from_dlpack(buf.tensor("float32", (32, 64), (64, 1), 32 * 64 * 4))
    rep.check(t.data_ptr() == buf.ptr + 32 * 64 * 4, "offset view: address is base + offset")
    rep.check(float(t[0, 0].item()) == 32 * 64.0 and float(t[31, 63].item()) == 64 * 64 - 1.0, "offset view: values")
    tt = torch.from_dlpack(buf.tensor("float32", (64, 64), (1, 64)))
    rep.check(tt.stride() == (1, 64) and float(tt[1, 0].item()) == 1.0 and float(tt[0, 1].item()) == 64.0,
              f"transposed strides honoured {tt.stride()}")


def torch_import(args, rep):
    import torch
    import torch.utils.dlpack

    cd = load_ext(args)
    x = torch.arange(MIB, dtype=torch.int32, device="cuda")
    before = cd.stats()
    imp = cd.from_dlpack(x)
    rep.check(imp.ptr == x.data_ptr(), f"same address ({imp.ptr:#x})")
    rep.check(imp.shape == [MIB] and imp.dtype == "int32" and imp.contiguous, f"shape/dtype {imp.shape} {imp.dtype}")
    rep.info(f"torch {torch.__version__} exported DLPack version {imp.version}")
    got = memoryview(imp.read()).cast("i")
    rep.check(got[0] == 0 and got[12345] == 12345 and got[MIB - 1] == MIB - 1, "we read torch's data")
    imp.write(bytes(4 * MIB))
    rep.check(int(x.abs().sum().item()) == 0, "torch reads our write")
    imp.fill_u32(7)
    imp.synchronize()
    rep.check(bool((x == 7).all().item()), "torch reads our kernel's fill")
    imp.release()
    imp.release()
    rep.check(delta(cd, before, "import_releases") == 1, "released exactly once")
    del imp

    # Legacy capsule: a producer that only knows the pre-1.0 protocol.
    class Legacy:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return torch.utils.dlpack.to_dlpack(self.t)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    y = torch.full((1000,), 3.5, dtype=torch.float64, device="cuda")
    imp = cd.from_dlpack(Legacy(y))
    rep.check(imp.version is None and imp.ptr == y.data_ptr(), f"legacy capsule imported (version {imp.version})")
    rep.check(memoryview(imp.read()).cast("d")[999] == 3.5, "legacy: data")
    del imp

    z = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4).t()
    imp = cd.from_dlpack(z)
    rep.check(imp.strides == [1, 4] and imp.shape == [4, 3] and not imp.contiguous, f"transposed: strides {imp.strides}")
    del imp
    check_raises(rep, lambda: cd.from_dlpack(z, contiguous=True), (BufferError,), "contiguous=True refuses a transposed tensor")

    for dt, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16"), (torch.bool, "bool"), (torch.int64, "int64"),
                     (torch.uint8, "uint8"), (torch.float64, "float64")):
        w = torch.ones(16, dtype=dt, device="cuda")
        imp = cd.from_dlpack(w)
        # Older PyTorch exported bool as kDLUInt 8; DLPack's kDLBool is newer.
        ok = imp.dtype == name or (name == "bool" and imp.dtype == "uint8")
        rep.check(ok and imp.ptr == w.data_ptr(), f"dtype {dt} -> {imp.dtype}")
        del imp

    # The producer's memory stays until release().
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    big = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    imp = cd.from_dlpack(big)
    del big
    gc.collect()
    held = torch.cuda.memory_allocated() - base
    rep.check(held >= 64 * MIB, f"torch keeps the memory while we hold it ({held} bytes)")
    imp.release()
    gc.collect()
    rep.check(torch.cuda.memory_allocated() - base < 64 * MIB, "released to torch at release()")

    # The DLPack 1.3 C exchange API.
    if cd.has_c_exchange_api(x):
        imp = cd.from_dlpack(x, c_api=True)
        rep.check(imp.via_c_api and imp.ptr == x.data_ptr(), "C exchange API: same address")
        rep.check(memoryview(imp.read()).cast("i")[5] == 7, "C exchange API: data")
        del imp
    else:
        rep.info(f"torch {torch.__version__} has no __dlpack_c_exchange_api__: C exchange API not exercised")


def cupy_both(args, rep):
    import cupy

    cd = load_ext(args)
    a = cupy.arange(MIB, dtype=cupy.int32)
    imp = cd.from_dlpack(a)
    rep.check(imp.ptr == a.data.ptr, f"cupy -> ours: same address ({imp.ptr:#x})")
    rep.check(memoryview(imp.read()).cast("i")[777] == 777, "cupy -> ours: data")
    imp.write(bytes(4 * MIB))
    rep.check(int(a.sum()) == 0, "cupy reads our write")
    del imp
    buf = cd.pool_alloc(4 * MIB)
    buf.fill_u32(11)
    before = cd.stats()
    b = cupy.from_dlpack(buf.tensor("int32", (MIB,)))
    rep.check(b.data.ptr == buf.ptr, f"ours -> cupy: same address ({b.data.ptr:#x})")
    rep.check(bool((b == 11).all()), "ours -> cupy: data")
    b += 1
    cupy.cuda.Device().synchronize()
    rep.check(memoryview(buf.read()).cast("i")[MIB - 1] == 12, "we read cupy's writes")
    del b
    gc.collect()
    rep.check(delta(cd, before, "export_deleters") == 1, "cupy ran the deleter once")


def jax_both(args, rep):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.dlpack
    import jax.numpy as jnp
    import numpy as np

    cd = load_ext(args)
    rep.info(f"jax {jax.__version__} on {jax.devices()}")
    a = jnp.arange(MIB, dtype=jnp.int32)
    a.block_until_ready()
    imp = cd.from_dlpack(a)
    rep.check(imp.ptr == a.unsafe_buffer_pointer(), f"jax -> ours: same address ({imp.ptr:#x})")
    rep.check(memoryview(imp.read()).cast("i")[4242] == 4242, "jax -> ours: data")
    del imp
    buf = cd.pool_alloc(4 * MIB)
    buf.fill_u32(21)
    before = cd.stats()
    b = jax.dlpack.from_dlpack(buf.tensor("int32", (MIB,)))
    rep.check(b.unsafe_buffer_pointer() == buf.ptr, f"ours -> jax: same address ({b.unsafe_buffer_pointer():#x})")
    rep.check(bool(np.all(np.asarray(b) == 21)), "ours -> jax: data")
    c = (b + 1).block_until_ready()
    rep.check(int(c[0]) == 22, "jax computes on our memory")
    del b, c
    gc.collect()
    # JAX frees a buffer once its pending uses are done, possibly on another thread.
    wait_for(lambda: delta(cd, before, "export_deleters") >= 1)
    time.sleep(0.2)
    rep.check(delta(cd, before, "export_deleters") == 1, f"jax ran the deleter once ({delta(cd, before, 'export_deleters')})")


def stream_export(args, rep):
    import cupy
    import torch

    cd = load_ext(args)
    n = 4 * MIB
    for consumer in ("torch", "torch_default", "torch_default_again", "cupy"):
        buf = cd.pool_alloc(4 * n)
        buf.fill_u32(1)
        buf.synchronize()
        buf.spin_fill_u32(0x0D0D0D0D, SLOW_CYCLES)
        t0 = time.time()
        if consumer == "torch":
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                t = torch.from_dlpack(buf.tensor("int32", (n,)))
                bad = int((t != 0x0D0D0D0D).sum().item())
        elif consumer.startswith("torch_default"):
            # PyTorch's default stream: __dlpack__(stream=1), the legacy stream, which the
            # module orders once per batch of producer work.
            s = torch.cuda.current_stream()
            t = torch.from_dlpack(buf.tensor("int32", (n,)))
            bad = int((t != 0x0D0D0D0D).sum().item())
            if consumer == "torch_default_again":
                # New producer work after an export: the next export orders again.
                buf.spin_fill_u32(0x0B0B0B0B, SLOW_CYCLES)
                t2 = torch.from_dlpack(buf.tensor("int32", (n,)))
                bad += int((t2 != 0x0B0B0B0B).sum().item())
                del t2
        else:
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                t = cupy.from_dlpack(buf.tensor("int32", (n,)))
                bad = int((t != 0x0D0D0D0D).sum().get(stream=s))
        rep.info(f"{consumer}: import and read took {time.time() - t0:.3f} s (the kernel ~0.1 s)")
        rep.check(bad == 0, f"{consumer} on its own stream sees the producer kernel's values ({bad} stale)")
        # The pool block's free records a fence on every stream that used it, the
        # consumer's too: free it while that stream is alive.
        del t
        buf.synchronize()
        del buf
        gc.collect()
        s.synchronize()


def stream_import(args, rep):
    import cupy
    import torch

    cd = load_ext(args)
    n = 4 * MIB
    # PyTorch producer: a sleep then a fill on a torch stream; we import at once.
    x = torch.zeros(n, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLOW_CYCLES)
        x.fill_(0x0E0E0E0E)
        imp = cd.from_dlpack(x)
    got = memoryview(imp.read()).cast("i")
    bad = sum(1 for i in range(0, n, 4099) if got[i] != 0x0E0E0E0E)
    rep.check(bad == 0, f"torch producer: our stream saw its final values ({bad} stale samples)")
    if cd.has_c_exchange_api(x):
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLOW_CYCLES)
            x.fill_(0x0F0F0F0F)
            imp2 = cd.from_dlpack(x, c_api=True)
        got = memoryview(imp2.read()).cast("i")
        bad = sum(1 for i in range(0, n, 4099) if got[i] != 0x0F0F0F0F)
        rep.check(bad == 0, f"torch producer through the C exchange API: final values ({bad} stale)")
        del imp2
    del imp
    torch.cuda.synchronize()
    # CuPy producer: a RawKernel spin then fill on a non-blocking CuPy stream.
    kern = cupy.RawKernel(SPIN_SRC, "spin_fill")
    a = cupy.zeros(n, dtype=cupy.int32)
    cupy.cuda.Device().synchronize()
    cs = cupy.cuda.Stream(non_blocking=True)
    with cs:
        kern((132,), (256,), (a, cupy.int64(n), cupy.int32(0x0C0C0C0C), cupy.int64(SLOW_CYCLES)))
        imp = cd.from_dlpack(a)
    got = memoryview(imp.read()).cast("i")
    bad = sum(1 for i in range(0, n, 4099) if got[i] != 0x0C0C0C0C)
    rep.check(bad == 0, f"cupy producer: our stream saw its final values ({bad} stale samples)")
    del imp
    cs.synchronize()
    # A stream object (not its int) is kept alive by the import that uses it: CuPy destroys
    # a Stream's CUstream when the object goes, while the import still reads on it.
    import weakref

    cs2 = cupy.cuda.Stream(non_blocking=True)
    b = cupy.full(n, 0x0B0B0B0B, dtype=cupy.int32)
    cupy.cuda.Device().synchronize()
    imp = cd.from_dlpack(b, stream=cs2)
    try:
        alive = weakref.ref(cs2)
    except TypeError:
        alive = None
    del cs2
    gc.collect()
    if alive is not None:
        rep.check(alive() is not None, "the stream object passed to from_dlpack lives while the import does")
    got = memoryview(imp.read()).cast("i")
    bad = sum(1 for i in range(0, n, 4099) if got[i] != 0x0B0B0B0B)
    rep.check(bad == 0, f"import on a stream object whose last Python reference went ({bad} stale)")
    del imp
    gc.collect()
    if alive is not None:
        rep.check(alive() is None, "the stream object is let go with the import")


def pool_block(args, rep):
    import torch

    cd = load_ext(args)
    size = 8 * MIB
    warm = cd.pool_alloc(size)
    del warm
    base_used = cd.pool_stats()["used"]
    buf = cd.pool_alloc(size)
    addr = buf.ptr
    buf.fill_u32(5)
    before = cd.stats()
    t = torch.from_dlpack(buf.tensor("int32", (size // 4,)))
    del buf
    gc.collect()
    others = [cd.pool_alloc(size) for _ in range(4)]
    rep.check(all(o.ptr != addr for o in others), "the exported block is not handed out again while torch holds it")
    rep.check(cd.pool_stats()["used"] >= base_used + 5 * size, f"pool counts it as used ({cd.pool_stats()['used']})")
    rep.check(bool((t == 5).all().item()), "torch's data intact while others allocate")
    del others
    rep.check(delta(cd, before, "export_deleters") == 0, "deleter not run while torch holds it")
    del t
    gc.collect()
    torch.cuda.synchronize()
    rep.check(delta(cd, before, "export_deleters") == 1, "deleter ran once when the torch tensor went")
    rep.check(cd.pool_stats()["used"] == base_used, f"pool used back to the baseline ({cd.pool_stats()['used']} vs {base_used})")
    again = cd.pool_alloc(size)
    rep.info(f"after release the pool handed out {'the same' if again.ptr == addr else 'another'} block")


def threads(args, rep):
    import torch

    cd = load_ext(args)
    buf = cd.pool_alloc(MIB)
    before = cd.stats()
    holder = [torch.from_dlpack(buf.tensor("float32", (MIB // 4,))) for _ in range(16)]

    def drop_one():
        holder.pop()
        gc.collect()

    ts = [threading.Thread(target=drop_one) for _ in range(16)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    rep.check(delta(cd, before, "export_deleters") == 16, f"16 torch tensors dropped on 16 threads: 16 deleters ({delta(cd, before, 'export_deleters')})")

    xs = [torch.ones(MIB, device="cuda") for _ in range(8)]
    imps = [cd.from_dlpack(x) for x in xs]
    before = cd.stats()
    ts = [threading.Thread(target=imp.release) for imp in imps[:4]]
    box = [imps[4:]]

    def drop_rest():
        box.pop()
        gc.collect()

    ts.append(threading.Thread(target=drop_rest))
    del imps
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    gc.collect()
    rep.check(delta(cd, before, "import_releases") == 8, f"8 imports released or dropped on other threads: 8 releases ({delta(cd, before, 'import_releases')})")


def c_api_self(args, rep):
    cd = load_ext(args)
    buf = cd.pool_alloc(16 * MIB)
    t = buf.tensor("int32", (4 * MIB,))
    rep.check(cd.has_c_exchange_api(t), "our Tensor type offers __dlpack_c_exchange_api__")
    buf.fill_u32(3)
    before = cd.stats()
    imp = cd.from_dlpack(t, c_api=True)
    rep.check(imp.via_c_api and imp.ptr == buf.ptr, f"imported through the C API at the same address ({imp.via_c_api})")
    rep.check(imp.version is not None and imp.version[0] == 1, f"versioned tensor {imp.version}")
    got = memoryview(imp.read()).cast("i")
    rep.check(got[0] == 3 and got[4 * MIB - 1] == 3, "data")
    imp.release()
    rep.check(delta(cd, before, "export_deleters") == 1 and delta(cd, before, "c_api_imports") == 1,
              "one export, one deleter, one C API import")
    # A slow kernel on the producer stream: current_work_stream orders our read after it.
    buf.spin_fill_u32(0x0A0A0A0A, SLOW_CYCLES)
    imp = cd.from_dlpack(t, c_api=True)
    got = memoryview(imp.read()).cast("i")
    bad = sum(1 for i in range(0, 4 * MIB, 4099) if got[i] != 0x0A0A0A0A)
    rep.check(bad == 0, f"the C API's current_work_stream orders our read after the producer ({bad} stale)")
    del imp
    buf.synchronize()
    # dltensor_from_py_object_no_sync (a bare DLTensor, no flags) through ctypes, as a C
    # consumer calls it with the GIL held: a writable tensor is described, a read-only one
    # refused (a bare DLTensor cannot say read-only).
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    table = get(type(t).__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    fns = (ctypes.c_void_p * 5).from_address(table + 16)
    dltensor_from_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(fns[3])
    out = (ctypes.c_uint64 * 6)()
    rc = dltensor_from_py(t, ctypes.addressof(out))
    rep.check(rc == 0 and out[0] == buf.ptr, f"dltensor_from_py_object_no_sync describes a tensor ({rc}, {out[0]:#x})")
    ro = buf.tensor("int32", (4 * MIB,), read_only=True)
    check_raises(rep, lambda: dltensor_from_py(ro, ctypes.addressof(out)), (BufferError,),
                 "dltensor_from_py_object_no_sync refuses a read-only tensor (no flag to say so)")


def c_api_to_py(args, rep):
    import ctypes
    import torch

    cd = load_ext(args)
    n = 4 * MIB
    buf = cd.pool_alloc(4 * n)
    t = buf.tensor("int32", (n,))
    buf.fill_u32(1)
    buf.synchronize()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    table = get(type(t).__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    fns = (ctypes.c_void_p * 5).from_address(table + 16)
    from_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(fns[1])
    to_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(fns[2])
    managed = ctypes.c_void_p()
    rc = from_py(t, ctypes.addressof(managed))
    rep.check(rc == 0 and managed.value, "managed_tensor_from_py_object_no_sync")
    out = ctypes.c_void_p()
    rc = to_py(managed, ctypes.addressof(out))
    imp = ctypes.cast(out, ctypes.py_object).value  # a reference of our own ...
    ctypes.pythonapi.Py_DecRef.argtypes = [ctypes.c_void_p]
    ctypes.pythonapi.Py_DecRef(out)  # ... and the one the call handed over, dropped
    rep.check(rc == 0 and imp.ptr == buf.ptr and imp.via_c_api, "managed_tensor_to_py_object_no_sync: an import of the same memory")
    # An export to torch's default (legacy) stream: the module orders it once.
    first = torch.from_dlpack(t)
    rep.check(bool((first == 1).all().item()), "first export read by torch")
    del first
    # Slow work on the producer stream that the module does not know of, then the import's
    # fill behind it on the same stream: the next legacy-stream export must wait for it.
    producer = torch.cuda.ExternalStream(cd.streams()[0])
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLOW_CYCLES)
    imp.fill_u32(0x22222222)
    x = torch.from_dlpack(buf.tensor("int32", (n,)))
    bad = int((x != 0x22222222).sum().item())
    rep.check(bad == 0, f"torch's default stream sees the import's fill on the producer stream ({bad} stale)")
    del x, imp
    gc.collect()
    buf.synchronize()
    torch.cuda.synchronize()


def refusals(args, rep):
    import torch

    cd = load_ext(args)
    check_raises(rep, lambda: cd.from_dlpack(torch.ones(4)), (BufferError,), "a CPU tensor is refused")
    check_raises(rep, lambda: cd.from_dlpack(torch.ones(4, dtype=torch.complex64, device="cuda")), (BufferError,),
                 "complex64 is refused (unsupported dtype)")
    buf = cd.pool_alloc(4096)
    t = buf.tensor("float32", (1024,))
    check_raises(rep, lambda: t.__dlpack__(dl_device=(2, 99)), (BufferError,), "dl_device of another device")
    check_raises(rep, lambda: t.__dlpack__(copy=True), (BufferError,), "copy=True")
    check_raises(rep, lambda: t.__dlpack__(stream=0), (ValueError,), "stream=0 (ambiguous)")
    # Integers no CUstream pointer can have (a stream id, a device ordinal): refused before the
    # driver reads through them (a larger garbage integer cannot be caught: it crashes).
    for bad in (3, 7, 0xFFFF):
        check_raises(rep, lambda: t.__dlpack__(stream=bad, max_version=(1, 3)), (ValueError,),
                     f"stream={bad} is no stream handle")
        check_raises(rep, lambda: cd.from_dlpack(t, stream=bad), (ValueError,),
                     f"from_dlpack(stream={bad}) is no stream handle")
    check_raises(rep, lambda: buf.tensor("float32", (1025,)), (BufferError,), "a view past the end")
    check_raises(rep, lambda: buf.tensor("float32", (4,), None, 2), (BufferError,), "a misaligned offset")
    check_raises(rep, lambda: buf.tensor("complex64"), (ValueError,), "an unknown dtype name")
    rep.check(t.__dlpack_device__() == (2, 0), f"__dlpack_device__ {t.__dlpack_device__()}")
    before = cd.stats()
    cap = t.__dlpack__(stream=-1, max_version=(1, 3))
    rep.check("dltensor_versioned" in repr(cap), f"max_version (1, 3): versioned capsule {cap!r}")
    del cap
    cap = t.__dlpack__(stream=-1)
    rep.check('"dltensor"' in repr(cap), f"no max_version: legacy capsule {cap!r}")
    del cap
    gc.collect()
    rep.check(delta(cd, before, "export_deleters") == 2, "unconsumed capsules ran their deleters")
    ro = buf.tensor("float32", (1024,), read_only=True)
    check_raises(rep, lambda: ro.__dlpack__(stream=-1), (BufferError,),
                 "a read-only tensor is not exported as a legacy capsule (no flag to say so)")
    cap = ro.__dlpack__(stream=-1, max_version=(1, 0))
    rep.check("dltensor_versioned" in repr(cap), "a read-only tensor is exported versioned")
    del cap
    imp = cd.from_dlpack(torch.ones(4, device="cuda"))
    check_raises(rep, lambda: cd.from_dlpack(torch.ones(4, device="cuda"), device=1 if torch.cuda.device_count() > 1 else 64),
                 (BufferError, RuntimeError), "another device than the tensor's")
    del imp


def flat(args, rep):
    import torch

    cd = load_ext(args)
    n = 2_000 if args.sanitize else 100_000
    buf = cd.pool_alloc(MIB)
    t = buf.tensor("float32", (MIB // 4,))
    x = torch.ones(MIB // 4, device="cuda")
    for _ in range(1000):
        del_me = torch.from_dlpack(t)
        del del_me
        imp = cd.from_dlpack(x)
        del imp
    torch.cuda.synchronize()
    gc.collect()
    before = cd.stats()
    alloc0 = torch.cuda.memory_allocated()
    used0 = cd.pool_stats()["used"]
    free0, _ = cd.mem_get_info()
    t0 = time.time()
    for _ in range(n):
        y = torch.from_dlpack(t)
        del y
        imp = cd.from_dlpack(x)
        del imp
    torch.cuda.synchronize()
    gc.collect()
    dt = time.time() - t0
    after = cd.stats()
    free1, _ = cd.mem_get_info()
    rep.info(f"{n} exchanges each way in {dt:.2f} s")
    rep.check(after["exports"] - before["exports"] == n and after["export_deleters"] - before["export_deleters"] == n,
              f"{n} exports, {after['export_deleters'] - before['export_deleters']} deleters")
    rep.check(after["live_exports"] == 0, f"no live exports ({after['live_exports']})")
    rep.check(after["imports"] - before["imports"] == n and after["import_releases"] - before["import_releases"] == n,
              f"{n} imports, {after['import_releases'] - before['import_releases']} releases")
    rep.check(torch.cuda.memory_allocated() == alloc0, "torch's allocated memory unchanged")
    rep.check(cd.pool_stats()["used"] == used0, "our pool's used bytes unchanged")
    rep.check(abs(free1 - free0) <= 2 * MIB, f"device free memory flat ({free0 - free1:+d} bytes)")


def child(args):
    rep = common.Report()
    name = args.child
    try:
        fn = globals().get(name)
        if name not in SCENARIOS or fn is None:
            rep.check(False, f"unknown scenario {name}")
        else:
            fn(args, rep)
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        rep.check(False, f"{name} raised {type(e).__name__}: {e}")
    return common.finish(rep)


def main():
    args = common.parser(__doc__).parse_args()
    if args.child:
        return child(args)
    ext = os.path.join(os.path.dirname(os.path.abspath(args.lib)), "cudars_dlpack.abi3.so")
    if not os.path.exists(ext):
        print(f"FAIL: {ext} not found\n0 passed, 1 failed")
        return 1
    scenarios = [(s, []) for s in SCENARIOS]
    return common.run_scenarios(os.path.abspath(__file__), args, scenarios)


if __name__ == "__main__":
    sys.exit(main())
