//! Policy: every tunable decision of the pool, named and explained in one place.
//!
//! The constants below decide how requests are rounded, which requests count as
//! small, how big new segments are, and how much address space is reserved. The
//! functions at the bottom turn them into decisions; the pool's code calls these
//! functions instead of repeating the arithmetic.
//!
//! The single place that decides whether a cached block is reused for a request is
//! `ShardState::choose_block` in `pool/shard/placement.rs`; it uses [`block_fits`] below.
//!
//! # Page policy (virtual-memory segments)
//!
//! The page size is not a constant: it is the device's granularity (2 MiB on an H200).
//! The rules for pages are fixed, and the pool's footprint follows from them:
//!
//! 1. A block has every page it touches mapped while it is live; blocks of one stream
//!    pack into the same pages, so neighbours share their boundary pages.
//! 2. A page no non-free block touches is cached: it stays mapped where it is, so the
//!    stream that freed it can reuse it without any call.
//! 3. When a block needs pages, they come first from unmapped pages the pool holds.
//!    Then, on a device without a limit whose pool holds less than [`MOVE_SLACK`] allows
//!    above the most live memory it has had ([`move_slack_budget`]), from the backend
//!    (new pages; if the device is full, those go back and the next step runs). Otherwise
//!    (a limit, or above the slack) from cached pages anywhere on the device (unmapped and
//!    mapped again where needed), and only then from the backend. So the pool holds at
//!    most about the pages its live blocks touch plus the slack, whatever the
//!    fragmentation of its address space. A graph capture's request never moves pages.
//! 4. A cached page is unmapped only once a completed fence covers every free of the
//!    memory on it: unmapping is not stream-ordered, so work still running on the page
//!    must be done.
//! 5. Pages are created only when the limit can take all the pages a request is
//!    missing, so a request that fails on the limit leaves the footprint unchanged.

/// Every request is rounded up to a multiple of this many bytes (CuPy's unit).
///
/// 512 bytes keeps every block aligned for any vector load a kernel may issue and
/// makes the sizes of most tensors of the same shape identical, which is what makes
/// exact-size reuse on the hot path hit. Smaller units would split segments into
/// slivers no kernel can use; larger ones waste memory on small tensors.
pub const ROUND: u64 = 512;

/// Requests of at most this many bytes (after rounding) are *small*.
///
/// Small and large blocks live in different segments. Small tensors are numerous and
/// short-lived; if they were mixed with large blocks, a single live 4 KiB block could
/// pin a whole 2 MiB page (or keep a 1 GiB plain segment from being released) between
/// two large free ranges. Kept apart, they pack densely into a few pages of their own.
pub const SMALL_REQUEST_MAX: u64 = 1 << 20;

/// Size of a new plain segment for small requests (plain-segment mode only).
///
/// One `cuMemAlloc` costs tens of microseconds; a 2 MiB segment serves many small
/// requests for that price while wasting at most 2 MiB per stream.
pub const SMALL_SEGMENT_SIZE: u64 = 2 << 20;

/// Requests above [`SMALL_REQUEST_MAX`] and below this size get a
/// [`MEDIUM_SEGMENT_SIZE`] plain segment (plain-segment mode only).
pub const MEDIUM_REQUEST_MAX: u64 = 10 << 20;

/// Size of a new plain segment for medium requests (plain-segment mode only): large
/// enough to hold a few medium blocks, so that they can be split from one allocation.
pub const MEDIUM_SEGMENT_SIZE: u64 = 20 << 20;

/// Plain segments for requests of [`MEDIUM_REQUEST_MAX`] and more are rounded up to a
/// multiple of this (plain-segment mode only): the driver hands out memory in 2 MiB
/// pages anyway, so the rounding costs nothing and lets a slightly larger request
/// reuse the segment later.
pub const LARGE_SEGMENT_ROUNDING: u64 = 2 << 20;

/// Address space reserved at a time for the small blocks of one stream
/// (virtual-memory mode). Address space costs no memory; this only bounds how many
/// reservations a stream makes. When it is used up, another range is reserved.
pub const SMALL_ADDRESS_RANGE: u64 = 1 << 30;

