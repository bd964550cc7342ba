//! The waker state machine and the reactor, on a CPU, against a fake completion source.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use super::reactor::{host_wake, Entry, HostRef, Reactor, Shared, Source, Wait};
use super::*;
use crate::error::DriverError;

/// A context shared by fake sources: a fault there fails every query, as a sticky CUDA
/// error does.
#[derive(Default)]
struct FakeContext {
    faulted: AtomicBool,
}

#[derive(Default)]
struct Counters {
    queries: AtomicUsize,
    drops: AtomicUsize,
    recycled: AtomicUsize,
}

const PENDING: u8 = 0;
const REACHED: u8 = 1;

/// A point that tests reach by hand.
struct Fake {
    state: Arc<AtomicU8>,
    context: Arc<FakeContext>,
    counters: Arc<Counters>,
}

impl Fake {
    fn new(context: &Arc<FakeContext>, counters: &Arc<Counters>) -> (Fake, Arc<AtomicU8>) {
        let state = Arc::new(AtomicU8::new(PENDING));
        (
            Fake {
                state: Arc::clone(&state),
                context: Arc::clone(context),
                counters: Arc::clone(counters),
            },
            state,
        )
    }
}

fn illegal_address() -> Error {
    Error::Driver(DriverError {
        code: 700,
        name: "CUDA_ERROR_ILLEGAL_ADDRESS",
        message: "an illegal memory access was encountered",
        call: "cuEventQuery",
    })
}

impl Source for Fake {
    fn query(&self) -> Result<bool> {
        self.counters.queries.fetch_add(1, Ordering::Relaxed);
        if self.context.faulted.load(Ordering::Acquire) {
            return Err(illegal_address());
        }
        Ok(self.state.load(Ordering::Acquire) == REACHED)
    }

    fn recycle(self) {
        self.counters.recycled.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.counters.drops.fetch_add(1, Ordering::Relaxed);
    }
}

fn test_config() -> PollConfig {
    PollConfig {
        spin: Duration::from_micros(10),
        yields: 2,
        max_sleep: Duration::from_micros(200),
        health_interval: Duration::from_millis(20),
    }
}

/// A reactor of its own for each test (leaked: the reactor is `'static`, as in a process).
struct TestReactor(&'static Reactor<Fake>);

impl TestReactor {
    fn new() -> TestReactor {
        TestReactor::with(test_config())
    }

    fn with(config: PollConfig) -> TestReactor {
        TestReactor(Box::leak(Box::new(Reactor::new("test-reactor", config))))
    }
}

impl Drop for TestReactor {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Counts wake-ups; remembers on which threads the waker was dropped.
#[derive(Default)]
struct CountingWaker {
    wakes: AtomicUsize,
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<CountingWaker>, Waker) {
    let c = Arc::new(CountingWaker::default());
    (Arc::clone(&c), Waker::from(c))
}

fn poll_with(wait: &mut Wait<Fake>, waker: &Waker) -> Poll<Result<()>> {
    wait.poll_wait(&mut Context::from_waker(waker))
}

/// Waits up to 10 s for `cond`.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn reached_before_the_first_poll_resolves_without_the_reactor() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    state.store(REACHED, Ordering::Release);
    let mut wait = Wait::new(r.0, fake, true);
    let (c, waker) = counting();
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(counters.queries.load(Ordering::Relaxed), 1, "one query");
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 1, "recycled");
    assert_eq!(r.0.stats().rounds, 0, "the reactor never ran");
    assert_eq!(c.wakes.load(Ordering::SeqCst), 0);
    // Polled again: the same outcome, no query.
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(counters.queries.load(Ordering::Relaxed), 1);
}

#[test]
fn reached_after_the_first_poll_wakes_once_and_frees_the_entry() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let mut wait = Wait::new(r.0, fake, true);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert!(!wait.is_finished());
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        c.wakes.load(Ordering::SeqCst),
        0,
        "no wake before the point"
    );
    state.store(REACHED, Ordering::Release);
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    assert!(wait.is_finished());
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    eventually("entry gone", || r.0.stats().waits == 0);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 1);
    assert_eq!(r.0.stats().completed, 1);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(c.wakes.load(Ordering::SeqCst), 1, "exactly one wake");
}

#[test]
fn dropped_before_completion_is_collected_by_the_reactor() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, _state) = Fake::new(&ctx, &counters);
    let mut wait = Wait::new(r.0, fake, false);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    eventually("registered", || r.0.stats().waits == 1);
    assert_eq!(
        counters.drops.load(Ordering::Relaxed),
        0,
        "the reactor holds it"
    );
    drop(wait);
    // The point is never reached: the reactor lets go of the source all the same.
    eventually("source dropped", || {
        counters.drops.load(Ordering::Relaxed) == 1
    });
    eventually("entry gone", || r.0.stats().waits == 0);
    assert_eq!(c.wakes.load(Ordering::SeqCst), 0);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 0);
}

