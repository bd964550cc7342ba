//! Events: markers in a stream's work (CuPy's `Event` and `get_elapsed_time`).
//!
//! # The timing rule
//!
//! **Every event is made with timing disabled unless the way it is made says "timed"**:
//!
//! | way of making it | timing |
//! | --- | --- |
//! | [`Event::new`] | off |
//! | [`Event::builder`] … `.build()` | off unless `.timing(true)` |
//! | [`Stream::record(None)`](crate::Stream::record) | off |
//! | [`Event::timed`], [`Stream::record_timed`](crate::Stream::record_timed) | on |
//! | [`Event::open_ipc`] | off (CUDA: interprocess events cannot time) |
//!
//! Most events order work (a stream waits on another, a pool fences a free) and an untimed
//! event is the cheaper kind to record, wait on and query, so that is the default. CuPy's
//! `Event()` and `Stream.record()` make timed events: their Rust spellings are
//! [`Event::timed`] and [`Stream::record_timed`](crate::Stream::record_timed). Asking an
//! untimed event for elapsed time is [`Error::TimingDisabled`], never a wrong number.
//!
//! ```no_run
//! use cudars_core::{Device, Event, Stream};
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let start = Event::timed(&dev)?;
//! let end = Event::timed(&dev)?;
//! start.record(&stream)?;
//! // ... queue work on `stream` ...
//! end.record(&stream)?;
//! end.synchronize()?;
//! println!("took {:?}", Event::elapsed(&start, &end)?);
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudars_sys::{CUevent, CUevent_flags, CUipcEventHandle, CUresult, CU_IPC_HANDLE_SIZE};

use crate::driver::{check, drv};
use crate::error::{Error, Result};
use crate::stream::{with_context, Stream};
use crate::Device;

/// Size of an [`IpcEventHandle`] in bytes.
pub const IPC_HANDLE_BYTES: usize = CU_IPC_HANDLE_SIZE as usize;

struct EventInner {
    raw: CUevent,
    device: Device,
    flags: u32,
    recorded: AtomicBool,
}

// SAFETY: an event handle may be used and destroyed from any thread.
unsafe impl Send for EventInner {}
// SAFETY: as above; every method maps to a thread-safe driver call or an atomic.
unsafe impl Sync for EventInner {}

impl Drop for EventInner {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if crate::release::inside_host_function() {
            // No cuEventDestroy inside a host function: a copy destroys it on the release
            // thread.
            let moved = EventInner {
                raw: std::mem::replace(&mut self.raw, std::ptr::null_mut()),
                device: self.device,
                flags: self.flags,
                recorded: AtomicBool::new(false),
            };
            crate::release::defer(Box::new(moved), crate::release::When::Now);
            return;
        }
        // SAFETY: we created (or opened) the event and this is its last reference; the
        // driver defers destruction until recorded work ends.
        let _ = with_context(self.device, false, |_| unsafe {
            drv!(cuEventDestroy(self.raw))
        });
    }
}

/// A CUDA event of one device.
///
/// Cloning is cheap and shares the event (and its "recorded" state); the event is destroyed
/// when the last clone drops. `Send` and `Sync`: the driver's event calls are thread-safe.
///
/// ```no_run
/// use cudars_core::{Device, Event, Stream};
/// let dev = Device::new(0)?;
/// let producer = Stream::new(&dev)?;
/// let consumer = Stream::new(&dev)?;
/// let ready = Event::new(&dev)?; // timing off (the default): the cheapest kind
/// // ... queue work on `producer` ...
/// ready.record(&producer)?;
/// consumer.wait_event(&ready)?; // `consumer`'s later work waits for it, the host does not
/// let _done: bool = ready.query()?; // asks without blocking
/// ready.synchronize()?; // the host waits
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Event {
    inner: Arc<EventInner>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.inner.raw)
            .field("device", &self.inner.device.ordinal())
            .field("timing", &self.timing_enabled())
            .field("blocking_sync", &self.is_blocking_sync())
            .field("interprocess", &self.is_interprocess())
            .field("recorded", &self.is_recorded())
            .finish()
    }
}

