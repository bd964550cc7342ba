//! The producer's side of DLPack's `stream` argument: order the consumer's stream after the
//! producer's work, on the device (an event recorded and waited for), never by blocking the
//! host.
//!
//! `__dlpack__(stream=S)` tells the producer on which stream the consumer will use the
//! tensor. For CUDA, as the Python array API standard's `__dlpack__` defines it
//! ([`ConsumerStream::from_protocol`]):
//!
//! | `S` | meaning |
//! | --- | --- |
//! | `None` (Python's default) | the legacy default stream (the standard's rule; PyTorch's own `__dlpack__` reads `None` as no ordering, which is not what a consumer that passes nothing can rely on) |
//! | `1` | the legacy default stream (`CU_STREAM_LEGACY`) |
//! | `2` | the per-thread default stream (`CU_STREAM_PER_THREAD`) |
//! | `>= 0x10000` ([`MIN_HANDLE`]) | a `CUstream` handle |
//! | `-1` | no ordering: the consumer takes care of it |
//! | `0`, other negatives | refused ([`Error::InvalidStream`]): 0 is ambiguous |
//! | `3 ..= 0xffff` | refused ([`Error::InvalidStream`]): no pointer, so no stream, lies there |
//!
//! A handle cannot be checked: the driver reads through it, so an integer that is not a live
//! stream (a framework's small stream *id* passed for the handle, a device ordinal, a
//! destroyed stream) crashes the process or worse. Only the values that can never be a
//! pointer are caught here; hence [`ConsumerStream::to_stream`] is `unsafe`.
//!
//! [`prepare_for_consumer`] does what a producer owes: the consumer's stream waits for the
//! producer's stream, and the view's owner learns that the consumer's stream uses the memory
//! ([`DevicePtr::record_stream`]), so a pool block's free (after the deleter) waits for that
//! stream's work and a reused block's earlier owner is ordered before it.

use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Event, Stream};

use crate::error::{Error, Result};

/// The lowest value taken as a `CUstream` handle: no user-space pointer lies in the first
/// 64 KiB of the address space (Linux's default `vm.mmap_min_addr`; Windows never maps
/// them), so a smaller integer is a mistake, refused before the driver reads through it.
pub const MIN_HANDLE: u64 = 0x1_0000;

/// The consumer's stream, as DLPack's `stream` argument names it for CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConsumerStream {
    /// `-1`: the consumer asks for no ordering.
    Unordered,
    /// `1` (and `None` in Python): the legacy default stream.
    Legacy,
    /// `2`: the per-thread default stream.
    PerThread,
    /// A `CUstream` handle (at least [`MIN_HANDLE`]).
    Handle(u64),
}

impl ConsumerStream {
    /// The stream a `__dlpack__(stream=...)` argument names for CUDA (see the module table).
    ///
    /// ```
    /// use cudars_dlpack::ConsumerStream;
    /// assert_eq!(ConsumerStream::from_protocol(None).unwrap(), ConsumerStream::Legacy);
    /// assert_eq!(ConsumerStream::from_protocol(Some(-1)).unwrap(), ConsumerStream::Unordered);
    /// let h = 0x7f00_1234_5000;
    /// assert_eq!(ConsumerStream::from_protocol(Some(h)).unwrap(), ConsumerStream::Handle(h as u64));
    /// assert!(ConsumerStream::from_protocol(Some(0)).is_err());
    /// assert!(ConsumerStream::from_protocol(Some(7)).is_err(), "not a pointer");
    /// ```
    pub fn from_protocol(stream: Option<i64>) -> Result<ConsumerStream> {
        match stream {
            None | Some(1) => Ok(ConsumerStream::Legacy),
            Some(2) => Ok(ConsumerStream::PerThread),
            Some(-1) => Ok(ConsumerStream::Unordered),
            Some(s) if s >= MIN_HANDLE as i64 => Ok(ConsumerStream::Handle(s as u64)),
            Some(s) => Err(Error::InvalidStream(s)),
        }
    }

    /// The protocol's integer for this stream (`-1`, `1`, `2` or the handle).
    pub fn to_protocol(self) -> i64 {
        match self {
            ConsumerStream::Unordered => -1,
            ConsumerStream::Legacy => 1,
            ConsumerStream::PerThread => 2,
            ConsumerStream::Handle(h) => h as i64,
        }
    }

    /// The protocol's integer for a consumer's own stream: 1 for the legacy stream, 2 for
    /// the per-thread stream, else its handle.
    pub fn of_stream(stream: &Stream) -> ConsumerStream {
        ConsumerStream::of_stream_raw(stream.raw() as u64)
    }

