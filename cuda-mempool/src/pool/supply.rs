//! Where pages and segments come from and where they go back: spare pages, pages
//! reclaimed from fenced free memory, new pages within the limit and the move slack, plain
//! segments, and the release of cached memory.

use crate::backend::{Backend, DeviceAddress};
use crate::error::{OomCause, PoolError};
use crate::policy;

use super::{Device, Global, Held, MemoryPool};

impl<B: Backend> MemoryPool<B> {
    /// Makes `g.spare` hold at least `want` pages, within the limit: by reclaiming fenced
    /// free pages (this shard's, then the device's other shards'), or by creating new ones.
    /// Reclaiming comes first, which keeps the footprint at the pages live blocks touch,
    /// unless the device has no limit and the pool holds less than [`policy::MOVE_SLACK`]
    /// allows above the most live memory the device has served: then new pages are created
    /// first; if creating falls short (the device is full), those pages go back and the
    /// request reclaims as it would without the slack.
    pub(super) fn provide_pages(
        &self,
        h: &mut Held<'_, '_, B>,
        want: usize,
    ) -> Result<Result<(), OomCause>, PoolError> {
        let dev = h.dev;
        let Some(page) = dev.page else {
            return Ok(Ok(()));
        };
        if h.g.spare.len() >= want {
            return Ok(Ok(()));
        }
        let bytes = |pages: usize| (pages as u64).saturating_mul(page);
        // Recorded only once the request is served: a request that fails does not raise it.
        let live_high =
            h.g.live_high
                .max(h.device_used().saturating_add(bytes(want)));
        let private = h.st.private;
        let after =
            h.g.reserved
                .current
                .saturating_add(bytes(want.saturating_sub(h.g.spare.len())));
        // A capture's request never moves pages: unmapping during a capture invalidates it.
        let create_first =
            private || (h.g.limit.is_none() && after <= policy::move_slack_budget(live_high));
        let mut moved = 0;
        if !create_first {
            moved += self.reclaim_for(h, want)?;
        }
        // Create nothing when the limit cannot take every missing page: pages created
        // for a request that fails anyway would only inflate the footprint.
        let missing = bytes(want.saturating_sub(h.g.spare.len()));
        if h.g
            .limit
            .is_some_and(|l| h.g.reserved.current.saturating_add(missing) > l)
        {
            return Ok(Err(OomCause::Limit));
        }
        let peak_before = h.g.reserved.peak;
        let created = self.create_pages(dev, h.g, want)?;
        if h.g.spare.len() < want && create_first && !private {
            // The device is full: the pages created for this request go back (they are the
            // last pushed), for the device's other users (cuBLAS, NCCL, other processes), and
            // the request moves pages as it would without the slack.
            for _ in 0..created {
                if let Some(p) = h.g.spare.pop() {
                    // SAFETY: a spare page, made by `create_physical` for this device just
                    // above and mapped nowhere.
                    unsafe { self.backend.release_physical(dev.id, p, page) }
                        .map_err(PoolError::backend("release_physical"))?;
                    h.g.reserved.sub(page);
                }
            }
            // Pages held only for a moment leave no trace in the peak.
            h.g.reserved.restore_peak(peak_before);
            moved += self.reclaim_for(h, want)?;
            self.create_pages(dev, h.g, want)?;
        }
        if h.g.spare.len() >= want {
            // Counted once the request has every page it needs: a failed request's
            // reclaimed pages are released by the roll-back, not mapped elsewhere.
            h.g.pages_moved += moved;
            h.g.live_high = live_high;
            Ok(Ok(()))
        } else {
            Ok(Err(OomCause::DeviceMemory))
        }
    }

    /// Creates pages into `g.spare` until it holds `want` or the device has no more;
    /// returns how many it created.
    fn create_pages(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
        want: usize,
    ) -> Result<usize, PoolError> {
        let Some(page) = dev.page else {
            return Ok(0);
        };
        let mut created = 0;
        while g.spare.len() < want {
            let made = self
                .backend
                .create_physical(dev.id, page)
                .map_err(PoolError::backend("create_physical"))?;
            let Some(p) = made else {
                break;
            };
            g.spare.push(p);
            g.reserved.add(page);
            created += 1;
        }
        Ok(created)
    }

    /// Unmaps fenced free pages into `spare` until it holds `want`: this shard's, then
    /// the device's other shards'. Returns the number of pages it added.
    fn reclaim_for(&self, h: &mut Held<'_, '_, B>, want: usize) -> Result<u64, PoolError> {
        let others = h.other_shards();
        let spare = &mut h.g.spare;
        let before = spare.len();
        h.st.reclaim_pages(&self.backend, spare, want)?;
        for other in others {
            if spare.len() >= want {
                break;
            }
            other
                .state
                .lock()
                .reclaim_pages(&self.backend, spare, want)?;
        }
        Ok(spare.len().saturating_sub(before) as u64)
    }

    /// Allocates a plain segment of `size` bytes within the limit, releasing wholly
    /// free fenced segments of the device first when the limit or the backend says no.
    pub(super) fn allocate_plain(
        &self,
        h: &mut Held<'_, '_, B>,
        size: u64,
    ) -> Result<Result<DeviceAddress, OomCause>, PoolError> {
        let fits = |g: &Global<B>| {
            g.limit
                .is_none_or(|l| g.reserved.current.saturating_add(size) <= l)
        };
        let mut released = false;
        if !fits(h.g) {
            self.release_device_cache(h)?;
            released = true;
            if !fits(h.g) {
                return Ok(Err(OomCause::Limit));
            }
        }
        loop {
            let ptr = self
                .backend
                .allocate(h.dev.id, size)
                .map_err(PoolError::backend("allocate"))?;
            if let Some(p) = ptr {
                h.g.reserved.add(size);
                return Ok(Ok(p));
            }
            if released {
                return Ok(Err(OomCause::DeviceMemory));
            }
            self.release_device_cache(h)?;
            released = true;
        }
    }

    /// Releases every fenced cached segment or page of the device (no host waits).
    pub(super) fn release_device_cache(&self, h: &mut Held<'_, '_, B>) -> Result<(), PoolError> {
        if h.st.private {
            // Nothing goes back to the driver during a capture (see `malloc_slow`).
            return Ok(());
        }
        let others = h.other_shards();
        let g = &mut *h.g;
        // Memory is short: the slack above the live peak restarts from what is live now.
        g.live_high = 0;
        // Counts are updated call by call, so an error midway leaves them exact.
        h.st.release_cached(&self.backend, &mut g.spare, &mut g.reserved.current)?;
        for other in others {
            other.state.lock().release_cached(
                &self.backend,
                &mut g.spare,
                &mut g.reserved.current,
            )?;
        }
        Ok(())
    }

    /// Returns every spare (unmapped) page of `dev` to the backend, counting each one off
    /// `reserved` as it goes; a page whose release fails is leaked and stays counted.
    pub(super) fn release_spare(
        &self,
        dev: &Device<B>,
        g: &mut Global<B>,
    ) -> Result<(), PoolError> {
        let Some(page) = dev.page else {
            return Ok(());
        };
        while let Some(p) = g.spare.pop() {
            // SAFETY: spare pages were made by `create_physical` for this device and are
            // mapped nowhere (they go to the spare list only unmapped).
            unsafe { self.backend.release_physical(dev.id, p, page) }
                .map_err(PoolError::backend("release_physical"))?;
            g.reserved.sub(page);
        }
        Ok(())
    }
}
