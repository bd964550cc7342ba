//! [`SimulatedBackend`]: a device on the CPU, for model tests and trace replays.
//!
//! * **Memory**: fake addresses in a private window per device; a configurable
//!   capacity counted in physical bytes (pages created plus plain allocations), beyond
//!   which allocation returns "out of memory"; a configurable page granularity, or
//!   none for a device without virtual memory support. Misuse (mapping over a mapped
//!   page, unmapping nothing, releasing a mapped page, freeing an unknown pointer) is
//!   an error, so a pool bug shows up as a failed call.
//! * **Time**: each stream has a count of *submitted* and of *completed* work items.
//!   [`submit_work`](SimulatedBackend::submit_work) stands for a kernel launch; a
//!   fence captures the submitted count and completes once the completed count
//!   reaches it. Work completes only when asked:
//!   [`complete_stream`](SimulatedBackend::complete_stream),
//!   [`complete_all`](SimulatedBackend::complete_all), or a host wait on a fence (which
//!   runs the stream up to the fence). A stream that waits on another stream's fence
//!   cannot complete past that wait before the other stream reaches the fence.
//! * **The per-thread default stream**: [`SimulatedBackend::PER_THREAD`] stands for the
//!   driver's `CU_STREAM_PER_THREAD` handle: every call resolves it to the calling thread's
//!   own stream (its key [`Backend::stream_key`] gives), so a fence recorded with it on
//!   another thread lands on that thread's stream, as on the GPU.
//! * **Memory use**: [`submit_use`](SimulatedBackend::submit_use) is a work item that reads
//!   and writes an address range. Unmapping or freeing memory that incomplete work uses, and
//!   a block handed to a stream not ordered after incomplete work of another stream on it
//!   ([`check_handout`](SimulatedBackend::check_handout)), are recorded as
//!   [`violations`](SimulatedBackend::violations): on a GPU, an illegal address or wrong data.
//! * **Accounting**: every backend call is counted ([`SimCalls`]); optionally every
//!   mapping change is logged ([`SimEvent`]) for tests to inspect.
//! * **Hooks and history** are the pool's (its observation seam, around any backend): a
//!   pool on this backend fires the `alloc` memory hooks ([`crate::hooks`]) and records its
//!   history as it does on the driver backend, so both can be tested without a GPU.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, StreamKey};

/// Total memory of an NVIDIA H200 as the driver reports it (143,771 MiB).
pub const H200_TOTAL_MEMORY: u64 = 150_754_820_096;

/// The virtual-memory granularity of an H200: 2 MiB.
pub const H200_GRANULARITY: u64 = 2 << 20;

/// Configuration of one simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimDevice {
    /// Capacity in bytes of physical memory (pages plus plain allocations).
    pub total_memory: u64,
    /// Page size of virtual memory, or `None` for a device without virtual memory
    /// management (the pool then uses plain segments).
    pub granularity: Option<u64>,
}

/// Counts of backend calls made so far, per method.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCalls {
    /// [`Backend::allocate`].
    pub allocate: u64,
    /// [`Backend::deallocate`].
    pub deallocate: u64,
    /// [`Backend::reserve_address_range`].
    pub reserve_address_range: u64,
    /// [`Backend::release_address_range`].
    pub release_address_range: u64,
    /// [`Backend::create_physical`].
    pub create_physical: u64,
    /// [`Backend::release_physical`].
    pub release_physical: u64,
    /// [`Backend::map`].
    pub map: u64,
    /// [`Backend::unmap`].
    pub unmap: u64,
    /// [`Backend::record_fence`].
    pub record_fence: u64,
    /// [`Backend::fence_completed`].
    pub fence_completed: u64,
    /// [`Backend::wait_fence`].
    pub wait_fence: u64,
    /// [`Backend::stream_wait_fence`].
    pub stream_wait_fence: u64,
    /// [`Backend::release_fence`].
    pub release_fence: u64,
    /// [`Backend::stream_released`].
    pub stream_released: u64,
    /// Calls that failed because a failure was injected ([`SimulatedBackend::inject_failure`]).
    pub injected_failures: u64,
}

/// The kinds of backend call a failure can be injected into
/// ([`SimulatedBackend::inject_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimCall {
    /// [`Backend::allocate`].
    Allocate,
    /// [`Backend::deallocate`].
    Deallocate,
    /// [`Backend::reserve_address_range`].
    ReserveAddressRange,
    /// [`Backend::release_address_range`].
    ReleaseAddressRange,
    /// [`Backend::create_physical`].
    CreatePhysical,
    /// [`Backend::release_physical`].
    ReleasePhysical,
    /// [`Backend::map`] (and each page of [`Backend::map_run`]).
    Map,
    /// [`Backend::unmap`].
    Unmap,
    /// [`Backend::record_fence`].
    RecordFence,
    /// [`Backend::fence_completed`].
    FenceCompleted,
    /// [`Backend::wait_fence`].
    WaitFence,
    /// [`Backend::stream_wait_fence`].
    StreamWaitFence,
    /// [`Backend::synchronize_stream`].
    SynchronizeStream,
}

impl SimCall {
    /// Every kind, for tests that pick one.
    pub const ALL: [SimCall; 13] = [
        SimCall::Allocate,
        SimCall::Deallocate,
        SimCall::ReserveAddressRange,
        SimCall::ReleaseAddressRange,
        SimCall::CreatePhysical,
        SimCall::ReleasePhysical,
        SimCall::Map,
        SimCall::Unmap,
        SimCall::RecordFence,
        SimCall::FenceCompleted,
        SimCall::WaitFence,
        SimCall::StreamWaitFence,
        SimCall::SynchronizeStream,
    ];
}

