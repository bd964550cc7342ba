//! The context note: what each thread remembers about its current CUDA context, so that the
//! hot paths need not ask the driver (`cuCtxGetCurrent`, 15-20 ns) before every call. A leaf:
//! it knows nothing of devices, streams or the driver. The calls that read it are
//! `with_context` and `launch_in_context` (stream.rs); every place where
//! this crate pops or replaces a thread's context clears it with [`forget_context`].

thread_local! {
    /// `true` once this thread was seen with a context current, until this crate pops or
    /// replaces it (see `stream::with_context`).
    static CONTEXT_SEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The context this thread was last seen with current by `stream::launch_in_context` (0:
    /// none known), until this crate pops or replaces it ([`forget_context`]).
    static KNOWN_CONTEXT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this thread was seen with a context current. `false` while the thread is being
/// torn down.
#[inline]
pub(crate) fn context_seen() -> bool {
    CONTEXT_SEEN.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// Notes that a context is current on this thread.
#[inline]
pub(crate) fn remember_context() {
    let _ = CONTEXT_SEEN.try_with(|c| c.set(true));
}

/// The context (as an address) last seen current by a launch on this thread, if known.
#[inline]
pub(crate) fn known_context() -> Option<usize> {
    KNOWN_CONTEXT.try_with(std::cell::Cell::get).ok()
}

/// Notes the context (as an address) a launch found current on this thread.
#[inline]
pub(crate) fn note_known_context(context: usize) {
    let _ = KNOWN_CONTEXT.try_with(|c| c.set(context));
}

/// Clears the note: this crate popped or replaced the thread's current context, so the next
/// call asks the driver again.
#[inline]
pub(crate) fn forget_context() {
    let _ = CONTEXT_SEEN.try_with(|c| c.set(false));
    let _ = KNOWN_CONTEXT.try_with(|c| c.set(0));
}
