//! Pinned staging for pageable host memory.
//!
//! The driver copies pageable memory (a `Vec`, a `Box<[T]>`) through a small internal bounce
//! buffer, one thread, at 6-10 GB/s on an H200, against about 55 GB/s for page-locked memory.
//! `cuda-xfer` routes large pageable transfers through its own pipeline instead: a few
//! page-locked *slots* of [`StagingConfig::chunk_bytes`] each, filled (to the device) or
//! drained (to the host) by the calling thread and up to [`StagingConfig::helpers`] helper
//! threads, while the DMA of the previous chunk runs. One core copies memory at 10-20 GB/s,
//! so several threads share each chunk, in parts of [`StagingConfig::part_bytes`].
//!
//! Transfers below [`StagingConfig::min_staged_bytes`], and transfers from or to pinned,
//! registered or managed memory, go straight to the driver.
//!
//! Chunks are submitted in order by one thread at a time. A transfer whose chunks are smaller
//! than a slot packs several into each (a ring of up to 64 positions, one fence each), so a
//! mid-sized transfer never waits for a slot to come free; mid-sized transfers also copy in
//! smaller parts with fewer helpers ([`MID_PART_BYTES`], [`MID_HELPERS`]). On x86_64 the
//! copies into the slots use streaming stores ([`StagingConfig::streaming_to_device`]), so
//! that the copy engine reads the slots from memory, not from the copying cores' caches,
//! which had halved its speed while the copies ran. [`probe`] records
//! where a transfer's time goes (for benchmarks).
//!
//! The slots and their events are cached per device and reused; [`release_cached`] frees
//! them. Helper threads are started on first use and live as long as the process.
//!
//! ```
//! use cudars_xfer::staging::{self, StagingConfig};
//! let previous = staging::set_config(StagingConfig { helpers: 3, ..staging::config() })?;
//! assert_eq!(staging::config().helpers, 3);
//! staging::set_config(previous)?;
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

pub(crate) mod copy;
pub(crate) mod lease;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub(crate) mod pool;
pub mod probe;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::{Device, Event, Stream};

use crate::error::{Error, Result};
use pipeline::{Direction, DmaEngine, SlotMemory, Tuning};
use plan::Plan;

/// How large pageable transfers are staged. Read with [`config`], change with [`set_config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes of one staging slot, and of one DMA (default 8 MiB).
    pub chunk_bytes: usize,
    /// Number of slots: how many chunks can be in flight at once (default 4).
    pub slots: usize,
    /// Bytes one thread copies at a time (default 512 KiB; transfers below
    /// `chunk_bytes * min_chunks` use at most [`MID_PART_BYTES`]).
    pub part_bytes: usize,
    /// Pageable transfers smaller than this go straight to the driver (default 1 MiB).
    pub min_staged_bytes: usize,
    /// Most helper threads one transfer uses besides the calling thread (default: one less
    /// than the available cores, at most 11; transfers below `chunk_bytes * min_chunks` use
    /// at most [`MID_HELPERS`]).
    pub helpers: usize,
    /// A staged transfer is cut into at least this many chunks when that makes them smaller
    /// than `chunk_bytes` (down to `part_bytes`), so that mid-sized transfers fill and drain
    /// the pipeline faster; 1 always uses `chunk_bytes` (default 4: with streaming copies,
    /// bench_xfer on the H200 gave 16 MiB to the device 42-43 GB/s against 40-41.5 with 8,
    /// and 4 MiB 33-35 against 32-33).
    pub min_chunks: usize,
    /// How long an idle helper thread keeps watching for the next transfer (spinning and
    /// yielding its core) before it sleeps, in microseconds (default 1000). Transfers that
    /// follow each other closer than this find their helpers awake; a sleeping helper takes
    /// tens of microseconds to wake. Applies to every helper of the process.
    pub helper_linger_us: u64,
    /// Host copies into the slots use streaming (non-temporal) stores, on x86_64: the
    /// copy engine then reads the staged bytes from memory rather than out of the copying
    /// cores' caches (default true). On the H200 (bench_xfer's mid-size probe) this took
    /// the copy engine from about 20 GB/s to over 40 GB/s while the host copies run, and
    /// each thread's copy rate from 6-7 to 13-15 GB/s: 4 MiB to the device 18.5 -> 30-33
    /// GB/s, 16 MiB 26 -> 40-42.
    pub streaming_to_device: bool,
    /// Host copies out of the slots into the destination use streaming stores, on x86_64:
    /// the destination's lines are not read before they are overwritten, and do not stay
    /// in the cache (default false: on the H200, 16 MiB to the host fell from about 43 to
    /// 32-39 GB/s with them).
    pub streaming_to_host: bool,
    /// To the host: how many chunks the calling thread queues before it calls the helper
    /// threads; the threads that wait for the other chunks queue them (default
    /// `usize::MAX`: every chunk that has a free slot. With 1, the helpers join sooner, but
    /// the queueing then competes with their copies: on the H200, 4 MiB to the host went
    /// from 20 to 18 GB/s).
    pub early_submits: usize,
}

