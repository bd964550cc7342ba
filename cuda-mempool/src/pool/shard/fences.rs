//! Epochs, fences and pending frees: when a shard's free memory is safe for other
//! streams, and waiting for it on the device or the host.

use crate::backend::{Backend, DeviceId};
use crate::error::PoolError;
use crate::observe::Observed;
use crate::policy::MAX_OUTSTANDING_FENCES;

use super::{BlockState, FenceSlot, PendingFree, ShardState};

impl<B: Backend> ShardState<B> {
    #[inline(never)]
    pub(super) fn release_shared(
        &mut self,
        backend: &Observed<B>,
        id: u32,
    ) -> Result<(), PoolError> {
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Pending;
        let returned = b
            .lent
            .then(|| b.extra_streams.first().map(|(k, _)| *k))
            .flatten();
        if b.lent {
            // A lent block comes back: this shard's stream never used it, so it keeps the
            // epoch of its last free here (which the borrower waited for); the borrower's
            // work on it is covered by the fence recorded below on the borrower's stream.
            b.lent = false;
            self.lent -= 1;
        } else {
            // The block's own stream used it too: its free takes an epoch like any other,
            // so this stream's fences (and a detach fence) cover that work.
            self.epoch += 1;
            b.freed_epoch = self.epoch;
        }
        let streams = std::mem::take(&mut b.extra_streams);
        if self.private {
            // Used on several streams of a capture: without a graph dependency between them
            // a reuse could race in replay. It stays out of use until the private pool goes,
            // and the pool goes only once the eager work of those streams is done: a fence
            // on each (a stream being captured gets none: its work runs only in replays,
            // which the graph's release covers).
            let mut first_error = None;
            for (_, s) in streams {
                if !backend.is_capturing(&s) {
                    match backend.record_fence(self.device, &s) {
                        Ok(f) => self.held_fences.push(f),
                        Err(e) => {
                            first_error.get_or_insert(e);
                            if backend.synchronize_stream(&s).is_err() {
                                self.sync_before_release = true;
                            }
                        }
                    }
                }
                backend.stream_released(s);
            }
            return match first_error {
                None => Ok(()),
                Some(e) => Err(PoolError::backend("record_fence")(e)),
            };
        }
        let mut first_error = None;
        let fences = streams
            .into_iter()
            .map(|(_, s)| {
                if backend.is_capturing(&s) {
                    // A fence recorded there would be a node of the capture, and a stream
                    // that waited for it would join the capture. Work captured there runs
                    // only in replays: the block is given up (never reused, still counted),
                    // as a capturing stream's unfenced cache is at detach.
                    backend.stream_released(s);
                    return FenceSlot::Never;
                }
                let slot = match backend.record_fence(self.device, &s) {
                    Ok(f) => FenceSlot::Recorded(f),
                    Err(e) => {
                        first_error.get_or_insert(e);
                        // The stream may be destroyed once this free returns: wait for its
                        // work now, or give the block up.
                        if backend.synchronize_stream(&s).is_ok() {
                            FenceSlot::Done
                        } else {
                            FenceSlot::Never
                        }
                    }
                };
                backend.stream_released(s);
                slot
            })
            .collect();
        self.pending.push(PendingFree {
            block: id,
            fences,
            returned,
        });
        self.returned += usize::from(returned.is_some());
        match first_error {
            None => Ok(()),
            Some(e) => Err(PoolError::backend("record_fence")(e)),
        }
    }

    /// Records a fence covering every free so far unless one is outstanding that does,
    /// then polls the outstanding fences.
    pub(super) fn refresh_fences(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        let covered = self.fences.back().is_some_and(|(e, _)| *e >= self.epoch);
        if self.epoch > self.safe_epoch && !covered && self.fences.len() < MAX_OUTSTANDING_FENCES {
            // A detached shard has no stream to record on, and needs none: its detach
            // fence covers every free it holds.
            // Nor is a fence recorded on a stream being captured (it would be a node of the
            // graph, not a point of the stream's work), or on another thread's per-thread
            // stream: its frees wait for a later fence (see `usable_stream`).
            if let Some(stream) = self.usable_stream(backend) {
                let f = backend
                    .record_fence(self.device, stream)
                    .map_err(PoolError::backend("record_fence"))?;
                self.fences.push_back((self.epoch, f));
            }
        }
        self.poll_fences(backend)
    }

    /// The epoch of this shard's frees when some of them are on a stream no fence can be
    /// recorded on now, another thread's per-thread default stream (this thread cannot record
    /// one there) or a lingering stream (it may be gone), and no fence covers them; `None`
    /// otherwise. See [`covered_up_to`](Self::covered_up_to).
    pub(crate) fn unfenced_on_other_thread(&self) -> Option<u64> {
        let unfenced = self.stream.is_some() && self.epoch > self.safe_epoch;
        (unfenced
            && !self.private
            && (self.lingering || super::is_other_threads_stream(self.stream_key)))
        .then_some(self.epoch)
    }