#[test]
fn dropped_unpolled_costs_nothing() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, _state) = Fake::new(&ctx, &counters);
    drop(Wait::new(r.0, fake, true));
    assert_eq!(counters.drops.load(Ordering::Relaxed), 1);
    assert_eq!(counters.queries.load(Ordering::Relaxed), 0);
    assert_eq!(r.0.stats(), ReactorStats::default());
}

#[test]
fn many_waiters_are_each_woken_once() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let points: Vec<_> = (0..10).map(|_| Fake::new(&ctx, &counters)).collect();
    let mut states = Vec::new();
    let mut waits = Vec::new();
    for (fake, state) in points {
        states.push(state);
        let shared_fake = fake;
        // 100 waits per point: each its own future on a source of the same point.
        for _ in 0..99 {
            let f = Fake {
                state: Arc::clone(&shared_fake.state),
                context: Arc::clone(&ctx),
                counters: Arc::clone(&counters),
            };
            waits.push((Wait::new(r.0, f, false), counting()));
        }
        waits.push((Wait::new(r.0, shared_fake, false), counting()));
    }
    for (wait, (_, waker)) in &mut waits {
        assert!(poll_with(wait, waker).is_pending());
    }
    for (i, state) in states.iter().enumerate() {
        state.store(REACHED, Ordering::Release);
        let group = &waits[i * 100..(i + 1) * 100];
        eventually("group woken", || {
            group
                .iter()
                .all(|(_, (c, _))| c.wakes.load(Ordering::SeqCst) == 1)
        });
        // The later groups are still asleep.
        for (_, (c, _)) in &waits[(i + 1) * 100..] {
            assert_eq!(c.wakes.load(Ordering::SeqCst), 0);
        }
    }
    for (wait, (c, waker)) in &mut waits {
        assert!(matches!(poll_with(wait, waker), Poll::Ready(Ok(()))));
        assert_eq!(c.wakes.load(Ordering::SeqCst), 1);
    }
    eventually("all collected", || r.0.stats().waits == 0);
    assert_eq!(r.0.stats().completed, 1000);
}

#[test]
fn an_error_reaches_every_waiter() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let mut waits: Vec<_> = (0..500)
        .map(|_| {
            (
                Wait::new(r.0, Fake::new(&ctx, &counters).0, true),
                counting(),
            )
        })
        .collect();
    for (wait, (_, waker)) in &mut waits {
        assert!(poll_with(wait, waker).is_pending());
    }
    let fault = Instant::now();
    ctx.faulted.store(true, Ordering::Release);
    eventually("all woken", || {
        waits
            .iter()
            .all(|(_, (c, _))| c.wakes.load(Ordering::SeqCst) == 1)
    });
    assert!(
        fault.elapsed() < Duration::from_secs(1),
        "{:?}",
        fault.elapsed()
    );
    for (wait, (_, waker)) in &mut waits {
        match poll_with(wait, waker) {
            Poll::Ready(Err(e)) => assert_eq!(e.driver().map(|d| d.code), Some(700)),
            other => panic!("expected the fault, got {other:?}"),
        }
    }
    eventually("all collected", || r.0.stats().waits == 0);
    assert_eq!(r.0.stats().failed, 500);
    assert_eq!(
        counters.recycled.load(Ordering::Relaxed),
        0,
        "failed sources are not reused"
    );
}

#[test]
fn the_latest_waker_is_the_one_woken() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let mut wait = Wait::new(r.0, fake, false);
    let (a, waker_a) = counting();
    let (b, waker_b) = counting();
    assert!(poll_with(&mut wait, &waker_a).is_pending());
    assert!(poll_with(&mut wait, &waker_b).is_pending());
    state.store(REACHED, Ordering::Release);
    eventually("b woken", || b.wakes.load(Ordering::SeqCst) == 1);
    assert_eq!(a.wakes.load(Ordering::SeqCst), 0);
}

/// A waker that records the threads it was woken and dropped on.
struct ThreadWaker {
    woken_on: Mutex<Vec<ThreadId>>,
    dropped_on: Arc<Mutex<Option<ThreadId>>>,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken_on
            .lock()
            .unwrap()
            .push(std::thread::current().id());
    }
}

impl Drop for ThreadWaker {
    fn drop(&mut self) {
        *self.dropped_on.lock().unwrap() = Some(std::thread::current().id());
    }
}

