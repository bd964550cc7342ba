//! The element types the routines take: [`Element`], sealed, for `f32`, `f64`, [`f16`],
//! [`bf16`], [`Complex32`] and [`Complex64`].

use cudars_blas_sys::{cublasComputeType_t, cudaDataType};
pub use half::{bf16, f16};
pub use num_complex::{Complex32, Complex64};

mod sealed {
    pub trait Sealed {}
}

/// An element type of cuBLAS's typed routines. `Scalar` is the type of `alpha` and `beta` (the
/// compute type's: `f32` for the 16-bit types, as PyTorch computes them).
pub trait Element: bytemuck::Pod + Send + Sync + sealed::Sealed + std::fmt::Debug {
    /// `alpha` / `beta`.
    type Scalar: bytemuck::Pod + Copy + std::fmt::Debug;
    /// The library's name for the element (`CUDA_R_32F`).
    const DATA_TYPE: cudaDataType;
    /// The library's name for the scalar.
    const SCALAR_TYPE: cudaDataType;
    /// The compute type of GEMMs on this element under [`MathMode::Default`](crate::MathMode).
    const COMPUTE: cublasComputeType_t;
    /// The type of a norm (`f32` for [`Complex32`], the element itself for the real types).
    type Real: bytemuck::Pod + Copy + std::fmt::Debug;
    /// The library's name for [`Element::Real`].
    const REAL_TYPE: cudaDataType;
    /// The execution type of a norm.
    const REAL_EXECUTION: cudaDataType;
    /// `true` for the complex types.
    const COMPLEX: bool;
    /// A name for messages (`f32`).
    const NAME: &'static str;
    /// One, as a scalar.
    fn one() -> Self::Scalar;
    /// Zero, as a scalar.
    fn zero() -> Self::Scalar;
}

macro_rules! element {
    ($t:ty, $s:ty, $dt:ident, $st:ident, $ct:ident, $complex:expr, $one:expr, $zero:expr, $real:ty, $rt:ident, $re:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            type Scalar = $s;
            type Real = $real;
            const REAL_TYPE: cudaDataType = cudaDataType::$rt;
            const REAL_EXECUTION: cudaDataType = cudaDataType::$re;
            const DATA_TYPE: cudaDataType = cudaDataType::$dt;
            const SCALAR_TYPE: cudaDataType = cudaDataType::$st;
            const COMPUTE: cublasComputeType_t = cublasComputeType_t::$ct;
            const COMPLEX: bool = $complex;
            const NAME: &'static str = stringify!($t);
            #[inline]
            fn one() -> $s {
                $one
            }
            #[inline]
            fn zero() -> $s {
                $zero
            }
        }
    };
}

element!(
    f32,
    f32,
    CUDA_R_32F,
    CUDA_R_32F,
    CUBLAS_COMPUTE_32F,
    false,
    1.0,
    0.0,
    f32,
    CUDA_R_32F,
    CUDA_R_32F
);
element!(
    f64,
    f64,
    CUDA_R_64F,
    CUDA_R_64F,
    CUBLAS_COMPUTE_64F,
    false,
    1.0,
    0.0,
    f64,
    CUDA_R_64F,
    CUDA_R_64F
);
element!(
    f16,
    f32,
    CUDA_R_16F,
    CUDA_R_32F,
    CUBLAS_COMPUTE_32F,
    false,
    1.0,
    0.0,
    f16,
    CUDA_R_16F,
    CUDA_R_32F
);
element!(
    bf16,
    f32,
    CUDA_R_16BF,
    CUDA_R_32F,
    CUBLAS_COMPUTE_32F,
    false,
    1.0,
    0.0,
    bf16,
    CUDA_R_16BF,
    CUDA_R_32F
);
element!(
    Complex32,
    Complex32,
    CUDA_C_32F,
    CUDA_C_32F,
    CUBLAS_COMPUTE_32F,
    true,
    Complex32::new(1.0, 0.0),
    Complex32::new(0.0, 0.0),
    f32,
    CUDA_R_32F,
    CUDA_R_32F
);
element!(
    Complex64,
    Complex64,
    CUDA_C_64F,
    CUDA_C_64F,
    CUBLAS_COMPUTE_64F,
    true,
    Complex64::new(1.0, 0.0),
    Complex64::new(0.0, 0.0),
    f64,
    CUDA_R_64F,
    CUDA_R_64F
);
