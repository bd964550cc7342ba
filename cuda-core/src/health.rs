//! Surviving a device fault: each device's context health, its generation, and the reset.
//!
//! After a kernel faults (an illegal address, a trap, an uncorrectable ECC error), the driver
//! marks the context lost: every later call on it fails with the same *sticky* error, for
//! the life of the context. This module remembers, per device:
//! - whether its primary context is **lost**, and the first sticky error seen (the one that
//!   lost it);
//! - its **generation**: 0 at start, one more after each [`Device::reset_after_fault`].
//!
//! From the first sticky error on, every call of the workspace on that device returns one
//! typed error, [`Error::ContextLost`] `{ device, first }`, and calls whose answer is known
//! return it without asking the driver: binding the context, stream and event operations,
//! launches, pool allocations (cuda-mempool asks [`usable`]) and futures (the reactor fails
//! every wait of the device). NCCL reports a fault as an unhandled CUDA error; cuda-nccl asks
//! [`probe`] and returns `ContextLost` instead.
//!
//! A fault that only other code saw (PyTorch's or CuPy's own calls, with this workspace's
//! pool as their allocator through the C ABI) is noticed by [`watch`], which the pools call
//! on every allocation: one question to the driver per device per millisecond at most, a
//! clock read otherwise. The C ABI then raises the framework's CUDA error (see
//! `cuda_mempool_last_context_lost`).
//!
//! # What a reset loses
//!
//! Everything of the primary context: device memory (pool segments and blocks included),
//! streams, events, loaded modules, graphs and their executables, library handles (cuBLAS,
//! cuFFT, ...). Their handles in this workspace fail closed; NCCL communicators are left
//! alone (their host memory leaks: NCCL would free through the CUDA runtime, whose calls a
//! reset does not wait for). What survives: host memory that is not pinned, cuda-rtc's
//! compiled images (its cache), [`Device`] values. State of the same context held by code
//! outside the workspace (the CUDA runtime of PyTorch or CuPy) is lost too, and nothing
//! tells that code.
//!
//! # Reset, and the handles of the old context
//!
//! [`Device::reset_after_fault`] waits until no thread is inside a call of this crate on the
//! device (calls that start meanwhile fail with [`Error::ContextLost`]) and until the other
//! devices have done the work already queued on them (peer access may reach this device's
//! memory), then resets the
//! primary context (`cuDevicePrimaryCtxReset`: every allocation, stream, event, module and
//! graph of the context is destroyed by the driver) and starts a new generation.
//!
//! Every handle of this crate remembers the generation it was made in (its [`Device`]
//! value carries it). A handle of an older generation fails closed: using it returns
//! [`Error::ContextLost`] naming the error that ended its generation, and dropping it frees
//! nothing (the driver already destroyed what it named; freeing through it could free
//! memory of the new context that reuses the address). The pools of cuda-mempool forget the
//! old context's segments the same way.
//!
//! A [`Device`] value itself is a name: one kept from before the reset makes handles of the
//! new generation (constructors stamp the current generation first), and its own methods
//! (`synchronize`, `memory_info`, ...) act on the new context. Only [`Device::bind`] refuses
//! a value of an ended generation, since handles bind their device through it.
//!
//! # When the driver keeps the context lost
//!
//! The driver decides whether a reset brings the device back. On driver 580 (CUDA 13.0) on
//! an H200, after an illegal address, it does not: `cuDevicePrimaryCtxReset` succeeds, but
//! every later context of the process fails with the same error (retaining the primary
//! context again, creating another context, after waiting; measured with libcuda alone by
//! `bench/results/round13/reset_probe.py`). [`Device::reset_after_fault`] then tries again
//! for 5 s and returns [`Error::ContextLost`] with the driver's error; the old handles still
//! belong to an ended generation and the device stays closed. Only a new process gets the
//! device back: the service exits for its supervisor to start it again. The same driver
//! loses the process's other GPUs too: after an illegal address on GPU 0, retaining GPU 1's
//! primary context fails with the same error, with or without peer access between them
//! (`test_child other-gpu-after-fault`, 2 x H200); this module marks each device lost at
//! its first such error.
//!
//! # What a service does
//!
//! 1. **Drain**: stop taking work; let every task see its [`Error::ContextLost`] and drop
//!    what it held (or keep it: old handles stay inert).
//! 2. **Reset**: [`Device::reset_after_fault`].
//! 3. **Reload**: make streams, pools and modules again (cuda-rtc's cache keeps compiled
//!    images, so loading them into the new context compiles nothing).
//! 4. **Resume**.
//!
//! Where the reset fails (the driver keeps the context lost, see above), exit for a restart.
//!
//! ```no_run
//! use cudars_core::Device;
//! let dev = Device::new(0)?;
//! match dev.synchronize() {
//!     Err(e) if e.is_context_lost() => {
//!         eprintln!("device lost: {e}; resetting");
//!         if let Err(e) = dev.reset_after_fault() {
//!             eprintln!("the driver keeps the device lost ({e}): exiting for a restart");
//!             std::process::exit(3);
//!         }
//!         assert!(dev.health().is_healthy());
//!     }
//!     other => other?,
//! }
//! # Ok::<(), cudars_core::Error>(())
//! ```
//!
//! Other code in the process that holds CUDA state of the same primary context (the CUDA
//! runtime of PyTorch or CuPy, a library handle this workspace does not know) loses it in a
//! reset as well; only this workspace's handles are known to fail closed.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use cudars_sys::CUresult;