#[test]
fn a_host_function_only_signals_and_the_reactor_wakes_the_task_on_its_own_thread() {
    // A health check far away: the wake must come from the host function's signal.
    let r = TestReactor::with(PollConfig {
        health_interval: Duration::from_secs(5),
        ..test_config()
    });
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, _state) = Fake::new(&ctx, &counters);
    let shared = Arc::new(Shared::new());
    let weak = Arc::downgrade(&shared);
    let host = HostRef::new(&shared);
    let data = host.as_data() as usize;
    r.0.register(Entry::host(fake, Arc::clone(&shared), host, true))
        .map_err(|(e, _)| e)
        .unwrap();
    let mut wait = Wait::registered(r.0, shared);

    let dropped_on = Arc::new(Mutex::new(None));
    let tw = Arc::new(ThreadWaker {
        woken_on: Mutex::new(Vec::new()),
        dropped_on: Arc::clone(&dropped_on),
    });
    let waker = Waker::from(Arc::clone(&tw));
    assert!(poll_with(&mut wait, &waker).is_pending());
    drop(waker);
    eventually("asleep", || r.0.stats().sleeps >= 1);

    // The "driver thread" runs the host function: it must not run the waker (executor
    // code, which may poll the task inline, and the task may call CUDA).
    let fired = Instant::now();
    let driver = std::thread::spawn(move || {
        // SAFETY: `data` is the reference the entry holds, and the function runs once.
        unsafe { host_wake(data as *mut std::ffi::c_void) };
        std::thread::current().id()
    })
    .join()
    .unwrap();
    eventually("woken", || !tw.woken_on.lock().unwrap().is_empty());
    assert!(
        fired.elapsed() < Duration::from_secs(1),
        "woken by the signal, not the health check: {:?}",
        fired.elapsed()
    );
    let woken_on = tw.woken_on.lock().unwrap().clone();
    assert_eq!(woken_on.len(), 1);
    assert_ne!(woken_on[0], driver, "the waker ran on the driver's thread");
    drop(tw);
    let (_, other) = counting();
    assert!(matches!(poll_with(&mut wait, &other), Poll::Ready(Ok(()))));
    drop(wait);
    // The reactor released its reference, and with it the last one: the shared state and
    // the waker are dropped off the driver's thread.
    eventually("released", || weak.upgrade().is_none());
    let on = dropped_on.lock().unwrap().expect("dropped");
    assert_ne!(on, driver, "the waker was dropped on the driver's thread");
    eventually("entry gone", || r.0.stats().waits == 0);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 1);
}

#[test]
fn a_fault_ends_a_host_function_wait_that_never_runs() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let (fake, _state) = Fake::new(&ctx, &counters);
    let shared = Arc::new(Shared::new());
    let weak = Arc::downgrade(&shared);
    let host = HostRef::new(&shared);
    r.0.register(Entry::host(fake, Arc::clone(&shared), host, true))
        .map_err(|(e, _)| e)
        .unwrap();
    let mut wait = Wait::registered(r.0, shared);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    let fault = Instant::now();
    ctx.faulted.store(true, Ordering::Release);
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    // Within a health interval (20 ms here) and a round.
    assert!(
        fault.elapsed() < Duration::from_millis(500),
        "{:?}",
        fault.elapsed()
    );
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Err(_))));
    eventually("entry gone", || r.0.stats().waits == 0);
    drop(wait);
    // The host function may still run some day: its reference is leaked, not released.
    assert!(weak.upgrade().is_some());
}

#[test]
fn a_polled_wait_arriving_during_a_health_check_sleep_is_not_delayed() {
    // Only a host-function wait held: the reactor sleeps until its next health check (1 s).
    let r = TestReactor::with(PollConfig {
        health_interval: Duration::from_secs(1),
        ..test_config()
    });
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, _state) = Fake::new(&ctx, &counters);
    let shared = Arc::new(Shared::new());
    r.0.register(Entry::host(
        fake,
        Arc::clone(&shared),
        HostRef::new(&shared),
        false,
    ))
    .map_err(|(e, _)| e)
    .unwrap();
    eventually("asleep", || r.0.stats().sleeps >= 1);
    std::thread::sleep(Duration::from_millis(20));
    let (fake, state) = Fake::new(&ctx, &counters);
    let start = Instant::now();
    let mut wait = Wait::new(r.0, fake, false);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    state.store(REACHED, Ordering::Release);
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "waited for the health check: {:?}",
        start.elapsed()
    );
    drop(wait);
    shared.cancel();
}

struct Probe(Arc<Mutex<Option<String>>>);

impl Drop for Probe {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = std::thread::current().name().map(str::to_owned);
    }
}

