//! [`MemoryEvent`]: what the pool did, in one type for both observers, the memory hooks
//! ([`hooks`](crate::hooks)) and the memory history ([`history`](crate::history)). A leaf.

use std::panic::Location;

use crate::backend::{DeviceAddress, StreamKey};
use crate::device_id::DeviceId;
use crate::error::OomCause;
use crate::private_id::PrivatePoolId;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A block was handed out; `size` is the size asked for.
    Malloc,
    /// A block was freed; `size` is the size it was asked for with.
    Free,
    /// A plain segment was allocated (`cuMemAlloc`); it holds `size` bytes of memory.
    SegmentAlloc,
    /// A plain segment was returned (`cuMemFree`).
    SegmentFree,
    /// An address range was reserved (`cuMemAddressReserve`): no memory behind it.
    RangeReserve,
    /// An address range was given back (`cuMemAddressFree`).
    RangeRelease,
    /// A physical page was created (`cuMemCreate`); `addr` is 0.
    PageCreate,
    /// A physical page was released (`cuMemRelease`); `addr` is 0.
    PageRelease,
    /// A physical page was mapped at `addr` (`cuMemMap`).
    PageMap,
    /// The page at `addr` was unmapped (`cuMemUnmap`).
    PageUnmap,
    /// A fence was recorded on `stream` (the hand-over point of its frees).
    FenceRecord,
    /// The block at `addr` (`size` bytes asked for) was marked as used on `stream` too
    /// (`record_stream`): its free waits for that stream's work.
    RecordStream,
    /// `stream` was made to wait for a fence of another stream on the device: memory
    /// stolen, or handed over, across streams.
    StreamWait,
    /// The device's limit changed; `size` is the new limit (`u64::MAX`: none).
    LimitChange,
    /// A private pool was created (a graph capture's).
    PrivatePoolCreate(PrivatePoolId),
    /// A private pool was released.
    PrivatePoolRelease(PrivatePoolId),
    /// The block at `addr`, just handed out, belongs to this private pool (a graph
    /// capture's): it follows the block's `Malloc`.
    PrivateBlock(PrivatePoolId),
    /// A request of `size` bytes failed: what ran out, and the pool's state then.
    OutOfMemory {
        /// What ran out.
        cause: OomCause,
        /// Bytes in live blocks on the device.
        used: u64,
        /// Physical bytes the pool held on the device.
        reserved: u64,
    },
}

/// What the pool did: what a memory hook is told, and what the history records (with its
/// place in the recording, [`Record`](crate::history::Record)). Named apart from
/// `cudars_core::Event`, the CUDA event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEvent {
    /// What happened.
    pub kind: EventKind,
    /// The device.
    pub device: DeviceId,
    /// The stream, where one is involved: the pool's [`StreamKey`]
    /// (`cudars_core::Stream::identity` for `cuda-core` streams), the same for every event of
    /// one stream whichever entry point made it, so a hook can pair mallocs with frees by
    /// stream.
    pub stream: Option<StreamKey>,
    /// Bytes (see [`EventKind`] for each kind's meaning; for a hook's malloc and free, the
    /// size asked for; for its `alloc`, the segment or page size).
    pub size: u64,
    /// The address: 0 where none (in the `*_pre` hooks of allocations, in the history's
    /// `PageCreate` and `PageRelease`, and when the device was out of memory). One exception:
    /// the `alloc_post` hook of a page made reports 1 (a page has no address until mapped,
    /// and 0 there means out of memory).
    pub addr: DeviceAddress,
    /// The caller of the allocating entry point (through `#[track_caller]`), when known.
    pub location: Option<&'static Location<'static>>,
}
