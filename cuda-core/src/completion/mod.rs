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
//! stream.completion()?.warm().await?; // the task keeps its thread hot: resumes sooner
//! # Ok(()) }
//! ```
//!
//! # No executor, no CUDA call in a callback
//!
//! The crate depends on no async runtime: a [`Completion`] is a plain [`Future`]. Its first
//! poll asks the driver (`cuEventQuery`) whether the point is reached: work already done
//! resolves there and then, with no registration, no waker and no other thread involved.
//! What happens next depends on the [`WakeMode`].
//!
//! # Wake modes: parked (the default) and warm
//!
//! **[`WakeMode::Parked`]**: the future stores the task's `Waker` with the *reactor*, one
//! thread of this crate started at the first wait that is not already complete and kept for
//! the life of the process, and returns `Pending`; the executor's thread is free (it may
//! sleep). The reactor queries the pending events in rounds with an adaptive back-off
//! ([`PollConfig`]): it spins for a few microseconds after each wake-up, then yields its core
//! a few times, then sleeps 1, 2, 4, ... microseconds up to [`PollConfig::max_sleep`] (12 us
//! by default), and parks on a condition variable when no wait is pending. Waits on the same
//! stream are batched: the reactor asks the newest point of each stream first (reached: every
//! older point of that stream is too, without a query of its own), then the oldest ones in
//! order, so a round costs about one query per stream, not one per future. Resuming costs
//! the reactor's detection delay (half a sleep, on average) plus the executor's own wake-up
//! of a sleeping thread (tens of microseconds on a virtual machine). CPU: the reactor's
//! rounds and short sleeps, a small fraction of a core, whatever the number of waits.
//!
//! **[`WakeMode::Warm`]**: for latency above all (a serving loop). The awaiting task's own
//! thread does not sleep: each poll spins on `cuEventQuery` in the polling thread for at most
//! [`WarmConfig::poll_spin`] (50 us by default, one query every half microsecond), returns
//! `Ready` directly when the point is reached (no waker, no reactor), and otherwise wakes its
//! own task and returns `Pending`, so the executor polls it again after its other ready
//! tasks: a bounded spin per poll, never a blocked executor. This goes on until the wait's
//! [`WarmConfig::spin_budget`] (1 ms by default, counted from the first poll) is spent; then
//! the wait takes the parked path above. Faults are seen at the next query, as in parked
//! mode.
//!
//! **The CPU bound of warm mode**: a warm wait keeps at most one thread busy, the one that
//! polls it, for at most its spin budget; a thread spins for one warm poll at a time, so the
//! number of spinning threads never exceeds the number of threads that poll futures (an
//! executor's workers), however many warm futures are pending ([`stats`] counts them:
//! [`ReactorStats::warm_spinning_peak`], [`ReactorStats::warm_threads`]). An executor may
//! also wake an idle worker to share a task that keeps re-scheduling itself (tokio does, one
//! searching worker at a time): CPU of the executor's, beyond the spinning thread, fewer the
//! longer [`WarmConfig::poll_spin`] is. Both knobs are [`WarmConfig`]'s; past the budget a
//! wait costs what a parked one costs.
//!
//! The mode is chosen at the first poll that finds the work not done, from, in order: the
//! future's own ([`Completion::with_mode`], [`Completion::warm`]); the polling thread's
//! ([`set_thread_wake_mode`]: set it in an executor's thread-start hook to make a whole
//! runtime warm); the process's ([`set_wake_mode`], initially from the environment variable
//! `CUDARS_WAKE_MODE`: `parked`, `warm` or `warm:<budget>` such as `warm:5ms`; see
//! [`WAKE_MODE_ENV`]).
//!
//! # Faults reach every waiter
//!
//! A query that answers anything but "not ready" ends the wait with that error: a failed
//! stream, or a device fault such as `CUDA_ERROR_ILLEGAL_ADDRESS`, which the driver then
//! reports on every query of the context, so every pending future of that context gets it
//! (as [`Error::Driver`], `call` = `cuEventQuery`): a warm future at its next query, a
//! parked one within one round of the reactor (at most [`PollConfig::max_sleep`] plus the
//! round itself). Futures woken by a host function ([`WakeStrategy::HostFunction`]) are
//! checked the same way every [`PollConfig::health_interval`] (100 ms by default, 1 s at
//! most): after a fault the driver never runs host functions, so a host function alone would
//! wait forever.
//!
//! # Wake strategies
//!
//! [`WakeStrategy::Poll`] (the default) is the reactor above. [`WakeStrategy::HostFunction`]
//! puts a host function (`cuLaunchHostFunc`) after the recorded event: it only marks that it
//! ran and signals the reactor, which completes the wait and wakes the task on its own thread
//! (no CUDA call, nothing dropped and no waker touched on the driver's thread: a waker is the
//! executor's code, which may poll the task inline, and the task may call CUDA), while the
//! reactor also checks the wait's health. A host function occupies the stream until it has
//! run, which costs a stream of many small awaited operations throughput; the benchmark
//! `bench_async` measures both. The strategy applies to [`Stream::completion`]; an event
//! alone has no stream to put a host function on, so [`Event::completion`] is always polled.
//! A warm wait of either strategy spins on its own event; the strategy decides what happens
//! once its budget is spent.
//!
//! # Dropping a future early
//!
//! is safe and leaks nothing: the reactor owns its own reference to the event and drops it
//! (and the entry) at its next round; a host function still queued keeps the shared state
//! alive until it has run. A future never polled was never registered and costs nothing; a
//! warm future dropped between two polls was never registered either and only drops its
//! event (the driver destroys it once its work is done). [`drop_after`] extends this to any
//! value (a buffer the device still reads, say): it is dropped on the reactor's drop thread
//! once the event completes, and leaked if the event fails.

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
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

