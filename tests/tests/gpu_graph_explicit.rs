//! GPU: cuda-graph's explicit graphs: every node kind on random data, conditional nodes (if,
//! if/else, while, switch: both branches, zero and many iterations), node updates replayed
//! 1,000 times with the data checked, whole-graph updates and their typed refusals, the
//! instantiate flags, and what a graph keeps alive.
//!
//! The kernels are compiled with NVRTC (`workspace_tests::graphs`): without libnvrtc every
//! test here fails at its first compile. Conditional nodes need a CUDA 12.3 driver (if,
//! while) or 12.8 (if/else, switch).
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudars_core::graph::InstantiateFlags;
use cudars_core::{Device, DevicePtr, Event, LaunchConfig, Stream};
use cudars_graph::{
    BuildError, CaptureMode, Error, Extent, GraphBuilder, HostBuffer, NodeKind, Pitched,
    UpdateOutcome, UpdateRefusal,
};
use cudars_rtc::{Kernel, KernelModule};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::graphs::graph_kernels;
use workspace_tests::rtc::Rng;

struct Setup {
    dev: Device,
    stream: Stream,
    module: KernelModule,
}

impl Setup {
    fn new() -> Setup {
        let dev = dev0();
        let stream = Stream::new(&dev).unwrap();
        let module = graph_kernels(&dev);
        Setup {
            dev,
            stream,
            module,
        }
    }

    fn kernel(&self, name: &str) -> Kernel {
        self.module.kernel(name).unwrap()
    }

    fn alloc(&self, bytes: usize) -> DevicePtr {
        DevicePtr::alloc(&self.dev, bytes).unwrap()
    }

    fn u32s(&self, data: &[u32]) -> DevicePtr {
        let p = self.alloc(data.len() * 4);
        p.copy_from_host(data).unwrap();
        p
    }

    fn f32s(&self, data: &[f32]) -> DevicePtr {
        let p = self.alloc(data.len() * 4);
        p.copy_from_host(data).unwrap();
        p
    }
}

fn read_u32(p: &DevicePtr) -> Vec<u32> {
    let mut v = vec![0u32; p.len() / 4];
    p.copy_to_host(&mut v).unwrap();
    v
}

fn read_f32(p: &DevicePtr) -> Vec<f32> {
    let mut v = vec![0f32; p.len() / 4];
    p.copy_to_host(&mut v).unwrap();
    v
}

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig::for_elements(n as u64, 256)
}

fn one() -> LaunchConfig {
    LaunchConfig::new((1, 1, 1), (1, 1, 1))
}

fn check_axpb(y: &[f32], x: &[f32], a: f32, b: f32) {
    for (i, (&yi, &xi)) in y.iter().zip(x).enumerate() {
        let want = a.mul_add(xi, b);
        assert!(
            (yi - want).abs() <= 1e-5 * want.abs().max(1.0),
            "y[{i}] = {yi}, expected {want} (a {a}, b {b}, x {xi})"
        );
    }
}

