//! Awaiting the GPU: futures that resolve when the device reaches a point in a stream
//! ([`Event::completion`], [`Stream::completion`]), for any executor.
//!
//! ```no_run
//! # async fn demo() -> cudars_core::Result<()> {
//! use cudars_core::{Device, Stream};
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! // ... queue work on `stream` ...
//! stream.completion()?.await?; // the task sleeps, the thread serves other tasks
//! # Ok(()) }
//! ```
//!
//! # No executor, no CUDA call in a callback
//!
//! The crate depends on no async runtime: a [`Completion`] is a plain
//! [`Future`] that stores the task's `Waker` and is
//! woken by one thread of this crate, the *reactor*, started at the first wait that is not
//! already complete and kept for the life of the process. The reactor owns a list of
//! pending waits, each an event, the waker and the shared outcome. It queries the events
//! (`cuEventQuery`) in rounds with an adaptive back-off ([`PollConfig`]): it spins for a few
//! microseconds after each wake-up, then yields its core a few times, then sleeps 1, 2, 4, ...
//! microseconds up to [`PollConfig::max_sleep`], and parks on a condition variable when no
//! wait is pending. Short sleeps are precise (the thread's timer slack is 1 us on Linux).
//!
//! # Faults reach every waiter
//!
//! A query that answers anything but "not ready" ends the wait with that error: a failed
//! stream, or a device fault such as `CUDA_ERROR_ILLEGAL_ADDRESS`, which the driver then
//! reports on every query of the context, so every pending future of that context gets it
//! (as [`Error::Driver`], `call` = `cuEventQuery`), within one round of
//! the reactor: at most [`PollConfig::max_sleep`] plus the round itself. Futures woken by a
//! host function ([`WakeStrategy::HostFunction`]) are checked the same way every
//! [`PollConfig::health_interval`] (100 ms by default, 1 s at most): after a fault the driver
//! never runs host functions, so a host function alone would wait forever.
//!
//! # Wake strategies
//!
//! [`WakeStrategy::Poll`] (the default) is the reactor above. [`WakeStrategy::HostFunction`]
//! puts a host function (`cuLaunchHostFunc`) after the recorded event: it only marks that it
//! ran and signals the reactor, which completes the wait and wakes the task on its own thread
//! (no CUDA call, nothing dropped and no waker touched on the driver's thread: a waker is the
//! executor's code, which may poll the task inline, and the task may call CUDA), while the
//! reactor also checks the wait's health. A host function occupies the stream until it has run, which costs a stream of
//! many small awaited operations throughput; the benchmark `bench_async` measures both.
//! The strategy applies to [`Stream::completion`]; an event alone has no stream to put a
//! host function on, so [`Event::completion`] is always polled.
//!
//! # Dropping a future early
//!
//! is safe and leaks nothing: the reactor owns its own reference to the event and drops it
//! (and the entry) at its next round; a host function still queued keeps the shared state
//! alive until it has run. A future never polled was never registered and costs nothing.
//! [`drop_after`] extends this to any value (a buffer the device still reads, say): it is
//! dropped on the reactor thread once the event completes, and leaked if the event fails.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use cudars_sys::CUcontext;

use crate::device::MAX_DEVICES;
use crate::driver::drv;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::stream::{Stream, StreamKind};

mod reactor;
#[cfg(test)]
mod tests;

use reactor::{host_wake, Entry, HostRef, Reactor, Shared, Source, Wait};

/// How a [`Stream::completion`] future learns that the device reached its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WakeStrategy {
    /// The reactor thread polls the recorded event with an adaptive back-off (the default).
    /// Adds nothing to the stream.
    #[default]
    Poll,
    /// A host function queued after the recorded event says the work is done and signals
    /// the reactor, which wakes the task on its own thread; the reactor checks the event every [`PollConfig::health_interval`] so that
    /// a device fault (after which host functions never run) still ends the wait. The host
    /// function holds the stream until it has run.
    HostFunction,
}

const STRATEGY_POLL: u8 = 0;
const STRATEGY_HOST: u8 = 1;

