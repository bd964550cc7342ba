//! Thin, `unsafe` wrappers over the driver's copy and memset calls on raw addresses, for
//! code that manages address lifetimes itself (memory pools, staging pipelines, benchmarks).
//! [`DevicePtr`](super::DevicePtr)'s methods are the safe layer over these.
//!
//! Each function makes `device`'s primary context current for the call (when it is not
//! already), checks nothing else, and does nothing for a length of 0. The
//! synchronous/asynchronous behaviour is the driver's, as described on
//! [`DevicePtr`](super::DevicePtr).
//!
//! # Safety (all functions)
//!
//! Every device range must be live memory that the driver may access in `device`'s context
//! (or in the named context, for peer copies) for `len` bytes; every host range must be valid
//! for `len` bytes, for reading (sources) or writing (destinations); for the `_async` forms
//! they must stay so, untouched by anyone else, until `stream` has run the operation; the
//! stream must belong to `device`.

use std::ffi::c_void;

use cudars_sys::CUdeviceptr;

use crate::driver::drv;
use crate::error::Result;
use crate::stream::Stream;
use crate::Device;

/// `cuMemcpyHtoD`: `len` bytes from host `src` to device `dst`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_htod(
    device: &Device,
    dst: CUdeviceptr,
    src: *const u8,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemcpyHtoD(dst, src.cast::<c_void>(), len)) }
}

/// `cuMemcpyHtoDAsync` on `stream`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_htod_async(
    device: &Device,
    dst: CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuMemcpyHtoDAsync(
            dst,
            src.cast::<c_void>(),
            len,
            stream.raw()
        ))
    }
}

/// `cuMemcpyDtoH`: `len` bytes from device `src` to host `dst`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_dtoh(device: &Device, dst: *mut u8, src: CUdeviceptr, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemcpyDtoH(dst.cast::<c_void>(), src, len)) }
}

/// `cuMemcpyDtoHAsync` on `stream`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_dtoh_async(
    device: &Device,
    dst: *mut u8,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuMemcpyDtoHAsync(
            dst.cast::<c_void>(),
            src,
            len,
            stream.raw()
        ))
    }
}

/// `cuMemcpyDtoD` within one device (non-overlapping ranges).
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_dtod(
    device: &Device,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemcpyDtoD(dst, src, len)) }
}

/// `cuMemcpyDtoDAsync` on `stream` (non-overlapping ranges).
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_dtod_async(
    device: &Device,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemcpyDtoDAsync(dst, src, len, stream.raw())) }
}

/// `cuMemcpyPeer`: from `src` on `src_device` to `dst` on `dst_device`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_peer(
    dst_device: &Device,
    dst: CUdeviceptr,
    src_device: &Device,
    src: CUdeviceptr,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // Both devices for the whole call: a reset of the source's device must wait for it.
    let _src_device = crate::health::enter(src_device)?;
    let dst_ctx = dst_device.primary_context()?;
    let src_ctx = src_device.primary_context()?;
    let _ctx = dst_device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemcpyPeer(dst, dst_ctx, src, src_ctx, len)) }
}

/// `cuMemcpyPeerAsync` on `stream` (a stream of `dst_device`).
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn copy_peer_async(
    dst_device: &Device,
    dst: CUdeviceptr,
    src_device: &Device,
    src: CUdeviceptr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    // Both devices for the whole call: a reset of the source's device must wait for it.
    let _src_device = crate::health::enter(src_device)?;
    let dst_ctx = dst_device.primary_context()?;
    let src_ctx = src_device.primary_context()?;
    let _ctx = dst_device.bind()?;
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuMemcpyPeerAsync(
            dst,
            dst_ctx,
            src,
            src_ctx,
            len,
            stream.raw()
        ))
    }
}

/// `cuMemsetD8`: `len` bytes at `dst` set to `value`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn memset_d8(device: &Device, dst: CUdeviceptr, value: u8, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD8(dst, value, len)) }
}

/// `cuMemsetD8Async` on `stream`.
///
/// # Safety
///
/// See the [module documentation](self).
pub unsafe fn memset_d8_async(
    device: &Device,
    dst: CUdeviceptr,
    value: u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD8Async(dst, value, len, stream.raw())) }
}

/// `cuMemsetD16`: `count` 16-bit elements at `dst` (2-byte aligned) set to `value`.
///
/// # Safety
///
/// See the [module documentation](self); the range is `2 * count` bytes.
pub unsafe fn memset_d16(
    device: &Device,
    dst: CUdeviceptr,
    value: u16,
    count: usize,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD16(dst, value, count)) }
}

/// `cuMemsetD16Async` on `stream`.
///
/// # Safety
///
/// See the [module documentation](self); the range is `2 * count` bytes.
pub unsafe fn memset_d16_async(
    device: &Device,
    dst: CUdeviceptr,
    value: u16,
    count: usize,
    stream: &Stream,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD16Async(dst, value, count, stream.raw())) }
}

/// `cuMemsetD32`: `count` 32-bit elements at `dst` (4-byte aligned) set to `value`.
///
/// # Safety
///
/// See the [module documentation](self); the range is `4 * count` bytes.
pub unsafe fn memset_d32(
    device: &Device,
    dst: CUdeviceptr,
    value: u32,
    count: usize,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD32(dst, value, count)) }
}

/// `cuMemsetD32Async` on `stream`.
///
/// # Safety
///
/// See the [module documentation](self); the range is `4 * count` bytes.
pub unsafe fn memset_d32_async(
    device: &Device,
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    stream: &Stream,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let _ctx = device.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv!(cuMemsetD32Async(dst, value, count, stream.raw())) }
}
