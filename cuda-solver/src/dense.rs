//! [`Solver`]: a cuSOLVER dense handle bound to a stream, and its factorisations and solves.
//!
//! Every routine has one shape: check the views (pure functions of `check`), ask cuSOLVER
//! for its workspace size, then `Solver::launch`: the workspace from the pool (or, inside a
//! capture, the solver's kept capture workspace), the views marked for the stream, the call,
//! and the `info` read back as a typed result (or, inside a capture, kept for
//! [`Solver::check_replay`]).

use std::ffi::{c_int, c_schar};
use std::sync::{Mutex, PoisonError};

use cudars_core::graph::{self, CaptureStatus};
use cudars_core::{Device, DevicePtr, Issue, Stream, StreamKind};
use cudars_solver_sys::{
    cublasFillMode_t, cublasOperation_t, cublasSideMode_t, cudaStream_t, cusolverDnHandle_t,
    cusolverEigMode_t, cusolverStatus_t, gesvdjInfo_t, syevjInfo_t, MissingSymbol,
};

use crate::check::{disjoint, info, matrices_bytes, square, view, Matrix, Uplo};
use crate::error::{check, cusolver, Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

type Status = std::result::Result<cusolverStatus_t, MissingSymbol>;

/// Which of cuSOLVER's S (`f32`) or D (`f64`) entry points a [`Scalar`] calls.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `f32`: the S routines.
    F32,
    /// `f64`: the D routines.
    F64,
}

/// The element types of the dense routines: `f32` and `f64`.
///
/// # Safety
///
/// Implemented only here (sealed): `KIND` names the entry points whose element type is
/// `Self`, so a pointer to `Self` is what they take.
pub unsafe trait Scalar: sealed::Sealed + bytemuck::Pod + Send + Sync {
    /// `S` or `D`.
    const NAME: &'static str;
    #[doc(hidden)]
    const KIND: Kind;
}

// SAFETY: f32 is the S routines' element.
unsafe impl Scalar for f32 {
    const NAME: &'static str = "S";
    const KIND: Kind = Kind::F32;
}

// SAFETY: f64 is the D routines' element.
unsafe impl Scalar for f64 {
    const NAME: &'static str = "D";
    const KIND: Kind = Kind::F64;
}

/// Calls the S or the D entry point, by `T::KIND`, with the same arguments: addresses are
/// given as `u64` and cast with `as *mut _` / `as *const _`, which takes each arm's element
/// type (the one `T` is, by [`Scalar`]'s contract).
macro_rules! sd {
    ($t:ty, $lib:expr, $s:ident, $d:ident, ($($arg:expr),* $(,)?)) => {
        match <$t as Scalar>::KIND {
            Kind::F32 => $lib.$s($($arg),*),
            Kind::F64 => $lib.$d($($arg),*),
        }
    };
}

fn fill(uplo: Uplo) -> cublasFillMode_t {
    match uplo {
        Uplo::Lower => cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
        Uplo::Upper => cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
    }
}

fn eig_mode(vectors: bool) -> cusolverEigMode_t {
    if vectors {
        cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR
    } else {
        cusolverEigMode_t::CUSOLVER_EIG_MODE_NOVECTOR
    }
}

/// Which side `ormqr` multiplies `Q` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `op(Q) C`.
    Left,
    /// `C op(Q)`.
    Right,
}

/// Whether a routine's result may be captured into a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capturable {
    /// The factorisations and solves: their `info` waits on the device for
    /// [`Solver::check_replay`].
    Yes,
    /// The iterative eigen and SVD routines: cuSOLVER may wait on the host inside them.
    No,
}

/// What a positive `info` means for a routine.
pub(crate) type Positive = fn(&'static str, usize) -> Error;

fn not_positive_definite(routine: &'static str, index: usize) -> Error {
    Error::NotPositiveDefinite { routine, index }
}
fn singular(routine: &'static str, index: usize) -> Error {
    Error::Singular { routine, index }
}
fn no_convergence(routine: &'static str, index: usize) -> Error {
    Error::NoConvergence { routine, index }
}
fn jacobi_not_converged(routine: &'static str, _info: usize) -> Error {
    Error::NotConverged { routine }
}
fn invalid(routine: &'static str, index: usize) -> Error {
    Error::InvalidParameter { routine, index }
}

/// The addresses a routine's call gets: its workspace (`lwork` elements), a second workspace
/// (gesvd's `rwork`), and its `info` words.
struct Work {
    work: u64,
    lwork: c_int,
    rwork: u64,
    info: u64,
}

/// A routine's workspace needs, in elements of its scalar, and its `info` words.
struct Needs {
    lwork: c_int,
    rwork: usize,
    infos: usize,
    /// A batched routine: its failures name the matrix.
    batched: bool,
}

impl Needs {
    fn work(lwork: c_int) -> Needs {
        Needs {
            lwork,
            rwork: 0,
            infos: 1,
            batched: false,
        }
    }
}

const ALIGN: u64 = 256;

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Byte offsets in one block: `[info words][work][rwork]`, each 256-byte aligned.
fn layout<T: Scalar>(needs: &Needs) -> Result<(u64, u64, u64)> {
    let size = std::mem::size_of::<T>() as u64;
    let lwork = u64::try_from(needs.lwork.max(1)).unwrap_or(1);
    let info = round_up(needs.infos as u64 * 4);
    let work = round_up(lwork * size);
    let rwork = round_up(needs.rwork as u64 * size);
    let total = info
        .checked_add(work)
        .and_then(|v| v.checked_add(rwork))
        .ok_or(Error::Shape {
            routine: "workspace",
            arg: "lwork",
            why: "the workspace's size overflows".into(),
        })?;
    Ok((info, info + work, total))
}

/// A block kept across captures (the capture workspace, the captured `info` words): taken
/// from the pool during a capture (so from its private pool: no memory node), marked in
/// each capture that uses it, so the graphs of captures begun through `cuda-core` keep it
/// alive; a block marked while no such capture ran was used by a foreign capture, whose
/// graphs may replay into it for ever: it is never freed.
#[derive(Default)]
struct Kept {
    block: Option<DevicePtr>,
    unkept: bool,
    capture: Option<u64>,
}

impl Kept {
    /// The block, at least `bytes` long, marked for capture `id`.
    fn get(
        &mut self,
        issue: &Issue<'_>,
        id: u64,
        bytes: u64,
        device: Device,
    ) -> Result<&DevicePtr> {
        let short = self.block.as_ref().is_none_or(|b| (b.len() as u64) < bytes);
        if short {
            let old = self.block.as_ref().map_or(0, |b| b.len() as u64);
            let want = bytes.max(old.saturating_mul(2)).max(ALIGN);
            let want = usize::try_from(want).map_err(|_| Error::Pool {
                bytes: usize::MAX,
                why: "a capture workspace past the address space".into(),
            })?;
            let p = cudars_mempool::allocator::alloc_on(issue.stream(), want).map_err(|e| {
                Error::Pool {
                    bytes: want,
                    why: format!("capture workspace: {e}"),
                }
            })?;
            if p.len() < want || !p.as_raw().is_multiple_of(ALIGN) || p.device() != device {
                return Err(Error::Pool {
                    bytes: want,
                    why: format!(
                        "the allocator gave {} bytes at {:#x} on device {}; the solver needs \
                         {want}, 256-byte aligned, on device {}",
                        p.len(),
                        p.as_raw(),
                        p.device().ordinal(),
                        device.ordinal()
                    ),
                });
            }
            self.retire();
            self.block = Some(p);
            self.capture = None;
        }
        if self.capture != Some(id) {
            if let Some(b) = &self.block {
                b.record_stream(issue)?;
                if !graph::captures_in_progress() {
                    self.unkept = true;
                }
            }
            self.capture = Some(id);
        }
        self.block.as_ref().ok_or(Error::Pool {
            bytes: 0,
            why: "no capture workspace".into(),
        })
    }

    /// Lets go of the block: to the pool in stream order (graphs that captured it keep it),
    /// or for ever when a foreign capture used it.
    fn retire(&mut self) {
        if let Some(b) = self.block.take() {
            if std::mem::take(&mut self.unkept) {
                forever()
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(b);
            }
        }
    }
}

/// Capture blocks that foreign graphs may still replay into: never freed.
fn forever() -> &'static Mutex<Vec<DevicePtr>> {
    static FOREVER: Mutex<Vec<DevicePtr>> = Mutex::new(Vec::new());
    &FOREVER
}

