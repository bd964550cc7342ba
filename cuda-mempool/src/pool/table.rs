//! The per-device table of stream shards.
//!
//! A lookup reads only atomics (`OnceLock::get`), so threads working on different
//! streams share no written cache line when they find their shard. Shards are never
//! removed: a slot, once filled, keeps its stream for the life of the pool, which is
//! what makes the open-addressing probe sequence valid without deletion markers.
//! A table that fills up chains to another table of the same size.

use std::sync::OnceLock;

use super::lock::ShardLock;

use super::shard::ShardState;
use crate::backend::{Backend, DeviceId, StreamId};
use crate::policy::SHARDS_PER_TABLE;

/// The state of one (device, stream) pair behind its own lock.
///
/// Aligned to two cache lines so that the locks of neighbouring slots never share one
/// (adjacent-line prefetching makes 128 bytes the unit that matters on x86).
#[repr(align(128))]
pub(crate) struct Shard<B: Backend> {
    pub(crate) stream: StreamId,
    pub(crate) state: ShardLock<ShardState<B>>,
}

/// Open-addressing table from stream ids to shards, chained when full.
pub(crate) struct ShardTable<B: Backend> {
    slots: Box<[OnceLock<Shard<B>>]>,
    next: OnceLock<Box<ShardTable<B>>>,
}

/// Spreads stream ids (often pointers, so with zero low bits) over the slots.
fn slot_of(stream: StreamId) -> usize {
    let h = stream.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The top bits of the product are the well-mixed ones; SHARDS_PER_TABLE is a
    // power of two no larger than 2^32, so the shift keeps enough of them.
    (h >> 32) as usize % SHARDS_PER_TABLE
}

impl<B: Backend> ShardTable<B> {
    pub(crate) fn new() -> Self {
        ShardTable {
            slots: (0..SHARDS_PER_TABLE).map(|_| OnceLock::new()).collect(),
            next: OnceLock::new(),
        }
    }

    /// The shard of `stream`, if one was created.
    pub(crate) fn get(&self, stream: StreamId) -> Option<&Shard<B>> {
        let start = slot_of(stream);
        for i in 0..SHARDS_PER_TABLE {
            match self.slots[(start + i) % SHARDS_PER_TABLE].get() {
                Some(shard) if shard.stream == stream => return Some(shard),
                Some(_) => continue,
                // Slots are filled in probe order and never emptied, so the first empty
                // slot ends the search.
                None => return None,
            }
        }
        self.next.get().and_then(|t| t.get(stream))
    }

    /// The shard of `stream`, created when it does not exist yet.
    #[inline]
    pub(crate) fn get_or_insert(
        &self,
        stream: StreamId,
        device: DeviceId,
        page: Option<u64>,
    ) -> &Shard<B> {
        // Fast path: the stream's shard sits in its home slot.
        if let Some(shard) = self.slots[slot_of(stream)].get() {
            if shard.stream == stream {
                return shard;
            }
        }
        self.get_or_insert_probing(stream, device, page)
    }

    #[inline(never)]
    fn get_or_insert_probing(
        &self,
        stream: StreamId,
        device: DeviceId,
        page: Option<u64>,
    ) -> &Shard<B> {
        let start = slot_of(stream);
        for i in 0..SHARDS_PER_TABLE {
            let slot = &self.slots[(start + i) % SHARDS_PER_TABLE];
            let shard = match slot.get() {
                Some(shard) => shard,
                // Two threads may race to fill this slot with different streams: one
                // wins, and the loser sees the winner's stream below and probes on.
                None => slot.get_or_init(|| Shard {
                    stream,
                    state: ShardLock::new(ShardState::new(device, stream, page)),
                }),
            };
            if shard.stream == stream {
                return shard;
            }
        }
        self.next
            .get_or_init(|| Box::new(ShardTable::new()))
            .get_or_insert(stream, device, page)
    }

    /// Every shard created so far, in table order.
    pub(crate) fn iter(&self) -> ShardIter<'_, B> {
        ShardIter {
            table: Some(self),
            index: 0,
        }
    }
}

/// Iterator over the shards of a table and its chained tables.
pub(crate) struct ShardIter<'t, B: Backend> {
    table: Option<&'t ShardTable<B>>,
    index: usize,
}

impl<'t, B: Backend> Iterator for ShardIter<'t, B> {
    type Item = &'t Shard<B>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let table = self.table?;
            while self.index < table.slots.len() {
                let slot = &table.slots[self.index];
                self.index += 1;
                if let Some(shard) = slot.get() {
                    return Some(shard);
                }
            }
            self.table = table.next.get().map(|b| &**b);
            self.index = 0;
        }
    }
}
