//! The error type of `cuda-graph`.
//!
//! [`Error`] converts into `cudars_core::Error` ([`Error::Cuda`] as itself, any other as
//! `cudars_core::Error::Crate` keeping the driver error at its root), as the errors of
//! `cuda-mempool` and `cuda-xfer` do: a function returning `cudars_core::Result` uses `?` on
//! all four crates, and no crate depends on a sibling for it (`cudars_core::error` explains
//! the choice). Inside a capture body, whose type is `cudars_graph::Result`, a sibling's error
//! goes through `cudars_core::Error`: `.map_err(cudars_core::Error::from)?`.
//!
//! ```no_run
//! use cudars_core::{Device, DevicePtr, Stream};
//! use cudars_graph::CaptureMode;
//! use std::sync::Arc;
//!
//! fn replay_twice(pool: &Arc<cudars_mempool::DevicePool>) -> cudars_core::Result<Vec<u8>> {
//!     let dev = Device::new(0)?;                                       // cuda-core
//!     let stream = Stream::new(&dev)?;
//!     let a: DevicePtr = pool.malloc_shared(&stream, 4096)?.into();    // cuda-mempool
//!     let b = cudars_xfer::to_device(&dev, &[7u8; 4096])?;               // cuda-xfer
//!     let exec = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
//!         // a sibling's error inside a body: through cudars_core::Error
//!         let tmp: DevicePtr = pool
//!             .malloc_shared(&stream, 4096)
//!             .map_err(cudars_core::Error::from)?
//!             .into();
//!         drop(tmp);
//!         a.copy_from_device_async(b.as_ptr(), s)?;
//!         Ok(())
//!     })?                                                              // cuda-graph
//!     .instantiate()?;
//!     exec.launch(&stream)?;
//!     exec.launch(&stream)?;
//!     let mut out = vec![0u8; 4096];
//!     a.copy_to_host(&mut out)?;
//!     Ok(out)
//! }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # replay_twice(&Arc::new(cudars_mempool::DevicePool::new_driver()?))?; Ok(()) }
//! ```

use std::fmt;

use cudars_core::graph::{CaptureStatus, UpdateRefusal};

use crate::builder::extent::Extent;
use crate::builder::node::NodeId;

/// Any error, boxed: what [`Error::other`] wraps.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which capture an error is about: the driver's capture id, and the stream and device it
/// began on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaptureId {
    /// The capture sequence's id, unique in the process (`cuStreamGetCaptureInfo`).
    pub id: u64,
    /// The driver's id of the stream the capture began on (`cuStreamGetId`; not a handle,
    /// not a pool's stream key).
    pub stream_id: u64,
    /// The ordinal of the stream's device.
    pub device: usize,
}

impl fmt::Display for CaptureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream capture #{} (begun on stream {} of device {})",
            self.id, self.stream_id, self.device
        )
    }
}

/// Every failure of `cuda-graph`.
///
/// Errors about a capture name it ([`CaptureId`]) and say what became of it: after any error
/// the capture has been ended, so the stream works normally again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `cuda-core` call failed.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),

    /// A capture was asked of a stream that is already being captured.
    #[error(
        "the stream (device {device}) is already part of stream capture #{capture}; end that \
         capture before beginning another"
    )]
    AlreadyCapturing {
        /// The stream's device.
        device: usize,
        /// The id of the capture the stream is part of.
        capture: u64,
    },

    /// The capture was invalidated by an operation that is illegal while a stream is captured
    /// (a synchronize, a call on the legacy null stream, a synchronous copy or allocation,
    /// ...). It has been ended and produced no graph.
    #[error(
        "{capture} was invalidated by an operation that is illegal during stream capture \
         (synchronize, work on the legacy null stream, a synchronous copy, ...); the capture \
         has been ended and produced no graph ({source})"
    )]
    Invalidated {
        /// The capture.
        capture: CaptureId,
        /// The driver's answer when the capture was ended
        /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
        source: cudars_core::Error,
    },

    /// The body of [`capture`](crate::capture) returned an error. The capture has been ended
    /// and its partial graph discarded; `status` says whether the body's error had also
    /// invalidated it (an illegal call inside the capture) or not (the body's own failure).
    #[error(
        "{capture} failed inside its body ({status} at the failure); the capture has been \
         ended and its partial graph discarded: {source}"
    )]
    Body {
        /// The capture.
        capture: CaptureId,
        /// The capture's status when the body failed.
        status: CaptureStatus,
        /// What the body returned.
        source: Box<Error>,
    },

    /// Ending a capture failed for another reason than invalidation (a forked stream that
    /// was not joined back, `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`; the end called from another
    /// thread, `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`, ...). The capture produced no graph.
    #[error("ending {capture} failed; it produced no graph: {source}")]
    End {
        /// The capture.
        capture: CaptureId,
        /// The driver's error.
        source: cudars_core::Error,
    },

    /// A graph under construction refused a node, or an executable graph refused a node
    /// update, before the driver was called (a node of another graph, a use of a graph
    /// allocation out of order, ...).
    #[error(transparent)]
    Build(#[from] BuildError),

    /// The driver refused to update an executable graph ([`GraphExec::try_update`]): the
    /// reason, and the node it blamed when it named one. The executable graph is unchanged.
    ///
    /// [`GraphExec::try_update`]: crate::GraphExec::try_update
    #[error("{}", describe_refusal(*refusal, *node, *from))]
    UpdateRefused {
        /// Why.
        refusal: cudars_core::graph::UpdateRefusal,
        /// The node of the new graph the driver blamed, when it named one this crate built.
        node: Option<NodeId>,
        /// For a changed edge, the node at its other end.
        from: Option<NodeId>,
    },

    /// Instantiation failed; `node` is the node the driver blamed, when it named one this
    /// crate built (a host node in a graph instantiated for device launch, say).
    #[error("instantiating the graph failed{}: {source}", match node { Some(n) => format!(" at {n}"), None => String::new() })]
    Instantiate {
        /// The node the driver blamed.
        node: Option<NodeId>,
        /// The driver's error.
        source: cudars_core::Error,
    },

    /// An error of the caller's own, returned from a capture body (see [`Error::other`]).
    #[error(transparent)]
    Other(BoxError),
}

