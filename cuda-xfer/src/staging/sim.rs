//! A simulated copier for the pipeline's CPU tests: "device memory" is a `Vec<u8>`, DMAs run
//! in submission order on a thread of their own after random delays (like a stream), and the
//! simulator records every rule the pipeline breaks:
//! - to the device, a slot submitted again before its previous DMA ran (the host rewrote
//!   bytes a DMA had yet to read), or a slot whose bytes changed between submission and DMA;
//! - to the host, a slot submitted again before its previous DMA ran.
//!
//! To the host, a submission fills the slot with poison at once (a real DMA may land at any
//! moment), so a thread that reads a slot before waiting for its fence reads poison and the
//! data check fails.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::pipeline::{Direction, DmaEngine};
use crate::error::{Error, Result};

const POISON: u8 = 0xEE;

struct Op {
    seq: u64,
    direction: Direction,
    slot: usize,
    host: usize,
    device_offset: usize,
    len: usize,
    checksum: u64,
}

/// One executed DMA, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Logged {
    pub slot: usize,
    pub device_offset: usize,
    pub len: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    next_seq: u64,
    executed: u64,
    /// Sequence number of each slot's last submission.
    last_on_slot: Vec<u64>,
    submits: usize,
    log: Vec<Logged>,
    violations: Vec<String>,
    shutdown: bool,
    /// DMAs do not run while set (see `SimDevice::release_dmas`).
    held: bool,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    memory: Mutex<Vec<u8>>,
    fail_submit: Option<usize>,
    fail_wait_on_slot: Option<usize>,
    /// A failing wait returns at once, with its DMA still queued (as a real failed fence
    /// wait may), instead of after the DMA ran.
    fail_wait_in_flight: bool,
    max_delay_us: u64,
}

pub(crate) struct SimDevice {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The simulated driver error the tests inject.
pub(crate) fn injected() -> Error {
    Error::InvalidConfig("injected failure".into())
}

impl SimDevice {
    /// A device of `size` bytes (filled with `fill`), `slots` fences, DMAs delayed up to
    /// `max_delay_us`.
    pub fn new(size: usize, fill: impl Fn(usize) -> u8, slots: usize, max_delay_us: u64) -> Self {
        Self::with_failures(size, fill, slots, max_delay_us, None, None)
    }

    /// As `new`, failing the `fail_submit`-th submission (0-based) and/or every wait on
    /// slot `fail_wait_on_slot` once something was submitted on it.
    pub fn with_failures(
        size: usize,
        fill: impl Fn(usize) -> u8,
        slots: usize,
        max_delay_us: u64,
        fail_submit: Option<usize>,
        fail_wait_on_slot: Option<usize>,
    ) -> Self {
        Self::build(
            size,
            fill,
            slots,
            max_delay_us,
            fail_submit,
            fail_wait_on_slot,
            false,
        )
    }

    /// As `new`, failing every wait on slot `slot` once something was submitted on it, at
    /// once: the DMA waited for stays in flight. DMAs are held back until `release_dmas`
    /// (or the drop), so a failed transfer returns with them queued. Use one slot: a wait on
    /// another slot would block until the release.
    pub fn with_failed_wait_in_flight(
        size: usize,
        fill: impl Fn(usize) -> u8,
        slots: usize,
        slot: usize,
    ) -> Self {
        Self::build(size, fill, slots, 0, None, Some(slot), true)
    }

