//! Synchronous transfers: host to device, device to host (CuPy's `asnumpy`, with `out=`),
//! device to device and between devices.
//!
//! Every transfer picks its route by itself:
//! - pinned, registered or managed host memory, and anything smaller than
//!   [`StagingConfig::min_staged_bytes`](crate::staging::StagingConfig::min_staged_bytes):
//!   one driver copy;
//! - larger pageable memory: the pinned staging pipeline ([`staging`](mod@crate::staging)).
//!
//! Synchronous transfers are ordered like the driver's own synchronous copies: on the
//! device's legacy default stream, after the work already queued on blocking streams. They
//! return when the host buffer may be reused (to the device) or holds the data (to the
//! host).

use bytemuck::Pod;
use cuda_core::memory::DevicePtr;
use cuda_core::{Device, Stream};

use crate::buffer::DeviceBuffer;
use crate::elements::check_same_len;
use crate::error::Result;
use crate::host::HostMemoryKind;
use crate::location::is_dma_ready;
use crate::staging::{self, StagingConfig};

/// How a host <-> device copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// One driver call.
    Direct,
    /// Through the pinned staging pipeline.
    Staged,
}

/// The route for `bytes` bytes at `host`.
pub(crate) fn route(
    host: *const u8,
    bytes: usize,
    kind: HostMemoryKind,
    cfg: &StagingConfig,
) -> Result<Route> {
    let direct = bytes < cfg.min_staged_bytes
        || kind == HostMemoryKind::Pinned
        || crate::host::known::contains(host as usize, bytes)
        || is_dma_ready(host, bytes)?;
    staging::count_route(!direct, bytes);
    Ok(if direct { Route::Direct } else { Route::Staged })
}

/// Copies `src` into `dst` (same length), synchronously.
pub(crate) fn h2d(src: &[u8], dst: &DevicePtr, kind: HostMemoryKind) -> Result<()> {
    check_same_len("copy_to_device", dst.len(), src.len())?;
    if src.is_empty() {
        return Ok(());
    }
    let cfg = staging::config();
    match route(src.as_ptr(), src.len(), kind, &cfg)? {
        Route::Direct => Ok(dst.copy_from_host(src)?),
        Route::Staged => {
            let stream = Stream::null(&dst.device());
            // SAFETY: `src` is borrowed for the whole call and holds `dst.len()` bytes.
            let lease = unsafe { staging::to_device(src.as_ptr(), dst, &stream, &cfg) }?;
            // Leaks the slots if a wait fails (a DMA from them may still run).
            staging::finish(lease)
        }
    }
}

