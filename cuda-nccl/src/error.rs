//! The error type of `cuda-nccl`.

use std::fmt;
use std::time::Duration;

use cudars_nccl_sys::{ncclResult_t, Nccl};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An NCCL call returned something other than `ncclSuccess`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The raw `ncclResult_t` value.
    pub code: u32,
    /// The NCCL entry point that returned it.
    pub call: &'static str,
    /// `ncclGetErrorString` of the code, plus `ncclGetLastError` when NCCL had more to say.
    pub message: String,
}

impl NcclError {
    /// The name of the code (`ncclSystemError`, ...).
    pub fn name(&self) -> &'static str {
        result_name(ncclResult_t(self.code))
    }

    /// `true` for `ncclRemoteError`: a peer failed or went away.
    pub fn is_remote(&self) -> bool {
        ncclResult_t(self.code) == ncclResult_t::ncclRemoteError
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({}): {}",
            self.call,
            self.name(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for NcclError {}

/// The name of an `ncclResult_t` value as `nccl.h` spells it.
pub fn result_name(r: ncclResult_t) -> &'static str {
    match r.0 {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown ncclResult_t",
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libnccl` could not be opened (lists every path tried and the variable to set).
    #[error(transparent)]
    Load(#[from] cudars_nccl_sys::LoadError),
    /// The loaded NCCL lacks an entry point the bindings know (it is older than the header).
    #[error(transparent)]
    MissingSymbol(#[from] cudars_nccl_sys::MissingSymbol),
    /// An NCCL call failed.
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// A CUDA call through `cuda-core` failed.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// A stream or buffer of another device than the communicator's.
    #[error("{what} belongs to device {actual}, the communicator to device {expected}")]
    WrongDevice {
        /// What was passed.
        what: &'static str,
        /// The communicator's device.
        expected: usize,
        /// The device of what was passed.
        actual: usize,
    },
    /// A buffer smaller than the call needs.
    #[error("{what} holds {len} bytes, the call needs {needed}")]
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Bytes the call reads or writes.
        needed: usize,
        /// Bytes the buffer holds.
        len: usize,
    },
    /// A buffer whose address is not aligned for the element type.
    #[error("{what} at {address:#x} is not aligned to {align} bytes for the element type")]
    Misaligned {
        /// Which buffer.
        what: &'static str,
        /// Its device address.
        address: u64,
        /// The alignment the element type needs.
        align: usize,
    },
    /// A collective's send and receive ranges overlap without being NCCL's in-place form
    /// (the same address, or for `all_gather` / `reduce_scatter` this rank's block of the
    /// larger buffer). NCCL leaves partial overlap undefined; nothing was issued.
    #[error(
        "the send range {send:#x}+{send_len} and the receive range {recv:#x}+{recv_len} overlap \
         without being the in-place form; NCCL forbids partial overlap"
    )]
    Overlap {
        /// Device address of the bytes the call reads.
        send: u64,
        /// How many bytes it reads.
        send_len: usize,
        /// Device address of the bytes the call writes.
        recv: u64,
        /// How many bytes it writes.
        recv_len: usize,
    },
    /// The communicator has calls in an NCCL group that is still open (on another thread,
    /// or, for [`Communicator::wait`](crate::Communicator::wait), on this one): NCCL issues
    /// them when that group ends, and the communicator cannot be used meanwhile. Nothing was
    /// done.
    #[error(
        "{what}: the communicator has calls in an NCCL group that is still open (on another \
         thread, or for `wait` on this one); end that group first"
    )]
    HeldByGroup {
        /// What was refused.
        what: &'static str,
    },
    /// [`Communicator::wait`](crate::Communicator::wait) on the per-thread default stream,
    /// while the communicator has work on the per-thread default stream of another thread:
    /// that handle names the calling thread's own stream, which is not where the work is.
    /// Wait on the thread that issued it (before moving the communicator), or use an
    /// explicit [`Stream`](cudars_core::Stream).
    #[error(
        "the per-thread default stream names each thread's own stream, and this \
         communicator's work is on another thread's; wait for it on that thread"
    )]
    ForeignPerThreadStream,
    /// A size computation overflowed.
    #[error("size overflow: {0}")]
    SizeOverflow(&'static str),
    /// A rank, root, peer, world size or device list NCCL cannot take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The work did not finish within the timeout; the communicator was aborted.
    #[error("{what} did not finish within {waited:?}; the communicator was aborted")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
    /// NCCL reported an asynchronous error (a peer failed, a network error); the communicator
    /// was aborted.
    #[error("asynchronous NCCL error, communicator aborted: {0}")]
    AsyncError(NcclError),
    /// The communicator was aborted earlier (by a timeout or an async error) and cannot be used.
    #[error("the communicator was aborted and cannot be used any more")]
    Aborted,
    /// An I/O operation of the launcher failed.
    #[error("{during}: {source}")]
    Io {
        /// What was being done.
        during: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The rendezvous that hands the unique id to every rank failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
}

impl Error {
    /// `true` when the device's CUDA context is lost (a kernel faulted; see
    /// `cudars_core::health`): the communicator's work will never finish, and every call on
    /// it returns this error. The process resets the device or restarts.
    pub fn is_context_lost(&self) -> bool {
        matches!(self, Error::Cuda(e) if e.is_context_lost())
    }
}

impl From<&'static cudars_nccl_sys::LoadError> for Error {
    fn from(e: &'static cudars_nccl_sys::LoadError) -> Self {
        Error::Load(e.clone())
    }
}

/// The process-wide NCCL library.
pub(crate) fn library() -> Result<&'static Nccl> {
    Ok(cudars_nccl_sys::nccl()?)
}

/// `Ok` for `ncclSuccess`; otherwise an [`NcclError`] for `call` with NCCL's message.
pub(crate) fn check(r: ncclResult_t, call: &'static str) -> Result<()> {
    if r.is_success() {
        Ok(())
    } else {
        Err(Error::Nccl(nccl_error(r, call, None)))
    }
}

/// Builds the error for `r`, asking NCCL for its message (and the communicator's last error).
pub(crate) fn nccl_error(
    r: ncclResult_t,
    call: &'static str,
    comm: Option<cudars_nccl_sys::ncclComm_t>,
) -> NcclError {
    let mut message = String::new();
    if let Ok(nccl) = cudars_nccl_sys::nccl() {
        // SAFETY: ncclGetErrorString takes any value and returns a static C string or null.
        if let Ok(p) = unsafe { nccl.ncclGetErrorString(r) } {
            message = c_text(p);
        }
        if let Some(comm) = comm {
            // SAFETY: `comm` is a live communicator handle of the caller; the result is a
            // C string owned by NCCL, copied at once.
            if let Ok(p) = unsafe { nccl.ncclGetLastError(comm) } {
                let last = c_text(p);
                if !last.is_empty() {
                    message = format!("{message} ({last})");
                }
            }
        }
    }
    if message.is_empty() {
        message = "no message from NCCL".into();
    }
    NcclError {
        code: r.0,
        call,
        message,
    }
}

fn c_text(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns NUL-terminated strings that live at least until the next call.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

impl From<Error> for cudars_core::Error {
    /// A wrapped `cuda-core` error ([`Error::Cuda`]) comes back as itself; any other failure
    /// is carried as `cudars_core::Error::Crate` (same message, same `source` chain), as the
    /// errors of `cuda-mempool`, `cuda-xfer` and `cuda-graph` are: a function returning
    /// `cudars_core::Result` uses `?` on all of them.
    fn from(error: Error) -> Self {
        match error {
            Error::Cuda(core) => core,
            other => {
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-nccl", other, None))
            }
        }
    }
}

/// The rendezvous failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// A variable the job needs is not set.
    #[error("{name} is not set ({hint})")]
    MissingVar {
        /// The variable.
        name: &'static str,
        /// What sets it.
        hint: &'static str,
    },
    /// A variable is set to something unusable.
    #[error("{name}={value:?}: {why}")]
    BadVar {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Rank 0 could not listen on the port.
    #[error("rank 0 could not listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Some ranks did not check in before the deadline.
    #[error("ranks {missing:?} of {world_size} never reached the rendezvous within {waited:?}")]
    PeerNeverCame {
        /// The ranks that did not come.
        missing: Vec<usize>,
        /// The world size.
        world_size: usize,
        /// How long rank 0 waited.
        waited: Duration,
    },
    /// A rank believes in another world size.
    #[error("rank {rank} says the world has {got} ranks, rank 0 says {expected}")]
    WrongWorldSize {
        /// The rank that disagrees.
        rank: usize,
        /// Rank 0's world size.
        expected: usize,
        /// The other rank's.
        got: usize,
    },
    /// Two processes claim one rank.
    #[error("two processes claim rank {rank}")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// A rank outside `1..world_size` checked in.
    #[error("a peer claims rank {rank}, outside 1..{world_size}")]
    RankOutOfRange {
        /// The rank claimed.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// Rank 0 could not be reached, or did not answer, before the deadline.
    #[error("rank 0 at {addr} did not answer within {waited:?} (last error: {last})")]
    RootUnreachable {
        /// `MASTER_ADDR:MASTER_PORT`.
        addr: String,
        /// How long this rank tried.
        waited: Duration,
        /// The last connection error.
        last: String,
    },
    /// Rank 0 refused this rank; its reason.
    #[error("rank 0 refused the rendezvous: {reason}")]
    Rejected {
        /// What rank 0 said.
        reason: String,
    },
    /// A peer spoke something other than this protocol.
    #[error("rendezvous protocol error: {0}")]
    Protocol(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_follow_the_header() {
        assert_eq!(result_name(ncclResult_t::ncclSuccess), "ncclSuccess");
        assert_eq!(
            result_name(ncclResult_t::ncclRemoteError),
            "ncclRemoteError"
        );
        assert_eq!(result_name(ncclResult_t::ncclInProgress), "ncclInProgress");
        assert_eq!(result_name(ncclResult_t(99)), "unknown ncclResult_t");
    }

    #[test]
    fn nccl_error_display_names_call_and_code() {
        let e = NcclError {
            code: 6,
            call: "ncclAllReduce",
            message: "remote process exited".into(),
        };
        assert!(e.is_remote());
        let s = e.to_string();
        assert!(
            s.contains("ncclAllReduce") && s.contains("ncclRemoteError"),
            "{s}"
        );
    }
}
