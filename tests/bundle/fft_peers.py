"""fft_peers.py: torch.fft.fft and cupy.fft.fft on the bench_fft rows (C2C f32, forward):
one transform of 2^24 and a batch of 4096 x 1024; ms, median of 20 (CUDA events)."""
import statistics


def time_ms(fn, record, sync, elapsed):
    for _ in range(3):
        fn()
    sync()
    t = []
    for _ in range(20):
        a, b = record(), record()
        a.record()
        fn()
        b.record()
        b.synchronize()
        t.append(elapsed(a, b))
    return statistics.median(t)


def main():
    rows = [("fft 2^24", 1 << 24, 1), ("fft 4096x1024", 1024, 4096)]
    try:
        import torch
        for name, n, batch in rows:
            x = torch.zeros(batch, n, dtype=torch.complex64, device="cuda")
            out = torch.empty_like(x)
            ms = time_ms(lambda: torch.fft.fft(x, dim=-1, out=out),
                         lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
                         lambda a, b: a.elapsed_time(b))
            print(f"{name}: torch {ms:.4f} ms")
    except Exception as e:  # noqa: BLE001
        print(f"torch: {e}")
    try:
        import cupy
        for name, n, batch in rows:
            x = cupy.zeros((batch, n), dtype=cupy.complex64)
            ms = time_ms(lambda: cupy.fft.fft(x, axis=-1),
                         lambda: cupy.cuda.Event(), cupy.cuda.Device().synchronize,
                         cupy.cuda.get_elapsed_time)
            print(f"{name}: cupy {ms:.4f} ms")
    except Exception as e:  # noqa: BLE001
        print(f"cupy: {e}")


if __name__ == "__main__":
    main()
