//! [`Handover`]: the one ordering rule for reused memory.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::event::Event;
use crate::graph::{self, CaptureStatus};
use crate::stream::{Stream, StreamKind};

/// The point at which a block of reused memory passed to its current owner: uses outside
/// the allocation stream are ordered after it.
///
/// Memory that a pool hands from one owner to the next in stream order (a block freed on
/// stream A and reused on A at once; a block of A's cache given to stream B after B was made
/// to wait for A's fence on the device; `cuMemAllocAsync` memory that the driver's pool
/// reuses the same ways) is safe to use on its *allocation stream*: the earlier owner's work
/// comes first in that stream's order. Any other use is not ordered by anything: a
/// synchronous call runs on the legacy default stream at once, and another stream does not
/// wait for the allocation stream. Without more, the earlier owner's kernel may then write
/// over the new owner's data.
///
/// **The rule:** every use of such memory by a safe API comes after the earlier owner's
/// work. The owner of the memory keeps a [`Handover`] made at the allocation; every safe use
/// goes through it before it issues anything:
///
/// | use | what the hand-over does, once per block |
/// | --- | --- |
/// | on the allocation stream | nothing (stream order) |
/// | on another stream ([`DeviceAlloc::record_stream`](super::DeviceAlloc::record_stream)) | records a fence on the allocation stream and makes the other stream wait for it on the device (`cuEventRecord` + `cuStreamWaitEvent`) |
/// | a synchronous call ([`DeviceAlloc::prepare_synchronous_use`](super::DeviceAlloc::prepare_synchronous_use)) | the host waits for that fence (`cuEventSynchronize`) |
///
/// A fence recorded on the allocation stream at (or after) the allocation covers the earlier
/// owner's work whatever way the block came: the earlier work was queued on that stream
/// before, or the stream was made to wait for it before the allocation returned. Once the
/// fence is seen complete the hand-over is over, and every later use costs one atomic load.
///
/// During a CUDA graph capture: a use on a stream that is captured into the same graph as
/// the allocation stream gets a dependency edge in the graph (a fence recorded in the
/// capture); a use on a stream that is captured while the allocation stream is not waits
/// for the earlier owner on the host (the graph runs only after the capture ends); a use
/// that can be ordered neither way is refused with [`Error::Unordered`], and nothing is
/// issued.
///
/// Made by the memory's owner at the allocation, with the stream the block was allocated
/// on. `Send` and `Sync`.
///
/// ```no_run
/// use cudars_core::memory::Handover;
/// use cudars_core::{Device, Stream};
///
/// let dev = Device::new(0)?;
/// let alloc_stream = Stream::builder(&dev).non_blocking(true).build()?;
/// let other = Stream::builder(&dev).non_blocking(true).build()?;
/// let handover = Handover::new(&alloc_stream)?;
/// handover.order_stream(&other)?; // `other` now waits for what preceded the allocation
/// handover.wait_host()?;          // and so does the host, for a synchronous call
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct Handover {
    stream: Stream,
    /// Set once the fence has been seen complete: nothing is left to order after.
    done: AtomicBool,
    /// The fence on the allocation stream, recorded at the first use outside it.
    fence: Mutex<Option<Event>>,
}

/// Whether `stream` is being captured, and the capture's id: asks the driver only when a
/// capture may be running on it (an external stream, or while `cuda-core` captures).
fn capture_of(stream: &Stream) -> Result<Option<u64>> {
    let may = match stream.kind() {
        StreamKind::LegacyNull => false,
        StreamKind::External => true,
        StreamKind::Owned | StreamKind::PerThread => graph::captures_in_progress(),
    };
    if !may {
        return Ok(None);
    }
    let info = graph::capture_info(stream)?;
    Ok(match info.status {
        CaptureStatus::None => None,
        // An invalidated capture is still a capture: nothing may be ordered through it.
        CaptureStatus::Active | CaptureStatus::Invalidated => Some(info.id.unwrap_or(0)),
    })
}

impl Handover {
    /// The hand-over of a block allocated on `stream`. On the per-thread default stream,
    /// which names a different stream on every thread, the fence is recorded now, on the
    /// allocating thread; elsewhere it is recorded at the first use outside `stream`.
    pub fn new(stream: &Stream) -> Result<Handover> {
        let h = Handover {
            stream: stream.clone(),
            done: AtomicBool::new(false),
            fence: Mutex::new(None),
        };
        // During a capture the fence would be a node of the graph, never complete: then no
        // fence, and uses outside the stream are refused (see `order_stream`).
        if stream.kind() == StreamKind::PerThread && capture_of(stream)?.is_none() {
            let event = Event::new(&stream.device())?;
            event.record(stream)?;
            *h.lock() = Some(event);
        }
        Ok(h)
    }

