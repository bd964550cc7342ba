//! Groups: `ncclGroupStart` / `ncclGroupEnd`, always ended.
//!
//! Calls made between the two are fused: one thread driving several GPUs must issue each GPU's
//! part of a collective inside a group, and send/recv pairs that depend on each other must be
//! grouped too. [`GroupGuard`] ends the group when dropped, so an early return with `?` or a
//! panic never leaves the thread inside a group; [`group`] is the closure form.
//!
//! # What a group holds
//!
//! NCCL issues the calls of a group at the outermost `ncclGroupEnd`, not when they are made.
//! Until then the thread's open group keeps, for every call made in it:
//!
//! * a clone of each buffer view (so a buffer dropped inside the group is not freed, nor its
//!   pool block handed to anyone else, before NCCL has queued the work that writes it; every
//!   view was also marked on the call's stream before the call, so once the work is queued
//!   the owner's reuse waits for it);
//! * the communicator. While a group of one thread holds a communicator, using it from any
//!   other thread (a collective, `wait`, `split`, `async_error`) is refused with
//!   [`Error::HeldByGroup`], and destroying or aborting it (drop, `abort`, a `wait` that
//!   times out) is deferred until that group has ended: the group never meets a destroyed
//!   communicator, whichever thread the communicator was moved to.
//!
//! Both are let go after the outermost `ncclGroupEnd` has returned (and, for non-blocking
//! communicators, after their queued work is issued). If the end fails, the views are kept
//! for good (leaked): NCCL may have queued part of the group's work, and leaking the memory
//! is the only way to be sure nobody else gets it while that work may still write it.

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cudars_nccl_sys::{ncclComm_t, ncclResult_t};

use crate::error::{check, library, nccl_error, Error, Result};

/// What a group guard calls; NCCL's `ncclGroupStart`/`End` in the crate, a fake in tests.
pub(crate) trait GroupApi {
    fn start(&self) -> Result<()>;
    /// Ends one level of grouping. At the outermost end, `settle` lists the non-blocking
    /// communicators used in the group (handle, timeout), whose queued work is waited for.
    fn end(&self, settle: &[(usize, Duration)]) -> Result<()>;
}

/// The real group calls.
pub(crate) struct NcclGroup;

impl GroupApi for NcclGroup {
    fn start(&self) -> Result<()> {
        let nccl = library()?;
        // SAFETY: ncclGroupStart takes no arguments; it only bumps a thread-local counter.
        check(unsafe { nccl.ncclGroupStart() }?, "ncclGroupStart")
    }

    fn end(&self, settle: &[(usize, Duration)]) -> Result<()> {
        let nccl = library()?;
        // SAFETY: called once per successful ncclGroupStart on this thread (the guard's rule).
        let r = unsafe { nccl.ncclGroupEnd() }?;
        if r == ncclResult_t::ncclInProgress {
            // Non-blocking communicators: the group's work is being issued in the background;
            // wait until each one used in the group says it is done. They are alive: the
            // group holds them, so their destruction waits for this end.
            for &(comm, timeout) in settle {
                settle_raw(comm as ncclComm_t, timeout, "ncclGroupEnd")?;
            }
            return Ok(());
        }
        check(r, "ncclGroupEnd")
    }
}