/// A change of what memory is where, logged when events are enabled
/// ([`SimulatedBackend::with_events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimEvent {
    /// Physical page `page` was mapped at `addr`.
    Map {
        /// Device.
        device: DeviceId,
        /// Page-aligned address.
        addr: u64,
        /// Id of the physical page.
        page: u64,
    },
    /// Physical page `page` was unmapped from `addr`.
    Unmap {
        /// Device.
        device: DeviceId,
        /// Page-aligned address.
        addr: u64,
        /// Id of the physical page.
        page: u64,
    },
    /// Plain allocation `id` at `addr` was returned.
    Deallocate {
        /// Device.
        device: DeviceId,
        /// Address.
        addr: u64,
        /// Id of the allocation (same id space as pages).
        id: u64,
    },
}

/// Errors of the simulated backend: misuse by the pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// No such device.
    #[error("no simulated device {0}")]
    NoDevice(u32),
    /// The device has no virtual memory support but a virtual memory call was made.
    #[error("device {0} has no virtual memory support")]
    NoVirtualMemory(u32),
    /// A size or address that is not a multiple of the granularity.
    #[error("{what} {value:#x} is not aligned to the granularity")]
    Misaligned {
        /// What was misaligned.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// An address outside every reserved range.
    #[error("address {0:#x} is not in a reserved range")]
    NotReserved(u64),
    /// Mapping over a mapped page.
    #[error("address {0:#x} is already mapped")]
    AlreadyMapped(u64),
    /// Mapping a page that is mapped elsewhere.
    #[error("physical page {0} is already mapped")]
    PageInUse(u64),
    /// Unmapping where nothing is mapped.
    #[error("address {0:#x} is not mapped")]
    NotMapped(u64),
    /// A page or allocation the device does not know.
    #[error("unknown physical page or allocation {0}")]
    Unknown(u64),
    /// Releasing an address range that still has pages mapped.
    #[error("address range at {0:#x} still has pages mapped")]
    RangeInUse(u64),
    /// Freeing a plain allocation with the wrong size or address.
    #[error("no plain allocation of that size at {0:#x}")]
    BadFree(u64),
    /// A failure injected by the test ([`SimulatedBackend::inject_failure`]).
    #[error("injected failure of {0:?}")]
    Injected(SimCall),
    /// A fence recorded on, or a wait made by, a stream that no longer exists: the pool
    /// used a stream after letting go of it.
    #[error("stream {0} was used after it was destroyed")]
    DestroyedStream(u64),
}

/// A physical page of the simulated device (the stand-in for a
/// `CUmemGenericAllocationHandle`).
#[derive(Debug, PartialEq, Eq)]
pub struct SimPage {
    id: u64,
}

impl SimPage {
    /// The page's id (the same id [`SimulatedBackend::translate`] reports).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A point in one stream's work ([`SimulatedBackend::point`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimPoint {
    timeline: u64,
    value: u64,
}

/// A fence of the simulated device: a stream and the submitted count at recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimFence {
    device: u32,
    stream: u64,
    value: u64,
}

impl SimFence {
    /// The stream it was recorded on.
    pub fn stream(&self) -> StreamKey {
        StreamKey(self.stream)
    }
    /// The stream's submitted work count when it was recorded.
    pub fn value(&self) -> u64 {
        self.value
    }
}

#[derive(Default)]
struct Clock {
    submitted: u64,
    completed: u64,
    /// (position in this stream, other stream, value): this stream's work from
    /// `position` on waits for the other stream to reach `value`.
    waits: Vec<(u64, u64, u64)>,
    /// The highest value this stream waited for, per other stream.
    waited: HashMap<u64, u64>,
    /// Every wait ever made, as `waits` (kept after completion, for
    /// [`SimulatedBackend::is_ordered_after`]).
    log: Vec<(u64, u64, u64)>,
}

struct DevState {
    cfg: SimDevice,
    physical: u64,
    next_va: u64,
    end_va: u64,
    ranges: BTreeMap<u64, u64>,
    mapped: HashMap<u64, u64>,
    pages: HashMap<u64, Option<u64>>,
    plain: BTreeMap<u64, (u64, u64)>,
}

struct State {
    devices: Vec<DevState>,
    clocks: HashMap<(u32, u64), Clock>,
    /// Stream id -> the key of its current timeline in `clocks` (a stream destroyed and
    /// created again under the same id gets a new timeline; fences keep the old one).
    timelines: HashMap<u64, u64>,
    next_timeline: u64,
    /// Streams whose user let go of them (the pool may release them).
    dropped: std::collections::HashSet<u64>,
    /// Streams the pool may rely on only while it holds live blocks made on them.
    borrowed: std::collections::HashSet<u64>,
    /// Streams that no longer exist.
    destroyed: std::collections::HashSet<u64>,
    /// Handle -> how many times it was created again after a destroy (the generation in
    /// [`SimulatedBackend::stream_uid`]).
    generations: HashMap<u64, u64>,
    /// Streams being captured into a graph ([`SimulatedBackend::set_capturing`]), with
    /// the id of their capture.
    capturing: HashMap<u64, u64>,
    /// The id of the next capture.
    next_capture: u64,
    /// Clones of each stream the pool holds ([`Backend::retain_stream`]).
    pool_refs: HashMap<u64, u64>,
    /// Injected failures: (kind, countdown); the call that brings the countdown to 0 fails.
    faults: Vec<(SimCall, u64)>,
    next_id: u64,
    calls: SimCalls,
    events: Option<Vec<SimEvent>>,
    /// Work items that use memory: (device, timeline, position, address, length).
    uses: Vec<(u32, u64, u64, u64, u64)>,
    /// What [`SimulatedBackend::violations`] returns.
    violations: Vec<String>,
}

