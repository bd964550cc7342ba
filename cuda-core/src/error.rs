//! The error type of `cuda-core`, and the error every crate of the workspace converts into.
//!
//! # One error for a program that uses several crates
//!
//! Each crate keeps its own precise error type (`cudars_mempool::PoolError`,
//! `cudars_xfer::Error`, `cudars_graph::Error`, `cudars_nccl::Error`), and each of them converts into
//! this crate's [`Error`] with `From`. So a function that calls `cuda-core`, `cuda-mempool`,
//! `cuda-xfer` and `cuda-graph` returns [`cudars_core::Result`](Result) and uses `?` on all of
//! them, whichever of those crates the program depends on.
//!
//! Why this shape rather than conversions between every pair of crates: every crate already
//! depends on `cuda-core` and on nothing else of the workspace, so the conversions live in
//! the crate that owns the error (`impl From<PoolError> for cudars_core::Error` is in
//! `cuda-mempool`), and no crate gains a dependency on a sibling. Pairwise conversions
//! (`PoolError` into `cudars_graph::Error`, and so on) would need each crate to depend on the
//! others, or a feature per pair that users must know to turn on.
//!
//! What a conversion keeps:
//! - A wrapped `cuda-core` error comes back as itself (`cudars_xfer::Error::Cuda(e)` and
//!   `cudars_graph::Error::Cuda(e)` become `e`), so matching on [`Error::Driver`] works as before.
//! - Anything else becomes [`Error::Crate`]: a [`CrateError`] naming the crate, holding the
//!   original error (get it back with [`Error::downcast_ref`]), displaying exactly as it does,
//!   with the same [`source`](std::error::Error::source) chain, and with the driver error
//!   (its `CUresult`) at its root, if any, in [`Error::driver`].
//!
//! Code that has a crate's error type fixed (the body of a `cudars_graph::capture` returns
//! `cudars_graph::Result`) converts a sibling's error through this one:
//! `pool.malloc(..).map_err(cudars_core::Error::from)?`.
//!
//! ```
//! use cudars_core::{CrateError, DriverError, Error};
//!
//! // What an upper crate does in its `From` impl: keep the error and its driver root.
//! #[derive(Debug)]
//! struct MyError;
//! impl std::fmt::Display for MyError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("my crate failed")
//!     }
//! }
//! impl std::error::Error for MyError {}
//!
//! let e = Error::Crate(CrateError::new("my-crate", MyError, None));
//! assert_eq!(e.to_string(), "my crate failed");
//! assert!(e.downcast_ref::<MyError>().is_some());
//! assert!(e.driver().is_none());
//! ```

use std::ffi::CStr;
use std::fmt;
use std::sync::Arc;

use cudars_sys::CUresult;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A driver call returned something other than `CUDA_SUCCESS`.
///
/// Carries the `CUresult` code, its name and message as the driver gives them
/// (`cuGetErrorName` / `cuGetErrorString`), and the entry point that failed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The raw `CUresult` value.
    pub code: u32,
    /// `CUDA_ERROR_...`, from `cuGetErrorName`.
    pub name: &'static str,
    /// The driver's description, from `cuGetErrorString`.
    pub message: &'static str,
    /// The driver entry point that returned the error (`cuMemAlloc`, ...).
    pub call: &'static str,
}

impl DriverError {
    /// Builds the error for `result` returned by `call`, asking the driver for its name and
    /// message (falls back to a generic text when the driver cannot say).
    pub fn new(result: CUresult, call: &'static str) -> Self {
        let (name, message) = describe(result);
        DriverError {
            code: result.0,
            name,
            message,
            call,
        }
    }

    /// The code as a `CUresult`.
    pub fn result(&self) -> CUresult {
        CUresult(self.code)
    }

    /// `true` for `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        self.result() == CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }

    /// `true` for `CUDA_ERROR_NOT_READY` (work still pending: not a failure for queries).
    pub fn is_not_ready(&self) -> bool {
        self.result() == CUresult::CUDA_ERROR_NOT_READY
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DriverError({} = {} in {}: {})",
            self.code, self.name, self.call, self.message
        )
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({}): {}",
            self.call, self.name, self.code, self.message
        )
    }
}

impl std::error::Error for DriverError {}

