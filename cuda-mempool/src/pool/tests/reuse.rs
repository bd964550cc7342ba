//! Reuse on one stream and across streams (fences), out of memory, limits.

use super::*;

#[test]
fn same_stream_reuse_is_immediate_and_calls_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    sim.submit_work(D0, S0);
    let a = pool.malloc(D0, &S0, 5 * MIB).unwrap();
    let p = a.ptr();
    sim.submit_work(D0, S0);
    drop(a);
    let calls = sim.calls();
    let b = pool.malloc(D0, &S0, 5 * MIB).unwrap();
    assert_eq!(b.ptr(), p);
    assert_eq!(sim.calls(), calls, "no backend call, no fence, no wait");
    assert_eq!(sim.completed(D0, S0), 0, "nothing waited for the stream");
}

#[test]
fn other_streams_get_memory_only_after_the_fence() {
    let pool = vm_pool_no_steal(64 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let a_page = sim.translate(D0, a.ptr().0).unwrap().0;
    sim.submit_work(D0, S0); // a kernel on S0 uses `a`
    drop(a);
    assert_eq!((pool.total_bytes() as usize), 8 * MIB);

    // S0's work is pending: S1 must not get those pages, so new ones are created.
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_ne!(sim.translate(D0, b.ptr().0).unwrap().0, a_page);
    assert_eq!((pool.total_bytes() as usize), 16 * MIB);
    assert_eq!(sim.completed(D0, S0), 0, "no host wait");

    // Once S0's work completes, its pages move to S1 instead of growing the pool.
    sim.complete_stream(D0, S0);
    let c = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    assert_eq!((pool.total_bytes() as usize), 16 * MIB);
    let c_pages: Vec<u64> = (0..4)
        .map(|i| {
            sim.translate(D0, c.ptr().0 + (i * 2 * MIB) as u64)
                .unwrap()
                .0
        })
        .collect();
    assert!(c_pages.contains(&a_page), "S0's pages were remapped for S1");
    drop((b, c));
}

#[test]
fn out_of_memory_waits_for_fences_before_failing() {
    let pool = vm_pool_no_steal(8 * MIB, 2 * MIB);
    let sim = pool.backend();
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    sim.submit_work(D0, S0);
    drop(a);
    // The device is full and S0's work pending: the pool waits for S0, then remaps.
    let b = pool.malloc(D0, &S1, 6 * MIB).unwrap();
    assert_eq!(sim.completed(D0, S0), 1, "the pool waited on the host");
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.retries, 1);
    assert_eq!(st.ooms, 0);
    assert_eq!(st.reserved.current, (8 * MIB) as u64);
    drop(b);
}

#[test]
fn out_of_memory_error_carries_the_figures_and_the_pool_keeps_working() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Bytes(8 * MIB)).unwrap();
    let a = pool.malloc(D0, &S0, 6 * MIB).unwrap();
    match pool.malloc(D0, &S0, 4 * MIB) {
        Err(PoolError::OutOfMemory {
            device,
            requested,
            used,
            reserved,
            limit,
            cause,
        }) => {
            assert_eq!(cause, crate::OomCause::Limit);
            assert_eq!(device, D0);
            assert_eq!(requested, 4 * MIB);
            assert_eq!(used, 6 * MIB as u64);
            assert!(reserved <= 8 * MIB as u64);
            assert_eq!(limit, Some(8 * MIB as u64));
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.ooms, 1);
    assert_eq!(st.oom_causes.limit, 1);
    assert_eq!(st.oom_causes.total(), st.ooms);
    assert_eq!(st.last_oom, Some(crate::OomCause::Limit));
    assert!(st.reserved.peak <= (8 * MIB) as u64);
    let b = pool.malloc(D0, &S0, 2 * MIB).unwrap();
    assert_eq!((pool.used_bytes() as usize), 8 * MIB);
    drop((a, b));
}

#[test]
fn limit_below_usage_is_an_error_that_changes_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Bytes(32 * MIB)).unwrap();
    let a = pool.malloc(D0, &S0, 3 * MIB).unwrap(); // touches 2 pages
    let b = pool.malloc(D0, &S0, 4 * MIB).unwrap();
    drop(b);
    let before = pool.total_bytes() as usize;
    match pool.set_limit(D0, Limit::Bytes(3 * MIB)) {
        Err(PoolError::LimitBelowUsage {
            limit,
            used,
            in_use,
            ..
        }) => {
            assert_eq!(limit, 3 * MIB as u64);
            assert_eq!(used, 3 * MIB as u64);
            assert_eq!(in_use, 4 * MIB as u64);
        }
        other => panic!("expected LimitBelowUsage, got {other:?}"),
    }
    assert_eq!(pool.get_limit(D0).unwrap(), Some(32 * MIB));
    assert_eq!((pool.total_bytes() as usize), before);
    // A limit between what is in use and what is held releases the cache.
    pool.set_limit(D0, Limit::Bytes(5 * MIB)).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), Some(5 * MIB));
    assert_eq!((pool.total_bytes() as usize), 4 * MIB);
    assert_eq!(pool.backend().physical_bytes(D0), (4 * MIB) as u64);
    drop(a);
}

#[test]
fn limits_by_fraction_and_from_text() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    pool.set_limit(D0, Limit::Fraction(0.25)).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), Some(16 * MIB));
    pool.set_limit(D0, Limit::Unlimited).unwrap();
    assert_eq!(pool.get_limit(D0).unwrap(), None);
    assert_eq!(Limit::parse("50%").unwrap(), Limit::Fraction(0.5));
    assert_eq!(Limit::parse(" 1024 ").unwrap(), Limit::Bytes(1024));
    assert_eq!(Limit::parse("none").unwrap(), Limit::Unlimited);
    assert!(Limit::parse("lots").is_err());
    let config = PoolConfig {
        limit: Limit::Fraction(0.5),
        ..PoolConfig::default()
    };
    let pool = MemoryPool::with_config(SimulatedBackend::h200(2), config).unwrap();
    let half = crate::sim::H200_TOTAL_MEMORY / 2;
    assert_eq!(pool.get_limit(DeviceId(1)).unwrap(), Some(half as usize));
}
