//! The per-device table of stream shards.
//!
//! A lookup reads only atomics (`OnceLock::get` and the shard's key), so threads working on
//! different streams share no written cache line when they find their shard. Slots are
//! never emptied: a shard, once created, stays in its slot for the life of the pool, which
//! is what makes the open-addressing probe sequence valid without deletion markers. A table
//! that fills up chains to another table of the same size.
//!
//! A shard's key can change: a shard that has let go of its stream (detached, see the
//! crate's `backend` module) may be *adopted* by a new stream, so that a program that
//! creates and destroys streams endlessly reuses a bounded number of shards (and their
//! cached memory and address ranges). Adoption happens under the table's insert lock and
//! only for shards on the new key's probe path before its first empty slot, so lookups
//! keep finding every key with the same probe. A thread that found a shard by its key
//! re-checks the key under the shard's lock, since an adoption may have changed it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::lock::{ShardGuard, ShardLock};

use super::shard::ShardState;
use crate::backend::{Backend, DeviceId, StreamKey};
use crate::policy::SHARDS_PER_TABLE;

/// The state of one (device, stream) pair behind its own lock.
///
/// Aligned to two cache lines so that the locks of neighbouring slots never share one
/// (adjacent-line prefetching makes 128 bytes the unit that matters on x86).
#[repr(align(128))]
pub(crate) struct Shard<B: Backend> {
    /// The key the shard serves; written only under the table's insert lock and the
    /// shard's own lock (equal to `state.key` whenever the shard lock is free).
    key: AtomicU64,
    pub(crate) state: ShardLock<ShardState<B>>,
}

/// The key of retired shards: no stream has it.
pub(crate) const RETIRED: StreamKey = StreamKey(u64::MAX);

impl<B: Backend> Shard<B> {
    /// The key the shard serves now.
    #[inline]
    pub(crate) fn key(&self) -> StreamKey {
        StreamKey(self.key.load(Ordering::Acquire))
    }

    /// Takes a retired shard (see `ShardState::retired`) out of every lookup. Called with
    /// the shard's lock held, after it retired.
    pub(crate) fn retire(&self, st: &mut ShardState<B>) {
        st.key = RETIRED;
        self.key.store(RETIRED.0, Ordering::Release);
    }

    /// Locks the shard; the guard [`retire`](Self::retire)s it on unlock if it retired
    /// while locked.
    #[inline]
    pub(crate) fn lock_retiring(&self) -> RetiringGuard<'_, B> {
        RetiringGuard {
            shard: self,
            st: self.state.lock(),
        }
    }
}

/// The guard of [`Shard::lock_retiring`]: a shard whose state retired while it was held
/// is taken out of every lookup when it is dropped, before the lock is released.
pub(crate) struct RetiringGuard<'a, B: Backend> {
    shard: &'a Shard<B>,
    st: ShardGuard<'a, ShardState<B>>,
}

impl<B: Backend> Deref for RetiringGuard<'_, B> {
    type Target = ShardState<B>;

    #[inline]
    fn deref(&self) -> &ShardState<B> {
        &self.st
    }
}

impl<B: Backend> DerefMut for RetiringGuard<'_, B> {
    #[inline]
    fn deref_mut(&mut self) -> &mut ShardState<B> {
        &mut self.st
    }
}

impl<B: Backend> Drop for RetiringGuard<'_, B> {
    #[inline]
    fn drop(&mut self) {
        if self.st.retired {
            self.shard.retire(&mut self.st);
        }
    }
}

/// Open-addressing table from stream keys to shards, chained when full.
pub(crate) struct ShardTable<B: Backend> {
    slots: Box<[OnceLock<Shard<B>>]>,
    next: OnceLock<Box<ShardTable<B>>>,
    /// Serialises creating and adopting shards (only the first table's lock is used).
    insert: Mutex<()>,
    /// How many shards of the table (and of the tables chained to it) linger (see
    /// `ShardState::let_go`), against `policy::MAX_LINGERING_STREAMS`.
    lingering: Arc<AtomicUsize>,
}