/// Builds an [`Event`] (CuPy's `Event(block, disable_timing, interprocess)`). Defaults:
/// **timing off** (the workspace's one rule, see the [module documentation](self); CuPy's
/// default is on: add `.timing(true)`), spin-waiting, local.
///
/// ```no_run
/// use cudars_core::{Device, Event};
/// let dev = Device::new(0)?;
/// let shared = Event::builder(&dev).interprocess(true).build()?;
/// let timed = Event::builder(&dev).timing(true).blocking_sync(true).build()?;
/// // interprocess events cannot time: this is a clear error, no event is created
/// assert!(Event::builder(&dev).timing(true).interprocess(true).build().is_err());
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use = "a builder does nothing until build() is called"]
pub struct EventBuilder {
    device: Device,
    blocking_sync: bool,
    disable_timing: bool,
    interprocess: bool,
}

impl EventBuilder {
    /// `true`: [`Event::synchronize`] sleeps the thread instead of spinning
    /// (`CU_EVENT_BLOCKING_SYNC`). Default `false`.
    pub fn blocking_sync(mut self, blocking: bool) -> Self {
        self.blocking_sync = blocking;
        self
    }

    /// `true`: the event records timestamps, so [`Event::elapsed`] works. Default `false`
    /// (`CU_EVENT_DISABLE_TIMING`: cheaper, for ordering only).
    pub fn timing(mut self, timing: bool) -> Self {
        self.disable_timing = !timing;
        self
    }

    /// CuPy's spelling of [`timing`](Self::timing)`(!disable)`. Default `true` (timing off).
    pub fn disable_timing(mut self, disable: bool) -> Self {
        self.disable_timing = disable;
        self
    }

    /// `true`: the event can be shared with other processes through
    /// [`Event::ipc_handle`] (`CU_EVENT_INTERPROCESS`); requires timing off (the default).
    /// Default `false`.
    pub fn interprocess(mut self, interprocess: bool) -> Self {
        self.interprocess = interprocess;
        self
    }

    /// Creates the event.
    pub fn build(self) -> Result<Event> {
        let flags = event_flags(self.blocking_sync, self.disable_timing, self.interprocess)?;
        let _ctx = self.device.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: the device's context is current; valid out-pointer.
        unsafe { drv!(cuEventCreate(&mut raw, flags)) }?;
        Ok(Event::from_parts(raw, self.device, flags, false))
    }
}

impl Event {
    fn from_parts(raw: CUevent, device: Device, flags: u32, recorded: bool) -> Event {
        Event {
            inner: Arc::new(EventInner {
                raw,
                device,
                flags,
                recorded: AtomicBool::new(recorded),
            }),
        }
    }

    /// A new event on `device` with **timing off** (the default: the cheapest kind, for
    /// ordering). [`Event::timed`] makes one that can time; [`Event::builder`] gives every
    /// option.
    pub fn new(device: &Device) -> Result<Event> {
        Event::builder(device).build()
    }

    /// A new event on `device` with **timing on** (CuPy's `Event()`).
    pub fn timed(device: &Device) -> Result<Event> {
        Event::builder(device).timing(true).build()
    }

    /// A builder for an event on `device`. Defaults: **timing off**, spin-waiting, local.
    pub fn builder(device: &Device) -> EventBuilder {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        EventBuilder {
            device: *device,
            blocking_sync: false,
            disable_timing: true,
            interprocess: false,
        }
    }

    /// The driver handle.
    #[inline]
    pub fn raw(&self) -> CUevent {
        self.inner.raw
    }

    /// The device the event belongs to.
    #[inline]
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// `true` unless the event was created with timing disabled.
    pub fn timing_enabled(&self) -> bool {
        self.inner.flags & CUevent_flags::CU_EVENT_DISABLE_TIMING.0 == 0
    }

    /// `true` for a blocking-sync event.
    pub fn is_blocking_sync(&self) -> bool {
        self.inner.flags & CUevent_flags::CU_EVENT_BLOCKING_SYNC.0 != 0
    }

    /// `true` for an interprocess event.
    pub fn is_interprocess(&self) -> bool {
        self.inner.flags & CUevent_flags::CU_EVENT_INTERPROCESS.0 != 0
    }

    /// `true` once the event has been recorded on a stream (through this value or a clone).
    /// Events opened from an IPC handle count as recorded: the exporter records them.
    pub fn is_recorded(&self) -> bool {
        self.inner.recorded.load(Ordering::Acquire)
    }

    /// `true` when no other clone of this event exists.
    pub(crate) fn is_unique(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }

