//! The machinery behind [`Completion`](super::Completion): the state a future shares with
//! whoever completes it ([`Shared`]), the future itself ([`Wait`], with its warm spin), and
//! the thread that polls the device ([`Reactor`], with its per-stream lanes).
//!
//! Everything here is generic over a [`Source`] (what says "done", "not yet" or "failed"),
//! so the state machine runs on a CPU against a fake source in the unit tests; the
//! process-wide reactor's source is an [`Event`](crate::Event).
//!
//! # Who may touch what
//!
//! - The future (any thread, any executor) stores its waker, reads the outcome, and on drop
//!   marks the wait cancelled and drops its own waker. A warm future queries its own source
//!   (a clone, for a host-function wait) while it spins, and owns it until it registers.
//! - The reactor thread queries sources, completes waits, wakes (consuming the waker), and is
//!   the only place where an entry with its source is dropped: so a source (an event) lives
//!   until the reactor lets go of it, whatever the future did. A reached entry's payload goes
//!   to the reactor's drop thread: its `Drop` may wait for the whole device (freeing pinned
//!   host memory synchronizes), which must not hold up the waits of other streams.
//! - A host function (driver thread, [`host_wake`]) may not call CUDA, drop anything that
//!   could, nor run an executor's code (a waker may poll a task inline, and the task may call
//!   CUDA): it only says it ran, its last access to the shared state, and signals the
//!   reactor, which completes the wait and wakes the task on its own thread. It never drops
//!   a reference count and never touches a waker.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

use super::{PollConfig, ReactorStats, WakeMode, WarmConfig};

/// What a wait waits for: a point the device reaches (an event), or a fake in tests.
pub(crate) trait Source: Send + Sync + 'static {
    /// `Ok(true)` once reached, `Ok(false)` before, `Err` when it never will (a failed
    /// stream, a device fault: sticky errors come back from every query of the context).
    fn query(&self) -> Result<bool>;

    /// Called once on the reactor thread with the first source it sees, before any query
    /// (an event makes its device's context current there).
    fn prepare_thread(&self) {}

    /// Called instead of a plain drop when the source was reached and nobody else holds it
    /// (an internal event goes back to its pool).
    fn recycle(self)
    where
        Self: Sized,
    {
    }
}

/// Locks, ignoring poisoning (the data is a waker slot or a queue: always consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

const PENDING: u8 = 0;
/// Someone won the right to complete; the outcome follows at once.
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;

/// The state a future shares with the reactor (and a host function).
pub(crate) struct Shared {
    state: AtomicU8,
    error: OnceLock<Error>,
    /// The waker of the last poll.
    waker: Mutex<Option<Waker>>,
    /// Whom a host function tells that it ran (the reactor holding the wait).
    signal: OnceLock<&'static dyn HostSignal>,
    /// The future was dropped before the outcome: the reactor drops the entry.
    cancelled: AtomicBool,
    /// The host function ran and will not touch this state again.
    host_done: AtomicBool,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            state: AtomicU8::new(PENDING),
            error: OnceLock::new(),
            waker: Mutex::new(None),
            signal: OnceLock::new(),
            cancelled: AtomicBool::new(false),
            host_done: AtomicBool::new(false),
        }
    }

    /// The outcome, once there is one.
    pub(crate) fn outcome(&self) -> Option<Result<()>> {
        match self.state.load(Ordering::Acquire) {
            DONE => Some(Ok(())),
            FAILED => Some(Err(self.error.get().cloned().unwrap_or_else(|| {
                Error::Reactor("a wait failed without its error".into())
            }))),
            _ => None,
        }
    }

    /// Claims the right to complete; `false` when another completer was first.
    fn claim(&self) -> bool {
        self.state
            .compare_exchange(PENDING, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Completes with `outcome` and wakes the future (consuming its waker), unless another
    /// completer was first. For the reactor thread (it drops things).
    fn complete(&self, outcome: Result<()>) -> bool {
        if !self.claim() {
            return false;
        }
        let state = match outcome {
            Ok(()) => DONE,
            Err(e) => {
                let _ = self.error.set(e);
                FAILED
            }
        };
        self.state.store(state, Ordering::Release);
        let waker = lock(&self.waker).take();
        if let Some(w) = waker {
            // A panicking waker must not end the reactor.
            let _ = catch_unwind(AssertUnwindSafe(|| w.wake()));
        }
        true
    }

    /// The future's side of a poll: the outcome, or `Pending` with the waker stored.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some(outcome) = self.outcome() {
            return Poll::Ready(outcome);
        }
        let replaced = {
            let mut slot = lock(&self.waker);
            match &*slot {
                Some(w) if w.will_wake(cx.waker()) => None,
                _ => slot.replace(cx.waker().clone()),
            }
        };
        drop(replaced);
        // A completer that stored its outcome before we stored the waker did not see it:
        // look again (the mutex orders the two).
        match self.outcome() {
            Some(outcome) => Poll::Ready(outcome),
            None => Poll::Pending,
        }
    }

    /// The future is gone: the reactor may drop the entry, nobody wakes it any more.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        let waker = lock(&self.waker).take();
        drop(waker);
    }
}

