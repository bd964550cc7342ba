//! Releases that cannot be made where a value drops: inside a host function, or while a
//! capture runs. They are handed to one thread of this crate, the release thread, which
//! drops the value again once that is allowed.
//!
//! | where the value drops | why not here | when the release thread drops it |
//! | --- | --- | --- |
//! | inside a host function (a [`Stream::add_callback`](crate::Stream::add_callback) closure, a graph host node) | CUDA forbids CUDA calls there; a free may deadlock or fail | at once, on the release thread |
//! | while a capture begun through this crate runs (`cuMemFree`, `cuMemFreeHost`, `cuIpcCloseMemHandle`, `cuMemUnmap` of memory whose free relies on the device's implicit wait) | a capture forbids the implicit device wait those frees rely on, and a device synchronisation fails and invalidates the capture | once no capture begun through this crate runs, or at [`release_deferred`] |
//! | while its stream is being captured (`cuMemFreeAsync` would become a node of the graph) | the free would be recorded, not made | at the next poll (every [`POLL`]) where the stream is not captured |
//! | after a device synchronisation failed because a capture that foreign code began runs (the driver reports `CUDA_ERROR_STREAM_CAPTURE_*`) | the work that uses the memory may still run | at [`release_deferred`], or when a capture of this crate ends; never by polling, since each try would invalidate the foreign capture again |
//!
//! The value's own `Drop` decides: it runs again on the release thread, outside any host
//! function, and either releases or defers itself again. Nothing is freed before the wait
//! it needs has succeeded; memory whose wait fails for another reason (a device fault) is
//! leaked, as every owner in the workspace does.
//!
//! Covered: [`DevicePtr`](crate::DevicePtr) (any owner behind it), [`Stream`](crate::Stream),
//! [`Event`](crate::Event), [`DeviceMemory`](crate::DeviceMemory),
//! [`ManagedMemory`](crate::ManagedMemory), [`PinnedMemory`](crate::PinnedMemory),
//! [`StreamOrderedMemory`](crate::async_pool::StreamOrderedMemory) and the IPC mappings
//! ([`IpcMapping`](crate::ipc::IpcMapping), [`SharedMapping`](crate::ipc::SharedMapping)).
//! Other handles (modules, graphs, virtual ranges, host registrations) still call the driver
//! where they drop: do not drop them inside a host function.
//!
//! [`deferred_count`] says how many values wait. A program whose captures are begun by
//! foreign code (the CUDA runtime, PyTorch) is not told when they end: call
//! [`release_deferred`] after them. While a capture begun through this crate runs, frees of
//! the types above wait for it, on every thread and device: a capture that is never ended
//! holds them for good.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How often values deferred until their stream leaves its capture are tried again.
pub const POLL: Duration = Duration::from_millis(50);

/// When the release thread drops a deferred value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// At once (the value dropped inside a host function).
    Now,
    /// When no capture begun through this crate runs any more, or at [`release_deferred`].
    AfterCaptures,
    /// At the next poll ([`POLL`]), and at the moments of [`When::AfterCaptures`].
    Poll,
    /// Only at [`release_deferred`] or when a capture of this crate ends: a retry that would
    /// disturb a foreign capture (a device synchronisation invalidates it).
    Parked,
}

enum Message {
    Drop(Box<dyn Send>, When),
    CapturesEnded,
    RetryAll,
}

thread_local! {
    /// Nesting of host functions running on this thread (a driver thread).
    static INSIDE_HOST_FUNCTION: Cell<u32> = const { Cell::new(0) };
}

/// `true` on a thread that is running a host function through [`HostFunctionScope`]: a
/// value that would call CUDA in its `Drop` must be deferred there.
#[inline]
pub fn inside_host_function() -> bool {
    INSIDE_HOST_FUNCTION.with(Cell::get) != 0
}

