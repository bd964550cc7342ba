//! [`PinnedMemoryPool`]: cached pinned host blocks (CuPy's `PinnedMemoryPool`).
//!
//! Sizes are rounded up to 512 bytes and blocks are kept in exact-size bins. A block is
//! reused only when the device work that used it is done: [`PinnedBlock::record_stream`]
//! notes each stream an asynchronous copy used it on, and the free records an event on each
//! of those streams; `malloc` hands the block out again only once every event has
//! completed (`cuEventQuery`, never blocking). A block freed with no recorded stream is
//! reusable at once. The allocator behind the pool can be replaced
//! ([`PinnedMemoryPool::set_allocator`], CuPy's `set_pinned_memory_allocator`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use cudars_core::memory::{PinnedFlags, PinnedMemory};
use cudars_core::{Device, Event, Stream, StreamKind};

use crate::backend::DeviceId;
use crate::error::PoolError;
use crate::policy;

/// Makes pinned host memory for a [`PinnedMemoryPool`]. Closures
/// `Fn(&Device, usize) -> cudars_core::Result<PinnedMemory>` implement it.
pub trait PinnedAllocator: Send + Sync {
    /// Allocates at least `size` bytes of pinned memory in `device`'s context.
    fn alloc(&self, device: &Device, size: usize) -> cudars_core::Result<PinnedMemory>;
}

impl<F> PinnedAllocator for F
where
    F: Fn(&Device, usize) -> cudars_core::Result<PinnedMemory> + Send + Sync,
{
    fn alloc(&self, device: &Device, size: usize) -> cudars_core::Result<PinnedMemory> {
        self(device, size)
    }
}

/// The default pinned allocator: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPinnedAllocator;

impl PinnedAllocator for DefaultPinnedAllocator {
    fn alloc(&self, device: &Device, size: usize) -> cudars_core::Result<PinnedMemory> {
        PinnedMemory::new(device, size, PinnedFlags::PORTABLE)
    }
}

/// A multiply-shift hasher for the pool's small integer keys (SipHash would cost more
/// than the rest of a cached `malloc`).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

struct FreeBlock {
    mem: PinnedMemory,
    fences: Vec<Event>,
}

#[derive(Default)]
struct State {
    /// Free blocks by (device ordinal, rounded size).
    bins: KeyMap<(usize, usize), Vec<FreeBlock>>,
    /// Spare events for fences, by device ordinal.
    events: KeyMap<usize, Vec<Event>>,
    total: u64,
    used: u64,
    n_free: usize,
}

struct Inner {
    allocator: RwLock<Arc<dyn PinnedAllocator>>,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A pool of pinned host blocks, reused once the device work that used them is done.
///
/// `Send` and `Sync`; cloning gives another handle to the same pool.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_mempool::pinned::PinnedMemoryPool;
///
/// let dev = Device::new(0)?;
/// let pool = PinnedMemoryPool::new();
/// let mut block = pool.malloc(&dev, 1 << 20)?;
/// block[0] = 7;
/// let stream = Stream::new(&dev)?;
/// block.record_stream(&stream)?; // an async copy from the block was queued on `stream`
/// drop(block); // reused only once `stream` has passed this point
/// assert_eq!(pool.n_free_blocks(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PinnedMemoryPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PinnedMemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("PinnedMemoryPool")
            .field("total_bytes", &st.total)
            .field("used_bytes", &st.used)
            .field("n_free_blocks", &st.n_free)
            .finish()
    }
}

impl Default for PinnedMemoryPool {
    fn default() -> Self {
        Self::new()
    }
}

impl PinnedMemoryPool {
    /// An empty pool using [`DefaultPinnedAllocator`].
    pub fn new() -> PinnedMemoryPool {
        Self::with_allocator(Arc::new(DefaultPinnedAllocator))
    }