    /// A hand-over that is already over: memory no earlier owner's work can touch (fresh
    /// from the driver, or whose earlier work is known to be complete).
    pub fn completed(stream: &Stream) -> Handover {
        Handover {
            stream: stream.clone(),
            done: AtomicBool::new(true),
            fence: Mutex::new(None),
        }
    }

    /// The stream the block was allocated on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Whether every earlier owner's work is known to be complete.
    #[inline]
    pub fn is_complete(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Event>> {
        self.fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Orders `stream` after the earlier owners' work: nothing when `stream` is the
    /// allocation stream or the hand-over is over; otherwise `stream` waits on the device
    /// for a fence on the allocation stream. An error means nothing was ordered, and the
    /// caller must not issue its work.
    #[inline]
    pub fn order_stream(&self, stream: &Stream) -> Result<()> {
        // Two per-thread default streams compare equal on different threads: only the
        // fence (recorded on the allocating thread) orders them.
        if self.is_complete()
            || (*stream == self.stream && self.stream.kind() != StreamKind::PerThread)
        {
            return Ok(());
        }
        self.order_stream_slow(stream)
    }

    #[inline(never)]
    fn order_stream_slow(&self, stream: &Stream) -> Result<()> {
        if self.stream.kind() == StreamKind::PerThread && self.lock().is_none() {
            // Its handle names the calling thread's stream: only the fence recorded by the
            // allocating thread orders other streams after it, and there is none.
            return Err(Error::Unordered(
                "memory allocated on the per-thread default stream during a capture can be \
                 used only on that stream"
                    .into(),
            ));
        }
        // A per-thread stream's handle names the calling thread's stream: never ask about
        // it from here. Its fence exists (checked above), so it was not captured.
        let own = if self.stream.kind() == StreamKind::PerThread {
            None
        } else {
            capture_of(&self.stream)?
        };
        let other = capture_of(stream)?;
        match (own, other) {
            (None, None) => {
                let mut fence = self.lock();
                let event = match fence.take() {
                    Some(e) => e,
                    None => {
                        let e = Event::new(&self.stream.device())?;
                        e.record(&self.stream)?;
                        e
                    }
                };
                let waited = stream.wait_event(&event);
                // Seen complete: the hand-over is over for every later use.
                if waited.is_ok() && event.query().unwrap_or(false) {
                    self.done.store(true, Ordering::Release);
                } else {
                    *fence = Some(event);
                }
                waited
            }
            // The graph runs only after its capture ends: waiting on the host now orders
            // every replay after the earlier owner.
            (None, Some(_)) => self.wait_host(),
            (Some(a), Some(b)) if a == b => {
                // One graph: a dependency edge from this point of the allocation stream.
                let e = Event::new(&self.stream.device())?;
                e.record(&self.stream)?;
                stream.wait_event(&e)
            }
            (Some(_), _) => Err(Error::Unordered(format!(
                "memory allocated on a stream being captured is used on stream {:#x}, which is \
                 not captured into the same graph; order that stream through the capture \
                 (an event recorded in it) or use the memory on its allocation stream",
                stream.raw() as usize
            ))),
        }
    }

    /// Blocks the host until the earlier owners' work is done: what a synchronous call does
    /// before it uses the memory. Refused ([`Error::Unordered`]) while the allocation stream
    /// is being captured, whose fence would only exist in the graph.
    pub fn wait_host(&self) -> Result<()> {
        if self.is_complete() {
            return Ok(());
        }
        let mut fence = self.lock();
        if self.is_complete() {
            return Ok(());
        }
        let event = match fence.take() {
            Some(e) => e,
            None => {
                if self.stream.kind() == StreamKind::PerThread {
                    return Err(Error::Unordered(
                        "memory allocated on the per-thread default stream during a capture \
                         can be used only on that stream"
                            .into(),
                    ));
                }
                if capture_of(&self.stream)?.is_some() {
                    return Err(Error::Unordered(
                        "a synchronous call on memory whose allocation stream is being \
                         captured cannot wait for it; use an asynchronous call on that stream"
                            .into(),
                    ));
                }
                let e = Event::new(&self.stream.device())?;
                e.record(&self.stream)?;
                e
            }
        };
        match event.synchronize() {
            Ok(()) => {
                self.done.store(true, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                *fence = Some(event);
                Err(e)
            }
        }
    }
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handover")
            .field("stream", &self.stream)
            .field("complete", &self.is_complete())
            .finish()
    }
}

// Compile-time check of the documented auto traits.
const _: fn() = || {
    fn check<T: Send + Sync>() {}
    check::<Handover>();
};
