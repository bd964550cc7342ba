//! GPU tests of streams, events, host callbacks, current-stream and device scopes, and
//! interprocess events (issue 3). Kernels are CUDA C++ compiled by NVRTC
//! (`workspace_tests::kernels`), except in the tests of `cuda-core`'s hand-written PTX:
//! `module_errors_are_clear` (a PTX module's functions) and the fill / copy / checksum test,
//! which runs the same checks on `cudars_core::kernels` (PTX, JIT-compiled by the driver) and
//! on the NVRTC kernels. This file and `gpu_soundness_core.rs` keep the PTX path tested.
//!
//! Run with `--test-threads=1`: several tests measure concurrency and timing.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::ffi::c_void;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use cudars_core::event::IpcEventHandle;
use cudars_core::stream::StreamKind;
use cudars_core::sys::{self, CUcontext, CUdevice_attribute, CUdeviceptr, CUresult, CUstream};
use cudars_core::{Device, Error, Event, Stream};
use workspace_tests::gpu::dev0;
use workspace_tests::kernels::{checksum_host, Kernels, SafeKernels};

/// Checks a raw driver call.
fn ok(r: Result<CUresult, sys::MissingSymbol>, what: &str) {
    let r = r.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r, CUresult::CUDA_SUCCESS, "{what}");
}

/// The SM clock rate the device reports, in Hz.
fn clock_hz(dev: &Device) -> f64 {
    let khz = dev
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .unwrap();
    assert!(khz > 0);
    khz as f64 * 1e3
}

/// Cycles the spin kernel needs for about `ms` milliseconds at the reported clock.
fn cycles_for_ms(dev: &Device, ms: f64) -> u64 {
    (clock_hz(dev) * ms / 1e3) as u64
}

/// Managed memory for `n` u32 values, freed on drop (raw driver calls: memory types are
/// another module's business).
struct Managed {
    ptr: CUdeviceptr,
    n: usize,
    dev: Device,
}

impl Managed {
    fn new(dev: &Device, n: usize) -> Managed {
        let _scope = dev.scope().unwrap();
        let mut ptr = 0;
        // SAFETY: context current; valid out-pointer.
        ok(
            unsafe {
                sys::driver().unwrap().cuMemAllocManaged(
                    &mut ptr,
                    n * 4,
                    sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0,
                )
            },
            "cuMemAllocManaged",
        );
        Managed { ptr, n, dev: *dev }
    }

    /// Host view; only while no device work touches the memory.
    fn read(&self) -> Vec<u32> {
        // SAFETY: managed memory is host-addressable; `n` u32s were allocated.
        unsafe { std::slice::from_raw_parts(self.ptr as usize as *const u32, self.n) }.to_vec()
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let _scope = self.dev.scope().unwrap();
        // SAFETY: allocated by cuMemAllocManaged; the tests synchronise before dropping.
        let _ = unsafe { sys::driver().unwrap().cuMemFree(self.ptr) };
    }
}

/// A `u32` flag in mapped pinned host memory: the host sets it, a kernel reads it. Set on
/// drop too, so a `wait_flag` kernel never outlives a failed test.
struct MappedFlag {
    host: *mut u32,
    dev_ptr: CUdeviceptr,
    dev: Device,
}

