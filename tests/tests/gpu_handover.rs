//! GPU: the one ordering rule for reused memory (`cudars_core::memory::Handover`).
//!
//! A kernel on stream A writes a pool block for about 0.1 s; the block is freed right
//! after the launch. A fresh non-blocking stream B asks for the same size and gets A's
//! memory, ordered after A on the device only (stealing before growing). Every use of the
//! new block that a safe API offers, synchronous calls (legacy stream), other streams,
//! `cuda-xfer`, the safe kernels (`cuda-core`'s PTX `Kernels::fill`, and the NVRTC kernels
//! of `workspace_tests::kernels`, whose views `cuda-rtc` marks), must come after A's kernel:
//! after everything has
//! finished, the block holds the new owner's data, never the old kernel's. The same for a
//! block reused on its own stream by a synchronous call, and for stream-ordered memory
//! (`cuMemAllocAsync`), whose driver pool reuses memory the same ways.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::Arc;

use cudars_core::async_pool::StreamOrderedMemory;
use cudars_core::kernels::Kernels as PtxKernels;
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};
use cudars_mempool::DevicePool;
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

/// About 0.1 s of SM clocks: the host runs far ahead of the old owner's kernel.
const SLOW: u64 = 200_000_000;
const OLD: u32 = 0x0bad_0bad;
const NEW: u32 = 0x600d_600d;
const SIZES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];

#[derive(Clone, Copy, Debug)]
enum Use {
    /// `DevicePtr::copy_from_host` (legacy stream).
    CopyFromHost,
    /// `DevicePtr::memset_u32` (legacy stream).
    MemsetU32,
    /// `DevicePtr::memset` (bytes; legacy stream).
    MemsetU8,
    /// `DevicePtr::copy_from_device` (legacy stream).
    CopyFromDevice,
    /// `memset_u32_async` on a third stream.
    AsyncOnOtherStream,
    /// `workspace_tests::kernels::Kernels::fill` (NVRTC, through `cuda-rtc`'s argument
    /// marking) on a third stream.
    KernelOnOtherStream,
    /// `cuda-core`'s safe `kernels::Kernels::fill` (PTX) on a third stream.
    PtxKernelOnOtherStream,
    /// `cudars_xfer::copy_to_device` (synchronous, possibly staged).
    XferCopyToDevice,
    /// `cudars_xfer::copy_to_device_on_stream` on a third stream.
    XferOnOtherStream,
    /// The new owner writes on its own stream, then reads synchronously: the read must
    /// see its write (and not the old kernel's data).
    ReadAfterOwnWrite,
}

const USES: [Use; 10] = [
    Use::CopyFromHost,
    Use::MemsetU32,
    Use::MemsetU8,
    Use::CopyFromDevice,
    Use::AsyncOnOtherStream,
    Use::KernelOnOtherStream,
    Use::PtxKernelOnOtherStream,
    Use::XferCopyToDevice,
    Use::XferOnOtherStream,
    Use::ReadAfterOwnWrite,
];

fn non_blocking(dev: &Device) -> Stream {
    Stream::builder(dev).non_blocking(true).build().unwrap()
}

/// Applies `how` to `block` (owned by stream `own`) and returns the value every u32 of it
/// must hold once everything is done, and what a read made by the use itself returned.
fn apply(
    how: Use,
    block: &DevicePtr,
    own: &Stream,
    dev: &Device,
    k: &Kernels,
    ptx: &PtxKernels,
) -> (u32, Option<Vec<u32>>) {
    let n = block.len() / 4;
    let other = non_blocking(dev);
    match how {
        Use::CopyFromHost => block.copy_from_host(&vec![NEW; n]).unwrap(),
        Use::MemsetU32 => block.memset_u32(NEW).unwrap(),
        Use::MemsetU8 => {
            block.memset(0x5a).unwrap();
            return (0x5a5a_5a5a, None);
        }
        Use::CopyFromDevice => {
            let src = DevicePtr::alloc(dev, block.len()).unwrap();
            src.memset_u32(NEW).unwrap();
            block.copy_from_device(&src).unwrap();
        }
        Use::AsyncOnOtherStream => block.memset_u32_async(NEW, &other).unwrap(),
        Use::KernelOnOtherStream => k.fill(&other, block, NEW).unwrap(),
        Use::PtxKernelOnOtherStream => ptx.fill(&other, block, NEW).unwrap(),
        Use::XferCopyToDevice => {
            let buf = cudars_xfer::DeviceBuffer::<u32>::from_ptr(block.clone()).unwrap();
            cudars_xfer::copy_to_device(&vec![NEW; n], &buf).unwrap();
        }
        Use::XferOnOtherStream => {
            let buf = cudars_xfer::DeviceBuffer::<u32>::from_ptr(block.clone()).unwrap();
            cudars_xfer::copy_to_device_on_stream(&vec![NEW; n], &buf, &other).unwrap();
        }
        Use::ReadAfterOwnWrite => {
            block.memset_u32_async(NEW, own).unwrap();
            let mut host = vec![0u32; n];
            block.copy_to_host(&mut host).unwrap();
            return (NEW, Some(host));
        }
    }
    other.synchronize().unwrap();
    (NEW, None)
}