/// Address space reserved at a time for the large blocks of one stream
/// (virtual-memory mode), as a multiple of the device's total memory. One times the
/// device memory guarantees that any request the device could ever hold fits in a
/// fresh range, so a large request never fails for lack of contiguous address space.
pub const LARGE_ADDRESS_RANGE_DEVICE_MULTIPLE: u64 = 1;

/// How many freed blocks a stream keeps aside, uncoalesced, for exact-size reuse.
///
/// A freed block first goes into a short last-in-first-out list. A request of the same
/// rounded size takes it back without touching the ordered free set, which is what
/// keeps a same-size `malloc`+`free` pair at a few tens of nanoseconds. On any miss the
/// list is coalesced into the free set first, so the deferral never makes a request
/// fail or grow the pool: it only delays merging. The list is short so that a scan of
/// it stays within one or two cache lines.
pub const RECENT_CAPACITY: usize = 16;

/// In virtual-memory mode a request first looks for a free block where every page it
/// touches is already mapped (no `cuMemMap`, nothing moved), taking the fitting blocks in
/// best-fit order; it looks at no more than this many before it falls back to the best fit
/// and maps what is missing. The bound keeps a cache of many unmapped free blocks (after
/// `free_all_blocks`, say) from costing a scan of all of them on every request: measured on
/// the simulated backend with 1,000 unmapped 4 MiB free blocks, an unbounded scan took
/// 225 us a request against 12 us without it.
pub const MAPPED_FIT_SCAN: usize = 32;

/// How far above the most live memory a device has had the pool may grow before it moves
/// pages: `1/MOVE_SLACK` of it. Below that, a request that needs pages gets new ones
/// (`cuMemCreate`); above, it takes them from fenced free memory (`cuMemUnmap` there,
/// `cuMemMap` + `cuMemSetAccess` here), which keeps the footprint at what live blocks touch.
///
/// A move costs about 48 us a 2 MiB page on the H200 (`cuMemSetAccess` 26 us, `cuMemUnmap`
/// 19 us, `cuMemMap` 3 us; a run of pages costs the same per page as single ones, so
/// batching does not help), and a program whose sizes change from step to step moves pages
/// on every step: the CuPy workload's trace, replayed without kernels, cost 3.3 us an
/// operation with moves against 0.5 us on plain segments (about 300 pages a pass). With
/// the slack, the simulated replay of that trace moves 90 to 190 pages a pass instead, at
/// peak reserved / peak requested 1.057 instead of 1.011 (CuPy's own pool holds 1.14x our
/// figure there); `lm_varlen` stops moving pages after its first pass, at 1.011.
pub const MOVE_SLACK: u64 = 16;

/// The physical bytes the pool may hold before it moves pages rather than create new ones,
/// for a device whose most live memory was `live_high` bytes (see [`MOVE_SLACK`]).
pub fn move_slack_budget(live_high: u64) -> u64 {
    live_high.saturating_add(live_high / MOVE_SLACK)
}

/// At most this many fences are outstanding per stream. A fence is recorded on the slow
/// path (a miss that needs memory from elsewhere) to learn when the stream's frees so
/// far are done; while earlier fences are still pending, later misses poll them instead
/// of recording more, so a stream far behind its host does not collect one event per
/// miss. Four keeps a recent fence available without letting the list grow.
pub const MAX_OUTSTANDING_FENCES: usize = 4;

/// Number of stream shards in one table of a device; further streams go into chained
/// tables of the same size. Lookups read only atomics, so threads on different streams
/// never write a shared cache line on the hot path.
pub const SHARDS_PER_TABLE: usize = 64;

/// How many foreign streams of a device may linger at once (keep their cache past the free
/// of their last block, with no fence: see `ShardState::let_go`). A lingering stream's owner
/// may destroy it, and its cache is then reachable only after a device-wide synchronisation,
/// so the count is bounded; past it, a stream detaches with its fence as before. A program's
/// recurring streams (PyTorch's pool of streams, a few side streams) fit well below it.
pub const MAX_LINGERING_STREAMS: usize = 32;