    /// An empty pool using `allocator`.
    pub fn with_allocator(allocator: Arc<dyn PinnedAllocator>) -> PinnedMemoryPool {
        PinnedMemoryPool {
            inner: Arc::new(Inner {
                allocator: RwLock::new(allocator),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Replaces the allocator used for new blocks (cached blocks stay).
    pub fn set_allocator(&self, allocator: Arc<dyn PinnedAllocator>) {
        *self
            .inner
            .allocator
            .write()
            .unwrap_or_else(|e| e.into_inner()) = allocator;
    }

    /// A pinned block of at least `size` bytes (rounded up to 512) in `device`'s context.
    /// Size 0 gives an empty block without touching the pool.
    pub fn malloc(&self, device: &Device, size: usize) -> Result<PinnedBlock, PoolError> {
        if size == 0 {
            return Ok(PinnedBlock {
                mem: None,
                pool: None,
                streams: Vec::new(),
                size: 0,
                rounded: 0,
            });
        }
        let rounded = policy::round_size(size as u64)
            .and_then(|r| usize::try_from(r).ok())
            .ok_or_else(|| PoolError::SizeOverflow { size })?;
        let key = (device.ordinal(), rounded);
        {
            let mut st = self.inner.lock();
            let st = &mut *st;
            if let Some(bin) = st.bins.get_mut(&key) {
                let ready = bin
                    .iter()
                    .rposition(|b| b.fences.iter().all(|e| e.query().unwrap_or(false)));
                if let Some(i) = ready {
                    let block = bin.swap_remove(i);
                    st.n_free -= 1;
                    st.used += rounded as u64;
                    if !block.fences.is_empty() {
                        st.events.entry(key.0).or_default().extend(block.fences);
                    }
                    return Ok(self.block(block.mem, size, rounded));
                }
            }
        }
        let allocator = Arc::clone(
            &self
                .inner
                .allocator
                .read()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let mem = match allocator.alloc(device, rounded) {
            Ok(m) => m,
            Err(e) if e.is_out_of_memory() => {
                // Release cached blocks whose work is done, then retry once.
                self.free_all_free();
                allocator
                    .alloc(device, rounded)
                    .map_err(|e| self.oom(device, size, e))?
            }
            Err(e) => return Err(PoolError::Cuda(e)),
        };
        if mem.len() < rounded {
            return Err(PoolError::Backend {
                op: "alloc",
                source: format!("asked for {rounded} bytes, got {}", mem.len()).into(),
            });
        }
        let mut st = self.inner.lock();
        st.total += rounded as u64;
        st.used += rounded as u64;
        drop(st);
        Ok(self.block(mem, size, rounded))
    }

    fn oom(&self, device: &Device, size: usize, e: cudars_core::Error) -> PoolError {
        if !e.is_out_of_memory() {
            return PoolError::Cuda(e);
        }
        let st = self.inner.lock();
        PoolError::OutOfMemory {
            cause: crate::OomCause::DeviceMemory,
            device: DeviceId(device.ordinal() as u32),
            requested: size,
            used: st.used,
            reserved: st.total,
            limit: None,
        }
    }

    fn block(&self, mem: PinnedMemory, size: usize, rounded: usize) -> PinnedBlock {
        PinnedBlock {
            mem: Some(mem),
            pool: Some(Arc::clone(&self.inner)),
            streams: Vec::new(),
            size,
            rounded,
        }
    }

    /// Frees every cached block whose recorded work is done (CuPy's `free_all_blocks`);
    /// blocks still waiting on device work stay cached.
    pub fn free_all_blocks(&self) {
        self.free_all_free();
    }

    fn free_all_free(&self) {
        let mut released = Vec::new();
        {
            let mut st = self.inner.lock();
            let st = &mut *st;
            let mut bytes = 0u64;
            for (key, bin) in st.bins.iter_mut() {
                let mut i = 0;
                while i < bin.len() {
                    if bin[i].fences.iter().all(|e| e.query().unwrap_or(false)) {
                        released.push(bin.swap_remove(i));
                        bytes += key.1 as u64;
                    } else {
                        i += 1;
                    }
                }
            }
            st.bins.retain(|_, b| !b.is_empty());
            st.total -= bytes;
            st.n_free -= released.len();
            st.events.clear();
        }
        drop(released); // cuMemFreeHost outside the lock
    }

    /// Pinned bytes held (in use and cached).
    pub fn total_bytes(&self) -> usize {
        self.inner.lock().total as usize
    }

    /// Bytes in blocks handed out (at the 512-byte rounding).
    pub fn used_bytes(&self) -> usize {
        self.inner.lock().used as usize
    }

    /// Bytes in cached blocks.
    pub fn free_bytes(&self) -> usize {
        let st = self.inner.lock();
        (st.total - st.used) as usize
    }

    /// Cached blocks (CuPy's `n_free_blocks`).
    pub fn n_free_blocks(&self) -> usize {
        self.inner.lock().n_free
    }
}

/// A pinned host block from a [`PinnedMemoryPool`]; dereferences to its bytes (the size
/// asked for). Dropping it returns it to the pool, fenced by an event on every stream
/// given to [`record_stream`](Self::record_stream).
///
/// `Send` and `Sync` (shared access gives `&[u8]` only).
pub struct PinnedBlock {
    mem: Option<PinnedMemory>,
    pool: Option<Arc<Inner>>,
    streams: Vec<Stream>,
    size: usize,
    rounded: usize,
}

impl std::fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("ptr", &self.as_ptr())
            .field("size", &self.size)
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl PinnedBlock {
    /// Notes that device work queued on `stream` uses the block (an asynchronous copy from
    /// or to it); its reuse then waits for that work.
    ///
    /// [`PoolError::PerThreadStream`] for the per-thread default stream
    /// ([`Stream::per_thread`]), which names a different stream on every thread: the fence
    /// would be recorded on the dropping thread's stream. Nothing is recorded then; use a
    /// created stream, or wait for the work before dropping the block.
    pub fn record_stream(&mut self, stream: &Stream) -> Result<(), PoolError> {
        if stream.kind() == StreamKind::PerThread {
            return Err(PoolError::PerThreadStream);
        }
        if self.mem.is_some() && !self.streams.iter().any(|s| s == stream) {
            self.streams.push(stream.clone());
        }
        Ok(())
    }

    /// The host address (dangling for an empty block).
    pub fn as_ptr(&self) -> *const u8 {
        self.mem.as_ref().map_or(std::ptr::null(), |m| m.as_ptr())
    }

    /// The host address for writes (null for an empty block), for asynchronous copies
    /// into the block.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.mem
            .as_mut()
            .map_or(std::ptr::null_mut(), |m| m.as_mut_ptr())
    }

    /// The size asked for.
    pub fn len(&self) -> usize {
        self.size
    }

    /// `true` for an empty block.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The underlying pinned allocation (its length is the rounded size).
    pub fn memory(&self) -> Option<&PinnedMemory> {
        self.mem.as_ref()
    }
}

impl Deref for PinnedBlock {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.mem {
            Some(m) => &m.as_slice()[..self.size],
            None => &[],
        }
    }
}

impl DerefMut for PinnedBlock {
    fn deref_mut(&mut self) -> &mut [u8] {
        let size = self.size;
        match &mut self.mem {
            Some(m) => &mut m.as_mut_slice()[..size],
            None => &mut [],
        }
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        let (Some(mem), Some(pool)) = (self.mem.take(), self.pool.take()) else {
            return;
        };
        let key = (mem.device().ordinal(), self.rounded);
        let mut fences = Vec::with_capacity(self.streams.len());
        let mut st = pool.lock();
        for stream in &self.streams {
            let spare = st
                .events
                .get_mut(&stream.device().ordinal())
                .and_then(Vec::pop);
            let event = match spare {
                Some(e) => Ok(e),
                None => Event::new(&stream.device()),
            };
            match event.and_then(|e| e.record(stream).map(|()| e)) {
                Ok(e) => fences.push(e),
                Err(_) => {
                    // Cannot fence: the block cannot be safely reused; synchronise instead.
                    let _ = stream.synchronize();
                }
            }
        }
        st.used -= self.rounded as u64;
        st.n_free += 1;
        st.bins
            .entry(key)
            .or_default()
            .push(FreeBlock { mem, fences });
    }
}

static DEFAULT_PINNED_POOL: OnceLock<PinnedMemoryPool> = OnceLock::new();

/// The process-wide default pinned pool (CuPy's `get_default_pinned_memory_pool`).
pub fn default_pinned_pool() -> &'static PinnedMemoryPool {
    DEFAULT_PINNED_POOL.get_or_init(PinnedMemoryPool::new)
}

/// Replaces the default pinned pool's allocator (CuPy's `set_pinned_memory_allocator`);
/// `None` restores [`DefaultPinnedAllocator`].
pub fn set_pinned_memory_allocator(allocator: Option<Arc<dyn PinnedAllocator>>) {
    default_pinned_pool()
        .set_allocator(allocator.unwrap_or_else(|| Arc::new(DefaultPinnedAllocator)));
}