#[test]
fn kernel_copy_and_memset_nodes_on_random_data() {
    let _s = serial();
    let t = Setup::new();
    let axpb = t.kernel("axpb");
    let add = t.kernel("add_u32");
    let n = 10_007;
    let mut rng = Rng::new(36);
    let hx = HostBuffer::alloc(&t.dev, n * 4).unwrap();
    let hy = HostBuffer::alloc(&t.dev, n * 4).unwrap();
    let (dx, dy) = (t.alloc(n * 4), t.alloc(n * 4));
    let (m8, m16, m32) = (t.alloc(1001), t.alloc(2 * 999), t.alloc(4 * 1003));
    let (a, b) = (rng.f32(), rng.f32());
    let (v8, v16, v32) = (
        rng.next_u64() as u8,
        rng.next_u64() as u16,
        rng.next_u64() as u32 >> 1,
    );

    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let up = g.add_memcpy(&[], &dx, &hx).unwrap();
    // SAFETY: axpb(float*, const float*, float, float, n) over n elements of n-element buffers.
    let k =
        unsafe { g.add_kernel_typed(&[up], &axpb, &cfg(n), (&dy, &dx, a, b, n as u64)) }.unwrap();
    let down = g.add_memcpy(&[k], &hy, &dy).unwrap();
    g.add_memset_u8(&[], &m8, v8).unwrap();
    g.add_memset_u16(&[], &m16, v16).unwrap();
    let s32 = g.add_memset_u32(&[], &m32, v32).unwrap();
    // A raw kernel node: add_u32(unsigned*, unsigned, unsigned long long).
    let (mut p, mut v, mut len) = (m32.as_raw(), 5u32, 1003u64);
    let mut params = [
        &mut p as *mut u64 as *mut c_void,
        &mut v as *mut u32 as *mut c_void,
        &mut len as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match add_u32's; m32 holds 1003 u32 and is kept by the graph.
    let raw =
        unsafe { g.add_kernel(&[s32], add.function(), &cfg(1003), &mut params, &[&m32]) }.unwrap();
    assert_eq!(g.len(), 7);
    let graph = g.finish().unwrap();
    assert_eq!(graph.node_count().unwrap(), 7);
    assert_eq!(graph.node_kind(raw), Some(NodeKind::Kernel));
    assert_eq!(graph.node_kind(down), Some(NodeKind::Memcpy));
    let exec = graph.instantiate().unwrap();

    for round in 0..3 {
        let x = rng.f32s(n);
        // SAFETY: no launch runs (the stream was synchronised).
        unsafe { hx.write(&x) }.unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        let mut y = vec![0f32; n];
        // SAFETY: the launch is complete.
        unsafe { hy.read(&mut y) }.unwrap();
        check_axpb(&y, &x, a, b);
        check_axpb(&read_f32(&dy), &x, a, b);
        let mut bytes = vec![0u8; 1001];
        m8.copy_to_host(&mut bytes).unwrap();
        assert!(bytes.iter().all(|&x| x == v8), "round {round}: u8 memset");
        let mut halves = vec![0u16; 999];
        m16.copy_to_host(&mut halves).unwrap();
        assert!(
            halves.iter().all(|&x| x == v16),
            "round {round}: u16 memset"
        );
        assert!(
            read_u32(&m32).iter().all(|&x| x == v32 + 5),
            "round {round}: u32 memset then the raw kernel's + 5"
        );
    }
}

#[test]
fn pitched_2d_and_3d_copy_nodes() {
    let _s = serial();
    let t = Setup::new();
    let mut rng = Rng::new(3);
    // The source: 3 slices of 8 rows of 64 bytes.
    let (sp, sr, slices) = (64usize, 8usize, 3usize);
    let data: Vec<u8> = (0..sp * sr * slices)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let src = t.alloc(data.len());
    src.copy_from_host(&data).unwrap();
    // 3-D: 40 x 5 x 3 into rows of 48 bytes, 6 rows per slice.
    let (dp, dr) = (48usize, 6usize);
    let dst = t.alloc(dp * dr * slices);
    dst.memset(0).unwrap();
    let e3 = Extent {
        width: 40,
        height: 5,
        depth: 3,
    };
    // 2-D: all 64 x 7 of the first slice into pinned host memory, rows of 64.
    let host = HostBuffer::alloc(&t.dev, 64 * 7).unwrap();
    let e2 = Extent {
        width: 64,
        height: 7,
        depth: 1,
    };
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let n3 = g
        .add_memcpy_3d(
            &[],
            Pitched::new(&dst, dp, dr),
            Pitched::new(&src, sp, sr),
            e3,
        )
        .unwrap();
    g.add_memcpy_3d(
        &[],
        Pitched::new(&host, 64, 7),
        Pitched::new(&src, sp, sr),
        e2,
    )
    .unwrap();
    // Out of bounds is refused before the driver.
    assert!(matches!(
        g.add_memcpy_3d(
            &[],
            Pitched::new(&dst, dp, dr),
            Pitched::new(&src, sp, sr),
            Extent { depth: 4, ..e3 }
        ),
        Err(Error::Cuda(cudars_core::Error::OutOfRange { .. }))
    ));
    let mut exec = g.finish().unwrap().instantiate().unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    let mut got = vec![0u8; dst.len()];
    dst.copy_to_host(&mut got).unwrap();
    for z in 0..slices {
        for r in 0..dr {
            for x in 0..dp {
                let want = if r < e3.height && x < e3.width {
                    data[(z * sr + r) * sp + x]
                } else {
                    0
                };
                assert_eq!(
                    got[(z * dr + r) * dp + x],
                    want,
                    "slice {z} row {r} byte {x}"
                );
            }
        }
    }
    let mut flat = vec![0u8; 64 * 7];
    // SAFETY: the launch is complete.
    unsafe { host.read(&mut flat) }.unwrap();
    assert_eq!(flat, data[..64 * 7]);
    // The 3-D node pointed at another buffer of the same layout. A driver that takes the
    // change in place copies into `moved` from now on; one that refuses it (driver 580 does,
    // for 3-D pitched nodes) must say so as a typed refusal and keep copying into `dst`.
    let moved = t.alloc(dp * dr * slices);
    moved.memset(0).unwrap();
    dst.memset(0).unwrap();
    let updated = exec.set_memcpy_3d(
        n3,
        Pitched::new(&moved, dp, dr),
        Pitched::new(&src, sp, sr),
        e3,
    );
    let target = match updated {
        Ok(()) => &moved,
        Err(Error::UpdateRefused {
            refusal: UpdateRefusal::ParametersChanged,
            node: Some(n),
            from: None,
        }) if n == n3 => {
            println!("the driver refused the in-place 3-D copy update (typed)");
            &dst
        }
        Err(e) => panic!("unexpected: {e}"),
    };
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    let mut got = vec![0u8; target.len()];
    target.copy_to_host(&mut got).unwrap();
    for z in 0..slices {
        for r in 0..dr {
            for x in 0..dp {
                let want = if r < e3.height && x < e3.width {
                    data[(z * sr + r) * sp + x]
                } else {
                    0
                };
                assert_eq!(
                    got[(z * dr + r) * dp + x],
                    want,
                    "after update: slice {z} row {r} byte {x}"
                );
            }
        }
    }
    let other = if std::ptr::eq(target, &moved) {
        &dst
    } else {
        &moved
    };
    let mut untouched = vec![1u8; other.len()];
    other.copy_to_host(&mut untouched).unwrap();
    assert!(
        untouched.iter().all(|&b| b == 0),
        "the other buffer was written"
    );
}

#[test]
fn host_and_event_nodes() {
    let _s = serial();
    let t = Setup::new();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let buf = t.alloc(4096);
    let recorded = Event::new(&t.dev).unwrap();
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let set = g.add_memset_u32(&[], &buf, 9).unwrap();
    let rec = g.add_event_record(&[set], &recorded).unwrap();
    g.add_host(&[rec], move || {
        seen.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    for _ in 0..10 {
        exec.launch(&t.stream).unwrap();
    }
    t.stream.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 10);
    assert!(recorded.query().unwrap());
    assert!(read_u32(&buf).iter().all(|&x| x == 9));

    // A wait node: the graph's copy waits for work on another stream.
    let other = Stream::new(&t.dev).unwrap();
    let (src, dst) = (t.alloc(1 << 20), t.alloc(1 << 20));
    let gate = Event::new(&t.dev).unwrap();
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let wait = g.add_event_wait(&[], &gate).unwrap();
    g.add_memcpy(&[wait], &dst, &src).unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    for value in [3u32, 77, 0xdead_beef] {
        src.memset_u32_async(value, &other).unwrap();
        gate.record(&other).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        assert!(read_u32(&dst).iter().all(|&x| x == value), "{value:#x}");
    }
}

#[test]
fn child_graphs_mix_captured_and_built() {
    let _s = serial();
    let t = Setup::new();
    let (a, b, c) = (t.alloc(4096), t.alloc(4096), t.alloc(4096));
    let captured = cudars_graph::capture(&t.stream, CaptureMode::ThreadLocal, |s| {
        a.memset_u32_async(7, s)?;
        Ok(())
    })
    .unwrap();
    let mut inner = GraphBuilder::new(&t.dev).unwrap();
    inner.add_memset_u32(&[], &c, 3).unwrap();
    let inner = inner.finish().unwrap();
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let child = g.add_child(&[], &captured).unwrap();
    let copy = g.add_memcpy(&[child], &b, &a).unwrap();
    g.add_child(&[copy], &inner).unwrap();
    drop((captured, inner));
    let exec = g.finish().unwrap().instantiate().unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 7));
    assert!(read_u32(&b).iter().all(|&x| x == 7));
    assert!(read_u32(&c).iter().all(|&x| x == 3));
}

