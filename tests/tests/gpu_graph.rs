//! GPU: cuda-graph: capture (closure and guard), multi-stream fork/join, replay, update,
//! launch on other streams, and what happens when a capture goes wrong.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Event, Stream};
use cudars_graph::{CaptureMode, CaptureStatus, Error, UpdateOutcome, UpdateRefusal};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

/// Elements in the test buffers: not a multiple of the kernels' block size.
const N: usize = (1 << 16) + 3;

// A global-mode capture refuses other threads' allocations: the tests of this file run one
// at a time (`workspace_tests::gpu::serial`) even when the harness runs tests in parallel.

fn setup() -> (Device, Stream, Kernels) {
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let kernels = Kernels::load(&dev).unwrap();
    (dev, stream, kernels)
}

fn buffer(dev: &Device, fill: u32) -> DevicePtr {
    let buf = DevicePtr::alloc(dev, N * 4).unwrap();
    buf.memset_u32(fill).unwrap();
    buf
}

fn read(buf: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; buf.len() / 4];
    buf.copy_to_host(&mut host).unwrap();
    host
}

fn assert_all(buf: &DevicePtr, expected: u32, what: &str) {
    let host = read(buf);
    if let Some((i, &x)) = host.iter().enumerate().find(|(_, &x)| x != expected) {
        panic!("{what}: element {i} is {x}, expected {expected}");
    }
}

fn status(stream: &Stream) -> CaptureStatus {
    cudars_graph::capture_status(stream).unwrap().status
}

/// The sequence under test: memsets, a device copy and kernels, ending with an accumulator.
/// Returns nothing; the effect on the buffers is modelled by `expected_after`.
fn sequence(
    k: &Kernels,
    s: &Stream,
    a: &DevicePtr,
    b: &DevicePtr,
    c: &DevicePtr,
    acc: &DevicePtr,
) -> cudars_core::Result<()> {
    a.memset_u32_async(5, s)?;
    // SAFETY: a, b, c and acc hold N u32s each and outlive the work (every test synchronises
    // before dropping them); nothing else touches them meanwhile.
    unsafe {
        k.add_u32_raw(s, a.as_raw(), 3, N as u64)?;
        b.copy_from_device_async(a, s)?;
        k.add_u32_raw(s, b.as_raw(), 1, N as u64)?;
        k.fill_u32_raw(s, c.as_raw(), 9, N as u64)?;
        c.slice(0..16)?.memset_u32_async(2, s)?;
        k.add_u32_raw(s, acc.as_raw(), 1, N as u64)?;
    }
    Ok(())
}

/// (a, b, c[0..4], c[4..], acc) after `runs` runs of `sequence` from acc = 0.
fn expected_after(runs: u32) -> (u32, u32, u32, u32, u32) {
    let a = 5 + 3;
    (a, a + 1, 2, 9, runs)
}

fn check_sequence(a: &DevicePtr, b: &DevicePtr, c: &DevicePtr, acc: &DevicePtr, runs: u32) {
    let (ea, eb, c_head, c_tail, eacc) = expected_after(runs);
    assert_all(a, ea, "a");
    assert_all(b, eb, "b");
    let host_c = read(c);
    assert!(
        host_c[..4].iter().all(|&x| x == c_head),
        "c head {:?}",
        &host_c[..4]
    );
    assert!(host_c[4..].iter().all(|&x| x == c_tail), "c tail");
    assert_all(acc, eacc, "acc");
}

