//! A deviceQuery-style table of every CUDA device.
//!
//! `cargo run --release --example device_info`. With no driver it prints the loader's error,
//! with every path it tried, and exits with status 1.

mod common;
use common::println;

use std::process::ExitCode;

use cudars_core::{Device, Result};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("device_info: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let driver = cudars_core::driver_version()?;
    let devices = Device::all()?;
    println!("CUDA driver version : {driver}");
    println!("bindings CUDA version: {}", cudars_core::bindings_version());
    println!(
        "bindings source     : {}",
        cudars_core::sys::BINDINGS_SOURCE
    );
    println!("devices             : {}", devices.len());
    for dev in devices {
        let (major, minor) = dev.compute_capability()?;
        let (free, total) = dev.memory_info()?;
        println!();
        println!("Device {}: {}", dev.ordinal(), dev.name()?);
        println!("  compute capability : {major}.{minor}");
        println!(
            "  total memory       : {:.1} GiB ({} bytes)",
            gib(dev.total_memory()?),
            dev.total_memory()?
        );
        println!(
            "  free memory now    : {:.1} GiB of {:.1} GiB",
            gib(free),
            gib(total)
        );
        println!("  multiprocessors    : {}", dev.multiprocessor_count()?);
        println!("  PCI bus id         : {}", dev.pci_bus_id()?);
        println!("  UUID               : {}", dev.uuid()?);
        let (least, greatest) = dev.stream_priority_range()?;
        println!("  stream priorities  : {least} (least) to {greatest} (greatest)");
    }
    Ok(())
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
