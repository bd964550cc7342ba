//! GPU: the pool with streams that come and go, graph captures (private pools), and the
//! soundness fixes of issue 26, on the real card:
//!
//! * a capture that allocates, frees and re-allocates inside it, replayed 1,000 times on
//!   random data against the same computation on the host, and the memory back after the
//!   graph is gone;
//! * 100,000 streams created, used and destroyed: device memory, shards and address space
//!   stay flat;
//! * a kernel still writing a block on a stream that is then destroyed: the block is not
//!   handed out before the kernel is done;
//! * a view's memset on a second stream, then a drop: the block is not reused before the
//!   memset (the owner's record_stream hook);
//! * a graph whose captured buffer is dropped before replay keeps it alive;
//! * the per-thread default stream gets a cache per thread (stream-ordered memory refuses it);
//! * out of memory recovers what a collector freed for another thread's per-thread stream.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudars_core::async_pool::StreamOrderedMemory;
use cudars_core::graph::{self as core_graph, CaptureMode};
use cudars_core::memory::{raw, DevicePtr};
use cudars_core::{Device, Stream};
use cudars_mempool::driver::device_id;
use cudars_mempool::history::{Clock, Recorder};
use cudars_mempool::{Backend, DevicePool, DriverBackend, Limit, MemoryPool, PoolError};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

const MIB: usize = 1 << 20;
/// About 0.1 s of SM clocks.
const SLOW: u64 = 200_000_000;

fn read_u32(ptr: u64, n: usize) -> Vec<u32> {
    let mut host = vec![0u32; n];
    // SAFETY: `ptr` addresses `n` u32s of live device memory; the legacy-stream copy waits
    // for the blocking streams' work (callers synchronise the others).
    unsafe { raw::copy_dtoh(&dev0(), host.as_mut_ptr().cast(), ptr, n * 4) }.expect("copy");
    host
}

fn write_u32(ptr: u64, data: &[u32]) {
    // SAFETY: `ptr` addresses `data.len()` u32s of live device memory.
    unsafe { raw::copy_htod(&dev0(), ptr, data.as_ptr().cast(), data.len() * 4) }.expect("copy");
}

/// xorshift64*: random test data without a dependency.
fn random_u32s(seed: &mut u64, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed >> 12;
            *seed ^= *seed << 25;
            *seed ^= *seed >> 27;
            (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
        })
        .collect()
}

