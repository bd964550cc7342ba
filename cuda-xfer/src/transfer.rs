//! Synchronous transfers: host to device, device to host (CuPy's `asnumpy`, with `out=`),
//! device to device and between devices.
//!
//! Every transfer picks its route by itself:
//! - pinned, registered or managed host memory, and anything smaller than
//!   [`StagingConfig::min_staged_bytes`](crate::staging::StagingConfig::min_staged_bytes):
//!   one driver copy;
//! - larger pageable memory: the pinned staging pipeline ([`staging`](mod@crate::staging)).
//!
//! # A synchronous transfer is done when it returns
//!
//! Once [`to_device`], [`copy_to_device`], [`to_host`], [`to_host_into`], [`copy_device`],
//! [`to_device_of`] (and the 2-D and `ndarray` forms built on them) return, the data is where
//! it was sent, for the host and for work on **any** stream, non-blocking streams included.
//! They start after the work already queued on the device's legacy default stream (and, as
//! that stream does, on blocking streams).
//!
//! The driver's own synchronous copies do not promise that: `cuMemcpyHtoD` from pageable
//! memory returns once the source is in the driver's bounce buffer, before the last DMA has
//! landed, and `cuMemcpyDtoD`, `cuMemcpyPeer` and `cuMemsetD8` return before the device has
//! run them. Work on the legacy stream (and on blocking streams) is ordered after them, but a
//! kernel on a non-blocking stream started right after such a copy can read stale bytes.
//! So wherever the driver's copy may return early, these functions wait for the legacy
//! stream before they return (a `cuStreamSynchronize`, which returns as soon as the copy has
//! landed). The cost is stated on each function; where it matters, a stream-ordered form
//! takes the stream and says so in its name ([`copy_to_device_on_stream`],
//! [`copy_device_async`]).
//!
//! # Streams being captured
//!
//! The transfers that take host memory and a stream ([`copy_to_device_on_stream`],
//! [`to_device_on_stream`], and those of [`pending`](crate::pending)) refuse a stream that is
//! being captured into a graph with [`Error::Capturing`](crate::Error::Capturing), before
//! anything is allocated or issued: the graph would record the host address and use it at
//! every launch, after the transfer gave the buffer back. Device-to-device copies
//! ([`copy_device_async`]) are captured as usual (the graph keeps their memory alive).

use bytemuck::Pod;
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};

use crate::buffer::DeviceBuffer;
use crate::elements::check_same_len;
use crate::error::Result;
use crate::host::HostMemoryKind;
use crate::location::{host_dma, HostDma};
use crate::staging::{self, StagingConfig};

/// How a host <-> device copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// One driver call, on host memory of this kind (small buffers of unknown kind are not
    /// asked about: [`HostDma::Pageable`]).
    Direct(HostDma),
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
    let route =
        if kind == HostMemoryKind::Pinned || crate::host::known::contains(host as usize, bytes) {
            Route::Direct(HostDma::Pinned)
        } else if bytes < cfg.min_staged_bytes {
            Route::Direct(HostDma::Pageable)
        } else {
            match host_dma(host, bytes)? {
                HostDma::Pageable => Route::Staged,
                dma => Route::Direct(dma),
            }
        };
    staging::count_route(route == Route::Staged, bytes);
    Ok(route)
}

/// [`Error::Capturing`](crate::Error::Capturing) when `stream` is being captured into a
/// graph: every transfer that takes host memory and a stream calls it before it allocates
/// or issues anything. A capture would record the host address, and each launch of the
/// graph would read (or write) it after the transfer gave the buffer back: freed, or reused
/// heap memory. (Asked of the driver each time, so captures begun by foreign code count too.)
///
/// The [`Issue`](cudars_core::Issue) it returns is held until the transfer's work and fence
/// are issued: a capture that another thread begins through `cuda-core` in between waits for
/// it.
pub(crate) fn refuse_capture<'s>(
    stream: &'s Stream,
    op: &'static str,
) -> Result<cudars_core::Issue<'s>> {
    let issue = stream.issue_any();
    if cudars_core::graph::is_capturing(stream)? {
        return Err(crate::Error::Capturing { op });
    }
    Ok(issue)
}

pub(crate) use crate::buffer::land;

