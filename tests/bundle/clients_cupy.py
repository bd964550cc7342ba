#!/usr/bin/env python3
"""CuPy 14 on cuda-mempool through lib/cuda_mempool_cupy.py: stream safety, threads, stream
churn, out of memory and CUDA graph capture, on the real GPU.

Scenarios (each in its own process; --only NAME runs a subset):
  cross_nonblocking, cross_blocking, cross_default
      a 16 MiB block freed on stream 1 while a ~0.2 s kernel still writes it; stream 2 then
      allocates the same size and fills it. After everything syncs, every element must hold
      stream 2's value (the block was not handed to stream 2 before the kernel completed).
  destroyed_stream   the same, with stream 1 destroyed right after the free.
  threads            8 threads, each on its own stream, freeing buffers kernels still write,
                     for --seconds (60): no corruption, no crash.
  churn              --streams (10,000) streams created, used for allocations, destroyed:
                     no crash; pool reserved bytes and device memory stay flat.
  oom, oom_limit     a request for twice the card (or over a limit) raises CuPy's
                     OutOfMemoryError; reserved bytes unchanged; a new kernel, cuBLAS and
                     cuFFT work afterwards.
  graph              cupy.cuda.Graph capture allocating (and freeing) inside the capture,
                     replayed with new inputs; data checked, graph memory not reused outside.
  stream_hold        the module's C path (CuPy's CFunctionAllocator calling the library, the
                     stream learnt from CuPy) keeps a stream object alive exactly while the
                     stream has live blocks, once a stream; the default stream is never held;
                     an out of memory on a stream leaves nothing held.
  steal_calls        CuPy calls users write after a steal: a ~0.2 s kernel on non-blocking
                     stream A writes a block, which is freed; non-blocking stream B allocates
                     the same size (the pool may hand it A's block, ordered on the device) and
                     then runs ndarray.set, ndarray.get or cupy.asarray(numpy_array) on it:
                     the data is right, read back at once and after everything finished.
  ptds_threads       8 threads on CuPy's per-thread default stream (cupy.cuda.Stream.ptds),
                     handing buffers that kernels still write to a collector thread that
                     frees them (frees from another thread), for --seconds: live buffers
                     never overwritten, no thread raises.
  ptds_program       the same with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 (the whole program's
                     default stream is the per-thread one), 8 threads and the collector.
  plain_first_touch  the plain route only: in 10 fresh processes, 8 threads (on their own
                     streams or the per-thread one) make the process's first allocations at
                     the same moment, so that the library's one-time setup (importing the CuPy
                     module, which lets other threads run) races their allocations: every
                     allocation is served at a real address with the right data, or raises.
  plain_*            the plain route (CuPy's documented four lines: CFunctionAllocator over
                     cuda_mempool_cupy_malloc / cuda_mempool_cupy_free, no module install):
                     plain_cross_nonblocking, plain_cross_blocking, plain_threads, plain_oom,
                     plain_oom_limit, plain_steal_calls, plain_ptds_threads; the library sets
                     up CuPy's stream lookup itself (here from the copy of the module embedded
                     in the library: lib/ is taken off sys.path).
  fault, plain_fault a kernel writes an illegal address; CuPy reports it first; then
                     allocations through the pool raise CuPy's CUDADriverError (status 700,
                     the message starting with the fault's text) within 50 ms, and keep
                     raising.
  block_size         every route of the module reports mem.size at the pool's 512-byte rounding
                     (as CuPy's pool does), and cupy.percentile over blocks whose tails hold
                     NaN gives numpy's result.

Usage: python3 clients_cupy.py [--lib PATH] [--seconds S] [--streams N] [--sanitize] [--only X]
Prints PASS/FAIL lines and "N passed, N failed"; exit status 1 on any failure.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clients_common as common  # noqa: E402

MIB = 1 << 20
SPIN_SRC = r"""
extern "C" __global__ void spin_fill(float* p, long long n, float v, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        p[i] = v;
    }
}
"""


class PlainPool:
    """The pool's figures and controls through the C functions (the plain route installs no
    module object); the subset of the module's MemoryPool the scenarios use."""

    path = "plain"

    def __init__(self, so):
        import ctypes

        self.so = so
        for name in ("used_bytes", "reserved_bytes", "get_limit", "n_free_blocks",
                     "cupy_held_streams", "live_allocations"):
            getattr(so, "cuda_mempool_" + name).restype = ctypes.c_int64
        so.cuda_mempool_set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        so.cuda_mempool_last_error.restype = ctypes.c_char_p

    def used_bytes(self):
        return self.so.cuda_mempool_used_bytes(0)

    def total_bytes(self):
        return self.so.cuda_mempool_reserved_bytes(0)

    def n_free_blocks(self):
        return self.so.cuda_mempool_n_free_blocks()

    def held_streams(self):
        return self.so.cuda_mempool_cupy_held_streams()

    def free_all_blocks(self):
        if self.so.cuda_mempool_free_all_blocks() != 0:
            raise RuntimeError(self.so.cuda_mempool_last_error())

    def set_limit(self, size=None):
        if self.so.cuda_mempool_set_limit(0, size or 0) != 0:
            raise ValueError(self.so.cuda_mempool_last_error())

    def get_limit(self):
        return self.so.cuda_mempool_get_limit(0)