static STRATEGY: AtomicU8 = AtomicU8::new(STRATEGY_POLL);

/// Sets the strategy [`Stream::completion`] uses from now on, in the whole process
/// ([`Stream::completion_with`] picks one per call).
pub fn set_wake_strategy(strategy: WakeStrategy) {
    let v = match strategy {
        WakeStrategy::Poll => STRATEGY_POLL,
        WakeStrategy::HostFunction => STRATEGY_HOST,
    };
    STRATEGY.store(v, Ordering::Relaxed);
}

/// The strategy [`Stream::completion`] uses.
pub fn wake_strategy() -> WakeStrategy {
    match STRATEGY.load(Ordering::Relaxed) {
        STRATEGY_HOST => WakeStrategy::HostFunction,
        _ => WakeStrategy::Poll,
    }
}

/// The reactor's back-off and health check (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollConfig {
    /// How long the reactor polls without pausing after a wait finished, or after work
    /// arrived at an idle reactor. Default 20 us.
    pub spin: Duration,
    /// How many times it then yields its core (`sched_yield`) between rounds. Default 4.
    pub yields: u32,
    /// The longest sleep between two rounds, reached by doubling from 1 us: it bounds the
    /// wake-up latency of a long wait, and the time a fault takes to reach a polled future.
    /// Default 50 us; at most 100 ms.
    pub max_sleep: Duration,
    /// How often a wait that a host function completes is checked for a fault. Default
    /// 100 ms; more than 0 and at most 1 s.
    pub health_interval: Duration,
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            spin: Duration::from_micros(20),
            yields: 4,
            max_sleep: Duration::from_micros(50),
            health_interval: Duration::from_millis(100),
        }
    }
}

impl PollConfig {
    /// [`Error::InvalidArgument`] for settings outside the documented bounds.
    fn check(&self) -> Result<()> {
        if self.max_sleep > Duration::from_millis(100) {
            return Err(Error::InvalidArgument(format!(
                "PollConfig::max_sleep {:?} is above 100 ms",
                self.max_sleep
            )));
        }
        if self.health_interval.is_zero() || self.health_interval > Duration::from_secs(1) {
            return Err(Error::InvalidArgument(format!(
                "PollConfig::health_interval {:?} is outside (0, 1 s]: a fault must reach \
                 every waiter within a second",
                self.health_interval
            )));
        }
        Ok(())
    }
}

/// Sets the process-wide reactor's back-off; [`Error::InvalidArgument`] (and nothing
/// changes) for settings outside [`PollConfig`]'s bounds.
pub fn set_poll_config(config: PollConfig) -> Result<()> {
    config.check()?;
    reactor().set_config(config);
    Ok(())
}

/// The process-wide reactor's back-off.
pub fn poll_config() -> PollConfig {
    reactor().config()
}

/// Counters of the process-wide reactor, for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReactorStats {
    /// Waits the reactor holds now: pending futures, futures dropped but not yet collected,
    /// values waiting in [`drop_after`], host functions not yet run.
    pub waits: usize,
    /// Waits that ended with their point reached.
    pub completed: u64,
    /// Waits that ended with an error.
    pub failed: u64,
    /// Rounds of queries so far.
    pub rounds: u64,
    /// Sleeps between rounds so far.
    pub sleeps: u64,
    /// `cuEventQuery` calls the reactor made.
    pub queries: u64,
}

/// The process-wide reactor's counters.
pub fn stats() -> ReactorStats {
    reactor().stats()
}

fn reactor() -> &'static Reactor<Event> {
    static REACTOR: OnceLock<Reactor<Event>> = OnceLock::new();
    REACTOR.get_or_init(|| Reactor::new("cuda-core-reactor", PollConfig::default()))
}

impl Source for Event {
    #[inline]
    fn query(&self) -> Result<bool> {
        Event::query(self)
    }

    fn prepare_thread(&self) {
        // An explicit event carries its context, but the driver wants some context current:
        // make this device's current once, instead of a push and pop at every query.
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let asked = unsafe { drv!(cuCtxGetCurrent(&mut current)) };
        if asked.is_ok() && current.is_null() {
            let _ = self.device().make_current();
        }
    }