#[test]
fn a_captured_sequence_replays_like_direct_issue_many_times() {
    let _serial = serial();
    let (dev, stream, k) = setup();
    let (a, b, c, acc) = (
        buffer(&dev, 0),
        buffer(&dev, 0),
        buffer(&dev, 0),
        buffer(&dev, 0),
    );

    // Directly.
    sequence(&k, &stream, &a, &b, &c, &acc).unwrap();
    stream.synchronize().unwrap();
    let direct = (read(&a), read(&b), read(&c), read(&acc));
    check_sequence(&a, &b, &c, &acc, 1);

    // Captured: nothing runs during the capture.
    for buf in [&a, &b, &c, &acc] {
        buf.memset_u32(0).unwrap();
    }
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        Ok(sequence(&k, s, &a, &b, &c, &acc)?)
    })
    .unwrap();
    stream.synchronize().unwrap();
    assert_all(&a, 0, "a after capture only");
    assert_all(&acc, 0, "acc after capture only");
    assert_eq!(graph.node_count().unwrap(), 7);
    assert_eq!(status(&stream), CaptureStatus::None);

    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        (read(&a), read(&b), read(&c), read(&acc)),
        direct,
        "first replay"
    );

    // Many replays; each one runs the whole sequence (the accumulator counts them).
    let mut runs = 1;
    for _ in 0..20 {
        exec.launch(&stream).unwrap();
        runs += 1;
        stream.synchronize().unwrap();
        check_sequence(&a, &b, &c, &acc, runs);
    }
    for _ in 0..500 {
        exec.launch(&stream).unwrap();
        runs += 1;
    }
    stream.synchronize().unwrap();
    check_sequence(&a, &b, &c, &acc, runs);
}

#[test]
fn every_capture_mode_records_and_replays() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 0);
    for (i, mode) in [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ]
    .into_iter()
    .enumerate()
    {
        let value = 100 + i as u32;
        let graph =
            cudars_graph::capture(&stream, mode, |s| Ok(buf.memset_u32_async(value, s)?)).unwrap();
        assert_all(&buf, if i == 0 { 0 } else { value - 1 }, "before launch");
        graph.instantiate().unwrap().launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(&buf, value, "after launch");
    }
}

#[test]
fn a_fork_join_capture_over_three_streams_replays_correctly() {
    let _serial = serial();
    let (dev, s0, k) = setup();
    let s1 = Stream::new(&dev).unwrap();
    let s2 = Stream::new(&dev).unwrap();
    let (x, y, z, w) = (
        buffer(&dev, 0),
        buffer(&dev, 0),
        buffer(&dev, 0),
        buffer(&dev, 0),
    );
    let n = N as u64;

    let graph = cudars_graph::capture(&s0, CaptureMode::ThreadLocal, |cap| {
        let id = cap.id().id;
        // s1 joins through the guard's helper ...
        cap.fork(&s1)?;
        // ... s2 through events of our own: record on the capturing stream, wait on s2.
        let fork = Event::new(&dev)?;
        fork.record(cap)?;
        s2.wait_event(&fork)?;
        for side in [&s1, &s2] {
            let info = cudars_graph::capture_status(side)?;
            assert_eq!(info.status, CaptureStatus::Active);
            assert_eq!(info.id, Some(id), "the side stream is in the same capture");
        }
        x.memset_u32_async(1, &s1)?;
        y.memset_u32_async(2, &s2)?;
        // SAFETY: x, y, z hold N u32s and live until the test's final synchronize.
        unsafe {
            k.add_u32_raw(&s1, x.as_raw(), 10, n)?;
            k.add_u32_raw(&s2, y.as_raw(), 20, n)?;
        }
        cap.join(&s1)?;
        let back = Event::new(&dev)?;
        back.record(&s2)?;
        cap.wait_event(&back)?;
        // After the join: depends on both branches.
        z.copy_from_device_async(&x, cap)?;
        w.copy_from_device_async(&y, cap)?;
        // SAFETY: as above.
        unsafe { k.add_u32_raw(cap, z.as_raw(), 100, n)? };
        Ok(())
    })
    .unwrap();
    for side in [&s0, &s1, &s2] {
        assert_eq!(status(side), CaptureStatus::None);
    }
    // 2 memsets + 2 kernels on the branches, 2 copies + 1 kernel after the join.
    assert_eq!(graph.node_count().unwrap(), 7);

    let exec = graph.instantiate().unwrap();
    for round in 0..10u32 {
        for buf in [&x, &y, &z, &w] {
            buf.memset_u32(round).unwrap();
        }
        // (The memsets ran on the legacy stream.)
        Stream::null(&dev).synchronize().unwrap();
        exec.launch(&s0).unwrap();
        s0.synchronize().unwrap();
        assert_all(&x, 11, "x");
        assert_all(&y, 22, "y");
        assert_all(&z, 111, "z");
        assert_all(&w, 22, "w");
    }
}

