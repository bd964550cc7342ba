//! Lending a free block of the shard to another stream's request, before the pool grows
//! (see [`policy::STEAL_BEFORE_GROWING`]).

use crate::backend::{Backend, StreamKey};
use crate::error::PoolError;
use crate::observe::Observed;
#[cfg(doc)]
use crate::policy;

use super::ShardState;

/// A block [`ShardState::lend`] handed out: its id and (address, generation).
pub(crate) type LentBlock = (u32, (u64, u64));

impl<B: Backend> ShardState<B> {
    /// Lends a free block of this shard to a request of `rounded` bytes (`requested` asked
    /// for) on another stream, `borrower` (key `borrower_key`), without any host wait: see
    /// [`policy::STEAL_BEFORE_GROWING`]. The block must have every page it needs mapped
    /// (pages are moved only under a completed fence, rule 4 of the page policy).
    ///
    /// 1. Frees returned by earlier borrowers (and other frees pending on other streams'
    ///    fences) join the free set: at once where their fences completed, and otherwise
    ///    after this shard's stream is made to wait for them on the device. Coalesced
    ///    first, they leave the borrower one contiguous range rather than fragments.
    /// 2. `borrower` is made to wait (on the device) for a fence of this shard's stream
    ///    covering the block's last free here, unless a completed one does already.
    /// 3. The block goes live, lent: the borrower is its first extra stream, so its free
    ///    records a fence there and the block waits as a pending free for it.
    ///
    /// `Ok(None)` when another host thread drives this shard's stream, nothing fits, no
    /// fence can be had, or the borrower's own earlier
    /// loan from this shard is still waiting here, unused since (it borrows in a loop:
    /// growing once is then cheaper than a steal per request). A failed wait hands out
    /// nothing and is returned.
    pub(crate) fn lend(
        &mut self,
        backend: &Observed<B>,
        rounded: u64,
        requested: u64,
        borrower: &B::Stream,
        borrower_key: StreamKey,
        borrower_thread: usize,
    ) -> Result<Option<LentBlock>, PoolError> {
        if self.private || self.retired || self.thread != borrower_thread {
            // Another host thread drives this stream: see `policy::STEAL_BEFORE_GROWING`.
            return Ok(None);
        }
        if self
            .pending
            .iter()
            .any(|p| p.returned == Some(borrower_key))
        {
            // The borrower gave back memory of this shard that nobody has used since: it
            // borrows again and again (a steady loop, not streams taking turns), so it grows
            // a cache of its own instead of paying a steal on every request.
            return Ok(None);
        }
        self.flush_recent();
        self.poll_pending(backend)?;
        if self.has_waitable_pending(backend) {
            // Before choosing: returned blocks coalesce with their free neighbours, so the
            // borrower is placed in one contiguous free range instead of beside them.
            self.stream_wait_pending(backend)?;
        }
        let Some((id, addr)) = self.mapped_fit(rounded) else {
            return Ok(None);
        };
        let epoch = self.blocks[id as usize].freed_epoch;
        self.poll_fences(backend)?;
        if epoch > self.safe_epoch {
            let device = self.device;
            let Some(fence) = self.fence_covering(backend, epoch)? else {
                return Ok(None);
            };
            backend
                .stream_wait_fence(device, borrower, fence)
                .map_err(PoolError::backend("stream_wait_fence"))?;
        }
        let id = self.claim(id, addr, rounded);
        let served = self.mark_live(id, requested);
        let b = &mut self.blocks[id as usize];
        b.lent = true;
        b.extra_streams
            .push((borrower_key, backend.retain_stream(borrower)));
        self.lent += 1;
        Ok(Some((id, served)))
    }
}
