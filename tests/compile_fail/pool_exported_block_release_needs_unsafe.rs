// `ExportedBlock::release` gives an IPC-exported block back to the pool at once, on the
// caller's word that the importer (another process) is done with it: it is `unsafe`
// (soundness round 2, item 10). The safe way is `release_after` with the importer's event.
use std::sync::Arc;

use cudars_core::{Device, Stream};
use cudars_mempool::DevicePool;

fn main() {
    let stream = Stream::new(&Device::new(0).unwrap()).unwrap();
    let pool = Arc::new(DevicePool::new_ipc().unwrap());
    let block = pool.malloc_ipc(&stream, 1 << 20).unwrap();
    block.release();
}