#[test]
fn memory_nodes_allocate_use_and_free_in_order() {
    let _s = serial();
    let t = Setup::new();
    let add = t.kernel("add_u32");
    let n = 50_001;
    let mut rng = Rng::new(7);
    let data: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let src = t.u32s(&data);
    let dst = t.alloc(n * 4);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let (an, alloc) = g.add_mem_alloc(&[], n * 4).unwrap();
    assert_eq!(alloc.len(), n * 4);
    // Unordered uses are refused, typed.
    assert!(matches!(
        g.add_memset_u32(&[], &alloc, 0),
        Err(Error::Build(BuildError::NotOrderedAfterAllocation { alloc: a })) if a == an
    ));
    let up = g.add_memcpy(&[an], &alloc, &src).unwrap();
    // SAFETY: add_u32 over the n u32 of the allocation, between its allocation and free.
    let k = unsafe { g.add_kernel_typed(&[up], &add, &cfg(n), (&alloc, 11u32, n as u64)) }.unwrap();
    let down = g.add_memcpy(&[k], &dst, &alloc).unwrap();
    assert!(matches!(
        g.add_mem_free(&[up], &alloc),
        Err(Error::Build(BuildError::UseNotBeforeFree { user })) if user == down
    ));
    let free = g.add_mem_free(&[down], &alloc).unwrap();
    assert!(matches!(
        g.add_memset_u32(&[free], &alloc, 0),
        Err(Error::Build(BuildError::AllocationFreed { free: f, .. })) if f == free
    ));
    let exec = g.finish().unwrap().instantiate().unwrap();
    for _ in 0..3 {
        dst.memset_u32(0).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        let got = read_u32(&dst);
        for (i, (&g, &d)) in got.iter().zip(&data).enumerate() {
            assert_eq!(g, d.wrapping_add(11), "element {i}");
        }
    }

    // An allocation the graph does not free: instantiated with auto-free, relaunchable.
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let (an, alloc) = g.add_mem_alloc(&[], 4096).unwrap();
    g.add_memset_u32(&[an], &alloc, 1).unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    assert!(exec.flags().contains(InstantiateFlags::AUTO_FREE_ON_LAUNCH));
    for _ in 0..3 {
        exec.launch(&t.stream).unwrap();
    }
    t.stream.synchronize().unwrap();
}