impl Error {
    /// Wraps any error (a capture body's own failure) as [`Error::Other`].
    ///
    /// ```
    /// let e = cudars_graph::Error::other("bad input");
    /// assert_eq!(e.to_string(), "bad input");
    /// ```
    pub fn other(error: impl Into<BoxError>) -> Error {
        Error::Other(error.into())
    }

    /// The `cuda-core` error at the root of this one, if any (looking inside
    /// [`Error::Body`], [`Error::Invalidated`] and [`Error::End`]).
    pub fn core(&self) -> Option<&cudars_core::Error> {
        match self {
            Error::Cuda(e)
            | Error::Invalidated { source: e, .. }
            | Error::End { source: e, .. }
            | Error::Instantiate { source: e, .. } => Some(e),
            Error::Body { source, .. } => source.core(),
            _ => None,
        }
    }

    /// The driver error at the root of this one, if any: its `name` says what the driver
    /// refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for a synchronize inside a capture,
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for work on the legacy null stream, ...).
    pub fn driver(&self) -> Option<&cudars_core::DriverError> {
        self.core().and_then(cudars_core::Error::driver)
    }

    /// The capture this error is about, if any.
    pub fn capture(&self) -> Option<CaptureId> {
        match self {
            Error::Invalidated { capture, .. }
            | Error::Body { capture, .. }
            | Error::End { capture, .. } => Some(*capture),
            _ => None,
        }
    }
}

