//! GPU, in a child process (a kernel fault kills the context for everything after it): a
//! kernel that faults on purpose makes every pending future of the context return an error
//! within a second: stream completions of both wake strategies (host functions never run
//! after a fault, so those rely on the reactor's health check), event completions, awaited
//! transfers and values waiting in `drop_after`.
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

#[test]
fn a_device_fault_reaches_every_pending_future_within_a_second() {
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let out = Command::new(&helper).arg("async-fault").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("child stdout:\n{stdout}");
    println!("child stderr:\n{stderr}");
    assert!(out.status.success(), "child failed: {}", out.status);
    let report = stdout
        .lines()
        .find(|l| l.starts_with("ASYNC_FAULT ok"))
        .expect("the child's report");
    println!("{report}");
}
