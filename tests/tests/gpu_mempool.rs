//! GPU: cuda-mempool on the real card: the driver backend's stream-ordered reuse (checked
//! with a slow writer kernel), out of memory, limits, returning memory to the device,
//! statistics, `cudars_core` views of pool blocks (and `record_stream` through them), the
//! async pool and the pinned pool.
//!
//! Every test takes `SERIAL`, so the ones that compare device memory levels never see
//! another test's allocations.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::Arc;

use cudars_core::memory::{raw, DevicePtr};
use cudars_core::{Device, Stream};
use cudars_mempool::async_pool::{AsyncPool, AsyncPoolSource};
use cudars_mempool::driver::{device_id, stream_key};
use cudars_mempool::pinned::PinnedMemoryPool;
use cudars_mempool::{DevicePool, DriverBackend, Limit, PoolConfig, PoolError};
use workspace_tests::gpu::{dev0, serial_reporting_crashes as serial};
use workspace_tests::kernels::Kernels;

const MIB: usize = 1 << 20;
/// About 0.1 s of SM clocks: long enough that the host runs well ahead of the kernel.
const SLOW: u64 = 200_000_000;

fn read_u32(ptr: u64, n: usize) -> Vec<u32> {
    let mut host = vec![0u32; n];
    // SAFETY: `ptr` addresses `n` u32s of live device memory; the legacy-stream copy waits
    // for the blocking streams' work.
    unsafe { raw::copy_dtoh(&dev0(), host.as_mut_ptr().cast(), ptr, n * 4) }.expect("copy");
    host
}

/// A block freed on A while a slow kernel on A still writes it must not be handed to B
/// before that kernel is done: B's own writes must survive. Run without a limit (the pool
/// may hand out fresh memory, or lend A's block with B waiting for A on the device) and
/// with a limit that leaves no room for fresh memory: with stealing (the default) the pool
/// lends A's block and B waits on the device, the host does not; without stealing it must
/// reuse A's pages after the fence completed, which the host waits for.
#[test]
fn cross_stream_reuse_waits_for_slow_kernel() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    for (limited, steal) in [(false, true), (true, true), (true, false)] {
        let a = Stream::new(&dev).unwrap();
        let b = Stream::new(&dev).unwrap();
        let config = PoolConfig {
            steal_before_growing: steal,
            ..PoolConfig::default()
        };
        let pool =
            DevicePool::with_config(DriverBackend::new().expect("driver"), config).expect("pool");
        let size = 4 * MIB;
        if limited {
            pool.set_limit(device_id(&dev), Limit::Bytes(size))
                .expect("limit");
        }
        let n = size / 4;
        let x = pool.malloc_stream(&a, size).expect("x");
        let x_addr = x.ptr().0;
        // SAFETY: x holds n u32s and stays allocated (in the pool) until the kernel is done.
        unsafe { k.spin_then_fill_raw(&a, x_addr, 0xAAAA_AAAA, n as u64, SLOW) }.unwrap();
        drop(x);
        let y = pool.malloc_stream(&b, size).expect("y");
        if steal {
            assert!(
                !a.is_done().unwrap(),
                "the slow kernel finished before the reuse test ran (or the host waited)"
            );
            if limited {
                assert_eq!(y.ptr().0, x_addr, "A's block lent to B");
            }
        } else {
            // The limit leaves no room for fresh memory: the pool had to wait for A's
            // fence and reuse A's pages (possibly remapped at another address).
            assert!(
                a.is_done().unwrap(),
                "under the limit, the memory could only come back after the kernel"
            );
        }
        // SAFETY: y holds n u32s, live until after the synchronising read below.
        unsafe { k.fill_u32_raw(&b, y.ptr().0, 0xBBBB_BBBB, n as u64) }.unwrap();
        b.synchronize().unwrap();
        a.synchronize().unwrap();
        let host = read_u32(y.ptr().0, n);
        let bad = host.iter().filter(|&&v| v != 0xBBBB_BBBB).count();
        assert_eq!(
            bad, 0,
            "limited={limited} steal={steal}: {bad} words of B's block were overwritten by \
             A's kernel"
        );
        drop(y);
        pool.free_all_blocks().unwrap();
    }
}

