//! [`Error`]: every failure of `cuda-sparse`, and the typed refusals of bad arguments (shapes,
//! views, and the index arrays of a sparse matrix).

use cudars_sparse_sys::{cusparseStatus_t, LoadError, MissingSymbol};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-sparse`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// cuSPARSE could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded cuSPARSE lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A cuSPARSE call returned something other than `CUSPARSE_STATUS_SUCCESS`.
    #[error("{call} failed: {name} ({code})")]
    Cusparse {
        /// The entry point.
        call: &'static str,
        /// The `cusparseStatus_t` value.
        code: u32,
        /// Its name in `cusparse.h`.
        name: &'static str,
    },
    /// A `cuda-core` call failed.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// The pool (or the device) could not give a buffer.
    #[error("buffer of {bytes} bytes: {why}")]
    Pool {
        /// The bytes asked for.
        bytes: usize,
        /// The allocator's error.
        why: String,
    },
    /// A shape, length, leading dimension or size the routine cannot take.
    #[error("{routine}: {arg}: {why}")]
    Shape {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// What is wrong.
        why: String,
    },
    /// An index array of the wrong length (`rows + 1` row offsets, `nnz` indices).
    #[error("{routine}: {arg}: {actual} elements; the matrix needs {expected}")]
    Length {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// The length the matrix needs.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// CSR row offsets that do not describe the matrix: the first is not 0, one is smaller
    /// than the one before it, or the last is not `nnz`.
    #[error("{routine}: row_offsets[{position}]: {why}")]
    RowOffsets {
        /// The routine.
        routine: &'static str,
        /// The 0-based position of the offending offset.
        position: usize,
        /// What is wrong.
        why: String,
    },
    /// A row or column index outside `[0, bound)`.
    #[error("{routine}: {arg}[{position}] = {value} is outside [0, {bound})")]
    IndexOutOfRange {
        /// The routine.
        routine: &'static str,
        /// The index array.
        arg: &'static str,
        /// The 0-based position in the array.
        position: usize,
        /// The index found there.
        value: i64,
        /// The number of rows or columns.
        bound: usize,
    },
    /// COO row indices that are not sorted (cuSPARSE's COO format has them non-decreasing).
    #[error("{routine}: {arg}[{position}] is smaller than the index before it (COO rows must be sorted)")]
    Unsorted {
        /// The routine.
        routine: &'static str,
        /// The index array.
        arg: &'static str,
        /// The 0-based position of the first index smaller than its predecessor.
        position: usize,
    },
    /// A view smaller than what the routine reads or writes in it.
    #[error("{routine}: {arg}: the routine reaches {need} bytes; the view holds {have}")]
    BufferTooSmall {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes held.
        have: u64,
    },
    /// A view not aligned to its elements.
    #[error("{routine}: {arg}: address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// The address.
        addr: u64,
        /// The alignment needed.
        align: usize,
    },
    /// An operand of another device than the handle's (or than the matrix's values).
    #[error("{routine}: {arg} belongs to device {actual}; expected device {expected}")]
    WrongDevice {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// The device expected.
        expected: usize,
        /// The operand's device.
        actual: usize,
    },
    /// Two views that must not share memory do (an output and an input).
    #[error("{routine}: {a} and {b} overlap")]
    Overlap {
        /// The routine.
        routine: &'static str,
        /// One view.
        a: &'static str,
        /// The other.
        b: &'static str,
    },
    /// The stream is being captured: refused (see the crate documentation, "Captures").
    #[error("{routine}: the stream is being captured; cuda-sparse does not issue into captures")]
    Capturing {
        /// The routine.
        routine: &'static str,
    },
    /// The per-thread default stream: a pool buffer cannot be ordered on it across threads.
    #[error("{routine}: the per-thread default stream is refused (a pool buffer cannot be ordered on it across threads); use a created stream")]
    PerThreadStream {
        /// The routine.
        routine: &'static str,
    },
}

/// `Ok` for `CUSPARSE_STATUS_SUCCESS`, else [`Error::Cusparse`] naming `call`.
pub(crate) fn check(
    status: Result<cusparseStatus_t, MissingSymbol>,
    call: &'static str,
) -> Result<()> {
    let status = status?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::Cusparse {
            call,
            code: status.0,
            name: status.name(),
        })
    }
}

impl From<&'static LoadError> for Error {
    fn from(e: &'static LoadError) -> Error {
        Error::Load(e.clone())
    }
}

/// The process-wide cuSPARSE.
pub(crate) fn cusparse() -> Result<&'static cudars_sparse_sys::Cusparse> {
    Ok(cudars_sparse_sys::cusparse()?)
}
