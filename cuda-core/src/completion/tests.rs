//! The waker state machine, the warm spin and the reactor (with its per-stream lanes), on a
//! CPU, against a fake completion source.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use super::reactor::{host_wake, Entry, HostRef, Lane, Reactor, Shared, Source, Wait};
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

/// A wait in parked mode, whatever the thread's or the process's mode.
fn parked(r: &'static Reactor<Fake>, fake: Fake, recycle: bool) -> Wait<Fake> {
    Wait::new(r, fake, recycle).with_mode(WakeMode::Parked)
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
    let mut wait = parked(r.0, fake, true);
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
    let mut wait = parked(r.0, fake, true);
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
    let mut wait = parked(r.0, fake, false);
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
    drop(parked(r.0, fake, true));
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
            waits.push((parked(r.0, f, false), counting()));
        }
        waits.push((parked(r.0, shared_fake, false), counting()));
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
        .map(|_| (parked(r.0, Fake::new(&ctx, &counters).0, true), counting()))
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
    let mut wait = parked(r.0, fake, false);
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
    let mut wait = parked(r.0, fake, false);
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
    let mut wait = parked(r.0, fake, false);
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
    let mut wait = parked(r.0, Fake::new(&ctx, &counters).0, false);
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    r.0.stop();
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    assert!(matches!(
        poll_with(&mut wait, &waker),
        Poll::Ready(Err(Error::Reactor(_)))
    ));
    let mut late = parked(r.0, Fake::new(&ctx, &counters).0, false);
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
    // Parked; warm within its budget (the self-wake unparks the thread at once); warm past
    // its budget (then parked).
    let modes = [
        WakeMode::Parked,
        warm(Duration::from_secs(5), Duration::from_micros(50)),
        warm(Duration::from_micros(300), Duration::from_micros(50)),
    ];
    for mode in modes {
        for _ in 0..10 {
            let (fake, state) = Fake::new(&ctx, &counters);
            let setter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2));
                state.store(REACHED, Ordering::Release);
            });
            block_on(Fut(Wait::new(r.0, fake, false).with_mode(mode))).unwrap();
            setter.join().unwrap();
        }
    }
    let stats = r.0.stats();
    assert_eq!(stats.warm_resolved, 10, "{stats:?}");
    assert_eq!(stats.warm_parked, 10, "{stats:?}");
    assert_eq!(stats.warm_spinning, 0);
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

// ---- warm mode ----

fn warm(budget: Duration, poll_spin: Duration) -> WakeMode {
    WakeMode::Warm(
        WarmConfig::new(budget)
            .unwrap()
            .with_poll_spin(poll_spin)
            .unwrap(),
    )
}

fn warm_wait(r: &'static Reactor<Fake>, fake: Fake, mode: WakeMode) -> Wait<Fake> {
    Wait::new(r, fake, true).with_mode(mode)
}

#[test]
fn a_warm_wait_spins_in_the_polling_thread_then_parks_when_its_budget_is_spent() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let budget = Duration::from_millis(30);
    let mut wait = warm_wait(r.0, fake, warm(budget, Duration::from_micros(100)));
    let (c, waker) = counting();
    let start = Instant::now();
    // Within the budget: every poll spins (queries), wakes its own task and returns
    // Pending; nothing is registered, the reactor never runs.
    let mut polls = 0;
    while start.elapsed() < budget / 2 {
        assert!(poll_with(&mut wait, &waker).is_pending());
        polls += 1;
    }
    assert_eq!(
        c.wakes.load(Ordering::SeqCst),
        polls,
        "a self-wake per poll"
    );
    assert!(
        counters.queries.load(Ordering::Relaxed) > polls,
        "several queries a poll"
    );
    let stats = r.0.stats();
    assert_eq!((stats.waits, stats.rounds), (0, 0), "registered: {stats:?}");
    assert_eq!(stats.warm_spinning, 0, "no spin outside a poll");
    assert_eq!(stats.warm_threads, 1);
    // Past the budget: the next poll registers and does not wake itself.
    std::thread::sleep(budget);
    let woken = c.wakes.load(Ordering::SeqCst);
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert_eq!(
        c.wakes.load(Ordering::SeqCst),
        woken,
        "no self-wake once parked"
    );
    eventually("registered", || r.0.stats().waits == 1);
    assert_eq!(r.0.stats().warm_parked, 1);
    // The parked path: the reactor wakes it once.
    state.store(REACHED, Ordering::Release);
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == woken + 1);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    eventually("entry gone", || r.0.stats().waits == 0);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 1);
    assert_eq!(r.0.stats().warm_resolved, 0);
}