impl Default for StagingConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        StagingConfig {
            chunk_bytes: 8 << 20,
            slots: 4,
            part_bytes: 512 << 10,
            min_staged_bytes: 1 << 20,
            helpers: cores.saturating_sub(1).min(11),
            min_chunks: 4,
            helper_linger_us: 1000,
            streaming_to_device: true,
            streaming_to_host: false,
            early_submits: usize::MAX,
        }
    }
}

impl StagingConfig {
    /// Checks the configuration ([`Error::InvalidConfig`] for zero chunks, slots or parts,
    /// more than 64 slots, or more helpers than the pool can start).
    pub fn validate(&self) -> Result<()> {
        if self.chunk_bytes == 0 || self.slots == 0 || self.part_bytes == 0 {
            return Err(Error::InvalidConfig(format!(
                "chunk_bytes ({}), slots ({}) and part_bytes ({}) must be non-zero",
                self.chunk_bytes, self.slots, self.part_bytes
            )));
        }
        if self.min_chunks == 0 {
            return Err(Error::InvalidConfig("min_chunks must be at least 1".into()));
        }
        if self.slots > 64 {
            return Err(Error::InvalidConfig(format!(
                "{} slots: at most 64",
                self.slots
            )));
        }
        if self.helpers > pool::MAX_HELPERS {
            return Err(Error::InvalidConfig(format!(
                "{} helpers: at most {}",
                self.helpers,
                pool::MAX_HELPERS
            )));
        }
        Ok(())
    }
}

/// The process-wide configuration, one atomic per field so that every transfer can read it
/// without a lock. A read racing with [`set_config`] may mix old and new fields; every mix of
/// two valid configurations is valid.
struct SharedConfig {
    chunk_bytes: AtomicUsize,
    slots: AtomicUsize,
    part_bytes: AtomicUsize,
    min_staged_bytes: AtomicUsize,
    helpers: AtomicUsize,
    min_chunks: AtomicUsize,
    helper_linger_us: AtomicU64,
    streaming_to_device: AtomicBool,
    streaming_to_host: AtomicBool,
    early_submits: AtomicUsize,
    writer: Mutex<()>,
}

fn shared_config() -> &'static SharedConfig {
    static CONFIG: OnceLock<SharedConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let c = StagingConfig::default();
        SharedConfig {
            chunk_bytes: AtomicUsize::new(c.chunk_bytes),
            slots: AtomicUsize::new(c.slots),
            part_bytes: AtomicUsize::new(c.part_bytes),
            min_staged_bytes: AtomicUsize::new(c.min_staged_bytes),
            helpers: AtomicUsize::new(c.helpers),
            min_chunks: AtomicUsize::new(c.min_chunks),
            helper_linger_us: AtomicU64::new(c.helper_linger_us),
            streaming_to_device: AtomicBool::new(c.streaming_to_device),
            streaming_to_host: AtomicBool::new(c.streaming_to_host),
            early_submits: AtomicUsize::new(c.early_submits),
            writer: Mutex::new(()),
        }
    })
}

