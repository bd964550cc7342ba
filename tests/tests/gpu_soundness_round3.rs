//! GPU: soundness, round 3 (issue #47): one regression test for each hole found in what the
//! second round added, and one for each rule that held on driver 580 only by luck, now made
//! to hold by design.
//!
//! | test | hole |
//! | --- | --- |
//! | `an_edited_header_changes_the_kernel_that_runs` | the compile cache returned the image of an old header (`-I` hashed as a string) |
//! | `a_planted_cache_entry_is_never_loaded` | a disk cache entry anyone could write went to the driver's loader |
//! | `a_shared_mapping_dropped_during_another_threads_capture_outlives_its_kernel` | `SharedMapping::drop` ignored a failed device synchronisation and unmapped under a running kernel |
//! | `device_memory_dropped_during_a_capture_is_freed_after_it` | `cuMemFree` during a capture relied on an implicit wait a capture forbids |
//! | `stream_ordered_memory_dropped_during_its_streams_capture_is_freed_after_it` | `cuMemFreeAsync` on a capturing stream became a node of the graph |
//! | `a_graph_host_node_that_drops_memory_releases_it_off_the_driver_thread` | a host node's closure freed memory inside the host function |
//! | `a_host_function_completion_wakes_the_task_off_the_driver_thread` | the completion's host function ran the executor's waker on the driver's thread |
//!
//! (The recording pool's hole, item 4, is `a_recording_pool_does_not_synchronise_the_device_during_a_capture`
//! in `gpu_pool_lifecycle.rs`, beside the test it extends.)
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cudars_core::async_pool::{MemPool, StreamOrderedMemory};
use cudars_core::completion::WakeStrategy;
use cudars_core::graph::{self as core_graph, CaptureMode};
use cudars_core::ipc::SharedMapping;
use cudars_core::kernels::Kernels;
use cudars_core::memory::{DeviceMemory, DevicePtr};
use cudars_core::{release, Device, LaunchConfig, Stream};
use cudars_graph::GraphBuilder;
use cudars_rtc::{Cache, Origin, Output, Program};
use sha2::{Digest, Sha256};
use workspace_tests::gpu::{dev0, serial};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudars-round3-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read_u32(view: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; view.len() / 4];
    view.copy_to_host(&mut host).unwrap();
    host
}

/// `k(out)` writes `VALUE` to `out[0]`, where the value comes from `value.h` on disk.
const FROM_HEADER: &str = r#"
    #include "value.h"
    extern "C" __global__ void k(unsigned int* out) { out[0] = VALUE; }
"#;

/// Compiles `source` with `-I include` through `cache`, loads it, runs `k` once, and
/// returns what it wrote and where the image came from.
fn run_k(dev: &Device, source: &str, include: &Path, cache: &Cache) -> (u32, Origin) {
    let compiled = Program::new(source)
        .include_path(include)
        .device(dev)
        .unwrap()
        .output(Output::Cubin)
        .cache(cache)
        .compile()
        .unwrap();
    let kernel = compiled.load(dev).unwrap().kernel("k").unwrap();
    let out = DevicePtr::alloc(dev, 4).unwrap();
    out.memset_u32(0).unwrap();
    let stream = Stream::new(dev).unwrap();
    // SAFETY: k writes out[0] only, and `out` holds one u32.
    unsafe {
        kernel
            .launch(&stream, &LaunchConfig::new((1, 1, 1), (1, 1, 1)), (&out,))
            .unwrap()
    };
    stream.synchronize().unwrap();
    (read_u32(&out)[0], compiled.origin())
}