fn wrong(host: &[u32], want: u32) -> usize {
    host.iter().filter(|&&x| x != want).count()
}

/// The hand-over of a stolen pool block, for every use and size: no element of the new
/// block holds the old kernel's value once everything is done.
#[test]
fn stolen_pool_block_is_safe_for_every_use() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let ptx = PtxKernels::load(&dev).unwrap();
    let mut failures = Vec::new();
    let mut stolen = 0;
    let mut runs = 0;
    for size in SIZES {
        for how in USES {
            // A fresh pool each time: the new stream's request finds only the old block.
            let pool = Arc::new(DevicePool::new_driver().unwrap());
            let a = non_blocking(&dev);
            let old: DevicePtr = pool.malloc_shared(&a, size).unwrap().into();
            let old_addr = old.as_raw();
            k.fill_after_spin(&a, &old, OLD, SLOW).unwrap();
            drop(old);
            let b = non_blocking(&dev);
            let block: DevicePtr = pool.malloc_shared(&b, size).unwrap().into();
            let same = block.as_raw() == old_addr;
            stolen += usize::from(same);
            runs += 1;
            let (want, read) = apply(how, &block, &b, &dev, &k, &ptx);
            a.synchronize().unwrap();
            b.synchronize().unwrap();
            let mut host = vec![0u32; size / 4];
            block.copy_to_host(&mut host).unwrap();
            let bad = wrong(&host, want);
            let bad_read = read.as_deref().map_or(0, |r| wrong(r, want));
            println!(
                "{how:?} {size} B: same block {same}, {bad} of {} elements wrong after all work, \
                 {bad_read} wrong in the use's own read",
                host.len()
            );
            if bad != 0 || bad_read != 0 {
                failures.push(format!("{how:?} at {size} B: {bad} / {bad_read} wrong"));
            }
        }
    }
    println!("stolen (same block handed over): {stolen} of {runs}");
    assert!(failures.is_empty(), "wrong data: {failures:?}");
    assert_eq!(
        stolen, runs,
        "the pool did not hand the old block to the new stream every time: those runs did not \
         exercise the hand-over"
    );
}

/// A block reused on its own (non-blocking) stream while the old kernel still writes it,
/// then used by a synchronous call: the call waits for the old kernel.
#[test]
fn same_stream_reuse_then_synchronous_use() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let ptx = PtxKernels::load(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let a = non_blocking(&dev);
    for size in SIZES {
        for how in [Use::CopyFromHost, Use::MemsetU32, Use::AsyncOnOtherStream] {
            let old: DevicePtr = pool.malloc_shared(&a, size).unwrap().into();
            let old_addr = old.as_raw();
            k.fill_after_spin(&a, &old, OLD, SLOW).unwrap();
            drop(old);
            let block: DevicePtr = pool.malloc_shared(&a, size).unwrap().into();
            assert_eq!(block.as_raw(), old_addr, "same-stream reuse is immediate");
            let (want, _) = apply(how, &block, &a, &dev, &k, &ptx);
            a.synchronize().unwrap();
            let mut host = vec![0u32; size / 4];
            block.copy_to_host(&mut host).unwrap();
            let bad = wrong(&host, want);
            println!(
                "same stream, {how:?} {size} B: {bad} of {} wrong",
                host.len()
            );
            assert_eq!(bad, 0, "{how:?} at {size} B raced the old owner's kernel");
        }
    }
}

