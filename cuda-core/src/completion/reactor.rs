//! The machinery behind [`Completion`](super::Completion): the state a future shares with
//! whoever completes it ([`Shared`]), the future itself ([`Wait`]), and the thread that
//! polls the device ([`Reactor`]).
//!
//! Everything here is generic over a [`Source`] (what says "done", "not yet" or "failed"),
//! so the state machine runs on a CPU against a fake source in the unit tests; the
//! process-wide reactor's source is an [`Event`](crate::Event).
//!
//! # Who may touch what
//!
//! - The future (any thread, any executor) stores its waker, reads the outcome, and on drop
//!   marks the wait cancelled and drops its own waker.
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

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

use super::{PollConfig, ReactorStats};

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
        }
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
        }
    }

    fn source(&self) -> Option<&S> {
        self.source.as_ref()
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
        }
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
        let mut list: Vec<Entry<S>> = Vec::new();
        let mut prepared = false;
        let mut backoff = Backoff::new(self.config());
        loop {
            let config = self.config();
            {
                let mut incoming = lock(&self.incoming);
                if incoming.stop {
                    break;
                }
                if list.is_empty() && incoming.entries.is_empty() {
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
                list.append(&mut incoming.entries);
            }
            if !prepared {
                if let Some(source) = list.iter().find_map(Entry::source) {
                    source.prepare_thread();
                    prepared = true;
                }
            }
            let now = Instant::now();
            let progressed = self.round(&mut list, now, &config);
            self.entries.store(list.len(), Ordering::Relaxed);
            self.rounds.fetch_add(1, Ordering::Relaxed);
            if progressed {
                backoff = Backoff::new(config);
            }
            if list.is_empty() {
                continue;
            }
            let polled = list.iter().any(|e| e.host.is_none());
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
        for entry in list.drain(..) {
            if let Some(shared) = &entry.shared {
                shared.complete(Err(Error::Reactor("the reactor has stopped".into())));
            }
            entry.finish_failed();
        }
        self.entries.store(0, Ordering::Relaxed);
    }

    /// One pass over every entry; `true` when any finished.
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
                Verdict::Reached => {
                    if let Some(payload) = entry.finish_reached() {
                        self.drop_payload(payload);
                    }
                }
                Verdict::Failed => entry.finish_failed(),
                Verdict::Dropped | Verdict::Keep => drop(entry),
            }
        }
        progressed
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

/// The future behind [`Completion`](super::Completion), generic over its source.
///
/// Not registered until its first poll: a wait whose point is reached by then costs one
/// query and nothing else; one dropped unpolled costs nothing.
pub(crate) struct Wait<S: Source> {
    reactor: &'static Reactor<S>,
    state: WaitState<S>,
}

enum WaitState<S: Source> {
    /// Not polled yet: the source, and whether to recycle it.
    Fresh(S, bool),
    /// Registered with the reactor (or a host function).
    Waiting(Arc<Shared>),
    /// Ready was returned; polled again it returns the same.
    Finished(Result<()>),
}

impl<S: Source> Wait<S> {
    pub(crate) fn new(reactor: &'static Reactor<S>, source: S, recycle: bool) -> Self {
        Wait {
            reactor,
            state: WaitState::Fresh(source, recycle),
        }
    }

    pub(crate) fn registered(reactor: &'static Reactor<S>, shared: Arc<Shared>) -> Self {
        Wait {
            reactor,
            state: WaitState::Waiting(shared),
        }
    }

    /// `true` once the outcome is known without another query.
    pub(crate) fn is_finished(&self) -> bool {
        match &self.state {
            WaitState::Fresh(..) => false,
            WaitState::Waiting(shared) => shared.outcome().is_some(),
            WaitState::Finished(_) => true,
        }
    }

    pub(crate) fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let outcome = match &self.state {
            WaitState::Finished(outcome) => return Poll::Ready(outcome.clone()),
            WaitState::Waiting(shared) => match shared.poll(cx) {
                Poll::Ready(outcome) => outcome,
                Poll::Pending => return Poll::Pending,
            },
            WaitState::Fresh(source, _) => match source.query() {
                Ok(false) => return self.register(cx),
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
        };
        self.state = WaitState::Finished(outcome.clone());
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
        match self
            .reactor
            .register(Entry::poll(source, Arc::clone(&shared), recycle))
        {
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
        if let WaitState::Waiting(shared) = &self.state {
            shared.cancel();
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
