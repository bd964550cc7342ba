//! Memory history: a bounded ring of what the pool and its backend did, a [`Snapshot`] of
//! what is where, a self-contained HTML report of both ([`report`]) and their export to
//! PyTorch's memory snapshot pickle ([`torch`]), which PyTorch's memory viewer opens.
//!
//! A [`Recorder`] keeps the last [`Recorder::capacity`] [`Record`]s (each a [`MemoryEvent`] with its place) in order; older ones are
//! dropped and counted ([`History::dropped`]). Each event carries a time (virtual, set by
//! the caller with [`Recorder::set_time`], or real: nanoseconds since the recorder was
//! made), the device, the stream, a size, an address and optionally the caller's location.
//!
//! Where events come from:
//! * the pool's one observation seam (`observe.rs`, around whatever backend the pool has)
//!   records what the pool asks of its backend: segments (plain allocations and address
//!   ranges), physical pages created, mapped, unmapped and released, fences recorded and
//!   streams made to wait for another stream's fence (a steal or a hand-over); it fires the
//!   memory [`hooks`](crate::hooks) around segments and pages too;
//! * the trace replay ([`replay::replay_recorded`](crate::replay::replay_recorded)) records
//!   every malloc and free, the out-of-memory failure if any (with the pool's used and
//!   reserved bytes) and produces a [`Snapshot`] at the end;
//! * [`Recorder::record_limit`] and [`Recorder::record_private_pool`] for code that changes
//!   a limit or creates and releases a private pool.
//!
//! A live pool records too: [`MemoryPool::start_history`](crate::MemoryPool::start_history)
//! first records what the pool holds at that moment (segments, pages, live blocks), then
//! every malloc and free, out-of-memory failure, limit change and private pool, and its
//! backend's segment, page and fence calls (through the observation seam, whatever the
//! backend). Off, it costs the hot path one relaxed load of a flag.
//!
//! ```
//! use cudars_mempool::history::{Clock, EventKind, Recorder};
//! use cudars_mempool::{DeviceAddress, DeviceId, StreamKey};
//!
//! let rec = Recorder::new(2, Clock::Virtual);
//! for i in 0..3u64 {
//!     rec.set_time(i);
//!     rec.malloc(DeviceId(0), StreamKey(1), 512, DeviceAddress(0x1000 * (i + 1)), None);
//! }
//! let h = rec.history();
//! assert_eq!(h.events.len(), 2); // the ring keeps the newest two
//! assert_eq!(h.dropped, 1);
//! assert_eq!(h.events[0].seq, 1);
//! assert!(matches!(h.events[1].kind, EventKind::Malloc));
//! ```

pub mod report;
mod snapshot;
mod stack;
pub mod torch;

use std::collections::VecDeque;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use crate::backend::{DeviceAddress, DeviceId, StreamKey};
use crate::error::OomCause;
pub use crate::memory_event::{EventKind, MemoryEvent};
use crate::private_id::PrivatePoolId;

pub use snapshot::{FreeBlock, LiveBlock, PoolTag, Segment, SegmentKind, Snapshot};
pub use stack::{CallStack, Frame};

/// Where event times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// The caller sets the time ([`Recorder::set_time`]), e.g. the operation index of a
    /// trace replay.
    Virtual,
    /// Nanoseconds since the recorder was made.
    Real,
}

/// One recorded event: the [`MemoryEvent`] (the same type the memory hooks are told), with
/// its place in the recording. Its fields read through it (`record.size`, `record.kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Position in the recording (0 for the first event ever recorded, gapless).
    pub seq: u64,
    /// Virtual time, or nanoseconds since the recorder was made ([`Clock`]).
    pub time: u64,
    /// What happened.
    pub event: MemoryEvent,
}

impl std::ops::Deref for Record {
    type Target = MemoryEvent;
    fn deref(&self) -> &MemoryEvent {
        &self.event
    }
}

/// A copy of what a recorder holds ([`Recorder::history`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History {
    /// The clock of the times.
    pub clock: Clock,
    /// The recorded events, oldest first, `seq` increasing by one.
    pub events: Vec<Record>,
    /// Events recorded but no longer held: dropped from the front of the full ring, or
    /// forgotten by [`Recorder::clear`].
    pub dropped: u64,
    /// The call stacks captured with events (a recorder made
    /// [`with_backtraces`](Recorder::with_backtraces)), by the event's `seq`, in order.
    pub stacks: Vec<(u64, CallStack)>,
}

/// Figures read off a history (see [`History::figures`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// The highest sum of the sizes of live blocks (malloc minus free).
    pub peak_active: u64,
    /// The highest physical memory held: plain segments plus created pages.
    pub peak_reserved: u64,
    /// Out-of-memory events.
    pub ooms: u64,
    /// The time of the last event.
    pub end_time: u64,
}

impl History {
    /// The call stack captured with event `seq`, if one was.
    pub fn stack(&self, seq: u64) -> Option<&CallStack> {
        self.stacks
            .binary_search_by_key(&seq, |(s, _)| *s)
            .ok()
            .map(|i| &self.stacks[i].1)
    }

