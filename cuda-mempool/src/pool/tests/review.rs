//! Regression tests from the second independent review.

use super::*;

// ----- regression tests from the second independent review -----

/// Forwards to a shared simulated backend; `deallocate`/`unmap` note whether S0 still had
/// incomplete work at the time.
struct Watch {
    inner: std::sync::Arc<SimulatedBackend>,
    bad: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
impl Watch {
    fn check(&self) {
        if self.inner.completed(D0, S0) < self.inner.submitted(D0, S0) {
            self.bad.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
// SAFETY: forwards (test probe).
unsafe impl crate::backend::Backend for Watch {
    type Stream = StreamKey;
    type Fence = crate::sim::SimFence;
    type Physical = crate::sim::SimPage;
    type Error = crate::sim::SimError;
    fn device_count(&self) -> Result<u32, Self::Error> {
        self.inner.device_count()
    }
    fn device_info(&self, d: DeviceId) -> Result<DeviceInfo, Self::Error> {
        self.inner.device_info(d)
    }
    fn allocate(&self, d: DeviceId, s: u64) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.allocate(d, s)
    }
    unsafe fn deallocate(&self, d: DeviceId, p: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        self.check();
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.deallocate(d, p, s) }
    }
    fn reserve_address_range(
        &self,
        d: DeviceId,
        s: u64,
    ) -> Result<Option<DeviceAddress>, Self::Error> {
        self.inner.reserve_address_range(d, s)
    }
    unsafe fn release_address_range(
        &self,
        d: DeviceId,
        b: DeviceAddress,
        s: u64,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_address_range(d, b, s) }
    }
    fn create_physical(&self, d: DeviceId, s: u64) -> Result<Option<Self::Physical>, Self::Error> {
        self.inner.create_physical(d, s)
    }
    unsafe fn release_physical(&self, d: DeviceId, p: Self::Physical) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.release_physical(d, p) }
    }
    unsafe fn map(
        &self,
        d: DeviceId,
        a: DeviceAddress,
        p: &Self::Physical,
    ) -> Result<(), Self::Error> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.map(d, a, p) }
    }
    unsafe fn unmap(&self, d: DeviceId, a: DeviceAddress, s: u64) -> Result<(), Self::Error> {
        self.check();
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.unmap(d, a, s) }
    }
    fn stream_key(&self, s: &StreamKey) -> Result<StreamKey, PoolError> {
        self.inner.stream_key(s)
    }
    fn may_release_stream(&self, s: &StreamKey) -> bool {
        self.inner.may_release_stream(s)
    }
    fn retain_stream(&self, s: &StreamKey) -> StreamKey {
        self.inner.retain_stream(s)
    }
    fn stream_released(&self, s: StreamKey) {
        self.inner.stream_released(s)
    }
    fn record_fence(&self, d: DeviceId, s: &StreamKey) -> Result<Self::Fence, Self::Error> {
        self.inner.record_fence(d, s)
    }
    fn synchronize_stream(&self, s: &StreamKey) -> Result<(), Self::Error> {
        self.inner.synchronize_stream(s)
    }
    fn fence_completed(&self, f: &Self::Fence) -> Result<bool, Self::Error> {
        self.inner.fence_completed(f)
    }
    fn wait_fence(&self, f: &Self::Fence) -> Result<(), Self::Error> {
        self.inner.wait_fence(f)
    }
    fn stream_wait_fence(
        &self,
        d: DeviceId,
        s: &StreamKey,
        f: &Self::Fence,
    ) -> Result<(), Self::Error> {
        self.inner.stream_wait_fence(d, s, f)
    }
    fn is_capturing(&self, s: &StreamKey) -> bool {
        self.inner.is_capturing(s)
    }
    fn synchronize_device(&self, d: DeviceId) -> Result<(), Self::Error> {
        self.inner.synchronize_device(d)
    }
    fn release_fence(&self, f: Self::Fence) {
        self.inner.release_fence(f)
    }
}

/// A shard detached while its stream was captured (release_stream) is retired with
/// unfenced frees: the pool's Drop must not deallocate or unmap its memory while the work
/// that used it still runs (it counted a detached shard as fenced).
#[test]
fn dropping_the_pool_waits_for_the_work_of_a_retired_shard() {
    for granularity in [None, Some(2 * MIB as u64)] {
        let inner = std::sync::Arc::new(SimulatedBackend::new(vec![SimDevice {
            total_memory: 1 << 30,
            granularity,
        }]));
        let bad = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pool = MemoryPool::new(Watch {
            inner: inner.clone(),
            bad: bad.clone(),
        })
        .unwrap();
        let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
        inner.submit_work(D0, S0); // a kernel writing `a`, still running
        drop(a); // free on S0 (stream kept: the user holds it)
        inner.set_capturing(S0, true); // a capture begins on S0
        pool.release_stream(D0, &S0).unwrap(); // detached while captured: retired
        inner.set_capturing(S0, false);
        drop(pool);
        assert!(
            !bad.load(std::sync::atomic::Ordering::SeqCst),
            "{granularity:?}: memory released under running work"
        );
    }
}

struct Bomb;
impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("payload drop panics");
        }
    }
}
struct BombHook;
impl crate::hooks::MemoryHook for BombHook {
    fn alloc_post(&self, _: &crate::hooks::MemoryEvent) {
        std::panic::panic_any(Bomb);
    }
}

/// A hook whose panic payload panics again when dropped must not unwind into the pool.
#[test]
fn a_hook_panic_payload_that_panics_on_drop_stays_out_of_the_pool() {
    let pool = MemoryPool::new(SimulatedBackend::new(vec![SimDevice {
        total_memory: 1 << 30,
        granularity: Some((2 * MIB) as u64),
    }]))
    .unwrap();
    let escaped = {
        let _g = crate::hooks::install(std::sync::Arc::new(BombHook));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let a = pool.malloc(D0, &S0, 8 * MIB);
            drop(a);
        }))
        .is_err()
    };
    assert!(!escaped, "a hook's panic escaped malloc");
    let a = pool.malloc(D0, &S0, 8 * MIB).unwrap();
    let b = pool.malloc(D0, &S1, 8 * MIB).unwrap();
    drop((a, b));
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.backend().mapped_pages(D0), 0);
}

#[test]
fn a_private_pool_made_and_freed_inside_one_capture_is_released_without_a_device_wait() {
    // CuPy's captures free their temporaries during the capture: the release of such a pool
    // must not wait for the whole device, which during another capture (the next test's)
    // would invalidate that capture.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let other = sim.submit_work(D0, S1); // unrelated work, still running
    let p = PrivatePoolId(13);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    sim.set_capturing(S0, true);
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    drop(a);
    sim.set_capturing(S0, false);
    hold.release();
    sim.set_capturing(S2, true); // another capture runs while the pool is collected
    pool.free_all_blocks().unwrap();
    sim.set_capturing(S2, false);
    assert!(!pool.has_private_pool(D0, p).unwrap(), "released");
    assert!(
        sim.completed(D0, S1) < other,
        "the release waited for the whole device"
    );
}
