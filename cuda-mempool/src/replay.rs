//! Trace replay: run a recorded allocation trace through a [`MemoryPool`] and measure
//! how much memory the pool needed.
//!
//! # Trace format
//!
//! Text, one operation per line; lines starting with `#` are comments (the first is a
//! header describing the recording):
//!
//! ```text
//! a ID SIZE STREAM    allocate SIZE bytes as ID on stream STREAM
//! f ID                free ID (on the stream it was allocated on)
//! ```
//!
//! # The figures
//!
//! * **peak requested**: the largest sum of the sizes of live allocations, as asked for
//!   (before rounding), over the trace; a property of the trace alone.
//! * **peak reserved**: the pool's peak of physical bytes held from the backend
//!   ([`Stats::reserved`]'s peak): whole plain segments, or created pages of
//!   virtual-memory segments. Address space is not counted: it costs no memory.
//! * their ratio, and the wall time per operation of the replay loop (parsing excluded).
//!
//! # The fence rule
//!
//! A trace records allocations, not the kernels between them, so the replay must
//! decide when the device is done with freed memory. The default rule,
//! [`FenceRule::Never`], forces nothing: the replay never synchronises, and a fence
//! completes only when the device completes it, as in a real program. Why it is the
//! default, and why the simulated and the GPU replay run the same rule:
//!
//! * On the GPU it is exactly what a program does: the replay issues allocations and
//!   frees through the pool and nothing else; the pool records its fences lazily and asks
//!   the driver whether they completed, and a fence completes when the GPU gets to it.
//!   Nothing in the replay loop waits for the device, so ns/op is the pool's own cost.
//! * In the simulated replay each allocation submits one work item to its stream (the
//!   kernels that would use the block), and the simulated device completes nothing on
//!   its own: a fence completes only when the pool itself waits for it on the host
//!   (which it does only out of memory). This is the slowest device there can be; the
//!   GPU, which completes fences within microseconds, can only let the pool see more
//!   fences completed, never fewer. So the simulated figure is what the pool needs when
//!   nothing it has freed has been seen to finish, the case that decides its footprint.
//! * The pool reaches the target under it without any host wait, because before it grows
//!   it reuses other streams' free memory by making the requesting stream wait for it on
//!   the device ([`policy::STEAL_BEFORE_GROWING`](crate::policy::STEAL_BEFORE_GROWING)).
//!   With that rule the figure barely depends on how fast the device is: `--all-rules`
//!   (the `replay` example) prints it under the others too.
//!
//! The other rules model a device that keeps up with the host by calling
//! [`MemoryPool::synchronize_free_blocks`] (records a fence on every stream with frees and
//! waits on the host for it): [`FenceRule::SynchronizeBeforeEachAllocation`] before every
//! allocation (the device is never behind: the best case, and what this replay used to
//! report; on the GPU it costs a host wait per operation), and
//! [`FenceRule::SynchronizeEvery`] after every `n` operations.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{Backend, DeviceId, StreamKey};
use crate::error::PoolError;
use crate::history::{Recorder, Snapshot};
use crate::pool::{Allocation, MemoryPool, PoolConfig};
use crate::sim::SimulatedBackend;
use crate::stats::Stats;

/// One operation of a trace, with trace ids replaced by dense slot numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceOp {
    /// Allocate `size` bytes on `stream` into `slot`.
    Alloc {
        /// Dense index of the allocation (its trace id renumbered).
        slot: usize,
        /// Bytes asked for.
        size: u64,
        /// The stream.
        stream: StreamKey,
    },
    /// Free the allocation in `slot`.
    Free {
        /// Dense index of the allocation.
        slot: usize,
    },
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The trace's name (its file stem).
    pub name: String,
    /// The first comment line, if any.
    pub header: Option<String>,
    /// The operations in order.
    pub ops: Vec<TraceOp>,
    /// Number of distinct allocations (slots).
    pub slots: usize,
}

/// When the replay lets the device catch up with the host (see the
/// [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceRule {
    /// Call [`MemoryPool::synchronize_free_blocks`] before every allocation (the device
    /// never lags).
    SynchronizeBeforeEachAllocation,
    /// Call it before the allocation following every `n`-th operation.
    SynchronizeEvery(u64),
    /// Never (the default): fences complete when the device completes them; the simulated
    /// device completes nothing on its own, so there only the pool's own waits (out of
    /// memory) complete them.
    Never,
}

