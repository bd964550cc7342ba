//! The GPU tests' shared preamble: one lock that serialises a test binary's tests (so
//! checks of device memory levels see only their own work), and device 0.

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