    fn build(
        size: usize,
        fill: impl Fn(usize) -> u8,
        slots: usize,
        max_delay_us: u64,
        fail_submit: Option<usize>,
        fail_wait_on_slot: Option<usize>,
        fail_wait_in_flight: bool,
    ) -> Self {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                last_on_slot: vec![0; slots],
                next_seq: 1,
                held: fail_wait_in_flight,
                ..State::default()
            }),
            changed: Condvar::new(),
            memory: Mutex::new((0..size).map(fill).collect()),
            fail_submit,
            fail_wait_on_slot,
            fail_wait_in_flight,
            max_delay_us,
        });
        let for_thread = Arc::clone(&inner);
        let thread = std::thread::spawn(move || device_loop(&for_thread));
        SimDevice {
            inner,
            thread: Some(thread),
        }
    }

    pub fn memory(&self) -> Vec<u8> {
        lock(&self.inner.memory).clone()
    }

    pub fn log(&self) -> Vec<Logged> {
        lock(&self.inner.state).log.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        lock(&self.inner.state).violations.clone()
    }

    /// Submitted DMAs that have not run yet.
    pub fn in_flight(&self) -> usize {
        lock(&self.inner.state).queue.len()
    }

    /// Lets held-back DMAs run (see `with_failed_wait_in_flight`).
    pub fn release_dmas(&self) {
        lock(&self.inner.state).held = false;
        self.inner.changed.notify_all();
    }

    /// Waits until every submitted DMA ran.
    pub fn drain(&self) {
        self.release_dmas();
        let mut state = lock(&self.inner.state);
        while !state.queue.is_empty() {
            state = self
                .inner
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        self.drain();
        lock(&self.inner.state).shutdown = true;
        self.inner.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn device_loop(inner: &Inner) {
    let mut rng = 0x9E3779B97F4A7C15u64 ^ (inner as *const Inner as u64);
    loop {
        let op = {
            let mut state = lock(&inner.state);
            loop {
                if let Some(op) = state.queue.front().filter(|_| !state.held) {
                    break Op { ..*op };
                }
                if state.shutdown {
                    return;
                }
                state = inner
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if inner.max_delay_us > 0 {
            std::thread::sleep(Duration::from_micros(rng % (inner.max_delay_us + 1)));
        }
        let mut violation = None;
        {
            let mut memory = lock(&inner.memory);
            let device = &mut memory[op.device_offset..op.device_offset + op.len];
            // SAFETY: the pipeline's contract keeps the slot bytes alive and untouched until
            // the fence of this op is waited for, which needs this op to have run.
            let host = unsafe { std::slice::from_raw_parts_mut(op.host as *mut u8, op.len) };
            match op.direction {
                Direction::ToDevice => {
                    if checksum(host) != op.checksum {
                        violation = Some(format!(
                            "slot {} changed between submission and DMA (seq {})",
                            op.slot, op.seq
                        ));
                    }
                    device.copy_from_slice(host);
                }
                Direction::ToHost => host.copy_from_slice(device),
            }
        }
        let mut state = lock(&inner.state);
        state.queue.pop_front();
        state.executed = op.seq;
        state.log.push(Logged {
            slot: op.slot,
            device_offset: op.device_offset,
            len: op.len,
        });
        if let Some(v) = violation {
            state.violations.push(v);
        }
        drop(state);
        inner.changed.notify_all();
    }
}

impl DmaEngine for SimDevice {
    unsafe fn submit(
        &self,
        direction: Direction,
        slot: usize,
        slot_memory: *mut u8,
        device_offset: usize,
        len: usize,
    ) -> Result<()> {
        let mut state = lock(&self.inner.state);
        let n = state.submits;
        state.submits += 1;
        if self.inner.fail_submit == Some(n) {
            return Err(injected());
        }
        if state.last_on_slot[slot] > state.executed {
            let v = format!("slot {slot} submitted again before its previous DMA ran");
            state.violations.push(v);
        }
        // SAFETY: the caller's contract: `len` bytes of staging memory, ours until the fence.
        let host = unsafe { std::slice::from_raw_parts_mut(slot_memory, len) };
        let sum = match direction {
            Direction::ToDevice => checksum(host),
            Direction::ToHost => {
                host.fill(POISON);
                0
            }
        };
        let seq = state.next_seq;
        state.next_seq += 1;
        state.last_on_slot[slot] = seq;
        state.queue.push_back(Op {
            seq,
            direction,
            slot,
            host: slot_memory as usize,
            device_offset,
            len,
            checksum: sum,
        });
        drop(state);
        self.inner.changed.notify_all();
        Ok(())
    }

    fn wait(&self, slot: usize) -> Result<()> {
        let mut state = lock(&self.inner.state);
        let target = state.last_on_slot[slot];
        if self.inner.fail_wait_on_slot == Some(slot) && target > 0 {
            if self.inner.fail_wait_in_flight {
                return Err(injected());
            }
            // Fail, but only after the DMA ran: a failed wait must not leave it in flight in
            // this model (the real driver's failed sync means the context is gone).
            while state.executed < target {
                state = self
                    .inner
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            return Err(injected());
        }
        while state.executed < target {
            state = self
                .inner
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        Ok(())
    }
}
