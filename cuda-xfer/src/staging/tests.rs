//! The pipeline against the simulated copier: data arrives intact, every rule of the slot
//! protocol holds, DMAs cover the transfer exactly once, failures end the transfer cleanly.

use proptest::prelude::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::lease::Cache;
use super::pipeline::{self, wait_all, Direction, DmaEngine, Failed, SlotMemory, Tuning};
use super::plan::Plan;
use super::sim::{injected, SimDevice};

/// The pipeline with default tuning and `helpers` helpers.
///
/// # Safety
///
/// As for [`pipeline::run`].
unsafe fn run<E: DmaEngine>(
    engine: &E,
    direction: Direction,
    host: *mut u8,
    plan: &Plan,
    slots: &[SlotMemory],
    helpers: usize,
) -> Result<(), Failed> {
    // SAFETY: the caller's contract.
    unsafe { pipeline::run(engine, direction, host, plan, slots, Tuning::new(helpers)) }
}

/// The tunings every data test runs under: the default, and streaming copies with only the
/// first chunk submitted early (none, too, to the host).
fn tunings(helpers: usize) -> [Tuning; 3] {
    let streaming = Tuning {
        streaming: true,
        early_submits: 1,
        ..Tuning::new(helpers)
    };
    [
        Tuning::new(helpers),
        streaming,
        Tuning {
            early_submits: 0,
            ..streaming
        },
    ]
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8) ^ (i >> 16)) as u8
}

struct Slots {
    memory: Vec<Vec<u8>>,
    ptrs: Vec<SlotMemory>,
}

fn slots(plan: &Plan) -> Slots {
    let mut memory: Vec<Vec<u8>> = (0..plan.slots())
        .map(|_| vec![0u8; plan.chunk_bytes()])
        .collect();
    let ptrs = memory
        .iter_mut()
        .map(|m| SlotMemory(m.as_mut_ptr()))
        .collect();
    Slots { memory, ptrs }
}

/// Every byte range of the transfer was moved exactly once, each chunk through its slot.
fn check_log(sim: &SimDevice, plan: &Plan, device_base: usize) {
    let mut log = sim.log();
    assert_eq!(log.len(), plan.chunks());
    // The sim runs DMAs in submission order: chunks are submitted in chunk order, whichever
    // thread finished them first.
    assert!(
        log.windows(2)
            .all(|w| w[0].device_offset < w[1].device_offset),
        "DMAs out of chunk order: {log:?}"
    );
    log.sort_by_key(|l| l.device_offset);
    for (k, l) in log.iter().enumerate() {
        let r = plan.chunk_range(k);
        assert_eq!(l.device_offset, device_base + r.start);
        assert_eq!(l.len, r.len());
        assert_eq!(l.slot, plan.slot_of(k));
    }
}

/// Host to device: the sim's device memory is offset by `skew` bytes from the transfer (the
/// engine adds nothing, so the test passes the skewed host slice instead).
fn to_device(total: usize, skew: usize, chunk: usize, part: usize, nslots: usize, helpers: usize) {
    to_device_with(
        total,
        skew,
        plan(total, chunk, part, nslots, false),
        helpers,
    );
    to_device_with(total, skew, plan(total, chunk, part, nslots, true), helpers);
}

fn plan(total: usize, chunk: usize, part: usize, nslots: usize, ramp: bool) -> Plan {
    if ramp {
        Plan::ramped(total, chunk, part, nslots).unwrap()
    } else {
        Plan::new(total, chunk, part, nslots).unwrap()
    }
}

fn to_device_with(total: usize, skew: usize, plan: Plan, helpers: usize) {
    for tuning in tunings(helpers) {
        to_device_tuned(total, skew, &plan, tuning);
    }
}

fn to_device_tuned(total: usize, skew: usize, plan: &Plan, tuning: Tuning) {
    let plan = plan.clone();
    let nslots = plan.slots();
    let src: Vec<u8> = (0..total + skew).map(pattern).collect();
    let src = &src[skew..]; // unaligned when skew is odd
    let mut s = slots(&plan);
    let sim = SimDevice::new(total, |_| 0, nslots, 20);
    // SAFETY: `src` holds `total` bytes, the slots `chunk` bytes each, all ours.
    unsafe {
        pipeline::run(
            &sim,
            Direction::ToDevice,
            src.as_ptr() as *mut u8,
            &plan,
            &s.ptrs,
            tuning,
        )
    }
    .unwrap();
    wait_all(&sim, nslots).unwrap();
    assert_eq!(sim.in_flight(), 0, "wait_all leaves nothing in flight");
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert!(sim.memory() == src, "device memory differs from the source");
    check_log(&sim, &plan, 0);
    s.memory.clear();
}