#[test]
fn validation_errors_are_typed() {
    let _s = serial();
    let t = Setup::new();
    let buf = t.alloc(4096);
    let mut g1 = GraphBuilder::new(&t.dev).unwrap();
    let mut g2 = GraphBuilder::new(&t.dev).unwrap();
    let n1 = g1.add_memset_u32(&[], &buf, 1).unwrap();
    match g2.add_memset_u32(&[n1], &buf, 2) {
        Err(Error::Build(BuildError::ForeignNode { node, graph })) => {
            assert_eq!(node, n1);
            assert_eq!(graph, g2.id());
        }
        other => panic!("{other:?}"),
    }
    // Sizes, alignment, host to host.
    let small = t.alloc(100);
    assert!(matches!(
        g1.add_memcpy(&[], &small, &buf),
        Err(Error::Cuda(cudars_core::Error::SizeMismatch { .. }))
    ));
    assert!(matches!(
        g1.add_memset_u32(&[], &buf.slice(2..).unwrap(), 0),
        Err(Error::Build(BuildError::Misaligned { element: 4, .. }))
    ));
    let (h1, h2) = (
        HostBuffer::alloc(&t.dev, 64).unwrap(),
        HostBuffer::alloc(&t.dev, 64).unwrap(),
    );
    assert!(matches!(
        g1.add_memcpy(&[], &h1, &h2),
        Err(Error::Build(BuildError::HostToHost))
    ));
    // Conditional handles and bodies.
    let h = g2.conditional_handle(None).unwrap();
    assert!(matches!(
        g1.add_while(&[], h, |_| Ok(())),
        Err(Error::Build(BuildError::ForeignHandle { .. }))
    ));
    let h1c = g1.conditional_handle(Some(0)).unwrap();
    let outer = n1;
    let r = g1.add_if(&[], h1c, |body| {
        assert!(body.is_body());
        assert!(matches!(
            body.add_host(&[], || {}),
            Err(Error::Build(BuildError::NotAllowedInBody { .. }))
        ));
        assert!(matches!(
            body.add_memcpy(&[], &buf.slice(..64).unwrap(), &h1),
            Err(Error::Build(BuildError::NotAllowedInBody { .. }))
        ));
        assert!(matches!(
            body.add_mem_alloc(&[], 64),
            Err(Error::Build(BuildError::NotAllowedInBody { .. }))
        ));
        // The parent's node is foreign to the body.
        assert!(matches!(
            body.add_memset_u32(&[outer], &buf, 0),
            Err(Error::Build(BuildError::ForeignNode { .. }))
        ));
        body.add_memset_u32(&[], &buf, 5)?;
        Ok(())
    });
    r.unwrap();
    // An error inside a body comes back as it is (the node stays, half built: drop the
    // builder).
    let h1d = g1.conditional_handle(Some(0)).unwrap();
    assert!(matches!(
        g1.add_if(&[], h1d, |_| Err(Error::other("body failed"))),
        Err(Error::Other(_))
    ));
    drop(g1);
    // An empty graph instantiates and launches.
    let empty = GraphBuilder::new(&t.dev).unwrap().finish().unwrap();
    assert_eq!(empty.node_count().unwrap(), 0);
    empty.instantiate().unwrap().launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    // Exec setters: a node of another graph, a node of the wrong kind.
    let mut g3 = GraphBuilder::new(&t.dev).unwrap();
    let n3 = g3.add_memset_u32(&[], &buf, 1).unwrap();
    let mut exec = g3.finish().unwrap().instantiate().unwrap();
    let foreign = g2.add_memset_u32(&[], &buf, 1).unwrap();
    assert!(matches!(
        exec.set_memset_u32(foreign, &buf, 3),
        Err(Error::Build(BuildError::NotInExecutable { .. }))
    ));
    assert!(matches!(
        exec.set_host(n3, || {}),
        Err(Error::Build(BuildError::WrongKind { .. }))
    ));
    exec.set_memset_u32(n3, &buf, 8).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&buf).iter().all(|&x| x == 8));
}

