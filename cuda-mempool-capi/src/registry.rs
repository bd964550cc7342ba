//! [`Registry`]: from a device pointer back to the pool allocation it came from.
//!
//! The C frees (`cuda_mempool_torch_free`, `cuda_mempool_cupy_free`) receive only a
//! pointer, while the pool frees a [`RawAllocation`]. The registry maps one to the other.
//! It is split into [`SHARDS`] independently locked hash maps, chosen by the pointer, so
//! threads allocating concurrently rarely meet on a lock, and each lock is held for one
//! hash-map insert or remove only.
//!
//! Each entry may also carry a *stream hold*: the handle of a caller's stream that the C
//! layer keeps alive for the block (see the `cupy` module), released when the block is freed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, PoisonError};

use cudars_mempool::RawAllocation;

/// Number of independently locked parts of the registry (a power of two).
pub const SHARDS: usize = 64;

/// A hasher for pointer keys: pool pointers are multiples of 512, so the low bits are
/// dropped and the rest is spread by a multiplication (Fibonacci hashing). Much cheaper
/// than the default SipHash, and keys are not attacker-controlled.
#[derive(Default, Clone, Copy, Debug)]
pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, key: u64) {
        self.0 = (key >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A recorded allocation, the stream hold taken for it, if any, and the handle of the stream
/// it was allocated on (as the caller passed it).
#[derive(Debug)]
struct Entry {
    raw: RawAllocation,
    hold: Option<usize>,
    handle: usize,
}

type Map = HashMap<u64, Entry, BuildHasherDefault<PtrHasher>>;

/// Live allocations handed out through the C API, by device address.
///
/// `Send + Sync`: every part is behind its own mutex.
#[derive(Debug)]
pub struct Registry {
    shards: Box<[Mutex<Map>]>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

/// The shard of a pointer: its bits above the 512-byte unit, mixed, top bits taken.
fn shard_of(ptr: u64) -> usize {
    ((ptr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros())) as usize
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
        }
    }

    fn map(&self, ptr: u64) -> std::sync::MutexGuard<'_, Map> {
        // No code panics while holding the lock (insert/remove only), so a poisoned
        // lock still guards a consistent map.
        self.shards[shard_of(ptr)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a live allocation under its address. Returns the allocation previously
    /// recorded at that address, which means a free was missed (it should be `None`).
    pub fn insert(&self, raw: RawAllocation) -> Option<RawAllocation> {
        self.insert_held(raw, None)
    }

    /// [`Registry::insert`], noting `hold`: the stream handle kept alive for this block
    /// (returned by [`Registry::remove_held`] when the block is removed).
    pub fn insert_held(&self, raw: RawAllocation, hold: Option<usize>) -> Option<RawAllocation> {
        self.insert_with(raw, hold, 0)
    }

    /// [`Registry::insert_held`], noting also `handle`, the stream handle the block was
    /// allocated on (returned by [`Registry::remove_with`]): a free that names a stream can
    /// tell the block's own without asking the driver.
    pub fn insert_with(
        &self,
        raw: RawAllocation,
        hold: Option<usize>,
        handle: usize,
    ) -> Option<RawAllocation> {
        let ptr = raw.ptr().0;
        self.map(ptr)
            .insert(ptr, Entry { raw, hold, handle })
            .map(|e| e.raw)
    }

    /// Removes and returns the allocation at `ptr` with its stream hold and stream handle.
    pub fn remove_with(&self, ptr: u64) -> Option<(RawAllocation, Option<usize>, usize)> {
        self.map(ptr)
            .remove(&ptr)
            .map(|e| (e.raw, e.hold, e.handle))
    }

    /// Removes and returns the allocation at `ptr`, if one is recorded.
    pub fn remove(&self, ptr: u64) -> Option<RawAllocation> {
        self.remove_held(ptr).map(|(raw, _)| raw)
    }

    /// Removes and returns the allocation at `ptr` with the stream hold noted for it.
    pub fn remove_held(&self, ptr: u64) -> Option<(RawAllocation, Option<usize>)> {
        self.remove_with(ptr).map(|(raw, hold, _)| (raw, hold))
    }

    /// Runs `f` on the allocation at `ptr`, if one is recorded, left in place (under the
    /// registry part's lock, so a concurrent free of the same pointer waits).
    pub fn with<R>(&self, ptr: u64, f: impl FnOnce(&RawAllocation) -> R) -> Option<R> {
        self.map(ptr).get(&ptr).map(|e| f(&e.raw))
    }

    /// The number of recorded allocations.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Whether no allocation is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudars_mempool::{DeviceId, MemoryPool, SimulatedBackend, StreamKey};

    #[test]
    fn shards_spread_consecutive_blocks() {
        let mut seen = [0usize; SHARDS];
        for i in 0..(SHARDS as u64 * 16) {
            seen[shard_of(0x7f00_0000_0000 + i * 512)] += 1;
        }
        let (min, max) = (seen.iter().min(), seen.iter().max());
        assert!(min >= Some(&8) && max <= Some(&32), "{seen:?}");
    }

    #[test]
    fn insert_get_remove_round_trip() {
        let pool = MemoryPool::new(SimulatedBackend::h200(1)).expect("pool");
        let reg = Registry::new();
        let mut addrs = Vec::new();
        for i in 1..=200u64 {
            let raw = pool
                .malloc(DeviceId(0), &StreamKey(i % 3), i as usize * 1000)
                .expect("malloc")
                .into_raw();
            let (ptr, size) = (raw.ptr().0, raw.size());
            assert_eq!(reg.insert(raw), None);
            addrs.push((ptr, size));
        }
        assert_eq!(reg.len(), addrs.len());
        for &(ptr, size) in &addrs {
            assert_eq!(reg.with(ptr, |r| (r.ptr().0, r.size())), Some((ptr, size)));
        }
        for &(ptr, size) in &addrs {
            let r = reg.remove(ptr).expect("recorded");
            assert_eq!((r.ptr().0, r.size()), (ptr, size));
            assert!(reg.remove(ptr).is_none(), "a second remove finds nothing");
            pool.free_raw(r).expect("free");
        }
        assert!(reg.is_empty());
        assert_eq!(pool.used_bytes(), 0);
    }

    #[test]
    fn a_stream_hold_comes_back_with_its_block() {
        let pool = MemoryPool::new(SimulatedBackend::h200(1)).expect("pool");
        let reg = Registry::new();
        let a = pool
            .malloc(DeviceId(0), &StreamKey(7), 4096)
            .expect("malloc")
            .into_raw();
        let b = pool
            .malloc(DeviceId(0), &StreamKey(7), 4096)
            .expect("malloc")
            .into_raw();
        let (pa, pb) = (a.ptr().0, b.ptr().0);
        assert!(reg.insert_held(a, Some(0x5000)).is_none());
        assert!(reg.insert(b).is_none());
        let (ra, ha) = reg.remove_held(pa).expect("recorded");
        assert_eq!(ha, Some(0x5000));
        let (rb, hb) = reg.remove_held(pb).expect("recorded");
        assert_eq!(hb, None);
        pool.free_raw(ra).expect("free");
        pool.free_raw(rb).expect("free");
        assert!(reg.is_empty());
    }
}
