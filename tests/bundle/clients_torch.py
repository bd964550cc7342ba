#!/usr/bin/env python3
"""PyTorch 2.11 on cuda-mempool through CUDAPluggableAllocator (cuda_mempool_torch_alloc /
cuda_mempool_torch_free), on the real GPU. Each scenario is a fresh process: the allocator
can only be swapped before PyTorch's first CUDA allocation.

Scenarios (--only NAME runs a subset):
  cross_stream         a 16 MiB tensor written on stream 1 by work that ends ~0.2 s later
                       (torch.cuda._sleep, then fill_) is freed; stream 2 allocates the same
                       size and fills it: after a sync every element holds stream 2's value.
  cross_record_stream  the tensor is allocated on stream A, written late on stream 1 and
                       marked with tensor.record_stream(stream 1) (hook set through
                       allocator._allocator.set_record_stream_fn); then streams A and 2
                       allocate and fill: no element overwritten.
  steal_calls          PyTorch calls users write after a steal: ~0.2 s of work on stream 1
                       writes a 16 MiB tensor, which is freed; stream 2 (PyTorch's streams are
                       non-blocking) allocates the same size (the pool may hand it stream 1's
                       block, ordered on the device) and runs tensor.copy_(cpu_tensor), or
                       fill_ then .cpu(): the data is right, at once and after a sync.
  oom, oom_limit       a request for twice the card (or over a limit set with
                       cuda_mempool_set_limit) raises RuntimeError / torch.OutOfMemoryError
                       whose message starts "CUDA out of memory"; reserved bytes unchanged;
                       a new runtime-compiled kernel (jiterator) and a first cuBLAS matmul work.
  graph                a training step captured with torch.cuda.graph, replayed 100 times on
                       our pool, against the same steps run eagerly on PyTorch's allocator.
  compile              torch.compile(mode="reduce-overhead") on a small transformer, 30 training
                       steps on our pool against PyTorch's allocator.
  compile_noasserts    the same with torch._inductor.config.triton.slow_path_cudagraph_asserts
                       off (those debug asserts call checkPoolLiveAllocations, which PyTorch
                       does not support for pluggable allocators).
  fault                a kernel writes an illegal address; PyTorch reports it first; then
                       allocations through the pool raise RuntimeError starting "CUDA error: an
                       illegal memory access was encountered" within 50 ms, and keep raising.

Losses: the same kernels run on the same data in the same order on both allocators, so they
are expected to be bitwise equal (deterministic algorithms, fixed cuBLAS workspace config);
the check allows a relative difference of 1e-6 and says whether they were bitwise equal.

Usage: python3 clients_torch.py [--lib PATH] [--sanitize] [--only X]
Prints PASS/FAIL lines and "N passed, N failed"; exit status 1 on any failure.
"""

import ctypes
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clients_common as common  # noqa: E402

MIB = 1 << 20
GRAPH_STEPS = 100
WARMUP = 3
COMPILE_STEPS = 30


