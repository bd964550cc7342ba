//! Access to the process-wide driver, and the free functions that ask it about itself.

use std::sync::OnceLock;

use cudars_sys::{CUresult, Driver};

use crate::error::{DriverError, Error, Result};

/// The process-wide driver, loaded and initialised. Fails with [`Error::Load`] when no driver
/// library can be opened, or with the `cuInit` error when initialisation failed.
#[inline]
pub(crate) fn api() -> Result<&'static Driver> {
    static INIT: OnceLock<Result<&'static Driver, Error>> = OnceLock::new();
    INIT.get_or_init(|| {
        let driver = cudars_sys::driver()?;
        match driver.init_status() {
            Some(status) if status.is_success() => Ok(driver),
            Some(status) => Err(DriverError::new(status, "cuInit").into()),
            None => Err(cudars_sys::MissingSymbol::new("cuInit").into()),
        }
    })
    .clone()
}

/// Turns a `CUresult` into `Ok(())` or a [`DriverError`] naming `call`.
#[inline]
pub(crate) fn check(result: CUresult, call: &'static str) -> Result<()> {
    if result.is_success() {
        Ok(())
    } else {
        Err(crate::health::on_error(DriverError::new(result, call)))
    }
}

/// Calls a driver entry point through the process-wide driver and checks its result:
/// `drv!(cuMemAlloc(&mut ptr, size))` is a `Result<()>` whose error names `cuMemAlloc`.
/// The expansion is an unsafe call: wrap it in `unsafe` with a `SAFETY:` comment.
macro_rules! drv {
    ($f:ident ( $($arg:expr),* $(,)? )) => {
        match $crate::driver::api() {
            Ok(d) => match d.$f($($arg),*) {
                Ok(r) => $crate::driver::check(r, stringify!($f)),
                Err(missing) => Err($crate::Error::from(missing)),
            },
            Err(e) => Err(e),
        }
    };
    // A `cudars_sys::compat` method, reported under the driver API's name:
    // `drv!(mem_advise as "cuMemAdvise" (ptr, len, advice, location))`.
    ($f:ident as $name:literal ( $($arg:expr),* $(,)? )) => {
        match $crate::driver::api() {
            Ok(d) => match d.$f($($arg),*) {
                Ok(r) => $crate::driver::check(r, $name),
                Err(missing) => Err($crate::Error::from(missing)),
            },
            Err(e) => Err(e),
        }
    };
}
pub(crate) use drv;

/// `true` when the driver loads, initialises, and reports at least one device. Never panics.
///
/// ```
/// if !cudars_core::is_available() {
///     eprintln!("no CUDA device here");
/// }
/// ```
pub fn is_available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// Number of CUDA devices.
pub fn device_count() -> Result<usize> {
    let mut count = 0;
    // SAFETY: valid out-pointer.
    unsafe { drv!(cuDeviceGetCount(&mut count)) }?;
    Ok(usize::try_from(count).unwrap_or(0))
}

pub use crate::version::CudaVersion;

/// The newest CUDA version the installed driver supports (`cuDriverGetVersion`).
pub fn driver_version() -> Result<CudaVersion> {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    unsafe { drv!(cuDriverGetVersion(&mut v)) }?;
    Ok(CudaVersion(v as u32))
}

/// The CUDA version of the headers these bindings were generated from (CuPy's
/// `get_local_runtime_version`: the version this build targets).
pub fn bindings_version() -> CudaVersion {
    CudaVersion(cudars_sys::CUDA_VERSION)
}
