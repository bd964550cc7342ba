//! "Advanced Memory Management", in Rust: a tracking allocator used for a scope, pinned
//! host memory from the pinned pool, and stream-ordered (async) allocation.
//!
//! Run on a machine with a GPU: `cargo run -p cudars-mempool --example advanced_memory`.

mod common;
use common::println;

use std::sync::Arc;

use cudars_core::{Device, Stream};
use cudars_mempool::allocator::{self, FnAllocator};
use cudars_mempool::async_pool::{AsyncPool, AsyncPoolSource};
use cudars_mempool::{default_pinned_pool, default_pool, PoolError};

/// Runs [`run`]; an error ends the program with its message and status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("advanced_memory: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new(0)?;

    // A custom allocator that reports each allocation, then hands it to the default pool.
    let tracking = FnAllocator::new(|stream: &Stream, size: usize| {
        println!("Allocating {size} bytes");
        Ok::<_, PoolError>(default_pool()?.malloc_shared(stream, size)?.into())
    });
    {
        let _scope = allocator::using_allocator(Arc::new(tracking));
        let ones = allocator::alloc(1000 * 1000 * 8)?; // prints the size
        ones.memset(0)?;
    } // the previous allocator is back

    // Pinned host memory for faster transfers (1000 f64s).
    let mut pinned = default_pinned_pool().malloc(&device, 1000 * 8)?;
    pinned.fill(0);
    let gpu = allocator::alloc(1000 * 8)?;
    gpu.copy_from_host(&pinned[..])?;

    // Stream-ordered allocation from the driver's pool.
    let stream = Arc::new(Stream::new(&device)?);
    let async_pool = AsyncPool::new(&device, AsyncPoolSource::Current)?;
    let async_mem = async_pool.malloc_ptr(&stream, 1000 * 4)?;
    async_mem.memset_async(0, &stream)?;
    stream.synchronize()?;
    println!(
        "async pool: {} bytes in use, {} bytes held",
        async_pool.used_bytes()?,
        async_pool.total_bytes()?
    );
    Ok(())
}