/// Told by a host function that it ran: the reactor, which then completes the wait and
/// wakes the task on its own thread.
pub(crate) trait HostSignal: Sync {
    /// A host function ran (called on the driver's thread: no CUDA, no executor code).
    fn host_fired(&self);
}

/// The host function of [`WakeStrategy::HostFunction`](super::WakeStrategy::HostFunction):
/// says the work before it is done and signals the reactor, which completes the wait and
/// wakes the task. No CUDA call, nothing dropped, no waker touched here: a waker is the
/// executor's code (it may run the task inline), and the task may call CUDA.
///
/// # Safety
///
/// `data` comes from `Arc::into_raw` of an `Arc<Shared>` whose reference the reactor keeps
/// until `host_done` is set (its [`HostRef`]), and the function is called at most once.
pub(crate) unsafe extern "C" fn host_wake(data: *mut c_void) {
    // SAFETY: the caller's contract: the reference behind `data` is alive until we set
    // `host_done` below, our last access.
    let shared = unsafe { &*(data as *const Shared) };
    // Read before `host_done`: afterwards the state may be gone. The reactor is 'static.
    let signal = shared.signal.get().copied();
    shared.host_done.store(true, Ordering::Release);
    if let Some(signal) = signal {
        // A panic must not unwind into the driver.
        let _ = catch_unwind(AssertUnwindSafe(|| signal.host_fired()));
    }
}

/// The reference a host function holds on a wait's shared state (from `Arc::into_raw`).
/// Released by the reactor once the host function said it is done; leaked when it may
/// never run (a device fault), so that a late run still finds live memory.
pub(crate) struct HostRef(*const Shared);

// SAFETY: the pointer is an `Arc<Shared>` reference, and `Shared` is Send + Sync.
unsafe impl Send for HostRef {}

impl HostRef {
    /// Makes the reference a host function will use.
    pub(crate) fn new(shared: &Arc<Shared>) -> HostRef {
        HostRef(Arc::into_raw(Arc::clone(shared)))
    }

    /// The `userData` pointer for the host function.
    pub(crate) fn as_data(&self) -> *mut c_void {
        self.0 as *mut c_void
    }

    /// Gives the reference back: only when the host function is done with it, or was never
    /// launched.
    pub(crate) fn release(self) {
        // SAFETY: the pointer came from Arc::into_raw in `new` and is released once (self
        // is consumed); no host function uses it any more (the caller's word).
        drop(unsafe { Arc::from_raw(self.0) });
    }

    /// Leaves the reference alive for good (the host function may still run).
    fn leak(self) {}
}

/// Something dropped (on the reactor's drop thread) after its source completed.
pub(crate) type Payload = Box<dyn Send>;

/// One wait the reactor watches.
pub(crate) struct Entry<S: Source> {
    source: Option<S>,
    shared: Option<Arc<Shared>>,
    payload: Option<Payload>,
    /// Set for waits that a host function completes: the reactor only checks their health.
    host: Option<HostRef>,
    /// Give the source back to its pool once reached.
    recycle: bool,
    /// For host-function waits: when to query the source next (the health check).
    next_check: Option<Instant>,
    /// For host-function waits: the source was seen reached, only the host function's
    /// release is awaited (and faults, which stop it from ever running).
    reached: bool,
    /// Where a polled wait's point lies in its stream (batched by the reactor).
    lane: Option<Lane>,
}

/// A stream, as the reactor batches its waits: (device ordinal, stream identity).
pub(crate) type LaneKey = (usize, u64);

/// Where a point lies in the order of the points this crate recorded on one stream: a
/// later point reached means every earlier one is (a stream runs its work in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) key: LaneKey,
    pub(crate) seq: u64,
}

impl<S: Source> Entry<S> {
    /// A wait the reactor completes by polling `source`.
    pub(crate) fn poll(source: S, shared: Arc<Shared>, recycle: bool) -> Self {
        Entry {
            source: Some(source),
            shared: Some(shared),
            payload: None,
            host: None,
            recycle,
            next_check: None,
            reached: false,
            lane: None,
        }
    }

    /// The same entry, batched with the other waits of its stream when `lane` says where it
    /// lies.
    pub(crate) fn in_lane(mut self, lane: Option<Lane>) -> Self {
        self.lane = lane;
        self
    }

    /// A wait that a host function completes; the reactor checks `source` for faults.
    pub(crate) fn host(source: S, shared: Arc<Shared>, host: HostRef, recycle: bool) -> Self {
        Entry {
            source: Some(source),
            shared: Some(shared),
            payload: None,
            host: Some(host),
            recycle,
            next_check: None,
            reached: false,
            lane: None,
        }
    }

    /// `payload` dropped once `source` is reached (leaked if it fails).
    pub(crate) fn payload(source: S, payload: Payload) -> Self {
        Entry {
            source: Some(source),
            shared: None,
            payload: Some(payload),
            host: None,
            recycle: false,
            next_check: None,
            reached: false,
            lane: None,
        }
    }

    fn source(&self) -> Option<&S> {
        self.source.as_ref()
    }