/// Issue 18: a capture that allocates, frees and allocates again inside the capture through
/// cuda-graph; 1,000 replays on random data agree with the host; the private pool's memory
/// goes back once the graph and its executable are gone.
#[test]
fn capture_with_private_pool_replays_correctly_and_returns_its_memory() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let s = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let pool = DevicePool::new_driver().unwrap();
    let id = device_id(&dev);
    let n = 256 * 1024;
    let bytes = n * 4;
    let input = DevicePtr::alloc(&dev, bytes).unwrap();
    let output = DevicePtr::alloc(&dev, bytes).unwrap();
    let baseline = pool.stats(id).unwrap().reserved.current;
    let mut addrs = Vec::new();
    let graph = cudars_graph::capture(&s, CaptureMode::ThreadLocal, |_c| {
        // t1 = input + 1
        let t1 = pool.malloc_stream(&s, bytes).expect("malloc in capture");
        addrs.push(t1.ptr().0);
        t1_from(&s, &input, t1.ptr().0, bytes)?;
        // SAFETY: t1 is n u32s of private-pool memory, kept until the graph is gone.
        unsafe { k.add_u32_raw(&s, t1.ptr().0, 1, n as u64) }?;
        // t2 = t1 + 2
        let t2 = pool.malloc_stream(&s, bytes).expect("malloc in capture");
        addrs.push(t2.ptr().0);
        t1_from_raw(&s, t2.ptr().0, t1.ptr().0, bytes)?;
        // SAFETY: as above.
        unsafe { k.add_u32_raw(&s, t2.ptr().0, 2, n as u64) }?;
        drop(t1); // freed inside the capture...
        let t3 = pool.malloc_stream(&s, bytes).expect("malloc in capture"); // ...and reused by it, in capture order
        addrs.push(t3.ptr().0);
        t1_from_raw(&s, t3.ptr().0, t2.ptr().0, bytes)?;
        // SAFETY: as above.
        unsafe { k.add_u32_raw(&s, t3.ptr().0, 3, n as u64) }?;
        output.copy_from_device_async(
            &DevicePtr::from_arc(Arc::new(Borrowed(t3.ptr().0, bytes, dev))),
            &s,
        )?;
        Ok(())
    })
    .expect("capture");
    assert_eq!(
        addrs[2], addrs[0],
        "a block freed in the capture is reused by it"
    );
    let st = pool.stats(id).unwrap();
    assert_eq!(st.private_pools, 1, "{st:?}");
    let exec = graph.instantiate().unwrap();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut checked = 0;
    for replay in 0..1000 {
        let data = random_u32s(&mut seed, n);
        s.synchronize().unwrap();
        write_u32(input.as_raw(), &data);
        // A synchronous copy from pageable memory may return before its DMA lands; `s` is
        // non-blocking, so order it explicitly (issue 25's point).
        Stream::null(&dev).synchronize().unwrap();
        exec.launch(&s).unwrap();
        if replay % 50 == 0 || replay == 999 {
            s.synchronize().unwrap();
            let out = read_u32(output.as_raw(), n);
            let bad = out
                .iter()
                .zip(&data)
                .filter(|(o, d)| **o != d.wrapping_add(6))
                .count();
            assert_eq!(
                bad, 0,
                "replay {replay}: {bad} of {n} elements differ from the host"
            );
            checked += 1;
        }
    }
    s.synchronize().unwrap();
    println!("capture_with_private_pool: 1000 replays, {checked} checked against the host");
    drop(exec);
    drop(graph);
    // The graph's release reaches the pool asynchronously (a user object's destructor).
    let start = Instant::now();
    loop {
        pool.free_all_blocks().unwrap();
        let st = pool.stats(id).unwrap();
        if st.private_pools == 0 && st.reserved.current <= baseline {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the private pool was not released after the graph was dropped: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A non-owning view of device memory the test keeps alive itself.
struct Borrowed(u64, usize, Device);

// SAFETY: the tests keep the range allocated (a private pool's block, alive until the graph
// is gone) for as long as the view and the graph use it; cuMemFree is never involved.
unsafe impl cudars_core::memory::DeviceAlloc for Borrowed {
    fn device(&self) -> Device {
        self.2
    }
    fn as_raw(&self) -> u64 {
        self.0
    }
    fn size(&self) -> usize {
        self.1
    }
}

fn t1_from(s: &Stream, src: &DevicePtr, dst: u64, bytes: usize) -> cudars_graph::Result<()> {
    // SAFETY: both ranges are live device memory of the stream's device, `bytes` long.
    unsafe { raw::copy_dtod_async(&s.device(), dst, src.as_raw(), bytes, s) }?;
    Ok(())
}

fn t1_from_raw(s: &Stream, dst: u64, src: u64, bytes: usize) -> cudars_graph::Result<()> {
    // SAFETY: both ranges are live private-pool memory, `bytes` long.
    unsafe { raw::copy_dtod_async(&s.device(), dst, src, bytes, s) }?;
    Ok(())
}

/// Issues 18 and 22: a server that makes a stream per request. 100,000 streams, each
/// allocating and freeing, then destroyed: memory, shards and address space stay flat.
#[test]
fn one_hundred_thousand_short_lived_streams_stay_flat() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let pool = DevicePool::new_driver().unwrap();
    let id = device_id(&dev);
    let (free_start, _) = dev.memory_info().unwrap();
    let mut worst_free = free_start;
    let mut worst = pool.stats(id).unwrap();
    // CUDA_RS_STREAMS shortens the loop where each driver call is slow (compute-sanitizer).
    let streams: u32 = std::env::var("CUDA_RS_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let every = (streams / 10).max(1);
    for i in 0..streams {
        let s = Stream::builder(&dev).non_blocking(true).build().unwrap();
        let a = pool.malloc_stream(&s, 3 * MIB).unwrap();
        let b = pool.malloc_stream(&s, 4096).unwrap();
        // SAFETY: a holds 3 MiB, freed on `s` after the kernel in stream order.
        unsafe { k.fill_u32_raw(&s, a.ptr().0, i, 1024) }.unwrap();
        drop((a, b));
        drop(s);
        if i % every == every - 1 {
            let (free, _) = dev.memory_info().unwrap();
            let st = pool.stats(id).unwrap();
            println!(
                "streams {:>6}: device free {:>6} MiB, pool reserved {:>5} MiB, shards {:>3}, attached {:>2}, address space {:>6} GiB",
                i + 1,
                free >> 20,
                st.reserved.current >> 20,
                st.shards,
                st.attached_streams,
                st.address_space >> 30
            );
            worst_free = worst_free.min(free);
            if st.shards > worst.shards {
                worst = st;
            }
        }
    }
    let st = pool.stats(id).unwrap();
    assert!(
        st.shards <= cudars_mempool::policy::ADOPT_BUSY_SHARDS_ABOVE as u64 + 2,
        "shards grow with streams: {st:?}"
    );
    assert!(st.attached_streams <= 2, "streams kept: {st:?}");
    assert!(
        free_start - worst_free < 2 << 30,
        "device memory fell by {} MiB",
        (free_start - worst_free) >> 20
    );
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.stats(id).unwrap().reserved.current, 0);
}

/// Issue 18: a kernel still writes a block on a stream that is then destroyed; the block
/// is not handed to another stream before the kernel is done (the limit leaves no room for
/// fresh memory, so the pool must reuse exactly that memory).
#[test]
fn a_block_of_a_destroyed_stream_is_not_reused_before_its_kernel_ends() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let pool = DevicePool::new_driver().unwrap();
    let size = 8 * MIB;
    pool.set_limit(device_id(&dev), Limit::Bytes(size)).unwrap();
    let n = size / 4;
    let a = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let x = pool.malloc_stream(&a, size).unwrap();
    // SAFETY: x holds n u32s, freed in stream order after the kernel.
    unsafe { k.spin_then_fill_raw(&a, x.ptr().0, 0xAAAA_AAAA, n as u64, SLOW) }.unwrap();
    drop(x);
    drop(a); // the user destroys the stream while its kernel runs
    let b = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let y = pool.malloc_stream(&b, size).unwrap();
    // SAFETY: y holds n u32s, alive until after the read.
    unsafe { k.fill_u32_raw(&b, y.ptr().0, 0xBBBB_BBBB, n as u64) }.unwrap();
    b.synchronize().unwrap();
    dev.synchronize().unwrap();
    let host = read_u32(y.ptr().0, n);
    let bad = host.iter().filter(|&&v| v != 0xBBBB_BBBB).count();
    assert_eq!(
        bad, 0,
        "{bad} words of the new block were overwritten by the old kernel"
    );
}

