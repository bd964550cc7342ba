//! Support code for the workspace's integration tests and GPU benchmarks.
//!
//! The GPU tests live in `tests/gpu_*.rs` behind the `gpu` feature, so `cargo test` on a
//! machine without a GPU does not build them, and `cargo xtask gpu-bundle` does. A GPU test
//! never passes without a GPU: it fails at its first driver call.

pub mod ptx;

pub mod bench;

pub mod nccl_check;

/// The path of a C library that is not the CUDA driver, for loader tests.
pub fn libc_path() -> &'static str {
    "libc.so.6"
}