#[test]
fn an_error_inside_the_closure_ends_the_capture_and_the_stream_works() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 1);
    let mut seen = None;
    let err = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        seen = Some(s.id());
        buf.memset_u32_async(2, s)?;
        Err(Error::other("the body gave up"))
    })
    .unwrap_err();
    match &err {
        Error::Body {
            capture,
            status,
            source,
        } => {
            assert_eq!(Some(*capture), seen);
            assert_eq!(*status, CaptureStatus::Active);
            assert_eq!(source.to_string(), "the body gave up");
        }
        other => panic!("expected Error::Body, got {other:?}"),
    }
    assert!(err.to_string().contains("stream capture #"), "{err}");
    assert_eq!(status(&stream), CaptureStatus::None);
    // The captured memset never ran; the stream runs new work normally.
    stream.synchronize().unwrap();
    assert_all(&buf, 1, "after the failed capture");
    buf.memset_u32_async(3, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 3, "after new work");
}

#[test]
fn a_panic_inside_the_closure_ends_the_capture_and_the_stream_works() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 1);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cudars_graph::capture(&stream, CaptureMode::Global, |s| {
            buf.memset_u32_async(2, s)?;
            panic!("boom inside the capture");
        })
    }));
    let payload = result.expect_err("the panic comes back out");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"boom inside the capture")
    );
    assert_eq!(status(&stream), CaptureStatus::None);
    // Global mode ended: allocation (illegal during a global capture) works again.
    let other = buffer(&dev, 4);
    assert_all(&other, 4, "allocation after the panic");
    buf.memset_u32_async(5, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 5, "after new work");
}

#[test]
fn synchronize_inside_a_capture_is_a_clear_error_and_leaves_no_capture_open() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 1);
    let err = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        buf.memset_u32_async(2, s)?;
        s.synchronize()?;
        Ok(())
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Body {
                status: CaptureStatus::Invalidated,
                ..
            }
        ),
        "{err:?}"
    );
    let driver = err.driver().expect("a driver error at the root");
    assert_eq!(driver.name, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
    assert_eq!(driver.call, "cuStreamSynchronize");
    let text = err.to_string();
    assert!(text.contains("stream capture #"), "{text}");
    assert!(text.contains("capture invalidated"), "{text}");
    assert!(text.contains("cuStreamSynchronize"), "{text}");
    println!("{text}");
    assert_eq!(status(&stream), CaptureStatus::None);
    stream.synchronize().unwrap();
    assert_all(&buf, 1, "nothing of the capture ran");
    buf.memset_u32_async(6, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 6, "after new work");
}

#[test]
fn legacy_stream_work_inside_a_capture_invalidates_it_and_leaves_no_capture_open() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 1);
    let null = Stream::null(&dev);
    let err = cudars_graph::capture(&stream, CaptureMode::Global, |s| {
        buf.memset_u32_async(2, s)?;
        buf.memset_u32_async(3, &null)?;
        Ok(())
    })
    .unwrap_err();
    let driver = err.driver().expect("a driver error at the root");
    assert_eq!(driver.name, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "{err}");
    assert!(matches!(
        err,
        Error::Body {
            status: CaptureStatus::Invalidated,
            ..
        }
    ));
    println!("{err}");
    assert_eq!(status(&stream), CaptureStatus::None);
    buf.memset_u32_async(7, &null).unwrap();
    buf.memset_u32_async(8, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 8, "both streams work after the capture");
}

