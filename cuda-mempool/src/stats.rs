//! [`Stats`]: what the pool holds and did, with peaks.
//!
//! # Where the numbers are kept
//!
//! Counters that the hot path changes (used bytes, requested bytes, active blocks,
//! allocations, frees) live in each (device, stream) shard, under the shard's own lock,
//! so that threads on different streams never write a shared cache line. Counters that
//! only the slow path changes (reserved bytes, retries, out-of-memory errors) live with
//! the device, under the device lock.
//!
//! A consequence for peaks: the peak of a shard counter is exact; the peak of a device
//! total of such a counter ([`Stats::used`], [`Stats::requested`], [`Stats::active_blocks`])
//! is reported as the *sum of the shards' peaks*, an upper bound of the true peak that
//! is exact whenever one stream was used. Keeping the exact device-wide peak would need
//! one shared atomic written by every `malloc` and `free` of every thread, which is what
//! the sharding avoids. [`Stats::reserved`]'s peak is always exact.

use crate::error::OomCause;

/// Out-of-memory failures counted by what ran out ([`OomCause`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomCounts {
    /// The device's limit could not take the request ([`OomCause::Limit`]).
    pub limit: u64,
    /// The device had no more memory ([`OomCause::DeviceMemory`]).
    pub device_memory: u64,
    /// No address range could be reserved ([`OomCause::AddressSpace`]).
    pub address_space: u64,
}

impl OomCounts {
    /// The count for `cause`.
    pub fn get(&self, cause: OomCause) -> u64 {
        match cause {
            OomCause::Limit => self.limit,
            OomCause::DeviceMemory => self.device_memory,
            OomCause::AddressSpace => self.address_space,
        }
    }

    /// Counts one failure of `cause`.
    pub(crate) fn count(&mut self, cause: OomCause) {
        match cause {
            OomCause::Limit => self.limit += 1,
            OomCause::DeviceMemory => self.device_memory += 1,
            OomCause::AddressSpace => self.address_space += 1,
        }
    }

    /// All failures: the sum of the three.
    pub fn total(&self) -> u64 {
        self.limit + self.device_memory + self.address_space
    }
}

/// A counter with its high-water mark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value seen (see the module documentation for device totals).
    pub peak: u64,
}

impl Stat {
    pub(crate) fn add(&mut self, n: u64) {
        self.current += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    pub(crate) fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
    }

    /// Forgets any peak reached since the peak was `before` (memory held only for a
    /// moment, or by an attempt that was rolled back): the peak becomes `before`, or the
    /// current value if that is higher.
    pub(crate) fn restore_peak(&mut self, before: u64) {
        self.peak = before.max(self.current);
    }

    pub(crate) fn merge(&mut self, other: &Stat) {
        self.current += other.current;
        self.peak += other.peak;
    }
}

/// Statistics of one device of the pool, or of one (device, stream) shard.
///
/// What the device holds: [`shards`](Self::shards) (stream caches) and
/// [`attached_streams`](Self::attached_streams) (streams held), address space
/// [`reserved`](Self::address_space) and [`mapped`](Self::mapped), physical memory
/// [`reserved`](Self::reserved); what went wrong: [`ooms`](Self::ooms) by
/// [cause](Self::oom_causes) and the [latest cause](Self::last_oom).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Bytes in live blocks, at the pool's rounding (CuPy's `used_bytes`).
    pub used: Stat,
    /// Bytes asked for by live allocations, before rounding.
    pub requested: Stat,
    /// Physical bytes held from the backend (CuPy's `total_bytes`): whole plain
    /// segments, or mapped and spare pages of virtual-memory segments. Zero in a
    /// stream shard's statistics (reservations belong to the device).
    pub reserved: Stat,
    /// Live blocks.
    pub active_blocks: Stat,
    /// Successful non-empty `malloc` calls.
    pub allocations: u64,
    /// Frees of non-empty allocations.
    pub frees: u64,
    /// Pages the pool unmapped from free memory to map under another request
    /// (virtual-memory segments; device statistics only): each costs a `cuMemUnmap`, a
    /// `cuMemMap` and a `cuMemSetAccess`, the price of keeping the footprint at what live
    /// blocks touch instead of creating new pages.
    pub pages_moved: u64,
    /// Times the pool ran its out-of-memory recovery (waiting for fences and releasing
    /// cached memory) before retrying a request.
    pub retries: u64,
    /// Requests that failed with [`PoolError::OutOfMemory`](crate::PoolError::OutOfMemory).
    pub ooms: u64,
    /// The same failures by what ran out: the limit, device memory or address space (the
    /// `cause` field of each [`PoolError::OutOfMemory`](crate::PoolError::OutOfMemory));
    /// `oom_causes.total() == ooms` (device statistics only).
    pub oom_causes: OomCounts,
    /// What ran out in the latest out-of-memory failure, if there was one (device
    /// statistics only).
    pub last_oom: Option<OomCause>,
    /// Stream caches (shards) the device holds, attached or not (device statistics only).
    pub shards: u64,
    /// Shards holding their stream (see the crate's `backend` module): streams the pool
    /// keeps a clone of because blocks made on them are live, or their owner still holds
    /// them (device statistics only).
    pub attached_streams: u64,
    /// Private pools of graph captures not yet released (device statistics only).
    pub private_pools: u64,
    /// Address space reserved for virtual-memory segments, in bytes (device statistics
    /// only). Zero with plain segments.
    pub address_space: u64,
    /// Physical bytes mapped into the pool's address space (device statistics only):
    /// with virtual-memory segments, the pages mapped into them (at most
    /// `address_space`); with plain segments, every segment. `reserved.current - mapped`
    /// is held as spare pages, mapped nowhere, ready to be mapped where needed.
    pub mapped: u64,
}

impl Stats {
    /// Bytes reserved but not in live blocks: `reserved - used` (CuPy's `free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.reserved.current.saturating_sub(self.used.current)
    }

    /// Fragmentation: the fraction of reserved memory that is not in live blocks,
    /// `1 - used / reserved`, in `[0, 1]`; `0` when nothing is reserved.
    pub fn fragmentation(&self) -> f64 {
        if self.reserved.current == 0 {
            0.0
        } else {
            self.free_bytes() as f64 / self.reserved.current as f64
        }
    }

    pub(crate) fn merge_shard(&mut self, shard: &Stats) {
        self.used.merge(&shard.used);
        self.requested.merge(&shard.requested);
        self.active_blocks.merge(&shard.active_blocks);
        self.allocations += shard.allocations;
        self.frees += shard.frees;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_follow_adds_not_subs() {
        let mut s = Stat::default();
        s.add(10);
        s.sub(4);
        s.add(2);
        assert_eq!(
            s,
            Stat {
                current: 8,
                peak: 10
            }
        );
        s.add(5);
        assert_eq!(
            s,
            Stat {
                current: 13,
                peak: 13
            }
        );
    }

    #[test]
    fn fragmentation_is_unused_share_of_reserved() {
        let mut st = Stats::default();
        assert_eq!(st.fragmentation(), 0.0);
        st.reserved.add(1000);
        st.used.add(250);
        assert_eq!(st.free_bytes(), 750);
        assert!((st.fragmentation() - 0.75).abs() < 1e-12);
    }
}
