//! GPU: DLPack export and import of real device memory (`cudars-dlpack`).
//!
//! A `DeviceMemory` and a `cuda-mempool` block are exported, imported back and read: the
//! same address (zero copy), the data written on one side read on the other, the owner kept
//! until the deleter runs exactly once (also on another thread), a pool block out of reuse
//! while exported, the consumer's stream ordered after a slow producer kernel by the
//! protocol's stream argument, and 100,000 exchanges that leave memory flat. The framework
//! side (PyTorch, CuPy, JAX) is `tests/bundle/clients_dlpack.py`.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};
use cudars_dlpack::ffi::{device_type, DLDevice};
use cudars_dlpack::{
    prepare_for_consumer, ConsumerStream, Error, Expect, ExportedTensor, ImportedTensor,
    TensorSpec, TensorView,
};
use cudars_mempool::DevicePool;
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

/// About 0.1 s of SM clocks on an H200: the host runs far ahead of the producer's kernel.
const SLOW: u64 = 200_000_000;

fn strict() -> Expect {
    Expect::new().device(0).contiguous(true).mutable(true)
}

/// Hands `t` over and takes it back as a consumer would.
fn import(t: ExportedTensor) -> ImportedTensor {
    // SAFETY: a tensor just handed over by `into_raw`, owned by nobody else. Views made
    // with `ordered_on: None` come after the producer's writes are complete (synchronous
    // calls, or a synchronised stream); the others name the stream `prepare_for_consumer`
    // ordered them before.
    unsafe { ImportedTensor::from_versioned(t.into_raw()) }.unwrap()
}

fn read_u32(view: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; view.len() / 4];
    view.copy_to_host(&mut host).unwrap();
    host
}

