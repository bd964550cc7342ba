//! Support code for the workspace's integration tests and GPU benchmarks.
//!
//! The GPU tests live in `tests/gpu_*.rs` behind the `gpu` feature, so `cargo test` on a
//! machine without a GPU does not build them, and `cargo xtask gpu-bundle` does. A GPU test
//! never passes without a GPU: it fails at its first driver call.
//!
//! The kernels the tests and benchmarks launch are [`kernels`]: CUDA C++ compiled by NVRTC
//! (`cuda-rtc`), with the entry points, launch geometry and checks of `cuda-core`'s
//! hand-written PTX (`cudars_core::kernels`), which the tests about those PTX kernels use.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

pub mod bench;

pub mod gpu;

pub mod graphs;

pub mod kernels;

pub mod nccl_check;

pub mod rtc;

/// The path of a C library that is not the CUDA driver, for loader tests.
pub fn libc_path() -> &'static str {
    "libc.so.6"
}

/// The path of the `test_child` helper binary, which tests start as a child process.
///
/// In the GPU bundle it lies in `helpers/` beside the `tests/` directory of the running test
/// binary; under cargo it is `built`, the test's `env!("CARGO_BIN_EXE_test_child")`.
pub fn test_child_path(built: &str) -> std::path::PathBuf {
    let bundled = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?.parent()?;
        let path = dir.join("helpers").join("test_child");
        path.is_file().then_some(path)
    });
    bundled.unwrap_or_else(|| std::path::PathBuf::from(built))
}

/// The workspace README's Rust examples, compiled as doc tests so they stay true (here, not in
/// a published crate, whose package does not contain the workspace README).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