use crate::device::{Device, MAX_DEVICES};
use crate::error::{DriverError, Error, Result};

/// The driver's sticky errors: the ones its header documents as leaving the process "in an
/// inconsistent state" where "any further CUDA work will return the same error", and the
/// device-side assert, after which "the context cannot be used anymore".
pub const STICKY: [CUresult; 13] = [
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
    // CUDA_ERROR_CONTAINED (226): by value, since headers before CUDA 12.4 lack the name.
    CUresult(226),
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_ASSERT,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
    CUresult::CUDA_ERROR_EXTERNAL_DEVICE,
];

/// `true` for a code of [`STICKY`].
pub fn is_sticky(code: CUresult) -> bool {
    STICKY.contains(&code)
}

/// How long [`Device::reset_after_fault`] waits for the threads inside calls on the device.
pub const RESET_WAIT: Duration = Duration::from_secs(10);

struct State {
    generation: AtomicU32,
    /// Lost, or being reset: no call may start.
    closed: AtomicBool,
    /// The first sticky error of the current generation (`None` while healthy, and during a
    /// reset of a healthy context).
    first: Mutex<Option<DriverError>>,
    /// What ended each earlier generation, by generation (the last 64): the error a stale
    /// handle reports.
    ended: Mutex<Vec<(u32, Option<DriverError>)>>,
    /// Held by the reset, so that two resets of one device do not interleave.
    resetting: Mutex<()>,
}

impl State {
    const fn new() -> State {
        State {
            generation: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            first: Mutex::new(None),
            ended: Mutex::new(Vec::new()),
            resetting: Mutex::new(()),
        }
    }
}

static STATES: [State; MAX_DEVICES] = [const { State::new() }; MAX_DEVICES];

/// Live host-accessible allocations of each device's context (pinned host memory, managed
/// memory): the reset would unmap their host pages under safe references, so it waits for
/// none to be left.
static HOST_LIVE: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];

/// A host-accessible allocation of `ordinal`'s context was made.
pub(crate) fn host_allocation_made(ordinal: usize) {
    if let Some(c) = HOST_LIVE.get(ordinal) {
        c.fetch_add(1, Ordering::SeqCst);
    }
}

/// A host-accessible allocation of `ordinal`'s context is gone (freed, or leaked with no
/// reference left to it).
pub(crate) fn host_allocation_gone(ordinal: usize) {
    if let Some(c) = HOST_LIVE.get(ordinal) {
        let _ = c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
}

/// Resets made in this process, on any device: while 0, every generation is 0.
static RESETS: AtomicUsize = AtomicUsize::new(0);

/// Devices lost or being reset: while 0, the checks are one load.
static CLOSED: AtomicUsize = AtomicUsize::new(0);

fn state(ordinal: usize) -> Option<&'static State> {
    STATES.get(ordinal)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One thread's calls in progress, per device. Written by its thread only (a plain load and
/// store, no read-modify-write: the hot path of every call), read by a reset.
#[derive(Debug)]
#[repr(align(128))] // its own cache lines: the owning thread writes them on every call
struct ThreadCalls {
    depth: [AtomicU32; MAX_DEVICES],
    /// Owned by a live thread (else free for the next new thread).
    taken: AtomicBool,
    /// The device of the owning thread's innermost call ([`pack`]ed; 0: none): a sticky
    /// error is that device's, whatever context is current (explicit streams and events are
    /// used without binding their context). Written and read by the owning thread only.
    calling: AtomicU64,
}

/// A call's device and generation in one word: the ordinal plus one in the high half, the
/// generation in the low one; 0 for none.
#[inline]
fn pack(ordinal: usize, generation: u32) -> u64 {
    ((ordinal as u64 + 1) << 32) | u64::from(generation)
}

/// [`pack`]'s inverse.
#[inline]
fn unpack(word: u64) -> Option<(usize, u32)> {
    (word != 0).then(|| (((word >> 32) - 1) as usize, word as u32))
}

/// Every [`ThreadCalls`] ever made (leaked: a thread's is reused by a later thread once it
/// ends with no call in progress). Bounded by the most threads alive at once.
static THREADS: Mutex<Vec<&'static ThreadCalls>> = Mutex::new(Vec::new());

/// `true` once `membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)` succeeded: a reset
/// then puts a full barrier on every thread of the process, and the call path needs only a
/// compiler fence between counting itself in and reading the device's state. Else the
/// call path fences itself.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

fn register_barrier() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use rustix::thread::{membarrier, MembarrierCommand};
            if membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok() {
                ASYMMETRIC.store(true, Ordering::SeqCst);
            }
        }
    });
}

