//! The pool's one observation seam: [`Observed`], the wrapper every [`MemoryPool`] puts
//! around its backend. Each call the pool makes that gets or gives back device memory, maps
//! or unmaps a page, or orders one stream after another goes through it, and it fires the
//! memory hooks ([`hooks`](crate::hooks): `alloc_pre` / `alloc_post` around each segment and
//! page) and notes the memory history ([`history`](crate::history): segments, ranges, pages,
//! fences) around the backend's own call. A backend does one thing per method, one driver
//! (or simulated) call, and knows nothing of either.
//!
//! Every other [`Backend`] method is reached through `Deref`: the wrapper forwards what it
//! does not observe by construction, so a method added to the trait needs no forwarding.
//!
//! [`MemoryPool`]: crate::MemoryPool

use std::ops::Deref;
use std::sync::Arc;

use crate::backend::{Backend, DeviceAddress, DeviceId, MapRunFailure};
use crate::history::{EventKind, Recorder, RecorderSlot};
use crate::hooks::{self, MemoryEvent};

/// A backend with the pool's hooks and history around it (see the module docs).
#[derive(Debug)]
pub(crate) struct Observed<B> {
    backend: B,
    /// The recorder of [`MemoryPool::start_history`](crate::MemoryPool::start_history), when
    /// one is in.
    history: RecorderSlot,
}

impl<B> Deref for Observed<B> {
    type Target = B;
    #[inline]
    fn deref(&self) -> &B {
        &self.backend
    }
}

/// The hook event of a backend allocation (`kind`) of `size` bytes on `device`.
fn alloc_event(kind: EventKind, device: DeviceId, size: u64) -> MemoryEvent {
    MemoryEvent {
        kind,
        device,
        stream: None,
        size,
        addr: NO_ADDRESS,
        location: None,
    }
}

/// Runs `call` between the `alloc_pre` and `alloc_post` hooks, when any is installed;
/// `addr` gives the address the post hook reports (0: out of memory). An error skips the
/// post hook.
#[inline]
fn around_alloc<T, E>(
    kind: EventKind,
    device: DeviceId,
    size: u64,
    call: impl FnOnce() -> Result<Option<T>, E>,
    addr: impl FnOnce(&T) -> u64,
) -> Result<Option<T>, E> {
    if !hooks::any_installed() {
        return call();
    }
    let mut ev = alloc_event(kind, device, size);
    hooks::each(|h| h.alloc_pre(&ev));
    let got = call()?;
    ev.addr = DeviceAddress(got.as_ref().map_or(0, addr));
    hooks::each(|h| h.alloc_post(&ev));
    Ok(got)
}

const NO_ADDRESS: DeviceAddress = DeviceAddress(0);

impl<B: Backend> Observed<B> {
    pub(crate) fn new(backend: B) -> Observed<B> {
        Observed {
            backend,
            history: RecorderSlot::default(),
        }
    }

    /// The wrapped backend.
    pub(crate) fn inner(&self) -> &B {
        &self.backend
    }

    /// Puts `recorder` in (`None`: takes it out): later backend calls are noted into it.
    pub(crate) fn set_recorder(&self, recorder: Option<Arc<Recorder>>) {
        self.history.set(recorder);
    }