    fn recycle(self) {
        recycle_event(self);
    }
}

/// Most idle events kept per device for [`Stream::completion`].
const POOLED_EVENTS: usize = 1024;

static EVENT_POOLS: [Mutex<Vec<Event>>; MAX_DEVICES] =
    [const { Mutex::new(Vec::new()) }; MAX_DEVICES];

/// An untimed event of `stream`'s device, from the pool when one is idle.
fn pooled_event(stream: &Stream) -> Result<Event> {
    let device = stream.device();
    let reused = EVENT_POOLS
        .get(device.ordinal())
        .and_then(|p| p.lock().unwrap_or_else(PoisonError::into_inner).pop());
    match reused {
        Some(event) => Ok(event),
        None => Event::new(&device),
    }
}

/// Keeps `event` for a later [`Stream::completion`] if nobody else holds it (it completed;
/// re-recording it is fine).
fn recycle_event(event: Event) {
    if !event.is_unique() || event.timing_enabled() || event.is_interprocess() {
        return;
    }
    if let Some(pool) = EVENT_POOLS.get(event.device().ordinal()) {
        let mut pool = pool.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < POOLED_EVENTS {
            pool.push(event);
        }
    }
}

/// A future that resolves when the device reaches a point in a stream: `Ok(())`, or the
/// error that stopped the device from getting there (a failed stream, a device fault).
///
/// Made by [`Event::completion`] and [`Stream::completion`]. Runtime-agnostic (any
/// executor's waker), `Send`, `Unpin`. Dropping it before it resolves is safe and leaks
/// nothing (see the [module documentation](self#dropping-a-future-early)). Polled again
/// after it resolved, it returns the same outcome.
#[must_use = "a completion does nothing unless awaited"]
pub struct Completion {
    wait: Wait<Event>,
}

impl Completion {
    /// `true` once the outcome is known (a poll returns at once, without a driver call).
    pub fn is_resolved(&self) -> bool {
        self.wait.is_finished()
    }
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().wait.poll_wait(cx)
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("resolved", &self.is_resolved())
            .finish()
    }
}

/// [`Event::completion`].
pub(crate) fn event_completion(event: &Event) -> Completion {
    Completion {
        wait: Wait::new(reactor(), event.clone(), false),
    }
}

/// [`Stream::completion_with`].
pub(crate) fn stream_completion(stream: &Stream, strategy: WakeStrategy) -> Result<Completion> {
    // The capture check and the record go together: a capture begun through this crate
    // waits for both.
    let _issue = stream.issue_any();
    let may_capture =
        stream.kind() == StreamKind::External || crate::capture_gate::captures_in_progress();
    if may_capture && crate::graph::touches_capture(stream) {
        return Err(Error::InvalidArgument(
            "Stream::completion on a stream being captured into a graph: the point would be \
             a node of the graph, reached only when the graph is launched"
                .into(),
        ));
    }
    let event = pooled_event(stream)?;
    event.record(stream)?;
    match strategy {
        WakeStrategy::Poll => Ok(Completion {
            wait: Wait::new(reactor(), event, true),
        }),
        WakeStrategy::HostFunction => {
            let shared = Arc::new(Shared::new());
            let host = HostRef::new(&shared);
            let data = host.as_data();
            let launched = stream.with_context(|_| {
                // SAFETY: a live stream; `host_wake` matches CUhostFn and makes no CUDA
                // call; `data` is a reference on the shared state that stays alive until
                // `host_wake` says it is done with it (the reactor's entry holds it).
                unsafe { drv!(cuLaunchHostFunc(stream.raw(), Some(host_wake), data)) }
            });
            if let Err(e) = launched {
                // The driver did not take the host function: the reference is ours again.
                host.release();
                return Err(e);
            }
            match reactor().register(Entry::host(event, Arc::clone(&shared), host, true)) {
                Ok(()) => Ok(Completion {
                    wait: Wait::registered(reactor(), shared),
                }),
                Err((e, entry)) => {
                    // The host function is queued and will use its reference: leak it.
                    entry.abandon();
                    Err(e)
                }
            }
        }
    }
}

