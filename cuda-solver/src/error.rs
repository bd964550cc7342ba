//! [`Error`]: every failure of `cuda-solver`, the typed refusals of bad arguments, and the
//! library's `info` output as a result.

use cudars_solver_sys::{cusolverStatus_t, LoadError, MissingSymbol};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-solver`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// cuSOLVER could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded cuSOLVER lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A cuSOLVER call returned something other than `CUSOLVER_STATUS_SUCCESS`.
    #[error("{call} failed: {name} ({code})")]
    Cusolver {
        /// The entry point.
        call: &'static str,
        /// The `cusolverStatus_t` value.
        code: u32,
        /// Its name in `cusolver_common.h`.
        name: &'static str,
    },
    /// A `cuda-core` call failed.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// The pool could not give a workspace.
    #[error("workspace of {bytes} bytes: {why}")]
    Pool {
        /// The bytes asked for.
        bytes: usize,
        /// The pool's error.
        why: String,
    },
    /// `potrf`: the leading minor of this order (1-based) is not positive definite; the
    /// factorisation stopped there.
    #[error("{routine}: the leading minor of order {index} is not positive definite")]
    NotPositiveDefinite {
        /// The routine.
        routine: &'static str,
        /// `info`: the order of the first minor that is not positive definite.
        index: usize,
    },
    /// `getrf`: `U(index, index)` (1-based) is exactly zero: the matrix is singular (the
    /// factorisation completed, a solve would divide by zero).
    #[error("{routine}: U({index}, {index}) is exactly zero: the matrix is singular")]
    Singular {
        /// The routine.
        routine: &'static str,
        /// `info`: the 1-based index of the zero pivot.
        index: usize,
    },
    /// An iterative routine did not converge: `index` off-diagonal elements of an
    /// intermediate form did not go to zero (syevd, gesvd).
    #[error("{routine}: did not converge ({index} off-diagonal elements remain)")]
    NoConvergence {
        /// The routine.
        routine: &'static str,
        /// `info`.
        index: usize,
    },
    /// A Jacobi routine (syevj, gesvdj and their batched forms) ran out of sweeps above its
    /// tolerance ([`Jacobi`](crate::Jacobi) sets both).
    #[error("{routine}: did not converge within its sweeps and tolerance")]
    NotConverged {
        /// The routine.
        routine: &'static str,
    },
    /// The per-thread default stream, which a solver refuses: a pool workspace cannot be
    /// ordered on it across threads. Use a created stream.
    #[error("{routine}: the per-thread default stream: a pool workspace cannot be ordered on it across threads; use a created stream")]
    PerThreadStream {
        /// The call.
        routine: &'static str,
    },
    /// cuSOLVER reported its `index`-th parameter (1-based) wrong (a check this crate missed).
    #[error("{routine}: cuSOLVER refused parameter {index}")]
    InvalidParameter {
        /// The routine.
        routine: &'static str,
        /// `-info`.
        index: usize,
    },
    /// A shape or leading dimension the routine cannot take.
    #[error("{routine}: {arg}: {why}")]
    Shape {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A view smaller than its matrix.
    #[error("{routine}: {arg}: the matrix reaches {need} bytes; the view holds {have}")]
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
    /// A view of another device than the solver's.
    #[error(
        "{routine}: {arg} belongs to device {actual}; the solver belongs to device {expected}"
    )]
    WrongDevice {
        /// The routine.
        routine: &'static str,
        /// The argument.
        arg: &'static str,
        /// The solver's device.
        expected: usize,
        /// The view's device.
        actual: usize,
    },
    /// Two views that must not share memory do.
    #[error("{routine}: {a} and {b} overlap")]
    Overlap {
        /// The routine.
        routine: &'static str,
        /// One view.
        a: &'static str,
        /// The other.
        b: &'static str,
    },
    /// A capture this routine cannot be part of (the eigen and SVD routines, in which
    /// cuSOLVER may wait on the host), or a stream whose capture was invalidated.
    #[error("{routine}: cannot run in this capture: {why}")]
    Capturing {
        /// The routine.
        routine: &'static str,
        /// Why.
        why: &'static str,
    },
    /// A batched routine's failure, naming the matrix (0-based) of the batch.
    #[error("matrix {batch} of the batch: {error}")]
    InBatch {
        /// The matrix's index in the batch.
        batch: usize,
        /// Its failure.
        error: Box<Error>,
    },
}

/// `Ok` for `CUSOLVER_STATUS_SUCCESS`, else [`Error::Cusolver`] naming `call`.
pub(crate) fn check(
    status: Result<cusolverStatus_t, MissingSymbol>,
    call: &'static str,
) -> Result<()> {
    let status = status?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::Cusolver {
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

/// The process-wide cuSOLVER.
pub(crate) fn cusolver() -> Result<&'static cudars_solver_sys::Cusolver> {
    Ok(cudars_solver_sys::cusolver()?)
}