thread_local! {
    /// Open groups on this thread.
    static DEPTH: RefCell<usize> = const { RefCell::new(0) };
    /// What the open group of this thread holds until its outermost end: one entry per
    /// communicator used in it.
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// `true` while this thread is inside a group.
pub fn in_group() -> bool {
    DEPTH.with(|d| *d.borrow() > 0)
}

/// One communicator used in the open group, and what its calls there use.
struct Held {
    /// The communicator's side of the hold.
    hold: Arc<Hold>,
    /// Handle and timeout of a non-blocking communicator, to settle after the end.
    settle: Option<(usize, Duration)>,
    /// Clones of the views and streams of its calls (kept alive until the end).
    keep: Vec<Box<dyn Any>>,
}

/// A deferred destruction of a communicator (its handle travels as an address).
type Deferred = Box<dyn FnOnce() + Send>;

/// A communicator's link to the open group, if any, that holds it: shared between the
/// communicator and that group's record, whichever threads they are on.
#[derive(Default)]
pub(crate) struct Hold {
    state: Mutex<HoldState>,
    /// Held around every NCCL call that reads or changes the communicator's state (its
    /// collectives, the group end that issues them, registrations, split, destroy, abort):
    /// a pool registering or deregistering its segments from another thread
    /// (`crate::pool`) never runs beside one of them, as NCCL requires.
    calls: Mutex<()>,
    /// The thread holding `calls` ([`thread_token`]), 0 when none: an atomic, so a
    /// collective pays one mutex (`calls`) and no other.
    calls_holder: AtomicUsize,
    /// `after_calls` holds something (checked by the guard without locking it).
    after_pending: AtomicBool,
    /// What the holder of `calls` left to do once it lets go (an abort from a timed-out
    /// settle inside a locked call: the abort takes the lock itself).
    after_calls: Mutex<Vec<Deferred>>,
}

/// The call lock of one communicator, held (see [`Hold::lock_calls`]). Dropping it lets go
/// of the lock, then runs what the holder left for afterwards.
pub(crate) struct CallGuard<'a> {
    hold: &'a Hold,
    guard: Option<MutexGuard<'a, ()>>,
}

/// A nonzero number naming the calling thread while it lives (the address of a thread-local).
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| std::ptr::from_ref(t) as usize)
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.hold.calls_holder.store(0, Ordering::Release);
        drop(self.guard.take());
        // Only the holder sets it (see `after_calls`), and it has let go of the lock.
        if !self.hold.after_pending.swap(false, Ordering::AcqRel) {
            return;
        }
        let after = std::mem::take(
            &mut *self
                .hold
                .after_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for f in after {
            f();
        }
    }
}

#[derive(Default)]
struct HoldState {
    /// The thread whose open group holds the communicator.
    thread: Option<ThreadId>,
    /// What the communicator left to that group's end (its destruction).
    deferred: Option<Deferred>,
}

impl Hold {
    fn lock(&self) -> MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serializes an NCCL call on the communicator with the other threads' (see `calls`).
    pub(crate) fn lock_calls(&self) -> CallGuard<'_> {
        let guard = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        self.calls_holder.store(thread_token(), Ordering::Release);
        CallGuard {
            hold: self,
            guard: Some(guard),
        }
    }

    /// Whether this thread holds the call lock now.
    pub(crate) fn calls_held_here(&self) -> bool {
        self.calls_holder.load(Ordering::Acquire) == thread_token()
    }

    /// Leaves `f` to run once this thread (the holder) lets go of the call lock.
    pub(crate) fn after_calls(&self, f: impl FnOnce() + Send + 'static) {
        self.after_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(f));
        self.after_pending.store(true, Ordering::Release);
    }

    /// The thread whose open group holds the communicator, if any.
    pub(crate) fn holder(&self) -> Option<ThreadId> {
        self.lock().thread
    }

    /// [`Error::HeldByGroup`] when an open group of another thread holds the communicator.
    pub(crate) fn check_here(&self, what: &'static str) -> Result<()> {
        match self.holder() {
            Some(t) if t != std::thread::current().id() => Err(Error::HeldByGroup { what }),
            _ => Ok(()),
        }
    }

    /// Leaves `f` to the end of the open group that holds the communicator and returns
    /// `true`; returns `false` (dropping `f` unrun) when no group holds it.
    ///
    /// No race: only the communicator's owner can make a group take it, and it is the one
    /// asking; a group can only let go meanwhile, which leaves `f` to the caller.
    pub(crate) fn defer(&self, f: impl FnOnce() + Send + 'static) -> bool {
        let mut st = self.lock();
        if st.thread.is_none() {
            return false;
        }
        st.deferred = Some(match st.deferred.take() {
            Some(first) => Box::new(move || {
                first();
                f();
            }),
            None => Box::new(f),
        });
        true
    }

    /// The group ended: lets go of the communicator and runs what it deferred.
    fn release(&self) {
        let deferred = {
            let mut st = self.lock();
            st.thread = None;
            st.deferred.take()
        };
        if let Some(f) = deferred {
            f();
        }
    }
}