impl FenceRule {
    /// Every rule the `replay` example's `--all-rules` prints, the default first.
    pub const ALL: [FenceRule; 3] = [
        FenceRule::Never,
        FenceRule::SynchronizeEvery(64),
        FenceRule::SynchronizeBeforeEachAllocation,
    ];
}

impl std::fmt::Display for FenceRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenceRule::SynchronizeBeforeEachAllocation => f.write_str("sync-before-alloc"),
            FenceRule::SynchronizeEvery(n) => write!(f, "sync-every-{n}"),
            FenceRule::Never => f.write_str("never-sync"),
        }
    }
}

/// How to replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayOptions {
    /// When the device catches up.
    pub fence_rule: FenceRule,
    /// The pool's configuration (virtual-memory segments by default).
    pub config: PoolConfig,
    /// Simulated replay only: the device completes each allocation's work at once, as the
    /// GPU replay's device does (the replay issues no kernels, so every fence the pool
    /// records is complete by the time it asks). Off by default: the device then
    /// completes nothing on its own, the case that decides the footprint. On, free memory
    /// is always safe to move, and the figure to watch is [`Stats::pages_moved`]: how
    /// often the pool moves pages instead of reusing mapped memory where it lies.
    pub device_keeps_up: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            fence_rule: FenceRule::Never,
            config: PoolConfig::default(),
            device_keeps_up: false,
        }
    }
}

/// The result of one replay.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// The trace's name.
    pub name: String,
    /// Operations replayed (allocations plus frees).
    pub ops: u64,
    /// Distinct streams in the trace.
    pub streams: usize,
    /// Largest sum of live requested sizes.
    pub peak_requested: u64,
    /// The pool's peak of physical bytes held.
    pub peak_reserved: u64,
    /// `peak_reserved / peak_requested`.
    pub ratio: f64,
    /// Wall time of the replay loop per operation, in nanoseconds.
    pub ns_per_op: f64,
    /// The fence rule used.
    pub fence_rule: FenceRule,
    /// The pool's statistics for the device at the end of the trace (before the
    /// allocations still live at the end are freed).
    pub stats: Stats,
}

/// Errors of loading or replaying a trace.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A malformed line.
    #[error("trace {name}, line {line}: {message}")]
    Parse {
        /// The trace's name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The pool failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// Parses a trace's text.
pub fn parse_trace(name: &str, text: &str) -> Result<Trace, ReplayError> {
    let err = |line: usize, message: String| ReplayError::Parse {
        name: name.to_string(),
        line,
        message,
    };
    let mut header = None;
    let mut ops = Vec::new();
    let mut live: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut slots = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            if header.is_none() {
                header = Some(comment.trim().to_string());
            }
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let kind = fields.next().unwrap_or("");
        let mut number = |what: &str| -> Result<u64, ReplayError> {
            let f = fields
                .next()
                .ok_or_else(|| err(line_no, format!("missing {what}")))?;
            f.parse::<u64>()
                .map_err(|_| err(line_no, format!("{what} {f:?} is not a number")))
        };
        match kind {
            "a" => {
                let id = number("id")?;
                let size = number("size")?;
                let stream = number("stream")?;
                if live.insert(id, slots).is_some() {
                    return Err(err(line_no, format!("id {id} allocated while live")));
                }
                ops.push(TraceOp::Alloc {
                    slot: slots,
                    size,
                    stream: StreamKey(stream),
                });
                slots += 1;
            }
            "f" => {
                let id = number("id")?;
                let slot = live
                    .remove(&id)
                    .ok_or_else(|| err(line_no, format!("free of id {id}, which is not live")))?;
                ops.push(TraceOp::Free { slot });
            }
            other => return Err(err(line_no, format!("unknown operation {other:?}"))),
        }
        if fields.next().is_some() {
            return Err(err(line_no, "trailing fields".to_string()));
        }
    }
    Ok(Trace {
        name: name.to_string(),
        header,
        ops,
        slots,
    })
}

/// Reads and parses a trace file; its name is the file stem.
pub fn load_trace(path: impl AsRef<Path>) -> Result<Trace, ReplayError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    parse_trace(&name, &text)
}