    /// The future is gone (polled waits only: a host function's wait stays until it ran).
    fn is_cancelled(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.cancelled.load(Ordering::Acquire))
    }

    /// A polled wait of a known stream: it goes to that stream's lane.
    fn lane_key(&self) -> Option<LaneKey> {
        match (&self.lane, &self.host, &self.shared) {
            (Some(lane), None, Some(_)) => Some(lane.key),
            _ => None,
        }
    }

    fn seq(&self) -> u64 {
        self.lane.map_or(0, |l| l.seq)
    }

    /// Finishes a reached entry: releases the host reference, recycles the source, and
    /// gives the payload back for the drop thread.
    fn finish_reached(mut self) -> Option<Payload> {
        let payload = self.payload.take();
        if let Some(host) = self.host.take() {
            host.release();
        }
        if let Some(source) = self.source.take() {
            if self.recycle {
                source.recycle();
            }
        }
        payload
    }

    /// Gives up on the entry as [`finish_failed`](Self::finish_failed) does: for a
    /// registration that failed.
    pub(crate) fn abandon(self) {
        self.finish_failed();
    }

    /// Finishes a failed entry: the payload and the host reference are leaked (the device
    /// may still use the one, a host function may still run with the other).
    fn finish_failed(mut self) {
        if let Some(payload) = self.payload.take() {
            std::mem::forget(payload);
        }
        if let Some(host) = self.host.take() {
            host.leak();
        }
    }
}

/// What a round decided about an entry.
enum Verdict {
    Keep,
    Reached,
    Failed,
    /// The future was dropped: drop the source (an event's destruction is deferred by the
    /// driver until its work is done).
    Dropped,
}

struct Incoming<S: Source> {
    entries: Vec<Entry<S>>,
    /// A host function ran since the last round.
    host_fired: bool,
    /// The reactor waits on the condition variable (empty list, or sleeping): registrations
    /// that arrive then notify it.
    parked: bool,
    stop: bool,
}

/// The thread that waits for the device for every future of the process.
pub(crate) struct Reactor<S: Source> {
    incoming: Mutex<Incoming<S>>,
    wakeup: Condvar,
    config: Mutex<PollConfig>,
    started: OnceLock<std::result::Result<(), String>>,
    name: &'static str,
    // Statistics.
    entries: AtomicUsize,
    completed: AtomicU64,
    failed: AtomicU64,
    rounds: AtomicU64,
    sleeps: AtomicU64,
    queries: AtomicU64,
    /// The drop thread's queue (started at the first payload; `None` when it could not be).
    dropper: OnceLock<Option<std::sync::mpsc::Sender<Payload>>>,
    /// Payloads sent to the drop thread and not yet dropped (counted as waits).
    drops_pending: AtomicUsize,
    batched: AtomicU64,
    // Warm waits (counted here so that each test reactor has its own).
    warm_spinning: AtomicUsize,
    warm_spinning_peak: AtomicUsize,
    warm_threads: AtomicUsize,
    warm_resolved: AtomicU64,
    warm_parked: AtomicU64,
}

/// The waits of one stream that the reactor holds, oldest point first.
struct Lanes<S: Source> {
    map: HashMap<LaneKey, VecDeque<Entry<S>>>,
}

impl<S: Source> Lanes<S> {
    fn new() -> Self {
        Lanes {
            map: HashMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.map.values().map(VecDeque::len).sum()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn insert(&mut self, key: LaneKey, entry: Entry<S>) {
        let lane = self.map.entry(key).or_default();
        // Points mostly arrive in order (then this is the end); a future polled late lands
        // before later ones.
        let seq = entry.seq();
        let at = lane.partition_point(|e| e.seq() < seq);
        lane.insert(at, entry);
    }

    fn drain_all(&mut self) -> impl Iterator<Item = Entry<S>> + '_ {
        self.map.drain().flat_map(|(_, lane)| lane)
    }

    fn first_source(&self) -> Option<&S> {
        self.map
            .values()
            .find_map(|lane| lane.iter().find_map(Entry::source))
    }
}

/// Counts a thread spinning in a warm poll while it lives.
struct Spinning<'a>(&'a AtomicUsize);

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

