//! The state of one (device, stream) shard: its segments, blocks, free sets and fences.
//!
//! # Map
//!
//! | file | what it answers |
//! | --- | --- |
//! | `mod.rs` | what a shard holds, and a block's life: claimed, live, freed, coalesced |
//! | `recent.rs` | the recently freed blocks, kept uncoalesced for exact-size reuse |
//! | `placement.rs` | which cached block serves a request, and where in it (the one place that decides) |
//! | `pages.rs` | segments and the pages under them: added, mapped, reclaimed, released |
//! | `page_table.rs` | the pages of one virtual-memory segment, with the runs of mapped pages |
//! | `fences.rs` | epochs, fences and pending frees: when free memory is safe for other streams |
//! | `attach.rs` | holding and letting go of the stream: attach, detach, adoption |
//! | `lend.rs` | lending a free block to another stream's request |
//! | `history.rs` | what the shard holds as history events (where a recording of a live pool starts) |
//!
//! # Blocks and segments
//!
//! A shard owns segments (address ranges) and tiles each of them with blocks, kept in
//! a doubly linked list in address order. A block is in one of these states:
//!
//! * `Live`: handed out to the user;
//! * `Recent`: freed, kept uncoalesced in the short exact-size list (`recent`);
//! * `Free`: freed and coalesced with its free neighbours, in the ordered free set of
//!   its size class;
//! * `Pending`: freed, but used on other streams (`record_stream`) whose fences have not
//!   completed yet; not reusable by anyone;
//! * `Claimed`: cut out of the free set for a request whose pages are being mapped; it
//!   goes live, or back to the free set if the request fails;
//! * `Vacant`: a slot of the block arena not in use.
//!
//! In a virtual-memory segment a block is an address range only; the physical pages
//! under it are tracked per segment. Every page touched by a non-free block is mapped.
//! A page that lies wholly inside a free block may be mapped (cached) or not.
//!
//! # Epochs and fences
//!
//! Each free stamps the block with the shard's next *epoch*. A fence recorded on the
//! shard's stream when the epoch is `e` covers every free stamped `<= e`; once it has
//! completed, `safe_epoch >= e`, and free memory stamped `<= safe_epoch` may be used by
//! other streams (its pages unmapped and mapped elsewhere). A synchronisation of the whole
//! device does the same for the epoch read before it (out-of-memory recovery, for frees on
//! another thread's per-thread stream, where this thread cannot record a fence). Coalescing
//! keeps the larger stamp, so a merged range is never considered safe too early.
//!
//! # Indexing
//!
//! Block ids index `blocks`; segment ids index `segments`. Ids are created only by this
//! module, stored only in its own structures and in allocation handles it issued, and a
//! slot is recycled only when no structure refers to it any more, so indexing with them
//! cannot go out of bounds. Ids from outside (raw handles) are checked with `get` first.

mod attach;
mod fences;
mod history;
mod lend;
mod page_table;
mod pages;
mod placement;
mod recent;

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::backend::{Backend, DeviceId, StreamKey};
use crate::error::PoolError;
use crate::observe::Observed;
use crate::policy::SizeClass;
use crate::stats::Stats;

use page_table::PageTable;
use recent::RecentList;

pub(crate) use placement::Choice;

use super::is_other_threads_stream;

/// No block (end of a neighbour list).
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockState {
    Vacant,
    Free,
    /// Cut out of the free set for a request that is being served (pages mapped under it):
    /// never coalesced with a neighbour that becomes free meanwhile.
    Claimed,
    Recent,
    Live,
    Pending,
}

#[derive(Clone, Debug)]
pub(crate) struct Block<S> {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    prev: u32,
    next: u32,
    segment: u32,
    class: SizeClass,
    pub(crate) state: BlockState,
    /// Bumped each time the block goes live: a handle names the block only with the
    /// generation it was issued with. 64 bits, so it cannot wrap in practice.
    pub(crate) generation: u64,
    freed_epoch: u64,
    requested: u64,
    /// Other streams the live block is used on (`record_stream`), kept until its free.
    extra_streams: Vec<(StreamKey, S)>,
    /// Lent to another stream's request ([`ShardState::lend`]): the borrower is the first
    /// of `extra_streams`, and this shard's own stream did not use the block.
    lent: bool,
}

pub(crate) enum Backing<P> {
    /// One plain allocation covering the whole segment.
    Plain,
    /// An address range with pages mapped where needed.
    Virtual(PageTable<P>),
}

