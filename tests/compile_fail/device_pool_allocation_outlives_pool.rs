// A block from `DevicePool::malloc_stream` (an `Allocation`) borrows the pool: it cannot
// outlive it. (`malloc_shared` gives a `PoolMemory` that holds the pool instead, so a
// `cudars_core::DevicePtr` view made from it needs no second owner kept alive.)
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let block;
    {
        let pool = cudars_mempool::DevicePool::new_driver().unwrap();
        block = pool.malloc_stream(&stream, 4096).unwrap();
    }
    drop(block);
}