/// Stream-ordered memory (`cuMemAllocAsync`): the driver's pool may give B the memory A
/// freed (ordered by an internal dependency); a synchronous use still comes after A.
#[test]
fn stream_ordered_memory_reuse_then_synchronous_use() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let ptx = PtxKernels::load(&dev).unwrap();
    let mut reused = 0;
    for size in SIZES {
        for how in [
            Use::CopyFromHost,
            Use::MemsetU32,
            Use::AsyncOnOtherStream,
            Use::ReadAfterOwnWrite,
        ] {
            let a = Arc::new(non_blocking(&dev));
            let old: DevicePtr = StreamOrderedMemory::new(size, &a).unwrap().into();
            let old_addr = old.as_raw();
            k.fill_after_spin(&a, &old, OLD, SLOW).unwrap();
            drop(old);
            let b = Arc::new(non_blocking(&dev));
            let block: DevicePtr = StreamOrderedMemory::new(size, &b).unwrap().into();
            reused += usize::from(block.as_raw() == old_addr);
            let (want, read) = apply(how, &block, &b, &dev, &k, &ptx);
            a.synchronize().unwrap();
            b.synchronize().unwrap();
            let mut host = vec![0u32; size / 4];
            block.copy_to_host(&mut host).unwrap();
            let bad = wrong(&host, want);
            let bad_read = read.as_deref().map_or(0, |r| wrong(r, want));
            println!(
                "stream-ordered {how:?} {size} B: same block {}, {bad} wrong, {bad_read} wrong in the use's read",
                block.as_raw() == old_addr
            );
            assert_eq!((bad, bad_read), (0, 0), "{how:?} at {size} B");
        }
    }
    println!("stream-ordered memory reused across streams: {reused} times");
}

/// A captured `cuMemAllocAsync` returns graph memory, backed only while the graph runs:
/// `StreamOrderedMemory` refuses a capturing stream instead of handing it out as an owner.
#[test]
fn stream_ordered_memory_refuses_a_capturing_stream() {
    let _s = serial();
    let dev = dev0();
    let s = non_blocking(&dev);
    let mut refused = None;
    let graph = cudars_graph::capture(&s, cudars_graph::CaptureMode::ThreadLocal, |c| {
        let stream = Arc::new((**c).clone());
        refused = Some(StreamOrderedMemory::new(1 << 20, &stream).map(|_| ()));
        Ok(())
    });
    let refused = refused.expect("the body ran");
    println!(
        "allocation in capture: {refused:?}; capture: {:?}",
        graph.as_ref().map(|_| ())
    );
    assert!(
        matches!(refused, Err(cudars_core::Error::InvalidArgument(ref m)) if m.contains("captured")),
        "{refused:?}"
    );
    assert!(graph.is_ok(), "the refusal leaves the capture valid");
}

/// A block of a capture's private pool, used after the capture by a slow kernel on another
/// stream and dropped at once with its graph: the private pool's memory goes back only
/// after that kernel, so the next owner of the memory keeps its own data.
#[test]
fn private_pool_release_waits_for_other_streams_work() {
    let _s = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    let size = 64 << 20;
    let s = non_blocking(&dev);
    let mut block: Option<DevicePtr> = None;
    let graph = cudars_graph::capture(&s, cudars_graph::CaptureMode::ThreadLocal, |c| {
        let b: DevicePtr = pool
            .malloc_shared(c, size)
            .map_err(cudars_core::Error::from)?
            .into();
        k.fill(c, &b, 1)?;
        block = Some(b);
        Ok(())
    })
    .unwrap();
    let block = block.unwrap();
    let other = non_blocking(&dev);
    k.fill_after_spin(&other, &block, OLD, SLOW).unwrap();
    drop(block);
    drop(graph);
    let reserved_before = pool.total_bytes();
    let t = non_blocking(&dev);
    let fresh: DevicePtr = pool.malloc_shared(&t, size).unwrap().into();
    fresh.memset_u32(NEW).unwrap();
    other.synchronize().unwrap();
    dev.synchronize().unwrap();
    let mut host = vec![0u32; size / 4];
    fresh.copy_to_host(&mut host).unwrap();
    let bad = wrong(&host, NEW);
    println!(
        "private pool released (reserved {reserved_before} -> {} bytes); {bad} of {} elements of the next owner wrong",
        pool.total_bytes(),
        host.len()
    );
    assert_eq!(bad, 0);
}
