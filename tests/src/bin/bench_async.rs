//! Benchmark: awaiting the GPU (`cudars_core::completion`) against a blocking
//! `cuEventSynchronize` and a spin on `cuEventQuery`, in the same run.
//!
//! **Wake latency**, from the end of a kernel to the resumed waiter. Each sample: a
//! `wait_flag` kernel on each of up to 8 streams spins until the host writes a mapped pinned
//! flag; the waiters are queued behind the kernels and left waiting for 2 ms (their steady
//! state: the reactor deep in its back-off); then the host writes the flag at `t0` and each
//! waiter notes when it resumes. Latency = resume - `t0` (it includes the flag's trip to the
//! device and the kernel's exit, the same for every waiter kind). At 1 and at 1,000
//! concurrent waits (spread over 8 streams):
//! - ours: `Stream::completion_with(strategy)` awaited by tokio tasks (4 worker threads),
//!   for `Poll` (default back-off: 20 us spin, 4 yields, sleeps up to 50 us), `Poll` with
//!   `max_sleep` 10 us, and `HostFunction`;
//! - peers: one thread in `cuEventSynchronize` on each event in turn (default event flags,
//!   and with `CU_EVENT_BLOCKING_SYNC`), and one thread spinning on `cuEventQuery` over the
//!   events; and the floor of any reactor design here: that spinning thread waking a tokio
//!   task through a oneshot (`spin_wakes_task`: detection is immediate, what remains is the
//!   runtime's own cost of resuming a parked worker).
//!
//! Rows: `wake_median_*` and `wake_p99_*` (us; raw column: the blocking synchronize's figure;
//! target median <= 1.5x), and `wait_cpu_*`: host CPU time of the whole process (getrusage,
//! user + system) from the moment the waiters wait until the last resumed, per sample (us;
//! raw column: the spin's; target <= 5% of it).
//!
//! **Cost to the stream**: 2,000 4 KiB pinned host-to-device copies on one stream, each
//! followed by an awaited `Stream::completion` (a task per copy), against the same copies
//! with one synchronize at the end (`pipeline_*`, copies per second; target >= 0.97x).
//!
//! Run on the GPU machine: `bench_async`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudars_core::completion::{self, PollConfig, WakeStrategy};
use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Event, Stream};
use workspace_tests::bench::{Report, Target};
use workspace_tests::kernels::Kernels;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// How long the waiters wait before the kernel is released.
const HOLD: Duration = Duration::from_millis(2);
const STREAMS: usize = 8;

