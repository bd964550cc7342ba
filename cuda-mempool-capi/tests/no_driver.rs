//! With no driver, every export that needs the pool fails with a null pointer or -1 and a
//! last-error message naming what was tried, and nothing panics. The check runs in a
//! child process whose `CUDA_DRIVER_LIBRARY` names a library that does not exist, so it
//! holds on any machine, with or without a GPU.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::ffi::CStr;
use std::process::Command;

use cudars_mempool_capi::*;

const MISSING: &str = "/nonexistent/cuda-mempool-capi-test/libcuda.so.1";

#[test]
fn without_a_driver_every_call_fails_cleanly() {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_without_driver",
            "--ignored",
            "--nocapture",
        ])
        .env("CUDA_DRIVER_LIBRARY", MISSING)
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child test did not run:\n{stdout}"
    );
}

/// The calling thread's last error, through the C entry point.
fn last_error() -> String {
    let p = cuda_mempool_last_error();
    assert!(!p.is_null(), "a failure must leave a last-error message");
    // SAFETY: a non-null result points to this thread's NUL-terminated message, valid
    // until the next failure on this thread; it is copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Asserts that the last error names `call` and the missing driver, then clears it.
fn expect_error(call: &str) {
    let msg = last_error();
    assert!(msg.starts_with(call), "{call}: {msg}");
    assert!(
        msg.contains(MISSING),
        "{call} should say what was tried: {msg}"
    );
    cuda_mempool_clear_error();
    assert!(cuda_mempool_last_error().is_null());
}

#[test]
#[ignore = "run by without_a_driver_every_call_fails_cleanly in a child process"]
fn child_without_driver() {
    assert_eq!(std::env::var("CUDA_DRIVER_LIBRARY").as_deref(), Ok(MISSING));
    assert!(!cudars_core::is_available());
    let null = std::ptr::null_mut();
    cuda_mempool_clear_error();

    // Twice: a failed pool creation is not cached as success.
    for _ in 0..2 {
        // SAFETY: a null stream is the legacy default stream.
        assert!(unsafe { cuda_mempool_alloc(1 << 20, 0, null) }.is_null());
        expect_error("cuda_mempool_alloc");
    }
    // The plain CuPy route refuses before the driver: it needs CuPy's current stream, and this
    // process has no Python interpreter.
    assert!(cuda_mempool_cupy_malloc(null, 4096, 0).is_null());
    let msg = last_error();
    assert!(
        msg.starts_with("cuda_mempool_cupy_malloc") && msg.contains("no Python interpreter"),
        "{msg}"
    );
    cuda_mempool_clear_error();

    assert_eq!(cuda_mempool_used_bytes(0), -1);
    expect_error("cuda_mempool_used_bytes");
    assert_eq!(cuda_mempool_reserved_bytes(0), -1);
    expect_error("cuda_mempool_reserved_bytes");
    assert_eq!(cuda_mempool_peak_reserved_bytes(0), -1);
    expect_error("cuda_mempool_peak_reserved_bytes");
    assert_eq!(cuda_mempool_free_all_blocks(), -1);
    expect_error("cuda_mempool_free_all_blocks");
    assert_eq!(cuda_mempool_set_limit(0, 1 << 30), -1);
    expect_error("cuda_mempool_set_limit");
    assert_eq!(cuda_mempool_get_limit(0), -1);
    expect_error("cuda_mempool_get_limit");
    // SAFETY: a null stream is always acceptable.
    assert_eq!(unsafe { cuda_mempool_set_current_stream(0, null) }, -1);
    expect_error("cuda_mempool_set_current_stream");
    assert_eq!(cuda_mempool_history_start(16), -1);
    expect_error("cuda_mempool_history_start");
    assert_eq!(cuda_mempool_history_start_backtraces(16), -1);
    expect_error("cuda_mempool_history_start_backtraces");
    assert_eq!(cuda_mempool_history_stop(), -1);
    expect_error("cuda_mempool_history_stop");
    // SAFETY: null is refused before anything is read.
    let refused = unsafe { cuda_mempool_history_dump(std::ptr::null(), 0) };
    assert_eq!(refused, -1);
    let msg = last_error();
    assert!(msg.contains("path is null"), "{msg}");
    cuda_mempool_clear_error();
    let path = c"/tmp/cudars-no-history.html";
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cuda_mempool_history_dump(path.as_ptr(), 0) }, -1);
    expect_error("cuda_mempool_history_dump");
    assert!(!std::path::Path::new("/tmp/cudars-no-history.html").exists());

    // Nothing was handed out, and calls that need no driver still work.
    assert_eq!(cuda_mempool_live_allocations(), 0);
    // SAFETY: as above.
    assert!(unsafe { cuda_mempool_alloc(0, 0, null) }.is_null());
    assert!(
        cuda_mempool_last_error().is_null(),
        "size 0 is not an error"
    );
}