    /// Running sums over the events: active bytes and physical bytes held, with their peaks.
    /// Only meaningful when nothing was dropped and the recording started with the pool.
    pub fn figures(&self) -> Figures {
        let mut f = Figures::default();
        let (mut active, mut reserved) = (0u64, 0u64);
        for e in &self.events {
            match e.kind {
                EventKind::Malloc => active += e.size,
                EventKind::Free => active = active.saturating_sub(e.size),
                EventKind::SegmentAlloc | EventKind::PageCreate => reserved += e.size,
                EventKind::SegmentFree | EventKind::PageRelease => {
                    reserved = reserved.saturating_sub(e.size)
                }
                EventKind::OutOfMemory { .. } => f.ooms += 1,
                _ => {}
            }
            f.peak_active = f.peak_active.max(active);
            f.peak_reserved = f.peak_reserved.max(reserved);
            f.end_time = f.end_time.max(e.time);
        }
        f
    }
}

struct Ring {
    events: VecDeque<Record>,
    /// (seq, stack) of held events that have one, in seq order.
    stacks: VecDeque<(u64, CallStack)>,
    next_seq: u64,
    dropped: u64,
    time: u64,
    enabled: bool,
}

/// A bounded, thread-safe ring of [`Record`]s.
pub struct Recorder {
    capacity: usize,
    clock: Clock,
    backtraces: bool,
    start: Instant,
    ring: Mutex<Ring>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("capacity", &self.capacity)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder keeping the newest `capacity` events (at least one), recording from now on.
    pub fn new(capacity: usize, clock: Clock) -> Self {
        let capacity = capacity.max(1);
        Recorder {
            capacity,
            clock,
            backtraces: false,
            start: Instant::now(),
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(capacity.min(1 << 16)),
                stacks: VecDeque::new(),
                next_seq: 0,
                dropped: 0,
                time: 0,
                enabled: true,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The same recorder, capturing a call stack ([`CallStack`]) with each malloc and out of
    /// memory it records (`true`), or not. Off by default: a capture costs microseconds
    /// (the stack is walked under the pool's shard lock), and resolving its frames for a
    /// report or a PyTorch snapshot much more, once per stack. The caller's location
    /// (`#[track_caller]`) is recorded either way.
    pub fn with_backtraces(mut self, on: bool) -> Self {
        self.backtraces = on;
        self
    }

    /// Whether call stacks are captured ([`with_backtraces`](Self::with_backtraces)).
    pub fn backtraces(&self) -> bool {
        self.backtraces
    }

    /// The most events kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Pauses (`false`) or resumes (`true`) recording; paused, [`record`](Self::record)
    /// keeps nothing.
    pub fn set_enabled(&self, enabled: bool) {
        self.lock().enabled = enabled;
    }

    /// Whether recording is on.
    pub fn is_enabled(&self) -> bool {
        self.lock().enabled
    }

    /// Sets the virtual time of the events recorded from now on (ignored by a
    /// [`Clock::Real`] recorder).
    pub fn set_time(&self, time: u64) {
        self.lock().time = time;
    }

    /// Records one event, with the next `seq` and the recorder's time, dropping the oldest
    /// if the ring is full.
    pub fn record(&self, event: MemoryEvent) {
        let stack = (self.backtraces
            && matches!(
                event.kind,
                EventKind::Malloc | EventKind::OutOfMemory { .. }
            ))
        .then(CallStack::capture);
        self.record_with(event, stack);
    }

    /// Records a block that was live when the recording started (a pool's baseline): a
    /// malloc with no location and no call stack, whatever the recorder captures.
    pub fn baseline_malloc(
        &self,
        device: DeviceId,
        stream: StreamKey,
        size: u64,
        addr: DeviceAddress,
    ) {
        let event = MemoryEvent {
            kind: EventKind::Malloc,
            device,
            stream: Some(stream),
            size,
            addr,
            location: None,
        };
        self.record_with(event, None);
    }

    fn record_with(&self, event: MemoryEvent, stack: Option<CallStack>) {
        let mut ring = self.lock();
        if !ring.enabled {
            return;
        }
        // Read under the lock, so that times never decrease along the sequence.
        let time = match self.clock {
            Clock::Real => u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Clock::Virtual => ring.time,
        };
        let event = Record {
            seq: ring.next_seq,
            time,
            event,
        };
        ring.next_seq += 1;
        if ring.events.len() == self.capacity {
            if let Some(old) = ring.events.pop_front() {
                if ring.stacks.front().is_some_and(|(s, _)| *s == old.seq) {
                    ring.stacks.pop_front();
                }
            }
            ring.dropped += 1;
        }
        if let Some(stack) = stack {
            ring.stacks.push_back((event.seq, stack));
        }
        ring.events.push_back(event);
    }

    /// Records an event of `kind` from its parts.
    pub fn event(
        &self,
        kind: EventKind,
        device: DeviceId,
        stream: Option<StreamKey>,
        size: u64,
        addr: DeviceAddress,
        location: Option<&'static Location<'static>>,
    ) {
        self.record(MemoryEvent {
            kind,
            device,
            stream,
            size,
            addr,
            location,
        });
    }

    /// Records a malloc of `size` bytes at `addr` on `stream`.
    pub fn malloc(
        &self,
        device: DeviceId,
        stream: StreamKey,
        size: u64,
        addr: DeviceAddress,
        location: Option<&'static Location<'static>>,
    ) {
        self.event(
            EventKind::Malloc,
            device,
            Some(stream),
            size,
            addr,
            location,
        );
    }

    /// Records the free of the block of `size` bytes at `addr`, made on `stream`.
    pub fn free(&self, device: DeviceId, stream: StreamKey, size: u64, addr: DeviceAddress) {
        self.event(EventKind::Free, device, Some(stream), size, addr, None);
    }

    /// Records a limit change (`None`: no limit), with the caller's location.
    #[track_caller]
    pub fn record_limit(&self, device: DeviceId, limit: Option<u64>) {
        self.event(
            EventKind::LimitChange,
            device,
            None,
            limit.unwrap_or(u64::MAX),
            DeviceAddress(0),
            Some(Location::caller()),
        );
    }

    /// Records the creation (`created`) or release of a private pool, with the caller's
    /// location.
    #[track_caller]
    pub fn record_private_pool(
        &self,
        device: DeviceId,
        stream: Option<StreamKey>,
        id: PrivatePoolId,
        created: bool,
    ) {
        let kind = if created {
            EventKind::PrivatePoolCreate(id)
        } else {
            EventKind::PrivatePoolRelease(id)
        };
        self.event(
            kind,
            device,
            stream,
            0,
            DeviceAddress(0),
            Some(Location::caller()),
        );
    }

    /// Records an out-of-memory failure of a request of `requested` bytes.
    pub fn out_of_memory(
        &self,
        device: DeviceId,
        stream: Option<StreamKey>,
        requested: u64,
        cause: OomCause,
        used: u64,
        reserved: u64,
    ) {
        self.event(
            EventKind::OutOfMemory {
                cause,
                used,
                reserved,
            },
            device,
            stream,
            requested,
            DeviceAddress(0),
            None,
        );
    }

    /// A copy of the events held, oldest first.
    pub fn history(&self) -> History {
        let ring = self.lock();
        History {
            clock: self.clock,
            events: ring.events.iter().copied().collect(),
            dropped: ring.dropped,
            stacks: ring.stacks.iter().cloned().collect(),
        }
    }

    /// Forgets every event held (sequence numbers go on).
    pub fn clear(&self) {
        let mut ring = self.lock();
        ring.dropped += ring.events.len() as u64;
        ring.events.clear();
        ring.stacks.clear();
    }
}

/// A recorder that can be put in and taken out while the code that records runs: what a
/// live pool and a backend hold. Empty, [`is_on`](Self::is_on) is one relaxed load; in, a
/// note reads the recorder under a shared lock (no reference count touched).
#[derive(Debug, Default)]
pub(crate) struct RecorderSlot {
    on: AtomicBool,
    recorder: RwLock<Option<Arc<Recorder>>>,
}

impl RecorderSlot {
    /// Whether a recorder is in (a hint: [`with`](Self::with) checks).
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Puts `recorder` in (`None`: takes it out); returns the one it replaces. Waits for
    /// notes in progress.
    pub(crate) fn set(&self, recorder: Option<Arc<Recorder>>) -> Option<Arc<Recorder>> {
        let mut slot = self
            .recorder
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        self.on.store(recorder.is_some(), Ordering::Release);
        std::mem::replace(&mut slot, recorder)
    }

    /// The recorder in the slot.
    pub(crate) fn get(&self) -> Option<Arc<Recorder>> {
        if !self.is_on() {
            return None;
        }
        self.recorder
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `f` with the recorder in the slot, if one is.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Recorder) -> R) -> Option<R> {
        if !self.is_on() {
            return None;
        }
        let slot = self.recorder.read().unwrap_or_else(PoisonError::into_inner);
        slot.as_deref().map(f)
    }

    /// Records an event of `kind` when a recorder is in.
    #[inline]
    pub(crate) fn note(
        &self,
        kind: EventKind,
        device: DeviceId,
        stream: Option<StreamKey>,
        size: u64,
        addr: DeviceAddress,
    ) {
        if self.is_on() {
            self.note_slow(kind, device, stream, size, addr);
        }
    }

    #[cold]
    fn note_slow(
        &self,
        kind: EventKind,
        device: DeviceId,
        stream: Option<StreamKey>,
        size: u64,
        addr: DeviceAddress,
    ) {
        self.with(|r| r.event(kind, device, stream, size, addr, None));
    }
}

#[cfg(test)]
mod tests;