def use_pool(lib, record_stream=True):
    """Swaps PyTorch's allocator for ours; returns the ctypes library (same handle PyTorch
    loaded, so the same pool)."""
    import torch

    if common.FROM_WHEEL and record_stream:
        # The wheel's one-call install (record_stream, empty_cache and the capture hooks).
        import cudars
        import cudars.torch

        assert os.path.samefile(lib, cudars.library_path()), lib
        cudars.torch.install()
        so = cudars.library()
        so.cuda_mempool_set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        return so
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        lib, "cuda_mempool_torch_alloc", "cuda_mempool_torch_free")
    so = ctypes.CDLL(lib)
    hooks = alloc._allocator
    if record_stream:
        hooks.set_record_stream_fn(ctypes.cast(so.cuda_mempool_record_stream, ctypes.c_void_p).value)
    # empty_cache() -> our free_all_blocks (int return ignored by a void() caller).
    hooks.set_reset_fn(ctypes.cast(so.cuda_mempool_free_all_blocks, ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(alloc)
    for name in ("used_bytes", "reserved_bytes", "get_limit"):
        getattr(so, "cuda_mempool_" + name).restype = ctypes.c_int64
    so.cuda_mempool_set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    so.cuda_mempool_last_error.restype = ctypes.c_char_p
    return so


def cross(args, rep, record):
    import torch

    use_pool(args.lib)
    dev = torch.device("cuda", 0)
    n = 4 * MIB
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "clock_rate", 0) or 1_980_000
    cycles = int(0.2 * clock_khz * 1000)
    s1 = torch.cuda.Stream()
    s2 = torch.cuda.Stream()
    sa = torch.cuda.Stream()
    torch.cuda._sleep(1000)  # load the sleep kernel before timing anything
    for s in (s1, s2, sa):  # and the fill / compare kernels the rounds use
        with torch.cuda.stream(s):
            w = torch.empty(n, dtype=torch.float32, device=dev)
            w.fill_(2.0)
            int((w != 2.0).sum().item())
            del w
    torch.cuda.synchronize()
    for rnd in range(3):
        if record:
            with torch.cuda.stream(sa):
                a = torch.empty(n, dtype=torch.float32, device=dev)
            s1.wait_stream(sa)
            with torch.cuda.stream(s1):
                torch.cuda._sleep(cycles)
                a.fill_(1.0)
            a.record_stream(s1)
        else:
            with torch.cuda.stream(s1):
                a = torch.empty(n, dtype=torch.float32, device=dev)
                torch.cuda._sleep(cycles)
                a.fill_(1.0)
        done1 = torch.cuda.Event()
        done1.record(s1)
        ptr_a = a.data_ptr()
        del a
        outs = []
        for s in ((sa, s2) if record else (s2,)):
            with torch.cuda.stream(s):
                b = torch.empty(n, dtype=torch.float32, device=dev)
                b.fill_(2.0)
                outs.append((s, b))
        overlap = not done1.query()
        torch.cuda.synchronize()
        rep.check(overlap, f"round {rnd}: stream 1's slow work was still running while the "
                           "other streams allocated and filled")
        for s, b in outs:
            wrong = int((b != 2.0).sum().item())
            rep.check(wrong == 0, f"round {rnd}: {wrong} of {n} elements differ on "
                                  f"{'stream A' if s is sa else 'stream 2'} "
                                  f"(same block: {b.data_ptr() == ptr_a})")
        del outs, b


def steal_calls(args, rep):
    """Item 2 of "Reused pool memory is safe for every use": PyTorch's own copies on a block the
    pool may have handed from stream 1 to stream 2."""
    import torch

    use_pool(args.lib)
    dev = torch.device("cuda", 0)
    n = 4 * MIB
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "clock_rate", 0) or 1_980_000
    cycles = int(0.2 * clock_khz * 1000)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    cpu = torch.full((n,), 2.0, dtype=torch.float32)
    torch.cuda._sleep(1000)
    for s in (s1, s2):  # warm up the kernels and copies the rounds use
        with torch.cuda.stream(s):
            w = torch.empty(n, dtype=torch.float32, device=dev)
            w.copy_(cpu)
            w.fill_(3.0)
            w.cpu()
            del w
    torch.cuda.synchronize()
    for call in ("copy_", "cpu"):
        for rnd in range(3):
            with torch.cuda.stream(s1):
                a = torch.empty(n, dtype=torch.float32, device=dev)
                torch.cuda._sleep(cycles)
                a.fill_(1.0)
            done = torch.cuda.Event()
            done.record(s1)
            ptr_a = a.data_ptr()
            del a
            with torch.cuda.stream(s2):
                b = torch.empty(n, dtype=torch.float32, device=dev)
                overlap = not done.query()
                if call == "copy_":
                    b.copy_(cpu)
                    want = 2.0
                else:
                    b.fill_(3.0)
                    want = 3.0
                now = b.cpu()
            torch.cuda.synchronize()
            later = b.cpu()
            bad_now = int((now != want).sum().item())
            bad_later = int((later != want).sum().item())
            same = b.data_ptr() == ptr_a
            rep.info(f"{call} round {rnd}: stream 1's work still running at the hand-over: "
                     f"{overlap}; same block: {same}")
            rep.check(bad_now == 0 and bad_later == 0,
                      f"{call} round {rnd}: {bad_now} elements wrong when read back on stream "
                      f"2, {bad_later} after a sync (same block: {same})")
            del b
    torch.cuda.synchronize()


