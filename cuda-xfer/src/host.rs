//! Host buffers that asynchronous transfers can take ownership of, and typed pinned memory.
//!
//! An asynchronous transfer keeps its host buffer until the device is done with it (see
//! [`Pending`](crate::Pending)). It must *own* the buffer, not borrow it: a borrow can be
//! ended early by leaking the pending transfer with `std::mem::forget`, after which the
//! caller could read memory the device is still writing. An owned buffer leaked that way is
//! simply never freed, which is safe. [`TransferBuffer`] is the trait for such owned buffers;
//! borrowed slices get their asynchronous transfers through [`scope`](crate::scope).

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use cudars_core::memory::{HostBuffer, HostRegistration, PinnedFlags, PinnedMemory, RegisterFlags};
use cudars_core::Device;

use crate::elements::byte_len;
use crate::error::{Error, Result};

/// What is known about a host buffer's memory without asking the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMemoryKind {
    /// Page-locked (allocated pinned, or registered): copied by the driver directly.
    Pinned,
    /// Not known: large buffers are checked with the driver's pointer attributes, and
    /// staged when pageable.
    Unknown,
}

/// An owned host buffer of plain elements, whose memory stays in place while the value is
/// moved: what asynchronous transfers take and give back.
///
/// Implemented for `Vec<T>`, `Box<[T]>`, [`PinnedBuffer<T>`], [`PinnedMemory`] (as bytes) and
/// [`HostRegistration`] of an owned buffer. `Send + 'static`: a pending transfer may be
/// waited for on another thread, and must not borrow anything a leak could release.
///
/// # Safety
///
/// - `as_slice` and `as_mut_slice` return the same memory every time, and that memory stays
///   allocated and at the same address when the value is moved, until it is dropped;
/// - no other value gives access to that memory (the buffer owns it);
/// - `kind` returns [`HostMemoryKind::Pinned`] only for page-locked memory (a wrong
///   `Pinned` would only make copies slower, but keep the promise anyway).
pub unsafe trait TransferBuffer: Send + 'static {
    /// The element type.
    type Elem: Pod;
    /// The elements.
    fn as_slice(&self) -> &[Self::Elem];
    /// The elements, mutably.
    fn as_mut_slice(&mut self) -> &mut [Self::Elem];
    /// Whether the memory is known to be page-locked.
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Unknown
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec does; nothing reachable through
// the trait reallocates it.
unsafe impl<T: Pod + Send> TransferBuffer for Vec<T> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

// SAFETY: a boxed slice's heap buffer does not move with the box.
unsafe impl<T: Pod + Send> TransferBuffer for Box<[T]> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

// SAFETY: the pinned allocation is owned by the value and never moves.
unsafe impl TransferBuffer for PinnedMemory {
    type Elem = u8;
    fn as_slice(&self) -> &[u8] {
        PinnedMemory::as_slice(self)
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        PinnedMemory::as_mut_slice(self)
    }
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pinned
    }
}

// SAFETY: the registration owns the buffer, whose memory stays in place (HostBuffer's
// contract) and registered while the registration lives.
unsafe impl<B> TransferBuffer for HostRegistration<B>
where
    B: HostBuffer + Send + 'static,
    B::Elem: Send,
{
    type Elem = B::Elem;
    fn as_slice(&self) -> &[B::Elem] {
        HostRegistration::as_slice(self)
    }
    fn as_mut_slice(&mut self) -> &mut [B::Elem] {
        HostRegistration::as_mut_slice(self)
    }
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pinned
    }
}