    /// As [`of_stream`](Self::of_stream) for a raw `CUstream` value (0, the null stream,
    /// is the legacy stream in a primary context): what a producer's
    /// `current_work_stream` gives.
    pub fn of_stream_raw(raw: u64) -> ConsumerStream {
        match raw {
            0 | 1 => ConsumerStream::Legacy,
            2 => ConsumerStream::PerThread,
            h => ConsumerStream::Handle(h),
        }
    }

    /// The stream on `device`, or `None` for [`Unordered`](Self::Unordered).
    ///
    /// # Safety
    ///
    /// A [`Handle`](Self::Handle) must be a live stream of `device` that stays valid while
    /// the returned `Stream` (or a clone, such as one a pool keeps while the memory is in
    /// use: see [`cudars_core::Stream::external`]) is used: what the DLPack protocol asks of
    /// the consumer that passes it.
    pub unsafe fn to_stream(self, device: &Device) -> Result<Option<Stream>> {
        Ok(match self {
            ConsumerStream::Unordered => None,
            ConsumerStream::Legacy => Some(Stream::null(device)),
            ConsumerStream::PerThread => Some(Stream::per_thread(device)),
            ConsumerStream::Handle(h) => {
                // SAFETY: the caller's contract.
                Some(unsafe { Stream::external(device, h as usize as cudars_core::sys::CUstream) }?)
            }
        })
    }
}

/// Whether two streams are the same stream (then stream order already orders them).
fn same_stream(a: &Stream, b: &Stream) -> bool {
    if a.device() != b.device() {
        return false;
    }
    let legacy = |s: &Stream| matches!(s.raw() as usize, 0 | 1);
    a.raw() == b.raw() || (legacy(a) && legacy(b))
}

/// Makes `consumer` wait on the device for all the work queued on `producer` so far: records
/// `event` (a new untimed one when `None`) on `producer` and has `consumer` wait for it.
/// Nothing when they are the same stream. The host never waits.
pub fn order_after(producer: &Stream, consumer: &Stream, event: Option<&Event>) -> Result<()> {
    if same_stream(producer, consumer) {
        return Ok(());
    }
    let event = producer.record(event)?;
    consumer.wait_event(&event)?;
    Ok(())
}

/// What a producer does for `__dlpack__(stream=consumer)` over `view`: unless the consumer
/// asked for no ordering, the consumer's stream is marked on the view's owner
/// ([`DevicePtr::record_stream`]: a pool block's free then waits for it, and the stream is
/// ordered after a reused block's earlier owner), and ordered after `producer`'s work so far
/// when there is a producer stream ([`order_after`], with `event` reused when given).
///
/// # Safety
///
/// As [`ConsumerStream::to_stream`]: a handle must be a live stream of the view's device,
/// valid until the consumer has released the tensor and the memory's owner no longer needs
/// it (a pool keeps the stream until the block's free has been ordered after it).
pub unsafe fn prepare_for_consumer(
    view: &DevicePtr,
    producer: Option<&Stream>,
    consumer: ConsumerStream,
    event: Option<&Event>,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let Some(consumer) = unsafe { consumer.to_stream(&view.device()) }? else {
        return Ok(());
    };
    view.record_stream(&consumer.issue_any())?;
    if let Some(producer) = producer {
        order_after(producer, &consumer, event)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_values() {
        use ConsumerStream::*;
        assert_eq!(ConsumerStream::from_protocol(None).unwrap(), Legacy);
        assert_eq!(ConsumerStream::from_protocol(Some(1)).unwrap(), Legacy);
        assert_eq!(ConsumerStream::from_protocol(Some(2)).unwrap(), PerThread);
        assert_eq!(ConsumerStream::from_protocol(Some(-1)).unwrap(), Unordered);
        assert_eq!(
            ConsumerStream::from_protocol(Some(0x1_0000)).unwrap(),
            Handle(0x1_0000)
        );
        // Integers that no pointer can have (a stream id, a device ordinal): refused before
        // anything reads through them.
        for bad in [0, -2, i64::MIN, 3, 7, 0xffff] {
            assert!(matches!(
                ConsumerStream::from_protocol(Some(bad)),
                Err(Error::InvalidStream(v)) if v == bad
            ));
        }
        for s in [Unordered, Legacy, PerThread, Handle(0xdead_0000)] {
            assert_eq!(
                ConsumerStream::from_protocol(Some(s.to_protocol())).unwrap(),
                s
            );
        }
    }
}