/// Copies `src` into `dst` (same length), synchronously; `Ok(true)` when the copy still has
/// to [`land`] on `dst`'s device before it is visible to every stream.
pub(crate) fn h2d_unlanded(src: &[u8], dst: &DevicePtr, kind: HostMemoryKind) -> Result<bool> {
    check_same_len("copy_to_device", dst.len(), src.len())?;
    if src.is_empty() {
        return Ok(false);
    }
    let cfg = staging::config();
    match route(src.as_ptr(), src.len(), kind, &cfg)? {
        Route::Direct(dma) => {
            dst.copy_from_host(src)?;
            // From pinned memory `cuMemcpyHtoD` is complete when it returns; from pageable
            // (or managed) memory the last DMA may still be in flight.
            Ok(dma != HostDma::Pinned)
        }
        Route::Staged => {
            let stream = Stream::null(&dst.device());
            // SAFETY: `src` is borrowed for the whole call and holds `dst.len()` bytes.
            let lease = unsafe { staging::to_device(src.as_ptr(), dst, &stream, &cfg) }?;
            // Waits for every slot's last DMA (all of them landed then); leaks the slots if
            // a wait fails (a DMA from them may still run).
            staging::finish(lease)?;
            Ok(false)
        }
    }
}

/// Copies `src` into `dst` (same length), synchronously, done for every stream on return.
pub(crate) fn h2d(src: &[u8], dst: &DevicePtr, kind: HostMemoryKind) -> Result<()> {
    if h2d_unlanded(src, dst, kind)? {
        land(&dst.device())?;
    }
    Ok(())
}

