//! GPU, two devices or more (run on the multi-GPU machine; with fewer every test fails with
//! a message saying so): one `MemoryPool` serving several devices.
//!
//! * a pool block on device 1 is read and written by a kernel on device 0 once
//!   `DevicePool::grant_peer_access` has granted it (virtual-memory segments: `cuMemSetAccess`
//!   on the block's pages; plain segments: peer context access);
//! * per-device limits and statistics: a limit on device 1 stops device 1 only, and each
//!   device's statistics count only its own blocks;
//! * a peer copy queued on device 1's stream from memory of device 0 keeps reading that
//!   memory, not its next owner's, when the source is dropped at once (the free of device 0's
//!   memory waits for device 1's work, which `cuMemFree` alone does not).
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudars_core::memory::{AttachFlags, DevicePtr, ManagedMemory};
use cudars_core::{Device, Stream};
use cudars_mempool::driver::device_id;
use cudars_mempool::{DevicePool, Limit, PoolError};
use workspace_tests::gpu::serial;
use workspace_tests::kernels::Kernels;

/// Devices 0 and 1; fails clearly with fewer than two, or without peer access between them.
fn two_devices() -> (Device, Device) {
    let all = Device::all().expect("CUDA devices");
    assert!(
        all.len() >= 2,
        "these tests need at least 2 GPUs, found {}: run gpu_ipc_two_gpus on the multi-GPU machine",
        all.len()
    );
    let (d0, d1) = (all[0], all[1]);
    assert!(
        d0.can_access_peer(&d1).unwrap(),
        "device 0 has no peer access to device 1"
    );
    (d0, d1)
}

fn kernel_on_device0_uses_a_block_of_device1(pool: Arc<DevicePool>) {
    let (d0, d1) = two_devices();
    let s0 = Stream::new(&d0).unwrap();
    let s1 = Stream::new(&d1).unwrap();
    let k0 = Kernels::load(&d0).unwrap();
    let n = (3 << 20) + 7; // u32s: a block over several 2 MiB pages, odd length
    let block: DevicePtr = pool.malloc_shared(&s1, n * 4).unwrap().into();
    assert_eq!(block.device(), d1);
    block.memset_u32_async(5, &s1).unwrap();
    s1.synchronize().unwrap();
    pool.grant_peer_access(&block, &d0).unwrap();
    // Device 0 reads and writes device 1's block: += 10, then fill a prefix.
    let issue = s0.issue_any(); // peer memory: any device's
    block.record_stream(&issue).unwrap();
    // SAFETY: the block lives until after s0 is synchronised; nothing else uses it meanwhile.
    unsafe { k0.add_u32_raw(&s0, block.as_raw(), 10, n as u64) }.unwrap();
    drop(issue);
    // SAFETY: as above.
    unsafe { k0.fill_u32_raw(&s0, block.as_raw(), 0xABCD, 1000) }.unwrap();
    s0.synchronize().unwrap();
    let mut host = vec![0u32; n];
    block.copy_to_host(&mut host).unwrap();
    assert!(host[..1000].iter().all(|&x| x == 0xABCD));
    let bad = host[1000..].iter().position(|&x| x != 15);
    assert_eq!(
        bad, None,
        "device 0's kernel did not update device 1's block"
    );
    // The same device is a no-op.
    pool.grant_peer_access(&block, &d1).unwrap();
}

#[test]
fn a_vmm_pool_block_on_device_1_is_used_by_a_kernel_on_device_0() {
    let _g = serial();
    let (_, d1) = two_devices();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    assert!(
        pool.uses_virtual_memory(device_id(&d1)).unwrap(),
        "device 1 should use virtual-memory segments"
    );
    kernel_on_device0_uses_a_block_of_device1(pool);
}

#[test]
fn a_plain_pool_block_on_device_1_is_used_by_a_kernel_on_device_0() {
    let _g = serial();
    let (_, d1) = two_devices();
    let pool = Arc::new(DevicePool::new_ipc().unwrap());
    assert!(!pool.uses_virtual_memory(device_id(&d1)).unwrap());
    kernel_on_device0_uses_a_block_of_device1(pool);
}