    /// Records the event at the current end of `stream`'s work (CuPy's `Event.record`).
    /// A stream of another device is [`Error::WrongDevice`].
    #[inline]
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let inner = &*self.inner;
        stream.expect_device(inner.device)?;
        stream.with_context(|d| {
            // SAFETY: live event and stream of the same device (an implicit stream handle has
            // its device's context current).
            check(
                unsafe { d.cuEventRecord(inner.raw, stream.raw()) }?,
                "cuEventRecord",
            )
        })?;
        if !inner.recorded.load(Ordering::Relaxed) {
            inner.recorded.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Records the event on the thread's current stream of its device
    /// ([`Stream::current`]), as CuPy's `Event.record()` with no stream.
    pub fn record_current(&self) -> Result<()> {
        self.record(&Stream::current(&self.inner.device))
    }

    /// `true` when the recorded work is done, or nothing was recorded (CuPy's
    /// `Event.done`).
    #[inline]
    pub fn query(&self) -> Result<bool> {
        with_context(self.inner.device, false, |d| {
            // SAFETY: a live event.
            let r = unsafe { d.cuEventQuery(self.inner.raw) }?;
            if r == CUresult::CUDA_ERROR_NOT_READY {
                Ok(false)
            } else {
                check(r, "cuEventQuery").map(|()| true)
            }
        })
    }

    /// Same as [`Event::query`].
    pub fn is_done(&self) -> Result<bool> {
        self.query()
    }

    /// Blocks until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        with_context(self.inner.device, false, |_| {
            // SAFETY: a live event.
            unsafe { drv!(cuEventSynchronize(self.inner.raw)) }
        })
    }

    /// Time between two recorded events in milliseconds (`cuEventElapsedTime`, resolution
    /// about 0.5 µs; CuPy's `get_elapsed_time`).
    ///
    /// Errors, before the driver is called: [`Error::WrongDevice`] when the events belong to
    /// different devices, [`Error::TimingDisabled`] when either has timing disabled,
    /// [`Error::EventNotRecorded`] when either was never recorded. The driver reports
    /// `CUDA_ERROR_NOT_READY` when `end` has not completed yet: synchronise it first.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        if start.device() != end.device() {
            return Err(Error::WrongDevice {
                what: "end event",
                expected: start.device().ordinal(),
                actual: end.device().ordinal(),
            });
        }
        if !start.timing_enabled() || !end.timing_enabled() {
            return Err(Error::TimingDisabled);
        }
        if !start.is_recorded() || !end.is_recorded() {
            return Err(Error::EventNotRecorded);
        }
        let mut ms = 0f32;
        let _end_device = crate::health::enter(&end.device())?;
        with_context(start.device(), false, |_| {
            // SAFETY: two live, recorded events of one device; valid out-pointer.
            unsafe {
                drv!(event_elapsed_time as "cuEventElapsedTime" (&mut ms, start.raw(), end.raw()))
            }
        })?;
        Ok(ms)
    }

    /// Time between two recorded events as a [`Duration`]; as [`Event::elapsed_ms`], and
    /// [`Error::InvalidArgument`] when `end` completed before `start` (a negative time).
    pub fn elapsed(start: &Event, end: &Event) -> Result<Duration> {
        duration_from_ms(Event::elapsed_ms(start, end)?)
    }

    /// The handle another process opens with [`Event::open_ipc`] (`cuIpcGetEventHandle`).
    /// Only for events built with `.interprocess(true)`; otherwise
    /// [`Error::InvalidArgument`].
    pub fn ipc_handle(&self) -> Result<IpcEventHandle> {
        if !self.is_interprocess() {
            return Err(Error::InvalidArgument(
                "ipc_handle needs an event built with .interprocess(true)".into(),
            ));
        }
        let mut handle = CUipcEventHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        let _ctx = self.inner.device.bind()?;
        // SAFETY: a live interprocess event; valid out-pointer.
        unsafe { drv!(cuIpcGetEventHandle(&mut handle, self.inner.raw)) }?;
        Ok(IpcEventHandle(handle.reserved.map(|b| b as u8)))
    }

    /// Opens an event another process exported with [`Event::ipc_handle`]
    /// (`cuIpcOpenEventHandle`; Linux only, as CUDA IPC). The event is interprocess with
    /// **timing off** (CUDA's rule for interprocess events), counts as recorded, and is closed on drop. Handles exported by the
    /// same process cannot be opened (the driver's rule).
    pub fn open_ipc(device: &Device, handle: &IpcEventHandle) -> Result<Event> {
        let raw_handle = CUipcEventHandle {
            reserved: handle.0.map(|b| b as std::ffi::c_char),
        };
        let _ctx = device.bind()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: the device's context is current; valid out-pointer; the handle is plain bytes
        // the driver validates.
        unsafe { drv!(cuIpcOpenEventHandle(&mut raw, raw_handle)) }?;
        let flags =
            CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        Ok(Event::from_parts(raw, *device, flags, true))
    }
}