def oom(args, rep, with_limit):
    import torch

    so = use_pool(args.lib)
    dev = torch.device("cuda", 0)
    free, total = torch.cuda.mem_get_info(0)
    keep = [torch.ones(64 * MIB, dtype=torch.uint8, device=dev) for _ in range(4)]
    torch.cuda.synchronize()
    so.cuda_mempool_free_all_blocks()
    label = "limit" if with_limit else "card"
    if with_limit:
        limit = so.cuda_mempool_reserved_bytes(0) + 1024 * MIB
        rep.check(so.cuda_mempool_set_limit(0, limit) == 0, f"cuda_mempool_set_limit({limit})")
        rep.check(so.cuda_mempool_get_limit(0) == limit, "cuda_mempool_get_limit returns it")
        request = 2048 * MIB
    else:
        request = 2 * total
    res0, used0 = so.cuda_mempool_reserved_bytes(0), so.cuda_mempool_used_bytes(0)
    try:
        t = torch.empty(request, dtype=torch.uint8, device=dev)
        rep.check(False, f"{label}: a request of {request} bytes raised (got a tensor at "
                         f"{t.data_ptr():#x})")
    except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError too
        msg = str(e)
        rep.info(f"{label}: {type(e).__name__}: {msg.splitlines()[0][:300]}")
        rep.check(msg.startswith("CUDA out of memory"),
                  f"{label}: {type(e).__name__} whose message starts 'CUDA out of memory'")
        rep.check("reserved" in msg and "allocated" in msg,
                  f"{label}: the message carries the pool's numbers (reserved before: {res0})")
    rep.check(so.cuda_mempool_reserved_bytes(0) == res0,
              f"{label}: reserved bytes equal before and after ({res0} -> "
              f"{so.cuda_mempool_reserved_bytes(0)})")
    rep.check(so.cuda_mempool_used_bytes(0) == used0, f"{label}: used bytes unchanged")
    # Work needing driver memory of its own: a runtime-compiled kernel, cuBLAS's first handle.
    import random

    k = random.randrange(1 << 20)
    try:
        fn = torch.cuda.jiterator._create_jit_fn(
            f"template <typename T> T f_{k}(T x) {{ return x * T(2) + T({k}); }}")
        x = torch.arange(1024, dtype=torch.float32, device=dev)
        y = fn(x)
        rep.check(float(y[10]) == 20.0 + k, f"{label}: a newly compiled kernel (jiterator) runs")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: a newly compiled kernel ({type(e).__name__}: {e})")
    try:
        a = torch.ones(2048, 2048, device=dev)
        c = a @ a
        rep.check(float(c[3, 4]) == 2048.0, f"{label}: the process's first cuBLAS matmul")
    except Exception as e:  # noqa: BLE001
        rep.check(False, f"{label}: cuBLAS matmul ({type(e).__name__}: {e})")
    if with_limit:
        try:
            z = torch.empty(512 * MIB, dtype=torch.uint8, device=dev)
            rep.check(True, f"{label}: 512 MiB under the limit succeeds")
            del z
        except Exception as e:  # noqa: BLE001
            rep.check(False, f"{label}: 512 MiB under the limit ({type(e).__name__}: {e})")
        so.cuda_mempool_set_limit(0, 0)
    del keep