/// A simulated set of devices; see the [module documentation](self).
pub struct SimulatedBackend {
    state: Mutex<State>,
}

impl std::fmt::Debug for SimulatedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedBackend").finish_non_exhaustive()
    }
}

const ADDRESS_WINDOW_BITS: u32 = 48;
/// Gap left between consecutive plain allocations and address ranges, so that no two
/// are adjacent and a pool merging across them would be caught.
const GUARD: u64 = 64 << 10;

impl SimulatedBackend {
    /// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`): it names the calling
    /// thread's own stream in every call.
    pub const PER_THREAD: StreamKey = StreamKey(u64::MAX - 2);

    /// Simulated devices with the given configurations (ids `0..devices.len()`).
    pub fn new(devices: Vec<SimDevice>) -> Self {
        let devices = devices
            .into_iter()
            .enumerate()
            .map(|(i, cfg)| {
                // Devices beyond the 65,535th share the last window's end and get no
                // address space; nobody simulates that many.
                let window = 1u64 << ADDRESS_WINDOW_BITS;
                let start = (i as u64 + 1).saturating_mul(window);
                DevState {
                    cfg,
                    physical: 0,
                    next_va: start,
                    end_va: start.saturating_add(window - 1),
                    ranges: BTreeMap::new(),
                    mapped: HashMap::new(),
                    pages: HashMap::new(),
                    plain: BTreeMap::new(),
                }
            })
            .collect();
        SimulatedBackend {
            state: Mutex::new(State {
                devices,
                clocks: HashMap::new(),
                timelines: HashMap::new(),
                // Below the per-thread keys' bit (1 << 62), above any key a test names.
                next_timeline: 1 << 61,
                dropped: Default::default(),
                borrowed: Default::default(),
                destroyed: Default::default(),
                generations: Default::default(),
                capturing: Default::default(),
                next_capture: 1,
                pool_refs: HashMap::new(),
                faults: Vec::new(),
                next_id: 1,
                calls: SimCalls::default(),
                events: None,
                uses: Vec::new(),
                violations: Vec::new(),
            }),
        }
    }

    /// `count` devices like an NVIDIA H200: 143,771 MiB with 2 MiB pages.
    pub fn h200(count: u32) -> Self {
        Self::new(
            (0..count)
                .map(|_| SimDevice {
                    total_memory: H200_TOTAL_MEMORY,
                    granularity: Some(H200_GRANULARITY),
                })
                .collect(),
        )
    }

