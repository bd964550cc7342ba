// Pending on issue 26 (lead's change): `RawAllocation` stops being `Copy`, and
// `MemoryPool::free_raw` consumes it, so the same raw allocation cannot be freed twice.
// Moved into `tests/compile_fail/` (with its `.stderr`) once that change lands.
use cuda_mempool::{DeviceId, MemoryPool, SimDevice, SimulatedBackend, StreamId};

fn main() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: 1 << 30,
        granularity: None,
    }]))
    .unwrap();
    let raw = pool
        .malloc(DeviceId(0), StreamId(0), 512)
        .unwrap()
        .into_raw();
    pool.free_raw(raw).unwrap();
    pool.free_raw(raw).unwrap();
}