fn to_host(total: usize, skew: usize, chunk: usize, part: usize, nslots: usize, helpers: usize) {
    to_host_with(
        total,
        skew,
        plan(total, chunk, part, nslots, false),
        helpers,
    );
    to_host_with(total, skew, plan(total, chunk, part, nslots, true), helpers);
}

fn to_host_with(total: usize, skew: usize, plan: Plan, helpers: usize) {
    for tuning in tunings(helpers) {
        to_host_tuned(total, skew, &plan, tuning);
    }
}

fn to_host_tuned(total: usize, skew: usize, plan: &Plan, tuning: Tuning) {
    let plan = plan.clone();
    let nslots = plan.slots();
    let mut s = slots(&plan);
    let sim = SimDevice::new(total, pattern, nslots, 20);
    let mut dst = vec![0u8; total + skew];
    // SAFETY: as in `to_device`.
    unsafe {
        pipeline::run(
            &sim,
            Direction::ToHost,
            dst[skew..].as_mut_ptr(),
            &plan,
            &s.ptrs,
            tuning,
        )
    }
    .unwrap();
    assert_eq!(
        sim.in_flight(),
        0,
        "to the host, every DMA is done on return"
    );
    assert_eq!(sim.violations(), Vec::<String>::new());
    assert!(
        dst[..skew].iter().all(|&b| b == 0),
        "bytes before the range untouched"
    );
    assert!(
        dst[skew..] == sim.memory()[..],
        "host copy differs from the device"
    );
    check_log(&sim, &plan, 0);
    s.memory.clear();
}

#[test]
fn to_device_small_cases() {
    for (total, chunk, part, nslots, helpers) in [
        (1, 8, 4, 1, 0),
        (7, 8, 4, 2, 1),
        (8, 8, 4, 2, 2),
        (9, 8, 4, 2, 2),
        (100, 8, 3, 1, 3),
        (4097, 1024, 256, 3, 2),
    ] {
        to_device(total, 0, chunk, part, nslots, helpers);
        to_device(total, 1, chunk, part, nslots, helpers);
    }
}

#[test]
fn to_host_small_cases() {
    for (total, chunk, part, nslots, helpers) in [
        (1, 8, 4, 1, 0),
        (7, 8, 4, 2, 1),
        (8, 8, 4, 2, 2),
        (9, 8, 4, 2, 2),
        (100, 8, 3, 1, 3),
        (4097, 1024, 256, 3, 2),
    ] {
        to_host(total, 0, chunk, part, nslots, helpers);
        to_host(total, 3, chunk, part, nslots, helpers);
    }
}

#[test]
fn a_single_slot_serialises_but_completes() {
    to_device(10_000, 0, 512, 64, 1, 3);
    to_host(10_000, 0, 512, 64, 1, 3);
}

#[test]
fn many_chunks_many_threads() {
    to_device(1 << 20, 5, 16 << 10, 4 << 10, 4, 3);
    to_host(1 << 20, 5, 16 << 10, 4 << 10, 4, 3);
}

#[test]
fn an_empty_transfer_submits_nothing() {
    let plan = Plan::new(0, 8, 4, 2).unwrap();
    let s = slots(&plan);
    let sim = SimDevice::new(0, |_| 0, 2, 0);
    for direction in [Direction::ToDevice, Direction::ToHost] {
        // SAFETY: zero bytes are touched.
        unsafe { run(&sim, direction, std::ptr::null_mut(), &plan, &s.ptrs, 2) }.unwrap();
    }
    assert!(sim.log().is_empty());
}

#[test]
fn a_wrong_number_of_slots_is_an_error() {
    let plan = Plan::new(10, 8, 4, 2).unwrap();
    let mut one = vec![0u8; 8];
    let sim = SimDevice::new(10, |_| 0, 2, 0);
    let src = [0u8; 10];
    // SAFETY: rejected before any byte is touched.
    let r = unsafe {
        run(
            &sim,
            Direction::ToDevice,
            src.as_ptr() as *mut u8,
            &plan,
            &[SlotMemory(one.as_mut_ptr())],
            0,
        )
    };
    assert!(matches!(
        r,
        Err(Failed {
            dma_issued: false,
            ..
        })
    ));
    assert!(sim.log().is_empty());
}

