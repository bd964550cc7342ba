//! The staged-copy pipeline, generic over the engine that moves a chunk between a staging slot
//! and the device, so the same code runs against the driver and against a simulated copier.
//!
//! Host to device, unit `(k, p)` of chunk `k` in slot `s`, round `r`:
//! 1. if `r > 0`: wait until chunk `k - slots` was submitted, then for its DMA to finish
//!    (the slot is free again);
//! 2. copy part `p` of the source into the slot;
//! 3. the thread that copies the last part of chunk `k` marks the chunk *ready* to submit.
//!
//! Device to host: chunks `0 .. slots` are ready from the start. Unit `(k, p)`:
//! 1. wait until chunk `k` was submitted, then for its DMA to finish;
//! 2. copy part `p` from the slot into the destination;
//! 3. the thread that copies the last part of chunk `k` out marks chunk `k + slots` ready
//!    (its slot is free now).
//!
//! Ready chunks are submitted (the DMA, then the slot's fence) strictly in chunk order, by
//! one thread at a time: whoever marks a chunk ready, or waits for a submission, tries to
//! take the submitter's role (never blocking on it) and submits every ready chunk in order.
//! So the DMAs queue in order, and copying threads never queue up on the driver's locks:
//! the probe of bench_xfer showed submissions from many threads at once taking 20-35 us
//! each (against 3 us from one thread), which left the copy engine idle.
//!
//! A slot's fence is never re-armed while a thread may still wait on its previous value: the
//! next submission on a slot happens only after every unit of the previous chunk on it is done.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::copy;
use super::plan::Plan;
use super::pool::{self, Backoff};
use super::probe::{self, StepKind};
use crate::error::{Error, Result};

/// Which way a staged transfer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Host memory to the device, through the slots.
    ToDevice,
    /// The device to host memory, through the slots.
    ToHost,
}