pub(crate) struct Segment<P> {
    base: u64,
    size: u64,
    /// The block at `base` (blocks keep their id when the blocks after them split off).
    first: u32,
    backing: Backing<P>,
}

enum FenceSlot<F> {
    Recorded(F),
    Done,
    /// No fence could be recorded and the stream could not be waited for either: the
    /// block can never be proven safe, and is never reused (leaked, still counted).
    Never,
}

struct PendingFree<F> {
    block: u32,
    fences: Vec<FenceSlot<F>>,
    /// A lent block given back ([`ShardState::lend`]): the borrower's key.
    returned: Option<StreamKey>,
}

pub(crate) struct ShardState<B: Backend> {
    pub(crate) device: DeviceId,
    /// The key of the stream this shard caches for (changes when a detached shard is
    /// adopted by another stream).
    pub(crate) key: StreamKey,
    /// The stream, while attached (see the crate's `backend` module): fences are recorded
    /// on it and it is made to wait only while this is `Some`.
    pub(crate) stream: Option<B::Stream>,
    /// The key of `stream` while attached: `key`, except for a private shard, whose `key`
    /// is a private shard key that may equal some stream's key.
    stream_key: StreamKey,
    /// Page size of virtual-memory segments; `0` in plain-segment mode.
    page: u64,
    /// A shard of a private pool (graph capture): its free memory is never given to other
    /// shards or back to the backend, since graph replays still use it; only releasing the
    /// whole private pool returns it.
    pub(crate) private: bool,
    /// Set when the shard had to let go of its stream without a fence and without a
    /// completed wait: what it caches can never be proven safe, so it is never used again
    /// (its memory stays reserved, counted, and leaked).
    pub(crate) retired: bool,
    blocks: Vec<Block<B::Stream>>,
    vacant: Vec<u32>,
    /// Free blocks per size class, ordered by (size, address) for best fit.
    free: [BTreeSet<(u64, u64, u32)>; 2],
    /// Recently freed blocks, uncoalesced: (size, id), newest last.
    recent: RecentList,
    segments: Vec<Option<Segment<B::Physical>>>,
    pending: Vec<PendingFree<B::Fence>>,
    epoch: u64,
    safe_epoch: u64,
    fences: VecDeque<(u64, B::Fence)>,
    /// A private shard's fences on other streams that used its blocks (recorded at their
    /// frees): the private pool is released only once they have completed.
    held_fences: Vec<B::Fence>,
    /// A private shard that let go of its stream while it was captured into another graph
    /// (or could not fence another stream's use): eager work on its memory may be
    /// uncovered, so its release first waits for the whole device.
    sync_before_release: bool,
    /// The capture its stream was part of when a private shard last attached it: a detach
    /// during that same capture leaves no eager work uncovered (every block it caches was
    /// made and freed inside the capture, or used eagerly on other streams, whose fences
    /// `held_fences` keeps).
    attach_capture: Option<u64>,
    /// Live blocks lent to other streams' requests (counted in `stats.active_blocks` too).
    lent: u64,
    /// Pending frees that are lent blocks given back.
    returned: usize,
    /// The stream's last block was freed and the shard kept the stream without a fence
    /// (see [`linger`](Self::linger)): its owner may have destroyed it since, so the pool
    /// records nothing on it and makes it wait for nothing until a request brings the same
    /// stream back (which a key that names one stream for the life of the process proves).
    pub(crate) lingering: bool,
    /// The key of the stream this shard last let go of with a detach fence: a request of the
    /// same stream attaching again makes the stream *recurring*, and a recurring stream
    /// lingers at its next last free instead of detaching (a stream used once, a temporary,
    /// detaches with its fence as before, so its memory stays fenced for other streams).
    pub(crate) detached_key: Option<StreamKey>,
    /// See [`detached_key`](Self::detached_key).
    pub(crate) recurring: bool,
    /// The count of lingering shards of this shard's table (`policy::MAX_LINGERING_STREAMS`).
    pub(crate) lingering_count: Arc<AtomicUsize>,
    /// The host thread that last took the slow path on this shard (a token of
    /// `pool::thread_token`): only requests of that thread may borrow from it.
    pub(crate) thread: usize,
    pub(crate) stats: Stats,
}

/// Page index range `[first, end)` of the pages that `[addr, addr + len)` touches,
/// relative to a segment at `base`.
fn touched_pages(base: u64, page: u64, addr: u64, len: u64) -> (usize, usize) {
    let start = addr - base;
    let first = start / page;
    let end = (start + len).div_ceil(page);
    (first as usize, end as usize)
}

