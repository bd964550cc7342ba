//! Work completing between two polls of one request; private pools released after other streams' work.

use super::*;

/// A backend whose device completes all work at the k-th `fence_completed` poll after being
/// armed: a real GPU finishing work between two polls made for one request.
struct LateSim {
    inner: SimulatedBackend,
    countdown: std::sync::atomic::AtomicI64,
}
// SAFETY: every method forwards to the simulated backend, which keeps the contract; the
// extra `complete_all` only completes work early in the model, which no fence outlives.
unsafe impl crate::backend::Backend for LateSim {
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
    unsafe fn map_run(
        &self,
        d: DeviceId,
        a: DeviceAddress,
        ps: u64,
        pages: &[&Self::Physical],
    ) -> Result<(), crate::backend::MapRunFailure<Self::Error>> {
        // SAFETY: forwards the pool's call with the caller's guarantees.
        unsafe { self.inner.map_run(d, a, ps, pages) }
    }
    unsafe fn unmap(&self, d: DeviceId, a: DeviceAddress, s: u64) -> Result<(), Self::Error> {
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
        if self
            .countdown
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.inner.complete_all();
        }
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
    fn release_fence(&self, f: Self::Fence) {
        self.inner.release_fence(f)
    }
}

/// A pending free that completes between two polls of one request (after the block for the
/// request was claimed, while pages are being found for it) must not coalesce with the
/// claimed block: it did, and the claimed block was then handed out inside a free range
/// (found by an independent review; two live blocks overlapped at k = 3).
#[test]
fn a_pending_free_completing_while_pages_are_found_leaves_the_claimed_block_alone() {
    for k in 1..8 {
        let config = PoolConfig {
            steal_before_growing: false,
            ..PoolConfig::default()
        };
        let pool = MemoryPool::with_config(
            LateSim {
                inner: SimulatedBackend::new(vec![SimDevice {
                    total_memory: (64 * MIB) as u64,
                    granularity: Some((2 * MIB) as u64),
                }]),
                countdown: std::sync::atomic::AtomicI64::new(i64::MAX),
            },
            config,
        )
        .unwrap();
        let sim = &pool.backend().inner;
        let a = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 0
        let b = pool.malloc(D0, &S0, 4 * MIB).unwrap(); // pages 1-2
        let c = pool.malloc(D0, &S0, 2 * MIB).unwrap(); // page 3
        drop(b);
        sim.complete_all();
        pool.free_all_blocks().unwrap(); // pages 1-2 unmapped
        a.record_stream(&S1).unwrap();
        sim.submit_work(D0, S1);
        drop(a); // pending on S1
        pool.backend()
            .countdown
            .store(k, std::sync::atomic::Ordering::SeqCst);
        let r = pool.malloc(D0, &S0, 4 * MIB).unwrap();
        pool.backend()
            .countdown
            .store(i64::MAX, std::sync::atomic::Ordering::SeqCst);
        let big = pool.malloc(D0, &S0, 6 * MIB).unwrap();
        let (r0, r1) = (r.ptr().addr(), r.ptr().addr() + (4 * MIB) as u64);
        let (b0, b1) = (big.ptr().addr(), big.ptr().addr() + (6 * MIB) as u64);
        assert!(r1 <= b0 || b1 <= r0, "k={k}: live blocks overlap");
        drop((r, big, c));
    }
}

#[test]
fn a_private_pool_is_released_only_after_another_streams_work_on_its_blocks() {
    // A private block used on another stream (record_stream) and freed while that stream's
    // kernel still runs: the private pool must not give its memory back before that work
    // completes (it used to drop the other stream with no fence at the free).
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let p = PrivatePoolId(9);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    a.record_stream(&S1).unwrap();
    let work = sim.submit_work(D0, S1);
    drop(a);
    hold.release();
    // The release happens at the next collection; whenever the pool's pages go back, the
    // other stream's kernel must be done.
    pool.free_all_blocks().unwrap();
    assert!(
        sim.completed(D0, S1) >= work,
        "private pool released while stream 1's work on its block was pending"
    );
    assert!(!pool.has_private_pool(D0, p).unwrap());
}

#[test]
fn a_private_shard_let_go_of_during_another_capture_waits_for_the_device_before_release() {
    // The block of capture 1's pool is used eagerly on its stream after capture 1, then
    // freed while the same stream is captured into graph 2: no fence can cover the eager
    // work, so the pool's release waits for the device.
    let pool = vm_pool(256 * MIB, 2 * MIB);
    let sim = pool.backend();
    let p = PrivatePoolId(11);
    let hold = pool.retain_private_pool(D0, p).unwrap();
    let a = pool.malloc_private(D0, p, &S0, 4 * MIB).unwrap();
    let eager = sim.submit_work(D0, S0);
    sim.set_capturing(S0, true);
    drop(a);
    sim.set_capturing(S0, false);
    hold.release();
    pool.free_all_blocks().unwrap();
    assert!(
        sim.completed(D0, S0) >= eager,
        "private pool released while eager work on its block was pending"
    );
}
