//! GPU: cuda-xfer's typed transfers: round trips of every size from pageable, pinned and
//! registered memory, aligned and not, sync and async; async transfers ordered against
//! kernels on the same stream; 2-D transfers in both orders (and through ndarray); where
//! memory lives; peer copies (two GPUs); synchronous transfers done for non-blocking
//! streams the moment they return (issue 25).
//!
//! Every test takes `SERIAL` (the route counters and the staging configuration are
//! process-wide); run with `--test-threads=1` anyway, the 1 GiB cases are large.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::memory::{AttachFlags, DevicePtr, ManagedMemory};
use cudars_core::{Device, Stream};
use cudars_xfer::half::{bf16, f16};
use cudars_xfer::layout::{Layout2, Order};
use cudars_xfer::location::{
    locate_buffer, locate_device_address, locate_range, locate_slice, Location,
};
use cudars_xfer::matrix::{
    copy_matrix_to_device, matrix_to_device, matrix_to_host, matrix_to_host_into, DeviceMatrix,
};
use cudars_xfer::ndarray::{s, Array2, ShapeBuilder};
use cudars_xfer::staging::{self, route_stats, StagingConfig};
use cudars_xfer::{
    copy_device, copy_device_async, copy_to_device, copy_to_device_async, copy_to_device_on_stream,
    register, scope, to_device, to_device_async, to_device_of, to_host, to_host_async,
    to_host_into, DeviceBuffer, Error, PinnedBuffer,
};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
/// The sizes issue 6 asks for.
const SIZES: [usize; 7] = [0, 1, 7, 4 * KIB + 1, MIB, 64 * MIB + 5, GIB];

/// SM clocks a "slow" kernel spins: about 0.1 s on an H200 (1.98 GHz).
const SLOW: u64 = 200_000_000;

/// Fills `buf` with a position- and seed-dependent pattern, eight bytes at a time.
fn fill(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        let v = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        c.copy_from_slice(&v.to_le_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(seed as u8) ^ 0x5a;
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed);
    v
}

/// Asserts equality without printing a gigabyte on failure.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{what}: first difference at byte {at} of {}: got {:#04x}, want {:#04x}",
            got.len(),
            got[at],
            want[at]
        );
    }
}

/// Whether a transfer of `bytes` pageable bytes is staged with the current configuration.
fn staged(bytes: usize) -> bool {
    bytes >= staging::config().min_staged_bytes
}

#[test]
fn pageable_round_trips_of_every_size_aligned_and_not() {
    let _s = serial();
    let dev = dev0();
    for &n in &SIZES {
        for skew in [0usize, 1] {
            let mut host = vec![0u8; n + skew];
            fill(&mut host[skew..], n as u64 + skew as u64);
            let src = &host[skew..];
            let before = route_stats();
            let on_device = to_device(&dev, src).unwrap();
            assert_eq!(on_device.len(), n);
            let back = to_host(&on_device).unwrap();
            same(&back, src, &format!("to_host {n} skew {skew}"));
            let mut out = vec![0xa5u8; n + 3];
            to_host_into(&on_device, &mut out[3..]).unwrap();
            same(&out[3..], src, &format!("to_host_into {n} skew {skew}"));
            assert_eq!(&out[..3], &[0xa5; 3], "bytes before the slice untouched");
            let after = route_stats();
            if n > 0 && staged(n) {
                // Three copies of pageable memory this size: all three staged.
                assert_eq!(after.staged - before.staged, 3, "size {n}");
                assert_eq!(after.staged_bytes - before.staged_bytes, 3 * n as u64);
            } else {
                assert_eq!(
                    after.staged, before.staged,
                    "size {n} goes straight to the driver"
                );
            }
        }
    }
}

#[test]
fn pinned_round_trips_of_every_size_are_direct() {
    let _s = serial();
    let dev = dev0();
    for &n in &SIZES {
        for skew in [0usize, 1] {
            let mut src = PinnedBuffer::<u8>::zeroed(&dev, n + skew).unwrap();
            fill(&mut src[skew..], 7 + n as u64);
            let mut out = PinnedBuffer::<u8>::zeroed(&dev, n + skew).unwrap();
            let before = route_stats();
            let on_device = to_device(&dev, &src[skew..]).unwrap();
            to_host_into(&on_device, &mut out[skew..]).unwrap();
            same(
                &out[skew..],
                &src[skew..],
                &format!("pinned {n} skew {skew}"),
            );
            let after = route_stats();
            assert_eq!(
                after.staged, before.staged,
                "pinned memory is never staged ({n})"
            );
            if n > 0 {
                assert_eq!(after.direct - before.direct, 2);
            }
        }
    }
}

