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

    fn may_synchronize_device(&self, device: DeviceId) -> bool {
        // Not the trait's default (`true`): the wrapped driver backend says `false` while a
        // capture may run, and a device-wide wait then would invalidate that capture.
        self.inner.may_synchronize_device(device)
    }

    fn release_fence(&self, fence: Self::Fence) {
        self.inner.release_fence(fence)
    }

    fn set_recorder(&self, recorder: Option<Arc<super::Recorder>>) {
        // The wrapped backend records too when asked (a pool's `start_history`); this
        // wrapper keeps recording into its own recorder as well. Not into the same recorder
        // twice: the wrapper already records these calls there.
        match &recorder {
            Some(r) if Arc::ptr_eq(r, &self.recorder) => self.inner.set_recorder(None),
            _ => self.inner.set_recorder(recorder),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every method of [`Backend`] is forwarded: a wrapper that leaves one to the trait's
    //! default silently changes the wrapped backend's answer (the default
    //! `may_synchronize_device` is `true`, which let the out-of-memory recovery synchronise
    //! the device during another thread's capture).

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::RecordingBackend;
    use crate::backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, MapRunFailure, StreamKey};
    use crate::history::{Clock, Recorder};
    use crate::sim::SimulatedBackend;

    /// A simulated backend that counts the calls of every method and answers each provided
    /// method with something its default never says.
    struct Probe {
        sim: SimulatedBackend,
        calls: Mutex<BTreeMap<&'static str, usize>>,
    }

    impl Probe {
        fn hit(&self, name: &'static str) {
            *self.calls.lock().unwrap().entry(name).or_default() += 1;
        }
    }

    // SAFETY: every method forwards to the simulated backend, which keeps the trait's
    // promises; the overridden provided methods answer questions only (no memory, page or
    // fence is touched by them).
    unsafe impl Backend for Probe {
        type Stream = <SimulatedBackend as Backend>::Stream;
        type Fence = <SimulatedBackend as Backend>::Fence;
        type Physical = <SimulatedBackend as Backend>::Physical;
        type Error = <SimulatedBackend as Backend>::Error;
        fn device_count(&self) -> Result<u32, Self::Error> {
            self.hit("device_count");
            self.sim.device_count()
        }
        fn device_info(&self, device: DeviceId) -> Result<DeviceInfo, Self::Error> {
            self.hit("device_info");
            self.sim.device_info(device)
        }
        fn allocate(&self, d: DeviceId, size: u64) -> Result<Option<DeviceAddress>, Self::Error> {
            self.hit("allocate");
            self.sim.allocate(d, size)
        }
        unsafe fn deallocate(
            &self,
            d: DeviceId,
            p: DeviceAddress,
            size: u64,
        ) -> Result<(), Self::Error> {
            self.hit("deallocate");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.deallocate(d, p, size) }
        }
        fn reserve_address_range(
            &self,
            d: DeviceId,
            size: u64,
        ) -> Result<Option<DeviceAddress>, Self::Error> {
            self.hit("reserve_address_range");
            self.sim.reserve_address_range(d, size)
        }
        unsafe fn release_address_range(
            &self,
            d: DeviceId,
            b: DeviceAddress,
            size: u64,
        ) -> Result<(), Self::Error> {
            self.hit("release_address_range");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.release_address_range(d, b, size) }
        }
        fn create_physical(
            &self,
            d: DeviceId,
            size: u64,
        ) -> Result<Option<Self::Physical>, Self::Error> {
            self.hit("create_physical");
            self.sim.create_physical(d, size)
        }
        unsafe fn release_physical(
            &self,
            d: DeviceId,
            page: Self::Physical,
        ) -> Result<(), Self::Error> {
            self.hit("release_physical");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.release_physical(d, page) }
        }
        unsafe fn map(
            &self,
            d: DeviceId,
            a: DeviceAddress,
            page: &Self::Physical,
        ) -> Result<(), Self::Error> {
            self.hit("map");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.map(d, a, page) }
        }
        unsafe fn map_run(
            &self,
            d: DeviceId,
            a: DeviceAddress,
            page_size: u64,
            pages: &[&Self::Physical],
        ) -> Result<(), MapRunFailure<Self::Error>> {
            self.hit("map_run");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.map_run(d, a, page_size, pages) }
        }
        unsafe fn unmap(
            &self,
            d: DeviceId,
            a: DeviceAddress,
            size: u64,
        ) -> Result<(), Self::Error> {
            self.hit("unmap");
            // SAFETY: the caller's promise, passed on.
            unsafe { self.sim.unmap(d, a, size) }
        }
        fn stream_key(&self, s: &Self::Stream) -> Result<StreamKey, crate::PoolError> {
            self.hit("stream_key");
            self.sim.stream_key(s)
        }
        fn may_release_stream(&self, s: &Self::Stream) -> bool {
            self.hit("may_release_stream");
            self.sim.may_release_stream(s)
        }
        fn retain_stream(&self, s: &Self::Stream) -> Self::Stream {
            self.hit("retain_stream");
            self.sim.retain_stream(s)
        }
        fn stream_released(&self, s: Self::Stream) {
            self.hit("stream_released");
            self.sim.stream_released(s)
        }
        fn record_fence(&self, d: DeviceId, s: &Self::Stream) -> Result<Self::Fence, Self::Error> {
            self.hit("record_fence");
            self.sim.record_fence(d, s)
        }
        fn synchronize_stream(&self, s: &Self::Stream) -> Result<(), Self::Error> {
            self.hit("synchronize_stream");
            self.sim.synchronize_stream(s)
        }
        fn fence_completed(&self, f: &Self::Fence) -> Result<bool, Self::Error> {
            self.hit("fence_completed");
            self.sim.fence_completed(f)
        }
        fn wait_fence(&self, f: &Self::Fence) -> Result<(), Self::Error> {
            self.hit("wait_fence");
            self.sim.wait_fence(f)
        }
        fn stream_wait_fence(
            &self,
            d: DeviceId,
            s: &Self::Stream,
            f: &Self::Fence,
        ) -> Result<(), Self::Error> {
            self.hit("stream_wait_fence");
            self.sim.stream_wait_fence(d, s, f)
        }
        fn is_capturing(&self, _s: &Self::Stream) -> bool {
            self.hit("is_capturing");
            true
        }
        fn capture_id(&self, _s: &Self::Stream) -> Option<u64> {
            self.hit("capture_id");
            Some(77)
        }
        fn synchronize_device(&self, d: DeviceId) -> Result<(), Self::Error> {
            self.hit("synchronize_device");
            self.sim.synchronize_device(d)
        }
        fn may_synchronize_device(&self, _d: DeviceId) -> bool {
            self.hit("may_synchronize_device");
            false
        }
        fn release_fence(&self, f: Self::Fence) {
            self.hit("release_fence");
            self.sim.release_fence(f)
        }
        fn set_recorder(&self, _r: Option<Arc<Recorder>>) {
            self.hit("set_recorder");
        }
    }

    /// The names of the methods the `Backend` trait declares, read from its source.
    fn trait_methods() -> Vec<String> {
        let src = include_str!("../backend.rs");
        let start = src.find("pub unsafe trait Backend").expect("the trait");
        let body = &src[start..];
        let end = body.find("\n}\n").expect("the trait's end");
        let mut names: Vec<String> = body[..end]
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix("unsafe fn ")
                    .or_else(|| l.strip_prefix("fn "))?;
                Some(rest.split(['(', '<']).next()?.to_string())
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_recording_backend_forwards_every_method() {
        let probe = Probe {
            sim: SimulatedBackend::h200(1),
            calls: Mutex::new(BTreeMap::new()),
        };
        let b = RecordingBackend::new(probe, Arc::new(Recorder::new(1024, Clock::Virtual)));
        let d = DeviceId(0);
        let s = StreamKey(1);
        // The answers that differ from the trait's defaults come through unchanged.
        assert!(!b.may_synchronize_device(d), "may_synchronize_device");
        assert!(b.is_capturing(&s), "is_capturing");
        assert_eq!(b.capture_id(&s), Some(77), "capture_id");
        // Everything else is called once through the wrapper.
        b.device_count().unwrap();
        b.device_info(d).unwrap();
        let seg = b.allocate(d, 2 << 20).unwrap().unwrap();
        // SAFETY: the segment was allocated just above and is not used.
        unsafe { b.deallocate(d, seg, 2 << 20) }.unwrap();
        let range = b.reserve_address_range(d, 4 << 20).unwrap().unwrap();
        let p1 = b.create_physical(d, 2 << 20).unwrap().unwrap();
        let p2 = b.create_physical(d, 2 << 20).unwrap().unwrap();
        // SAFETY: fresh pages mapped into a fresh range, then unmapped before release.
        unsafe {
            b.map(d, range, &p1).unwrap();
            b.unmap(d, range, 2 << 20).unwrap();
            b.map_run(d, range, 2 << 20, &[&p1, &p2]).unwrap();
            b.unmap(d, range, 2 << 20).unwrap();
            b.unmap(d, DeviceAddress(range.0 + (2 << 20)), 2 << 20)
                .unwrap();
            b.release_physical(d, p1).unwrap();
            b.release_physical(d, p2).unwrap();
            b.release_address_range(d, range, 4 << 20).unwrap();
        }
        b.stream_key(&s).unwrap();
        let kept = b.retain_stream(&s);
        let _ = b.may_release_stream(&kept);
        b.stream_released(kept);
        let f = b.record_fence(d, &s).unwrap();
        b.fence_completed(&f).unwrap();
        b.wait_fence(&f).unwrap();
        b.stream_wait_fence(d, &s, &f).unwrap();
        b.release_fence(f);
        b.synchronize_stream(&s).unwrap();
        b.synchronize_device(d).unwrap();
        b.set_recorder(None);

        let calls = b.inner().calls.lock().unwrap().clone();
        let seen: Vec<String> = calls.keys().map(|k| k.to_string()).collect();
        assert_eq!(
            seen,
            trait_methods(),
            "every Backend method reaches the wrapped backend through RecordingBackend \
             (a method added to the trait must be forwarded, and called here)"
        );
    }
}
