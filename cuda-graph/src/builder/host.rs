//! Host nodes: Rust closures run by the driver at each launch, and [`HostBuffer`], pinned
//! host memory a graph copies to and from.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::memory::{PinnedFlags, PinnedMemory};
use cudars_core::Device;

use super::registry::Owner;
use crate::error::Result;

pub(crate) struct HostBufferInner {
    pub(crate) mem: PinnedMemory,
}

/// Pinned host memory that graph copy nodes read or write: shared between the caller and
/// every graph that uses it, which keep it allocated.
///
/// A graph's copy may run whenever the graph is launched, so the contents are reached only
/// through `unsafe` calls whose caller promises that no launch using the buffer runs
/// meanwhile (after a `synchronize` of the launch stream, say).
/// [`try_into_inner`](Self::try_into_inner) gives the memory back once no graph holds it.
#[derive(Clone)]
pub struct HostBuffer {
    pub(crate) inner: Arc<HostBufferInner>,
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.inner.mem.as_ptr())
            .field("len", &self.len())
            .finish()
    }
}

impl HostBuffer {
    /// Wraps pinned memory.
    pub fn new(mem: PinnedMemory) -> HostBuffer {
        HostBuffer {
            inner: Arc::new(HostBufferInner { mem }),
        }
    }

    /// `len` bytes of zeroed pinned memory in `device`'s context.
    pub fn alloc(device: &Device, len: usize) -> Result<HostBuffer> {
        let mut mem = PinnedMemory::new(device, len, PinnedFlags::PORTABLE)?;
        mem.as_mut_slice().fill(0);
        Ok(HostBuffer::new(mem))
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    /// Whether it has zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first address.
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.mem.as_ptr()
    }

    /// Copies `src` into the start of the buffer (`src.len()` at most [`len`](Self::len):
    /// a longer one is [`cudars_core::Error::SizeMismatch`]).
    ///
    /// # Safety
    ///
    /// No launch of a graph that copies from or into this buffer runs during the call, and
    /// no other [`write`](Self::write) or [`read`](Self::read) of this buffer (through any
    /// clone, on any thread) runs at the same time.
    pub unsafe fn write<T: bytemuck::Pod>(&self, src: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(src);
        if bytes.len() > self.len() {
            return Err(cudars_core::Error::SizeMismatch {
                op: "HostBuffer::write",
                dst: self.len(),
                src: bytes.len(),
            }
            .into());
        }
        // SAFETY: the range is inside the buffer; the caller promises that no graph copy and
        // no other read or write touches it now, and `&self` access to the bytes is only
        // through these unsafe calls.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.inner.mem.as_ptr().cast_mut(),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies the start of the buffer into `dst` (`dst` at most [`len`](Self::len) bytes).
    ///
    /// # Safety
    ///
    /// No launch of a graph that copies into this buffer runs during the call, and no
    /// [`write`](Self::write) of this buffer (through any clone, on any thread) runs at the
    /// same time.
    pub unsafe fn read<T: bytemuck::Pod>(&self, dst: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if bytes.len() > self.len() {
            return Err(cudars_core::Error::SizeMismatch {
                op: "HostBuffer::read",
                dst: bytes.len(),
                src: self.len(),
            }
            .into());
        }
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.mem.as_ptr(), bytes.as_mut_ptr(), bytes.len())
        };
        Ok(())
    }

    /// The pinned memory back, when no graph and no other clone holds it (a graph's
    /// executables wait for their launches before they let go); else `Err(self)`.
    pub fn try_into_inner(self) -> std::result::Result<PinnedMemory, HostBuffer> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => Ok(inner.mem),
            Err(inner) => Err(HostBuffer { inner }),
        }
    }
}

/// What keeps a host buffer alive in a graph.
pub(crate) fn host_owner(h: &HostBuffer) -> Owner {
    Owner::Host(h.inner.clone() as Arc<dyn Any + Send + Sync>)
}

/// A host closure as a host node runs it.
pub(crate) struct HostCallback {
    pub(crate) f: Mutex<Box<dyn FnMut() + Send>>,
}

/// The host node's trampoline: runs the closure, catching a panic (it must not unwind into
/// the driver).
pub(crate) unsafe extern "C" fn host_trampoline(data: *mut c_void) {
    // SAFETY: `data` is the `HostCallback` of an `Arc` that every graph and executable graph
    // holding the node keeps alive until its launches have completed.
    let callback = unsafe { &*(data as *const HostCallback) };
    // A value of cuda-core that the closure drops here (taken out of a captured `Option`)
    // releases on cuda-core's release thread: no CUDA call inside the host function.
    let _inside = cudars_core::release::HostFunctionScope::enter();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut f = callback.f.lock().unwrap_or_else(PoisonError::into_inner);
        (f)();
    }));
}

pub(crate) fn host_callback(f: impl FnMut() + Send + 'static) -> (Arc<HostCallback>, *mut c_void) {
    let cb = Arc::new(HostCallback {
        f: Mutex::new(Box::new(f)),
    });
    let data = Arc::as_ptr(&cb) as *mut c_void;
    (cb, data)
}

pub(crate) use host_trampoline as HOST_TRAMPOLINE;