/// A new stream adopts the shard of a stream the pool let go of (its cache, pages and
/// address ranges) only when that shard's last fence has completed, so the new stream never
/// waits for someone else's work. Once a device holds this many shards, a new stream adopts
/// an idle shard even if its fence is still pending (the new stream is then made to wait for
/// it on the device, not the host): this bounds the shards, and the address space they
/// reserve, when a program creates streams faster than the GPU finishes their work.
pub const ADOPT_BUSY_SHARDS_ABOVE: usize = SHARDS_PER_TABLE;

/// Before the pool grows (maps pages it must create, or reserves a new segment) for a
/// request on stream B, it serves the request with free memory whose last user may still
/// be running, by making B wait for that work on the device (`cuStreamWaitEvent`, as RMM's
/// stream-ordered resource does), never on the host. In order:
///
/// 1. B's own frees that wait for other streams' fences (`record_stream`, or blocks B
///    lent out and got back): B waits for those fences;
/// 2. a free block of another stream A's cache with every page it needs mapped: B waits
///    for a fence of A covering the block's free, and the block is *lent* to B (it stays
///    in A's cache, live; its free records a fence on B and returns it to A, where A's
///    stream waits for that fence, on the device, the next time A needs it).
///
/// Nothing is taken when spare pages already cover what B's own cache lacks: growing then
/// costs no new memory. Two limits keep it from turning every request into a steal:
///
/// * B borrows only from streams the same host thread drives (the thread that last took
///   the slow path on that stream's cache). Streams one thread drives take turns on the
///   host (one Python thread and four streams recorded the `multistream` trace); streams of
///   different threads are concurrent pipelines by design, each cycling its own memory.
///   Measured on the H200 before this limit, 2 threads each looping on its own stream fell
///   from 43 to 1.4 million pairs per second: each request of one borrowed the block the
///   other had just freed.
/// * B does not borrow again from a cache that still holds, unused since, a block B
///   borrowed and gave back: B is looping, and a cache of its own is cheaper.
///
/// **When it beats growing.** Growing costs memory the program may never give back (the
/// footprint is the peak of what each stream ever held, summed over streams: a trace
/// whose streams take turns holding 128 MiB reserves 4 x 128 MiB on four streams), and
/// on the GPU a `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` per page, tens of
/// microseconds each. Stealing costs one `cuStreamWaitEvent` (about a microsecond, no
/// host wait) and no memory. Moving pages instead (rules 3 and 4 of the page policy) needs the
/// fence *completed*: unmapping is not stream-ordered, so a device that lags its host
/// (every real program) would grow before it could move anything.
///
/// **Its cost to concurrency.** B's work issued after the request runs only after the
/// work A had issued before its fence: where A and B were meant to overlap, they now
/// overlap less (A, when it later takes lent blocks back, likewise waits for B). With
/// `false` the pool keeps streams independent and grows instead, as PyTorch's caching
/// allocator does; cross-stream reuse then happens only after completed fences.
/// [`PoolConfig::steal_before_growing`](crate::PoolConfig::steal_before_growing) sets it
/// per pool.
pub const STEAL_BEFORE_GROWING: bool = true;

/// The two kinds of segment a block can live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeClass {
    /// Rounded size at most [`SMALL_REQUEST_MAX`].
    Small,
    /// Everything larger.
    Large,
}

impl SizeClass {
    /// Index into per-class arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            SizeClass::Small => 0,
            SizeClass::Large => 1,
        }
    }
}

/// Rounds a request up to a multiple of [`ROUND`]; `None` when that overflows.
///
/// `size` must be non-zero: zero-sized requests never reach the pool's algorithm.
pub fn round_size(size: u64) -> Option<u64> {
    size.checked_add(ROUND - 1).map(|s| s / ROUND * ROUND)
}

/// The class of a rounded request.
pub fn size_class(rounded: u64) -> SizeClass {
    if rounded <= SMALL_REQUEST_MAX {
        SizeClass::Small
    } else {
        SizeClass::Large
    }
}

