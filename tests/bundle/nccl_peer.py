#!/usr/bin/env python3
"""torch.distributed (NCCL backend) all_reduce of float32, 8 B to 1 GiB, one process per GPU.

The PyTorch column of bench_nccl: same sizes, same timing policy (5 warm-up operations, then
the median of 3 batches of back-to-back in-place all_reduces, host clock around each batch and a
synchronize; `iters_for` as in bench_nccl.rs). Rank 0 writes `bytes,seconds` rows to --out.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0).

With --captured: per collective, 100 in-place all_reduces launched one by one against the same
100 captured with torch.cuda.graph and replayed (8 B to 1 MiB; `bytes,launched,captured` rows),
the PyTorch side of `bench_nccl --captured`.

With --registered: the same sweep on plain tensors, on tensors of a torch.cuda.MemPool
registered with the process group (ProcessGroupNCCL.register_mem_pool, NCCL's ncclCommRegister)
and, where PyTorch offers it, of a pool registered as symmetric windows (symm=True); sizes
interleaved; `bytes,plain,registered,symmetric` rows (nan where PyTorch lacks a kind). The
PyTorch side of `bench_nccl --registered`.

Usage: python3 nccl_peer.py --world N --out FILE [--captured | --registered]
"""
import argparse
import os
import socket
import statistics
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

MAX_BYTES = 1 << 30


def sizes():
    s = 8
    while s <= MAX_BYTES:
        yield s
        s *= 2


def iters_for(nbytes):
    if nbytes <= 1 << 20:
        return 200
    return max(10, min(200, (4 << 30) // nbytes))


def worker(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    buf = torch.zeros(MAX_BYTES // 4, dtype=torch.float32, device=dev)
    small = torch.zeros(1, dtype=torch.float32, device=dev)
    rows = [(nbytes, time_size(buf[: nbytes // 4], small, nbytes)) for nbytes in sizes()]
    if rank == 0:
        with open(out, "w") as f:
            f.write("bytes,seconds\n")
            for nbytes, secs in rows:
                f.write(f"{nbytes},{secs}\n")
    dist.barrier()
    dist.destroy_process_group()


CAPTURED_SIZES = [8, 1 << 10, 8 << 10, 64 << 10, 1 << 20]
OPS = 100
REPLAYS = 5


def captured_worker(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    buf = torch.zeros(max(CAPTURED_SIZES) // 4, dtype=torch.float32, device=dev)
    small = torch.zeros(1, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream()
    rows = []
    for nbytes in CAPTURED_SIZES:
        t = buf[: nbytes // 4]
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()

        def line_up():
            dist.all_reduce(small)
            torch.cuda.synchronize()

        launched = []
        for _ in range(3):
            line_up()
            start = time.perf_counter()
            for _ in range(OPS):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            launched.append((time.perf_counter() - start) / OPS)
        # PyTorch's recipe: warm up on a side stream, then capture.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(OPS):
                dist.all_reduce(t)
        g.replay()
        torch.cuda.synchronize()
        captured = []
        for _ in range(3):
            line_up()
            start = time.perf_counter()
            for _ in range(REPLAYS):
                g.replay()
            torch.cuda.synchronize()
            captured.append((time.perf_counter() - start) / (REPLAYS * OPS))
        del g
        rows.append((nbytes, statistics.median(launched), statistics.median(captured)))
    if rank == 0:
        with open(out, "w") as f:
            f.write("bytes,launched,captured\n")
            for nbytes, lt, ct in rows:
                f.write(f"{nbytes},{lt},{ct}\n")
    dist.barrier()
    dist.destroy_process_group()


def time_size(t, small, nbytes):
    iters = iters_for(nbytes)
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    samples = []
    for _ in range(3):
        dist.all_reduce(small)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def registered_pool(dev, symm):
    """A MemPool of the NCCL backend's allocator, with one 1 GiB tensor, registered with the
    process group (symmetric when `symm`); None (and why, on stderr) where PyTorch lacks it."""
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            buf = torch.zeros(MAX_BYTES // 4, dtype=torch.float32, device=dev)
        if symm:
            backend.register_mem_pool(pool, symm=True)
        else:
            backend.register_mem_pool(pool)
        return pool, backend, buf
    except Exception as e:  # noqa: BLE001 - report whatever PyTorch says
        print(f"nccl_peer: no {'symmetric' if symm else 'registered'} MemPool: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def registered_worker(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    plain = torch.zeros(MAX_BYTES // 4, dtype=torch.float32, device=dev)
    small = torch.zeros(1, dtype=torch.float32, device=dev)
    reg = registered_pool(dev, False)
    sym = registered_pool(dev, True)
    rows = []
    for nbytes in sizes():
        n = nbytes // 4
        p = time_size(plain[:n], small, nbytes)
        r = time_size(reg[2][:n], small, nbytes) if reg else float("nan")
        s = time_size(sym[2][:n], small, nbytes) if sym else float("nan")
        rows.append((nbytes, p, r, s))
    if rank == 0:
        with open(out, "w") as f:
            f.write("bytes,plain,registered,symmetric\n")
            for nbytes, p, r, s in rows:
                f.write(f"{nbytes},{p},{r},{s}\n")
    dist.barrier()
    for entry in (reg, sym):
        if entry:
            pool, backend, buf = entry
            del buf
            try:
                backend.deregister_mem_pool(pool)
            except Exception:  # noqa: BLE001
                pass
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--out", required=True)
    ap.add_argument("--captured", action="store_true")
    ap.add_argument("--registered", action="store_true")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"nccl_peer: torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, "
          f"{args.world} GPUs", flush=True)
    target = (captured_worker if args.captured
              else registered_worker if args.registered else worker)
    mp.spawn(target, args=(args.world, port, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