thread_local! {
    /// The reactors this thread has spun for (by address): counts distinct spinning threads.
    static SPUN_FOR: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

impl<S: Source> Reactor<S> {
    pub(crate) fn new(name: &'static str, config: PollConfig) -> Reactor<S> {
        Reactor {
            incoming: Mutex::new(Incoming {
                entries: Vec::new(),
                host_fired: false,
                parked: false,
                stop: false,
            }),
            wakeup: Condvar::new(),
            config: Mutex::new(config),
            started: OnceLock::new(),
            name,
            entries: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            dropper: OnceLock::new(),
            drops_pending: AtomicUsize::new(0),
            batched: AtomicU64::new(0),
            warm_spinning: AtomicUsize::new(0),
            warm_spinning_peak: AtomicUsize::new(0),
            warm_threads: AtomicUsize::new(0),
            warm_resolved: AtomicU64::new(0),
            warm_parked: AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> PollConfig {
        *lock(&self.config)
    }

    pub(crate) fn set_config(&self, config: PollConfig) {
        *lock(&self.config) = config;
        // A sleeping reactor picks the new setting up at once.
        self.wakeup.notify_one();
    }

    pub(crate) fn stats(&self) -> ReactorStats {
        let queued = lock(&self.incoming).entries.len();
        ReactorStats {
            waits: self.entries.load(Ordering::Relaxed)
                + queued
                + self.drops_pending.load(Ordering::Acquire),
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            rounds: self.rounds.load(Ordering::Relaxed),
            sleeps: self.sleeps.load(Ordering::Relaxed),
            queries: self.queries.load(Ordering::Relaxed),
            batched: self.batched.load(Ordering::Relaxed),
            warm_spinning: self.warm_spinning.load(Ordering::Relaxed),
            warm_spinning_peak: self.warm_spinning_peak.load(Ordering::Relaxed),
            warm_threads: self.warm_threads.load(Ordering::Relaxed),
            warm_resolved: self.warm_resolved.load(Ordering::Relaxed),
            warm_parked: self.warm_parked.load(Ordering::Relaxed),
        }
    }

    /// Counts this thread as spinning for a warm wait until the guard drops.
    fn spinning(&self) -> Spinning<'_> {
        let now = self.warm_spinning.fetch_add(1, Ordering::Relaxed) + 1;
        self.warm_spinning_peak.fetch_max(now, Ordering::Relaxed);
        let me = self as *const Self as usize;
        let first = SPUN_FOR
            .try_with(|seen| {
                let mut seen = seen.borrow_mut();
                if seen.contains(&me) {
                    false
                } else {
                    seen.push(me);
                    true
                }
            })
            .unwrap_or(false);
        if first {
            self.warm_threads.fetch_add(1, Ordering::Relaxed);
        }
        Spinning(&self.warm_spinning)
    }

    /// Starts the thread once.
    fn start(&'static self) -> Result<()> {
        self.started
            .get_or_init(|| {
                std::thread::Builder::new()
                    .name(self.name.into())
                    .spawn(move || self.run())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| Error::Reactor(format!("the thread could not be started: {e}")))
    }

    /// Hands `entry` to the reactor (starting it at the first call). On error the entry is
    /// given back, untouched.
    #[allow(
        clippy::result_large_err,
        reason = "the error path is rare (no thread, or a stopped reactor), and the entry \
                  must come back by value"
    )]
    pub(crate) fn register(
        &'static self,
        entry: Entry<S>,
    ) -> std::result::Result<(), (Error, Entry<S>)> {
        if let Err(e) = self.start() {
            return Err((e, entry));
        }
        let mut incoming = lock(&self.incoming);
        if incoming.stop {
            drop(incoming);
            return Err((Error::Reactor("the reactor has stopped".into()), entry));
        }
        if let (Some(_), Some(shared)) = (&entry.host, &entry.shared) {
            // A host function that runs before this is seen at the round after the push.
            let _ = shared.signal.set(self);
        }
        incoming.entries.push(entry);
        if incoming.parked {
            incoming.parked = false;
            drop(incoming);
            self.wakeup.notify_one();
        }
        Ok(())
    }

    /// Stops the thread after its current round (tests only: the process-wide reactor runs
    /// for the life of the process). Entries left are failed.
    #[cfg(test)]
    pub(crate) fn stop(&self) {
        lock(&self.incoming).stop = true;
        self.wakeup.notify_one();
    }

    fn run(&'static self) {
        #[cfg(target_os = "linux")]
        {
            // Short sleeps are the back-off's last stage: without this, Linux adds 50 us of
            // timer slack to every one of them.
            let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        }
        // Waits of unknown streams, host-function waits, payloads.
        let mut list: Vec<Entry<S>> = Vec::new();
        // Polled waits of known streams, batched per stream.
        let mut lanes: Lanes<S> = Lanes::new();
        let mut prepared = false;
        let mut backoff = Backoff::new(self.config());
        loop {
            let config = self.config();
            {
                let mut incoming = lock(&self.incoming);
                if incoming.stop {
                    break;
                }
                if list.is_empty() && lanes.is_empty() && incoming.entries.is_empty() {
                    incoming.parked = true;
                    incoming = self
                        .wakeup
                        .wait_while(incoming, |i| i.entries.is_empty() && !i.stop)
                        .unwrap_or_else(PoisonError::into_inner);
                    incoming.parked = false;
                    if incoming.stop {
                        break;
                    }
                    // Work arrived at an idle reactor: start with the spin.
                    backoff = Backoff::new(config);
                }
                incoming.host_fired = false;
                for entry in incoming.entries.drain(..) {
                    match entry.lane_key() {
                        Some(key) => lanes.insert(key, entry),
                        None => list.push(entry),
                    }
                }
                // Counted before the lock goes, so that no wait is ever missing from stats.
                self.entries
                    .store(list.len() + lanes.len(), Ordering::Relaxed);
            }
            if !prepared {
                if let Some(source) = list
                    .iter()
                    .find_map(Entry::source)
                    .or_else(|| lanes.first_source())
                {
                    source.prepare_thread();
                    prepared = true;
                }
            }
            let now = Instant::now();
            let progressed = self.round(&mut list, now, &config) | self.round_lanes(&mut lanes);
            self.entries
                .store(list.len() + lanes.len(), Ordering::Relaxed);
            self.rounds.fetch_add(1, Ordering::Relaxed);
            if progressed {
                backoff = Backoff::new(config);
            }
            if list.is_empty() && lanes.is_empty() {
                continue;
            }
            let polled = !lanes.is_empty() || list.iter().any(|e| e.host.is_none());
            let pause = if polled {
                backoff.next(config)
            } else {
                // Only waits that host functions complete: sleep until the next health
                // check.
                let due = list
                    .iter()
                    .filter_map(|e| e.next_check)
                    .min()
                    .unwrap_or(now + config.health_interval);
                Pause::Sleep(due.saturating_duration_since(Instant::now()))
            };
            match pause {
                Pause::Spin => std::hint::spin_loop(),
                Pause::Yield => std::thread::yield_now(),
                Pause::Sleep(d) => {
                    if d.is_zero() {
                        continue;
                    }
                    self.sleeps.fetch_add(1, Ordering::Relaxed);
                    let mut incoming = lock(&self.incoming);
                    if incoming.stop {
                        break;
                    }
                    if !incoming.entries.is_empty() || incoming.host_fired {
                        continue;
                    }
                    // New registrations during a back-off sleep (at most `max_sleep`) wait
                    // for its end; during a sleep until the next health check (only
                    // host-function waits held) they wake the reactor, as at an idle one.
                    // A host function that ran wakes it in either case.
                    incoming.parked = !polled;
                    let (mut incoming, _) = self
                        .wakeup
                        .wait_timeout_while(incoming, d, |i| {
                            !i.host_fired && !i.stop && (polled || i.entries.is_empty())
                        })
                        .unwrap_or_else(PoisonError::into_inner);
                    incoming.parked = false;
                    if incoming.stop {
                        break;
                    }
                }
            }
        }
        // Stopped (tests): whatever is left fails, registered or still queued.
        list.append(&mut lock(&self.incoming).entries);
        list.extend(lanes.drain_all());
        for entry in list.drain(..) {
            if let Some(shared) = &entry.shared {
                shared.complete(Err(Error::Reactor("the reactor has stopped".into())));
            }
            entry.finish_failed();
        }
        self.entries.store(0, Ordering::Relaxed);
    }

    /// One pass over every entry of the list; `true` when any finished.
    fn round(&'static self, list: &mut Vec<Entry<S>>, now: Instant, config: &PollConfig) -> bool {
        let mut progressed = false;
        let mut i = 0;
        while i < list.len() {
            let verdict = self.judge(&mut list[i], now, config);
            if matches!(verdict, Verdict::Keep) {
                i += 1;
                continue;
            }
            progressed = true;
            let entry = list.swap_remove(i);
            match verdict {
                Verdict::Reached => self.finish_reached(entry),
                Verdict::Failed => entry.finish_failed(),
                Verdict::Dropped | Verdict::Keep => drop(entry),
            }
        }
        progressed
    }

    /// One pass over every stream's lane; `true` when any wait finished.
    fn round_lanes(&'static self, lanes: &mut Lanes<S>) -> bool {
        let mut progressed = false;
        for lane in lanes.map.values_mut() {
            progressed |= self.round_lane(lane);
        }
        lanes.map.retain(|_, lane| !lane.is_empty());
        progressed
    }

    /// One stream's waits, oldest point first: the newest point is asked first (reached:
    /// so is every older one, without a query each); else the oldest ones, in order, up to
    /// the first not reached (the later ones cannot be). About one query per stream a round.
    fn round_lane(&'static self, lane: &mut VecDeque<Entry<S>>) -> bool {
        let before = lane.len();
        // Futures dropped: their entries go (an event's destruction is deferred by the driver
        // until its work is done).
        lane.retain(|e| !e.is_cancelled());
        let progressed = lane.len() != before;
        let mut newest_pending = false;
        if lane.len() > 1 {
            match lane.back().map(|e| self.query(e)) {
                Some(Ok(true)) => {
                    let n = lane.len();
                    for (i, entry) in lane.drain(..).enumerate() {
                        if i + 1 < n {
                            self.batched.fetch_add(1, Ordering::Relaxed);
                        }
                        self.reach(entry);
                    }
                    return true;
                }
                Some(Err(err)) => {
                    self.fail_all(lane, &err);
                    return true;
                }
                Some(Ok(false)) => newest_pending = true,
                None => {}
            }
        }
        let mut reached = false;
        while let Some(front) = lane.front() {
            if newest_pending && lane.len() == 1 {
                // The newest point, asked above.
                break;
            }
            match self.query(front) {
                Ok(true) => {
                    if let Some(entry) = lane.pop_front() {
                        self.reach(entry);
                        reached = true;
                    }
                }
                Ok(false) => break,
                Err(err) => {
                    self.fail_all(lane, &err);
                    return true;
                }
            }
        }
        progressed || reached
    }

    /// Asks an entry's source (counted).
    fn query(&self, entry: &Entry<S>) -> Result<bool> {
        let Some(source) = entry.source() else {
            return Ok(true);
        };
        self.queries.fetch_add(1, Ordering::Relaxed);
        source.query()
    }

    /// Completes a polled entry whose point is reached, wakes its future and finishes it.
    fn reach(&'static self, entry: Entry<S>) {
        if let Some(shared) = &entry.shared {
            shared.complete(Ok(()));
        }
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.finish_reached(entry);
    }

    /// Fails every entry of a lane with `err` (a sticky error: the stream's points after a
    /// failed one never come either).
    fn fail_all(&self, lane: &mut VecDeque<Entry<S>>, err: &Error) {
        for entry in lane.drain(..) {
            if let Some(shared) = &entry.shared {
                shared.complete(Err(err.clone()));
            }
            self.failed.fetch_add(1, Ordering::Relaxed);
            entry.finish_failed();
        }
    }

    /// Finishes a reached entry, its payload to the drop thread.
    fn finish_reached(&'static self, entry: Entry<S>) {
        if let Some(payload) = entry.finish_reached() {
            self.drop_payload(payload);
        }
    }

    /// Drops a reached entry's payload on the drop thread (a panicking `Drop` is caught
    /// there), counted in the stats' waits until it is dropped; inline, on this thread, when
    /// the drop thread cannot be started.
    fn drop_payload(&'static self, payload: Payload) {
        let dropper = self.dropper.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Payload>();
            std::thread::Builder::new()
                .name(format!("{}-drops", self.name))
                .spawn(move || {
                    for payload in rx {
                        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
                        self.drops_pending.fetch_sub(1, Ordering::Release);
                    }
                })
                .ok()
                .map(|_| tx)
        });
        self.drops_pending.fetch_add(1, Ordering::AcqRel);
        let unsent = match dropper {
            Some(tx) => tx.send(payload).err().map(|e| e.0),
            None => Some(payload),
        };
        if let Some(payload) = unsent {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            self.drops_pending.fetch_sub(1, Ordering::Release);
        }
    }

    fn judge(&self, e: &mut Entry<S>, now: Instant, config: &PollConfig) -> Verdict {
        if e.host.is_some() {
            let host_done = e
                .shared
                .as_ref()
                .is_some_and(|s| s.host_done.load(Ordering::Acquire));
            if host_done {
                // The host function only said so: the wait is completed, and the task woken,
                // here on the reactor's thread.
                if let Some(shared) = &e.shared {
                    shared.complete(Ok(()));
                }
                self.completed.fetch_add(1, Ordering::Relaxed);
                return Verdict::Reached;
            }
            match e.next_check {
                Some(due) if now < due => return Verdict::Keep,
                _ => e.next_check = Some(now + config.health_interval),
            }
        } else if let Some(shared) = &e.shared {
            if shared.cancelled.load(Ordering::Acquire) {
                return Verdict::Dropped;
            }
        }
        let Some(source) = e.source.as_ref() else {
            return Verdict::Dropped;
        };
        self.queries.fetch_add(1, Ordering::Relaxed);
        match source.query() {
            Ok(false) => Verdict::Keep,
            Ok(true) if e.host.is_some() => {
                // The host function completes (and releases) soon; completing here too is
                // harmless and saves the wait.
                if !e.reached {
                    e.reached = true;
                    if let Some(shared) = &e.shared {
                        shared.complete(Ok(()));
                    }
                }
                Verdict::Keep
            }
            Ok(true) => {
                if let Some(shared) = &e.shared {
                    shared.complete(Ok(()));
                }
                self.completed.fetch_add(1, Ordering::Relaxed);
                Verdict::Reached
            }
            Err(err) => {
                if let Some(shared) = &e.shared {
                    shared.complete(Err(err));
                }
                self.failed.fetch_add(1, Ordering::Relaxed);
                Verdict::Failed
            }
        }
    }
}