/// A graph: set the condition from `flag`, then `body` under a conditional node.
#[test]
fn if_node_runs_its_body_only_when_the_condition_is_set() {
    let _s = serial();
    let t = Setup::new();
    let (set_cond, add) = (t.kernel("set_cond"), t.kernel("add_u32"));
    let n = 4099;
    let flag = t.u32s(&[0]);
    let out = t.u32s(&vec![0; n]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    // SAFETY: set_cond(handle, const unsigned*) on one thread; flag holds one u32.
    let set = unsafe { g.add_kernel_typed(&[], &set_cond, &one(), (h, &flag)) }.unwrap();
    g.add_if(&[set], h, |body| {
        // SAFETY: add_u32 over out's n u32.
        unsafe { body.add_kernel_typed(&[], &add, &cfg(n), (&out, 1u32, n as u64)) }?;
        Ok(())
    })
    .unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    let mut expected = 0;
    for value in [0u32, 1, 0, 1, 1, 0, 5] {
        flag.copy_from_host(&[value]).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        expected += u32::from(value != 0);
        assert!(
            read_u32(&out).iter().all(|&x| x == expected),
            "condition {value}: expected {expected}"
        );
    }
}

#[test]
fn if_else_node_runs_one_branch_or_the_other() {
    let _s = serial();
    let t = Setup::new();
    let (set_cond, add) = (t.kernel("set_cond"), t.kernel("add_u32"));
    let n = 1000;
    let flag = t.u32s(&[0]);
    let out = t.u32s(&vec![0; n]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    // SAFETY: as in the if test.
    let set = unsafe { g.add_kernel_typed(&[], &set_cond, &one(), (h, &flag)) }.unwrap();
    g.add_if_else(
        &[set],
        h,
        |then| {
            // SAFETY: add_u32 over out's n u32.
            unsafe { then.add_kernel_typed(&[], &add, &cfg(n), (&out, 1u32, n as u64)) }?;
            Ok(())
        },
        |otherwise| {
            // SAFETY: as above.
            unsafe { otherwise.add_kernel_typed(&[], &add, &cfg(n), (&out, 100u32, n as u64)) }?;
            Ok(())
        },
    )
    .unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    let mut expected = 0;
    for value in [1u32, 0, 0, 1, 3] {
        flag.copy_from_host(&[value]).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        expected += if value != 0 { 1 } else { 100 };
        assert!(read_u32(&out).iter().all(|&x| x == expected), "{value}");
    }
}

#[test]
fn while_node_runs_zero_one_and_many_iterations() {
    let _s = serial();
    let t = Setup::new();
    let (pre, step, add) = (
        t.kernel("cond_positive"),
        t.kernel("loop_step"),
        t.kernel("add_u32"),
    );
    let n = 777;
    let counter = t.u32s(&[0]);
    let iterations = t.u32s(&[0]);
    let out = t.u32s(&vec![0; n]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    // SAFETY: cond_positive(handle, const unsigned*) on one thread.
    let first = unsafe { g.add_kernel_typed(&[], &pre, &one(), (h, &counter)) }.unwrap();
    g.add_while(&[first], h, |body| {
        // SAFETY: add_u32 over out; loop_step(unsigned*, unsigned*, handle) on one thread.
        let k = unsafe { body.add_kernel_typed(&[], &add, &cfg(n), (&out, 1u32, n as u64)) }?;
        // SAFETY: as above.
        unsafe { body.add_kernel_typed(&[k], &step, &one(), (&counter, &iterations, h)) }?;
        Ok(())
    })
    .unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    for start in [0u32, 1, 1000, 0, 5] {
        counter.copy_from_host(&[start]).unwrap();
        iterations.copy_from_host(&[0u32]).unwrap();
        out.memset_u32(0).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        assert_eq!(
            read_u32(&iterations),
            vec![start],
            "iterations from {start}"
        );
        assert_eq!(read_u32(&counter), vec![0]);
        assert!(
            read_u32(&out).iter().all(|&x| x == start),
            "body ran {start} times"
        );
    }
}

#[test]
fn a_while_of_k_steps_stops_at_the_step_the_device_decides() {
    let _s = serial();
    let t = Setup::new();
    let (pre, step) = (t.kernel("cond_positive"), t.kernel("loop_step"));
    let counter = t.u32s(&[0]);
    let iterations = t.u32s(&[0]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    // SAFETY: cond_positive(handle, const unsigned*) on one thread.
    let first = unsafe { g.add_kernel_typed(&[], &pre, &one(), (h, &counter)) }.unwrap();
    let mut added = Vec::new();
    g.add_while_steps(&[first], h, 4, |i, body, after| {
        added.push(i);
        // SAFETY: loop_step(unsigned*, unsigned*, handle) on one thread: it counts and
        // decrements while the counter is positive, and sets the condition.
        unsafe { body.add_kernel_typed(after, &step, &one(), (&counter, &iterations, h)) }
    })
    .unwrap();
    assert_eq!(added, vec![0, 1, 2, 3]);
    let exec = g.finish().unwrap().instantiate().unwrap();
    // Counts that are and are not multiples of the 4 steps: exactly that many steps count.
    for start in [10u32, 0, 1, 4, 13] {
        counter.copy_from_host(&[start]).unwrap();
        iterations.copy_from_host(&[0u32]).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        assert_eq!(read_u32(&iterations), vec![start], "steps from {start}");
        assert_eq!(read_u32(&counter), vec![0]);
    }
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(Some(0)).unwrap();
    assert!(g
        .add_while_steps(&[], h, 0, |_, _, _| unreachable!())
        .is_err());
}

#[test]
fn switch_node_runs_the_chosen_case_or_none() {
    let _s = serial();
    let t = Setup::new();
    let (set_cond, add) = (t.kernel("set_cond"), t.kernel("add_u32"));
    let n = 2048;
    let flag = t.u32s(&[0]);
    let out = t.u32s(&vec![0; n]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(None).unwrap();
    // SAFETY: as in the if test.
    let set = unsafe { g.add_kernel_typed(&[], &set_cond, &one(), (h, &flag)) }.unwrap();
    g.add_switch(&[set], h, 4, |case, body| {
        let v = (case as u32 + 1) * 10;
        // SAFETY: add_u32 over out's n u32.
        unsafe { body.add_kernel_typed(&[], &add, &cfg(n), (&out, v, n as u64)) }?;
        Ok(())
    })
    .unwrap();
    let exec = g.finish().unwrap().instantiate().unwrap();
    let mut expected = 0;
    for value in [0u32, 1, 2, 3, 4, 7, 2] {
        flag.copy_from_host(&[value]).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        if value < 4 {
            expected += (value + 1) * 10;
        }
        assert!(
            read_u32(&out).iter().all(|&x| x == expected),
            "case {value}"
        );
    }
}

#[test]
fn node_updates_replayed_1000_times() {
    let _s = serial();
    let t = Setup::new();
    let axpb = t.kernel("axpb");
    let n = 4096;
    let mut rng = Rng::new(1000);
    let x = rng.f32s(n);
    let dx = t.f32s(&x);
    let dy = t.alloc(n * 4);
    let targets = [t.alloc(n * 4), t.alloc(n * 4)];
    let dsts = [t.alloc(n * 4), t.alloc(n * 4)];
    let hosts = [
        HostBuffer::alloc(&t.dev, n * 4).unwrap(),
        HostBuffer::alloc(&t.dev, n * 4).unwrap(),
    ];
    let marker = Arc::new(());
    let held = Arc::clone(&marker);
    let last = Arc::new(AtomicUsize::new(usize::MAX));

    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let m = g.add_memset_u32(&[], &targets[0], 0).unwrap();
    // SAFETY: axpb over n elements of n-element buffers.
    let k = unsafe { g.add_kernel_typed(&[m], &axpb, &cfg(n), (&dy, &dx, 1f32, 0f32, n as u64)) }
        .unwrap();
    let c = g.add_memcpy(&[k], &dsts[0], &dy).unwrap();
    let d = g.add_memcpy(&[c], &hosts[0], &dsts[0]).unwrap();
    let hn = g
        .add_host(&[d], move || {
            let _ = &held;
        })
        .unwrap();
    let mut exec = g.finish().unwrap().instantiate().unwrap();
    assert_eq!(Arc::strong_count(&marker), 2, "the exec holds the closure");

    for i in 0..1000usize {
        let v = rng.next_u64() as u32;
        let (a, b) = (rng.f32(), rng.f32());
        let j = i % 2;
        exec.set_memset_u32(m, &targets[j], v).unwrap();
        // SAFETY: as above.
        unsafe { exec.set_kernel_typed(k, &axpb, &cfg(n), (&dy, &dx, a, b, n as u64)) }.unwrap();
        exec.set_memcpy(c, &dsts[j], &dy).unwrap();
        exec.set_memcpy(d, &hosts[j], &dsts[j]).unwrap();
        let seen = Arc::clone(&last);
        exec.set_host(hn, move || seen.store(i, Ordering::SeqCst))
            .unwrap();
        if i == 0 {
            // The first closure was replaced before any launch ran with it here: let go.
            assert_eq!(Arc::strong_count(&marker), 1, "the old closure is released");
        }
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        assert!(
            read_u32(&targets[j]).iter().all(|&x| x == v),
            "iteration {i}: memset"
        );
        check_axpb(&read_f32(&dsts[j]), &x, a, b);
        let mut host = vec![0f32; n];
        // SAFETY: the launch is complete.
        unsafe { hosts[j].read(&mut host) }.unwrap();
        check_axpb(&host, &x, a, b);
        assert_eq!(last.load(Ordering::SeqCst), i, "iteration {i}: host node");
    }
    drop(exec);
    // The host buffers come back once no graph holds them.
    let [h0, h1] = hosts;
    assert!(h0.try_into_inner().is_ok());
    assert!(h1.try_into_inner().is_ok());
}

fn chain(t: &Setup, a: &DevicePtr, b: &DevicePtr, va: u32, vb: u32) -> cudars_graph::Graph {
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let first = g.add_memset_u32(&[], a, va).unwrap();
    g.add_memset_u32(&[first], b, vb).unwrap();
    g.finish().unwrap()
}

#[test]
fn whole_graph_updates_and_their_typed_refusals() {
    let _s = serial();
    let t = Setup::new();
    let (a, b) = (t.alloc(4096), t.alloc(4096));
    let mut exec = chain(&t, &a, &b, 1, 2).instantiate().unwrap();
    // Same shape, new values: updated in place.
    let same = chain(&t, &a, &b, 3, 4);
    exec.try_update(&same).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 3));
    assert!(read_u32(&b).iter().all(|&x| x == 4));

    // Another topology: one more node.
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let first = g.add_memset_u32(&[], &a, 5).unwrap();
    let second = g.add_memset_u32(&[first], &b, 6).unwrap();
    g.add_memset_u32(&[second], &a, 7).unwrap();
    let bigger = g.finish().unwrap();
    match exec.try_update(&bigger) {
        Err(Error::UpdateRefused { refusal, .. }) => {
            assert_eq!(refusal, UpdateRefusal::TopologyChanged)
        }
        other => panic!("{other:?}"),
    }
    // A node of another type at the same place.
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let first = g.add_memset_u32(&[], &a, 5).unwrap();
    let copy = g.add_memcpy(&[first], &b, &a).unwrap();
    let retyped = g.finish().unwrap();
    match exec.try_update(&retyped) {
        Err(e @ Error::UpdateRefused { .. }) => {
            let Error::UpdateRefused { refusal, node, .. } = &e else {
                unreachable!()
            };
            assert!(
                matches!(
                    refusal,
                    UpdateRefusal::NodeTypeChanged | UpdateRefusal::TopologyChanged
                ),
                "{e}"
            );
            if let Some(node) = node {
                assert!(*node == copy || *node == first, "{e}");
            }
            assert!(e.to_string().contains("cannot be updated"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // The refused updates left it as it was.
    a.memset_u32(0).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 3));
    // `update` re-instantiates when refused.
    assert!(matches!(
        exec.update(&bigger).unwrap(),
        UpdateOutcome::Reinstantiated(UpdateRefusal::TopologyChanged)
    ));
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 7));
    assert!(read_u32(&b).iter().all(|&x| x == 6));
}

#[test]
fn instantiate_flags_upload_and_device_launch() {
    let _s = serial();
    let t = Setup::new();
    let add = t.kernel("add_u32");
    let n = 1024;
    let buf = t.u32s(&vec![0; n]);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    // SAFETY: add_u32 over buf's n u32.
    unsafe { g.add_kernel_typed(&[], &add, &cfg(n), (&buf, 2u32, n as u64)) }.unwrap();
    let graph = g.finish().unwrap();
    let uploaded = graph
        .instantiate_with_params(InstantiateFlags::NONE, Some(&t.stream))
        .unwrap();
    assert!(uploaded.flags().contains(InstantiateFlags::UPLOAD));
    uploaded.launch(&t.stream).unwrap();
    uploaded.upload(&t.stream).unwrap();
    uploaded.launch(&t.stream).unwrap();
    let device = graph
        .instantiate_with_params(InstantiateFlags::DEVICE_LAUNCH, Some(&t.stream))
        .unwrap();
    device.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&buf).iter().all(|&x| x == 6));

    // A host node cannot be launched from the device: the driver refuses, typed.
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let host = g.add_host(&[], || {}).unwrap();
    let graph = g.finish().unwrap();
    match graph.instantiate_with_params(InstantiateFlags::DEVICE_LAUNCH, None) {
        Err(Error::Instantiate { node, source }) => {
            assert!(node.is_none() || node == Some(host), "{node:?}");
            assert!(source.driver().is_some(), "{source}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_graph_keeps_its_buffers_alive() {
    let _s = serial();
    let t = Setup::new();
    let add = t.kernel("add_u32");
    let n = 1 << 16;
    let a = t.u32s(&vec![4; n]);
    let b = t.alloc(n * 4);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    // SAFETY: add_u32 over a's n u32.
    let k = unsafe { g.add_kernel_typed(&[], &add, &cfg(n), (&a, 1u32, n as u64)) }.unwrap();
    g.add_memcpy(&[k], &b, &a).unwrap();
    let graph = g.finish().unwrap();
    drop(a);
    let exec = graph.instantiate().unwrap();
    drop(graph);
    // Memory allocated now must not land on `a`'s range.
    let noise: Vec<DevicePtr> = (0..8).map(|_| t.u32s(&vec![0xffff_ffff; n])).collect();
    exec.launch(&t.stream).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&b).iter().all(|&x| x == 6));
    for p in &noise {
        assert!(read_u32(p).iter().all(|&x| x == 0xffff_ffff));
    }
}

/// A conditional body whose closure fails, or panics, after adding nodes leaves those nodes
/// in the graph (the builder stays usable): their buffers must stay alive with the graph,
/// not be dropped with the body's builder while a launch still writes to them.
#[test]
fn a_failed_or_panicking_conditional_body_keeps_its_buffers_alive() {
    let _s = serial();
    let t = Setup::new();
    let n = 1 << 16;
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let h = g.conditional_handle(Some(1)).unwrap();
    let failed = g.add_if(&[], h, |body| {
        let only_here = DevicePtr::alloc(&t.dev, n * 4)?;
        body.add_memset_u32(&[], &only_here, 7)?;
        Err(Error::other("the body fails after adding a node"))
    });
    assert!(failed.is_err());
    let h2 = g.conditional_handle(Some(1)).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.add_if(&[], h2, |body| {
            let only_here = DevicePtr::alloc(&t.dev, n * 4)?;
            body.add_memset_u32(&[], &only_here, 9)?;
            panic!("the body panics after adding a node");
        })
    }));
    assert!(panicked.is_err());
    let exec = g.finish().unwrap().instantiate().unwrap();
    // Memory allocated now must not land on the bodies' buffers.
    let noise: Vec<DevicePtr> = (0..8).map(|_| t.u32s(&vec![0xffff_ffff; n])).collect();
    exec.launch(&t.stream).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    for p in &noise {
        assert!(
            read_u32(p).iter().all(|&x| x == 0xffff_ffff),
            "a launch wrote into memory freed with a failed body's builder"
        );
    }
}

