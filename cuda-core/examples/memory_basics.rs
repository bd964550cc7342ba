//! Basic device and memory management: the Rust version of the seed's CuPy example
//! (`is_available`, `get_device_id`, `with Device(1):`, allocating an array, looking at
//! memory usage and releasing cached memory).
//!
//! `cuda-core` alone has no caching pool (that is `cuda-mempool`'s `MemoryPool`), so the
//! pool part uses the driver's own stream-ordered pool of the device, which `cuda-core`
//! wraps.
//!
//! Run with `cargo run --release -p cudars-core --example memory_basics`; exits 0 on a machine
//! with a GPU, prints the error and exits 1 otherwise.

mod common;
use common::println;

use std::process::ExitCode;
use std::sync::Arc;

use cudars_core::async_pool::{MemPool, StreamOrderedMemory};
use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Stream};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mib(bytes: impl Into<u64>) -> f64 {
    bytes.into() as f64 / (1u64 << 20) as f64
}

fn run() -> cudars_core::Result<()> {
    // Device management.
    println!("CUDA available: {}", cudars_core::is_available());
    println!("Current device: {}", Device::current()?.ordinal());

    // Switch devices: device 1 when there is one (as the CuPy example does), else device 0.
    let count = cudars_core::device_count()?;
    let target = Device::new(if count > 1 { 1 } else { 0 })?;
    {
        let _scope = target.scope()?; // `with cp.cuda.Device(1):`
        let (free_before, total) = target.memory_info()?;

        // `arr = cp.zeros((1000, 1000))`: a million f64 zeros.
        let arr = DevicePtr::alloc(&target, 1000 * 1000 * std::mem::size_of::<f64>())?;
        arr.memset(0)?;
        println!("Array on device: {}", arr.device().ordinal());

        // Round trip through pinned host memory.
        let mut host = PinnedMemory::new(&target, arr.len(), PinnedFlags::PORTABLE)?;
        host.as_mut_slice_of::<f64>()?.fill(1.5);
        arr.copy_from_host(&host[..])?;
        host.fill(0);
        arr.copy_to_host(&mut host[..])?;
        let sum: f64 = host.as_slice_of::<f64>()?.iter().sum();
        println!("Sum after a round trip: {sum}");

        let (free_now, _) = target.memory_info()?;
        println!(
            "Device memory: {:.1} MiB of {:.1} MiB free ({:.1} MiB fewer with the array)",
            mib(free_now as u64),
            mib(total as u64),
            mib(free_before.saturating_sub(free_now) as u64)
        );
    } // the array is freed, and the previous device is current again
    println!(
        "Current device after the scope: {}",
        Device::current()?.ordinal()
    );

    // Memory pool management, with the device's stream-ordered pool.
    let pool = MemPool::default_for(&target)?;
    pool.set_release_threshold(u64::MAX)?; // keep freed memory cached
    let stream = Arc::new(Stream::new(&target)?);
    let block = DevicePtr::new(StreamOrderedMemory::from_pool(&pool, 8 << 20, &stream)?);
    block.memset_async(0, &stream)?;
    stream.synchronize()?;
    println!("Memory usage: {} bytes", pool.used_current()?);
    drop(block); // freed on the stream, stays cached in the pool
    stream.synchronize()?;
    println!(
        "After the free: used {} bytes, cached {} bytes",
        pool.used_current()?,
        pool.reserved_current()?
    );

    // Free unused memory (CuPy's `pool.free_all_free()`).
    pool.trim_to(0)?;
    println!("After trimming: cached {} bytes", pool.reserved_current()?);
    pool.set_release_threshold(0)?; // the driver's default again
    Ok(())
}