#[test]
fn registered_round_trips_of_every_size_are_direct() {
    let _s = serial();
    let dev = dev0();
    for &n in &SIZES {
        let mut reg = register(&dev, pattern(n + 1, 99 + n as u64)).unwrap();
        let mut out = register(&dev, vec![0u8; n + 1]).unwrap();
        let before = route_stats();
        let on_device = to_device(&dev, &reg.as_slice()[1..]).unwrap();
        to_host_into(&on_device, &mut out.as_mut_slice()[1..]).unwrap();
        same(
            &out.as_slice()[1..],
            &reg.as_slice()[1..],
            &format!("registered {n}"),
        );
        let after = route_stats();
        assert_eq!(
            after.staged, before.staged,
            "registered memory is never staged ({n})"
        );
        // Registered memory stays registered while written through the registration.
        reg.as_mut_slice()[0] ^= 1;
        assert_eq!(
            locate_slice(reg.as_slice()).unwrap(),
            if n + 1 > 0 {
                Location::PinnedHost
            } else {
                Location::PageableHost
            }
        );
        let data = reg.into_inner();
        assert_eq!(data.len(), n + 1);
        if n >= 4 * KIB {
            assert_eq!(
                locate_slice(&data).unwrap(),
                Location::PageableHost,
                "unregistered"
            );
        }
    }
}

#[test]
fn async_round_trips_of_every_size_with_owned_buffers() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    for &n in &SIZES {
        // Pageable Vec (staged when large).
        let src = pattern(n, 3 * n as u64);
        let (on_device, pending) = to_device_async(src.clone(), &stream).unwrap();
        let returned = pending.wait().unwrap();
        same(&returned, &src, "the source comes back unchanged");
        let back = to_host_async(&on_device, vec![0u8; n], &stream)
            .unwrap()
            .wait()
            .unwrap();
        same(&back, &src, &format!("async Vec {n}"));

        // Pinned.
        let pinned = PinnedBuffer::from_slice(&dev, &src).unwrap();
        let (on_device, pending) = to_device_async(pinned, &stream).unwrap();
        let out = PinnedBuffer::<u8>::zeroed(&dev, n).unwrap();
        let pending_out = to_host_async(&on_device, out, &stream).unwrap();
        drop(pending); // waits; the device buffer stays usable in stream order
        let out = pending_out.wait().unwrap();
        same(&out, &src, &format!("async pinned {n}"));

        // Registered.
        let reg = register(&dev, src.clone()).unwrap();
        let target = DeviceBuffer::<u8>::zeroed(&dev, n).unwrap();
        let reg = copy_to_device_async(reg, &target, &stream)
            .unwrap()
            .wait()
            .unwrap();
        let out = register(&dev, vec![0u8; n]).unwrap();
        let out = to_host_async(&target, out, &stream)
            .unwrap()
            .wait()
            .unwrap();
        same(
            out.as_slice(),
            reg.as_slice(),
            &format!("async registered {n}"),
        );
    }
}

#[test]
fn scoped_async_round_trips_from_unaligned_borrowed_slices() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    for &n in &SIZES {
        let host = pattern(n + 1, 11 + n as u64);
        let mut out = vec![0u8; n + 1];
        let on_device = DeviceBuffer::<u8>::alloc(&dev, n).unwrap();
        scope(|s| {
            s.copy_to_device(&host[1..], &on_device, &stream)?;
            s.to_host(&on_device, &mut out[1..], &stream)
        })
        .unwrap()
        .unwrap();
        same(&out[1..], &host[1..], &format!("scoped {n}"));
    }
}

