//! [`ElemType`], the scalar element types: a leaf (its conversions from and to DLPack's
//! `DLDataType` live in `dtype.rs`), so that errors can name element types.

/// A scalar element type that a DLPack tensor may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElemType {
    /// `bool`, stored as one byte (`kDLBool`, 8 bits).
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}
