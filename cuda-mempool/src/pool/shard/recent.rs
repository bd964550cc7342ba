//! The recently freed blocks of a shard, kept uncoalesced: the exact-size reuse of the
//! hot path.

use crate::policy::RECENT_CAPACITY;

use super::NIL;

/// The recently freed blocks of a shard, newest last, kept inline in the shard (no heap
/// buffer that could share a cache line with another shard's data).
pub(super) struct RecentList {
    len: usize,
    sizes: [u64; RECENT_CAPACITY],
    ids: [u32; RECENT_CAPACITY],
}

impl RecentList {
    pub(super) fn new() -> Self {
        RecentList {
            len: 0,
            sizes: [0; RECENT_CAPACITY],
            ids: [NIL; RECENT_CAPACITY],
        }
    }

    /// Takes the newest block of exactly `size` bytes.
    #[inline]
    pub(super) fn take(&mut self, size: u64) -> Option<u32> {
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
    pub(super) fn push(&mut self, size: u64, id: u32) -> Option<u32> {
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

    pub(super) fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.ids[self.len])
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
    }
}