#[test]
fn a_completion_arriving_during_the_spin_resolves_in_the_poll_without_the_reactor() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let mut wait = warm_wait(
        r.0,
        fake,
        warm(Duration::from_secs(10), WarmConfig::MAX_POLL_SPIN),
    );
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_micros(300));
        state.store(REACHED, Ordering::Release);
    });
    let start = Instant::now();
    let outcome = loop {
        if let Poll::Ready(outcome) = poll_with(&mut wait, &waker) {
            break outcome;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never resolved");
    };
    setter.join().unwrap();
    assert!(outcome.is_ok());
    let stats = r.0.stats();
    assert_eq!(
        (stats.waits, stats.rounds),
        (0, 0),
        "the reactor ran: {stats:?}"
    );
    assert_eq!(stats.warm_resolved, 1);
    assert_eq!(stats.warm_parked, 0);
    assert_eq!(
        counters.recycled.load(Ordering::Relaxed),
        1,
        "reached: recycled"
    );
    // Ready came straight from the poll: no wake beyond the self-wakes of the Pending polls.
    let pending_polls = c.wakes.load(Ordering::SeqCst);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(c.wakes.load(Ordering::SeqCst), pending_polls);
}

#[test]
fn a_fault_during_the_spin_reaches_the_warm_future_at_its_next_query() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let mut waits: Vec<_> = (0..50)
        .map(|_| {
            let fake = Fake::new(&ctx, &counters).0;
            let mode = warm(Duration::from_secs(10), Duration::from_micros(20));
            (warm_wait(r.0, fake, mode), counting())
        })
        .collect();
    for (wait, (_, waker)) in &mut waits {
        assert!(poll_with(wait, waker).is_pending());
    }
    ctx.faulted.store(true, Ordering::Release);
    for (wait, (_, waker)) in &mut waits {
        match poll_with(wait, waker) {
            Poll::Ready(Err(e)) => assert_eq!(e.driver().map(|d| d.code), Some(700)),
            other => panic!("expected the fault, got {other:?}"),
        }
    }
    let stats = r.0.stats();
    assert_eq!(stats.rounds, 0, "the reactor never ran");
    assert_eq!(stats.warm_resolved, 50);
    assert_eq!(
        counters.recycled.load(Ordering::Relaxed),
        0,
        "failed: not reused"
    );
    assert_eq!(counters.drops.load(Ordering::Relaxed), 50);
}

#[test]
fn a_warm_future_dropped_mid_spin_drops_its_source_and_registers_nothing() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, _state) = Fake::new(&ctx, &counters);
    let mut wait = warm_wait(
        r.0,
        fake,
        warm(Duration::from_secs(10), Duration::from_micros(50)),
    );
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert!(!wait.is_finished());
    drop(wait);
    assert_eq!(
        counters.drops.load(Ordering::Relaxed),
        1,
        "the source is dropped"
    );
    assert_eq!(
        counters.recycled.load(Ordering::Relaxed),
        0,
        "not reached: not reused"
    );
    std::thread::sleep(Duration::from_millis(5));
    let stats = r.0.stats();
    assert_eq!((stats.waits, stats.rounds), (0, 0), "{stats:?}");
    assert_eq!(stats.warm_spinning, 0);
    assert_eq!(c.wakes.load(Ordering::SeqCst), 2, "only the self-wakes");
}

