//! [`Error`]: every failure of `cuda-fft`, and the typed refusals of bad arguments.

use cudars_fft_sys::{cufftResult, LoadError, MissingSymbol};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-fft`.
///
/// The variants from [`Error::Shape`] on are refusals: an argument that would make cuFFT fail,
/// or read or write outside the views passed, caught before anything is issued. Each names
/// the argument (`"input"`, `"output"`, `"shape"`, `"direction"`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// cuFFT could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded cuFFT lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A cuFFT call returned something other than `CUFFT_SUCCESS`.
    #[error("{call} failed: {name} ({code})")]
    Cufft {
        /// The entry point.
        call: &'static str,
        /// The `cufftResult` value.
        code: u32,
        /// Its name in `cufft.h` (`CUFFT_INVALID_SIZE`, ...).
        name: &'static str,
    },
    /// A `cuda-core` call failed (binding the context, the stream's device, marking memory on
    /// the stream, an event).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// The pool could not give a work area.
    #[error("work area of {bytes} bytes: {why}")]
    Pool {
        /// The bytes asked for.
        bytes: usize,
        /// The pool's error.
        why: String,
    },
    /// A shape, batch, stride, distance or embedding the transform cannot have.
    #[error("{arg}: {why}")]
    Shape {
        /// The argument.
        arg: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A view smaller than the layout reaches.
    #[error("{arg}: the layout reaches {need} bytes; the view holds {have}")]
    BufferTooSmall {
        /// The argument.
        arg: &'static str,
        /// Bytes the layout reaches from the view's start.
        need: u64,
        /// Bytes the view holds.
        have: u64,
    },
    /// The view's address is not aligned to its elements.
    #[error("{arg}: address {addr:#x} is not aligned to its {align}-byte elements")]
    Misaligned {
        /// The argument.
        arg: &'static str,
        /// The view's device address.
        addr: u64,
        /// The alignment the elements need.
        align: usize,
    },
    /// An object of another device than the plan's.
    #[error("{arg} belongs to device {actual}; the plan belongs to device {expected}")]
    WrongDevice {
        /// The argument.
        arg: &'static str,
        /// The plan's device.
        expected: usize,
        /// The argument's device.
        actual: usize,
    },
    /// Output and input share memory in a way the transform cannot run in place, or the
    /// output layout maps two elements to one address.
    #[error("{why}")]
    Overlap {
        /// What overlaps.
        why: String,
    },
    /// A direction the transform does not have (R2C is forward, C2R inverse).
    #[error("direction: {why}")]
    Direction {
        /// What is wrong.
        why: String,
    },
    /// Something this crate does not do (or not in this state: an invalidated capture).
    #[error("{what}: {why}")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// Why.
        why: String,
    },
}

impl Error {
    pub(crate) fn shape(arg: &'static str, why: impl Into<String>) -> Error {
        Error::Shape {
            arg,
            why: why.into(),
        }
    }
}

/// `Ok` for `CUFFT_SUCCESS`, else [`Error::Cufft`] naming `call`.
pub(crate) fn check(status: Result<cufftResult, MissingSymbol>, call: &'static str) -> Result<()> {
    let status = status?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::Cufft {
            call,
            code: status.0,
            name: status.name(),
        })
    }
}

/// The process-wide cuFFT.
pub(crate) fn cufft() -> Result<&'static cudars_fft_sys::Cufft> {
    Ok(cudars_fft_sys::cufft()?)
}

impl From<&'static LoadError> for Error {
    fn from(e: &'static LoadError) -> Error {
        Error::Load(e.clone())
    }
}