/// The process-wide staging configuration.
pub fn config() -> StagingConfig {
    let c = shared_config();
    StagingConfig {
        chunk_bytes: c.chunk_bytes.load(Ordering::Relaxed),
        slots: c.slots.load(Ordering::Relaxed),
        part_bytes: c.part_bytes.load(Ordering::Relaxed),
        min_staged_bytes: c.min_staged_bytes.load(Ordering::Relaxed),
        helpers: c.helpers.load(Ordering::Relaxed),
        min_chunks: c.min_chunks.load(Ordering::Relaxed),
        helper_linger_us: c.helper_linger_us.load(Ordering::Relaxed),
        streaming_to_device: c.streaming_to_device.load(Ordering::Relaxed),
        streaming_to_host: c.streaming_to_host.load(Ordering::Relaxed),
        early_submits: c.early_submits.load(Ordering::Relaxed),
    }
}

/// Replaces the process-wide staging configuration and returns the previous one. An invalid
/// configuration is rejected and changes nothing. Transfers already running keep theirs.
pub fn set_config(config: StagingConfig) -> Result<StagingConfig> {
    config.validate()?;
    let c = shared_config();
    let _writer = c.writer.lock().unwrap_or_else(PoisonError::into_inner);
    let previous = self::config();
    c.chunk_bytes.store(config.chunk_bytes, Ordering::Relaxed);
    c.slots.store(config.slots, Ordering::Relaxed);
    c.part_bytes.store(config.part_bytes, Ordering::Relaxed);
    c.min_staged_bytes
        .store(config.min_staged_bytes, Ordering::Relaxed);
    c.helpers.store(config.helpers, Ordering::Relaxed);
    c.min_chunks.store(config.min_chunks, Ordering::Relaxed);
    c.helper_linger_us
        .store(config.helper_linger_us, Ordering::Relaxed);
    c.streaming_to_device
        .store(config.streaming_to_device, Ordering::Relaxed);
    c.streaming_to_host
        .store(config.streaming_to_host, Ordering::Relaxed);
    c.early_submits
        .store(config.early_submits, Ordering::Relaxed);
    pool::set_linger_us(config.helper_linger_us);
    Ok(previous)
}

/// Counts of host <-> device transfers by route, since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteStats {
    /// Transfers copied by one driver call (pinned, registered, managed, or small).
    pub direct: u64,
    /// Bytes of those.
    pub direct_bytes: u64,
    /// Transfers that went through the staging pipeline.
    pub staged: u64,
    /// Bytes of those.
    pub staged_bytes: u64,
}

static DIRECT: AtomicU64 = AtomicU64::new(0);
static DIRECT_BYTES: AtomicU64 = AtomicU64::new(0);
static STAGED: AtomicU64 = AtomicU64::new(0);
static STAGED_BYTES: AtomicU64 = AtomicU64::new(0);