fn describe(result: CUresult) -> (&'static str, &'static str) {
    let Ok(driver) = cudars_sys::driver() else {
        return (
            "CUDA_ERROR_UNKNOWN_CODE",
            "no driver loaded to describe this code",
        );
    };
    let mut name = std::ptr::null();
    let mut message = std::ptr::null();
    // SAFETY: valid out-pointers; the driver returns pointers to static strings or leaves them.
    let name_ok = unsafe { driver.cuGetErrorName(result, &mut name) }.is_ok_and(|r| r.is_success());
    // SAFETY: as above.
    let msg_ok =
        unsafe { driver.cuGetErrorString(result, &mut message) }.is_ok_and(|r| r.is_success());
    let to_str = |p: *const std::ffi::c_char| {
        // SAFETY: on success both point to NUL-terminated strings with static storage in
        // libcuda, which the process-wide driver keeps loaded for the life of the process.
        unsafe { CStr::from_ptr(p) }
            .to_str()
            .unwrap_or("(not UTF-8)")
    };
    (
        if name_ok && !name.is_null() {
            to_str(name)
        } else {
            "CUDA_ERROR_UNKNOWN_CODE"
        },
        if msg_ok && !message.is_null() {
            to_str(message)
        } else {
            "unrecognised error code"
        },
    )
}

