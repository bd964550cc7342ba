//! cuSOLVER's dense routines on `cuda-core` streams and `cuda-mempool` memory: CuPy's
//! `cupy.cuda.cusolver` (and the factorisations under `cupy.linalg`) for Rust.
//!
//! | item | what | CuPy / LAPACK |
//! | --- | --- | --- |
//! | [`Solver`] | a dense handle bound to a stream | `cupy.cuda.device.get_cusolver_handle()` |
//! | [`Solver::potrf`], [`Solver::potrs`] | Cholesky factorisation and solve | `cholesky`, `xPOTRF`, `xPOTRS` |
//! | [`Solver::getrf`], [`Solver::getrs`] | LU with partial pivoting and solve | `xGETRF`, `xGETRS` (`cupy.linalg.solve`) |
//! | [`Matrix`], [`Uplo`] | a column-major matrix in a view; the triangle read | LAPACK's layout |
//!
//! Every view is checked before cuSOLVER sees it (device, alignment, the bytes the matrix
//! reaches with its leading dimension, overlaps between outputs and inputs, 32-bit sizes).
//! Workspaces come from the pool on the solver's stream. Each routine reads its `info`
//! back: a matrix that is not positive definite ([`Error::NotPositiveDefinite`]) or singular
//! ([`Error::Singular`]) is an error naming the index. Elements: `f32`, `f64`.
//!
//! QR, eigen-decompositions, SVD, the batched forms and captured solves are not here yet.

pub mod check;
pub mod dense;
pub mod error;

#[cfg(test)]
mod tests;

pub use check::{Matrix, Uplo};
pub use dense::{Scalar, Solver};
pub use error::{Error, Result};