#[test]
fn the_guard_form_begins_reports_ends_and_ends_on_drop() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 1);

    // The legacy stream cannot be captured; nothing begins.
    let null = Stream::null(&dev);
    assert!(matches!(
        cudars_graph::capture_begin(&null, CaptureMode::ThreadLocal),
        Err(Error::Cuda(cudars_core::Error::InvalidArgument(_)))
    ));

    // begin / status / end.
    let capture = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
    let info = cudars_graph::capture_status(&stream).unwrap();
    assert_eq!(info.status, CaptureStatus::Active);
    assert_eq!(info.id, Some(capture.id().id));
    assert_eq!(capture.status().unwrap(), CaptureStatus::Active);
    // A second begin on the same stream is refused and leaves the first capture alone.
    match cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal) {
        Err(Error::AlreadyCapturing { capture: id, .. }) => assert_eq!(id, capture.id().id),
        other => panic!("expected AlreadyCapturing, got {other:?}"),
    }
    assert_eq!(capture.status().unwrap(), CaptureStatus::Active);
    buf.memset_u32_async(2, &capture).unwrap();
    buf.memset_u32_async(3, &capture).unwrap();
    let id = capture.id();
    let graph = capture.end().unwrap();
    assert_eq!(graph.capture(), Some(id));
    assert_eq!(graph.node_count().unwrap(), 2);
    assert_eq!(status(&stream), CaptureStatus::None);

    // A guard dropped without end(): the capture ends and its work is discarded.
    {
        let forgotten = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
        buf.memset_u32_async(9, &forgotten).unwrap();
    }
    assert_eq!(status(&stream), CaptureStatus::None);
    stream.synchronize().unwrap();
    assert_all(&buf, 1, "no captured work ran");

    // end() after an illegal call: Invalidated, naming the capture; the stream is free again.
    let capture = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
    let id = capture.id();
    assert!(stream.synchronize().is_err());
    assert_eq!(capture.status().unwrap(), CaptureStatus::Invalidated);
    match capture.end() {
        Err(e @ Error::Invalidated { .. }) => {
            assert_eq!(e.capture(), Some(id));
            assert_eq!(
                e.driver().map(|d| d.name),
                Some("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
            );
        }
        other => panic!("expected Invalidated, got {other:?}"),
    }
    assert_eq!(status(&stream), CaptureStatus::None);

    graph.instantiate().unwrap().launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 3, "the graph of the first capture");
}

#[test]
fn update_with_a_new_memset_value_changes_what_the_next_launch_writes() {
    let _serial = serial();
    let (dev, stream, k) = setup();
    let buf = buffer(&dev, 0);
    let other = buffer(&dev, 0);
    let record = |value: u32| {
        cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
            buf.memset_u32_async(value, s)?;
            // SAFETY: buf holds N u32s and lives until the final synchronize.
            unsafe { k.add_u32_raw(s, buf.as_raw(), 1, N as u64)? };
            Ok(())
        })
        .unwrap()
    };
    let mut exec = record(10).instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 11, "first graph");

    // Same shape, another memset value: updated in place.
    assert_eq!(exec.update(&record(20)).unwrap(), UpdateOutcome::Updated);
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 21, "after the update");

    // Another shape (a third node): refused by the driver, so re-instantiated, and correct.
    let bigger = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        buf.memset_u32_async(29, s)?;
        // SAFETY: as above.
        unsafe { k.add_u32_raw(s, buf.as_raw(), 1, N as u64)? };
        other.memset_u32_async(31, s)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(bigger.node_count().unwrap(), 3);
    match exec.update(&bigger).unwrap() {
        UpdateOutcome::Reinstantiated(why) => {
            assert_eq!(why, UpdateRefusal::TopologyChanged, "{why}")
        }
        UpdateOutcome::Updated => panic!("a different topology cannot update in place"),
    }
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_all(&buf, 30, "after re-instantiation");
    assert_all(&other, 31, "after re-instantiation");
}

