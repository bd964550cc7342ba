//! [`DevicePtr`]: a view (shared owner, offset, length) into device memory, with copies and
//! memsets (CuPy's `MemoryPointer`).

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use cudars_sys::CUdeviceptr;

use super::managed::{advise_range, prefetch_range};
use super::raw;
use super::{Advice, DeviceAlloc, DeviceMemory, Location};
use crate::error::{Error, Result};
use crate::issue::Issue;
use crate::stream::Stream;
use crate::Device;

/// A view of `len` bytes at some offset into a shared allocation: CuPy's `MemoryPointer`.
///
/// The view holds its owner (any [`DeviceAlloc`]: device, managed, unowned or pool memory)
/// through an `Arc`, so the memory lives until the last view of it drops. Cloning is cheap
/// (an `Arc` clone); [`slice`](Self::slice) makes sub-views.
///
/// # Copies and memsets
///
/// | method | driver call |
/// | --- | --- |
/// | [`copy_from_host`](Self::copy_from_host) / [`copy_to_host`](Self::copy_to_host) | `cuMemcpyHtoD` / `cuMemcpyDtoH` |
/// | [`copy_from_host_async`](Self::copy_from_host_async) / [`copy_to_host_async`](Self::copy_to_host_async) (`unsafe`) | `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` |
/// | [`copy_from_device`](Self::copy_from_device) (+ `_async`) | `cuMemcpyDtoD`, or `cuMemcpyPeer` between devices |
/// | [`memset`](Self::memset), [`memset_u16`](Self::memset_u16), [`memset_u32`](Self::memset_u32) (+ `_async`) | `cuMemsetD8/16/32` |
///
/// # Ordering
///
/// Every operation, synchronous or not, comes after the work of the memory's earlier owners
/// (a pool block reused in stream order: see [`Handover`](super::Handover)):
///
/// - The synchronous forms first wait on the host for that work
///   ([`DeviceAlloc::prepare_synchronous_use`]), run on the device's legacy default stream,
///   and return once the operation has completed on the device (also device-to-device
///   copies and memsets, which the driver alone would leave running). So a synchronous call
///   never races the previous owner of a reused block, and a block freed after it is never
///   reused under it.
/// - The `_async` forms are ordered on the given stream, which must belong to the view's
///   device ([`Error::WrongDevice`] otherwise); they mark the stream on the owner
///   ([`record_stream`](Self::record_stream)), which also makes that stream wait for the
///   earlier owner's work when it is not the memory's allocation stream.
///
/// Sizes must match exactly ([`Error::SizeMismatch`]); a zero-byte operation succeeds without
/// calling the driver.
///
/// `DevicePtr` is `Send` and `Sync`: its owner is, and every access goes through the driver.
///
/// ```no_run
/// use cudars_core::{memory::DevicePtr, Device, Stream};
///
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let a = DevicePtr::alloc(&dev, 4096)?;
/// let b = DevicePtr::alloc(&dev, 4096)?;
/// a.memset_u32_async(0xdead_beef, &stream)?;
/// b.copy_from_device_async(&a, &stream)?;
/// stream.synchronize()?;
/// let mut host = vec![0u32; 1024];
/// b.copy_to_host(&mut host)?;
/// assert!(host.iter().all(|&x| x == 0xdead_beef));
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Clone)]
pub struct DevicePtr {
    owner: Arc<dyn DeviceAlloc>,
    addr: CUdeviceptr,
    len: usize,
    device: Device,
}

/// What a view drops instead of its owner inside a host function: nothing to release.
struct Released(Device);

// SAFETY: an empty range (address 0, no bytes): nothing to read, write or free.
unsafe impl DeviceAlloc for Released {
    fn device(&self) -> Device {
        self.0
    }
    fn as_raw(&self) -> CUdeviceptr {
        0
    }
    fn size(&self) -> usize {
        0
    }
}

impl Drop for DevicePtr {
    #[inline]
    fn drop(&mut self) {
        // The last view of an owner frees it (cuMemFree, a pool's fence, an unmap): never
        // inside a host function, where CUDA calls are forbidden. There the owner goes to the
        // release thread (only the last reference frees; others just count down there).
        if crate::release::inside_host_function() {
            let owner = std::mem::replace(&mut self.owner, Arc::new(Released(self.device)));
            crate::release::defer(Box::new(owner), crate::release::When::Now);
        }
    }
}

