//! The physical pages under one virtual-memory segment, with an index of the runs of
//! mapped pages.
//!
//! A shard's virtual-memory segment is one large address range (the device's memory,
//! see [`policy::address_range_size`](crate::policy::address_range_size)), so once its
//! blocks are freed and coalesced, one free block may span the whole range with islands
//! of mapped pages inside. The run index lets the pool find such an island in time
//! proportional to the number of islands, not of pages, and place a request there
//! without mapping anything (see `ShardState::placement`).

use std::collections::BTreeMap;

/// Page slots of a segment (`Some` where a physical page is mapped) and the maximal runs
/// of consecutive mapped slots, kept in step by [`put`](Self::put) and
/// [`take`](Self::take), the only ways to change a slot.
pub(crate) struct PageTable<P> {
    slots: Vec<Option<P>>,
    mapped: usize,
    /// Maximal runs of mapped slots, `start -> end` (exclusive); no two touch.
    runs: BTreeMap<usize, usize>,
}

impl<P> PageTable<P> {
    pub(crate) fn new() -> Self {
        PageTable {
            slots: Vec::new(),
            mapped: 0,
            runs: BTreeMap::new(),
        }
    }

    /// Number of mapped pages.
    pub(crate) fn mapped(&self) -> usize {
        self.mapped
    }

    pub(crate) fn is_mapped(&self, i: usize) -> bool {
        matches!(self.slots.get(i), Some(Some(_)))
    }

    /// Records `page` as mapped at slot `i`, which must be unmapped (a mapped slot keeps
    /// its page and `page` is handed back).
    pub(crate) fn put(&mut self, i: usize, page: P) -> Result<(), P> {
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].is_some() {
            return Err(page);
        }
        self.slots[i] = Some(page);
        self.mapped += 1;
        let mut start = i;
        let mut end = i + 1;
        if let Some((&s, &e)) = self.runs.range(..i).next_back() {
            if e == i {
                start = s;
            }
        }
        if let Some(e) = self.runs.remove(&(i + 1)) {
            end = e;
        }
        self.runs.insert(start, end);
        Ok(())
    }

    /// Takes the page mapped at slot `i` out of the table (the caller unmaps it).
    pub(crate) fn take(&mut self, i: usize) -> Option<P> {
        let page = self.slots.get_mut(i)?.take()?;
        self.mapped -= 1;
        // A mapped slot lies in exactly one run.
        if let Some((&s, &e)) = self.runs.range(..=i).next_back() {
            self.runs.remove(&s);
            if s < i {
                self.runs.insert(s, i);
            }
            if i + 1 < e {
                self.runs.insert(i + 1, e);
            }
        }
        Some(page)
    }

    /// The runs of mapped slots inside `[first, end)`, clipped to it, in order.
    pub(crate) fn runs_within(
        &self,
        first: usize,
        end: usize,
    ) -> impl Iterator<Item = (usize, usize)> + '_ {
        // The run that starts before `first` may reach into the range.
        let before = self
            .runs
            .range(..first)
            .next_back()
            .filter(|(_, &e)| e > first)
            .map(|(_, &e)| (first, e.min(end)));
        let inside = self
            .runs
            .range(first..end)
            .map(move |(&s, &e)| (s, e.min(end)));
        before.into_iter().chain(inside)
    }

    /// Number of mapped slots in `[first, end)`.
    pub(crate) fn mapped_within(&self, first: usize, end: usize) -> usize {
        if first >= end {
            return 0;
        }
        self.runs_within(first, end).map(|(s, e)| e - s).sum()
    }

    /// Every mapped page with its slot, emptying the table.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (usize, P)> + '_ {
        self.mapped = 0;
        self.runs.clear();
        self.slots
            .drain(..)
            .enumerate()
            .filter_map(|(i, p)| p.map(|p| (i, p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs<P>(t: &PageTable<P>) -> Vec<(usize, usize)> {
        t.runs.iter().map(|(&s, &e)| (s, e)).collect()
    }

    #[test]
    fn runs_merge_and_split() {
        let mut t = PageTable::new();
        for i in [3, 5, 4, 9, 0] {
            t.put(i, i as u32).unwrap();
        }
        assert_eq!(runs(&t), vec![(0, 1), (3, 6), (9, 10)]);
        assert_eq!(t.mapped(), 5);
        assert_eq!(t.put(4, 99), Err(99));
        assert_eq!(t.take(4), Some(4));
        assert_eq!(t.take(4), None);
        assert_eq!(runs(&t), vec![(0, 1), (3, 4), (5, 6), (9, 10)]);
        assert_eq!(t.take(0), Some(0));
        assert_eq!(runs(&t), vec![(3, 4), (5, 6), (9, 10)]);
        t.put(4, 4).unwrap();
        assert_eq!(runs(&t), vec![(3, 6), (9, 10)]);
        assert_eq!(t.mapped(), 4);
        assert!(t.is_mapped(5) && !t.is_mapped(6) && !t.is_mapped(100));
    }

    #[test]
    fn counts_and_clips() {
        let mut t = PageTable::new();
        for i in (2..8).chain(10..12) {
            t.put(i, 0u8).unwrap();
        }
        assert_eq!(
            t.runs_within(4, 11).collect::<Vec<_>>(),
            vec![(4, 8), (10, 11)]
        );
        assert_eq!(t.runs_within(0, 3).collect::<Vec<_>>(), vec![(2, 3)]);
        assert_eq!(t.mapped_within(0, 100), 8);
        assert_eq!(t.mapped_within(7, 10), 1);
        assert_eq!(t.mapped_within(8, 10), 0);
        assert_eq!(t.mapped_within(5, 5), 0);
        let drained: Vec<usize> = t.drain().map(|(i, _)| i).collect();
        assert_eq!(drained, vec![2, 3, 4, 5, 6, 7, 10, 11]);
        assert_eq!(t.mapped(), 0);
        assert_eq!(t.mapped_within(0, 100), 0);
    }

    /// The run index agrees with the slots after any sequence of puts and takes.
    #[test]
    fn index_matches_slots() {
        let mut t = PageTable::new();
        let mut x: u64 = 12345;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (x >> 33) as usize % 64;
            if (x >> 20) & 1 == 0 {
                let _ = t.put(i, ());
            } else {
                t.take(i);
            }
            let from_slots: Vec<usize> = (0..64).filter(|&i| t.is_mapped(i)).collect();
            let from_runs: Vec<usize> = t.runs_within(0, 64).flat_map(|(s, e)| s..e).collect();
            assert_eq!(from_slots, from_runs);
            assert_eq!(t.mapped(), from_slots.len());
            // Maximal: no two runs touch.
            let r = runs(&t);
            assert!(r.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}