/// Item 1: the header a kernel includes from disk changes between two compiles of the same
/// program. The old key hashed the option `-I<dir>`, not the files: the memory cache (and a
/// later process's disk cache) returned the old image, and the old kernel ran.
#[test]
fn an_edited_header_changes_the_kernel_that_runs() {
    let _s = serial();
    let dev = dev0();
    let root = temp_dir("header");
    let include = root.join("include");
    std::fs::create_dir_all(&include).unwrap();
    let cache = Cache::in_dir(root.join("cache"));
    std::fs::write(include.join("value.h"), "#define VALUE 1111u\n").unwrap();
    let (first, origin) = run_k(&dev, FROM_HEADER, &include, &cache);
    println!("value.h says 1111: the kernel wrote {first} ({origin:?})");
    assert_eq!(first, 1111);
    std::fs::write(include.join("value.h"), "#define VALUE 2222u\n").unwrap();
    let (second, origin) = run_k(&dev, FROM_HEADER, &include, &cache);
    println!("value.h says 2222: the kernel wrote {second} ({origin:?})");
    assert_eq!(second, 2222, "a stale kernel ran (served from {origin:?})");
    // A later process (a fresh cache over the same directory) with the header changed again.
    std::fs::write(include.join("value.h"), "#define VALUE 3333u\n").unwrap();
    let later = Cache::in_dir(root.join("cache"));
    let (third, origin) = run_k(&dev, FROM_HEADER, &include, &later);
    println!("value.h says 3333, a fresh cache: the kernel wrote {third} ({origin:?})");
    assert_eq!(third, 3333, "a stale kernel ran (served from {origin:?})");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The bytes of a disk cache entry (the format `cudars_rtc::cache` documents), written by
/// hand as an attacker would.
fn entry_bytes(key: &[u8; 32], arch: (u32, u32), image: &[u8]) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    }
    let mut payload = vec![1u8]; // a cubin
    payload.extend_from_slice(&arch.0.to_le_bytes());
    payload.extend_from_slice(&arch.1.to_le_bytes());
    payload.push(0);
    put(&mut payload, image);
    put(&mut payload, b"");
    payload.extend_from_slice(&0u32.to_le_bytes());
    let mut out = b"CUDARTC\0".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// Item 3: someone who may write the cache directory's files plants an entry under the key
/// of a program, with a valid checksum and another image (here a harmless other kernel; a
/// crafted one crashed the loader). The old cache loaded whatever the file held; the new one
/// loads only files of this user that no one else may write, and compiles again.
#[test]
fn a_planted_cache_entry_is_never_loaded() {
    use std::os::unix::fs::PermissionsExt as _;
    let _s = serial();
    let dev = dev0();
    let root = temp_dir("planted");
    let include = root.join("include");
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("value.h"), "#define VALUE 7u\n").unwrap();
    let dir = root.join("cache");
    // The intruder's image: the same kernel writing 666.
    let intruder = Program::new("extern \"C\" __global__ void k(unsigned int* o) { o[0] = 666u; }")
        .device(&dev)
        .unwrap()
        .no_cache()
        .compile()
        .unwrap();
    let (cc_major, cc_minor) = dev.compute_capability().unwrap();
    let program = Program::new(FROM_HEADER)
        .include_path(&include)
        .device(&dev)
        .unwrap();
    let compiler = cudars_rtc::Compiler::global().unwrap();
    let key = program
        .cache_key(compiler)
        .unwrap()
        .expect("the program is cacheable");
    let planted = entry_bytes(&key.0, (cc_major, cc_minor), intruder.image());
    type MakeForeign = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, MakeForeign)> = vec![(
        "a world-writable entry",
        Box::new(|p: &Path| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).unwrap()
        }),
    )];
    // Only root can give a file to another user.
    let mut cases = cases;
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        cases.push((
            "an entry owned by another user",
            Box::new(|p: &Path| {
                std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
            }),
        ));
    }
    for (what, make_foreign) in cases {
        let _ = std::fs::remove_dir_all(&dir);
        // The directory as this user's cache makes it (0700).
        Cache::in_dir(&dir)
            .entry_path(&key)
            .map(|p| std::fs::create_dir_all(p.parent().unwrap()))
            .unwrap()
            .unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = Cache::in_dir(&dir).entry_path(&key).unwrap();
        std::fs::write(&path, &planted).unwrap();
        make_foreign(&path);
        let cache = Cache::in_dir(&dir);
        let (value, origin) = run_k(&dev, FROM_HEADER, &include, &cache);
        println!(
            "{what}: the kernel wrote {value} ({origin:?}; untrusted entries seen: {})",
            cache.stats().untrusted
        );
        assert_eq!(value, 7, "{what}: the planted image ran");
        assert_eq!(origin, Origin::Compiled);
        assert_eq!(cache.stats().untrusted, 1, "{what}");
    }
    // The entry the cache wrote itself (this user's, private) is loaded from disk by a later
    // process: the checks refuse only what another user could have written.
    let later = Cache::in_dir(&dir);
    let (value, origin) = run_k(&dev, FROM_HEADER, &include, &later);
    assert_eq!((value, origin), (7, Origin::Disk));
    assert_eq!(later.stats().untrusted, 0);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Item 2: a kernel still writes a `SharedMapping` when its last view is dropped, while
