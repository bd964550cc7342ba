//! A service loop that survives a device fault (see `cudars_core::health`).
//!
//! Each request runs a kernel that writes its number into a buffer, then reads it back. One
//! request in the middle is poisoned: its kernel writes to address 0x10, which faults and
//! loses the context. The loop then does what a service should: drain (drop what the
//! failed request held), reset (`Device::reset_after_fault`), reload (module, stream and
//! buffer made again in the new context) and resume, and the requests after the fault are
//! served with their results checked.
//!
//! Run with `cargo run --release -p cudars-core --example fault_service`; exits 0 on a machine
//! with a GPU whose driver recovers the context in a reset (printing one line per request).
//! Where the driver keeps the context lost after the reset (driver 580 after an illegal
//! address does), the loop says so and exits 1, as a service would for its supervisor to
//! restart it; so it does without a GPU, printing the error.

mod common;
use common::println;

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

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> cudars_core::Result<()> {
    let mut service = Service::start()?;
    let mut resets = 0;
    for n in 1..=6u32 {
        match service.serve(n, n == 3) {
            Ok(v) if v == n => println!("request {n}: served ({v})"),
            Ok(v) => return Err(Error::InvalidArgument(format!("request {n} read back {v}"))),
            Err(e) if e.is_context_lost() => {
                println!("request {n}: {e}");
                // Drain: what the service held belongs to the lost context (dropping it
                // frees nothing); reset; reload; resume.
                let dev = service.dev;
                drop(service);
                if let Err(e) = dev.reset_after_fault() {
                    // Some drivers keep the context lost even after the reset (driver 580
                    // after an illegal address): then only a new process gets the device
                    // back, and the service exits for its supervisor to start it again.
                    println!("  reset refused: {e}; exiting for a restart");
                    return Err(e);
                }
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
    println!("served 5 of 6 requests, {resets} reset(s)");
    Ok(())
}