/// Data copied to the device asynchronously lands after the kernels queued before it, and
/// before the kernels queued after it, from pinned and from (staged) pageable memory.
#[test]
fn async_copies_to_the_device_are_ordered_with_kernels_on_the_stream() {
    let _s = serial();
    let dev = dev0();
    let kernels = Kernels::load(&dev).unwrap();
    let stream = Stream::new(&dev).unwrap();
    for n in [1024usize, 16 * MIB + 1] {
        let buf = DeviceBuffer::<u32>::zeroed(&dev, n).unwrap();
        // A slow kernel writes 1 everywhere; the copy must overwrite it with 5, then +1.
        // SAFETY: `buf` holds `n` u32 and outlives the stream work (synchronised below).
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 1, n as u64, SLOW) }.unwrap();
        let pending = copy_to_device_async(vec![5u32; n], &buf, &stream).unwrap();
        // SAFETY: as above.
        unsafe { kernels.add_u32_raw(&stream, buf.as_raw(), 1, n as u64) }.unwrap();
        let out = to_host_async(&buf, vec![0u32; n], &stream)
            .unwrap()
            .wait()
            .unwrap();
        assert!(
            out.iter().all(|&x| x == 6),
            "pageable, {n} elements: {:?}",
            &out[..4]
        );
        drop(pending);

        let src = PinnedBuffer::from_slice(&dev, &vec![9u32; n]).unwrap();
        // SAFETY: as above.
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 1, n as u64, SLOW) }.unwrap();
        let pending = copy_to_device_async(src, &buf, &stream).unwrap();
        assert!(
            !pending.is_complete().unwrap(),
            "a pinned copy queued behind a slow kernel is still pending"
        );
        // SAFETY: as above.
        unsafe { kernels.add_u32_raw(&stream, buf.as_raw(), 1, n as u64) }.unwrap();
        let out = PinnedBuffer::<u32>::zeroed(&dev, n).unwrap();
        let out = to_host_async(&buf, out, &stream).unwrap().wait().unwrap();
        assert!(
            out.iter().all(|&x| x == 10),
            "pinned, {n} elements: {:?}",
            &out[..4]
        );
        assert!(pending.is_complete().unwrap());
        pending.wait().unwrap();
    }
}

/// Copies to the host wait for the kernels queued before them on the stream.
#[test]
fn async_copies_to_the_host_see_earlier_kernels() {
    let _s = serial();
    let dev = dev0();
    let kernels = Kernels::load(&dev).unwrap();
    let stream = Stream::new(&dev).unwrap();
    for n in [1024usize, 16 * MIB + 1] {
        let buf = DeviceBuffer::<u32>::zeroed(&dev, n).unwrap();
        // SAFETY: `buf` holds `n` u32 and outlives the stream work.
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 7, n as u64, SLOW) }.unwrap();
        let pinned = PinnedBuffer::<u32>::zeroed(&dev, n).unwrap();
        let pending = to_host_async(&buf, pinned, &stream).unwrap();
        assert!(
            !pending.is_complete().unwrap(),
            "queued behind the slow kernel"
        );
        let out = pending.wait().unwrap();
        assert!(out.iter().all(|&x| x == 7), "pinned {n}");

        // SAFETY: as above.
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 8, n as u64, SLOW) }.unwrap();
        let out = to_host_async(&buf, vec![0u32; n], &stream)
            .unwrap()
            .wait()
            .unwrap();
        assert!(out.iter().all(|&x| x == 8), "pageable {n}");

        // SAFETY: as above.
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 9, n as u64, SLOW) }.unwrap();
        let mut borrowed = vec![0u32; n];
        scope(|s| s.to_host(&buf, &mut borrowed, &stream))
            .unwrap()
            .unwrap();
        assert!(borrowed.iter().all(|&x| x == 9), "scoped {n}");

        // The synchronous copy is ordered after blocking streams' work too.
        // SAFETY: as above.
        unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 10, n as u64, SLOW) }.unwrap();
        assert!(
            to_host(&buf).unwrap().iter().all(|&x| x == 10),
            "sync after a blocking stream {n}"
        );
    }
}

#[test]
fn a_dropped_pending_transfer_waits_and_a_forgotten_one_leaks_safely() {
    let _s = serial();
    let dev = dev0();
    let kernels = Kernels::load(&dev).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let n = 4096;
    let buf = DeviceBuffer::<u32>::zeroed(&dev, n).unwrap();
    // SAFETY: `buf` holds `n` u32 and outlives the stream work.
    unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 3, n as u64, SLOW) }.unwrap();
    let pending =
        to_host_async(&buf, PinnedBuffer::<u32>::zeroed(&dev, n).unwrap(), &stream).unwrap();
    drop(pending);
    assert!(
        stream.is_done().unwrap(),
        "dropping the pending transfer waited for it"
    );

    // SAFETY: as above.
    unsafe { kernels.spin_then_fill_raw(&stream, buf.as_raw(), 4, n as u64, SLOW) }.unwrap();
    let pending = to_host_async(&buf, vec![0u32; n], &stream).unwrap();
    std::mem::forget(pending); // the Vec is leaked with it, never freed under the DMA
    stream.synchronize().unwrap();
}

