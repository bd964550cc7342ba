//! [`RecordingBackend`]: a backend that records what the pool asks of another one.

use std::sync::Arc;

use super::{EventKind, Recorder};
use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, MapRunFailure, StreamKey};

/// Wraps a backend and records every segment, page and cross-stream fence call the pool
/// makes through it into a [`Recorder`], then does exactly what the wrapped backend does.
///
/// ```
/// use std::sync::Arc;
/// use cudars_mempool::history::{Clock, EventKind, Recorder, RecordingBackend};
/// use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};
///
/// let rec = Arc::new(Recorder::new(1024, Clock::Virtual));
/// let pool = MemoryPool::new(RecordingBackend::new(SimulatedBackend::h200(1), rec.clone()))?;
/// let a = pool.malloc(DeviceId(0), &StreamKey(1), 1 << 20)?;
/// let h = rec.history();
/// assert!(h.events.iter().any(|e| e.kind == EventKind::PageMap));
/// assert_eq!(h.figures().peak_reserved, pool.stats(DeviceId(0))?.reserved.peak);
/// # drop(a);
/// # Ok::<(), cudars_mempool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct RecordingBackend<B> {
    inner: B,
    recorder: Arc<Recorder>,
}

/// A physical page of a [`RecordingBackend`]: the wrapped backend's page and its size.
#[derive(Debug)]
pub struct RecordedPage<P> {
    page: P,
    size: u64,
}

impl<B: Backend> RecordingBackend<B> {
    /// Wraps `inner`, recording into `recorder`.
    pub fn new(inner: B, recorder: Arc<Recorder>) -> Self {
        RecordingBackend { inner, recorder }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The recorder.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    fn note(&self, kind: EventKind, device: DeviceId, size: u64, addr: DeviceAddress) {
        self.recorder.event(kind, device, None, size, addr, None);
    }

    fn key(&self, stream: &B::Stream) -> Option<StreamKey> {
        self.inner.stream_key(stream).ok()
    }
}

// SAFETY: every method forwards to the wrapped backend with the same arguments and returns
// its answer unchanged (pages are the wrapped backend's pages with their size beside them),
// so each promise of the trait holds because the wrapped backend keeps it; recording only
// appends to the recorder, which touches no memory, page or fence.
unsafe impl<B: Backend> Backend for RecordingBackend<B> {
    type Stream = B::Stream;
    type Fence = B::Fence;
    type Physical = RecordedPage<B::Physical>;
    type Error = B::Error;

    fn device_count(&self) -> Result<u32, Self::Error> {
        self.inner.device_count()
    }

    fn device_info(&self, device: DeviceId) -> Result<DeviceInfo, Self::Error> {
        self.inner.device_info(device)
    }

    fn allocate(&self, device: DeviceId, size: u64) -> Result<Option<DeviceAddress>, Self::Error> {
        let r = self.inner.allocate(device, size)?;
        if let Some(addr) = r {
            self.note(EventKind::SegmentAlloc, device, size, addr);
        }
        Ok(r)
    }

    unsafe fn deallocate(
        &self,
        device: DeviceId,
        ptr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: the caller's promise for this backend is the same promise for the wrapped
        // one: `allocate` above returned exactly the wrapped backend's segments.
        unsafe { self.inner.deallocate(device, ptr, size) }?;
        self.note(EventKind::SegmentFree, device, size, ptr);
        Ok(())
    }

    fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error> {
        let r = self.inner.reserve_address_range(device, size)?;
        if let Some(addr) = r {
            self.note(EventKind::RangeReserve, device, size, addr);
        }
        Ok(r)
    }

    unsafe fn release_address_range(
        &self,
        device: DeviceId,
        base: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: the ranges of this backend are the wrapped backend's ranges, unchanged.
        unsafe { self.inner.release_address_range(device, base, size) }?;
        self.note(EventKind::RangeRelease, device, size, base);
        Ok(())
    }