/// What the reactor does between two rounds.
#[derive(Debug, PartialEq)]
enum Pause {
    Spin,
    Yield,
    Sleep(Duration),
}

/// The adaptive back-off: spin for `config.spin`, then yield `config.yields` times, then
/// sleep 1 us, 2 us, 4 us, ... up to `config.max_sleep`. Reset when a wait finishes.
struct Backoff {
    spin_until: Instant,
    yields: u32,
    sleep: Duration,
}

/// The first sleep of the back-off's last stage.
const FIRST_SLEEP: Duration = Duration::from_micros(1);

impl Backoff {
    fn new(config: PollConfig) -> Backoff {
        Backoff {
            spin_until: Instant::now() + config.spin,
            yields: 0,
            sleep: FIRST_SLEEP,
        }
    }

    fn next(&mut self, config: PollConfig) -> Pause {
        if Instant::now() < self.spin_until {
            return Pause::Spin;
        }
        if self.yields < config.yields {
            self.yields += 1;
            return Pause::Yield;
        }
        let d = self.sleep.min(config.max_sleep);
        self.sleep = (self.sleep * 2).min(config.max_sleep.max(FIRST_SLEEP));
        Pause::Sleep(d)
    }
}

/// Between two queries of a warm spin: the driver is asked about two million times a second
/// at most, which leaves its locks to the threads that issue work.
const QUERY_GAP: Duration = Duration::from_nanos(500);

