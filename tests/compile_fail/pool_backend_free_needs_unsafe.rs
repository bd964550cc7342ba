// `MemoryPool::backend()` hands the live pool's backend to anyone; freeing or unmapping an
// address through it would free a live block's memory (the next allocation then gets the
// same address: two owners, then a double free). `Backend::deallocate`, `unmap`, `map` and
// `release_address_range` are `unsafe fn`: a safe program cannot call them (soundness
// round 2, item 1).
use cudars_mempool::{Backend, DeviceAddress, DeviceId, DevicePool};

fn main() {
    let pool = DevicePool::new_driver().unwrap();
    let dev = DeviceId(0);
    let _ = pool.backend().deallocate(dev, DeviceAddress(0x7f00_0000_0000), 2 << 20);
    let _ = pool.backend().unmap(dev, DeviceAddress(0x7f00_0000_0000), 2 << 20);
    let _ = pool.backend().release_address_range(dev, DeviceAddress(0x7f00_0000_0000), 2 << 20);
}
