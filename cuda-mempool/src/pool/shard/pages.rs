//! A shard's segments and the pages under them: added, mapped, reclaimed, released.

use std::collections::BTreeSet;

use crate::backend::{Backend, DeviceAddress, DeviceId};
use crate::error::PoolError;
use crate::observe::Observed;
use crate::policy::SizeClass;

use super::page_table::PageTable;
use super::{
    inner_pages, touched_pages, Backing, Block, BlockState, FenceSlot, Segment, ShardState, NIL,
};

impl<B: Backend> ShardState<B> {
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
        backend: &Observed<B>,
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
        backend: &Observed<B>,
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
                // frees a completed fence or device synchronisation covers (`freed_epoch <=
                // safe_epoch`), so no live block touches it and no work uses it any more.
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
        backend: &Observed<B>,
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
    pub(crate) fn release_everything(
        &mut self,
        backend: &Observed<B>,
        spare: &mut Vec<B::Physical>,
    ) -> u64 {
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
}

/// Maps the pending `run` of `(slot, page)` pairs (consecutive slots) with one
/// [`Backend::map_run`] call and records them in `pages`; on failure the pages go back to
/// `spare` and nothing is recorded. Empties `run`.
fn map_run<B: Backend>(
    backend: &Observed<B>,
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
        return Err(PoolError::backend("map_run")(failure.error));
    }
    for (i, phys) in run.drain(..) {
        let _ = pages.put(i, phys);
    }
    Ok(())
}
