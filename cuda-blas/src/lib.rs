//! cuBLAS and cuBLASLt on `cuda-core`'s streams and views and `cuda-mempool`'s pool (CuPy's
//! `cupy.cuda.cublas`, PyTorch's `at::cuda::blas`).
//!
//! | item | what it does | library call |
//! | --- | --- | --- |
//! | [`Gemm`] | `C = alpha op(A) op(B) + beta C`, any [`Element`], column- or row-major | `cublasGemmEx` |
//! | [`Gemm::run_strided_batched`] | a batch of GEMMs a stride apart | `cublasGemmStridedBatchedEx` |
//! | [`gemm_batched`] | a batch of GEMMs anywhere | `cublasGemmBatchedEx` |
//! | [`gemv`] | `y = alpha op(A) x + beta y` | `cublas{S,D,C,Z}gemv` |
//! | [`axpy`], [`scal`] | `y += alpha x`, `x *= alpha` | `cublasAxpyEx`, `cublasScalEx` |
//! | [`dot`] / [`dot_into`], [`nrm2`] / [`nrm2_into`] | reductions to the host (blocking) or to device memory | `cublasDot{c}Ex`, `cublasNrm2Ex` |
//! | [`geam`] | `C = alpha op(A) + beta op(B)` | `cublas{S,D,C,Z}geam`, `cublasLtMatrixTransform` |
//! | [`LtMatmul`] | matmul with an [`Epilogue`] (bias, ReLU, GELU and backward forms) | `cublasLtMatmul` |
//! | [`Fp8Matmul`] | e4m3/e5m2 inputs with scales (compute capability 8.9+) | `cublasLtMatmul` |
//!
//! Elements: `f32`, `f64`, [`f16`](struct@f16), [`bf16`](struct@bf16), [`Complex32`], [`Complex64`] ([`Element`]);
//! `alpha` and `beta` are `f32` for the 16-bit types. [`MathMode`] chooses TF32 or pedantic
//! precision.
//!
//! # Handles, workspaces, captures
//!
//! Nothing to create: each call takes the cached handle of its stream ([`handle`]: one per
//! (device, stream), PyTorch's rule), with a workspace from the pool on that stream, or during
//! a capture from the capture's private pool, so a captured GEMM records no memory node and
//! repeated captures do not grow memory. Handles are used by one thread at a time (a mutex
//! per handle); threads on their own streams never wait for each other.
//!
//! # Checked before the library reads memory
//!
//! Every routine checks dimensions, leading dimensions, strides, increments and counts, that
//! each view holds what the call reads or writes, alignment, the device of every operand
//! against the stream's, and that outputs overlap no input ([`shape`]); a refusal is a typed
//! [`Error`] naming the argument, with nothing issued. Each view is then marked with the call's
//! [`Issue`](cudars_core::Issue) (the ordering rule of pool blocks), as every launcher does.
//!
//! The libraries are opened at run time (`cudars-blas-sys`): `$CUDA_CUBLAS_LIBRARY`,
//! `$CUDA_CUBLASLT_LIBRARY`, else `libcublas.so.13`/`.12` and the toolkit directories.
//!
//! ```no_run
//! use cudars_blas::{Gemm, Mat};
//! use cudars_core::{Device, Stream};
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let n = 256;
//! let a = cudars_mempool::driver::malloc(&stream, n * n * 4)?;
//! let b = cudars_mempool::driver::malloc(&stream, n * n * 4)?;
//! let c = cudars_mempool::driver::malloc(&stream, n * n * 4)?;
//! Gemm::new(Mat::<f32>::col_major(&a, n, n), Mat::col_major(&b, n, n), Mat::col_major(&c, n, n))
//!     .run(&stream)?;
//! // A view too short for its shape is refused before anything runs:
//! let err = Gemm::new(Mat::<f32>::col_major(&a, n, n + 1), Mat::col_major(&b, n + 1, n), Mat::col_major(&c, n, n))
//!     .run(&stream)
//!     .unwrap_err();
//! assert!(matches!(err, cudars_blas::Error::BufferTooSmall { argument: "a", .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod blas;
mod element;
mod error;
pub mod handle;
pub mod lt;
pub mod shape;

pub use blas::{
    axpy, dot, dot_into, geam, gemm_batched, gemv, nrm2, nrm2_into, scal, Gemm, MathMode,
    StridedBatch,
};
pub use element::{bf16, f16, Complex32, Complex64, Element};
pub use error::{Error, Result};
pub use lt::{Epilogue, Fp8, Fp8Matmul, LtMatmul, MAX_PLANS};
pub use shape::{Mat, Op, Order, Vector};

#[cfg(test)]
mod tests;
