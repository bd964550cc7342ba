//! [`Communicator`]: one rank of an NCCL communicator, on one GPU.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cudars_core::memory::DeviceAlloc;
use cudars_core::{Device, DevicePtr, Stream, StreamKind};
use cudars_nccl_sys::{config_initializer, ncclComm_t, ncclResult_t, NCCL_SPLIT_NOCOLOR};

use crate::error::{check, library, nccl_error, Error, NcclError, Result};
use crate::group::{self, pause, settle_raw};
use crate::id::UniqueId;
use crate::register::Registry;

/// How a communicator is created.
///
/// ```
/// use std::time::Duration;
/// use cudars_nccl::CommConfig;
/// let config = CommConfig::default().nonblocking(true).timeout(Duration::from_secs(30));
/// assert!(config.is_nonblocking());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    nonblocking: bool,
    timeout: Duration,
}

impl Default for CommConfig {
    /// Blocking (NCCL's and PyTorch's default), 5 minutes for non-blocking waits.
    fn default() -> Self {
        CommConfig {
            nonblocking: false,
            timeout: Duration::from_secs(300),
        }
    }
}

impl CommConfig {
    /// Non-blocking mode (`blocking = 0`): initialisation returns at once and is polled, so a
    /// peer that never joins ends in [`Error::Timeout`] instead of a hang. Calls that NCCL
    /// answers with `ncclInProgress` are polled to completion before returning, bounded by
    /// [`timeout`](Self::timeout).
    pub fn nonblocking(mut self, nonblocking: bool) -> Self {
        self.nonblocking = nonblocking;
        self
    }

    /// The bound on non-blocking initialisation and on each non-blocking call's polling.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether non-blocking mode is on.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// The configured timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }
}

/// One rank of an NCCL communicator, bound to one GPU.
///
/// Created by [`init_rank`](Self::init_rank) (one rank per process or thread),
/// [`init_all`](Self::init_all) (every GPU of this process) or [`split`](Self::split).
/// Dropping it destroys it (`ncclCommDestroy`); a communicator that timed out or saw an
/// asynchronous error was aborted (`ncclCommAbort`) and is only released.
///
/// `Send` but not `Sync`: NCCL lets a communicator move between threads but not be used by two
/// at once. A program that drives several GPUs from one thread issues each collective inside a
/// [`group`](crate::group::group).
///
/// **Graphs.** Collectives may be captured into CUDA graphs (`cudars_graph::capture` on the
/// communicator's stream). A graph that captured one keeps the communicator alive: dropping
/// or aborting the communicator while such a graph exists is deferred until the last of them
/// is gone (the communicator is marked aborted at once, so no new work is issued on it, but
/// the graphs' replays keep a live communicator). After a foreign capture (not begun through
/// cuda-core), whose graphs nothing tracks, the communicator is never destroyed.
///
/// Moving it to another thread while a [group] of this thread still holds it
/// (it was used in the open group) is allowed, but the other thread cannot use it until that
/// group ends ([`Error::HeldByGroup`]), and dropping or aborting it there is deferred to the
/// group's end: the group never meets a destroyed communicator.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<cudars_nccl::Communicator>();
/// ```
pub struct Communicator {
    raw: ncclComm_t,
    device: Device,
    rank: usize,
    size: usize,
    config: CommConfig,
    aborted: Cell<bool>,
    /// The open group, if any, that holds the communicator (see [`crate::group`]).
    hold: Arc<group::Hold>,
    /// Threads that issued work of this communicator on their per-thread default stream,
    /// not yet waited for there (see [`Communicator::wait`]).
    per_thread_issuers: Cell<Vec<ThreadId>>,
    /// The communicator as a zero-byte owner ([`Keeper`]) that graphs capturing its
    /// collectives hold, and what its last holder does to the communicator; made at the
    /// first captured collective.
    keeper: std::cell::OnceCell<(DevicePtr, Arc<AtomicU8>)>,
    /// Its registrations (see [`crate::register`]), closed when NCCL drops them.
    registry: Arc<Registry>,
}