/// The reset's side of the barrier (see [`ASYMMETRIC`]).
fn barrier_on_every_thread() {
    std::sync::atomic::fence(Ordering::SeqCst);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if ASYMMETRIC.load(Ordering::SeqCst) {
        use rustix::thread::{membarrier, MembarrierCommand};
        if membarrier(MembarrierCommand::PrivateExpedited).is_err() {
            // Registered, so this does not fail; if it did, waiting a scheduler tick lets
            // every running thread pass a context switch (a full barrier) meanwhile.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A thread's slot for its [`ThreadCalls`].
#[derive(Clone, Copy)]
enum Slot {
    /// No call yet on this thread.
    Fresh,
    /// Its counts.
    Mine(&'static ThreadCalls),
    /// The thread is ending: calls from thread-local destructors count in [`LATE`]. With
    /// the counts it kept because a call was still in progress (a guard held in a
    /// thread-local), whose calling device stays readable.
    Gone(Option<&'static ThreadCalls>),
}

thread_local! {
    /// This thread's counts. Constant-initialised and without a destructor: one
    /// thread-local access on the hot path of every call, and readable during other
    /// thread-locals' destructors.
    static SLOT: std::cell::Cell<Slot> = const { std::cell::Cell::new(Slot::Fresh) };
    /// Gives the counts back when the thread ends; touched once, at the thread's first call.
    static RELEASE: Release = const { Release };
    /// The innermost call's device ([`pack`]ed) for calls counted in [`LATE`].
    static LATE_CALLING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// See [`RELEASE`].
struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let _ = SLOT.try_with(|slot| {
            if let Slot::Mine(t) = slot.get() {
                // Reusable only with no call left counted (one forgotten stays, and blocks
                // resets).
                if t.depth.iter().all(|d| d.load(Ordering::Acquire) == 0) {
                    slot.set(Slot::Gone(None));
                    t.taken.store(false, Ordering::Release);
                } else {
                    slot.set(Slot::Gone(Some(t)));
                }
            } else {
                slot.set(Slot::Gone(None));
            }
        });
    }
}

/// This thread's counts, taken at its first call; `None` once the thread is ending.
#[inline]
fn mine() -> Option<&'static ThreadCalls> {
    match SLOT.try_with(std::cell::Cell::get) {
        Ok(Slot::Mine(t)) => Some(t),
        Ok(Slot::Fresh) => take_counts(),
        Ok(Slot::Gone(_)) | Err(_) => None,
    }
}

/// The first call of a thread: takes a free [`ThreadCalls`] (or makes one) and arranges for
/// its return when the thread ends.
#[cold]
fn take_counts() -> Option<&'static ThreadCalls> {
    // The destructor first: a thread that can no longer register one is ending.
    if RELEASE.try_with(|_| ()).is_err() {
        let _ = SLOT.try_with(|s| s.set(Slot::Gone(None)));
        return None;
    }
    register_barrier();
    let mut all = lock(&THREADS);
    let free = all.iter().copied().find(|t| {
        t.taken
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    let calls = free.unwrap_or_else(|| {
        let made: &'static ThreadCalls = Box::leak(Box::new(ThreadCalls {
            depth: [const { AtomicU32::new(0) }; MAX_DEVICES],
            taken: AtomicBool::new(true),
            calling: AtomicU64::new(0),
        }));
        all.push(made);
        made
    });
    drop(all);
    calls.calling.store(0, Ordering::Relaxed);
    SLOT.try_with(|s| s.set(Slot::Mine(calls))).ok()?;
    Some(calls)
}

/// Calls made on threads whose own counts are torn down, per device.
static LATE: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

/// Where an [`InCall`] is counted.
#[derive(Debug, Clone, Copy)]
enum Depth {
    /// This thread's counts, and its count for the device.
    Own(&'static ThreadCalls, &'static AtomicU32),
    Late(&'static AtomicU32),
}

/// Threads counted inside calls on `ordinal`.
fn inside(ordinal: usize) -> usize {
    let own: usize = lock(&THREADS)
        .iter()
        .map(|t| t.depth[ordinal].load(Ordering::SeqCst) as usize)
        .sum();
    own + LATE[ordinal].load(Ordering::SeqCst) as usize
}

/// A device's state, as [`Device::health`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// The device's context generation: 0 at start, one more after each reset.
    pub generation: u32,
    /// The sticky error that lost the context, while it is lost.
    pub lost: Option<DriverError>,
}

impl Health {
    /// `true` while the context is not lost.
    pub fn is_healthy(&self) -> bool {
        self.lost.is_none()
    }
}

/// The current generation of `ordinal`'s context.
pub(crate) fn generation(ordinal: usize) -> u32 {
    state(ordinal).map_or(0, |s| s.generation.load(Ordering::Acquire))
}

pub(crate) fn health(ordinal: usize) -> Health {
    let Some(s) = state(ordinal) else {
        return Health {
            generation: 0,
            lost: None,
        };
    };
    Health {
        generation: s.generation.load(Ordering::Acquire),
        lost: *lock(&s.first),
    }
}

/// The error for a call on `device` when it cannot go to the driver: its generation ended,
/// or its context is lost or being reset; `None` when the call may go on.
fn refusal(device: &Device) -> Option<Error> {
    let ordinal = device.ordinal();
    let s = state(ordinal)?;
    let now = s.generation.load(Ordering::Acquire);
    let born = device.generation();
    if born != now {
        let first = lock(&s.ended)
            .iter()
            .find(|(g, _)| *g == born)
            .and_then(|(_, e)| *e);
        return Some(Error::ContextLost {
            device: ordinal,
            first: first.map(Box::new),
        });
    }
    if s.closed.load(Ordering::SeqCst) {
        return Some(Error::ContextLost {
            device: ordinal,
            first: lock(&s.first).map(Box::new),
        });
    }
    None
}

/// `Ok(())` when a call on `device` (a handle's device, with the generation the handle was
/// made in) may go to the driver, else the [`Error::ContextLost`] it returns instead.
#[inline]
pub fn usable(device: &Device) -> Result<()> {
    // No device lost or closed, and none ever reset: every handle is of generation 0.
    if CLOSED.load(Ordering::SeqCst) == 0 && RESETS.load(Ordering::SeqCst) == 0 {
        return Ok(());
    }
    match refusal(device) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How far apart, at least, [`watch`]'s questions to the driver about one device are.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(1);

/// When each device may be asked again by [`watch`], in nanoseconds of the coarse
/// monotonic clock.
static NEXT_WATCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// The coarse monotonic clock in nanoseconds (a read of the vDSO's last tick, a few
/// nanoseconds; it advances once per kernel tick, every 1 to 4 ms); 0 where there is none.
#[inline]
fn coarse_now_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
        (t.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Notices a fault that only other code saw: a pool serving PyTorch or CuPy through the C
/// ABI learns of a lost context here, where the framework's own calls met the sticky error
/// and none of this workspace's did.
///
/// At most once per [`WATCH_INTERVAL`] per device (in practice once per tick of the coarse
/// clock, 1 to 4 ms), asks the driver whether `stream`'s work failed (`cuStreamQuery`, about
/// 0.3 µs, in the relaxed capture mode). Measured on driver 580 (`bench/results/round14/
/// fault_calls.py`): after a kernel's illegal address, `cuStreamQuery` and `cuEventQuery`
/// answer the sticky error at once, while `cuStreamGetId`, `cuStreamIsCapturing` and
/// `cuCtxGetId` still answer success until some call has reported it. Between two questions
/// the check is a clock read and a load. Never asked while the stream is, or may be, captured
/// (a query there would invalidate the capture): then the first call after the next
/// interval asks.
///
/// `Err(ContextLost)` when the answer is a sticky error (the device is then marked lost, as
/// by any call), or when the device is already lost; `Ok(())` otherwise, any other error of
/// the question included (it says nothing about the context; the caller's own calls report
/// it).
///
/// ```no_run
/// use cudars_core::{health, Device, Stream};
/// let stream = Stream::new(&Device::new(0)?)?;
/// health::watch(&stream)?; // Ok while the context works
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[inline]
pub fn watch(stream: &crate::Stream) -> Result<()> {
    let device = stream.device();
    usable(&device)?;
    match NEXT_WATCH.get(device.ordinal()) {
        Some(next) if take_turn(next, coarse_now_ns()) => probe(stream),
        _ => Ok(()),
    }
}

/// `true` for the one caller whose turn it is to ask at `now` (the interval since the last
/// turn has passed); its turn moves the next one a [`WATCH_INTERVAL`] on.
#[inline]
fn take_turn(next: &AtomicU64, now: u64) -> bool {
    let due = next.load(Ordering::Relaxed);
    if now < due {
        return false;
    }
    let interval = WATCH_INTERVAL.as_nanos() as u64;
    next.compare_exchange(
        due,
        now.saturating_add(interval),
        Ordering::Relaxed,
        Ordering::Relaxed,
    )
    .is_ok()
}

/// [`watch`]'s question, asked now: whether `stream`'s work failed with a sticky error
/// (`cuStreamQuery` in the relaxed capture mode, the stream's device bound; not asked while
/// the stream is, or may be, captured, nor inside a host function; of the legacy stream only
/// its capture question, `cuStreamIsCapturing`, which reports the error once any call of the
/// process has met it). For a library whose own error says less than the driver's: NCCL reports a
/// faulted context as `ncclUnhandledCudaError`, and cuda-nccl asks this to return
/// [`Error::ContextLost`] instead. `Err(ContextLost)` as [`watch`]; `Ok(())` otherwise.
#[cold]
pub fn probe(stream: &crate::Stream) -> Result<()> {
    use crate::graph;
    let device = stream.device();
    // Never from a host function: no CUDA call may be made there.
    if crate::release::inside_host_function() {
        return usable(&device);
    }
    // Never a query of the legacy stream: it would join the capture of any blocking stream
    // of the context, which a foreign capture (CuPy's) may begin at any moment. Its capture
    // question (`cuStreamIsCapturing`) is safe during any capture, and answers the sticky
    // error once some call of the process has met it (the framework's own, typically: the
    // default streams of PyTorch and CuPy are the legacy stream). A driver error marks the
    // device lost through the usual path.
    if stream.kind() == crate::StreamKind::LegacyNull {
        let _ = graph::touches_capture(stream);
        return usable(&device);
    }
    // From the capture check to the query, a capture begun through this crate waits.
    let _gate = crate::capture_gate::issue_guard();
    if graph::may_be_captured(stream) && graph::touches_capture(stream) {
        // Ask again after the next interval.
        return usable(&device);
    }
    // The stream's own device current: a sticky error is then its context's.
    let Ok(_bound) = device.bind() else {
        return usable(&device);
    };
    let Ok(_relaxed) = graph::RelaxedCaptureMode::new() else {
        return usable(&device);
    };
    match stream.is_done() {
        Err(e) if e.is_context_lost() => Err(e),
        _ => usable(&device),
    }
}

/// How many resets this process has made, on any device. A cache of per-context state
/// (cuda-mempool's default pool) compares it with the count it was made at: while equal,
/// none of its handles can be stale (one load).
#[inline]
pub fn resets() -> usize {
    RESETS.load(Ordering::SeqCst)
}

/// `true` when a handle made with `device` belongs to an ended generation: its `Drop` must
/// free nothing.
#[inline]
pub fn is_stale(device: &Device) -> bool {
    device.generation() != generation(device.ordinal())
}

/// A thread inside a call on a device; a reset waits until none is left. Made by this
/// crate's calls, and by [`hold`] for calls of other libraries (NCCL) on the device's
/// context. Not `Send`: the count is the thread's own.
#[must_use = "the device is held only while the guard lives"]
#[derive(Debug)]
pub struct InCall {
    /// The count this call is in: this thread's own (single writer), or, on a thread whose
    /// own counts are already torn down (a call from a thread-local's destructor), the
    /// device's shared count of such calls.
    depth: Depth,
    /// The thread's calling device before this call ([`pack`]ed; restored on drop).
    outer: u64,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for InCall {
    fn drop(&mut self) {
        match self.depth {
            // This thread is the only writer.
            Depth::Own(t, d) => {
                t.calling.store(self.outer, Ordering::Relaxed);
                d.store(d.load(Ordering::Relaxed) - 1, Ordering::Release);
            }
            Depth::Late(d) => {
                let _ = LATE_CALLING.try_with(|c| c.set(self.outer));
                d.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// The device (and generation) of the calling thread's innermost call, if any.
fn calling() -> Option<(usize, u32)> {
    let late = || LATE_CALLING.try_with(std::cell::Cell::get).unwrap_or(0);
    let word = match SLOT.try_with(std::cell::Cell::get) {
        Ok(Slot::Mine(t)) => t.calling.load(Ordering::Relaxed),
        // A call from a thread-local destructor is innermost; else the call kept in
        // progress when the counts were given back.
        Ok(Slot::Gone(Some(t))) => match late() {
            0 => t.calling.load(Ordering::Relaxed),
            w => w,
        },
        _ => late(),
    };
    unpack(word)
}

/// Enters a call on `device`: [`Error::ContextLost`] instead when it may not go to the
/// driver.
#[inline]
pub(crate) fn enter(device: &Device) -> Result<InCall> {
    if device.ordinal() >= MAX_DEVICES {
        return Err(Error::InvalidDevice {
            ordinal: device.ordinal(),
            count: MAX_DEVICES,
        });
    }
    let word = pack(device.ordinal(), device.generation());
    let mine = mine();
    let depth = match mine {
        Some(t) => {
            let d = &t.depth[device.ordinal()];
            // This thread is the only writer: no read-modify-write.
            d.store(d.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            Depth::Own(t, d)
        }
        None => {
            let d = &LATE[device.ordinal()];
            d.fetch_add(1, Ordering::SeqCst);
            Depth::Late(d)
        }
    };
    // Counted in before reading the device's state. A reset closes the device, then puts a
    // barrier on every thread, then reads the counts: either it sees this thread's count,
    // or this thread sees the device closed.
    if ASYMMETRIC.load(Ordering::Relaxed) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        std::sync::atomic::fence(Ordering::SeqCst);
    }
    let outer = match depth {
        Depth::Own(t, _) => {
            let outer = t.calling.load(Ordering::Relaxed);
            t.calling.store(word, Ordering::Relaxed);
            outer
        }
        Depth::Late(_) => LATE_CALLING.try_with(|c| c.replace(word)).unwrap_or(0),
    };
    let call = InCall {
        depth,
        outer,
        _not_send: std::marker::PhantomData,
    };
    usable(device)?;
    Ok(call)
}

/// Holds off [`Device::reset_after_fault`] of `device` while the guard lives, for a call
/// that reaches the device's context outside this crate (cuda-nccl holds it around every
/// NCCL call): the reset waits until no thread holds the device, so the call never runs
/// against the new context. [`Error::ContextLost`] instead when the device is lost, being
/// reset, or `device` is of an ended generation: the caller must then leave the context
/// alone.
///
/// ```no_run
/// use cudars_core::{health, Device};
/// let dev = Device::new(0)?;
/// let _held = health::hold(&dev)?;
/// // ... a foreign library's call on device 0's context ...
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[inline]
pub fn hold(device: &Device) -> Result<InCall> {
    enter(device)
}

/// `true` while some device of the process is lost or being reset. For a library whose
/// teardown could wait on work that a lost device will never finish (an NCCL communicator
/// whose peer is on that device): it then aborts instead.
#[inline]
pub fn any_closed() -> bool {
    CLOSED.load(Ordering::SeqCst) != 0
}

/// Marks `ordinal`'s context lost by `first` (the first sticky error wins) and returns the
/// error every call reports from now on.
pub(crate) fn lose(ordinal: usize, first: DriverError) -> Error {
    let Some(s) = state(ordinal) else {
        return Error::Driver(first);
    };
    // Pending waits of the device end with the error at their next query, which this
    // module refuses without the driver (the reactor's round, a warm future's spin, a host
    // function wait's health check).
    let kept = {
        let mut slot = lock(&s.first);
        if slot.is_none() {
            *slot = Some(first);
            if !s.closed.swap(true, Ordering::SeqCst) {
                CLOSED.fetch_add(1, Ordering::SeqCst);
            }
        }
        *slot
    };
    Error::ContextLost {
        device: ordinal,
        first: kept.map(Box::new),
    }
}

/// The error a failed driver call returns: a sticky error marks the context current on this
/// thread lost and becomes [`Error::ContextLost`]; any error of a lost context reports the
/// first one.
pub(crate) fn on_error(error: DriverError) -> Error {
    let sticky = is_sticky(error.result());
    if !sticky && CLOSED.load(Ordering::Relaxed) == 0 {
        return Error::Driver(error);
    }
    let calling = calling();
    if let Some((ordinal, born)) = calling {
        if born != generation(ordinal) {
            // A late error of an ended generation: it says nothing of the new context.
            return Error::ContextLost {
                device: ordinal,
                first: Some(Box::new(error)),
            };
        }
    }
    let Some(ordinal) = calling
        .map(|(o, _)| o)
        .or_else(crate::device::current_primary_ordinal)
    else {
        return Error::Driver(error);
    };
    if sticky {
        return lose(ordinal, error);
    }
    match state(ordinal).and_then(|s| *lock(&s.first)) {
        Some(first) => Error::ContextLost {
            device: ordinal,
            first: Some(Box::new(first)),
        },
        None => Error::Driver(error),
    }
}

/// After the driver's reset: the old generation ends (remembered with `first`, the error
/// its stale handles report) and the device opens again, healthy.
fn start_generation(ordinal: usize, first: Option<DriverError>, still: Option<DriverError>) {
    let s = &STATES[ordinal];
    // Under the `first` lock, as `lose` takes it: the new generation starts lost (`still`)
    // or healthy in one step, never healthy for a moment in between.
    let mut slot = lock(&s.first);
    {
        let mut ended = lock(&s.ended);
        let old = s.generation.load(Ordering::Acquire);
        ended.push((old, first));
        if ended.len() > 64 {
            ended.remove(0);
        }
        // The device is closed here, so `usable` compares generations whatever it reads of
        // RESETS. Counted after the new generation shows: whoever reads the new count (a
        // cache made at the old one, see `resets`) also sees the new generation.
        s.generation.store(old.wrapping_add(1), Ordering::SeqCst);
        RESETS.fetch_add(1, Ordering::SeqCst);
    }
    *slot = still;
    if still.is_none() && s.closed.swap(false, Ordering::SeqCst) {
        CLOSED.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The reset: see [`Device::reset_after_fault`].
pub(crate) fn reset(device: &Device) -> Result<()> {
    let ordinal = device.ordinal();
    let Some(s) = state(ordinal) else {
        return Err(Error::InvalidDevice {
            ordinal,
            count: MAX_DEVICES,
        });
    };
    let _one = lock(&s.resetting);
    // Close the device: calls that start now fail; wait for those inside.
    if !s.closed.swap(true, Ordering::SeqCst) {
        CLOSED.fetch_add(1, Ordering::SeqCst);
    }
    let reopen = |s: &State| {
        if lock(&s.first).is_none() && s.closed.swap(false, Ordering::SeqCst) {
            CLOSED.fetch_sub(1, Ordering::SeqCst);
        }
    };
    barrier_on_every_thread();
    let started = Instant::now();
    while inside(ordinal) != 0 {
        if started.elapsed() > RESET_WAIT {
            reopen(s);
            return Err(Error::Timeout(format!(
                "Device::reset_after_fault: {} thread(s) still inside calls on device {ordinal} \
                 after {RESET_WAIT:?}",
                inside(ordinal)
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Pinned and managed memory of the context is unmapped from the host by the reset: with
    // a value still referring to it, safe code could read freed pages afterwards.
    let host = HOST_LIVE[ordinal].load(Ordering::SeqCst);
    if host != 0 {
        reopen(s);
        return Err(Error::InvalidArgument(format!(
            "Device::reset_after_fault: {host} pinned or managed allocation(s) of device \
             {ordinal} are still alive; the reset would unmap their host memory under them: \
             drop them (and empty the pools that cache them) first"
        )));
    }
    // Work already queued on other devices may still read or write this device's memory
    // (peer copies, kernels through peer access): it ends before the memory does, so that no
    // address of the new context is written by it. (New such work is refused: this device
    // is closed, and every issue checks the memory's device.) A device whose wait fails with
    // a lost context has stopped its work; any other failure (a capture in progress there
    // refuses the wait) leaves its work running, and the reset is refused: nothing is
    // freed under it.
    // Bounded: work on another device may wait forever for the lost one (an NCCL kernel
    // whose peer faulted); the wait runs on a thread of its own, left behind on a timeout.
    let others: Vec<usize> = crate::device::retained_ordinals()
        .into_iter()
        .filter(|&o| o != ordinal)
        .collect();
    if !others.is_empty() {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("cudars-reset-drain".into())
            .spawn(move || {
                let unfinished: Vec<(usize, Error)> = others
                    .into_iter()
                    .filter_map(|other| {
                        let waited = Device::new(other).and_then(|dev| dev.synchronize());
                        match waited {
                            Err(e) if !e.is_context_lost() => Some((other, e)),
                            _ => None,
                        }
                    })
                    .collect();
                let _ = tx.send(unfinished);
            });
        let drained = match spawned.map(|_| rx.recv_timeout(RESET_WAIT)) {
            Ok(Ok(unfinished)) => unfinished,
            _ => {
                reopen(s);
                return Err(Error::Timeout(format!(
                    "Device::reset_after_fault: work on the other devices did not finish \
                     within {RESET_WAIT:?} (it may reach device {ordinal}'s memory; a \
                     collective waiting for a peer on device {ordinal} never finishes: abort \
                     its communicators first)"
                )));
            }
        };
        if let Some((other, e)) = drained.into_iter().next() {
            reopen(s);
            return Err(Error::InvalidArgument(format!(
                "Device::reset_after_fault: could not wait for the work on device {other} \
                 ({e}), which may reach device {ordinal}'s memory; nothing was reset (end \
                 its captures and try again)"
            )));
        }
    }
    // Waits of the device query their events through the generation check: after the
    // reset they are refused before the driver sees a destroyed handle.
    let first = *lock(&s.first);
    match crate::device::reset_primary(device) {
        // Nothing was destroyed.
        Err(e) => {
            reopen(s);
            Err(e)
        }
        Ok(Ok(())) => {
            start_generation(ordinal, first, None);
            Ok(())
        }
        // The old context is gone (its handles now belong to an ended generation), but the
        // driver still fails the new one: it stays lost, with the error it gives.
        Ok(Err(e)) => {
            let still = match &e {
                Error::Driver(d) => *d,
                _ => DriverError::new(CUresult::CUDA_ERROR_UNKNOWN, "reset_after_fault"),
            };
            start_generation(ordinal, first, Some(still));
            Err(match e {
                Error::Driver(d) => Error::ContextLost {
                    device: ordinal,
                    first: Some(Box::new(d)),
                },
                other => other,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_codes_are_the_documented_ones() {
        assert!(is_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        assert!(is_sticky(CUresult::CUDA_ERROR_ECC_UNCORRECTABLE));
        assert!(!is_sticky(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_sticky(CUresult::CUDA_ERROR_NOT_READY));
        assert!(!is_sticky(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn a_lost_device_refuses_calls_and_names_the_first_error() {
        // Ordinal 63: no other test uses it.
        let dev = Device::test_only(63);
        assert!(usable(&dev).is_ok());
        let first = DriverError {
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS",
            message: "an illegal memory access was encountered",
            call: "cuStreamSynchronize",
        };
        let e = lose(63, first);
        assert!(matches!(e, Error::ContextLost { device: 63, first: Some(f) } if *f == first));
        // A second sticky error does not replace the first.
        let later = DriverError {
            call: "cuMemAlloc",
            ..first
        };
        assert!(
            matches!(lose(63, later), Error::ContextLost { first: Some(f), .. } if f.call == "cuStreamSynchronize")
        );
        assert!(matches!(
            enter(&dev),
            Err(Error::ContextLost { device: 63, .. })
        ));
        assert_eq!(health(63).lost, Some(first));
        assert!(!health(63).is_healthy());
        // A handle of another generation is stale and refused too.
        assert!(!is_stale(&dev));
        let other = dev.with_generation(7);
        assert!(is_stale(&other));
        assert!(matches!(usable(&other), Err(Error::ContextLost { .. })));
        assert_eq!(inside(63), 0, "a refused call does not stay counted");
    }

    #[test]
    fn after_a_reset_handles_of_every_earlier_generation_are_refused() {
        // Ordinal 61: no other test uses it. The driver's reset is not called here; the
        // bookkeeping after it is.
        let old = Device::test_only(61);
        assert!(usable(&old).is_ok());
        let first = DriverError {
            code: 719,
            name: "CUDA_ERROR_LAUNCH_FAILED",
            message: "unspecified launch failure",
            call: "cuCtxSynchronize",
        };
        let _ = lose(61, first);
        start_generation(61, Some(first), None);
        assert_eq!(generation(61), 1);
        assert!(health(61).is_healthy());
        // A generation-0 handle: refused (not let through by the no-reset fast path), with
        // the error that ended its generation; its drop must free nothing.
        assert!(is_stale(&old));
        assert!(
            matches!(usable(&old), Err(Error::ContextLost { device: 61, first: Some(f) }) if *f == first)
        );
        assert!(enter(&old).is_err());
        assert_eq!(inside(61), 0);
        // A handle of the new generation works.
        let new = old.with_generation(1);
        assert!(!is_stale(&new));
        assert!(usable(&new).is_ok());
        let call = enter(&new).unwrap();
        assert_eq!(inside(61), 1);
        drop(call);
        assert_eq!(inside(61), 0);
    }

    #[test]
    fn one_watcher_a_turn_and_turns_an_interval_apart() {
        let next = AtomicU64::new(0);
        let interval = WATCH_INTERVAL.as_nanos() as u64;
        assert!(take_turn(&next, 5_000_000), "the first call asks");
        assert!(!take_turn(&next, 5_000_000), "the same instant: not again");
        assert!(!take_turn(&next, 5_000_000 + interval - 1));
        assert!(
            take_turn(&next, 5_000_000 + interval),
            "an interval later: again"
        );
        // Threads racing at one instant: exactly one wins.
        let next = std::sync::Arc::new(AtomicU64::new(0));
        let wins: usize = (0..8)
            .map(|_| {
                let n = std::sync::Arc::clone(&next);
                std::thread::spawn(move || usize::from(take_turn(&n, 42)))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .sum();
        assert_eq!(wins, 1);
        // The coarse clock moves forward, and is not zero on Linux.
        let a = coarse_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(10));
        let b = coarse_now_ns();
        assert!(b > a, "{a} then {b}");
    }

    #[test]
    fn calls_from_thread_local_destructors_are_counted_and_released() {
        type Seen = Option<(Option<(usize, u32)>, usize, Option<(usize, u32)>)>;
        static SEEN: Mutex<Seen> = Mutex::new(None);
        struct CallsOnDrop(Device);
        impl Drop for CallsOnDrop {
            fn drop(&mut self) {
                // Runs while the thread ends, before or after its counts are given back:
                // counted either way, and released. (No panic in a destructor: the outcome
                // goes to SEEN.)
                let call = enter(&self.0);
                let during = calling();
                // Counted in the shared count of ending threads: this thread's own were
                // given back before (see the order below).
                let counted = LATE[59].load(Ordering::SeqCst) as usize;
                drop(call);
                let after = calling();
                *SEEN.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((during, counted, after));
            }
        }
        thread_local! {
            static LATE_USER: std::cell::RefCell<Option<CallsOnDrop>> =
                const { std::cell::RefCell::new(None) };
        }
        let dev = Device::test_only(59);
        std::thread::spawn(move || {
            // Registered before the thread's first call: destroyed after its counts'
            // destructor (the reverse order), so its call counts in LATE.
            LATE_USER.with(|u| *u.borrow_mut() = Some(CallsOnDrop(dev)));
            let call = enter(&dev).unwrap();
            assert_eq!(inside(59), 1);
            assert_eq!(calling(), Some((59, 0)));
            let nested = enter(&Device::test_only(58)).unwrap();
            assert_eq!(calling(), Some((58, 0)));
            drop(nested);
            assert_eq!(calling(), Some((59, 0)));
            drop(call);
            assert_eq!(calling(), None);
        })
        .join()
        .unwrap();
        assert_eq!(inside(59), 0);
        assert_eq!(LATE[59].load(Ordering::SeqCst), 0);
        let seen = *SEEN.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(
            seen,
            Some((Some((59, 0)), 1, None)),
            "(during, counted, after)"
        );
    }

    #[test]
    fn a_call_held_across_the_threads_end_keeps_its_device_and_count() {
        type Seen = Option<(Option<(usize, u32)>, usize)>;
        static SEEN: Mutex<Seen> = Mutex::new(None);
        struct Holder(Option<InCall>);
        impl Drop for Holder {
            fn drop(&mut self) {
                // The thread's counts were kept (a call is in progress): the call is still
                // counted and its device still the calling one. No panic here: SEEN.
                let seen = (calling(), inside(57));
                *SEEN.lock().unwrap_or_else(PoisonError::into_inner) = Some(seen);
                drop(self.0.take());
            }
        }
        thread_local! {
            static HELD: std::cell::RefCell<Holder> =
                const { std::cell::RefCell::new(Holder(None)) };
        }
        std::thread::spawn(|| {
            // HELD's destructor registered first, the counts' second: the counts' runs
            // first, with this call still in progress.
            HELD.with(|h| h.borrow_mut().0 = Some(enter(&Device::test_only(57)).unwrap()));
        })
        .join()
        .unwrap();
        let seen = *SEEN.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(seen, Some((Some((57, 0)), 1)));
        assert_eq!(inside(57), 0);
    }

    #[test]
    fn a_healthy_device_counts_its_callers() {
        let dev = Device::test_only(62);
        let a = enter(&dev).unwrap();
        let b = enter(&dev).unwrap();
        assert_eq!(inside(62), 2);
        drop(a);
        drop(b);
        assert_eq!(inside(62), 0);
    }
}
