//! Data-parallel training's core step in one process: every GPU of the machine holds its own
//! gradients; one grouped all_reduce (average) leaves every GPU with the mean.
//!
//! `cargo run --release -p cudars-nccl --example all_reduce_gradients`
//! (runs with `NCCL_NVLS_ENABLE=0`: NVLink multicast stays off.)

use std::time::{Duration, Instant};

use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};
use cudars_nccl::{group, Communicator, ReduceOp};

fn main() {
    if let Err(e) = run() {
        eprintln!("all_reduce_gradients: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let devices = Device::all()?;
    let comms = Communicator::init_all(&devices)?;
    let n = devices.len();
    let params = 25_000_000; // a 100 MB f32 model
    let streams = devices
        .iter()
        .map(Stream::new)
        .collect::<Result<Vec<_>, _>>()?;
    // Replica r computed gradients all equal to r + 1 (stand-in for a backward pass).
    let grads = devices
        .iter()
        .enumerate()
        .map(|(r, d)| {
            let g = DevicePtr::alloc(d, params * 4)?;
            g.memset_u32(((r + 1) as f32).to_bits())?;
            Ok(g)
        })
        .collect::<Result<Vec<_>, cudars_core::Error>>()?;
    let t = Instant::now();
    group::group(|| {
        for ((c, g), s) in comms.iter().zip(&grads).zip(&streams) {
            c.all_reduce_in_place::<f32>(g, params, ReduceOp::Avg, s)?;
        }
        Ok(())
    })?;
    for (c, s) in comms.iter().zip(&streams) {
        c.wait(s, Duration::from_secs(60))?;
    }
    let elapsed = t.elapsed();
    let want = (1..=n).sum::<usize>() as f32 / n as f32;
    for (r, g) in grads.iter().enumerate() {
        let mut head = [0f32; 4];
        g.slice(..16)?.copy_to_host(&mut head)?;
        if head.iter().any(|&v| (v - want).abs() > 1e-5) {
            return Err(format!("GPU {r}: got {head:?}, want {want}").into());
        }
    }
    println!(
        "averaged {params} gradients over {n} GPU(s) in {:.2} ms: every replica holds {want}",
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