#[test]
fn typed_elements_half_floats_and_structs_round_trip() {
    let _s = serial();
    let dev = dev0();
    let h: Vec<f16> = (0..3001).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
    assert_eq!(to_host(&to_device(&dev, &h).unwrap()).unwrap(), h);
    let b: Vec<bf16> = (0..3001).map(|i| bf16::from_f32(-(i as f32))).collect();
    assert_eq!(to_host(&to_device(&dev, &b).unwrap()).unwrap(), b);
    let big: Vec<f64> = (0..(3 * MIB / 8 + 1)).map(|i| i as f64 / 3.0).collect();
    assert_eq!(to_host(&to_device(&dev, &big).unwrap()).unwrap(), big);

    #[derive(
        Clone, Copy, Debug, PartialEq, cudars_xfer::bytemuck::Pod, cudars_xfer::bytemuck::Zeroable,
    )]
    #[bytemuck(crate = "cudars_xfer::bytemuck")]
    #[repr(C)]
    struct Particle {
        pos: [f32; 3],
        id: u32,
    }
    let p: Vec<Particle> = (0..1000)
        .map(|i| Particle {
            pos: [i as f32, 1.0, -1.0],
            id: i,
        })
        .collect();
    assert_eq!(to_host(&to_device(&dev, &p).unwrap()).unwrap(), p);
}

#[test]
fn size_and_alignment_rules_are_typed_errors_that_change_nothing() {
    let _s = serial();
    let dev = dev0();
    let buf = to_device(&dev, &[1u32, 2, 3, 4]).unwrap();
    let mut short = [0u32; 3];
    assert_eq!(
        to_host_into(&buf, &mut short),
        Err(Error::LengthMismatch {
            op: "to_host_into",
            dst: 3,
            src: 4
        })
    );
    assert_eq!(short, [0; 3]);
    assert!(matches!(
        copy_to_device(&[9u32; 5], &buf),
        Err(Error::LengthMismatch { .. })
    ));
    assert_eq!(
        to_host(&buf).unwrap(),
        vec![1, 2, 3, 4],
        "nothing was copied"
    );

    let bytes = DevicePtr::alloc(&dev, 16).unwrap();
    let odd = bytes.slice(1..9).unwrap();
    assert!(matches!(
        DeviceBuffer::<u32>::from_ptr(odd.clone()),
        Err(Error::Misaligned { align: 4, .. })
    ));
    assert!(DeviceBuffer::<u8>::from_ptr(odd).is_ok());
    assert!(matches!(
        DeviceBuffer::<u64>::from_ptr(bytes.slice(0..12).unwrap()),
        Err(Error::NotWholeElements {
            bytes: 12,
            elem_size: 8
        })
    ));
    assert!(matches!(
        DeviceBuffer::<u64>::alloc(&dev, usize::MAX / 4),
        Err(Error::SizeOverflow { .. })
    ));

    // Empty transfers need no memory and no copy.
    let empty = to_device::<f32>(&dev, &[]).unwrap();
    assert!(empty.is_empty());
    assert_eq!(to_host(&empty).unwrap(), Vec::<f32>::new());

    // A stream of another device is rejected before anything is queued (with one GPU,
    // a wrong length is the bad input available).
    let stream = Stream::new(&dev).unwrap();
    assert!(matches!(
        to_host_async(&buf, vec![0u32; 5], &stream),
        Err(Error::LengthMismatch { .. })
    ));
}

#[test]
fn device_to_device_copies() {
    let _s = serial();
    let dev = dev0();
    let src = to_device(&dev, &pattern(3 * MIB + 1, 5)).unwrap();
    let dst = DeviceBuffer::<u8>::zeroed(&dev, 3 * MIB + 1).unwrap();
    copy_device(&src, &dst).unwrap();
    same(
        &to_host(&dst).unwrap(),
        &to_host(&src).unwrap(),
        "copy_device",
    );
    let stream = Stream::new(&dev).unwrap();
    let dst2 = DeviceBuffer::<u8>::zeroed(&dev, 3 * MIB + 1).unwrap();
    copy_device_async(&dst, &dst2, &stream).unwrap();
    stream.synchronize().unwrap();
    same(
        &to_host(&dst2).unwrap(),
        &to_host(&src).unwrap(),
        "copy_device_async",
    );
    let copy = to_device_of(&src, &dev).unwrap();
    assert_ne!(copy.as_raw(), src.as_raw());
    same(
        &to_host(&copy).unwrap(),
        &to_host(&src).unwrap(),
        "to_device_of",
    );
    assert!(matches!(
        copy_device(&src, &src.slice(1..).unwrap()),
        Err(Error::LengthMismatch { .. })
    ));
}