/// What the last holder of a [`Keeper`] does: nothing (the communicator destroys itself),
/// destroy it, abort it, or nothing ever (a foreign capture may replay it).
const KEEP_OWNED: u8 = 0;
const KEEP_DESTROY: u8 = 1;
const KEEP_ABORT: u8 = 2;
const KEEP_FOREVER: u8 = 3;

/// A communicator as a zero-byte allocation: cuda-core's capture keep-alive holds it for the
/// graphs of each capture that used it, like the memory their nodes use.
struct Keeper {
    raw: usize,
    device: Device,
    config: CommConfig,
    fate: Arc<AtomicU8>,
    registry: Arc<Registry>,
}

// SAFETY: a zero-byte range (`size() == 0`, `as_raw()` 0, allowed) on the communicator's
// device; nothing is copied to or from it and the values never change. Its drop only acts
// on the communicator when the communicator handed it that job (`fate`), after which nothing
// else uses the handle.
unsafe impl DeviceAlloc for Keeper {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> cudars_core::sys::CUdeviceptr {
        0
    }
    fn size(&self) -> usize {
        0
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        match self.fate.load(Ordering::Acquire) {
            KEEP_DESTROY => destroy_raw(
                self.raw as ncclComm_t,
                &self.config,
                &self.device,
                &self.registry,
            ),
            KEEP_ABORT => abort_raw(self.raw as ncclComm_t, &self.device, &self.registry),
            _ => {}
        }
    }
}

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time (NCCL's
// thread-safety rule); `Communicator` is not `Sync` (the `Cell` sees to that), so moving it is
// the only way another thread gets to use it through this type. The one other user, a
// registered pool's segment source on any thread, calls NCCL only under the communicator's
// call lock, which every NCCL call that touches the communicator's state takes too.
unsafe impl Send for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device.ordinal())
            .field("nonblocking", &self.config.nonblocking)
            .field("aborted", &self.aborted.get())
            .finish()
    }
}

impl Communicator {
    fn from_raw(
        raw: ncclComm_t,
        device: Device,
        rank: usize,
        size: usize,
        config: CommConfig,
    ) -> Communicator {
        let hold = Arc::<group::Hold>::default();
        Communicator {
            raw,
            // Stamped by the caller before NCCL made the communicator: a reset meanwhile
            // leaves it of the ended generation, failing closed and never destroyed.
            device,
            rank,
            size,
            config,
            aborted: Cell::new(false),
            hold: Arc::clone(&hold),
            per_thread_issuers: Cell::new(Vec::new()),
            keeper: std::cell::OnceCell::new(),
            registry: Arc::new(Registry::new(hold)),
        }
    }

    /// Marks the communicator in the capture `issue` records into (its graphs then keep it
    /// alive); `foreign` when no capture of cuda-core runs (nothing keeps it: it is never
    /// destroyed).
    pub(crate) fn keep_in_capture(&self, issue: &cudars_core::Issue<'_>) -> Result<()> {
        let (ptr, fate) = self.keeper.get_or_init(|| {
            let fate = Arc::new(AtomicU8::new(KEEP_OWNED));
            let ptr = DevicePtr::new(Keeper {
                raw: self.raw as usize,
                device: self.device,
                config: self.config.clone(),
                fate: Arc::clone(&fate),
                registry: Arc::clone(&self.registry),
            });
            (ptr, fate)
        });
        ptr.record_stream(issue)?;
        if !cudars_core::graph::captures_in_progress() {
            fate.store(KEEP_FOREVER, Ordering::Release);
            forever()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(ptr.clone());
        }
        Ok(())
    }

    /// When graphs hold the communicator: hands `fate` to the last of them (unless a foreign
    /// capture made it permanent) and returns `true`.
    fn hand_to_graphs(&self, fate: u8) -> bool {
        let Some((ptr, f)) = self.keeper.get() else {
            return false;
        };
        if f.load(Ordering::Acquire) == KEEP_FOREVER {
            return true;
        }
        if Arc::strong_count(ptr.owner()) > 1 {
            f.store(fate, Ordering::Release);
            // The communicator's own reference goes with it; the graphs' remain.
            return true;
        }
        false
    }