/// Drops `value` once the work recorded in `event` is done, without blocking: at once when
/// it is already done, else on the reactor's drop thread once the reactor sees it complete. If the
/// event reports an error (the device failed; it may still be using what `value` owns),
/// `value` is leaked, never dropped, and the error is returned when it is known now.
///
/// For what the device still reads or writes when its owner goes away: a host buffer of a
/// transfer whose future was dropped, device memory of a kernel in flight. `value`'s `Drop`
/// runs on the reactor's drop thread, never on the reactor's polling thread, so a slow drop
/// (freeing pinned memory waits for the device) holds up no other wait; a panic there is
/// caught. `event` must not be recorded again by anyone until then: a later record would
/// move the point the drop waits for.
///
/// ```no_run
/// use cudars_core::{completion, Device, DevicePtr, Stream};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let scratch = DevicePtr::alloc(&dev, 1 << 20)?;
/// scratch.memset_async(0, &stream)?;
/// let done = stream.record(None)?;
/// completion::drop_after(&done, scratch)?; // freed once the memset is done
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub fn drop_after<T: Send + 'static>(event: &Event, value: T) -> Result<()> {
    match event.query() {
        Ok(true) => {
            drop(value);
            Ok(())
        }
        Err(e) => {
            std::mem::forget(value);
            Err(e)
        }
        Ok(false) => match reactor().register(Entry::payload(event.clone(), Box::new(value))) {
            Ok(()) => Ok(()),
            // No reactor: wait here rather than drop early.
            Err((_, entry)) => match event.synchronize() {
                Ok(()) => {
                    drop(entry);
                    Ok(())
                }
                Err(e) => {
                    entry.abandon();
                    Err(e)
                }
            },
        },
    }
}

// The entry points live here, beside what they build, so that the event and stream modules
// need not know this one.
impl Event {
    /// A future that resolves when the work recorded in this event is done (at once when
    /// nothing was recorded, as [`Event::query`]): `Ok(())`, or the error that stopped the
    /// device (a failed stream, a device fault), which reaches every pending future of the
    /// context. Runtime-agnostic; see [`crate::completion`]. It holds a clone of the event,
    /// so the event lives until the future (and the reactor's entry for it) is gone.
    ///
    /// Always polled by the reactor thread ([`WakeStrategy::Poll`]):
    /// an event has no stream to put a host function on. The event need not be untimed,
    /// but untimed events (the default) are cheaper to query.
    ///
    /// ```no_run
    /// # async fn demo() -> cudars_core::Result<()> {
    /// use cudars_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let stream = Stream::new(&dev)?;
    /// // ... queue work on `stream` ...
    /// let done = stream.record(None)?;
    /// done.completion().await?;
    /// # Ok(()) }
    /// ```
    pub fn completion(&self) -> Completion {
        event_completion(self)
    }
}

impl Stream {
    /// A future that resolves when the device has done all the work queued on this stream
    /// so far (later work does not count): `Ok(())`, or the error that stopped the device (a
    /// failed stream, a device fault). Records an untimed event (reused from a small
    /// per-device pool) and waits for it with the process's
    /// [`wake_strategy`]; runtime-agnostic, see
    /// [`crate::completion`].
    ///
    /// A stream being captured into a graph is refused with [`Error::InvalidArgument`]: the
    /// point would be a graph node, reached only when the graph is launched.
    ///
    /// ```no_run
    /// # async fn demo() -> cudars_core::Result<()> {
    /// use cudars_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let stream = Stream::new(&dev)?;
    /// // ... queue work on `stream` ...
    /// stream.completion()?.await?;
    /// # Ok(()) }
    /// ```
    pub fn completion(&self) -> Result<Completion> {
        stream_completion(self, wake_strategy())
    }

    /// As [`Stream::completion`], with the given wake strategy for this wait.
    pub fn completion_with(&self, strategy: WakeStrategy) -> Result<Completion> {
        stream_completion(self, strategy)
    }
}