/// Called by a collective inside an open group, before it calls NCCL: until the group's
/// outermost end, the group holds the communicator (`hold`) and keeps `keep` alive.
pub(crate) fn hold(hold: &Arc<Hold>, settle: Option<(usize, Duration)>, keep: Vec<Box<dyn Any>>) {
    hold.lock().thread = Some(std::thread::current().id());
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        match h.iter_mut().find(|e| Arc::ptr_eq(&e.hold, hold)) {
            Some(e) => e.keep.extend(keep),
            None => h.push(Held {
                hold: Arc::clone(hold),
                settle,
                keep,
            }),
        }
    });
}

/// Polls `ncclCommGetAsyncError` until the communicator's pending work is issued
/// (not `ncclInProgress`), or `timeout` passes.
pub(crate) fn settle_raw(comm: ncclComm_t, timeout: Duration, call: &'static str) -> Result<()> {
    let nccl = library()?;
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let mut state = ncclResult_t::ncclSuccess;
        check(
            // SAFETY: `comm` is a live communicator (its owner is alive for the call) and `state`
            // a valid out-pointer.
            unsafe { nccl.ncclCommGetAsyncError(comm, &mut state) }?,
            "ncclCommGetAsyncError",
        )?;
        if state != ncclResult_t::ncclInProgress {
            if state.is_success() {
                return Ok(());
            }
            return Err(Error::Nccl(nccl_error(state, call, Some(comm))));
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                what: call,
                waited: timeout,
            });
        }
        pause(&mut spins);
    }
}

/// Spins briefly, then yields, then sleeps: low latency for short waits, little CPU for long.
pub(crate) fn pause(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 2000 {
        std::hint::spin_loop();
    } else if *spins < 4000 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

struct Guard<A: GroupApi> {
    api: A,
    ended: bool,
}

impl<A: GroupApi> Guard<A> {
    fn begin(api: A) -> Result<Self> {
        api.start()?;
        DEPTH.with(|d| *d.borrow_mut() += 1);
        Ok(Guard { api, ended: false })
    }

    fn end(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        let outermost = DEPTH.with(|d| {
            let mut d = d.borrow_mut();
            *d = d.saturating_sub(1);
            *d == 0
        });
        if !outermost {
            return self.api.end(&[]);
        }
        // NCCL issues the whole group now: what its calls use is let go only afterwards.
        let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
        let settle: Vec<(usize, Duration)> = held.iter().filter_map(|e| e.settle).collect();
        let ended = {
            // Every communicator of the group, locked in one order (their addresses).
            let mut holds: Vec<&Arc<Hold>> = held.iter().map(|e| &e.hold).collect();
            holds.sort_by_key(|h| Arc::as_ptr(h) as usize);
            let _calls: Vec<CallGuard<'_>> = holds.iter().map(|h| h.lock_calls()).collect();
            self.api.end(&settle)
        };
        for Held { hold, keep, .. } in held {
            hold.release();
            if ended.is_err() {
                // Part of the group's work may be queued: its memory is never handed out again.
                std::mem::forget(keep);
            }
        }
        ended
    }
}

impl<A: GroupApi> Drop for Guard<A> {
    fn drop(&mut self) {
        // Ending is what matters; an error here has nowhere to go (`end` returns it).
        let _ = self.finish();
    }
}

/// An open NCCL group on this thread; ended by [`end`](GroupGuard::end) or on drop (also
/// while unwinding from a panic). Not `Send`: NCCL's groups belong to the thread that opened
/// them.
///
/// ```no_run
/// # use cudars_core::{memory::DevicePtr, Stream};
/// # use cudars_nccl::{Communicator, GroupGuard};
/// # fn f(comm: &Communicator, a: &DevicePtr, b: &DevicePtr, s: &Stream) -> cudars_nccl::Result<()> {
/// let peer = (comm.rank() + 1) % comm.size();
/// let from = (comm.rank() + comm.size() - 1) % comm.size();
/// let group = GroupGuard::begin()?;
/// comm.send::<f32>(a, 1024, peer, s)?; // a `?` here still ends the group
/// comm.recv::<f32>(b, 1024, from, s)?;
/// group.end()?;
/// # Ok(()) }
/// ```
pub struct GroupGuard {
    inner: Guard<NcclGroup>,
    _not_send: PhantomData<*const ()>,
}

impl GroupGuard {
    /// `ncclGroupStart`.
    pub fn begin() -> Result<GroupGuard> {
        Ok(GroupGuard {
            inner: Guard::begin(NcclGroup)?,
            _not_send: PhantomData,
        })
    }

    /// `ncclGroupEnd`, returning its error (dropping the guard ends the group too, silently).
    pub fn end(self) -> Result<()> {
        let GroupGuard { inner, .. } = self;
        inner.end()
    }
}

impl std::fmt::Debug for GroupGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupGuard").finish_non_exhaustive()
    }
}