/// Page index range of the pages lying wholly inside `[addr, addr + len)`.
fn inner_pages(base: u64, page: u64, addr: u64, len: u64) -> (usize, usize) {
    let start = addr - base;
    let first = start.div_ceil(page);
    let end = (start + len) / page;
    (first as usize, end.max(first) as usize)
}

impl<B: Backend> ShardState<B> {
    pub(crate) fn new(
        device: DeviceId,
        key: StreamKey,
        page: Option<u64>,
        lingering_count: Arc<AtomicUsize>,
    ) -> Self {
        ShardState {
            device,
            key,
            stream: None,
            stream_key: key,
            page: page.unwrap_or(0),
            private: false,
            retired: false,
            lingering: false,
            detached_key: None,
            recurring: false,
            lingering_count,
            blocks: Vec::new(),
            vacant: Vec::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            recent: RecentList::new(),
            segments: Vec::new(),
            pending: Vec::new(),
            epoch: 0,
            safe_epoch: 0,
            fences: VecDeque::new(),
            held_fences: Vec::new(),
            sync_before_release: false,
            attach_capture: None,
            lent: 0,
            returned: 0,
            thread: 0,
            stats: Stats::default(),
        }
    }

    // ----- arena -----------------------------------------------------------------
    fn new_block(&mut self, block: Block<B::Stream>) -> u32 {
        if let Some(id) = self.vacant.pop() {
            let generation = self.blocks[id as usize].generation;
            self.blocks[id as usize] = Block {
                generation,
                ..block
            };
            id
        } else {
            self.blocks.push(block);
            // The arena never holds u32::MAX blocks: each block covers at least
            // 512 bytes of device memory, and no device has 2 TiB.
            (self.blocks.len() - 1) as u32
        }
    }

    fn drop_block(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Vacant;
        b.lent = false;
        b.extra_streams = Vec::new();
        self.vacant.push(id);
    }

    fn key(&self, id: u32) -> (usize, (u64, u64, u32)) {
        let b = &self.blocks[id as usize];
        (b.class.index(), (b.size, b.addr, id))
    }

    fn insert_free(&mut self, id: u32) {
        let (class, key) = self.key(id);
        self.free[class].insert(key);
    }

    fn remove_free(&mut self, id: u32) {
        let (class, key) = self.key(id);
        self.free[class].remove(&key);
    }

    // ----- the hot path ----------------------------------------------------------
    /// Takes free block `id` out of the free set and cuts `[addr, addr + len)` out of it
    /// as a block of its own, returning that block's id (state `Claimed`, in no set: a
    /// pending free that completes while pages are found for it cannot coalesce with it).
    /// The pieces before and after go back into the free set.
    pub(crate) fn claim(&mut self, id: u32, addr: u64, len: u64) -> u32 {
        self.remove_free(id);
        let b = self.blocks[id as usize].clone();
        let mut target = id;
        if addr > b.addr {
            let tail = self.new_block(Block {
                addr,
                size: b.addr + b.size - addr,
                prev: id,
                next: b.next,
                state: BlockState::Free,
                extra_streams: Vec::new(),
                ..b.clone()
            });
            if b.next != NIL {
                self.blocks[b.next as usize].prev = tail;
            }
            let head = &mut self.blocks[id as usize];
            head.size = addr - b.addr;
            head.next = tail;
            self.insert_free(id);
            target = tail;
        }
        let t = self.blocks[target as usize].clone();
        if t.size > len {
            let rest = self.new_block(Block {
                addr: addr + len,
                size: t.size - len,
                prev: target,
                next: t.next,
                state: BlockState::Free,
                extra_streams: Vec::new(),
                ..t.clone()
            });
            if t.next != NIL {
                self.blocks[t.next as usize].prev = rest;
            }
            let mid = &mut self.blocks[target as usize];
            mid.size = len;
            mid.next = rest;
            self.insert_free(rest);
        }
        self.blocks[target as usize].state = BlockState::Claimed;
        target
    }

    /// Gives back a block claimed for a request that could not be completed.
    pub(crate) fn unclaim(&mut self, id: u32) {
        self.coalesce_insert(id);
    }

    /// Makes block `id` live for a request of `requested` bytes; returns its address
    /// and generation.
    #[inline]
    pub(crate) fn mark_live(&mut self, id: u32, requested: u64) -> (u64, u64) {
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Live;
        b.generation = b.generation.wrapping_add(1);
        b.requested = requested;
        let (addr, size, generation) = (b.addr, b.size, b.generation);
        self.stats.used.add(size);
        self.stats.requested.add(requested);
        self.stats.active_blocks.add(1);
        self.stats.allocations += 1;
        (addr, generation)
    }

