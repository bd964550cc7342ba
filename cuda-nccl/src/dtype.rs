//! Element types NCCL reduces, and the reduction operators.

use cudars_nccl_sys::{ncclDataType_t, ncclRedOp_t};

/// An NCCL element type, as a Rust value (no dtype strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
    /// `ncclFloat16`.
    F16,
    /// `ncclBfloat16`.
    BF16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
}

impl DataType {
    /// The `ncclDataType_t` code.
    pub fn to_raw(self) -> ncclDataType_t {
        match self {
            DataType::I8 => ncclDataType_t::ncclInt8,
            DataType::U8 => ncclDataType_t::ncclUint8,
            DataType::I32 => ncclDataType_t::ncclInt32,
            DataType::U32 => ncclDataType_t::ncclUint32,
            DataType::I64 => ncclDataType_t::ncclInt64,
            DataType::U64 => ncclDataType_t::ncclUint64,
            DataType::F16 => ncclDataType_t::ncclFloat16,
            DataType::BF16 => ncclDataType_t::ncclBfloat16,
            DataType::F32 => ncclDataType_t::ncclFloat32,
            DataType::F64 => ncclDataType_t::ncclFloat64,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type NCCL can move and reduce. Sealed: implemented for `i8`, `u8`, `i32`, `u32`,
/// `i64`, `u64`, `half::f16`, `half::bf16`, `f32` and `f64`, whose layouts are the ones NCCL
/// reads for [`NcclType::DATA_TYPE`].
///
/// ```
/// use cudars_nccl::{DataType, NcclType};
/// assert_eq!(<f32 as NcclType>::DATA_TYPE, DataType::F32);
/// assert_eq!(<half::bf16 as NcclType>::DATA_TYPE, DataType::BF16);
/// ```
pub trait NcclType: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The NCCL element type.
    const DATA_TYPE: DataType;
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATA_TYPE: DataType = DataType::$d;
        }
    )*};
}

nccl_type! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average (sum divided by the number of ranks; NCCL 2.10 and later).
    Avg,
}

impl ReduceOp {
    /// The `ncclRedOp_t` code.
    pub fn to_raw(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: NcclType>(code: u32) {
        assert_eq!(T::DATA_TYPE.to_raw().0, code);
        assert_eq!(T::DATA_TYPE.size(), std::mem::size_of::<T>());
    }

    #[test]
    fn every_rust_type_maps_to_its_nccl_code_and_size() {
        check::<i8>(0);
        check::<u8>(1);
        check::<i32>(2);
        check::<u32>(3);
        check::<i64>(4);
        check::<u64>(5);
        check::<half::f16>(6);
        check::<f32>(7);
        check::<f64>(8);
        check::<half::bf16>(9);
    }

    #[test]
    fn reduce_ops_map_to_their_codes() {
        let codes: Vec<u32> = [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ]
        .iter()
        .map(|o| o.to_raw().0)
        .collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
    }
}