impl MappedFlag {
    fn new(dev: &Device) -> MappedFlag {
        let _scope = dev.scope().unwrap();
        let d = sys::driver().unwrap();
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: context current; valid out-pointer.
        ok(
            unsafe {
                d.cuMemHostAlloc(
                    &mut host,
                    4,
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            },
            "cuMemHostAlloc",
        );
        // SAFETY: 4 bytes were just allocated.
        unsafe { std::ptr::write_volatile(host as *mut u32, 0) };
        let mut dev_ptr = 0;
        // SAFETY: mapped pinned allocation; valid out-pointer.
        ok(
            unsafe { d.cuMemHostGetDevicePointer(&mut dev_ptr, host, 0) },
            "cuMemHostGetDevicePointer",
        );
        MappedFlag {
            host: host as *mut u32,
            dev_ptr,
            dev: *dev,
        }
    }

    fn set(&self) {
        // SAFETY: live pinned allocation of 4 bytes.
        unsafe { std::ptr::write_volatile(self.host, 1) };
    }
}

impl Drop for MappedFlag {
    fn drop(&mut self) {
        self.set();
        // The kernel may still be reading: wait for the device before freeing.
        let _ = self.dev.synchronize();
        let _scope = self.dev.scope().unwrap();
        // SAFETY: allocated by cuMemHostAlloc; the device is idle.
        let _ = unsafe {
            sys::driver()
                .unwrap()
                .cuMemFreeHost(self.host as *mut c_void)
        };
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Milliseconds the spin kernel takes for `cycles`, timed by events around it (median of 3).
fn spin_ms(k: &Kernels, stream: &Stream, cycles: u64) -> f64 {
    let dev = stream.device();
    let runs = (0..3)
        .map(|_| {
            let start = Event::timed(&dev).unwrap();
            let end = Event::timed(&dev).unwrap();
            start.record(stream).unwrap();
            k.spin(stream, cycles).unwrap();
            end.record(stream).unwrap();
            end.synchronize().unwrap();
            let ms = Event::elapsed_ms(&start, &end).unwrap() as f64;
            let d = Event::elapsed(&start, &end).unwrap();
            assert!((d.as_secs_f64() * 1e3 - ms).abs() < 1e-3);
            ms
        })
        .collect();
    median(runs)
}

#[test]
fn spin_kernel_time_is_linear_in_cycles_and_matches_the_clock_rate() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::new(&dev).unwrap();
    // Warm up: module load, clocks ramping up.
    k.spin(&stream, cycles_for_ms(&dev, 50.0)).unwrap();
    stream.synchronize().unwrap();

    let n = cycles_for_ms(&dev, 20.0);
    let t1 = spin_ms(&k, &stream, n);
    let t2 = spin_ms(&k, &stream, 2 * n);
    let expected = n as f64 / clock_hz(&dev) * 1e3;
    let ratio = t2 / t1;
    // Effective clock from the difference, which cancels launch overhead.
    let effective_mhz = n as f64 / ((t2 - t1) / 1e3) / 1e6;
    println!(
        "spin: N = {n} cycles: {t1:.3} ms; 2N: {t2:.3} ms; ratio {ratio:.4}; expected at the \
         reported clock ({:.0} MHz): {expected:.3} ms; effective clock {effective_mhz:.0} MHz",
        clock_hz(&dev) / 1e6
    );
    assert!(
        (ratio - 2.0).abs() <= 0.2,
        "time(2N)/time(N) = {ratio}, not within 10% of 2"
    );
    assert!(
        (t1 - expected).abs() <= 0.1 * expected,
        "spin of {n} cycles took {t1:.3} ms, expected {expected:.3} ms +- 10%"
    );
}

#[test]
fn non_blocking_stream_overlaps_the_legacy_null_stream_and_a_blocking_one_does_not() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let null = Stream::null(&dev);
    let cycles = cycles_for_ms(&dev, 40.0);
    k.spin(&null, cycles / 4).unwrap(); // warm-up
    null.synchronize().unwrap();

    // Total time of a spin on `other` followed by a spin on the legacy null stream, from an
    // event recorded on the null stream before both to the later of their end events.
    let both = |other: &Stream| -> f64 {
        let start = Event::timed(&dev).unwrap();
        let end_other = Event::timed(&dev).unwrap();
        let end_null = Event::timed(&dev).unwrap();
        start.record(&null).unwrap();
        k.spin(other, cycles).unwrap();
        end_other.record(other).unwrap();
        k.spin(&null, cycles).unwrap();
        end_null.record(&null).unwrap();
        dev.synchronize().unwrap();
        let a = Event::elapsed_ms(&start, &end_other).unwrap();
        let b = Event::elapsed_ms(&start, &end_null).unwrap();
        a.max(b) as f64
    };
    let single = spin_ms(&k, &null, cycles);
    let non_blocking = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let blocking = Stream::new(&dev).unwrap();
    assert!(non_blocking.is_non_blocking().unwrap());
    assert!(!blocking.is_non_blocking().unwrap());
    let overlapped = both(&non_blocking);
    let serialised = both(&blocking);
    println!(
        "one spin {single:.2} ms; non-blocking + null {overlapped:.2} ms; blocking + null \
         {serialised:.2} ms"
    );
    assert!(
        overlapped < 1.4 * single,
        "non-blocking stream did not overlap the null stream: {overlapped} ms vs {single} ms"
    );
    assert!(
        serialised > 1.8 * single,
        "blocking stream overlapped the null stream: {serialised} ms vs {single} ms"
    );

