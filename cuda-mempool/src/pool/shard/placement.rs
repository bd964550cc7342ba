//! Which cached block serves a request, and where in it: the one place that decides.

use crate::backend::Backend;
use crate::policy;

use super::{touched_pages, Backing, ShardState};

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

impl<B: Backend> ShardState<B> {
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

    /// The first free block (best fit first, among the first
    /// [`MAPPED_FIT_SCAN`](policy::MAPPED_FIT_SCAN) that fit) where a request of `rounded`
    /// bytes finds every page it touches mapped, and where in it; `(id, addr)`.
    ///
    /// Blocks are taken in best-fit order, but the mapped range inside a block is the
    /// smallest that holds the request. Best fit over every mapped range of every block
    /// instead (one coalesced free block may hold many) was measured and not taken: on the
    /// `lm_varlen` trace with a device that lags, it raised peak reserved / peak requested
    /// from 1.008 to 1.075.
    pub(super) fn mapped_fit(&self, rounded: u64) -> Option<(u32, u64)> {
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
}
