//! The capture gate: how safe calls and beginning captures stay out of each other's way, and
//! the count of captures begun through this crate. A leaf: it knows nothing of streams,
//! memory or the driver.
//!
//! A safe call that decides something by a stream's capture status (refuse a borrowed host
//! buffer, keep memory alive in the graph, order a stream after a hand-over, free memory
//! now) holds an [`IssueGuard`] from the check until its work is issued; a capture begun
//! through [`graph::begin_capture`](crate::graph::begin_capture) waits in [`BeginGate`] for
//! every such call in flight, so no work slips into a capture that began between the check
//! and the issue. [`captures_in_progress`] is the one atomic load the hot paths pay when no
//! capture runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Captures begun through [`begin_capture`](crate::graph::begin_capture) and not yet ended, in the whole process. Lets
/// allocators check "is any capture running?" with one atomic load before asking the driver
/// about a particular stream.
static ACTIVE_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// `true` while a capture begun through this crate ([`begin_capture`](crate::graph::begin_capture), and so `cuda-graph`)
/// has not ended. Captures that foreign code (the CUDA runtime, PyTorch) begins directly are
/// not counted.
#[inline]
pub fn captures_in_progress() -> bool {
    ACTIVE_CAPTURES.load(Ordering::Acquire) != 0
}

/// Captures that foreign code announced ([`announce_capture_begin`]) and has not ended: PyTorch
/// tells its allocator when each of its captures begins and ends.
static ANNOUNCED_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// `true` while a capture announced with [`announce_capture_begin`] has not been ended with
/// [`announce_capture_end`]. With [`captures_in_progress`], what an allocator asks before it
/// asks the driver about a stream whose captures are all announced
/// ([`Stream::external_announced`](crate::Stream::external_announced)).
#[inline]
pub fn announced_captures_in_progress() -> bool {
    ANNOUNCED_CAPTURES.load(Ordering::Acquire) != 0
}

/// Announces that foreign code is about to begin a graph capture (call it before the capture
/// begins). Until the matching [`announce_capture_end`], allocators ask the driver about every
/// stream made with [`Stream::external_announced`](crate::Stream::external_announced).
/// Announcing a capture that never begins only costs those questions.
pub fn announce_capture_begin() {
    ANNOUNCED_CAPTURES.fetch_add(1, Ordering::SeqCst);
}