    // The same by ordering alone: work on the null stream holds back an event on a blocking
    // stream, not one on a non-blocking stream.
    let null_done = Event::new(&dev).unwrap();
    k.spin(&null, cycles_for_ms(&dev, 200.0)).unwrap();
    null_done.record(&null).unwrap();
    let nb_event = non_blocking.record(None).unwrap();
    nb_event.synchronize().unwrap();
    assert!(
        !null_done.query().unwrap(),
        "the null stream's spin was already done"
    );
    let b_event = blocking.record(None).unwrap();
    b_event.synchronize().unwrap();
    assert!(
        null_done.query().unwrap(),
        "a blocking stream's event completed before the null stream's prior work"
    );
}

#[test]
fn host_callback_runs_after_the_kernel_and_sees_its_status() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let n = 1 << 16;
    let mem = Managed::new(&dev, n);
    let (ptr, len) = (mem.ptr, mem.n);
    // SAFETY: `mem` holds n u32 and outlives the kernel (synchronised below).
    unsafe { k.fill_u32_raw(&stream, ptr, 0, n as u64) }.unwrap();
    // SAFETY: as above.
    unsafe { k.spin_then_fill_raw(&stream, ptr, 7, n as u64, cycles_for_ms(&dev, 30.0)) }.unwrap();
    let (tx, rx) = mpsc::channel();
    stream
        .add_callback(move |status| {
            // SAFETY: the callback runs after the kernel; managed memory is host-addressable
            // and nothing else touches it meanwhile.
            let seen = unsafe { std::slice::from_raw_parts(ptr as usize as *const u32, len) };
            let all_seven = seen.iter().all(|&v| v == 7);
            let _ = tx.send((status, all_seven));
        })
        .unwrap();
    let (status, all_seven) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(status, Ok(()));
    assert!(all_seven, "the callback ran before the kernel's writes");
    stream.synchronize().unwrap();
    assert!(mem.read().iter().all(|&v| v == 7));

    // Later work on the stream waits for the callback.
    let gate = Arc::new(AtomicBool::new(false));
    let g = Arc::clone(&gate);
    stream
        .add_callback(move |_| {
            std::thread::sleep(Duration::from_millis(50));
            g.store(true, Ordering::SeqCst);
        })
        .unwrap();
    let after = stream.record(None).unwrap();
    after.synchronize().unwrap();
    assert!(gate.load(Ordering::SeqCst));
}

#[test]
fn a_panicking_callback_is_reported_and_the_process_goes_on() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    for stream in [Stream::new(&dev).unwrap(), Stream::null(&dev)] {
        let ran_after = Arc::new(AtomicBool::new(false));
        let r = Arc::clone(&ran_after);
        k.spin(&stream, cycles_for_ms(&dev, 5.0)).unwrap();
        stream
            .add_callback(|_| panic!("deliberate panic in a host callback"))
            .unwrap();
        stream
            .add_callback(move |status| r.store(status.is_ok(), Ordering::SeqCst))
            .unwrap();
        match stream.synchronize() {
            Err(Error::CallbackPanicked(msg)) => {
                assert!(msg.contains("deliberate panic"), "{msg}")
            }
            other => panic!("expected CallbackPanicked on {stream:?}, got {other:?}"),
        }
        assert!(ran_after.load(Ordering::SeqCst));
        // Reported once; the stream keeps working.
        assert!(stream.take_callback_panic().is_none());
        k.spin(&stream, 1000).unwrap();
        stream.synchronize().unwrap();
    }
}

#[test]
fn current_stream_is_per_thread_and_scopes_nest_and_restore() {
    let dev = dev0();
    let null = Stream::null(&dev);
    assert_eq!(Stream::current(&dev), null);
    let s1 = Stream::new(&dev).unwrap();
    let s2 = Stream::builder(&dev).non_blocking(true).build().unwrap();
    {
        let _a = s1.scope();
        assert_eq!(Stream::current(&dev), s1);
        {
            let _b = s2.scope();
            assert_eq!(Stream::current(&dev), s2);
            assert_eq!(cudars_core::stream::current_stream(&dev), s2);
            // Another thread sees its own current stream: the null stream.
            let seen = std::thread::spawn(move || Stream::current(&dev))
                .join()
                .unwrap();
            assert_eq!(seen, Stream::null(&dev));
            assert_eq!(seen.kind(), StreamKind::LegacyNull);
        }
        assert_eq!(Stream::current(&dev), s1);
        // An event recorded on "the current stream" lands on s1.
        let k = Kernels::load(&dev).unwrap();
        k.spin(&s1, cycles_for_ms(&dev, 50.0)).unwrap();
        let e = Event::new(&dev).unwrap();
        e.record_current().unwrap();
        assert!(
            !e.query().unwrap(),
            "the event was not queued behind s1's spin"
        );
        e.synchronize().unwrap();
    }
    assert_eq!(Stream::current(&dev), null);

    // A current stream is kept alive while current, even when its last handle is dropped.
    let temp = Stream::new(&dev).unwrap();
    let raw = temp.raw();
    temp.make_current();
    drop(temp);
    let cur = Stream::current(&dev);
    assert_eq!(cur.raw(), raw);
    cur.synchronize().unwrap();
    drop(cur);
    null.make_current();
    assert_eq!(Stream::current(&dev), null);
}