/// Process CPU time (user + system) in microseconds.
fn cpu_us() -> f64 {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; RUSAGE_SELF is always accepted.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Who waits.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Waiter {
    /// Our futures with this strategy and back-off.
    Ours(WakeStrategy, PollConfig),
    /// `cuEventSynchronize` in turn on each event, one thread; `true`: blocking-sync events.
    Sync(bool),
    /// One thread spinning on `cuEventQuery` over the events.
    Spin,
    /// The floor of any design that resumes a task parked on the runtime: one thread spins on
    /// `cuEventQuery` (no detection delay) and wakes each tokio task through a oneshot.
    SpinWakesTask,
}

impl Waiter {
    fn label(&self) -> String {
        match self {
            Waiter::Ours(WakeStrategy::HostFunction, _) => "host_function".into(),
            Waiter::Ours(_, cfg) if *cfg == PollConfig::default() => "poll".into(),
            Waiter::Ours(_, cfg) => format!("poll_max{}us", cfg.max_sleep.as_micros()),
            Waiter::Sync(false) => "event_sync".into(),
            Waiter::Sync(true) => "event_sync_blocking".into(),
            Waiter::Spin => "query_spin".into(),
            Waiter::SpinWakesTask => "spin_wakes_task".into(),
        }
    }
}

/// A mapped pinned word the `wait_flag` kernels watch.
struct Flag {
    mem: PinnedMemory,
    dev_ptr: u64,
}

impl Flag {
    fn new(dev: &Device) -> BoxResult<Flag> {
        let mem = PinnedMemory::new(dev, 4, PinnedFlags::DEVICE_MAP)?;
        let dev_ptr = mem.device_ptr().ok_or("no device mapping")?;
        let f = Flag { mem, dev_ptr };
        f.set(0);
        Ok(f)
    }

    fn set(&self, v: u32) {
        // SAFETY: 4 bytes of live pinned memory; the kernel only reads it.
        unsafe { std::ptr::write_volatile(self.mem.as_ptr() as *mut u32, v) };
    }
}

struct Sample {
    latencies_us: Vec<f64>,
    cpu_us: f64,
}

struct Bench {
    dev: Device,
    k: Kernels,
    streams: Vec<Stream>,
    flag: Flag,
    rt: tokio::runtime::Runtime,
}

impl Bench {
    /// One sample: `waits` waiters of kind `who` behind `wait_flag` kernels.
    fn sample(&self, who: Waiter, waits: usize) -> BoxResult<Sample> {
        self.flag.set(0);
        let streams = &self.streams[..waits.min(STREAMS)];
        for s in streams {
            // SAFETY: the flag is mapped pinned memory that outlives the kernel (it is set
            // below and the stream is drained before the next sample).
            unsafe {
                self.k.wait_flag_raw(
                    s,
                    self.flag.dev_ptr,
                    self.k.cycles_for(Duration::from_secs(2)),
                )
            }?;
        }
        let base = Instant::now();
        let resumed: Arc<Vec<AtomicU64>> =
            Arc::new((0..waits).map(|_| AtomicU64::new(0)).collect());
        let stamp = move |i: usize, r: &Vec<AtomicU64>| {
            r[i].store(base.elapsed().as_nanos() as u64 + 1, Ordering::Release);
        };
        let (cpu0, t0, cpu1);
        match who {
            Waiter::Ours(strategy, _) => {
                let futures: Vec<_> = (0..waits)
                    .map(|i| streams[i % streams.len()].completion_with(strategy))
                    .collect::<Result<_, _>>()?;
                let tasks: Vec<_> = futures
                    .into_iter()
                    .enumerate()
                    .map(|(i, f)| {
                        let r = Arc::clone(&resumed);
                        self.rt.spawn(async move {
                            f.await.unwrap();
                            stamp(i, &r);
                        })
                    })
                    .collect();
                cpu0 = cpu_us();
                std::thread::sleep(HOLD);
                t0 = base.elapsed().as_nanos() as u64;
                self.flag.set(1);
                self.rt.block_on(async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                });
                cpu1 = cpu_us();
            }
            Waiter::SpinWakesTask => {
                let events: Vec<Event> = (0..waits)
                    .map(|i| {
                        let e = Event::builder(&self.dev).build()?;
                        e.record(&streams[i % streams.len()])?;
                        Ok(e)
                    })
                    .collect::<cudars_core::Result<_>>()?;
                let (txs, tasks): (Vec<_>, Vec<_>) = (0..waits)
                    .map(|i| {
                        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                        let r = Arc::clone(&resumed);
                        let task = self.rt.spawn(async move {
                            rx.await.unwrap();
                            stamp(i, &r);
                        });
                        (tx, task)
                    })
                    .unzip();
                let spinner = std::thread::spawn(move || {
                    let mut left: Vec<(usize, Option<tokio::sync::oneshot::Sender<()>>)> =
                        txs.into_iter().map(Some).enumerate().collect();
                    while !left.is_empty() {
                        left.retain_mut(|(i, tx)| {
                            if events[*i].query().unwrap() {
                                let _ = tx.take().map(|t| t.send(()));
                                false
                            } else {
                                true
                            }
                        });
                    }
                });
                cpu0 = cpu_us();
                std::thread::sleep(HOLD);
                t0 = base.elapsed().as_nanos() as u64;
                self.flag.set(1);
                spinner.join().map_err(|_| "spinner thread panicked")?;
                self.rt.block_on(async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                });
                cpu1 = cpu_us();
            }
            Waiter::Sync(_) | Waiter::Spin => {
                let blocking = who == Waiter::Sync(true);
                let events: Vec<Event> = (0..waits)
                    .map(|i| {
                        let e = Event::builder(&self.dev).blocking_sync(blocking).build()?;
                        e.record(&streams[i % streams.len()])?;
                        Ok(e)
                    })
                    .collect::<cudars_core::Result<_>>()?;
                let r = Arc::clone(&resumed);
                let spin = who == Waiter::Spin;
                let waiter = std::thread::spawn(move || {
                    if spin {
                        let mut left: Vec<usize> = (0..events.len()).collect();
                        while !left.is_empty() {
                            left.retain(|&i| {
                                if events[i].query().unwrap() {
                                    stamp(i, &r);
                                    false
                                } else {
                                    true
                                }
                            });
                        }
                    } else {
                        for (i, e) in events.iter().enumerate() {
                            e.synchronize().unwrap();
                            stamp(i, &r);
                        }
                    }
                });
                cpu0 = cpu_us();
                std::thread::sleep(HOLD);
                t0 = base.elapsed().as_nanos() as u64;
                self.flag.set(1);
                waiter.join().map_err(|_| "waiter thread panicked")?;
                cpu1 = cpu_us();
            }
        }
        for s in streams {
            s.synchronize()?;
        }
        let latencies_us = resumed
            .iter()
            .map(|t| (t.load(Ordering::Acquire).saturating_sub(1 + t0)) as f64 / 1e3)
            .collect();
        Ok(Sample {
            latencies_us,
            cpu_us: cpu1 - cpu0,
        })
    }

    /// Median and p99 latency (us) and median CPU per sample (us) over `samples` samples.
    fn measure(&self, who: Waiter, waits: usize, samples: usize) -> BoxResult<(f64, f64, f64)> {
        if let Waiter::Ours(_, cfg) = who {
            completion::set_poll_config(cfg)?;
        }
        // Warm-up: events, threads, the reactor, the runtime.
        for _ in 0..3 {
            self.sample(who, waits)?;
        }
        let mut lat = Vec::new();
        let mut cpu = Vec::new();
        for _ in 0..samples {
            let s = self.sample(who, waits)?;
            lat.extend(s.latencies_us);
            cpu.push(s.cpu_us);
        }
        completion::set_poll_config(PollConfig::default())?;
        lat.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        Ok((
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&cpu, 0.5),
        ))
    }

    /// Copies per second of `n` 4 KiB pinned copies on one stream, each followed by an
    /// awaited completion (`Some(strategy)`), or by nothing and one synchronize (`None`).
    fn pipeline(&self, strategy: Option<WakeStrategy>, n: usize) -> BoxResult<f64> {
        let stream = &self.streams[0];
        let src = PinnedMemory::new(&self.dev, 4096, PinnedFlags::NONE)?;
        let dst = DevicePtr::alloc(&self.dev, 4096)?;
        let mut best = 0f64;
        for _ in 0..5 {
            stream.synchronize()?;
            let start = Instant::now();
            let mut tasks = Vec::with_capacity(n);
            for _ in 0..n {
                // SAFETY: `src` is pinned and outlives the stream's work (synchronised below
                // before it drops).
                unsafe { dst.copy_from_host_async(src.as_slice(), stream) }?;
                if let Some(s) = strategy {
                    let f = stream.completion_with(s)?;
                    tasks.push(self.rt.spawn(async move { f.await.unwrap() }));
                }
            }
            if strategy.is_some() {
                self.rt.block_on(async {
                    for t in tasks {
                        t.await.unwrap();
                    }
                });
            } else {
                stream.synchronize()?;
            }
            best = best.max(n as f64 / start.elapsed().as_secs_f64());
        }
        stream.synchronize()?;
        Ok(best)
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench_async: {e}");
        std::process::exit(1);
    }
}