    fn create_physical(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<Self::Physical>, Self::Error> {
        let r = self.inner.create_physical(device, size)?;
        Ok(r.map(|page| {
            self.note(EventKind::PageCreate, device, size, DeviceAddress(0));
            RecordedPage { page, size }
        }))
    }

    unsafe fn release_physical(
        &self,
        device: DeviceId,
        page: Self::Physical,
    ) -> Result<(), Self::Error> {
        let size = page.size;
        // SAFETY: `page.page` is the wrapped backend's page this wrapper's page holds; the
        // caller's promise (made by `create_physical` for `device`, mapped nowhere) is its.
        unsafe { self.inner.release_physical(device, page.page) }?;
        self.note(EventKind::PageRelease, device, size, DeviceAddress(0));
        Ok(())
    }

    unsafe fn map(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page: &Self::Physical,
    ) -> Result<(), Self::Error> {
        // SAFETY: the caller's promise about `addr` and `page` holds for the wrapped
        // backend's range and page, which are the ones this wrapper handed out.
        unsafe { self.inner.map(device, addr, &page.page) }?;
        self.note(EventKind::PageMap, device, page.size, addr);
        Ok(())
    }

    unsafe fn map_run(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page_size: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), MapRunFailure<Self::Error>> {
        let inner: Vec<&B::Physical> = pages.iter().map(|p| &p.page).collect();
        // SAFETY: the same run of the same pages, in the same order, as the caller promised.
        let r = unsafe { self.inner.map_run(device, addr, page_size, &inner) };
        let mapped: Vec<usize> = match &r {
            Ok(()) => (0..pages.len()).collect(),
            Err(failure) => failure.left_mapped.clone(),
        };
        for i in mapped {
            self.note(
                EventKind::PageMap,
                device,
                page_size,
                DeviceAddress(addr.0 + i as u64 * page_size),
            );
        }
        r
    }

    unsafe fn unmap(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        size: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: the page mapped at `addr` was mapped through the wrapped backend.
        unsafe { self.inner.unmap(device, addr, size) }?;
        self.note(EventKind::PageUnmap, device, size, addr);
        Ok(())
    }

    fn stream_key(&self, stream: &Self::Stream) -> Result<StreamKey, crate::PoolError> {
        self.inner.stream_key(stream)
    }

    fn may_release_stream(&self, stream: &Self::Stream) -> bool {
        self.inner.may_release_stream(stream)
    }

    fn retain_stream(&self, stream: &Self::Stream) -> Self::Stream {
        self.inner.retain_stream(stream)
    }

    fn stream_released(&self, stream: Self::Stream) {
        self.inner.stream_released(stream)
    }

    fn record_fence(
        &self,
        device: DeviceId,
        stream: &Self::Stream,
    ) -> Result<Self::Fence, Self::Error> {
        let f = self.inner.record_fence(device, stream)?;
        self.recorder.event(
            EventKind::FenceRecord,
            device,
            self.key(stream),
            0,
            DeviceAddress(0),
            None,
        );
        Ok(f)
    }

    fn synchronize_stream(&self, stream: &Self::Stream) -> Result<(), Self::Error> {
        self.inner.synchronize_stream(stream)
    }

    fn fence_completed(&self, fence: &Self::Fence) -> Result<bool, Self::Error> {
        self.inner.fence_completed(fence)
    }

    fn wait_fence(&self, fence: &Self::Fence) -> Result<(), Self::Error> {
        self.inner.wait_fence(fence)
    }

    fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: &Self::Stream,
        fence: &Self::Fence,
    ) -> Result<(), Self::Error> {
        self.inner.stream_wait_fence(device, stream, fence)?;
        self.recorder.event(
            EventKind::StreamWait,
            device,
            self.key(stream),
            0,
            DeviceAddress(0),
            None,
        );
        Ok(())
    }

    fn is_capturing(&self, stream: &Self::Stream) -> bool {
        self.inner.is_capturing(stream)
    }

    fn capture_id(&self, stream: &Self::Stream) -> Option<u64> {
        self.inner.capture_id(stream)
    }

    fn synchronize_device(&self, device: DeviceId) -> Result<(), Self::Error> {
        self.inner.synchronize_device(device)
    }

    fn release_fence(&self, fence: Self::Fence) {
        self.inner.release_fence(fence)
    }
}