#[test]
fn small_staging_chunks_and_one_thread_still_move_everything() {
    let _s = serial();
    let dev = dev0();
    let previous = staging::set_config(StagingConfig {
        chunk_bytes: 64 * KIB + 3,
        slots: 2,
        part_bytes: 5000,
        min_staged_bytes: 1,
        helpers: 0,
        min_chunks: 1,
        ..StagingConfig::default()
    })
    .unwrap();
    let result = std::panic::catch_unwind(|| {
        let src = pattern(5 * MIB + 17, 21);
        let d = to_device(&dev, &src[1..]).unwrap();
        same(&to_host(&d).unwrap(), &src[1..], "tiny chunks, no helpers");
    });
    staging::set_config(StagingConfig {
        helpers: 3,
        ..staging::config()
    })
    .unwrap();
    let result2 = std::panic::catch_unwind(|| {
        let src = pattern(5 * MIB + 17, 22);
        let d = to_device(&dev, &src).unwrap();
        same(&to_host(&d).unwrap(), &src, "tiny chunks, three helpers");
    });
    staging::set_config(previous).unwrap();
    result.unwrap();
    result2.unwrap();
    assert!(staging::set_config(StagingConfig {
        slots: 0,
        ..previous
    })
    .is_err());
    assert_eq!(
        staging::config(),
        previous,
        "an invalid configuration changes nothing"
    );
    assert!(staging::release_cached() > 0, "staging buffers were cached");
}

#[test]
fn matrices_in_both_orders() {
    let _s = serial();
    let dev = dev0();
    let (rows, cols) = (300usize, 517usize);
    let c: Vec<f32> = (0..rows * cols).map(|k| k as f32).collect();
    let c_layout = Layout2::contiguous(rows, cols, Order::RowMajor);
    let at = |i: usize, j: usize| (i * cols + j) as f32;

    // Row-major host to column-major device and back, both orders.
    let m = matrix_to_device(&dev, &c, c_layout, Order::ColumnMajor).unwrap();
    let raw = to_host(m.buffer()).unwrap();
    assert_eq!(raw[1], at(1, 0), "column-major on the device");
    assert_eq!(raw[rows], at(0, 1));
    assert_eq!(matrix_to_host(&m, Order::RowMajor).unwrap(), c);
    let f = matrix_to_host(&m, Order::ColumnMajor).unwrap();
    assert_eq!(f, raw);

    // Column-major host to row-major device.
    let m2 = matrix_to_device(
        &dev,
        &f,
        Layout2::contiguous(rows, cols, Order::ColumnMajor),
        Order::RowMajor,
    )
    .unwrap();
    assert_eq!(to_host(m2.buffer()).unwrap(), c);

    // A pitched device matrix keeps its gaps.
    let ld = cols + 3;
    let backing = DeviceBuffer::<f32>::alloc(&dev, rows * ld).unwrap();
    backing.as_ptr().memset_u32(f32::to_bits(-1.0)).unwrap();
    let pitched = DeviceMatrix::new(
        backing.clone(),
        Layout2::with_leading_dimension(rows, cols, Order::RowMajor, ld).unwrap(),
    )
    .unwrap();
    copy_matrix_to_device(
        &f,
        Layout2::contiguous(rows, cols, Order::ColumnMajor),
        &pitched,
    )
    .unwrap();
    let all = to_host(&backing).unwrap();
    for i in 0..rows {
        assert_eq!(
            &all[i * ld..i * ld + cols],
            &c[i * cols..(i + 1) * cols],
            "row {i}"
        );
        assert_eq!(
            &all[i * ld + cols..(i + 1) * ld],
            &[-1.0; 3],
            "gap after row {i}"
        );
    }
    // ... and reads into a pitched host layout too.
    let host_layout =
        Layout2::with_leading_dimension(rows, cols, Order::ColumnMajor, rows + 2).unwrap();
    let mut host = vec![7.0f32; host_layout.span().unwrap()];
    matrix_to_host_into(&pitched, &mut host, host_layout).unwrap();
    assert_eq!(host[0], at(0, 0));
    assert_eq!(host[rows + 2 + 5], at(5, 1));
    assert_eq!(host[rows], 7.0, "host gap untouched");

    // Shape mismatches are errors.
    let mut wrong = vec![0f32; rows * cols];
    assert!(matches!(
        matrix_to_host_into(
            &m,
            &mut wrong,
            Layout2::contiguous(cols, rows, Order::RowMajor)
        ),
        Err(Error::ShapeMismatch { .. })
    ));
}