/// Marks the calling thread as running a host function until dropped: for the trampolines
/// that run Rust closures as CUDA host functions (this crate's stream callbacks, cuda-graph's
/// host nodes). Values of this crate dropped meanwhile release their handles and memory on
/// the release thread instead (see the [module](self)). Not `Send`.
#[derive(Debug)]
#[must_use = "the thread counts as inside a host function only while the scope lives"]
pub struct HostFunctionScope {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl HostFunctionScope {
    /// Enters the scope. Starts the release thread first if it is not running (a thread is
    /// spawned, which makes no CUDA call).
    pub fn enter() -> HostFunctionScope {
        start();
        INSIDE_HOST_FUNCTION.with(|c| c.set(c.get() + 1));
        HostFunctionScope {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for HostFunctionScope {
    fn drop(&mut self) {
        INSIDE_HOST_FUNCTION.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Starts the release thread if it is not running (a thread is spawned; no CUDA call): for
/// callers that are about to hand work to a host function.
pub(crate) fn start() {
    let _ = release_thread();
}

/// Values waiting for [`When::AfterCaptures`] or [`When::Poll`].
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// How many values wait for their release (a capture to end, a stream to leave its
/// capture).
pub fn deferred_count() -> usize {
    WAITING.load(Ordering::Acquire)
}

/// Asks the release thread to try every waiting value again now (after captures that
/// foreign code began have ended, for example). Returns at once; [`deferred_count`] drops
/// as values are released.
pub fn release_deferred() {
    send(Message::RetryAll);
}

/// Tells the release thread that no capture begun through this crate runs any more.
pub(crate) fn captures_ended() {
    // SeqCst with `defer`'s increment: either this sees the value counted, or the release
    // thread, receiving it later, sees the capture count at 0.
    if WAITING.load(Ordering::SeqCst) != 0 {
        send(Message::CapturesEnded);
    }
}

/// Hands `value` to the release thread, which drops it as `when` says. Leaked when that
/// thread cannot run (it could not be started), never dropped here.
pub(crate) fn defer(value: Box<dyn Send>, when: When) {
    if when != When::Now {
        WAITING.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(Message::Drop(value, when)) = try_send(Message::Drop(value, when)) {
        if when != When::Now {
            WAITING.fetch_sub(1, Ordering::SeqCst);
        }
        note_leak();
        std::mem::forget(value);
    }
}

fn send(m: Message) {
    if let Some(Message::Drop(value, _)) = try_send(m) {
        std::mem::forget(value);
    }
}

/// Sends `m`, or gives it back when the thread is not running.
fn try_send(m: Message) -> Option<Message> {
    match release_thread() {
        Some(tx) => tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(m)
            .err()
            .map(|e| e.0),
        None => Some(m),
    }
}

/// The release thread's channel; `None` when it could not be started.
fn release_thread() -> Option<&'static Mutex<Sender<Message>>> {
    static THREAD: OnceLock<Option<Mutex<Sender<Message>>>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (tx, rx) = channel::<Message>();
            std::thread::Builder::new()
                .name("cuda-core-release".into())
                .spawn(move || {
                    let mut waiting: Vec<(Box<dyn Send>, When)> = Vec::new();
                    let mut next_poll: Option<Instant> = None;
                    // Drops a value (its Drop releases it, or defers it again: a re-deferred
                    // value is counted again before this one is uncounted, so the count never
                    // shows a false 0). A panicking Drop must not end the thread.
                    let release = |value: Box<dyn Send>, counted: bool| {
                        let _ = catch_unwind(AssertUnwindSafe(move || drop(value)));
                        if counted {
                            WAITING.fetch_sub(1, Ordering::SeqCst);
                        }
                    };
                    loop {
                        let message = match next_poll {
                            None => match rx.recv() {
                                Ok(m) => Some(m),
                                Err(_) => return,
                            },
                            Some(due) => {
                                let left = due.saturating_duration_since(Instant::now());
                                match rx.recv_timeout(left) {
                                    Ok(m) => Some(m),
                                    Err(RecvTimeoutError::Timeout) => None,
                                    Err(RecvTimeoutError::Disconnected) => return,
                                }
                            }
                        };
                        let mut retry_all = false;
                        match message {
                            Some(Message::Drop(value, When::Now)) => release(value, false),
                            Some(Message::Drop(value, When::AfterCaptures))
                                if !crate::capture_gate::captures_in_progress() =>
                            {
                                release(value, true)
                            }
                            Some(Message::Drop(value, when)) => {
                                if when == When::Poll && next_poll.is_none() {
                                    next_poll = Some(Instant::now() + POLL);
                                }
                                waiting.push((value, when));
                            }
                            Some(Message::CapturesEnded | Message::RetryAll) => retry_all = true,
                            None => {}
                        }
                        // Polled values at their deadline, whatever messages keep arriving.
                        let poll_due = next_poll.is_some_and(|due| Instant::now() >= due);
                        if retry_all || poll_due {
                            let (now, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut waiting)
                                .into_iter()
                                .partition(|(_, when)| retry_all || *when == When::Poll);
                            waiting = keep;
                            next_poll = None;
                            for (value, _) in now {
                                release(value, true);
                            }
                        }
                        if next_poll.is_none() && waiting.iter().any(|(_, w)| *w == When::Poll) {
                            next_poll = Some(Instant::now() + POLL);
                        }
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Whether a free that relies on the device's implicit wait (`cuMemFree`, `cuMemFreeHost`,
/// an unmap after a device synchronisation) may be made now. `Ok` holds the capture gate
/// (the capture gate): keep it until the free is made, so that no
/// capture begun through this crate starts between the check and the free. `Err` says until
/// when to defer it: inside a host function (at once, elsewhere), or while a capture begun
/// through this crate runs (until it ends).
#[inline]
fn free_must_wait() -> std::result::Result<crate::capture_gate::IssueGuard, When> {
    if inside_host_function() {
        return Err(When::Now);
    }
    let gate = crate::capture_gate::issue_guard();
    if crate::capture_gate::captures_in_progress() {
        return Err(When::AfterCaptures);
    }
    Ok(gate)
}

/// The capture gate for a free that relies on the device's implicit wait (see
/// [`free_must_wait`]), held until the free is made; or, when the free must wait, `None`
/// after handing what `move_out` takes out of the value (leaving it empty) to the release
/// thread.
#[inline]
pub(crate) fn gate_or_defer(
    move_out: impl FnOnce() -> Box<dyn Send>,
) -> Option<crate::capture_gate::IssueGuard> {
    match free_must_wait() {
        Ok(gate) => Some(gate),
        Err(when) => {
            defer(move_out(), when);
            None
        }
    }
}

/// Releases that failed for a reason no retry fixes (a device fault): the memory or
/// mapping was leaked, never freed under work that may still use it.
static LEAKED: AtomicUsize = AtomicUsize::new(0);

/// How many allocations or mappings were leaked because the wait before their release
/// failed for good (a device fault).
pub fn leaked_count() -> usize {
    LEAKED.load(Ordering::Acquire)
}

/// Counts one leak.
pub(crate) fn note_leak() {
    LEAKED.fetch_add(1, Ordering::AcqRel);
}

/// Whether a failed device-wide wait may succeed later: the driver refused it because a
/// capture runs (`CUDA_ERROR_STREAM_CAPTURE_*`), not because the context failed.
pub(crate) fn retry_may_succeed(e: &crate::Error) -> bool {
    use cudars_sys::CUresult as R;
    match e.driver().map(crate::DriverError::result) {
        Some(r) => [
            R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            R::CUDA_ERROR_STREAM_CAPTURE_MERGE,
            R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            R::CUDA_ERROR_CAPTURED_EVENT,
        ]
        .contains(&r),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Probe(mpsc::Sender<(bool, std::thread::ThreadId)>);
    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = self
                .0
                .send((inside_host_function(), std::thread::current().id()));
        }
    }

    #[test]
    fn a_value_deferred_inside_a_host_function_is_dropped_elsewhere() {
        let (tx, rx) = mpsc::channel();
        let here = std::thread::current().id();
        {
            let _scope = HostFunctionScope::enter();
            assert!(inside_host_function());
            defer(Box::new(Probe(tx)), When::Now);
        }
        assert!(!inside_host_function());
        let (inside, on) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(!inside, "dropped outside any host function");
        assert_ne!(on, here, "dropped on the release thread");
    }

    #[test]
    fn polled_values_are_tried_again_until_they_go() {
        /// Defers itself `left` more times, then reports.
        struct Stubborn(u32, mpsc::Sender<u32>);
        impl Drop for Stubborn {
            fn drop(&mut self) {
                if self.0 > 0 {
                    defer(Box::new(Stubborn(self.0 - 1, self.1.clone())), When::Poll);
                } else {
                    let _ = self.1.send(0);
                }
            }
        }
        let (tx, rx) = mpsc::channel();
        defer(Box::new(Stubborn(3, tx)), When::Poll);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
    }

    #[test]
    fn values_waiting_for_captures_go_at_an_explicit_retry() {
        let (tx, rx) = mpsc::channel();
        // No capture of this crate runs in this test process's CPU tests: the value goes
        // at once, or at the latest at the retry.
        defer(Box::new(Probe(tx)), When::AfterCaptures);
        release_deferred();
        let (inside, _) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(!inside);
    }
}
