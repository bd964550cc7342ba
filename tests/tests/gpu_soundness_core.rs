//! GPU: soundness holes of the safe API found by reading it as a hostile
//! `#![forbid(unsafe_code)]` user ("Soundness, round 2"), one regression test each, and the
//! driver behaviour each fix stands on, made explicit:
//!
//! * `Kernels::copy` / `Kernels::checksum` refuse overlapping views (the raw kernels forbid
//!   them; an overlapping copy gave wrong elements on an H200) and change nothing then:
//!   `cuda-core`'s own PTX kernels (`cudars_core::kernels`), and the NVRTC-compiled
//!   `workspace_tests::kernels` the other tests use, through the same test body;
//! * an executable graph launched on a stream that is being captured is refused up front
//!   (`cudars_core::graph` and `cuda-graph`), and the capture goes on; the driver itself
//!   refuses `cuGraphLaunch` there and invalidates the capture;
//! * `cuda-xfer`'s transfers of host memory on a stream refuse a capturing stream (the
//!   driver captures a pageable copy as a node reading the host address at every replay);
//! * a host callback's captures (a `DevicePtr` whose drop frees device memory) are dropped
//!   off the driver's callback thread.
//!
//! This file tests `cuda-core`'s safe launchers of its hand-written PTX, so it keeps them (with
//! `gpu_stream_event.rs`, it keeps the PTX path tested).
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::sync::mpsc;

use std::thread::ThreadId;
use std::time::Duration;

use cudars_core::graph::{self as core_graph, CaptureMode, InstantiateFlags};
use cudars_core::kernels::{checksum_host, Kernels};
use cudars_core::memory::{DeviceAlloc, DeviceMemory, DevicePtr};
use cudars_core::sys::{CUdeviceptr, CUresult};
use cudars_core::{Device, Error, Stream};
use cudars_graph::CaptureStatus;
use cudars_xfer::{DeviceBuffer, PinnedBuffer};
// Captures refuse some calls of other threads: the tests of this file run one at a time
// (`workspace_tests::gpu::serial`).
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::SafeKernels;

fn read(buf: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; buf.len() / 4];
    buf.copy_to_host(&mut host).unwrap();
    host
}

fn expect_invalid_argument(r: Result<(), Error>, what: &str) {
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("overlap"), "{what}: {m}"),
        other => panic!("{what}: expected an InvalidArgument about overlap, got {other:?}"),
    }
}

#[test]
fn kernels_refuse_overlapping_views_and_change_nothing() {
    let _g = serial();
    refuse_overlapping_views(&Kernels::load(&dev0()).unwrap());
}

#[test]
fn nvrtc_kernels_refuse_overlapping_views_and_change_nothing() {
    let _g = serial();
    refuse_overlapping_views(&workspace_tests::kernels::Kernels::load(&dev0()).unwrap());
}

fn refuse_overlapping_views(k: &impl SafeKernels) {
    let dev = k.device();
    let stream = Stream::new(&dev).unwrap();
    let n = 1 << 16; // u32s
    let pattern: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let buf = DevicePtr::alloc(&dev, n * 4).unwrap();
    buf.copy_from_host(&pattern).unwrap();
    Stream::null(&dev).synchronize().unwrap();

    let (lo, hi) = buf.split_at(n * 2).unwrap();
    let shifted = buf.slice(4..n * 2 + 4).unwrap();
    // The same view, one element apart, and the checksum's output inside its input.
    expect_invalid_argument(k.copy(&stream, &lo, &lo), "copy onto itself");
    expect_invalid_argument(k.copy(&stream, &shifted, &lo), "copy one element up");
    expect_invalid_argument(k.copy(&stream, &lo, &shifted), "copy one element down");
    expect_invalid_argument(
        k.checksum(&stream, &buf, &buf.slice(64..72).unwrap()),
        "checksum into its input",
    );
    expect_invalid_argument(
        k.checksum(&stream, &hi, &buf.slice(n * 2..n * 2 + 8).unwrap()),
        "checksum into the first element of its input",
    );
    stream.synchronize().unwrap();
    assert_eq!(read(&buf), pattern, "a refused launch changed the buffer");

    // Disjoint views (adjacent halves) work, with the right results.
    k.copy(&stream, &hi, &lo).unwrap();
    let out = DevicePtr::alloc(&dev, 8).unwrap();
    k.checksum(&stream, &lo, &out).unwrap();
    stream.synchronize().unwrap();
    let host = read(&buf);
    assert_eq!(&host[..n / 2], &pattern[..n / 2]);
    assert_eq!(&host[n / 2..], &pattern[..n / 2]);
    let mut sum = [0u64];
    out.copy_to_host(&mut sum).unwrap();
    assert_eq!(sum[0], checksum_host(&pattern[..n / 2]));
}

