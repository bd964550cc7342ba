//! The element types: [`Value`] (`f32`, `f64`) and [`Index`] (`i32`, `i64`).

use cudars_sparse_sys::{cudaDataType, cusparseIndexType_t};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// The value types of the matrices and dense operands: `f32` and `f64` (the compute type is
/// the same). Sealed: implemented here only.
pub trait Value: sealed::Sealed + bytemuck::Pod + Send + Sync + std::fmt::Debug + 'static {
    /// `f32` or `f64`.
    const NAME: &'static str;
    /// cuSPARSE's `cudaDataType` of the type.
    #[doc(hidden)]
    fn data_type() -> cudaDataType;
}

impl Value for f32 {
    const NAME: &'static str = "f32";
    fn data_type() -> cudaDataType {
        cudaDataType::CUDA_R_32F
    }
}

impl Value for f64 {
    const NAME: &'static str = "f64";
    fn data_type() -> cudaDataType {
        cudaDataType::CUDA_R_64F
    }
}

/// The index types of the sparse matrices: `i32` and `i64` (row offsets and indices of one
/// matrix have the same type). Sealed: implemented here only.
pub trait Index:
    sealed::Sealed + bytemuck::Pod + Send + Sync + std::fmt::Debug + PartialOrd + 'static
{
    /// The largest count (rows, columns, nonzeros) the type can index.
    const MAX: usize;
    /// `i32` or `i64`.
    const NAME: &'static str;
    /// The index as an `i64`.
    fn to_i64(self) -> i64;
    /// cuSPARSE's `cusparseIndexType_t` of the type.
    #[doc(hidden)]
    fn index_type() -> cusparseIndexType_t;
}

impl Index for i32 {
    const MAX: usize = i32::MAX as usize;
    const NAME: &'static str = "i32";
    #[inline]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn index_type() -> cusparseIndexType_t {
        cusparseIndexType_t::CUSPARSE_INDEX_32I
    }
}

impl Index for i64 {
    const MAX: usize = i64::MAX as usize;
    const NAME: &'static str = "i64";
    #[inline]
    fn to_i64(self) -> i64 {
        self
    }
    fn index_type() -> cusparseIndexType_t {
        cusparseIndexType_t::CUSPARSE_INDEX_64I
    }
}