    /// Adds `stream` to the streams a live block is used on.
    pub(crate) fn record_stream(
        &mut self,
        backend: &Observed<B>,
        id: u32,
        generation: u64,
        stream: &B::Stream,
        key: StreamKey,
    ) -> Result<(), PoolError> {
        // The stream the block's own fences are recorded on (not the shard key: a private
        // shard's key may equal another stream's key). Detached, there is none.
        let own = self.stream.as_ref().map(|_| self.stream_key);
        let b = self.live_block(id, generation)?;
        // Another stream's mark records its fence at the block's free, which may come from any
        // thread: a per-thread default stream (whose handle names the calling thread's stream)
        // can only be the block's own, unlent.
        if super::is_per_thread_key(key) && (Some(key) != own || b.lent) {
            return Err(PoolError::PerThreadStream);
        }
        // A lent block's own stream is its borrower: this shard's stream, if it uses the
        // block too, needs a fence at the free like any other.
        if (Some(key) != own || b.lent) && !b.extra_streams.iter().any(|(k, _)| *k == key) {
            b.extra_streams.push((key, backend.retain_stream(stream)));
        }
        Ok(())
    }

    fn live_block(&mut self, id: u32, generation: u64) -> Result<&mut Block<B::Stream>, PoolError> {
        let live = matches!(self.blocks.get(id as usize),
            Some(b) if b.state == BlockState::Live && b.generation == generation);
        if !live {
            return Err(self.invalid_handle(id));
        }
        Ok(&mut self.blocks[id as usize])
    }

    /// The address and requested size of live block `id` of generation `generation`.
    pub(crate) fn live_extent(&self, id: u32, generation: u64) -> Option<(u64, u64)> {
        match self.blocks.get(id as usize) {
            Some(b) if b.state == BlockState::Live && b.generation == generation => {
                Some((b.addr, b.requested))
            }
            _ => None,
        }
    }

    /// The error for a handle that names no live block: out of line, so that the hot
    /// paths carry no error value (see [`release`](Self::release)).
    #[cold]
    #[inline(never)]
    fn invalid_handle(&self, id: u32) -> PoolError {
        PoolError::InvalidHandle {
            ptr: self.blocks.get(id as usize).map_or(0, |b| b.addr),
        }
    }

    /// Frees live block `id`. Without extra streams it joins the recent list at once;
    /// with them, fences are recorded on those streams and the block waits in
    /// `pending` until they complete. If recording a fence fails, the block still
    /// waits (a fence is recorded again later, which is only more conservative) and
    /// the error is returned.
    ///
    /// The hot path (a block used on its own stream alone, the stream kept) returns
    /// `Ok(())` without building or moving an error value: the rare outcomes are out of
    /// line. (A `Result<(), PoolError>` carried through this function and copied on
    /// each free cost about 10 ns a pair on the H200 machines' Intel CPUs, through
    /// store-to-load forwarding stalls.)
    #[inline]
    pub(crate) fn release(
        &mut self,
        backend: &Observed<B>,
        id: u32,
        generation: u64,
    ) -> Result<(), PoolError> {
        let (size, requested, shared) = match self.blocks.get(id as usize) {
            Some(b) if b.state == BlockState::Live && b.generation == generation => {
                (b.size, b.requested, !b.extra_streams.is_empty())
            }
            _ => return Err(self.invalid_handle(id)),
        };
        self.stats.used.sub(size);
        self.stats.requested.sub(requested);
        self.stats.active_blocks.sub(1);
        self.stats.frees += 1;
        if shared {
            return self.release_shared_then_detach(backend, id);
        }
        self.epoch += 1;
        let b = &mut self.blocks[id as usize];
        b.state = BlockState::Recent;
        b.freed_epoch = self.epoch;
        if let Some(oldest) = self.recent.push(size, id) {
            self.coalesce_insert(oldest);
        }
        if self.stream_idle() && self.may_detach(backend) {
            return self.let_go(backend);
        }
        Ok(())
    }

    /// [`release`](Self::release) of a block used on other streams too.
    #[inline(never)]
    fn release_shared_then_detach(
        &mut self,
        backend: &Observed<B>,
        id: u32,
    ) -> Result<(), PoolError> {
        // A failed fence record on another stream still frees the block (safely, see
        // `release_shared`); the stream of this shard must be let go of all the same.
        let result = self.release_shared(backend, id);
        let detached = if self.stream_idle() && self.may_detach(backend) {
            self.let_go(backend)
        } else {
            Ok(())
        };
        result.and(detached)
    }

