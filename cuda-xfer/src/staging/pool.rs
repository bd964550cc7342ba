//! The helper threads that run a staged transfer's host copies beside the calling thread.
//!
//! One process-wide pool, created on first use and grown to the most helpers any transfer
//! asked for. A transfer posts a *job* (a `Fn()` that claims and runs work units until none
//! is left) and runs it on the calling thread too; helpers that are free join in, up to the
//! job's limit. The caller never depends on a helper joining: the work units are claimed in
//! an order that lets any number of threads, one included, finish them (see `plan`).
//!
//! The job borrows the caller's stack (buffers, the pipeline state). That is sound because
//! the caller does not return before every helper that joined has left: a helper announces
//! itself (`active += 1`) before it checks that the job is still open, and the caller closes
//! the job before it waits for `active == 0`; with both sides using `SeqCst`, either the
//! helper sees the job closed and touches nothing, or the caller sees the helper and waits.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// Most helper threads the pool ever starts.
pub(crate) const MAX_HELPERS: usize = 63;

struct Job {
    id: u64,
    /// Type-erased `&&(dyn Fn() + Sync)` living on the caller's stack.
    data: *const (),
    call: unsafe fn(*const ()),
    max_helpers: usize,
    active: AtomicUsize,
    closed: AtomicBool,
    /// Set once a helper ran out of work: no point in others joining.
    exhausted: AtomicBool,
}

// SAFETY: `data` is only dereferenced by `help`, between `active += 1` with the job open and
// `active -= 1`; the caller keeps the pointee alive (and `Sync`, as `run` requires) until it
// has closed the job and seen `active == 0`. Everything else in `Job` is atomics.
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl Job {
    fn help(&self) {
        let before = self.active.fetch_add(1, SeqCst);
        if before >= self.max_helpers || self.closed.load(SeqCst) {
            self.active.fetch_sub(1, SeqCst);
            return;
        }
        super::probe::mark(super::probe::StepKind::Join, 0);
        // SAFETY: the job is open and we are counted in `active`: the caller has not returned
        // and will not before we decrement (module docs). A panic is caught: it must not
        // kill the helper thread (the work function reports its own panics anyway).
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe { (self.call)(self.data) }));
        self.exhausted.store(true, SeqCst);
        self.active.fetch_sub(1, SeqCst);
    }
}

/// How long an idle helper keeps looking for the next job before it sleeps on the condition
/// variable: transfers issued back to back (a loop of copies, or copies between short kernels)
/// then find their helpers awake instead of paying a wake-up each.
/// (Set from [`StagingConfig::helper_linger_us`](super::StagingConfig::helper_linger_us).)
static LINGER_US: AtomicU64 = AtomicU64::new(1000);

/// Sets how long idle helpers linger, in microseconds.
pub(crate) fn set_linger_us(us: u64) {
    LINGER_US.store(us, SeqCst);
}

struct Shared {
    jobs: Mutex<Vec<Arc<Job>>>,
    /// Id of the latest job posted (lets lingering helpers watch without the lock).
    latest: AtomicU64,
    posted: Condvar,
    threads: AtomicUsize,
    spawn_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn shared() -> &'static Arc<Shared> {
    static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        Arc::new(Shared {
            jobs: Mutex::new(Vec::new()),
            latest: AtomicU64::new(0),
            posted: Condvar::new(),
            threads: AtomicUsize::new(0),
            spawn_lock: Mutex::new(()),
        })
    })
}

/// Starts helper threads until the pool has `n` (at most [`MAX_HELPERS`]). A thread that
/// cannot be spawned is not an error: the transfer runs with fewer helpers.
fn ensure_threads(n: usize) {
    let shared = shared();
    let n = n.min(MAX_HELPERS);
    if shared.threads.load(SeqCst) >= n {
        return;
    }
    let _guard = lock(&shared.spawn_lock);
    while shared.threads.load(SeqCst) < n {
        let index = shared.threads.load(SeqCst);
        let for_thread = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("cuda-xfer-staging-{index}"))
            .spawn(move || {
                super::probe::set_helper(index);
                helper_loop(&for_thread)
            });
        if spawned.is_err() {
            break;
        }
        shared.threads.fetch_add(1, SeqCst);
    }
}

/// Number of helper threads started so far.
#[cfg(test)]
pub(crate) fn threads() -> usize {
    shared().threads.load(SeqCst)
}