/// Moves one chunk between a staging slot and the device, in submission order per engine,
/// and lets threads wait for a slot's last movement.
pub(crate) trait DmaEngine: Sync {
    /// Queues the copy of `len` bytes between the slot memory at `slot_memory` and the
    /// device at byte `device_offset` of the transfer, then re-arms the fence of `slot`.
    ///
    /// # Safety
    ///
    /// `slot_memory` points to `len` bytes of staging memory that nobody else reads or writes
    /// until [`DmaEngine::wait`] for `slot` has returned after this submission.
    unsafe fn submit(
        &self,
        direction: Direction,
        slot: usize,
        slot_memory: *mut u8,
        device_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Blocks until the last copy submitted on `slot` is complete (at once if none was).
    fn wait(&self, slot: usize) -> Result<()>;
}

/// A staged transfer that failed: its first error, and whether a DMA was issued on any slot
/// (the submission attempted counts, even if it then failed). After a failure the slots are
/// waited for, but a failed wait proves nothing, so once a DMA was issued the slots' memory
/// must never be reused ([`Lease::settle`](super::lease::Lease::settle) leaks it).
#[derive(Debug)]
pub(crate) struct Failed {
    /// The first error met.
    pub error: Error,
    /// Whether a DMA was (or may have been) issued on a slot.
    pub dma_issued: bool,
}

/// A staging slot's memory (`Plan::chunk_bytes` bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotMemory(pub *mut u8);

// SAFETY: a plain address; who may touch the bytes and when is the pipeline's protocol.
unsafe impl Send for SlotMemory {}
// SAFETY: as above.
unsafe impl Sync for SlotMemory {}

/// The host side of a transfer: the source (to the device) or the destination (to the host).
#[derive(Debug, Clone, Copy)]
struct HostMemory(*mut u8);

// SAFETY: as for `SlotMemory`; disjoint units touch disjoint bytes.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

struct Pipeline<'a, E: DmaEngine> {
    engine: &'a E,
    direction: Direction,
    plan: &'a Plan,
    slots: &'a [SlotMemory],
    host: HostMemory,
    /// Host copies with streaming stores (see [`copy`]).
    streaming: bool,
    next_unit: AtomicUsize,
    /// Units of each chunk not yet done.
    remaining: Box<[AtomicUsize]>,
    /// Submissions made on each slot so far.
    submitted: Box<[AtomicUsize]>,
    /// Submissions on each slot whose DMA is known to be complete.
    completed: Box<[AtomicUsize]>,
    /// Whether a thread is waiting on each slot's fence.
    waiting: Box<[AtomicBool]>,
    /// Whether each chunk may be submitted (filled, or its slot free).
    ready: Box<[AtomicBool]>,
    /// The next chunk to submit (chunks are submitted in order).
    next_submit: AtomicUsize,
    /// Held by the thread in the submitter's role.
    submitting: AtomicBool,
    /// Set before the first submission is attempted.
    dma_issued: AtomicBool,
    abort: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl<E: DmaEngine> Pipeline<'_, E> {
    fn fail(&self, error: Error) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(error);
        }
        self.abort.store(true, Ordering::Release);
    }

    /// Claims and runs units until none is left or the transfer is abandoned. Never panics.
    fn work(&self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| loop {
            if self.abort.load(Ordering::Acquire) {
                return Ok(());
            }
            let u = self.next_unit.fetch_add(1, Ordering::Relaxed);
            if u >= self.plan.units() {
                return Ok(());
            }
            self.run_unit(u)?;
        }));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(e),
            Err(panic) => self.fail(Error::WorkerPanicked(panic_message(&*panic))),
        }
    }

    /// Waits until the DMA of the `count`-th submission on `slot` is complete; `Ok(false)`
    /// when the transfer was abandoned meanwhile.
    ///
    /// One thread per slot waits on the engine's fence; the others watch `completed`, so a
    /// chunk costs one fence wait however many threads share it. The submission waited for
    /// is always the slot's latest: the next one needs every unit of this round done,
    /// the waiting thread's own included.
    fn wait_done(&self, slot: usize, count: usize) -> Result<bool> {
        let mut backoff = Backoff::new();
        loop {
            if self.completed[slot].load(Ordering::Acquire) >= count {
                return Ok(true);
            }
            if self.abort.load(Ordering::Acquire) {
                return Ok(false);
            }
            if self.submitted[slot].load(Ordering::Acquire) < count {
                // The submission may be ready with nobody in the submitter's role.
                self.pump()?;
            }
            if self.submitted[slot].load(Ordering::Acquire) >= count
                && self.waiting[slot]
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let waited = if self.completed[slot].load(Ordering::Acquire) >= count {
                    Ok(())
                } else {
                    self.engine.wait(slot)
                };
                if waited.is_ok() {
                    self.completed[slot].fetch_max(count, Ordering::AcqRel);
                }
                self.waiting[slot].store(false, Ordering::Release);
                waited?;
                return Ok(true);
            }
            backoff.wait();
        }
    }

    /// # Safety (internal)
    /// Units touch disjoint host bytes; slot bytes are touched only in the window the
    /// protocol of the module docs gives them.
    fn run_unit(&self, u: usize) -> Result<()> {
        let unit = self.plan.unit(u);
        let slot = self.slots[unit.slot].0;
        let len = unit.range.len();
        match self.direction {
            Direction::ToDevice => {
                if unit.round > 0 {
                    probe::mark(StepKind::WaitStart, u);
                    let go_on = self.wait_done(unit.slot, unit.round)?;
                    probe::mark(StepKind::WaitEnd, u);
                    if !go_on {
                        return Ok(());
                    }
                }
                probe::mark(StepKind::CopyStart, u);
                // SAFETY: the source holds `plan.total()` bytes (`run`'s contract) and the
                // range lies inside it; the slot's previous DMA is complete and no other unit
                // writes these slot bytes; the regions cannot overlap (staging is ours).
                unsafe {
                    copy::copy(
                        slot.add(unit.slot_offset),
                        self.host.0.add(unit.range.start),
                        len,
                        self.streaming,
                    );
                }
                probe::mark(StepKind::CopyEnd, len);
                if self.remaining[unit.chunk].fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.mark_ready(unit.chunk)?;
                }
            }
            Direction::ToHost => {
                probe::mark(StepKind::WaitStart, u);
                let go_on = self.wait_done(unit.slot, unit.round + 1)?;
                probe::mark(StepKind::WaitEnd, u);
                if !go_on {
                    return Ok(());
                }
                probe::mark(StepKind::CopyStart, u);
                // SAFETY: the chunk's DMA into the slot is complete and the slot is not
                // re-armed before this unit is done; the destination range is ours alone.
                unsafe {
                    copy::copy(
                        self.host.0.add(unit.range.start),
                        slot.add(unit.slot_offset),
                        len,
                        self.streaming,
                    );
                }
                probe::mark(StepKind::CopyEnd, len);
                if self.remaining[unit.chunk].fetch_sub(1, Ordering::AcqRel) == 1 {
                    let next = unit.chunk + self.plan.slots();
                    if next < self.plan.chunks() {
                        self.mark_ready(next)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks chunk `k` ready to submit, then submits what is ready, if no other thread is.
    fn mark_ready(&self, k: usize) -> Result<()> {
        self.ready[k].store(true, Ordering::SeqCst);
        self.pump()
    }

    /// Takes the submitter's role if it is free and submits every ready chunk in order;
    /// returns at once if another thread has the role. Whoever drops the role looks again
    /// after dropping it (`SeqCst` on both sides), so a chunk made ready meanwhile by a
    /// thread that found the role taken is never left behind.
    fn pump(&self) -> Result<()> {
        self.pump_upto(usize::MAX)
    }

    /// [`Pipeline::pump`], submitting no chunk from `limit` on.
    fn pump_upto(&self, limit: usize) -> Result<()> {
        let limit = limit.min(self.plan.chunks());
        loop {
            if self
                .submitting
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return Ok(());
            }
            let mut result = Ok(());
            loop {
                let k = self.next_submit.load(Ordering::SeqCst);
                if k >= limit
                    || !self.ready[k].load(Ordering::SeqCst)
                    || self.abort.load(Ordering::Acquire)
                {
                    break;
                }
                result = self.submit(k);
                if result.is_err() {
                    break;
                }
                self.next_submit.store(k + 1, Ordering::SeqCst);
            }
            self.submitting.store(false, Ordering::SeqCst);
            result?;
            let k = self.next_submit.load(Ordering::SeqCst);
            if k >= limit
                || !self.ready[k].load(Ordering::SeqCst)
                || self.abort.load(Ordering::Acquire)
            {
                return Ok(());
            }
        }
    }

    /// Submits chunk `k` on its slot and publishes the submission.
    fn submit(&self, k: usize) -> Result<()> {
        let range = self.plan.chunk_range(k);
        let slot = self.plan.slot_of(k);
        // Before the call: a submission that fails part-way may still have queued the copy.
        self.dma_issued.store(true, Ordering::Release);
        probe::mark(StepKind::SubmitStart, k);
        // SAFETY: to the device, every part of chunk `k` is in the slot and nobody touches the
        // slot until its fence is waited for (the next round's units wait for it); to the
        // host, every reader of the previous chunk in the slot is done.
        unsafe {
            self.engine.submit(
                self.direction,
                slot,
                self.slots[slot].0,
                range.start,
                range.len(),
            )
        }?;
        probe::mark(StepKind::SubmitEnd, k);
        self.submitted[slot].fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// How one staged transfer runs, besides its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// Most helper threads besides the calling thread.
    pub helpers: usize,
    /// Host copies with streaming stores (see [`copy`]).
    pub streaming: bool,
    /// To the host: how many of the chunks ready from the start the calling thread submits
    /// before it calls the helpers (the threads waiting for the others submit them).
    pub early_submits: usize,
}

impl Tuning {
    /// `helpers` helpers, ordinary copies, every ready chunk submitted before the helpers
    /// are called.
    #[cfg(test)]
    pub fn new(helpers: usize) -> Tuning {
        Tuning {
            helpers,
            streaming: false,
            early_submits: usize::MAX,
        }
    }
}

/// Runs a staged transfer of `plan.total()` bytes between `host` and the device through
/// `slots`, on the calling thread and up to `tuning.helpers` helper threads.
///
/// On success, to the host: every byte is in `host`, every DMA is done. To the device: every
/// chunk has been copied into a slot and submitted; the last DMAs may still be running (wait
/// for every slot, or for a later fence on the same queue, before reusing the slots).
/// On failure, every slot has been waited for and the first error is returned, with whether
/// a DMA was issued: the waits themselves may have failed, so the slots may still be the
/// target of a DMA and their memory must never be reused then (see [`Failed`]). The host
/// memory is never touched by a DMA, and no helper thread touches it after the return.
///
/// # Safety
///
/// `host` is valid for `plan.total()` bytes of reads (to the device) or writes (to the host)
/// and untouched by anyone else during the call; each slot is valid for
/// `plan.chunk_bytes()` bytes, used by nobody else until the slots are idle again, and
/// overlaps neither `host` nor another slot; `slots.len() == plan.slots()`.
pub(crate) unsafe fn run<E: DmaEngine>(
    engine: &E,
    direction: Direction,
    host: *mut u8,
    plan: &Plan,
    slots: &[SlotMemory],
    tuning: Tuning,
) -> std::result::Result<(), Failed> {
    if slots.len() != plan.slots() {
        return Err(Failed {
            error: Error::InvalidConfig(format!(
                "{} slots given for a plan of {}",
                slots.len(),
                plan.slots()
            )),
            dma_issued: false,
        });
    }
    if plan.total() == 0 {
        return Ok(());
    }
    let pipeline = Pipeline {
        engine,
        direction,
        plan,
        slots,
        host: HostMemory(host),
        streaming: tuning.streaming,
        next_unit: AtomicUsize::new(0),
        remaining: (0..plan.chunks())
            .map(|k| AtomicUsize::new(plan.parts_of(k)))
            .collect(),
        submitted: (0..plan.slots()).map(|_| AtomicUsize::new(0)).collect(),
        completed: (0..plan.slots()).map(|_| AtomicUsize::new(0)).collect(),
        waiting: (0..plan.slots()).map(|_| AtomicBool::new(false)).collect(),
        ready: (0..plan.chunks())
            .map(|k| AtomicBool::new(direction == Direction::ToHost && k < plan.slots()))
            .collect(),
        next_submit: AtomicUsize::new(0),
        submitting: AtomicBool::new(false),
        dma_issued: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    probe::mark(StepKind::Start, plan.units());
    if direction == Direction::ToHost {
        // The first round's DMAs (up to `early_submits` of them), before any helper starts.
        if let Err(e) = pipeline.pump_upto(tuning.early_submits) {
            pipeline.fail(e);
        }
    }
    // Not worth waking more helpers than there are units besides the caller's.
    let helpers = tuning.helpers.min(plan.units().saturating_sub(1));
    pool::run(helpers, &|| pipeline.work());
    probe::mark(StepKind::End, 0);
    let error = pipeline
        .error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    match error {
        None => Ok(()),
        Some(error) => {
            // Try to leave the slots idle. A failed wait here does not change the outcome:
            // once a DMA was issued the caller never reuses the slots (see `Failed`).
            for slot in 0..plan.slots() {
                let _ = engine.wait(slot);
            }
            Err(Failed {
                error,
                dma_issued: pipeline.dma_issued.load(Ordering::Acquire),
            })
        }
    }
}

/// Waits for the last DMA of every slot.
#[cfg(test)]
pub(crate) fn wait_all<E: DmaEngine>(engine: &E, slots: usize) -> Result<()> {
    let mut first = Ok(());
    for slot in 0..slots {
        let r = engine.wait(slot);
        if first.is_ok() {
            first = r;
        }
    }
    first
}