/// A built graph's nodes use buffers and closures that only the `Graph` / `GraphExec`
/// keep alive: their bare `cuda-core` handles would instantiate, clone or launch without
/// them (an executable graph or a launch outliving the buffers), so they are not handed out.
/// A captured graph's core handle keeps its memory itself: it is.
#[test]
fn bare_core_handles_are_withheld_from_graphs_whose_nodes_hold_buffers() {
    let _s = serial();
    let t = Setup::new();
    let a = t.alloc(4096);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let set = g.add_memset_u32(&[], &a, 1).unwrap();
    g.add_host(&[set], || {}).unwrap();
    let graph = g.finish().unwrap();
    assert!(graph.handle().is_none());
    assert!(graph.try_clone().unwrap().handle().is_none());
    let exec = graph.instantiate().unwrap();
    assert!(exec.handle().is_none());
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 1));

    // A built graph whose nodes hold nothing, and a captured graph, hand it out.
    let mut empty = GraphBuilder::new(&t.dev).unwrap();
    empty.add_empty(&[]).unwrap();
    let empty = empty.finish().unwrap();
    assert!(empty.handle().is_some());
    assert!(empty.instantiate().unwrap().handle().is_some());
    let captured = cudars_graph::capture(&t.stream, CaptureMode::ThreadLocal, |s| {
        a.memset_async(2, s)?;
        Ok(())
    })
    .unwrap();
    assert!(captured.handle().is_some());
    let exec = captured.instantiate().unwrap();
    exec.handle().unwrap().launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 0x0202_0202));
}