def fault(args, rep):
    """A kernel of the program's own faults (an illegal address, launched through libcuda on
    PyTorch's current stream): PyTorch's synchronize reports it first, so the pool learns of
    it only through its own check (health::watch). Allocations through the pool must then
    stop within a bounded time and raise RuntimeError whose message starts with the fault's
    text, and cuda_mempool_last_context_lost must name it."""
    import time

    import torch

    so = use_pool(args.lib)
    so.cuda_mempool_last_context_lost.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2
    so.cuda_mempool_last_context_lost.restype = ctypes.c_int
    so.cuda_mempool_last_error.restype = ctypes.c_char_p
    dev = torch.device("cuda", 0)
    # Cached blocks of the size asked for afterwards: the pool could serve them with no
    # driver call at all.
    warm = [torch.empty(MIB, dtype=torch.uint8, device=dev) for _ in range(16)]
    del warm
    torch.cuda.synchronize()
    common.launch_illegal_address(torch.cuda.current_stream().cuda_stream)
    t_fault = time.perf_counter()
    try:
        torch.cuda.synchronize()
        rep.check(False, "torch.cuda.synchronize() after the fault raised")
    except RuntimeError as e:
        rep.info(f"PyTorch's own report: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        rep.check("illegal memory access" in str(e),
                  f"PyTorch reports the illegal address itself ({type(e).__name__})")
    err, served, dt = common.refused_after_fault(
        lambda: torch.empty(MIB, dtype=torch.uint8, device=dev))
    since = time.perf_counter() - t_fault
    rep.info(f"pool: {served} allocations served after PyTorch's report, refused "
             f"{dt * 1e3:.2f} ms after it ({since * 1e3:.2f} ms after the launch)")
    rep.check(err is not None, "an allocation through the pool raised within 1 s")
    if err is None:
        return
    msg = str(err)
    rep.info(f"raised: {type(err).__name__}: {msg[:400]}")
    rep.check(isinstance(err, RuntimeError), f"it is a RuntimeError ({type(err).__name__})")
    rep.check(msg.startswith("CUDA error: an illegal memory access was encountered"),
              "its message starts with the fault's text, as PyTorch's own CUDA errors do")
    rep.check("CUDA_ERROR_ILLEGAL_ADDRESS" in msg and "device 0" in msg,
              "it names the driver's error and the device")
    d, c = ctypes.c_int(-1), ctypes.c_int(-1)
    got = so.cuda_mempool_last_context_lost(ctypes.byref(d), ctypes.byref(c))
    rep.check(got == 1 and d.value == 0 and c.value == 700,
              f"cuda_mempool_last_context_lost: {got}, device {d.value}, CUresult {c.value} "
              "(expected 1, 0, 700)")
    rep.check(dt < 0.05, f"refused within 50 ms of PyTorch's report ({dt * 1e3:.2f} ms)")
    # Every later allocation is refused too, without hanging.
    again = [common.refused_after_fault(lambda: torch.empty(4 * MIB, device=dev), 0.2)
             for _ in range(3)]
    rep.check(all(e is not None and n == 0 for e, n, _ in again),
              "later allocations (a new size too) are refused at once")


# ---- issue 49's fast path: the capture hooks, and a foreign stream reused after destroy ----

def capture_between(args, rep):
    """A capture begun between two allocations on a stream whose earlier block lingers in the
    pool: the capture's temporaries come from its private pool (PyTorch announced the capture
    through the hooks), so eager memory allocated after the capture is never what a replay
    writes."""
    import torch

    use_pool(args.lib)
    dev = torch.device("cuda", 0)
    n = 1 * MIB
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):  # the stream recurs: its last block's free lingers
            t = torch.empty(n, dtype=torch.float32, device=dev)
            t.fill_(0.0)
            del t
        x = torch.full((n,), 3.0, device=dev)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        tmp = x * 2.0          # a temporary, freed during the capture
        y = tmp + 1.0
        del tmp
    tmp_like = []
    with torch.cuda.stream(s):
        for _ in range(4):      # eager blocks of the temporary's size, after the capture
            z = torch.full((n,), 7.0, device=dev)
            tmp_like.append(z)
        for _ in range(20):
            g.replay()
    torch.cuda.synchronize()
    clobbered = sum(int((z != 7.0).sum().item()) for z in tmp_like)
    rep.check(clobbered == 0, f"eager blocks allocated after the capture keep their values "
                              f"through 20 replays ({clobbered} elements overwritten)")
    rep.check(bool((y == 7.0).all().item()), "the graph computes x * 2 + 1")
    del g, y, tmp_like