#[test]
fn device_scopes_nest_and_restore() {
    let dev = dev0();
    let ctx_now = || {
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(
            unsafe { sys::driver().unwrap().cuCtxGetCurrent(&mut c) },
            "cuCtxGetCurrent",
        );
        c
    };
    // A fresh thread has no current context.
    std::thread::spawn(move || {
        assert!(ctx_now().is_null());
        let primary = dev.primary_context().unwrap();
        {
            let _a = dev.scope().unwrap();
            assert_eq!(ctx_now(), primary);
            assert_eq!(Device::current().unwrap(), dev);
            {
                let _b = dev.scope().unwrap();
                assert_eq!(ctx_now(), primary);
            }
            assert_eq!(ctx_now(), primary);
        }
        assert!(
            ctx_now().is_null(),
            "the outer scope did not restore 'no context'"
        );
        // Streams and events work from a thread with no current context.
        let s = Stream::new(&dev).unwrap();
        assert!(ctx_now().is_null());
        let e = s.record(None).unwrap();
        e.synchronize().unwrap();
        assert!(s.is_done().unwrap());
        s.synchronize().unwrap();
        Stream::null(&dev).synchronize().unwrap();
        assert!(ctx_now().is_null(), "an operation left a context current");
    })
    .join()
    .unwrap();
}

