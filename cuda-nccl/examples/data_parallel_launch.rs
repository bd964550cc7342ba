//! The same gradient all_reduce as `all_reduce_gradients`, one process per GPU, as a
//! multi-node job runs. Started without `RANK`, the program is the launcher: it re-executes
//! itself once per GPU with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` set (and `NCCL_NVLS_ENABLE=0`). With `RANK` set (by the launcher, torchrun,
//! Slurm's `srun` with `MASTER_ADDR`/`MASTER_PORT`, or `mpirun`), it is one rank.
//!
//! `cargo run --release -p cudars-nccl --example data_parallel_launch [-- RANKS]`

use std::time::Duration;

use cudars_core::memory::DevicePtr;
use cudars_core::Stream;
use cudars_nccl::{CommConfig, Communicator, Launcher, ReduceOp};

fn main() {
    let result = if std::env::var_os("RANK").is_some()
        || std::env::var_os("SLURM_PROCID").is_some()
        || std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
    {
        rank()
    } else {
        launch()
    };
    if let Err(e) = result {
        eprintln!("data_parallel_launch: {e}");
        std::process::exit(1);
    }
}

fn launch() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => cudars_core::device_count()?,
    };
    println!("launching {ranks} rank(s)");
    let statuses = Launcher::new(ranks)
        .args(Vec::<String>::new())
        .spawn()?
        .wait(Duration::from_secs(300))?;
    let failed = statuses.iter().filter(|s| !s.success()).count();
    if failed > 0 {
        return Err(format!("{failed} rank(s) failed: {statuses:?}").into());
    }
    println!("all {ranks} rank(s) agree");
    Ok(())
}

fn rank() -> Result<(), Box<dyn std::error::Error>> {
    // Non-blocking: a rank that never joins is an error after the timeout, not a hang.
    let config = CommConfig::default()
        .nonblocking(true)
        .timeout(Duration::from_secs(120));
    let (comm, job) = Communicator::from_env(&config)?;
    let dev = comm.device();
    let stream = Stream::new(&dev)?;
    let params = 1 << 22;
    let grads = DevicePtr::alloc(&dev, params * 4)?;
    grads.memset_u32(((job.rank + 1) as f32).to_bits())?;
    comm.all_reduce_in_place::<f32>(&grads, params, ReduceOp::Avg, &stream)?;
    comm.wait(&stream, Duration::from_secs(60))?;
    let n = job.world_size;
    let want = (1..=n).sum::<usize>() as f32 / n as f32;
    let mut head = [0f32; 4];
    grads.slice(..16)?.copy_to_host(&mut head)?;
    if head.iter().any(|&v| (v - want).abs() > 1e-5) {
        return Err(format!("rank {}: got {head:?}, want {want}", job.rank).into());
    }
    println!(
        "rank {} of {} (GPU {}): mean gradient {want}",
        job.rank,
        n,
        dev.ordinal()
    );
    Ok(())
}