/// Copies `src` into `dst` (same length), synchronously, done on return. `fresh`: `dst` is
/// a heap buffer just allocated for the copy, so pageable (no need to ask the driver whether
/// a small one is managed memory).
pub(crate) fn d2h(src: &DevicePtr, dst: &mut [u8], fresh: bool) -> Result<()> {
    check_same_len("to_host_into", dst.len(), src.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    let cfg = staging::config();
    match route(dst.as_ptr(), dst.len(), HostMemoryKind::Unknown, &cfg)? {
        Route::Direct(dma) => {
            // `cuMemcpyDtoH` to pageable or pinned memory returns once the bytes are there;
            // managed memory is device-visible memory, whose copies may return early.
            src.copy_to_host(dst)?;
            // `route` does not ask the driver about small buffers (it says pageable): ask
            // here, so that a small managed destination lands too.
            let dma = if dma == HostDma::Pageable && !fresh {
                host_dma(dst.as_ptr(), dst.len())?
            } else {
                dma
            };
            if dma == HostDma::Managed {
                land(&src.device())?;
            }
            Ok(())
        }
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
/// Done when it returns: the data is on the device for work on any stream (see the
/// [module docs](self)). Cost of that promise: from pageable memory below
/// [`StagingConfig::min_staged_bytes`](crate::staging::StagingConfig::min_staged_bytes)
/// (1 MiB), a wait for the last DMA. On an H200 (bench_xfer, medians per call, against the
/// bare `cuMemcpyHtoD` that returns before the data lands): 4 KiB 8.2 us against 3.2,
/// 64 KiB 16.5 against 7.0, 256 KiB 26.7 against 15.8, 1023 KiB 82.5 against 57.4; the
/// same as the bare call followed by a stream synchronisation (8.0, 16.3, 27.3, 83.1 us).
/// From pinned or registered memory nothing (the driver's copy is complete when it
/// returns); from larger pageable memory nothing either (the staging pipeline already waits
/// for its DMAs: 4 MiB in 220 us, the bare driver call 262 us).
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let on_device = cudars_xfer::to_device(&dev, &[1.0f32, 2.0, 3.0])?;
/// assert_eq!(on_device.len(), 3);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_device<T: Pod>(device: &Device, src: &[T]) -> Result<DeviceBuffer<T>> {
    let dst = DeviceBuffer::alloc(device, src.len())?;
    copy_to_device(src, &dst)?;
    Ok(dst)
}

/// Copies `src` from the host into `dst`, which must hold as many elements
/// ([`Error::LengthMismatch`](crate::Error::LengthMismatch) otherwise, before any copy).
///
/// Done when it returns: the data is in `dst` for work on any stream (see the
/// [module docs](self)). Cost of that promise, as for [`to_device`]: from small pageable
/// memory a wait for the last DMA (4 KiB: 8.2 us against 3.2 us for the bare driver call
/// on an H200), nothing from pinned memory or for staged copies.
/// [`copy_to_device_on_stream`] is the stream-ordered form without that wait.
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let dst = cudars_xfer::DeviceBuffer::<u32>::alloc(&dev, 4)?;
/// cudars_xfer::copy_to_device(&[1u32, 2, 3, 4], &dst)?;
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn copy_to_device<T: Pod>(src: &[T], dst: &DeviceBuffer<T>) -> Result<()> {
    check_same_len("copy_to_device", dst.len(), src.len())?;
    h2d(
        bytemuck::cast_slice(src),
        dst.as_ptr(),
        HostMemoryKind::Unknown,
    )
}

/// Copies `src` from the host into a new buffer on `stream`'s device, ordered on `stream`:
/// the stream-ordered form of [`to_device`] (see [`copy_to_device_on_stream`]).
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let stream = cudars_core::Stream::builder(&dev).non_blocking(true).build()?;
/// let on_device = cudars_xfer::to_device_on_stream(&[1u8, 2, 3], &stream)?;
/// // ... work on `stream` sees the bytes; work on other streams must wait for `stream`.
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_device_on_stream<T: Pod>(src: &[T], stream: &Stream) -> Result<DeviceBuffer<T>> {
    // Before the allocation, which a capture would refuse too (and be invalidated by).
    let _gate = refuse_capture(stream, "to_device_on_stream")?;
    let dst = DeviceBuffer::alloc(&stream.device(), src.len())?;
    copy_to_device_on_stream(src, &dst, stream)?;
    Ok(dst)
}

/// Copies `src` from the host into `dst` (same length), ordered on `stream`, a stream of
/// `dst`'s device: the copy starts after the work queued on `stream` before it, and work
/// queued on `stream` after it sees the data. Returns once `src` may be reused; the data is
/// guaranteed in place only for work on `stream` (and for anything that waits for it).
///
/// The form to use for many small copies from pageable memory that feed work on one
/// stream: below [`StagingConfig::min_staged_bytes`](crate::staging::StagingConfig) it does
/// not wait for the DMA to land, which [`copy_to_device`] does (on an H200: 4 KiB in 2.9 us against 8.2 us, 256 KiB in 15.6 us against 26.7 us). From
/// pinned, registered or managed memory, and for staged (large pageable) sources, it waits
/// for the copy before it returns anyway (the source is borrowed), so it is done then, as
/// [`copy_to_device`] is.
///
/// A stream that is being captured into a graph is refused with
/// [`Error::Capturing`](crate::Error::Capturing), before anything is issued: the graph would
/// read `src`'s address at every launch, after the borrow ended (the driver captures a
/// pageable copy as a memcpy node from the host address).
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let stream = cudars_core::Stream::new(&dev)?;
/// let dst = cudars_xfer::DeviceBuffer::<f32>::alloc(&dev, 256)?;
/// cudars_xfer::copy_to_device_on_stream(&[0.5f32; 256], &dst, &stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn copy_to_device_on_stream<T: Pod>(
    src: &[T],
    dst: &DeviceBuffer<T>,
    stream: &Stream,
) -> Result<()> {
    check_same_len("copy_to_device_on_stream", dst.len(), src.len())?;
    stream.expect_device(dst.device())?;
    let _gate = refuse_capture(stream, "copy_to_device_on_stream")?;
    let bytes: &[u8] = bytemuck::cast_slice(src);
    if bytes.is_empty() {
        return Ok(());
    }
    let device_mem = dst.as_ptr();
    let cfg = staging::config();
    match route(bytes.as_ptr(), bytes.len(), HostMemoryKind::Unknown, &cfg)? {
        // `route` does not ask the driver about small buffers; here the answer decides
        // whether the borrow may end before the DMA, so ask (a pointer-attribute query).
        Route::Direct(HostDma::Pageable)
            if host_dma(bytes.as_ptr(), bytes.len())? == HostDma::Pageable =>
        {
            // SAFETY: from pageable memory the driver copies `bytes` into its own staging
            // memory before `cuMemcpyHtoDAsync` returns, so the borrow may end then.
            unsafe { device_mem.copy_from_host_async(bytes, stream) }?;
            Ok(())
        }
        Route::Direct(_) => {
            // SAFETY: the DMA reads `bytes` when the stream reaches it; the stream is
            // synchronised below, before the borrow ends, and on every error path.
            let issued = unsafe { device_mem.copy_from_host_async(bytes, stream) };
            let waited = stream.synchronize();
            issued?;
            Ok(waited?)
        }
        Route::Staged => {
            // SAFETY: `bytes` is borrowed for the whole call.
            let lease = unsafe { staging::to_device(bytes.as_ptr(), device_mem, stream, &cfg) }?;
            staging::finish(lease)
        }
    }
}

/// Copies a device buffer into a new `Vec` (CuPy's `asnumpy`).
///
/// Done when it returns, at no extra cost (the driver's device-to-host copies are complete
/// when they return into pageable or pinned memory). It starts after the work queued on the legacy default stream and on blocking streams;
/// work on a non-blocking stream that writes `src` must be waited for first.
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let on_device = cudars_xfer::to_device(&dev, &[half::f16::from_f32(0.5); 8])?;
/// let back: Vec<half::f16> = cudars_xfer::to_host(&on_device)?;
/// assert_eq!(back[7].to_f32(), 0.5);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_host<T: Pod>(src: &DeviceBuffer<T>) -> Result<Vec<T>> {
    // Zeroed memory from the allocator costs nothing up front for large sizes (fresh pages).
    let mut out: Vec<T> = bytemuck::zeroed_vec(src.len());
    d2h(src.as_ptr(), bytemuck::cast_slice_mut(&mut out), true)?;
    Ok(out)
}

