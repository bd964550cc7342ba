//! The state of one (device, stream) shard: its segments, blocks, free sets and fences.
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
//! other streams (its pages unmapped and mapped elsewhere). Coalescing keeps the larger
//! stamp, so a merged range is never considered safe too early.
//!
//! # Indexing
//!
//! Block ids index `blocks`; segment ids index `segments`. Ids are created only by this
//! module, stored only in its own structures and in allocation handles it issued, and a
//! slot is recycled only when no structure refers to it any more, so indexing with them
//! cannot go out of bounds. Ids from outside (raw handles) are checked with `get` first.

use std::collections::{BTreeSet, VecDeque};

use crate::backend::{Backend, DeviceAddress, DeviceId, StreamId};
use crate::error::PoolError;
use crate::policy::{self, SizeClass, MAX_OUTSTANDING_FENCES, RECENT_CAPACITY};
use crate::stats::Stats;

use super::pages::PageTable;

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
    extra_streams: Vec<(StreamId, S)>,
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
    returned: Option<StreamId>,
}

/// A block [`ShardState::lend`] handed out: its id and (address, generation).
pub(crate) type LentBlock = (u32, (u64, u64));

/// What [`ShardState::choose_block`] found for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// A block of exactly the right size, taken out of the recent list: ready to go live.
    Ready(u32),
    /// The best-fitting free block `id`; the request goes at `addr`; `unmapped` pages
    /// under `[addr, addr + rounded)` must be mapped first.
    Fit { id: u32, addr: u64, unmapped: usize },
    /// No free block is large enough: a new segment is needed.
    None,
}

pub(crate) struct ShardState<B: Backend> {
    pub(crate) device: DeviceId,
    /// The key of the stream this shard caches for (changes when a detached shard is
    /// adopted by another stream).
    pub(crate) key: StreamId,
    /// The stream, while attached (see the crate's `backend` module): fences are recorded
    /// on it and it is made to wait only while this is `Some`.
    pub(crate) stream: Option<B::Stream>,
    /// The key of `stream` while attached: `key`, except for a private shard, whose `key`
    /// is a private shard key that may equal some stream's key.
    stream_key: StreamId,
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
    /// The host thread that last took the slow path on this shard (a token of
    /// `pool::thread_token`): only requests of that thread may borrow from it.
    pub(crate) thread: usize,
    pub(crate) stats: Stats,
}

/// The recently freed blocks of a shard, newest last, kept inline in the shard (no heap
/// buffer that could share a cache line with another shard's data).
struct RecentList {
    len: usize,
    sizes: [u64; RECENT_CAPACITY],
    ids: [u32; RECENT_CAPACITY],
}

impl RecentList {
    fn new() -> Self {
        RecentList {
            len: 0,
            sizes: [0; RECENT_CAPACITY],
            ids: [NIL; RECENT_CAPACITY],
        }
    }

    /// Takes the newest block of exactly `size` bytes.
    #[inline]
    fn take(&mut self, size: u64) -> Option<u32> {
        let len = self.len;
        let pos = self.sizes[..len].iter().rposition(|&s| s == size)?;
        let id = self.ids[pos];
        if pos + 1 < len {
            self.sizes.copy_within(pos + 1..len, pos);
            self.ids.copy_within(pos + 1..len, pos);
        }
        self.len = len - 1;
        Some(id)
    }

    /// Adds a block; when full, the oldest block is pushed out and returned.
    #[inline]
    fn push(&mut self, size: u64, id: u32) -> Option<u32> {
        let mut evicted = None;
        if self.len == RECENT_CAPACITY {
            evicted = Some(self.ids[0]);
            self.sizes.copy_within(1.., 0);
            self.ids.copy_within(1.., 0);
            self.len -= 1;
        }
        // `len < RECENT_CAPACITY` here, so the index is in bounds.
        self.sizes[self.len] = size;
        self.ids[self.len] = id;
        self.len += 1;
        evicted
    }

    fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.ids[self.len])
    }

    fn clear(&mut self) {
        self.len = 0;
    }
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
    pub(crate) fn new(device: DeviceId, key: StreamId, page: Option<u64>) -> Self {
        ShardState {
            device,
            key,
            stream: None,
            stream_key: key,
            page: page.unwrap_or(0),
            private: false,
            retired: false,
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

    /// The one place that decides which cached block serves a request of `rounded`
    /// bytes:
    ///
    /// 1. the most recently freed block of exactly that size, if any (the best possible
    ///    fit, found without touching the ordered free set);
    /// 2. otherwise, after coalescing the recent list, the smallest free block that
    ///    fits ([`policy::block_fits`]), lowest address first, where the request finds
    ///    every page it touches mapped ([`placement`](Self::placement));
    /// 3. otherwise the smallest free block that fits, the request placed where it needs
    ///    the fewest pages mapped;
    /// 4. otherwise none: the caller needs a new segment.
    ///
    /// Step 2 before step 3 is what keeps pages where they are: in a virtual-memory
    /// segment, taking a larger block whose pages are mapped costs no memory (the rest
    /// stays free and mapped), while the best fit with unmapped pages would take pages
    /// from elsewhere (`cuMemUnmap`, `cuMemMap`, `cuMemSetAccess`: tens of microseconds
    /// each) or create new ones. Measured on the recorded traces with fences completing
    /// as fast as the device allows, it cut the mapping calls of `lm_varlen` by 5x and of
    /// `multistream` by 80x at the same peak reserved (see bench/NOTES.md).
    ///
    /// Every free block here was last used by this shard's stream (or by a borrower or
    /// `record_stream` stream this stream has waited for), so no fence is needed to reuse
    /// it; other streams get it by moving pages under a completed fence, or by waiting for
    /// a fence when it is lent ([`lend`](Self::lend)).
    #[inline]
    pub(crate) fn choose_block(&mut self, rounded: u64) -> Choice {
        if let Some(id) = self.take_recent(rounded) {
            return Choice::Ready(id);
        }
        self.choose_free(rounded)
    }

    /// Step 1 of [`choose_block`](Self::choose_block) alone.
    #[inline]
    pub(crate) fn take_recent(&mut self, rounded: u64) -> Option<u32> {
        self.recent.take(rounded)
    }

    /// Steps 2 to 4 of [`choose_block`](Self::choose_block).
    #[inline(never)]
    pub(crate) fn choose_free(&mut self, rounded: u64) -> Choice {
        self.flush_recent();
        if self.page != 0 {
            if let Some((id, addr)) = self.mapped_fit(rounded) {
                return Choice::Fit {
                    id,
                    addr,
                    unmapped: 0,
                };
            }
        }
        let class = policy::size_class(rounded).index();
        let found = self.free[class]
            .range((rounded, 0, 0)..)
            .next()
            .filter(|k| policy::block_fits(k.0, rounded))
            .map(|k| k.2);
        let Some(id) = found else {
            return Choice::None;
        };
        let (addr, unmapped) = self.placement(id, rounded);
        Choice::Fit { id, addr, unmapped }
    }

    /// Where in free block `id` a request of `rounded` bytes goes, and how many pages
    /// must be mapped for it there: its start if every page is mapped there, else the
    /// start of the first run of mapped pages inside it that holds the whole request (a
    /// coalesced free block of a virtual-memory segment may span the whole range with
    /// islands of mapped pages inside), else whichever end needs fewer pages mapped.
    fn placement(&self, id: u32, rounded: u64) -> (u64, usize) {
        let b = &self.blocks[id as usize];
        let start = b.addr;
        if self.page == 0 || b.size == rounded {
            return (start, self.unmapped_pages(b.segment, start, rounded));
        }
        let at_start = self.unmapped_pages(b.segment, start, rounded);
        if at_start == 0 {
            return (start, 0);
        }
        if let Some((_, addr)) = self.mapped_island(b.segment, start, b.size, rounded) {
            return (addr, 0);
        }
        let end = b.addr + b.size - rounded;
        let at_end = self.unmapped_pages(b.segment, end, rounded);
        if at_end < at_start {
            (end, at_end)
        } else {
            (start, at_start)
        }
    }

    /// The smallest range of mapped pages inside `[addr, addr + size)` of `segment` that
    /// holds `len` bytes, as `(its length, its start)` (lowest address among equals).
    fn mapped_island(&self, segment: u32, addr: u64, size: u64, len: u64) -> Option<(u64, u64)> {
        let Some(Some(seg)) = self.segments.get(segment as usize) else {
            return None;
        };
        let Backing::Virtual(pages) = &seg.backing else {
            return None;
        };
        let (first, end) = touched_pages(seg.base, self.page, addr, size);
        pages
            .runs_within(first, end)
            .filter_map(|(s, e)| {
                // The run's bytes inside the block: a run clipped at `first` starts at the
                // block's own start, which may lie inside that page.
                let lo = (seg.base + s as u64 * self.page).max(addr);
                let hi = (seg.base + e as u64 * self.page).min(addr + size);
                let room = hi.saturating_sub(lo);
                (room >= len).then_some((room, lo))
            })
            .min()
    }

    /// Whether any page under `[addr, addr + len)` in `segment` is mapped (always, in a
    /// plain segment).
    fn any_mapped(&self, segment: u32, addr: u64, len: u64) -> bool {
        match self.segments.get(segment as usize) {
            Some(Some(seg)) => match &seg.backing {
                Backing::Plain => true,
                Backing::Virtual(pages) => {
                    let (first, end) = touched_pages(seg.base, self.page, addr, len);
                    pages.runs_within(first, end).next().is_some()
                }
            },
            _ => false,
        }
    }

    /// Number of unmapped pages under `[addr, addr + len)` in `segment`.
    fn unmapped_pages(&self, segment: u32, addr: u64, len: u64) -> usize {
        let Some(Some(seg)) = self.segments.get(segment as usize) else {
            return 0;
        };
        match &seg.backing {
            Backing::Plain => 0,
            Backing::Virtual(pages) => {
                let (first, end) = touched_pages(seg.base, self.page, addr, len);
                (end - first) - pages.mapped_within(first, end)
            }
        }
    }

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
        backend: &B,
        id: u32,
        generation: u64,
        stream: &B::Stream,
        key: StreamId,
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
        match self.blocks.get_mut(id as usize) {
            Some(b) if b.state == BlockState::Live && b.generation == generation => Ok(b),
            Some(b) => Err(PoolError::InvalidHandle { ptr: b.addr }),
            None => Err(PoolError::InvalidHandle { ptr: 0 }),
        }
    }

    /// Frees live block `id`. Without extra streams it joins the recent list at once;
    /// with them, fences are recorded on those streams and the block waits in
    /// `pending` until they complete. If recording a fence fails, the block still
    /// waits (a fence is recorded again later, which is only more conservative) and
    /// the error is returned.
    #[inline]
    pub(crate) fn release(
        &mut self,
        backend: &B,
        id: u32,
        generation: u64,
    ) -> Result<(), PoolError> {
        let b = self.live_block(id, generation)?;
        let (size, requested) = (b.size, b.requested);
        let shared = !b.extra_streams.is_empty();
        self.stats.used.sub(size);
        self.stats.requested.sub(requested);
        self.stats.active_blocks.sub(1);
        self.stats.frees += 1;
        // A failed fence record on another stream still frees the block (safely, see
        // `release_shared`); the stream of this shard must be let go of all the same.
        let mut result = Ok(());
        if shared {
            result = self.release_shared(backend, id);
        } else {
            self.epoch += 1;
            let b = &mut self.blocks[id as usize];
            b.state = BlockState::Recent;
            b.freed_epoch = self.epoch;
            if let Some(oldest) = self.recent.push(size, id) {
                self.coalesce_insert(oldest);
            }
        }
        if self.stream_idle() {
            let detached = self.detach_if_released(backend);
            result = result.and(detached);
        }
        result
    }

    /// Detaches the stream if the backend says its owner may now destroy it (see
    /// [`detach`](Self::detach)); the free of a stream's last live block calls it.
    #[inline(never)]
    pub(crate) fn detach_if_released(&mut self, backend: &B) -> Result<(), PoolError> {
        match &self.stream {
            // A private shard lets go at once: it is not where a stream's ordinary work
            // allocates, and its clone would keep an owned stream alive.
            Some(s) if self.private || backend.may_release_stream(s) => self.detach(backend),
            _ => Ok(()),
        }
    }

    #[inline(never)]
    fn release_shared(&mut self, backend: &B, id: u32) -> Result<(), PoolError> {
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

    // ----- segments and pages -----------------------------------------------------

    /// Adds a segment covering `[base, base + size)` as one free block; returns that
    /// block's id.
    pub(crate) fn add_segment(&mut self, base: u64, size: u64, class: SizeClass) -> u32 {
        let seg_id = match self.segments.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.segments.push(None);
                self.segments.len() - 1
            }
        };
        let first = self.new_block(Block {
            addr: base,
            size,
            prev: NIL,
            next: NIL,
            segment: seg_id as u32,
            class,
            state: BlockState::Free,
            generation: 0,
            freed_epoch: 0,
            requested: 0,
            extra_streams: Vec::new(),
            lent: false,
        });
        let backing = if self.page == 0 {
            Backing::Plain
        } else {
            Backing::Virtual(PageTable::new())
        };
        self.segments[seg_id] = Some(Segment {
            base,
            size,
            first,
            backing,
        });
        self.insert_free(first);
        first
    }

    /// Maps a page from `spare` under every unmapped page of block `id`. The caller
    /// made sure `spare` holds enough; if it does not, or the backend fails, the pages
    /// mapped so far stay mapped (they are cached memory of a free range once the
    /// caller gives the block back) and an error or `false` is returned.
    pub(crate) fn map_block(
        &mut self,
        backend: &B,
        id: u32,
        spare: &mut Vec<B::Physical>,
    ) -> Result<bool, PoolError> {
        let (addr, size, segment) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.size, b.segment)
        };
        let page = self.page;
        let device = self.device;
        let Some(Some(seg)) = self.segments.get_mut(segment as usize) else {
            return Ok(false);
        };
        let base = seg.base;
        let Backing::Virtual(pages) = &mut seg.backing else {
            return Ok(true);
        };
        let (first, end) = touched_pages(base, page, addr, size);
        // Unmapped pages are mapped in runs of consecutive slots, one backend call a run.
        let mut run: Vec<(usize, B::Physical)> = Vec::new();
        let mut enough = true;
        for i in first..end {
            if pages.is_mapped(i) {
                map_run(backend, device, base, page, pages, &mut run, spare)?;
                continue;
            }
            let Some(phys) = spare.pop() else {
                enough = false;
                break;
            };
            run.push((i, phys));
        }
        map_run(backend, device, base, page, pages, &mut run, spare)?;
        Ok(enough)
    }

    /// Unmaps pages lying wholly inside free blocks whose frees a completed fence
    /// covers, moving them to `spare`, until `spare` holds `want` pages or nothing is
    /// left. The smallest runs of mapped pages go first: they are the fragments least
    /// able to serve a request without mapping, while the long runs stay for the
    /// requests that need them (on the `lm_varlen` trace, stripping the largest free
    /// blocks first moved 8x more pages at the same peak).
    pub(crate) fn reclaim_pages(
        &mut self,
        backend: &B,
        spare: &mut Vec<B::Physical>,
        want: usize,
    ) -> Result<(), PoolError> {
        if self.page == 0 || spare.len() >= want || self.private {
            return Ok(());
        }
        self.flush_recent();
        self.poll_pending(backend)?;
        self.refresh_fences(backend)?;
        let safe = self.safe_epoch;
        let page = self.page;
        // The runs of mapped pages lying wholly inside fenced free blocks.
        let mut islands: Vec<(usize, u32, usize)> = Vec::new();
        for &(size, addr, id) in self.free.iter().flat_map(|set| set.iter()) {
            let b = &self.blocks[id as usize];
            if b.freed_epoch > safe {
                continue;
            }
            let Some(Some(seg)) = self.segments.get(b.segment as usize) else {
                continue;
            };
            let Backing::Virtual(pages) = &seg.backing else {
                continue;
            };
            let (first, end) = inner_pages(seg.base, page, addr, size);
            islands.extend(
                pages
                    .runs_within(first, end)
                    .map(|(s, e)| (e - s, b.segment, s)),
            );
        }
        islands.sort_unstable();
        for (len, segment, first) in islands {
            let Some(Some(seg)) = self.segments.get_mut(segment as usize) else {
                continue;
            };
            let base = seg.base;
            let Backing::Virtual(pages) = &mut seg.backing else {
                continue;
            };
            for i in first..first + len {
                if spare.len() >= want {
                    return Ok(());
                }
                let Some(phys) = pages.take(i) else {
                    continue;
                };
                let va = DeviceAddress(base + i as u64 * page);
                // SAFETY: page `i` of this segment was mapped at `va` (the table held it) by
                // this shard through `backend`; it lies wholly inside a free block whose
                // frees a completed fence covers (`freed_epoch <= safe_epoch`), so no live
                // block touches it and no work uses it any more.
                if let Err(e) = unsafe { backend.unmap(self.device, va, page) } {
                    // Still mapped: back where it was (the slot was just emptied).
                    let _ = pages.put(i, phys);
                    return Err(PoolError::backend("unmap")(e));
                }
                spare.push(phys);
            }
        }
        Ok(())
    }

    /// Releases cached memory whose frees a completed fence covers: in plain mode,
    /// segments that are wholly free (returned to the backend, their bytes subtracted
    /// from `reserved`); in virtual-memory mode, the pages of free blocks (to `spare`),
    /// then the address ranges of segments left wholly free and unmapped.
    pub(crate) fn release_cached(
        &mut self,
        backend: &B,
        spare: &mut Vec<B::Physical>,
        reserved: &mut u64,
    ) -> Result<(), PoolError> {
        if self.private {
            return Ok(());
        }
        self.flush_recent();
        self.poll_pending(backend)?;
        self.refresh_fences(backend)?;
        if self.page != 0 {
            self.reclaim_pages(backend, spare, usize::MAX)?;
        }
        let safe = self.safe_epoch;
        for seg_id in 0..self.segments.len() {
            let Some(seg) = &self.segments[seg_id] else {
                continue;
            };
            let first = &self.blocks[seg.first as usize];
            let wholly_free = first.state == BlockState::Free
                && first.next == NIL
                && first.size == seg.size
                && first.freed_epoch <= safe;
            let unmapped = match &seg.backing {
                Backing::Plain => true,
                Backing::Virtual(pages) => pages.mapped() == 0,
            };
            if !(wholly_free && unmapped) {
                continue;
            }
            let (base, size, first_id) = (seg.base, seg.size, seg.first);
            match seg.backing {
                Backing::Plain => {
                    // SAFETY: a plain segment this shard got from `backend.allocate` (base and
                    // size as recorded), wholly one free block whose frees a completed fence
                    // covers, so nothing uses it; it is forgotten just below (or stays
                    // recorded if the call fails).
                    unsafe { backend.deallocate(self.device, DeviceAddress(base), size) }
                        .map_err(PoolError::backend("deallocate"))?;
                    *reserved = reserved.saturating_sub(size);
                }
                Backing::Virtual(_) => {
                    // SAFETY: a range this shard reserved through `backend` (base and size as
                    // recorded), with no page mapped in it and wholly one fenced free block,
                    // so no address of it is in use; it is forgotten just below.
                    unsafe {
                        backend.release_address_range(self.device, DeviceAddress(base), size)
                    }
                    .map_err(PoolError::backend("release_address_range"))?;
                }
            }
            self.remove_free(first_id);
            self.drop_block(first_id);
            self.segments[seg_id] = None;
        }
        Ok(())
    }

    /// Releases everything this shard holds, live or not (the pool is being dropped
    /// and has waited for every fence). Returns the plain bytes released; pages go to
    /// `spare`.
    pub(crate) fn release_everything(&mut self, backend: &B, spare: &mut Vec<B::Physical>) -> u64 {
        let mut released = 0;
        for f in self.held_fences.drain(..) {
            backend.release_fence(f);
        }
        for seg in self.segments.drain(..).flatten() {
            match seg.backing {
                Backing::Plain => {
                    // A segment that cannot be returned is leaked, and stays counted: the
                    // device still holds it.
                    // SAFETY: a plain segment of this shard (from `backend.allocate`), drained
                    // from it so never given back twice; the caller (the pool's drop, or a
                    // private pool found idle) has waited for every fence covering its
                    // blocks, and no block of it is used any more. (The pool's drop goes on
                    // after a failed wait, a driver failure it cannot report: a known gap.)
                    if unsafe { backend.deallocate(self.device, DeviceAddress(seg.base), seg.size) }
                        .is_ok()
                    {
                        released += seg.size;
                    }
                }
                Backing::Virtual(mut pages) => {
                    let mut all_unmapped = true;
                    for (i, p) in pages.drain() {
                        let va = DeviceAddress(seg.base + i as u64 * self.page);
                        // A page that cannot be unmapped is leaked (still counted).
                        // SAFETY: page `i` of this segment, mapped at `va` by this shard and
                        // drained from its table; the caller waited for every fence and no
                        // block of the segment is used any more (as for the segment above).
                        if unsafe { backend.unmap(self.device, va, self.page) }.is_ok() {
                            spare.push(p);
                        } else {
                            all_unmapped = false;
                        }
                    }
                    // A range with a page left mapped in it is leaked.
                    if all_unmapped {
                        // SAFETY: the segment's range, reserved by this shard and drained
                        // from it; every page of it was unmapped just above.
                        let _ = unsafe {
                            backend.release_address_range(
                                self.device,
                                DeviceAddress(seg.base),
                                seg.size,
                            )
                        };
                    }
                }
            }
        }
        for (_, f) in self.fences.drain(..) {
            backend.release_fence(f);
        }
        self.returned = 0;
        for p in self.pending.drain(..) {
            for slot in p.fences {
                match slot {
                    FenceSlot::Recorded(f) => backend.release_fence(f),
                    FenceSlot::Done | FenceSlot::Never => {}
                }
            }
        }
        for b in &mut self.blocks {
            for (_, s) in std::mem::take(&mut b.extra_streams) {
                backend.stream_released(s);
            }
        }
        self.blocks.clear();
        self.vacant.clear();
        self.recent.clear();
        self.free = [BTreeSet::new(), BTreeSet::new()];
        self.epoch = 0;
        self.safe_epoch = 0;
        if let Some(stream) = self.stream.take() {
            backend.stream_released(stream);
        }
        released
    }

    /// Address space this shard's virtual-memory segments reserve, in bytes.
    pub(crate) fn address_space(&self) -> u64 {
        if self.page == 0 {
            return 0;
        }
        self.segments.iter().flatten().map(|s| s.size).sum()
    }

    // ----- fences ------------------------------------------------------------------

    /// Records a fence covering every free so far unless one is outstanding that does,
    /// then polls the outstanding fences.
    fn refresh_fences(&mut self, backend: &B) -> Result<(), PoolError> {
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

    /// The attached stream, if the pool may record a fence on it or make it wait from this
    /// thread now: not while it is being captured (a fence there would be a node of the
    /// graph; for the legacy stream, the backend counts a capture of a blocking stream of the
    /// device, which makes the legacy stream unusable), nor when it is another thread's
    /// per-thread default stream (its handle would name this thread's stream). Frees that
    /// need a fence then wait, out of cross-stream reuse, for a later call that can record
    /// one.
    fn usable_stream(&self, backend: &B) -> Option<&B::Stream> {
        if super::is_other_threads_stream(self.stream_key) {
            return None;
        }
        self.stream.as_ref().filter(|s| !backend.is_capturing(s))
    }

    /// Lets go of the stream once no block made on it is live: records a fence covering
    /// every free so far (unless one already does), then hands the stream back to the
    /// backend. If the fence cannot be recorded the shard stays attached (the stream is
    /// kept, so nothing it cached is reused unfenced) and the error is returned.
    pub(crate) fn detach(&mut self, backend: &B) -> Result<(), PoolError> {
        if !self.stream_idle() {
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
        result
    }

    /// Attaches `stream` (key `key`) to a detached shard: the shard's previous stream (the
    /// same one, or another that had the same key, or another key's when the shard is
    /// adopted) may still have work running on memory the shard caches, so unless the
    /// detach fence has completed, `stream` is first made to wait for it. Nothing changes
    /// on error.
    pub(crate) fn attach(
        &mut self,
        backend: &B,
        stream: &B::Stream,
        key: StreamId,
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
        self.stream_key = backend.stream_key(stream)?;
        self.key = key;
        if self.private {
            self.attach_capture = backend.capture_id(stream);
        }
        self.stream = Some(backend.retain_stream(stream));
        Ok(())
    }

    /// Whether a detached shard's memory is all covered by completed fences, so that
    /// adopting it costs the new stream no wait (polls the fences).
    pub(crate) fn is_settled(&mut self, backend: &B) -> bool {
        !self.retired
            && self.pending.is_empty()
            && self.poll_fences(backend).is_ok()
            && self.epoch <= self.safe_epoch
    }

    /// Whether an idle, detached shard may be adopted at all (see [`is_settled`](Self::is_settled)).
    pub(crate) fn is_adoptable(&self) -> bool {
        !self.retired && !self.private
    }

    fn poll_fences(&mut self, backend: &B) -> Result<(), PoolError> {
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

    /// Blocks the host until every free of this shard so far is covered by a completed
    /// fence, and every pending free's fences have completed.
    /// Whether every free of the shard is covered by a completed fence (or by its detach
    /// fence; never for a retired shard): what must hold before its memory is released whole. [`wait_fences`] can leave
    /// it false, for a stream this thread may not fence now (see `usable_stream`).
    ///
    /// [`wait_fences`]: Self::wait_fences
    pub(crate) fn fully_fenced(&self) -> bool {
        // A retired shard let go of its stream with frees no fence covers.
        !self.retired && (self.stream.is_none() || self.epoch <= self.safe_epoch)
    }

    pub(crate) fn wait_fences(&mut self, backend: &B) -> Result<(), PoolError> {
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
    pub(crate) fn poll_pending(&mut self, backend: &B) -> Result<(), PoolError> {
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
    fn wait_pending(&mut self, backend: &B) -> Result<(), PoolError> {
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
    pub(crate) fn stream_wait_pending(&mut self, backend: &B) -> Result<bool, PoolError> {
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
    pub(crate) fn stream_wait_returns(&mut self, backend: &B) {
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
        backend: &B,
        ordered_after: bool,
        only_returned: bool,
        settle: impl Fn(&B, DeviceId, &B::Fence) -> Result<(), PoolError>,
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

    // ----- lending to other streams -----------------------------------------------

    /// The first free block (best fit first, among the first
    /// [`MAPPED_FIT_SCAN`](policy::MAPPED_FIT_SCAN) that fit) where a request of `rounded`
    /// bytes finds every page it touches mapped, and where in it; `(id, addr)`.
    ///
    /// Blocks are taken in best-fit order, but the mapped range inside a block is the
    /// smallest that holds the request. Best fit over every mapped range of every block
    /// instead (one coalesced free block may hold many) was measured and not taken: on the
    /// `lm_varlen` trace with a device that lags, it raised peak reserved / peak requested
    /// from 1.008 to 1.075.
    fn mapped_fit(&self, rounded: u64) -> Option<(u32, u64)> {
        let class = policy::size_class(rounded).index();
        self.free[class]
            .range((rounded, 0, 0)..)
            .filter(|k| policy::block_fits(k.0, rounded))
            .take(policy::MAPPED_FIT_SCAN)
            .filter(|&&(size, addr, id)| {
                self.any_mapped(self.blocks[id as usize].segment, addr, size)
            })
            .find_map(|&(_, _, id)| match self.placement(id, rounded) {
                (addr, 0) => Some((id, addr)),
                _ => None,
            })
    }

    /// A fence of this shard's stream covering every free stamped `<= epoch`: an
    /// outstanding one, or one recorded now (never on a detached or capturing stream).
    /// `None` when there is none to be had. Recording one beyond
    /// [`MAX_OUTSTANDING_FENCES`] gives the older ones up: the new one covers all they do.
    fn fence_covering(&mut self, backend: &B, epoch: u64) -> Result<Option<&B::Fence>, PoolError> {
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
        backend: &B,
        rounded: u64,
        requested: u64,
        borrower: &B::Stream,
        borrower_key: StreamId,
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

    /// Whether the shard has frees waiting for other streams' fences that its own stream
    /// could wait for on the device (attached, not capturing).
    pub(crate) fn has_waitable_pending(&self, backend: &B) -> bool {
        self.has_pending() && self.usable_stream(backend).is_some()
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

/// Maps the pending `run` of `(slot, page)` pairs (consecutive slots) with one
/// [`Backend::map_run`] call and records them in `pages`; on failure the pages go back to
/// `spare` and nothing is recorded. Empties `run`.
#[allow(clippy::too_many_arguments)]
fn map_run<B: Backend>(
    backend: &B,
    device: DeviceId,
    base: u64,
    page: u64,
    pages: &mut PageTable<B::Physical>,
    run: &mut Vec<(usize, B::Physical)>,
    spare: &mut Vec<B::Physical>,
) -> Result<(), PoolError> {
    let Some(&(first, _)) = run.first() else {
        return Ok(());
    };
    let refs: Vec<&B::Physical> = run.iter().map(|(_, p)| p).collect();
    // SAFETY: the run's slots are consecutive unmapped slots of one segment's range, which
    // the calling shard reserved through `backend` and holds; `page` is the device's
    // granularity; every page comes from the spare list, so it is mapped nowhere.
    let result = unsafe {
        backend.map_run(
            device,
            DeviceAddress(base + first as u64 * page),
            page,
            &refs,
        )
    };
    drop(refs);
    if let Err(failure) = result {
        for (k, (i, phys)) in run.drain(..).enumerate() {
            if failure.left_mapped.contains(&k) {
                // Still mapped where it was put: cached memory of the free range. The
                // slot was unmapped when the run was formed, so `put` cannot refuse it.
                let _ = pages.put(i, phys);
            } else {
                spare.push(phys);
            }
        }
        return Err(PoolError::backend("map")(failure.error));
    }
    for (i, phys) in run.drain(..) {
        let _ = pages.put(i, phys);
    }
    Ok(())
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