fn run() -> BoxResult<()> {
    let dev = Device::new(0)?;
    println!(
        "bench_async on {} (driver CUDA {}); a sample: waiters wait {HOLD:?}, then the kernel \
         is released",
        dev.name()?,
        cudars_core::driver_version()?
    );
    let bench = Bench {
        k: Kernels::load(&dev)?,
        streams: (0..STREAMS)
            .map(|_| Stream::builder(&dev).non_blocking(true).build())
            .collect::<cudars_core::Result<_>>()?,
        flag: Flag::new(&dev)?,
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()?,
        dev,
    };
    let mut report = Report::new("bench_async");
    let fast = PollConfig {
        max_sleep: Duration::from_micros(10),
        ..PollConfig::default()
    };
    let ours = [
        Waiter::Ours(WakeStrategy::Poll, PollConfig::default()),
        Waiter::Ours(WakeStrategy::Poll, fast),
        Waiter::Ours(WakeStrategy::HostFunction, PollConfig::default()),
    ];
    for (waits, samples) in [(1usize, 300usize), (1000, 30)] {
        let sync = bench.measure(Waiter::Sync(false), waits, samples)?;
        let sync_blocking = bench.measure(Waiter::Sync(true), waits, samples)?;
        let spin = bench.measure(Waiter::Spin, waits, samples)?;
        println!(
            "-- {waits} concurrent wait(s): peers (median / p99 us, cpu us per sample): \
             event_sync {:.1} / {:.1}, {:.0}; event_sync_blocking {:.1} / {:.1}, {:.0}; \
             query_spin {:.1} / {:.1}, {:.0}",
            sync.0,
            sync.1,
            sync.2,
            sync_blocking.0,
            sync_blocking.1,
            sync_blocking.2,
            spin.0,
            spin.1,
            spin.2
        );
        for who in ours {
            let (median, p99, cpu) = bench.measure(who, waits, samples)?;
            let name = who.label();
            report.row(
                &format!("wake_median_{name}_{waits}"),
                "us",
                median,
                Some(sync.0),
                "cuEventSynchronize",
                Target::RatioAtMost(1.5),
            );
            report.row(
                &format!("wake_p99_{name}_{waits}"),
                "us",
                p99,
                Some(sync.1),
                "cuEventSynchronize",
                Target::None,
            );
            report.row(
                &format!("wait_cpu_{name}_{waits}"),
                "us",
                cpu,
                Some(spin.2),
                "cuEventQuery spin",
                Target::RatioAtMost(0.05),
            );
        }
        let floor = bench.measure(Waiter::SpinWakesTask, waits, samples)?;
        for (name, peer) in [
            ("event_sync_blocking", sync_blocking),
            ("query_spin", spin),
            ("spin_wakes_task", floor),
        ] {
            report.row(
                &format!("wake_median_{name}_{waits}"),
                "us",
                peer.0,
                Some(sync.0),
                "cuEventSynchronize",
                Target::None,
            );
        }
        report.row(
            &format!("wait_cpu_event_sync_{waits}"),
            "us",
            sync.2,
            Some(spin.2),
            "cuEventQuery spin",
            Target::None,
        );
        report.row(
            &format!("wait_cpu_event_sync_blocking_{waits}"),
            "us",
            sync_blocking.2,
            Some(spin.2),
            "cuEventQuery spin",
            Target::None,
        );
    }
    let n = 2000;
    let plain = bench.pipeline(None, n)?;
    for strategy in [WakeStrategy::Poll, WakeStrategy::HostFunction] {
        let with = bench.pipeline(Some(strategy), n)?;
        let name = match strategy {
            WakeStrategy::HostFunction => "host_function",
            _ => "poll",
        };
        report.row(
            &format!("pipeline_{name}_4KiB_x{n}"),
            "copies/s",
            with,
            Some(plain),
            "no futures",
            Target::RatioAtLeast(0.97),
        );
    }
    println!("reactor: {:?}", completion::stats());
    Ok(())
}
