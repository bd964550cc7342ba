//! Accounting: releasing the cache (`free_all_*`), limits, and statistics.

use crate::backend::{Backend, DeviceId, StreamKey};
use crate::error::PoolError;
use crate::stats::Stats;

#[cfg(doc)]
use super::Allocation;
use super::{lock, Device, Global, Limit, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Returns every cached segment and page to the backend: wholly free segments,
    /// and in virtual-memory segments every page no live block touches (CuPy's
    /// `free_all_blocks`).
    ///
    /// This waits on the host for the fences of all freed memory first, since memory
    /// can be returned only once no work uses it; it is meant for phase changes, not
    /// the hot path. Frees no fence can cover (lingering foreign streams, other threads'
    /// per-thread streams) are covered by one synchronisation of the device, unless a capture
    /// the pool knows of may run. Like CuPy's and PyTorch's own `free_all_blocks` /
    /// `empty_cache`, which free memory through the driver, it must not be called while a
    /// capture the pool does not know of runs.
    pub fn free_all_blocks(&self) -> Result<(), PoolError> {
        for dev in self.devices.iter() {
            self.collect_private_pools(dev);
            let mut g = lock(&dev.global);
            self.free_device_blocks(dev, &mut g)?;
        }
        Ok(())
    }

    fn free_device_blocks(&self, dev: &Device<B>, g: &mut Global<B>) -> Result<(), PoolError> {
        // The slack above the live peak restarts from what is live after this
        // (`policy::MOVE_SLACK`): a program that empties its cache after a transient peak gets
        // a footprint that follows its memory from then on.
        g.live_high = 0;
        // Frees no fence of this thread can cover (lingering streams, other threads'
        // per-thread streams) are covered by one synchronisation of the device when no
        // capture may run, so that their memory goes back too.
        let mut uncovered = Vec::new();
        for shard in dev.shards.iter() {
            let mut st = shard.state.lock();
            st.flush_recent();
            st.wait_fences(&self.backend)?;
            if let Some(epoch) = st.unfenced_on_other_thread() {
                uncovered.push((shard, epoch));
            } else {
                // A lingering stream whose frees are all covered needs no synchronisation.
                st.forget_lingering(&self.backend);
            }
        }
        self.cover_by_device_sync(dev.id, uncovered);
        for shard in dev.shards.iter() {
            let mut st = shard.state.lock();
            st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current)?;
        }
        self.release_spare(dev, g)
    }

    /// The same as [`free_all_blocks`](Self::free_all_blocks) (CuPy keeps both names).
    pub fn free_all_free(&self) -> Result<(), PoolError> {
        self.free_all_blocks()
    }

    /// Blocks the host until all work that used the currently cached (freed) memory
    /// has finished, on every device and stream, so that this memory becomes reusable
    /// by every stream (its pages may be moved) without further waiting.
    ///
    /// Useful after a phase of work on many streams; the trace replay calls it to model
    /// a device that keeps up with the host (see [`crate::replay`]).
    pub fn synchronize_free_blocks(&self) -> Result<(), PoolError> {
        for dev in self.devices.iter() {
            for shard in dev.shards.iter() {
                let mut st = shard.state.lock();
                if st.has_unfenced_frees() {
                    st.wait_fences(&self.backend)?;
                }
            }
        }
        Ok(())
    }

    /// Sets the hard cap on the physical memory the pool holds on `device`.
    ///
    /// Fails with [`PoolError::LimitBelowUsage`], changing nothing, when the live
    /// blocks alone need more. Otherwise the limit is set and, if the pool holds more
    /// than the new limit, cached memory is released as by
    /// [`free_all_blocks`](Self::free_all_blocks) for this device.
    pub fn set_limit(&self, device: DeviceId, limit: Limit) -> Result<(), PoolError> {
        let dev = self.device(device)?;
        let bytes = limit
            .resolve(dev.info.total_memory as usize)?
            .map(|b| b as u64);
        let mut g = lock(&dev.global);
        if let Some(b) = bytes {
            let mut in_use = 0;
            let mut used = 0;
            for shard in dev.all_shards() {
                let st = shard.state.lock();
                in_use += st.live_footprint();
                used += st.stats.used.current;
            }
            if b < in_use {
                return Err(PoolError::LimitBelowUsage {
                    device,
                    limit: b,
                    used,
                    in_use,
                });
            }
        }
        g.limit = bytes;
        if self.history.is_on() {
            self.note_limit(device, bytes);
        }
        if bytes.is_some_and(|b| g.reserved.current > b) {
            self.free_device_blocks(dev, &mut g)?;
        }
        Ok(())
    }

    /// The limit of `device` in bytes, `None` when unlimited.
    pub fn get_limit(&self, device: DeviceId) -> Result<Option<usize>, PoolError> {
        Ok(lock(&self.device(device)?.global).limit.map(|l| l as usize))
    }

    /// Statistics of one device (see [`Stats`] for how peaks of totals are defined).
    pub fn stats(&self, device: DeviceId) -> Result<Stats, PoolError> {
        let dev = self.device(device)?;
        let g = lock(&dev.global);
        let spare_bytes = (g.spare.len() as u64).saturating_mul(dev.page.unwrap_or(0));
        let mut s = Stats {
            reserved: g.reserved,
            retries: g.retries,
            pages_moved: g.pages_moved,
            ooms: g.ooms,
            oom_causes: g.oom_causes,
            last_oom: g.last_oom,
            mapped: g.reserved.current.saturating_sub(spare_bytes),
            ..Stats::default()
        };
        drop(g);
        for shard in dev.all_shards() {
            let st = shard.state.lock();
            s.merge_shard(&st.stats);
            s.shards += 1;
            s.attached_streams += u64::from(st.is_attached());
            s.address_space += st.address_space();
        }
        s.private_pools = lock(&dev.privates).pools.len() as u64;
        Ok(s)
    }

    /// Statistics of one (device, stream) shard, with exact peaks. All zero for a
    /// stream the pool has not seen. A block another stream borrowed from this stream's
    /// cache counts here, in the lender's figures ([`Allocation::held_by`]).
    pub fn stream_stats(&self, device: DeviceId, stream: StreamKey) -> Result<Stats, PoolError> {
        let dev = self.device(device)?;
        Ok(dev
            .shards
            .get(stream)
            .map(|s| s.state.lock().stats)
            .unwrap_or_default())
    }

    /// Bytes in live blocks on all devices (CuPy's `used_bytes`).
    pub fn used_bytes(&self) -> u64 {
        self.devices
            .iter()
            .flat_map(|d| d.all_shards())
            .map(|s| s.state.lock().stats.used.current)
            .sum()
    }

    /// Physical bytes the pool holds on all devices (CuPy's `total_bytes`).
    pub fn total_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| lock(&d.global).reserved.current)
            .sum()
    }

    /// Bytes held but not in live blocks on all devices: `total_bytes - used_bytes`
    /// (CuPy's `free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| {
                let g = lock(&d.global);
                let used: u64 = d
                    .all_shards()
                    .map(|s| s.state.lock().stats.used.current)
                    .sum();
                g.reserved.current.saturating_sub(used)
            })
            .sum()
    }

    /// The number of free blocks holding memory on all devices (CuPy's
    /// `n_free_blocks`): coalesced free blocks, counting in virtual-memory segments
    /// only those with mapped memory under them, plus frees waiting for
    /// `record_stream` fences.
    pub fn n_free_blocks(&self) -> usize {
        self.devices
            .iter()
            .flat_map(|d| d.shards.iter())
            .map(|s| s.state.lock().count_free_blocks())
            .sum()
    }
}