    /// Records that every free up to `epoch` has completed on the device: the caller
    /// synchronised the whole device after reading `epoch` (work issued before a free was
    /// issued before the synchronisation began).
    pub(crate) fn covered_up_to(&mut self, epoch: u64) {
        self.safe_epoch = self.safe_epoch.max(epoch);
    }

    /// The attached stream, if the pool may record a fence on it or make it wait from this
    /// thread now: not while it is being captured (a fence there would be a node of the
    /// graph; for the legacy stream, the backend counts a capture of a blocking stream of the
    /// device, which makes the legacy stream unusable), nor when it is another thread's
    /// per-thread default stream (its handle would name this thread's stream). Frees that
    /// need a fence then wait, out of cross-stream reuse, for a later call that can record
    /// one.
    fn usable_stream(&self, backend: &Observed<B>) -> Option<&B::Stream> {
        if self.lingering || super::is_other_threads_stream(self.stream_key) {
            return None;
        }
        self.stream.as_ref().filter(|s| !backend.is_capturing(s))
    }

    pub(super) fn poll_fences(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        while let Some((_, f)) = self.fences.front() {
            let done = backend
                .fence_completed(f)
                .map_err(PoolError::backend("fence_completed"))?;
            if !done {
                break;
            }
            if let Some((e, f)) = self.fences.pop_front() {
                self.safe_epoch = self.safe_epoch.max(e);
                backend.release_fence(f);
            }
        }
        Ok(())
    }

    /// Whether frees wait for record_stream fences.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether any free memory of this shard is not yet covered by a completed fence.
    pub(crate) fn has_unfenced_frees(&self) -> bool {
        self.epoch > self.safe_epoch || !self.pending.is_empty()
    }

    /// Whether every free of the shard is covered by a completed fence (or by its detach
    /// fence; never for a retired shard): what must hold before its memory is released
    /// whole. [`wait_fences`] can leave
    /// it false, for a stream this thread may not fence now (see `usable_stream`).
    ///
    /// [`wait_fences`]: Self::wait_fences
    pub(crate) fn fully_fenced(&self) -> bool {
        // A retired shard let go of its stream with frees no fence covers.
        !self.retired && (self.stream.is_none() || self.epoch <= self.safe_epoch)
    }

    /// Blocks the host until every free of this shard so far is covered by a completed
    /// fence, and every pending free's fences have completed (a stream this thread may not
    /// fence now gets no new fence: see [`fully_fenced`](Self::fully_fenced)).
    pub(crate) fn wait_fences(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        self.wait_pending(backend)?;
        while let Some(f) = self.held_fences.last() {
            backend
                .wait_fence(f)
                .map_err(PoolError::backend("wait_fence"))?;
            if let Some(f) = self.held_fences.pop() {
                backend.release_fence(f);
            }
        }
        if self.sync_before_release {
            backend
                .synchronize_device(self.device)
                .map_err(PoolError::backend("synchronize_device"))?;
            self.sync_before_release = false;
        }
        if self.epoch > self.safe_epoch {
            let covered = self.fences.back().is_some_and(|(e, _)| *e >= self.epoch);
            if !covered {
                // Detached shards are always covered (their detach fence).
                if self.stream.is_none() {
                    return Ok(());
                }
                // A stream this thread may not use now (see `usable_stream`) gets no new
                // fence: the outstanding ones are waited for, and the later frees stay
                // unsafe for other streams.
                if let Some(stream) = self.usable_stream(backend) {
                    let f = backend
                        .record_fence(self.device, stream)
                        .map_err(PoolError::backend("record_fence"))?;
                    self.fences.push_back((self.epoch, f));
                }
            }
            if let Some((e, f)) = self.fences.back() {
                backend
                    .wait_fence(f)
                    .map_err(PoolError::backend("wait_fence"))?;
                let e = *e;
                for (_, f) in self.fences.drain(..) {
                    backend.release_fence(f);
                }
                self.safe_epoch = self.safe_epoch.max(e);
            }
        }
        Ok(())
    }