def reused_stream(args, rep):
    """A foreign stream (cuStreamCreate, wrapped by torch.cuda.ExternalStream) used in rounds,
    its last block freed while a slow kernel still writes it, then destroyed; a new stream
    (often under the same handle value) allocates at once: it must not get memory the old
    stream's kernel still writes."""
    import torch

    use_pool(args.lib)
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.empty(1, device=dev)  # the primary context is current on this thread
    n = 4 * MIB
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "clock_rate", 0) or 1_980_000
    cycles = int(0.2 * clock_khz * 1000)
    torch.cuda._sleep(1000)
    reused = 0
    for rnd in range(3):
        h = ctypes.c_void_p()
        rep.check(cuda.cuStreamCreate(ctypes.byref(h), 1) == 0, f"round {rnd}: cuStreamCreate")
        old = torch.cuda.ExternalStream(h.value)
        with torch.cuda.stream(old):
            for _ in range(3):  # recurring: the last free lingers without a fence
                w = torch.empty(n, dtype=torch.float32, device=dev)
                w.fill_(0.0)
                del w
            a = torch.empty(n, dtype=torch.float32, device=dev)
            torch.cuda._sleep(cycles)
            a.fill_(1.0)
            ptr_a = a.data_ptr()
            del a
        done = torch.cuda.Event()
        done.record(old)
        del old
        rep.check(cuda.cuStreamDestroy_v2(h) == 0, f"round {rnd}: cuStreamDestroy")
        h2 = ctypes.c_void_p()
        rep.check(cuda.cuStreamCreate(ctypes.byref(h2), 1) == 0, f"round {rnd}: new stream")
        reused += int(h2.value == h.value)
        new = torch.cuda.ExternalStream(h2.value)
        with torch.cuda.stream(new):
            b = torch.empty(n, dtype=torch.float32, device=dev)
            b.fill_(2.0)
        overlap = not done.query()
        torch.cuda.synchronize()
        wrong = int((b != 2.0).sum().item())
        rep.check(overlap, f"round {rnd}: the old stream's kernel still ran at the new allocation")
        rep.check(wrong == 0, f"round {rnd}: {wrong} of {n} elements of the new stream's block "
                              f"overwritten (same block: {b.data_ptr() == ptr_a}, handle "
                              f"reused: {h2.value == h.value})")
        del b, new
        torch.cuda.synchronize()
        cuda.cuStreamDestroy_v2(h2)
    rep.info(f"the driver reused the destroyed stream's handle in {reused} of 3 rounds")


# ---- graph: a training step captured with torch.cuda.graph ----

def graph_losses(mode, lib):
    import torch

    if mode == "pool":
        use_pool(lib)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(7)
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(11)
    data = [(torch.randn(128, 256, generator=gen), torch.randint(0, 10, (128,), generator=gen))
            for _ in range(WARMUP + GRAPH_STEPS)]
    static_x = torch.empty(128, 256, device=dev)
    static_y = torch.empty(128, dtype=torch.long, device=dev)
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    # Warm-up on a side stream, as PyTorch's documentation shows (both modes alike).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(WARMUP):
            static_x.copy_(data[i][0])
            static_y.copy_(data[i][1])
            losses.append(step().item())
    torch.cuda.current_stream().wait_stream(s)
    if mode == "pool":
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = loss_fn(model(static_x), static_y)
            static_loss.backward()
            opt.step()
        for i in range(WARMUP, WARMUP + GRAPH_STEPS):
            static_x.copy_(data[i][0])
            static_y.copy_(data[i][1])
            g.replay()
            losses.append(static_loss.item())
        del g
    else:
        for i in range(WARMUP, WARMUP + GRAPH_STEPS):
            static_x.copy_(data[i][0])
            static_y.copy_(data[i][1])
            losses.append(step().item())
    return losses


# ---- compile: torch.compile(mode="reduce-overhead") on a small transformer ----

