//! [`ShardLock`]: the lock of one (device, stream) shard.
//!
//! Why not `std::sync::Mutex`: a same-size `malloc`+`free` pair takes the shard lock
//! twice, and with `Mutex` each lock/unlock costs two atomic read-modify-write
//! instructions (a compare-exchange to lock, a swap to unlock and learn whether to wake
//! a waiter). On the machines we measured, one such instruction costs 6-14 ns, so the
//! four of them were most of the 50 ns budget of a pair. This lock unlocks with a plain
//! release store, halving that cost.
//!
//! The price is that a waiter spins (briefly) and then yields instead of sleeping. That
//! is the right trade here: a shard belongs to one stream, which is normally used by one
//! thread at a time, so the lock is almost never contended; when it is, the holder is
//! either on the hot path (tens of nanoseconds) or on the slow path (driver calls,
//! where yielding costs the waiter little compared to the call it waits for).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins this many times before starting to yield the thread.
const SPINS_BEFORE_YIELD: u32 = 100;

/// A mutual-exclusion lock with a one-instruction unlock; see the module documentation.
pub(crate) struct ShardLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (the guard is
// created only by winning the `false -> true` exchange and releases with the store of
// `false`), which is exactly the contract of `Mutex<T>`: sendable and shareable when
// `T` is sendable.
unsafe impl<T: Send> Send for ShardLock<T> {}
// SAFETY: see above.
unsafe impl<T: Send> Sync for ShardLock<T> {}

/// Exclusive access to the value of a [`ShardLock`]; unlocks when dropped.
pub(crate) struct ShardGuard<'a, T> {
    lock: &'a ShardLock<T>,
    /// Makes the guard `Send`/`Sync` exactly when `&mut T` is.
    _marker: PhantomData<&'a mut T>,
}

impl<T> ShardLock<T> {
    pub(crate) fn new(value: T) -> Self {
        ShardLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Locks, spinning then yielding while another thread holds the lock.
    #[inline]
    pub(crate) fn lock(&self) -> ShardGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        ShardGuard {
            lock: self,
            _marker: PhantomData,
        }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T> Deref for ShardGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so no other
        // reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for ShardGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ShardGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_concurrent_writers() {
        let lock = ShardLock::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        // A non-atomic read-modify-write that loses updates without
                        // mutual exclusion.
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), 80_000);
    }
}
