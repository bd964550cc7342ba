//! Fault injection: random pool operations on the simulated backend while random backend
//! calls fail (every kind of call: allocation, address ranges, physical pages, mapping,
//! fences, waits), with streams that come and go, foreign streams destroyed and their
//! handles reused, and private pools. After every operation:
//!
//! * every failure is a typed `PoolError` (out of memory, or a backend error whose source
//!   is the injected failure), never a panic, never another kind of error;
//! * the pool never uses a stream it let go of (the simulator fails such calls, so it
//!   would show as a `DestroyedStream` error);
//! * memory reaches another stream only with the wait on its last users: a byte last used
//!   by stream A (its own stream, or one marked with `record_stream`, up to A's work at the
//!   free) is handed to stream B != A only once that work completed or B was made to wait
//!   for it, directly or through a chain of waits (blocks stolen from another stream's
//!   cache); a failed wait (`stream_wait_fence` fails under injection) hands nothing out;
//! * nothing is lost or double-counted: the pool's reserved bytes equal the simulator's
//!   physical bytes; `used` and active blocks equal what the test holds; live blocks never
//!   overlap; memory a live private pool handed out is never handed out by ordinary
//!   allocations;
//! * and at the end, with failures off, the pool serves again and gives back everything.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::collections::HashMap;