#[test]
fn an_exec_launch_on_a_capturing_stream_is_refused_and_the_capture_goes_on() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let a = DevicePtr::alloc(&dev, 4096).unwrap();
    let b = DevicePtr::alloc(&dev, 4096).unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        a.memset_u32_async(1, s)?;
        Ok(())
    })
    .unwrap();
    let exec = graph.instantiate().unwrap();

    // cuda-graph's GraphExec.
    let capture = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
    b.memset_u32_async(2, &capture).unwrap();
    match exec.launch(&capture) {
        Err(cudars_graph::Error::Cuda(Error::Unsupported(m))) => {
            assert!(m.contains("captured"), "{m}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert_eq!(capture.status().unwrap(), CaptureStatus::Active);
    let inner = capture.end().unwrap();
    assert_eq!(
        inner.node_count().unwrap(),
        1,
        "only the memset was captured"
    );

    // cudars_core's GraphExecHandle, on a capture begun through cudars_core::graph.
    // SAFETY: only safe view operations are captured, and the capture is ended below.
    unsafe { core_graph::begin_capture(&stream, CaptureMode::ThreadLocal) }.unwrap();
    let refused = exec.handle().expect("a captured graph").launch(&stream);
    assert!(
        matches!(refused, Err(Error::Unsupported(_))),
        "expected Unsupported, got {refused:?}"
    );
    assert!(core_graph::is_capturing(&stream).unwrap());
    let empty = core_graph::end_capture(&stream).unwrap();
    assert_eq!(empty.node_count().unwrap(), 0);
    assert!(!core_graph::is_capturing(&stream).unwrap());

    // Outside a capture the executable graph runs as before.
    exec.launch(&stream).unwrap();
    inner.instantiate().unwrap().launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(read(&a).iter().all(|&x| x == 1));
    assert!(read(&b).iter().all(|&x| x == 2));
}

/// The driver behaviour behind the refusal above: `cuGraphLaunch` on a stream that is being
/// captured is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` on driver 580) and
/// invalidates the capture. Should a driver accept it, the launch would become a node of the
/// captured graph that keeps neither the executable graph nor its memory alive: the
/// up-front refusal of `GraphExecHandle::launch` is what the API relies on either way.
#[test]
fn the_driver_refuses_a_graph_launch_inside_a_capture() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let a = DevicePtr::alloc(&dev, 4096).unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        a.memset_async(3, s)?;
        Ok(())
    })
    .unwrap();
    let exec = graph
        .handle()
        .expect("a captured graph")
        .instantiate(InstantiateFlags::NONE)
        .unwrap();
    // SAFETY: nothing but the raw launch below is captured; the capture is ended below.
    unsafe { core_graph::begin_capture(&stream, CaptureMode::ThreadLocal) }.unwrap();
    let result = {
        let _scope = dev.scope().unwrap();
        // SAFETY: a live executable graph and a live stream of the current context.
        unsafe {
            cudars_core::sys::driver()
                .unwrap()
                .cuGraphLaunch(exec.raw(), stream.raw())
        }
        .unwrap()
    };
    let ended = core_graph::end_capture(&stream);
    assert_eq!(
        result,
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        "the driver's answer to cuGraphLaunch inside a capture changed"
    );
    let err = ended.expect_err("the refused launch should invalidate the capture");
    assert_eq!(
        err.driver().map(|d| d.result()),
        Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        "{err}"
    );
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
}

fn expect_capturing<T: std::fmt::Debug>(r: cudars_xfer::Result<T>, op: &str) {
    match r {
        Err(cudars_xfer::Error::Capturing { op: named }) => assert_eq!(named, op),
        other => panic!("{op}: expected Error::Capturing, got {other:?}"),
    }
}