#[test]
fn a_graph_launches_on_other_streams_than_the_captured_one() {
    let _serial = serial();
    let (dev, captured, k) = setup();
    let buf = buffer(&dev, 0);
    let graph = cudars_graph::capture(&captured, CaptureMode::ThreadLocal, |s| {
        // SAFETY: buf holds N u32s and lives until the final synchronize.
        unsafe { k.add_u32_raw(s, buf.as_raw(), 1, N as u64)? };
        Ok(())
    })
    .unwrap();
    let exec = graph.instantiate().unwrap();
    let other = Stream::builder(&dev).non_blocking(true).build().unwrap();
    exec.upload(&other).unwrap();
    exec.launch(&other).unwrap();
    other.synchronize().unwrap();
    assert_all(&buf, 1, "on a non-blocking stream");
    let legacy = Stream::null(&dev);
    exec.launch(&legacy).unwrap();
    legacy.synchronize().unwrap();
    assert_all(&buf, 2, "on the legacy stream");
    let per_thread = Stream::per_thread(&dev);
    exec.launch(&per_thread).unwrap();
    per_thread.synchronize().unwrap();
    assert_all(&buf, 3, "on the per-thread stream");
    // A dropped captured stream does not matter to the executable graph.
    drop(captured);
    exec.launch(&other).unwrap();
    other.synchronize().unwrap();
    assert_all(&buf, 4, "after the captured stream is gone");
}

#[test]
fn clone_dot_file_and_upload() {
    let _serial = serial();
    let (dev, stream, _) = setup();
    let buf = buffer(&dev, 0);
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        buf.memset_u32_async(1, s)?;
        buf.slice(0..64)?.memset_u32_async(2, s)?;
        Ok(())
    })
    .unwrap();
    let copy = graph.try_clone().unwrap();
    assert_eq!(copy.node_count().unwrap(), graph.node_count().unwrap());
    assert_eq!(copy.capture(), None);
    drop(graph);
    let exec = copy.instantiate().unwrap();
    exec.upload(&stream).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let host = read(&buf);
    assert!(host[..16].iter().all(|&x| x == 2) && host[16..].iter().all(|&x| x == 1));

    let path = std::env::temp_dir().join(format!("gpu_graph_{}.dot", std::process::id()));
    copy.write_dot(&path, true).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(text.trim_start().starts_with("digraph"), "{text}");
    assert!(text.to_lowercase().contains("memset"), "{text}");
}

#[test]
fn stream_ordered_allocations_inside_a_capture_become_memory_nodes() {
    let _serial = serial();
    let (dev, stream, k) = setup();
    let out = buffer(&dev, 0);
    let driver = cudars_core::sys::driver().unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        let mut tmp: cudars_core::sys::CUdeviceptr = 0;
        let _ctx = dev.bind()?;
        // SAFETY: a live stream of the current context; valid out-pointer. During capture the
        // allocation becomes a graph node; it is freed below, inside the same graph.
        let r = unsafe { driver.cuMemAllocAsync(&mut tmp, N * 4, s.raw()) }.unwrap();
        assert!(r.is_success(), "{r:?}");
        // SAFETY: tmp addresses N u32s during the graph's execution.
        unsafe {
            k.fill_u32_raw(s, tmp, 40, N as u64)?;
            k.add_u32_raw(s, tmp, 2, N as u64)?;
            let r = driver
                .cuMemcpyDtoDAsync(out.as_raw(), tmp, N * 4, s.raw())
                .unwrap();
            assert!(r.is_success(), "{r:?}");
            let r = driver.cuMemFreeAsync(tmp, s.raw()).unwrap();
            assert!(r.is_success(), "{r:?}");
        }
        Ok(())
    })
    .unwrap();
    // alloc, 2 kernels, copy, free.
    assert_eq!(graph.node_count().unwrap(), 5);
    let exec = graph.instantiate().unwrap();
    for round in 0..3 {
        out.memset_u32(round).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_all(&out, 42, "out");
    }
}
