//! cuSOLVER's dense routines on `cuda-core` streams and `cuda-mempool` memory: CuPy's
//! `cupy.cuda.cusolver` (and the factorisations under `cupy.linalg`) for Rust.
//!
//! | item | what | CuPy / LAPACK |
//! | --- | --- | --- |
//! | [`Solver`] | a dense handle bound to a stream | `cupy.cuda.device.get_cusolver_handle()` |
//! | [`Solver::potrf`], [`Solver::potrs`] | Cholesky factorisation and solve | `cholesky`, `xPOTRF`, `xPOTRS` |
//! | [`Solver::getrf`], [`Solver::getrs`] | LU with partial pivoting and solve | `xGETRF`, `xGETRS` (`cupy.linalg.solve`) |
//! | [`Solver::geqrf`], [`Solver::orgqr`] | QR and its `Q` | `cupy.linalg.qr`, `xGEQRF`, `xORGQR` |
//! | [`Solver::syevd`] | symmetric eigen-decomposition | `cupy.linalg.eigh`, `xSYEVD` |
//! | [`Solver::gesvd`] | singular value decomposition (m >= n) | `cupy.linalg.svd`, `xGESVD` |
//! | [`Matrix`], [`Uplo`] | a column-major matrix in a view; the triangle read | LAPACK's layout |
//!
//! Every view is checked before cuSOLVER sees it (device, alignment, the bytes the matrix
//! reaches with its leading dimension, overlaps between outputs and inputs, 32-bit sizes).
//! Workspaces come from the pool on the solver's stream. Each routine reads its `info`
//! back: a matrix that is not positive definite ([`Error::NotPositiveDefinite`]) or singular
//! ([`Error::Singular`]) is an error naming the index, as is an iteration that does not
//! converge ([`Error::NoConvergence`]). Elements: `f32`, `f64`.
//!
//! Not here yet: `ormqr`, `potri`, `syevj`, `gesvdj`, the batched forms and captured solves.

pub mod check;
pub mod dense;
pub mod error;

#[cfg(test)]
mod tests;

pub use check::{Matrix, Uplo};
pub use dense::{Scalar, Solver};
pub use error::{Error, Result};