#[test]
fn host_transfers_refuse_a_capturing_stream() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 1024;
    let dst = DeviceBuffer::<u32>::zeroed(&dev, n).unwrap();
    let pinned = PinnedBuffer::from_slice(&dev, &vec![9u32; n]).unwrap();
    let small = vec![7u32; n];
    let big = vec![8u32; 4 << 20]; // over the staging threshold
    let big_dst = DeviceBuffer::<u32>::zeroed(&dev, big.len()).unwrap();

    let capture = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
    let s: &Stream = &capture;
    expect_capturing(
        cudars_xfer::copy_to_device_on_stream(&small, &dst, s),
        "copy_to_device_on_stream",
    );
    expect_capturing(
        cudars_xfer::copy_to_device_on_stream(&big, &big_dst, s),
        "copy_to_device_on_stream",
    );
    expect_capturing(
        cudars_xfer::to_device_on_stream(&small, s),
        "to_device_on_stream",
    );
    expect_capturing(
        cudars_xfer::copy_to_device_async(small.clone(), &dst, s),
        "copy_to_device_async",
    );
    expect_capturing(
        cudars_xfer::copy_to_device_async(pinned, &dst, s),
        "copy_to_device_async",
    );
    expect_capturing(
        cudars_xfer::to_device_async(small.clone(), s),
        "to_device_async",
    );
    expect_capturing(
        cudars_xfer::to_host_async(&dst, vec![0u32; n], s),
        "to_host_async",
    );
    let mut out = vec![0u32; n];
    let scoped = cudars_xfer::scope(|sc| {
        expect_capturing(sc.copy_to_device(&small, &dst, s), "Scope::copy_to_device");
        expect_capturing(sc.to_host(&dst, &mut out, s), "Scope::to_host");
    });
    scoped.unwrap();
    // Nothing was issued, and the capture is intact.
    assert_eq!(capture.status().unwrap(), CaptureStatus::Active);
    let graph = capture.end().unwrap();
    assert_eq!(
        graph.node_count().unwrap(),
        0,
        "a refused transfer was captured"
    );

    // Outside a capture the same calls work.
    cudars_xfer::copy_to_device_on_stream(&small, &dst, &stream).unwrap();
    let back = cudars_xfer::to_host_async(&dst, vec![0u32; n], &stream)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(back, small);
}

/// The driver behaviour behind the refusal above: a copy from pageable host memory issued on
/// a capturing stream is accepted and recorded as a graph node (which reads the host address
/// at every launch), rather than refused or run at once.
#[test]
fn the_driver_captures_a_pageable_copy_as_a_graph_node() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let dst = DevicePtr::alloc(&dev, 4096).unwrap();
    let host = vec![5u8; 4096];
    let capture = cudars_graph::capture_begin(&stream, CaptureMode::ThreadLocal).unwrap();
    // SAFETY: `host` outlives the graph, which is never launched.
    unsafe { dst.copy_from_host_async(&host, &capture) }.unwrap();
    assert_eq!(capture.status().unwrap(), CaptureStatus::Active);
    let graph = capture.end().unwrap();
    assert_eq!(
        graph.node_count().unwrap(),
        1,
        "the pageable copy should be a node of the captured graph"
    );
    drop(graph);
    drop(host);
}

/// Device memory whose drop reports the thread it ran on, after freeing the memory.
struct DropReporter {
    memory: Option<DeviceMemory>,
    report: mpsc::Sender<(ThreadId, Option<String>)>,
}

// SAFETY: the range is `memory`'s, a live cuMemAlloc allocation until the drop; the fields
// never change until then.
unsafe impl DeviceAlloc for DropReporter {
    fn device(&self) -> Device {
        self.memory.as_ref().unwrap().device()
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.memory.as_ref().unwrap().as_raw()
    }
    fn size(&self) -> usize {
        self.memory.as_ref().unwrap().size()
    }
}

impl Drop for DropReporter {
    fn drop(&mut self) {
        // cuMemFree: a CUDA call, forbidden inside a host callback.
        drop(self.memory.take());
        let me = std::thread::current();
        let _ = self.report.send((me.id(), me.name().map(str::to_owned)));
    }
}

#[test]
fn a_host_callback_drops_device_memory_off_the_driver_thread() {
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let k = Kernels::load(&dev).unwrap();
    let (report, dropped) = mpsc::channel();
    let view = DevicePtr::new(DropReporter {
        memory: Some(DeviceMemory::new(&dev, 1 << 20).unwrap()),
        report,
    });
    k.fill(&stream, &view, 0x1234).unwrap();
    k.spin(&stream, k.cycles_for(Duration::from_millis(20)))
        .unwrap();
    let (ran, ran_rx) = mpsc::channel();
    stream
        .add_callback(move |status| {
            // The callback owns the last view of the memory.
            let _ = ran.send((std::thread::current().id(), status, view.len()));
        })
        .unwrap();
    let (callback_thread, status, len) = ran_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(status, Ok(()));
    assert_eq!(len, 1 << 20);
    let (drop_thread, drop_name) = dropped.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_ne!(
        drop_thread, callback_thread,
        "the callback's captured DevicePtr was dropped inside the driver's callback"
    );
    assert_ne!(drop_thread, std::thread::current().id());
    assert_eq!(drop_name.as_deref(), Some("cuda-core-release"));
    // The stream and the device work on.
    stream.synchronize().unwrap();
    let again = DevicePtr::alloc(&dev, 4096).unwrap();
    k.fill(&stream, &again, 5).unwrap();
    stream.synchronize().unwrap();
    assert!(read(&again).iter().all(|&x| x == 5));
}
