//! [`Error`]: every failure of `cuda-blas`.

use cudars_blas_sys::{LoadError, MissingSymbol};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-blas`. The argument refusals ([`Error::Shape`],
/// [`Error::BufferTooSmall`], [`Error::Misaligned`], [`Error::WrongDevice`],
/// [`Error::Overlap`]) are found before anything is issued: nothing ran, nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// cuBLAS or cuBLASLt could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded library lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A cuBLAS or cuBLASLt call failed.
    #[error("{call} failed: {name} ({code})")]
    Library {
        /// The call.
        call: &'static str,
        /// The `cublasStatus_t` code.
        code: u32,
        /// Its name (`CUBLAS_STATUS_...`).
        name: &'static str,
    },
    /// A driver call of cuda-core failed (a stream, a device, a copy).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// The pool could not give a workspace or a pointer array (out of memory included: nothing
    /// was issued and nothing leaked).
    #[error("{what}: {source}")]
    Pool {
        /// What the memory was for.
        what: &'static str,
        /// The pool's error.
        #[source]
        source: cudars_mempool::PoolError,
    },
    /// A dimension, leading dimension, stride, increment or count is not valid for the call.
    #[error("{routine}: {argument}: {detail}")]
    Shape {
        /// The routine (`gemm`).
        routine: &'static str,
        /// The argument (`a.ld`, `k`, `batch`).
        argument: &'static str,
        /// What is wrong, with the numbers.
        detail: String,
    },
    /// A view is shorter than the elements the call would read or write.
    #[error("{routine}: {argument} needs {needed} bytes; the view has {len}")]
    BufferTooSmall {
        /// The routine.
        routine: &'static str,
        /// The argument.
        argument: &'static str,
        /// Bytes the call would touch.
        needed: u64,
        /// Bytes in the view.
        len: usize,
    },
    /// A view's address is not aligned to its element.
    #[error("{routine}: {argument} at {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The routine.
        routine: &'static str,
        /// The argument.
        argument: &'static str,
        /// The view's address.
        addr: u64,
        /// The element's alignment.
        align: usize,
    },
    /// An operand lives on another device than the stream.
    #[error("{routine}: {argument} is on device {actual}; the stream is on device {expected}")]
    WrongDevice {
        /// The routine.
        routine: &'static str,
        /// The argument.
        argument: &'static str,
        /// The stream's device.
        expected: usize,
        /// The operand's device.
        actual: usize,
    },
    /// The output overlaps an input (or another output of the same call): the library's
    /// result would be undefined.
    #[error("{routine}: {output} overlaps {input}")]
    Overlap {
        /// The routine.
        routine: &'static str,
        /// The output argument.
        output: &'static str,
        /// The argument it overlaps.
        input: &'static str,
    },
    /// The call cannot run here: a host-result routine on a stream being captured, FP8 on a
    /// device without it, a conjugate of a row-major operand, ...
    #[error("{routine}: {why}")]
    Unsupported {
        /// The routine.
        routine: &'static str,
        /// Why.
        why: String,
    },
}

impl From<&LoadError> for Error {
    fn from(e: &LoadError) -> Error {
        Error::Load(e.clone())
    }
}

impl Error {
    pub(crate) fn shape(routine: &'static str, argument: &'static str, detail: String) -> Error {
        Error::Shape {
            routine,
            argument,
            detail,
        }
    }

    pub(crate) fn pool(what: &'static str, source: cudars_mempool::PoolError) -> Error {
        Error::Pool { what, source }
    }
}

/// `Ok` for `CUBLAS_STATUS_SUCCESS`, else [`Error::Library`] naming the call.
pub(crate) fn check(
    status: Result<cudars_blas_sys::cublasStatus_t, MissingSymbol>,
    call: &'static str,
) -> Result<()> {
    let status = status?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::Library {
            call,
            code: status.0,
            name: status.name(),
        })
    }
}