/// Copies `src` into `dst` (same length), synchronously.
pub(crate) fn d2h(src: &DevicePtr, dst: &mut [u8], kind: HostMemoryKind) -> Result<()> {
    check_same_len("to_host_into", dst.len(), src.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    let cfg = staging::config();
    match route(dst.as_ptr(), dst.len(), kind, &cfg)? {
        Route::Direct => Ok(src.copy_to_host(dst)?),
        Route::Staged => {
            let stream = Stream::null(&src.device());
            // SAFETY: `dst` is an exclusive borrow of `src.len()` bytes for the whole call.
            unsafe { staging::to_host(src, dst.as_mut_ptr(), &stream, &cfg) }
        }
    }
}

/// Copies `src` from the host into a new buffer on `device` (CuPy's `asarray` of a NumPy
/// array). An empty slice gives an empty buffer without a driver call.
///
/// ```no_run
/// let dev = cuda_core::Device::new(0)?;
/// let on_device = cuda_xfer::to_device(&dev, &[1.0f32, 2.0, 3.0])?;
/// assert_eq!(on_device.len(), 3);
/// # Ok::<(), cuda_xfer::Error>(())
/// ```
pub fn to_device<T: Pod>(device: &Device, src: &[T]) -> Result<DeviceBuffer<T>> {
    let dst = DeviceBuffer::alloc(device, src.len())?;
    copy_to_device(src, &dst)?;
    Ok(dst)
}

/// Copies `src` from the host into `dst`, which must hold as many elements
/// ([`Error::LengthMismatch`](crate::Error::LengthMismatch) otherwise, before any copy).
pub fn copy_to_device<T: Pod>(src: &[T], dst: &DeviceBuffer<T>) -> Result<()> {
    check_same_len("copy_to_device", dst.len(), src.len())?;
    h2d(
        bytemuck::cast_slice(src),
        dst.as_ptr(),
        HostMemoryKind::Unknown,
    )
}

/// Copies a device buffer into a new `Vec` (CuPy's `asnumpy`).
///
/// ```no_run
/// let dev = cuda_core::Device::new(0)?;
/// let on_device = cuda_xfer::to_device(&dev, &[half::f16::from_f32(0.5); 8])?;
/// let back: Vec<half::f16> = cuda_xfer::to_host(&on_device)?;
/// assert_eq!(back[7].to_f32(), 0.5);
/// # Ok::<(), cuda_xfer::Error>(())
/// ```
pub fn to_host<T: Pod>(src: &DeviceBuffer<T>) -> Result<Vec<T>> {
    // Zeroed memory from the allocator costs nothing up front for large sizes (fresh pages).
    let mut out: Vec<T> = bytemuck::zeroed_vec(src.len());
    to_host_into(src, &mut out)?;
    Ok(out)
}

/// Copies a device buffer into `dst`, which must hold as many elements (CuPy's
/// `asnumpy(a, out=dst)`; [`Error::LengthMismatch`](crate::Error::LengthMismatch) otherwise,
/// before any copy).
///
/// ```no_run
/// let dev = cuda_core::Device::new(0)?;
/// let on_device = cuda_xfer::to_device(&dev, &[1u64, 2, 3])?;
/// let mut out = [0u64; 3];
/// cuda_xfer::to_host_into(&on_device, &mut out)?;
/// assert_eq!(out, [1, 2, 3]);
/// # Ok::<(), cuda_xfer::Error>(())
/// ```
pub fn to_host_into<T: Pod>(src: &DeviceBuffer<T>, dst: &mut [T]) -> Result<()> {
    check_same_len("to_host_into", dst.len(), src.len())?;
    d2h(
        src.as_ptr(),
        bytemuck::cast_slice_mut(dst),
        HostMemoryKind::Unknown,
    )
}

/// Copies device buffer `src` into `dst` (same length; either device): `cuMemcpyDtoD` on one
/// device, a peer copy (`cuMemcpyPeer`) between two, which works whether or not peer access
/// is enabled. Ordered on the legacy default stream of `dst`'s device; like the driver's, the
/// call may return before the device has finished, and later work on that stream (and on
/// blocking streams) sees the result. Overlapping buffers are an error.
pub fn copy_device<T: Pod>(src: &DeviceBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
    check_same_len("copy_device", dst.len(), src.len())?;
    Ok(dst.as_ptr().copy_from_device(src.as_ptr())?)
}

/// Queues a copy of device buffer `src` into `dst` (same length; either device) on `stream`,
/// a stream of `dst`'s device. Both buffers are kept alive by the caller's handles; the
/// stream order makes later work on `stream` see the result.
pub fn copy_device_async<T: Pod>(
    src: &DeviceBuffer<T>,
    dst: &DeviceBuffer<T>,
    stream: &Stream,
) -> Result<()> {
    check_same_len("copy_device_async", dst.len(), src.len())?;
    Ok(dst.as_ptr().copy_from_device_async(src.as_ptr(), stream)?)
}

/// A copy of `src` in a new buffer on `device` (the same or another device: a peer copy),
/// like CuPy's `cupy.asarray(a)` inside `with Device(n):`.
///
/// ```no_run
/// let (d0, d1) = (cuda_core::Device::new(0)?, cuda_core::Device::new(1)?);
/// let a = cuda_xfer::to_device(&d0, &[1u8, 2, 3])?;
/// let b = cuda_xfer::to_device_of(&a, &d1)?;
/// assert_eq!(b.device(), d1);
/// # Ok::<(), cuda_xfer::Error>(())
/// ```
pub fn to_device_of<T: Pod>(src: &DeviceBuffer<T>, device: &Device) -> Result<DeviceBuffer<T>> {
    let dst = DeviceBuffer::alloc(device, src.len())?;
    copy_device(src, &dst)?;
    Ok(dst)
}