/// The future behind [`Completion`](super::Completion), generic over its source.
///
/// Not registered until its first poll: a wait whose point is reached by then costs one
/// query and nothing else; one dropped unpolled costs nothing. A warm wait is registered
/// only once its spin budget is spent.
pub(crate) struct Wait<S: Source> {
    reactor: &'static Reactor<S>,
    state: WaitState<S>,
    /// The future's own mode; `None`: the polling thread's, else the process's.
    mode: Option<WakeMode>,
    /// Where its point lies in its stream, for the reactor's batching.
    lane: Option<Lane>,
}

enum WaitState<S: Source> {
    /// Not polled yet: the source, and whether to recycle it.
    Fresh(S, bool),
    /// Registered with a host function at creation, not polled yet: a clone of the source
    /// for a warm spin.
    Hosted(Arc<Shared>, Option<S>),
    /// Spinning in the polling thread (warm mode), not registered (unless hosted).
    Warm(Spin<S>),
    /// Registered with the reactor (or a host function).
    Waiting(Arc<Shared>),
    /// Ready was returned; polled again it returns the same.
    Finished(Result<()>),
}

/// A warm wait's spin.
struct Spin<S: Source> {
    source: S,
    /// Give the source back to its pool once reached (else drop it).
    recycle: bool,
    /// The end of the spin budget.
    until: Instant,
    /// The longest spin in one poll.
    poll_spin: Duration,
    /// A host-function wait's shared state (the reactor completes it too).
    shared: Option<Arc<Shared>>,
}

