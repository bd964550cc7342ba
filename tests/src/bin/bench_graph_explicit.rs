//! Benchmark: explicit graphs and conditional nodes (issue 36), in one run.
//!
//! 1. A 100-iteration loop whose condition is decided on the device: as a while node (one
//!    launch, the loop runs on the GPU) against the host-driven loop of 100 launches of a
//!    one-step graph, in two forms: the host reads the condition back after each step (what
//!    a data-dependent loop such as a solver must do without conditional nodes), and the
//!    100 launches queued blindly then one synchronisation (the best a host loop can do when
//!    it knows the count in advance). Figures: end to end, launch until the result is on the
//!    host, per 100-iteration loop. Target: the while node at least 5x faster than the
//!    read-back host loop (ratio <= 0.2). Then the same 100 steps with a body of 10 chained
//!    guarded steps per while iteration (the exit is still decided by the counter on the
//!    device, checked by every step), against both host loops: the one-step read-back loop,
//!    and a read-back after every 10 guarded steps (the host's version of the same unroll).
//! 2. Changing one kernel argument between launches: a node update
//!    (`GraphExec::set_kernel_typed`) plus the relaunch, against building and instantiating
//!    the graph again plus the launch, and against a whole-graph update
//!    (`GraphExec::try_update`) plus the launch. Target: update + relaunch at least 10x
//!    faster than re-instantiation (ratio <= 0.1), for the host cost alone and end to end
//!    (launch until synchronised; the kernel's own time is in both sides). Then the same on
//!    a graph of 100 chained kernel nodes with one of them updated.
//!
//! Each figure is the median of many samples after a warm-up. Run on the GPU machine:
//! `bench_graph_explicit` (or through `run.sh bench`). The same while loop through NVIDIA's
//! `cuda.core` is not measured here (no Python peer script for it yet).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

mod common;
use common::println;

use std::time::Instant;

use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
use cudars_graph::{GraphBuilder, GraphExec};
use cudars_rtc::Kernel;
use workspace_tests::bench::{median, Report, Target};
use workspace_tests::graphs::graph_kernels;

const ITERATIONS: u32 = 100;
const WARMUP: usize = 20;
const SAMPLES: usize = 200;
/// Elements of the update benchmark's kernel.
const UPDATE_ELEMS: usize = 1 << 16;

fn one() -> LaunchConfig {
    LaunchConfig::new((1, 1, 1), (1, 1, 1))
}

fn read_u32(p: &DevicePtr) -> u32 {
    let mut v = [0u32; 1];
    p.copy_to_host(&mut v).unwrap();
    v[0]
}

fn sample_us(mut f: impl FnMut()) -> f64 {
    for _ in 0..WARMUP {
        f();
    }
    let mut samples: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median(&mut samples)
}

/// The while-node graph: counter := 100 (memset node), then `while (counter > 0)` of a body
/// of `unroll` chained loop steps, each of which decrements the counter and counts the
/// iteration while it is > 0, and sets the condition (the last one's setting holds).
fn while_graph(
    dev: &Device,
    step: &Kernel,
    counter: &DevicePtr,
    iters: &DevicePtr,
    unroll: usize,
) -> GraphExec {
    let mut g = GraphBuilder::new(dev).unwrap();
    let reset = g.add_memset_u32(&[], counter, ITERATIONS).unwrap();
    let h = g.conditional_handle(Some(1)).unwrap();
    g.add_while_steps(&[reset], h, unroll as u32, |_, body, after| {
        // SAFETY: loop_step(unsigned*, unsigned*, handle) on one thread, one u32 each.
        unsafe { body.add_kernel_typed(after, step, &one(), (counter, iters, h)) }
    })
    .unwrap();
    g.finish().unwrap().instantiate().unwrap()
}

/// `unroll` chained guarded steps (no condition): the host-driven loop's graph when it reads
/// the counter back every `unroll` steps.
fn guarded_graph(
    dev: &Device,
    guarded: &Kernel,
    counter: &DevicePtr,
    iters: &DevicePtr,
    unroll: usize,
) -> GraphExec {
    let mut g = GraphBuilder::new(dev).unwrap();
    let mut prev = Vec::new();
    for _ in 0..unroll {
        // SAFETY: guarded_step(unsigned*, unsigned*) on one thread, one u32 each.
        let k = unsafe { g.add_kernel_typed(&prev, guarded, &one(), (counter, iters)) }.unwrap();
        prev = vec![k];
    }
    g.finish().unwrap().instantiate().unwrap()
}

