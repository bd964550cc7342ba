//! Model tests of `MemoryPool<SimulatedBackend>` against a reference model.
//!
//! Random sequences of malloc, free, record_stream, free_all_blocks, set_limit,
//! synchronize_free_blocks and simulated GPU work run across two devices and three
//! streams, on virtual-memory devices and on plain-segment devices. After every
//! operation the test checks:
//!
//! * live blocks never overlap, neither in address space nor in physical memory (the
//!   simulator translates addresses to physical pages), and every live byte is mapped;
//! * every byte is accounted for: the pool's reserved bytes equal the simulator's
//!   physical bytes, `used + free == total`, reserved peaks are the highest value seen;
//! * statistics match the reference model (used, requested, active blocks, their
//!   per-stream peaks, allocations, frees, out-of-memory count, limits);
//! * the limit is never exceeded;
//! * out of memory happens only when even an empty cache could not fit the request:
//!   the physical memory the live blocks occupy plus what the request needs exceeds
//!   the limit or the capacity;
//! * memory reaches another stream only after the work that used it is known done: a
//!   physical byte last used by stream A (up to A's submitted work count at the free,
//!   or by a stream recorded with `record_stream`) is handed to stream B != A only if
//!   A has completed that work or B was made to wait for it (directly, or through a
//!   chain of waits: stolen memory, see `policy::STEAL_BEFORE_GROWING`); a page is unmapped or a
//!   plain segment returned only once every stream that used it has completed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::collections::HashMap;

use cudars_mempool::sim::SimEvent;
use cudars_mempool::Backend;
use cudars_mempool::{
    Allocation, DeviceId, Limit, MemoryPool, PoolError, SimDevice, SimulatedBackend, StreamKey,
};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const DEVICES: u8 = 2;
const STREAMS: u8 = 3;

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        dev: u8,
        stream: u8,
        size: u64,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: u8,
    },
    /// A use of a live block on another stream than its allocation stream, ordered by the
    /// hand-over rule of `cudars_core::memory::Handover`.
    UseElsewhere {
        pick: usize,
        stream: u8,
    },
    FreeAllBlocks,
    SetLimit {
        dev: u8,
        limit: Option<u64>,
    },
    Submit {
        dev: u8,
        stream: u8,
    },
    Complete {
        dev: u8,
        stream: u8,
    },
    CompleteAll,
    SynchronizeFreeBlocks,
}

fn size_strategy(capacity: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..=2 * KIB,
        3 => 2 * KIB..=256 * KIB,
        1 => 256 * KIB..=MIB,
        3 => MIB + 1..=3 * MIB,
        1 => Just(0u64),
        1 => capacity / 2..=capacity + MIB,
    ]
}

fn op_strategy(capacity: u64) -> impl Strategy<Value = Op> {
    let dev = 0..DEVICES;
    let stream = 0..STREAMS;
    prop_oneof![
        12 => (dev.clone(), stream.clone(), size_strategy(capacity))
            .prop_map(|(dev, stream, size)| Op::Malloc { dev, stream, size }),
        8 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::UseElsewhere { pick, stream }),
        1 => Just(Op::FreeAllBlocks),
        1 => (dev.clone(), prop::option::of(0..=capacity + 2 * MIB))
            .prop_map(|(dev, limit)| Op::SetLimit { dev, limit }),
        5 => (dev.clone(), stream.clone()).prop_map(|(dev, stream)| Op::Submit { dev, stream }),
        3 => (dev.clone(), stream.clone()).prop_map(|(dev, stream)| Op::Complete { dev, stream }),
        1 => Just(Op::CompleteAll),
        1 => Just(Op::SynchronizeFreeBlocks),
    ]
}

/// A device configuration of the model run.
#[derive(Clone, Copy, Debug)]
struct Setup {
    capacity: u64,
    /// Page size, or `None` for plain segments.
    page: Option<u64>,
}

struct LiveEntry<'p> {
    alloc: Allocation<'p, SimulatedBackend>,
    rounded: u64,
    extra: Vec<StreamKey>,
}

/// The last use of a piece of physical memory: freed while `stream` had `value` work
/// items submitted.
#[derive(Clone, Copy, Debug)]
struct Hazard {
    dev: u32,
    phys: u64,
    start: u64,
    end: u64,
    stream: StreamKey,
    value: u64,
}