def install_plain(cp, lib):
    """CuPy's documented CFunctionAllocator lines over the library, nothing else; lib/ is
    taken off sys.path so that the library runs its embedded copy of the module."""
    import ctypes

    libdir = os.path.dirname(os.path.abspath(lib))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != libdir]
    so = ctypes.CDLL(lib)
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    alloc = cp.cuda.memory.CFunctionAllocator(
        0, addr(so.cuda_mempool_cupy_malloc), addr(so.cuda_mempool_cupy_free), so)
    cp.cuda.set_allocator(alloc.malloc)
    return PlainPool(so)


def setup(args):
    import cupy as cp

    if args.mode == "plain":
        pool = install_plain(cp, args.lib)
        cmp = None
    else:
        if common.FROM_WHEEL:
            import cudars.cupy
            from cudars import _cuda_mempool_cupy as cmp

            assert os.path.samefile(args.lib, cudars.library_path()), args.lib
            pool = cudars.cupy.install()
        else:
            import cuda_mempool_cupy as cmp

            pool = cmp.install(args.lib)
    cp.cuda.Device(0).use()
    kern = cp.RawKernel(SPIN_SRC, "spin_fill")
    clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
    return cp, cmp, pool, kern, clock_khz


def launch(cp, kern, arr, value, cycles):
    n = arr.size
    kern((264,), (256,), (arr, cp.int64(n), cp.float32(value), cp.int64(cycles)))


def cross_stream(args, rep, kind):
    cp, cmp, pool, kern, khz = setup(args)
    n = 4 * MIB  # float32: 16 MiB
    cycles = int(0.2 * khz * 1000)  # ~0.2 s at the base clock
    if kind == "default":
        s1 = cp.cuda.Stream.null
    else:
        s1 = cp.cuda.Stream(non_blocking=(kind == "nonblocking"))
    s2 = cp.cuda.Stream(non_blocking=(kind != "blocking"))
    destroy = kind == "destroyed"
    # Warm up everything the rounds use (kernel compilation would otherwise outlast the
    # slow kernel and hide the overlap).
    with s2:
        w = cp.empty(n, dtype=cp.float32)
        w.fill(2.0)
        int((w != 2.0).sum())
        del w
    cp.cuda.Device(0).synchronize()
    used0 = pool.used_bytes()
    for rnd in range(4):
        # The last round leaves no room for fresh memory: stream 2 can only get the block
        # the kernel writes, so the pool must wait for the kernel before handing it over.
        limited = rnd == 3
        if limited:
            pool.set_limit(size=int(n * 4 * 1.5))
        with s1:
            a = cp.empty(n, dtype=cp.float32)
            launch(cp, kern, a, 1.0, cycles)
            done1 = cp.cuda.Event()
            done1.record(s1)
            ptr_a = a.data.ptr
            del a  # freed while the kernel still runs (and will write 1.0)
        if destroy:
            del s1
            s1 = cp.cuda.Stream(non_blocking=True)
        with s2:
            b = cp.empty(n, dtype=cp.float32)
            b.fill(2.0)
            ptr_b = b.data.ptr
        still_running = not done1.done
        cp.cuda.Device(0).synchronize()
        host = cp.asnumpy(b)
        wrong = int((host != 2.0).sum())
        if limited:
            pool.set_limit(size=0)
            rep.check(True, f"{kind} round {rnd} (limited): the pool handed over "
                            f"{'the same block' if ptr_a == ptr_b else 'other memory'}, "
                            f"kernel still running at the hand-over: {still_running}")
        else:
            rep.check(still_running, f"{kind} round {rnd}: the slow kernel was still running "
                                     f"when stream 2 allocated and filled (the test had an overlap)")
        rep.check(wrong == 0, f"{kind} round {rnd}: {wrong} of {n} elements differ from stream "
                              f"2's value (same block: {ptr_a == ptr_b})")
        del b
    cp.cuda.Device(0).synchronize()
    rep.check(pool.used_bytes() == used0,
              f"{kind}: used bytes back to {used0} after the arrays are gone "
              f"(now {pool.used_bytes()})")