/// The driver flags for a builder's settings, or [`Error::InvalidArgument`] for an
/// interprocess event with timing.
fn event_flags(blocking_sync: bool, disable_timing: bool, interprocess: bool) -> Result<u32> {
    if interprocess && !disable_timing {
        return Err(Error::InvalidArgument(
            "an interprocess event must have timing disabled: add .disable_timing(true)".into(),
        ));
    }
    let mut flags = CUevent_flags::CU_EVENT_DEFAULT.0;
    if blocking_sync {
        flags |= CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
    }
    if disable_timing {
        flags |= CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    }
    if interprocess {
        flags |= CUevent_flags::CU_EVENT_INTERPROCESS.0;
    }
    Ok(flags)
}

/// Milliseconds from the driver as a [`Duration`]; negative or non-finite values are errors.
fn duration_from_ms(ms: f32) -> Result<Duration> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(Error::InvalidArgument(format!(
            "elapsed time {ms} ms: the end event completed before the start event"
        )));
    }
    Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
}

/// An interprocess event handle: 64 opaque bytes to send to another process, which opens
/// the event with [`Event::open_ipc`].
///
/// ```
/// use cudars_core::event::IpcEventHandle;
/// let handle = IpcEventHandle::from_bytes(&[7u8; 64])?;
/// let text = handle.to_hex();
/// assert_eq!(IpcEventHandle::from_hex(&text)?, handle);
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcEventHandle(pub [u8; IPC_HANDLE_BYTES]);

impl fmt::Debug for IpcEventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcEventHandle({})", self.to_hex())
    }
}

impl IpcEventHandle {
    /// The handle's bytes.
    pub fn to_bytes(&self) -> [u8; IPC_HANDLE_BYTES] {
        self.0
    }

    /// A handle from exactly [`IPC_HANDLE_BYTES`] bytes; any other length is
    /// [`Error::InvalidArgument`].
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcEventHandle> {
        let array: [u8; IPC_HANDLE_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an IPC event handle is {IPC_HANDLE_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(IpcEventHandle(array))
    }

    /// The bytes as lowercase hexadecimal (128 characters), e.g. for an environment variable.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut s = String::with_capacity(2 * IPC_HANDLE_BYTES);
        for b in self.0 {
            let _ = write!(s, "{b:02x}");
        }
        s
    }

    /// Parses [`IpcEventHandle::to_hex`]'s output (either case); anything else is
    /// [`Error::InvalidArgument`].
    pub fn from_hex(text: &str) -> Result<IpcEventHandle> {
        let bad = || {
            Error::InvalidArgument(format!(
                "an IPC event handle is {} hex digits, got {:?}",
                2 * IPC_HANDLE_BYTES,
                text
            ))
        };
        let text = text.trim();
        if text.len() != 2 * IPC_HANDLE_BYTES || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; IPC_HANDLE_BYTES];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(IpcEventHandle(bytes))
    }
}

// Recording on and waiting for events, seen from the stream: here beside the event, so that
// the stream module need not know this one.
impl Stream {
    /// Records an event at the current end of the stream's work and returns it (CuPy's
    /// `Stream.record(event=None)`): `event` when given (a clone sharing it), else a new
    /// event with **timing off**, as [`Event::new`] (the workspace's one timing rule, see
    /// [`crate::event`]; CuPy's `record()` makes a timed one: that is
    /// [`record_timed`](Self::record_timed)).
    pub fn record(&self, event: Option<&Event>) -> Result<Event> {
        let event = match event {
            Some(e) => e.clone(),
            None => Event::new(&self.device())?,
        };
        event.record(self)?;
        Ok(event)
    }