/// How many host <-> device transfers took each route so far (zero-byte transfers are not
/// counted). For diagnostics: "is my buffer really copied directly?"
pub fn route_stats() -> RouteStats {
    RouteStats {
        direct: DIRECT.load(Ordering::Relaxed),
        direct_bytes: DIRECT_BYTES.load(Ordering::Relaxed),
        staged: STAGED.load(Ordering::Relaxed),
        staged_bytes: STAGED_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts one transfer of `bytes` on its route.
pub(crate) fn count_route(staged: bool, bytes: usize) {
    let (n, b) = if staged {
        (&STAGED, &STAGED_BYTES)
    } else {
        (&DIRECT, &DIRECT_BYTES)
    };
    n.fetch_add(1, Ordering::Relaxed);
    b.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Page-locked slots and their fences, for one device.
pub(crate) struct Staging {
    device: Device,
    chunk: usize,
    slots: Vec<PinnedMemory>,
    /// One fence per ring position (see `lay_out`).
    events: Vec<Event>,
    /// Ring positions the latest transfer used (their fences cover all its DMAs).
    used: usize,
}

/// Most idle staging sets kept for reuse (each is `slots * chunk_bytes` of pinned memory).
const MAX_CACHED: usize = 4;

/// The idle staging sets of every device.
static CACHE: lease::Cache<Staging> = lease::Cache::new(MAX_CACHED);

/// A staging set checked out for one transfer (see [`lease::Lease`]): back to the cache on
/// drop, leaked instead after a failure once a DMA was issued on it.
pub(crate) type Lease = lease::Lease<'static, Staging>;

/// Frees every cached (idle) staging buffer. Staging buffers in use by a transfer are freed
/// when it completes. Staging buffers of a transfer that failed after issuing a DMA are
/// leaked, never freed nor reused (a DMA may still target them). Returns the number of
/// pinned bytes released.
pub fn release_cached() -> usize {
    let released: Vec<Staging> = CACHE.take_all();
    released
        .iter()
        .map(|s| s.slots.len() * s.chunk)
        .sum::<usize>()
}

/// Allocates the staging buffers a transfer on `device` will use with the current
/// configuration, so that the first staged transfer does not pay for it.
pub fn prepare(device: &Device) -> Result<()> {
    let cfg = config();
    let lease = checkout(device, &cfg)?;
    drop(lease);
    Ok(())
}

/// Leases a cached staging set of `device` that matches `cfg`, or allocates one.
fn checkout(device: &Device, cfg: &StagingConfig) -> Result<Lease> {
    CACHE.checkout(
        |s| s.device == *device && s.chunk == cfg.chunk_bytes && s.slots.len() == cfg.slots,
        || {
            let mut slots = Vec::with_capacity(cfg.slots);
            let mut events = Vec::with_capacity(cfg.slots);
            for _ in 0..cfg.slots {
                slots.push(PinnedMemory::new(
                    device,
                    cfg.chunk_bytes,
                    PinnedFlags::PORTABLE,
                )?);
                events.push(fence_event(device)?);
            }
            Ok(Staging {
                device: *device,
                chunk: cfg.chunk_bytes,
                slots,
                used: events.len(),
                events,
            })
        },
    )
}

/// Moves chunks between the slots and `device_mem` on `stream`, one event per slot.
struct DriverEngine<'a> {
    device_mem: &'a DevicePtr,
    stream: &'a Stream,
    events: &'a [Event],
}

impl DmaEngine for DriverEngine<'_> {
    unsafe fn submit(
        &self,
        direction: Direction,
        slot: usize,
        slot_memory: *mut u8,
        device_offset: usize,
        len: usize,
    ) -> Result<()> {
        let end = crate::elements::end_of(device_offset, len)?;
        let view = self.device_mem.slice(device_offset..end)?;
        match direction {
            Direction::ToDevice => {
                // SAFETY: the slot holds `len` bytes that nobody touches until the slot's
                // event (recorded next, after the copy) has completed (`submit`'s contract).
                unsafe {
                    let src = std::slice::from_raw_parts(slot_memory, len);
                    view.copy_from_host_async(src, self.stream)
                }?;
            }
            Direction::ToHost => {
                // SAFETY: as above: the slot is ours until its event completes.
                unsafe {
                    let dst = std::slice::from_raw_parts_mut(slot_memory, len);
                    view.copy_to_host_async(dst, self.stream)
                }?;
            }
        }
        self.events[slot].record(self.stream)?;
        Ok(())
    }

    fn wait(&self, slot: usize) -> Result<()> {
        Ok(self.events[slot].synchronize()?)
    }
}

/// Copies `len` bytes at `src` into `dst` through the staging pipeline, ordered on `stream`.
/// Returns once every byte of `src` has been read; the last DMAs may still run: the returned
/// lease must be kept until work recorded on `stream` after this call has completed, and
/// [leaked](lease::Lease::leak) if waiting for that work fails. On error, the staging set
/// was leaked if a DMA had been issued on it.
///
/// # Safety
///
/// `src` is valid for reads of `dst.len()` bytes during the call.
pub(crate) unsafe fn to_device(
    src: *const u8,
    dst: &DevicePtr,
    stream: &Stream,
    cfg: &StagingConfig,
) -> Result<Lease> {
    let mut lease = checkout(&dst.device(), cfg)?;
    let Some(staging) = lease.set_mut() else {
        return Err(Error::InvalidConfig("staging lease without buffers".into()));
    };
    let (plan, slots, mut tuning) = lay_out(staging, dst.len(), cfg)?;
    tuning.streaming = cfg.streaming_to_device;
    let engine = DriverEngine {
        device_mem: dst,
        stream,
        events: &staging.events,
    };
    // SAFETY: `src` is readable for `plan.total()` bytes (our contract); the slots are this
    // lease's pinned buffers of `chunk_bytes` each, used by nobody else until the lease drops
    // (or never again, when `settle` leaks them).
    let outcome = unsafe {
        pipeline::run(
            &engine,
            Direction::ToDevice,
            src as *mut u8,
            &plan,
            &slots,
            tuning,
        )
    };
    lease.settle(outcome)
}

/// Waits for the last DMA of each slot of `lease` (the end of a staged copy to the device),
/// then returns the lease to the cache; if a wait fails, leaks it instead (a DMA may still
/// read the slots).
pub(crate) fn finish(lease: Lease) -> Result<()> {
    let waited = match lease.set() {
        Some(staging) => staging.events[..staging.used.min(staging.events.len())]
            .iter()
            .try_for_each(Event::synchronize),
        None => Ok(()),
    };
    match waited {
        Ok(()) => Ok(()),
        Err(e) => {
            lease.leak();
            Err(e.into())
        }
    }
}

/// Copies `src` into `len = src.len()` bytes at `dst` through the staging pipeline, ordered
/// on `stream`. Complete when it returns. On error, the staging set was leaked if a DMA had
/// been issued on it.
///
/// # Safety
///
/// `dst` is valid for writes of `src.len()` bytes (it need not be initialised) and nobody
/// else touches it during the call.
pub(crate) unsafe fn to_host(
    src: &DevicePtr,
    dst: *mut u8,
    stream: &Stream,
    cfg: &StagingConfig,
) -> Result<()> {
    let mut lease = checkout(&src.device(), cfg)?;
    let Some(staging) = lease.set_mut() else {
        return Err(Error::InvalidConfig("staging lease without buffers".into()));
    };
    let (plan, slots, mut tuning) = lay_out(staging, src.len(), cfg)?;
    tuning.streaming = cfg.streaming_to_host;
    let engine = DriverEngine {
        device_mem: src,
        stream,
        events: &staging.events,
    };
    // SAFETY: `dst` is writable for `plan.total()` bytes (our contract); the slots are ours.
    // On success every DMA has completed; on failure `settle` leaks the slots if a DMA was
    // issued (its wait may have failed), so no DMA can reach reused memory.
    let outcome = unsafe { pipeline::run(&engine, Direction::ToHost, dst, &plan, &slots, tuning) };
    lease.settle(outcome).map(drop)
}

/// Granularity of chunk sizes chosen by [`chunk_for`].
const CHUNK_GRAIN: usize = 64 << 10;

/// The chunk size for a transfer of `total` bytes: `chunk_bytes`, or less so that there are
/// at least `min_chunks` chunks, in whole 64 KiB, never below the part size [`cut_for`]
/// picks (nor above the slot size).
#[cfg(test)]
pub(crate) fn chunk_for(total: usize, cfg: &StagingConfig) -> usize {
    cut_for(total, cfg).chunk
}

/// Host-copy parts of a mid-sized transfer (one whose chunks the cut makes smaller than
/// `chunk_bytes`, below `chunk_bytes * min_chunks`: 32 MiB by default): at most this many
/// bytes. Smaller parts start the first DMA sooner and share the last chunks among more
/// threads. bench_xfer's sweep on the H200 (16 cores), 4 MiB / 16 MiB to the device, 7
/// helpers, before streaming copies: 512 KiB parts 17.4 / 29.5 GB/s, 256 KiB 18.6 / 31.1, 128 KiB 19.9 / 32.3.
pub const MID_PART_BYTES: usize = 128 << 10;

/// Most helper threads a mid-sized transfer uses: with more, the host copies crowd the
/// memory bus that the copy engine reads from, and the transfer gets slower. The same
/// sweep (before streaming copies), 16 MiB to the device / to the host, 128 KiB parts: 7 helpers 32.3 / 39.6 GB/s, 15
/// helpers 27.0 / 35.4 (large transfers gain from more: 64 MiB to the device, 11 helpers
/// 43.0 GB/s, 7 helpers 38.1).
pub const MID_HELPERS: usize = 7;

/// How one transfer is cut: chunk and part sizes, and how many helpers it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Bytes of one chunk (one DMA).
    pub chunk: usize,
    /// Bytes of one part (one host copy).
    pub part: usize,
    /// Most helper threads.
    pub helpers: usize,
}

