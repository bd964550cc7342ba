//! Stream capture: the closure form ([`capture`], [`capture_with`]) and the explicit guard
//! ([`capture_begin`] → [`Capture`] → [`Capture::end`]), both of which always end the capture.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Deref;

use cudars_core::graph::{self as raw, CaptureInfo, CaptureMode, CaptureStatus};
use cudars_core::sys::CUresult;
use cudars_core::{Event, Stream};

use crate::error::{CaptureId, Error, Result};
use crate::graph::Graph;

/// `stream`'s capture status and the id of the capture it is part of, if any.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_graph::CaptureStatus;
/// let stream = Stream::new(&Device::new(0)?)?;
/// assert_eq!(cudars_graph::capture_status(&stream)?.status, CaptureStatus::None);
/// # Ok::<(), cudars_graph::Error>(())
/// ```
pub fn capture_status(stream: &Stream) -> Result<CaptureInfo> {
    Ok(raw::capture_info(stream)?)
}

/// Captures the work `body` issues on `stream` into a [`Graph`] (the closure form).
///
/// `body` receives the open [`Capture`], which derefs to the captured stream: pass it wherever
/// a `&Stream` is wanted, and use [`Capture::fork`] / [`Capture::join`] to bring other streams
/// into the same graph.
///
/// The capture is always ended:
/// - `body` returns `Ok`: the graph is returned (or [`Error::Invalidated`] if something in
///   the body broke the capture without reporting an error).
/// - `body` returns `Err`: the capture is ended, the partial graph destroyed, and the error
///   comes back as [`Error::Body`] naming the capture and its status at the failure (an
///   illegal call such as a synchronize inside the capture shows as `capture invalidated`).
/// - `body` panics: the capture is ended and the partial graph destroyed while unwinding, then
///   the panic continues.
///
/// In every case the stream is out of capture mode afterwards and works normally.
///
/// ```no_run
/// use cudars_core::{memory::DevicePtr, Device, Stream};
/// use cudars_graph::CaptureMode;
///
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let buf = DevicePtr::alloc(&dev, 4096)?;
/// let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
///     buf.memset_u32_async(7, s)?;
///     Ok(())
/// })?;
/// let exec = graph.instantiate()?;
/// exec.launch(&stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cudars_graph::Error>(())
/// ```
pub fn capture(
    stream: &Stream,
    mode: CaptureMode,
    body: impl FnOnce(&Capture<'_>) -> Result<()>,
) -> Result<Graph> {
    capture_with(stream, mode, body).map(|(graph, ())| graph)
}

/// [`capture`] whose body also returns a value, handed back beside the graph.
pub fn capture_with<R>(
    stream: &Stream,
    mode: CaptureMode,
    body: impl FnOnce(&Capture<'_>) -> Result<R>,
) -> Result<(Graph, R)> {
    let capture = capture_begin(stream, mode)?;
    // A panic in `body` unwinds through `capture`, whose Drop ends the capture.
    match body(&capture) {
        Ok(value) => capture.end().map(|graph| (graph, value)),
        Err(error) => {
            let id = capture.id;
            let status = raw::capture_info(stream)
                .map(|i| i.status)
                .unwrap_or(CaptureStatus::Invalidated);
            capture.abandon();
            Err(Error::Body {
                capture: id,
                status,
                source: Box::new(error),
            })
        }
    }
}

/// Begins capturing `stream` and returns the guard that ends it (CuPy's
/// `Graph.capture_begin`; [`Capture::end`] is `capture_end`).
///
/// A guard dropped without [`Capture::end`] (a forgotten end, an early return with `?`, a
/// panic) ends the capture and destroys the partial graph, so the stream is never left
/// capturing.
///
/// The legacy null stream cannot be captured (a `cuda-core` invalid-argument error); a stream
/// that is already capturing gives [`Error::AlreadyCapturing`]. Neither begins anything.
///
/// ```no_run
/// use cudars_core::{memory::DevicePtr, Device, Stream};
/// use cudars_graph::CaptureMode;
///
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let buf = DevicePtr::alloc(&dev, 1024)?;
/// let capture = cudars_graph::capture_begin(&stream, CaptureMode::Global)?;
/// buf.memset_async(0, &capture)?;
/// let graph = capture.end()?;
/// assert_eq!(graph.node_count()?, 1);
/// # Ok::<(), cudars_graph::Error>(())
/// ```
pub fn capture_begin(stream: &Stream, mode: CaptureMode) -> Result<Capture<'_>> {
    // The legacy stream (handles 0 and 1) is refused by `begin_capture` below.
    let legacy = (stream.raw() as usize) <= 1;
    // The stream's id is asked before the capture begins: the driver refuses
    // `cuStreamGetId` on a capturing stream.
    let stream_id = if legacy {
        0
    } else {
        let before = raw::capture_info(stream)?;
        if let (CaptureStatus::Active | CaptureStatus::Invalidated, Some(capture)) =
            (before.status, before.id)
        {
            return Err(Error::AlreadyCapturing {
                device: stream.device().ordinal(),
                capture,
            });
        }
        raw::stream_id(stream)?
    };
    // SAFETY: the `Capture` guard always ends the capture (on error and panic too), and
    // graphs keep the memory of safe view operations alive; `Capture` documents that raw
    // launches issued inside it must keep their memory alive themselves.
    unsafe { raw::begin_capture(stream, mode) }?;
    let mut capture = Capture {
        stream,
        mode,
        id: CaptureId {
            id: 0,
            stream_id,
            device: stream.device().ordinal(),
        },
        events: RefCell::new(Vec::new()),
        ended: false,
        _same_thread: PhantomData,
    };
    // From here the guard ends the capture if identifying it fails.
    capture.id.id = raw::capture_info(stream)?.id.unwrap_or(0);
    Ok(capture)
}

/// An open capture of one stream; see [`capture_begin`] and [`capture`].
///
/// Derefs to the captured [`Stream`], so it can be passed wherever work is issued. Ends the
/// capture when dropped if [`Capture::end`] was not called.
///
/// Neither `Send` nor `Sync`: the driver requires a capture in global or thread-local mode
/// to be ended on the thread that began it, and the guard keeps that true for every mode.
#[derive(Debug)]
#[must_use = "dropping the guard ends the capture and discards the graph; call `end()`"]
pub struct Capture<'s> {
    stream: &'s Stream,
    mode: CaptureMode,
    id: CaptureId,
    /// Events of forks and joins, kept until the capture ends.
    events: RefCell<Vec<Event>>,
    ended: bool,
    _same_thread: PhantomData<*const ()>,
}

