// `RawAllocation` is not `Copy` and `MemoryPool::free_raw` consumes it: the same raw
// allocation cannot be freed twice (issue 26, item 5).
use cudars_mempool::{DeviceId, MemoryPool, SimDevice, SimulatedBackend, StreamKey};

fn main() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: 1 << 30,
        granularity: None,
    }]))
    .unwrap();
    let raw = pool
        .malloc(DeviceId(0), &StreamKey(0), 512)
        .unwrap()
        .into_raw();
    pool.free_raw(raw).unwrap();
    pool.free_raw(raw).unwrap();
}
