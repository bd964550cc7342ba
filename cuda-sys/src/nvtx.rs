//! NVTX3 marks and ranges.
//!
//! NVTX3 is header-only: when the build found `nvtx3/nvToolsExt.h` (in the CUDA include
//! directory or `NVTX_INCLUDE_DIR`), its `static inline` functions are compiled into this crate
//! and forward to a profiler if one is attached. Otherwise every function here does nothing,
//! which is NVTX's own behaviour with no profiler attached. [`ENABLED`] tells which.

use std::ffi::c_char;

/// `true` when the NVTX3 headers were compiled in.
pub const ENABLED: bool = cfg!(cuda_sys_nvtx);

#[cfg(cuda_sys_nvtx)]
#[allow(missing_docs, dead_code, clippy::all, rustdoc::all)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/nvtx.rs"));
}

#[cfg(cuda_sys_nvtx)]
fn attributes(message: *const c_char, argb: u32) -> ffi::nvtxEventAttributes_t {
    let mut a = ffi::nvtxEventAttributes_t {
        version: ffi::NVTX_VERSION as u16,
        size: std::mem::size_of::<ffi::nvtxEventAttributes_t>() as u16,
        colorType: ffi::nvtxColorType_t_NVTX_COLOR_ARGB as _,
        color: argb,
        messageType: ffi::nvtxMessageType_t_NVTX_MESSAGE_TYPE_ASCII as _,
        ..Default::default()
    };
    a.message.ascii = message;
    a
}

/// Places a mark, with an optional ARGB colour.
///
/// # Safety
///
/// `message` must point to a NUL-terminated string valid for the call.
pub unsafe fn mark(message: *const c_char, argb: Option<u32>) {
    #[cfg(cuda_sys_nvtx)]
    match argb {
        // SAFETY: valid attributes and string (caller).
        Some(c) => unsafe { ffi::nvtxMarkEx(&attributes(message, c)) },
        // SAFETY: valid string (caller).
        None => unsafe { ffi::nvtxMarkA(message) },
    }
    #[cfg(not(cuda_sys_nvtx))]
    let _ = (message, argb);
}

/// Pushes a range, with an optional ARGB colour; returns the new depth (negative on error or
/// when no profiler is attached, as NVTX does).
///
/// # Safety
///
/// `message` must point to a NUL-terminated string valid for the call.
pub unsafe fn range_push(message: *const c_char, argb: Option<u32>) -> i32 {
    #[cfg(cuda_sys_nvtx)]
    match argb {
        // SAFETY: valid attributes and string (caller).
        Some(c) => unsafe { ffi::nvtxRangePushEx(&attributes(message, c)) },
        // SAFETY: valid string (caller).
        None => unsafe { ffi::nvtxRangePushA(message) },
    }
    #[cfg(not(cuda_sys_nvtx))]
    {
        let _ = (message, argb);
        -1
    }
}

/// Pops the innermost range; returns the depth it had (negative on error or with no profiler).
pub fn range_pop() -> i32 {
    #[cfg(cuda_sys_nvtx)]
    // SAFETY: nvtxRangePop takes no arguments and tolerates an empty stack.
    return unsafe { ffi::nvtxRangePop() };
    #[cfg(not(cuda_sys_nvtx))]
    -1
}
