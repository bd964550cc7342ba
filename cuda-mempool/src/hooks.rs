//! Memory hooks (CuPy's `cupy.cuda.memory_hook`): callbacks before and after each backend
//! allocation (`alloc`: a segment or page from the driver), each pool `malloc` and each
//! free, installed on the current thread for a scope.
//!
//! * [`MemoryHook`]: the trait, every method with an empty default.
//! * [`install`]: pushes a hook for the current thread; the returned [`HookGuard`] removes
//!   it when dropped. Hooks nest; all installed hooks run, innermost last.
//! * [`DebugHook`]: emits a `tracing` event (target `cudars_mempool::hooks`, level DEBUG)
//!   for every callback.
//! * [`LineProfileHook`]: attributes malloc'd bytes to the caller's file and line, through
//!   `#[track_caller]` on the allocating entry points (CuPy's `LineProfileHook`).
//!
//! Where they fire: `alloc` hooks in the pool's one observation seam, around each backend
//! allocation of a plain segment or a virtual-memory page, whatever the backend (the same
//! seam records the memory [`history`](crate::history)); `malloc` hooks in
//! [`DevicePool::malloc_stream`](crate::DevicePool::malloc_stream),
//! [`DevicePool::malloc_shared`](crate::DevicePool::malloc_shared) and
//! [`allocator::alloc`](crate::allocator::alloc); `free` hooks when a
//! [`PoolMemory`](crate::PoolMemory) (or memory from `allocator::alloc`) is dropped. With no
//! hook installed the cost is one thread-local read.
//!
//! # Panicking hooks
//!
//! `alloc` hooks run inside the pool's slow path, with its locks held. A hook that panics
//! does not unwind into the pool: each hook call is run under `catch_unwind`, the panic is
//! reported (a `tracing` WARN event, target `cudars_mempool::hooks`, after the panic hook's
//! own message) and dropped, and the operation goes on as if the hook had returned. The
//! pool's state is never left half-changed by a hook.
//!
//! # Hooks must not call the pool
//!
//! Because `alloc` hooks run with the pool's device lock held, an `alloc` hook that calls
//! back into the same pool (an allocation, `stats`, `free_all_blocks`, `start_history`,
//! `snapshot`) waits for that lock forever. Record what you need and act on it after the
//! hooked call returns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// What a hook is told about one operation: the pool's one event type, the same the memory
/// history records ([`history::Record`](crate::history::Record)). `kind` says which
/// operation: `SegmentAlloc` or `PageCreate` for `alloc_*`, `Malloc` for `malloc_*`, `Free`
/// for `free_*`.
pub use crate::memory_event::MemoryEvent;

/// Callbacks around memory operations; every method defaults to doing nothing.
/// Hooks must be `Send + Sync` (they are shared through `Arc`) and must not allocate from
/// the pool themselves.
pub trait MemoryHook: Send + Sync {
    /// Before the backend allocates a segment or page.
    fn alloc_pre(&self, _event: &MemoryEvent) {}
    /// After the backend allocated: `addr` is the segment's address; for a physical page
    /// (`kind` `PageCreate`, no address until mapped) 1; 0 when the device was out of
    /// memory.
    fn alloc_post(&self, _event: &MemoryEvent) {}
    /// Before a pool `malloc`.
    fn malloc_pre(&self, _event: &MemoryEvent) {}
    /// After a successful pool `malloc`.
    fn malloc_post(&self, _event: &MemoryEvent) {}
    /// Before a block goes back to the pool.
    fn free_pre(&self, _event: &MemoryEvent) {}
    /// After a block went back to the pool.
    fn free_post(&self, _event: &MemoryEvent) {}
}

thread_local! {
    static HOOKS: RefCell<Vec<Arc<dyn MemoryHook>>> = const { RefCell::new(Vec::new()) };
}

/// Removes its hook from the current thread when dropped. Not `Send`: it belongs to the
/// thread that installed the hook.
#[must_use = "the hook is removed when the guard drops"]
#[derive(Debug)]
pub struct HookGuard {
    index: usize,
    _not_send: PhantomData<*const ()>,
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        HOOKS.with(|h| h.borrow_mut().truncate(self.index));
    }
}