/// A failing submission ends the transfer with that error, leaves no DMA in flight, and does
/// not hang whichever thread was waiting for the failed chunk.
#[test]
fn a_failed_submission_stops_the_transfer_cleanly() {
    for direction in [Direction::ToDevice, Direction::ToHost] {
        for fail_at in [0, 1, 3, 7] {
            for helpers in [0, 2] {
                let total = 64 << 10;
                let plan = Plan::new(total, 4 << 10, 1 << 10, 3).unwrap();
                let s = slots(&plan);
                let sim = SimDevice::with_failures(total, pattern, 3, 10, Some(fail_at), None);
                let mut host = vec![0u8; total];
                // SAFETY: as in `to_device`.
                let r = unsafe { run(&sim, direction, host.as_mut_ptr(), &plan, &s.ptrs, helpers) };
                let failed = r.expect_err("the transfer fails");
                assert_eq!(failed.error, injected(), "{direction:?} fail_at {fail_at}");
                assert!(failed.dma_issued, "a submission was attempted");
                assert_eq!(sim.in_flight(), 0, "slots idle after a failure");
                // Threads that had claimed work before the failure may finish it, but the
                // transfer stops: not every chunk moves.
                assert!(
                    sim.log().len() < plan.chunks(),
                    "{direction:?} fail_at {fail_at}"
                );
                assert_eq!(sim.violations(), Vec::<String>::new());
            }
        }
    }
}

#[test]
fn a_failed_wait_stops_the_transfer_cleanly() {
    for direction in [Direction::ToDevice, Direction::ToHost] {
        let total = 64 << 10;
        let plan = Plan::new(total, 4 << 10, 1 << 10, 2).unwrap();
        let s = slots(&plan);
        let sim = SimDevice::with_failures(total, pattern, 2, 10, None, Some(1));
        let mut host = vec![0u8; total];
        // SAFETY: as in `to_device`.
        let r = unsafe { run(&sim, direction, host.as_mut_ptr(), &plan, &s.ptrs, 2) };
        let failed = r.expect_err("the transfer fails");
        assert_eq!(failed.error, injected(), "{direction:?}");
        assert!(failed.dma_issued);
        assert_eq!(sim.in_flight(), 0);
        assert!(sim.log().len() < plan.chunks());
    }
}

/// A staging set for the lease tests: slot memory the cache hands out, counting its drops.
struct SimSet {
    slots: Slots,
    drops: Arc<AtomicUsize>,
}

impl SimSet {
    fn new(plan: &Plan, drops: &Arc<AtomicUsize>) -> SimSet {
        SimSet {
            slots: slots(plan),
            drops: Arc::clone(drops),
        }
    }

    fn addresses(&self) -> Vec<usize> {
        self.slots.ptrs.iter().map(|p| p.0 as usize).collect()
    }
}