/// Page-locked host memory holding `len` elements of `T`, zero-initialised: a typed
/// [`PinnedMemory`]. Dereferences to `[T]`.
///
/// Allocated portable (usable with every device). Transfers from and to it run at full DMA
/// speed and are truly asynchronous. `Send` and `Sync` like a `Vec<T>`.
///
/// ```no_run
/// use cudars_xfer::PinnedBuffer;
/// let dev = cudars_core::Device::new(0)?;
/// let mut buf = PinnedBuffer::<f32>::zeroed(&dev, 1024)?;
/// buf[0] = 1.5;
/// let on_device = cudars_xfer::to_device(&dev, &buf)?; // direct DMA, no staging
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub struct PinnedBuffer<T: Pod> {
    memory: ManuallyDrop<PinnedMemory>,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Pod> PinnedBuffer<T> {
    /// `len` zeroed elements of page-locked memory, allocated in `device`'s context and
    /// portable to every context. Zero elements allocate nothing.
    pub fn zeroed(device: &Device, len: usize) -> Result<PinnedBuffer<T>> {
        let bytes = byte_len::<T>(len)?;
        let mut memory = PinnedMemory::new(device, bytes, PinnedFlags::PORTABLE)?;
        memory.as_mut_slice().fill(0);
        PinnedBuffer::from_memory(memory)
    }

    /// A page-locked copy of `src`.
    pub fn from_slice(device: &Device, src: &[T]) -> Result<PinnedBuffer<T>> {
        let bytes = byte_len::<T>(src.len())?;
        let mut memory = PinnedMemory::new(device, bytes, PinnedFlags::PORTABLE)?;
        memory
            .as_mut_slice()
            .copy_from_slice(bytemuck::cast_slice(src));
        PinnedBuffer::from_memory(memory)
    }

    /// Views pinned memory as elements of `T`: [`Error::NotWholeElements`] when its size is
    /// not a multiple of `size_of::<T>()`, [`Error::Misaligned`] when its address is not
    /// aligned for `T` (pinned memory is page-aligned, so only for over-aligned types).
    pub fn from_memory(memory: PinnedMemory) -> Result<PinnedBuffer<T>> {
        let len = crate::elements::element_count::<T>(memory.len())?;
        if len > 0 && !(memory.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::Misaligned {
                addr: memory.as_ptr() as u64,
                align: std::mem::align_of::<T>(),
            });
        }
        known::insert(memory.as_ptr() as usize, memory.len());
        Ok(PinnedBuffer {
            memory: ManuallyDrop::new(memory),
            len,
            _elem: PhantomData,
        })
    }

    /// The untyped pinned memory.
    pub fn into_memory(self) -> PinnedMemory {
        let mut this = ManuallyDrop::new(self);
        known::remove(this.memory.as_ptr() as usize);
        // SAFETY: `this` is never dropped, so the memory is moved out exactly once.
        unsafe { ManuallyDrop::take(&mut this.memory) }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for zero elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Pod> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `from_memory` checked that the memory holds exactly `len` elements at an
        // address aligned for `T`; `T: Pod` makes every byte pattern a valid `T`.
        unsafe { std::slice::from_raw_parts(self.memory.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Pod> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        known::remove(self.memory.as_ptr() as usize);
        // SAFETY: dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.memory) };
    }
}

impl<T: Pod> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("elem", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("ptr", &self.memory.as_ptr())
            .finish()
    }
}

// SAFETY: the pinned allocation is owned by the value, never moves, and is page-locked.
unsafe impl<T: Pod + Send> TransferBuffer for PinnedBuffer<T> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pinned
    }
}

/// Page-locks a long-lived host buffer (`cuMemHostRegister`, portable to every context) so
/// that its transfers run at pinned speed without staging, for as long as the returned
/// [`Registered`] lives.
///
/// Registering costs about as much as copying the buffer once, so it pays off for buffers
/// that are transferred many times.
///
/// ```no_run
/// let dev = cudars_core::Device::new(0)?;
/// let mut reg = cudars_xfer::register(&dev, vec![0f32; 1 << 24])?;
/// reg[0] = 1.0;
/// let on_device = cudars_xfer::to_device(&dev, &reg)?; // pinned: direct DMA
/// let data: Vec<f32> = reg.into_inner();
/// # Ok::<(), cudars_xfer::Error>(())
/// ```
pub fn register<B: HostBuffer>(device: &Device, buffer: B) -> Result<Registered<B>> {
    let inner = HostRegistration::new(device, buffer, RegisterFlags::PORTABLE)?;
    let slice = inner.as_slice();
    let start = slice.as_ptr() as usize;
    known::insert(start, std::mem::size_of_val(slice));
    Ok(Registered {
        inner: ManuallyDrop::new(inner),
        start,
    })
}

/// A host buffer page-locked by [`register`]; unregistered on drop, or given back by
/// [`into_inner`](Self::into_inner). Dereferences to the buffer's elements.
///
/// Transfers recognise the buffer, and any slice of it, as pinned without asking the driver.
/// `Send` and `Sync` when the buffer is.
pub struct Registered<B: HostBuffer> {
    inner: ManuallyDrop<HostRegistration<B>>,
    start: usize,
}