/// Installs `hook` on the current thread until the guard drops (CuPy's `with hook:`).
///
/// ```
/// use std::sync::Arc;
/// use cudars_mempool::hooks::{self, LineProfileHook};
///
/// let profile = Arc::new(LineProfileHook::new());
/// {
///     let _guard = hooks::install(profile.clone());
///     // ... allocations made here are attributed to their call sites
/// }
/// assert!(profile.report().is_empty());
/// ```
pub fn install(hook: Arc<dyn MemoryHook>) -> HookGuard {
    HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        h.push(hook);
        HookGuard {
            index: h.len() - 1,
            _not_send: PhantomData,
        }
    })
}

/// Whether any hook is installed on the current thread.
pub fn any_installed() -> bool {
    HOOKS.with(|h| !h.borrow().is_empty())
}

/// Runs `f` on every hook installed on the current thread (a snapshot, so a hook may
/// install or remove hooks without a borrow conflict). A hook that panics is caught here:
/// the panic is reported and dropped, and the next hook runs (see the
/// [module documentation](self)).
pub(crate) fn each(f: impl Fn(&dyn MemoryHook)) {
    let hooks: Vec<Arc<dyn MemoryHook>> = HOOKS.with(|h| {
        let h = h.borrow();
        if h.is_empty() {
            Vec::new()
        } else {
            h.clone()
        }
    });
    for hook in &hooks {
        // The hook's own state may be left half-changed by its panic; the pool's is not
        // touched by the call, so unwind safety is asserted for the hook only.
        let call = std::panic::AssertUnwindSafe(|| f(hook.as_ref()));
        if let Err(payload) = std::panic::catch_unwind(call) {
            // Forgotten, not dropped: a payload whose own drop panics would unwind into
            // the pool after all.
            std::mem::forget(payload);
            tracing::warn!(
                target: "cudars_mempool::hooks",
                "a memory hook panicked; the panic was dropped and the operation goes on"
            );
        }
    }
}

/// Emits a `tracing` DEBUG event (target `cudars_mempool::hooks`) for every callback.
#[derive(Debug, Clone, Copy, Default)]
pub struct DebugHook;

macro_rules! debug_event {
    ($name:literal, $e:expr) => {
        tracing::debug!(
            target: "cudars_mempool::hooks",
            op = $name,
            kind = ?$e.kind,
            device = $e.device.0,
            size = $e.size,
            addr = $e.addr.0,
            stream = $e.stream.map(|s| s.0),
            location = ?$e.location.map(|l| (l.file(), l.line())),
        )
    };
}

impl MemoryHook for DebugHook {
    fn alloc_pre(&self, e: &MemoryEvent) {
        debug_event!("alloc_pre", e);
    }
    fn alloc_post(&self, e: &MemoryEvent) {
        debug_event!("alloc_post", e);
    }
    fn malloc_pre(&self, e: &MemoryEvent) {
        debug_event!("malloc_pre", e);
    }
    fn malloc_post(&self, e: &MemoryEvent) {
        debug_event!("malloc_post", e);
    }
    fn free_pre(&self, e: &MemoryEvent) {
        debug_event!("free_pre", e);
    }
    fn free_post(&self, e: &MemoryEvent) {
        debug_event!("free_post", e);
    }
}

/// One line of a [`LineProfileHook`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineStat {
    /// Source file of the call site.
    pub file: &'static str,
    /// Line of the call site.
    pub line: u32,
    /// Successful mallocs from that line.
    pub count: u64,
    /// Bytes malloc'd from that line.
    pub bytes: u64,
}