impl Drop for SimSet {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs one transfer of `plan` through a set leased from `cache`, then settles the lease as
/// `to_device`/`to_host` do; returns the result and the addresses of the slots used.
fn leased_transfer(
    cache: &Cache<SimSet>,
    drops: &Arc<AtomicUsize>,
    sim: &SimDevice,
    direction: Direction,
    plan: &Plan,
    host: &mut [u8],
) -> (crate::Result<()>, Vec<usize>) {
    let lease = cache
        .checkout(|_| true, || Ok(SimSet::new(plan, drops)))
        .unwrap();
    let set = lease.set().unwrap();
    let addresses = set.addresses();
    // SAFETY: `host` holds `plan.total()` bytes; the slots are the lease's, `chunk_bytes`
    // each, and reach nobody else while leased (or ever, once leaked).
    let outcome = unsafe { run(sim, direction, host.as_mut_ptr(), plan, &set.slots.ptrs, 2) };
    (lease.settle(outcome).map(drop), addresses)
}

/// Item 6 of the soundness issue: a failed fence wait leaves a DMA in flight on a slot. The
/// lease is then leaked: not recycled into the cache (the next transfer gets other memory),
/// not freed (the late DMA lands in memory nobody else owns), and the late DMA breaks no rule
/// of the slot protocol. A successful transfer, and one that fails before any DMA, do
/// recycle their set.
#[test]
fn a_failed_wait_leaks_the_lease_instead_of_recycling_it() {
    for direction in [Direction::ToDevice, Direction::ToHost] {
        let total = 16 << 10;
        let plan = Plan::new(total, 4 << 10, 1 << 10, 1).unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let cache: Cache<SimSet> = Cache::new(4);
        let mut host = vec![0u8; total];

        // A healthy transfer: its set goes back to the cache and is handed out again.
        let ok_sim = SimDevice::new(total, pattern, 1, 0);
        let (r, first) = leased_transfer(&cache, &drops, &ok_sim, direction, &plan, &mut host);
        r.unwrap();
        wait_all(&ok_sim, 1).unwrap();
        assert_eq!(cache.len(), 1, "{direction:?}: recycled after success");

        // The failing transfer reuses that set; its wait on slot 0 fails with the DMA queued.
        let bad_sim = SimDevice::with_failed_wait_in_flight(total, pattern, 1, 0);
        let (r, failed_on) = leased_transfer(&cache, &drops, &bad_sim, direction, &plan, &mut host);
        assert_eq!(failed_on, first, "the cached set was reused");
        assert_eq!(r, Err(injected()), "{direction:?}");
        assert_eq!(
            bad_sim.in_flight(),
            1,
            "{direction:?}: the DMA is still queued"
        );
        assert_eq!(cache.len(), 0, "{direction:?}: the set was not recycled");
        assert_eq!(drops.load(Ordering::SeqCst), 0, "{direction:?}: nor freed");

        // The cache hands out new memory, and a transfer through it is intact while the
        // stale DMA is still pending.
        let next_sim = SimDevice::new(total, pattern, 1, 0);
        let (r, next) = leased_transfer(&cache, &drops, &next_sim, direction, &plan, &mut host);
        r.unwrap();
        wait_all(&next_sim, 1).unwrap();
        assert!(
            next.iter().all(|a| !failed_on.contains(a)),
            "{direction:?}: a leaked slot was handed out again"
        );
        assert_eq!(next_sim.violations(), Vec::<String>::new());
        assert_eq!(cache.len(), 1);

        // The stale DMA lands in the leaked memory and breaks no rule.
        bad_sim.release_dmas();
        bad_sim.drain();
        assert_eq!(bad_sim.violations(), Vec::<String>::new());
        assert_eq!(
            drops.load(Ordering::SeqCst),
            0,
            "{direction:?}: still not freed"
        );

        // A failure before any DMA (a plan the slots do not match) recycles the set.
        let lease = cache
            .checkout(|_| true, || Ok(SimSet::new(&plan, &drops)))
            .unwrap();
        let sim = SimDevice::new(total, pattern, 1, 0);
        let two = Plan::new(total, 4 << 10, 1 << 10, 2).unwrap();
        // SAFETY: rejected before any byte is touched.
        let outcome = unsafe {
            run(
                &sim,
                direction,
                host.as_mut_ptr(),
                &two,
                &lease.set().unwrap().slots.ptrs,
                0,
            )
        };
        assert!(lease.settle(outcome).is_err());
        assert_eq!(cache.len(), 1, "{direction:?}: no DMA issued, recycled");
        drop(cache.take_all());
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "{direction:?}: the one live set"
        );
    }
}

/// A failed submission (which may have queued its copy) leaks the lease too.
#[test]
fn a_failed_submission_leaks_the_lease() {
    for direction in [Direction::ToDevice, Direction::ToHost] {
        let total = 16 << 10;
        let plan = Plan::new(total, 4 << 10, 1 << 10, 2).unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let cache: Cache<SimSet> = Cache::new(4);
        let mut host = vec![0u8; total];
        let sim = SimDevice::with_failures(total, pattern, 2, 0, Some(1), None);
        let (r, _) = leased_transfer(&cache, &drops, &sim, direction, &plan, &mut host);
        assert_eq!(r, Err(injected()), "{direction:?}");
        assert_eq!(cache.len(), 0, "{direction:?}: not recycled");
        assert_eq!(drops.load(Ordering::SeqCst), 0, "{direction:?}: not freed");
    }
}