impl<B: HostBuffer> Registered<B> {
    /// The registered elements.
    pub fn as_slice(&self) -> &[B::Elem] {
        self.inner.as_slice()
    }

    /// The registered elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [B::Elem] {
        self.inner.as_mut_slice()
    }

    /// The `cuda-core` registration.
    pub fn registration(&self) -> &HostRegistration<B> {
        &self.inner
    }

    /// Unregisters the buffer and gives it back.
    pub fn into_inner(self) -> B {
        let mut this = ManuallyDrop::new(self);
        known::remove(this.start);
        // SAFETY: `this` is never dropped, so the registration is moved out exactly once.
        unsafe { ManuallyDrop::take(&mut this.inner) }.into_inner()
    }
}

impl<B: HostBuffer> Deref for Registered<B> {
    type Target = [B::Elem];
    fn deref(&self) -> &[B::Elem] {
        self.as_slice()
    }
}

impl<B: HostBuffer> DerefMut for Registered<B> {
    fn deref_mut(&mut self) -> &mut [B::Elem] {
        self.as_mut_slice()
    }
}

impl<B: HostBuffer> Drop for Registered<B> {
    fn drop(&mut self) {
        known::remove(self.start);
        // SAFETY: dropped exactly once, here (after the range left the registry).
        unsafe { ManuallyDrop::drop(&mut self.inner) };
    }
}

impl<B: HostBuffer> fmt::Debug for Registered<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("registration", &*self.inner)
            .finish()
    }
}

// SAFETY: the registration owns the buffer, whose memory stays in place (HostBuffer's
// contract) and page-locked while the value lives.
unsafe impl<B> TransferBuffer for Registered<B>
where
    B: HostBuffer + Send + 'static,
    B::Elem: Send,
{
    type Elem = B::Elem;
    fn as_slice(&self) -> &[B::Elem] {
        Registered::as_slice(self)
    }
    fn as_mut_slice(&mut self) -> &mut [B::Elem] {
        Registered::as_mut_slice(self)
    }
    fn kind(&self) -> HostMemoryKind {
        HostMemoryKind::Pinned
    }
}

/// The page-locked ranges `cuda-xfer` itself made ([`PinnedBuffer`], [`register`]): a
/// transfer from or to a slice inside one of them is routed straight to the driver without
/// asking it about the pointer. Entries leave when their owner drops, so a stale entry can
/// only exist between a free and the removal just before it.
pub(crate) mod known {
    use std::collections::BTreeMap;
    use std::sync::{PoisonError, RwLock};

    static RANGES: RwLock<BTreeMap<usize, usize>> = RwLock::new(BTreeMap::new());

    /// Records `len` page-locked bytes at `start` (nothing for 0 bytes).
    pub(crate) fn insert(start: usize, len: usize) {
        if len == 0 {
            return;
        }
        let mut ranges = RANGES.write().unwrap_or_else(PoisonError::into_inner);
        ranges.insert(start, start.saturating_add(len));
    }

    /// Forgets the range starting at `start`.
    pub(crate) fn remove(start: usize) {
        let mut ranges = RANGES.write().unwrap_or_else(PoisonError::into_inner);
        ranges.remove(&start);
    }

    /// `true` when `len > 0` bytes at `ptr` lie inside one recorded range.
    pub(crate) fn contains(ptr: usize, len: usize) -> bool {
        let ranges = RANGES.read().unwrap_or_else(PoisonError::into_inner);
        match ranges.range(..=ptr).next_back() {
            Some((_, &end)) => len > 0 && ptr.saturating_add(len) <= end,
            None => false,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn ranges_are_found_only_when_they_cover_the_slice() {
            // Addresses no real allocation uses in this test process.
            let base = usize::MAX - (1 << 20);
            insert(base, 4096);
            insert(base + 8192, 100);
            assert!(contains(base, 4096));
            assert!(contains(base + 10, 10));
            assert!(!contains(base + 10, 4096), "runs past the end");
            assert!(!contains(base + 4096, 1), "just after the range");
            assert!(contains(base + 8192 + 99, 1));
            assert!(!contains(base - 1, 2), "starts before the range");
            assert!(!contains(base, 0));
            remove(base);
            assert!(!contains(base, 1));
            assert!(contains(base + 8192, 100));
            remove(base + 8192);
            insert(base, 0);
            assert!(!contains(base, 1), "empty ranges are not recorded");
        }
    }
}