/// Every failure of `cuda-core`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The driver library could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] cudars_sys::LoadError),
    /// The installed driver lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(cudars_sys::MissingSymbol),
    /// The installed driver is older than the CUDA version a call needs (an entry point whose
    /// ABI, or a feature that, it does not have yet).
    #[error("{symbol} needs a CUDA {needed} driver; the installed driver supports CUDA {driver}")]
    DriverTooOld {
        /// The entry point or feature.
        symbol: &'static str,
        /// The driver's version.
        driver: crate::version::CudaVersion,
        /// The version needed.
        needed: crate::version::CudaVersion,
    },
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A device ordinal outside `0..count`.
    #[error("invalid device ordinal {ordinal}: {count} device(s) present")]
    InvalidDevice {
        /// The ordinal asked for (for `Device::from_raw`, the handle's value; a negative
        /// handle reads as `usize::MAX`).
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// An object of one device was used with another (a stream of device 0 with memory of
    /// device 1, say).
    #[error("{what} belongs to device {actual}, expected device {expected}")]
    WrongDevice {
        /// What was passed.
        what: &'static str,
        /// The ordinal of the device the operation needs.
        expected: usize,
        /// The ordinal of the device the object belongs to.
        actual: usize,
    },
    /// A size computation overflowed (`count * size_of::<T>()`, offset + length, ...).
    #[error("size overflow: {0}")]
    SizeOverflow(&'static str),
    /// Source and destination of a copy differ in size.
    #[error("size mismatch in {op}: destination holds {dst} bytes, source {src}")]
    SizeMismatch {
        /// The operation.
        op: &'static str,
        /// Destination bytes.
        dst: usize,
        /// Source bytes.
        src: usize,
    },
    /// A view reaching past the end of its allocation.
    #[error("range {offset}..{offset}+{len} is outside an allocation of {size} bytes")]
    OutOfRange {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the allocation.
        size: usize,
    },
    /// An argument the driver would reject, caught before calling it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Elapsed time asked of an event created with timing disabled (the default of every
    /// way of making one but `Event::timed`, `.timing(true)` and `Stream::record_timed`).
    #[error("event was created with timing disabled (the default); elapsed time needs events made with Event::timed, Stream::record_timed or .timing(true)")]
    TimingDisabled,
    /// An event was used before it was recorded.
    #[error("event has not been recorded")]
    EventNotRecorded,
    /// The operation does not exist in this CUDA version.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A host callback panicked; the panic was caught and did not unwind into the driver.
    #[error("host callback panicked: {0}")]
    CallbackPanicked(String),
    /// A use of reused memory could not be ordered after its earlier owner's work (see
    /// [`memory::Handover`](crate::memory::Handover)); nothing was issued.
    #[error("cannot order this use of the memory after its earlier owner's work: {0}")]
    Unordered(String),
    /// The thread that waits for the device on behalf of futures
    /// ([`crate::completion`]) is not available (it could not be started).
    #[error("completion reactor: {0}")]
    Reactor(String),
    /// Sharing memory between processes failed ([`crate::ipc`]); the
    /// [`IpcError`] names the likely cause.
    #[cfg(unix)]
    #[error(transparent)]
    Ipc(#[from] IpcError),
    /// An error of a crate built on `cuda-core` (`cudars_mempool::PoolError`, `cudars_xfer::Error`,
    /// `cudars_graph::Error`, ...), converted with `From` so that `?` works across crates
    /// (see the [module documentation](self)). Displays as the original error does.
    #[error(transparent)]
    Crate(CrateError),
    /// An optional library (cuBLAS, cuSOLVER, ...) could not be opened.
    #[error("{library} could not be opened; tried {tried}")]
    LibraryNotFound {
        /// Which library.
        library: &'static str,
        /// Paths tried, with reasons.
        tried: String,
    },
    /// The device's context is lost (a kernel faulted: a sticky error), or the handle used
    /// belongs to a context generation that a [`Device::reset_after_fault`] ended. Every
    /// call on the device returns this until the reset; see [`crate::health`].
    ///
    /// [`Device::reset_after_fault`]: crate::Device::reset_after_fault
    #[error("the CUDA context of device {device} is lost{}", match .first {
        Some(first) => format!(" ({first}); reset it with Device::reset_after_fault"),
        None => " (it was reset); make the handle again".to_string(),
    })]
    ContextLost {
        /// The device's ordinal.
        device: usize,
        /// The sticky error that lost the context (`None` when a healthy context was
        /// reset under the handle). Boxed: [`Error`] stays within 64 bytes.
        first: Option<Box<DriverError>>,
    },
    /// Something waited longer than its bound.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl Error {
    /// The driver error inside, if this is one, or the driver error at the root of a
    /// converted [`Error::Crate`] (its `CUresult` is [`DriverError::result`]).
    pub fn driver(&self) -> Option<&DriverError> {
        match self {
            Error::Driver(d) => Some(d),
            Error::ContextLost { first, .. } => first.as_deref(),
            Error::Crate(c) => c.driver(),
            _ => None,
        }
    }

    /// `true` for [`Error::ContextLost`], and for a sticky driver error (see
    /// [`crate::health::STICKY`]) as itself or at the root of a converted [`Error::Crate`]:
    /// a call made where this crate could not tell the device returns the driver's error.
    pub fn is_context_lost(&self) -> bool {
        match self {
            Error::ContextLost { .. } => true,
            Error::Driver(d) => crate::health::is_sticky(d.result()),
            Error::Crate(c) => c
                .driver()
                .is_some_and(|d| crate::health::is_sticky(d.result())),
            _ => false,
        }
    }

    /// The error of another crate that this one was converted from ([`Error::Crate`]), as
    /// its own type: `err.downcast_ref::<cudars_mempool::PoolError>()`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Crate(c) => c.downcast_ref(),
            _ => None,
        }
    }

    /// `true` when the driver reported `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn is_out_of_memory(&self) -> bool {
        self.driver().is_some_and(DriverError::is_out_of_memory)
    }
}

/// The error of a crate built on `cuda-core`, carried in [`Error::Crate`].
///
/// It displays as the original error, has the same
/// [`source`](std::error::Error::source) chain, and keeps the driver error at the root of
/// the original, if there is one ([`CrateError::driver`]). Clones share the original; two
/// `CrateError`s are equal when they share it.
///
/// One pointer wide, so it does not make [`Error`] (and every `Result` of the workspace)
/// larger.
#[derive(Clone)]
pub struct CrateError(Arc<CrateErrorInner>);

struct CrateErrorInner {
    crate_name: &'static str,
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
    driver: Option<DriverError>,
}

impl CrateError {
    /// Wraps `error` of the crate `crate_name` (`"cuda-mempool"`, ...); `driver` is the
    /// driver error at its root, if any.
    pub fn new<E: std::error::Error + Send + Sync + 'static>(
        crate_name: &'static str,
        error: E,
        driver: Option<DriverError>,
    ) -> Self {
        CrateError(Arc::new(CrateErrorInner {
            crate_name,
            error: Box::new(error),
            driver,
        }))
    }

    /// The crate the error came from.
    pub fn crate_name(&self) -> &'static str {
        self.0.crate_name
    }

    /// The original error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0.error
    }

    /// The original error as its own type, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.error.downcast_ref::<E>()
    }

    /// The driver error at the root of the original error, if any.
    pub fn driver(&self) -> Option<&DriverError> {
        self.0.driver.as_ref()
    }
}