/// `record_stream` reached through a `cudars_core` view of a pool block: the block is made on
/// stream A, turned into a `DevicePtr` view, written by a slow kernel on stream B (launched
/// through its bare address, so only the explicit `record_stream(&b)` on the view tells
/// the pool about B), and the view is dropped, freeing the block on A while B still runs.
/// The next owner, on A itself or on another stream C, must not get the block before B's
/// kernel is done: its own writes must survive B's late fill. With a limit that leaves room
/// for one block only, the pool has no choice but to reuse that block, so a `record_stream`
/// that did nothing would let A (same-stream reuse is immediate) or C (A's fence is already
/// passed) write it under B's kernel, and B's fill would overwrite them.
#[test]
fn record_stream_through_a_core_view_delays_reuse_until_that_streams_work_is_done() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let size = 4 * MIB;
    let n = size / 4;
    for limited in [true, false] {
        for next_on_a in [true, false] {
            let a = Stream::new(&dev).unwrap();
            let b = Stream::new(&dev).unwrap();
            let c = Stream::new(&dev).unwrap();
            let pool = Arc::new(DevicePool::new_driver().expect("pool"));
            if limited {
                pool.set_limit(device_id(&dev), Limit::Bytes(size))
                    .expect("limit");
            }
            let view: DevicePtr = pool.malloc_shared(&a, size).expect("block").into();
            let old = view.as_raw();
            // The only mark of B: on the view.
            let issue = b.issue(view.device()).expect("issue");
            view.record_stream(&issue)
                .expect("record_stream on the view");
            // SAFETY: the view holds n u32s; the pool keeps the block out of reuse until B's
            // work is done because of the record_stream above (what this test checks), and
            // the test synchronises B before the pool is dropped.
            unsafe { k.spin_then_fill_raw(&b, old, 0xAAAA_AAAA, n as u64, SLOW) }.unwrap();
            drop(issue);
            drop(view); // freed on A, with B's mark
            let next = if next_on_a { &a } else { &c };
            let new: DevicePtr = pool
                .malloc_shared(next, size)
                .expect("the next block")
                .into();
            let overlaps = new.as_raw() < old + size as u64 && old < new.as_raw() + size as u64;
            if limited {
                assert!(
                    overlaps,
                    "under the limit the pool can only reuse the block"
                );
            }
            // If the block came back while B still runs, the pool must have made `next` wait
            // for B on the device; the data check below decides either way.
            k.fill(next, &new, 0xBBBB_BBBB).unwrap();
            next.synchronize().unwrap();
            b.synchronize().unwrap();
            let mut host = vec![0u32; n];
            new.copy_to_host(&mut host).unwrap();
            let bad = host.iter().filter(|&&v| v != 0xBBBB_BBBB).count();
            assert_eq!(
                bad, 0,
                "limited={limited} next_on_a={next_on_a}: {bad} words of the next owner's \
                 block were overwritten by B's kernel: the view's record_stream was not honoured"
            );
            drop(new);
            pool.free_all_blocks().unwrap();
        }
    }
}

/// On the same stream, a freed block is reused at once, without waiting for the kernel.
#[test]
fn same_stream_reuse_is_immediate() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let a = Stream::new(&dev).unwrap();
    let pool = DevicePool::new_driver().unwrap();
    let x = pool.malloc_stream(&a, MIB).unwrap();
    let addr = x.ptr();
    k.spin(&a, SLOW).unwrap();
    drop(x);
    let y = pool.malloc_stream(&a, MIB).unwrap();
    assert_eq!(y.ptr(), addr);
    assert!(!a.is_done().unwrap(), "malloc waited for the stream");
    a.synchronize().unwrap();
}