#[test]
fn a_payload_is_dropped_on_the_drop_thread_after_its_point_and_leaked_after_a_fault() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let (fake, state) = Fake::new(&ctx, &counters);
    let seen = Arc::new(Mutex::new(None));
    r.0.register(Entry::payload(fake, Box::new(Probe(Arc::clone(&seen)))))
        .map_err(|(e, _)| e)
        .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert!(seen.lock().unwrap().is_none(), "kept while pending");
    state.store(REACHED, Ordering::Release);
    eventually("dropped", || seen.lock().unwrap().is_some());
    assert_eq!(seen.lock().unwrap().as_deref(), Some("test-reactor-drops"));

    let (fake, _state) = Fake::new(&ctx, &counters);
    let leaked = Arc::new(Mutex::new(None));
    r.0.register(Entry::payload(fake, Box::new(Probe(Arc::clone(&leaked)))))
        .map_err(|(e, _)| e)
        .unwrap();
    ctx.faulted.store(true, Ordering::Release);
    eventually("entry gone", || r.0.stats().waits == 0);
    assert_eq!(r.0.stats().failed, 1);
    std::thread::sleep(Duration::from_millis(5));
    assert!(leaked.lock().unwrap().is_none(), "leaked, never dropped");
}

/// A payload whose drop blocks until released (as freeing pinned host memory waits for the
/// whole device).
struct Blocking(std::sync::mpsc::Receiver<()>);

impl Drop for Blocking {
    fn drop(&mut self) {
        let _ = self.0.recv_timeout(Duration::from_secs(10));
    }
}

#[test]
fn a_payload_whose_drop_blocks_holds_up_no_other_wait_and_counts_until_dropped() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let (release, gate) = std::sync::mpsc::channel();
    let (fake, state) = Fake::new(&ctx, &counters);
    r.0.register(Entry::payload(fake, Box::new(Blocking(gate))))
        .map_err(|(e, _)| e)
        .unwrap();
    state.store(REACHED, Ordering::Release);
    // The payload's drop is now blocked; another wait still completes.
    let (fake, state) = Fake::new(&ctx, &counters);
    let mut wait = Wait::new(r.0, fake, false);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    state.store(REACHED, Ordering::Release);
    eventually("woken past a blocked drop", || {
        c.wakes.load(Ordering::SeqCst) == 1
    });
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    eventually("only the blocked drop left", || r.0.stats().waits == 1);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(r.0.stats().waits, 1, "the blocked drop still counts");
    release.send(()).unwrap();
    eventually("drop finished", || r.0.stats().waits == 0);
}

#[test]
fn a_stopped_reactor_fails_its_waits_and_refuses_new_ones() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let mut wait = Wait::new(r.0, Fake::new(&ctx, &counters).0, false);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    r.0.stop();
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    assert!(matches!(
        poll_with(&mut wait, &waker),
        Poll::Ready(Err(Error::Reactor(_)))
    ));
    let mut late = Wait::new(r.0, Fake::new(&ctx, &counters).0, false);
    assert!(matches!(
        poll_with(&mut late, &waker),
        Poll::Ready(Err(Error::Reactor(_)))
    ));
}

/// A whole `block_on` over a thread-parking waker: what an executor does.
#[test]
fn a_minimal_executor_drives_waits_to_completion() {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(v) = Pin::new(&mut f).poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(Duration::from_secs(1));
        }
    }
    struct Fut(Wait<Fake>);
    impl Future for Fut {
        type Output = Result<()>;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
            self.get_mut().0.poll_wait(cx)
        }
    }
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    for _ in 0..20 {
        let (fake, state) = Fake::new(&ctx, &counters);
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            state.store(REACHED, Ordering::Release);
        });
        block_on(Fut(Wait::new(r.0, fake, false))).unwrap();
        setter.join().unwrap();
    }
}

#[test]
fn poll_config_bounds_are_checked() {
    assert!(PollConfig::default().check().is_ok());
    let bad_sleep = PollConfig {
        max_sleep: Duration::from_millis(101),
        ..PollConfig::default()
    };
    assert!(matches!(bad_sleep.check(), Err(Error::InvalidArgument(_))));
    for health in [Duration::ZERO, Duration::from_millis(1001)] {
        let bad = PollConfig {
            health_interval: health,
            ..PollConfig::default()
        };
        assert!(matches!(bad.check(), Err(Error::InvalidArgument(_))));
    }
}

#[test]
fn strategy_setting_round_trips() {
    assert_eq!(WakeStrategy::default(), WakeStrategy::Poll);
    set_wake_strategy(WakeStrategy::HostFunction);
    assert_eq!(wake_strategy(), WakeStrategy::HostFunction);
    set_wake_strategy(WakeStrategy::Poll);
    assert_eq!(wake_strategy(), WakeStrategy::Poll);
}

#[test]
fn completion_is_send_and_unpin() {
    fn send_unpin<T: Send + Unpin + 'static>() {}
    send_unpin::<Completion>();
}
