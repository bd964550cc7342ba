//! GPU: soundness round 2, the pool's behaviour on the card (the type-level fixes are
//! compile-fail cases, `tests/compile_fail/pool_*.rs`):
//!
//! * an IPC-exported block goes back to the pool only on the importer's word: dropped
//!   without a release, or `release_after` with an event that is not interprocess, it is
//!   never lent to another allocation; `unsafe { release() }` gives it back;
//! * a memory hook that panics inside the driver backend (with the pool's locks held) is
//!   caught, and the pool keeps serving;
//! * what safe code can still do with the pool's backend (record and give back fences,
//!   make streams wait on them) does not let the pool lend a block a slow kernel still
//!   writes.
//!
//! Every test takes `SERIAL`.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudars_core::memory::{raw, DevicePtr};
use cudars_core::{Device, Event, Stream};
use cudars_mempool::driver::device_id;
use cudars_mempool::hooks::{self, MemoryEvent, MemoryHook};
use cudars_mempool::{Backend, DevicePool, DriverBackend, Limit, PoolConfig, PoolError};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

const MIB: usize = 1 << 20;
const BLOCK: usize = 4 * MIB;
/// About 0.1 s of SM clocks: long enough that the host runs well ahead of the kernel.
const SLOW: u64 = 200_000_000;

fn overlaps(a: &DevicePtr, base: u64, len: usize) -> bool {
    a.as_raw() < base + len as u64 && base < a.as_raw() + a.len() as u64
}

fn read_u32(dev: &Device, ptr: u64, n: usize) -> Vec<u32> {
    let mut host = vec![0u32; n];
    // SAFETY: `ptr` addresses `n` u32s of live device memory; the legacy-stream copy waits
    // for the blocking streams' work.
    unsafe { raw::copy_dtoh(dev, host.as_mut_ptr().cast(), ptr, n * 4) }.expect("copy");
    host
}

/// Allocates `count` blocks of `BLOCK` bytes on `stream`, keeping them all, and says whether
/// any of them overlaps `base..base + len`.
fn any_allocation_gets(
    pool: &Arc<DevicePool>,
    stream: &Stream,
    count: usize,
    base: u64,
    len: usize,
) -> bool {
    let mut kept = Vec::new();
    let mut hit = false;
    for _ in 0..count {
        let a: DevicePtr = pool.malloc_shared(stream, BLOCK).unwrap().into();
        hit |= overlaps(&a, base, len);
        kept.push(a);
    }
    hit
}

/// Dropped without a release, an exported block stays out of reuse: the exporter cannot
/// know the importer is done. Before the fix dropping was `release`, and the very next
/// allocation on the stream got the block while the importer could still write it.
#[test]
fn an_exported_block_dropped_without_release_is_never_reused() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_ipc().unwrap());
    let block = pool.malloc_ipc(&stream, BLOCK).unwrap();
    let (base, len) = (block.view().as_raw(), block.view().len());
    block.view().memset_async(0x5A, &stream).unwrap();
    drop(block);
    stream.synchronize().unwrap();
    assert!(
        !any_allocation_gets(&pool, &stream, 64, base, len),
        "an allocation got a dropped, never released, exported block"
    );
}

/// `release_after` with an event that is not interprocess (so not the importer's) is
/// refused with a typed error, and the block is not released.
#[test]
fn release_after_refuses_a_local_event_and_keeps_the_block() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_ipc().unwrap());
    let block = pool.malloc_ipc(&stream, BLOCK).unwrap();
    let (base, len) = (block.view().as_raw(), block.view().len());
    let local = Event::new(&dev).unwrap();
    local.record(&stream).unwrap();
    let err = block.release_after(&stream, &local).unwrap_err();
    assert!(matches!(err, PoolError::NotInterprocessEvent), "{err}");
    stream.synchronize().unwrap();
    assert!(
        !any_allocation_gets(&pool, &stream, 64, base, len),
        "a block whose release_after was refused went back to the pool"
    );
}

/// The `unsafe` release still gives the block back (the caller vouches for the importer).
#[test]
fn an_unsafe_release_gives_the_block_back() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_ipc().unwrap());
    let block = pool.malloc_ipc(&stream, BLOCK).unwrap();
    let (base, len) = (block.view().as_raw(), block.view().len());
    // SAFETY: the block was never sent to another process: no importer exists.
    unsafe { block.release() };
    assert!(
        any_allocation_gets(&pool, &stream, 64, base, len),
        "the released block was never reused"
    );
}