/// Whether a free block of `block_size` bytes may serve a request of `rounded` bytes.
///
/// Any block at least as large as the request fits; the caller then splits off the
/// remainder (every remainder is a multiple of [`ROUND`] and therefore usable), so a
/// fitted block never carries waste. Among the fitting blocks the pool takes the
/// smallest (best fit), and among equal sizes the lowest address, which packs blocks
/// towards the start of their segment and leaves the end free to be unmapped.
pub fn block_fits(block_size: u64, rounded: u64) -> bool {
    block_size >= rounded
}

/// Size of a new plain segment for a request of `rounded` bytes, or `None` on overflow.
///
/// `last_resort` asks for the smallest segment that fits (the rounded request
/// itself); the pool uses it when memory is short, so that a request fails only when
/// even an exactly-sized segment could not be had.
pub fn plain_segment_size(rounded: u64, last_resort: bool) -> Option<u64> {
    if last_resort {
        return Some(rounded);
    }
    if rounded <= SMALL_REQUEST_MAX {
        Some(SMALL_SEGMENT_SIZE)
    } else if rounded < MEDIUM_REQUEST_MAX {
        Some(MEDIUM_SEGMENT_SIZE)
    } else {
        round_up(rounded, LARGE_SEGMENT_ROUNDING)
    }
}

/// Size of a new address range (virtual-memory mode) for a request of `rounded` bytes
/// on a device of `total_memory` bytes with pages of `granularity` bytes; `None` on
/// overflow.
pub fn address_range_size(rounded: u64, total_memory: u64, granularity: u64) -> Option<u64> {
    let base = match size_class(rounded) {
        SizeClass::Small => SMALL_ADDRESS_RANGE,
        SizeClass::Large => total_memory.checked_mul(LARGE_ADDRESS_RANGE_DEVICE_MULTIPLE)?,
    };
    round_up(base.max(rounded), granularity)
}

/// Rounds `value` up to a multiple of `unit` (`unit > 0`); `None` on overflow.
pub(crate) fn round_up(value: u64, unit: u64) -> Option<u64> {
    if unit == 0 {
        return Some(value);
    }
    value.checked_add(unit - 1).map(|v| v / unit * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_512_bytes() {
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(33_554_460), Some(33_554_944));
        assert_eq!(round_size(u64::MAX), None);
        assert_eq!(round_size(u64::MAX - 511), Some(u64::MAX - 511));
    }

    #[test]
    fn classes_split_at_one_mebibyte() {
        assert_eq!(size_class(512), SizeClass::Small);
        assert_eq!(size_class(1 << 20), SizeClass::Small);
        assert_eq!(size_class((1 << 20) + 512), SizeClass::Large);
    }

    #[test]
    fn plain_segment_sizes_follow_the_request_class() {
        assert_eq!(plain_segment_size(512, false), Some(SMALL_SEGMENT_SIZE));
        assert_eq!(
            plain_segment_size(3 << 20, false),
            Some(MEDIUM_SEGMENT_SIZE)
        );
        assert_eq!(plain_segment_size((10 << 20) + 512, false), Some(12 << 20));
        assert_eq!(plain_segment_size(3 << 20, true), Some(3 << 20));
        assert_eq!(plain_segment_size(u64::MAX - 511, false), None);
    }

    #[test]
    fn address_ranges_cover_the_device_for_large_requests() {
        let g = 2 << 20;
        assert_eq!(
            address_range_size(512, 80 << 30, g),
            Some(SMALL_ADDRESS_RANGE)
        );
        assert_eq!(
            address_range_size(4 << 20, (80 << 30) + 1, g),
            Some((80 << 30) + g)
        );
        assert_eq!(address_range_size(100 << 30, 80 << 30, g), Some(100 << 30));
    }

    #[test]
    fn fit_is_size_only() {
        assert!(block_fits(1024, 1024));
        assert!(block_fits(4096, 1024));
        assert!(!block_fits(512, 1024));
    }
}