fn helper_loop(shared: &Shared) {
    let mut last_tried = 0u64;
    loop {
        // Linger: yield while watching for a newer job, then fall back to the condvar.
        let idle = std::time::Instant::now();
        let linger = std::time::Duration::from_micros(LINGER_US.load(SeqCst));
        while shared.latest.load(SeqCst) <= last_tried && idle.elapsed() < linger {
            std::thread::yield_now();
        }
        let job = {
            let mut jobs = lock(&shared.jobs);
            loop {
                let open = jobs.iter().find(|j| {
                    j.id > last_tried && !j.closed.load(SeqCst) && !j.exhausted.load(SeqCst)
                });
                if let Some(job) = open {
                    break Arc::clone(job);
                }
                jobs = shared
                    .posted
                    .wait(jobs)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        last_tried = job.id;
        job.help();
    }
}

unsafe fn call_erased(data: *const ()) {
    // SAFETY: `run` stored a pointer to a live `&(dyn Fn() + Sync)` here (see `Job::help`).
    let work = unsafe { &*(data as *const &(dyn Fn() + Sync)) };
    work();
}

/// Runs `work` on the calling thread and on up to `max_helpers` helper threads at once, and
/// returns once every thread that ran it is done. A panic of the caller's own run is
/// re-raised after the helpers have left.
pub(crate) fn run(max_helpers: usize, work: &(dyn Fn() + Sync)) {
    let max_helpers = max_helpers.min(MAX_HELPERS);
    if max_helpers == 0 {
        work();
        return;
    }
    ensure_threads(max_helpers);
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let shared = shared();
    let id = NEXT_ID.fetch_add(1, SeqCst);
    let job = Arc::new(Job {
        id,
        data: &work as *const &(dyn Fn() + Sync) as *const (),
        call: call_erased,
        max_helpers,
        active: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        exhausted: AtomicBool::new(false),
    });
    lock(&shared.jobs).push(Arc::clone(&job));
    shared.latest.fetch_max(id, SeqCst);
    shared.posted.notify_all();

    let outcome = catch_unwind(AssertUnwindSafe(work));

    job.closed.store(true, SeqCst);
    let mut backoff = Backoff::new();
    while job.active.load(SeqCst) != 0 {
        backoff.wait();
    }
    lock(&shared.jobs).retain(|j| j.id != job.id);
    if let Err(panic) = outcome {
        resume_unwind(panic);
    }
}

/// How long a waiting thread spins and yields before it starts sleeping: longer than a
/// chunk's DMA (about 150 us for 8 MiB at 55 GB/s), so that the waits of a running transfer
/// never pay a scheduler tick, and short enough not to burn a core on a stalled one.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// Waits a little, more each call: spin, then yield, then (after [`BUSY_WAIT`]) sleep.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    rounds: u32,
    since: Option<std::time::Instant>,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff::default()
    }

    pub(crate) fn wait(&mut self) {
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds < 64 {
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < BUSY_WAIT {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_runs_exactly_once_with_helpers() {
        for helpers in [0, 1, 3] {
            let next = AtomicUsize::new(0);
            let done: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            run(helpers, &|| loop {
                let u = next.fetch_add(1, SeqCst);
                if u >= done.len() {
                    return;
                }
                done[u].fetch_add(1, SeqCst);
            });
            assert!(done.iter().all(|d| d.load(SeqCst) == 1));
        }
    }

    #[test]
    fn helpers_never_exceed_the_limit() {
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let next = AtomicUsize::new(0);
        run(2, &|| loop {
            let now = inside.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            let u = next.fetch_add(1, SeqCst);
            std::thread::yield_now();
            inside.fetch_sub(1, SeqCst);
            if u >= 2000 {
                return;
            }
        });
        // The caller plus at most two helpers.
        assert!(most.load(SeqCst) <= 3, "{}", most.load(SeqCst));
        assert!(threads() >= 2);
    }

    #[test]
    fn a_panic_of_the_caller_is_raised_after_the_helpers_leave() {
        let next = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run(2, &|| {
                if std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("cuda-xfer-staging"))
                {
                    while next.fetch_add(1, SeqCst) < 100 {}
                } else {
                    panic!("caller fails");
                }
            })
        }));
        assert!(result.is_err());
    }

    #[test]
    fn concurrent_jobs_all_finish() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let next = AtomicUsize::new(0);
                    let sum = AtomicUsize::new(0);
                    run(3, &|| loop {
                        let u = next.fetch_add(1, SeqCst);
                        if u >= 500 {
                            return;
                        }
                        sum.fetch_add(u, SeqCst);
                    });
                    assert_eq!(sum.load(SeqCst), 499 * 500 / 2);
                });
            }
        });
    }
}