#[test]
fn a_warm_host_function_wait_spins_on_its_clone_and_the_reactor_still_collects_the_entry() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let clone = Fake {
        state: Arc::clone(&fake.state),
        context: Arc::clone(&fake.context),
        counters: Arc::clone(&fake.counters),
    };
    let shared = Arc::new(Shared::new());
    let weak = Arc::downgrade(&shared);
    let host = HostRef::new(&shared);
    let data = host.as_data() as usize;
    r.0.register(Entry::host(fake, Arc::clone(&shared), host, true))
        .map_err(|(e, _)| e)
        .unwrap();
    let mut wait = Wait::hosted(r.0, shared, clone)
        .with_mode(warm(Duration::from_secs(10), Duration::from_micros(50)));
    let (_c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    state.store(REACHED, Ordering::Release);
    let start = Instant::now();
    while poll_with(&mut wait, &waker).is_pending() {
        assert!(start.elapsed() < Duration::from_secs(5), "never resolved");
    }
    assert_eq!(r.0.stats().warm_resolved, 1);
    drop(wait);
    // The host function runs later: the reactor then releases its reference.
    // SAFETY: `data` is the reference the entry holds, and the function runs once.
    unsafe { host_wake(data as *mut std::ffi::c_void) };
    eventually("released", || weak.upgrade().is_none());
    eventually("entry gone", || r.0.stats().waits == 0);
}

#[test]
fn spinning_threads_are_bounded_by_the_threads_that_poll() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let mode = warm(Duration::from_secs(10), Duration::from_micros(20));
    const THREADS: usize = 3;
    const PER_THREAD: usize = 200;
    let mut states = Vec::new();
    let mut batches = Vec::new();
    for _ in 0..THREADS {
        let mut batch = Vec::new();
        for _ in 0..PER_THREAD {
            let (fake, state) = Fake::new(&ctx, &counters);
            states.push(state);
            batch.push(warm_wait(r.0, fake, mode));
        }
        batches.push(batch);
    }
    // Threads that have polled every wait of theirs twice (all spinning, none reached).
    let go = Arc::new(AtomicUsize::new(0));
    let pollers: Vec<_> = batches
        .into_iter()
        .map(|mut batch| {
            let go = Arc::clone(&go);
            std::thread::spawn(move || {
                let (_c, waker) = counting();
                let mut done = vec![false; batch.len()];
                let mut rounds = 0u64;
                while done.iter().any(|d| !d) {
                    for (wait, done) in batch.iter_mut().zip(&mut done) {
                        if !*done {
                            *done = poll_with(wait, &waker).is_ready();
                        }
                    }
                    rounds += 1;
                    if rounds == 2 {
                        go.fetch_add(1, Ordering::Release);
                    }
                }
            })
        })
        .collect();
    eventually("spinning", || go.load(Ordering::Acquire) == THREADS);
    for state in &states {
        state.store(REACHED, Ordering::Release);
    }
    for p in pollers {
        p.join().unwrap();
    }
    let stats = r.0.stats();
    assert!(stats.warm_spinning_peak <= THREADS, "{stats:?}");
    assert_eq!(stats.warm_threads, THREADS, "{stats:?}");
    assert_eq!(stats.warm_spinning, 0);
    assert_eq!(stats.warm_resolved, (THREADS * PER_THREAD) as u64);
    assert_eq!((stats.waits, stats.rounds), (0, 0), "{stats:?}");
}

#[test]
fn the_mode_comes_from_the_future_then_the_thread_then_the_process() {
    let r = TestReactor::new();
    std::thread::spawn(move || {
        let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
        let (_c, waker) = counting();
        let previous = set_thread_wake_mode(Some(WakeMode::warm()));
        assert_eq!(previous, None);
        assert_eq!(thread_wake_mode(), Some(WakeMode::warm()));
        // No mode of its own: the thread's (warm): spins, registers nothing.
        let mut wait = Wait::new(r.0, Fake::new(&ctx, &counters).0, false);
        assert!(poll_with(&mut wait, &waker).is_pending());
        assert_eq!(r.0.stats().waits, 0);
        assert_eq!(r.0.stats().warm_threads, 1);
        drop(wait);
        // Its own mode wins over the thread's.
        let mut wait = parked(r.0, Fake::new(&ctx, &counters).0, false);
        assert!(poll_with(&mut wait, &waker).is_pending());
        eventually("registered", || r.0.stats().waits == 1);
        drop(wait);
        assert_eq!(set_thread_wake_mode(None), Some(WakeMode::warm()));
        assert_eq!(thread_wake_mode(), None);
    })
    .join()
    .unwrap();
}