/// Out of memory with the memory freed for another thread's per-thread default stream: that
/// thread fills the pool's limit on `Stream::per_thread` and starts a slow kernel on each
/// block; a collector thread frees them (it cannot record a fence on the other thread's
/// stream, and that thread keeps its stream); a request on a third stream that needs that
/// memory is served once a device synchronisation covers the frees, and holds its own data
/// after everything (the old kernels wrote first). It failed with out of memory, 0 bytes in
/// use, before.
#[test]
fn out_of_memory_recovers_blocks_freed_for_another_threads_per_thread_stream() {
    collector_out_of_memory(false);
}

/// The same while this thread captures another stream: the recovery must not synchronise the
/// device (`cuCtxSynchronize` fails during any capture and invalidates it), so the request
/// fails with out of memory, the capture ends valid, and once it has ended the request is
/// served, after the other thread's kernels.
#[test]
fn out_of_memory_does_not_synchronise_the_device_during_a_capture() {
    collector_out_of_memory(true);
}

/// Soundness round 3, item 4: the same through a pool that records its history. The old
/// wrapper that recorded (`RecordingBackend`, over the driver backend) left
/// `may_synchronize_device` to the trait's default (`true`), so the recovery synchronised
/// the device during the capture and invalidated it (`end_capture` failed with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`). Recording now goes through the pool's one
/// observation seam, which forwards every method it does not observe.
#[test]
fn a_recording_pool_does_not_synchronise_the_device_during_a_capture() {
    let _s = serial();
    let recorder = Arc::new(Recorder::new(1 << 16, Clock::Real));
    let pool = MemoryPool::new(DriverBackend::new().unwrap()).unwrap();
    pool.start_history(Arc::clone(&recorder));
    collector_out_of_memory_on(&pool, true);
    assert!(
        !recorder.history().events.is_empty(),
        "the pool recorded its history meanwhile"
    );
}

