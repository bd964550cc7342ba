//! Statistics, raw handles and their generations, devices, threads.

use super::*;

#[test]
fn stats_track_peaks_and_counts() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let a = pool.malloc(D0, &S0, 1000).unwrap();
    let b = pool.malloc(D0, &S0, 2000).unwrap();
    let c = pool.malloc(D0, &S1, 4 * MIB).unwrap();
    drop(b);
    let d = pool.malloc(D0, &S0, 100).unwrap();
    let st = pool.stats(D0).unwrap();
    assert_eq!(st.used.current, (1024 + 512 + 4 * MIB) as u64);
    assert_eq!(
        st.used.peak,
        ((1024 + 2048) + 4 * MIB) as u64,
        "sum of the shards' peaks"
    );
    assert_eq!(st.requested.current, (1000 + 100 + 4 * MIB) as u64);
    assert_eq!(st.active_blocks.current, 3);
    assert_eq!(st.active_blocks.peak, 3);
    assert_eq!(st.allocations, 4);
    assert_eq!(st.frees, 1);
    assert_eq!(st.reserved.current, (2 * MIB + 4 * MIB) as u64);
    assert_eq!(st.free_bytes(), st.reserved.current - st.used.current);
    assert!(st.fragmentation() > 0.0 && st.fragmentation() < 1.0);
    let s0 = pool.stream_stats(D0, S0).unwrap();
    assert_eq!(s0.used.peak, 1024 + 2048);
    assert_eq!(s0.active_blocks.peak, 2);
    assert_eq!(
        pool.stream_stats(D0, StreamKey(99)).unwrap(),
        Stats::default()
    );
    assert_eq!(
        (pool.used_bytes() as usize) + (pool.free_bytes() as usize),
        (pool.total_bytes() as usize)
    );
    drop((a, c, d));
}

#[test]
fn raw_handles_are_checked() {
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let raw = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(
        (pool.used_bytes() as usize),
        4096,
        "a raw allocation stays allocated"
    );
    pool.record_stream_raw(&raw, &S1).unwrap();
    let addr = raw.ptr();
    pool.free_raw(raw).unwrap();
    pool.synchronize_free_blocks().unwrap();
    // The same block handed out again: a forged handle with the old generation must not
    // free it (a real one cannot exist: `free_raw` consumed it, and the type is not Copy).
    let again = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(again.ptr(), addr);
    let stale = again.forge_stale_for_tests();
    assert!(matches!(
        pool.free_raw(stale),
        Err(PoolError::InvalidHandle { .. })
    ));
    assert_eq!((pool.used_bytes() as usize), 4096);
    pool.free_raw(again).unwrap();
    assert_eq!((pool.used_bytes() as usize), 0);
}

#[test]
fn a_generation_jumped_past_u32_still_refuses_stale_handles() {
    // 26.5: with a u32 generation, 2^32 reuses of a slot made a stale copy valid again.
    let pool = vm_pool(64 * MIB, 2 * MIB);
    let first = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    let stale = first.forge_copy_for_tests();
    pool.free_raw(first).unwrap();
    // 2^32 - 1 reuses later (a u32 generation would now be one short of wrapping):
    pool.jump_generations_for_tests(D0, &S0, u64::from(u32::MAX));
    let live = pool.malloc(D0, &S0, 4096).unwrap().into_raw();
    assert_eq!(live.ptr(), stale.ptr(), "the same slot, reused");
    assert!(matches!(
        pool.free_raw(stale),
        Err(PoolError::InvalidHandle { .. })
    ));
    assert_eq!(
        (pool.used_bytes() as usize),
        4096,
        "the live block was not freed"
    );
    pool.free_raw(live).unwrap();
}

#[test]
fn devices_are_independent() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![
        SimDevice {
            total_memory: (16 * MIB) as u64,
            granularity: Some((2 * MIB) as u64),
        },
        SimDevice {
            total_memory: (16 * MIB) as u64,
            granularity: None,
        },
    ]))
    .unwrap();
    assert!(pool.uses_virtual_memory(D0).unwrap());
    assert!(!pool.uses_virtual_memory(DeviceId(1)).unwrap());
    let a = pool.malloc(D0, &S0, 16 * MIB).unwrap();
    let b = pool.malloc(DeviceId(1), &S0, 2 * MIB).unwrap();
    assert_eq!(pool.stats(D0).unwrap().used.current, (16 * MIB) as u64);
    assert_eq!(
        pool.stats(DeviceId(1)).unwrap().used.current,
        (2 * MIB) as u64
    );
    assert!(matches!(
        pool.malloc(D0, &S1, 512),
        Err(PoolError::OutOfMemory { device: D0, .. })
    ));
    drop((a, b));
}

#[test]
fn many_frees_coalesce_back_into_one_block() {
    let pool = plain_pool(64 * MIB);
    let blocks: Vec<_> = (1..=40u64)
        .map(|i| pool.malloc(D0, &S0, (i * 512) as usize).unwrap())
        .collect();
    for b in blocks.into_iter().rev().step_by(1) {
        drop(b);
    }
    assert_eq!(pool.n_free_blocks(), 1);
}

#[test]
fn threads_on_their_own_and_on_shared_streams_never_overlap() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    let pool = vm_pool(512 * MIB, 2 * MIB);
    let live: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, live) = (&pool, &live);
            s.spawn(move || {
                // Threads 0 and 1 share a stream; 2 and 3 have their own.
                let stream = StreamKey(t.max(1));
                let mut mine = Vec::new();
                let mut x = t + 1;
                for _ in 0..3000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if mine.len() < 8 && x % 3 != 0 {
                        let size = 512 + (x >> 40) % (3 * MIB) as u64;
                        let a = pool.malloc(D0, &stream, size as usize).unwrap();
                        let mut l = live.lock().unwrap();
                        let start = a.ptr().0;
                        let end = start + size;
                        if let Some((&s, &e)) = l.range(..end).next_back() {
                            assert!(e <= start || s >= end, "overlap");
                        }
                        l.insert(start, end);
                        drop(l);
                        mine.push(a);
                    } else if !mine.is_empty() {
                        let a = mine.swap_remove((x >> 20) as usize % mine.len());
                        live.lock().unwrap().remove(&a.ptr().0);
                        drop(a);
                    }
                }
                for a in mine {
                    live.lock().unwrap().remove(&a.ptr().0);
                }
            });
        }
    });
    assert_eq!((pool.used_bytes() as usize), 0);
    assert_eq!(pool.stats(D0).unwrap().active_blocks.current, 0);
}