use cudars_mempool::sim::{SimCall, SimError, SimPoint};
use cudars_mempool::{
    Allocation, DeviceId, MemoryPool, PoolError, PrivateHold, PrivatePoolId, SimDevice,
    SimulatedBackend, StreamKey,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const D0: DeviceId = DeviceId(0);
/// Streams 1..=2 are owned (the user drops them; the pool destroys them when it lets go);
/// 3..=4 are foreign (the test destroys them whenever no block made on them is live, and
/// reuses their handle values).
const STREAMS: u64 = 4;

#[derive(Clone, Debug)]
enum Op {
    Malloc { stream: u64, size: u64 },
    MallocPrivate { pool: u64, stream: u64, size: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    Submit { stream: u64 },
    CompleteAll,
    FreeAllBlocks,
    DropOrDestroy { stream: u64 },
    ReleaseHold { pool: u64 },
    Inject { kind: usize, nth: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let stream = 1..=STREAMS;
    let size =
        prop_oneof![4 => 1u64..=64 * 1024, 3 => 64 * 1024..=3 * MIB, 1 => 3 * MIB..=20 * MIB];
    prop_oneof![
        8 => (stream.clone(), size.clone()).prop_map(|(stream, size)| Op::Malloc { stream, size }),
        2 => (0..2u64, stream.clone(), size).prop_map(|(pool, stream, size)| Op::MallocPrivate { pool, stream, size }),
        6 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        3 => stream.clone().prop_map(|stream| Op::Submit { stream }),
        2 => Just(Op::CompleteAll),
        1 => Just(Op::FreeAllBlocks),
        1 => stream.prop_map(|stream| Op::DropOrDestroy { stream }),
        1 => (0..2u64).prop_map(|pool| Op::ReleaseHold { pool }),
        4 => (0..SimCall::ALL.len(), 1..4u64).prop_map(|(kind, nth)| Op::Inject { kind, nth }),
    ]
}

struct Live<'p> {
    alloc: Allocation<'p, SimulatedBackend>,
    stream: u64,
    extra: Vec<u64>,
    private: Option<u64>,
}

struct Run<'p> {
    pool: &'p MemoryPool<SimulatedBackend>,
    live: Vec<Live<'p>>,
    /// Owned streams the user dropped (no more requests on them).
    dropped: Vec<u64>,
    /// Foreign streams destroyed and not yet re-created.
    destroyed: Vec<u64>,
    holds: HashMap<u64, PrivateHold>,
    /// Address ranges handed out by each private pool while it exists.
    private_ranges: HashMap<u64, Vec<(u64, u64)>>,
    /// Freed address ranges with the point each user's work had reached at the free:
    /// another stream may get that memory only ordered after it.
    hazards: Vec<(u64, u64, u64, SimPoint)>,
    /// Handouts of memory last used by another stream (the new path was exercised).
    cross_stream: u64,
}

fn check_error(e: &PoolError) {
    if std::env::var_os("FAULTS_DEBUG").is_some() {
        eprintln!(
            "error: {e:?}\n{}",
            std::backtrace::Backtrace::force_capture()
        );
    }
    match e {
        PoolError::OutOfMemory { .. } => {}
        PoolError::Backend { source, .. } => match source.downcast_ref::<SimError>() {
            Some(SimError::Injected(_)) => {}
            other => panic!("a backend error that was not injected: {other:?} ({e})"),
        },
        other => panic!("unexpected error kind: {other}"),
    }
}

impl<'p> Run<'p> {
    fn sim(&self) -> &'p SimulatedBackend {
        self.pool.backend()
    }

    fn usable(&mut self, stream: u64) -> Option<StreamKey> {
        if self.dropped.contains(&stream) {
            return None;
        }
        if let Some(i) = self.destroyed.iter().position(|&s| s == stream) {
            // A new foreign stream gets the old handle value.
            self.destroyed.swap_remove(i);
            self.sim().create_stream(StreamKey(stream));
            self.sim().borrow_stream(StreamKey(stream));
        }
        Some(StreamKey(stream))
    }

    /// Memory handed to stream `s` at `[start, end)` that another stream used must come
    /// ordered after that use.
    fn check_hazards(&mut self, s: StreamKey, start: u64, end: u64) {
        for &(hs, he, user, point) in &self.hazards {
            if he <= start || hs >= end || user == s.0 {
                continue;
            }
            self.cross_stream += 1;
            assert!(
                self.sim().is_ordered_after_point(D0, s, point),
                "memory last used by stream {user} handed to stream {} without a completed \
                 fence or a wait on it",
                s.0
            );
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Malloc { stream, size } => {
                let Some(s) = self.usable(stream) else { return };
                let waits = self.sim().calls().stream_wait_fence;
                match self.pool.malloc(D0, &s, size as usize) {
                    Ok(a) => {
                        let (start, end) = (a.ptr().0, a.ptr().0 + size);
                        self.check_hazards(s, start, end);
                        for (pool, ranges) in &self.private_ranges {
                            for &(ps, pe) in ranges {
                                assert!(
                                    end <= ps || start >= pe,
                                    "private pool {pool}'s memory handed to an ordinary allocation"
                                );
                            }
                        }
                        self.live.push(Live {
                            alloc: a,
                            stream,
                            extra: Vec::new(),
                            private: None,
                        });
                    }
                    Err(e) => {
                        check_error(&e);
                        if matches!(
                            e,
                            PoolError::Backend {
                                op: "stream_wait_fence",
                                ..
                            }
                        ) {
                            // A failed wait: the request failed as a whole, nothing live was
                            // added (checked by `check`), whatever the wait was for.
                            assert!(self.sim().calls().stream_wait_fence > waits);
                        }
                    }
                }
            }
            Op::MallocPrivate { pool, stream, size } => {
                let Some(s) = self.usable(stream) else { return };
                if !self.holds.contains_key(&pool) {
                    match self.pool.retain_private_pool(D0, PrivatePoolId(pool)) {
                        Ok(h) => {
                            self.holds.insert(pool, h);
                        }
                        Err(e) => return check_error(&e),
                    }
                }
                match self
                    .pool
                    .malloc_private(D0, PrivatePoolId(pool), &s, size as usize)
                {
                    Ok(a) => {
                        self.check_hazards(s, a.ptr().0, a.ptr().0 + size);
                        self.private_ranges
                            .entry(pool)
                            .or_default()
                            .push((a.ptr().0, a.ptr().0 + size));
                        self.live.push(Live {
                            alloc: a,
                            stream,
                            extra: Vec::new(),
                            private: Some(pool),
                        });
                    }
                    Err(e) => check_error(&e),
                }
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return;
                }
                let e = self.live.swap_remove(pick % self.live.len());
                let (start, end) = (e.alloc.ptr().0, e.alloc.ptr().0 + e.alloc.size() as u64);
                for user in std::iter::once(e.stream).chain(e.extra.iter().copied()) {
                    let point = self.sim().point(D0, StreamKey(user));
                    self.hazards.push((start, end, user, point));
                }
                if let Err(err) = e.alloc.free() {
                    check_error(&err);
                }
            }
            Op::RecordStream { pick, stream } => {
                if self.live.is_empty() {
                    return;
                }
                let Some(s) = self.usable(stream) else { return };
                let n = self.live.len();
                let e = &mut self.live[pick % n];
                match e.alloc.record_stream(&s) {
                    Ok(()) => e.extra.push(stream),
                    Err(err) => check_error(&err),
                }
            }
            Op::Submit { stream } => {
                if let Some(s) = self.usable(stream) {
                    self.sim().submit_work(D0, s);
                }
            }
            Op::CompleteAll => self.sim().complete_all(),
            Op::FreeAllBlocks => {
                if let Err(e) = self.pool.free_all_blocks() {
                    check_error(&e);
                }
            }
            Op::DropOrDestroy { stream } => {
                let in_use = self
                    .live
                    .iter()
                    .any(|l| l.stream == stream || l.extra.contains(&stream));
                if stream <= 2 {
                    // The user drops an owned stream (the pool keeps it while needed).
                    if !self.dropped.contains(&stream) {
                        self.sim().drop_stream(StreamKey(stream));
                        self.dropped.push(stream);
                    }
                } else if !in_use && !self.destroyed.contains(&stream) {
                    self.sim().borrow_stream(StreamKey(stream));
                    self.sim().destroy_stream(StreamKey(stream));
                    self.destroyed.push(stream);
                }
            }
            Op::ReleaseHold { pool } => {
                if let Some(h) = self.holds.remove(&pool) {
                    h.release();
                    match self.pool.has_private_pool(D0, PrivatePoolId(pool)) {
                        Ok(false) => {
                            self.private_ranges.remove(&pool);
                        }
                        Ok(true) => {}
                        Err(e) => check_error(&e),
                    }
                }
            }
            Op::Inject { kind, nth } => self.sim().inject_failure(SimCall::ALL[kind], nth),
        }
        // A private pool whose holds are gone and blocks freed may be collected by any call.
        let gone: Vec<u64> = self
            .private_ranges
            .keys()
            .copied()
            .filter(|p| !self.holds.contains_key(p))
            .filter(|p| !matches!(self.pool.has_private_pool(D0, PrivatePoolId(*p)), Ok(true)))
            .collect();
        for p in gone {
            self.private_ranges.remove(&p);
        }
        self.check();
    }

    fn check(&self) {
        let st = self.pool.stats(D0).expect("stats");
        assert_eq!(
            st.reserved.current,
            self.sim().physical_bytes(D0),
            "pool and device disagree"
        );
        let used: u64 = self
            .live
            .iter()
            .map(|l| (l.alloc.size() as u64).div_ceil(512) * 512)
            .sum();
        assert_eq!(st.used.current, used, "used bytes");
        assert_eq!(
            st.active_blocks.current,
            self.live.len() as u64,
            "active blocks"
        );
        let mut ranges: Vec<(u64, u64)> = self
            .live
            .iter()
            .map(|l| (l.alloc.ptr().0, l.alloc.ptr().0 + l.alloc.size() as u64))
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
        }
        for l in &self.live {
            if l.private.is_none() {
                let a = l.alloc.ptr().0;
                assert!(
                    self.sim().translate(D0, a).is_some(),
                    "a live block is not mapped"
                );
            }
        }
    }

    fn finish(mut self) {
        self.sim().clear_failures();
        self.sim().complete_all();
        self.live.clear();
        for (_, h) in self.holds.drain() {
            h.release();
        }
        // The pool serves again...
        let s = StreamKey(99);
        let a = self
            .pool
            .malloc(D0, &s, (2 * MIB) as usize)
            .expect("the pool serves after the faults");
        drop(a);
        // ...and gives back everything it can (a page whose release failed under
        // injection stays counted, on both sides).
        self.pool
            .free_all_blocks()
            .expect("free_all_blocks after the faults");
        assert_eq!(self.pool.total_bytes(), self.sim().physical_bytes(D0));
        assert_eq!(self.pool.used_bytes(), 0);
    }
}

