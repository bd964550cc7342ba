//! Element types: [`ElemType`] (a `DLDataType` this crate knows) and [`DlElem`] (the Rust
//! types that stand for them).
//!
//! | `ElemType` | Rust | DLPack code, bits |
//! | --- | --- | --- |
//! | `U8`, `U16`, `U32`, `U64` | `u8` ... `u64` | `kDLUInt` (1), 8..64 |
//! | `I8`, `I16`, `I32`, `I64` | `i8` ... `i64` | `kDLInt` (0), 8..64 |
//! | `F16`, `F32`, `F64` | [`half::f16`], `f32`, `f64` | `kDLFloat` (2), 16..64 |
//! | `BF16` | [`half::bf16`] | `kDLBfloat` (4), 16 |
//! | `Bool` | `bool` | `kDLBool` (6), 8 |
//!
//! `lanes` is always 1: vector types, complex numbers and the sub-byte / fp8 codes are refused
//! with [`Error::UnsupportedDType`].

use crate::error::{Error, Result};
use crate::ffi::{DLDataType, DLDataTypeCode};

pub use crate::elem::ElemType;

impl ElemType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            ElemType::Bool | ElemType::U8 | ElemType::I8 => 1,
            ElemType::U16 | ElemType::I16 | ElemType::F16 | ElemType::BF16 => 2,
            ElemType::U32 | ElemType::I32 | ElemType::F32 => 4,
            ElemType::U64 | ElemType::I64 | ElemType::F64 => 8,
        }
    }

    /// The alignment an element needs (its size: every type here is naturally aligned).
    pub const fn align(self) -> usize {
        self.size()
    }

    /// The `DLDataType` (lanes 1).
    pub const fn to_dl(self) -> DLDataType {
        let (code, bits) = match self {
            ElemType::Bool => (DLDataTypeCode::BOOL, 8),
            ElemType::U8 => (DLDataTypeCode::UINT, 8),
            ElemType::I8 => (DLDataTypeCode::INT, 8),
            ElemType::U16 => (DLDataTypeCode::UINT, 16),
            ElemType::I16 => (DLDataTypeCode::INT, 16),
            ElemType::U32 => (DLDataTypeCode::UINT, 32),
            ElemType::I32 => (DLDataTypeCode::INT, 32),
            ElemType::U64 => (DLDataTypeCode::UINT, 64),
            ElemType::I64 => (DLDataTypeCode::INT, 64),
            ElemType::F16 => (DLDataTypeCode::FLOAT, 16),
            ElemType::BF16 => (DLDataTypeCode::BFLOAT, 16),
            ElemType::F32 => (DLDataTypeCode::FLOAT, 32),
            ElemType::F64 => (DLDataTypeCode::FLOAT, 64),
        };
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The element type of a `DLDataType`, or [`Error::UnsupportedDType`].
    pub fn from_dl(dtype: DLDataType) -> Result<ElemType> {
        let refused = Error::UnsupportedDType {
            code: dtype.code.0,
            bits: dtype.bits,
            lanes: dtype.lanes,
        };
        if dtype.lanes != 1 {
            return Err(refused);
        }
        Ok(match (dtype.code, dtype.bits) {
            (DLDataTypeCode::BOOL, 8) => ElemType::Bool,
            (DLDataTypeCode::UINT, 8) => ElemType::U8,
            (DLDataTypeCode::INT, 8) => ElemType::I8,
            (DLDataTypeCode::UINT, 16) => ElemType::U16,
            (DLDataTypeCode::INT, 16) => ElemType::I16,
            (DLDataTypeCode::UINT, 32) => ElemType::U32,
            (DLDataTypeCode::INT, 32) => ElemType::I32,
            (DLDataTypeCode::UINT, 64) => ElemType::U64,
            (DLDataTypeCode::INT, 64) => ElemType::I64,
            (DLDataTypeCode::FLOAT, 16) => ElemType::F16,
            (DLDataTypeCode::BFLOAT, 16) => ElemType::BF16,
            (DLDataTypeCode::FLOAT, 32) => ElemType::F32,
            (DLDataTypeCode::FLOAT, 64) => ElemType::F64,
            _ => return Err(refused),
        })
    }

    /// The NumPy-style name (`"float32"`, `"bool"`, `"bfloat16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::Bool => "bool",
            ElemType::U8 => "uint8",
            ElemType::I8 => "int8",
            ElemType::U16 => "uint16",
            ElemType::I16 => "int16",
            ElemType::U32 => "uint32",
            ElemType::I32 => "int32",
            ElemType::U64 => "uint64",
            ElemType::I64 => "int64",
            ElemType::F16 => "float16",
            ElemType::BF16 => "bfloat16",
            ElemType::F32 => "float32",
            ElemType::F64 => "float64",
        }
    }

    /// The element type of a NumPy-style name, as [`name`](Self::name) gives.
    pub fn from_name(name: &str) -> Option<ElemType> {
        ElemType::ALL.iter().copied().find(|t| t.name() == name)
    }

    /// Every element type.
    pub const ALL: [ElemType; 13] = [
        ElemType::Bool,
        ElemType::U8,
        ElemType::I8,
        ElemType::U16,
        ElemType::I16,
        ElemType::U32,
        ElemType::I32,
        ElemType::U64,
        ElemType::I64,
        ElemType::F16,
        ElemType::BF16,
        ElemType::F32,
        ElemType::F64,
    ];
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that stands for one [`ElemType`]: what typed views are generic over.
///
/// Sealed: implemented for `bool`, `u8`..`u64`, `i8`..`i64`, [`half::f16`], [`half::bf16`],
/// `f32` and `f64`, each with the size and alignment of its DLPack type.
pub trait DlElem: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The element type.
    const TYPE: ElemType;
}

