//! `cuda_mempool_torch_alloc`: PyTorch's allocation function, which throws a C++ exception on
//! failure (see `src/torch_alloc.cpp`, compiled by `build.rs`).
//!
//! The C++ function cannot be exported by itself: rustc's version script for a cdylib makes
//! every symbol it did not define in Rust local. This `extern "C-unwind"` wrapper is the
//! exported symbol; the "C-unwind" ABI (on both sides) lets the C++ exception unwind through
//! this frame into PyTorch, which turns it into a Python `RuntimeError`. With `extern "C"`
//! the unwind would abort the process instead.
//!
//! To the lead: `mod torch_alloc;` and `pub use torch_alloc::cuda_mempool_torch_alloc;` in
//! lib.rs (and drop the Rust `cuda_mempool_torch_alloc` there).

use std::ffi::{c_int, c_void};

unsafe extern "C-unwind" {
    fn cuda_mempool_torch_alloc_throwing(
        size: isize,
        device: c_int,
        stream: *mut c_void,
    ) -> *mut c_void;
}

/// Allocates `size` bytes on `device` for use on `stream` through `cuda_mempool_alloc`.
/// NULL for size 0; for any other failure (negative size, out of memory, no driver) it throws
/// `std::runtime_error` and never returns NULL.
///
/// # Safety
/// Only for C++ callers that can receive a C++ exception (PyTorch); `stream` as for
/// `cuda_mempool_alloc`.
#[no_mangle]
pub unsafe extern "C-unwind" fn cuda_mempool_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: plain values passed through to the C++ trampoline, which may unwind ("C-unwind").
    unsafe { cuda_mempool_torch_alloc_throwing(size, device, stream) }
}