fn collector_out_of_memory(during_capture: bool) {
    let _s = serial();
    let pool = DevicePool::new_driver().unwrap();
    collector_out_of_memory_on(&pool, during_capture);
}

fn collector_out_of_memory_on<B>(pool: &MemoryPool<B>, during_capture: bool)
where
    B: Backend<Stream = Stream>,
{
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let id = device_id(&dev);
    let size = 8 * MIB;
    pool.set_limit(id, Limit::Bytes(2 * size)).unwrap();
    let n = size / 4;
    let (blocks_tx, blocks_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|sc| {
        // Dropped however this closure ends: the other thread never waits forever.
        let done_tx = done_tx;
        let k = &k;
        sc.spawn(move || {
            let ptds = Stream::per_thread(&dev);
            let blocks: Vec<_> = (0..2)
                .map(|_| pool.malloc(id, &ptds, size).unwrap().into_raw())
                .collect();
            for b in &blocks {
                // SAFETY: b holds n u32s, freed (by the collector) after this launch.
                unsafe { k.spin_then_fill_raw(&ptds, b.ptr().0, 0xAAAA_AAAA, n as u64, SLOW) }
                    .unwrap();
            }
            for b in blocks {
                blocks_tx.send(b).unwrap();
            }
            drop(blocks_tx);
            // Alive, its stream attached, until the request below is done.
            let _ = done_rx.recv();
        });
        for b in blocks_rx {
            pool.free_raw(b).unwrap();
        }
        let s = Stream::builder(&dev).non_blocking(true).build().unwrap();
        if during_capture {
            let cap = Stream::builder(&dev).non_blocking(true).build().unwrap();
            // SAFETY: nothing is captured; the capture is ended below.
            unsafe { core_graph::begin_capture(&cap, CaptureMode::ThreadLocal) }.unwrap();
            let refused = pool.malloc(id, &s, 2 * size);
            let ended = core_graph::end_capture(&cap);
            assert!(
                matches!(refused, Err(PoolError::OutOfMemory { .. })),
                "during the capture: {refused:?}"
            );
            let graph = ended.expect("the capture was not invalidated by the pool");
            assert_eq!(graph.node_count().unwrap(), 0);
        }
        let y = pool
            .malloc(id, &s, 2 * size)
            .expect("the memory freed for the other thread's stream is recovered");
        // SAFETY: y holds 2n u32s, alive until after the read.
        unsafe { k.fill_u32_raw(&s, y.ptr().0, 0xBBBB_BBBB, 2 * n as u64) }.unwrap();
        s.synchronize().unwrap();
        dev.synchronize().unwrap();
        let host = read_u32(y.ptr().0, 2 * n);
        let bad = host.iter().filter(|&&v| v != 0xBBBB_BBBB).count();
        assert_eq!(
            bad, 0,
            "{bad} words of the new block were overwritten by the other thread's kernels"
        );
        drop(y);
        drop(done_tx);
    });
}

