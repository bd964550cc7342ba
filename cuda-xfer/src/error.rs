//! The error type of `cuda-xfer`.

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-xfer`. Bad input is caught before any driver call and changes
/// nothing; driver failures arrive as [`Error::Cuda`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `cuda-core` call failed (driver errors, wrong device, ...).
    #[error(transparent)]
    Cuda(#[from] cuda_core::Error),
    /// `count * size_of::<T>()` (or an offset plus a length) does not fit in `usize`.
    #[error("size overflow: {count} elements of {elem_size} bytes")]
    SizeOverflow {
        /// Number of elements asked for.
        count: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// A byte count that is not a whole number of elements of the type asked for.
    #[error("{bytes} bytes is not a whole number of {elem_size}-byte elements")]
    NotWholeElements {
        /// The byte count.
        bytes: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// A device address that is not aligned for the element type.
    #[error("device address {addr:#x} is not aligned to {align} bytes for the element type")]
    Misaligned {
        /// The address.
        addr: u64,
        /// The alignment the element type needs.
        align: usize,
    },
    /// An element type of size zero where elements are counted from bytes.
    #[error("zero-sized element types cannot be transferred")]
    ZeroSizedElement,
    /// Source and destination of a copy hold different numbers of elements.
    #[error("length mismatch in {op}: destination holds {dst} elements, source {src}")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Destination elements.
        dst: usize,
        /// Source elements.
        src: usize,
    },
    /// A 2-D shape that does not fit the buffer it describes.
    #[error("a {rows}x{cols} matrix with leading dimension {ld} needs {needed} elements, the buffer holds {len}")]
    ShapeMismatch {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Leading dimension (elements between the starts of consecutive rows, or columns).
        ld: usize,
        /// Elements the shape needs.
        needed: usize,
        /// Elements the buffer holds.
        len: usize,
    },
    /// A leading dimension smaller than the row (row-major) or column (column-major) it spans.
    #[error("leading dimension {ld} is smaller than the {inner} elements it must span")]
    BadLeadingDimension {
        /// The leading dimension given.
        ld: usize,
        /// The row or column length.
        inner: usize,
    },
    /// A staging configuration that cannot work (zero-sized chunks, no slots, ...).
    #[error("invalid staging configuration: {0}")]
    InvalidConfig(String),
    /// A staging worker panicked; the panic was caught and the transfer abandoned safely.
    #[error("a staging worker panicked: {0}")]
    WorkerPanicked(String),
}

impl Error {
    /// The `cuda-core` error inside, if this is one.
    pub fn cuda(&self) -> Option<&cuda_core::Error> {
        match self {
            Error::Cuda(e) => Some(e),
            _ => None,
        }
    }
}
