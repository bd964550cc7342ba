//! The cache of idle staging sets, and the [`Lease`] through which one transfer holds a set.
//!
//! A set goes back to the cache when its lease drops. The one exception is a transfer that
//! fails after it issued a DMA on the set's slots: a failed wait cannot prove that the DMA is
//! over, so the set is [leaked](Lease::leak) (never freed, never handed out again) and an
//! in-flight DMA can only ever reach memory that nobody else uses.
//!
//! Generic over the set, so that the simulated copier's tests run the same cache and the
//! same settle rule as the driver's staging.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::pipeline::Failed;
use crate::error::Result;

/// Idle staging sets kept for reuse, at most `max` of them.
pub(crate) struct Cache<S> {
    sets: Mutex<Vec<S>>,
    max: usize,
}

impl<S> Cache<S> {
    /// An empty cache that keeps at most `max` idle sets.
    pub(crate) const fn new(max: usize) -> Self {
        Cache {
            sets: Mutex::new(Vec::new()),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<S>> {
        self.sets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leases a cached set for which `fits` holds, or else a new one from `make`.
    pub(crate) fn checkout(
        &self,
        fits: impl Fn(&S) -> bool,
        make: impl FnOnce() -> Result<S>,
    ) -> Result<Lease<'_, S>> {
        let found = {
            let mut sets = self.lock();
            let at = sets.iter().position(fits);
            at.map(|i| sets.swap_remove(i))
        };
        let set = match found {
            Some(set) => set,
            None => make()?,
        };
        Ok(Lease {
            cache: self,
            set: Some(set),
        })
    }

    /// Removes every idle set (the caller drops them).
    pub(crate) fn take_all(&self) -> Vec<S> {
        std::mem::take(&mut *self.lock())
    }

    /// Idle sets in the cache.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A staging set checked out of a [`Cache`] for one transfer; back to the cache on drop.
/// Whoever holds it must not drop it while a DMA on its slots may still run: on an error
/// after a DMA was issued, [`leak`](Self::leak) it (or [`settle`](Self::settle) a pipeline
/// run, which does so).
pub(crate) struct Lease<'c, S> {
    cache: &'c Cache<S>,
    set: Option<S>,
}

impl<S> Lease<'_, S> {
    /// The leased set (`None` only after [`leak`](Self::leak), which consumes the lease).
    pub(crate) fn set(&self) -> Option<&S> {
        self.set.as_ref()
    }

    /// The leased set, mutably.
    pub(crate) fn set_mut(&mut self) -> Option<&mut S> {
        self.set.as_mut()
    }

    /// Gives the set up for good: it is neither returned to the cache nor freed, so a DMA
    /// that may still target its slots can never reach reused memory.
    pub(crate) fn leak(mut self) {
        if let Some(set) = self.set.take() {
            std::mem::forget(set);
        }
    }

    /// Ends a pipeline run on this lease's slots: the lease back on success; on failure
    /// the run's error, after leaking the set if any DMA was issued on it (a failure before
    /// the first DMA leaves the slots untouched, and they go back to the cache).
    pub(crate) fn settle(self, outcome: std::result::Result<(), Failed>) -> Result<Self> {
        match outcome {
            Ok(()) => Ok(self),
            Err(failed) => {
                if failed.dma_issued {
                    self.leak();
                }
                Err(failed.error)
            }
        }
    }
}

impl<S> Drop for Lease<'_, S> {
    fn drop(&mut self) {
        if let Some(set) = self.set.take() {
            let surplus = {
                let mut sets = self.cache.lock();
                if sets.len() < self.cache.max {
                    sets.push(set);
                    None
                } else {
                    Some(set)
                }
            };
            // Freed outside the lock.
            drop(surplus);
        }
    }
}
