//! Stream-ordered caching memory pools for CUDA devices.
//!
//! `cuda-mempool` is the workspace's counterpart of CuPy's `cupy.cuda.MemoryPool`:
//! one [`MemoryPool`] serves every device, caches freed blocks per stream, and hands
//! memory back to other streams only once the work that used it is known to be done.
//! The pool's algorithm runs on the CPU and is generic over a [`Backend`] that provides
//! address ranges, physical memory and fences; this crate ships a
//! [`SimulatedBackend`] for tests and trace replays, and the driver backend is built
//! on `cuda-core`.
//!
//! # Contents
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`allocator`] | pluggable allocators (CuPy's `set_allocator`): the [`allocator::Allocator`] trait, direct, pool, closure and C-function allocators, the thread's current allocator, [`allocator::alloc`] |
//! | [`async_pool`] | [`AsyncPool`] over the driver's `cuMemPool*` (CuPy's `MemoryAsyncPool`), from an [`AsyncPoolSource`] |
//! | [`driver`] | the [`DriverBackend`] over `cuda-core`, [`DevicePool`], [`PoolMemory`], the process-wide [`default_pool`], [`driver::stream_key`] and [`driver::device_id`] |
//! | [`history`] | memory history: [`history::Recorder`], a bounded ring of events (mallocs, frees, segments, pages, fences, limits, private pools, out of memory), [`history::Snapshot`] and the HTML [`history::report`] |
//! | [`hooks`] | memory hooks (CuPy's `memory_hook`): [`hooks::MemoryHook`], [`hooks::MemoryEvent`], the `tracing` debug hook and the per-call-site profile |
//! | [`pinned`] | [`PinnedMemoryPool`] of pinned host blocks reused after their streams' work, [`PinnedBlock`], [`pinned::PinnedAllocator`] |
//! | [`backend`] | the [`Backend`] trait and the id types [`DeviceId`], [`StreamKey`], [`DeviceAddress`], [`DeviceInfo`] |
//! | [`ipc`] | pool blocks shared with other processes: legacy IPC ([`DevicePool::new_ipc`], [`DevicePool::malloc_ipc`], [`ipc::ExportedBlock`], [`ipc::import_block`]) and file descriptors of shareable virtual memory ([`DevicePool::new_shareable`], [`DevicePool::malloc_fd`], [`ipc::ExportedFdBlock`], [`ipc::import_block_fd`]) |
//! | [`peer`] | several GPUs: [`DevicePool::grant_peer_access`] to a block from another device |
//! | [`policy`] | every policy constant (rounding, size classes, segment sizes, address ranges) with its reason |
//! | [`pool`] | [`MemoryPool`], its RAII handle [`Allocation`], [`RawAllocation`], [`Limit`], [`PoolConfig`]; its module documentation maps its files, one line each |
//! | [`stats`] | [`Stats`], [`Stat`], [`OomCounts`]: used, requested, reserved, active blocks with peaks; allocations, retries, OOMs by cause, fragmentation; shards and streams held; address space reserved and mapped |
//! | [`error`] | [`PoolError`], the crate's one error type |
//! | [`sim`] | [`SimulatedBackend`]: fake addresses, capacity, granularity, a virtual clock for fences, call counts |
//! | [`replay`] | parsing and replaying allocation traces ([`replay::replay_file`]) into a [`replay::ReplayReport`] |
//!
//! # Semantics in brief
//!
//! * Sizes are rounded up to 512 bytes; size 0 gives an empty allocation and touches
//!   nothing. Blocks are split and coalesced; a request takes the best-fitting free
//!   block of its stream; small (≤ 1 MiB) and large blocks live in separate segments.
//! * A block freed on stream A is reused on A at once. Its memory goes to stream B only
//!   after a fence recorded on A after the free has completed; with
//!   [`Allocation::record_stream`] (or any `cudars_core` view's asynchronous operation, or
//!   `cudars_core::DevicePtr::record_stream`), a block's free also waits for the listed streams.
//!   Fences are recorded lazily on the slow path, so the hot path never calls the
//!   backend and never blocks the host (the one exception: freeing a block marked
//!   with `record_stream` records a fence on each of its other streams).
//! * With virtual-memory segments (the default where the device supports them), the
//!   pool's footprint is the physical pages its live blocks touch plus what it caches.
//!   Without a limit, new pages are created while the pool holds less than
//!   [`policy::MOVE_SLACK`] allows above the most live memory the device has had; beyond
//!   that (and always under a limit), fenced free pages are moved to where they are needed
//!   before new ones are created. [`MemoryPool::free_all_blocks`] returns every page no
//!   live block touches.
//! * Out of memory: the pool waits for fences and releases cached memory, retries, and
//!   then fails with [`PoolError::OutOfMemory`] carrying the requested, used and
//!   reserved bytes and the limit. [`MemoryPool::set_limit`] is a hard cap.
//! * Streams: the pool holds a clone of a stream only while blocks made on it are live
//!   (or its owner still holds it). Once the last block is freed it records a fence
//!   covering the stream's frees and lets go ([`backend`] explains the rule), so streams
//!   may be created and destroyed freely: a later stream adopts the idle cache, and a new
//!   stream that gets an old handle's value first waits for the old fence.
//!   [`Stats`] counts shards, attached streams and reserved address space.
//! * During a CUDA graph capture, `DevicePool::malloc_stream` (and everything built on it,
//!   the C ABI included) serves the capturing stream from a private pool of that capture:
//!   its memory is reused only inside the capture, in capture order, and released once the
//!   graph and every executable graph made from it are destroyed
//!   ([`MemoryPool::malloc_private`]). Captures begun through `cuda-core`/`cuda-graph` cost
//!   one atomic load to detect; external streams (PyTorch's, CuPy's) are asked each time.
//! * Failures leave the pool as it was: out of memory gives back what the attempt reserved
//!   ([`PoolError::OutOfMemory`] says whether the limit, the device or the address space
//!   ran out); a backend failure is a typed error, and the pool keeps serving (the
//!   simulated backend can fail any call, see [`sim::SimCall`]).
//! * The hot path takes only a per-(device, stream) lock; see [`pool`] for the locking
//!   structure and [`stats`] for what that means for peaks.
//!
//! # Async code: pool memory and awaited streams
//!
//! A block's lifetime is tied to **stream order, not to an `.await`**. A block allocated
//! on stream S and used by work queued on S may be dropped as soon as that work is queued,
//! before anything is awaited: the pool reuses it on S only after that work (stream order)
//! and on another stream only after a fence recorded at the free has completed (the
//! workspace's one ordering rule, `cudars_core::memory::Handover`). Work on other streams
//! that used the block is covered the same way once marked (`record_stream`; every
//! `cudars_core` view operation and `cuda-xfer` transfer marks it). So a task keeps a block
//! across `stream.completion().await` only to read results after it, never to keep the
//! device safe; and dropping a task mid-await (a cancelled request) frees its blocks
//! correctly at once.
//!
//! Nothing on that path blocks the thread: `malloc_stream` / [`DevicePool::malloc_shared`]
//! on memory the pool has cached for the stream, the drop of an allocation, the view's
//! `_async` operations, `Stream::completion` and `cuda-xfer`'s awaited transfers. In a task
//! that must be `'static` (`tokio::spawn`), take blocks with [`DevicePool::malloc_shared`]
//! (it holds an `Arc` of the pool; convert it into a `cudars_core::DevicePtr`). What does
//! block the calling thread, and so belongs in `spawn_blocking` or outside the request path:
//! - a malloc that runs out of memory: before it fails it waits on the host for the
//!   fences of cached memory, releases it and retries (a malloc that only grows the pool
//!   makes driver calls that take tens of microseconds but wait for no device work; size
//!   or warm the pool so that steady-state requests are served from its cache);
//! - [`MemoryPool::free_all_blocks`], [`MemoryPool::synchronize_free_blocks`],
//!   [`MemoryPool::set_limit`] below what is cached, dropping a pool, releasing a
//!   capture's private pool (they wait for fences, or the device);
//! - synchronous uses of a block (`memset`, `copy_to_host`, ... and
//!   `prepare_synchronous_use`), which wait on the host for its hand-over fence and for
//!   themselves.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use cudars_core::{DevicePtr, Device, Stream};
//! use cudars_mempool::DevicePool;
//! let pool = Arc::new(DevicePool::new_driver()?);
//! let stream = Stream::new(&Device::new(0)?)?;
//! let scratch: DevicePtr = pool.malloc_shared(&stream, 1 << 20)?.into();
//! scratch.memset_async(0, &stream)?;
//! drop(scratch); // fine before the await: reused on `stream` after the memset only
//! stream.completion()?.await?;
//! # Ok(()) }
//! ```
//!
//! ```
//! use cudars_mempool::{DeviceId, Limit, MemoryPool, PoolError, SimulatedBackend, StreamKey};
//!
//! let pool = MemoryPool::new(SimulatedBackend::h200(1))?;
//! let dev = DeviceId(0);
//! pool.set_limit(dev, Limit::Bytes(64 << 20))?;
//! let a = pool.malloc(dev, &StreamKey(1), 10 << 20)?;
//! let err = pool.malloc(dev, &StreamKey(1), 60 << 20).unwrap_err();
//! assert!(matches!(err, PoolError::OutOfMemory { .. }));
//! drop(a);
//! let b = pool.malloc(dev, &StreamKey(1), 60 << 20)?; // the cached 10 MiB was reused
//! assert_eq!(pool.total_bytes(), 60 << 20);
//! # drop(b);
//! # Ok::<(), PoolError>(())
//! ```

#![deny(missing_docs)]

pub mod allocator;
pub mod async_pool;
pub mod backend;
mod device_id;
pub mod driver;
pub mod error;
pub mod history;
pub mod hooks;
#[cfg(unix)]
pub mod ipc;
mod memory_event;
mod observe;
pub mod peer;
pub mod pinned;
pub mod policy;
pub mod pool;
mod private_id;
pub mod replay;
pub mod sim;
pub mod stats;

pub use async_pool::{AsyncPool, AsyncPoolSource};
pub use backend::{Backend, DeviceAddress, DeviceId, DeviceInfo, MapRunFailure, StreamKey};
pub use driver::{
    default_pool, DevicePool, DriverBackend, DriverFence, ExportedSegment, PoolMemory,
    SegmentSource,
};
pub use error::{OomCause, PoolError, Result};
pub use pinned::{default_pinned_pool, PinnedBlock, PinnedMemoryPool};
pub use pool::{
    Allocation, Limit, MemoryPool, PoolConfig, PrivateHold, PrivatePoolId, RawAllocation,
    LIMIT_ENV_VAR,
};
pub use sim::{SimCall, SimDevice, SimulatedBackend};
pub use stats::{OomCounts, Stat, Stats};