/// (file, line) -> (count, bytes).
type LineTable = HashMap<(&'static str, u32), (u64, u64)>;

/// Attributes malloc'd bytes to the caller's file and line (CuPy's `LineProfileHook`).
/// Mallocs whose caller is unknown are attributed to `<unknown>:0`.
///
/// `Send` and `Sync` (a mutex-protected table).
#[derive(Debug, Default)]
pub struct LineProfileHook {
    table: Mutex<LineTable>,
}

impl LineProfileHook {
    /// An empty profile.
    pub fn new() -> LineProfileHook {
        LineProfileHook::default()
    }

    /// Call sites with their counts and bytes, most bytes first.
    pub fn report(&self) -> Vec<LineStat> {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<LineStat> = table
            .iter()
            .map(|(&(file, line), &(count, bytes))| LineStat {
                file,
                line,
                count,
                bytes,
            })
            .collect();
        v.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.file.cmp(b.file))
                .then(a.line.cmp(&b.line))
        });
        v
    }

    /// Writes the report, one `file:line count bytes` line per call site.
    pub fn print_report(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        for s in self.report() {
            writeln!(
                out,
                "{}:{} {} mallocs {} bytes",
                s.file, s.line, s.count, s.bytes
            )?;
        }
        Ok(())
    }
}

impl MemoryHook for LineProfileHook {
    fn malloc_post(&self, e: &MemoryEvent) {
        let key = e
            .location
            .map_or(("<unknown>", 0), |l| (l.file(), l.line()));
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entry = table.entry(key).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += e.size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Count(Mutex<Vec<&'static str>>);
    impl MemoryHook for Count {
        fn malloc_pre(&self, _: &MemoryEvent) {
            self.0.lock().unwrap().push("malloc_pre");
        }
    }

    #[test]
    fn guards_nest_and_remove() {
        let a = Arc::new(Count::default());
        let b = Arc::new(Count::default());
        let e = MemoryEvent {
            kind: crate::history::EventKind::Malloc,
            device: crate::DeviceId(0),
            stream: None,
            size: 1,
            addr: crate::DeviceAddress(0),
            location: None,
        };
        assert!(!any_installed());
        {
            let _ga = install(a.clone());
            {
                let _gb = install(b.clone());
                each(|h| h.malloc_pre(&e));
            }
            each(|h| h.malloc_pre(&e));
        }
        each(|h| h.malloc_pre(&e));
        assert!(!any_installed());
        assert_eq!(a.0.lock().unwrap().len(), 2);
        assert_eq!(b.0.lock().unwrap().len(), 1);
    }

    struct Panics;
    impl MemoryHook for Panics {
        fn malloc_pre(&self, _: &MemoryEvent) {
            panic!("a hook that panics");
        }
    }

    #[test]
    fn a_panicking_hook_does_not_unwind_and_later_hooks_still_run() {
        let counted = Arc::new(Count::default());
        let e = MemoryEvent {
            kind: crate::history::EventKind::Malloc,
            device: crate::DeviceId(0),
            stream: None,
            size: 1,
            addr: crate::DeviceAddress(0),
            location: None,
        };
        let _gp = install(Arc::new(Panics));
        let _gc = install(counted.clone());
        // Before the fix the panic unwound out of `each` (and through the caller's locks).
        let r = std::panic::catch_unwind(|| each(|h| h.malloc_pre(&e)));
        assert!(r.is_ok(), "a hook's panic escaped `each`");
        assert_eq!(
            counted.0.lock().unwrap().len(),
            1,
            "the next hook did not run"
        );
    }

    #[test]
    #[track_caller]
    fn line_profile_attributes_bytes() {
        let p = LineProfileHook::new();
        let here = std::panic::Location::caller();
        for size in [100, 200] {
            p.malloc_post(&MemoryEvent {
                kind: crate::history::EventKind::Malloc,
                device: crate::DeviceId(0),
                stream: None,
                size,
                addr: crate::DeviceAddress(1),
                location: Some(here),
            });
        }
        p.malloc_post(&MemoryEvent {
            kind: crate::history::EventKind::Malloc,
            device: crate::DeviceId(0),
            stream: None,
            size: 5,
            addr: crate::DeviceAddress(1),
            location: None,
        });
        let r = p.report();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].count, r[0].bytes, r[0].line), (2, 300, here.line()));
        assert_eq!((r[1].file, r[1].bytes), ("<unknown>", 5));
        let mut out = Vec::new();
        p.print_report(&mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("2 mallocs 300 bytes"));
    }
}