/// Copies a device buffer into `dst`, which must hold as many elements (CuPy's
/// `asnumpy(a, out=dst)`; [`Error::LengthMismatch`](crate::Error::LengthMismatch) otherwise,
/// before any copy).
///
/// Done when it returns, as [`to_host`] is; into managed memory it waits for the legacy
/// stream as well (the driver's copy may return early there), which costs one `cuStreamSynchronize` (about 5 us on an H200
/// after a small copy).
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let on_device = cudars_xfer::to_device(&dev, &[1u64, 2, 3])?;
/// let mut out = [0u64; 3];
/// cudars_xfer::to_host_into(&on_device, &mut out)?;
/// assert_eq!(out, [1, 2, 3]);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_host_into<T: Pod>(src: &DeviceBuffer<T>, dst: &mut [T]) -> Result<()> {
    check_same_len("to_host_into", dst.len(), src.len())?;
    d2h(src.as_ptr(), bytemuck::cast_slice_mut(dst), false)
}

/// Copies device buffer `src` into `dst` (same length; either device): `cuMemcpyDtoD` on one
/// device, a peer copy (`cuMemcpyPeer`) between two, which works whether or not peer access
/// is enabled. Overlapping buffers are an error.
///
/// Done when it returns: the copy starts after the work queued on the legacy default stream
/// of `dst`'s device (and on its blocking streams), and the call waits for that stream (of
/// both devices, for a peer copy) before it returns, so work on any stream sees the result.
/// The driver's copy alone would return at once; the wait costs the copy's own time on the
/// device. On an H200 (bench_xfer): 4 KiB in 10.5 us against 5.1 us for the bare
/// `cuMemcpyDtoD`, 64 MiB in 43 us against 5.7 us. [`copy_device_async`] is the
/// stream-ordered form that returns at once.
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let a = cudars_xfer::to_device(&dev, &[1u16, 2, 3])?;
/// let b = cudars_xfer::DeviceBuffer::<u16>::alloc(&dev, 3)?;
/// cudars_xfer::copy_device(&a, &b)?;
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn copy_device<T: Pod>(src: &DeviceBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
    check_same_len("copy_device", dst.len(), src.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    dst.as_ptr().copy_from_device(src.as_ptr())?;
    land(&dst.device())?;
    if src.device() != dst.device() {
        land(&src.device())?;
    }
    Ok(())
}

/// Queues a copy of device buffer `src` into `dst` (same length; either device) on `stream`,
/// a stream of `dst`'s device, and returns at once. Both buffers are kept alive by the
/// caller's handles; the stream order makes later work on `stream` see the result.
pub fn copy_device_async<T: Pod>(
    src: &DeviceBuffer<T>,
    dst: &DeviceBuffer<T>,
    stream: &Stream,
) -> Result<()> {
    check_same_len("copy_device_async", dst.len(), src.len())?;
    Ok(dst.as_ptr().copy_from_device_async(src.as_ptr(), stream)?)
}

/// A copy of `src` in a new buffer on `device` (the same or another device: a peer copy),
/// like CuPy's `cupy.asarray(a)` inside `with Device(n):`. Done when it returns, with the
/// cost of [`copy_device`].
///
/// ```no_run
/// let (d0, d1) = (cudars_core::Device::new(0)?, cudars_core::Device::new(1)?);
/// let a = cudars_xfer::to_device(&d0, &[1u8, 2, 3])?;
/// let b = cudars_xfer::to_device_of(&a, &d1)?;
/// assert_eq!(b.device(), d1);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn to_device_of<T: Pod>(src: &DeviceBuffer<T>, device: &Device) -> Result<DeviceBuffer<T>> {
    let dst = DeviceBuffer::alloc(device, src.len())?;
    copy_device(src, &dst)?;
    Ok(dst)
}
