"""solver_peers.py: torch.linalg and cupy.linalg on the bench_solver rows (f32, 4096 x 4096):
Cholesky and SVD (singular values and vectors); ms of host wall time per call, the median
of 5 (Cholesky) or 3 (SVD) after a warm-up, each call synchronised."""
import statistics
import time

N = 4096


def wall_ms(fn, sync, reps):
    fn()
    sync()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


def main():
    try:
        import torch
        g = torch.Generator(device="cuda").manual_seed(5)
        m = torch.rand(N, N, device="cuda", generator=g) - 0.5
        spd = (m + m.T) / 2 + N * torch.eye(N, device="cuda")
        ms = wall_ms(lambda: torch.linalg.cholesky(spd), torch.cuda.synchronize, 5)
        print(f"cholesky {N} f32: torch {ms:.3f} ms")
        a = torch.rand(N, N, device="cuda", generator=g) - 0.5
        ms = wall_ms(lambda: torch.linalg.svd(a, full_matrices=False), torch.cuda.synchronize, 3)
        print(f"svd {N} f32: torch {ms:.3f} ms (default driver)")
        for driver in ("gesvd", "gesvdj"):
            ms = wall_ms(lambda: torch.linalg.svd(a, full_matrices=False, driver=driver),
                         torch.cuda.synchronize, 3)
            print(f"svd {N} f32: torch {ms:.3f} ms ({driver})")
    except Exception as e:  # noqa: BLE001
        print(f"torch: {e}")
    try:
        import cupy
        rs = cupy.random.RandomState(5)
        m = rs.rand(N, N, dtype=cupy.float32) - 0.5
        spd = (m + m.T) / 2 + N * cupy.eye(N, dtype=cupy.float32)
        sync = cupy.cuda.Device().synchronize
        ms = wall_ms(lambda: cupy.linalg.cholesky(spd), sync, 5)
        print(f"cholesky {N} f32: cupy {ms:.3f} ms")
        a = rs.rand(N, N, dtype=cupy.float32) - 0.5
        ms = wall_ms(lambda: cupy.linalg.svd(a, full_matrices=False), sync, 3)
        print(f"svd {N} f32: cupy {ms:.3f} ms")
    except Exception as e:  # noqa: BLE001
        print(f"cupy: {e}")


if __name__ == "__main__":
    main()