/// The cut of a `total`-byte transfer under `cfg`: full chunks, `part_bytes` parts and
/// `helpers` helpers for large transfers; for mid-sized ones (fewer than `min_chunks` full
/// chunks), chunks of `total / min_chunks` (in whole 64 KiB), parts of at most
/// [`MID_PART_BYTES`] and at most [`MID_HELPERS`] helpers.
pub(crate) fn cut_for(total: usize, cfg: &StagingConfig) -> Cut {
    let want = total
        .div_ceil(cfg.min_chunks.max(1))
        .div_ceil(CHUNK_GRAIN)
        .saturating_mul(CHUNK_GRAIN);
    let mid = want < cfg.chunk_bytes;
    let part = if mid {
        cfg.part_bytes.min(MID_PART_BYTES)
    } else {
        cfg.part_bytes
    }
    .max(1);
    Cut {
        chunk: want.max(part).min(cfg.chunk_bytes).max(1),
        part,
        helpers: if mid {
            cfg.helpers.min(MID_HELPERS)
        } else {
            cfg.helpers
        },
    }
}

/// Most ring positions (virtual slots, one fence each) a staging set is cut into.
const MAX_RING: usize = 64;

/// How many chunks of `chunk` bytes the staging set's memory holds at once: each slot of
/// `slot_bytes` holds `slot_bytes / chunk` of them (at least one), up to [`MAX_RING`].
pub(crate) fn ring_positions(slots: usize, slot_bytes: usize, chunk: usize) -> usize {
    let per_slot = (slot_bytes / chunk.max(1)).max(1);
    slots.saturating_mul(per_slot).clamp(1, MAX_RING.max(slots))
}