/// Runs `ops`; returns how many handouts reused memory another stream had used.
fn run(ops: &[Op], page: Option<u64>) -> u64 {
    let sim = SimulatedBackend::new(vec![SimDevice {
        total_memory: 64 * MIB,
        granularity: page,
    }]);
    for s in 3..=STREAMS {
        sim.borrow_stream(StreamKey(s));
    }
    let pool = MemoryPool::new(sim).expect("pool");
    let mut r = Run {
        pool: &pool,
        live: Vec::new(),
        dropped: Vec::new(),
        destroyed: Vec::new(),
        holds: HashMap::new(),
        private_ranges: HashMap::new(),
        hazards: Vec::new(),
        cross_stream: 0,
    };
    for op in ops {
        r.apply(op);
    }
    let cross = r.cross_stream;
    r.finish();
    cross
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6_000, max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn virtual_memory_pool_survives_injected_faults(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, Some(2 * MIB));
    }

    #[test]
    fn plain_segment_pool_survives_injected_faults(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, None);
    }
}

#[test]
fn every_call_kind_can_fail() {
    // A deterministic pass per kind: the first call of that kind fails, on a workload that
    // makes every kind of call; the failure comes back typed and the pool keeps serving.
    for (i, &kind) in SimCall::ALL.iter().enumerate() {
        for page in [Some(2 * MIB), None] {
            let ops = vec![
                Op::Inject { kind: i, nth: 1 },
                Op::Malloc {
                    stream: 1,
                    size: 3 * MIB,
                },
                Op::Malloc {
                    stream: 3,
                    size: 5 * MIB,
                },
                Op::Submit { stream: 1 },
                Op::RecordStream { pick: 0, stream: 2 },
                Op::Free { pick: 0 },
                Op::Free { pick: 0 },
                Op::Malloc {
                    stream: 2,
                    size: 40 * MIB,
                },
                Op::Malloc {
                    stream: 2,
                    size: 30 * MIB,
                },
                Op::FreeAllBlocks,
                Op::CompleteAll,
                Op::Free { pick: 0 },
                Op::FreeAllBlocks,
            ];
            run(&ops, page);
            let _ = kind;
        }
    }
}