use reactor::{host_wake, Entry, HostRef, Lane, Reactor, Shared, Source, Wait};

/// How a [`Stream::completion`] future learns that the device reached its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WakeStrategy {
    /// The reactor thread polls the recorded event with an adaptive back-off (the default).
    /// Adds nothing to the stream.
    #[default]
    Poll,
    /// A host function queued after the recorded event says the work is done and signals
    /// the reactor, which wakes the task on its own thread; the reactor checks the event
    /// every [`PollConfig::health_interval`] so that a device fault (after which host
    /// functions never run) still ends the wait. The host function holds the stream until it
    /// has run.
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

/// How an awaiting task waits once its first poll found the work not done (see the
/// [module documentation](self#wake-modes-parked-the-default-and-warm)).
///
/// ```
/// use std::time::Duration;
/// use cudars_core::completion::{WakeMode, WarmConfig};
/// let warm = WakeMode::Warm(WarmConfig::new(Duration::from_millis(5))?);
/// assert_eq!("warm:5ms".parse::<WakeMode>()?, warm);
/// assert_eq!("parked".parse::<WakeMode>()?, WakeMode::Parked);
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WakeMode {
    /// The task's thread is free while it waits; the reactor wakes the task (the default).
    #[default]
    Parked,
    /// The polling thread spins on the event, a bounded slice per poll, until the wait's
    /// spin budget is spent; then the parked path.
    Warm(WarmConfig),
}

impl WakeMode {
    /// Warm with the default [`WarmConfig`] (1 ms budget, 50 us a poll).
    pub const fn warm() -> WakeMode {
        WakeMode::Warm(WarmConfig::DEFAULT)
    }
}

/// The CPU a warm wait may spend: [`spin_budget`](Self::spin_budget) in all,
/// [`poll_spin`](Self::poll_spin) in one poll. Only valid values can be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarmConfig {
    spin_budget: Duration,
    poll_spin: Duration,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig::DEFAULT
    }
}

impl WarmConfig {
    /// 1 ms budget, 50 us a poll.
    pub const DEFAULT: WarmConfig = WarmConfig {
        spin_budget: Duration::from_millis(1),
        poll_spin: Duration::from_micros(50),
    };
    /// The longest spin budget: 10 s.
    pub const MAX_SPIN_BUDGET: Duration = Duration::from_secs(10);
    /// The longest spin in one poll: 1 ms (a poll must hand its thread back soon).
    pub const MAX_POLL_SPIN: Duration = Duration::from_millis(1);