#[test]
fn stream_builder_priorities_kinds_and_queries() {
    let dev = dev0();
    let (least, greatest) = dev.stream_priority_range().unwrap();
    println!("priority range: least {least}, greatest {greatest}");
    let urgent = Stream::builder(&dev).greatest_priority().build().unwrap();
    assert_eq!(urgent.priority().unwrap(), greatest);
    let low = Stream::builder(&dev).priority(least).build().unwrap();
    assert_eq!(low.priority().unwrap(), least);
    for bad in [greatest - 1, least + 1] {
        assert!(matches!(
            Stream::builder(&dev).priority(bad).build(),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert_eq!(urgent.kind(), StreamKind::Owned);
    assert!(urgent.is_done().unwrap());

    // is_done follows the work.
    let k = Kernels::load(&dev).unwrap();
    k.spin(&urgent, cycles_for_ms(&dev, 30.0)).unwrap();
    assert!(!urgent.is_done().unwrap());
    urgent.synchronize().unwrap();
    assert!(urgent.is_done().unwrap());

    // The per-thread default stream takes work and synchronises.
    let ptds = Stream::per_thread(&dev);
    assert_eq!(ptds.kind(), StreamKind::PerThread);
    k.spin(&ptds, 1000).unwrap();
    ptds.synchronize().unwrap();
    assert!(ptds.is_done().unwrap());
    assert!(Stream::null(&dev).is_done().unwrap());

    // record(Some(e)) records into e and hands back the same event.
    let e = Event::new(&dev).unwrap();
    let back = low.record(Some(&e)).unwrap();
    assert_eq!(back.raw(), e.raw());
    assert!(e.is_recorded());
    // One timing rule: off unless the name says timed.
    let fresh = low.record(None).unwrap();
    assert!(!fresh.timing_enabled() && fresh.is_recorded());
    let timed = low.record_timed().unwrap();
    assert!(timed.timing_enabled() && timed.is_recorded());

    // wait_event orders a stream behind another one's work.
    let waiter = Stream::builder(&dev).non_blocking(true).build().unwrap();
    k.spin(&urgent, cycles_for_ms(&dev, 50.0)).unwrap();
    let marker = urgent.record(None).unwrap();
    waiter.wait_event(&marker).unwrap();
    let behind = waiter.record(None).unwrap();
    assert!(!behind.query().unwrap());
    behind.synchronize().unwrap();
    assert!(marker.query().unwrap());
}

#[test]
fn external_stream_is_used_but_not_destroyed() {
    let dev = dev0();
    let d = sys::driver().unwrap();
    let mut raw: CUstream = std::ptr::null_mut();
    {
        let _scope = dev.scope().unwrap();
        // SAFETY: context current; valid out-pointer.
        ok(unsafe { d.cuStreamCreate(&mut raw, 0) }, "cuStreamCreate");
    }
    let dropped = Arc::new(AtomicBool::new(false));
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    {
        // SAFETY: `raw` is a live stream of `dev`, destroyed below after the wrapper.
        let ext =
            unsafe { Stream::external_with_owner(&dev, raw, Flag(Arc::clone(&dropped))) }.unwrap();
        assert_eq!(ext.kind(), StreamKind::External);
        assert_eq!(ext.raw(), raw);
        let k = Kernels::load(&dev).unwrap();
        k.spin(&ext, 1000).unwrap();
        let clone = ext.clone();
        drop(ext);
        assert!(
            !dropped.load(Ordering::SeqCst),
            "owner dropped with a clone alive"
        );
        clone.synchronize().unwrap();
    }
    assert!(dropped.load(Ordering::SeqCst));
    // The foreign stream is still alive. (Raw calls need a current context.)
    let _scope = dev.scope().unwrap();
    // SAFETY: live stream.
    ok(
        unsafe { d.cuStreamQuery(raw) },
        "cuStreamQuery after the wrapper dropped",
    );
    // SAFETY: we created it; nothing else uses it now.
    ok(unsafe { d.cuStreamDestroy(raw) }, "cuStreamDestroy");
}

#[test]
fn event_timing_errors_are_clear() {
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let timed_a = Event::timed(&dev).unwrap();
    let timed_b = Event::timed(&dev).unwrap();
    let untimed = Event::new(&dev).unwrap();
    assert!(!untimed.timing_enabled());
    // One timing rule for every way of making an event: off unless the name says timed.
    assert!(!Event::builder(&dev).build().unwrap().timing_enabled());
    assert!(!stream.record(None).unwrap().timing_enabled());
    assert!(timed_a.timing_enabled());
    assert!(Event::builder(&dev)
        .timing(true)
        .build()
        .unwrap()
        .timing_enabled());
    let stamped = stream.record_timed().unwrap();
    assert!(stamped.timing_enabled() && stamped.is_recorded());
    assert_eq!(
        Event::elapsed(&timed_a, &timed_b),
        Err(Error::EventNotRecorded)
    );
    timed_a.record(&stream).unwrap();
    assert_eq!(
        Event::elapsed(&timed_a, &timed_b),
        Err(Error::EventNotRecorded)
    );
    untimed.record(&stream).unwrap();
    assert_eq!(
        Event::elapsed(&timed_a, &untimed),
        Err(Error::TimingDisabled)
    );
    assert_eq!(
        Event::elapsed_ms(&untimed, &timed_a),
        Err(Error::TimingDisabled)
    );
    let k = Kernels::load(&dev).unwrap();
    k.spin(&stream, cycles_for_ms(&dev, 2.0)).unwrap();
    timed_b.record(&stream).unwrap();
    timed_b.synchronize().unwrap();
    let d = Event::elapsed(&timed_a, &timed_b).unwrap();
    assert!(
        d > Duration::from_micros(500) && d < Duration::from_secs(1),
        "{d:?}"
    );
    // Reverse order: a negative time is an error, never a panic.
    assert!(Event::elapsed(&timed_b, &timed_a).is_err());

    // Builder validation and interprocess rules.
    assert!(matches!(
        Event::builder(&dev).timing(true).interprocess(true).build(),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        untimed.ipc_handle(),
        Err(Error::InvalidArgument(_))
    ));
    let blocking = Event::builder(&dev)
        .blocking_sync(true)
        .disable_timing(true)
        .build()
        .unwrap();
    assert!(blocking.is_blocking_sync() && !blocking.timing_enabled());
    blocking.record(&stream).unwrap();
    blocking.synchronize().unwrap();
    assert!(blocking.is_done().unwrap());
    let ipc = Event::builder(&dev)
        .disable_timing(true)
        .interprocess(true)
        .build()
        .unwrap();
    let handle = ipc.ipc_handle().unwrap();
    assert_eq!(
        IpcEventHandle::from_bytes(&handle.to_bytes()).unwrap(),
        handle
    );
}

#[test]
fn interprocess_event_is_waited_on_in_a_child_process() {
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let flag = MappedFlag::new(&dev);
    let event = Event::builder(&dev)
        .disable_timing(true)
        .interprocess(true)
        .build()
        .unwrap();
    // A kernel that runs until the host sets the flag (at most ~20 s), then the event.
    // SAFETY: `flag` is mapped pinned memory that outlives the kernel (its Drop sets it and
    // synchronises).
    unsafe { k.wait_flag_raw(&stream, flag.dev_ptr, cycles_for_ms(&dev, 20_000.0)) }.unwrap();
    event.record(&stream).unwrap();
    let handle = event.ipc_handle().unwrap();

    // The child is the `test_child` helper binary (`ipc-event`), never a test of its own.
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let mut child = Command::new(&helper)
        .args(["ipc-event", &handle.to_hex()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut saw_pending = false;
    let mut saw_complete = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        println!("child: {line}");
        if let Some(at) = line.find("IPC_CHILD pending=") {
            assert_eq!(
                &line[at..],
                "IPC_CHILD pending=true",
                "the child saw the event done early"
            );
            assert!(
                !event.query().unwrap(),
                "the kernel finished without the flag"
            );
            saw_pending = true;
            // Only now may the kernel finish.
            flag.set();
        }
        if line.contains("IPC_CHILD completed") {
            assert!(saw_pending, "completed before reporting pending");
            saw_complete = true;
        }
    }
    flag.set();
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    assert!(saw_pending && saw_complete);
    event.synchronize().unwrap();
}

#[test]
fn module_errors_are_clear() {
    let dev = dev0();
    let err = cudars_core::module::Module::from_ptx(&dev, ".version 7.0\n.target sm_70\nnot ptx")
        .unwrap_err();
    let text = err.to_string();
    println!("bad PTX error: {text}");
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(text.contains("cuModuleLoadDataEx"), "{text}");
    // cuda-core's PTX module, JIT-compiled by the driver.
    let k = cudars_core::kernels::Kernels::load(&dev).unwrap();
    assert!(k.module().function("no_such_kernel").is_err());
    let f = k.module().function(cudars_core::kernels::SPIN).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let mut c = 1u64;
    let mut params = [&mut c as *mut u64 as *mut c_void];
    let issue = stream.issue(dev).unwrap();
    // SAFETY: zero grid is rejected before the driver.
    let r = unsafe { f.launch(&issue, (0, 1, 1), (1, 1, 1), 0, &mut params) };
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
    // SAFETY: spin takes one u64.
    unsafe { f.launch(&issue, (1, 1, 1), (1, 1, 1), 0, &mut params) }.unwrap();
    drop(issue);
    stream.synchronize().unwrap();
}

/// Foreign code pops the context behind cuda-core's per-thread "a context is current" cache
/// (`with_context` in cuda-core's stream module): every call on explicit handles that skips
/// the question must still succeed, through the driver's `CUDA_ERROR_INVALID_CONTEXT` answer
/// and a retry with the device's context pushed, and must leave the thread as it found it (no
/// context). A driver that crashed here instead of answering would kill this test.
#[test]
fn explicit_handles_survive_a_foreign_context_pop() {
    std::thread::spawn(|| {
        let dev = dev0();
        let d = sys::driver().unwrap();
        let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
        let other = Stream::builder(&dev).non_blocking(true).build().unwrap();
        let start = stream.record_timed().unwrap();
        let end = stream.record_timed().unwrap();
        // Makes the cache say "a context is current" (a call that asks the driver with the
        // device current), then pops it as foreign code would.
        let arm_and_pop = || {
            dev.make_current().unwrap();
            end.synchronize().unwrap();
            // SAFETY: plain driver call; NULL unsets the thread's context.
            ok(
                unsafe { d.cuCtxSetCurrent(std::ptr::null_mut()) },
                "cuCtxSetCurrent",
            );
        };
        let no_context_left = |what: &str| {
            let mut current: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            ok(
                unsafe { d.cuCtxGetCurrent(&mut current) },
                "cuCtxGetCurrent",
            );
            assert!(current.is_null(), "{what} left a context current");
        };
        let mut checked = 0;
        let mut check = |what: &str, r: Result<(), Error>| {
            r.unwrap_or_else(|e| panic!("{what} after a foreign pop: {e}"));
            no_context_left(what);
            checked += 1;
        };

        arm_and_pop();
        check("Event::record", start.record(&stream));
        arm_and_pop();
        check("Event::record (end)", end.record(&stream));
        arm_and_pop();
        check("Event::query", end.query().map(|_| ()));
        arm_and_pop();
        check("Event::synchronize", end.synchronize());
        arm_and_pop();
        check(
            "Event::elapsed_ms",
            Event::elapsed_ms(&start, &end).map(|_| ()),
        );
        arm_and_pop();
        check("Stream::synchronize", stream.synchronize());
        arm_and_pop();
        check("Stream::is_done", stream.is_done().map(|_| ()));
        arm_and_pop();
        check("Stream::wait_event", other.wait_event(&end));
        arm_and_pop();
        check("Stream::record", other.record(None).map(|_| ()));
        arm_and_pop();
        check("Event drop", {
            drop(start);
            Ok(())
        });
        arm_and_pop();
        check("Stream drop (destroy)", {
            drop(other);
            Ok(())
        });
        assert_eq!(checked, 11);
        // The stream still works afterwards, from a thread with no context.
        stream.synchronize().unwrap();
        no_context_left("the last synchronize");
    })
    .join()
    .unwrap();
}

/// Foreign code changes the thread's context behind the launch path's note (cuda-core's
/// `launch_in_context`, which launches without asking the driver while the context it last
/// saw current is still noted): the context popped, then another context of the same device
/// made current. Every launch must still run with the right data, the driver's refusal of
/// the first try retried with the device's context pushed, and the thread left with the
/// context foreign code set.
#[test]
fn launches_survive_a_foreign_context_change() {
    std::thread::spawn(|| {
        let dev = dev0();
        let d = sys::driver().unwrap();
        let k = Kernels::load(&dev).unwrap();
        let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
        let buf = cudars_core::memory::DevicePtr::alloc(&dev, 4096).unwrap();
        let current = || {
            let mut c: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            ok(unsafe { d.cuCtxGetCurrent(&mut c) }, "cuCtxGetCurrent");
            c
        };
        let fill_and_check = |value: u32, what: &str| {
            k.fill(&stream, &buf, value)
                .unwrap_or_else(|e| panic!("launch {what}: {e}"));
            stream.synchronize().unwrap();
            let mut host = vec![0u32; 1024];
            buf.copy_to_host(&mut host).unwrap();
            assert!(
                host.iter().all(|&x| x == value),
                "launch {what}: wrong data"
            );
        };
        // Notes the primary context as current (a launch with it current).
        let arm = || {
            dev.make_current().unwrap();
            fill_and_check(1, "with the context current");
        };
        arm();
        // SAFETY: NULL unsets the thread's context, as foreign code may.
        ok(
            unsafe { d.cuCtxSetCurrent(std::ptr::null_mut()) },
            "cuCtxSetCurrent",
        );
        fill_and_check(2, "after a foreign pop");
        assert!(current().is_null(), "the launch left a context current");

        arm();
        let mut other: CUcontext = std::ptr::null_mut();
        // `cuCtxCreate_v2(CUcontext*, unsigned flags, CUdevice)`, the same in every driver
        // since CUDA 3.2 (the bindings' `cuCtxCreate` differs between the 12 and 13 headers).
        // SAFETY: the driver library cuda-sys loaded; the symbol has this signature.
        let lib = unsafe { libloading::Library::new(d.path()) }.unwrap();
        type CtxCreate = unsafe extern "C" fn(*mut CUcontext, u32, i32) -> CUresult;
        // SAFETY: as above.
        let create = unsafe { lib.get::<CtxCreate>(b"cuCtxCreate_v2\0") }.unwrap();
        // SAFETY: valid out-pointer and device, flags 0; the new context is made current on
        // this thread (foreign code's context).
        let created = unsafe { create(&mut other, 0, dev.raw()) };
        assert_eq!(created, CUresult::CUDA_SUCCESS, "cuCtxCreate_v2");
        assert_eq!(current(), other);
        fill_and_check(3, "with another context current");
        fill_and_check(4, "again with another context current");
        assert_eq!(
            current(),
            other,
            "the launch changed foreign code's context"
        );
        // SAFETY: the context this test created, current on this thread; destroying it
        // leaves the thread with no context.
        ok(unsafe { d.cuCtxDestroy(other) }, "cuCtxDestroy");
        fill_and_check(5, "after the foreign context was destroyed");
    })
    .join()
    .unwrap();
}

/// Two devices, and foreign code making the other device's context current behind the launch
/// path's note (cudart and NCCL switch devices so): launches on either device, alternating,
/// run with the right data, and the thread keeps the context foreign code set.
#[test]
#[ignore = "needs two GPUs"]
fn launches_on_two_devices_with_the_other_current() {
    let count = cudars_core::device_count().unwrap();
    assert!(count >= 2, "this test needs two GPUs, found {count}");
    std::thread::spawn(|| {
        let d = sys::driver().unwrap();
        let devs = [Device::new(0).unwrap(), Device::new(1).unwrap()];
        let kernels: Vec<Kernels> = devs.iter().map(|v| Kernels::load(v).unwrap()).collect();
        let streams: Vec<Stream> = devs
            .iter()
            .map(|v| Stream::builder(v).non_blocking(true).build().unwrap())
            .collect();
        let bufs: Vec<cudars_core::memory::DevicePtr> = devs
            .iter()
            .map(|v| cudars_core::memory::DevicePtr::alloc(v, 4096).unwrap())
            .collect();
        let current = || {
            let mut c: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            ok(unsafe { d.cuCtxGetCurrent(&mut c) }, "cuCtxGetCurrent");
            c
        };
        let fill = |i: usize, value: u32, what: &str| {
            kernels[i]
                .fill(&streams[i], &bufs[i], value)
                .unwrap_or_else(|e| panic!("launch on device {i} {what}: {e}"));
            streams[i].synchronize().unwrap();
            let mut host = vec![0u32; 1024];
            bufs[i].copy_to_host(&mut host).unwrap();
            assert!(
                host.iter().all(|&x| x == value),
                "device {i} {what}: wrong data"
            );
        };
        // The note says device 0's context (a launch with it current) ...
        devs[0].make_current().unwrap();
        fill(0, 1, "with its context current");
        // ... then foreign code makes device 1's context current.
        let other = devs[1].primary_context().unwrap();
        // SAFETY: a retained primary context, made current as foreign code would.
        ok(unsafe { d.cuCtxSetCurrent(other) }, "cuCtxSetCurrent");
        for round in 0..50u32 {
            fill(0, 10 + round, "with the other device's context current");
            fill(1, 100 + round, "its own context current");
            assert_eq!(
                current(),
                other,
                "round {round}: the launch changed the context"
            );
        }
    })
    .join()
    .unwrap();
}

/// The public kernels (`cudars_core::kernels`, PTX) do what their table says: fill, add,
/// copy, checksum on views, and their checks refuse bad views before launching anything.
#[test]
fn public_kernels_fill_copy_and_checksum() {
    let dev = dev0();
    fill_copy_and_checksum(&cudars_core::kernels::Kernels::load(&dev).unwrap());
}

/// The NVRTC kernels (`workspace_tests::kernels`) pass the same checks as the PTX ones.
#[test]
fn nvrtc_kernels_fill_copy_and_checksum_as_the_ptx_ones() {
    let dev = dev0();
    fill_copy_and_checksum(&Kernels::load(&dev).unwrap());
}

fn fill_copy_and_checksum(k: &impl SafeKernels) {
    use cudars_core::DevicePtr;
    let dev = k.device();
    let stream = Stream::new(&dev).unwrap();
    let n = 1 << 20;
    let a = DevicePtr::alloc(&dev, n * 4).unwrap();
    let b = DevicePtr::alloc(&dev, n * 4).unwrap();
    let sum = DevicePtr::alloc(&dev, 8).unwrap();
    k.spin(&stream, k.cycles_for(Duration::from_millis(1)))
        .unwrap();
    k.fill(&stream, &a, 7).unwrap();
    k.add(&stream, &a, 3).unwrap();
    k.copy(&stream, &b, &a).unwrap();
    k.checksum(&stream, &b, &sum).unwrap();
    stream.synchronize().unwrap();
    let mut host = vec![0u32; n];
    b.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&v| v == 10));
    let mut out = [0u64];
    sum.copy_to_host(&mut out).unwrap();
    assert_eq!(out[0], checksum_host(&host));
    assert_eq!(out[0], 10 * n as u64);
    // A varied pattern, so a checksum that skipped or repeated elements would differ.
    let pattern: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    a.copy_from_host(&pattern).unwrap();
    k.checksum(&stream, &a, &sum).unwrap();
    stream.synchronize().unwrap();
    sum.copy_to_host(&mut out).unwrap();
    assert_eq!(out[0], checksum_host(&pattern));
    // Bad views are refused before any launch.
    assert!(matches!(
        k.copy(&stream, &b.slice(4..).unwrap(), &a.slice(8..).unwrap()),
        Err(Error::SizeMismatch { .. })
    ));
    assert!(matches!(
        k.fill(&stream, &a.slice(1..5).unwrap(), 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        k.checksum(&stream, &a, &sum.slice(..4).unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    // A sub-view (1000 elements: not a multiple of the block size) changes only its own
    // elements; the slow fill writes every element of its view.
    k.fill(&stream, &a, 0).unwrap();
    let mid = a.slice(4..4 * 1001).unwrap();
    k.fill(&stream, &mid, 5).unwrap();
    k.add(&stream, &mid, 2).unwrap();
    k.fill_after_spin(&stream, &b, 9, k.cycles_for(Duration::from_millis(1)))
        .unwrap();
    stream.synchronize().unwrap();
    a.copy_to_host(&mut host).unwrap();
    assert_eq!(host[0], 0);
    assert!(host[1..1001].iter().all(|&v| v == 7));
    assert!(host[1001..].iter().all(|&v| v == 0));
    b.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&v| v == 9));
    // Empty views: nothing is written, and the checksum of nothing is 0.
    let empty = a.slice(8..8).unwrap();
    k.fill(&stream, &empty, 1).unwrap();
    k.add(&stream, &empty, 1).unwrap();
    k.copy(&stream, &empty, &b.slice(..0).unwrap()).unwrap();
    k.fill_after_spin(&stream, &empty, 1, 1000).unwrap();
    k.checksum(&stream, &empty, &sum).unwrap();
    stream.synchronize().unwrap();
    sum.copy_to_host(&mut out).unwrap();
    assert_eq!(out[0], 0);
    a.copy_to_host(&mut host).unwrap();
    assert_eq!(&host[..3], &[0, 7, 7]);
}