impl DevicePtr {
    /// A view of the whole of `alloc`, which the view (and its clones) now owns.
    pub fn new<A: DeviceAlloc + 'static>(alloc: A) -> DevicePtr {
        DevicePtr::from_arc(Arc::new(alloc))
    }

    /// A view of the whole of a shared allocation.
    pub fn from_arc(owner: Arc<dyn DeviceAlloc>) -> DevicePtr {
        let addr = owner.as_raw();
        let len = owner.size();
        let device = owner.device();
        DevicePtr {
            owner,
            addr,
            len,
            device,
        }
    }

    /// Allocates `size` bytes of plain device memory ([`DeviceMemory`]) and views all of it.
    /// Size 0 gives an empty view without a driver call.
    pub fn alloc(device: &Device, size: usize) -> Result<DevicePtr> {
        Ok(DevicePtr::new(DeviceMemory::new(device, size)?))
    }

    /// The allocation this view keeps alive.
    pub fn owner(&self) -> &Arc<dyn DeviceAlloc> {
        &self.owner
    }

    /// Notes that work issued with `issue` (on its stream, `stream` below) uses this memory, so
    /// that it is neither freed nor reused
    /// before that work is done (PyTorch's `record_stream`), whatever the owner: pool blocks
    /// and stream-ordered memory then make their free wait for `stream`; memory whose free
    /// waits for the device needs nothing. While `stream` is being captured into a graph
    /// (by [`crate::graph`] or `cuda-graph`), the owner is also kept alive by the graphs
    /// made from that capture, so a replay never writes freed memory.
    ///
    /// Every safe asynchronous operation of the view calls this itself; call it when you
    /// hand the address to other work on `stream` (a kernel launch, a library call).
    ///
    /// ```no_run
    /// use cudars_core::{memory::DevicePtr, Device, Stream};
    /// let dev = Device::new(0)?;
    /// let other = Stream::new(&dev)?;
    /// let buf = DevicePtr::alloc(&dev, 4096)?;
    /// let issue = other.issue(dev)?; // the capture gate, held until `issue` drops
    /// buf.record_stream(&issue)?;    // then launch a kernel that uses `buf` with `issue`
    /// # Ok::<(), cudars_core::Error>(())
    /// ```
    ///
    /// It also orders `stream` after the work of the memory's earlier owners when `stream` is
    /// not the memory's allocation stream (see [`Handover`](super::Handover)): call it
    /// *before* issuing the work, and issue nothing if it fails.
    ///
    /// Taking an [`Issue`] (not a stream) is what keeps the capture gate closed from this
    /// mark until the work is issued: a capture begun on another thread in between would
    /// capture work whose memory nothing keeps alive.
    pub fn record_stream(&self, issue: &Issue<'_>) -> Result<()> {
        // Memory of an ended context generation is refused before any work is queued: its
        // address may now belong to the new context.
        crate::health::usable(&self.device)?;
        let stream = issue.stream();
        self.owner.record_stream(stream)?;
        crate::graph::keep_alive_in_capture(stream, &self.owner)
    }

    /// Blocks the host until no earlier owner's work can touch the memory (a reused pool
    /// block: see [`Handover`](super::Handover)). Every synchronous operation of the view
    /// calls it; call it before you use the address in a synchronous call of your own (a
    /// library call on the legacy stream, a host read of mapped memory).
    pub fn prepare_synchronous_use(&self) -> Result<()> {
        crate::health::usable(&self.device)?;
        self.owner.prepare_synchronous_use()
    }

    /// Waits until the synchronous operation just issued on the legacy default stream has
    /// completed, so that it is over when the call returns (see the type's Ordering).
    fn finish_synchronous(&self, issued: Result<()>) -> Result<()> {
        issued?;
        // Through an event, not `cuStreamSynchronize` of the legacy stream, which would take
        // a host callback's report that belongs to whoever queued it there.
        let done = crate::event::Event::new(&self.device)?;
        done.record(&Stream::null(&self.device))?;
        done.synchronize()
    }

    /// The device of the memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device address of the view's first byte (CuPy's `ptr`).
    pub fn as_raw(&self) -> CUdeviceptr {
        self.addr
    }

    /// Offset of the view from the start of its allocation, in bytes.
    pub fn offset(&self) -> usize {
        (self.addr - self.owner.as_raw()) as usize
    }

    /// Length of the view in bytes (CuPy's `size`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the view has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-view of `range` (relative to this view), sharing the allocation.
    /// [`Error::OutOfRange`] when the range reaches past the end of this view.
    ///
    /// ```no_run
    /// # let dev = cudars_core::Device::new(0)?;
    /// let buf = cudars_core::memory::DevicePtr::alloc(&dev, 100)?;
    /// let mid = buf.slice(10..20)?;
    /// assert_eq!((mid.offset(), mid.len()), (10, 10));
    /// assert!(buf.slice(90..110).is_err());
    /// # Ok::<(), cudars_core::Error>(())
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DevicePtr> {
        let (start, len) = resolve(self.offset(), self.len, range)?;
        Ok(DevicePtr {
            owner: self.owner.clone(),
            addr: self.addr + start as CUdeviceptr,
            len,
            device: self.device,
        })
    }

    /// Splits the view in two at `mid`: `[0, mid)` and `[mid, len)`.
    pub fn split_at(&self, mid: usize) -> Result<(DevicePtr, DevicePtr)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    fn check_len(&self, op: &'static str, src: usize) -> Result<()> {
        if src == self.len {
            Ok(())
        } else {
            Err(Error::SizeMismatch {
                op,
                dst: self.len,
                src,
            })
        }
    }

    /// Copies `src` from the host into the view; `src` must be exactly as long as the view.
    /// Returns once `src` may be reused.
    pub fn copy_from_host<T: bytemuck::Pod>(&self, src: &[T]) -> Result<()> {
        let src: &[u8] = bytemuck::cast_slice(src);
        self.check_len("copy_from_host", src.len())?;
        if self.len == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        // SAFETY: the view's range is live device memory of its device (DeviceAlloc's
        // contract) that no earlier owner's work touches any more (just waited for); `src`
        // holds `len` readable bytes for the duration of the call, which does not return
        // before it has read them.
        let issued = unsafe { raw::copy_htod(&self.device, self.addr, src.as_ptr(), self.len) };
        self.finish_synchronous(issued)
    }

    /// Queues a copy of `src` into the view on `stream`, and returns at once.
    ///
    /// # Safety
    ///
    /// `src` is read when the stream reaches the copy, after this call returns: it must stay
    /// allocated and unmodified until the stream work is done (synchronise the stream, or an
    /// event recorded after the copy). For a truly asynchronous copy `src` should be pinned
    /// ([`PinnedMemory`](super::PinnedMemory) or [`HostRegistration`](super::HostRegistration));
    /// from pageable memory the driver stages it and may return later.
    pub unsafe fn copy_from_host_async<T: bytemuck::Pod>(
        &self,
        src: &[T],
        stream: &Stream,
    ) -> Result<()> {
        let src: &[u8] = bytemuck::cast_slice(src);
        self.check_len("copy_from_host_async", src.len())?;
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        // SAFETY: live device range of the stream's device; the caller keeps `src` alive and
        // unmodified until the stream has run the copy.
        unsafe { raw::copy_htod_async(&self.device, self.addr, src.as_ptr(), self.len, stream) }
    }

    /// Copies the view to `dst` on the host; `dst` must be exactly as long as the view.
    /// Returns when the data is in `dst`.
    pub fn copy_to_host<T: bytemuck::Pod>(&self, dst: &mut [T]) -> Result<()> {
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        self.check_len("copy_to_host", dst.len())?;
        if self.len == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        // SAFETY: live device range that no earlier owner's work touches any more; `dst` is
        // exclusively borrowed, holds `len` bytes, and cuMemcpyDtoH returns only after
        // writing them.
        unsafe { raw::copy_dtoh(&self.device, dst.as_mut_ptr(), self.addr, self.len) }
    }

    /// Copies the view into a new `Vec<u8>`.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Queues a copy of the view into `dst` on `stream`, and returns at once.
    ///
    /// # Safety
    ///
    /// `dst` is written when the stream reaches the copy, after this call returns: it must
    /// stay allocated, and must be neither read nor written by anyone, until the stream work
    /// is done (synchronise the stream, or an event recorded after the copy). For a truly
    /// asynchronous copy `dst` should be pinned.
    pub unsafe fn copy_to_host_async<T: bytemuck::Pod>(
        &self,
        dst: &mut [T],
        stream: &Stream,
    ) -> Result<()> {
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        self.check_len("copy_to_host_async", dst.len())?;
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        // SAFETY: live device range of the stream's device; the caller keeps `dst` alive and
        // untouched until the stream has run the copy.
        unsafe { raw::copy_dtoh_async(&self.device, dst.as_mut_ptr(), self.addr, self.len, stream) }
    }

    fn check_device_copy(&self, op: &'static str, src: &DevicePtr) -> Result<()> {
        self.check_len(op, src.len)?;
        let overlap = self.len != 0
            && src.addr < self.addr + self.len as CUdeviceptr
            && self.addr < src.addr + src.len as CUdeviceptr;
        if overlap && src.device == self.device {
            return Err(Error::InvalidArgument(format!(
                "{op}: source {:#x}+{} and destination {:#x}+{} overlap",
                src.addr, src.len, self.addr, self.len
            )));
        }
        Ok(())
    }

    /// Copies `src` (device memory of this or another device) into the view. Between devices
    /// this is a peer copy (`cuMemcpyPeer`), which works with or without peer access enabled
    /// (without it the driver stages through the host). Overlapping ranges are an
    /// [`Error::InvalidArgument`].
    pub fn copy_from_device(&self, src: &DevicePtr) -> Result<()> {
        self.check_device_copy("copy_from_device", src)?;
        if self.len == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        src.prepare_synchronous_use()?;
        let issued = if src.device == self.device {
            // SAFETY: both ranges are live device memory of this device, `len` bytes each,
            // not overlapping, and no earlier owner's work touches them any more.
            unsafe { raw::copy_dtod(&self.device, self.addr, src.addr, self.len) }
        } else {
            // SAFETY: each range is live device memory of its device, `len` bytes, that no
            // earlier owner's work touches any more.
            unsafe { raw::copy_peer(&self.device, self.addr, &src.device, src.addr, self.len) }
        };
        self.finish_synchronous(issued)?;
        if src.device != self.device {
            // The peer copy may also run on the source's device.
            src.finish_synchronous(Ok(()))?;
        }
        Ok(())
    }

    /// Queues a copy of `src` into the view on `stream` (a stream of the view's device);
    /// between devices a peer copy (`cuMemcpyPeerAsync`). Keep both allocations alive until
    /// the stream has run the copy (pools that free in stream order do this for you).
    pub fn copy_from_device_async(&self, src: &DevicePtr, stream: &Stream) -> Result<()> {
        self.check_device_copy("copy_from_device_async", src)?;
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        src.record_stream(&issue)?;
        if src.device == self.device {
            // SAFETY: both ranges are live device memory of the stream's device.
            unsafe { raw::copy_dtod_async(&self.device, self.addr, src.addr, self.len, stream) }
        } else {
            // SAFETY: each range is live device memory of its device; the stream is of the
            // destination's device.
            unsafe {
                raw::copy_peer_async(
                    &self.device,
                    self.addr,
                    &src.device,
                    src.addr,
                    self.len,
                    stream,
                )
            }
        }
    }

    /// Sets every byte of the view to `value` (`cuMemsetD8`).
    pub fn memset(&self, value: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        // SAFETY: live device range of this device, `len` bytes, that no earlier owner's
        // work touches any more.
        let issued = unsafe { raw::memset_d8(&self.device, self.addr, value, self.len) };
        self.finish_synchronous(issued)
    }

    /// Queues setting every byte of the view to `value` on `stream` (`cuMemsetD8Async`).
    pub fn memset_async(&self, value: u8, stream: &Stream) -> Result<()> {
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        // SAFETY: live device range of the stream's device.
        unsafe { raw::memset_d8_async(&self.device, self.addr, value, self.len, stream) }
    }

    /// The number of `width`-byte elements, checking address and length alignment.
    fn elements(&self, width: usize, op: &'static str) -> Result<usize> {
        if !self.addr.is_multiple_of(width as CUdeviceptr) || !self.len.is_multiple_of(width) {
            return Err(Error::InvalidArgument(format!(
                "{op}: view at {:#x} of {} bytes is not a whole number of aligned {width}-byte \
                 elements",
                self.addr, self.len
            )));
        }
        Ok(self.len / width)
    }

    /// Sets every 16-bit element of the view to `value` (`cuMemsetD16`). The view's address
    /// and length must be multiples of 2 ([`Error::InvalidArgument`] otherwise).
    pub fn memset_u16(&self, value: u16) -> Result<()> {
        let n = self.elements(2, "memset_u16")?;
        if n == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        // SAFETY: live device range that no earlier owner's work touches any more; `n`
        // aligned 16-bit elements fill it.
        let issued = unsafe { raw::memset_d16(&self.device, self.addr, value, n) };
        self.finish_synchronous(issued)
    }

    /// Queues [`memset_u16`](Self::memset_u16) on `stream` (`cuMemsetD16Async`).
    pub fn memset_u16_async(&self, value: u16, stream: &Stream) -> Result<()> {
        let n = self.elements(2, "memset_u16_async")?;
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        // SAFETY: as in `memset_u16`; the stream is of this device.
        unsafe { raw::memset_d16_async(&self.device, self.addr, value, n, stream) }
    }

    /// Sets every 32-bit element of the view to `value` (`cuMemsetD32`). The view's address
    /// and length must be multiples of 4 ([`Error::InvalidArgument`] otherwise).
    pub fn memset_u32(&self, value: u32) -> Result<()> {
        let n = self.elements(4, "memset_u32")?;
        if n == 0 {
            return Ok(());
        }
        self.prepare_synchronous_use()?;
        // SAFETY: live device range that no earlier owner's work touches any more; `n`
        // aligned 32-bit elements fill it.
        let issued = unsafe { raw::memset_d32(&self.device, self.addr, value, n) };
        self.finish_synchronous(issued)
    }

    /// Queues [`memset_u32`](Self::memset_u32) on `stream` (`cuMemsetD32Async`).
    pub fn memset_u32_async(&self, value: u32, stream: &Stream) -> Result<()> {
        let n = self.elements(4, "memset_u32_async")?;
        let issue = stream.issue(self.device)?;
        self.record_stream(&issue)?;
        // SAFETY: as in `memset_u32`; the stream is of this device.
        unsafe { raw::memset_d32_async(&self.device, self.addr, value, n, stream) }
    }

    /// Prefetches the view's bytes to `to`, ordered on `stream` (`cuMemPrefetchAsync`).
    /// Only for managed memory: the driver rejects other memory.
    pub fn prefetch(&self, to: Location, stream: &Stream) -> Result<()> {
        let issue = stream.issue_any();
        self.record_stream(&issue)?;
        prefetch_range(self.addr, self.len, to, stream)
    }

    /// Advises the driver about the view's bytes (`cuMemAdvise`). Only for managed memory.
    pub fn advise(&self, advice: Advice, location: Location) -> Result<()> {
        advise_range(self.device, self.addr, self.len, advice, location)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePtr")
            .field("device", &self.device.ordinal())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("offset", &self.offset())
            .field("len", &self.len)
            .finish()
    }
}

