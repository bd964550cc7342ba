// An `Allocation` borrows its `MemoryPool`: it cannot outlive it.
use cudars_mempool::{DeviceId, MemoryPool, SimDevice, SimulatedBackend, StreamKey};

fn main() {
    let allocation;
    {
        let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
            total_memory: 1 << 30,
            granularity: None,
        }]))
        .unwrap();
        allocation = pool.malloc(DeviceId(0), &StreamKey(0), 512).unwrap();
    }
    drop(allocation);
}
