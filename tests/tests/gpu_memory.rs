//! GPU: cuda-core's memory primitives: device, managed, pinned, registered and unowned
//! memory, `DevicePtr` views with their copies and memsets, pointer attributes, virtual
//! memory and stream-ordered pools.
//!
//! Every test takes `SERIAL`, so the ones that compare device memory levels
//! (`Device::memory_info`) never see another test's allocations.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudars_core::async_pool::{self, MemPool, PoolAttribute, StreamOrderedMemory};
use cudars_core::memory::{
    Advice, AttachFlags, DeviceMemory, DevicePtr, HostRegistration, Location, ManagedMemory,
    PinnedFlags, PinnedMemory, RegisterFlags, UnownedMemory,
};
use cudars_core::pointer;
use cudars_core::vmm::{self, Granularity, PhysicalAllocation, VirtualRange};
use cudars_core::{Device, Error, Stream};
use workspace_tests::gpu::{dev0, serial};

const MIB: usize = 1 << 20;
/// The sizes issue 3 asks for: 0, 1, 511, 4 KiB, 1 MiB + 3 bytes and 256 MiB.
const SIZES: [usize; 6] = [0, 1, 511, 4096, MIB + 3, 256 * MIB];

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Asserts equality without printing megabytes on failure.
#[track_caller]
fn assert_bytes(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    if let Some(i) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} of {}: got {:#04x}, expected {:#04x}",
            actual.len(),
            actual[i],
            expected[i]
        );
    }
}

#[track_caller]
fn assert_all(actual: &[u8], value: u8, what: &str) {
    if let Some(i) = actual.iter().position(|&a| a != value) {
        panic!(
            "{what}: byte {i} of {} is {:#04x}, expected {value:#04x}",
            actual.len(),
            actual[i]
        );
    }
}

/// Waits for the work of the device's legacy default stream, where the synchronous copies and
/// memsets run. (Not `Device::synchronize`: see the report on `cuCtxSynchronize` under
/// CUDA 13.)
fn sync_legacy(dev: &Device) {
    Stream::null(dev)
        .synchronize()
        .expect("cuStreamSynchronize(NULL)");
}

fn free_memory(dev: &Device) -> usize {
    dev.memory_info().expect("cuMemGetInfo").0
}

#[test]
fn copies_and_memsets_round_trip_every_size_sync_and_async() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let max = *SIZES.iter().max().unwrap();
    let mut pinned_src = PinnedMemory::new(&dev, max, PinnedFlags::NONE).unwrap();
    let mut pinned_dst = PinnedMemory::new(&dev, max, PinnedFlags::PORTABLE).unwrap();
    for (k, &size) in SIZES.iter().enumerate() {
        let seed = k as u8 * 17 + 3;
        let data = pattern(size, seed);
        let d = DevicePtr::alloc(&dev, size).unwrap();
        assert_eq!(d.len(), size);
        assert_eq!(d.is_empty(), size == 0);
        assert_eq!(d.as_raw() == 0, size == 0, "size 0 has a null address");

        // Sync, pageable host memory.
        d.copy_from_host(&data).unwrap();
        let mut back = vec![0u8; size];
        d.copy_to_host(&mut back).unwrap();
        assert_bytes(&back, &data, &format!("sync pageable round trip of {size}"));

        // Sync memset, read into pinned memory.
        d.memset(0xa5).unwrap();
        d.copy_to_host(&mut pinned_dst[..size]).unwrap();
        assert_all(&pinned_dst[..size], 0xa5, &format!("sync memset of {size}"));

        // Async, pinned host memory.
        let data2 = pattern(size, seed ^ 0x5a);
        pinned_src[..size].copy_from_slice(&data2);
        pinned_dst[..size].fill(0);
        // SAFETY: both pinned buffers outlive the copies and are untouched until the
        // stream is synchronised.
        unsafe {
            d.copy_from_host_async(&pinned_src[..size], &stream)
                .unwrap();
            d.copy_to_host_async(&mut pinned_dst[..size], &stream)
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert_bytes(
            &pinned_dst[..size],
            &data2,
            &format!("async pinned round trip of {size}"),
        );

        // Async memset, then an async copy into pageable memory.
        d.memset_async(0x3c, &stream).unwrap();
        let mut pageable = vec![0u8; size];
        // SAFETY: `pageable` lives and is untouched until the stream is synchronised.
        unsafe { d.copy_to_host_async(&mut pageable, &stream).unwrap() };
        stream.synchronize().unwrap();
        assert_all(&pageable, 0x3c, &format!("async memset of {size}"));

        // Async from pageable memory, and device-to-device copies (sync and async).
        // SAFETY: `data` lives and is untouched until the stream is synchronised.
        unsafe { d.copy_from_host_async(&data, &stream).unwrap() };
        let e = DevicePtr::alloc(&dev, size).unwrap();
        e.copy_from_device_async(&d, &stream).unwrap();
        stream.synchronize().unwrap();
        assert_bytes(
            &e.to_vec().unwrap(),
            &data,
            &format!("async pageable + D2D of {size}"),
        );
        d.memset(0).unwrap();
        d.copy_from_device(&e).unwrap();
        let mut back = vec![0u8; size];
        d.copy_to_host(&mut back).unwrap();
        assert_bytes(&back, &data, &format!("sync D2D of {size}"));
    }
}

