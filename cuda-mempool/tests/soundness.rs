//! Soundness round 2, the pool's CPU side (simulated backend): a memory hook that panics
//! inside the pool's slow path (with its locks held) does not unwind through the pool, which
//! keeps working; the private pools of graph captures cannot be held or allocated from
//! through the public private-pool calls; a private pool's holds are released one by one.
//! (The type-level fixes, unsafe backend methods, opaque driver fences, `PrivateHold` not
//! `Clone`, `ExportedBlock::release` unsafe, are compile-fail cases of the `tests` crate.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudars_mempool::hooks::{self, MemoryEvent, MemoryHook};
use cudars_mempool::{
    DeviceId, MemoryPool, PoolError, PrivatePoolId, SimDevice, SimulatedBackend, StreamKey,
};

const MIB: usize = 1 << 20;
const D0: DeviceId = DeviceId(0);

fn pool(granularity: Option<u64>) -> MemoryPool<SimulatedBackend> {
    MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: 1 << 30,
        granularity,
    }]))
    .unwrap()
}

/// Counts its calls, then panics in each of them.
#[derive(Default)]
struct PanickingHook {
    calls: AtomicUsize,
}

impl MemoryHook for PanickingHook {
    fn alloc_pre(&self, _: &MemoryEvent) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("alloc_pre hook panics");
    }
    fn alloc_post(&self, _: &MemoryEvent) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("alloc_post hook panics");
    }
}

/// A hook that panics while the pool holds its locks (the backend's `alloc` hooks run in
/// the pool's slow path) is caught: the allocation succeeds, the accounting is right, and
/// the pool serves other threads and gives everything back afterwards. Before the fix the
/// panic unwound out of `malloc`, through the pool's locks, in the middle of a refill.
#[test]
fn a_panicking_memory_hook_leaves_the_pool_working() {
    for granularity in [None, Some(2 * MIB as u64)] {
        let pool = pool(granularity);
        let hook = Arc::new(PanickingHook::default());
        {
            let _guard = hooks::install(hook.clone());
            let a = pool
                .malloc(D0, &StreamKey(1), 64 * MIB)
                .expect("the allocation goes on despite the hook's panic");
            assert!(
                hook.calls.load(Ordering::SeqCst) >= 2,
                "{granularity:?}: the alloc hooks did not run (so this test tests nothing)"
            );
            assert_eq!(pool.stats(D0).unwrap().used.current, (64 * MIB) as u64);
            drop(a);
        }
        // Another thread: no lock was left held, no state left half-changed.
        std::thread::scope(|s| {
            s.spawn(|| {
                let b = pool.malloc(D0, &StreamKey(2), 96 * MIB).unwrap();
                let c = pool.malloc(D0, &StreamKey(2), MIB).unwrap();
                assert!(
                    b.ptr().0 + (96 * MIB) as u64 <= c.ptr().0
                        || c.ptr().0 + MIB as u64 <= b.ptr().0
                );
            });
        });
        let stats = pool.stats(D0).unwrap();
        assert_eq!(stats.used.current, 0, "{granularity:?}");
        assert_eq!(stats.active_blocks.current, 0, "{granularity:?}");
        pool.backend().complete_all();
        pool.free_all_blocks().unwrap();
        assert_eq!(pool.total_bytes(), 0, "{granularity:?}");
        assert_eq!(pool.backend().physical_bytes(D0), 0, "{granularity:?}");
    }
}

/// The ids of graph captures' private pools are refused by the public calls, with a typed
/// error and no change: an outside hold (released twice through a clone, before the fix)
/// or an outside allocation reusing a block the capture freed would let the pool lend
/// memory that the capture's graph still writes when it replays. Ordinary ids still work.
#[test]
fn capture_private_pools_are_refused_to_the_public_calls() {
    let pool = pool(Some((2 * MIB) as u64));
    let capture = PrivatePoolId(PrivatePoolId::CAPTURE_BIT | 7);
    assert!(capture.is_capture_pool());
    match pool.retain_private_pool(D0, capture) {
        Err(PoolError::CapturePrivatePool { pool }) => assert_eq!(pool, capture.0),
        other => panic!("a capture's pool was held from outside: {other:?}"),
    }
    match pool.malloc_private(D0, capture, &StreamKey(1), MIB) {
        Err(PoolError::CapturePrivatePool { pool }) => assert_eq!(pool, capture.0),
        Ok(a) => panic!("an outside allocation in a capture's pool at {}", a.ptr()),
        Err(e) => panic!("{e}"),
    }
    assert!(
        !pool.has_private_pool(D0, capture).unwrap(),
        "a pool was made"
    );
    assert_eq!(pool.total_bytes(), 0);

    let mine = PrivatePoolId(7);
    assert!(!mine.is_capture_pool());
    let hold = pool.retain_private_pool(D0, mine).unwrap();
    let a = pool.malloc_private(D0, mine, &StreamKey(1), MIB).unwrap();
    drop(a);
    hold.release();
    pool.backend().complete_all();
    assert!(!pool.has_private_pool(D0, mine).unwrap());
}

/// Each hold counts once: releasing one of two holds keeps the private pool, and its memory
/// is not lent to ordinary allocations; releasing the second lets it go.
#[test]
fn private_pool_holds_are_released_one_by_one() {
    let pool = pool(Some((2 * MIB) as u64));
    let id = PrivatePoolId(3);
    let first = pool.retain_private_pool(D0, id).unwrap();
    let second = pool.retain_private_pool(D0, id).unwrap();
    let a = pool.malloc_private(D0, id, &StreamKey(1), 4 * MIB).unwrap();
    let private_addr = a.ptr();
    drop(a);
    first.release();
    pool.backend().complete_all();
    assert!(pool.has_private_pool(D0, id).unwrap(), "one hold is left");
    let b = pool.malloc(D0, &StreamKey(1), 4 * MIB).unwrap();
    assert_ne!(
        b.ptr(),
        private_addr,
        "a held private pool's memory was lent"
    );
    drop(b);
    second.release();
    pool.backend().complete_all();
    assert!(!pool.has_private_pool(D0, id).unwrap());
}
