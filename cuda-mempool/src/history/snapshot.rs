//! [`Snapshot`]: what is where at one instant, rebuilt from a history.

use std::collections::BTreeMap;
use std::panic::Location;

use super::{EventKind, History, Record};
use crate::backend::{DeviceAddress, DeviceId, StreamKey};
use crate::pool::PrivatePoolId;

/// Which pool a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolTag {
    /// The pool's shared cache.
    Shared,
    /// A private pool (a graph capture's).
    Private(PrivatePoolId),
}

/// A block handed out and not freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// The device.
    pub device: DeviceId,
    /// Its address.
    pub addr: DeviceAddress,
    /// The size asked for.
    pub size: u64,
    /// The stream it was allocated on.
    pub stream: StreamKey,
    /// Its pool.
    pub pool: PoolTag,
    /// When it was allocated.
    pub since: u64,
    /// Who allocated it, where known.
    pub location: Option<&'static Location<'static>>,
    /// The `seq` of its malloc event in the history it was rebuilt from (its call stack, if
    /// one was captured: [`History::stack`]); `None` for a block the history did not see
    /// allocated.
    pub seq: Option<u64>,
}

/// How a segment is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// A plain allocation, memory behind all of it.
    Plain,
    /// A reserved address range; memory only where pages are mapped.
    Virtual,
}

/// A segment the pool holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The device.
    pub device: DeviceId,
    /// First address.
    pub base: DeviceAddress,
    /// Bytes of address space.
    pub size: u64,
    /// How it is backed.
    pub kind: SegmentKind,
    /// Mapped pages of a virtual segment: (address, bytes), in address order. Empty for a
    /// plain segment.
    pub pages: Vec<(DeviceAddress, u64)>,
    /// The stream of the first block allocated in it, where the history shows one (the
    /// pool gives each segment to one stream's shard).
    pub stream: Option<StreamKey>,
}

impl Segment {
    /// Bytes of memory behind the segment: all of a plain one, the mapped pages of a
    /// virtual one.
    pub fn backed_bytes(&self) -> u64 {
        match self.kind {
            SegmentKind::Plain => self.size,
            SegmentKind::Virtual => self.pages.iter().map(|p| p.1).sum(),
        }
    }
}

/// Memory of a segment that no live block covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeBlock {
    /// The device.
    pub device: DeviceId,
    /// First address.
    pub addr: DeviceAddress,
    /// Bytes.
    pub size: u64,
    /// The segment's stream, where known.
    pub stream: Option<StreamKey>,
    /// Its pool.
    pub pool: PoolTag,
}

/// What is where at one instant: live blocks, segments with their mapped pages, and the
/// free memory between blocks, each in (device, address) order.
///
/// Rebuilt from a [`History`] that starts with the pool ([`History::dropped`] is 0):
/// a live block covers its size rounded up to
/// [`policy::ROUND`](crate::policy::ROUND); free blocks are the backed memory of a
/// segment outside every live block. A live block is tagged with its private pool where the
/// history says so ([`EventKind::PrivateBlock`](super::EventKind::PrivateBlock)), else
/// [`PoolTag::Shared`]; free blocks are tagged [`PoolTag::Shared`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The time of the snapshot.
    pub time: u64,
    /// Blocks handed out and not freed.
    pub live: Vec<LiveBlock>,
    /// Segments held.
    pub segments: Vec<Segment>,
    /// Backed memory outside live blocks.
    pub free: Vec<FreeBlock>,
}

impl Snapshot {
    /// Bytes in live blocks (sizes asked for).
    pub fn active_bytes(&self) -> u64 {
        self.live.iter().map(|b| b.size).sum()
    }

    /// Physical bytes behind the segments.
    pub fn backed_bytes(&self) -> u64 {
        self.segments.iter().map(Segment::backed_bytes).sum()
    }
}

/// A block's size rounded up to the pool's granule, as it occupies its segment.
pub(super) fn round(size: u64) -> u64 {
    let r = crate::policy::ROUND;
    size.div_ceil(r).saturating_mul(r)
}