def compile_losses(mode, lib, asserts):
    import torch
    import torch.nn.functional as F

    if mode == "pool":
        use_pool(lib)
    if not asserts:
        import torch._inductor.config as inductor_config

        inductor_config.triton.slow_path_cudagraph_asserts = False
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(3)
    dev = torch.device("cuda", 0)
    vocab, d, seq, batch = 512, 128, 64, 16
    layer = torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential()
    model.emb = torch.nn.Embedding(vocab, d)
    model.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    model.out = torch.nn.Linear(d, vocab)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model, mode="reduce-overhead")
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(COMPILE_STEPS):
        x = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
        y = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
        logits = compiled(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def reference_losses(args, kind):
    """PyTorch's own allocator, in a fresh process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "ref_" + kind, "--lib", args.lib]
    out = subprocess.run(cmd, env=common.child_env(args.lib), capture_output=True, text=True,
                         timeout=1200)
    for line in out.stdout.splitlines():
        if line.startswith("LOSSES "):
            return json.loads(line[len("LOSSES "):])
    sys.stdout.write(out.stdout[-4000:] + out.stderr[-4000:])
    return None


def compare(rep, name, ours, ref):
    if not rep.check(ref is not None, f"{name}: the reference run on PyTorch's allocator completed"):
        return
    rep.check(len(ours) == len(ref), f"{name}: {len(ours)} losses against {len(ref)}")
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, ref)), default=0.0)
    bitwise = all(float(a).hex() == float(b).hex() for a, b in zip(ours, ref))
    rep.info(f"{name}: first losses ours {ours[:3]}, PyTorch's {ref[:3]}; last ours "
             f"{ours[-1]!r}, PyTorch's {ref[-1]!r}; bitwise equal: {bitwise}")
    rep.check(worst <= 1e-6, f"{name}: losses equal within 1e-6 relative (worst {worst:.3e}, "
                             f"bitwise equal: {bitwise})")
    rep.check(all(a == a for a in ours), f"{name}: no NaN loss")


SCENARIOS = ["cross_stream", "cross_record_stream", "steal_calls", "oom", "oom_limit", "graph",
             "capture_between", "reused_stream", "compile", "compile_noasserts", "fault"]


def child(args):
    rep = common.Report()
    name = args.child
    try:
        if name == "ref_graph":
            print("LOSSES " + json.dumps(graph_losses("torch", args.lib)))
            return 0
        if name == "ref_compile":
            print("LOSSES " + json.dumps(compile_losses("torch", args.lib, True)))
            return 0
        if name == "cross_stream":
            cross(args, rep, record=False)
        elif name == "cross_record_stream":
            cross(args, rep, record=True)
        elif name == "steal_calls":
            steal_calls(args, rep)
        elif name == "oom":
            oom(args, rep, False)
        elif name == "oom_limit":
            oom(args, rep, True)
        elif name == "capture_between":
            capture_between(args, rep)
        elif name == "reused_stream":
            reused_stream(args, rep)
        elif name == "fault":
            fault(args, rep)
        elif name == "graph":
            ours = graph_losses("pool", args.lib)
            compare(rep, "torch.cuda.graph training step, 100 replays", ours,
                    reference_losses(args, "graph"))
        elif name in ("compile", "compile_noasserts"):
            asserts = name == "compile"
            try:
                ours = compile_losses("pool", args.lib, asserts)
            except RuntimeError as e:
                if "does not yet support" in str(e):
                    rep.check(False, f"{name}: PyTorch refused the pluggable allocator: {e}")
                    return common.finish(rep)
                raise
            compare(rep, f"torch.compile(reduce-overhead) transformer, {COMPILE_STEPS} steps"
                         f"{'' if asserts else ', cudagraph asserts off'}", ours,
                    reference_losses(args, "compile"))
        else:
            rep.check(False, f"unknown scenario {name}")
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        rep.check(False, f"{name} raised {type(e).__name__}: {str(e)[:500]}")
    return common.finish(rep)


def main():
    args = common.parser(__doc__).parse_args()
    if args.child:
        return child(args)
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found\n0 passed, 1 failed")
        return 1
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    names = SCENARIOS
    if args.sanitize:  # Triton/Inductor under memcheck takes far too long
        names = [n for n in SCENARIOS if not n.startswith("compile")]
    return common.run_scenarios(os.path.abspath(__file__), args, [(n, []) for n in names])


if __name__ == "__main__":
    sys.exit(main())