    /// Moves pending frees whose fences have all completed into the free set.
    pub(crate) fn poll_pending(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        let mut i = 0;
        while i < self.pending.len() {
            let mut done = true;
            for slot in self.pending[i].fences.iter_mut() {
                match slot {
                    FenceSlot::Done => {}
                    FenceSlot::Never => done = false,
                    FenceSlot::Recorded(f) => {
                        let complete = backend
                            .fence_completed(f)
                            .map_err(PoolError::backend("fence_completed"))?;
                        if complete {
                            if let FenceSlot::Recorded(f) = std::mem::replace(slot, FenceSlot::Done)
                            {
                                backend.release_fence(f);
                            }
                        } else {
                            done = false;
                        }
                    }
                }
            }
            if done {
                let p = self.pending.swap_remove(i);
                self.returned -= usize::from(p.returned.is_some());
                self.finish_pending(p.block, false);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// A pending free joins the free set. When its other streams' fences have completed,
    /// the epoch stamped at its free stands (its own stream's work is covered by this
    /// stream's fences). When instead this stream was made to wait for them on the device
    /// (`ordered_after`), only a fence recorded on this stream from now on covers that work,
    /// so the block takes a new epoch.
    fn finish_pending(&mut self, id: u32, ordered_after: bool) {
        if ordered_after {
            self.epoch += 1;
            self.blocks[id as usize].freed_epoch = self.epoch;
        }
        self.coalesce_insert(id);
    }

    /// Blocks the host until every pending free's fences have completed, then frees
    /// those blocks.
    fn wait_pending(&mut self, backend: &Observed<B>) -> Result<(), PoolError> {
        self.settle_pending(backend, false, false, |backend, _, f| {
            backend
                .wait_fence(f)
                .map_err(PoolError::backend("wait_fence"))
        })
    }

    /// Makes this shard's stream wait (on the device, not the host) for every pending
    /// free's fences, after which those blocks are safe for this stream and are freed.
    /// Returns whether there was any. A fence recorded on this stream later covers the
    /// waited-for work too, so the usual epoch rule then holds for other streams.
    pub(crate) fn stream_wait_pending(&mut self, backend: &Observed<B>) -> Result<bool, PoolError> {
        let Some(stream) = self.usable_stream(backend).cloned() else {
            return Ok(false);
        };
        let any = !self.pending.is_empty();
        self.settle_pending(backend, true, false, |backend, device, f| {
            backend
                .stream_wait_fence(device, &stream, f)
                .map_err(PoolError::backend("stream_wait_fence"))
        })?;
        Ok(any)
    }

    /// Makes this shard's stream wait (on the device) for the fences of the lent blocks
    /// given back, which then join the free set (see [`stream_wait_pending`](Self::stream_wait_pending)).
    /// Best effort: a failed wait leaves the rest pending, where they stay safe.
    #[inline(never)]
    pub(crate) fn stream_wait_returns(&mut self, backend: &Observed<B>) {
        let Some(stream) = self.usable_stream(backend).cloned() else {
            return;
        };
        let _ = self.poll_pending(backend);
        let _ = self.settle_pending(backend, true, true, |backend, device, f| {
            backend
                .stream_wait_fence(device, &stream, f)
                .map_err(PoolError::backend("stream_wait_fence"))
        });
    }

    /// Whether lent blocks given back wait for their borrowers' fences.
    #[inline]
    pub(crate) fn has_returns(&self) -> bool {
        self.returned != 0
    }

    fn settle_pending(
        &mut self,
        backend: &Observed<B>,
        ordered_after: bool,
        only_returned: bool,
        settle: impl Fn(&Observed<B>, DeviceId, &B::Fence) -> Result<(), PoolError>,
    ) -> Result<(), PoolError> {
        let mut i = 0;
        while i < self.pending.len() {
            if only_returned && self.pending[i].returned.is_none() {
                i += 1;
                continue;
            }
            let mut never = false;
            for slot in self.pending[i].fences.iter_mut() {
                if let FenceSlot::Recorded(f) = slot {
                    settle(backend, self.device, f)?;
                    if let FenceSlot::Recorded(f) = std::mem::replace(slot, FenceSlot::Done) {
                        backend.release_fence(f);
                    }
                }
                never |= matches!(slot, FenceSlot::Never);
            }
            if never {
                i += 1;
            } else {
                let p = self.pending.swap_remove(i);
                self.returned -= usize::from(p.returned.is_some());
                self.finish_pending(p.block, ordered_after);
            }
        }
        Ok(())
    }

    /// A fence of this shard's stream covering every free stamped `<= epoch`: an
    /// outstanding one, or one recorded now (never on a detached or capturing stream).
    /// `None` when there is none to be had. Recording one beyond
    /// [`MAX_OUTSTANDING_FENCES`] gives the older ones up: the new one covers all they do.
    pub(super) fn fence_covering(
        &mut self,
        backend: &Observed<B>,
        epoch: u64,
    ) -> Result<Option<&B::Fence>, PoolError> {
        if !self.fences.iter().any(|(e, _)| *e >= epoch) {
            let Some(stream) = self.usable_stream(backend) else {
                return Ok(None);
            };
            let f = backend
                .record_fence(self.device, stream)
                .map_err(PoolError::backend("record_fence"))?;
            while self.fences.len() >= MAX_OUTSTANDING_FENCES {
                if let Some((_, old)) = self.fences.pop_front() {
                    backend.release_fence(old);
                }
            }
            self.fences.push_back((self.epoch, f));
        }
        Ok(self
            .fences
            .iter()
            .find(|(e, _)| *e >= epoch)
            .map(|(_, f)| f))
    }

    /// Whether the shard has frees waiting for other streams' fences that its own stream
    /// could wait for on the device (attached, not capturing).
    pub(crate) fn has_waitable_pending(&self, backend: &Observed<B>) -> bool {
        self.has_pending() && self.usable_stream(backend).is_some()
    }
}
