//! With no driver, every call is a clear error and nothing panics. The check runs in a child
//! process whose `CUDA_DRIVER_LIBRARY` names a library that does not exist, so it holds on any
//! machine, with or without a GPU.

use std::process::Command;

const MISSING: &str = "/nonexistent/cuda-rs-test/libcuda.so.1";

#[test]
fn without_a_driver_every_call_is_an_error_not_a_panic() {
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

#[test]
#[ignore = "run by without_a_driver_every_call_is_an_error_not_a_panic in a child process"]
fn child_without_driver() {
    assert_eq!(std::env::var("CUDA_DRIVER_LIBRARY").as_deref(), Ok(MISSING));
    assert!(!cuda_core::is_available());
    let err = cuda_core::device_count().unwrap_err();
    assert!(matches!(err, cuda_core::Error::Load(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(MISSING), "{text}");
    assert!(matches!(
        cuda_core::Device::new(0),
        Err(cuda_core::Error::Load(_))
    ));
    assert!(cuda_core::driver_version().is_err());
    assert!(cuda_core::Device::current().is_err());
}