def threads_scenario(args, rep):
    cp, cmp, pool, kern, khz = setup(args)
    n_threads = 8
    seconds = args.seconds
    errors, crashes, iters = [], [], [0] * n_threads
    short = int(0.002 * khz * 1000)  # ~2 ms
    stop_at = time.time() + seconds

    def worker(t):
        try:
            rng = __import__("random").Random(1000 + t)
            s = cp.cuda.Stream(non_blocking=True)
            kept = []
            with s:
                while time.time() < stop_at:
                    size = rng.randint(1, 16) * MIB // 4
                    x = cp.empty(size, dtype=cp.float32)
                    launch(cp, kern, x, -1.0 - t, short)
                    del x  # freed while being written
                    val = float(t * 1_000_000 + iters[t] % 1_000_000)
                    y = cp.empty(rng.randint(1, 16) * MIB // 4, dtype=cp.float32)
                    launch(cp, kern, y, val, 0)
                    kept.append((y, val))
                    if len(kept) > 4:
                        kept.pop(0)
                    iters[t] += 1
                    if iters[t] % 8 == 0:
                        s.synchronize()
                        for arr, v in kept:
                            bad = int((arr != v).sum())
                            if bad:
                                errors.append(f"thread {t} iter {iters[t]}: {bad} elements "
                                              f"of a live buffer overwritten")
                        s.synchronize()
                s.synchronize()
                for arr, v in kept:
                    bad = int((arr != v).sum())
                    if bad:
                        errors.append(f"thread {t} final: {bad} elements overwritten")
        except Exception as e:  # noqa: BLE001 - reported as a failure
            crashes.append(f"thread {t}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    cp.cuda.Device(0).synchronize()
    rep.info(f"{n_threads} threads, {seconds:.0f} s, {sum(iters)} iterations "
             f"({', '.join(map(str, iters))}); pool reserved {pool.total_bytes() / MIB:.1f} MiB")
    rep.check(not crashes, "no thread raised" + ("" if not crashes else ": " + "; ".join(crashes[:5])))
    rep.check(not errors, "no live buffer corrupted" + ("" if not errors else ": " + "; ".join(errors[:5])))
    rep.check(min(iters) > 0, "every thread made progress")
    rep.check(pool.held_streams() == 0,
              f"no stream held once the threads' arrays are gone ({pool.held_streams()})")


def churn(args, rep):
    cp, cmp, pool, kern, khz = setup(args)
    n = args.streams
    warm = min(100, max(n // 10, 1))
    samples = []
    base = None
    bad_data = 0
    t0 = time.time()
    for i in range(n):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            a = cp.empty((3 * MIB) // 4, dtype=cp.float32)
            a.fill(float(i % 1000))
            b = cp.empty(100_000, dtype=cp.float32)  # a second, small block
            b.fill(1.0)
            if i % 97 == 0:
                if float(a[-1]) != float(i % 1000):
                    bad_data += 1
            del a, b
        del s  # destroyed; its blocks are cached by the pool (freed on it)
        if i + 1 == warm:
            cp.cuda.Device(0).synchronize()
            free, total = cp.cuda.runtime.memGetInfo()
            base = (pool.total_bytes(), total - free)
        if base is not None and ((i + 1) % max(n // 10, 1) == 0 or i + 1 == n):
            cp.cuda.Device(0).synchronize()
            free, total = cp.cuda.runtime.memGetInfo()
            samples.append((i + 1, pool.total_bytes(), total - free))
            rep.info(f"after {i + 1:6d} streams ({time.time() - t0:6.1f} s): pool reserved "
                     f"{pool.total_bytes() / MIB:8.1f} MiB, device used {(total - free) / MIB:9.1f} "
                     f"MiB, free blocks {pool.n_free_blocks()}")
    bound = 64 * MIB
    last = samples[-1]
    rep.check(pool.held_streams() == 0, f"no stream held after the churn ({pool.held_streams()})")
    rep.check(bad_data == 0, f"{n} streams: data read back correctly")
    rep.check(last[1] - base[0] <= bound,
              f"pool reserved flat: {base[0] / MIB:.1f} MiB after {warm} streams, "
              f"{last[1] / MIB:.1f} MiB after {n} (bound +{bound // MIB} MiB)")
    rep.check(last[2] - base[1] <= bound,
              f"device memory flat: {base[1] / MIB:.1f} MiB used after {warm} streams, "
              f"{last[2] / MIB:.1f} MiB after {n} (bound +{bound // MIB} MiB)")


def stream_hold(args, rep):
    import gc
    import weakref

    cp, cmp, pool, kern, khz = setup(args)
    import cupy

    # CuPy 14.1 and later raise the exception the library leaves pending ("c"); older ones
    # need the module's pointer check ("c+check").
    want = "c" if tuple(int(x) for x in cupy.__version__.split(".")[:2]) >= (14, 1) else "c+check"
    rep.check(pool.path == want, f"the module allocates through its C path (path: {pool.path}, "
                                 f"CuPy {cupy.__version__})")
    base = pool.held_streams()
    rep.check(base == 0, f"no stream held at the start ({base})")
    x = cp.empty(MIB, dtype=cp.float32)
    rep.check(pool.held_streams() == 0, "a block on the default stream holds no stream")
    s = cp.cuda.Stream(non_blocking=True)
    ref = weakref.ref(s)
    with s:
        a = cp.empty(MIB, dtype=cp.float32)
        b = cp.empty(MIB, dtype=cp.float32)
    rep.check(pool.held_streams() == 1, f"one hold for two blocks ({pool.held_streams()})")
    del s
    gc.collect()
    rep.check(ref() is not None, "the stream object lives while blocks allocated on it do")
    launch(cp, kern, a, 3.0, 1000)
    del a
    gc.collect()
    rep.check(ref() is not None and pool.held_streams() == 1,
              "still held after the first of its two blocks is freed")
    del b
    gc.collect()
    rep.check(ref() is None, "the stream object is let go after its last block is freed")
    rep.check(pool.held_streams() == 0, f"no stream held afterwards ({pool.held_streams()})")
    # Out of memory on a stream: nothing stays held.
    s = cp.cuda.Stream(non_blocking=True)
    ref = weakref.ref(s)
    _, total = cp.cuda.runtime.memGetInfo()
    try:
        with s:
            cp.empty(2 * total, dtype=cp.uint8)
        rep.check(False, "a request for twice the card raised")
    except cp.cuda.memory.OutOfMemoryError:
        rep.check(True, "a request for twice the card on a stream raised OutOfMemoryError")
    del s
    gc.collect()
    rep.check(ref() is None and pool.held_streams() == 0,
              "after the out of memory the stream is not held")
    # Many streams at once, then all freed.
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(32)]
    arrays = []
    for st in streams:
        with st:
            arrays.append(cp.full(1000, 5.0, dtype=cp.float32))
    rep.check(pool.held_streams() == 32, f"32 streams with live blocks held ({pool.held_streams()})")
    refs = [weakref.ref(st) for st in streams]
    del streams, st
    cp.cuda.Device(0).synchronize()
    rep.check(all(float(v[-1]) == 5.0 for v in arrays), "their data read back")
    del arrays
    gc.collect()
    rep.check(pool.held_streams() == 0 and all(r() is None for r in refs),
              "all 32 let go after their blocks are freed")
    del x


def after_oom_work(cp, rep, label):
    """Work that needs driver memory of its own: a brand-new kernel module, cuBLAS, cuFFT."""
    import random

    k = random.randrange(1 << 12)  # small: the float32 result must be exact
    src = ('extern "C" __global__ void f(float* p, int n) { int i = blockIdx.x * blockDim.x'
           f' + threadIdx.x; if (i < n) p[i] = i * 2.0f + {k}.0f; }}')
    try:
        x = cp.empty(1 << 20, dtype=cp.float32)
        cp.RawKernel(src, "f")(((1 << 20) // 256,), (256,), (x, cp.int32(1 << 20)))
        ok = float(x[12345]) == 12345 * 2.0 + k
        rep.check(ok, f"{label}: a newly compiled kernel loads and runs")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: a newly compiled kernel loads and runs ({type(e).__name__}: {e})")
    try:
        a = cp.ones((2048, 2048), dtype=cp.float32)
        c = a @ a
        rep.check(float(c[7, 9]) == 2048.0, f"{label}: cuBLAS matmul")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: cuBLAS matmul ({type(e).__name__}: {e})")
    try:
        v = cp.ones(1 << 20, dtype=cp.complex64)
        f = cp.fft.fft(v)
        rep.check(abs(complex(f[0]) - (1 << 20)) < 1e-3, f"{label}: cuFFT")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: cuFFT ({type(e).__name__}: {e})")


def _oom_in_a_frame(cp, request):
    local = cp.ones(64 * MIB, dtype=cp.uint8)  # noqa: F841  lives in the raising frame
    cp.empty(request, dtype=cp.uint8)


def oom(args, rep, with_limit):
    cp, cmp, pool, kern, khz = setup(args)
    free, total = cp.cuda.runtime.memGetInfo()
    keep = [cp.ones(64 * MIB, dtype=cp.uint8) for _ in range(4)]  # live blocks: 256 MiB
    junk = [cp.empty(8 * MIB, dtype=cp.uint8) for _ in range(8)]
    del junk  # cached
    cp.cuda.Device(0).synchronize()
    label = "limit" if with_limit else "card"
    rep.info(f"{label}: the module's allocation path is {pool.path}")
    if with_limit:
        limit = pool.total_bytes() + 1024 * MIB
        pool.set_limit(size=limit)
        rep.check(pool.get_limit() == limit, f"set_limit/get_limit round trip ({limit} bytes)")
        request = 2048 * MIB
    else:
        limit = 0
        request = 2 * total
    # First with cached blocks present: the pool may release them to retry; used unchanged.
    used0, res0 = pool.used_bytes(), pool.total_bytes()
    try:
        cp.empty(request, dtype=cp.uint8)
        rep.check(False, f"{label}: a request of {request} bytes raised")
    except cp.cuda.memory.OutOfMemoryError as e:
        rep.check(True, f"{label}: a request of {request} bytes raised cupy OutOfMemoryError: {e}")
        got = getattr(e, "requested", -1)
        rep.check(request <= got < request + 2 * MIB,
                  f"{label}: the error carries the requested size ({got}, asked {request})")
        if with_limit:
            rep.check(getattr(e, "limit", 0) == limit, f"{label}: the error carries the limit")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: raised {type(e).__name__} instead of OutOfMemoryError: {e}")
    rep.check(pool.used_bytes() == used0, f"{label}: used bytes unchanged ({used0})")
    rep.check(pool.total_bytes() <= res0, f"{label}: reserved not above before "
                                          f"({res0} -> {pool.total_bytes()})")
    # Then with no cache: reserved must be exactly what it was.
    pool.free_all_blocks()
    res1 = pool.total_bytes()
    try:
        cp.empty(request, dtype=cp.uint8)
        rep.check(False, f"{label} (no cache): the request raised")
    except cp.cuda.memory.OutOfMemoryError:
        rep.check(True, f"{label} (no cache): the request raised OutOfMemoryError")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label} (no cache): raised {type(e).__name__}: {e}")
    rep.check(pool.total_bytes() == res1,
              f"{label}: reserved bytes equal before and after ({res1} -> {pool.total_bytes()})")
    free2, _ = cp.cuda.runtime.memGetInfo()
    rep.info(f"{label}: device free {free / MIB:.0f} MiB at start, {free2 / MIB:.0f} MiB after")
    after_oom_work(cp, rep, label)
    # "Catch OOM, free, retry": once the exception is handled, nothing may keep it (its
    # traceback holds the raising frames and their arrays) alive.
    used_before = pool.used_bytes()
    try:
        _oom_in_a_frame(cp, request)
    except cp.cuda.memory.OutOfMemoryError:
        pass
    rep.check(pool.used_bytes() == used_before,
              f"{label}: the array of the frame that raised is freed once the OOM is handled "
              f"({used_before} -> {pool.used_bytes()} bytes used)")
    if with_limit:
        try:
            x = cp.empty(512 * MIB, dtype=cp.uint8)
            rep.check(True, f"{label}: 512 MiB under the limit succeeds")
            del x
        except Exception as e:  # noqa: BLE001
            rep.check(False, f"{label}: 512 MiB under the limit ({type(e).__name__}: {e})")
        pool.set_limit()
        rep.check(pool.get_limit() == 0, f"{label}: set_limit() removes the limit")
    if args.mode == "plain":
        mod = sys.modules.get("cuda_mempool_cupy")
        rep.check(mod is not None and "embedded" in getattr(mod, "__file__", ""),
                  f"plain route: the library set up its embedded module copy ({mod})")
        rep.check(isinstance(getattr(mod, "OutOfMemoryError", None), type) and
                  issubclass(mod.OutOfMemoryError, cp.cuda.memory.OutOfMemoryError),
                  "plain route: its OutOfMemoryError is CuPy's")
    else:
        rep.check(cp.get_default_memory_pool() is pool,
                  "cupy.get_default_memory_pool() is the module's pool")
    del keep


def graph(args, rep):
    cp, cmp, pool, kern, khz = setup(args)
    n = 1 << 20
    s = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.arange(n, dtype=cp.float32)
        # Warm-up: compile and load the kernels before capture.
        y = x * 2
        z = y + 1
        w = z * 3
        del y, z, w
        s.synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        s.begin_capture()
        y = x * 2           # allocated inside the capture
        z = y + 1
        del y               # freed inside the capture
        w = z * 3           # may reuse y's block, within the capture
        g = s.end_capture()
    ptr_w = w.data.ptr
    # Memory allocated outside the capture while the graph lives must not alias it.
    with s2:
        other = [cp.full(n, 7.0, dtype=cp.float32) for _ in range(4)]
    s2.synchronize()
    rep.check(all(o.data.ptr != ptr_w and o.data.ptr != z.data.ptr for o in other),
              "graph: allocations outside the capture got other addresses")
    ok = True
    for i in range(20):
        with s:
            x[...] = cp.float32(i)
            g.launch(s)
        s.synchronize()
        expect = (i * 2.0 + 1.0) * 3.0
        ok &= bool((w == expect).all())
    rep.check(ok, "graph: 20 replays with new inputs give the right data")
    rep.check(all(bool((o == 7.0).all()) for o in other),
              "graph: memory allocated outside the capture untouched by the replays")
    del g, w, z, other
    cp.cuda.Device(0).synchronize()
    # The graph tells the pool it is gone from a driver thread, a moment after it is
    # destroyed: give it up to 5 s.
    import time
    deadline = time.time() + 5
    pool.free_all_blocks()
    while pool.total_bytes() > before + 2 * MIB and time.time() < deadline:
        time.sleep(0.01)
        pool.free_all_blocks()
    rep.info(f"graph: pool reserved {before / MIB:.1f} MiB before capture, "
             f"{pool.total_bytes() / MIB:.1f} MiB after the graph was destroyed")
    rep.check(pool.total_bytes() <= before + 2 * MIB,
              "graph: the capture's memory returns after the graph is destroyed")


def steal_calls(args, rep):
    """Item 2 of "Reused pool memory is safe for every use": CuPy's own calls on a block the
    pool may have handed from stream A to stream B, ordered on the device."""
    import numpy as np

    cp, cmp, pool, kern, khz = setup(args)
    n = 4 * MIB  # float32: 16 MiB
    cycles = int(0.2 * khz * 1000)
    sa = cp.cuda.Stream(non_blocking=True)
    sb = cp.cuda.Stream(non_blocking=True)
    host = {v: np.full(n, v, dtype=np.float32) for v in (2.0, 3.0)}
    for s in (sa, sb):  # warm up kernels and copies on both streams
        with s:
            w = cp.empty(n, dtype=cp.float32)
            launch(cp, kern, w, 0.0, 1000)
            w.set(host[2.0])
            w.get()
            cp.asarray(host[3.0])
            w.fill(4.0)
            del w
    cp.cuda.Device(0).synchronize()
    for call in ("set", "asarray", "get"):
        for rnd in range(3):
            with sa:
                a = cp.empty(n, dtype=cp.float32)
                launch(cp, kern, a, 1.0, cycles)
                done = cp.cuda.Event()
                done.record(sa)
                ptr_a = a.data.ptr
                del a  # freed while the kernel still runs (and will write 1.0)
            with sb:
                if call == "set":
                    b = cp.empty(n, dtype=cp.float32)
                    b.set(host[2.0])
                    want = 2.0
                elif call == "asarray":
                    b = cp.asarray(host[3.0])
                    want = 3.0
                else:
                    b = cp.empty(n, dtype=cp.float32)
                    b.fill(4.0)
                    want = 4.0
                overlap = not done.done
                now = b.get()  # on stream B, at once
            cp.cuda.Device(0).synchronize()
            later = cp.asnumpy(b)
            bad_now = int((now != want).sum())
            bad_later = int((later != want).sum())
            same = b.data.ptr == ptr_a
            rep.info(f"{call} round {rnd}: kernel still running at the hand-over: {overlap}; "
                     f"same block: {same}")
            rep.check(bad_now == 0 and bad_later == 0,
                      f"{call} round {rnd}: {bad_now} elements wrong when read back on stream B, "
                      f"{bad_later} after everything finished (same block: {same})")
            del b
    cp.cuda.Device(0).synchronize()


def history_scenario(args, rep):
    """Issue 37: the module's record_history / dump_report / dump_snapshot on a live CuPy
    program, the snapshot opened by PyTorch's own memory_viz code."""
    import pickle
    import subprocess
    import tempfile

    cp, cmp, pool, kern, khz = setup(args)
    keep = [cp.empty(3 * MIB, dtype=cp.uint8)]  # live before the recording starts
    pool.record_history()
    s1 = cp.cuda.Stream(non_blocking=True)
    with s1:
        keep.append(cp.ones(5 * MIB // 4, dtype=cp.float32))
        for i in range(20):
            t = cp.zeros((i + 1) * 4096, dtype=cp.uint8)
            del t
    keep.append(cp.arange(1000, dtype=cp.int64))
    cp.cuda.Device(0).synchronize()
    # What the allocator was asked for: each array's block size (mem.size; the module asks
    # the pool for the 512-rounded size, as CuPy's pool reports it).
    live = sum(a.data.mem.size for a in keep)
    out = tempfile.mkdtemp(prefix="cudars-history-")
    html, snap = os.path.join(out, "report.html"), os.path.join(out, "snapshot.pickle")
    pool.dump_report(html)
    pool.dump_snapshot(snap)
    pool.record_history(False)
    text = open(html, encoding="utf-8").read()
    rep.check(text.startswith("<!DOCTYPE html>") and "<svg" in text and "http://" not in
              text.replace("http://www.w3.org", ""),
              f"the HTML report is one self-contained page ({len(text)} bytes)")
    with open(snap, "rb") as f:
        data = pickle.load(f)
    active = [b for seg in data["segments"] for b in seg["blocks"]
              if b["state"] == "active_allocated"]
    requested = sum(b["requested_size"] for b in active)
    rep.check(requested == live,
              f"the snapshot's active blocks ({len(active)}, {requested} bytes) are the live "
              f"arrays ({len(keep)}, {live} bytes)")
    traces = data.get("device_traces", [[]])
    allocs = sum(1 for e in traces[0] if e.get("action") == "alloc")
    rep.check(allocs >= 20 + 2, f"the trace holds the allocations made while recording ({allocs})")
    for cmd in (["stats", snap], ["trace_plot", snap, "-o", os.path.join(out, "trace.html")],
                ["segment_plot", snap, "-o", os.path.join(out, "segments.html")]):
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz"] + cmd,
                           capture_output=True, text=True, timeout=120)
        rep.check(r.returncode == 0,
                  f"PyTorch's memory_viz {cmd[0]} reads our snapshot "
                  f"(rc {r.returncode}; {(r.stdout + r.stderr).strip()[-300:]})")
        if cmd[0] == "stats" and r.returncode == 0:
            rep.info("memory_viz stats: " + " | ".join(r.stdout.strip().splitlines()[:6]))
    # With native call stacks: each allocation made while recording carries its callers'
    # frames; the blocks live before it started (its baseline) carry none (their allocating
    # stack is not known).
    before = {a.data.ptr for a in keep}
    pool.record_history(backtraces=True)
    with s1:
        fresh = cp.full(1000, 7.0, dtype=cp.float32)
    keep.append(fresh)
    cp.cuda.Device(0).synchronize()
    snap2 = os.path.join(out, "snapshot_stacks.pickle")
    pool.dump_snapshot(snap2)
    pool.record_history(False)
    with open(snap2, "rb") as f:
        data = pickle.load(f)
    allocs = [e for e in data.get("device_traces", [[]])[0] if e.get("action") == "alloc"]
    made = [e for e in allocs if e["addr"] not in before]
    baseline = [e for e in allocs if e["addr"] in before]
    deep = [e for e in made if len(e.get("frames", [])) > 1]
    names = [fr["name"] for fr in (deep[0]["frames"] if deep else [])][:4]
    rep.info(f"backtraces: {len(deep)} of the {len(made)} allocations made while recording "
             f"with call stacks ({len(baseline)} baseline blocks); innermost callers: {names}")
    rep.check(made and len(deep) == len(made) and fresh.data.ptr in {e["addr"] for e in deep}
              and all(len(e.get("frames", [])) == 0 for e in baseline),
              "with backtraces, every allocation made while recording carries its native call "
              "stack, and the blocks from before it none")
    del keep


def first_touch_once(args, rep):
    """One fresh process of plain_first_touch: 8 threads released together make the
    process's first allocations (the plain route's setup runs inside the first of them)."""
    import cupy as cp

    install_plain(cp, args.lib)
    cp.cuda.Device(0).use()
    n_threads = 8
    gate = threading.Barrier(n_threads)
    results = [None] * n_threads

    def work(t):
        try:
            stream = cp.cuda.Stream.ptds if t % 2 else cp.cuda.Stream(non_blocking=True)
            with stream:
                gate.wait()
                arrs = [cp.empty((1 + t) * MIB // 4, dtype=cp.float32) for _ in range(4)]
                ptrs = [a.data.ptr for a in arrs]
                for i, a in enumerate(arrs):
                    a.fill(float(t * 10 + i))
                stream.synchronize()
                wrong = sum(int((a != float(t * 10 + i)).sum()) for i, a in enumerate(arrs))
                results[t] = (ptrs, wrong, None)
        except Exception as e:  # noqa: BLE001 - reported below
            results[t] = ([], 0, f"{type(e).__name__}: {e}")

    ts = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    cp.cuda.Device(0).synchronize()
    raised = [f"thread {t}: {r[2]}" for t, r in enumerate(results) if r[2]]
    zero = [t for t, r in enumerate(results) if any(p == 0 for p in r[0])]
    wrong = sum(r[1] for r in results)
    rep.info(f"{n_threads} threads' first allocations: {sum(len(r[0]) for r in results)} served, "
             f"{len(raised)} raised")
    rep.check(not zero, "no allocation at address 0" + (f" (threads {zero})" if zero else ""))
    rep.check(wrong == 0, f"every element right ({wrong} wrong)")
    rep.check(not raised, "no thread raised" + ("" if not raised else ": " + "; ".join(raised[:3])))


def first_touch(args, rep):
    """plain_first_touch: first_touch_once in 10 fresh processes."""
    import subprocess

    runs, bad = 10, []
    for r in range(runs):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "plain_first_touch_once",
               "--lib", args.lib]
        out = subprocess.run(cmd, env=common.child_env(args.lib), capture_output=True,
                             text=True, timeout=300)
        if out.returncode != 0:
            bad.append(f"process {r}: exit {out.returncode}: {(out.stdout + out.stderr)[-800:]}")
    rep.check(not bad, f"{runs} fresh processes, 8 threads making each one's first allocations "
                       f"at once: all served right" + ("" if not bad else ": " + " | ".join(bad[:2])))


def ptds_scenario(args, rep, whole_program):
    """Item 3: CuPy's per-thread default stream, 8 threads, frees from a collector thread."""
    import queue
    import random

    if whole_program:
        os.environ["CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"] = "1"
    cp, cmp, pool, kern, khz = setup(args)
    ptds = cp.cuda.Stream.ptds
    if whole_program:
        rep.check(cp.cuda.get_current_stream().ptr == ptds.ptr,
                  f"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: the default stream is the per-thread "
                  f"one (handle {cp.cuda.get_current_stream().ptr:#x})")
    n_threads = 8
    short = int(0.002 * khz * 1000)  # ~2 ms
    stop_at = time.time() + args.seconds
    # Bounded: a collector starved of the GIL must not let thousands of arrays pile up (an
    # unbounded queue held 17,000 live blocks, 149 GB, on the H200: out of memory by design).
    graveyard = queue.Queue(maxsize=256)
    errors, crashes, iters, collected = [], [], [0] * n_threads, [0]

    def collector():
        while True:
            item = graveyard.get()
            if item is None:
                return
            time.sleep(random.random() * 0.001)
            del item  # the last reference: freed on this thread
            collected[0] += 1

    def work(t):
        rng = random.Random(2000 + t)
        kept = []
        while time.time() < stop_at:
            x = cp.empty(rng.randint(1, 16) * MIB // 4, dtype=cp.float32)
            launch(cp, kern, x, -1.0 - t, short)
            graveyard.put(x)  # freed by the collector while the kernel may still write it
            del x
            val = float(t * 1_000_000 + iters[t] % 1_000_000)
            y = cp.empty(rng.randint(1, 16) * MIB // 4, dtype=cp.float32)
            launch(cp, kern, y, val, 0)
            kept.append((y, val))
            if len(kept) > 4:
                graveyard.put(kept.pop(0)[0])
            iters[t] += 1
            if iters[t] % 8 == 0:
                cp.cuda.get_current_stream().synchronize()
                for arr, v in kept:
                    bad = int((arr != v).sum())
                    if bad:
                        errors.append(f"thread {t} iter {iters[t]}: {bad} elements of a live "
                                      f"buffer overwritten")
        cp.cuda.get_current_stream().synchronize()
        for arr, v in kept:
            bad = int((arr != v).sum())
            if bad:
                errors.append(f"thread {t} final: {bad} elements overwritten")

    def worker(t):
        try:
            if whole_program:
                if cp.cuda.get_current_stream().ptr != ptds.ptr:
                    raise RuntimeError("the thread's default stream is not the per-thread one")
                work(t)
            else:
                with ptds:
                    work(t)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            crashes.append(f"thread {t}: {type(e).__name__}: {e}")

    col = threading.Thread(target=collector)
    col.start()
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    graveyard.put(None)
    col.join()
    cp.cuda.Device(0).synchronize()
    rep.info(f"per-thread default stream{' (whole program)' if whole_program else ''}: "
             f"{n_threads} threads, {args.seconds:.0f} s, {sum(iters)} iterations "
             f"({', '.join(map(str, iters))}); {collected[0]} blocks freed by the collector; "
             f"pool reserved {pool.total_bytes() / MIB:.1f} MiB")
    rep.check(not crashes, "no thread raised (allocations on the per-thread stream served)" +
              ("" if not crashes else ": " + "; ".join(crashes[:5])))
    rep.check(not errors, "no live buffer corrupted" +
              ("" if not errors else ": " + "; ".join(errors[:5])))
    rep.check(min(iters) > 0 and collected[0] > 0,
              "every thread made progress and the collector freed blocks")
    rep.check(pool.used_bytes() == 0,
              f"every block came back ({pool.used_bytes()} bytes still used)")


SCENARIOS = ["cross_nonblocking", "cross_blocking", "cross_default", "destroyed_stream",
             "threads", "churn", "oom", "oom_limit", "graph", "stream_hold", "steal_calls",
             "ptds_threads", "ptds_program", "history", "block_size", "fault"]
# The plain route (--mode plain): the same scenarios through CuPy's four documented lines.
PLAIN = ["cross_nonblocking", "cross_blocking", "threads", "oom", "oom_limit", "steal_calls",
         "ptds_threads", "first_touch", "fault"]


def fault(args, rep):
    """A kernel faults (an illegal address, launched through libcuda on CuPy's current
    stream); CuPy's own synchronize reports it first, so the pool learns of it only through
    its own check (health::watch). Allocations must then stop within a bounded time and
    raise CuPy's CUDADriverError (the module's ContextLostError) with the fault's status and
    text."""
    cp, cmp, pool, kern, khz = setup(args)
    warm = [cp.empty(MIB, dtype=cp.uint8) for _ in range(16)]  # cached blocks of that size
    del warm
    cp.cuda.Device(0).synchronize()
    common.launch_illegal_address(cp.cuda.get_current_stream().ptr)
    t_fault = time.perf_counter()
    try:
        cp.cuda.Device(0).synchronize()
        rep.check(False, "Device.synchronize() after the fault raised")
    except Exception as e:  # noqa: BLE001
        rep.info(f"CuPy's own report: {type(e).__name__}: {str(e)[:200]}")
        rep.check("ILLEGAL_ADDRESS" in str(e) or "illegal memory access" in str(e),
                  f"CuPy reports the illegal address itself ({type(e).__name__})")
    err, served, dt = common.refused_after_fault(lambda: cp.empty(MIB, dtype=cp.uint8))
    since = time.perf_counter() - t_fault
    rep.info(f"pool: {served} allocations served after CuPy's report, refused {dt * 1e3:.2f} ms "
             f"after it ({since * 1e3:.2f} ms after the launch)")
    rep.check(err is not None, "an allocation through the pool raised within 1 s")
    if err is None:
        return
    msg = str(err)
    rep.info(f"raised: {type(err).__module__}.{type(err).__name__}: {msg[:400]}")
    rep.check(isinstance(err, cp.cuda.driver.CUDADriverError),
              f"it is CuPy's CUDADriverError ({type(err).__name__})")
    rep.check(getattr(err, "status", None) == 700 and getattr(err, "device", None) == 0,
              f"status 700 (CUDA_ERROR_ILLEGAL_ADDRESS) on device 0 (status "
              f"{getattr(err, 'status', None)}, device {getattr(err, 'device', None)})")
    rep.check(msg.startswith("CUDA error: an illegal memory access was encountered")
              and "CUDA_ERROR_ILLEGAL_ADDRESS" in msg,
              "its message starts with the fault's text and names the driver's error")
    rep.check(dt < 0.05, f"refused within 50 ms of CuPy's report ({dt * 1e3:.2f} ms)")
    again = [common.refused_after_fault(lambda: cp.empty(4 * MIB, dtype=cp.float32), 0.2)
             for _ in range(3)]
    rep.check(all(e is not None and n == 0 for e, n, _ in again),
              "later allocations (a new size too) are refused at once")


def block_size(args, rep):
    """``mem.size`` is the block's real, 512-rounded size on every route of the module (CuPy's
    pool reports it so, and CuPy's code and tests rely on it: test_percentile_memory_access),
    and percentile over a block whose tail holds NaN reads only its own elements."""
    import numpy as np

    cp, cmp, pool, kern, khz = setup(args)
    so = cmp.library()
    routes = {pool.path: pool.malloc, "python": cmp._make_python_malloc(so)}
    for route, malloc in routes.items():
        for size in (1, 100, 511, 512, 513, 4000, MIB + 1, 3 * MIB + 7):
            m = malloc(size)
            got = m.mem.size
            rep.check(got % 512 == 0 and size <= got < size + 512 and m.ptr != 0,
                      f"{route} route: {size} bytes give mem.size {got}")
            del m
    original = cp.cuda.get_allocator()

    def nan_tail(size):
        memptr = original(size)
        n = memptr.mem.size // 4
        cp.ndarray((n,), dtype=cp.float32, memptr=memptr).fill(cp.nan)
        return memptr

    a = np.random.default_rng(0).random(1001, dtype=np.float32)
    want = np.percentile(a, [0, 25, 50, 75, 100])
    cp.cuda.set_allocator(nan_tail)
    try:
        got = cp.percentile(cp.asarray(a), cp.asarray([0.0, 25.0, 50.0, 75.0, 100.0])).get()
    finally:
        cp.cuda.set_allocator(original)
    rep.check(np.allclose(got, want), f"percentile with NaN past every block's end: {got} vs {want}")


def child(args):
    rep = common.Report()
    name = args.child
    if name.startswith("plain_"):
        args.mode = "plain"
        name = name[len("plain_"):]
    if args.sanitize:
        args.seconds = min(args.seconds, 5)
        args.streams = min(args.streams, 200)
    try:
        if name.startswith("cross_"):
            cross_stream(args, rep, name[len("cross_"):])
        elif name == "destroyed_stream":
            cross_stream(args, rep, "destroyed")
        elif name == "threads":
            threads_scenario(args, rep)
        elif name == "churn":
            churn(args, rep)
        elif name == "oom":
            oom(args, rep, False)
        elif name == "oom_limit":
            oom(args, rep, True)
        elif name == "graph":
            graph(args, rep)
        elif name == "stream_hold":
            stream_hold(args, rep)
        elif name == "steal_calls":
            steal_calls(args, rep)
        elif name == "ptds_threads":
            ptds_scenario(args, rep, False)
        elif name == "ptds_program":
            ptds_scenario(args, rep, True)
        elif name == "history":
            history_scenario(args, rep)
        elif name == "block_size":
            block_size(args, rep)
        elif name == "fault":
            fault(args, rep)
        elif name == "first_touch" and args.mode == "plain":
            first_touch(args, rep)
        elif name == "first_touch_once" and args.mode == "plain":
            first_touch_once(args, rep)
        else:
            rep.check(False, f"unknown scenario {name}")
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        rep.check(False, f"{name} raised {type(e).__name__}: {e}")
    return common.finish(rep)


def main():
    args = common.parser(__doc__).parse_args()
    if args.child:
        return child(args)
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found\n0 passed, 1 failed")
        return 1
    scenarios = [(s, []) for s in SCENARIOS] + [("plain_" + s, []) for s in PLAIN]
    return common.run_scenarios(os.path.abspath(__file__), args, scenarios)


if __name__ == "__main__":
    sys.exit(main())
