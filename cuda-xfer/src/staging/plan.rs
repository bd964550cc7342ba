//! How a staged transfer is cut up: chunks (one DMA each, one staging slot each) and parts
//! (one host copy each, the unit a thread claims).
//!
//! Chunks are consecutive, at most `chunk` bytes each; chunk `k` goes through slot
//! `k % slots` in round `k / slots`. A *ramped* plan starts with smaller chunks (an eighth
//! of `chunk`, then a quarter, a half, then `chunk`), so that the first DMA starts after a
//! short host copy, done by the calling thread alone if the helper threads are still waking
//! up, and so that the pipeline fills fast. Each chunk is cut into parts of `part` bytes (the
//! last one shorter). Work units are numbered chunk by chunk, part by part, so the units of
//! chunk `k` all come before those of chunk `k + 1`: a thread that claims a unit only ever
//! waits for units claimed before it, which is what makes the pipeline deadlock-free with any
//! number of threads, one included.

use std::ops::Range;

use crate::error::{Error, Result};

/// First chunk of a ramped plan: `chunk / RAMP` (then twice that, and so on up to `chunk`).
const RAMP: usize = 8;

/// The cut of one staged transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    total: usize,
    part: usize,
    slots: usize,
    max_chunk: usize,
    /// Chunk `k` is `bounds[k]..bounds[k + 1]`.
    bounds: Vec<usize>,
    /// Units of chunk `k` are `first_unit[k]..first_unit[k + 1]`.
    first_unit: Vec<usize>,
}

/// One unit of host copy work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The chunk the unit belongs to.
    pub chunk: usize,
    /// The staging slot of that chunk.
    pub slot: usize,
    /// How many times the slot was used before this chunk.
    pub round: usize,
    /// The unit's bytes in the transfer (host and device offsets alike).
    pub range: Range<usize>,
    /// Where the unit's bytes start inside the slot.
    pub slot_offset: usize,
}

impl Plan {
    /// The plan for `total` bytes in chunks of `chunk` bytes through `slots` slots, host
    /// copies in parts of `part` bytes (clamped to the chunk).
    #[cfg(test)]
    pub fn new(total: usize, chunk: usize, part: usize, slots: usize) -> Result<Plan> {
        Plan::build(total, chunk, part, slots, false)
    }

    /// As [`Plan::new`], the first chunks ramping up from `chunk / 8` (at least a part).
    pub fn ramped(total: usize, chunk: usize, part: usize, slots: usize) -> Result<Plan> {
        Plan::build(total, chunk, part, slots, true)
    }

    fn build(total: usize, chunk: usize, part: usize, slots: usize, ramp: bool) -> Result<Plan> {
        if chunk == 0 || part == 0 || slots == 0 {
            return Err(Error::InvalidConfig(format!(
                "chunk ({chunk}), part ({part}) and slots ({slots}) must all be non-zero"
            )));
        }
        let part = part.min(chunk);
        let mut size = if ramp {
            (chunk / RAMP).max(part)
        } else {
            chunk
        };
        let mut bounds = vec![0];
        let mut first_unit = vec![0];
        let mut at = 0usize;
        while at < total {
            let len = size.min(total - at);
            at += len;
            bounds.push(at);
            let units = first_unit.last().copied().unwrap_or(0) + len.div_ceil(part);
            first_unit.push(units);
            size = size.saturating_mul(2).min(chunk);
        }
        Ok(Plan {
            total,
            part,
            slots,
            max_chunk: chunk,
            bounds,
            first_unit,
        })
    }

    /// Bytes in the whole transfer.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Largest chunk: the staging slots must hold this many bytes.
    #[cfg(test)]
    pub fn chunk_bytes(&self) -> usize {
        self.max_chunk
    }

