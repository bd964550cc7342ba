#!/usr/bin/env python3
"""Record the allocation trace of the PyTorch or the CuPy workload (torch_workload.py,
cupy_workload.py) in the replay format of cudars_mempool::replay, so that the pool's policies
can be studied on the simulated backend without a GPU:

    a ID SIZE STREAM    allocate SIZE bytes as ID on stream STREAM
    f ID                free ID

PyTorch: its own allocator's memory history (alloc / free_requested events, sizes as the
caching allocator rounded them). CuPy: a memory hook on CuPy's own pool (malloc / free, the
pool's rounded sizes). Each workload runs on its library's own allocator; the per-process
allocator micro-benchmark that follows each workload is left out.

Usage: python3 record_trace.py torch|cupy [--steps N] --out FILE
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def write(out, name, ops, note):
    live, requested, peak, streams = {}, 0, 0, set()
    for op in ops:
        if op[0] == "a":
            live[op[1]] = op[2]
            requested += op[2]
            peak = max(peak, requested)
            streams.add(op[3])
        else:
            requested -= live.pop(op[1])
    with open(out, "w") as f:
        f.write(f"# trace {name}: {note}; ops {len(ops)}; streams {len(streams)}; "
                f"peak_requested {peak}\n")
        f.write("# format: 'a ID SIZE STREAM' allocates SIZE bytes as ID on stream STREAM; "
                "'f ID' frees ID\n")
        for op in ops:
            f.write(" ".join(str(x) for x in op) + "\n")
    print(f"{out}: {len(ops)} ops, {len(streams)} streams, peak requested {peak} B, "
          f"{len(live)} left live")


def record_torch(steps):
    import torch
    import torch_workload

    torch_workload.alloc_pair_ns = lambda *a, **k: 0.0  # no micro-benchmark in the trace
    torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
    torch_workload.child("torch", "", steps)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    ops, ids, streams, next_id = [], {}, {}, 0
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            ids[e["addr"]] = next_id
            s = streams.setdefault(e["stream"], len(streams))
            ops.append(("a", next_id, e["size"], s))
            next_id += 1
        elif e["action"] == "free_requested" and e["addr"] in ids:
            ops.append(("f", ids.pop(e["addr"])))
    return ops, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def record_cupy(steps):
    import cupy as cp
    import cupy_workload

    ops, ids, next_id = [], {}, [0]

    class Hook(cp.cuda.MemoryHook):
        name = "record_trace"

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            ids[mem_ptr] = next_id[0]
            ops.append(("a", next_id[0], mem_size, 0))
            next_id[0] += 1

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            if mem_ptr in ids:
                ops.append(("f", ids.pop(mem_ptr)))

    with Hook():
        cupy_workload.child("cupy", "", steps)
    # Leave out the micro-benchmark after the workload: trailing 1 MiB allocate-free pairs.
    while (len(ops) >= 2 and ops[-1][0] == "f" and ops[-2][0] == "a"
           and ops[-2][2] == 1 << 20 and ops[-1][1] == ops[-2][1]):
        del ops[-2:]
    return ops, f"cupy {cp.__version__} on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=["torch", "cupy"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    record = record_torch if args.workload == "torch" else record_cupy
    ops, note = record(args.steps)
    write(args.out, f"{args.workload}_workload", ops, f"{note}, {args.steps} steps")


if __name__ == "__main__":
    main()
