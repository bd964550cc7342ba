//! GPU, in a child process (a kernel fault kills the context for everything after it): a
//! kernel that faults on purpose makes every pending future of the context return an error
//! within a second: stream completions of both wake strategies (host functions never run
//! after a fault, so those rely on the reactor's health check), event completions, awaited
//! transfers and values waiting in `drop_after`. In both wake modes: the child runs once
//! parked and once warm, with a spin budget (2 s) longer than the time to the fault, so that
//! the futures are spinning when it comes and see it at their next query (the mode is the
//! process's, from `CUDARS_WAKE_MODE`).
//!
//! The child is `test_child async-fault` (tests/src/bin/test_child.rs), which reports one
//! line; this binary is left out of `run.sh sanitize`, since memcheck rightly reports the
//! fault the child provokes.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::process::Command;

/// Runs the child with `CUDARS_WAKE_MODE=mode`; its `ASYNC_FAULT ok` line.
fn fault_child(mode: &str) -> String {
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let out = Command::new(&helper)
        .arg("async-fault")
        .env(cudars_core::completion::WAKE_MODE_ENV, mode)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("[{mode}] child stdout:\n{stdout}");
    println!("[{mode}] child stderr:\n{stderr}");
    assert!(
        out.status.success(),
        "[{mode}] child failed: {}",
        out.status
    );
    stdout
        .lines()
        .find(|l| l.starts_with("ASYNC_FAULT ok"))
        .expect("the child's report")
        .to_string()
}

/// The number after `key=` in a report line.
fn field(report: &str, key: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {report:?}"))
}

#[test]
fn a_device_fault_reaches_every_pending_future_within_a_second_parked() {
    let report = fault_child("parked");
    println!(
        "fault timings, parked: first error {} ms after the launch, all within {} ms; {report}",
        field(&report, "first_after_launch_ms"),
        field(&report, "spread_ms")
    );
}

#[test]
fn a_device_fault_reaches_every_pending_future_within_a_second_warm() {
    let report = fault_child("warm:2s");
    println!(
        "fault timings, warm: first error {} ms after the launch, all within {} ms; {report}",
        field(&report, "first_after_launch_ms"),
        field(&report, "spread_ms")
    );
    // The spinning futures saw the fault themselves: the reactor failed only what it held
    // (host-function entries, values in drop_after), not the polled futures (4 streams x 100
    // futures and a transfer each, of which 4 x 50 are host-function waits).
    let futures = field(&report, "futures");
    let failed = field(&report, "failed");
    assert!(
        failed < futures * 2 / 3,
        "the reactor failed {failed} of {futures} waits: the futures were not spinning"
    );
}
