//! With no driver, every call is a clear error and nothing panics. The check runs in a child
//! process (the `test_child` helper binary) whose `CUDA_DRIVER_LIBRARY` names a library that does not exist, so it holds on any
//! machine, with or without a GPU.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::process::Command;

const MISSING: &str = "/nonexistent/cuda-rs-test/libcuda.so.1";

#[test]
fn without_a_driver_every_call_is_an_error_not_a_panic() {
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let out = Command::new(&helper)
        .args(["no-driver", MISSING])
        .env("CUDA_DRIVER_LIBRARY", MISSING)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", helper.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("NO_DRIVER ok"),
        "the child did not finish its checks:\n{stdout}"
    );
}