#[derive(Default, Clone, Copy)]
struct Counter {
    current: u64,
    peak: u64,
}

impl Counter {
    fn add(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
    }
    fn sub(&mut self, n: u64) {
        self.current -= n;
    }
}

#[derive(Default)]
struct ShardModel {
    used: Counter,
    requested: Counter,
    active: Counter,
    allocations: u64,
    frees: u64,
}

struct Model<'p> {
    setup: Setup,
    pool: &'p MemoryPool<SimulatedBackend>,
    live: Vec<LiveEntry<'p>>,
    shards: HashMap<(u32, StreamKey), ShardModel>,
    limits: [Option<u64>; DEVICES as usize],
    ooms: [u64; DEVICES as usize],
    max_reserved: [u64; DEVICES as usize],
    hazards: Vec<Hazard>,
}

fn sid(s: u8) -> StreamKey {
    StreamKey(100 + s as u64)
}

fn round(size: u64) -> u64 {
    size.div_ceil(512) * 512
}

impl<'p> Model<'p> {
    fn sim(&self) -> &'p SimulatedBackend {
        self.pool.backend()
    }

    /// Physical pieces (id, start, end) behind `[addr, addr + len)`.
    fn pieces(&self, dev: DeviceId, addr: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        let mut at = addr;
        let end = addr + len;
        while at < end {
            let Some((id, off)) = self.sim().translate(dev, at) else {
                panic!("live byte {at:#x} on device {dev} is not backed");
            };
            let chunk = match self.setup.page {
                Some(g) => (g - off).min(end - at),
                None => end - at,
            };
            if self.setup.page.is_none() {
                let last = self.sim().translate(dev, at + chunk - 1);
                assert_eq!(
                    last,
                    Some((id, off + chunk - 1)),
                    "block spans plain allocations"
                );
            }
            out.push((id, off, off + chunk));
            at += chunk;
        }
        out
    }

    /// Physical bytes the live blocks of `dev` occupy: the pages they touch, or the
    /// plain allocations holding one.
    fn footprint(&self, dev: DeviceId) -> u64 {
        let ranges: Vec<(u64, u64)> = self
            .live
            .iter()
            .filter(|e| e.alloc.device() == dev)
            .map(|e| (e.alloc.ptr().0, e.alloc.ptr().0 + e.rounded))
            .collect();
        match self.setup.page {
            Some(g) => {
                let mut pages: Vec<u64> = ranges
                    .iter()
                    .flat_map(|&(s, e)| (s / g)..e.div_ceil(g))
                    .collect();
                pages.sort_unstable();
                pages.dedup();
                pages.len() as u64 * g
            }
            None => self
                .sim()
                .plain_allocations(dev)
                .iter()
                .filter(|&&(a, s, _)| ranges.iter().any(|&(b, _)| b >= a && b < a + s))
                .map(|&(_, s, _)| s)
                .sum(),
        }
    }

    fn need(&self, rounded: u64) -> u64 {
        match self.setup.page {
            Some(g) => rounded.div_ceil(g) * g,
            None => rounded,
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Malloc { dev, stream, size } => {
                self.malloc(DeviceId(dev as u32), sid(stream), size)
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return;
                }
                let e = self.live.swap_remove(pick % self.live.len());
                let dev = e.alloc.device();
                let stream = e.alloc.stream();
                let mut users = vec![(stream, self.sim().submitted(dev, stream))];
                for &x in &e.extra {
                    users.push((x, self.sim().submitted(dev, x)));
                }
                for (phys, start, end) in self.pieces(dev, e.alloc.ptr().0, e.rounded) {
                    for &(s, value) in &users {
                        self.hazards.push(Hazard {
                            dev: dev.0,
                            phys,
                            start,
                            end,
                            stream: s,
                            value,
                        });
                    }
                }
                // Statistics go to the cache holding the block (the lender's for a lent block).
                let m = self.shards.entry((dev.0, e.alloc.held_by())).or_default();
                m.used.sub(e.rounded);
                m.requested.sub(e.alloc.size() as u64);
                m.active.sub(1);
                m.frees += 1;
                e.alloc.free().expect("free");
            }
            Op::RecordStream { pick, stream } => {
                if self.live.is_empty() {
                    return;
                }
                let n = self.live.len();
                let e = &mut self.live[pick % n];
                e.alloc.record_stream(&sid(stream)).expect("record_stream");
                if sid(stream) != e.alloc.stream() && !e.extra.contains(&sid(stream)) {
                    e.extra.push(sid(stream));
                }
            }
            Op::UseElsewhere { pick, stream } => {
                if self.live.is_empty() {
                    return;
                }
                let n = self.live.len();
                let (dev, own, ptr, rounded) = {
                    let e = &self.live[pick % n];
                    (
                        e.alloc.device(),
                        e.alloc.stream(),
                        e.alloc.ptr().0,
                        e.rounded,
                    )
                };
                let other = sid(stream);
                if other == own {
                    return;
                }
                // The hand-over rule: a fence recorded on the allocation stream now, waited
                // for by the other stream, orders the use after every earlier owner of the
                // block's memory, however the block came (own cache, a steal, moved pages).
                let sim = self.sim();
                let fence = sim.record_fence(dev, &own).expect("record_fence");
                sim.stream_wait_fence(dev, &other, &fence)
                    .expect("stream_wait_fence");
                sim.release_fence(fence);
                for (phys, start, end) in self.pieces(dev, ptr, rounded) {
                    for h in &self.hazards {
                        if h.dev != dev.0 || h.phys != phys || h.end <= start || h.start >= end {
                            continue;
                        }
                        assert!(
                            h.stream == other || sim.is_ordered_after(dev, other, h.stream, h.value),
                            "a use on {other:?} of a block allocated on {own:?} is not ordered after \
                             {:?} (work {}), an earlier owner of its memory",
                            h.stream,
                            h.value
                        );
                    }
                }
                self.live[pick % n].extra.push(other);
                self.live[pick % n]
                    .alloc
                    .record_stream(&other)
                    .expect("record_stream");
            }
            Op::FreeAllBlocks => {
                self.pool.free_all_blocks().expect("free_all_blocks");
                for d in 0..DEVICES as u32 {
                    let dev = DeviceId(d);
                    assert_eq!(
                        self.pool.stats(dev).unwrap().reserved.current,
                        self.footprint(dev),
                        "after free_all_blocks only live blocks hold memory"
                    );
                }
            }
            Op::SetLimit { dev, limit } => {
                let dev = DeviceId(dev as u32);
                let before = self.pool.stats(dev).unwrap().reserved.current;
                let footprint = self.footprint(dev);
                let r = self.pool.set_limit(
                    dev,
                    limit.map_or(Limit::Unlimited, |l| Limit::Bytes(l as usize)),
                );
                match (limit, r) {
                    (
                        Some(l),
                        Err(PoolError::LimitBelowUsage {
                            limit: el, in_use, ..
                        }),
                    ) => {
                        assert!(
                            l < footprint,
                            "refused a limit of {l} above the footprint {footprint}"
                        );
                        assert_eq!((el, in_use), (l, footprint));
                        assert_eq!(
                            self.pool.get_limit(dev).unwrap().map(|l| l as u64),
                            self.limits[dev.0 as usize]
                        );
                        assert_eq!(self.pool.stats(dev).unwrap().reserved.current, before);
                    }
                    (_, Ok(())) => {
                        if let Some(l) = limit {
                            assert!(l >= footprint, "accepted a limit below the footprint");
                        }
                        self.limits[dev.0 as usize] = limit;
                        assert_eq!(self.pool.get_limit(dev).unwrap().map(|l| l as u64), limit);
                    }
                    (_, Err(e)) => panic!("set_limit failed: {e}"),
                }
            }
            Op::Submit { dev, stream } => {
                self.sim().submit_work(DeviceId(dev as u32), sid(stream));
            }
            Op::Complete { dev, stream } => self
                .sim()
                .complete_stream(DeviceId(dev as u32), sid(stream)),
            Op::CompleteAll => self.sim().complete_all(),
            Op::SynchronizeFreeBlocks => self.pool.synchronize_free_blocks().expect("synchronize"),
        }
    }

    fn malloc(&mut self, dev: DeviceId, stream: StreamKey, size: u64) {
        let footprint = self.footprint(dev);
        match self.pool.malloc(dev, &stream, size as usize) {
            Ok(a) => {
                if size == 0 {
                    assert!(a.ptr().is_null());
                    return;
                }
                let rounded = round(size);
                for (phys, start, end) in self.pieces(dev, a.ptr().0, rounded) {
                    for h in &self.hazards {
                        if h.dev != dev.0 || h.phys != phys || h.end <= start || h.start >= end {
                            continue;
                        }
                        let ordered = self.sim().is_ordered_after(dev, stream, h.stream, h.value);
                        assert!(
                            h.stream == stream || ordered,
                            "memory last used by {:?} (work {}) handed to {:?} before that work completed",
                            h.stream,
                            h.value,
                            stream
                        );
                    }
                }
                let m = self.shards.entry((dev.0, a.held_by())).or_default();
                m.used.add(rounded);
                m.requested.add(size);
                m.active.add(1);
                m.allocations += 1;
                self.live.push(LiveEntry {
                    alloc: a,
                    rounded,
                    extra: Vec::new(),
                });
            }
            Err(PoolError::OutOfMemory {
                device,
                requested,
                used,
                reserved,
                limit,
                ..
            }) => {
                let requested = requested as u64;
                assert_eq!(device, dev);
                assert_eq!(requested, size);
                let rounded = round(size);
                let cap = limit.unwrap_or(u64::MAX).min(self.setup.capacity);
                assert!(
                    footprint + self.need(rounded) > cap,
                    "out of memory for {size} bytes although live blocks occupy {footprint} of {cap}"
                );
                assert_eq!(limit, self.limits[dev.0 as usize]);
                let model_used: u64 = self
                    .shards
                    .iter()
                    .filter(|(k, _)| k.0 == dev.0)
                    .map(|(_, m)| m.used.current)
                    .sum();
                assert_eq!(used, model_used);
                assert_eq!(reserved, self.pool.stats(dev).unwrap().reserved.current);
                self.ooms[dev.0 as usize] += 1;
            }
            Err(e) => panic!("malloc({size}) failed: {e}"),
        }
    }

    fn check(&mut self) {
        // Unmapping a page or returning a segment needs every user done.
        for ev in self.sim().take_events() {
            let (dev, phys) = match ev {
                SimEvent::Unmap { device, page, .. } => (device, page),
                SimEvent::Deallocate { device, id, .. } => (device, id),
                SimEvent::Map { .. } => continue,
            };
            for h in self
                .hazards
                .iter()
                .filter(|h| h.dev == dev.0 && h.phys == phys)
            {
                assert!(
                    self.sim().completed(dev, h.stream) >= h.value,
                    "physical memory {phys} released while {:?} may still use it",
                    h.stream
                );
            }
        }
        let sim = self.sim();
        self.hazards
            .retain(|h| sim.completed(DeviceId(h.dev), h.stream) < h.value);

        // No overlap, in address space and in physical memory.
        let mut va: Vec<(u64, u64)> = self
            .live
            .iter()
            .map(|e| (e.alloc.ptr().0, e.alloc.ptr().0 + e.rounded))
            .collect();
        va.sort_unstable();
        for w in va.windows(2) {
            assert!(w[0].1 <= w[1].0, "live blocks overlap: {:x?}", w);
        }
        let mut phys: Vec<(u32, u64, u64, u64)> = Vec::new();
        for e in &self.live {
            let dev = e.alloc.device();
            for (p, s, t) in self.pieces(dev, e.alloc.ptr().0, e.rounded) {
                phys.push((dev.0, p, s, t));
            }
        }
        phys.sort_unstable();
        for w in phys.windows(2) {
            if w[0].0 == w[1].0 && w[0].1 == w[1].1 {
                assert!(
                    w[0].3 <= w[1].2,
                    "live blocks share physical memory: {:?}",
                    w
                );
            }
        }

        // Accounting and statistics.
        for d in 0..DEVICES as u32 {
            let dev = DeviceId(d);
            let st = self.pool.stats(dev).unwrap();
            let reserved = st.reserved.current;
            assert_eq!(
                reserved,
                self.sim().physical_bytes(dev),
                "pool and device disagree"
            );
            if let Some(l) = self.limits[d as usize] {
                assert!(reserved <= l, "reserved {reserved} above the limit {l}");
            }
            assert!(reserved >= self.footprint(dev));
            self.max_reserved[d as usize] = self.max_reserved[d as usize].max(reserved);
            assert_eq!(st.reserved.peak, self.max_reserved[d as usize]);
            let shards: Vec<(&StreamKey, &ShardModel)> = self
                .shards
                .iter()
                .filter(|(k, _)| k.0 == d)
                .map(|(k, m)| (&k.1, m))
                .collect();
            let sum =
                |f: &dyn Fn(&ShardModel) -> u64| shards.iter().map(|(_, m)| f(m)).sum::<u64>();
            assert_eq!(st.used.current, sum(&|m| m.used.current));
            assert_eq!(st.used.peak, sum(&|m| m.used.peak));
            assert_eq!(st.requested.current, sum(&|m| m.requested.current));
            assert_eq!(st.requested.peak, sum(&|m| m.requested.peak));
            assert_eq!(st.active_blocks.current, sum(&|m| m.active.current));
            assert_eq!(st.active_blocks.peak, sum(&|m| m.active.peak));
            assert_eq!(st.allocations, sum(&|m| m.allocations));
            assert_eq!(st.frees, sum(&|m| m.frees));
            assert_eq!(st.ooms, self.ooms[d as usize]);
            assert_eq!(st.oom_causes.total(), st.ooms);
            assert_eq!(st.last_oom.is_some(), st.ooms > 0);
            // Address space reserved and physical bytes mapped, as the simulator sees them.
            let backend = self.pool.backend();
            assert_eq!(st.address_space, backend.reserved_address_space(dev));
            match self.setup.page {
                Some(page) => {
                    assert_eq!(st.mapped, backend.mapped_pages(dev) as u64 * page);
                    assert!(st.mapped <= st.address_space);
                }
                None => assert_eq!(st.mapped, reserved),
            }
            assert!(st.mapped >= self.footprint(dev));
            // (No `retries >= ooms`: a request larger than the limit or the device fails at
            // once, without releasing anything or retrying.)
            for (s, m) in shards {
                let ss = self.pool.stream_stats(dev, *s).unwrap();
                assert_eq!(
                    (ss.used.current, ss.used.peak),
                    (m.used.current, m.used.peak)
                );
                assert_eq!(
                    (ss.active_blocks.current, ss.active_blocks.peak),
                    (m.active.current, m.active.peak)
                );
            }
        }
        assert_eq!(
            self.pool.used_bytes() + self.pool.free_bytes(),
            self.pool.total_bytes()
        );
    }
}

