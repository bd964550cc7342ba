//! The error type of `cuda-xfer`.
//!
//! [`Error`] converts into `cudars_core::Error` (a wrapped `cuda-core` error as itself, any
//! other as `cudars_core::Error::Crate`), as the errors of `cuda-mempool` and `cuda-graph` do:
//! a function returning `cudars_core::Result` uses `?` on all of them, and no crate depends on
//! a sibling for it (`cudars_core::error` explains the choice).
//!
//! ```no_run
//! use cudars_core::{Device, Stream};
//!
//! // `?` on cuda-core and cuda-xfer calls alike (cuda-mempool and cuda-graph too: see the
//! // example in `cudars_graph::error`, which chains all four).
//! fn round_trip(data: &[u32]) -> cudars_core::Result<Vec<u32>> {
//!     let dev = Device::new(0)?;                     // cuda-core
//!     let stream = Stream::new(&dev)?;
//!     let on_device = cudars_xfer::to_device(&dev, data)?; // cuda-xfer
//!     on_device.as_ptr().memset_async(0, &stream)?;  // cuda-core
//!     stream.synchronize()?;
//!     Ok(cudars_xfer::to_host(&on_device)?)            // cuda-xfer
//! }
//! # fn main() -> cudars_core::Result<()> { round_trip(&[1, 2, 3]).map(drop) }
//! ```

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-xfer`. Bad input is caught before any driver call and changes
/// nothing; driver failures arrive as [`Error::Cuda`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `cuda-core` call failed (driver errors, wrong device, ...).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
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
    /// A transfer between host memory and the device on a stream that is being captured
    /// into a graph. The capture would record the host address, and every launch of the
    /// graph would read (or write) it long after this call gave the buffer back; so nothing
    /// is issued, and the capture goes on unharmed. Copy through device memory inside
    /// captures (`DevicePtr::copy_from_device_async`), whose owners the graph keeps alive.
    #[error("{op}: the stream is being captured into a graph, whose launches would use the host buffer after the transfer gave it back; nothing was issued")]
    Capturing {
        /// The transfer.
        op: &'static str,
    },
}

impl Error {
    /// The `cuda-core` error inside, if this is one.
    pub fn cuda(&self) -> Option<&cudars_core::Error> {
        match self {
            Error::Cuda(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for cudars_core::Error {
    /// A wrapped `cuda-core` error comes back as itself; any other failure is carried as
    /// `cudars_core::Error::Crate` (same message, same `source` chain), so `?` works in a
    /// function that returns `cudars_core::Result` (see the module documentation).
    fn from(error: Error) -> Self {
        match error {
            Error::Cuda(core) => core,
            other => {
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-xfer", other, None))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capturing_stream_is_its_own_error() {
        let e = Error::Capturing {
            op: "copy_to_device_on_stream",
        };
        let text = e.to_string();
        assert!(text.starts_with("copy_to_device_on_stream: "), "{text}");
        assert!(text.contains("captured"), "{text}");
        assert!(e.cuda().is_none());
        let core = cudars_core::Error::from(e);
        assert!(matches!(
            core.downcast_ref::<Error>(),
            Some(Error::Capturing {
                op: "copy_to_device_on_stream"
            })
        ));
    }

    #[test]
    fn converts_into_cuda_core_error() {
        let root = cudars_core::Error::InvalidArgument("x".into());
        assert_eq!(cudars_core::Error::from(Error::Cuda(root.clone())), root);
        let e = Error::LengthMismatch {
            op: "copy",
            dst: 1,
            src: 2,
        };
        let text = e.to_string();
        let core = cudars_core::Error::from(e);
        assert_eq!(core.to_string(), text);
        assert!(matches!(
            core.downcast_ref::<Error>(),
            Some(Error::LengthMismatch { dst: 1, .. })
        ));
    }
}