#[test]
fn per_device_limits_and_stats_hold() {
    let _g = serial();
    let (d0, d1) = two_devices();
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let pool = DevicePool::new_driver().unwrap();
    let (i0, i1) = (device_id(&d0), device_id(&d1));
    pool.set_limit(i1, Limit::Bytes(64 << 20)).unwrap();
    assert_eq!(pool.get_limit(i1).unwrap(), Some(64 << 20));
    assert_eq!(pool.get_limit(i0).unwrap(), None);
    // Device 0 is not limited by device 1's limit.
    let big0 = pool.malloc_stream(&s0, 256 << 20).unwrap();
    let a1 = pool.malloc_stream(&s1, 48 << 20).unwrap();
    let err = pool.malloc_stream(&s1, 32 << 20).unwrap_err();
    match err {
        PoolError::OutOfMemory { device, limit, .. } => {
            assert_eq!(device, i1);
            assert_eq!(limit, Some(64 << 20));
        }
        e => panic!("expected OutOfMemory on device 1, got {e}"),
    }
    let (st0, st1) = (pool.stats(i0).unwrap(), pool.stats(i1).unwrap());
    assert_eq!(st0.used.current, 256 << 20);
    assert_eq!(st1.used.current, 48 << 20);
    assert!(st1.reserved.current <= 64 << 20);
    assert_eq!(st1.ooms, 1);
    assert_eq!(st0.ooms, 0);
    drop((big0, a1));
    assert_eq!(pool.stats(i0).unwrap().used.current, 0);
    assert_eq!(pool.stats(i1).unwrap().used.current, 0);
    // A limit below device 1's use is refused, and device 0 keeps its own.
    let held = pool.malloc_stream(&s1, 40 << 20).unwrap();
    assert!(matches!(
        pool.set_limit(i1, Limit::Bytes(8 << 20)),
        Err(PoolError::LimitBelowUsage { .. })
    ));
    drop(held);
    pool.free_all_blocks().unwrap();
}

/// Device 0's memory, filled with `value` and landed (the fill is done for every stream).
fn filled_on(dev: &Device, bytes: usize, value: u32) -> DevicePtr {
    let buf = DevicePtr::alloc(dev, bytes).unwrap();
    buf.copy_from_host(&vec![value; bytes / 4]).unwrap();
    Stream::null(dev).synchronize().unwrap();
    buf
}

fn all_equal(buf: &DevicePtr, expected: u32, what: &str) {
    let mut host = vec![0u32; buf.len() / 4];
    buf.copy_to_host(&mut host).unwrap();
    if let Some(i) = host.iter().position(|&x| x != expected) {
        let wrong = host.iter().filter(|&&x| x != expected).count();
        panic!(
            "{what}: {wrong} of {} elements wrong, the first at {i}: {:#x}, expected {expected:#x}",
            host.len(),
            host[i]
        );
    }
}

/// A peer copy queued behind a slow kernel on `s1` (device 1) from `src` (device 0), with
/// `src` dropped at once and a new owner on device 0 writing its own data at once: the
/// copy must still read the source's data.
fn peer_copy_outlives_its_dropped_source(src: DevicePtr, bytes: usize) {
    let (d0, d1) = two_devices();
    let s1 = Stream::new(&d1).unwrap();
    let k1 = Kernels::load(&d1).unwrap();
    let dst = DevicePtr::alloc(&d1, bytes).unwrap();
    dst.memset(0).unwrap();
    Stream::null(&d1).synchronize().unwrap();
    let slow = Duration::from_millis(300);
    k1.spin(&s1, k1.cycles_for(slow)).unwrap();
    dst.copy_from_device_async(&src, &s1).unwrap();
    let old_addr = src.as_raw();
    let start = Instant::now();
    drop(src);
    let dropped_after = start.elapsed();
    let next = filled_on(&d0, bytes, 0x5A5A_0002);
    eprintln!(
        "source dropped in {dropped_after:?}; its next owner {} its address",
        if next.as_raw() == old_addr {
            "reuses"
        } else {
            "does not reuse"
        }
    );
    s1.synchronize().unwrap();
    all_equal(&dst, 0xA5A5_0001, "the peer copy's destination");
    all_equal(&next, 0x5A5A_0002, "the source's next owner");
}

#[test]
fn a_peer_copy_reads_its_dropped_source_not_the_next_owner() {
    let _g = serial();
    let (d0, _) = two_devices();
    let bytes = 64 << 20;
    peer_copy_outlives_its_dropped_source(filled_on(&d0, bytes, 0xA5A5_0001), bytes);
}

#[test]
fn a_peer_copy_reads_its_dropped_managed_source_not_the_next_owner() {
    let _g = serial();
    let (d0, _) = two_devices();
    let bytes = 64 << 20;
    let src = ManagedMemory::new(&d0, bytes, AttachFlags::GLOBAL)
        .unwrap()
        .into_ptr();
    src.copy_from_host(&vec![0xA5A5_0001u32; bytes / 4])
        .unwrap();
    Stream::null(&d0).synchronize().unwrap();
    peer_copy_outlives_its_dropped_source(src, bytes);
}