/// Replays `trace` on device `device` of `pool`, under `rule`. `stream_of` gives the
/// backend's stream for each stream of the trace; `after_alloc` is called after each
/// allocation with its stream (the simulated replay submits a work item there). Works
/// with any backend: the GPU replay calls it with the driver backend.
pub fn replay_on<B: Backend>(
    pool: &MemoryPool<B>,
    device: DeviceId,
    trace: &Trace,
    rule: FenceRule,
    stream_of: impl FnMut(StreamKey) -> B::Stream,
    after_alloc: impl FnMut(StreamKey),
) -> Result<ReplayReport, ReplayError> {
    replay_with(pool, device, trace, rule, stream_of, after_alloc, None)
}

/// [`replay_on`], recording every malloc and free (at the operation's index as virtual
/// time) and an out-of-memory failure into `recorder` when one is given.
fn replay_with<B: Backend>(
    pool: &MemoryPool<B>,
    device: DeviceId,
    trace: &Trace,
    rule: FenceRule,
    mut stream_of: impl FnMut(StreamKey) -> B::Stream,
    mut after_alloc: impl FnMut(StreamKey),
    recorder: Option<&Recorder>,
) -> Result<ReplayReport, ReplayError> {
    let mut live: Vec<Option<Allocation<'_, B>>> = Vec::with_capacity(trace.slots);
    live.resize_with(trace.slots, || None);
    let mut requested = 0u64;
    let mut peak_requested = 0u64;
    let mut streams = std::collections::HashSet::new();
    let mut since_sync = 0u64;
    let start = Instant::now();
    for (index, op) in trace.ops.iter().enumerate() {
        if let Some(r) = recorder {
            r.set_time(index as u64);
        }
        match *op {
            TraceOp::Alloc { slot, size, stream } => {
                let sync = match rule {
                    FenceRule::SynchronizeBeforeEachAllocation => true,
                    FenceRule::SynchronizeEvery(n) => since_sync >= n,
                    FenceRule::Never => false,
                };
                if sync {
                    pool.synchronize_free_blocks()?;
                    since_sync = 0;
                }
                let a = match pool.malloc(device, &stream_of(stream), size as usize) {
                    Ok(a) => a,
                    Err(e) => {
                        if let (
                            Some(r),
                            PoolError::OutOfMemory {
                                used,
                                reserved,
                                cause,
                                ..
                            },
                        ) = (recorder, &e)
                        {
                            r.out_of_memory(device, Some(stream), size, *cause, *used, *reserved);
                        }
                        return Err(e.into());
                    }
                };
                if let Some(r) = recorder {
                    r.malloc(device, stream, size, a.ptr(), None);
                }
                after_alloc(stream);
                streams.insert(stream);
                requested += size;
                peak_requested = peak_requested.max(requested);
                if let Some(cell) = live.get_mut(slot) {
                    *cell = Some(a);
                }
            }
            TraceOp::Free { slot } => {
                if let Some(a) = live.get_mut(slot).and_then(Option::take) {
                    requested -= a.size() as u64;
                    if let Some(r) = recorder {
                        r.free(device, a.stream(), a.size() as u64, a.ptr());
                    }
                    a.free()?;
                }
            }
        }
        since_sync += 1;
    }
    let elapsed = start.elapsed();
    let stats = pool.stats(device)?;
    if let Some(r) = recorder {
        // What the pool does when the blocks still live are dropped is not the trace's.
        r.set_enabled(false);
    }
    drop(live);
    let ops = trace.ops.len() as u64;
    let peak_reserved = stats.reserved.peak;
    Ok(ReplayReport {
        name: trace.name.clone(),
        ops,
        streams: streams.len(),
        peak_requested,
        peak_reserved,
        ratio: if peak_requested == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_requested as f64
        },
        ns_per_op: if ops == 0 {
            0.0
        } else {
            elapsed.as_nanos() as f64 / ops as f64
        },
        fence_rule: rule,
        stats,
    })
}

/// Replays `trace` through a fresh `MemoryPool<SimulatedBackend>` modelled on an H200
/// (143,771 MiB, 2 MiB pages).
pub fn replay(trace: &Trace, options: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let pool = MemoryPool::with_config(SimulatedBackend::h200(1), options.config)?;
    let device = DeviceId(0);
    let sim = pool.backend();
    replay_on(
        &pool,
        device,
        trace,
        options.fence_rule,
        |s| s,
        |stream| {
            sim.submit_work(device, stream);
            if options.device_keeps_up {
                sim.complete_stream(device, stream);
            }
        },
    )
}