    /// Enables (or disables) the log of mapping changes read by
    /// [`take_events`](Self::take_events).
    pub fn with_events(self, enabled: bool) -> Self {
        self.lock().events = if enabled { Some(Vec::new()) } else { None };
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Submits one work item (a kernel) to a stream; returns the stream's submitted
    /// count after it.
    /// The user lets go of `stream`: the pool may release it once it holds no live block
    /// made on it, and the stream is destroyed when the pool does
    /// ([`Backend::stream_released`]) or at once if the pool does not hold it.
    pub fn drop_stream(&self, stream: StreamKey) {
        let mut s = self.lock();
        s.dropped.insert(stream.0);
        if s.pool_refs.get(&stream.0).copied().unwrap_or(0) == 0 {
            s.destroyed.insert(stream.0);
        }
    }

    /// Makes `stream` a borrowed stream: the pool may rely on it only while it holds live
    /// blocks made on it (as with foreign streams through the C ABI); the test may
    /// [`destroy_stream`](Self::destroy_stream) it once every such block is freed.
    pub fn borrow_stream(&self, stream: StreamKey) {
        self.lock().borrowed.insert(stream.0);
    }

    /// Destroys `stream`: any later fence recorded on it or wait made by it is a pool bug
    /// and fails with [`SimError::DestroyedStream`]. Its work still completes.
    pub fn destroy_stream(&self, stream: StreamKey) {
        self.lock().destroyed.insert(stream.0);
    }

    /// Marks `stream` as being captured into a graph, or not: what
    /// [`Backend::is_capturing`] answers for it.
    /// Each call with `true` begins a new capture, with an id of its own.
    pub fn set_capturing(&self, stream: StreamKey, capturing: bool) {
        let mut s = self.lock();
        let stream = resolve(stream.0);
        if capturing {
            let id = s.next_capture;
            s.next_capture += 1;
            s.capturing.insert(stream, id);
        } else {
            s.capturing.remove(&stream);
        }
    }

    /// Creates a stream under an id that may have been used by a destroyed stream (a
    /// handle value the driver reuses): it gets a new, empty timeline, so work of the old
    /// stream does not complete with it.
    pub fn create_stream(&self, stream: StreamKey) {
        let mut s = self.lock();
        if s.destroyed.remove(&stream.0) {
            let t = s.next_timeline;
            s.next_timeline += 1;
            s.timelines.insert(stream.0, t);
            *s.generations.entry(stream.0).or_insert(0) += 1;
        }
        s.dropped.remove(&stream.0);
    }

    /// The stream that `handle` names now, as the driver backend knows an external stream:
    /// by an identity never reused (`cuStreamGetId`), here the handle with its generation
    /// (how many times it was created again after a destroy). The pool keys such a stream by
    /// this value, so a handle reused by a new stream is another key; the backend lets a
    /// borrowed stream named so *linger* ([`Backend::may_linger`]); and any use of the value
    /// after its handle was destroyed, or created again, fails with
    /// [`SimError::DestroyedStream`].
    pub fn stream_uid(&self, handle: StreamKey) -> StreamKey {
        assert!(
            handle.0 <= HANDLE_MASK,
            "simulated handles with uids are below 2^40"
        );
        let s = self.lock();
        StreamKey(UID_TAG | (generation(&s, handle.0) << GEN_SHIFT) | handle.0)
    }

    /// Whether `stream` was destroyed ([`destroy_stream`](Self::destroy_stream), or
    /// dropped by the user and released by the pool).
    pub fn is_destroyed(&self, stream: StreamKey) -> bool {
        self.lock().destroyed.contains(&stream.0)
    }

    /// Makes the `nth` call (1 = the next one) of `kind` from now on fail with
    /// [`SimError::Injected`]. Several injections may be pending at once.
    pub fn inject_failure(&self, kind: SimCall, nth: u64) {
        self.lock().faults.push((kind, nth.max(1)));
    }

    /// Forgets every pending injected failure.
    pub fn clear_failures(&self) {
        self.lock().faults.clear();
    }

    /// Records one unit of work submitted to `stream` (a kernel launch) and returns the
    /// stream's submitted count.
    pub fn submit_work(&self, device: DeviceId, stream: StreamKey) -> u64 {
        let mut s = self.lock();
        let t = timeline(&s, stream.0);
        let c = s.clocks.entry((device.0, t)).or_default();
        c.submitted += 1;
        c.submitted
    }

    /// Completes all work submitted to `stream` so far (and whatever it waited for).
    pub fn complete_stream(&self, device: DeviceId, stream: StreamKey) {
        let mut s = self.lock();
        let t = timeline(&s, stream.0);
        let to = s.clocks.get(&(device.0, t)).map_or(0, |c| c.submitted);
        complete_to(&mut s, device.0, t, to);
    }

    /// Completes the first `value` work items of `stream` (and whatever they waited for);
    /// nothing if they had.
    pub fn complete_up_to(&self, device: DeviceId, stream: StreamKey, value: u64) {
        let mut s = self.lock();
        let t = timeline(&s, stream.0);
        let to = s
            .clocks
            .get(&(device.0, t))
            .map_or(0, |c| c.submitted.min(value));
        complete_to(&mut s, device.0, t, to);
    }

    /// Completes all work submitted to every stream so far.
    pub fn complete_all(&self) {
        let mut s = self.lock();
        let all: Vec<((u32, u64), u64)> = s.clocks.iter().map(|(k, c)| (*k, c.submitted)).collect();
        for ((d, st), to) in all {
            complete_to(&mut s, d, st, to);
        }
    }

    /// Work items submitted to a stream so far.
    pub fn submitted(&self, device: DeviceId, stream: StreamKey) -> u64 {
        let s = self.lock();
        s.clocks
            .get(&(device.0, timeline(&s, stream.0)))
            .map_or(0, |c| c.submitted)
    }

    /// Work items of a stream completed so far.
    pub fn completed(&self, device: DeviceId, stream: StreamKey) -> u64 {
        let s = self.lock();
        s.clocks
            .get(&(device.0, timeline(&s, stream.0)))
            .map_or(0, |c| c.completed)
    }

    /// The highest submitted count of stream `on` that stream `waiter` was made to
    /// wait for ([`Backend::stream_wait_fence`]); 0 if none.
    pub fn waited(&self, device: DeviceId, waiter: StreamKey, on: StreamKey) -> u64 {
        let s = self.lock();
        s.clocks
            .get(&(device.0, timeline(&s, waiter.0)))
            .and_then(|c| c.waited.get(&timeline(&s, on.0)).copied())
            .unwrap_or(0)
    }

    /// Whether work submitted to `waiter` from now on runs after the first `value` work
    /// items of stream `on`: they have completed, or `waiter` is `on` (stream order), or
    /// `waiter` was made to wait ([`Backend::stream_wait_fence`]) for a point of some
    /// stream that is itself ordered after them, directly or through a chain of waits.
    pub fn is_ordered_after(
        &self,
        device: DeviceId,
        waiter: StreamKey,
        on: StreamKey,
        value: u64,
    ) -> bool {
        let point = self.point(device, on);
        self.is_ordered_after_point(device, waiter, SimPoint { value, ..point })
    }

    /// The current end of `stream`'s work (its submitted count), on the stream's current
    /// timeline: it stays the same point if the stream is destroyed and its id reused.
    pub fn point(&self, device: DeviceId, stream: StreamKey) -> SimPoint {
        let s = self.lock();
        let t = timeline(&s, stream.0);
        SimPoint {
            timeline: t,
            value: s.clocks.get(&(device.0, t)).map_or(0, |c| c.submitted),
        }
    }

    /// [`is_ordered_after`](Self::is_ordered_after) for a point taken with
    /// [`point`](Self::point).
    pub fn is_ordered_after_point(
        &self,
        device: DeviceId,
        waiter: StreamKey,
        point: SimPoint,
    ) -> bool {
        ordered_after(
            &self.lock(),
            device.0,
            waiter.0,
            point.timeline,
            point.value,
        )
    }

    /// Submits a work item to `stream` that uses `[addr, addr + len)` (a kernel reading and
    /// writing a block), and returns the stream's submitted count. Memory it uses must stay
    /// mapped, and go to no stream that is not ordered after it, until it completes.
    pub fn submit_use(&self, device: DeviceId, stream: StreamKey, addr: u64, len: u64) -> u64 {
        let mut s = self.lock();
        let t = timeline(&s, stream.0);
        let c = s.clocks.entry((device.0, t)).or_default();
        c.submitted += 1;
        let pos = c.submitted;
        // Completed uses are of no interest any more.
        let st = &mut *s;
        let clocks = &st.clocks;
        st.uses
            .retain(|&(d, t, p, ..)| clocks.get(&(d, t)).is_some_and(|c| p > c.completed));
        st.uses.push((device.0, t, pos, addr, len));
        pos
    }

    /// Checks that `stream`, given `[addr, addr + len)` now, runs its later work after every
    /// incomplete work item of other streams using that memory; records a violation (and
    /// returns false) for each one it is not ordered after.
    pub fn check_handout(&self, device: DeviceId, stream: StreamKey, addr: u64, len: u64) -> bool {
        let mut s = self.lock();
        let mut found = Vec::new();
        for &(d, t, pos, a, l) in &s.uses {
            if d == device.0
                && a < addr + len
                && addr < a + l
                && !ordered_after(&s, d, stream.0, t, pos)
            {
                found.push(format!(
                    "[{addr:#x}, +{len:#x}) handed to stream {:#x} while work {pos} of stream \
                     {t:#x} may still use [{a:#x}, +{l:#x})",
                    timeline(&s, stream.0)
                ));
            }
        }
        let ok = found.is_empty();
        add_violations(&mut s, found);
        ok
    }

    /// What went wrong so far: memory unmapped or freed under incomplete work, and handouts
    /// not ordered after the memory's earlier users (see [`submit_use`](Self::submit_use)).
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Physical bytes held on a device: pages created plus plain allocations.
    pub fn physical_bytes(&self, device: DeviceId) -> u64 {
        self.lock()
            .devices
            .get(device.0 as usize)
            .map_or(0, |d| d.physical)
    }

    /// Number of pages mapped on a device.
    pub fn mapped_pages(&self, device: DeviceId) -> usize {
        self.lock()
            .devices
            .get(device.0 as usize)
            .map_or(0, |d| d.mapped.len())
    }

    /// Bytes of address space reserved on a device.
    pub fn reserved_address_space(&self, device: DeviceId) -> u64 {
        self.lock()
            .devices
            .get(device.0 as usize)
            .map_or(0, |d| d.ranges.values().sum())
    }

    /// Live plain allocations of a device: (address, size, id).
    pub fn plain_allocations(&self, device: DeviceId) -> Vec<(u64, u64, u64)> {
        self.lock()
            .devices
            .get(device.0 as usize)
            .map_or_else(Vec::new, |d| {
                d.plain.iter().map(|(&a, &(s, id))| (a, s, id)).collect()
            })
    }

    /// The physical memory behind a device address: (id of the page or plain
    /// allocation, offset in it), or `None` when nothing is there.
    pub fn translate(&self, device: DeviceId, addr: u64) -> Option<(u64, u64)> {
        let s = self.lock();
        let d = s.devices.get(device.0 as usize)?;
        if let Some((&a, &(size, id))) = d.plain.range(..=addr).next_back() {
            if addr < a + size {
                return Some((id, addr - a));
            }
        }
        let g = d.cfg.granularity?;
        let (&base, &size) = d.ranges.range(..=addr).next_back()?;
        if addr >= base + size {
            return None;
        }
        let page_va = base + (addr - base) / g * g;
        d.mapped.get(&page_va).map(|&id| (id, addr - page_va))
    }

    /// The mapping changes logged since the last call (empty unless enabled with
    /// [`with_events`](Self::with_events)).
    pub fn take_events(&self) -> Vec<SimEvent> {
        self.lock()
            .events
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Counts of backend calls so far.
    pub fn calls(&self) -> SimCalls {
        self.lock().calls
    }
}

/// The stream `id` names on the calling thread: [`SimulatedBackend::PER_THREAD`] is the
/// thread's own per-thread stream.
fn resolve(id: u64) -> u64 {
    if id == SimulatedBackend::PER_THREAD.0 {
        crate::pool::per_thread_key().0
    } else if is_uid(id) {
        // A stream named with its generation (see `SimulatedBackend::stream_uid`): its handle.
        id & HANDLE_MASK
    } else {
        id
    }
}

/// Whether `id` names a stream with its generation ([`SimulatedBackend::stream_uid`]).
fn is_uid(id: u64) -> bool {
    id != SimulatedBackend::PER_THREAD.0
        && id & UID_TAG == UID_TAG
        && id & !(UID_TAG | GEN_MASK | HANDLE_MASK) == 0
}

/// Streams named with a generation ([`SimulatedBackend::stream_uid`]): the tag bits, the
/// generation's bits and the handle's bits.
const UID_TAG: u64 = 3 << 62;
const GEN_SHIFT: u32 = 40;
const GEN_MASK: u64 = ((1 << 20) - 1) << GEN_SHIFT;
const HANDLE_MASK: u64 = (1 << GEN_SHIFT) - 1;

/// The key in `State::clocks` of the current timeline of stream `id` (as named on the
/// calling thread).
fn timeline(s: &State, id: u64) -> u64 {
    let id = resolve(id);
    s.timelines.get(&id).copied().unwrap_or(id)
}

/// Whether the calling thread's `waiter` runs its later work after the first `value` items
/// of timeline `o` (see [`SimulatedBackend::is_ordered_after`]).
fn ordered_after(s: &State, device: u32, waiter: u64, o: u64, value: u64) -> bool {
    let w = timeline(s, waiter);
    let done = s.clocks.get(&(device, o)).map_or(0, |c| c.completed);
    if done >= value || w == o {
        return true;
    }
    // Depth-first over (timeline, position): the waiter sees everything its waits up to
    // `position` ordered it after.
    let mut best: HashMap<u64, u64> = HashMap::new();
    let mut stack = vec![(w, u64::MAX)];
    while let Some((t, pos)) = stack.pop() {
        if t == o && pos >= value {
            return true;
        }
        if best.get(&t).is_some_and(|&p| p >= pos) {
            continue;
        }
        best.insert(t, pos);
        if let Some(c) = s.clocks.get(&(device, t)) {
            for &(at, other, ov) in &c.log {
                if at <= pos {
                    stack.push((other, ov));
                }
            }
        }
    }
    false
}

/// Records a violation for each incomplete work item using memory in `[addr, addr + len)`
/// of `device` (memory about to be unmapped or freed).
fn check_unused(s: &mut State, device: u32, addr: u64, len: u64, what: &str) {
    let mut found = Vec::new();
    for &(d, t, pos, a, l) in &s.uses {
        let done = s.clocks.get(&(d, t)).map_or(0, |c| c.completed);
        if d == device && pos > done && a < addr + len && addr < a + l {
            found.push(format!(
                "{what} [{addr:#x}, +{len:#x}) while work {pos} of stream {t:#x} (completed {done}) \
                 still uses [{a:#x}, +{l:#x})"
            ));
        }
    }
    add_violations(s, found);
}

/// Keeps the first violations (a broken pool would otherwise fill memory with them).
fn add_violations(s: &mut State, found: Vec<String>) {
    let room = 64usize.saturating_sub(s.violations.len());
    s.violations.extend(found.into_iter().take(room));
}

/// Fails the call if a failure of `kind` is due.
fn fault(s: &mut State, kind: SimCall) -> Result<(), SimError> {
    let mut hit = false;
    s.faults.retain_mut(|(k, n)| {
        if *k != kind || hit {
            return true;
        }
        *n -= 1;
        if *n == 0 {
            hit = true;
            false
        } else {
            true
        }
    });
    if hit {
        s.calls.injected_failures += 1;
        return Err(SimError::Injected(kind));
    }
    Ok(())
}

/// Fails when `stream` no longer exists (a stream named with its generation also when its
/// handle now names a later stream: the driver would reach that other stream).
///
/// Such a use is also recorded as a violation: on a GPU it is undefined behaviour, which the
/// pool's callers may not see (some discard the error of a best-effort call).
fn alive(s: &mut State, stream: u64) -> Result<(), SimError> {
    let handle = resolve(stream);
    let stale = is_uid(stream) && (stream & GEN_MASK) >> GEN_SHIFT != generation(s, handle);
    if s.destroyed.contains(&handle) || stale {
        add_violations(
            s,
            vec![format!("stream {handle:#x} used after it was destroyed")],
        );
        return Err(SimError::DestroyedStream(handle));
    }
    Ok(())
}

/// How many times `handle` was created again after a destroy.
fn generation(s: &State, handle: u64) -> u64 {
    s.generations.get(&handle).copied().unwrap_or(0)
}

fn complete_to(s: &mut State, device: u32, stream: u64, value: u64) {
    let mut work = vec![(stream, value)];
    while let Some((st, v)) = work.pop() {
        let c = s.clocks.entry((device, st)).or_default();
        if v > c.completed {
            c.completed = v;
        }
        let completed = c.completed;
        c.waits.retain(|&(at, other, ov)| {
            if at <= completed {
                work.push((other, ov));
                false
            } else {
                true
            }
        });
    }
}

fn dev_mut(s: &mut State, device: DeviceId) -> Result<&mut DevState, SimError> {
    s.devices
        .get_mut(device.0 as usize)
        .ok_or(SimError::NoDevice(device.0))
}

fn granularity(d: &DevState, device: DeviceId) -> Result<u64, SimError> {
    match d.cfg.granularity {
        Some(0) => Err(SimError::Misaligned {
            what: "granularity",
            value: 0,
        }),
        Some(g) => Ok(g),
        None => Err(SimError::NoVirtualMemory(device.0)),
    }
}

fn take_va(d: &mut DevState, size: u64, align: u64) -> Option<u64> {
    let base = d.next_va.div_ceil(align).checked_mul(align)?;
    let end = base.checked_add(size)?;
    if end > d.end_va {
        return None;
    }
    d.next_va = end.saturating_add(GUARD);
    Some(base)
}

impl SimulatedBackend {
    /// `allocate`.
    fn allocate_plain(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, SimError> {
        let mut s = self.lock();
        s.calls.allocate += 1;
        fault(&mut s, SimCall::Allocate)?;
        let id = s.next_id;
        let d = dev_mut(&mut s, device)?;
        if d.physical.saturating_add(size) > d.cfg.total_memory {
            return Ok(None);
        }
        let Some(base) = take_va(d, size, 512) else {
            return Ok(None);
        };
        d.physical += size;
        d.plain.insert(base, (size, id));
        s.next_id += 1;
        Ok(Some(DeviceAddress(base)))
    }

    /// `create_physical`.
    fn create_page(&self, device: DeviceId, size: u64) -> Result<Option<SimPage>, SimError> {
        let mut s = self.lock();
        s.calls.create_physical += 1;
        fault(&mut s, SimCall::CreatePhysical)?;
        let id = s.next_id;
        let d = dev_mut(&mut s, device)?;
        let g = granularity(d, device)?;
        if size != g {
            return Err(SimError::Misaligned {
                what: "page size",
                value: size,
            });
        }
        if d.physical.saturating_add(size) > d.cfg.total_memory {
            return Ok(None);
        }
        d.physical += size;
        d.pages.insert(id, None);
        s.next_id += 1;
        Ok(Some(SimPage { id }))
    }
}

// SAFETY: the simulated device's memory is fake (addresses in a private window that nothing
// dereferences), so no call can cause undefined behaviour; beyond that the contract of
// `Backend` holds as a model: ranges, pages and plain segments never overlap, misuse of the
// unsafe methods (unknown, mapped or double-freed ranges and pages) is refused with an error,
// a fence is a value (stream, submitted count) that completes only once the stream's clock
// reaches it whatever else is done with copies of it, and `release_fence` only counts.
unsafe impl Backend for SimulatedBackend {
    type Stream = StreamKey;
    type Fence = SimFence;
    type Physical = SimPage;
    type Error = SimError;

    fn device_count(&self) -> Result<u32, SimError> {
        Ok(self.lock().devices.len() as u32)
    }

    fn device_info(&self, device: DeviceId) -> Result<DeviceInfo, SimError> {
        let mut s = self.lock();
        let d = dev_mut(&mut s, device)?;
        Ok(DeviceInfo {
            total_memory: d.cfg.total_memory,
            granularity: d.cfg.granularity,
        })
    }

    fn stream_key(&self, stream: &StreamKey) -> Result<StreamKey, crate::PoolError> {
        if is_uid(stream.0) {
            // Named with its generation (`stream_uid`): a key no later stream shares.
            return Ok(*stream);
        }
        Ok(StreamKey(resolve(stream.0)))
    }

    fn may_release_stream(&self, stream: &StreamKey) -> bool {
        if *stream == Self::PER_THREAD {
            // As the driver backend: let go once its blocks are freed.
            return true;
        }
        let s = self.lock();
        let handle = resolve(stream.0);
        s.dropped.contains(&handle) || s.borrowed.contains(&handle)
    }

    fn may_linger(&self, stream: &StreamKey) -> bool {
        is_uid(stream.0) && self.lock().borrowed.contains(&resolve(stream.0))
    }

    fn retain_stream(&self, stream: &StreamKey) -> StreamKey {
        *self.lock().pool_refs.entry(stream.0).or_insert(0) += 1;
        *stream
    }

    fn stream_released(&self, stream: StreamKey) {
        let mut s = self.lock();
        s.calls.stream_released += 1;
        let refs = s.pool_refs.entry(stream.0).or_insert(0);
        *refs = refs.saturating_sub(1);
        if *refs == 0 && s.dropped.contains(&stream.0) {
            s.destroyed.insert(stream.0);
        }
    }

    fn allocate(&self, device: DeviceId, size: u64) -> Result<Option<DeviceAddress>, SimError> {
        self.allocate_plain(device, size)
    }

    unsafe fn deallocate(
        &self,
        device: DeviceId,
        ptr: DeviceAddress,
        size: u64,
    ) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.deallocate += 1;
        fault(&mut s, SimCall::Deallocate)?;
        let d = dev_mut(&mut s, device)?;
        match d.plain.get(&ptr.0) {
            Some(&(sz, id)) if sz == size => {
                d.plain.remove(&ptr.0);
                d.physical -= size;
                check_unused(&mut s, device.0, ptr.0, size, "freed");
                if let Some(ev) = s.events.as_mut() {
                    ev.push(SimEvent::Deallocate {
                        device,
                        addr: ptr.0,
                        id,
                    });
                }
                drop(s);
                Ok(())
            }
            _ => Err(SimError::BadFree(ptr.0)),
        }
    }

    fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, SimError> {
        let mut s = self.lock();
        s.calls.reserve_address_range += 1;
        fault(&mut s, SimCall::ReserveAddressRange)?;
        let d = dev_mut(&mut s, device)?;
        let g = granularity(d, device)?;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(SimError::Misaligned {
                what: "range size",
                value: size,
            });
        }
        let Some(base) = take_va(d, size, g) else {
            return Ok(None);
        };
        d.ranges.insert(base, size);
        drop(s);
        let addr = DeviceAddress(base);
        Ok(Some(addr))
    }

    unsafe fn release_address_range(
        &self,
        device: DeviceId,
        base: DeviceAddress,
        size: u64,
    ) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.release_address_range += 1;
        fault(&mut s, SimCall::ReleaseAddressRange)?;
        let d = dev_mut(&mut s, device)?;
        if d.ranges.get(&base.0) != Some(&size) {
            return Err(SimError::NotReserved(base.0));
        }
        if d.mapped
            .keys()
            .any(|&va| va >= base.0 && va < base.0 + size)
        {
            return Err(SimError::RangeInUse(base.0));
        }
        d.ranges.remove(&base.0);
        drop(s);
        Ok(())
    }

