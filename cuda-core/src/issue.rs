//! Issuing work on a stream, as a type: [`Issue`].
//!
//! A safe call that issues work on a stream decides things by the stream's capture status:
//! it keeps the memory it uses alive in the graph while the stream is captured, orders the
//! stream after a reused block's earlier owner, refuses a borrowed host buffer. A capture
//! begun on another thread between that decision and the issue would capture work whose
//! memory nobody keeps alive. [`Stream::issue`] checks that the stream belongs to the device
//! the work is for and takes the capture gate; the [`Issue`] it returns holds the gate until
//! it drops, and it is what marking memory ([`DevicePtr::record_stream`]) and launching
//! ([`Function::launch`]) take. So every launcher marks and launches inside one gate: one
//! that forgets the gate does not compile.
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device, Module, Stream};
//! # fn demo(module: &Module) -> cudars_core::Result<()> {
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let buf = DevicePtr::alloc(&dev, 4096)?;
//! let kernel = module.function("fill")?;
//! let issue = stream.issue(dev)?; // the stream's device checked, the gate held
//! buf.record_stream(&issue)?;     // marked inside the gate
//! let mut addr = buf.as_raw();
//! // SAFETY (of this example): `fill(u32*)` writes 1,024 u32s.
//! unsafe { kernel.launch(&issue, (4, 1, 1), (256, 1, 1), 0, &mut [(&mut addr as *mut u64).cast()]) }?;
//! drop(issue);                    // a capture begun elsewhere may start now
//! # Ok(()) }
//! ```
//!
//! [`DevicePtr::record_stream`]: crate::memory::DevicePtr::record_stream
//! [`Function::launch`]: crate::Function::launch

use crate::capture_gate::{issue_guard, IssueGuard};
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::sys::CUstream;
use crate::Device;

/// Work being issued on one stream: the stream, checked to belong to the device the work is
/// for, and the capture gate, held until this value drops (a capture begun through
/// [`begin_capture`](crate::graph::begin_capture), and so `cuda-graph`, on another thread
/// waits for it). Made by [`Stream::issue`]; taken by everything that marks memory as used
/// by the stream or queues work that uses it. Nesting costs nothing.
///
/// Bind it to a name and keep it until the work is issued: a temporary (`record_stream(&
/// stream.issue(dev)?)`) drops at the end of its statement, and a capture may then begin
/// before the work is issued. While you hold one, do not block on other threads and do not
/// begin a capture: a capture that another thread begins waits for this `Issue`, and two
/// threads that each hold one and each begin a capture wait for each other. Leaking one
/// (`mem::forget`) keeps every later capture of other threads waiting.
///
/// Not `Send`: the gate is the thread's.
///
/// ```compile_fail
/// fn needs_send<T: Send>(_: T) {}
/// let dev = cudars_core::Device::new(0).unwrap();
/// let stream = cudars_core::Stream::new(&dev).unwrap();
/// needs_send(stream.issue(dev).unwrap());
/// ```
#[derive(Debug)]
#[must_use = "the gate covers the issue only while the Issue lives"]
pub struct Issue<'s> {
    stream: &'s Stream,
    _gate: IssueGuard,
}

impl<'s> Issue<'s> {
    /// The stream the work goes to.
    #[inline]
    pub fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// The stream's device (the device the work is for).
    #[inline]
    pub fn device(&self) -> Device {
        self.stream.device()
    }

    /// The stream's raw handle, for the driver or library call that issues the work.
    #[inline]
    pub fn raw(&self) -> CUstream {
        self.stream.raw()
    }

    /// [`Error::WrongDevice`] naming `what` unless the work is for `device` (the one check:
    /// a kernel of a module, a buffer, a communicator of another device).
    #[inline]
    pub fn expect_device(&self, what: &'static str, device: Device) -> Result<()> {
        same_device(what, device, self.device())
    }
}

impl Stream {
    /// Begins issuing work for `device` on this stream: [`Error::WrongDevice`] unless the
    /// stream belongs to `device`, else an [`Issue`] that holds the capture gate until it
    /// drops. Mark the memory the work uses with it, then issue the work with it.
    #[inline]
    pub fn issue(&self, device: Device) -> Result<Issue<'_>> {
        self.expect_device(device)?;
        Ok(Issue {
            stream: self,
            _gate: issue_guard(),
        })
    }

    /// Begins issuing work that may use memory of any device (a prefetch of managed memory,
    /// a peer copy) on this stream: an [`Issue`] for the stream's own device, holding the
    /// capture gate until it drops.
    #[inline]
    pub fn issue_any(&self) -> Issue<'_> {
        Issue {
            stream: self,
            _gate: issue_guard(),
        }
    }

    /// [`Error::WrongDevice`] unless this stream belongs to `device`: the check every call
    /// that takes a stream and a device's object makes (the workspace's one spelling of it).
    #[inline]
    pub fn expect_device(&self, device: Device) -> Result<()> {
        same_device("stream", device, self.device())
    }
}

/// [`Error::WrongDevice`] naming `what` unless `actual` is `expected`.
#[inline]
fn same_device(what: &'static str, expected: Device, actual: Device) -> Result<()> {
    if expected == actual {
        // Both handles must be of the device's live context generation (a reset ended the
        // other ones: their addresses and handles may now name the new context's objects).
        crate::health::usable(&expected)?;
        crate::health::usable(&actual)
    } else {
        Err(Error::WrongDevice {
            what,
            expected: expected.ordinal(),
            actual: actual.ordinal(),
        })
    }
}