    /// Rank `rank` of `nranks` on `device`, for the communicator named by `id` (the same on
    /// every rank). Every rank must call it (from its own process or thread); in blocking mode
    /// it returns when all have joined.
    ///
    /// ```no_run
    /// use cudars_core::Device;
    /// use cudars_nccl::{Communicator, UniqueId};
    /// let id = UniqueId::new()?; // on rank 0, then sent to the others
    /// let comm = Communicator::init_rank(&Device::new(0)?, 1, 0, &id)?;
    /// assert_eq!(comm.size(), 1);
    /// # Ok::<(), cudars_nccl::Error>(())
    /// ```
    pub fn init_rank(device: &Device, nranks: usize, rank: usize, id: &UniqueId) -> Result<Self> {
        Self::init_rank_with(device, nranks, rank, id, &CommConfig::default())
    }

    /// [`init_rank`](Self::init_rank) with a [`CommConfig`] (`ncclCommInitRankConfig`).
    pub fn init_rank_with(
        device: &Device,
        nranks: usize,
        rank: usize,
        id: &UniqueId,
        config: &CommConfig,
    ) -> Result<Self> {
        if nranks == 0 || nranks > i32::MAX as usize || rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of {nranks}: need 0 <= rank < nranks"
            )));
        }
        // The generation the communicator is made in, read before NCCL makes it.
        let device = &device.stamped();
        let nccl = library()?;
        let _scope = device.scope()?;
        let mut raw_config = config_initializer();
        raw_config.blocking = i32::from(!config.nonblocking);
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` and `raw_config` are valid for the call; the id is passed by value;
        // the device is current (NCCL binds the communicator to the current device).
        let r = unsafe {
            nccl.ncclCommInitRankConfig(
                &mut raw,
                nranks as i32,
                id.to_raw(),
                rank as i32,
                &mut raw_config,
            )
        }?;
        let comm = Communicator::from_raw(raw, *device, rank, nranks, config.clone());
        if raw.is_null() {
            check(r, "ncclCommInitRankConfig")?;
            return Err(Error::InvalidArgument(
                "ncclCommInitRankConfig returned no communicator".into(),
            ));
        }
        // On error `comm` is dropped: aborted, since it never became usable.
        comm.finish_init(r, "ncclCommInitRankConfig")?;
        Ok(comm)
    }

    /// Every device of `devices` in this process, rank `i` on `devices[i]`
    /// (`ncclCommInitAll`). Blocking; use the result inside a [`group`](crate::group::group)
    /// when one thread drives them all.
    ///
    /// ```no_run
    /// let comms = cudars_nccl::Communicator::init_all(&cudars_core::Device::all()?)?;
    /// for c in &comms {
    ///     println!("rank {} of {} on GPU {}", c.rank(), c.size(), c.device().ordinal());
    /// }
    /// # Ok::<(), cudars_nccl::Error>(())
    /// ```
    pub fn init_all(devices: &[Device]) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "init_all needs at least one device".into(),
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.ordinal() == d.ordinal()) {
                return Err(Error::InvalidArgument(format!(
                    "device {} appears twice in init_all's list",
                    d.ordinal()
                )));
            }
        }
        // The generations the communicators are made in, read before NCCL makes them.
        let devices: Vec<Device> = devices.iter().map(Device::stamped).collect();
        let devices = devices.as_slice();
        let nccl = library()?;
        let ordinals: Vec<i32> = devices.iter().map(|d| d.ordinal() as i32).collect();
        let mut raws: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `raws` has room for one handle per device; `ordinals` lists them.
        let r = unsafe {
            nccl.ncclCommInitAll(raws.as_mut_ptr(), devices.len() as i32, ordinals.as_ptr())
        }?;
        check(r, "ncclCommInitAll")?;
        Ok(raws
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (raw, device))| {
                Communicator::from_raw(raw, *device, rank, devices.len(), CommConfig::default())
            })
            .collect())
    }

    /// `ncclCommSplit`: every rank of this communicator calls it at the same time (from its
    /// own thread or process); ranks with the same `color` form a new communicator, ordered by
    /// `key` (ties by their rank here). `color: None` (`NCCL_SPLIT_NOCOLOR`) takes part without
    /// joining one: the result is `Ok(None)`.
    ///
    /// ```no_run
    /// # fn f(comm: &cudars_nccl::Communicator) -> cudars_nccl::Result<()> {
    /// // Pairs: ranks {0,1}, {2,3}, ...
    /// let pair = comm.split(Some((comm.rank() / 2) as u32), comm.rank() as i32)?;
    /// if let Some(pair) = pair {
    ///     assert!(pair.size() <= 2);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.check_usable()?;
        self.hold.check_here("split")?;
        let color = match color {
            None => NCCL_SPLIT_NOCOLOR,
            Some(c) => i32::try_from(c)
                .map_err(|_| Error::InvalidArgument(format!("split color {c} is over i32::MAX")))?,
        };
        let nccl = library()?;
        let _scope = self.device.scope()?;
        let mut raw_config = config_initializer();
        raw_config.blocking = i32::from(!self.config.nonblocking);
        // A non-blocking split may write the new communicator some time after the call
        // returns: the out-slot is leaked (8 bytes), never freed while NCCL may write it.
        let slot: &'static mut ncclComm_t = Box::leak(Box::new(std::ptr::null_mut()));
        let out: *mut ncclComm_t = slot;
        let r = {
            // Held until NCCL's work on the parent is done (a non-blocking split goes on in
            // the background): a registered pool's thread calls NCCL on it otherwise.
            let _calls = self.hold.lock_calls();
            // SAFETY: `self.raw` is live; `out` stays valid forever; the config is valid for
            // the call.
            let r = unsafe { nccl.ncclCommSplit(self.raw, color, key, out, &mut raw_config) }?;
            check_split(r)?;
            if self.config.nonblocking {
                self.settle(r, "ncclCommSplit")?;
            }
            r
        };
        if color == NCCL_SPLIT_NOCOLOR {
            return Ok(None);
        }
        // Wait (bounded by the timeout) for NCCL to fill the slot.
        let deadline = std::time::Instant::now() + self.config.timeout;
        let raw = loop {
            // SAFETY: `out` is the leaked slot, always valid; a volatile read sees NCCL's write.
            let v = unsafe { std::ptr::read_volatile(out) };
            if !v.is_null() {
                break v;
            }
            if std::time::Instant::now() > deadline {
                self.abort_now();
                return Err(Error::Timeout {
                    what: "ncclCommSplit",
                    waited: self.config.timeout,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let mut comm = Communicator::from_raw(raw, self.device, 0, 0, self.config.clone());
        comm.finish_init(r, "ncclCommSplit")?;
        let (mut count, mut rank) = (0, 0);
        check(
            // SAFETY: `comm.raw` is a live, initialised communicator; valid out-pointers.
            unsafe { nccl.ncclCommCount(comm.raw, &mut count) }?,
            "ncclCommCount",
        )?;
        check(
            // SAFETY: as above.
            unsafe { nccl.ncclCommUserRank(comm.raw, &mut rank) }?,
            "ncclCommUserRank",
        )?;
        comm.size = count.max(0) as usize;
        comm.rank = rank.max(0) as usize;
        Ok(Some(comm))
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The GPU this rank runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// The raw handle, for NCCL calls this crate does not wrap. Stays owned by `self`.
    pub fn raw(&self) -> ncclComm_t {
        self.raw
    }

    /// `true` once the communicator was aborted (after a timeout or an asynchronous error).
    pub fn is_aborted(&self) -> bool {
        self.aborted.get()
    }

    /// `ncclCommGetAsyncError`: `Ok(None)` while healthy (or still initialising), the error
    /// NCCL saw otherwise (a peer failed, a network error).
    pub fn async_error(&self) -> Result<Option<NcclError>> {
        self.check_usable()?;
        self.hold.check_here("async_error")?;
        let nccl = library()?;
        let mut state = ncclResult_t::ncclSuccess;
        check(
            // SAFETY: `self.raw` is live and not aborted; valid out-pointer.
            unsafe { nccl.ncclCommGetAsyncError(self.raw, &mut state) }?,
            "ncclCommGetAsyncError",
        )?;
        if state.is_success() || state == ncclResult_t::ncclInProgress {
            Ok(None)
        } else {
            Ok(Some(nccl_error(
                state,
                "ncclCommGetAsyncError",
                Some(self.raw),
            )))
        }
    }

    /// Waits until `stream` has finished its work, at most `timeout`, watching NCCL's
    /// asynchronous error. On a timeout or an asynchronous error the communicator is aborted
    /// (`ncclCommAbort`, which also stops its kernels so the stream drains) and the error is
    /// [`Error::Timeout`] or [`Error::AsyncError`]: a dead or hung peer never hangs the caller.
    ///
    /// Refused, doing nothing:
    ///
    /// * while an open group holds the communicator (its calls there are not issued yet, so
    ///   there is nothing to wait for): [`Error::HeldByGroup`];
    /// * on the per-thread default stream ([`Stream::per_thread`]) when this communicator
    ///   issued work on the per-thread stream of another thread and it was not waited for
    ///   there: that handle names the calling thread's own stream, not the one the work is
    ///   on ([`Error::ForeignPerThreadStream`]). Wait on the issuing thread before moving the
    ///   communicator, or use explicit streams.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn f(comm: &cudars_nccl::Communicator, s: &cudars_core::Stream) -> cudars_nccl::Result<()> {
    /// match comm.wait(s, Duration::from_secs(30)) {
    ///     Ok(()) => {}
    ///     Err(cudars_nccl::Error::Timeout { .. } | cudars_nccl::Error::AsyncError(_)) => {
    ///         // `comm` is aborted: drop it, make a new one.
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn wait(&self, stream: &Stream, timeout: Duration) -> Result<()> {
        self.check_usable()?;
        self.check_stream(stream)?;
        if self.hold.holder().is_some() {
            return Err(Error::HeldByGroup { what: "wait" });
        }
        let per_thread = stream.kind() == StreamKind::PerThread;
        let me = std::thread::current().id();
        if per_thread && self.per_thread_issuers_any(|t| t != me) {
            return Err(Error::ForeignPerThreadStream);
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(e) = self.async_error()? {
                // A fault of the device reaches NCCL as an unhandled CUDA error: the
                // workspace's one error for it is ContextLost, and a lost context's
                // communicator is left alone.
                cudars_core::health::probe(stream)?;
                self.abort_now();
                return Err(Error::AsyncError(e));
            }
            if stream.is_done()? {
                if per_thread {
                    // This thread's per-thread stream has drained.
                    self.per_thread_issuers_update(|v| v.retain(|t| *t != me));
                }
                // Registrations retired meanwhile, once all their work is done.
                self.registry.drain(self);
                return Ok(());
            }
            if start.elapsed() >= timeout {
                self.abort_now();
                return Err(Error::Timeout {
                    what: "the communicator's work on the stream",
                    waited: timeout,
                });
            }
            pause(&mut spins);
        }
    }

    /// Aborts the communicator now (`ncclCommAbort`): pending work is stopped, peers see an
    /// error. Consumes it. While an open group holds it (see [`crate::group`]), the abort
    /// happens when that group ends, and this returns `Ok`.
    pub fn abort(self) -> Result<()> {
        if self.aborted.replace(true) {
            return Ok(());
        }
        if self.hand_to_graphs(KEEP_ABORT) {
            return Ok(());
        }
        // A lost or reset context: the handle is left alone (see `context_gone`); else the
        // device is held (no reset) until the abort returns.
        let _held = match cudars_core::health::hold(&self.device) {
            Ok(h) => h,
            Err(e) => {
                // A lost context: the handle is left alone for good; no NCCL call on it
                // any more (a registered pool's included).
                let retired = {
                    let _calls = self.hold.lock_calls();
                    self.registry.close()
                };
                drop(retired);
                return Err(e.into());
            }
        };
        let raw = self.raw as usize;
        let device = self.device;
        let registry = Arc::clone(&self.registry);
        if self
            .hold
            .defer(move || abort_raw(raw as ncclComm_t, &device, &registry))
        {
            return Ok(());
        }
        let nccl = library()?;
        let calls = self.hold.lock_calls();
        // SAFETY: `self.raw` is live, no open group holds it, and it is not used again (the
        // flag is set).
        let aborted = unsafe { nccl.ncclCommAbort(self.raw) };
        // NCCL dropped the registrations with the communicator.
        let retired = self.registry.close();
        drop(calls);
        drop(retired);
        check(aborted?, "ncclCommAbort")
    }

    /// Aborts in place (idempotent), for the error paths; deferred to the end of the open
    /// group that holds the communicator, if any.
    pub(crate) fn abort_now(&self) {
        if self.aborted.replace(true) {
            return;
        }
        if self.hand_to_graphs(KEEP_ABORT) {
            return;
        }
        let raw = self.raw as usize;
        let device = self.device;
        let registry = Arc::clone(&self.registry);
        if self.hold.calls_held_here() {
            // Inside a call that holds the communicator's call lock (a settle that timed
            // out): the abort takes the lock itself, once the call lets go of it.
            self.hold
                .after_calls(move || abort_raw(raw as ncclComm_t, &device, &registry));
            return;
        }
        if !self
            .hold
            .defer(move || abort_raw(raw as ncclComm_t, &device, &registry))
        {
            abort_raw(self.raw, &self.device, &self.registry);
        }
    }

    /// Its registrations.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The communicator's side of the group hold.
    pub(crate) fn hold(&self) -> &Arc<group::Hold> {
        &self.hold
    }

    /// Notes that the calling thread issues work of this communicator on its per-thread
    /// default stream.
    pub(crate) fn note_per_thread_issue(&self) {
        let me = std::thread::current().id();
        self.per_thread_issuers_update(|v| {
            if !v.contains(&me) {
                v.push(me);
            }
        });
    }

    fn per_thread_issuers_update(&self, f: impl FnOnce(&mut Vec<ThreadId>)) {
        let mut v = self.per_thread_issuers.take();
        f(&mut v);
        self.per_thread_issuers.set(v);
    }

    fn per_thread_issuers_any(&self, f: impl Fn(ThreadId) -> bool) -> bool {
        let v = self.per_thread_issuers.take();
        let any = v.iter().any(|t| f(*t));
        self.per_thread_issuers.set(v);
        any
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.aborted.get() {
            return Err(Error::Aborted);
        }
        // A lost or reset context: `ContextLost`, without calling NCCL.
        cudars_core::health::usable(&self.device)?;
        Ok(())
    }

    pub(crate) fn check_stream(&self, stream: &Stream) -> Result<()> {
        stream.expect_device(self.device).map_err(|e| match e {
            cudars_core::Error::WrongDevice {
                expected, actual, ..
            } => Error::WrongDevice {
                what: "the stream",
                expected,
                actual,
            },
            e => e.into(),
        })
    }

    /// After an init-like call: checks `r`, and in non-blocking mode polls until the new
    /// communicator is ready, aborting it on a timeout or error.
    fn finish_init(&self, r: ncclResult_t, call: &'static str) -> Result<()> {
        if r != ncclResult_t::ncclInProgress {
            if let Err(e) = check(r, call) {
                self.abort_now();
                return Err(e);
            }
        }
        if self.config.nonblocking {
            if let Err(e) = settle_raw(self.raw, self.config.timeout, call) {
                self.abort_now();
                return Err(e);
            }
        }
        Ok(())
    }

    /// After an NCCL call on this communicator: `Ok` on success; in non-blocking mode, polls an
    /// `ncclInProgress` to its end (inside a group, the group's end does that).
    pub(crate) fn settle(&self, r: ncclResult_t, call: &'static str) -> Result<()> {
        if r == ncclResult_t::ncclInProgress && self.config.nonblocking {
            if group::in_group() {
                // The group holds this communicator and settles it after its end.
                return Ok(());
            }
            return match settle_raw(self.raw, self.config.timeout, call) {
                Err(e @ Error::Timeout { .. }) => {
                    self.abort_now();
                    Err(e)
                }
                other => other,
            };
        }
        if r.is_success() {
            Ok(())
        } else {
            Err(Error::Nccl(nccl_error(r, call, Some(self.raw))))
        }
    }
}

/// `ncclInProgress` is not a failure of a split; anything else but success is.
fn check_split(r: ncclResult_t) -> Result<()> {
    if r == ncclResult_t::ncclInProgress {
        return Ok(());
    }
    check(r, "ncclCommSplit")
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.aborted.get() {
            return;
        }
        // Graphs that captured its collectives still replay them: the last one destroys it.
        if self.hand_to_graphs(KEEP_DESTROY) {
            return;
        }
        let raw = self.raw as usize;
        let config = self.config.clone();
        let device = self.device;
        let registry = Arc::clone(&self.registry);
        // Still used in an open group (of this thread or another): destroyed at its end.
        if !self
            .hold
            .defer(move || destroy_raw(raw as ncclComm_t, &config, &device, &registry))
        {
            destroy_raw(self.raw, &self.config, &self.device, &self.registry);
        }
    }
}

/// Communicators that foreign graphs may replay: never destroyed.
fn forever() -> &'static std::sync::Mutex<Vec<DevicePtr>> {
    static FOREVER: std::sync::Mutex<Vec<DevicePtr>> = std::sync::Mutex::new(Vec::new());
    &FOREVER
}

/// Holds `device` for a teardown call (no reset meanwhile), or `None` when the
/// communicator's CUDA context is lost (a kernel faulted) or was reset since the
/// communicator was made (see `cudars_core::health`): its handle is then left alone, never
/// destroyed nor aborted, which leaks what NCCL holds for it (host memory, its proxy thread,
/// shared-memory segments). NCCL would free its device memory and streams through the CUDA
/// runtime, which after a reset may free memory of the new context at the old addresses, and
/// whose calls a reset does not wait for.
fn context_held(device: &Device) -> Option<cudars_core::health::InCall> {
    cudars_core::health::hold(device).ok()
}

/// `ncclCommAbort`, its error dropped (error paths and deferred aborts); nothing when the
/// context is gone ([`context_held`]).
/// The registry is closed in every case (NCCL dropped the registrations, or the handle is
/// left alone for good): its retired memory is freed.
fn abort_raw(raw: ncclComm_t, device: &Device, registry: &Registry) {
    let retired = {
        let _calls = registry.lock_calls();
        abort_locked(raw, device);
        registry.close()
    };
    drop(retired);
}

/// `ncclCommAbort` with the communicator's call lock held.
fn abort_locked(raw: ncclComm_t, device: &Device) {
    let Some(_held) = context_held(device) else {
        return;
    };
    if let Ok(nccl) = library() {
        // SAFETY: callers pass a live handle that nothing uses afterwards: its communicator
        // is marked aborted and no open group holds it any more.
        let _ = unsafe { nccl.ncclCommAbort(raw) };
    }
}

/// Destroys a live communicator: `ncclCommFinalize` and its polling first in non-blocking
/// mode; an abort when that or `ncclCommDestroy` fails; nothing when the context is gone
/// ([`context_held`]). While any device of the process is lost, an abort instead: a peer on
/// the lost device never finishes its part, and the destroy would wait for it forever. The
/// registry is closed afterwards, in every case.
fn destroy_raw(raw: ncclComm_t, config: &CommConfig, device: &Device, registry: &Registry) {
    let retired = {
        let _calls = registry.lock_calls();
        destroy_locked(raw, config, device);
        registry.close()
    };
    drop(retired);
}

fn destroy_locked(raw: ncclComm_t, config: &CommConfig, device: &Device) {
    if cudars_core::health::any_closed() {
        abort_locked(raw, device);
        return;
    }
    let Some(_held) = context_held(device) else {
        return;
    };
    let Ok(nccl) = library() else {
        return;
    };
    if config.nonblocking {
        // SAFETY: `raw` is live (its owner is being dropped, no open group holds it);
        // finalize flushes its pending work.
        let finalized = unsafe { nccl.ncclCommFinalize(raw) }
            .ok()
            .filter(|r| r.is_success() || *r == ncclResult_t::ncclInProgress)
            .is_some()
            && settle_raw(raw, config.timeout, "ncclCommFinalize").is_ok();
        if !finalized {
            abort_locked(raw, device);
            return;
        }
    }
    // SAFETY: `raw` is live and not used after this.
    let destroyed = unsafe { nccl.ncclCommDestroy(raw) };
    if !matches!(destroyed, Ok(r) if r.is_success()) {
        abort_locked(raw, device);
    }
}