/// One routine captured into a graph: where its `info` words land on each replay.
struct Captured {
    routine: &'static str,
    positive: Positive,
    words: DevicePtr,
    count: usize,
    batched: bool,
}

/// The `info` words a capture's routines of one solver leave on the device at each replay
/// ([`Solver::take_capture_info`]): each capture has its own words, kept alive by its graphs.
pub struct CaptureInfo {
    captured: Vec<Captured>,
}

impl std::fmt::Debug for CaptureInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureInfo")
            .field(
                "routines",
                &self.captured.iter().map(|c| c.routine).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl CaptureInfo {
    /// The routines captured, in order.
    pub fn routines(&self) -> Vec<&'static str> {
        self.captured.iter().map(|c| c.routine).collect()
    }

    /// After a replay of the graph on `stream`: waits for `stream`, reads each routine's
    /// `info` and returns the first failure, typed as the eager call would have returned it.
    /// Read before any replay, the words hold whatever the capture's memory held (a failure
    /// may be reported that no replay made). A stream being captured is refused (the wait
    /// would invalidate its capture).
    pub fn check(&self, stream: &Stream) -> Result<()> {
        if capture_of(stream)?.is_some() {
            return Err(Error::Capturing {
                routine: "CaptureInfo::check",
                why: "the stream is being captured: waiting for it would end its capture",
            });
        }
        stream.synchronize()?;
        for c in &self.captured {
            let mut words = vec![0i32; c.count];
            c.words.copy_to_host(&mut words)?;
            infos(c.routine, &words, c.positive, c.batched)?;
        }
        Ok(())
    }
}

/// The capture `stream` is recorded into (asked of the driver only when one may run).
fn capture_of(stream: &Stream) -> Result<Option<u64>> {
    if !graph::may_be_captured(stream) {
        return Ok(None);
    }
    let info = graph::capture_info(stream)?;
    match info.status {
        CaptureStatus::None => Ok(None),
        CaptureStatus::Active => Ok(info.id),
        CaptureStatus::Invalidated => Err(Error::Capturing {
            routine: "cuSOLVER call",
            why: "the stream's capture has been invalidated; end it before issuing more work",
        }),
    }
}

fn capture_may_run() -> bool {
    graph::captures_in_progress() || graph::announced_captures_in_progress()
}

/// A cuSOLVER dense handle bound to a stream (CuPy's `cusolver` handle of a device, PyTorch's
/// per-stream one). Every routine checks its views first, takes its workspace from the pool on
/// the stream, runs, and reads the routine's `info` back (waiting for the stream): a matrix
/// that is not positive definite or is singular is an `Err` naming the index, never a silently
/// wrong answer. The per-thread default stream is refused (a pool workspace cannot be ordered
/// on it across threads).
///
/// **Captures.** The factorisations and solves (`potrf`, `potrs`, `potri`, `getrf`,
/// `getrs`, `geqrf`, `orgqr`, `ormqr`) may be captured into a graph: inside a capture they
/// use a workspace the solver keeps across captures (taken from the capture's private pool
/// the first time, so the graph holds no memory node and repeated captures do not grow the
/// pool) and leave their `info` on the device, in words of each capture's own; after
/// replaying a graph, its [`CaptureInfo`] ([`take_capture_info`](Self::take_capture_info), or
/// [`check_replay`](Self::check_replay) for the latest capture) returns the same typed
/// errors. Every graph that captured one solver shares that workspace: replay them one after
/// another, not at the same time on different streams (cuBLAS's and PyTorch's rule for
/// captured workspaces). A graph keeps the solver's handle alive: it may outlive the solver.
/// The eigen and SVD routines refuse a capture ([`Error::Capturing`]): cuSOLVER may wait on
/// the host inside them.
///
/// `Send`, not `Sync`: every routine takes `&mut self`.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_solver::{Matrix, Solver, Uplo};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let mut solver = Solver::new(&stream)?;
/// let n = 512;
/// let a = cudars_mempool::driver::malloc(&stream, n * n * 8)?; // an SPD matrix, f64
/// let b = cudars_mempool::driver::malloc(&stream, n * 8)?;
/// solver.potrf::<f64>(Matrix::new(&a, n, n), Uplo::Lower)?; // A = L L^T, in place
/// solver.potrs::<f64>(Matrix::new(&a, n, n), Uplo::Lower, Matrix::new(&b, n, 1))?; // x in b
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Solver {
    raw: cusolverDnHandle_t,
    device: Device,
    stream: Stream,
    /// The handle's owner ([`HandleOwner`]): graphs that captured a routine hold it too.
    handle: DevicePtr,
    /// A capture that kept nothing alive (foreign) used the handle: it is never destroyed.
    handle_unkept: bool,
    /// The workspace of captured routines, shared by every capture of this solver.
    capture_work: Kept,
    /// Blocks of captured `info` words. A block serves one capture at a time; it is used
    /// again only when nothing else holds it (no graph, no [`CaptureInfo`]).
    info_blocks: Vec<DevicePtr>,
    /// The current capture's block and the bytes of it used.
    info_cursor: Option<(DevicePtr, usize)>,
    /// The capture `captured` belongs to.
    capture: Option<u64>,
    captured: Vec<Captured>,
}

// SAFETY: a cuSOLVER handle may move between threads so long as calls on it do not overlap:
// every call goes through `&mut self` (or `Drop`), with the handle's device bound.
unsafe impl Send for Solver {}

impl std::fmt::Debug for Solver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Solver")
            .field("device", &self.device.ordinal())
            .field("captured", &self.captured.len())
            .finish()
    }
}

impl Solver {
    /// A handle on `stream`'s device, bound to `stream`.
    pub fn new(stream: &Stream) -> Result<Solver> {
        refuse_per_thread(stream, "Solver::new")?;
        let lib = cusolver()?;
        let device = stream.device();
        let _ctx = device.bind()?;
        let _relaxed = graph::RelaxedCaptureMode::new()?;
        let mut raw: cusolverDnHandle_t = std::ptr::null_mut();
        let created = {
            // SAFETY: a valid out-pointer; the device's primary context is current.
            unsafe { lib.cusolverDnCreate(&mut raw) }
        };
        check(created, "cusolverDnCreate")?;
        let handle = DevicePtr::new(HandleOwner(Raw(raw, device)));
        let mut s = Solver {
            raw,
            device,
            stream: stream.clone(),
            handle,
            handle_unkept: false,
            capture_work: Kept::default(),
            info_blocks: Vec::new(),
            info_cursor: None,
            capture: None,
            captured: Vec::new(),
        };
        s.bind(stream)?;
        Ok(s)
    }

