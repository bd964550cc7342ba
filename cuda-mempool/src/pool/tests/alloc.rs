//! Requests, rounding, splitting and coalescing, best fit, segment classes.

use super::*;

#[test]
fn pool_and_handles_are_send_and_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<MemoryPool<SimulatedBackend>>();
    sync::<MemoryPool<SimulatedBackend>>();
    send::<Allocation<'static, SimulatedBackend>>();
    send::<RawAllocation>();
}

#[test]
fn size_zero_touches_nothing() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 0).unwrap();
    assert!(a.is_empty());
    assert!(a.ptr().is_null());
    assert_eq!(pool.backend().calls(), crate::sim::SimCalls::default());
    assert_eq!(pool.stats(D0).unwrap().allocations, 0);
    a.free().unwrap();
    assert_eq!(pool.stats(D0).unwrap().frees, 0);
    // Even on a device that does not exist, as CuPy's empty pointer does not care.
    assert!(pool.malloc(DeviceId(9), &S0, 0).unwrap().is_empty());
}

#[test]
fn bad_input_is_an_error() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    assert!(matches!(
        pool.malloc(DeviceId(1), &S0, 1),
        Err(PoolError::InvalidDevice {
            device: DeviceId(1),
            count: 1
        })
    ));
    assert!(matches!(
        pool.malloc(D0, &S0, usize::MAX),
        Err(PoolError::SizeOverflow { size: usize::MAX })
    ));
    assert!(matches!(
        pool.set_limit(D0, Limit::Fraction(1.5)),
        Err(PoolError::InvalidLimit(_))
    ));
    assert_eq!(pool.get_limit(D0).unwrap(), None);
}

#[test]
fn sizes_are_rounded_to_512_bytes() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 1).unwrap();
    assert_eq!((pool.used_bytes() as usize), 512);
    let b = pool.malloc(D0, &S0, 513).unwrap();
    assert_eq!((pool.used_bytes() as usize), 512 + 1024);
    assert_eq!(b.ptr().0, a.ptr().0 + 512, "small blocks are packed");
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.requested.current, 514);
    assert_eq!(st.active_blocks.current, 2);
}

#[test]
fn split_and_coalesce() {
    let pool = plain_pool(64 * MIB);
    let a = pool.malloc(D0, &S0, 1000).unwrap();
    let b = pool.malloc(D0, &S0, 1000).unwrap();
    let c = pool.malloc(D0, &S0, 1000).unwrap();
    let base = a.ptr().0;
    assert_eq!(b.ptr().0, base + 1024);
    assert_eq!(c.ptr().0, base + 2048);
    // One 2 MiB segment: the remainder after c is the only free block.
    assert_eq!((pool.total_bytes() as usize), 2 * MIB);
    assert_eq!(pool.n_free_blocks(), 1);
    drop(b);
    assert_eq!(pool.n_free_blocks(), 2, "b sits between two live blocks");
    drop(a);
    assert_eq!(pool.n_free_blocks(), 2, "a and b merge");
    drop(c);
    assert_eq!(
        pool.n_free_blocks(),
        1,
        "the whole segment is one block again"
    );
    let d = pool.malloc(D0, &S0, 3 * 1024).unwrap();
    assert_eq!(
        d.ptr().0,
        base,
        "the merged block serves a request for all three"
    );
    assert_eq!(pool.backend().calls().allocate, 1);
}

#[test]
fn best_fit_takes_the_smallest_fitting_block() {
    let pool = plain_pool(64 * MIB);
    let x1 = pool.malloc(D0, &S0, 3072).unwrap();
    let _s1 = pool.malloc(D0, &S0, 512).unwrap();
    let x2 = pool.malloc(D0, &S0, 1024).unwrap();
    let _s2 = pool.malloc(D0, &S0, 512).unwrap();
    let x3 = pool.malloc(D0, &S0, 2048).unwrap();
    let _s3 = pool.malloc(D0, &S0, 512).unwrap();
    let (p1, p2, p3) = (x1.ptr(), x2.ptr(), x3.ptr());
    drop(x1);
    drop(x2);
    drop(x3);
    // Holes of 3072, 1024 and 2048 bytes, and the segment's tail.
    let y = pool.malloc(D0, &S0, 1500).unwrap();
    assert_eq!(y.ptr(), p3, "1536 bytes go into the 2048-byte hole");
    let z = pool.malloc(D0, &S0, 1024).unwrap();
    assert_eq!(z.ptr(), p2, "an exact fit wins");
    let w = pool.malloc(D0, &S0, 2560).unwrap();
    assert_eq!(
        w.ptr(),
        p1,
        "only the 3072-byte hole is left below the tail"
    );
}

#[test]
fn split_remainder_of_a_large_hole_stays_free() {
    let pool = plain_pool(64 * MIB);
    let a = pool.malloc(D0, &S0, 4096).unwrap();
    let _guard = pool.malloc(D0, &S0, 512).unwrap();
    let p = a.ptr().0;
    drop(a);
    let b = pool.malloc(D0, &S0, 1024).unwrap();
    assert_eq!(b.ptr().0, p);
    let c = pool.malloc(D0, &S0, 3072).unwrap();
    assert_eq!(
        c.ptr().0,
        p + 1024,
        "the 3072-byte remainder was kept as a block"
    );
}

#[test]
fn small_and_large_blocks_use_separate_segments() {
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let small = pool.malloc(D0, &S0, 4096).unwrap();
    let large = pool.malloc(D0, &S0, 3 * MIB).unwrap();
    let distance = small.ptr().0.abs_diff(large.ptr().0);
    assert!(
        distance >= policy::SMALL_ADDRESS_RANGE,
        "different address ranges"
    );
    // 1 page for the small block, 2 for the large one.
    assert_eq!((pool.total_bytes() as usize), 3 * 2 * MIB);
}
