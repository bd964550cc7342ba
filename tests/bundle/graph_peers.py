"""The peer of bench_graph_explicit: the same 100-iteration device loop through NVIDIA's
cuda.core (a while node of its GraphBuilder, the condition set on the device by
cudaGraphSetConditional), the host-driven loop of 100 launches of a one-step graph that reads
the counter back after each step, and a whole-graph update (Graph.update) plus relaunch against
building and completing the graph again. Every figure: launch until the stream is synchronised,
median of many samples after a warm-up. Rows go to stdout and, with BENCH_OUT, to
$BENCH_OUT/peers.csv (scenario, peer, value, unit) under bench_graph_explicit's scenario names.

Usage: python3 graph_peers.py [--samples N]
"""
import csv
import ctypes
import os
import sys
import time

ITERATIONS = 100

SOURCE = r'''
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
extern "C" __global__ void reset(unsigned* counter, unsigned value) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *counter = value;
}
extern "C" __global__ void loop_step(unsigned* counter, unsigned* iterations, cudaGraphConditionalHandle h) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned c = *counter;
        if (c > 0) { *counter = c - 1; *iterations += 1; }
        cudaGraphSetConditional(h, *counter > 0);
    }
}
extern "C" __global__ void plain_step(unsigned* counter, unsigned* iterations) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned c = *counter;
        if (c > 0) { *counter = c - 1; *iterations += 1; }
    }
}
extern "C" __global__ void axpb(float* y, const float* x, float a, float b, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
'''

ROWS = []


def row(scenario, peer, value, unit):
    ROWS.append((scenario, peer, value, unit))
    print(f"{scenario:<66} | {peer:<9} | {value:12.3f} {unit}", flush=True)


def median_us(fn, samples, warmup=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return times[len(times) // 2]


def core():
    try:
        import cuda.core.experimental as cc
    except ImportError:
        import cuda.core as cc
    return cc


def make_condition(gb, default):
    """The builder's condition: create_conditional_handle (cuda.core 0.3-1.0) or
    create_condition (later releases, a GraphCondition that launch() unwraps)."""
    for name in ("create_conditional_handle", "create_condition"):
        f = getattr(gb, name, None)
        if f is None:
            continue
        for kwargs in ({"default_value": default}, {}):
            try:
                return f(**kwargs)
            except TypeError:
                continue
    raise AttributeError("GraphBuilder has neither create_conditional_handle nor create_condition "
                         f"(cuda.core attributes: {[a for a in dir(gb) if not a.startswith('_')]})")


def main():
    samples = 200
    if "--samples" in sys.argv:
        samples = int(sys.argv[sys.argv.index("--samples") + 1])
    cc = core()
    dev = cc.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    prog = cc.Program(SOURCE, code_type="c++", options=cc.ProgramOptions(std="c++17", arch=arch))
    mod = prog.compile("cubin", name_expressions=("reset", "loop_step", "plain_step", "axpb"))
    reset, loop_step, plain_step, axpb = (mod.get_kernel(k) for k in ("reset", "loop_step", "plain_step", "axpb"))
    one = cc.LaunchConfig(grid=1, block=1)
    pinned = cc.LegacyPinnedMemoryResource()
    counter = pinned.allocate(4)
    iters = pinned.allocate(4)
    c_counter = ctypes.c_uint.from_address(int(counter.handle))
    c_iters = ctypes.c_uint.from_address(int(iters.handle))

    # The while node: reset the counter, then loop on the device.
    gb = dev.create_graph_builder().begin_building()
    handle = make_condition(gb, 1)
    cc.launch(gb, one, reset, int(counter.handle), ctypes.c_uint(ITERATIONS))
    body = gb.while_loop(handle)
    body.begin_building()
    cc.launch(body, one, loop_step, int(counter.handle), int(iters.handle), handle)
    body.end_building()
    looped = gb.end_building().complete()
    c_iters.value = 0
    looped.launch(stream)
    stream.sync()
    assert c_iters.value == ITERATIONS, c_iters.value

    def device_loop():
        looped.launch(stream)
        stream.sync()

    row("100-iteration loop: while node vs host read-back loop", "cuda.core",
        median_us(device_loop, samples), "us")

    # The host-driven loop: one launch per step, the counter read after each.
    gb = dev.create_graph_builder().begin_building()
    cc.launch(gb, one, plain_step, int(counter.handle), int(iters.handle))
    step = gb.end_building().complete()

    def host_loop():
        c_counter.value = ITERATIONS
        n = 0
        while True:
            step.launch(stream)
            stream.sync()
            n += 1
            if c_counter.value == 0:
                break
        assert n == ITERATIONS

    row("100-iteration loop: host read-back loop (peer's own)", "cuda.core",
        median_us(host_loop, samples // 4 or 1), "us")

    # Whole-graph update + relaunch against building and completing again.
    n = 1 << 16
    x = dev.allocate(n * 4, stream=stream)
    y = dev.allocate(n * 4, stream=stream)
    cfg = cc.LaunchConfig(grid=(n + 255) // 256, block=256)

    def build(a):
        g = dev.create_graph_builder().begin_building()
        cc.launch(g, cfg, axpb, int(y.handle), int(x.handle), ctypes.c_float(a), ctypes.c_float(0.0),
                  ctypes.c_ulonglong(n))
        return g.end_building()

    graph = build(1.0).complete()
    state = {"a": 1.0}

    def update():
        state["a"] += 1.0
        graph.update(build(state["a"]))
        graph.launch(stream)
        stream.sync()

    def reinstantiate():
        state["a"] += 1.0
        g = build(state["a"]).complete()
        g.launch(stream)
        stream.sync()

    row("kernel argument: whole-graph update + relaunch vs re-instantiation", "cuda.core",
        median_us(update, samples), "us")
    row("kernel argument: re-instantiation + launch (peer's own)", "cuda.core",
        median_us(reinstantiate, samples), "us")

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
    try:
        main()
    except Exception as e:  # a missing or older cuda.core is reported, not fatal
        print(f"cuda.core: not measured ({type(e).__name__}: {e})", flush=True)
        sys.exit(0)