impl<S: Source> Wait<S> {
    pub(crate) fn new(reactor: &'static Reactor<S>, source: S, recycle: bool) -> Self {
        Wait {
            reactor,
            state: WaitState::Fresh(source, recycle),
            mode: None,
            lane: None,
        }
    }

    /// A wait already registered (a host-function wait), never warm.
    #[cfg(test)]
    pub(crate) fn registered(reactor: &'static Reactor<S>, shared: Arc<Shared>) -> Self {
        Wait {
            reactor,
            state: WaitState::Waiting(shared),
            mode: None,
            lane: None,
        }
    }

    /// A host-function wait registered at creation; `spin_source`, a clone of its source,
    /// serves a warm spin (and is recycled if the spin sees it reached).
    pub(crate) fn hosted(
        reactor: &'static Reactor<S>,
        shared: Arc<Shared>,
        spin_source: S,
    ) -> Self {
        Wait {
            reactor,
            state: WaitState::Hosted(shared, Some(spin_source)),
            mode: None,
            lane: None,
        }
    }

    /// The same wait, batched by the reactor with the other waits of its stream.
    pub(crate) fn in_lane(mut self, lane: Option<Lane>) -> Self {
        self.lane = lane;
        self
    }

    /// The future's own mode (taken at the first poll that finds the work not done).
    pub(crate) fn set_mode(&mut self, mode: WakeMode) {
        self.mode = Some(mode);
    }

    /// The same wait with its own mode (tests).
    #[cfg(test)]
    pub(crate) fn with_mode(mut self, mode: WakeMode) -> Self {
        self.set_mode(mode);
        self
    }

    fn warm_config(&self) -> Option<WarmConfig> {
        match self.mode.unwrap_or_else(super::ambient_wake_mode) {
            WakeMode::Warm(config) => Some(config),
            WakeMode::Parked => None,
        }
    }

    /// `true` once the outcome is known without another query.
    pub(crate) fn is_finished(&self) -> bool {
        match &self.state {
            WaitState::Fresh(..) => false,
            WaitState::Hosted(shared, _) | WaitState::Waiting(shared) => shared.outcome().is_some(),
            WaitState::Warm(spin) => spin.shared.as_ref().is_some_and(|s| s.outcome().is_some()),
            WaitState::Finished(_) => true,
        }
    }

