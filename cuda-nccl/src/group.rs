//! Groups: `ncclGroupStart` / `ncclGroupEnd`, always ended.
//!
//! Calls made between the two are fused: one thread driving several GPUs must issue each GPU's
//! part of a collective inside a group, and send/recv pairs that depend on each other must be
//! grouped too. [`GroupGuard`] ends the group when dropped, so an early return with `?` or a
//! panic never leaves the thread inside a group; [`group`] is the closure form.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use cuda_nccl_sys::{ncclComm_t, ncclResult_t};

use crate::error::{check, library, nccl_error, Error, Result};

/// What a group guard calls; NCCL's `ncclGroupStart`/`End` in the crate, a fake in tests.
pub(crate) trait GroupApi {
    fn start(&self) -> Result<()>;
    fn end(&self) -> Result<()>;
}

/// The real group calls.
pub(crate) struct NcclGroup;

impl GroupApi for NcclGroup {
    fn start(&self) -> Result<()> {
        let nccl = library()?;
        // SAFETY: ncclGroupStart takes no arguments; it only bumps a thread-local counter.
        check(unsafe { nccl.ncclGroupStart() }?, "ncclGroupStart")
    }

    fn end(&self) -> Result<()> {
        let nccl = library()?;
        // SAFETY: called once per successful ncclGroupStart on this thread (the guard's rule).
        let r = unsafe { nccl.ncclGroupEnd() }?;
        let outermost = DEPTH.with(|d| *d.borrow() == 0);
        if r == ncclResult_t::ncclInProgress && outermost {
            // Non-blocking communicators: the group's work is being issued in the background;
            // wait until each one touched in the group says it is done.
            let touched = TOUCHED.with(|t| std::mem::take(&mut *t.borrow_mut()));
            for (comm, timeout) in touched {
                settle_raw(comm as ncclComm_t, timeout, "ncclGroupEnd")?;
            }
            return Ok(());
        }
        if outermost {
            TOUCHED.with(|t| t.borrow_mut().clear());
        }
        check(r, "ncclGroupEnd")
    }
}

thread_local! {
    /// Open groups on this thread.
    static DEPTH: RefCell<usize> = const { RefCell::new(0) };
    /// Non-blocking communicators used in the open group: handle address and timeout.
    static TOUCHED: RefCell<Vec<(usize, Duration)>> = const { RefCell::new(Vec::new()) };
}

/// `true` while this thread is inside a group.
pub fn in_group() -> bool {
    DEPTH.with(|d| *d.borrow() > 0)
}

/// Notes that a non-blocking communicator was used inside the open group.
pub(crate) fn touch(comm: ncclComm_t, timeout: Duration) {
    TOUCHED.with(|t| {
        let mut t = t.borrow_mut();
        if !t.iter().any(|(c, _)| *c == comm as usize) {
            t.push((comm as usize, timeout));
        }
    })
}

/// Forgets a communicator that is being destroyed inside a group.
pub(crate) fn forget(comm: ncclComm_t) {
    TOUCHED.with(|t| t.borrow_mut().retain(|(c, _)| *c != comm as usize));
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
        DEPTH.with(|d| {
            let mut d = d.borrow_mut();
            *d = d.saturating_sub(1);
        });
        self.api.end()
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
/// # use cuda_core::{memory::DevicePtr, Stream};
/// # use cuda_nccl::{Communicator, GroupGuard};
/// # fn f(comm: &Communicator, a: &DevicePtr, b: &DevicePtr, s: &Stream) -> cuda_nccl::Result<()> {
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
/// # use cuda_core::{memory::DevicePtr, Stream};
/// # use cuda_nccl::{group, Communicator, ReduceOp};
/// # fn f(comms: &[Communicator], bufs: &[DevicePtr], streams: &[Stream]) -> cuda_nccl::Result<()> {
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
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Fake {
        log: Rc<RefCell<Vec<&'static str>>>,
        fail_start: bool,
        fail_end: Rc<Cell<bool>>,
    }

    impl GroupApi for Fake {
        fn start(&self) -> Result<()> {
            if self.fail_start {
                return Err(Error::InvalidArgument("start failed".into()));
            }
            self.log.borrow_mut().push("start");
            Ok(())
        }
        fn end(&self) -> Result<()> {
            self.log.borrow_mut().push("end");
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
}