/// Ends an announcement of [`announce_capture_begin`] (call it after the capture ended). An
/// end without a begin is ignored (the count never goes below zero).
///
/// # Safety
///
/// The caller ends a capture it announced, and that capture has ended. An end too many
/// (while another announced capture runs) would let allocators skip the capture question for
/// a stream being captured ([`Stream::external_announced`](crate::Stream::external_announced)),
/// and serve it memory that the graph's replays then overwrite. A safe program cannot:
///
/// ```compile_fail,E0133
/// cudars_core::graph::announce_capture_end();
/// ```
pub unsafe fn announce_capture_end() {
    let _ =
        ANNOUNCED_CAPTURES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// Safe calls between their capture check and their issue on threads whose [`IssueFlag`]
/// cannot be used (a thread being torn down): see [`issue_guard`].
static ISSUING_UNFLAGGED: AtomicUsize = AtomicUsize::new(0);
/// Captures waiting in [`begin_capture`](crate::graph::begin_capture) for those calls to finish.
static BEGINNING: AtomicUsize = AtomicUsize::new(0);

/// One thread's "between a capture check and the issue" flag, on a cache line of its own (a
/// flag shared by all threads made every launch bounce one line between the cores).
#[repr(align(64))]
struct IssueFlag(AtomicBool);

/// Every flag ever handed to a thread (leaked, reused after their thread exits): what
/// [`BeginGate::wait`] scans.
static ALL_FLAGS: Mutex<Vec<&'static IssueFlag>> = Mutex::new(Vec::new());
/// Flags of exited threads, for new threads.
static FREE_FLAGS: Mutex<Vec<&'static IssueFlag>> = Mutex::new(Vec::new());

/// A thread's flag; gives it back when the thread exits.
struct FlagSlot(&'static IssueFlag);

impl FlagSlot {
    fn new() -> FlagSlot {
        let reused = FREE_FLAGS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        FlagSlot(reused.unwrap_or_else(|| {
            let flag: &'static IssueFlag = Box::leak(Box::new(IssueFlag(AtomicBool::new(false))));
            ALL_FLAGS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(flag);
            flag
        }))
    }
}

impl Drop for FlagSlot {
    fn drop(&mut self) {
        // A guard cannot outlive its thread's slot: the flag is down here.
        self.0 .0.store(false, Ordering::SeqCst);
        FREE_FLAGS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.0);
    }
}

thread_local! {
    /// This thread's nesting of [`issue_guard`]s (only the outermost raises the thread's
    /// flag), and whether the outermost counted in [`ISSUING_UNFLAGGED`] instead.
    static ISSUE_DEPTH: std::cell::Cell<(usize, bool)> = const { std::cell::Cell::new((0, false)) };
    /// This thread's flag.
    static ISSUE_FLAG: FlagSlot = FlagSlot::new();
}

/// Held by a safe call from the moment it decides something by a stream's capture status
/// (refuse a borrowed host buffer, keep memory alive in the graph, order a stream after a
/// hand-over) until its work and fences are issued: a capture begun through
/// [`begin_capture`](crate::graph::begin_capture) (and so `cuda-graph`) on another thread waits for it, so the work
/// cannot slip into a capture that began between the check and the issue. Nested guards
/// cost nothing more. Captures that foreign code begins (the CUDA runtime, PyTorch, CuPy) on
/// a stream are not held back: issue such a stream's work on the thread that captures it.
///
/// Users reach it through [`Issue`](crate::Issue) ([`Stream::issue`](crate::Stream::issue)),
/// which [`DevicePtr::record_stream`](crate::memory::DevicePtr::record_stream) and
/// [`Function::launch`](crate::Function::launch) take; cuda-core's free paths take it
/// directly. Not `Send`: the nesting is per thread.
#[derive(Debug)]
#[must_use = "the guard covers the issue only while it lives"]
pub struct IssueGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Takes an [`IssueGuard`]: when no capture is beginning, one store to a flag of this
/// thread's own and one load (each thread raises its own flag and then looks for a beginning
/// capture; [`begin_capture`](crate::graph::begin_capture) announces itself and then looks at every thread's flag, so one of
/// the two always sees the other).
#[inline]
pub fn issue_guard() -> IssueGuard {
    ISSUE_DEPTH.with(|state| {
        let (depth, unflagged) = state.get();
        if depth == 0 {
            state.set((1, enter_issue()));
        } else {
            state.set((depth + 1, unflagged));
        }
    });
    IssueGuard {
        _not_send: std::marker::PhantomData,
    }
}

/// Whether beginning captures make every running thread of the process execute a memory
/// barrier (Linux `membarrier`, `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, registered here once).
/// Then an issue raises its flag with a plain store, and only the rare beginning capture pays
/// for the ordering ("asymmetric" Dekker: the capture's barrier makes a raised flag visible
/// before it looks, or the issue sees the capture): one locked instruction less per launch.
/// Elsewhere, or if the kernel refuses, both sides use sequentially consistent operations.
fn asymmetric_fences() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            use rustix::thread::{membarrier, MembarrierCommand};
            membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

/// The beginning capture's side of [`asymmetric_fences`] (only called once they are on): a
/// memory barrier on every running thread of the process. Should the expedited command fail
/// even though it registered (a child process after `fork`, say), the global one (which waits
/// until every CPU has scheduled, slower but as good an order) is used. Should both fail, the
/// process aborts: issues already raised their flags with plain stores, and without a barrier
/// a capture could begin between one's check and its issue (work slipping into a graph that
/// does not keep its memory alive).
fn barrier_on_all_threads() {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{membarrier, MembarrierCommand};
        if membarrier(MembarrierCommand::PrivateExpedited).is_ok() {
            return;
        }
        if membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
            && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
        {
            return;
        }
        if membarrier(MembarrierCommand::Global).is_err() {
            eprintln!(
                "cudars-core: membarrier failed after it had been registered; a capture cannot \
                 be ordered after the safe calls in flight (aborting rather than risk it)"
            );
            std::process::abort();
        }
    }
}

