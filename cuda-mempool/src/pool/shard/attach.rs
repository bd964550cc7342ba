//! Holding and letting go of the shard's stream: attach, detach, and the conditions to
//! adopt an idle shard for another stream.

use std::sync::atomic::Ordering;

use crate::backend::{Backend, StreamKey};
use crate::error::PoolError;
use crate::observe::Observed;
use crate::policy::MAX_LINGERING_STREAMS;

use super::ShardState;

impl<B: Backend> ShardState<B> {
    /// Detaches the stream if the backend says its owner may now destroy it (see
    /// [`detach`](Self::detach)); the free of a stream's last live block calls it.
    #[inline(never)]
    pub(crate) fn detach_if_released(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        if self.may_detach(backend) {
            self.detach(backend)
        } else {
            Ok(())
        }
    }

    /// The free of the stream's last live block, when the stream may go: a recurring stream
    /// that the backend lets linger ([`Backend::may_linger`]) keeps its shard attached with
    /// no fence and no driver call (`lingering`); any other detaches with its fence. A
    /// lingering shard's frees are covered by no fence: other streams reach them only after
    /// a device-wide synchronisation (out-of-memory recovery), and the same stream's next
    /// request takes them back at once, in its own order.
    ///
    /// [`Backend::may_linger`]: crate::Backend::may_linger
    ///
    /// At most [`MAX_LINGERING_STREAMS`] shards of a device linger at once: past that a
    /// stream detaches with its fence, so that the memory of streams destroyed while
    /// lingering stays bounded.
    #[inline]
    pub(crate) fn let_go(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        if self.lingering {
            return Ok(());
        }
        if self.recurring
            && !self.private
            && self.stream.as_ref().is_some_and(|s| backend.may_linger(s))
            && self
                .lingering_count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_LINGERING_STREAMS).then_some(n + 1)
                })
                .is_ok()
        {
            self.lingering = true;
            return Ok(());
        }
        self.detach(backend)
    }

    /// Ends lingering: the caller holds the same stream, valid now (a request with the
    /// shard's key, or the owner's `release_stream`).
    #[inline]
    pub(crate) fn resume(&mut self) {
        if self.lingering {
            self.lingering = false;
            self.lingering_count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A lingering shard whose frees a device-wide synchronisation covered lets go of its
    /// stream without touching it (nothing is recorded on it: its owner may have destroyed
    /// it), so that the shard can be adopted. Its key stays its stream's, so the stream, if
    /// it comes back, attaches again as a recurring one.
    pub(crate) fn forget_lingering(&mut self, backend: &Observed<B>) {
        if self.lingering && self.epoch <= self.safe_epoch && self.stream_idle() {
            self.resume();
            self.detached_key = Some(self.stream_key);
            if let Some(stream) = self.stream.take() {
                backend.stream_released(stream);
            }
        }
    }

    /// Whether [`detach_if_released`](Self::detach_if_released) lets go of the stream (once
    /// it is idle): a private shard at once (it is not where a stream's ordinary work
    /// allocates, and its clone would keep an owned stream alive), another when the backend
    /// says the stream may go.
    #[inline]
    pub(crate) fn may_detach(&self, backend: &Observed<B>) -> bool {
        match &self.stream {
            Some(s) => self.private || backend.may_release_stream(s),
            None => false,
        }
    }

    /// Whether no block of this shard is live, lent blocks included (the condition to
    /// adopt the shard for another stream, or to release a private pool).
    pub(crate) fn is_idle(&self) -> bool {
        self.stats.active_blocks.current == 0
    }

    /// Whether no block made on this shard's own stream is live (the condition to
    /// [`detach`](Self::detach)): blocks lent to other streams do not keep the stream.
    #[inline]
    pub(crate) fn stream_idle(&self) -> bool {
        self.stats.active_blocks.current == self.lent
    }

    /// Whether the shard holds its stream.
    pub(crate) fn is_attached(&self) -> bool {
        self.stream.is_some()
    }

    /// Lets go of the stream once no block made on it is live: records a fence covering
    /// every free so far (unless one already does), then hands the stream back to the
    /// backend. If the fence cannot be recorded the shard stays attached (the stream is
    /// kept, so nothing it cached is reused unfenced) and the error is returned.
    #[inline(never)]
    pub(crate) fn detach(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        if !self.stream_idle() || self.lingering {
            // A lingering stream may be gone: nothing is recorded on it (see `let_go`).
            return Ok(());
        }
        if self.stream.is_none() {
            return Ok(());
        }
        if super::is_other_threads_stream(self.stream_key) {
            // Another thread's per-thread stream (its last block freed here, by a garbage
            // collector say): no fence can be recorded on it from this thread. The shard keeps
            // it; the owning thread's next free of a last block detaches, with a fence. Until
            // then these frees are reused by that stream alone.
            return Ok(());
        }
        if self
            .stream
            .as_ref()
            .is_some_and(|st| backend.is_capturing(st))
        {
            // The stream is being captured: a fence would become a node of the graph. A
            // private shard needs none (nothing ran on its memory since the capture began:
            // captured work runs only in replays, which the graph's release covers). An
            // ordinary shard with frees no completed fence covers gives that memory up
            // (retired: never reused, still counted) rather than keep a handle its owner
            // may destroy once this last block is freed.
            // A failed poll counts as pending: the stream is let go of all the same (its
            // owner may destroy it once this call returns), and the error reported.
            let polled = self.poll_fences(backend);
            if !self.private && self.epoch > self.safe_epoch {
                self.retired = true;
            }
            if self.private && self.epoch > self.safe_epoch {
                // Captured into another graph than the one it attached in: eager work issued
                // between the captures is covered by no fence, so the pool's release waits
                // for the whole device first. (In the same capture nothing ran eagerly on
                // the stream: no wait, which matters, since a device-wide wait during some
                // other capture would invalidate that capture.)
                let now = self.stream.as_ref().and_then(|s| backend.capture_id(s));
                if now.is_none() || now != self.attach_capture || now == Some(0) {
                    self.sync_before_release = true;
                }
            }
            if let Some(stream) = self.stream.take() {
                backend.stream_released(stream);
            }
            self.detached_key = None;
            return polled;
        }
        self.flush_recent();
        // A failed poll only means a new fence is recorded below when an outstanding one
        // might have done; the stream must be let go of all the same.
        let mut result = self.poll_fences(backend);
        let covered = self.fences.back().is_some_and(|(e, _)| *e >= self.epoch);
        if let (true, Some(stream)) = (self.epoch > self.safe_epoch && !covered, &self.stream) {
            match backend.record_fence(self.device, stream) {
                Ok(f) => self.fences.push_back((self.epoch, f)),
                Err(e) => {
                    // The stream may be destroyed as soon as this call returns: wait for its
                    // work now instead, or, if even that fails, never use this cache again.
                    if backend.synchronize_stream(stream).is_ok() {
                        for (_, f) in self.fences.drain(..) {
                            backend.release_fence(f);
                        }
                        self.safe_epoch = self.epoch;
                    } else {
                        self.retired = true;
                    }
                    result = Err(PoolError::backend("record_fence")(e));
                }
            }
        }
        if let Some(stream) = self.stream.take() {
            backend.stream_released(stream);
        }
        self.detached_key = (!self.retired).then_some(self.stream_key);
        result
    }

    /// Attaches `stream` (key `key`) to a detached shard: the shard's previous stream (the
    /// same one, or another that had the same key, or another key's when the shard is
    /// adopted) may still have work running on memory the shard caches, so unless the
    /// detach fence has completed, `stream` is first made to wait for it. Nothing changes
    /// on error.
    pub(crate) fn attach(
        &mut self,
        backend: &Observed<B>,
        stream: &B::Stream,
        key: StreamKey,
    ) -> Result<(), PoolError> {
        self.poll_fences(backend)?;
        if self.epoch > self.safe_epoch {
            if let Some((_, f)) = self.fences.back() {
                if backend.is_capturing(stream) {
                    // A wait would touch the capture (the legacy stream while a blocking
                    // stream is captured joins it): the host waits instead.
                    backend
                        .wait_fence(f)
                        .map_err(PoolError::backend("wait_fence"))?;
                } else {
                    backend
                        .stream_wait_fence(self.device, stream, f)
                        .map_err(PoolError::backend("stream_wait_fence"))?;
                }
                // Everything freed so far is now ordered before `stream`'s later work:
                // reuse by `stream` is safe. Other streams still go by the fences.
            }
        }
        let stream_key = backend.stream_key(stream)?;
        self.recurring = self.detached_key == Some(stream_key);
        self.stream_key = stream_key;
        self.key = key;
        if self.private {
            self.attach_capture = backend.capture_id(stream);
        }
        self.stream = Some(backend.retain_stream(stream));
        Ok(())
    }

    /// Whether a detached shard's memory is all covered by completed fences, so that
    /// adopting it costs the new stream no wait (polls the fences).
    pub(crate) fn is_settled(&mut self, backend: &Observed<B>) -> bool {
        !self.retired
            && self.pending.is_empty()
            && self.poll_fences(backend).is_ok()
            && self.epoch <= self.safe_epoch
    }

    /// Whether an idle, detached shard may be adopted at all (see [`is_settled`](Self::is_settled)).
    pub(crate) fn is_adoptable(&self) -> bool {
        !self.retired && !self.private
    }
}