fn run(setup: Setup, ops: &[Op]) {
    let backend = SimulatedBackend::new(
        (0..DEVICES)
            .map(|_| SimDevice {
                total_memory: setup.capacity,
                granularity: setup.page,
            })
            .collect(),
    )
    .with_events(true);
    let pool = MemoryPool::new(backend).expect("pool");
    let mut model = Model {
        setup,
        pool: &pool,
        live: Vec::new(),
        shards: HashMap::new(),
        limits: [None; DEVICES as usize],
        ooms: [0; DEVICES as usize],
        max_reserved: [0; DEVICES as usize],
        hazards: Vec::new(),
    };
    for op in ops {
        model.apply(op);
        model.check();
    }
    // Everything freed and released: nothing is left on either device.
    let entries = std::mem::take(&mut model.live);
    drop(entries);
    pool.free_all_blocks().expect("final free_all_blocks");
    for d in 0..DEVICES as u32 {
        assert_eq!(pool.backend().physical_bytes(DeviceId(d)), 0);
        assert_eq!(pool.backend().reserved_address_space(DeviceId(d)), 0);
    }
    assert_eq!(pool.n_free_blocks(), 0);
}

const VM: Setup = Setup {
    capacity: 12 * MIB,
    page: Some(256 * KIB),
};

const PLAIN: Setup = Setup {
    capacity: 28 * MIB,
    page: None,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn virtual_memory_pool_matches_the_model(ops in prop::collection::vec(op_strategy(VM.capacity), 1..60)) {
        run(VM, &ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn plain_segment_pool_matches_the_model(ops in prop::collection::vec(op_strategy(PLAIN.capacity), 1..60)) {
        run(PLAIN, &ops);
    }
}
