//! "Memory Optimization Strategies", in Rust: watch the default pool's byte counts while
//! a loop makes large temporaries, and return cached memory every 10 iterations.
//!
//! Run on a machine with a GPU: `cargo run -p cudars-mempool --example memory_optimization`.

mod common;
use common::println;

use cudars_core::{Device, Stream};
use cudars_mempool::default_pool;

fn print_memory_info() -> Result<(), cudars_mempool::PoolError> {
    let pool = default_pool()?;
    println!("Used: {:.2} GB", pool.used_bytes() as f64 / 1e9);
    println!("Free: {:.2} GB", pool.free_bytes() as f64 / 1e9);
    Ok(())
}

/// Runs [`run`]; an error ends the program with its message and status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("memory_optimization: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new(0)?;
    let stream = Stream::new(&device)?;
    let pool = default_pool()?;
    print_memory_info()?;

    let n = 5000 * 5000 * 8; // a 5000 x 5000 f64 temporary
    for i in 0..100 {
        let temp = pool.malloc_stream(&stream, n)?;
        let result = pool.malloc_stream(&stream, n)?;
        // ... kernels on `stream` would fill `temp` and compute `result` here ...
        drop((temp, result)); // back into the pool's cache of `stream`, reused next time
        if i % 10 == 0 {
            pool.free_all_free()?; // return cached memory no live block touches
            print_memory_info()?;
        }
    }
    stream.synchronize()?;
    Ok(())
}