    /// A budget of `spin_budget` (at most [`MAX_SPIN_BUDGET`](Self::MAX_SPIN_BUDGET); 0
    /// means "one query per poll, then parked") and the default spin per poll;
    /// [`Error::InvalidArgument`] above the bound.
    pub fn new(spin_budget: Duration) -> Result<WarmConfig> {
        if spin_budget > Self::MAX_SPIN_BUDGET {
            return Err(Error::InvalidArgument(format!(
                "WarmConfig spin budget {spin_budget:?} is above {:?}",
                Self::MAX_SPIN_BUDGET
            )));
        }
        Ok(WarmConfig {
            spin_budget,
            ..WarmConfig::DEFAULT
        })
    }

    /// The same budget, spinning at most `poll_spin` in one poll (at most
    /// [`MAX_POLL_SPIN`](Self::MAX_POLL_SPIN); 0: one query per poll, the task re-polled
    /// by its executor in between); [`Error::InvalidArgument`] above the bound.
    pub fn with_poll_spin(self, poll_spin: Duration) -> Result<WarmConfig> {
        if poll_spin > Self::MAX_POLL_SPIN {
            return Err(Error::InvalidArgument(format!(
                "WarmConfig poll spin {poll_spin:?} is above {:?}",
                Self::MAX_POLL_SPIN
            )));
        }
        Ok(WarmConfig { poll_spin, ..self })
    }

    /// How long a warm wait spins in all, from its first poll, before it parks.
    pub fn spin_budget(&self) -> Duration {
        self.spin_budget
    }

    /// How long one poll spins at most before it hands its thread back.
    pub fn poll_spin(&self) -> Duration {
        self.poll_spin
    }
}

/// Parses a duration such as `500us`, `2ms`, `1s` (units `ns`, `us`, `µs`, `ms`, `s`).
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit.trim() {
        "ns" => Some(Duration::from_nanos(n)),
        "us" | "µs" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        _ => None,
    }
}

impl FromStr for WakeMode {
    type Err = Error;

    /// `parked`, `warm` (the default budget) or `warm:<budget>` (`warm:500us`, `warm:5ms`).
    fn from_str(text: &str) -> Result<WakeMode> {
        let text = text.trim();
        let bad = || {
            Error::InvalidArgument(format!(
                "wake mode {text:?}: expected parked, warm or warm:<budget> (e.g. warm:5ms)"
            ))
        };
        match text.split_once(':') {
            None if text.eq_ignore_ascii_case("parked") => Ok(WakeMode::Parked),
            None if text.eq_ignore_ascii_case("warm") => Ok(WakeMode::warm()),
            Some((kind, budget)) if kind.eq_ignore_ascii_case("warm") => Ok(WakeMode::Warm(
                WarmConfig::new(parse_duration(budget).ok_or_else(bad)?)?,
            )),
            _ => Err(bad()),
        }
    }
}

/// The environment variable that sets the process's initial [`WakeMode`] (read once, at the
/// first use of [`wake_mode`]): `parked`, `warm` or `warm:<budget>`. A value that does not
/// parse leaves the mode parked. [`set_wake_mode`] overrides it.
pub const WAKE_MODE_ENV: &str = "CUDARS_WAKE_MODE";

/// The process's wake mode, packed in one word: 0 before it is first read or set; else
/// bit 0 set, bit 1 warm, bits 2..22 the poll spin in ns (at most 1 ms < 2^20 ns), bits
/// 22.. the budget in ns (at most 10 s < 2^34 ns).
static PROCESS_MODE: AtomicU64 = AtomicU64::new(0);

const MODE_SET: u64 = 1;
const MODE_WARM: u64 = 2;
const POLL_SPIN_BITS: u32 = 20;

fn encode_mode(mode: WakeMode) -> u64 {
    match mode {
        WakeMode::Parked => MODE_SET,
        WakeMode::Warm(c) => {
            // In range by construction (WarmConfig's bounds).
            let spin = c.poll_spin.as_nanos() as u64 & ((1 << POLL_SPIN_BITS) - 1);
            let budget = c.spin_budget.as_nanos() as u64;
            MODE_SET | MODE_WARM | (spin << 2) | (budget << (2 + POLL_SPIN_BITS))
        }
    }
}