macro_rules! elem {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl DlElem for $t {
            const TYPE: ElemType = ElemType::$e;
        }
        const _: () = assert!(
            std::mem::size_of::<$t>() == ElemType::$e.size()
                && std::mem::align_of::<$t>() <= ElemType::$e.align()
        );
    )*};
}

elem! {
    bool => Bool, u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_through_dldatatype() {
        for t in ElemType::ALL {
            let dl = t.to_dl();
            assert_eq!(dl.lanes, 1);
            assert_eq!(usize::from(dl.bits), t.size() * 8);
            assert_eq!(ElemType::from_dl(dl).unwrap(), t);
            assert_eq!(ElemType::from_name(t.name()), Some(t));
        }
    }

    #[test]
    fn the_header_codes() {
        let dt = |code, bits| DLDataType {
            code: DLDataTypeCode(code),
            bits,
            lanes: 1,
        };
        assert_eq!(ElemType::from_dl(dt(2, 32)).unwrap(), ElemType::F32);
        assert_eq!(ElemType::from_dl(dt(0, 64)).unwrap(), ElemType::I64);
        assert_eq!(ElemType::from_dl(dt(1, 8)).unwrap(), ElemType::U8);
        assert_eq!(ElemType::from_dl(dt(4, 16)).unwrap(), ElemType::BF16);
        assert_eq!(ElemType::from_dl(dt(6, 8)).unwrap(), ElemType::Bool);
        assert_eq!(ElemType::from_dl(dt(2, 16)).unwrap(), ElemType::F16);
    }

    #[test]
    fn unsupported_types_are_refused() {
        let refused = |code, bits, lanes| {
            matches!(
                ElemType::from_dl(DLDataType {
                    code: DLDataTypeCode(code),
                    bits,
                    lanes
                }),
                Err(Error::UnsupportedDType { .. })
            )
        };
        assert!(refused(2, 32, 4), "float4 vector");
        assert!(refused(5, 64, 1), "complex64");
        assert!(refused(8, 8, 1), "float8_e4m3");
        assert!(refused(6, 1, 1), "one-bit bool");
        assert!(refused(2, 8, 1), "8-bit float");
        assert!(refused(0, 128, 1), "int128");
        assert!(refused(3, 64, 1), "opaque handle");
        assert!(refused(2, 32, 0), "zero lanes");
    }

    #[test]
    fn rust_types_name_their_elem_type() {
        assert_eq!(<f32 as DlElem>::TYPE, ElemType::F32);
        assert_eq!(<bool as DlElem>::TYPE, ElemType::Bool);
        assert_eq!(<half::bf16 as DlElem>::TYPE, ElemType::BF16);
        assert_eq!(<i64 as DlElem>::TYPE, ElemType::I64);
    }
}