    pub(crate) fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let outcome = match &mut self.state {
            WaitState::Finished(outcome) => return Poll::Ready(outcome.clone()),
            WaitState::Waiting(shared) => match shared.poll(cx) {
                Poll::Ready(outcome) => outcome,
                Poll::Pending => return Poll::Pending,
            },
            WaitState::Warm(_) => return self.spin(cx),
            WaitState::Fresh(source, _) => match source.query() {
                Ok(false) => {
                    return match self.warm_config() {
                        Some(config) => {
                            self.start_spin(config);
                            self.spin(cx)
                        }
                        None => self.register(cx),
                    }
                }
                Ok(true) => {
                    if let WaitState::Fresh(source, true) =
                        std::mem::replace(&mut self.state, WaitState::Finished(Ok(())))
                    {
                        source.recycle();
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
            WaitState::Hosted(shared, spin_source) => match shared.outcome() {
                Some(outcome) => {
                    // The clone goes; reached, it returns to its pool if it is the last.
                    if let Some(source) = spin_source.take() {
                        if outcome.is_ok() {
                            source.recycle();
                        }
                    }
                    outcome
                }
                None => {
                    let shared = Arc::clone(shared);
                    let spin_source = spin_source.take();
                    return match (self.warm_config(), spin_source) {
                        (Some(config), Some(source)) => {
                            self.state = WaitState::Warm(Spin {
                                source,
                                recycle: true,
                                until: Instant::now() + config.spin_budget(),
                                poll_spin: config.poll_spin(),
                                shared: Some(shared),
                            });
                            self.spin(cx)
                        }
                        (_, source) => {
                            drop(source);
                            self.state = WaitState::Waiting(Arc::clone(&shared));
                            self.poll_wait(cx)
                        }
                    };
                }
            },
        };
        self.state = WaitState::Finished(outcome.clone());
        Poll::Ready(outcome)
    }

    /// A fresh wait whose point is not reached starts spinning.
    fn start_spin(&mut self, config: WarmConfig) {
        let until = Instant::now() + config.spin_budget();
        let state = std::mem::replace(&mut self.state, WaitState::Finished(Ok(())));
        self.state = match state {
            WaitState::Fresh(source, recycle) => WaitState::Warm(Spin {
                source,
                recycle,
                until,
                poll_spin: config.poll_spin(),
                shared: None,
            }),
            other => other,
        };
    }

    /// One poll of a warm wait: queries its source, one query every [`QUERY_GAP`], for up
    /// to the spin of one poll (or what is left of the budget); `Ready` as soon as the
    /// source answers. Not reached: the task wakes itself and returns `Pending` (its
    /// executor polls it again after its other ready tasks) while budget is left, else the
    /// wait takes the parked path.
    fn spin(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let WaitState::Warm(spin) = &self.state else {
            return self.poll_wait(cx);
        };
        // A host-function wait may have been completed by the reactor meanwhile.
        if let Some(outcome) = spin.shared.as_ref().and_then(|s| s.outcome()) {
            return self.end_spin(outcome);
        }
        let start = Instant::now();
        let slice_end = (start + spin.poll_spin).min(spin.until);
        let answer = {
            let _spinning = self.reactor.spinning();
            loop {
                match spin.source.query() {
                    Ok(false) => {}
                    Ok(true) => break Some(Ok(())),
                    Err(e) => break Some(Err(e)),
                }
                let now = Instant::now();
                if now >= slice_end {
                    break None;
                }
                let next = (now + QUERY_GAP).min(slice_end);
                while Instant::now() < next {
                    std::hint::spin_loop();
                }
            }
        };
        if let Some(outcome) = answer {
            self.reactor.warm_resolved.fetch_add(1, Ordering::Relaxed);
            return self.end_spin(outcome);
        }
        if Instant::now() < spin.until {
            // Runnable again at once: the executor's thread stays awake (other ready tasks
            // run first).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // The budget is spent: the parked path.
        self.reactor.warm_parked.fetch_add(1, Ordering::Relaxed);
        let state = std::mem::replace(&mut self.state, WaitState::Finished(Ok(())));
        let WaitState::Warm(spin) = state else {
            self.state = state;
            return self.poll_wait(cx);
        };
        match spin.shared {
            Some(shared) => {
                drop(spin.source);
                self.state = WaitState::Waiting(shared);
                self.poll_wait(cx)
            }
            None => {
                self.state = WaitState::Fresh(spin.source, spin.recycle);
                self.register(cx)
            }
        }
    }

    /// A warm wait learnt its outcome: its source is recycled when reached, else dropped.
    fn end_spin(&mut self, outcome: Result<()>) -> Poll<Result<()>> {
        let state = std::mem::replace(&mut self.state, WaitState::Finished(outcome.clone()));
        if let WaitState::Warm(spin) = state {
            if outcome.is_ok() && spin.recycle {
                spin.source.recycle();
            }
            // A host-function wait's entry stays with the reactor until the function ran;
            // the future no longer listens.
            if let Some(shared) = spin.shared {
                shared.cancel();
            }
        }
        Poll::Ready(outcome)
    }

    fn register(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let shared = Arc::new(Shared::new());
        *lock(&shared.waker) = Some(cx.waker().clone());
        let WaitState::Fresh(source, recycle) =
            std::mem::replace(&mut self.state, WaitState::Waiting(Arc::clone(&shared)))
        else {
            return Poll::Pending;
        };
        let entry = Entry::poll(source, Arc::clone(&shared), recycle).in_lane(self.lane);
        match self.reactor.register(entry) {
            Ok(()) => shared.poll(cx),
            Err((e, entry)) => {
                drop(entry);
                self.state = WaitState::Finished(Err(e.clone()));
                Poll::Ready(Err(e))
            }
        }
    }
}

impl<S: Source> HostSignal for Reactor<S> {
    fn host_fired(&self) {
        let mut incoming = lock(&self.incoming);
        incoming.host_fired = true;
        drop(incoming);
        self.wakeup.notify_one();
    }
}

impl<S: Source> Drop for Wait<S> {
    fn drop(&mut self) {
        match &self.state {
            WaitState::Waiting(shared) | WaitState::Hosted(shared, _) => shared.cancel(),
            WaitState::Warm(Spin {
                shared: Some(shared),
                ..
            }) => shared.cancel(),
            // A fresh or spinning polled wait owns its source, dropped with it.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_sleeps_doubling_up_to_the_cap() {
        let config = PollConfig {
            spin: Duration::ZERO,
            yields: 2,
            max_sleep: Duration::from_micros(10),
            health_interval: Duration::from_millis(100),
        };
        let mut b = Backoff::new(config);
        let us = |n| Pause::Sleep(Duration::from_micros(n));
        let seen: Vec<Pause> = (0..8).map(|_| b.next(config)).collect();
        assert_eq!(
            seen,
            vec![
                Pause::Yield,
                Pause::Yield,
                us(1),
                us(2),
                us(4),
                us(8),
                us(10),
                us(10)
            ]
        );
        let spinning = PollConfig {
            spin: Duration::from_secs(60),
            ..config
        };
        assert_eq!(Backoff::new(spinning).next(spinning), Pause::Spin);
    }
}