#[derive(Default)]
struct PanickingHook {
    calls: AtomicUsize,
}

impl MemoryHook for PanickingHook {
    fn alloc_pre(&self, _: &MemoryEvent) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("alloc_pre hook panics");
    }
    fn malloc_post(&self, _: &MemoryEvent) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("malloc_post hook panics");
    }
    fn free_pre(&self, _: &MemoryEvent) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        panic!("free_pre hook panics");
    }
}

/// A hook panicking in the driver backend's `alloc` (the pool's locks held), after a malloc
/// and before a free: each panic is caught; the block is served, written, read back and
/// freed, and another thread then uses the pool. Before the fix the first panic unwound
/// out of `malloc_shared` through the pool's locks.
#[test]
fn a_panicking_hook_in_the_driver_backend_leaves_the_pool_working() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    for config in [
        PoolConfig::default(),
        PoolConfig {
            virtual_memory: false,
            ..PoolConfig::default()
        },
    ] {
        let pool =
            Arc::new(DevicePool::with_config(DriverBackend::new().unwrap(), config).unwrap());
        let hook = Arc::new(PanickingHook::default());
        {
            let _guard = hooks::install(hook.clone());
            let view: DevicePtr = pool.malloc_shared(&stream, 64 * MIB).unwrap().into();
            view.memset_async(0x7E, &stream).unwrap();
            stream.synchronize().unwrap();
            let mut host = vec![0u8; 64 * MIB];
            view.copy_to_host(&mut host).unwrap();
            assert!(host.iter().all(|&b| b == 0x7E));
            drop(view);
            assert!(
                hook.calls.load(Ordering::SeqCst) >= 3,
                "{config:?}: the hooks did not all run"
            );
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let other = Stream::new(&dev).unwrap();
                let view: DevicePtr = pool.malloc_shared(&other, 8 * MIB).unwrap().into();
                view.memset_async(1, &other).unwrap();
                other.synchronize().unwrap();
            });
        });
        let stats = pool.stats(device_id(&dev)).unwrap();
        assert_eq!(stats.used.current, 0, "{config:?}");
        pool.free_all_blocks().unwrap();
    }
}

/// What safe code can do with the live pool's backend: record fences on an idle stream and
/// give them back (into the cache the pool takes its fences from), query and wait on them,
/// make a stream wait on them. None of it makes the pool lend a block a slow kernel still
/// writes: under a limit that leaves room for one block only, B gets A's block and must
/// wait for A's kernel on the device, so B's fill survives.
#[test]
fn safe_backend_calls_do_not_make_the_pool_lend_a_busy_block() {
    let _g = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let a = Stream::new(&dev).unwrap();
    let b = Stream::new(&dev).unwrap();
    let idle = Stream::new(&dev).unwrap();
    let pool = DevicePool::with_config(DriverBackend::new().unwrap(), PoolConfig::default())
        .expect("pool");
    let id = device_id(&dev);
    pool.set_limit(id, Limit::Bytes(BLOCK)).unwrap();
    let n = BLOCK / 4;
    let x = pool.malloc_stream(&a, BLOCK).unwrap();
    let x_addr = x.ptr().0;
    // SAFETY: x holds n u32s and stays allocated (in the pool) until the kernel is done.
    unsafe { k.spin_then_fill_raw(&a, x_addr, 0xAAAA_AAAA, n as u64, SLOW) }.unwrap();
    drop(x);
    let backend = pool.backend();
    for _ in 0..64 {
        let f = backend.record_fence(id, &idle).unwrap();
        assert!(backend.fence_completed(&f).is_ok());
        backend.wait_fence(&f).unwrap();
        backend.stream_wait_fence(id, &b, &f).unwrap();
        backend.release_fence(f);
    }
    let y = pool.malloc_stream(&b, BLOCK).unwrap();
    assert!(
        !a.is_done().unwrap(),
        "the slow kernel finished before the reuse test ran (or the host waited)"
    );
    // SAFETY: y holds n u32s, live until after the synchronising read below.
    unsafe { k.fill_u32_raw(&b, y.ptr().0, 0xBBBB_BBBB, n as u64) }.unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    let bad = read_u32(&dev, y.ptr().0, n)
        .iter()
        .filter(|&&v| v != 0xBBBB_BBBB)
        .count();
    assert_eq!(
        bad, 0,
        "{bad} words of B's block were overwritten by A's kernel"
    );
    drop(y);
    pool.free_all_blocks().unwrap();
}