/// More than the card holds: a typed error, and the pool keeps working.
#[test]
fn oom_on_the_card_is_typed_and_recoverable() {
    let _s = serial();
    let dev = dev0();
    let s = Stream::new(&dev).unwrap();
    let pool = DevicePool::new_driver().unwrap();
    let keep = pool.malloc_stream(&s, 8 * MIB).unwrap();
    let huge = 200usize << 30;
    let reserved_before = pool.stats(device_id(&dev)).unwrap().reserved;
    match pool.malloc_stream(&s, huge) {
        Err(PoolError::OutOfMemory {
            requested,
            used,
            reserved,
            cause,
            ..
        }) => {
            assert_eq!(requested, huge);
            assert_eq!(used, 8 * MIB as u64);
            assert_eq!(cause, cudars_mempool::OomCause::DeviceMemory);
            assert_eq!(reserved, reserved_before.current, "nothing reserved for it");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Nothing was kept: the pool holds what it held before, and the driver still has the
    // card's memory for others (a plain 1 GiB allocation succeeds).
    assert_eq!(
        pool.stats(device_id(&dev)).unwrap().reserved,
        reserved_before
    );
    drop(cudars_core::DeviceMemory::new(&dev, 1 << 30).expect("the card is not starved"));
    let again = pool
        .malloc_stream(&s, 64 * MIB)
        .expect("pool works after OOM");
    let view_bytes = vec![7u8; 64 * MIB];
    // SAFETY: again holds 64 MiB, live during the synchronous copy.
    unsafe { raw::copy_htod(&dev, again.ptr().0, view_bytes.as_ptr(), 64 * MIB) }.unwrap();
    let stats = pool.stats(device_id(&dev)).unwrap();
    assert_eq!(stats.ooms, 1);
    assert_eq!(stats.oom_causes.device_memory, 1);
    assert_eq!(stats.last_oom, Some(cudars_mempool::OomCause::DeviceMemory));
    assert!(stats.mapped >= 72 * MIB as u64 && stats.mapped <= stats.reserved.current);
    // Through `?` into cudars_core::Error, the pool's error and its cause are still there.
    let err: cudars_core::Error = pool.malloc_stream(&s, huge).unwrap_err().into();
    assert!(matches!(
        err.downcast_ref::<PoolError>(),
        Some(PoolError::OutOfMemory {
            cause: cudars_mempool::OomCause::DeviceMemory,
            ..
        })
    ));
    drop((keep, again));
}

/// `set_limit` is a hard cap on the card.
#[test]
fn limit_holds_on_the_card() {
    let _s = serial();
    let dev = dev0();
    let id = device_id(&dev);
    let s = Stream::new(&dev).unwrap();
    let pool = DevicePool::new_driver().unwrap();
    pool.set_limit(id, Limit::Bytes(64 * MIB)).unwrap();
    assert_eq!(pool.get_limit(id).unwrap(), Some(64 * MIB));
    let a = pool.malloc_stream(&s, 32 * MIB).unwrap();
    let err = pool.malloc_stream(&s, 40 * MIB).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory { limit: Some(l), .. } if l == 64 * MIB as u64));
    let b = pool.malloc_stream(&s, 30 * MIB).unwrap();
    assert!(pool.stats(id).unwrap().reserved.peak <= 64 * MIB as u64);
    assert!(matches!(
        pool.set_limit(id, Limit::Bytes(MIB)),
        Err(PoolError::LimitBelowUsage { .. })
    ));
    drop((a, b));
    pool.set_limit(id, Limit::Fraction(0.5)).unwrap();
    let total = dev.total_memory().unwrap();
    assert_eq!(pool.get_limit(id).unwrap(), Some(total / 2));
}