/// Spreads stream keys (often pointers, so with zero low bits) over the slots.
fn slot_of(key: StreamKey) -> usize {
    let h = key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The top bits of the product are the well-mixed ones; SHARDS_PER_TABLE is a
    // power of two no larger than 2^32, so the shift keeps enough of them.
    (h >> 32) as usize % SHARDS_PER_TABLE
}

/// What [`ShardTable::insert`] found or made for a key.
pub(crate) enum Inserted<'t, B: Backend> {
    /// The key already has a shard.
    Existing,
    /// A new, empty shard was made for the key.
    Created(&'t Shard<B>),
    /// A detached shard was re-keyed to the key; the caller must attach its stream (which
    /// may wait for the shard's previous fences) before using it.
    Adopted(&'t Shard<B>),
}

impl<B: Backend> ShardTable<B> {
    pub(crate) fn new() -> Self {
        Self::sharing(Arc::new(AtomicUsize::new(0)))
    }

    /// A table counting its lingering shards in `lingering` (a chained table shares its
    /// first table's count).
    fn sharing(lingering: Arc<AtomicUsize>) -> Self {
        ShardTable {
            slots: (0..SHARDS_PER_TABLE).map(|_| OnceLock::new()).collect(),
            next: OnceLock::new(),
            insert: Mutex::new(()),
            lingering,
        }
    }

    /// The shard of `key`, if one exists (its key may change after this returns: check it
    /// under the shard's lock).
    pub(crate) fn get(&self, key: StreamKey) -> Option<&Shard<B>> {
        let start = slot_of(key);
        for i in 0..SHARDS_PER_TABLE {
            match self.slots[(start + i) % SHARDS_PER_TABLE].get() {
                Some(shard) if shard.key() == key => return Some(shard),
                Some(_) => continue,
                // Slots are filled in probe order and never emptied, so the first empty
                // slot ends the search.
                None => return None,
            }
        }
        self.next.get().and_then(|t| t.get(key))
    }

    /// The shard of `key` when it sits in its home slot: the hot path.
    #[inline]
    pub(crate) fn get_home(&self, key: StreamKey) -> Option<&Shard<B>> {
        match self.slots[slot_of(key)].get() {
            Some(shard) if shard.key() == key => Some(shard),
            _ => None,
        }
    }

    /// Holds the insert lock: no shard is created, adopted or re-keyed meanwhile.
    pub(crate) fn insert_lock(&self) -> MutexGuard<'_, ()> {
        self.insert.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Finds the shard of `key`, or adopts a detached shard on its probe path for which
    /// `adoptable` says yes (called with the shard locked), or creates one. The caller
    /// holds [`insert_lock`](Self::insert_lock).
    pub(crate) fn insert(
        &self,
        key: StreamKey,
        device: DeviceId,
        page: Option<u64>,
        adoptable: &mut dyn FnMut(&mut ShardState<B>) -> bool,
    ) -> Inserted<'_, B> {
        if let Some(shard) = self.get(key) {
            let _ = shard;
            return Inserted::Existing;
        }
        let mut table = self;
        loop {
            let start = slot_of(key);
            for i in 0..SHARDS_PER_TABLE {
                let slot = &table.slots[(start + i) % SHARDS_PER_TABLE];
                match slot.get() {
                    Some(shard) => {
                        let mut st = shard.state.lock();
                        if !st.is_attached()
                            && st.is_idle()
                            && st.is_adoptable()
                            && adoptable(&mut st)
                        {
                            st.key = key;
                            shard.key.store(key.0, Ordering::Release);
                            return Inserted::Adopted(shard);
                        }
                    }
                    None => {
                        // Only inserters fill slots, and they hold the insert lock.
                        let shard = slot.get_or_init(|| Shard {
                            key: AtomicU64::new(key.0),
                            state: ShardLock::new(ShardState::new(
                                device,
                                key,
                                page,
                                Arc::clone(&self.lingering),
                            )),
                        });
                        return Inserted::Created(shard);
                    }
                }
            }
            table = table
                .next
                .get_or_init(|| Box::new(ShardTable::sharing(Arc::clone(&self.lingering))));
        }
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