/// Issues 26 (item 4) and 25: a view of pool memory used by a memset on a second stream,
/// then dropped: the block is not reused on its own stream before the memset has run.
#[test]
fn a_view_used_on_another_stream_is_not_reused_before_that_work_ends() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let size = 8 * MIB;
    pool.set_limit(device_id(&dev), Limit::Bytes(size)).unwrap();
    let n = size / 4;
    let s1 = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let s2 = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let v: DevicePtr = pool.malloc_shared(&s1, size).unwrap().into();
    k.spin(&s2, SLOW).unwrap();
    v.memset_u32_async(0xDEAD_DEAD, &s2).unwrap(); // marks s2 on the block
    drop(v);
    let w = pool.malloc_stream(&s1, size).unwrap();
    // SAFETY: w holds n u32s, alive until after the read.
    unsafe { k.fill_u32_raw(&s1, w.ptr().0, 0xBBBB_BBBB, n as u64) }.unwrap();
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    let host = read_u32(w.ptr().0, n);
    let bad = host.iter().filter(|&&v| v != 0xBBBB_BBBB).count();
    assert_eq!(
        bad, 0,
        "{bad} words were overwritten by the other stream's memset"
    );
    // The same through an explicit record_stream on the view (a kernel launch the view
    // cannot see).
    drop(w);
    let v: DevicePtr = pool.malloc_shared(&s1, size).unwrap().into();
    let issue = s2.issue(v.device()).unwrap();
    v.record_stream(&issue).unwrap();
    // SAFETY: v holds n u32s; the owner waits for s2 before any reuse.
    unsafe { k.spin_then_fill_raw(&s2, v.as_raw(), 0xDEAD_DEAD, n as u64, SLOW) }.unwrap();
    drop(issue);
    drop(v);
    let w = pool.malloc_stream(&s1, size).unwrap();
    // SAFETY: as above.
    unsafe { k.fill_u32_raw(&s1, w.ptr().0, 0xCCCC_CCCC, n as u64) }.unwrap();
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    let host = read_u32(w.ptr().0, n);
    let bad = host.iter().filter(|&&v| v != 0xCCCC_CCCC).count();
    assert_eq!(
        bad, 0,
        "{bad} words overwritten after an explicit record_stream"
    );
}

/// Issue 26 (item 2): a graph keeps alive the memory its captured view operations use.
#[test]
fn a_graph_keeps_its_captured_buffer_alive() {
    let _s = serial();
    let dev = dev0();
    let s = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let a = DevicePtr::alloc(&dev, 1 << 20).unwrap();
    let graph = cudars_graph::capture(&s, CaptureMode::ThreadLocal, |_c| {
        a.memset_u32_async(0x1234_5678, &s)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        Arc::strong_count(a.owner()),
        2,
        "the graph holds the buffer"
    );
    let exec = graph.instantiate().unwrap();
    let owner = Arc::downgrade(a.owner());
    drop(a);
    drop(graph);
    assert!(
        owner.upgrade().is_some(),
        "the executable graph still holds it"
    );
    // Fresh memory of the same size, which a freed `a` could have become.
    let b = DevicePtr::alloc(&dev, 1 << 20).unwrap();
    b.memset_u32(0).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    let host = read_u32(b.as_raw(), (1 << 20) / 4);
    assert!(
        host.iter().all(|&v| v == 0),
        "the replay wrote someone else's memory"
    );
    drop(exec);
    assert!(owner.upgrade().is_none(), "released with the last graph");
}

/// Issue 26 (item 3), and "Reused pool memory is safe for every use" (item 3): the per-thread
/// default stream names a different stream on every thread. The pool serves it with a cache
/// per thread; stream-ordered memory still refuses it, and so does marking another stream's
/// block with it (that block's free, on any thread, would need a fence on it).
#[test]
fn the_per_thread_stream_gets_a_cache_per_thread() {
    let _s = serial();
    let dev = dev0();
    let pool = DevicePool::new_driver().unwrap();
    let ptds = Stream::per_thread(&dev);
    let a = pool.malloc_stream(&ptds, 4096).unwrap();
    let key = a.stream();
    let other = std::thread::scope(|s| {
        s.spawn(|| {
            let b = pool.malloc_stream(&Stream::per_thread(&dev), 4096).unwrap();
            b.stream()
        })
        .join()
        .unwrap()
    });
    assert_ne!(
        key, other,
        "each thread's per-thread stream has its own key"
    );
    assert!(StreamOrderedMemory::new(4096, &Arc::new(ptds.clone())).is_err());
    let created = Stream::new(&dev).unwrap();
    let c = pool.malloc_stream(&created, 4096).unwrap();
    assert!(matches!(
        c.record_stream(&ptds),
        Err(PoolError::PerThreadStream)
    ));
    a.record_stream(&ptds).unwrap();
    drop((a, c));
    ptds.synchronize().unwrap();
}