/// A graph's allocation node address is its own: a whole-graph update from another graph
/// with allocation nodes would point this executable graph's copies at addresses its own
/// allocation nodes never map. `try_update` refuses it, typed, before the driver;
/// `update` re-instantiates instead, and the result runs on the new graph's buffers.
#[test]
fn whole_graph_updates_from_graphs_with_allocation_nodes_are_refused() {
    let _s = serial();
    let t = Setup::new();
    let n = 4096;
    let build = |src: &DevicePtr, dst: &DevicePtr| {
        let mut g = GraphBuilder::new(&t.dev).unwrap();
        let (an, alloc) = g.add_mem_alloc(&[], n * 4).unwrap();
        let up = g.add_memcpy(&[an], &alloc, src).unwrap();
        let down = g.add_memcpy(&[up], dst, &alloc).unwrap();
        g.add_mem_free(&[down], &alloc).unwrap();
        (g.finish().unwrap(), an)
    };
    let (src1, dst1) = (t.u32s(&vec![1; n]), t.alloc(n * 4));
    let (src2, dst2) = (t.u32s(&vec![2; n]), t.alloc(n * 4));
    let (g1, _) = build(&src1, &dst1);
    let (g2, alloc2) = build(&src2, &dst2);
    // Nor can the bare core handles be used to update one with the other.
    assert!(g1.handle().is_none() && g2.handle().is_none());
    let mut exec = g1.instantiate().unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&dst1).iter().all(|&x| x == 1));
    // Its own graph goes to the driver (which may take or refuse it, typed either way).
    match exec.try_update(&g1) {
        Ok(()) | Err(Error::UpdateRefused { .. }) => {}
        Err(e) => panic!("{e:?}"),
    }
    match exec.try_update(&g2) {
        Err(Error::UpdateRefused {
            refusal: UpdateRefusal::NotSupported,
            node: Some(node),
            from: None,
        }) => assert_eq!(node, alloc2),
        other => panic!("{other:?}"),
    }
    drop(g1);
    assert_eq!(
        exec.update(&g2).unwrap(),
        UpdateOutcome::Reinstantiated(UpdateRefusal::NotSupported)
    );
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&dst2).iter().all(|&x| x == 2));
}