    /// Records a new event with **timing on** ([`Event::timed`]) at the current end of the
    /// stream's work and returns it, for [`Event::elapsed`].
    ///
    /// ```no_run
    /// use cudars_core::{Device, Event, Stream};
    /// let dev = Device::new(0)?;
    /// let stream = Stream::new(&dev)?;
    /// let start = stream.record_timed()?;
    /// // ... queue work on `stream` ...
    /// let end = stream.record_timed()?;
    /// end.synchronize()?;
    /// println!("{:?}", Event::elapsed(&start, &end)?);
    /// # Ok::<(), cudars_core::Error>(())
    /// ```
    pub fn record_timed(&self) -> Result<Event> {
        let event = Event::timed(&self.device())?;
        event.record(self)?;
        Ok(event)
    }

    /// Makes later work on this stream wait for `event`'s recorded work (the event may
    /// belong to another device).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // The event's device too, for the whole call: it may be another device, which a
        // reset must not destroy the event of while the driver reads it.
        let _event_device = crate::health::enter(&event.device())?;
        self.with_context(|_| {
            // SAFETY: live stream and event.
            unsafe { drv!(cuStreamWaitEvent(self.raw(), event.raw(), 0)) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_of(blocking: bool, no_timing: bool, ipc: bool) -> Result<u32> {
        event_flags(blocking, no_timing, ipc)
    }

    #[test]
    fn interprocess_needs_timing_disabled() {
        let err = flags_of(false, false, true).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("timing")));
        let flags = flags_of(false, true, true).unwrap();
        assert_eq!(
            flags,
            CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0
        );
    }

    #[test]
    fn timing_is_off_unless_asked_for() {
        // No driver needed: the builder's settings are plain data until build().
        let dev = crate::device::Device::test_only(0);
        let flags = |b: EventBuilder| flags_of(b.blocking_sync, b.disable_timing, b.interprocess);
        let off = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        assert_eq!(flags(Event::builder(&dev)).unwrap(), off);
        assert_eq!(flags(Event::builder(&dev).timing(true)).unwrap(), 0);
        assert_eq!(
            flags(Event::builder(&dev).disable_timing(false)).unwrap(),
            0
        );
        assert_eq!(
            flags(Event::builder(&dev).interprocess(true)).unwrap(),
            off | CUevent_flags::CU_EVENT_INTERPROCESS.0
        );
        assert!(flags(Event::builder(&dev).timing(true).interprocess(true)).is_err());
    }

    #[test]
    fn flags_combine() {
        assert_eq!(flags_of(false, false, false).unwrap(), 0);
        assert_eq!(
            flags_of(true, true, false).unwrap(),
            CUevent_flags::CU_EVENT_BLOCKING_SYNC.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0
        );
    }

    #[test]
    fn ipc_handle_round_trips_through_bytes_and_hex() {
        let mut bytes = [0u8; IPC_HANDLE_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 5) as u8;
        }
        let handle = IpcEventHandle::from_bytes(&bytes).unwrap();
        assert_eq!(handle.to_bytes(), bytes);
        let hex = handle.to_hex();
        assert_eq!(hex.len(), 128);
        assert_eq!(IpcEventHandle::from_hex(&hex).unwrap(), handle);
        assert_eq!(
            IpcEventHandle::from_hex(&hex.to_uppercase()).unwrap(),
            handle
        );
    }

    #[test]
    fn ipc_handle_rejects_wrong_lengths_and_digits() {
        assert!(IpcEventHandle::from_bytes(&[0u8; 63]).is_err());
        assert!(IpcEventHandle::from_bytes(&[0u8; 65]).is_err());
        assert!(IpcEventHandle::from_hex("00").is_err());
        let mut bad = "0".repeat(128);
        bad.replace_range(10..11, "g");
        assert!(IpcEventHandle::from_hex(&bad).is_err());
        let mut non_ascii = "0".repeat(126);
        non_ascii.push('é');
        assert!(IpcEventHandle::from_hex(&non_ascii).is_err());
    }

    #[test]
    fn durations_convert_and_reject_negative_time() {
        assert_eq!(duration_from_ms(1.5).unwrap(), Duration::from_micros(1500));
        assert_eq!(duration_from_ms(0.0).unwrap(), Duration::ZERO);
        assert!(duration_from_ms(-0.5).is_err());
        assert!(duration_from_ms(f32::NAN).is_err());
        assert!(duration_from_ms(f32::INFINITY).is_err());
    }
}