#[test]
fn ndarray_arrays_in_and_out() {
    use cudars_xfer::array::{
        array1_to_device, array_to_device, buffer_to_array1, matrix_to_array, matrix_to_array_into,
    };
    let _s = serial();
    let dev = dev0();
    let a = Array2::from_shape_fn((123, 45), |(i, j)| (i * 1000 + j) as i64);
    for device_order in [Order::RowMajor, Order::ColumnMajor] {
        let m = array_to_device(&dev, a.view(), device_order).unwrap();
        assert_eq!(m.order(), device_order);
        let back_c = matrix_to_array(&m, Order::RowMajor).unwrap();
        assert_eq!(back_c, a);
        assert!(back_c.is_standard_layout());
        let back_f = matrix_to_array(&m, Order::ColumnMajor).unwrap();
        assert_eq!(back_f, a);
        assert!(back_f.t().is_standard_layout(), "Fortran order");
    }
    // A Fortran-order array and a strided view go up too.
    let mut f = Array2::<i64>::zeros((123, 45).f());
    f.assign(&a);
    let m = array_to_device(&dev, f.view(), Order::RowMajor).unwrap();
    assert_eq!(matrix_to_array(&m, Order::RowMajor).unwrap(), a);
    let strided = a.slice(s![..;2, 1..;3]);
    let m = array_to_device(&dev, strided, Order::ColumnMajor).unwrap();
    assert_eq!(matrix_to_array(&m, Order::RowMajor).unwrap(), strided);
    // Into an existing strided array.
    let m = array_to_device(&dev, a.view(), Order::RowMajor).unwrap();
    let mut target = Array2::<i64>::zeros((246, 45));
    matrix_to_array_into(&m, target.slice_mut(s![..;2, ..])).unwrap();
    assert_eq!(target.slice(s![..;2, ..]), a);
    assert!(target.slice(s![1..;2, ..]).iter().all(|&x| x == 0));
    // 1-D.
    let v = cudars_xfer::ndarray::Array1::from_iter((0..1000).map(|i| i as f32));
    let d = array1_to_device(&dev, v.view()).unwrap();
    assert_eq!(buffer_to_array1(&d).unwrap(), v);
    let every_other = v.slice(s![..;2]);
    let d = array1_to_device(&dev, every_other).unwrap();
    assert_eq!(buffer_to_array1(&d).unwrap(), every_other);
}

#[test]
fn locations_for_each_kind_of_memory() {
    let _s = serial();
    let dev = dev0();
    let on_device = to_device(&dev, &[1u8; 4096]).unwrap();
    assert_eq!(locate_buffer(&on_device).unwrap(), Location::Device(dev));
    assert!(Location::Device(dev).is_device());
    let pinned = PinnedBuffer::<u8>::zeroed(&dev, 4096).unwrap();
    assert_eq!(locate_slice(&pinned).unwrap(), Location::PinnedHost);
    assert_eq!(
        cudars_xfer::locate(pinned.as_ptr()).unwrap(),
        Location::PinnedHost
    );
    let pageable = vec![0u8; 1 << 20];
    assert_eq!(locate_slice(&pageable).unwrap(), Location::PageableHost);
    let on_stack = [0u64; 4];
    assert_eq!(locate_slice(&on_stack).unwrap(), Location::PageableHost);
    assert_eq!(
        cudars_xfer::locate(std::ptr::null::<u8>()).unwrap(),
        Location::PageableHost
    );

    let reg = register(&dev, vec![0u8; 4 << 20]).unwrap();
    assert_eq!(
        locate_slice(&reg.as_slice()[100..]).unwrap(),
        Location::PinnedHost
    );

    let managed = ManagedMemory::new(&dev, 1 << 20, AttachFlags::GLOBAL).unwrap();
    assert_eq!(
        locate_device_address(managed.as_raw()).unwrap(),
        Location::Managed
    );
    assert!(Location::Managed.is_dma_ready() && Location::PinnedHost.is_dma_ready());
    assert!(!Location::PageableHost.is_dma_ready());
}