    /// [`Backend::allocate`], with the `alloc` hooks and a `SegmentAlloc` note.
    pub(crate) fn allocate(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, B::Error> {
        let got = around_alloc(
            EventKind::SegmentAlloc,
            device,
            size,
            || self.backend.allocate(device, size),
            |a| a.0,
        )?;
        if let Some(addr) = got {
            self.history
                .note(EventKind::SegmentAlloc, device, None, size, addr);
        }
        Ok(got)
    }

    /// [`Backend::deallocate`], with a `SegmentFree` note.
    ///
    /// # Safety
    ///
    /// [`Backend::deallocate`]'s contract.
    pub(crate) unsafe fn deallocate(
        &self,
        device: DeviceId,
        ptr: DeviceAddress,
        size: u64,
    ) -> Result<(), B::Error> {
        // SAFETY: the caller's contract is the method's.
        unsafe { self.backend.deallocate(device, ptr, size) }?;
        self.history
            .note(EventKind::SegmentFree, device, None, size, ptr);
        Ok(())
    }

    /// [`Backend::reserve_address_range`], with a `RangeReserve` note.
    pub(crate) fn reserve_address_range(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<DeviceAddress>, B::Error> {
        let got = self.backend.reserve_address_range(device, size)?;
        if let Some(addr) = got {
            self.history
                .note(EventKind::RangeReserve, device, None, size, addr);
        }
        Ok(got)
    }

    /// [`Backend::release_address_range`], with a `RangeRelease` note.
    ///
    /// # Safety
    ///
    /// [`Backend::release_address_range`]'s contract.
    pub(crate) unsafe fn release_address_range(
        &self,
        device: DeviceId,
        base: DeviceAddress,
        size: u64,
    ) -> Result<(), B::Error> {
        // SAFETY: the caller's contract is the method's.
        unsafe { self.backend.release_address_range(device, base, size) }?;
        self.history
            .note(EventKind::RangeRelease, device, None, size, base);
        Ok(())
    }

    /// [`Backend::create_physical`], with the `alloc` hooks (a page has no address: the post
    /// hook reports 1 for a page made, 0 for out of memory) and a `PageCreate` note.
    pub(crate) fn create_physical(
        &self,
        device: DeviceId,
        size: u64,
    ) -> Result<Option<B::Physical>, B::Error> {
        let got = around_alloc(
            EventKind::PageCreate,
            device,
            size,
            || self.backend.create_physical(device, size),
            |_| 1,
        )?;
        if got.is_some() {
            self.history
                .note(EventKind::PageCreate, device, None, size, NO_ADDRESS);
        }
        Ok(got)
    }

    /// [`Backend::release_physical`] of a page of `size` bytes, with a `PageRelease` note.
    ///
    /// # Safety
    ///
    /// [`Backend::release_physical`]'s contract.
    pub(crate) unsafe fn release_physical(
        &self,
        device: DeviceId,
        page: B::Physical,
        size: u64,
    ) -> Result<(), B::Error> {
        // SAFETY: the caller's contract is the method's.
        unsafe { self.backend.release_physical(device, page) }?;
        self.history
            .note(EventKind::PageRelease, device, None, size, NO_ADDRESS);
        Ok(())
    }

    /// [`Backend::map_run`], with a `PageMap` note for each page once all are mapped.
    ///
    /// # Safety
    ///
    /// [`Backend::map_run`]'s contract.
    pub(crate) unsafe fn map_run(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        page_size: u64,
        pages: &[&B::Physical],
    ) -> Result<(), MapRunFailure<B::Error>> {
        // SAFETY: the caller's contract is the method's.
        let mapped = unsafe { self.backend.map_run(device, addr, page_size, pages) };
        if self.history.is_on() {
            // Every page on success; on a failure, the pages left mapped (the pool keeps
            // them in its table and unmaps them later, through here).
            let noted: Vec<u64> = match &mapped {
                Ok(()) => (0..pages.len() as u64).collect(),
                Err(f) => f.left_mapped.iter().map(|&i| i as u64).collect(),
            };
            for i in noted {
                let at = DeviceAddress(addr.0 + i * page_size);
                self.history
                    .note(EventKind::PageMap, device, None, page_size, at);
            }
        }
        mapped
    }

    /// [`Backend::unmap`], with a `PageUnmap` note.
    ///
    /// # Safety
    ///
    /// [`Backend::unmap`]'s contract.
    pub(crate) unsafe fn unmap(
        &self,
        device: DeviceId,
        addr: DeviceAddress,
        size: u64,
    ) -> Result<(), B::Error> {
        // SAFETY: the caller's contract is the method's.
        unsafe { self.backend.unmap(device, addr, size) }?;
        self.history
            .note(EventKind::PageUnmap, device, None, size, addr);
        Ok(())
    }

    /// [`Backend::record_fence`], with a `FenceRecord` note naming the stream.
    pub(crate) fn record_fence(
        &self,
        device: DeviceId,
        stream: &B::Stream,
    ) -> Result<B::Fence, B::Error> {
        let fence = self.backend.record_fence(device, stream)?;
        if self.history.is_on() {
            let key = self.backend.stream_key(stream).ok();
            self.history
                .note(EventKind::FenceRecord, device, key, 0, NO_ADDRESS);
        }
        Ok(fence)
    }

    /// [`Backend::stream_wait_fence`], with a `StreamWait` note naming the stream.
    pub(crate) fn stream_wait_fence(
        &self,
        device: DeviceId,
        stream: &B::Stream,
        fence: &B::Fence,
    ) -> Result<(), B::Error> {
        self.backend.stream_wait_fence(device, stream, fence)?;
        if self.history.is_on() {
            let key = self.backend.stream_key(stream).ok();
            self.history
                .note(EventKind::StreamWait, device, key, 0, NO_ADDRESS);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use crate::history::{Clock, EventKind, Recorder};
    use crate::hooks::{self, MemoryEvent, MemoryHook};
    use crate::{DeviceId, MemoryPool, PoolConfig, SimulatedBackend, StreamKey};

    /// What the seam does with each `Backend` method: observed here (an inherent method of
    /// `Observed` of the same name, which the pool calls), or forwarded as is through
    /// `Deref`. A method added to the trait fails this test until it is put in one list.
    const OBSERVED: &[&str] = &[
        "allocate",
        "deallocate",
        "reserve_address_range",
        "release_address_range",
        "create_physical",
        "release_physical",
        "map_run",
        "unmap",
        "record_fence",
        "stream_wait_fence",
    ];
    const FORWARDED: &[&str] = &[
        "device_count",
        "device_info",
        // The pool maps runs only (`map_run`); a single-page map is not observed.
        "map",
        "stream_key",
        "may_release_stream",
        "may_linger",
        "retain_stream",
        "stream_released",
        "synchronize_stream",
        "fence_completed",
        "wait_fence",
        "is_capturing",
        "capture_id",
        "synchronize_device",
        "may_synchronize_device",
        "release_fence",
    ];

    /// The names of the methods a trait or impl block declares, read from source.
    fn methods(src: &str, start: &str) -> Vec<String> {
        let at = src.find(start).expect("the block");
        let body = &src[at..];
        let end = body.find("\n}\n").expect("the block's end");
        body[..end]
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                let rest = l
                    .strip_prefix("unsafe fn ")
                    .or_else(|| l.strip_prefix("fn "))?;
                let end = rest.find(['(', '<'])?;
                Some(rest[..end].to_string())
            })
            .collect()
    }

    #[test]
    fn every_backend_method_is_observed_or_forwarded() {
        let declared = methods(include_str!("backend.rs"), "pub unsafe trait Backend");
        assert!(declared.len() > 20, "read {declared:?}");
        for m in &declared {
            let observed = OBSERVED.contains(&m.as_str());
            let forwarded = FORWARDED.contains(&m.as_str());
            assert!(
                observed != forwarded,
                "Backend::{m} must be in exactly one of OBSERVED and FORWARDED"
            );
        }
        let wrapper = methods(include_str!("observe.rs"), "impl<B: Backend> Observed<B> {");
        for m in OBSERVED {
            assert!(declared.iter().any(|d| d == m), "{m} is no Backend method");
            assert!(wrapper.iter().any(|w| w == m), "Observed has no {m}");
        }
    }

    #[derive(Default)]
    struct Count(Mutex<Vec<(&'static str, u64)>>);
    impl MemoryHook for Count {
        fn alloc_pre(&self, e: &MemoryEvent) {
            self.0.lock().unwrap().push(("pre", e.addr.0));
        }
        fn alloc_post(&self, e: &MemoryEvent) {
            self.0.lock().unwrap().push(("post", e.addr.0));
        }
    }

    /// On both kinds of segment, the seam fires the `alloc` hooks once around each backend
    /// allocation and notes the backend's calls, once each, into the pool's recorder.
    #[test]
    fn hooks_and_history_fire_once_for_each_backend_call() {
        for vmm in [false, true] {
            let config = PoolConfig {
                virtual_memory: vmm,
                ..PoolConfig::default()
            };
            let pool = MemoryPool::with_config(SimulatedBackend::h200(1), config).unwrap();
            let rec = Arc::new(Recorder::new(1 << 12, Clock::Virtual));
            pool.start_history(Arc::clone(&rec));
            let count = Arc::new(Count::default());
            let guard = hooks::install(count.clone());
            let a = pool.malloc(DeviceId(0), &StreamKey(1), 3 << 20).unwrap();
            drop(guard);
            let seen = count.0.lock().unwrap().clone();
            assert!(!seen.is_empty(), "vmm {vmm}: no alloc hook fired");
            assert_eq!(seen.len() % 2, 0, "vmm {vmm}: {seen:?}");
            for pair in seen.chunks(2) {
                assert_eq!(pair[0], ("pre", 0), "vmm {vmm}: {seen:?}");
                assert_eq!(pair[1].0, "post");
                assert_ne!(pair[1].1, 0, "vmm {vmm}: an allocation that succeeded");
            }
            let h = rec.history();
            let kinds: Vec<_> = h.events.iter().map(|e| e.kind).collect();
            let made = kinds
                .iter()
                .filter(|k| matches!(k, EventKind::SegmentAlloc | EventKind::PageCreate))
                .count();
            assert_eq!(
                made,
                seen.len() / 2,
                "vmm {vmm}: one note per backend allocation"
            );
            drop(a);
            pool.free_all_blocks().unwrap();
            let h = rec.history();
            let released = h
                .events
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        EventKind::SegmentFree | EventKind::PageRelease | EventKind::PageUnmap
                    )
                })
                .count();
            assert!(released > 0, "vmm {vmm}: the trim went through the seam");
            assert_eq!(
                h.figures().peak_reserved,
                pool.stats(DeviceId(0)).unwrap().reserved.peak
            );
        }
    }

    /// A block marked on a second stream and freed waits in the pending list; the next
    /// malloc on its own stream settles it with a stream wait, which the history records
    /// (the pending path reaches the backend through the seam too).
    #[test]
    fn the_pending_path_records_its_stream_waits() {
        let pool = MemoryPool::new(SimulatedBackend::h200(1)).unwrap();
        // One 2 MiB page in all: the second malloc must reuse the first block.
        pool.set_limit(DeviceId(0), crate::Limit::Bytes(2 << 20))
            .unwrap();
        let rec = Arc::new(Recorder::new(1 << 12, Clock::Virtual));
        pool.start_history(Arc::clone(&rec));
        let a = pool.malloc(DeviceId(0), &StreamKey(1), 2 << 20).unwrap();
        a.record_stream(&StreamKey(2)).unwrap();
        // Work on the second stream that the device has not done: the free must wait for it.
        pool.backend().submit_work(DeviceId(0), StreamKey(2));
        drop(a);
        let waits = |rec: &Recorder| {
            rec.history()
                .events
                .iter()
                .filter(|e| e.kind == EventKind::StreamWait)
                .count()
        };
        let before = waits(&rec);
        let b = pool.malloc(DeviceId(0), &StreamKey(1), 2 << 20).unwrap();
        assert!(
            waits(&rec) > before,
            "no StreamWait noted: {:?}",
            rec.history()
                .events
                .iter()
                .map(|e| e.kind)
                .collect::<Vec<_>>()
        );
        drop(b);
    }
}
