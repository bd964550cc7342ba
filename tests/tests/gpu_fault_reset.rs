//! GPU, in a child process (each round provokes a kernel fault on purpose): surviving a
//! device fault (cudars_core::health). Eight threads work through the pool, kernels (PTX and
//! cuda-rtc's), stream futures, captured graphs, an NCCL all-reduce on a communicator of one
//! rank each, cuda-xfer round trips and checked synchronous copies until a kernel writes an
//! illegal address; every thread must get `Error::ContextLost` within a second of the
//! faulting launch, with no hang and no panic. Then `Device::reset_after_fault`, old handles
//! (a stream, device memory, an event, a pool block, the pool, the module, a `Device` value)
//! fail closed when used and dropped, and a fresh workload (a new pool, the default pool, new
//! kernels) runs with its data checked. Twenty rounds in one process: the driver's free
//! memory after each reset stays level.
//!
//! Where the driver keeps the context lost after `cuDevicePrimaryCtxReset` (driver 580 after
//! an illegal address: `bench/results/round13/reset_probe.py` finds no in-process sequence,
//! libcuda alone, that recovers it), the child checks the floor instead: the reset returns
//! `ContextLost` with the driver's error, and handles old and new keep failing closed.
//!
//! The child is `test_child device-reset 20` (tests/src/bin/test_child.rs). This binary is
//! left out of `run.sh sanitize`: memcheck rightly reports the fault the child provokes.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::process::Command;

#[test]
fn twenty_faults_each_reach_every_thread_then_a_reset_brings_the_device_back() {
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let out = Command::new(&helper)
        .args(["device-reset", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("child stdout:\n{stdout}");
    println!("child stderr:\n{stderr}");
    assert!(out.status.success(), "child failed: {}", out.status);
    // Every round's fault reached the eight threads as ContextLost within a second (the child
    // asserts it and prints the times).
    assert!(stdout
        .lines()
        .any(|l| l.starts_with("FAULT_ROUND 0 threads=8")));
    if let Some(floor) = stdout.lines().find(|l| l.starts_with("DEVICE_RESET floor")) {
        // The driver kept the context lost after its reset (a driver floor, not ours): the
        // child checked that the reset said so as ContextLost and that every handle, old and
        // new, fails closed without hanging.
        println!("reset below the driver's floor: {floor}");
        return;
    }
    let rounds = stdout
        .lines()
        .filter(|l| l.starts_with("RESET_ROUND"))
        .count();
    assert_eq!(rounds, 20, "one line per round");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("DEVICE_RESET ok rounds=20")),
        "the child's summary"
    );
}