#[test]
fn a_range_straddling_a_registered_buffer_is_pageable() {
    let _s = serial();
    let dev = dev0();
    let mut big = vec![0u8; 16 << 20];
    let base = big.as_ptr();
    let reg = register(&dev, &mut big[..8 << 20]).unwrap();
    assert_eq!(locate_slice(reg.as_slice()).unwrap(), Location::PinnedHost);
    // The last KiB of the registered half, and that KiB plus 64 KiB after it (beyond any
    // page rounding of the registration). No reference is made: `locate_range` only asks
    // the driver about the addresses.
    // SAFETY: both ends lie inside `big`'s allocation.
    let straddle = unsafe { base.add((8 << 20) - 1024) };
    assert_eq!(locate_range(straddle, 1024).unwrap(), Location::PinnedHost);
    assert_eq!(
        locate_range(straddle, 1024 + (64 << 10)).unwrap(),
        Location::PageableHost
    );
    drop(reg);
    assert_eq!(
        locate_range(straddle, 1024).unwrap(),
        Location::PageableHost,
        "unregistered"
    );
}

#[test]
#[ignore = "needs two GPUs"]
fn peer_copies_between_two_devices() {
    let _s = serial();
    let (d0, d1) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    let src = to_device(&d0, &pattern(64 * MIB + 5, 77)).unwrap();
    let on_1 = to_device_of(&src, &d1).unwrap();
    assert_eq!(on_1.device(), d1);
    same(
        &to_host(&on_1).unwrap(),
        &to_host(&src).unwrap(),
        "peer copy",
    );
    let back = DeviceBuffer::<u8>::zeroed(&d0, src.len()).unwrap();
    let stream = Stream::new(&d0).unwrap();
    copy_device_async(&on_1, &back, &stream).unwrap();
    stream.synchronize().unwrap();
    same(
        &to_host(&back).unwrap(),
        &to_host(&src).unwrap(),
        "peer copy back, async",
    );
    // A stream of the wrong device is rejected before anything is queued.
    let s1 = Stream::new(&d1).unwrap();
    assert!(matches!(
        to_host_async(&src, vec![0u8; src.len()], &s1),
        Err(Error::Cuda(cudars_core::Error::WrongDevice { .. }))
    ));
}

/// splitmix64: the random sizes and contents of the landing tests (seeded: reproducible).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A size from 1 byte to `max`, log-uniform (as many tiny copies as large ones).
    fn size(&mut self, max: usize) -> usize {
        let bits = (self.next() % (max.ilog2() as u64 + 1)) as u32;
        let n = (1usize << bits) + (self.next() as usize & ((1usize << bits) - 1));
        n.clamp(1, max)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let tail = self.next().to_le_bytes();
        let rest = chunks.into_remainder();
        let n = rest.len();
        rest.copy_from_slice(&tail[..n]);
    }
}