/// Device memory returns to its starting level after `free_all_blocks`; statistics agree
/// with what was asked for.
#[test]
fn memory_returns_and_stats_agree() {
    let _s = serial();
    let dev = dev0();
    let id = device_id(&dev);
    let s1 = Stream::new(&dev).unwrap();
    let s2 = Stream::new(&dev).unwrap();
    for plain in [false, true] {
        let pool = if plain {
            DevicePool::new(cudars_mempool::DriverBackend::plain().unwrap()).unwrap()
        } else {
            DevicePool::new_driver().unwrap()
        };
        assert_eq!(pool.uses_virtual_memory(id).unwrap(), !plain);
        dev.synchronize().unwrap();
        let (free0, _) = dev.memory_info().unwrap();
        let sizes = [1000usize, 3 * MIB, 100 * MIB, 1 << 30, 512];
        let mut live = Vec::new();
        for (i, &sz) in sizes.iter().enumerate() {
            let s = if i % 2 == 0 { &s1 } else { &s2 };
            live.push(pool.malloc_stream(s, sz).unwrap());
        }
        let rounded: u64 = sizes.iter().map(|&s| (s as u64).div_ceil(512) * 512).sum();
        let st = pool.stats(id).unwrap();
        assert_eq!(st.used.current, rounded);
        assert_eq!(st.requested.current, sizes.iter().sum::<usize>() as u64);
        assert_eq!(st.active_blocks.current, sizes.len() as u64);
        assert_eq!(st.allocations, sizes.len() as u64);
        assert_eq!(pool.used_bytes(), rounded);
        assert_eq!(pool.used_bytes() + pool.free_bytes(), pool.total_bytes());
        assert!(pool.total_bytes() >= rounded);
        let (free1, _) = dev.memory_info().unwrap();
        assert!(
            free0 - free1 >= (1 << 30),
            "plain={plain}: the pool's memory did not show on the device"
        );
        drop(live);
        let st = pool.stats(id).unwrap();
        assert_eq!(st.used.current, 0);
        assert_eq!(st.frees, sizes.len() as u64);
        assert_eq!(pool.n_free_blocks() > 0, pool.free_bytes() > 0);
        pool.free_all_blocks().unwrap();
        assert_eq!(pool.total_bytes(), 0);
        assert_eq!(pool.n_free_blocks(), 0);
        let (free2, _) = dev.memory_info().unwrap();
        let diff = free0.abs_diff(free2);
        assert!(
            diff <= 2 * MIB,
            "plain={plain}: device free memory {free0} before, {free2} after free_all_blocks"
        );
    }
}

/// Pool blocks convert into `cudars_core` views; data round trips; the default pool works.
#[test]
fn views_and_default_pool() {
    let _s = serial();
    let dev = dev0();
    let s = Stream::new(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let m = pool.malloc_shared(&s, 4096).unwrap();
    assert_eq!(m.stream(), stream_key(&s));
    let view: DevicePtr = m.into();
    // `s` lives to the end of the test, after the pools' last use of it.
    let data: Vec<u32> = (0..1024).collect();
    view.copy_from_host(&data).unwrap();
    let mut back = vec![0u32; 1024];
    view.copy_to_host(&mut back).unwrap();
    assert_eq!(back, data);
    let half = view.slice(2048..).unwrap();
    half.memset_u32_async(5, &s).unwrap();
    s.synchronize().unwrap();
    view.copy_to_host(&mut back).unwrap();
    assert!(back[..512].iter().copied().eq(0..512));
    assert!(back[512..].iter().all(|&v| v == 5));
    assert_eq!(pool.used_bytes(), 4096);
    drop((view, half));
    assert_eq!(pool.used_bytes(), 0);

    let v = cudars_mempool::driver::malloc(&s, 1000).unwrap();
    assert_eq!(v.len(), 1000);
    assert!(cudars_mempool::default_pool().unwrap().used_bytes() >= 1024);
    drop(v);
    assert_eq!(cudars_mempool::default_pool().unwrap().used_bytes(), 0);
    let empty = cudars_mempool::driver::malloc(&s, 0).unwrap();
    assert!(empty.is_empty());
    cudars_mempool::default_pool()
        .unwrap()
        .free_all_blocks()
        .unwrap();
}

/// AsyncPool: round trip, byte counts, limit, free_all_blocks.
#[test]
fn async_pool_round_trip() {
    let _s = serial();
    let dev = dev0();
    let s = Arc::new(Stream::new(&dev).unwrap());
    let pool = AsyncPool::new(&dev, AsyncPoolSource::New { max_size: None }).unwrap();
    assert_eq!(pool.mem_pool().release_threshold().unwrap(), u64::MAX);
    let view = pool.malloc_ptr(&s, MIB).unwrap();
    view.memset_u32_async(0x1234_5678, &s).unwrap();
    s.synchronize().unwrap();
    let mut back = vec![0u32; MIB / 4];
    view.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&v| v == 0x1234_5678));
    assert!(pool.used_bytes().unwrap() >= MIB as u64);
    drop(view);
    s.synchronize().unwrap();
    assert_eq!(pool.used_bytes().unwrap(), 0);
    assert!(
        pool.total_bytes().unwrap() >= MIB as u64,
        "memory stayed cached"
    );
    pool.set_limit(Limit::Bytes(8 * MIB)).unwrap();
    assert_eq!(pool.get_limit(), Some(8 * MIB));
    let a = pool.malloc(&s, 6 * MIB).unwrap();
    assert!(matches!(
        pool.malloc(&s, 4 * MIB),
        Err(PoolError::OutOfMemory { .. })
    ));
    drop(a);
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes().unwrap(), 0);
}