/// The host-driven loop: launch `graph`, read the counter back, until it is 0; returns
/// the launches made.
fn readback_loop(graph: &GraphExec, counter: &DevicePtr, stream: &Stream) -> u32 {
    counter.memset_u32(ITERATIONS).unwrap();
    let mut n = 0;
    loop {
        graph.launch(stream).unwrap();
        n += 1;
        let mut left = [0u32; 1];
        // SAFETY: an async copy into a local that outlives the synchronize just after.
        unsafe { counter.copy_to_host_async(&mut left, stream) }.unwrap();
        stream.synchronize().unwrap();
        if left[0] == 0 {
            return n;
        }
    }
}

/// One step of the host-driven loop: the same kernel, no condition (handle 0 is never
/// passed to `cudaGraphSetConditional`: the kernel sets it unconditionally, so the step
/// graph uses `count_step` and a decrement through `add_u32`).
fn step_graph(
    dev: &Device,
    count: &Kernel,
    add: &Kernel,
    counter: &DevicePtr,
    iters: &DevicePtr,
) -> GraphExec {
    let mut g = GraphBuilder::new(dev).unwrap();
    // SAFETY: count_step(unsigned*) on one thread; add_u32 over one u32 (adds -1).
    let k = unsafe { g.add_kernel_typed(&[], count, &one(), (iters,)) }.unwrap();
    // SAFETY: as above.
    unsafe { g.add_kernel_typed(&[k], add, &one(), (counter, u32::MAX, 1u64)) }.unwrap();
    g.finish().unwrap().instantiate().unwrap()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let module = graph_kernels(&dev);
    let (step, count, add, axpb, guarded) = (
        module.kernel("loop_step")?,
        module.kernel("count_step")?,
        module.kernel("add_u32")?,
        module.kernel("axpb")?,
        module.kernel("guarded_step")?,
    );
    println!(
        "device: {}; driver {}",
        dev.name()?,
        cudars_core::driver_version()?
    );
    let mut report = Report::new("bench_graph_explicit");

    // 1. The device loop against host-driven loops.
    let counter = DevicePtr::alloc(&dev, 4)?;
    let iters = DevicePtr::alloc(&dev, 4)?;
    let looped = while_graph(&dev, &step, &counter, &iters, 1);
    iters.memset_u32(0)?;
    looped.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(
        read_u32(&iters),
        ITERATIONS,
        "the while node ran 100 iterations"
    );
    let while_us = sample_us(|| {
        looped.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });

    let stepper = step_graph(&dev, &count, &add, &counter, &iters);
    // The read-back loop: after each step, the counter comes back to decide.
    let readback_us = sample_us(|| {
        assert_eq!(readback_loop(&stepper, &counter, &stream), ITERATIONS);
    });
    // The blind loop: 100 launches queued, one synchronisation.
    let blind_us = sample_us(|| {
        for _ in 0..ITERATIONS {
            stepper.launch(&stream).unwrap();
        }
        stream.synchronize().unwrap();
    });
    report.row(
        "100-iteration loop: while node vs host read-back loop",
        "us",
        while_us,
        Some(readback_us),
        "host loop, read-back",
        Target::RatioAtMost(0.2),
    );
    report.row(
        "100-iteration loop: while node vs 100 queued launches",
        "us",
        while_us,
        Some(blind_us),
        "100 launches, 1 sync",
        Target::None,
    );
    // The same loops with 10 guarded steps per round: per while-node iteration, and per
    // host read-back. Same 100 steps, same exit rule (decided by the counter on the device).
    const UNROLL: usize = 10;
    let looped10 = while_graph(&dev, &step, &counter, &iters, UNROLL);
    iters.memset_u32(0)?;
    looped10.launch(&stream)?;
    stream.synchronize()?;
    assert_eq!(
        read_u32(&iters),
        ITERATIONS,
        "the unrolled while node: 100 steps"
    );
    let while10_us = sample_us(|| {
        looped10.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    let guarded10 = guarded_graph(&dev, &guarded, &counter, &iters, UNROLL);
    iters.memset_u32(0)?;
    let rounds = readback_loop(&guarded10, &counter, &stream);
    assert_eq!(
        (rounds, read_u32(&iters)),
        (ITERATIONS / UNROLL as u32, ITERATIONS)
    );
    let readback10_us = sample_us(|| {
        readback_loop(&guarded10, &counter, &stream);
    });
    report.row(
        "100-iteration loop: while node of 10 steps vs host read-back loop",
        "us",
        while10_us,
        Some(readback_us),
        "host loop, read-back",
        Target::RatioAtMost(0.2),
    );
    report.row(
        "100-iteration loop: while node of 10 steps vs read-back every 10",
        "us",
        while10_us,
        Some(readback10_us),
        "read-back every 10",
        Target::None,
    );

    // 2. Node update + relaunch against re-instantiation.
    let n = UPDATE_ELEMS;
    let x = DevicePtr::alloc(&dev, n * 4)?;
    let y = DevicePtr::alloc(&dev, n * 4)?;
    x.memset_u32(0x3f80_0000)?; // 1.0f
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    let build = |a: f32| {
        let mut g = GraphBuilder::new(&dev).unwrap();
        // SAFETY: axpb over n elements of n-element buffers.
        let k =
            unsafe { g.add_kernel_typed(&[], &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }.unwrap();
        (g.finish().unwrap(), k)
    };
    let (graph, node) = build(1.0);
    let mut exec = graph.instantiate()?;
    let mut a = 1.0f32;
    let update_us = sample_us(|| {
        a += 1.0;
        // SAFETY: as above.
        unsafe { exec.set_kernel_typed(node, &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }.unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    let mut check = [0f32; 1];
    y.slice(..4)?.copy_to_host(&mut check)?;
    assert_eq!(check[0], a, "the updated argument reached the kernel");
    let reinstantiate_us = sample_us(|| {
        a += 1.0;
        let (graph, _) = build(a);
        let fresh = graph.instantiate().unwrap();
        fresh.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    // The host cost alone: the update against building and instantiating.
    let update_only_us = sample_us(|| {
        a += 1.0;
        // SAFETY: as above.
        unsafe { exec.set_kernel_typed(node, &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }.unwrap();
    });
    let instantiate_only_us = sample_us(|| {
        a += 1.0;
        let (graph, _) = build(a);
        drop(graph.instantiate().unwrap());
    });
    let whole_us = sample_us(|| {
        a += 1.0;
        let (graph, _) = build(a);
        exec.try_update(&graph).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    report.row(
        "kernel argument: node update vs re-instantiation (host)",
        "us",
        update_only_us,
        Some(instantiate_only_us),
        "build + instantiate",
        Target::RatioAtMost(0.1),
    );
    report.row(
        "kernel argument: node update + relaunch vs re-instantiation + launch",
        "us",
        update_us,
        Some(reinstantiate_us),
        "build + instantiate",
        Target::RatioAtMost(0.1),
    );
    report.row(
        "kernel argument: whole-graph update + relaunch vs re-instantiation",
        "us",
        whole_us,
        Some(reinstantiate_us),
        "build + instantiate",
        Target::None,
    );

    // The same on a graph of 100 chained kernel nodes (a serving step's size), one updated.
    const NODES: usize = 100;
    let build_big = |a: f32| {
        let mut g = GraphBuilder::new(&dev).unwrap();
        let mut prev = Vec::new();
        let mut first = None;
        for _ in 0..NODES {
            // SAFETY: axpb over n elements of n-element buffers.
            let k = unsafe { g.add_kernel_typed(&prev, &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }
                .unwrap();
            first.get_or_insert(k);
            prev = vec![k];
        }
        (g.finish().unwrap(), first.unwrap())
    };
    let (big, big_node) = build_big(1.0);
    let mut big_exec = big.instantiate()?;
    let big_update_us = sample_us(|| {
        a += 1.0;
        // SAFETY: as above.
        unsafe { big_exec.set_kernel_typed(big_node, &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }
            .unwrap();
        big_exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    let big_reinstantiate_us = sample_us(|| {
        a += 1.0;
        let (graph, _) = build_big(a);
        let fresh = graph.instantiate().unwrap();
        fresh.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    });
    let big_update_only_us = sample_us(|| {
        a += 1.0;
        // SAFETY: as above.
        unsafe { big_exec.set_kernel_typed(big_node, &axpb, &cfg, (&y, &x, a, 0f32, n as u64)) }
            .unwrap();
    });
    let big_instantiate_only_us = sample_us(|| {
        a += 1.0;
        let (graph, _) = build_big(a);
        drop(graph.instantiate().unwrap());
    });
    report.row(
        "100-node graph: node update vs re-instantiation (host)",
        "us",
        big_update_only_us,
        Some(big_instantiate_only_us),
        "build + instantiate",
        Target::RatioAtMost(0.1),
    );
    report.row(
        "100-node graph: node update + relaunch vs re-instantiation + launch",
        "us",
        big_update_us,
        Some(big_reinstantiate_us),
        "build + instantiate",
        Target::RatioAtMost(0.1),
    );
    Ok(())
}