#[test]
fn wake_modes_parse_and_warm_configs_are_bounded() {
    assert_eq!("parked".parse::<WakeMode>().unwrap(), WakeMode::Parked);
    assert_eq!("warm".parse::<WakeMode>().unwrap(), WakeMode::warm());
    assert_eq!(WakeMode::warm(), WakeMode::Warm(WarmConfig::default()));
    let five = WakeMode::Warm(WarmConfig::new(Duration::from_millis(5)).unwrap());
    assert_eq!("warm:5ms".parse::<WakeMode>().unwrap(), five);
    assert_eq!(" WARM:5000us ".parse::<WakeMode>().unwrap(), five);
    assert_eq!(
        "warm:2s".parse::<WakeMode>().unwrap(),
        WakeMode::Warm(WarmConfig::new(Duration::from_secs(2)).unwrap())
    );
    for bad in [
        "",
        "hot",
        "warm:",
        "warm:5",
        "warm:5h",
        "warm:11s",
        "parked:1ms",
    ] {
        assert!(
            matches!(bad.parse::<WakeMode>(), Err(Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
    assert!(WarmConfig::new(WarmConfig::MAX_SPIN_BUDGET).is_ok());
    assert!(matches!(
        WarmConfig::new(WarmConfig::MAX_SPIN_BUDGET + Duration::from_nanos(1)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        WarmConfig::default().with_poll_spin(Duration::from_millis(2)),
        Err(Error::InvalidArgument(_))
    ));
    let c = WarmConfig::new(Duration::ZERO)
        .unwrap()
        .with_poll_spin(Duration::ZERO)
        .unwrap();
    assert_eq!(
        (c.spin_budget(), c.poll_spin()),
        (Duration::ZERO, Duration::ZERO)
    );
}

#[test]
fn the_process_mode_word_round_trips() {
    let configs = [
        WarmConfig::default(),
        WarmConfig::new(WarmConfig::MAX_SPIN_BUDGET)
            .unwrap()
            .with_poll_spin(WarmConfig::MAX_POLL_SPIN)
            .unwrap(),
        WarmConfig::new(Duration::ZERO)
            .unwrap()
            .with_poll_spin(Duration::ZERO)
            .unwrap(),
        WarmConfig::new(Duration::from_nanos(123_456_789))
            .unwrap()
            .with_poll_spin(Duration::from_nanos(987_654))
            .unwrap(),
    ];
    for mode in configs
        .into_iter()
        .map(WakeMode::Warm)
        .chain([WakeMode::Parked])
    {
        assert_eq!(decode_mode(encode_mode(mode)), mode);
    }
    // The process setting itself is left alone: other tests run beside this one. Setting
    // what it is already changes nothing.
    let now = wake_mode();
    set_wake_mode(now);
    assert_eq!(wake_mode(), now);
}

#[test]
fn a_warm_wait_with_no_budget_queries_once_then_parks() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let (fake, state) = Fake::new(&ctx, &counters);
    let mut wait = warm_wait(r.0, fake, warm(Duration::ZERO, Duration::ZERO));
    let (c, waker) = counting();
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert_eq!(c.wakes.load(Ordering::SeqCst), 0, "parked at once");
    eventually("registered", || r.0.stats().waits == 1);
    state.store(REACHED, Ordering::Release);
    eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
}

// ---- lanes: the waits of one stream, batched ----

/// A wait on a point of stream `key` recorded as number `seq`.
fn lane_wait(r: &'static Reactor<Fake>, fake: Fake, key: u64, seq: u64) -> Wait<Fake> {
    parked(r, fake, true).in_lane(Some(Lane { key: (0, key), seq }))
}

#[test]
fn the_newest_point_of_a_stream_reached_completes_every_older_wait_without_a_query() {
    // A long sleep: the reactor must not reach them by chance between two steps.
    let r = TestReactor::with(PollConfig {
        spin: Duration::ZERO,
        yields: 0,
        max_sleep: Duration::from_millis(20),
        ..test_config()
    });
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let mut states = Vec::new();
    let mut waits: Vec<_> = (1..=100u64)
        .map(|seq| {
            let (fake, state) = Fake::new(&ctx, &counters);
            states.push(state);
            (lane_wait(r.0, fake, 7, seq), counting())
        })
        .collect();
    // Polled newest first: the lane still orders them by their point.
    for (wait, (_, waker)) in waits.iter_mut().rev() {
        assert!(poll_with(wait, waker).is_pending());
    }
    eventually("registered", || r.0.stats().waits == 100);
    eventually("a round", || r.0.stats().rounds >= 2);
    let before = r.0.stats().queries;
    // Only the newest point says so: a stream runs in order, so the others are done too.
    states[99].store(REACHED, Ordering::Release);
    eventually("all woken", || {
        waits
            .iter()
            .all(|(_, (c, _))| c.wakes.load(Ordering::SeqCst) == 1)
    });
    let stats = r.0.stats();
    assert_eq!(stats.completed, 100);
    assert_eq!(stats.batched, 99, "{stats:?}");
    assert!(
        stats.queries - before <= 2 * (stats.rounds - 1).max(1) + 4,
        "about one query a round: {stats:?}"
    );
    for (wait, (_, waker)) in &mut waits {
        assert!(matches!(poll_with(wait, waker), Poll::Ready(Ok(()))));
    }
    eventually("collected", || r.0.stats().waits == 0);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 100);
}

#[test]
fn a_lane_completes_in_order_up_to_its_first_pending_point() {
    let r = TestReactor::new();
    let (ctx, counters) = (Arc::default(), Arc::new(Counters::default()));
    let mut states = Vec::new();
    let mut waits: Vec<_> = (1..=6u64)
        .map(|seq| {
            let (fake, state) = Fake::new(&ctx, &counters);
            states.push(state);
            (lane_wait(r.0, fake, 9, seq), counting())
        })
        .collect();
    // Another stream, pending: untouched by this one's progress.
    let (other, _other_state) = Fake::new(&ctx, &counters);
    let mut other = (lane_wait(r.0, other, 10, 1), counting());
    assert!(poll_with(&mut other.0, &other.1 .1).is_pending());
    for (wait, (_, waker)) in &mut waits {
        assert!(poll_with(wait, waker).is_pending());
    }
    // The third is dropped: its entry goes without holding up the others.
    let (dropped, _) = waits.remove(2);
    drop(dropped);
    states[0].store(REACHED, Ordering::Release);
    states[1].store(REACHED, Ordering::Release);
    states[3].store(REACHED, Ordering::Release);
    // 1, 2 and 4 (the dropped third is skipped); 5 and 6 are not reached.
    eventually("three woken", || {
        waits[..3]
            .iter()
            .all(|(_, (c, _))| c.wakes.load(Ordering::SeqCst) == 1)
    });
    std::thread::sleep(Duration::from_millis(5));
    for (_, (c, _)) in &waits[3..] {
        assert_eq!(c.wakes.load(Ordering::SeqCst), 0, "woken before its point");
    }
    assert_eq!(other.1 .0.wakes.load(Ordering::SeqCst), 0);
    states[5].store(REACHED, Ordering::Release);
    eventually("all woken", || {
        waits
            .iter()
            .all(|(_, (c, _))| c.wakes.load(Ordering::SeqCst) == 1)
    });
    eventually("only the other stream left", || r.0.stats().waits == 1);
    assert_eq!(r.0.stats().batched, 1, "the fifth, through the sixth");
    drop(other);
}

#[test]
fn a_fault_fails_every_wait_of_a_lane() {
    let r = TestReactor::new();
    let ctx: Arc<FakeContext> = Arc::default();
    let counters = Arc::new(Counters::default());
    let mut waits: Vec<_> = (1..=20u64)
        .map(|seq| {
            (
                lane_wait(r.0, Fake::new(&ctx, &counters).0, 3, seq),
                counting(),
            )
        })
        .collect();
    for (wait, (_, waker)) in &mut waits {
        assert!(poll_with(wait, waker).is_pending());
    }
    ctx.faulted.store(true, Ordering::Release);
    for (wait, (c, waker)) in &mut waits {
        eventually("woken", || c.wakes.load(Ordering::SeqCst) == 1);
        assert!(matches!(poll_with(wait, waker), Poll::Ready(Err(_))));
    }
    eventually("collected", || r.0.stats().waits == 0);
    assert_eq!(r.0.stats().failed, 20);
    assert_eq!(counters.recycled.load(Ordering::Relaxed), 0);
}
