//! The crate's error type: every refusal of an export or an import is a variant of its own.

use crate::elem::ElemType;

/// Why an export or an import was refused, or a CUDA call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `cuda-core` call failed (stream ordering, a copy, a wait).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// A null pointer where a tensor or a data pointer was needed.
    #[error("null {0}")]
    Null(&'static str),
    /// The tensor's DLPack major version is not 1 (its deleter was called, as the spec asks).
    #[error("DLPack version {major}.{minor} is not supported (major version 1 is)")]
    UnsupportedVersion {
        /// The tensor's major version.
        major: u32,
        /// The tensor's minor version.
        minor: u32,
    },
    /// The tensor is not in CUDA device memory (`kDLCUDA`, or `kDLCUDAManaged` when allowed).
    #[error("the tensor is on DLPack device type {device_type}, not CUDA memory ({allowed})")]
    NotCuda {
        /// The tensor's `DLDeviceType`.
        device_type: u32,
        /// What would have been accepted.
        allowed: &'static str,
    },
    /// The tensor is on another GPU than the one named.
    #[error("the tensor is on CUDA device {actual}, not device {expected}")]
    WrongDevice {
        /// The device ordinal asked for.
        expected: usize,
        /// The tensor's device ordinal.
        actual: usize,
    },
    /// The tensor's `DLDevice::device_id` is no device ordinal (negative).
    #[error("the tensor's CUDA device id {0} is negative")]
    InvalidDevice(i32),
    /// The tensor's `DLDataType` has no [`ElemType`] here (vector lanes, complex, fp8, ...).
    #[error("unsupported DLPack dtype (code {code}, bits {bits}, lanes {lanes})")]
    UnsupportedDType {
        /// `DLDataType::code`.
        code: u8,
        /// `DLDataType::bits`.
        bits: u8,
        /// `DLDataType::lanes`.
        lanes: u16,
    },
    /// The tensor's element type is not the one asked for.
    #[error("the tensor holds {actual:?}, not {expected:?}")]
    TypeMismatch {
        /// The element type asked for.
        expected: ElemType,
        /// The tensor's.
        actual: ElemType,
    },
    /// A negative extent, or more dimensions than a DLPack tensor may have.
    #[error("invalid shape {shape:?}")]
    InvalidShape {
        /// The shape given or found.
        shape: Vec<i64>,
    },
    /// Strides whose count differs from the shape's.
    #[error("{strides} strides for {ndim} dimensions")]
    StrideCount {
        /// Dimensions.
        ndim: usize,
        /// Strides given.
        strides: usize,
    },
    /// A negative stride where contiguous memory was asked for.
    #[error("negative stride {stride} in dimension {dim} where contiguous memory is needed")]
    NegativeStride {
        /// The dimension.
        dim: usize,
        /// Its stride, in elements.
        stride: i64,
    },
    /// Strides that are not compact row-major where contiguous memory was asked for.
    #[error("strides {strides:?} of shape {shape:?} are not compact row-major")]
    NotContiguous {
        /// The shape.
        shape: Vec<i64>,
        /// The strides, in elements.
        strides: Vec<i64>,
    },
    /// A data address (pointer plus byte offset) that is not a multiple of the element's
    /// alignment.
    #[error("data address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The address of the first element.
        addr: u64,
        /// The alignment the element type needs.
        align: usize,
    },
    /// The elements the shape, strides and offset reach lie outside the owner's bytes.
    #[error("the tensor reaches bytes {first}..{end} of an allocation of {size} bytes")]
    OutOfBounds {
        /// First byte reached, relative to the allocation (may be negative).
        first: i128,
        /// One past the last byte reached.
        end: i128,
        /// The allocation's size.
        size: usize,
    },
    /// Sizes or offsets that overflow.
    #[error("size overflow in {0}")]
    Overflow(&'static str),
    /// A mutable view of a tensor its producer marked read-only.
    #[error(
        "the tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY) and a mutable view was asked"
    )]
    ReadOnly,
    /// A DLPack `stream` argument that means nothing for CUDA (0, negative but -1, or a value
    /// from 3 to 0xffff, which no stream handle can have).
    #[error(
        "invalid DLPack stream argument {0} for CUDA (0 is ambiguous; -1, 1, 2 or a stream handle, a pointer)"
    )]
    InvalidStream(i64),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for cudars_core::Error {
    /// A wrapped `cuda-core` error comes back as itself; any other refusal is carried as
    /// `cudars_core::Error::Crate`, so `?` works in a function returning `cudars_core::Result`.
    fn from(error: Error) -> Self {
        match error {
            Error::Cuda(core) => core,
            other => {
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-dlpack", other, None))
            }
        }
    }
}