impl<'s> Capture<'s> {
    /// The captured stream.
    pub fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// The capture mode it began with.
    pub fn mode(&self) -> CaptureMode {
        self.mode
    }

    /// The capture's id, stream and device.
    pub fn id(&self) -> CaptureId {
        self.id
    }

    /// The capture's current status: `Active`, or `Invalidated` after an illegal call.
    pub fn status(&self) -> Result<CaptureStatus> {
        Ok(raw::capture_info(self.stream)?.status)
    }

    /// Brings `other` into this capture: records an event on the captured stream and makes
    /// `other` wait on it, so work issued to `other` afterwards is captured into the same graph,
    /// after the work captured so far. Join it back with [`Capture::join`] before the capture
    /// ends (the driver refuses to end a capture with an unjoined stream).
    ///
    /// ```no_run
    /// # use cudars_core::{memory::DevicePtr, Device, Stream};
    /// # use cudars_graph::CaptureMode;
    /// # let dev = Device::new(0)?;
    /// # let (main, side) = (Stream::new(&dev)?, Stream::new(&dev)?);
    /// # let (a, b) = (DevicePtr::alloc(&dev, 64)?, DevicePtr::alloc(&dev, 64)?);
    /// let graph = cudars_graph::capture(&main, CaptureMode::ThreadLocal, |cap| {
    ///     cap.fork(&side)?;
    ///     a.memset_async(1, cap)?;   // these two run concurrently in the graph
    ///     b.memset_async(2, &side)?;
    ///     cap.join(&side)?;
    ///     Ok(())
    /// })?;
    /// # Ok::<(), cudars_graph::Error>(())
    /// ```
    pub fn fork(&self, other: &Stream) -> Result<()> {
        self.link(self.stream, other)
    }

    /// Makes the captured stream wait for the work captured on `other` (forked earlier with
    /// [`Capture::fork`], or with events of your own): records an event on `other` and makes
    /// the captured stream wait on it.
    pub fn join(&self, other: &Stream) -> Result<()> {
        self.link(other, self.stream)
    }

    fn link(&self, from: &Stream, to: &Stream) -> Result<()> {
        let event = Event::new(&from.device())?;
        event.record(from)?;
        to.wait_event(&event)?;
        self.events.borrow_mut().push(event);
        Ok(())
    }

    /// Ends the capture and returns its graph (CuPy's `Graph.capture_end`).
    ///
    /// [`Error::Invalidated`] when an illegal call broke the capture, [`Error::End`] for
    /// other refusals (an unjoined fork, ...); either way the capture is over and the stream
    /// works normally.
    pub fn end(mut self) -> Result<Graph> {
        self.ended = true;
        match raw::end_capture(self.stream) {
            Ok(handle) => Ok(Graph::from_capture(handle, self.id)),
            Err(e) => Err(self.end_error(e)),
        }
    }

    fn end_error(&self, e: cudars_core::Error) -> Error {
        let invalidated = e
            .driver()
            .is_some_and(|d| d.result() == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        if invalidated {
            Error::Invalidated {
                capture: self.id,
                source: e,
            }
        } else {
            Error::End {
                capture: self.id,
                source: e,
            }
        }
    }

    /// Ends the capture, if the stream is still capturing, and discards whatever it recorded.
    fn abandon(mut self) {
        self.discard();
    }

    fn discard(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        let capturing = raw::capture_info(self.stream)
            .map(|i| i.status != CaptureStatus::None)
            .unwrap_or(true);
        if capturing {
            // The graph (if any) drops at once; an error means there was none to drop.
            let _ = raw::end_capture(self.stream);
        }
    }
}

impl Deref for Capture<'_> {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        self.stream
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        self.discard();
    }
}