/// PinnedMemoryPool: `record_stream` refuses the per-thread default stream (its fence would
/// land on the dropping thread's stream) with a typed error and records nothing.
#[test]
fn pinned_record_stream_refuses_the_per_thread_stream() {
    let _s = serial();
    let dev = dev0();
    let pool = PinnedMemoryPool::new();
    let mut p = pool.malloc(&dev, MIB).unwrap();
    let err = p.record_stream(&Stream::per_thread(&dev)).unwrap_err();
    assert!(matches!(err, PoolError::PerThreadStream), "{err}");
    assert!(err.to_string().contains("use a created stream"), "{err}");
    assert!(format!("{p:?}").contains("streams: 0"), "{p:?}");
    let created = Stream::new(&dev).unwrap();
    p.record_stream(&created).unwrap();
    assert!(format!("{p:?}").contains("streams: 1"), "{p:?}");
    drop(p);
    created.synchronize().unwrap();
    pool.free_all_blocks();
}

/// PinnedMemoryPool: a block used by a copy queued behind a slow kernel is not reused
/// until the copy is done; afterwards it is.
#[test]
fn pinned_reuse_waits_for_slow_copy() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let s = Stream::new(&dev).unwrap();
    let pool = PinnedMemoryPool::new();
    let size = 4 * MIB;
    let n = size / 4;
    let d = cudars_core::memory::DeviceMemory::new(&dev, size).unwrap();
    let mut p = pool.malloc(&dev, size).unwrap();
    let p_addr = p.as_ptr();
    // SAFETY: d holds n u32s, live until the synchronisation below; p stays cached (not
    // freed to the OS) and is not handed out while the copy is pending.
    unsafe {
        k.spin_then_fill_raw(&s, d.as_raw(), 0xC0FFEE, n as u64, SLOW)
            .unwrap();
        raw::copy_dtoh_async(&dev, p.as_mut_ptr(), d.as_raw(), size, &s).unwrap();
    }
    p.record_stream(&s).unwrap();
    drop(p);
    assert_eq!(pool.n_free_blocks(), 1);
    let q = pool.malloc(&dev, size).unwrap();
    assert!(!s.is_done().unwrap(), "the slow kernel finished too early");
    assert_ne!(q.as_ptr(), p_addr, "reused while the copy was pending");
    assert_eq!(pool.total_bytes(), 2 * size);
    drop(q);
    s.synchronize().unwrap();
    let r1 = pool.malloc(&dev, size).unwrap();
    let r2 = pool.malloc(&dev, size).unwrap();
    assert_eq!(pool.total_bytes(), 2 * size, "no new block after the sync");
    let reused = [&r1, &r2]
        .into_iter()
        .find(|r| r.as_ptr() == p_addr)
        .expect("the copied-into block is reused once the copy is done");
    assert!(words(reused).iter().all(|&v| v == 0xC0FFEE));
    assert_eq!(pool.used_bytes(), 2 * size);
    drop((r1, r2));
    pool.free_all_blocks();
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(pool.n_free_blocks(), 0);
}

fn words(b: &[u8]) -> &[u32] {
    assert_eq!(b.as_ptr() as usize % 4, 0);
    // SAFETY: aligned (checked), u32 has no invalid bit patterns, length truncated.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 4) }
}

#[derive(Default)]
struct CountingHook {
    alloc: std::sync::atomic::AtomicUsize,
    malloc: std::sync::atomic::AtomicUsize,
    free: std::sync::atomic::AtomicUsize,
}

