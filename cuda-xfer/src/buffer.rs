//! [`DeviceBuffer<T>`]: a typed view of device memory.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use bytemuck::Pod;
use cudars_core::memory::DevicePtr;
use cudars_core::sys::CUdeviceptr;
use cudars_core::Device;

use crate::elements::{byte_len, check_device_alignment, element_count};
use crate::error::{Error, Result};

/// `len` elements of `T` in device memory: a typed [`DevicePtr`] (shared owner, offset,
/// length), what the transfers of this crate produce and consume.
///
/// Cloning shares the memory, as a `DevicePtr` does; it does not copy it. The memory is
/// freed when the last view of the allocation drops. Any [`DevicePtr`] whose address is
/// aligned for `T` and whose length is a whole number of elements becomes a `DeviceBuffer`
/// through [`from_ptr`](Self::from_ptr), so memory from `cuda-core`, pools or foreign owners
/// can be transferred too.
///
/// `Send` and `Sync` for every `T`: the value holds no `T`, only device memory that is
/// reached through the driver.
///
/// ```no_run
/// use cudars_xfer::DeviceBuffer;
/// let dev = cudars_core::Device::new(0)?;
/// let buf = DeviceBuffer::<u32>::zeroed(&dev, 1000)?;
/// let tail = buf.slice(900..)?; // shares the allocation
/// assert_eq!(cudars_xfer::to_host(&tail)?, vec![0u32; 100]);
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub struct DeviceBuffer<T> {
    ptr: DevicePtr,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for DeviceBuffer<T> {
    fn clone(&self) -> Self {
        DeviceBuffer {
            ptr: self.ptr.clone(),
            len: self.len,
            _elem: PhantomData,
        }
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates room for `len` elements on `device` (`cuMemAlloc`). The contents are
    /// whatever the memory held: any bytes are a valid `T`, but not a meaningful one.
    /// Zero elements allocate nothing.
    pub fn alloc(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = byte_len::<T>(len)?;
        if std::mem::size_of::<T>() == 0 {
            return Err(Error::ZeroSizedElement);
        }
        Ok(DeviceBuffer {
            ptr: DevicePtr::alloc(device, bytes)?,
            len,
            _elem: PhantomData,
        })
    }

    /// Allocates `len` elements on `device`, every byte zero.
    ///
    /// Done when it returns, like the synchronous transfers: the zeros are there for work on
    /// any stream. (`cuMemsetD8` returns before the device has run it, so this waits for the
    /// legacy default stream afterwards: one `cuStreamSynchronize`, about 5 us on an H200,
    /// plus the memset's own time on the device.)
    pub fn zeroed(device: &Device, len: usize) -> Result<DeviceBuffer<T>> {
        let buf = DeviceBuffer::alloc(device, len)?;
        if !buf.is_empty() {
            buf.ptr.memset(0)?;
            land(device)?;
        }
        Ok(buf)
    }

    /// Views device memory as elements of `T`: [`Error::Misaligned`] when its address is not
    /// aligned for `T`, [`Error::NotWholeElements`] when its length is not a multiple of
    /// `size_of::<T>()`.
    pub fn from_ptr(ptr: DevicePtr) -> Result<DeviceBuffer<T>> {
        let len = element_count::<T>(ptr.len())?;
        if len > 0 {
            check_device_alignment::<T>(ptr.as_raw())?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            _elem: PhantomData,
        })
    }

    /// The untyped view.
    pub fn as_ptr(&self) -> &DevicePtr {
        &self.ptr
    }

    /// Gives the untyped view.
    pub fn into_ptr(self) -> DevicePtr {
        self.ptr
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.ptr.device()
    }

    /// The device address of the first element.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr.as_raw()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for zero elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.ptr.len()
    }

    /// Elements `range` of this buffer, sharing the allocation. [`Error::Cuda`] with
    /// `OutOfRange` when the range does not lie inside the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceBuffer<T>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return Err(Error::Cuda(cudars_core::Error::OutOfRange {
                offset: start,
                len: end.saturating_sub(start),
                size: self.len,
            }));
        }
        let size = std::mem::size_of::<T>();
        Ok(DeviceBuffer {
            ptr: self.ptr.slice(start * size..end * size)?,
            len: end - start,
            _elem: PhantomData,
        })
    }
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("elem", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("ptr", &self.ptr)
            .finish()
    }
}

/// Waits until the work queued so far on `device`'s legacy default stream is done: what a
/// synchronous driver copy that may return early still owes (see the `transfer` module's
/// docs).
pub(crate) fn land(device: &Device) -> Result<()> {
    Ok(cudars_core::Stream::null(device).synchronize()?)
}