    // ----- coalescing --------------------------------------------------------------
    /// Marks `id` free, merges it with free neighbours and inserts the result into the
    /// free set.
    fn coalesce_insert(&mut self, id: u32) {
        let mut id = id;
        self.blocks[id as usize].state = BlockState::Free;
        let prev = self.blocks[id as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == BlockState::Free {
            self.remove_free(prev);
            let b = self.blocks[id as usize].clone();
            let p = &mut self.blocks[prev as usize];
            p.size += b.size;
            p.next = b.next;
            p.freed_epoch = p.freed_epoch.max(b.freed_epoch);
            if b.next != NIL {
                self.blocks[b.next as usize].prev = prev;
            }
            self.drop_block(id);
            id = prev;
        }
        let next = self.blocks[id as usize].next;
        if next != NIL && self.blocks[next as usize].state == BlockState::Free {
            self.remove_free(next);
            let n = self.blocks[next as usize].clone();
            let b = &mut self.blocks[id as usize];
            b.size += n.size;
            b.next = n.next;
            b.freed_epoch = b.freed_epoch.max(n.freed_epoch);
            if n.next != NIL {
                self.blocks[n.next as usize].prev = id;
            }
            self.drop_block(next);
        }
        self.insert_free(id);
    }

    /// Coalesces every recently freed block into the free set.
    pub(crate) fn flush_recent(&mut self) {
        while let Some(id) = self.recent.pop() {
            self.coalesce_insert(id);
        }
    }

    // ----- accounting ----------------------------------------------------------------
    /// Physical bytes the live blocks occupy: the pages they touch (virtual memory) or
    /// the segments holding at least one (plain). Free, recent and pending blocks are
    /// not counted: waiting for fences and releasing the cache frees what they hold.
    pub(crate) fn live_footprint(&self) -> u64 {
        let mut total = 0;
        for seg in self.segments.iter().flatten() {
            let mut id = seg.first;
            let mut counted_end = 0usize;
            let mut any_live = false;
            while id != NIL {
                let b = &self.blocks[id as usize];
                if b.state == BlockState::Live {
                    any_live = true;
                    if self.page != 0 {
                        let (first, end) = touched_pages(seg.base, self.page, b.addr, b.size);
                        let first = first.max(counted_end);
                        if end > first {
                            total += (end - first) as u64 * self.page;
                            counted_end = end;
                        }
                    }
                }
                id = b.next;
            }
            if self.page == 0 && any_live {
                total += seg.size;
            }
        }
        total
    }

    /// The number of free blocks holding memory: coalesced free blocks (in
    /// virtual-memory mode only those touching a mapped page) plus pending frees.
    pub(crate) fn count_free_blocks(&mut self) -> usize {
        self.flush_recent();
        let mut n = self.pending.len();
        for set in &self.free {
            for &(size, addr, id) in set {
                let b = &self.blocks[id as usize];
                let backed = match self.segments.get(b.segment as usize) {
                    Some(Some(seg)) => match &seg.backing {
                        Backing::Plain => true,
                        Backing::Virtual(pages) => {
                            let (first, end) = touched_pages(seg.base, self.page, addr, size);
                            pages.mapped_within(first, end) > 0
                        }
                    },
                    _ => false,
                };
                if backed {
                    n += 1;
                }
            }
        }
        n
    }

    #[cfg(test)]
    pub(crate) fn jump_generations_for_tests(&mut self, by: u64) {
        for b in &mut self.blocks {
            b.generation = b.generation.wrapping_add(by);
        }
    }

    /// Address and size of a live block, for handles that have only ids.
    pub(crate) fn live_range(&self, id: u32, generation: u64) -> Option<(u64, u64)> {
        self.blocks
            .get(id as usize)
            .filter(|b| b.state == BlockState::Live && b.generation == generation)
            .map(|b| (b.addr, b.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges() {
        let p = 100;
        assert_eq!(touched_pages(1000, p, 1000, 100), (0, 1));
        assert_eq!(touched_pages(1000, p, 1050, 100), (0, 2));
        assert_eq!(inner_pages(1000, p, 1050, 100), (1, 1));
        assert_eq!(inner_pages(1000, p, 1050, 200), (1, 2));
        assert_eq!(inner_pages(1000, p, 1000, 300), (0, 3));
    }
}