impl cudars_mempool::hooks::MemoryHook for CountingHook {
    fn alloc_post(&self, _: &cudars_mempool::hooks::MemoryEvent) {
        self.alloc
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn malloc_post(&self, _: &cudars_mempool::hooks::MemoryEvent) {
        self.malloc
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn free_post(&self, _: &cudars_mempool::hooks::MemoryEvent) {
        self.free.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

static C_LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

unsafe extern "C" fn c_malloc(
    ctx: *mut std::ffi::c_void,
    size: usize,
    device: i32,
    _stream: cudars_core::sys::CUstream,
) -> u64 {
    assert_eq!(ctx as usize, 0x1234);
    let Ok(dev) = Device::new(device as usize) else {
        return 0;
    };
    match cudars_core::memory::DeviceMemory::new(&dev, size) {
        Ok(m) => {
            C_LIVE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            m.into_raw()
        }
        Err(_) => 0,
    }
}

unsafe extern "C" fn c_free(
    _ctx: *mut std::ffi::c_void,
    ptr: u64,
    device: i32,
    _stream: cudars_core::sys::CUstream,
) {
    if let Ok(dev) = Device::new(device as usize) {
        // SAFETY: ptr came from c_malloc (cuMemAlloc) on this device; freed once.
        drop(unsafe { cudars_core::memory::DeviceMemory::from_raw(dev, ptr, 0x1000) });
        C_LIVE.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Allocators (direct, closure, C functions, scoped current allocator) and hooks
/// (alloc/malloc/free counts, line profile).
#[test]
fn allocators_and_hooks() {
    use cudars_mempool::allocator::{self, CFunctionAllocator, DirectAllocator, FnAllocator};
    use cudars_mempool::hooks::{self, LineProfileHook};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let _s = serial();
    let dev = dev0();
    let s = Stream::new(&dev).unwrap();
    let default_used = cudars_mempool::default_pool().unwrap().used_bytes();
    assert!(allocator::get_allocator().is_none());
    {
        let _g = allocator::using_allocator(Arc::new(DirectAllocator));
        let v = allocator::alloc_on(&s, MIB).unwrap();
        v.memset_u32(9).unwrap();
        let mut back = vec![0u32; MIB / 4];
        v.copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&x| x == 9));
        assert_eq!(
            cudars_mempool::default_pool().unwrap().used_bytes(),
            default_used,
            "the direct allocator must not use the pool"
        );
    }
    assert!(allocator::get_allocator().is_none(), "guard restores");

    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    allocator::set_allocator(Some(Arc::new(FnAllocator::new(
        move |st: &Stream, size: usize| {
            c2.fetch_add(1, Ordering::Relaxed);
            allocator::Allocator::allocate(&DirectAllocator, st, size)
        },
    ))));
    let v = allocator::alloc_on(&s, 4096).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    drop(v);
    allocator::set_allocator(None);

    // SAFETY: c_malloc/c_free are thread-safe and follow the contract.
    let c_alloc = unsafe { CFunctionAllocator::new(0x1234 as *mut _, c_malloc, c_free, None) };
    {
        let _g = allocator::using_allocator(Arc::new(c_alloc));
        let v = allocator::alloc_on(&s, 0x1000).unwrap();
        assert_eq!(C_LIVE.load(Ordering::SeqCst), 1);
        v.copy_from_host(&[1u8; 0x1000]).unwrap();
        assert_eq!(v.to_vec().unwrap(), vec![1u8; 0x1000]);
        drop(v);
        assert_eq!(C_LIVE.load(Ordering::SeqCst), 0);
    }

    let counting = Arc::new(CountingHook::default());
    let profile = Arc::new(LineProfileHook::new());
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let line;
    {
        let _g1 = hooks::install(counting.clone());
        let _g2 = hooks::install(profile.clone());
        line = line!() + 1;
        let m = pool.malloc_shared(&s, 3 * MIB).unwrap();
        assert!(
            counting.alloc.load(Ordering::Relaxed) >= 1,
            "backend alloc hooks"
        );
        assert_eq!(counting.malloc.load(Ordering::Relaxed), 1);
        drop(m);
        assert_eq!(counting.free.load(Ordering::Relaxed), 1);
        let _d = hooks::install(Arc::new(hooks::DebugHook));
        drop(pool.malloc_shared(&s, 512).unwrap());
    }
    drop(pool.malloc_shared(&s, 512).unwrap()); // no hooks any more
    assert_eq!(counting.malloc.load(Ordering::Relaxed), 2);
    let report = profile.report();
    assert_eq!(report[0].bytes, 3 * MIB as u64);
    assert_eq!(report[0].line, line);
    assert!(report[0].file.ends_with("gpu_mempool.rs"));
    cudars_mempool::default_pool()
        .unwrap()
        .free_all_blocks()
        .unwrap();
}
