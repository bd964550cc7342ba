//! cuSOLVER's dense routines on `cuda-core` streams and `cuda-mempool` memory: CuPy's
//! `cupy.cuda.cusolver` (and the factorisations under `cupy.linalg`) for Rust.
//!
//! | item | what | CuPy / LAPACK |
//! | --- | --- | --- |
//! | [`Solver`] | a dense handle bound to a stream | `cupy.cuda.device.get_cusolver_handle()` |
//! | [`Solver::potrf`], [`Solver::potrs`], [`Solver::potri`] | Cholesky factorisation, solve and inverse | `cholesky`, `xPOTRF`, `xPOTRS`, `xPOTRI` |
//! | [`Solver::getrf`], [`Solver::getrs`] | LU with partial pivoting and solve | `xGETRF`, `xGETRS` (`cupy.linalg.solve`) |
//! | [`Solver::geqrf`], [`Solver::orgqr`], [`Solver::ormqr`] | QR, its `Q`, and products with `Q` | `cupy.linalg.qr`, `xGEQRF`, `xORGQR`, `xORMQR` |
//! | [`Solver::syevd`], [`Solver::syevj`], [`Solver::syevj_batched`] | symmetric eigen-decomposition (divide and conquer; Jacobi, and batched up to 32 x 32) | `cupy.linalg.eigh`, `xSYEVD`, `xSYEVJ` |
//! | [`Solver::gesvd`], [`Solver::gesvdj`], [`Solver::gesvdj_batched`] | singular value decomposition (QR iteration, m >= n; Jacobi, any shape, and batched) | `cupy.linalg.svd`, `xGESVD`, `xGESVDJ` |
//! | [`Solver::check_replay`] | the typed `info` of the routines a replayed graph ran | |
//! | [`Matrix`], [`Uplo`] | a column-major matrix in a view; the triangle read | LAPACK's layout |
//!
//! Every view is checked before cuSOLVER sees it (device, alignment, the bytes the matrix
//! reaches with its leading dimension, overlaps between outputs and inputs, 32-bit sizes).
//! Workspaces come from the pool on the solver's stream. Each routine reads its `info`
//! back: a matrix that is not positive definite ([`Error::NotPositiveDefinite`]) or singular
//! ([`Error::Singular`]) is an error naming the index, as is an iteration that does not
//! converge ([`Error::NoConvergence`]); a batched routine's failure names its matrix
//! ([`Error::InBatch`]). Elements: `f32`, `f64`.
//!
//! The factorisations and solves may be captured into graphs (a workspace kept across
//! captures, no memory node; `info` checked after a replay by [`Solver::check_replay`]); the
//! eigen and SVD routines refuse captures. Not here: the pointer-array batched forms
//! (`potrfBatched`, `potrsBatched`), the 64-bit `cusolverDnX*` API, complex elements.

pub mod check;
pub mod dense;
pub mod error;

#[cfg(test)]
mod tests;

pub use check::{Matrix, Uplo};
pub use dense::{CaptureInfo, Jacobi, Pivots, Scalar, Side, Solver, BATCHED_JACOBI_MAX};
pub use error::{Error, Result};