/// Issue 25: a synchronous `to_device` means done. 10,000 rounds, each a pageable
/// `to_device` of a random size (1 byte to 3 MiB, log-uniform) and random contents,
/// followed at once by a device-to-device copy on a NON-BLOCKING stream; the copy is read
/// back and compared byte for byte. Every eighth round also checks a sibling the same way:
/// `copy_to_device` into a reused buffer, `to_device` from a pinned slice, `copy_device`,
/// `DeviceBuffer::zeroed`.
///
/// This fails on the old code: there a pageable copy below the staging threshold (1 MiB) was
/// a bare `cuMemcpyHtoD`, which returns once the driver holds the source in its bounce
/// buffer, before the last DMA has landed. The legacy stream orders later work on itself
/// and on blocking streams after that DMA, but a non-blocking stream is not ordered with
/// it, so its copy could read the destination before the bytes arrived (issue 25's stress
/// run: 3 of 134 copies saw stale zeros; bench_xfer's landing check counts the same race on
/// the bare driver call). `copy_device` (`cuMemcpyDtoD`) and `zeroed` (`cuMemsetD8`) returned
/// before the device had even started.
#[test]
fn to_device_is_done_for_work_on_a_non_blocking_stream() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    const MAX: usize = 3 * MIB;
    let scratch = DeviceBuffer::<u8>::alloc(&dev, MAX).unwrap();
    let reused = DeviceBuffer::<u8>::alloc(&dev, MAX).unwrap();
    let mut pinned = PinnedBuffer::<u8>::zeroed(&dev, MAX).unwrap();
    let mut back = vec![0u8; MAX];
    let mut rng = Rng(0x25_2025);
    let mut src = vec![0u8; MAX];
    for round in 0..10_000 {
        let n = rng.size(MAX);
        let src = &mut src[..n];
        rng.fill(src);
        let out = scratch.slice(..n).unwrap();
        // The case: `to_device`, then at once a copy on the non-blocking stream.
        let d = to_device(&dev, src).unwrap();
        copy_device_async(&d, &out, &stream).unwrap();
        stream.synchronize().unwrap();
        to_host_into(&out, &mut back[..n]).unwrap();
        same(
            &back[..n],
            src,
            &format!("to_device, round {round}, {n} bytes"),
        );
        if round % 8 != 7 {
            continue;
        }
        // Siblings, each followed at once by the non-blocking stream's copy.
        // Each arm gives back the buffers the stream's copy reads, alive until it is done.
        let (what, _alive) = match round / 8 % 4 {
            0 => {
                let dst = reused.slice(..n).unwrap();
                copy_to_device(src, &dst).unwrap();
                copy_device_async(&dst, &out, &stream).unwrap();
                ("copy_to_device", dst)
            }
            1 => {
                pinned[..n].copy_from_slice(src);
                let d = to_device(&dev, &pinned[..n]).unwrap();
                copy_device_async(&d, &out, &stream).unwrap();
                ("to_device from pinned memory", d)
            }
            2 => {
                let dst = reused.slice(..n).unwrap();
                copy_device(&d, &dst).unwrap();
                copy_device_async(&dst, &out, &stream).unwrap();
                ("copy_device", dst)
            }
            _ => {
                let z = DeviceBuffer::<u8>::zeroed(&dev, n).unwrap();
                copy_device_async(&z, &out, &stream).unwrap();
                src.fill(0);
                ("zeroed", z)
            }
        };
        stream.synchronize().unwrap();
        to_host_into(&out, &mut back[..n]).unwrap();
        same(
            &back[..n],
            src,
            &format!("{what}, round {round}, {n} bytes"),
        );
    }
}

/// The other direction of issue 25: a copy on a non-blocking stream writes a buffer, that
/// stream is synchronised, and `to_host` (or `to_host_into`) returns every byte of it.
/// Then the stream-ordered form: `copy_to_device_on_stream` followed by a copy on the same
/// non-blocking stream (stream order alone, no wait).
#[test]
fn to_host_after_a_non_blocking_stream_and_stream_ordered_uploads() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    const MAX: usize = 3 * MIB;
    let scratch = DeviceBuffer::<u8>::alloc(&dev, MAX).unwrap();
    let mut rng = Rng(0x25_0002);
    let mut src = vec![0u8; MAX];
    let mut back = vec![0u8; MAX];
    for round in 0..2_000 {
        let n = rng.size(MAX);
        let src = &mut src[..n];
        rng.fill(src);
        let d = to_device(&dev, src).unwrap();
        let out = scratch.slice(..n).unwrap();
        copy_device_async(&d, &out, &stream).unwrap();
        stream.synchronize().unwrap();
        if round % 2 == 0 {
            same(
                &to_host(&out).unwrap(),
                src,
                &format!("to_host, round {round}"),
            );
        } else {
            to_host_into(&out, &mut back[..n]).unwrap();
            same(&back[..n], src, &format!("to_host_into, round {round}"));
        }
        // Stream-ordered upload, then work on the same stream.
        rng.fill(src);
        let dst = DeviceBuffer::<u8>::alloc(&dev, n).unwrap();
        copy_to_device_on_stream(src, &dst, &stream).unwrap();
        copy_device_async(&dst, &out, &stream).unwrap();
        stream.synchronize().unwrap();
        to_host_into(&out, &mut back[..n]).unwrap();
        same(
            &back[..n],
            src,
            &format!("copy_to_device_on_stream, round {round}"),
        );
    }
    let other = Stream::new(&Device::new(0).unwrap()).unwrap();
    let dst = DeviceBuffer::<u8>::alloc(&dev, 4).unwrap();
    assert!(
        copy_to_device_on_stream(&[1u8, 2, 3], &dst, &other).is_err(),
        "lengths"
    );
}