/// Resolves `range` against a view of `len` bytes at `base_offset` in its allocation:
/// `(start, length)` relative to the view, or the error [`DevicePtr::slice`] documents.
fn resolve(
    base_offset: usize,
    len: usize,
    range: impl RangeBounds<usize>,
) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1).ok_or(Error::SizeOverflow("slice start"))?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1).ok_or(Error::SizeOverflow("slice end"))?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::OutOfRange {
            offset: base_offset.saturating_add(start),
            len: end.saturating_sub(start),
            size: base_offset.saturating_add(len),
        });
    }
    Ok((start, end - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_relative_to_the_view() {
        assert_eq!(resolve(0, 100, ..).unwrap(), (0, 100));
        assert_eq!(resolve(0, 100, 10..20).unwrap(), (10, 10));
        assert_eq!(resolve(7, 100, 10..=19).unwrap(), (10, 10));
        assert_eq!(resolve(0, 100, 100..).unwrap(), (100, 0));
        assert_eq!(resolve(0, 0, ..).unwrap(), (0, 0));
        assert_eq!(
            resolve(0, 100, (Bound::Excluded(9), Bound::Unbounded)).unwrap(),
            (10, 90)
        );
    }

    #[test]
    fn out_of_range_reports_allocation_offsets() {
        match resolve(100, 200, 150..250) {
            Err(Error::OutOfRange { offset, len, size }) => {
                assert_eq!((offset, len, size), (250, 100, 300))
            }
            other => panic!("{other:?}"),
        }
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = resolve(0, 100, 5..3);
        assert!(matches!(reversed, Err(Error::OutOfRange { .. })));
        assert!(matches!(
            resolve(0, 100, 0..101),
            Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(
            resolve(0, 100, ..=usize::MAX),
            Err(Error::SizeOverflow(_))
        ));
        assert!(matches!(
            resolve(0, 100, (Bound::Excluded(usize::MAX), Bound::Unbounded)),
            Err(Error::SizeOverflow(_))
        ));
    }
}
