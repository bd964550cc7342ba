//! A timing probe of the staging pipeline, for finding where a staged transfer's time goes
//! (a benchmark's diagnostic, off by default; it costs one relaxed atomic load per step when
//! off).
//!
//! While [`set_enabled`] is on, every staged transfer records its steps, each with the time
//! since the probe was enabled and the thread that took it (0: the calling thread; `n`:
//! helper thread `n - 1`). [`take`] returns and clears what was recorded.
//!
//! ```
//! use cudars_xfer::staging::probe;
//! probe::set_enabled(true);
//! // ... staged transfers ...
//! probe::set_enabled(false);
//! let steps = probe::take();
//! assert!(steps.is_empty()); // nothing was staged here
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a recorded step is. Pairs (`...Start`, `...End`) bracket one piece of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// The pipeline starts (caller); `index` is the number of units.
    Start,
    /// A helper thread joins the transfer.
    Join,
    /// A thread starts waiting for a slot to be free (to the device) or filled (to the
    /// host); `index` is the unit.
    WaitStart,
    /// The wait is over.
    WaitEnd,
    /// A thread starts copying a unit between host memory and a slot; `index` is the unit.
    CopyStart,
    /// The copy is done; `index` is the unit's bytes.
    CopyEnd,
    /// A thread starts submitting a chunk's DMA and fence; `index` is the chunk.
    SubmitStart,
    /// The submission returned.
    SubmitEnd,
    /// The pipeline is done (caller), every helper has left.
    End,
}

/// One recorded step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Time since the probe was enabled.
    pub at: Duration,
    /// 0 for the calling thread, `n` for helper thread `n - 1`.
    pub thread: usize,
    /// What happened.
    pub kind: StepKind,
    /// The unit, chunk or byte count the step is about (see [`StepKind`]).
    pub index: usize,
}

static ENABLED: AtomicBool = AtomicBool::new(false);

struct Recording {
    since: Instant,
    steps: Vec<Step>,
}

static RECORDING: Mutex<Option<Recording>> = Mutex::new(None);

thread_local! {
    static THREAD: Cell<usize> = const { Cell::new(0) };
}

/// Turns the probe on (clearing what was recorded) or off (keeping it for [`take`]).
pub fn set_enabled(on: bool) {
    let mut rec = RECORDING.lock().unwrap_or_else(PoisonError::into_inner);
    if on {
        *rec = Some(Recording {
            since: Instant::now(),
            steps: Vec::with_capacity(1 << 16),
        });
    }
    ENABLED.store(on, Ordering::SeqCst);
}

/// The steps recorded since the probe was enabled or last taken, in the order recorded.
pub fn take() -> Vec<Step> {
    let mut rec = RECORDING.lock().unwrap_or_else(PoisonError::into_inner);
    match rec.as_mut() {
        Some(r) => std::mem::take(&mut r.steps),
        None => Vec::new(),
    }
}

/// Names the calling thread for the probe (helper `index`).
pub(crate) fn set_helper(index: usize) {
    THREAD.with(|t| t.set(index + 1));
}

/// Records a step when the probe is on.
#[inline]
pub(crate) fn mark(kind: StepKind, index: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let thread = THREAD.with(Cell::get);
    let mut rec = RECORDING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(r) = rec.as_mut() {
        let at = r.since.elapsed();
        r.steps.push(Step {
            at,
            thread,
            kind,
            index,
        });
    }
}
