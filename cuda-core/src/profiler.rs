//! Profiler control: start and stop collection by an attached profiling tool (CuPy's
//! `cupy.cuda.profiler.start`/`stop` and the `with cupy.cuda.profile():` block).
//!
//! With no profiling tool attached (Nsight Systems, Nsight Compute, ...), [`start`] and
//! [`stop`] succeed and do nothing. Collection is per context: these functions act on the
//! calling thread's current context, or on device 0's primary context (the one every
//! `cuda-core` operation on device 0 uses) when the thread has none.
//!
//! ```no_run
//! use cudars_core::profiler;
//!
//! // Profile only this block (run under `nsys profile --capture-range=cudaProfilerApi`).
//! {
//!     let _profiling = profiler::profile()?;
//!     // ... the work to measure ...
//! } // collection stops here, also on an early return or a panic
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::marker::PhantomData;
use std::path::Path;

use cudars_sys::CUcontext;

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::Device;

/// Runs `f` with a context current: the calling thread's current context if it has one,
/// otherwise device 0's primary context (CuPy's default device) for the duration of the call.
fn in_current_context(f: impl FnOnce() -> Result<()>) -> Result<()> {
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { drv!(cuCtxGetCurrent(&mut current)) }?;
    if current.is_null() {
        let _ctx = Device::new(0)?.bind()?;
        f()
    } else {
        f()
    }
}

/// Enables collection by the attached profiling tool for the calling thread's current context
/// (device 0's primary context when none is current), `cuProfilerStart`. Starting when already
/// started has no effect.
pub fn start() -> Result<()> {
    // SAFETY: a context is current; the call takes no arguments.
    in_current_context(|| unsafe { drv!(cuProfilerStart()) })
}

/// Disables collection by the attached profiling tool for the calling thread's current context
/// (device 0's primary context when none is current), `cuProfilerStop`. Stopping when not
/// started has no effect.
pub fn stop() -> Result<()> {
    // SAFETY: a context is current; the call takes no arguments.
    in_current_context(|| unsafe { drv!(cuProfilerStop()) })
}

/// Starts profiling until the returned guard drops (CuPy's `with cupy.cuda.profile():`).
///
/// The guard stops collection when it drops, on every path out of the scope. Guards do not
/// count: collection is a single switch, so the first guard to drop stops it. The guard is
/// neither `Send` nor `Sync`: it stops collection on the thread that created it, for the
/// context current there (as [`stop`] does).
///
/// ```no_run
/// let guard = cudars_core::profiler::profile()?;
/// // ... work ...
/// guard.stop()?; // or just let it drop; `stop` reports the driver's error
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub fn profile() -> Result<ProfileGuard> {
    start()?;
    Ok(ProfileGuard {
        stopped: false,
        _not_send: PhantomData,
    })
}

/// Keeps profiling enabled while it lives; see [`profile`].
#[derive(Debug)]
#[must_use = "profiling stops when the guard drops"]
pub struct ProfileGuard {
    stopped: bool,
    _not_send: PhantomData<*const ()>,
}

impl ProfileGuard {
    /// Stops collection now and reports the driver's answer (dropping the guard does the same
    /// and ignores errors).
    pub fn stop(mut self) -> Result<()> {
        self.stopped = true;
        stop()
    }
}

impl Drop for ProfileGuard {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = stop();
        }
    }
}

/// Output format of the legacy command-line profiler, the argument of [`initialize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputMode {
    /// `key value` pairs (CuPy's `cudaKeyValuePair`).
    KeyValuePair,
    /// Comma-separated values (CuPy's `cudaCSV`).
    Csv,
}

/// The message of the error [`initialize`] returns.
pub const INITIALIZE_REMOVED: &str =
    "cuProfilerInitialize was removed in CUDA 12 (with the legacy command-line profiler); \
     configure the profiling tool instead (Nsight Systems: --capture-range=cudaProfilerApi) \
     and use profiler::start/stop or profiler::profile";

/// CuPy's `profiler.initialize(config_file, output_file, output_mode)`.
///
/// `cuProfilerInitialize` and the command-line profiler it configured were removed in CUDA 12,
/// so this always returns [`Error::Unsupported`] (with [`INITIALIZE_REMOVED`]) and makes no
/// driver call. It exists so code ported from CuPy finds the function and learns why it is gone.
///
/// ```
/// use cudars_core::profiler::{initialize, OutputMode};
/// let err = initialize("prof.cfg", "prof.out", OutputMode::Csv).unwrap_err();
/// assert!(matches!(err, cudars_core::Error::Unsupported(_)));
/// ```
pub fn initialize(
    config_file: impl AsRef<Path>,
    output_file: impl AsRef<Path>,
    output_mode: OutputMode,
) -> Result<()> {
    let _ = (config_file.as_ref(), output_file.as_ref(), output_mode);
    Err(Error::Unsupported(INITIALIZE_REMOVED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initialize_is_unsupported_and_says_why() {
        let err = initialize("a.cfg", "b.out", OutputMode::KeyValuePair).unwrap_err();
        assert_eq!(err, Error::Unsupported(INITIALIZE_REMOVED));
        let text = err.to_string();
        assert!(text.contains("removed in CUDA 12"), "{text}");
        assert!(text.contains("cuProfilerInitialize"), "{text}");
    }
}
