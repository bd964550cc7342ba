"""sparse_peers.py: torch and cupyx.scipy.sparse on the bench_sparse row: y = A x with A a
10^6 x 10^6 CSR matrix of 100 nonzeros per row (10^8 nonzeros, int32 indices, float32 values,
one column drawn at random in each of 100 equal bands, as bench_sparse builds it; here built
on the GPU); ms per product, the median of 50 (CUDA events) after 5 warm-up calls."""
import statistics

ROWS = 1_000_000
PER_ROW = 100
BAND = ROWS // PER_ROW
NAME = "spmv csr 1e8 nnz f32"


def time_ms(fn, record, sync, elapsed):
    for _ in range(5):
        fn()
    sync()
    t = []
    for _ in range(50):
        a, b = record(), record()
        a.record()
        fn()
        b.record()
        b.synchronize()
        t.append(elapsed(a, b))
    return statistics.median(t)


def main():
    nnz = ROWS * PER_ROW
    try:
        import torch
        dev = "cuda"
        bands = torch.arange(PER_ROW, dtype=torch.int32, device=dev) * BAND
        cols = (bands.repeat(ROWS)
                + torch.randint(0, BAND, (nnz,), dtype=torch.int32, device=dev))
        crow = torch.arange(0, nnz + 1, PER_ROW, dtype=torch.int32, device=dev)
        vals = torch.ones(nnz, dtype=torch.float32, device=dev)
        a = torch.sparse_csr_tensor(crow, cols, vals, size=(ROWS, ROWS))
        x = torch.ones(ROWS, dtype=torch.float32, device=dev)
        assert float(torch.mv(a, x)[0]) == PER_ROW
        ms = time_ms(lambda: torch.mv(a, x),
                     lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
                     lambda s, e: s.elapsed_time(e))
        print(f"{NAME}: torch {ms:.4f} ms")
        del a, cols, crow, vals, x, bands
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        print(f"torch: {e}")
    try:
        import cupy
        import cupyx.scipy.sparse as sp
        bands = cupy.arange(PER_ROW, dtype=cupy.int32) * BAND
        cols = (cupy.tile(bands, ROWS)
                + cupy.random.randint(0, BAND, size=nnz, dtype=cupy.int32))
        crow = cupy.arange(0, nnz + 1, PER_ROW, dtype=cupy.int32)
        vals = cupy.ones(nnz, dtype=cupy.float32)
        a = sp.csr_matrix((vals, cols, crow), shape=(ROWS, ROWS))
        x = cupy.ones(ROWS, dtype=cupy.float32)
        assert float((a @ x)[0]) == PER_ROW
        ms = time_ms(lambda: a @ x,
                     lambda: cupy.cuda.Event(), cupy.cuda.Device().synchronize,
                     cupy.cuda.get_elapsed_time)
        print(f"{NAME}: cupy {ms:.4f} ms")
    except Exception as e:  # noqa: BLE001
        print(f"cupy: {e}")


if __name__ == "__main__":
    main()