/// The owner an export keeps, counting its drops (the deleter's runs).
struct Counted(#[allow(dead_code)] DevicePtr, Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

fn export_counted(view: &DevicePtr, spec: &TensorSpec) -> (ExportedTensor, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let device = DLDevice {
        device_type: device_type::CUDA,
        device_id: view.device().ordinal() as i32,
    };
    // SAFETY: the view's range is live device memory while the view (kept by the owner)
    // lives.
    let t = unsafe {
        ExportedTensor::from_raw_parts(
            device,
            view.as_raw(),
            view.len(),
            Counted(view.clone(), drops.clone()),
            spec,
        )
    }
    .unwrap();
    (t, drops)
}

#[test]
fn device_memory_round_trip_is_zero_copy() {
    let _s = serial();
    let dev = dev0();
    let buf = DevicePtr::alloc(&dev, 32 * 32 * 4).unwrap();
    buf.memset_u32(0x1234_5678).unwrap();
    assert_eq!(Arc::strong_count(buf.owner()), 1);
    let exported = ExportedTensor::from_view(&buf, &TensorSpec::of::<u32>([32, 32])).unwrap();
    assert_eq!(
        Arc::strong_count(buf.owner()),
        2,
        "the export keeps the allocation"
    );
    let view: TensorView<u32> = import(exported).into_view(&strict()).unwrap();
    assert_eq!(view.addr(), buf.as_raw() as u64, "zero copy: same address");
    let ptr = view.into_device_ptr(&dev, None).unwrap();
    assert_eq!(ptr.as_raw(), buf.as_raw());
    assert!(
        read_u32(&ptr).iter().all(|&x| x == 0x1234_5678),
        "producer's data seen by the consumer"
    );
    ptr.memset_u32(0x0055_aa00).unwrap();
    assert!(
        read_u32(&buf).iter().all(|&x| x == 0x0055_aa00),
        "consumer's data seen by the producer"
    );
    drop(ptr);
    assert_eq!(
        Arc::strong_count(buf.owner()),
        1,
        "the deleter released the allocation"
    );
}

#[test]
fn device_memory_owner_is_dropped_exactly_once_on_another_thread() {
    let _s = serial();
    let dev = dev0();
    let buf = DevicePtr::alloc(&dev, 4096).unwrap();
    let (t, drops) = export_counted(&buf, &TensorSpec::of::<f32>([1024]));
    let view = import(t).into_view::<f32>(&strict()).unwrap();
    let ptr = view.into_device_ptr(&dev, None).unwrap();
    ptr.memset_u32(0).unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    std::thread::spawn(move || drop(ptr)).join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // A legacy export too.
    let (t, drops) = export_counted(&buf, &TensorSpec::of::<u8>([4096]));
    // SAFETY: handed over once.
    let imported = unsafe { ImportedTensor::from_legacy(t.into_raw_legacy()) }.unwrap();
    std::thread::spawn(move || drop(imported)).join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn a_pool_block_stays_out_of_reuse_while_exported() {
    let _s = serial();
    let dev = dev0();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    const SIZE: usize = 1 << 20;
    let block: DevicePtr = pool.malloc_shared(&stream, SIZE).unwrap().into();
    let addr = block.as_raw();
    block.memset_u32_async(7, &stream).unwrap();
    let (t, drops) = export_counted(&block, &TensorSpec::of::<u32>([(SIZE / 4) as i64]));
    drop(block); // the producer lets go: only the consumer holds it now
    let consumer = import(t).into_view::<u32>(&strict()).unwrap();
    let mut others = Vec::new();
    for _ in 0..4 {
        let other: DevicePtr = pool.malloc_shared(&stream, SIZE).unwrap().into();
        assert_ne!(
            other.as_raw(),
            addr,
            "the exported block was handed out again"
        );
        others.push(other);
    }
    drop(others);
    stream.synchronize().unwrap();
    let ptr = consumer.into_device_ptr(&dev, None).unwrap();
    assert!(read_u32(&ptr).iter().all(|&x| x == 7));
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    assert!(
        pool.used_bytes() >= SIZE as u64,
        "the exported block counts as used"
    );
    drop(ptr);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert_eq!(
        pool.used_bytes(),
        0,
        "once released, the block is free in the pool"
    );
    // The five cached blocks' bytes serve five requests without growing the pool: the
    // released block is among them.
    let reserved = pool.total_bytes();
    let again: Vec<DevicePtr> = (0..5)
        .map(|_| pool.malloc_shared(&stream, SIZE).unwrap().into())
        .collect();
    assert_eq!(pool.total_bytes(), reserved, "served from the cache");
    assert!(
        again
            .iter()
            .any(|b| b.as_raw() <= addr && addr < b.as_raw() + SIZE as u64),
        "the released block is reused"
    );
}

#[test]
fn the_consumer_stream_waits_for_a_slow_producer() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let producer = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let consumer = Stream::builder(&dev).non_blocking(true).build().unwrap();
    // Read on the consumer's stream, then through a synchronous copy (legacy stream), which
    // the view's hand-over makes wait for the consumer stream's fence.
    for (owner, read) in [
        ("device memory", "consumer stream"),
        ("pool block", "consumer stream"),
        ("device memory", "synchronous copy"),
        ("pool block", "synchronous copy"),
    ] {
        let pool = Arc::new(DevicePool::new_driver().unwrap());
        let buf: DevicePtr = match owner {
            "pool block" => pool.malloc_shared(&producer, 4 << 20).unwrap().into(),
            _ => DevicePtr::alloc(&dev, 4 << 20).unwrap(),
        };
        buf.memset_u32(1).unwrap();
        k.fill_after_spin(&producer, &buf, 0xfeed_beef, SLOW)
            .unwrap();
        // What `__dlpack__(stream=consumer)` does.
        // SAFETY: `consumer` is a live stream of this device that outlives the export.
        unsafe {
            prepare_for_consumer(
                &buf,
                Some(&producer),
                ConsumerStream::of_stream(&consumer),
                None,
            )
        }
        .unwrap();
        let t =
            ExportedTensor::from_view(&buf, &TensorSpec::of::<u32>([(1 << 20) as i64])).unwrap();
        let view = import(t)
            .into_view::<u32>(&strict())
            .unwrap()
            .into_device_ptr(&dev, Some(&consumer))
            .unwrap();
        let mut host = vec![0u32; 1 << 20];
        if read == "consumer stream" {
            // SAFETY: `host` is untouched until `consumer` is synchronised below.
            unsafe { view.copy_to_host_async(&mut host, &consumer) }.unwrap();
            consumer.synchronize().unwrap();
        } else {
            view.copy_to_host(&mut host).unwrap();
        }
        let stale = host.iter().filter(|&&x| x != 0xfeed_beef).count();
        assert_eq!(
            stale, 0,
            "{owner}, {read}: read {stale} elements before the producer's kernel wrote them"
        );
        drop(view);
        producer.synchronize().unwrap();
    }
}

#[test]
fn dropping_a_consumer_view_waits_for_its_streams_before_the_deleter() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let buf = DevicePtr::alloc(&dev, 1 << 20).unwrap();
    let (t, drops) = export_counted(&buf, &TensorSpec::of::<u32>([(1 << 18) as i64]));
    let ptr = import(t)
        .into_view::<u32>(&strict())
        .unwrap()
        .into_device_ptr(&dev, None)
        .unwrap();
    k.fill_after_spin(&stream, &ptr, 9, SLOW).unwrap();
    drop(ptr);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert!(
        stream.is_done().unwrap(),
        "the deleter ran while a kernel still used the memory"
    );
    assert!(read_u32(&buf).iter().all(|&x| x == 9));
}