impl fmt::Debug for CrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrateError")
            .field("crate", &self.0.crate_name)
            .field("error", &self.0.error)
            .finish()
    }
}

impl fmt::Display for CrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.error, f)
    }
}

impl std::error::Error for CrateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.error.source()
    }
}

impl PartialEq for CrateError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CrateError {}

impl From<cudars_sys::MissingSymbol> for Error {
    /// [`Error::DriverTooOld`] when the driver is older than the entry point's ABI, else
    /// [`Error::MissingSymbol`].
    fn from(missing: cudars_sys::MissingSymbol) -> Self {
        if missing.is_driver_too_old() {
            Error::DriverTooOld {
                symbol: missing.name,
                driver: crate::version::CudaVersion(missing.driver),
                needed: crate::version::CudaVersion(missing.needed),
            }
        } else {
            Error::MissingSymbol(missing)
        }
    }
}

/// Why an IPC operation failed: [`Error::Ipc`].
#[cfg(unix)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IpcError {
    /// The handle was exported by this process: the driver opens handles of other
    /// processes only (inside one process, use the memory directly).
    #[error("IPC handle was exported by this process; the driver only opens handles of other processes (use the memory directly){}", driver_suffix(.driver))]
    SameProcess {
        /// The driver's refusal, when the driver was asked (`None`: caught before).
        driver: Option<DriverError>,
    },
    /// The handle is already open in this process ([`IpcMapping::open`](crate::ipc::IpcMapping::open)); the driver maps a
    /// handle once per process. Use [`IpcMapping::open_shared`](crate::ipc::IpcMapping::open_shared) to share the open mapping.
    #[error("IPC handle is already open in this process; the driver maps a handle once per process (use IpcMapping::open_shared)")]
    AlreadyOpen,
    /// The driver refused the handle: it is corrupted, or stale (the exporter freed the
    /// memory or exited).
    #[error("IPC handle refused: corrupted, or stale (the exporter freed the memory or exited): {driver}")]
    InvalidHandle {
        /// The driver's error.
        driver: DriverError,
    },
    /// The memory lives on a device the importing device cannot access (no peer access
    /// between them).
    #[error("IPC memory is on a device the importing device cannot reach (peer access): {driver}")]
    PeerAccess {
        /// The driver's error.
        driver: DriverError,
    },
    /// Shareable memory of one device mapped for a device that cannot access it.
    #[error("shareable memory is on device {memory}; device {requested} has no peer access to it")]
    WrongDevice {
        /// The ordinal of the device holding the memory.
        memory: usize,
        /// The ordinal of the device asked to map it.
        requested: usize,
    },
    /// The memory cannot be exported this way (says why).
    #[error("memory cannot be exported: {0}")]
    NotExportable(String),
    /// Sending or receiving over the Unix socket failed.
    #[error("IPC socket: {message} ({kind:?})")]
    Socket {
        /// The I/O error's kind.
        kind: std::io::ErrorKind,
        /// The I/O error's text.
        message: String,
    },
    /// The peer sent something other than what was expected (no descriptor, a short
    /// message).
    #[error("IPC protocol: {0}")]
    Protocol(String),
}

#[cfg(unix)]
fn driver_suffix(driver: &Option<DriverError>) -> String {
    driver.map(|d| format!(": {d}")).unwrap_or_default()
}

#[cfg(unix)]
impl From<std::io::Error> for IpcError {
    fn from(e: std::io::Error) -> Self {
        IpcError::Socket {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

#[cfg(unix)]
impl From<rustix::io::Errno> for IpcError {
    fn from(e: rustix::io::Errno) -> Self {
        IpcError::from(std::io::Error::from(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_converted_error_does_not_make_error_larger() {
        assert_eq!(
            std::mem::size_of::<CrateError>(),
            std::mem::size_of::<usize>()
        );
        // The largest variants before `Crate` existed hold a `String` and a `&str`.
        assert!(
            std::mem::size_of::<Error>() <= 64,
            "{}",
            std::mem::size_of::<Error>()
        );
    }
}