impl From<Error> for cudars_core::Error {
    /// A wrapped `cuda-core` error ([`Error::Cuda`]) comes back as itself; any other failure
    /// is carried as `cudars_core::Error::Crate` (same message, same `source` chain, the driver
    /// error at its root in `cudars_core::Error::driver`), so `?` works in a function that
    /// returns `cudars_core::Result` (see the module documentation).
    fn from(error: Error) -> Self {
        match error {
            Error::Cuda(core) => core,
            other => {
                let driver = other.driver().copied();
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-graph", other, driver))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> CaptureId {
        CaptureId {
            id: 7,
            stream_id: 3,
            device: 0,
        }
    }

    #[test]
    fn body_errors_name_the_capture_and_keep_the_root_cause() {
        let root = cudars_core::Error::InvalidArgument("x".into());
        let e = Error::Body {
            capture: id(),
            status: CaptureStatus::Invalidated,
            source: Box::new(Error::Cuda(root.clone())),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("stream capture #7 (begun on stream 3 of device 0)"),
            "{text}"
        );
        assert!(
            text.contains("capture invalidated at the failure"),
            "{text}"
        );
        assert!(text.ends_with("invalid argument: x"), "{text}");
        assert_eq!(e.core(), Some(&root));
        assert_eq!(e.capture(), Some(id()));
        assert!(e.driver().is_none());
    }

    #[test]
    fn converts_into_cuda_core_error_keeping_the_capture_error() {
        let root = cudars_core::Error::InvalidArgument("x".into());
        assert_eq!(cudars_core::Error::from(Error::Cuda(root.clone())), root);
        let e = Error::End {
            capture: id(),
            source: root.clone(),
        };
        let text = e.to_string();
        let core = cudars_core::Error::from(e);
        assert_eq!(core.to_string(), text);
        assert!(matches!(
            core.downcast_ref::<Error>(),
            Some(Error::End { capture, .. }) if *capture == id()
        ));
        let source = std::error::Error::source(&core).map(ToString::to_string);
        assert_eq!(source, Some(root.to_string()));
    }

    #[test]
    fn other_errors_wrap_anything() {
        let e = Error::other(std::io::Error::other("disk"));
        assert_eq!(e.to_string(), "disk");
        assert!(e.core().is_none() && e.capture().is_none());
    }
}

/// A node refused before the driver was called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A dependency (or a node to update) that belongs to another graph.
    #[error("{node} belongs to another graph than graph #{graph}")]
    ForeignNode {
        /// The node passed.
        node: NodeId,
        /// The graph it was passed to.
        graph: u64,
    },
    /// A condition handle made for another graph.
    #[error("the condition handle was made for graph #{handle_graph}, not graph #{graph}")]
    ForeignHandle {
        /// The graph the handle belongs to.
        handle_graph: u64,
        /// The graph of the conditional node.
        graph: u64,
    },
    /// A graph allocation used in another graph than the one that allocates it.
    #[error("the graph allocation of {alloc} is used in graph #{graph}")]
    ForeignAllocation {
        /// The allocation node.
        alloc: NodeId,
        /// The graph it was used in.
        graph: u64,
    },
    /// A kind of node a conditional body cannot hold.
    #[error("a conditional node's body cannot hold a {kind}")]
    NotAllowedInBody {
        /// What was refused.
        kind: &'static str,
    },
    /// A use of a graph allocation that does not depend on its allocation node.
    #[error("a node using the graph allocation of {alloc} must depend on that allocation node")]
    NotOrderedAfterAllocation {
        /// The allocation node.
        alloc: NodeId,
    },
    /// A use of a graph allocation after its free node, or a second free.
    #[error("the graph allocation of {alloc} was freed by {free}")]
    AllocationFreed {
        /// The allocation node.
        alloc: NodeId,
        /// The free node.
        free: NodeId,
    },
    /// A free node that does not depend on a node that uses the allocation.
    #[error("the free node must depend on {user}, which uses the allocation")]
    UseNotBeforeFree {
        /// The node using the allocation.
        user: NodeId,
    },
    /// A copy or memset of zero bytes.
    #[error("a {kind} of zero bytes")]
    Empty {
        /// The node kind.
        kind: &'static str,
    },
    /// A memset whose destination is not a whole number of aligned elements.
    #[error("memset of {element}-byte elements: the destination (address {addr:#x}, {len} bytes) must be aligned to and a multiple of {element} bytes")]
    Misaligned {
        /// Element size.
        element: usize,
        /// Destination address.
        addr: u64,
        /// Destination length.
        len: usize,
    },
    /// A host-to-host copy.
    #[error("a graph copy needs at least one device end")]
    HostToHost,
    /// A pitched copy whose rows do not fit the pitch, or whose slices do not fit the rows.
    #[error("pitched copy: the {end} (pitch {pitch} bytes, {rows} rows per slice) cannot hold rows of {} bytes, {} per slice", extent.width, extent.height)]
    BadPitch {
        /// `"destination"` or `"source"`.
        end: &'static str,
        /// Its pitch.
        pitch: usize,
        /// Its rows per slice.
        rows: usize,
        /// The copy's extent.
        extent: Extent,
    },
    /// A node update of a node that is not in this executable graph.
    #[error("{node} is not a node of this executable graph")]
    NotInExecutable {
        /// The node.
        node: NodeId,
    },
    /// A node update of the wrong kind (a memset's parameters for a kernel node, say).
    #[error("{node} is a {actual}, not a {expected}")]
    WrongKind {
        /// The node.
        node: NodeId,
        /// The kind the update is for.
        expected: &'static str,
        /// The node's kind.
        actual: &'static str,
    },
    /// A body closure left another builder in its place (swapped builders).
    #[error("a conditional body's builder was replaced inside its closure")]
    BodyReplaced,
}

/// The text of [`Error::UpdateRefused`].
pub(crate) fn describe_refusal(
    refusal: UpdateRefusal,
    node: Option<NodeId>,
    from: Option<NodeId>,
) -> String {
    let mut text = format!("the executable graph cannot be updated: {refusal}");
    match (node, from) {
        (Some(n), Some(f)) => text.push_str(&format!(" (at {n}, edge from {f})")),
        (Some(n), None) => text.push_str(&format!(" (at {n})")),
        _ => {}
    }
    text
}

/// The error of an operand on another device than the graph's.
pub(crate) fn wrong_device(
    what: &'static str,
    expected: cudars_core::Device,
    actual: cudars_core::Device,
) -> Error {
    cudars_core::Error::WrongDevice {
        what,
        expected: expected.ordinal(),
        actual: actual.ordinal(),
    }
    .into()
}