fn decode_mode(word: u64) -> WakeMode {
    if word & MODE_WARM == 0 {
        return WakeMode::Parked;
    }
    WakeMode::Warm(WarmConfig {
        spin_budget: Duration::from_nanos(word >> (2 + POLL_SPIN_BITS)),
        poll_spin: Duration::from_nanos((word >> 2) & ((1 << POLL_SPIN_BITS) - 1)),
    })
}

/// Sets the [`WakeMode`] of every future of the process from now on that has no mode of its
/// own and is polled on a thread without one (see the
/// [module documentation](self#wake-modes-parked-the-default-and-warm)). A wait keeps the
/// mode it started with.
pub fn set_wake_mode(mode: WakeMode) {
    PROCESS_MODE.store(encode_mode(mode), Ordering::Relaxed);
}

/// The process's [`WakeMode`]: the last [`set_wake_mode`], else [`WAKE_MODE_ENV`]'s, else
/// parked.
pub fn wake_mode() -> WakeMode {
    let word = PROCESS_MODE.load(Ordering::Relaxed);
    if word != 0 {
        return decode_mode(word);
    }
    let from_env = std::env::var(WAKE_MODE_ENV)
        .ok()
        .and_then(|v| v.parse::<WakeMode>().ok())
        .unwrap_or_default();
    // A concurrent `set_wake_mode` wins.
    let _ = PROCESS_MODE.compare_exchange(
        0,
        encode_mode(from_env),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    decode_mode(PROCESS_MODE.load(Ordering::Relaxed))
}

thread_local! {
    static THREAD_MODE: Cell<Option<WakeMode>> = const { Cell::new(None) };
}

/// Sets the [`WakeMode`] of futures first polled on this thread (unless they have one of
/// their own), over the process's; `None` removes it. Returns the previous setting. For a
/// whole runtime, call it in the runtime's thread-start hook (tokio's
/// `Builder::on_thread_start`); for one thread of your own:
///
/// ```
/// use cudars_core::completion::{self, WakeMode};
/// std::thread::spawn(|| {
///     completion::set_thread_wake_mode(Some(WakeMode::warm()));
///     assert_eq!(completion::thread_wake_mode(), Some(WakeMode::warm()));
///     // ... run an executor here: the futures it polls first spin, then park ...
/// })
/// .join()
/// .unwrap();
/// ```
pub fn set_thread_wake_mode(mode: Option<WakeMode>) -> Option<WakeMode> {
    THREAD_MODE.with(|m| m.replace(mode))
}

/// This thread's [`WakeMode`], if [`set_thread_wake_mode`] gave it one.
pub fn thread_wake_mode() -> Option<WakeMode> {
    THREAD_MODE.with(Cell::get)
}

/// The mode of a future without one of its own, polled on this thread.
pub(crate) fn ambient_wake_mode() -> WakeMode {
    thread_wake_mode().unwrap_or_else(wake_mode)
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
    /// wake-up latency of a long parked wait (half of it on average), and the time a fault
    /// takes to reach a parked future. Default 12 us (a wake-up every 12 us costs the
    /// reactor's thread a small fraction of a core); at most 100 ms.
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
            max_sleep: Duration::from_micros(12),
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

/// Counters of the process-wide reactor and of warm waits, for tests and benchmarks.
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
    /// Of `completed`: waits completed without a query of their own, because a later point
    /// of the same stream was reached.
    pub batched: u64,
    /// Threads spinning in a warm poll now.
    pub warm_spinning: usize,
    /// The most threads ever spinning in warm polls at once.
    pub warm_spinning_peak: usize,
    /// Distinct threads that have ever spun for a warm wait.
    pub warm_threads: usize,
    /// Warm waits that saw their outcome while spinning (the reactor never held them).
    pub warm_resolved: u64,
    /// Warm waits whose spin budget ran out, which then took the parked path.
    pub warm_parked: u64,
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
    if let Some(pool) = EVENT_POOLS.get(device.ordinal()) {
        let mut pool = pool.lock().unwrap_or_else(PoisonError::into_inner);
        // Events of an ended context generation are dropped (which frees nothing), never
        // reused.
        while let Some(event) = pool.pop() {
            if !crate::health::is_stale(&event.device()) {
                return Ok(event);
            }
        }
    }
    Event::new(&device)
}

/// Keeps `event` for a later [`Stream::completion`] if nobody else holds it (it completed;
/// re-recording it is fine).
fn recycle_event(event: Event) {
    if !event.is_unique()
        || event.timing_enabled()
        || event.is_interprocess()
        || crate::health::usable(&event.device()).is_err()
    {
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
/// executor's waker), `Send`, `Unpin`. Parked by default; [`Completion::warm`] and
/// [`Completion::with_mode`] choose the [`WakeMode`] of this future (see the
/// [module documentation](self#wake-modes-parked-the-default-and-warm)). Dropping it before
/// it resolves is safe and leaks nothing (see the
/// [module documentation](self#dropping-a-future-early)). Polled again after it resolved,
/// it returns the same outcome.
#[must_use = "a completion does nothing unless awaited"]
pub struct Completion {
    wait: Wait<Event>,
}

impl Completion {
    /// `true` once the outcome is known (a poll returns at once, without a driver call).
    pub fn is_resolved(&self) -> bool {
        self.wait.is_finished()
    }

    /// This future waits in `mode`, whatever the thread's or the process's mode. Decided
    /// at the first poll that finds the work not done: on a future already spinning or
    /// parked it changes nothing.
    ///
    /// ```no_run
    /// # async fn demo() -> cudars_core::Result<()> {
    /// use std::time::Duration;
    /// use cudars_core::completion::{WakeMode, WarmConfig};
    /// use cudars_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let stream = Stream::new(&dev)?;
    /// // ... queue a step of about 3 ms on `stream` ...
    /// let warm = WakeMode::Warm(WarmConfig::new(Duration::from_millis(5))?);
    /// stream.completion()?.with_mode(warm).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_mode(mut self, mode: WakeMode) -> Completion {
        self.wait.set_mode(mode);
        self
    }

    /// [`with_mode`](Self::with_mode)`(`[`WakeMode::warm()`]`)`: spins in the polling
    /// thread, 50 us a poll, for up to 1 ms, then parks.
    pub fn warm(self) -> Completion {
        self.with_mode(WakeMode::warm())
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

/// Shards of the per-stream record order: a point recorded under a shard's lock gets a
/// number above every point of its stream recorded before it.
const LANE_SHARDS: usize = 16;

static LANE_SEQ: [Mutex<u64>; LANE_SHARDS] = [const { Mutex::new(0) }; LANE_SHARDS];

/// Records `event` on `stream`; for a stream whose identity is unique (one this crate made,
/// or an external one the driver names), also says where the point lies in the stream's
/// order of points recorded here, so that the reactor can batch the stream's waits.
fn record_in_lane(stream: &Stream, event: &Event) -> Result<Option<Lane>> {
    if !stream.identity_is_unique() {
        event.record(stream)?;
        return Ok(None);
    }
    let key = (stream.device().ordinal(), stream.identity());
    let shard = (key.1 as usize ^ key.0) % LANE_SHARDS;
    let mut seq = LANE_SEQ[shard]
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // The record and the number go together: two threads recording on one stream get
    // numbers in the stream's order.
    event.record(stream)?;
    *seq += 1;
    Ok(Some(Lane { key, seq: *seq }))
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
    match strategy {
        WakeStrategy::Poll => {
            let lane = record_in_lane(stream, &event)?;
            Ok(Completion {
                wait: Wait::new(reactor(), event, true).in_lane(lane),
            })
        }
        WakeStrategy::HostFunction => {
            event.record(stream)?;
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
            // A clone for a warm spin on the future's side (dropped at its first poll in
            // parked mode).
            let spin_source = event.clone();
            match reactor().register(Entry::host(event, Arc::clone(&shared), host, true)) {
                Ok(()) => Ok(Completion {
                    wait: Wait::hosted(reactor(), shared, spin_source),
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
    /// Always polled ([`WakeStrategy::Poll`]): an event has no stream to put a host
    /// function on; parked or warm as [`Completion::with_mode`] says. The event need not be
    /// untimed, but untimed events (the default) are cheaper to query.
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
    /// per-device pool) and waits for it with the process's [`wake_strategy`], parked or
    /// warm as [`Completion::with_mode`] says; runtime-agnostic, see [`crate::completion`].
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