    /// Number of staging slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        self.bounds.len() - 1
    }

    /// The bytes of chunk `k` (`k < chunks()`).
    pub fn chunk_range(&self, k: usize) -> Range<usize> {
        self.bounds[k]..self.bounds[k + 1]
    }

    /// The slot chunk `k` goes through.
    pub fn slot_of(&self, k: usize) -> usize {
        k % self.slots
    }

    /// Number of host-copy units in the whole transfer.
    pub fn units(&self) -> usize {
        self.first_unit.last().copied().unwrap_or(0)
    }

    /// Unit `u` (`u < units()`).
    pub fn unit(&self, u: usize) -> Unit {
        // The last chunk whose first unit is at most `u`.
        let chunk = self.first_unit.partition_point(|&f| f <= u) - 1;
        let p = u - self.first_unit[chunk];
        let chunk_range = self.chunk_range(chunk);
        let start = chunk_range.start + p * self.part;
        let end = (start + self.part).min(chunk_range.end);
        Unit {
            chunk,
            slot: chunk % self.slots,
            round: chunk / self.slots,
            range: start..end,
            slot_offset: p * self.part,
        }
    }

    /// Number of units of chunk `k`.
    pub fn parts_of(&self, k: usize) -> usize {
        self.first_unit[k + 1] - self.first_unit[k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_sizes_are_rejected() {
        assert!(matches!(
            Plan::new(10, 0, 1, 1),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            Plan::new(10, 1, 0, 1),
            Err(Error::InvalidConfig(_))
        ));
        assert!(matches!(
            Plan::new(10, 1, 1, 0),
            Err(Error::InvalidConfig(_))
        ));
    }

    #[test]
    fn an_empty_transfer_has_no_work() {
        let plan = Plan::ramped(0, 8, 4, 2).unwrap();
        assert_eq!(plan.chunks(), 0);
        assert_eq!(plan.units(), 0);
    }

    #[test]
    fn a_small_example_is_cut_as_described() {
        // 23 bytes, chunks of 8, parts of 3, 2 slots.
        let plan = Plan::new(23, 8, 3, 2).unwrap();
        assert_eq!(plan.chunks(), 3);
        assert_eq!(plan.chunk_range(2), 16..23);
        assert_eq!(plan.units(), 3 + 3 + 3);
        let u = plan.unit(5);
        assert_eq!(
            u,
            Unit {
                chunk: 1,
                slot: 1,
                round: 0,
                range: 14..16,
                slot_offset: 6
            }
        );
        let u = plan.unit(8);
        assert_eq!(
            u,
            Unit {
                chunk: 2,
                slot: 0,
                round: 1,
                range: 22..23,
                slot_offset: 6
            }
        );
    }

    #[test]
    fn a_ramped_plan_starts_small_and_doubles() {
        // 64 units of chunk 8 MiB, parts of 512 KiB: 1, 2, 4, 8, 8, ... MiB.
        const MIB: usize = 1 << 20;
        let plan = Plan::ramped(64 * MIB, 8 * MIB, MIB / 2, 4).unwrap();
        let sizes: Vec<usize> = (0..plan.chunks())
            .map(|k| plan.chunk_range(k).len())
            .collect();
        assert_eq!(
            sizes,
            [1, 2, 4, 8, 8, 8, 8, 8, 8, 8, 1].map(|m| m * MIB),
            "the ramp, then full chunks, then the rest"
        );
        assert_eq!(plan.parts_of(0), 2);
        assert_eq!(plan.parts_of(3), 16);
        // The ramp never starts below a part.
        let plan = Plan::ramped(100, 16, 6, 2).unwrap();
        assert_eq!(plan.chunk_range(0), 0..6);
        assert_eq!(plan.chunk_range(1), 6..18);
    }

    #[test]
    fn a_part_larger_than_the_chunk_is_clamped() {
        let plan = Plan::new(20, 8, 100, 3).unwrap();
        assert_eq!(plan.units(), 3);
        assert_eq!(plan.unit(2).range, 16..20);
    }

    proptest! {
        /// Units tile the transfer exactly once, in order, each inside its chunk and its slot.
        #[test]
        fn units_tile_the_transfer(
            total in 0usize..5000,
            chunk in 1usize..700,
            part in 1usize..900,
            slots in 1usize..6,
            ramp in any::<bool>(),
        ) {
            let plan = if ramp {
                Plan::ramped(total, chunk, part, slots).unwrap()
            } else {
                Plan::new(total, chunk, part, slots).unwrap()
            };
            let mut next = 0;
            let mut per_chunk = vec![0usize; plan.chunks()];
            for k in 0..plan.chunks() {
                let r = plan.chunk_range(k);
                prop_assert!(!r.is_empty() && r.len() <= chunk);
            }
            for u in 0..plan.units() {
                let unit = plan.unit(u);
                prop_assert_eq!(unit.range.start, next, "unit {} starts where the previous ended", u);
                prop_assert!(unit.range.end > unit.range.start);
                let c = plan.chunk_range(unit.chunk);
                prop_assert!(c.start <= unit.range.start && unit.range.end <= c.end);
                prop_assert_eq!(unit.slot_offset, unit.range.start - c.start);
                prop_assert!(unit.slot_offset + unit.range.len() <= plan.chunk_bytes());
                prop_assert_eq!(unit.slot, unit.chunk % slots);
                prop_assert_eq!(unit.round, unit.chunk / slots);
                per_chunk[unit.chunk] += 1;
                next = unit.range.end;
            }
            prop_assert_eq!(next, total);
            for (k, n) in per_chunk.iter().enumerate() {
                prop_assert_eq!(*n, plan.parts_of(k));
            }
        }
    }
}