/// The plan of a `total`-byte transfer through `staging`, and the memory of its ring
/// positions. Chunks smaller than a slot share slots: every slot is cut into as many
/// chunk-sized positions as it holds, so a mid-sized transfer (up to `slots * chunk_bytes`)
/// never waits for a position to come free. Makes the fences the positions need.
fn lay_out(
    staging: &mut Staging,
    total: usize,
    cfg: &StagingConfig,
) -> Result<(Plan, Vec<SlotMemory>, Tuning)> {
    let cut = cut_for(total, cfg);
    let chunk = cut.chunk.min(staging.chunk);
    let per_slot = (staging.chunk / chunk).max(1);
    let positions = ring_positions(staging.slots.len(), staging.chunk, chunk);
    let plan = Plan::ramped(total, chunk, cut.part, positions)?;
    while staging.events.len() < positions {
        staging.events.push(fence_event(&staging.device)?);
    }
    let memory = staging
        .slots
        .iter_mut()
        .flat_map(|m| {
            let base = m.as_mut_ptr();
            // Inside the slot: `j * chunk + chunk <= per_slot * chunk <= slot bytes`.
            (0..per_slot).map(move |j| SlotMemory(base.wrapping_add(j * chunk)))
        })
        .take(positions)
        .collect();
    staging.used = plan.chunks().min(positions);
    let tuning = Tuning {
        helpers: cut.helpers,
        streaming: false,
        early_submits: cfg.early_submits,
    };
    Ok((plan, memory, tuning))
}

/// A fence for one ring position (no timing: cheaper to record).
fn fence_event(device: &Device) -> Result<Event> {
    Ok(Event::builder(device).disable_timing(true).build()?)
}