#[test]
fn refusals_on_real_memory() {
    let _s = serial();
    let dev = dev0();
    let buf = DevicePtr::alloc(&dev, 4096).unwrap();
    let t = ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([1024])).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&Expect::new().device(1)),
        Err(Error::WrongDevice {
            expected: 1,
            actual: 0
        })
    ));
    let t =
        ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([1024]).read_only(true)).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&strict()),
        Err(Error::ReadOnly)
    ));
    let t =
        ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([32, 32]).strides([1, 32])).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&strict()),
        Err(Error::NotContiguous { .. })
    ));
    assert!(matches!(
        ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([1025])),
        Err(Error::OutOfBounds { .. })
    ));
    let other = Device::new(0).unwrap();
    let t = ExportedTensor::from_view(&buf, &TensorSpec::of::<f32>([1024])).unwrap();
    assert!(import(t)
        .into_view::<f32>(&strict())
        .unwrap()
        .into_device_ptr(&other, None)
        .is_ok());
    assert_eq!(
        Arc::strong_count(buf.owner()),
        1,
        "every refused or dropped import released"
    );
}

#[test]
fn a_hundred_thousand_exchanges_leave_memory_flat() {
    let _s = serial();
    let dev = dev0();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let block: DevicePtr = pool.malloc_shared(&stream, 1 << 20).unwrap().into();
    let spec = TensorSpec::of::<f32>([512, 512]);
    // Warm up, then measure.
    for _ in 0..1000 {
        drop(import(ExportedTensor::from_view(&block, &spec).unwrap()));
    }
    stream.synchronize().unwrap();
    let (free_before, _) = dev.memory_info().unwrap();
    let used_before = pool.used_bytes();
    for i in 0..100_000 {
        let t = ExportedTensor::from_view(&block, &spec).unwrap();
        let view = import(t).into_view::<f32>(&strict()).unwrap();
        if i % 1000 == 0 {
            // Through a DevicePtr now and then, on the stream, as a consumer would.
            let ptr = view.into_device_ptr(&dev, None).unwrap();
            ptr.memset_async(0, &stream).unwrap();
        }
    }
    stream.synchronize().unwrap();
    let (free_after, _) = dev.memory_info().unwrap();
    assert_eq!(
        Arc::strong_count(block.owner()),
        1,
        "every exchange released its owner"
    );
    assert_eq!(pool.used_bytes(), used_before);
    assert!(
        free_before.abs_diff(free_after) <= 2 << 20,
        "device memory moved by {} bytes",
        free_before as i64 - free_after as i64
    );
}