    /// The stream the handle runs on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Moves the handle to `stream` (of its device), after everything queued on the old one.
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        refuse_per_thread(stream, "Solver::set_stream")?;
        stream.expect_device(self.device)?;
        let ev = self.stream.record(None)?;
        stream.wait_event(&ev)?;
        self.bind(stream)?;
        self.stream = stream.clone();
        Ok(())
    }

    fn bind(&mut self, stream: &Stream) -> Result<()> {
        let lib = cusolver()?;
        check(
            // SAFETY: a live handle used through `&mut self`; a live stream of its device.
            unsafe { lib.cusolverDnSetStream(self.raw, stream.raw() as cudaStream_t) },
            "cusolverDnSetStream",
        )
    }

    /// After replaying the graph of this solver's latest capture on the solver's stream:
    /// [`CaptureInfo::check`] of that capture's routines (`Ok` when it held none). For a graph
    /// launched on another stream, or an earlier capture, keep its
    /// [`take_capture_info`](Self::take_capture_info) and check that.
    pub fn check_replay(&mut self) -> Result<()> {
        let latest = CaptureInfo {
            captured: std::mem::take(&mut self.captured),
        };
        let r = latest.check(&self.stream);
        self.captured = latest.captured;
        r
    }

    /// The `info` words of this solver's latest capture (its routines, in order), taken: a
    /// later capture does not change what it reads.
    pub fn take_capture_info(&mut self) -> CaptureInfo {
        CaptureInfo {
            captured: std::mem::take(&mut self.captured),
        }
    }

    /// Checks `m` against the solver's device and returns its byte range.
    fn check_matrix<T: Scalar>(
        &self,
        routine: &'static str,
        arg: &'static str,
        m: &Matrix<'_>,
    ) -> Result<(u64, u64)> {
        self.check_matrices::<T>(routine, arg, m, 1)
    }

    /// Checks `batch` matrices of `m`'s shape stored `ld * cols` elements apart in `m`'s view.
    fn check_matrices<T: Scalar>(
        &self,
        routine: &'static str,
        arg: &'static str,
        m: &Matrix<'_>,
        batch: usize,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        let need = matrices_bytes(routine, arg, (m.rows, m.cols, m.ld), size, batch)?;
        view(
            routine,
            arg,
            (m.ptr.as_raw(), m.ptr.len(), m.ptr.device().ordinal()),
            need,
            (size, self.device.ordinal()),
        )
    }

    /// Checks a vector of `len` elements of `T` in `v` and returns its byte range.
    fn check_vector<T: Scalar>(
        &self,
        routine: &'static str,
        arg: &'static str,
        v: &DevicePtr,
        len: usize,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        let need = (len as u64).checked_mul(size as u64).ok_or(Error::Shape {
            routine,
            arg,
            why: "the vector's extent overflows".into(),
        })?;
        view(
            routine,
            arg,
            (v.as_raw(), v.len(), v.device().ordinal()),
            need,
            (size, self.device.ordinal()),
        )
    }

    /// Asks a workspace size with the device bound (`query` fills `lwork`).
    fn buffer_size(
        &self,
        call: &'static str,
        query: impl FnOnce(cusolverDnHandle_t, &mut c_int) -> Status,
    ) -> Result<c_int> {
        let _ctx = self.device.bind()?;
        let mut lwork: c_int = 0;
        check(query(self.raw, &mut lwork), call)?;
        if lwork < 0 {
            return Err(Error::Cusolver {
                call,
                code: 0,
                name: "a negative workspace size",
            });
        }
        Ok(lwork)
    }

    /// Runs one routine: its workspace and `info` words from the pool (or, inside a capture,
    /// from the blocks the solver keeps for captures), every view in `views` marked for the
    /// stream, then `call`; outside a capture the `info` words are read back (waiting for the
    /// stream) and a failure is returned typed, inside one they are kept for
    /// [`check_replay`](Self::check_replay).
    ///
    /// `call` gets the addresses of a workspace of `needs.lwork` and `needs.rwork` elements
    /// of `T` and of `needs.infos` i32 words, all live pool memory of the solver's device
    /// marked for the stream, held until the work is done (or by the capture's graphs).
    #[allow(clippy::too_many_arguments, reason = "one routine's whole description")]
    fn launch<T: Scalar>(
        &mut self,
        routine: &'static str,
        capturable: Capturable,
        views: &[&DevicePtr],
        needs: Needs,
        positive: Positive,
        entry: &'static str,
        call: impl FnOnce(cusolverDnHandle_t, &Work) -> Status,
    ) -> Result<()> {
        let (info_at, rwork_at, total) = layout::<T>(&needs)?;
        let stream = self.stream.clone();
        let issue = stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let capture = capture_of(&self.stream)?;
        for v in views {
            v.record_stream(&issue)?;
        }
        let Some(id) = capture else {
            let bytes = usize::try_from(total).map_err(|_| Error::Pool {
                bytes: usize::MAX,
                why: "past the address space".into(),
            })?;
            let block = cudars_mempool::allocator::alloc_on(&self.stream, bytes).map_err(|e| {
                Error::Pool {
                    bytes,
                    why: e.to_string(),
                }
            })?;
            if block.len() < bytes || block.device() != self.device {
                return Err(Error::Pool {
                    bytes,
                    why: format!(
                        "the allocator gave {} bytes on device {}",
                        block.len(),
                        block.device().ordinal()
                    ),
                });
            }
            block.record_stream(&issue)?;
            let base = block.as_raw();
            let work = Work {
                info: base,
                work: base + info_at,
                lwork: needs.lwork,
                rwork: base + rwork_at,
            };
            check(call(self.raw, &work), entry)?;
            drop(issue);
            self.stream.synchronize()?;
            let mut words = vec![0i32; needs.infos];
            block.slice(..needs.infos * 4)?.copy_to_host(&mut words)?;
            return infos(routine, &words, positive, needs.batched);
        };
        if capturable == Capturable::No {
            return Err(Error::Capturing {
                routine,
                why: "cuSOLVER may wait on the host inside the eigen and SVD routines",
            });
        }
        if self.capture != Some(id) {
            self.captured.clear();
            self.info_cursor = None;
            self.capture = Some(id);
        }
        // The graph keeps the handle alive (cuSOLVER's and its cuBLAS's state that captured
        // kernels may use); when no capture of cuda-core runs, the capture is foreign.
        self.handle.record_stream(&issue)?;
        if !graph::captures_in_progress() {
            self.handle_unkept = true;
        }
        let work_base = self
            .capture_work
            .get(&issue, id, total - info_at, self.device)?
            .as_raw();
        // This capture's own info words, kept by its graphs.
        let words = self.info_words(&issue, needs.infos * 4)?;
        let work = Work {
            info: words.as_raw(),
            work: work_base,
            lwork: needs.lwork,
            rwork: work_base + (rwork_at - info_at),
        };
        check(call(self.raw, &work), entry)?;
        self.captured.push(Captured {
            routine,
            positive,
            words,
            count: needs.infos,
            batched: needs.batched,
        });
        Ok(())
    }
}

impl Solver {
    /// `bytes` of `info` words for a routine of the capture `issue` records: from the
    /// capture's block, or a block nothing else holds (every graph and [`CaptureInfo`] that
    /// used it is gone), or a new one from the pool (during the capture: its private pool, no
    /// memory node). The block is marked in the capture, so its graphs keep it.
    fn info_words(&mut self, issue: &Issue<'_>, bytes: usize) -> Result<DevicePtr> {
        let step = bytes.next_multiple_of(4);
        if let Some((block, used)) = &mut self.info_cursor {
            if *used + bytes <= block.len() {
                let words = block.slice(*used..*used + bytes)?;
                *used += step;
                return Ok(words);
            }
        }
        self.info_cursor = None;
        let want = bytes.max(256);
        let free = self
            .info_blocks
            .iter()
            .position(|b| std::sync::Arc::strong_count(b.owner()) == 1 && b.len() >= want);
        let block = match free {
            Some(i) => self.info_blocks[i].clone(),
            None => {
                let b = cudars_mempool::allocator::alloc_on(issue.stream(), want).map_err(|e| {
                    Error::Pool {
                        bytes: want,
                        why: format!("captured info words: {e}"),
                    }
                })?;
                if b.len() < want || b.device() != self.device || !b.as_raw().is_multiple_of(4) {
                    return Err(Error::Pool {
                        bytes: want,
                        why: "the allocator gave a block of another size, device or alignment"
                            .into(),
                    });
                }
                self.info_blocks.push(b.clone());
                b
            }
        };
        block.record_stream(issue)?;
        if !graph::captures_in_progress() {
            // A foreign capture keeps nothing: its graphs may write these words for ever.
            self.info_blocks.retain(|b| b.as_raw() != block.as_raw());
            forever()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(block.clone());
        }
        let words = block.slice(..bytes)?;
        self.info_cursor = Some((block, step));
        Ok(words)
    }
}

/// `info` words as a result: the first nonzero one, typed. A batched routine's positive
/// `info` names its matrix ([`Error::InBatch`]); a refused parameter (cuSOLVER reports it in
/// the first word) is returned as it is.
pub(crate) fn infos(
    routine: &'static str,
    words: &[i32],
    positive: Positive,
    batched: bool,
) -> Result<()> {
    for (k, &w) in words.iter().enumerate() {
        if let Err(e) = info(routine, w, |index| positive(routine, index)) {
            return Err(match e {
                Error::InvalidParameter { .. } => e,
                e if batched => Error::InBatch {
                    batch: k,
                    error: Box::new(e),
                },
                e => e,
            });
        }
    }
    Ok(())
}

/// `rows` of `b` must be `n` (the order of the system).
fn rows_match(routine: &'static str, arg: &'static str, rows: usize, n: usize) -> Result<()> {
    if rows != n {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("{rows} rows for an order-{n} system"),
        });
    }
    Ok(())
}