/// another thread holds a capture open. `cuCtxSynchronize` fails during any capture of the
/// context; the old drop ignored that and unmapped at once, and the kernel faulted with
/// `CUDA_ERROR_ILLEGAL_ADDRESS` (the context was lost). Now the unmap waits until the
/// captures end (the release thread makes it then).
#[test]
fn a_shared_mapping_dropped_during_another_threads_capture_outlives_its_kernel() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    // Allocated before the capture: a capture in global mode refuses cuMemAlloc and
    // cuMemCreate on every thread.
    let mapping = SharedMapping::new(&dev, 8 << 20).unwrap().into_ptr();
    let check = DevicePtr::alloc(&dev, 4).unwrap();
    let (capturing_tx, capturing_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let capturer = std::thread::spawn(move || {
        let dev = dev0();
        let cap = Stream::builder(&dev).non_blocking(true).build().unwrap();
        // SAFETY: nothing is captured; the capture is ended below.
        unsafe { core_graph::begin_capture(&cap, CaptureMode::Global) }.unwrap();
        capturing_tx.send(()).unwrap();
        let _ = end_rx.recv_timeout(Duration::from_secs(30));
        core_graph::end_capture(&cap).map(|_| ())
    });
    capturing_rx.recv().unwrap();
    // A slow writer (about half a second), then the last view is dropped under it.
    k.fill_after_spin(
        &stream,
        &mapping,
        0x5A5A_5A5A,
        k.cycles_for(Duration::from_millis(500)),
    )
    .unwrap();
    drop(mapping);
    let deferred = release::deferred_count();
    println!("dropped under the kernel during the capture: {deferred} release(s) deferred");
    std::thread::sleep(Duration::from_millis(100));
    end_tx.send(()).unwrap();
    let ended = capturer.join().unwrap();
    let synced = stream.synchronize();
    println!("the kernel's stream after the capture ended: {synced:?}; capture: {ended:?}");
    synced.expect("the kernel faulted: its memory was unmapped under it");
    ended.expect("the capture was invalidated");
    assert!(
        deferred >= 1,
        "the unmap was not deferred during the capture"
    );
    // The mapping is released once the capture has ended.
    let start = Instant::now();
    while release::deferred_count() != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(release::deferred_count(), 0, "never released");
    // The context works on.
    k.fill(&stream, &check, 3).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(read_u32(&check), vec![3]);
}

/// Design (a): `cuMemFree` waits for the device's work only implicitly, a wait a capture
/// forbids. While a capture begun through this crate runs, plain device memory (and managed
/// and pinned memory) is freed after it instead, and the kernel still writing it finishes
/// untouched.
#[test]
fn device_memory_dropped_during_a_capture_is_freed_after_it() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let cap = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let (free_before, _) = dev.memory_info().unwrap();
    let mem = DeviceMemory::new(&dev, 64 << 20).unwrap().into_ptr();
    k.fill_after_spin(&stream, &mem, 9, k.cycles_for(Duration::from_millis(300)))
        .unwrap();
    // SAFETY: nothing is captured; the capture is ended below.
    unsafe { core_graph::begin_capture(&cap, CaptureMode::ThreadLocal) }.unwrap();
    drop(mem);
    let deferred = release::deferred_count();
    let graph = core_graph::end_capture(&cap);
    println!("dropped during a capture: {deferred} release(s) deferred; capture: {graph:?}");
    graph.expect("the capture was invalidated");
    stream.synchronize().expect("the kernel faulted");
    assert!(deferred >= 1, "cuMemFree was called during the capture");
    let start = Instant::now();
    while release::deferred_count() != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(release::deferred_count(), 0, "never freed");
    let (free_after, _) = dev.memory_info().unwrap();
    assert!(
        free_after + (16 << 20) >= free_before,
        "the memory did not come back: {} MiB free before, {} MiB after",
        free_before >> 20,
        free_after >> 20
    );
}

