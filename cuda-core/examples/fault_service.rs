//! A service loop that survives a device fault (see `cudars_core::health`).
//!
//! Each request runs a kernel that writes its number into a buffer, then reads it back. One
//! request in the middle is poisoned: its kernel writes to address 0x10, which faults and
//! loses the context. The worker then does what a service should: drain (drop what the
//! failed request held), reset (`Device::reset_after_fault`), reload (module, stream and
//! buffer made again in the new context) and resume.
//!
//! Where the driver keeps the context lost even after the reset (driver 580 after an illegal
//! address does: every call of the process answers the fault's error, a new context
//! included), only a new process gets the device back. So the program is its own supervisor:
//! run without arguments, it starts itself as a worker (`--worker FIRST`) and, when a worker
//! exits with [`RESTART`], starts a new one at the request after the failed one. The poisoned
//! request is answered with its error, never retried (it would fault again); every other
//! request is served, its result checked, whichever way the device came back.
//!
//! Run with `cargo run --release -p cudars-core --example fault_service`; exits 0 when the
//! requests after the fault were served (one line per request, and how the device came back:
//! in-process resets, worker restarts). Without a GPU the first worker fails to start, and
//! the supervisor exits 1 with its error.

mod common;
use common::{print, println};

use std::ffi::c_void;
use std::process::ExitCode;

use cudars_core::{Device, DevicePtr, Error, Module, Stream};

/// One kernel: `*p = v` from one thread.
const PTX: &str = r"
.version 7.0
.target sm_70
.address_size 64
.visible .entry poke(.param .u64 p, .param .u32 v) {
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  ld.param.u32 %r1, [v];
  st.global.u32 [%rd2], %r1;
  ret;
}
";

/// What a request needs, made again after each reset.
struct Service {
    dev: Device,
    module: Module,
    stream: Stream,
    out: DevicePtr,
}

impl Service {
    fn start() -> cudars_core::Result<Service> {
        let dev = Device::new(0)?;
        Ok(Service {
            module: Module::from_ptx(&dev, PTX)?,
            stream: Stream::new(&dev)?,
            out: DevicePtr::alloc(&dev, 4)?,
            dev,
        })
    }

    /// Serves request `n`; a poisoned request writes to address 0x10 instead.
    fn serve(&self, n: u32, poisoned: bool) -> cudars_core::Result<u32> {
        let f = self.module.function("poke")?;
        let issue = self.stream.issue(self.dev)?;
        self.out.record_stream(&issue)?;
        let mut ptr: u64 = if poisoned { 0x10 } else { self.out.as_raw() };
        let mut v = n;
        let mut params = [
            std::ptr::from_mut(&mut ptr).cast::<c_void>(),
            std::ptr::from_mut(&mut v).cast::<c_void>(),
        ];
        // SAFETY: two parameters of the kernel's types; `out` holds 4 bytes of the stream's
        // device. The poisoned request breaks the contract on purpose: it writes to an
        // address no allocation holds, which faults the context and touches nothing of the
        // host (the point of this example).
        unsafe { f.launch(&issue, (1, 1, 1), (1, 1, 1), 0, &mut params) }?;
        self.stream.synchronize()?;
        let mut back = [0u32];
        self.out.copy_to_host(&mut back)?;
        Ok(back[0])
    }
}

/// The worker's exit status when its device stays lost after a reset: start a new process.
const RESTART: u8 = 3;
/// Requests served per run, and the poisoned one.
const REQUESTS: u32 = 6;
const POISONED: u32 = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, first] = args.as_slice() {
        if flag == "--worker" {
            let first = first.parse().unwrap_or(1);
            return match worker(first) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.is_context_lost() => {
                    println!("  worker: the device stays lost after the reset ({e}); exiting for a restart");
                    ExitCode::from(RESTART)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    supervise()
}

/// Starts workers until every request is answered: a worker that exits with [`RESTART`] is
/// replaced by one that starts at the request after the last one answered.
fn supervise() -> ExitCode {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("error: cannot find this program's own path to start a worker");
        return ExitCode::FAILURE;
    };
    let mut first = 1;
    for restart in 0..3 {
        let out = match run_worker(&exe, first) {
            Ok(out) => out,
            Err(e) => {
                eprintln!("error: the worker: {e}");
                return ExitCode::FAILURE;
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        // The last request this worker answered, served or failed.
        let answered = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("request ")?
                    .split(':')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max();
        match out.status.code() {
            Some(0) => {
                println!("all {REQUESTS} requests answered; {restart} worker restart(s)");
                return ExitCode::SUCCESS;
            }
            Some(c) if c == i32::from(RESTART) => {
                first = answered.map_or(first, |n| n + 1);
                println!(
                    "supervisor: worker lost its device; starting a new one at request {first}"
                );
            }
            _ => {
                eprintln!("error: the worker failed ({})", out.status);
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("error: three restarts and the requests are still not answered");
    ExitCode::FAILURE
}

/// How long a worker may take before the supervisor kills it (a hung worker must not hang
/// the service).
const WORKER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs one worker from request `first`, killed past [`WORKER_DEADLINE`].
fn run_worker(exe: &std::path::Path, first: u32) -> std::io::Result<std::process::Output> {
    let mut child = std::process::Command::new(exe)
        .args(["--worker", &first.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?;
    let started = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > WORKER_DEADLINE {
            child.kill()?;
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("still running after {WORKER_DEADLINE:?}: killed"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output()
}

/// Serves requests `first..=REQUESTS`; on a lost context, resets and resumes, or returns the
/// reset's `ContextLost` when the driver keeps the device lost.
fn worker(first: u32) -> cudars_core::Result<()> {
    let mut service = Service::start()?;
    let mut resets = 0;
    for n in first..=REQUESTS {
        match service.serve(n, n == POISONED) {
            Ok(v) if v == n => println!("request {n}: served ({v})"),
            Ok(v) => return Err(Error::InvalidArgument(format!("request {n} read back {v}"))),
            Err(e) if e.is_context_lost() => {
                println!("request {n}: failed: {e}");
                // Drain: what the service held belongs to the lost context (dropping it
                // frees nothing); reset; reload; resume.
                let dev = service.dev;
                drop(service);
                dev.reset_after_fault()?;
                resets += 1;
                service = Service::start()?;
                println!(
                    "  reset: device {} back at generation {} ({:?})",
                    dev.ordinal(),
                    service.dev.generation(),
                    service.dev.health()
                );
            }
            Err(e) => return Err(e),
        }
    }
    println!("worker: requests {first} to {REQUESTS} answered, {resets} in-process reset(s)");
    Ok(())
}