#[test]
fn stolen_memory_comes_with_the_wait_and_a_failed_wait_hands_out_nothing() {
    for page in [Some(2 * MIB), None] {
        let steal = vec![
            Op::Malloc {
                stream: 1,
                size: 8 * MIB,
            },
            Op::Submit { stream: 1 },
            Op::Free { pick: 0 },
            // Stream 2 takes stream 1's block, waiting for stream 1 on the device.
            Op::Malloc {
                stream: 2,
                size: 8 * MIB,
            },
            Op::Submit { stream: 2 },
            Op::Free { pick: 0 },
            // Back to stream 1 (it waits for stream 2), then to foreign stream 3 through
            // stream 1's fence, which follows its wait on stream 2.
            Op::Malloc {
                stream: 1,
                size: 8 * MIB,
            },
            Op::Submit { stream: 1 },
            Op::Free { pick: 0 },
            Op::Malloc {
                stream: 3,
                size: 8 * MIB,
            },
        ];
        assert!(run(&steal, page) >= 3, "the steal path was not exercised");
        // The same with every wait failing once: each failure is typed, hands nothing out,
        // and the checks above still hold for what is handed out.
        let kind = SimCall::ALL
            .iter()
            .position(|&k| k == SimCall::StreamWaitFence)
            .unwrap();
        for nth in 1..=4 {
            let mut ops = vec![Op::Inject { kind, nth }];
            ops.extend(steal.iter().cloned());
            run(&ops, page);
        }
    }
}
