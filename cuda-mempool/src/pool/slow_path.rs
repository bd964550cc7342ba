//! A miss, in the order it tries: the shard's cache once more, memory lent by another
//! stream, growth with recovery, and out of memory.

use crate::backend::{Backend, StreamKey};
use crate::error::{OomCause, PoolError};
use crate::policy;

use super::shard::Choice;
use super::table::Shard;
use super::{is_per_thread_key, lock, thread_token, Device, Held, MemoryPool, Request};

/// What the slow path hands back: the shard holding the block (the requesting stream's,
/// or the lender's), that shard's key, the block id and (address, generation).
type Served<'p, B> = (&'p Shard<B>, StreamKey, u32, (u64, u64));

impl<B: Backend> MemoryPool<B> {
    /// The slow path: grows the shard, recovers from memory pressure, or fails with
    /// out of memory after rolling back what it reserved. `Ok(None)` when the shard was
    /// adopted by another key or detached while the lock was dropped: start again.
    #[inline(never)]
    #[track_caller]
    pub(super) fn malloc_slow<'p>(
        &self,
        dev: &'p Device<B>,
        shard: &'p Shard<B>,
        key: StreamKey,
        stream: &B::Stream,
        size: u64,
        rounded: u64,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        // A private shard serves a capture: nothing goes back to the driver now (unmapping
        // or freeing memory during a capture invalidates it: CuPy's test_graph.py).
        let capturing = shard.state.lock().private;
        if !capturing {
            self.collect_private_pools(dev);
        }
        let mut g = lock(&dev.global);
        let mut st = shard.lock_retiring();
        if st.key != key {
            return Ok(None);
        }
        if st.stream.is_none() {
            st.attach(&self.backend, stream, key)?;
        }
        st.resume();
        let mut held = Held {
            dev,
            g: &mut g,
            shard,
            st: &mut st,
        };
        let req = Request {
            key,
            stream,
            size,
            rounded,
        };
        let served = self.serve_slow(&mut held, &req);
        if let (true, Ok(Some((_, _, _, (addr, _))))) = (self.history.is_on(), &served) {
            // Under the device lock: start_history's baseline is either before or after.
            let site = std::panic::Location::caller();
            self.note_malloc(dev.id, key, size, *addr, site);
        }
        if served.is_err() {
            // A failed request may leave no block made on the stream: the shard must not
            // keep a stream its owner may destroy once this call returns (a C caller may).
            self.let_go_if_idle(&mut st);
        }
        served
    }

    /// [`malloc_slow`](Self::malloc_slow) once the shard is attached: the cache, stealing,
    /// growth, out of memory.
    fn serve_slow<'p>(
        &self,
        h: &mut Held<'_, 'p, B>,
        req: &Request<'_, B>,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        let Request {
            key,
            stream,
            size,
            rounded,
        } = *req;
        let thread = thread_token();
        h.st.thread = thread;
        if let Some(id) = self.take_cached(h.st, rounded)? {
            return Ok(Some((h.shard, key, id, h.st.mark_live(id, size))));
        }
        // A per-thread default stream never borrows: the fence that a borrowed block's free
        // records on the borrower could then be due on a thread that is not the stream's own
        // (a garbage collector freeing it).
        if self.steal
            && !h.st.private
            && !is_per_thread_key(key)
            && !self.backend.is_capturing(stream)
        {
            if let Some(served) = self.steal(h, req, thread)? {
                // Served from another stream's cache: this shard holds no block made on the
                // stream, so it must not keep a stream its owner may now destroy.
                self.let_go_if_idle(h.st);
                return Ok(Some(served));
            }
        }
        // A request the device (or its limit) could never hold fails at once, before
        // anything is reserved or released.
        let footprint = policy::round_up(rounded, h.dev.page.unwrap_or(1)).unwrap_or(u64::MAX);
        let cause = if h.g.limit.is_some_and(|l| footprint > l) {
            Some(OomCause::Limit)
        } else if footprint > h.dev.info.total_memory {
            Some(OomCause::DeviceMemory)
        } else {
            None
        };
        if let Some(cause) = cause {
            return Err(self.out_of_memory(h, size, cause));
        }
        let peak_before = h.g.reserved.peak;
        let outcome = self.grow_with_recovery(h, rounded);
        match outcome {
            Ok(Ok(id)) => Ok(Some((h.shard, key, id, h.st.mark_live(id, size)))),
            Ok(Err(cause)) => {
                // Give back whatever this attempt reserved or mapped and is not in use; the
                // attempt leaves no trace in the peak either.
                let _ = self.roll_back(h);
                h.g.reserved.restore_peak(peak_before);
                Err(self.out_of_memory(h, size, cause))
            }
            Err(e) => {
                let _ = self.roll_back(h);
                h.g.reserved.restore_peak(peak_before);
                Err(e)
            }
        }
    }

    /// Serves a request, before the pool grows, with memory other streams' work may still
    /// be using, by making `stream` wait for it on the device (see
    /// [`policy::STEAL_BEFORE_GROWING`]): first this shard's frees pending on other
    /// streams' fences, then mapped free blocks of the device's other shards whose streams
    /// this thread drives (`thread`, see the policy). Nothing is
    /// taken when spare pages already cover what this shard's own cache lacks (growing
    /// then costs no new memory).
    fn steal<'p>(
        &self,
        h: &mut Held<'_, 'p, B>,
        req: &Request<'_, B>,
        thread: usize,
    ) -> Result<Option<Served<'p, B>>, PoolError> {
        let Request {
            key,
            stream,
            size,
            rounded,
        } = *req;
        if h.st.has_waitable_pending(&self.backend) {
            h.st.stream_wait_pending(&self.backend)?;
            if let Some(id) = self.take_cached(h.st, rounded)? {
                return Ok(Some((h.shard, key, id, h.st.mark_live(id, size))));
            }
        }
        if let Choice::Fit { unmapped, .. } = h.st.choose_block(rounded) {
            if unmapped <= h.g.spare.len() {
                return Ok(None);
            }
        }
        for other in h.other_shards() {
            let mut o = other.state.lock();
            if let Some((id, served)) = o.lend(&self.backend, rounded, size, stream, key, thread)? {
                return Ok(Some((other, o.key, id, served)));
            }
        }
        Ok(None)
    }
}