impl History {
    /// The snapshot after every event held.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_at(u64::MAX)
    }

    /// The snapshot after the events at or before `time`.
    pub fn snapshot_at(&self, time: u64) -> Snapshot {
        let events = self.events.iter().take_while(|e| e.time <= time);
        build(events, time.min(self.events.last().map_or(0, |e| e.time)))
    }
}

type Key = (u32, u64);

fn build<'a>(events: impl Iterator<Item = &'a Record>, time: u64) -> Snapshot {
    let mut live: BTreeMap<Key, LiveBlock> = BTreeMap::new();
    let mut segments: BTreeMap<Key, Segment> = BTreeMap::new();
    let mut pages: BTreeMap<Key, u64> = BTreeMap::new();
    for e in events {
        let key = (e.device.0, e.addr.0);
        match e.kind {
            EventKind::Malloc => {
                let stream = e.stream.unwrap_or(StreamKey(0));
                if let Some((_, seg)) = segments.range_mut(..=key).next_back() {
                    if seg.device == e.device
                        && e.addr.0 < seg.base.0.saturating_add(seg.size)
                        && seg.stream.is_none()
                    {
                        seg.stream = Some(stream);
                    }
                }
                live.insert(
                    key,
                    LiveBlock {
                        device: e.device,
                        addr: e.addr,
                        size: e.size,
                        stream,
                        pool: PoolTag::Shared,
                        since: e.time,
                        location: e.location,
                        seq: Some(e.seq),
                    },
                );
            }
            EventKind::Free => {
                live.remove(&key);
            }
            EventKind::PrivateBlock(id) => {
                if let Some(b) = live.get_mut(&key) {
                    b.pool = PoolTag::Private(id);
                }
            }
            EventKind::SegmentAlloc | EventKind::RangeReserve => {
                let kind = if e.kind == EventKind::SegmentAlloc {
                    SegmentKind::Plain
                } else {
                    SegmentKind::Virtual
                };
                segments.insert(
                    key,
                    Segment {
                        device: e.device,
                        base: e.addr,
                        size: e.size,
                        kind,
                        pages: Vec::new(),
                        stream: None,
                    },
                );
            }
            EventKind::SegmentFree | EventKind::RangeRelease => {
                segments.remove(&key);
            }
            EventKind::PageMap => {
                pages.insert(key, e.size);
            }
            EventKind::PageUnmap => {
                pages.remove(&key);
            }
            _ => {}
        }
    }
    for seg in segments.values_mut() {
        if seg.kind == SegmentKind::Virtual {
            let (lo, hi) = (
                (seg.device.0, seg.base.0),
                (seg.device.0, seg.base.0 + seg.size),
            );
            seg.pages = pages
                .range(lo..hi)
                .map(|(&(_, a), &s)| (DeviceAddress(a), s))
                .collect();
        }
    }
    let mut free = Vec::new();
    for seg in segments.values() {
        let backed: Vec<(u64, u64)> = match seg.kind {
            SegmentKind::Plain => vec![(seg.base.0, seg.base.0 + seg.size)],
            SegmentKind::Virtual => {
                // Merge adjacent pages into runs.
                let mut runs: Vec<(u64, u64)> = Vec::new();
                for &(a, s) in &seg.pages {
                    match runs.last_mut() {
                        Some(last) if last.1 == a.0 => last.1 = a.0 + s,
                        _ => runs.push((a.0, a.0 + s)),
                    }
                }
                runs
            }
        };
        for (start, end) in backed {
            let mut at = start;
            let lo = (seg.device.0, start);
            let hi = (seg.device.0, end);
            for b in live.range(lo..hi).map(|(_, b)| b) {
                if b.addr.0 > at {
                    free.push(free_block(seg, at, b.addr.0 - at));
                }
                at = at.max(b.addr.0.saturating_add(round(b.size)));
            }
            if end > at {
                free.push(free_block(seg, at, end - at));
            }
        }
    }
    Snapshot {
        time,
        live: live.into_values().collect(),
        segments: segments.into_values().collect(),
        free,
    }
}

fn free_block(seg: &Segment, addr: u64, size: u64) -> FreeBlock {
    FreeBlock {
        device: seg.device,
        addr: DeviceAddress(addr),
        size,
        stream: seg.stream,
        pool: PoolTag::Shared,
    }
}