    fn create_physical(&self, device: DeviceId, size: u64) -> Result<Option<SimPage>, SimError> {
        self.create_page(device, size)
    }

    unsafe fn release_physical(&self, device: DeviceId, page: SimPage) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.release_physical += 1;
        fault(&mut s, SimCall::ReleasePhysical)?;
        let d = dev_mut(&mut s, device)?;
        let g = granularity(d, device)?;
        match d.pages.get(&page.id) {
            None => Err(SimError::Unknown(page.id)),
            Some(Some(_)) => Err(SimError::PageInUse(page.id)),
            Some(None) => {
                d.pages.remove(&page.id);
                d.physical -= g;
                Ok(())
            }
        }
    }

    unsafe fn map(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page: &SimPage,
    ) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.map += 1;
        fault(&mut s, SimCall::Map)?;
        let d = dev_mut(&mut s, device)?;
        let g = granularity(d, device)?;
        let va = addr.0;
        let (&base, &size) = d
            .ranges
            .range(..=va)
            .next_back()
            .ok_or(SimError::NotReserved(va))?;
        if va + g > base + size {
            return Err(SimError::NotReserved(va));
        }
        if !(va - base).is_multiple_of(g) {
            return Err(SimError::Misaligned {
                what: "map address",
                value: va,
            });
        }
        if d.mapped.contains_key(&va) {
            return Err(SimError::AlreadyMapped(va));
        }
        match d.pages.get_mut(&page.id) {
            None => return Err(SimError::Unknown(page.id)),
            Some(Some(_)) => return Err(SimError::PageInUse(page.id)),
            Some(slot) => *slot = Some(va),
        }
        d.mapped.insert(va, page.id);
        if let Some(ev) = s.events.as_mut() {
            ev.push(SimEvent::Map {
                device,
                addr: va,
                page: page.id,
            });
        }
        drop(s);
        Ok(())
    }

    unsafe fn unmap(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        size: u64,
    ) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.unmap += 1;
        fault(&mut s, SimCall::Unmap)?;
        let d = dev_mut(&mut s, device)?;
        let g = granularity(d, device)?;
        if size != g {
            return Err(SimError::Misaligned {
                what: "unmap size",
                value: size,
            });
        }
        let id = d
            .mapped
            .remove(&addr.0)
            .ok_or(SimError::NotMapped(addr.0))?;
        check_unused(&mut s, device.0, addr.0, size, "unmapped");
        let d = dev_mut(&mut s, device)?;
        if let Some(slot) = d.pages.get_mut(&id) {
            *slot = None;
        }
        if let Some(ev) = s.events.as_mut() {
            ev.push(SimEvent::Unmap {
                device,
                addr: addr.0,
                page: id,
            });
        }
        drop(s);
        Ok(())
    }

    fn record_fence(&self, device: DeviceId, stream: &StreamKey) -> Result<SimFence, SimError> {
        let mut s = self.lock();
        s.calls.record_fence += 1;
        fault(&mut s, SimCall::RecordFence)?;
        alive(&mut s, stream.0)?;
        if device.0 as usize >= s.devices.len() {
            return Err(SimError::NoDevice(device.0));
        }
        let t = timeline(&s, stream.0);
        let value = s.clocks.entry((device.0, t)).or_default().submitted;
        drop(s);
        Ok(SimFence {
            device: device.0,
            stream: t,
            value,
        })
    }

    fn synchronize_stream(&self, stream: &StreamKey) -> Result<(), SimError> {
        let mut s = self.lock();
        fault(&mut s, SimCall::SynchronizeStream)?;
        alive(&mut s, stream.0)?;
        let t = timeline(&s, stream.0);
        let targets: Vec<(u32, u64)> = s
            .clocks
            .iter()
            .filter(|(k, _)| k.1 == t)
            .map(|(k, c)| (k.0, c.submitted))
            .collect();
        for (d, to) in targets {
            complete_to(&mut s, d, t, to);
        }
        Ok(())
    }

    fn fence_completed(&self, fence: &SimFence) -> Result<bool, SimError> {
        let mut s = self.lock();
        s.calls.fence_completed += 1;
        fault(&mut s, SimCall::FenceCompleted)?;
        let done = s
            .clocks
            .get(&(fence.device, fence.stream))
            .map_or(fence.value == 0, |c| c.completed >= fence.value);
        Ok(done)
    }

    /// No device-wide wait while any stream is being captured (as on a real device, where
    /// it would invalidate the capture).
    fn may_synchronize_device(&self, _device: DeviceId) -> bool {
        self.lock().capturing.is_empty()
    }

    fn is_capturing(&self, stream: &StreamKey) -> bool {
        let mut s = self.lock();
        // A question about a destroyed stream is a use of it (recorded as a violation).
        let _ = alive(&mut s, stream.0);
        s.capturing.contains_key(&resolve(stream.0))
    }

    fn capture_id(&self, stream: &StreamKey) -> Option<u64> {
        let mut s = self.lock();
        let _ = alive(&mut s, stream.0);
        s.capturing.get(&resolve(stream.0)).copied()
    }

    fn synchronize_device(&self, device: DeviceId) -> Result<(), SimError> {
        let mut s = self.lock();
        let all: Vec<((u32, u64), u64)> = s
            .clocks
            .iter()
            .filter(|(k, _)| k.0 == device.0)
            .map(|(k, c)| (*k, c.submitted))
            .collect();
        for ((d, st), to) in all {
            complete_to(&mut s, d, st, to);
        }
        Ok(())
    }

    fn wait_fence(&self, fence: &SimFence) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.wait_fence += 1;
        fault(&mut s, SimCall::WaitFence)?;
        complete_to(&mut s, fence.device, fence.stream, fence.value);
        Ok(())
    }

    fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: &StreamKey,
        fence: &SimFence,
    ) -> Result<(), SimError> {
        let mut s = self.lock();
        s.calls.stream_wait_fence += 1;
        fault(&mut s, SimCall::StreamWaitFence)?;
        alive(&mut s, stream.0)?;
        let t = timeline(&s, stream.0);
        let c = s.clocks.entry((device.0, t)).or_default();
        // The wait is itself a command of the stream: work after it cannot complete
        // before the fence has.
        c.submitted += 1;
        let at = c.submitted;
        c.waits.push((at, fence.stream, fence.value));
        c.log.push((at, fence.stream, fence.value));
        let w = c.waited.entry(fence.stream).or_insert(0);
        *w = (*w).max(fence.value);
        Ok(())
    }

    fn release_fence(&self, _fence: SimFence) {
        self.lock().calls.release_fence += 1;
    }
}