/// Design (b): stream-ordered memory dropped while its own stream is being captured. The old
/// drop called `cuMemFreeAsync` there, which the driver recorded as a free node of the graph
/// (a free of eager memory at every replay) instead of freeing. Now nothing enters the graph
/// and the memory is freed on its stream once the capture has ended.
#[test]
fn stream_ordered_memory_dropped_during_its_streams_capture_is_freed_after_it() {
    let _s = serial();
    let dev = dev0();
    let stream = Arc::new(Stream::builder(&dev).non_blocking(true).build().unwrap());
    let pool = MemPool::current(&dev).unwrap();
    stream.synchronize().unwrap();
    let used_before = pool.used_current().unwrap();
    let mem = DevicePtr::new(StreamOrderedMemory::new(64 << 20, &stream).unwrap());
    mem.memset_u32_async(1, &stream).unwrap();
    stream.synchronize().unwrap();
    let used_during = pool.used_current().unwrap();
    // SAFETY: nothing but the drop happens during the capture; it is ended below.
    unsafe { core_graph::begin_capture(&stream, CaptureMode::ThreadLocal) }.unwrap();
    drop(mem);
    let graph = core_graph::end_capture(&stream).expect("the capture was invalidated");
    let nodes = graph.node_count().unwrap();
    println!("the graph of a capture during which the memory was dropped has {nodes} node(s)");
    assert_eq!(nodes, 0, "the free was recorded into the graph");
    let start = Instant::now();
    while release::deferred_count() != 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(release::deferred_count(), 0, "never freed");
    stream.synchronize().unwrap();
    let used_after = pool.used_current().unwrap();
    println!(
        "the driver pool's used bytes: {used_before} before, {used_during} while allocated, \
         {used_after} after the capture ended"
    );
    assert_eq!(
        used_after, used_before,
        "the memory was never freed (leaked)"
    );
}

/// Design (c), host nodes: a graph host node's closure takes the last view of device memory
/// out of what it captured and drops it inside the host function, where CUDA calls are
/// forbidden (the old drop called `cuMemFree` there). The release goes to the release
/// thread; the graph, the stream and the memory level are fine afterwards.
#[test]
fn a_graph_host_node_that_drops_memory_releases_it_off_the_driver_thread() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let (free_before, _) = dev.memory_info().unwrap();
    let slot = Arc::new(Mutex::new(Some(
        DeviceMemory::new(&dev, 64 << 20).unwrap().into_ptr(),
    )));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut g = GraphBuilder::new(&dev).unwrap();
    {
        let (slot, ran) = (Arc::clone(&slot), Arc::clone(&ran));
        g.add_host(&[], move || {
            // The last view, dropped here: inside the host function.
            drop(slot.lock().unwrap().take());
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let exec = g.finish().unwrap().instantiate().unwrap();
    exec.launch(&stream).unwrap();
    let done = stream.completion().unwrap();
    let start = Instant::now();
    let outcome = block_on_timeout(done, Duration::from_secs(20));
    println!(
        "graph with a host node that drops 64 MiB: {:?} after {:?}",
        outcome,
        start.elapsed()
    );
    outcome
        .expect("the stream did not finish (a CUDA call inside the host function?)")
        .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let start = Instant::now();
    loop {
        let (free_now, _) = dev.memory_info().unwrap();
        if free_now + (16 << 20) >= free_before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the memory was not freed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
}

/// A waker that notes the name of the thread it runs on.
struct NamingWaker(Mutex<Vec<String>>);

impl Wake for NamingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let name = std::thread::current()
            .name()
            .unwrap_or("(unnamed)")
            .to_owned();
        self.0.lock().unwrap().push(name);
    }
}

/// Design (c), futures: with `WakeStrategy::HostFunction` the old host function called the
/// task's waker itself, executor code on the driver's thread (a waker may poll the task
/// inline, and the task may call CUDA). Now the host function only signals, and the reactor
/// wakes the task on its own thread.
#[test]
fn a_host_function_completion_wakes_the_task_off_the_driver_thread() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    k.spin(&stream, k.cycles_for(Duration::from_millis(50)))
        .unwrap();
    let mut done = Box::pin(stream.completion_with(WakeStrategy::HostFunction).unwrap());
    let waker_state = Arc::new(NamingWaker(Mutex::new(Vec::new())));
    let waker = Waker::from(Arc::clone(&waker_state));
    let mut cx = Context::from_waker(&waker);
    assert!(done.as_mut().poll(&mut cx).is_pending());
    let start = Instant::now();
    while waker_state.0.lock().unwrap().is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let woken_on = waker_state.0.lock().unwrap().clone();
    println!("the task was woken on: {woken_on:?}");
    assert_eq!(woken_on, vec!["cuda-core-reactor".to_string()]);
    assert!(matches!(done.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
}

/// Polls `fut` on this thread until it is ready or `limit` passes.
fn block_on_timeout<F: std::future::Future>(fut: F, limit: Duration) -> Option<F::Output> {
    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = Arc::new(Flag(std::sync::atomic::AtomicBool::new(true)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let mut fut = Box::pin(fut);
    let start = Instant::now();
    while start.elapsed() < limit {
        if flag.0.swap(false, Ordering::SeqCst) {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return Some(v);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}