/// [`replay`], recording into `recorder`: the pool's backend calls on the simulated device
/// are recorded (its observation seam), so the history holds its segments, pages and cross-stream fences as
/// well as every malloc and free (virtual time: the operation's index in the trace). Returns
/// the report and the [`Snapshot`] at the end of the trace, before the blocks still live
/// are freed. On out of memory the history ends with the failure, and the error is returned.
///
/// ```
/// use std::sync::Arc;
/// use cudars_mempool::history::{Clock, Recorder};
/// use cudars_mempool::replay::{parse_trace, replay_recorded, ReplayOptions};
///
/// let trace = parse_trace("t", "a 1 1000 0\na 2 3000 1\nf 1\n")?;
/// let rec = Arc::new(Recorder::new(1 << 16, Clock::Virtual));
/// let (report, snapshot) = replay_recorded(&trace, &ReplayOptions::default(), &rec)?;
/// assert_eq!(rec.history().figures().peak_active, report.peak_requested);
/// assert_eq!(snapshot.live.len(), 1);
/// # Ok::<(), cudars_mempool::replay::ReplayError>(())
/// ```
pub fn replay_recorded(
    trace: &Trace,
    options: &ReplayOptions,
    recorder: &Arc<Recorder>,
) -> Result<(ReplayReport, Snapshot), ReplayError> {
    let pool = MemoryPool::with_config(SimulatedBackend::h200(1), options.config)?;
    pool.record_backend_calls(Some(recorder.clone()));
    let device = DeviceId(0);
    let sim = pool.backend();
    if let Some(limit) = pool.get_limit(device)? {
        recorder.set_time(0);
        recorder.record_limit(device, Some(limit as u64));
    }
    let report = replay_with(
        &pool,
        device,
        trace,
        options.fence_rule,
        |s| s,
        |stream| {
            sim.submit_work(device, stream);
            if options.device_keeps_up {
                sim.complete_stream(device, stream);
            }
        },
        Some(recorder),
    )?;
    // `replay_with` paused the recorder before dropping the blocks still live at the end,
    // so the history (and its snapshot) ends with them live.
    let snapshot = recorder.history().snapshot();
    drop(pool);
    recorder.set_enabled(true);
    Ok((report, snapshot))
}

/// Loads and replays a trace file (see [`replay`]).
pub fn replay_file(
    path: impl AsRef<Path>,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    replay(&load_trace(path)?, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_renumbers() {
        let t = parse_trace(
            "t",
            "# hdr\n# format\na 7 100 0\na 9 200 1\nf 7\na 7 50 0\nf 9\n",
        )
        .unwrap();
        assert_eq!(t.header.as_deref(), Some("hdr"));
        assert_eq!(t.slots, 3);
        assert_eq!(
            t.ops,
            vec![
                TraceOp::Alloc {
                    slot: 0,
                    size: 100,
                    stream: StreamKey(0)
                },
                TraceOp::Alloc {
                    slot: 1,
                    size: 200,
                    stream: StreamKey(1)
                },
                TraceOp::Free { slot: 0 },
                TraceOp::Alloc {
                    slot: 2,
                    size: 50,
                    stream: StreamKey(0)
                },
                TraceOp::Free { slot: 1 },
            ]
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "a 1 2",
            "f 3",
            "a 1 2 3\na 1 5 0",
            "x 1",
            "a 1 two 0",
            "f 1 2",
        ] {
            assert!(
                matches!(parse_trace("t", bad), Err(ReplayError::Parse { .. })),
                "{bad:?} parsed"
            );
        }
    }

    #[test]
    fn replay_counts_peaks() {
        let t = parse_trace("t", "a 1 1000 0\na 2 3000 0\nf 1\na 3 500 0\nf 2\nf 3\n").unwrap();
        let r = replay(&t, &ReplayOptions::default()).unwrap();
        assert_eq!(r.ops, 6);
        assert_eq!(r.streams, 1);
        assert_eq!(r.peak_requested, 4000);
        // Small blocks share one 2 MiB page.
        assert_eq!(r.peak_reserved, 2 << 20);
        assert_eq!(r.stats.allocations, 3);
    }
}