/// Transfers from several threads at once share the helper pool and stay correct.
#[test]
fn concurrent_transfers_share_the_helpers() {
    std::thread::scope(|scope| {
        for i in 0..3 {
            scope.spawn(move || {
                to_device(200_000 + i, i, 8 << 10, 2 << 10, 3, 2);
                to_host(200_000 + i, i, 8 << 10, 2 << 10, 3, 2);
            });
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_cut_moves_the_data_intact(
        total in 1usize..40_000,
        skew in 0usize..8,
        chunks in 1usize..64,
        part in 1usize..3_000,
        nslots in 1usize..5,
        helpers in 0usize..4,
        to_dev in any::<bool>(),
    ) {
        let chunk = total.div_ceil(chunks);
        if to_dev {
            to_device(total, skew, chunk, part, nslots, helpers);
        } else {
            to_host(total, skew, chunk, part, nslots, helpers);
        }
    }
}

#[test]
fn invalid_configurations_are_rejected() {
    use super::StagingConfig;
    use crate::Error;
    let ok = StagingConfig::default();
    assert!(ok.validate().is_ok());
    for bad in [
        StagingConfig {
            chunk_bytes: 0,
            ..ok
        },
        StagingConfig { slots: 0, ..ok },
        StagingConfig {
            part_bytes: 0,
            ..ok
        },
        StagingConfig { slots: 65, ..ok },
        StagingConfig { helpers: 64, ..ok },
        StagingConfig {
            min_chunks: 0,
            ..ok
        },
    ] {
        assert!(
            matches!(bad.validate(), Err(Error::InvalidConfig(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn mid_sized_transfers_get_smaller_chunks() {
    use super::{chunk_for, StagingConfig};
    let cfg = StagingConfig {
        chunk_bytes: 8 << 20,
        part_bytes: 512 << 10,
        min_chunks: 8,
        ..StagingConfig::default()
    };
    assert_eq!(chunk_for(1 << 30, &cfg), 8 << 20, "large: the slot size");
    assert_eq!(chunk_for(64 << 20, &cfg), 8 << 20);
    assert_eq!(chunk_for(32 << 20, &cfg), 4 << 20, "eight chunks");
    assert_eq!(
        chunk_for((32 << 20) + 1, &cfg),
        (4 << 20) + (64 << 10),
        "whole 64 KiB"
    );
    assert_eq!(
        chunk_for(1 << 20, &cfg),
        128 << 10,
        "at least min_chunks, in whole 64 KiB"
    );
    assert_eq!(chunk_for(64 << 10, &cfg), 128 << 10, "never below a part");
    let one = StagingConfig {
        min_chunks: 1,
        ..cfg
    };
    assert_eq!(chunk_for(32 << 20, &one), 8 << 20);
    let tiny_slots = StagingConfig {
        chunk_bytes: 1000,
        part_bytes: 5000,
        ..cfg
    };
    assert_eq!(
        chunk_for(1 << 20, &tiny_slots),
        1000,
        "never above the slot size"
    );
}

#[test]
fn mid_sized_transfers_get_smaller_parts_and_fewer_helpers() {
    use super::{cut_for, ring_positions, Cut, StagingConfig, MID_HELPERS, MID_PART_BYTES};
    const MIB: usize = 1 << 20;
    let cfg = StagingConfig {
        chunk_bytes: 8 * MIB,
        part_bytes: 512 << 10,
        min_chunks: 8,
        helpers: 11,
        ..StagingConfig::default()
    };
    let large = Cut {
        chunk: 8 * MIB,
        part: 512 << 10,
        helpers: 11,
    };
    assert_eq!(cut_for(64 * MIB, &cfg), large, "64 MiB: eight full chunks");
    assert_eq!(cut_for(1 << 30, &cfg), large);
    let mid = |chunk| Cut {
        chunk,
        part: MID_PART_BYTES,
        helpers: MID_HELPERS,
    };
    assert_eq!(cut_for(4 * MIB, &cfg), mid(512 << 10));
    assert_eq!(cut_for(16 * MIB, &cfg), mid(2 * MIB));
    assert_eq!(
        cut_for(56 * MIB + 1, &cfg),
        mid(7 * MIB + (64 << 10)),
        "rounded up to 64 KiB"
    );
    // Configured smaller parts and fewer helpers are kept.
    let small = StagingConfig {
        part_bytes: 4096,
        helpers: 2,
        ..cfg
    };
    assert_eq!(
        cut_for(4 * MIB, &small),
        Cut {
            chunk: 512 << 10,
            part: 4096,
            helpers: 2
        }
    );
    // The ring: slots cut into chunk-sized positions, at most 64 (at least one per slot).
    assert_eq!(ring_positions(4, 8 * MIB, 512 << 10), 64);
    assert_eq!(ring_positions(4, 8 * MIB, 2 * MIB), 16);
    assert_eq!(ring_positions(4, 8 * MIB, 8 * MIB), 4);
    assert_eq!(ring_positions(4, 8 * MIB, 3 * MIB), 8, "whole chunks only");
    assert_eq!(ring_positions(3, 1000, 5000), 3);
}