/// The row interchanges of an LU factorisation ([`Solver::getrf`]) in device memory this value
/// owns: `len` 1-based row indices of a matrix of `rows` rows, each in `1..=rows`, always.
/// cuSOLVER's `getrs` uses them as row indices of its right-hand side without checking them,
/// so nothing but `getrf` ever writes them: they start as valid indices (all 1) and no view
/// of them is handed out ([`to_host`](Self::to_host) copies them).
pub struct Pivots {
    ptr: DevicePtr,
    rows: usize,
    len: usize,
}

impl std::fmt::Debug for Pivots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pivots")
            .field("rows", &self.rows)
            .field("len", &self.len)
            .finish()
    }
}

impl Pivots {
    /// Room for the `len` pivots of an LU of a matrix of `rows` rows (`min(rows, cols)` for
    /// [`getrf`](Solver::getrf) of `rows x cols`; `n` for an order-`n` system), from the pool
    /// on `stream`, set to 1 in stream order.
    pub fn new(stream: &Stream, rows: usize, len: usize) -> Result<Pivots> {
        const R: &str = "Pivots::new";
        crate::check::int(R, "rows", rows)?;
        crate::check::int(R, "len", len)?;
        refuse_per_thread(stream, R)?;
        let bytes = len.max(1) * 4;
        let ptr = cudars_mempool::allocator::alloc_on(stream, bytes).map_err(|e| Error::Pool {
            bytes,
            why: e.to_string(),
        })?;
        if ptr.len() < bytes || ptr.device() != stream.device() || !ptr.as_raw().is_multiple_of(4) {
            return Err(Error::Pool {
                bytes,
                why: "the allocator gave a block of another size, device or alignment".into(),
            });
        }
        ptr.memset_u32_async(1, stream)?;
        Ok(Pivots { ptr, rows, len })
    }

    /// The rows of the matrices whose LU these pivots hold.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// How many pivots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the pivots on the host (a synchronous copy: wait for the factorisation's
    /// stream first).
    pub fn to_host(&self) -> Result<Vec<i32>> {
        let mut v = vec![0i32; self.len];
        self.ptr.slice(..self.len * 4)?.copy_to_host(&mut v)?;
        Ok(v)
    }
}

/// A Jacobi routine's parameters: tolerance and sweeps (cuSOLVER's defaults when `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Jacobi {
    /// The tolerance (default: machine precision).
    pub tolerance: Option<f64>,
    /// The most sweeps (default: 100).
    pub max_sweeps: Option<u32>,
}