#[test]
fn the_legacy_null_stream_orders_async_copies() {
    let _s = serial();
    let dev = dev0();
    let null = Stream::null(&dev);
    let d = DevicePtr::alloc(&dev, 4096).unwrap();
    let data = pattern(4096, 9);
    let mut back = vec![0u8; 4096];
    // SAFETY: both buffers outlive the synchronize below.
    unsafe {
        d.copy_from_host_async(&data, &null).unwrap();
        d.copy_to_host_async(&mut back, &null).unwrap();
    }
    null.synchronize().unwrap();
    assert_bytes(&back, &data, "null-stream round trip");
}

#[test]
fn typed_fills_and_copies_respect_alignment() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let d = DevicePtr::alloc(&dev, 4096).unwrap();

    d.memset_u16(0x1234).unwrap();
    let mut h16 = vec![0u16; 2048];
    d.copy_to_host(&mut h16).unwrap();
    assert!(h16.iter().all(|&x| x == 0x1234), "memset_u16");

    d.memset_u32_async(0xdead_beef, &stream).unwrap();
    stream.synchronize().unwrap();
    let mut h32 = vec![0u32; 1024];
    d.copy_to_host(&mut h32).unwrap();
    assert!(h32.iter().all(|&x| x == 0xdead_beef), "memset_u32_async");

    // A u16 fill of an aligned sub-view leaves its neighbours alone.
    d.slice(8..16)
        .unwrap()
        .memset_u16_async(0xffff, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    d.copy_to_host(&mut h32).unwrap();
    assert_eq!(
        &h32[..5],
        &[
            0xdead_beef,
            0xdead_beef,
            0xffff_ffff,
            0xffff_ffff,
            0xdead_beef
        ]
    );

    // Typed host slices: 1024 u32 = 4096 bytes; 1023 is a size mismatch.
    let src: Vec<u32> = (1..=1024u32).map(|i| i.wrapping_mul(0x0101_0101)).collect();
    d.copy_from_host(&src).unwrap();
    d.copy_to_host(&mut h32).unwrap();
    assert_eq!(h32, src);
    assert!(matches!(
        d.copy_from_host(&src[..1023]),
        Err(Error::SizeMismatch {
            dst: 4096,
            src: 4092,
            ..
        })
    ));

    // Misaligned address or length: a clear error, nothing written.
    let odd = d.slice(1..9).unwrap();
    assert!(matches!(odd.memset_u16(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(odd.memset_u32(0), Err(Error::InvalidArgument(_))));
    let ragged = d.slice(0..6).unwrap();
    assert!(matches!(
        ragged.memset_u32_async(0, &stream),
        Err(Error::InvalidArgument(_))
    ));
    assert!(ragged.memset_u16(7).is_ok(), "6 bytes are three u16");
    d.copy_to_host(&mut h32).unwrap();
    assert_eq!(h32[0], 0x0007_0007);
    assert_eq!(
        h32[1],
        (src[1] & 0xffff_0000) | 0x0007,
        "bytes 6.. untouched"
    );
    assert_ne!(src[1] & 0xffff_0000, 0);
    assert_eq!(&h32[2..], &src[2..]);
}

#[test]
fn raw_calls_work_on_addresses() {
    use cudars_core::memory::raw;
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let d = DeviceMemory::new(&dev, 4096).unwrap();
    let e = DeviceMemory::new(&dev, 4096).unwrap();
    let data = pattern(4096, 44);
    let mut back = vec![0u8; 4096];
    // SAFETY: `d` and `e` are live 4096-byte allocations of `dev`; the host buffers outlive
    // the stream synchronisation below.
    unsafe {
        raw::copy_htod(&dev, d.as_raw(), data.as_ptr(), 4096).unwrap();
        raw::memset_d32_async(&dev, d.as_raw() + 1024, 0x0a0b_0c0d, 256, &stream).unwrap();
        raw::copy_dtod_async(&dev, e.as_raw(), d.as_raw(), 4096, &stream).unwrap();
        raw::memset_d8(&dev, e.as_raw(), 0, 0).unwrap(); // zero length: nothing
        raw::copy_dtoh_async(&dev, back.as_mut_ptr(), e.as_raw(), 4096, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    let mut expect = data.clone();
    for w in expect[1024..2048].chunks_mut(4) {
        w.copy_from_slice(&0x0a0b_0c0du32.to_le_bytes());
    }
    assert_bytes(&back, &expect, "raw copies and memsets");
}

#[test]
fn views_and_sub_views_share_their_allocation() {
    let _s = serial();
    let dev = dev0();
    let data = pattern(1000, 1);
    let whole = DevicePtr::alloc(&dev, 1000).unwrap();
    whole.copy_from_host(&data).unwrap();
    assert_eq!(whole.offset(), 0);

    let mid = whole.slice(100..300).unwrap();
    assert_eq!((mid.offset(), mid.len()), (100, 200));
    assert_eq!(mid.as_raw(), whole.as_raw() + 100);
    let inner = mid.slice(50..).unwrap();
    assert_eq!((inner.offset(), inner.len()), (150, 150));
    assert_eq!(inner.as_raw(), whole.as_raw() + 150);
    assert_eq!(whole.slice(..=9).unwrap().len(), 10);
    assert_eq!(whole.slice(..).unwrap().len(), 1000);
    assert!(whole.slice(1000..).unwrap().is_empty());

    assert_bytes(
        &inner.to_vec().unwrap(),
        &data[150..300],
        "sub-sub-view read",
    );
    inner.memset(0).unwrap();
    let mut expect = data.clone();
    expect[150..300].fill(0);
    assert_bytes(
        &whole.to_vec().unwrap(),
        &expect,
        "memset through a sub-view",
    );

    // A sub-view copy lands at its offset.
    let (left, right) = whole.split_at(500).unwrap();
    assert_eq!((left.len(), right.len(), right.offset()), (500, 500, 500));
    right.copy_from_device(&left).unwrap();
    let after = whole.to_vec().unwrap();
    assert_bytes(&after[500..], &expect[..500], "copy between halves");

    // Views keep the allocation alive: drop the original, use a sub-view.
    let owner = Arc::clone(whole.owner());
    let count = Arc::strong_count(&owner);
    drop(whole);
    drop(left);
    assert_eq!(Arc::strong_count(&owner), count - 2);
    assert_bytes(
        &mid.to_vec().unwrap(),
        &expect[100..300],
        "sub-view after the parent drops",
    );
    let clone = mid.clone();
    assert_eq!(Arc::strong_count(&owner), count - 1);
    assert_eq!(clone.as_raw(), mid.as_raw());
    assert_eq!(owner.size(), 1000);
}

#[test]
fn out_of_range_size_mismatch_and_overlap_are_typed_errors_that_change_nothing() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let data = pattern(100, 2);
    let d = DevicePtr::alloc(&dev, 100).unwrap();
    d.copy_from_host(&data).unwrap();

    match d.slice(90..110) {
        Err(Error::OutOfRange { offset, len, size }) => {
            assert_eq!((offset, len, size), (90, 20, 100))
        }
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    let sub = d.slice(10..20).unwrap();
    match sub.slice(5..11) {
        Err(Error::OutOfRange { offset, len, size }) => {
            assert_eq!((offset, len, size), (15, 6, 20))
        }
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = d.slice(5..3);
    assert!(matches!(reversed, Err(Error::OutOfRange { .. })));
    assert!(matches!(
        d.slice(..=usize::MAX),
        Err(Error::SizeOverflow(_))
    ));

    let short = vec![0xffu8; 99];
    match d.copy_from_host(&short) {
        Err(Error::SizeMismatch { op, dst, src }) => {
            assert_eq!((op, dst, src), ("copy_from_host", 100, 99))
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
    let mut long = vec![0u8; 101];
    assert!(matches!(
        d.copy_to_host(&mut long),
        Err(Error::SizeMismatch {
            dst: 100,
            src: 101,
            ..
        })
    ));
    assert!(long.iter().all(|&b| b == 0), "a failed copy writes nothing");
    // SAFETY: the calls fail before queuing anything.
    unsafe {
        assert!(matches!(
            d.copy_from_host_async(&short, &stream),
            Err(Error::SizeMismatch { .. })
        ));
        assert!(matches!(
            d.copy_to_host_async(&mut long, &stream),
            Err(Error::SizeMismatch { .. })
        ));
    }
    let other = DevicePtr::alloc(&dev, 50).unwrap();
    assert!(matches!(
        d.copy_from_device(&other),
        Err(Error::SizeMismatch {
            dst: 100,
            src: 50,
            ..
        })
    ));
    assert!(matches!(
        d.copy_from_device_async(&other, &stream),
        Err(Error::SizeMismatch { .. })
    ));
    // Overlapping device ranges.
    let a = d.slice(0..60).unwrap();
    let b = d.slice(40..100).unwrap();
    assert!(matches!(
        a.copy_from_device(&b),
        Err(Error::InvalidArgument(_))
    ));
    stream.synchronize().unwrap();
    assert_bytes(
        &d.to_vec().unwrap(),
        &data,
        "contents after the failed calls",
    );
}

#[test]
fn device_memory_returns_to_its_starting_level() {
    let _s = serial();
    let dev = dev0();
    // Warm up: the first allocation of a context may create driver-internal state.
    drop(DeviceMemory::new(&dev, 64 * MIB).unwrap());
    let before = free_memory(&dev);
    let views: Vec<DevicePtr> = (0..4)
        .map(|_| DevicePtr::alloc(&dev, 64 * MIB).unwrap())
        .collect();
    let subs: Vec<DevicePtr> = views.iter().map(|v| v.slice(MIB..).unwrap()).collect();
    let during = free_memory(&dev);
    assert!(
        before - during >= 256 * MIB,
        "before {before}, during {during}"
    );
    drop(views);
    assert!(
        free_memory(&dev) < during + 64 * MIB,
        "sub-views keep the memory"
    );
    drop(subs);
    let after = free_memory(&dev);
    println!("device memory: before {before}, with 256 MiB {during}, after {after}");
    assert!(
        after.abs_diff(before) <= 2 * MIB,
        "before {before}, after {after}"
    );

    // into_raw / from_raw hand ownership back and forth.
    let mem = DeviceMemory::new(&dev, 4096).unwrap();
    let raw = mem.into_raw();
    // SAFETY: `raw` came from cuMemAlloc on `dev` with 4096 bytes, and nobody else owns it.
    let mem = unsafe { DeviceMemory::from_raw(dev, raw, 4096) };
    assert_eq!(mem.as_raw(), raw);
    let empty = DeviceMemory::new(&dev, 0).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.as_raw(), 0);
}

#[test]
fn managed_memory_written_by_the_device_is_read_on_the_host() {
    let _s = serial();
    let dev = dev0();
    for attach in [AttachFlags::GLOBAL, AttachFlags::HOST] {
        let mem = Arc::new(ManagedMemory::new(&dev, MIB + 3, attach).unwrap());
        assert_eq!(
            pointer::locate(mem.as_host_ptr()).unwrap(),
            Location::Managed
        );
        let view = DevicePtr::from_arc(mem.clone());
        view.memset(0x5a).unwrap();
        sync_legacy(&dev);
        // SAFETY: the device is synchronised and no further device work is queued.
        assert_all(
            unsafe { mem.as_slice() },
            0x5a,
            "managed memory after a device memset",
        );

        // The host writes, the device reads.
        // SAFETY: no device work is pending; nobody else references the memory.
        unsafe { std::ptr::write_bytes(mem.as_host_ptr(), 0x11, mem.size()) };
        assert_all(&view.to_vec().unwrap(), 0x11, "device read of host writes");
    }
    let empty = ManagedMemory::new(&dev, 0, AttachFlags::GLOBAL).unwrap();
    assert!(empty.is_empty());
    // SAFETY: an empty allocation.
    assert!(unsafe { empty.as_slice() }.is_empty());
}

/// `CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`: a device ordinal, or -1 for the host.
fn last_prefetch_location(dev: &Device, addr: u64, len: usize) -> i32 {
    let mut loc: i32 = -7;
    let _ctx = dev.bind().unwrap(); // range attributes need a current context
    let driver = cudars_sys::driver().unwrap();
    // SAFETY: a 4-byte out-buffer for an int attribute of a managed range.
    let r = unsafe {
        driver.cuMemRangeGetAttribute(
            (&mut loc as *mut i32).cast(),
            4,
            cudars_sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            addr,
            len,
        )
    }
    .unwrap();
    assert!(r.is_success(), "{r:?}");
    loc
}

#[test]
fn managed_memory_prefetches_to_the_device_and_to_the_host() {
    let _s = serial();
    let dev = dev0();
    assert_eq!(
        dev.attribute(
            cudars_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        )
        .unwrap(),
        1,
        "this test needs concurrent managed access"
    );
    let stream = Stream::new(&dev).unwrap();
    let size = 8 * MIB;
    let mem = Arc::new(ManagedMemory::new(&dev, size, AttachFlags::GLOBAL).unwrap());

    mem.prefetch(Location::Device(dev), &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        last_prefetch_location(&dev, mem.as_raw(), size),
        dev.ordinal() as i32
    );

    let view = DevicePtr::from_arc(mem.clone());
    view.memset_async(0x42, &stream).unwrap();
    mem.prefetch(Location::HOST, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(last_prefetch_location(&dev, mem.as_raw(), size), -1);
    // SAFETY: the stream is synchronised; nothing else is queued.
    assert_all(
        unsafe { mem.as_slice() },
        0x42,
        "after prefetch to the host",
    );

    // A sub-range through a view.
    let half = view.slice(size / 2..).unwrap();
    half.prefetch(Location::Device(dev), &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        last_prefetch_location(&dev, half.as_raw(), half.len()),
        dev.ordinal() as i32
    );

    // Advice: read-mostly is visible through the range attribute.
    mem.advise(Advice::SetReadMostly, Location::Device(dev))
        .unwrap();
    let mut read_mostly: i32 = 0;
    let _ctx = dev.bind().unwrap();
    let driver = cudars_sys::driver().unwrap();
    // SAFETY: a 4-byte out-buffer for an int attribute of a managed range.
    let r = unsafe {
        driver.cuMemRangeGetAttribute(
            (&mut read_mostly as *mut i32).cast(),
            4,
            cudars_sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY,
            mem.as_raw(),
            size,
        )
    }
    .unwrap();
    assert!(r.is_success());
    assert_eq!(read_mostly, 1);
    mem.advise(Advice::UnsetReadMostly, Location::Device(dev))
        .unwrap();
    mem.advise(Advice::SetPreferredLocation, Location::HOST)
        .unwrap();
    mem.advise(Advice::SetAccessedBy, Location::Device(dev))
        .unwrap();

    // Prefetch of plain device memory is a driver error, not a crash.
    let plain = DevicePtr::alloc(&dev, 4096).unwrap();
    assert!(plain.prefetch(Location::HOST, &stream).is_err());
}

#[test]
fn pinned_memory_flags_mapping_and_typed_views() {
    let _s = serial();
    let dev = dev0();
    let size = MIB + 3;
    for flags in [
        PinnedFlags::NONE,
        PinnedFlags::PORTABLE,
        PinnedFlags::DEVICE_MAP,
        PinnedFlags::WRITE_COMBINED,
        PinnedFlags::PORTABLE | PinnedFlags::DEVICE_MAP | PinnedFlags::WRITE_COMBINED,
    ] {
        let mut buf = PinnedMemory::new(&dev, size, flags).unwrap();
        assert_eq!(buf.len(), size);
        assert_eq!(buf.flags(), flags);
        assert_eq!(
            buf.device_ptr().is_some(),
            flags.contains(PinnedFlags::DEVICE_MAP)
        );
        assert_eq!(pointer::locate(buf.as_ptr()).unwrap(), Location::PinnedHost);
        let data = pattern(size, flags.0 as u8);
        buf.copy_from_slice(&data);
        let d = DevicePtr::alloc(&dev, size).unwrap();
        d.copy_from_host(&buf[..]).unwrap();
        buf.fill(0);
        d.copy_to_host(&mut buf[..]).unwrap();
        assert_bytes(&buf, &data, &format!("round trip through pinned {flags:?}"));
    }

    // Mapped memory: a device memset through its device pointer reaches the host.
    let mapped = Arc::new(PinnedMemory::new(&dev, 4096, PinnedFlags::DEVICE_MAP).unwrap());
    let dptr = mapped
        .device_ptr()
        .expect("mapped memory has a device pointer");
    let owner: Arc<dyn Any + Send + Sync> = mapped.clone();
    // SAFETY: the mapped range belongs to `dev`'s context and is kept alive by `owner`; no
    // host reference to it is held while the device writes.
    let view = unsafe { UnownedMemory::new(dev, dptr, 4096, Some(owner)) }.into_ptr();
    view.memset(0x77).unwrap();
    sync_legacy(&dev);
    assert_all(
        mapped.as_slice(),
        0x77,
        "mapped pinned memory after a device memset",
    );
    drop(view);
    assert_eq!(Arc::strong_count(&mapped), 1);

    // Typed views.
    let mut words = PinnedMemory::new(&dev, 4096, PinnedFlags::NONE).unwrap();
    words
        .as_mut_slice_of::<u32>()
        .unwrap()
        .iter_mut()
        .enumerate()
        .for_each(|(i, w)| *w = i as u32);
    assert_eq!(words.as_slice_of::<u32>().unwrap()[1023], 1023);
    assert_eq!(words.as_slice_of::<f64>().unwrap().len(), 512);
    let (p, n) = words.into_raw();
    assert_eq!(
        pointer::locate(p).unwrap(),
        Location::PinnedHost,
        "still allocated"
    );
    // SAFETY: `p` came from cuMemHostAlloc on `dev` with these flags and `n` bytes.
    let words = unsafe { PinnedMemory::from_raw(dev, p, n, PinnedFlags::NONE) }.unwrap();
    assert_eq!(words.as_slice_of::<u32>().unwrap()[1023], 1023);
    let odd = PinnedMemory::new(&dev, 4097, PinnedFlags::NONE).unwrap();
    assert!(matches!(
        odd.as_slice_of::<u32>(),
        Err(Error::InvalidArgument(_))
    ));

    let empty = PinnedMemory::new(&dev, 0, PinnedFlags::DEVICE_MAP).unwrap();
    assert!(empty.is_empty() && empty.as_slice().is_empty() && empty.device_ptr().is_none());
}

#[test]
fn host_registration_round_trip() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let size = MIB + 3;
    let data = pattern(size, 77);
    let d = DevicePtr::alloc(&dev, size).unwrap();
    d.copy_from_host(&data).unwrap();

    // A borrowed buffer.
    let mut buf = vec![0u8; size];
    let addr = buf.as_ptr();
    assert_eq!(pointer::locate(addr).unwrap(), Location::PageableHost);
    {
        let mut reg = HostRegistration::new(
            &dev,
            &mut buf[..],
            RegisterFlags::PORTABLE | RegisterFlags::DEVICE_MAP,
        )
        .unwrap();
        assert_eq!(reg.len_bytes(), size);
        assert_eq!(pointer::locate(addr).unwrap(), Location::PinnedHost);
        // SAFETY: the registered buffer is untouched until the stream is synchronised.
        unsafe { d.copy_to_host_async(reg.as_mut_slice(), &stream).unwrap() };
        stream.synchronize().unwrap();
        assert_bytes(reg.as_slice(), &data, "async copy into registered memory");

        // Its device pointer is usable by a device memset.
        let dptr = reg.device_ptr().expect("registered with DEVICE_MAP");
        // SAFETY: the registered range stays registered (and `buf` borrowed) while the view
        // lives; no host reference is used while the device writes.
        let view = unsafe { UnownedMemory::new(dev, dptr, 16, None) }.into_ptr();
        view.memset(0xee).unwrap();
        sync_legacy(&dev);
        drop(view);
        assert_all(
            &reg.as_slice()[..16],
            0xee,
            "memset through the mapped registration",
        );
    }
    assert_eq!(
        pointer::locate(addr).unwrap(),
        Location::PageableHost,
        "unregistered on drop"
    );
    assert_all(&buf[..16], 0xee, "the buffer keeps what the device wrote");
    assert_bytes(&buf[16..], &data[16..], "the buffer keeps the copied data");

    // An owned buffer, typed, given back by into_inner.
    let words = vec![0u32; 1024];
    let mut reg = HostRegistration::new(&dev, words, RegisterFlags::NONE).unwrap();
    let waddr = reg.as_slice().as_ptr();
    assert_eq!(pointer::locate(waddr).unwrap(), Location::PinnedHost);
    let w = DevicePtr::alloc(&dev, 4096).unwrap();
    w.memset_u32(0x0102_0304).unwrap();
    w.copy_to_host(reg.as_mut_slice()).unwrap();
    let words = reg.into_inner();
    assert_eq!(pointer::locate(waddr).unwrap(), Location::PageableHost);
    assert!(words.iter().all(|&x| x == 0x0102_0304));

    // Empty buffers are not registered.
    let mut nothing: [u8; 0] = [];
    let reg = HostRegistration::new(&dev, &mut nothing[..], RegisterFlags::NONE).unwrap();
    assert_eq!(reg.len_bytes(), 0);
}

struct Tracked {
    mem: DeviceMemory,
    dropped: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

#[test]
fn unowned_memory_keeps_its_owner_alive() {
    let _s = serial();
    let dev = dev0();
    let dropped = Arc::new(AtomicBool::new(false));
    let tracked = Arc::new(Tracked {
        mem: DeviceMemory::new(&dev, 4096).unwrap(),
        dropped: dropped.clone(),
    });
    let (ptr, size) = (tracked.mem.as_raw(), tracked.mem.size());
    let owner: Arc<dyn Any + Send + Sync> = tracked.clone();
    // SAFETY: the range is device memory of `dev`, kept alive by `owner`.
    let unowned = unsafe { UnownedMemory::new(dev, ptr, size, Some(owner)) };
    assert!(unowned.owner().is_some());
    assert_eq!(Arc::strong_count(&tracked), 2);
    drop(tracked); // the foreign side lets go
    assert!(!dropped.load(Ordering::SeqCst));

    let view = DevicePtr::new(unowned);
    let sub = view.slice(1024..2048).unwrap();
    let copy = view.clone();
    drop(view);
    view_round_trip(&sub);
    drop(sub);
    assert!(!dropped.load(Ordering::SeqCst), "a clone is still alive");
    view_round_trip(&copy);
    drop(copy);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the owner drops with the last view"
    );

    // No owner: the wrapper is only a view of memory owned elsewhere.
    let mem = DeviceMemory::new(&dev, 256).unwrap();
    // SAFETY: `mem` outlives the view below.
    let bare = unsafe { UnownedMemory::new(dev, mem.as_raw(), mem.size(), None) }.into_ptr();
    view_round_trip(&bare);
}

fn view_round_trip(v: &DevicePtr) {
    let data = pattern(v.len(), 31);
    v.copy_from_host(&data).unwrap();
    assert_bytes(&v.to_vec().unwrap(), &data, "round trip");
}

#[test]
fn pointer_attributes_say_where_memory_lives() {
    let _s = serial();
    let dev = dev0();
    let stream = Arc::new(Stream::new(&dev).unwrap());
    let ordinal = dev.ordinal();

    let d = DeviceMemory::new(&dev, 1 << 16).unwrap();
    let a = pointer::attributes(d.as_raw() + 100).unwrap();
    println!("device memory: {a:?}");
    assert_eq!(a.location, Location::Device(dev));
    assert_eq!(a.device_ordinal, Some(ordinal));
    assert_eq!(a.device_pointer, Some(d.as_raw() + 100));
    if let Some((start, len)) = a.range {
        assert_eq!((start, len), (d.as_raw(), 1 << 16));
    }
    assert!(!a.location.is_host_accessible() && a.location.is_dma_ready());

    let pinned = PinnedMemory::new(&dev, 4096, PinnedFlags::NONE).unwrap();
    let a = pointer::attributes(pinned.as_ptr() as u64).unwrap();
    println!("pinned memory: {a:?}");
    assert_eq!(a.location, Location::PinnedHost);
    assert_eq!(a.host_pointer, Some(pinned.as_ptr() as usize));

    let mut buf = vec![1u8; 8192];
    let addr = buf.as_ptr();
    let reg = HostRegistration::new(&dev, &mut buf[..], RegisterFlags::NONE).unwrap();
    assert_eq!(pointer::locate(addr).unwrap(), Location::PinnedHost);
    drop(reg);

    let managed = ManagedMemory::new(&dev, 4096, AttachFlags::GLOBAL).unwrap();
    let a = pointer::attributes(managed.as_raw()).unwrap();
    println!("managed memory: {a:?}");
    assert_eq!(a.location, Location::Managed);
    assert!(a.location.is_host_accessible());

    let async_mem = StreamOrderedMemory::new(4096, &stream).unwrap();
    assert_eq!(
        pointer::locate_device(async_mem.as_raw()).unwrap(),
        Location::Device(dev)
    );
    drop(async_mem);
    stream.synchronize().unwrap();

    let v = vec![0u64; 100];
    let a = pointer::attributes(v.as_ptr() as u64).unwrap();
    println!("Vec memory: {a:?}");
    assert_eq!(a.location, Location::PageableHost);
    assert_eq!(a.device_ordinal, None);
    let on_stack = 5u32;
    assert_eq!(
        pointer::locate(std::ptr::addr_of!(on_stack)).unwrap(),
        Location::PageableHost
    );
    assert_eq!(pointer::locate_device(0).unwrap(), Location::PageableHost);
    assert!(!Location::PageableHost.is_dma_ready());
}

#[test]
fn virtual_memory_reserve_create_map_access_and_release() {
    let _s = serial();
    let dev = dev0();
    assert!(vmm::is_supported(&dev).unwrap(), "an H200 supports VMM");
    let g = vmm::granularity(&dev, Granularity::Minimum).unwrap();
    let rec = vmm::granularity(&dev, Granularity::Recommended).unwrap();
    println!("VMM granularity: minimum {g}, recommended {rec}");
    assert!(g.is_power_of_two() && g >= 4096);
    assert!(rec >= g && rec / g * g == rec);

    // Warm up the VMM paths once, then measure.
    {
        let r = VirtualRange::reserve(&dev, g, 0).unwrap();
        let p = PhysicalAllocation::new(&dev, g).unwrap();
        r.map(0, &p).unwrap();
        // SAFETY: nothing was queued on the mapping.
        unsafe { r.unmap(0, g) }.unwrap();
    }
    let before = free_memory(&dev);

    let range = Arc::new(VirtualRange::reserve(&dev, 4 * g, 0).unwrap());
    assert_eq!(range.size(), 4 * g);
    assert_eq!(range.base() % g as u64, 0);
    assert!(
        free_memory(&dev).abs_diff(before) <= g,
        "reserving addresses takes no memory"
    );
    let phys = PhysicalAllocation::new(&dev, 2 * g).unwrap();
    assert_eq!(phys.size(), 2 * g);
    assert!(
        before - free_memory(&dev) >= 2 * g,
        "cuMemCreate takes memory"
    );

    // Bad input: out of the range, empty.
    assert!(matches!(
        range.map(3 * g, &phys),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        // SAFETY: rejected before any driver call (out of the range).
        unsafe { range.unmap(0, 5 * g) },
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        PhysicalAllocation::new(&dev, 0),
        Err(Error::InvalidArgument(_))
    ));

    range.map(g, &phys).unwrap();
    range.set_access(g, 2 * g, &dev).unwrap();
    assert_eq!(
        pointer::locate_device(range.base() + g as u64).unwrap(),
        Location::Device(dev)
    );
    let owner: Arc<dyn Any + Send + Sync> = range.clone();
    // SAFETY: `base + g .. + 2g` is mapped, read-write for `dev`, and stays mapped while the
    // view lives (it is unmapped only after the view drops below).
    let view =
        unsafe { UnownedMemory::new(dev, range.base() + g as u64, 2 * g, Some(owner)) }.into_ptr();
    view.memset_u32(0xcafe_babe).unwrap();
    let mut back = vec![0u32; 2 * g / 4];
    view.copy_to_host(&mut back).unwrap();
    assert!(
        back.iter().all(|&x| x == 0xcafe_babe),
        "memset through a VMM mapping"
    );
    let data = pattern(2 * g, 5);
    view.copy_from_host(&data).unwrap();
    assert_bytes(
        &view.to_vec().unwrap(),
        &data,
        "copies through a VMM mapping",
    );
    sync_legacy(&dev);
    drop(view);

    // Releasing the handle while mapped keeps the memory until the unmap.
    drop(phys);
    assert!(
        before - free_memory(&dev) >= 2 * g,
        "mapped memory outlives its handle"
    );
    // SAFETY: the view is dropped and its work synchronised (`sync_legacy` above).
    unsafe { range.unmap(g, 2 * g) }.unwrap();
    let range = Arc::try_unwrap(range).expect("the view is gone");
    drop(range);
    let after = free_memory(&dev);
    println!("VMM: free before {before}, after {after}");
    assert!(
        after.abs_diff(before) <= g,
        "before {before}, after {after}"
    );

    let empty = VirtualRange::reserve(&dev, 0, 0).unwrap();
    assert_eq!((empty.base(), empty.size()), (0, 0));
}

#[test]
fn stream_ordered_pools_allocate_free_and_report() {
    let _s = serial();
    let dev = dev0();
    assert!(async_pool::is_supported(&dev).unwrap());
    let stream = Arc::new(Stream::new(&dev).unwrap());

    let default = MemPool::default_for(&dev).unwrap();
    assert!(!default.is_owned());
    assert_eq!(MemPool::current(&dev).unwrap().raw(), default.raw());

    let pool = MemPool::new(&dev, Some(64 * MIB)).unwrap();
    assert!(pool.is_owned());
    pool.set_release_threshold(u64::MAX).unwrap();
    assert_eq!(pool.release_threshold().unwrap(), u64::MAX);
    assert_eq!(pool.used_current().unwrap(), 0);

    let mem = StreamOrderedMemory::from_pool(&pool, 8 * MIB, &stream).unwrap();
    let view = DevicePtr::new(mem);
    view.memset_async(0x6b, &stream).unwrap();
    let mut back = vec![0u8; 8 * MIB];
    // SAFETY: `back` is untouched until the stream is synchronised.
    unsafe { view.copy_to_host_async(&mut back, &stream).unwrap() };
    stream.synchronize().unwrap();
    assert_all(&back, 0x6b, "stream-ordered memory");
    let used = pool.used_current().unwrap();
    let reserved = pool.reserved_current().unwrap();
    println!("pool: used {used}, reserved {reserved}");
    assert!(used >= 8 * MIB as u64 && reserved >= used);
    drop(view); // cuMemFreeAsync on `stream`
    stream.synchronize().unwrap();
    assert_eq!(pool.used_current().unwrap(), 0);
    assert!(pool.used_high().unwrap() >= 8 * MIB as u64);
    assert!(
        pool.reserved_current().unwrap() > 0,
        "the threshold keeps memory cached"
    );

    // Raw calls, size 0, and the pool's maximum size.
    let p = pool.alloc_async(MIB, &stream).unwrap();
    assert_ne!(p, 0);
    // SAFETY: `p` came from the pool and is freed once.
    unsafe { async_pool::free_async(p, &stream).unwrap() };
    assert_eq!(pool.alloc_async(0, &stream).unwrap(), 0);
    let too_big = pool.alloc_async(128 * MIB, &stream);
    println!("128 MiB from a 64 MiB pool: {too_big:?}");
    assert!(too_big.is_err(), "maxSize holds");
    stream.synchronize().unwrap();

    pool.trim_to(0).unwrap();
    assert_eq!(
        pool.reserved_current().unwrap(),
        0,
        "trim releases cached memory"
    );
    pool.reset_high_watermarks().unwrap();
    assert_eq!(pool.used_high().unwrap(), 0);

    for attr in [
        PoolAttribute::ReuseFollowEventDependencies,
        PoolAttribute::ReuseAllowOpportunistic,
        PoolAttribute::ReuseAllowInternalDependencies,
    ] {
        let was = pool.attribute(attr).unwrap();
        assert!(was <= 1);
        pool.set_attribute(attr, 1 - was).unwrap();
        assert_eq!(pool.attribute(attr).unwrap(), 1 - was, "{attr:?}");
        pool.set_attribute(attr, was).unwrap();
    }
    assert!(
        pool.set_attribute(PoolAttribute::UsedCurrent, 5).is_err(),
        "read-only"
    );

    // The current pool serves cuMemAllocAsync.
    pool.make_current().unwrap();
    assert_eq!(MemPool::current(&dev).unwrap().raw(), pool.raw());
    let mem = StreamOrderedMemory::new(2 * MIB, &stream).unwrap();
    stream.synchronize().unwrap();
    assert!(pool.used_current().unwrap() >= 2 * MIB as u64);
    drop(mem);
    stream.synchronize().unwrap();
    assert_eq!(pool.used_current().unwrap(), 0);
    default.make_current().unwrap();
    assert_eq!(MemPool::current(&dev).unwrap().raw(), default.raw());

    // Wrapping an existing handle does not destroy it.
    // SAFETY: `pool` outlives the wrapper.
    let wrapped = unsafe { MemPool::from_raw(pool.raw(), dev) };
    assert!(!wrapped.is_owned());
    drop(wrapped);
    assert_eq!(pool.used_current().unwrap(), 0, "still alive");

    // A stream of the right device is checked (one device here: the default path).
    let raw = async_pool::alloc_async(4096, &stream).unwrap();
    // SAFETY: `raw` came from cuMemAllocAsync and is freed once.
    unsafe { async_pool::free_async(raw, &stream).unwrap() };
    stream.synchronize().unwrap();
}

#[test]
#[ignore = "needs two GPUs"]
fn peer_copies_between_two_devices() {
    let _s = serial();
    let count = cudars_core::device_count().unwrap();
    assert!(count >= 2, "this test needs two GPUs, found {count}");
    let (d0, d1) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    let size = 64 * MIB + 5;
    let data = pattern(size, 99);
    let a = DevicePtr::alloc(&d0, size).unwrap();
    let b = DevicePtr::alloc(&d1, size).unwrap();
    a.copy_from_host(&data).unwrap();

    // Without peer access (the driver stages), then with it.
    b.copy_from_device(&a).unwrap();
    assert_bytes(&b.to_vec().unwrap(), &data, "peer copy 0 -> 1");
    if d1.can_access_peer(&d0).unwrap() {
        d1.enable_peer_access(&d0).unwrap();
        d0.enable_peer_access(&d1).unwrap();
    }
    let s1 = Stream::new(&d1).unwrap();
    a.memset(0).unwrap();
    b.memset_async(0x21, &s1).unwrap();
    let s0 = Stream::new(&d0).unwrap();
    s1.synchronize().unwrap();
    a.copy_from_device_async(&b, &s0).unwrap();
    s0.synchronize().unwrap();
    assert_all(&a.to_vec().unwrap(), 0x21, "async peer copy 1 -> 0");

    // A stream of the other device is a typed error.
    match a.memset_async(0, &s1) {
        Err(Error::WrongDevice {
            what,
            expected,
            actual,
        }) => {
            assert_eq!((what, expected, actual), ("stream", 0, 1))
        }
        other => panic!("expected WrongDevice, got {other:?}"),
    }
    assert!(matches!(
        b.copy_from_device_async(&a, &s0),
        Err(Error::WrongDevice { .. })
    ));
    assert_eq!(
        pointer::locate_device(b.as_raw()).unwrap(),
        Location::Device(d1)
    );
}