/// Raises this thread's flag (or, on a thread being torn down, counts in
/// [`ISSUING_UNFLAGGED`]) once no capture is beginning; returns whether it counted.
#[inline]
fn enter_issue() -> bool {
    let flag = ISSUE_FLAG.try_with(|f| f.0).ok();
    let asymmetric = asymmetric_fences();
    loop {
        while BEGINNING.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        match flag {
            Some(f) if asymmetric => {
                f.0.store(true, Ordering::Relaxed);
                // Program order is all this side needs: the beginning capture's barrier
                // orders the store for it.
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
            }
            Some(f) => f.0.store(true, Ordering::SeqCst),
            None => {
                ISSUING_UNFLAGGED.fetch_add(1, Ordering::SeqCst);
            }
        }
        if BEGINNING.load(Ordering::SeqCst) == 0 {
            return flag.is_none();
        }
        match flag {
            Some(f) => f.0.store(false, Ordering::SeqCst),
            None => {
                ISSUING_UNFLAGGED.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for IssueGuard {
    #[inline]
    fn drop(&mut self) {
        ISSUE_DEPTH.with(|state| {
            let (depth, unflagged) = state.get();
            let d = depth.saturating_sub(1);
            state.set((d, unflagged));
            if d == 0 {
                if unflagged {
                    ISSUING_UNFLAGGED.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let _ = ISSUE_FLAG.try_with(|f| f.0 .0.store(false, Ordering::Release));
                }
            }
        });
    }
}

/// Held by [`begin_capture`](crate::graph::begin_capture) while it begins a capture: safe calls that checked for captures
/// before it must have issued (see [`issue_guard`]), and new ones wait until it is dropped
/// (by then the capture is counted, so they see it).
pub(crate) struct BeginGate;

impl BeginGate {
    pub(crate) fn wait() -> BeginGate {
        BEGINNING.fetch_add(1, Ordering::SeqCst);
        // Issues that raised their flag with a plain store (see `asymmetric_fences`): after
        // this barrier their flags are visible, or they see BEGINNING and back off.
        if asymmetric_fences() {
            barrier_on_all_threads();
        }
        // This thread's own guard, if it holds one, does not count.
        let (depth, unflagged) = ISSUE_DEPTH.with(std::cell::Cell::get);
        let own_flag = ISSUE_FLAG.try_with(|f| std::ptr::from_ref(f.0)).ok();
        let own_unflagged = usize::from(depth > 0 && unflagged);
        while ISSUING_UNFLAGGED.load(Ordering::SeqCst) > own_unflagged {
            std::thread::yield_now();
        }
        let flags: Vec<&'static IssueFlag> = ALL_FLAGS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for f in flags {
            if Some(std::ptr::from_ref(f)) == own_flag {
                continue;
            }
            while f.0.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
        }
        BeginGate
    }
}

impl Drop for BeginGate {
    fn drop(&mut self) {
        BEGINNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a capture that has begun (after the driver began it, with the [`BeginGate`] held).
pub(crate) fn count_begun() {
    ACTIVE_CAPTURES.fetch_add(1, Ordering::SeqCst);
}

/// Counts a capture that has ended; `true` when it was the last one running.
pub(crate) fn count_ended() -> bool {
    ACTIVE_CAPTURES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) == Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_capture_begins_only_after_the_issues_that_checked_before_it() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let issued = Arc::new(AtomicBool::new(false));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let i2 = Arc::clone(&issued);
        let issuer = std::thread::spawn(move || {
            let outer = super::issue_guard();
            let inner = super::issue_guard(); // nesting costs nothing and blocks nothing
            held_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
            i2.store(true, Ordering::SeqCst);
            drop(inner);
            drop(outer);
        });
        held_rx.recv().unwrap();
        let gate = super::BeginGate::wait();
        assert!(
            issued.load(Ordering::SeqCst),
            "a capture began while a safe call was between its check and its issue"
        );
        // While a capture begins, a new issue waits for it.
        let waited = Arc::new(AtomicBool::new(false));
        let w2 = Arc::clone(&waited);
        let late = std::thread::spawn(move || {
            let _g = super::issue_guard();
            w2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waited.load(Ordering::SeqCst),
            "an issue slipped past a beginning capture"
        );
        drop(gate);
        late.join().unwrap();
        issuer.join().unwrap();
        assert!(waited.load(Ordering::SeqCst));
    }

    #[test]
    fn issues_of_many_threads_never_overlap_a_beginning_capture() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        // 6 threads issue in a loop (some nested, some from short-lived threads, whose flags
        // go back and are reused) while captures begin on another thread: while a gate is
        // held, no issue is between its guard's start and end.
        let inside = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..6)
            .map(|t| {
                let (inside, stop) = (Arc::clone(&inside), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let issue = move || {
                        let g = super::issue_guard();
                        let nested = (t % 2 == 0).then(super::issue_guard);
                        inside.fetch_add(1, Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(nested);
                        drop(g);
                    };
                    while !stop.load(Ordering::SeqCst) {
                        if t == 5 {
                            std::thread::spawn(issue.clone()).join().unwrap();
                        } else {
                            issue();
                        }
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let gate = super::BeginGate::wait();
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "an issue overlapped a beginning capture"
            );
            std::thread::yield_now();
            assert_eq!(inside.load(Ordering::SeqCst), 0);
            drop(gate);
        }
        // The beginning thread's own guard does not hold it back.
        let own = super::issue_guard();
        drop(super::BeginGate::wait());
        drop(own);
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap();
        }
        let flags = ALL_FLAGS.lock().unwrap().len();
        assert!(
            flags < 64,
            "{flags} flags for at most ~10 live threads: exited threads' flags are reused"
        );
    }
}