/// The factorisations and solves (capturable).
impl Solver {
    /// Cholesky factorisation of the symmetric positive definite `a` (square, its `uplo`
    /// triangle read), in place: `A = L L^T` (`Lower`) or `U^T U` (`Upper`).
    /// [`Error::NotPositiveDefinite`] names the order of the first leading minor that is not.
    pub fn potrf<T: Scalar>(&mut self, a: Matrix<'_>, uplo: Uplo) -> Result<()> {
        const R: &str = "potrf";
        let n = square(R, "a", a.rows, a.cols)?;
        self.check_matrix::<T>(R, "a", &a)?;
        let lib = cusolver()?;
        let (n, lda, ap) = (n as c_int, a.ld as c_int, a.ptr.as_raw());
        let lwork = self.buffer_size("cusolverDnXpotrf_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` holds the n x n matrix with leading dimension lda
            // (checked); a valid out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSpotrf_bufferSize,
                    cusolverDnDpotrf_bufferSize,
                    (h, fill(uplo), n, ap as *mut _, lda, lw)
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr],
            Needs::work(lwork),
            not_positive_definite,
            "cusolverDnXpotrf",
            |h, w| {
                // SAFETY: as above, with a workspace of `lwork` elements and one info word from
                // the pool (launch's contract), all marked for the stream.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSpotrf,
                        cusolverDnDpotrf,
                        (
                            h,
                            fill(uplo),
                            n,
                            ap as *mut _,
                            lda,
                            w.work as *mut _,
                            w.lwork,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// Solves `A X = B` with `a` holding [`potrf`](Self::potrf)'s factor (its `uplo`
    /// triangle); `b` (n x nrhs) is overwritten with `X`. `a` and `b` must not overlap.
    pub fn potrs<T: Scalar>(&mut self, a: Matrix<'_>, uplo: Uplo, b: Matrix<'_>) -> Result<()> {
        const R: &str = "potrs";
        let n = square(R, "a", a.rows, a.cols)?;
        rows_match(R, "b", b.rows, n)?;
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rb = self.check_matrix::<T>(R, "b", &b)?;
        disjoint(R, ("a", ra), ("b", rb))?;
        let lib = cusolver()?;
        let (n, nrhs, lda, ldb) = (n as c_int, b.cols as c_int, a.ld as c_int, b.ld as c_int);
        let (ap, bp) = (a.ptr.as_raw(), b.ptr.as_raw());
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, b.ptr],
            Needs::work(0),
            invalid,
            "cusolverDnXpotrs",
            |h, w| {
                // SAFETY: a live handle; `a` (n x n) and `b` (n x nrhs) checked against their
                // views and disjoint; one info word (launch's contract); all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSpotrs,
                        cusolverDnDpotrs,
                        (
                            h,
                            fill(uplo),
                            n,
                            nrhs,
                            ap as *const _,
                            lda,
                            bp as *mut _,
                            ldb,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// The inverse of the symmetric positive definite matrix whose [`potrf`](Self::potrf)
    /// factor `a` holds, in place (its `uplo` triangle; LAPACK's `xPOTRI`).
    /// [`Error::Singular`] names a zero diagonal element of the factor.
    pub fn potri<T: Scalar>(&mut self, a: Matrix<'_>, uplo: Uplo) -> Result<()> {
        const R: &str = "potri";
        let n = square(R, "a", a.rows, a.cols)?;
        self.check_matrix::<T>(R, "a", &a)?;
        let lib = cusolver()?;
        let (n, lda, ap) = (n as c_int, a.ld as c_int, a.ptr.as_raw());
        let lwork = self.buffer_size("cusolverDnXpotri_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` holds the n x n matrix (checked); an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSpotri_bufferSize,
                    cusolverDnDpotri_bufferSize,
                    (h, fill(uplo), n, ap as *mut _, lda, lw)
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr],
            Needs::work(lwork),
            singular,
            "cusolverDnXpotri",
            |h, w| {
                // SAFETY: as above, with launch's workspace and info word.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSpotri,
                        cusolverDnDpotri,
                        (
                            h,
                            fill(uplo),
                            n,
                            ap as *mut _,
                            lda,
                            w.work as *mut _,
                            w.lwork,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// LU factorisation with partial pivoting of `a` (m x n), in place: `P A = L U`;
    /// `pivots` (made for `m` rows, at least `min(m, n)` of them) receives the 1-based row
    /// indices. [`Error::Singular`] names the first exactly-zero diagonal element of `U` (the
    /// factors are still written).
    pub fn getrf<T: Scalar>(&mut self, a: Matrix<'_>, pivots: &mut Pivots) -> Result<()> {
        const R: &str = "getrf";
        self.check_matrix::<T>(R, "a", &a)?;
        let k = a.rows.min(a.cols);
        if pivots.rows != a.rows || pivots.len < k {
            return Err(Error::Shape {
                routine: R,
                arg: "pivots",
                why: format!(
                    "made for {} rows and {} pivots; a {} x {} LU needs {} rows and {k}",
                    pivots.rows, pivots.len, a.rows, a.cols, a.rows
                ),
            });
        }
        if pivots.ptr.device() != self.device {
            return Err(Error::WrongDevice {
                routine: R,
                arg: "pivots",
                expected: self.device.ordinal(),
                actual: pivots.ptr.device().ordinal(),
            });
        }
        let lib = cusolver()?;
        let (m, n, lda) = (a.rows as c_int, a.cols as c_int, a.ld as c_int);
        let (ap, pp) = (a.ptr.as_raw(), pivots.ptr.as_raw());
        let lwork = self.buffer_size("cusolverDnXgetrf_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` holds the m x n matrix (checked); an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSgetrf_bufferSize,
                    cusolverDnDgetrf_bufferSize,
                    (h, m, n, ap as *mut _, lda, lw)
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, &pivots.ptr],
            Needs::work(lwork),
            singular,
            "cusolverDnXgetrf",
            |h, w| {
                // SAFETY: as above; the pivots' own memory holds at least min(m, n) i32 (checked;
                // no view of it exists, so it is disjoint from `a`); launch's workspace and info
                // word; all marked. getrf writes indices in 1..=m = pivots.rows.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgetrf,
                        cusolverDnDgetrf,
                        (
                            h,
                            m,
                            n,
                            ap as *mut _,
                            lda,
                            w.work as *mut _,
                            pp as *mut c_int,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// Solves `A X = B` with `a` and `pivots` from [`getrf`](Self::getrf) of an order-`n`
    /// matrix; `b` (n x nrhs) is overwritten with `X`. Every pivot is in `1..=n` by
    /// [`Pivots`]' construction, so `b`'s rows are all cuSOLVER touches; pivots of another
    /// factorisation of the same order give a wrong answer, never a stray access.
    pub fn getrs<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        pivots: &Pivots,
        b: Matrix<'_>,
    ) -> Result<()> {
        const R: &str = "getrs";
        let n = square(R, "a", a.rows, a.cols)?;
        rows_match(R, "b", b.rows, n)?;
        if pivots.rows != n || pivots.len < n {
            return Err(Error::Shape {
                routine: R,
                arg: "pivots",
                why: format!(
                    "made for {} rows and {} pivots; an order-{n} system needs {n} of each",
                    pivots.rows, pivots.len
                ),
            });
        }
        if pivots.ptr.device() != self.device {
            return Err(Error::WrongDevice {
                routine: R,
                arg: "pivots",
                expected: self.device.ordinal(),
                actual: pivots.ptr.device().ordinal(),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rb = self.check_matrix::<T>(R, "b", &b)?;
        disjoint(R, ("a", ra), ("b", rb))?;
        let lib = cusolver()?;
        let (n, nrhs, lda, ldb) = (n as c_int, b.cols as c_int, a.ld as c_int, b.ld as c_int);
        let (ap, pp, bp) = (a.ptr.as_raw(), pivots.ptr.as_raw(), b.ptr.as_raw());
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, &pivots.ptr, b.ptr],
            Needs::work(0),
            invalid,
            "cusolverDnXgetrs",
            |h, w| {
                // SAFETY: a live handle; `a` (n x n) and `b` (n x nrhs) checked against their
                // views and disjoint; the pivots' own memory (no view of it exists) holds n
                // indices, each in 1..=n (Pivots' invariant), so the row swaps stay in `b`; one
                // info word; all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgetrs,
                        cusolverDnDgetrs,
                        (
                            h,
                            cublasOperation_t::CUBLAS_OP_N,
                            n,
                            nrhs,
                            ap as *const _,
                            lda,
                            pp as *const c_int,
                            bp as *mut _,
                            ldb,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// QR factorisation of `a` (m x n), in place: `R` in the upper triangle, the Householder
    /// vectors below it, their scalars in `tau` (`min(m, n)` elements of `T`).
    pub fn geqrf<T: Scalar>(&mut self, a: Matrix<'_>, tau: &DevicePtr) -> Result<()> {
        const R: &str = "geqrf";
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rt = self.check_vector::<T>(R, "tau", tau, a.rows.min(a.cols))?;
        disjoint(R, ("a", ra), ("tau", rt))?;
        let lib = cusolver()?;
        let (m, n, lda) = (a.rows as c_int, a.cols as c_int, a.ld as c_int);
        let (ap, tp) = (a.ptr.as_raw(), tau.as_raw());
        let lwork = self.buffer_size("cusolverDnXgeqrf_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` holds the m x n matrix (checked); an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSgeqrf_bufferSize,
                    cusolverDnDgeqrf_bufferSize,
                    (h, m, n, ap as *mut _, lda, lw)
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, tau],
            Needs::work(lwork),
            invalid,
            "cusolverDnXgeqrf",
            |h, w| {
                // SAFETY: as above; `tau` holds min(m, n) elements, disjoint from `a`; launch's
                // workspace and info word; all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgeqrf,
                        cusolverDnDgeqrf,
                        (
                            h,
                            m,
                            n,
                            ap as *mut _,
                            lda,
                            tp as *mut _,
                            w.work as *mut _,
                            w.lwork,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// Forms the first `n` columns of `Q` (m x n, `m >= n >= k`) in place from
    /// [`geqrf`](Self::geqrf)'s `k` Householder vectors in `a` and scalars in `tau`.
    pub fn orgqr<T: Scalar>(&mut self, a: Matrix<'_>, k: usize, tau: &DevicePtr) -> Result<()> {
        const R: &str = "orgqr";
        if !(a.rows >= a.cols && a.cols >= k) {
            return Err(Error::Shape {
                routine: R,
                arg: "a",
                why: format!("needs m >= n >= k; got {} x {} and k = {k}", a.rows, a.cols),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rt = self.check_vector::<T>(R, "tau", tau, k)?;
        disjoint(R, ("a", ra), ("tau", rt))?;
        let lib = cusolver()?;
        let (m, n, kk, lda) = (a.rows as c_int, a.cols as c_int, k as c_int, a.ld as c_int);
        let (ap, tp) = (a.ptr.as_raw(), tau.as_raw());
        let lwork = self.buffer_size("cusolverDnXorgqr_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` (m x n) and `tau` (k) checked; an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSorgqr_bufferSize,
                    cusolverDnDorgqr_bufferSize,
                    (h, m, n, kk, ap as *const _, lda, tp as *const _, lw)
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, tau],
            Needs::work(lwork),
            invalid,
            "cusolverDnXorgqr",
            |h, w| {
                // SAFETY: as above, with launch's workspace and info word; all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSorgqr,
                        cusolverDnDorgqr,
                        (
                            h,
                            m,
                            n,
                            kk,
                            ap as *mut _,
                            lda,
                            tp as *const _,
                            w.work as *mut _,
                            w.lwork,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// Multiplies `c` (m x n) in place by `Q` or `Q^T` (`transpose`) from
    /// [`geqrf`](Self::geqrf): `a` holds its `k = a.cols` Householder vectors (`m x k` for
    /// [`Side::Left`], `n x k` for [`Side::Right`]) and `tau` their scalars.
    pub fn ormqr<T: Scalar>(
        &mut self,
        side: Side,
        transpose: bool,
        a: Matrix<'_>,
        tau: &DevicePtr,
        c: Matrix<'_>,
    ) -> Result<()> {
        const R: &str = "ormqr";
        let k = a.cols;
        let order = match side {
            Side::Left => c.rows,
            Side::Right => c.cols,
        };
        if a.rows != order || k > order {
            return Err(Error::Shape {
                routine: R,
                arg: "a",
                why: format!(
                    "{} x {k} reflectors for a {} x {} `c` on the {side:?}: need {order} rows \
                     and k <= {order}",
                    a.rows, c.rows, c.cols
                ),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rt = self.check_vector::<T>(R, "tau", tau, k)?;
        let rc = self.check_matrix::<T>(R, "c", &c)?;
        disjoint(R, ("a", ra), ("c", rc))?;
        disjoint(R, ("tau", rt), ("c", rc))?;
        let lib = cusolver()?;
        let s = match side {
            Side::Left => cublasSideMode_t::CUBLAS_SIDE_LEFT,
            Side::Right => cublasSideMode_t::CUBLAS_SIDE_RIGHT,
        };
        let t = if transpose {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        };
        let (m, n, kk) = (c.rows as c_int, c.cols as c_int, k as c_int);
        let (lda, ldc) = (a.ld as c_int, c.ld as c_int);
        let (ap, tp, cp) = (a.ptr.as_raw(), tau.as_raw(), c.ptr.as_raw());
        let lwork = self.buffer_size("cusolverDnXormqr_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a`, `tau` and `c` checked for these shapes; an
            // out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSormqr_bufferSize,
                    cusolverDnDormqr_bufferSize,
                    (
                        h,
                        s,
                        t,
                        m,
                        n,
                        kk,
                        ap as *const _,
                        lda,
                        tp as *const _,
                        cp as *const _,
                        ldc,
                        lw
                    )
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::Yes,
            &[a.ptr, tau, c.ptr],
            Needs::work(lwork),
            invalid,
            "cusolverDnXormqr",
            |h, w| {
                // SAFETY: as above; `c` disjoint from `a` and `tau`; launch's workspace and info
                // word; all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSormqr,
                        cusolverDnDormqr,
                        (
                            h,
                            s,
                            t,
                            m,
                            n,
                            kk,
                            ap as *const _,
                            lda,
                            tp as *const _,
                            cp as *mut _,
                            ldc,
                            w.work as *mut _,
                            w.lwork,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }
}

/// A `syevjInfo_t` or `gesvdjInfo_t` for one call, destroyed after it.
struct Params<P: Copy> {
    raw: P,
    destroy: fn(P),
}

impl<P: Copy> Drop for Params<P> {
    fn drop(&mut self) {
        (self.destroy)(self.raw);
    }
}

fn syevj_params(j: Jacobi) -> Result<Params<syevjInfo_t>> {
    let lib = cusolver()?;
    let mut raw: syevjInfo_t = std::ptr::null_mut();
    let status = {
        // SAFETY: a valid out-pointer.
        unsafe { lib.cusolverDnCreateSyevjInfo(&mut raw) }
    };
    check(status, "cusolverDnCreateSyevjInfo")?;
    let p = Params {
        raw,
        destroy: |raw| {
            if let Ok(lib) = cusolver() {
                // SAFETY: created above, destroyed once, after the call that used it.
                let _ = unsafe { lib.cusolverDnDestroySyevjInfo(raw) };
            }
        },
    };
    if let Some(t) = j.tolerance {
        let status = {
            // SAFETY: a live parameter object.
            unsafe { lib.cusolverDnXsyevjSetTolerance(p.raw, t) }
        };
        check(status, "cusolverDnXsyevjSetTolerance")?;
    }
    if let Some(s) = j.max_sweeps {
        let s = c_int::try_from(s).unwrap_or(c_int::MAX);
        let status = {
            // SAFETY: a live parameter object.
            unsafe { lib.cusolverDnXsyevjSetMaxSweeps(p.raw, s) }
        };
        check(status, "cusolverDnXsyevjSetMaxSweeps")?;
    }
    Ok(p)
}

fn gesvdj_params(j: Jacobi) -> Result<Params<gesvdjInfo_t>> {
    let lib = cusolver()?;
    let mut raw: gesvdjInfo_t = std::ptr::null_mut();
    let status = {
        // SAFETY: a valid out-pointer.
        unsafe { lib.cusolverDnCreateGesvdjInfo(&mut raw) }
    };
    check(status, "cusolverDnCreateGesvdjInfo")?;
    let p = Params {
        raw,
        destroy: |raw| {
            if let Ok(lib) = cusolver() {
                // SAFETY: created above, destroyed once, after the call that used it.
                let _ = unsafe { lib.cusolverDnDestroyGesvdjInfo(raw) };
            }
        },
    };
    if let Some(t) = j.tolerance {
        let status = {
            // SAFETY: a live parameter object.
            unsafe { lib.cusolverDnXgesvdjSetTolerance(p.raw, t) }
        };
        check(status, "cusolverDnXgesvdjSetTolerance")?;
    }
    if let Some(s) = j.max_sweeps {
        let s = c_int::try_from(s).unwrap_or(c_int::MAX);
        let status = {
            // SAFETY: a live parameter object.
            unsafe { lib.cusolverDnXgesvdjSetMaxSweeps(p.raw, s) }
        };
        check(status, "cusolverDnXgesvdjSetMaxSweeps")?;
    }
    Ok(p)
}

/// The largest order of cuSOLVER's batched Jacobi routines.
pub const BATCHED_JACOBI_MAX: usize = 32;

/// The eigen and SVD routines (not capturable).
impl Solver {
    /// Eigen-decomposition of the symmetric `a` (its `uplo` triangle) by divide and conquer:
    /// the eigenvalues, ascending, into `w` (n elements of `T`); with `vectors`, the
    /// orthonormal eigenvectors overwrite `a` (column j for `w[j]`).
    pub fn syevd<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        uplo: Uplo,
        w: &DevicePtr,
        vectors: bool,
    ) -> Result<()> {
        const R: &str = "syevd";
        let n = square(R, "a", a.rows, a.cols)?;
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rw = self.check_vector::<T>(R, "w", w, n)?;
        disjoint(R, ("a", ra), ("w", rw))?;
        let lib = cusolver()?;
        let (n, lda, jobz) = (n as c_int, a.ld as c_int, eig_mode(vectors));
        let (ap, wp) = (a.ptr.as_raw(), w.as_raw());
        let lwork = self.buffer_size("cusolverDnXsyevd_bufferSize", |h, lw| {
            // SAFETY: a live handle; `a` (n x n) and `w` (n) checked; an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSsyevd_bufferSize,
                    cusolverDnDsyevd_bufferSize,
                    (
                        h,
                        jobz,
                        fill(uplo),
                        n,
                        ap as *const _,
                        lda,
                        wp as *const _,
                        lw
                    )
                )
            }
        })?;
        self.launch::<T>(
            R,
            Capturable::No,
            &[a.ptr, w],
            Needs::work(lwork),
            no_convergence,
            "cusolverDnXsyevd",
            |h, wk| {
                // SAFETY: as above, `w` disjoint from `a`; launch's workspace and info word.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSsyevd,
                        cusolverDnDsyevd,
                        (
                            h,
                            jobz,
                            fill(uplo),
                            n,
                            ap as *mut _,
                            lda,
                            wp as *mut _,
                            wk.work as *mut _,
                            wk.lwork,
                            wk.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// [`syevd`](Self::syevd) by Jacobi rotations (`xSYEVJ`): faster on small and
    /// well-separated spectra, tunable by `jacobi`. [`Error::NoConvergence`] when the sweeps
    /// run out above the tolerance.
    pub fn syevj<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        uplo: Uplo,
        w: &DevicePtr,
        vectors: bool,
        jacobi: Jacobi,
    ) -> Result<()> {
        self.syevj_any::<T>("syevj", a, uplo, w, vectors, jacobi, 1)
    }

    /// [`syevj`](Self::syevj) of `batch` matrices of order `n <= 32`
    /// ([`BATCHED_JACOBI_MAX`]) stored `ld * n` elements apart from `a`'s first, their
    /// eigenvalues `n` apart in `w` (`xSYEVJBATCHED`). A failure names its matrix
    /// ([`Error::InBatch`]).
    pub fn syevj_batched<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        uplo: Uplo,
        w: &DevicePtr,
        vectors: bool,
        jacobi: Jacobi,
        batch: usize,
    ) -> Result<()> {
        self.syevj_any::<T>("syevj_batched", a, uplo, w, vectors, jacobi, batch)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "syevj's and syevj_batched's arguments"
    )]
    fn syevj_any<T: Scalar>(
        &mut self,
        r: &'static str,
        a: Matrix<'_>,
        uplo: Uplo,
        w: &DevicePtr,
        vectors: bool,
        jacobi: Jacobi,
        batch: usize,
    ) -> Result<()> {
        let n = square(r, "a", a.rows, a.cols)?;
        let batched = r == "syevj_batched";
        if batched && (n > BATCHED_JACOBI_MAX || batch == 0) {
            return Err(Error::Shape {
                routine: r,
                arg: "a",
                why: format!(
                    "order {n}, batch {batch}: the batched Jacobi routine takes orders up to \
                     {BATCHED_JACOBI_MAX} and at least one matrix"
                ),
            });
        }
        let nb = crate::check::int(r, "batch", batch)?;
        let ra = self.check_matrices::<T>(r, "a", &a, batch)?;
        let rw = self.check_vector::<T>(r, "w", w, n.saturating_mul(batch))?;
        disjoint(r, ("a", ra), ("w", rw))?;
        let lib = cusolver()?;
        let params = syevj_params(jacobi)?;
        let pr = params.raw;
        let (n, lda, jobz) = (n as c_int, a.ld as c_int, eig_mode(vectors));
        let (ap, wp) = (a.ptr.as_raw(), w.as_raw());
        let lwork = self.buffer_size("cusolverDnXsyevj_bufferSize", |h, lw| {
            // SAFETY: a live handle and parameter object; `a` (batch matrices n x n) and `w`
            // (n per matrix) checked; an out-pointer.
            unsafe {
                if batched {
                    sd!(
                        T,
                        lib,
                        cusolverDnSsyevjBatched_bufferSize,
                        cusolverDnDsyevjBatched_bufferSize,
                        (
                            h,
                            jobz,
                            fill(uplo),
                            n,
                            ap as *const _,
                            lda,
                            wp as *const _,
                            lw,
                            pr,
                            nb
                        )
                    )
                } else {
                    sd!(
                        T,
                        lib,
                        cusolverDnSsyevj_bufferSize,
                        cusolverDnDsyevj_bufferSize,
                        (
                            h,
                            jobz,
                            fill(uplo),
                            n,
                            ap as *const _,
                            lda,
                            wp as *const _,
                            lw,
                            pr
                        )
                    )
                }
            }
        })?;
        let needs = Needs {
            lwork,
            rwork: 0,
            infos: batch,
            batched,
        };
        self.launch::<T>(
            r,
            Capturable::No,
            &[a.ptr, w],
            needs,
            jacobi_not_converged,
            "cusolverDnXsyevj",
            |h, wk| {
                // SAFETY: as above, `w` disjoint from `a`; launch's workspace and `batch` info
                // words; all marked; the parameter object outlives the call (launch waits for
                // the stream before returning, outside a capture, and refuses one).
                unsafe {
                    if batched {
                        sd!(
                            T,
                            lib,
                            cusolverDnSsyevjBatched,
                            cusolverDnDsyevjBatched,
                            (
                                h,
                                jobz,
                                fill(uplo),
                                n,
                                ap as *mut _,
                                lda,
                                wp as *mut _,
                                wk.work as *mut _,
                                wk.lwork,
                                wk.info as *mut c_int,
                                pr,
                                nb
                            )
                        )
                    } else {
                        sd!(
                            T,
                            lib,
                            cusolverDnSsyevj,
                            cusolverDnDsyevj,
                            (
                                h,
                                jobz,
                                fill(uplo),
                                n,
                                ap as *mut _,
                                lda,
                                wp as *mut _,
                                wk.work as *mut _,
                                wk.lwork,
                                wk.info as *mut c_int,
                                pr
                            )
                        )
                    }
                }
            },
        )?;
        drop(params);
        Ok(())
    }

    /// Singular value decomposition `A = U S V^T` of `a` (m x n, `m >= n`, which
    /// cuSOLVER's gesvd requires: decompose the transpose otherwise; `a` is destroyed): the
    /// singular values, descending, into `s` (n elements of `T`), and when given all of `U`
    /// (m x m) and of `V^T` (n x n). [`Error::NoConvergence`] if the bidiagonal iteration fails.
    pub fn gesvd<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        s: &DevicePtr,
        u: Option<Matrix<'_>>,
        vt: Option<Matrix<'_>>,
    ) -> Result<()> {
        const R: &str = "gesvd";
        let (m, n) = (a.rows, a.cols);
        if m < n {
            return Err(Error::Shape {
                routine: R,
                arg: "a",
                why: format!("{m} x {n}: cuSOLVER's gesvd needs m >= n (decompose the transpose)"),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rs = self.check_vector::<T>(R, "s", s, n)?;
        disjoint(R, ("a", ra), ("s", rs))?;
        let mut outs = vec![("a", ra), ("s", rs)];
        for (arg, x, rows, cols) in [("u", &u, m, m), ("vt", &vt, n, n)] {
            if let Some(x) = x {
                self.check_output::<T>(R, arg, x, (rows, cols), &mut outs)?;
            }
        }
        let lib = cusolver()?;
        let (mi, ni, lda) = (m as c_int, n as c_int, a.ld as c_int);
        let lwork = self.buffer_size("cusolverDnXgesvd_bufferSize", |h, lw| {
            // SAFETY: a live handle; an out-pointer.
            unsafe {
                sd!(
                    T,
                    lib,
                    cusolverDnSgesvd_bufferSize,
                    cusolverDnDgesvd_bufferSize,
                    (h, mi, ni, lw)
                )
            }
        })?;
        let side = |x: &Option<Matrix<'_>>| -> (c_schar, u64, c_int) {
            match x {
                Some(x) => (b'A' as c_schar, x.ptr.as_raw(), x.ld as c_int),
                None => (b'N' as c_schar, 0, 1),
            }
        };
        let (ju, up, ldu) = side(&u);
        let (jv, vp, ldvt) = side(&vt);
        let (ap, sp) = (a.ptr.as_raw(), s.as_raw());
        let mut views = vec![a.ptr, s];
        views.extend(u.iter().chain(vt.iter()).map(|x| x.ptr));
        let needs = Needs {
            lwork,
            rwork: n.saturating_sub(1).max(1),
            infos: 1,
            batched: false,
        };
        self.launch::<T>(
            R,
            Capturable::No,
            &views,
            needs,
            no_convergence,
            "cusolverDnXgesvd",
            |h, w| {
                // SAFETY: a live handle; `a` (m x n, m >= n), `s` (n), U (m x m) and V^T (n x n)
                // when asked (null and 'N' otherwise) checked and pairwise disjoint; launch's
                // workspaces of `lwork` and n - 1 elements and its info word; all marked.
                unsafe {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgesvd,
                        cusolverDnDgesvd,
                        (
                            h,
                            ju,
                            jv,
                            mi,
                            ni,
                            ap as *mut _,
                            lda,
                            sp as *mut _,
                            up as *mut _,
                            ldu,
                            vp as *mut _,
                            ldvt,
                            w.work as *mut _,
                            w.lwork,
                            w.rwork as *mut _,
                            w.info as *mut c_int
                        )
                    )
                }
            },
        )
    }

    /// Singular value decomposition `A = U S V^T` of `a` (m x n, any shape; `a` is
    /// destroyed) by Jacobi rotations (`xGESVDJ`): the `min(m, n)` singular values,
    /// descending, into `s`; with `vectors = Some((u, v))`, `U` (m x m, or m x min(m, n)
    /// with `economy`) and `V` (not transposed: n x n, or n x min(m, n)).
    pub fn gesvdj<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        s: &DevicePtr,
        vectors: Option<(Matrix<'_>, Matrix<'_>)>,
        economy: bool,
        jacobi: Jacobi,
    ) -> Result<()> {
        self.gesvdj_any::<T>("gesvdj", a, s, vectors, economy, jacobi, 1)
    }

    /// [`gesvdj`](Self::gesvdj) of `batch` matrices of at most 32 x 32
    /// ([`BATCHED_JACOBI_MAX`]) stored `ld * n` elements apart from `a`'s first; `s` holds
    /// `min(m, n)` values per matrix, `U` and `V` (full, not economy) their `ld * m` and
    /// `ld * n` elements per matrix (`xGESVDJBATCHED`). A failure names its matrix
    /// ([`Error::InBatch`]).
    pub fn gesvdj_batched<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        s: &DevicePtr,
        vectors: Option<(Matrix<'_>, Matrix<'_>)>,
        jacobi: Jacobi,
        batch: usize,
    ) -> Result<()> {
        self.gesvdj_any::<T>("gesvdj_batched", a, s, vectors, false, jacobi, batch)
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "gesvdj's and gesvdj_batched's arguments"
    )]
    fn gesvdj_any<T: Scalar>(
        &mut self,
        r: &'static str,
        a: Matrix<'_>,
        s: &DevicePtr,
        vectors: Option<(Matrix<'_>, Matrix<'_>)>,
        economy: bool,
        jacobi: Jacobi,
        batch: usize,
    ) -> Result<()> {
        let (m, n) = (a.rows, a.cols);
        let k = m.min(n);
        let batched = r == "gesvdj_batched";
        if batched && (m > BATCHED_JACOBI_MAX || n > BATCHED_JACOBI_MAX || batch == 0) {
            return Err(Error::Shape {
                routine: r,
                arg: "a",
                why: format!(
                    "{m} x {n}, batch {batch}: the batched Jacobi SVD takes up to \
                     {BATCHED_JACOBI_MAX} x {BATCHED_JACOBI_MAX} and at least one matrix"
                ),
            });
        }
        let nb = crate::check::int(r, "batch", batch)?;
        let ra = self.check_matrices::<T>(r, "a", &a, batch)?;
        let rs = self.check_vector::<T>(r, "s", s, k.saturating_mul(batch))?;
        disjoint(r, ("a", ra), ("s", rs))?;
        let mut outs = vec![("a", ra), ("s", rs)];
        let cols = |full: usize| if economy { k } else { full };
        let (jobz, (up, ldu), (vp, ldv)) = match &vectors {
            Some((u, v)) => {
                self.check_outputs::<T>(r, "u", u, (m, cols(m)), batch, &mut outs)?;
                self.check_outputs::<T>(r, "v", v, (n, cols(n)), batch, &mut outs)?;
                (
                    eig_mode(true),
                    (u.ptr.as_raw(), u.ld as c_int),
                    (v.ptr.as_raw(), v.ld as c_int),
                )
            }
            // cuSOLVER reads ldu and ldv even without vectors: the smallest it accepts.
            None => (
                eig_mode(false),
                (0, m.max(1) as c_int),
                (0, n.max(1) as c_int),
            ),
        };
        let lib = cusolver()?;
        let params = gesvdj_params(jacobi)?;
        let pr = params.raw;
        let econ = c_int::from(economy);
        let (mi, ni, lda) = (m as c_int, n as c_int, a.ld as c_int);
        let (ap, sp) = (a.ptr.as_raw(), s.as_raw());
        let lwork = self.buffer_size("cusolverDnXgesvdj_bufferSize", |h, lw| {
            // SAFETY: a live handle and parameter object; `a`, `s` and the vectors (when
            // asked) checked for these shapes; an out-pointer.
            unsafe {
                if batched {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgesvdjBatched_bufferSize,
                        cusolverDnDgesvdjBatched_bufferSize,
                        (
                            h,
                            jobz,
                            mi,
                            ni,
                            ap as *const _,
                            lda,
                            sp as *const _,
                            up as *const _,
                            ldu,
                            vp as *const _,
                            ldv,
                            lw,
                            pr,
                            nb
                        )
                    )
                } else {
                    sd!(
                        T,
                        lib,
                        cusolverDnSgesvdj_bufferSize,
                        cusolverDnDgesvdj_bufferSize,
                        (
                            h,
                            jobz,
                            econ,
                            mi,
                            ni,
                            ap as *const _,
                            lda,
                            sp as *const _,
                            up as *const _,
                            ldu,
                            vp as *const _,
                            ldv,
                            lw,
                            pr
                        )
                    )
                }
            }
        })?;
        let mut views = vec![a.ptr, s];
        if let Some((u, v)) = &vectors {
            views.push(u.ptr);
            views.push(v.ptr);
        }
        let needs = Needs {
            lwork,
            rwork: 0,
            infos: batch,
            batched,
        };
        self.launch::<T>(
            r,
            Capturable::No,
            &views,
            needs,
            jacobi_not_converged,
            "cusolverDnXgesvdj",
            |h, w| {
                // SAFETY: as above, the outputs pairwise disjoint and disjoint from `a`;
                // launch's workspace and `batch` info words; all marked; the parameter object
                // outlives the call (launch waits for the stream, and refuses captures).
                unsafe {
                    if batched {
                        sd!(
                            T,
                            lib,
                            cusolverDnSgesvdjBatched,
                            cusolverDnDgesvdjBatched,
                            (
                                h,
                                jobz,
                                mi,
                                ni,
                                ap as *mut _,
                                lda,
                                sp as *mut _,
                                up as *mut _,
                                ldu,
                                vp as *mut _,
                                ldv,
                                w.work as *mut _,
                                w.lwork,
                                w.info as *mut c_int,
                                pr,
                                nb
                            )
                        )
                    } else {
                        sd!(
                            T,
                            lib,
                            cusolverDnSgesvdj,
                            cusolverDnDgesvdj,
                            (
                                h,
                                jobz,
                                econ,
                                mi,
                                ni,
                                ap as *mut _,
                                lda,
                                sp as *mut _,
                                up as *mut _,
                                ldu,
                                vp as *mut _,
                                ldv,
                                w.work as *mut _,
                                w.lwork,
                                w.info as *mut c_int,
                                pr
                            )
                        )
                    }
                }
            },
        )?;
        drop(params);
        Ok(())
    }

    /// Checks an output matrix of `shape`, disjoint from every view in `outs`; adds it.
    fn check_output<T: Scalar>(
        &self,
        r: &'static str,
        arg: &'static str,
        x: &Matrix<'_>,
        shape: (usize, usize),
        outs: &mut Vec<(&'static str, (u64, u64))>,
    ) -> Result<()> {
        self.check_outputs::<T>(r, arg, x, shape, 1, outs)
    }

    /// [`check_output`](Self::check_output) for `batch` matrices `ld * cols` apart.
    fn check_outputs<T: Scalar>(
        &self,
        r: &'static str,
        arg: &'static str,
        x: &Matrix<'_>,
        (rows, cols): (usize, usize),
        batch: usize,
        outs: &mut Vec<(&'static str, (u64, u64))>,
    ) -> Result<()> {
        if (x.rows, x.cols) != (rows, cols) {
            return Err(Error::Shape {
                routine: r,
                arg,
                why: format!("{} x {}; it must be {rows} x {cols}", x.rows, x.cols),
            });
        }
        let rx = self.check_matrices::<T>(r, arg, x, batch)?;
        for &(o, ro) in outs.iter() {
            disjoint(r, (o, ro), (arg, rx))?;
        }
        outs.push((arg, rx));
        Ok(())
    }
}

fn refuse_per_thread(stream: &Stream, routine: &'static str) -> Result<()> {
    if stream.kind() == StreamKind::PerThread {
        return Err(Error::PerThreadStream { routine });
    }
    Ok(())
}

/// A handle nobody uses any more, destroyed by whichever thread buries it.
struct Raw(cusolverDnHandle_t, Device);

// SAFETY: a handle no solver uses; destroyed once.
unsafe impl Send for Raw {}

impl Raw {
    fn destroy(self) {
        let Ok(lib) = cusolver() else { return };
        let Ok(_ctx) = self.1.bind() else { return };
        let _relaxed = graph::RelaxedCaptureMode::new();
        // SAFETY: the handle a solver created, destroyed once; work it queued stays ordered
        // on its stream.
        let _ = unsafe { lib.cusolverDnDestroy(self.0) };
    }
}

/// Handles dropped while a capture may run (`cusolverDnDestroy` may synchronise the device,
/// which would invalidate another thread's capture): destroyed after it.
fn grave() -> &'static std::sync::Mutex<Vec<Raw>> {
    static GRAVE: std::sync::Mutex<Vec<Raw>> = std::sync::Mutex::new(Vec::new());
    &GRAVE
}

/// The solver's handle as a zero-byte owner: destroyed when the solver and every graph that
/// captured one of its routines are gone.
struct HandleOwner(Raw);

// SAFETY: the handle inside is used only by `Drop` (once, on whichever thread drops the last
// owner); the solver calls it through its own copy under `&mut self`.
unsafe impl Send for HandleOwner {}
// SAFETY: as above: `&HandleOwner` reaches only the device, never the handle.
unsafe impl Sync for HandleOwner {}

// SAFETY: a zero-byte range (allowed: `size() == 0`, `as_raw()` 0) on the handle's device;
// nothing is copied to or from it and the values never change. Its drop destroys the handle
// after every solver and graph holding it is gone.
unsafe impl cudars_core::DeviceAlloc for HandleOwner {
    fn device(&self) -> Device {
        self.0 .1
    }
    fn as_raw(&self) -> cudars_core::sys::CUdeviceptr {
        0
    }
    fn size(&self) -> usize {
        0
    }
}

impl Drop for HandleOwner {
    fn drop(&mut self) {
        let raw = Raw(self.0 .0, self.0 .1);
        let mut g = grave()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if capture_may_run() {
            g.push(raw);
            return;
        }
        let dead = std::mem::take(&mut *g);
        drop(g);
        raw.destroy();
        for r in dead {
            r.destroy();
        }
    }
}

impl Drop for Solver {
    fn drop(&mut self) {
        self.captured.clear();
        self.info_cursor = None;
        self.capture_work.retire();
        if self.handle_unkept {
            forever()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(self.handle.clone());
        }
    }
}