/// Runs `f` inside a group and ends it, whatever `f` returns; `f`'s error wins over the end's.
///
/// ```no_run
/// # use cudars_core::{memory::DevicePtr, Stream};
/// # use cudars_nccl::{group, Communicator, ReduceOp};
/// # fn f(comms: &[Communicator], bufs: &[DevicePtr], streams: &[Stream]) -> cudars_nccl::Result<()> {
/// group::group(|| {
///     for ((c, b), s) in comms.iter().zip(bufs).zip(streams) {
///         c.all_reduce_in_place::<f32>(b, 256, ReduceOp::Sum, s)?;
///     }
///     Ok(())
/// })
/// # }
/// ```
pub fn group<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    run_in(NcclGroup, f)
}

fn run_in<A: GroupApi, T>(api: A, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let guard = Guard::begin(api)?;
    let result = f();
    let ended = guard.end();
    let value = result?;
    ended?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn what_the_call_lock_holder_leaves_runs_after_it_lets_go() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let hold = Arc::new(Hold::default());
        assert!(!hold.calls_held_here());
        let ran = Arc::new(AtomicBool::new(false));
        {
            let _g = hold.lock_calls();
            assert!(hold.calls_held_here());
            // Another thread does not hold it.
            let h2 = Arc::clone(&hold);
            assert!(!std::thread::spawn(move || h2.calls_held_here())
                .join()
                .unwrap());
            let (h, r) = (Arc::clone(&hold), Arc::clone(&ran));
            // What an abort inside a locked call does: it takes the lock itself afterwards.
            hold.after_calls(move || {
                let _again = h.lock_calls();
                r.store(true, Ordering::SeqCst);
            });
            assert!(!ran.load(Ordering::SeqCst));
        }
        assert!(ran.load(Ordering::SeqCst));
        assert!(!hold.calls_held_here());
    }

    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Fake {
        log: Rc<RefCell<Vec<&'static str>>>,
        fail_start: bool,
        fail_end: Rc<Cell<bool>>,
        settled: Rc<RefCell<Vec<(usize, Duration)>>>,
    }

    impl GroupApi for Fake {
        fn start(&self) -> Result<()> {
            if self.fail_start {
                return Err(Error::InvalidArgument("start failed".into()));
            }
            self.log.borrow_mut().push("start");
            Ok(())
        }
        fn end(&self, settle: &[(usize, Duration)]) -> Result<()> {
            self.log.borrow_mut().push("end");
            self.settled.borrow_mut().extend_from_slice(settle);
            if self.fail_end.get() {
                return Err(Error::InvalidArgument("end failed".into()));
            }
            Ok(())
        }
    }

    fn log(f: &Fake) -> Vec<&'static str> {
        f.log.borrow().clone()
    }

    #[test]
    fn drop_ends_the_group_once() {
        let fake = Fake::default();
        {
            let _g = Guard::begin(fake.clone()).unwrap();
            assert!(in_group());
        }
        assert!(!in_group());
        assert_eq!(log(&fake), ["start", "end"]);
    }

    #[test]
    fn explicit_end_is_not_repeated_on_drop() {
        let fake = Fake::default();
        let g = Guard::begin(fake.clone()).unwrap();
        g.end().unwrap();
        assert_eq!(log(&fake), ["start", "end"]);
    }

    #[test]
    fn a_panic_inside_still_ends_the_group() {
        let fake = Fake::default();
        let f2 = fake.clone();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _g = Guard::begin(f2).unwrap();
            panic!("boom");
        }));
        assert!(caught.is_err());
        assert_eq!(log(&fake), ["start", "end"]);
        assert!(!in_group());
    }

    #[test]
    fn an_error_inside_the_closure_ends_the_group_and_wins() {
        let fake = Fake::default();
        fake.fail_end.set(true);
        let r: Result<()> = run_in(fake.clone(), || Err(Error::Aborted));
        assert!(matches!(r, Err(Error::Aborted)));
        assert_eq!(log(&fake), ["start", "end"]);
    }

    #[test]
    fn an_end_error_is_returned() {
        let fake = Fake::default();
        fake.fail_end.set(true);
        let r = run_in(fake.clone(), || Ok(5));
        assert!(matches!(r, Err(Error::InvalidArgument(m)) if m == "end failed"));
    }

    #[test]
    fn a_failed_start_opens_nothing_and_ends_nothing() {
        let fake = Fake {
            fail_start: true,
            ..Fake::default()
        };
        let mut ran = false;
        let r = run_in(fake.clone(), || {
            ran = true;
            Ok(())
        });
        assert!(r.is_err());
        assert!(!ran);
        assert!(log(&fake).is_empty());
        assert!(!in_group());
    }

    #[test]
    fn nested_groups_end_in_order() {
        let fake = Fake::default();
        let outer = Guard::begin(fake.clone()).unwrap();
        {
            let _inner = Guard::begin(fake.clone()).unwrap();
            assert_eq!(DEPTH.with(|d| *d.borrow()), 1 + 1);
        }
        assert!(in_group());
        outer.end().unwrap();
        assert!(!in_group());
        assert_eq!(log(&fake), ["start", "start", "end", "end"]);
    }

    /// Logs its drop into the fake's log: stands for a held buffer view.
    struct Sentinel(Rc<RefCell<Vec<&'static str>>>, &'static str);

    impl Drop for Sentinel {
        fn drop(&mut self) {
            self.0.borrow_mut().push(self.1);
        }
    }

    fn keep(fake: &Fake, what: &'static str) -> Vec<Box<dyn Any>> {
        vec![Box::new(Sentinel(fake.log.clone(), what))]
    }

    #[test]
    fn held_views_are_released_only_after_the_outermost_end() {
        let fake = Fake::default();
        let comm = Arc::new(Hold::default());
        let outer = Guard::begin(fake.clone()).unwrap();
        hold(&comm, None, keep(&fake, "view a dropped"));
        {
            let inner = Guard::begin(fake.clone()).unwrap();
            hold(&comm, None, keep(&fake, "view b dropped"));
            inner.end().unwrap();
        }
        // The inner end issues nothing in NCCL: both views are still held.
        assert_eq!(log(&fake), ["start", "start", "end"]);
        assert_eq!(comm.holder(), Some(std::thread::current().id()));
        outer.end().unwrap();
        assert_eq!(
            log(&fake),
            [
                "start",
                "start",
                "end",
                "end",
                "view a dropped",
                "view b dropped"
            ]
        );
        assert_eq!(comm.holder(), None);
    }

    #[test]
    fn a_group_ended_by_a_panic_releases_its_views_after_the_end() {
        let fake = Fake::default();
        let f2 = fake.clone();
        let comm = Arc::new(Hold::default());
        let c2 = comm.clone();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _g = Guard::begin(f2.clone()).unwrap();
            hold(&c2, None, keep(&f2, "view dropped"));
            panic!("boom");
        }));
        assert!(caught.is_err());
        assert_eq!(log(&fake), ["start", "end", "view dropped"]);
        assert_eq!(comm.holder(), None);
    }

    #[test]
    fn a_failed_end_keeps_the_views_for_good_but_lets_the_communicator_go() {
        let fake = Fake::default();
        fake.fail_end.set(true);
        let comm = Arc::new(Hold::default());
        let g = Guard::begin(fake.clone()).unwrap();
        hold(&comm, None, keep(&fake, "view dropped"));
        assert!(g.end().is_err());
        // Leaked: NCCL may have queued part of the group's work on that memory.
        assert_eq!(log(&fake), ["start", "end"]);
        assert_eq!(comm.holder(), None);
    }

    #[test]
    fn non_blocking_communicators_are_settled_once_at_the_outermost_end() {
        let fake = Fake::default();
        let (a, b) = (Arc::new(Hold::default()), Arc::new(Hold::default()));
        let secs = Duration::from_secs(1);
        let g = Guard::begin(fake.clone()).unwrap();
        hold(&a, Some((0xa, secs)), Vec::new());
        hold(&b, None, Vec::new());
        hold(&a, Some((0xa, secs)), Vec::new());
        g.end().unwrap();
        assert_eq!(*fake.settled.borrow(), [(0xa, secs)]);
    }

    #[test]
    fn a_destruction_deferred_by_a_held_communicator_runs_after_the_end() {
        let fake = Fake::default();
        let comm = Arc::new(Hold::default());
        // Not held: nothing is deferred, the caller destroys it itself.
        assert!(!comm.defer(|| panic!("must not run")));
        let g = Guard::begin(fake.clone()).unwrap();
        hold(&comm, None, Vec::new());
        let destroyed = Arc::new(Mutex::new(Vec::new()));
        let d = destroyed.clone();
        assert!(comm.defer(move || d.lock().unwrap().push("abort")));
        let d = destroyed.clone();
        assert!(comm.defer(move || d.lock().unwrap().push("destroy")));
        assert!(destroyed.lock().unwrap().is_empty());
        g.end().unwrap();
        assert_eq!(*destroyed.lock().unwrap(), ["abort", "destroy"]);
        assert!(!comm.defer(|| panic!("must not run")));
    }

    #[test]
    fn another_thread_cannot_use_a_communicator_held_by_this_threads_group() {
        let fake = Fake::default();
        let comm = Arc::new(Hold::default());
        comm.check_here("x").unwrap();
        let g = Guard::begin(fake.clone()).unwrap();
        hold(&comm, None, Vec::new());
        // This thread (the group's) may go on using it.
        comm.check_here("x").unwrap();
        let c2 = comm.clone();
        let there = std::thread::spawn(move || {
            let refused = c2.check_here("ncclAllReduce");
            // Dropped there: deferred to the group's end, on this thread.
            let deferred = c2.defer(|| {});
            (refused, deferred)
        })
        .join()
        .unwrap();
        assert!(matches!(
            there.0,
            Err(Error::HeldByGroup {
                what: "ncclAllReduce"
            })
        ));
        assert!(there.1);
        g.end().unwrap();
        let c2 = comm.clone();
        std::thread::spawn(move || c2.check_here("x").unwrap())
            .join()
            .unwrap();
    }
}
