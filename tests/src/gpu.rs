//! The GPU tests' shared preamble, used by every `tests/tests/gpu_*.rs`: one lock that
//! serialises a test binary's tests (so checks of device memory levels see only their own
//! work), the same lock with a backtrace on a crash, and device 0.

use std::sync::{Mutex, MutexGuard};

use cudars_core::Device;

static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the test binary's one lock (a test that panicked while holding it does not
/// poison it for the others).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Device 0; fails the test when there is none.
pub fn dev0() -> Device {
    Device::new(0).expect("device 0")
}

/// [`serial`], after installing (once per process) a SIGSEGV handler that prints a backtrace
/// and exits with status 139: diagnostics for a crash inside a driver call.
pub fn serial_reporting_crashes() -> MutexGuard<'static, ()> {
    install_segv_backtrace();
    serial()
}

/// Prints a backtrace on SIGSEGV (diagnostics for a crash inside a driver call).
fn install_segv_backtrace() {
    extern "C" fn on_segv(_sig: i32) {
        eprintln!(
            "SIGSEGV, backtrace:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        std::process::exit(139);
    }
    extern "C" {
        fn signal(sig: i32, handler: extern "C" fn(i32)) -> usize;
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: installs a handler for SIGSEGV (11); the handler only runs on a crash.
    ONCE.call_once(|| unsafe {
        signal(11, on_segv);
    });
}