/// The driver names an executable graph's nodes, for node updates, by the nodes of the graph
/// it was instantiated from: dropping that `Graph` must not destroy them while the executable
/// graph can still be updated (other graphs built and dropped meanwhile reuse the memory).
#[test]
fn node_updates_work_after_the_graph_is_dropped() {
    let _s = serial();
    let t = Setup::new();
    let n = 4096;
    let (a, b) = (t.alloc(n * 4), t.alloc(n * 4));
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let m = g.add_memset_u32(&[], &a, 1).unwrap();
    let mut exec = g.finish().unwrap().instantiate().unwrap();
    for i in 0..64u32 {
        // Graphs made and destroyed now may reuse the memory of dropped nodes.
        let mut other = GraphBuilder::new(&t.dev).unwrap();
        for _ in 0..8 {
            other.add_memset_u32(&[], &b, 0).unwrap();
        }
        drop(other.finish().unwrap());
        let dst = if i % 2 == 0 { &a } else { &b };
        exec.set_memset_u32(m, dst, i).unwrap();
        exec.launch(&t.stream).unwrap();
        t.stream.synchronize().unwrap();
        assert!(read_u32(dst).iter().all(|&x| x == i), "update {i}");
    }

    // After a re-instantiating update, the nodes are those of the new graph: dropped too.
    let mut g2 = GraphBuilder::new(&t.dev).unwrap();
    let first = g2.add_memset_u32(&[], &a, 5).unwrap();
    let second = g2.add_memset_u32(&[first], &b, 6).unwrap();
    assert!(matches!(
        exec.update(&g2.finish().unwrap()).unwrap(),
        UpdateOutcome::Reinstantiated(_)
    ));
    exec.set_memset_u32(second, &b, 7).unwrap();
    exec.launch(&t.stream).unwrap();
    t.stream.synchronize().unwrap();
    assert!(read_u32(&a).iter().all(|&x| x == 5));
    assert!(read_u32(&b).iter().all(|&x| x == 7));
}

/// A graph on one thread and an executable graph made from it on another: the driver does
/// not synchronise calls on one graph, and the executable graph's node updates name the
/// graph's nodes. The graph's own calls (node count, instantiation, clone, the lent bare
/// handle) and the node updates run at the same time; each must succeed and the executable
/// graph must write what its last update says.
#[test]
fn node_updates_and_graph_calls_from_two_threads() {
    let _s = serial();
    let t = Setup::new();
    let buf = t.alloc(4 * 4096);
    let mut g = GraphBuilder::new(&t.dev).unwrap();
    let node = g.add_memset_u32(&[], &buf, 1).unwrap();
    let graph = g.finish().unwrap();
    let mut exec = graph.instantiate().unwrap();
    let stream = Stream::builder(&t.dev).non_blocking(true).build().unwrap();
    std::thread::scope(|s| {
        let updater = s.spawn(|| {
            for v in 0..300u32 {
                exec.set_memset_u32(node, &buf, v).unwrap();
                exec.launch(&stream).unwrap();
            }
            stream.synchronize().unwrap();
            assert!(
                read_u32(&buf).iter().all(|&x| x == 299),
                "the last update's value"
            );
        });
        for _ in 0..100 {
            assert_eq!(graph.node_count().unwrap(), 1);
            drop(graph.instantiate().unwrap());
            drop(graph.try_clone().unwrap());
        }
        updater.join().unwrap();
    });
    // The bare handle held while this thread goes on with the same graph: no deadlock.
    let plain = GraphBuilder::new(&t.dev).unwrap().finish().unwrap();
    let held = plain.handle().expect("a graph whose nodes hold nothing");
    assert_eq!(held.node_count().unwrap(), 0);
    assert_eq!(plain.node_count().unwrap(), 0);
    drop(plain.instantiate().unwrap());
    drop(held);
}
