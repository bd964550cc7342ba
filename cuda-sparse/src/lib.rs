//! cuSPARSE's generic API on `cuda-core` streams and `cuda-mempool` memory: CuPy's
//! `cupy.cuda.cusparse` (and what `cupyx.scipy.sparse`'s products call) for Rust.
//!
//! | item | what | cuSPARSE / SciPy |
//! | --- | --- | --- |
//! | [`Sparse`] | a handle bound to a stream | `cusparseCreate`, `cusparseSetStream` |
//! | [`CsrMatrix`], [`CooMatrix`] | sparse matrices whose indices are checked, owning their descriptor | `cusparseCreateCsr`, `cusparseCreateCoo`; `csr_matrix`, `coo_matrix` |
//! | [`Sparse::spmv`] | `y = alpha op(A) x + beta y` | `cusparseSpMV`; `A @ x` |
//! | [`Sparse::spmm`] | `C = alpha op(A) op(B) + beta C` | `cusparseSpMM`; `A @ B` |
//! | [`DnVec`], [`DnMat`], [`Order`], [`Op`] | dense operands (column- or row-major) in views | `cusparseCreateDnVec`, `cusparseCreateDnMat` |
//!
//! Values: `f32`, `f64` ([`Value`]); indices: `i32`, `i64` ([`Index`]); zero-based.
//!
//! # What is checked, what is trusted
//!
//! cuSPARSE reads memory at the positions a matrix's indices give, without checking them: a
//! bad row offset or column index is an out-of-bounds read (or write, through the output's
//! rows). So the safe constructors check the structure before cuSPARSE sees it, on the host:
//! CSR row offsets `rows + 1` of them, the first 0, non-decreasing, the last `nnz`; COO row
//! indices sorted; every row index in `[0, rows)` and column index in `[0, cols)`; the counts
//! within the index type. Index arrays given on the host ([`CsrMatrix::from_host`]) are
//! checked there and uploaded; index arrays on the device ([`CsrMatrix::from_device`]) are
//! copied device-to-device and read back to the host to be checked (a copy of the indices'
//! bytes each way and a wait for the stream, once per matrix). Either way the matrix keeps
//! its checked indices in device memory of its own that no other value can reach, so they
//! cannot change after the check. The `unsafe` `from_device_unchecked` constructors skip
//! the copy and the check and use the caller's arrays, trusting what their `# Safety`
//! sections state.
//!
//! Every product then checks, before any library call, with a typed [`Error`] naming the
//! argument: the shapes of `op(A)`, `x`, `y`, `op(B)`, `C`; the leading dimensions against the
//! layout; that each view holds what the routine reads or writes (for a dense matrix,
//! `ld * cols` or `ld * rows` elements, the length cuSPARSE documents) and is aligned to the
//! value type; that every operand is on the handle's device; and that the output overlaps
//! no input (the other dense operand, the matrix's indices and values). Buffers come from
//! the pool on the handle's stream ([`cudars_mempool::allocator::alloc_on`]), and every view
//! is marked for the stream, so nothing is freed or reused before the product has run.
//!
//! # Captures
//!
//! A product on a stream being captured (or that would touch a capture: the legacy stream
//! while a blocking stream is captured) is refused with [`Error::Capturing`], before anything
//! is issued: a graph would replay the product long after the call, with a pool buffer and
//! dense views whose lifetime nothing ties to the graph. So are the device constructors on
//! a captured stream (they wait for it). Capture support needs the buffer from the capture's
//! private pool and the views kept alive by the graph, as `cuda-blas` does; not here yet.
//!
//! The library is opened at run time (`cudars-sparse-sys`): `$CUDA_CUSPARSE_LIBRARY`, else
//! `libcusparse.so.12` / `.11` and the toolkit directories.
//!
//! Not here yet: CSC and the other formats, SpGEMM, triangular solves (SpSV, SpSM), SDDMM,
//! conversions, the non-default algorithms, complex and 16-bit values.

mod check;
mod dense;
mod element;
mod error;
mod handle;
mod matrix;

#[cfg(test)]
mod tests;

pub use dense::{DnMat, DnVec, Op, Order};
pub use element::{Index, Value};
pub use error::{Error, Result};
pub use handle::Sparse;
pub use matrix::{CooMatrix, CsrMatrix, Format, SparseMatrix};
