//! [`Plan`]: one cuFFT plan, its work areas from the pool, and its execution on a stream.
//!
//! * **Work areas.** cuFFT's own allocation is off (`cufftSetAutoAllocation(0)`): the work
//!   area is a pool block, taken on the stream of the first execution. During a capture the
//!   plan uses a second work area, taken from the pool during its first captured execution
//!   (so from the capture's private pool: no memory node is recorded) and kept for every
//!   later capture, so repeated captures do not grow memory; graphs captured through
//!   `cuda-core`/`cuda-graph` keep it alive. Graphs that captured one plan share that work
//!   area: replay them one after another, not at the same time (the rule PyTorch's and
//!   cuda-blas's captured workspaces follow).
//! * **Streams.** A plan is bound to the stream it last ran on. Running it on another stream
//!   rebinds it: the new stream first waits for the plan's last execution on the old one, so
//!   the two never share the work area at the same time. The per-thread default stream is
//!   refused (a pool block cannot be ordered on it across threads, and a plan moves between
//!   threads): use a created stream.
//! * **Destruction.** cuFFT's handle owns device tables (twiddles) that its kernels read, so
//!   a graph that captured a plan keeps the handle alive: the handle is a zero-byte owner
//!   marked in each capture like the memory the captured kernels use, and is destroyed when
//!   the plan and every such graph are gone (never, after a foreign capture that kept
//!   nothing). `cufftDestroy` may synchronise the device; while a capture may run in the
//!   process, dropped handles wait and are destroyed after it.

use std::sync::{Mutex, PoisonError};

use cudars_core::graph::{self, CaptureStatus};
use cudars_core::memory::DeviceAlloc;
use cudars_core::{Device, DevicePtr, Issue, Stream, StreamKind};
use cudars_fft_sys::{cudaDataType_t, cudaStream_t, cufftHandle, cufftType};

use crate::error::{check, cufft, Error, Result};
use crate::layout::{Direction, Geometry, Precision, Transform};

/// A cuFFT plan for one [`Geometry`] on one device.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_fft::{Direction, Geometry, Plan, Precision, Transform};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// // 64 transforms of 1,024 complex f32 numbers, packed.
/// let g = Geometry::packed(Transform::C2C, Precision::Single, &[1024], 64)?;
/// let mut plan = Plan::new(&dev, g)?;
/// let x = cudars_mempool::driver::malloc(&stream, 64 * 1024 * 8)?;
/// let y = cudars_mempool::driver::malloc(&stream, 64 * 1024 * 8)?;
/// plan.exec(&stream, &x, &y, Direction::Forward)?;
/// plan.exec(&stream, &y, &y, Direction::Inverse)?; // in place: 1024 x
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Plan {
    raw: cufftHandle,
    /// The handle's owner ([`Handle`]): graphs that captured the plan hold it too.
    handle: DevicePtr,
    /// A capture that kept nothing alive (foreign) used the handle: it is never destroyed.
    handle_unkept: bool,
    device: Device,
    geometry: Geometry,
    /// The bytes the input and output layouts reach.
    reach: (u64, u64),
    work_bytes: usize,
    /// Execution state.
    eager: Option<DevicePtr>,
    capture: Option<DevicePtr>,
    capture_id: Option<u64>,
    /// A capture kept nothing alive (foreign): its graphs may replay into `capture` forever.
    capture_unkept: bool,
    /// The work area the handle has now (its address).
    bound_work: u64,
    /// The stream the handle is set to.
    bound: Option<Stream>,
    /// The stream of the last eager execution (which used the eager work area).
    eager_stream: Option<Stream>,
    /// The capture and stream of the last captured execution (the capture work area).
    capture_stream: Option<(u64, Stream)>,
    /// The stream the eager work area was last marked for.
    work_stream: Option<Stream>,
    executions: u64,
}

// SAFETY: a cuFFT handle may be used from any thread so long as calls on it do not overlap:
// every call goes through `&mut self` (or happens in `Drop`), with the plan's device bound.
unsafe impl Send for Plan {}
// SAFETY: `&self` methods only read plain fields; nothing reaches the handle through `&self`.
unsafe impl Sync for Plan {}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("device", &self.device.ordinal())
            .field("geometry", &self.geometry)
            .field("work_bytes", &self.work_bytes)
            .finish()
    }
}

/// The input and output data types of a half-precision (cufftXt) transform.
fn xt_types(t: Transform) -> (cudaDataType_t, cudaDataType_t) {
    match t {
        Transform::C2C => (cudaDataType_t::CUDA_C_16F, cudaDataType_t::CUDA_C_16F),
        Transform::R2C => (cudaDataType_t::CUDA_R_16F, cudaDataType_t::CUDA_C_16F),
        Transform::C2R => (cudaDataType_t::CUDA_C_16F, cudaDataType_t::CUDA_R_16F),
    }
}

/// The `cufftType` of a single- or double-precision transform (half precision plans through
/// cufftXt; it never reaches here, and gets C2C's type if it did).
fn cufft_type(t: Transform, p: Precision) -> cufftType {
    match (t, p) {
        (Transform::C2C, Precision::Single) => cufftType::CUFFT_C2C,
        (Transform::R2C, Precision::Single) => cufftType::CUFFT_R2C,
        (Transform::C2R, Precision::Single) => cufftType::CUFFT_C2R,
        (Transform::C2C, Precision::Double) => cufftType::CUFFT_Z2Z,
        (Transform::R2C, Precision::Double) => cufftType::CUFFT_D2Z,
        (Transform::C2R, Precision::Double) => cufftType::CUFFT_Z2D,
        (_, _) => cufftType::CUFFT_C2C,
    }
}

/// Whether a capture may be running anywhere in the process.
fn capture_may_run() -> bool {
    graph::captures_in_progress() || graph::announced_captures_in_progress()
}

/// The capture `stream` is recorded into (asked of the driver only when one may run).
pub(crate) fn capture_of(stream: &Stream) -> Result<Option<u64>> {
    if !graph::may_be_captured(stream) {
        return Ok(None);
    }
    let info = graph::capture_info(stream)?;
    match info.status {
        CaptureStatus::None => Ok(None),
        CaptureStatus::Active => Ok(info.id),
        CaptureStatus::Invalidated => Err(Error::Unsupported {
            what: "FFT execution",
            why: "the stream's capture has been invalidated; end it before issuing more work"
                .into(),
        }),
    }
}

impl Plan {
    /// Plans `geometry` on `device` (`cufftMakePlanMany64`, cuFFT's own work-area allocation
    /// off). Nothing is allocated for the work area until the first execution.
    pub fn new(device: &Device, geometry: Geometry) -> Result<Plan> {
        let lib = cufft()?;
        let _ctx = device.bind()?;
        // Planning allocates (twiddles, kernels): inside another thread's capture in global
        // mode that would be refused and invalidate the capture.
        let _relaxed = graph::RelaxedCaptureMode::new()?;
        let mut raw: cufftHandle = 0;
        // SAFETY: a valid out-pointer; the device's context is current.
        check(unsafe { lib.cufftCreate(&mut raw) }, "cufftCreate")?;
        let handle = DevicePtr::new(Handle {
            raw,
            device: *device,
        });
        let reach = (geometry.input_bytes()?, geometry.output_bytes()?);
        let mut plan = Plan {
            raw,
            handle,
            handle_unkept: false,
            device: *device,
            reach,
            geometry,
            work_bytes: 0,
            eager: None,
            capture: None,
            capture_id: None,
            capture_unkept: false,
            bound_work: 0,
            bound: None,
            eager_stream: None,
            capture_stream: None,
            work_stream: None,
            executions: 0,
        };
        // (On an error below, dropping `plan` destroys the handle.)
        let off = {
            // SAFETY: the handle just created.
            unsafe { lib.cufftSetAutoAllocation(raw, 0) }
        };
        check(off, "cufftSetAutoAllocation")?;
        let g = &plan.geometry;
        let to64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
        let mut n = to64(&g.shape);
        let mut inembed = to64(&g.input.embed);
        let mut onembed = to64(&g.output.embed);
        let (inp, onp) = if g.advanced {
            (inembed.as_mut_ptr(), onembed.as_mut_ptr())
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let mut work: usize = 0;
        let made = if g.precision == Precision::Half {
            let (it, ot) = xt_types(g.transform);
            // SAFETY: as below; the data types are half precision's for this transform (the
            // execution type is the complex one, as cufftXt requires).
            unsafe {
                lib.cufftXtMakePlanMany(
                    raw,
                    g.shape.len() as i32,
                    n.as_mut_ptr() as *mut _,
                    inp as *mut _,
                    g.input.stride as i64 as _,
                    g.input.dist as i64 as _,
                    it,
                    onp as *mut _,
                    g.output.stride as i64 as _,
                    g.output.dist as i64 as _,
                    ot,
                    g.batch as i64 as _,
                    &mut work,
                    cudaDataType_t::CUDA_C_16F,
                )
            }
        } else {
            // SAFETY: `n` and the embeddings hold `rank` values each (Geometry checked the
            // ranks, that every value fits i64, and that the layouts stay within what the
            // views will be checked against); null embeddings select the packed layout.
            unsafe {
                lib.cufftMakePlanMany64(
                    raw,
                    g.shape.len() as i32,
                    n.as_mut_ptr() as *mut _,
                    inp as *mut _,
                    g.input.stride as i64 as _,
                    g.input.dist as i64 as _,
                    onp as *mut _,
                    g.output.stride as i64 as _,
                    g.output.dist as i64 as _,
                    cufft_type(g.transform, g.precision),
                    g.batch as i64 as _,
                    &mut work,
                )
            }
        };
        let entry = if g.precision == Precision::Half {
            "cufftXtMakePlanMany"
        } else {
            "cufftMakePlanMany64"
        };
        check(made, entry)?;
        plan.work_bytes = work;
        Ok(plan)
    }

    /// The geometry planned.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The plan's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The work area cuFFT asked for, in bytes.
    pub fn work_bytes(&self) -> usize {
        self.work_bytes
    }

    /// Executions issued so far.
    pub fn executions(&self) -> u64 {
        self.executions
    }

    /// The raw handle, for cuFFT calls this crate does not wrap. Calls on it must not overlap
    /// with this plan's executions (hold `&mut Plan` meanwhile), and must not change its
    /// stream, work area or auto-allocation.
    pub fn as_raw(&self) -> cufftHandle {
        self.raw
    }

    /// Runs the transform on `stream` from `input` into `output` (the same view for C2C in
    /// place). `dir` must be [`Direction::Forward`] for R2C and [`Direction::Inverse`] for
    /// C2R. Checked before anything is issued: the stream's and views' device, each view's
    /// alignment and length against the layout, and how the views overlap. C2R may overwrite
    /// its input.
    pub fn exec(
        &mut self,
        stream: &Stream,
        input: &DevicePtr,
        output: &DevicePtr,
        dir: Direction,
    ) -> Result<()> {
        let dir = self.geometry.direction(dir)?;
        for (arg, d) in [("input", input.device()), ("output", output.device())] {
            if d != self.device {
                return Err(Error::WrongDevice {
                    arg,
                    expected: self.device.ordinal(),
                    actual: d.ordinal(),
                });
            }
        }
        self.geometry.check_views_reaching(
            (input.as_raw(), input.len()),
            (output.as_raw(), output.len()),
            self.reach,
        )?;
        if stream.kind() == StreamKind::PerThread {
            // A pool block (the work area, the views) cannot be ordered on the per-thread
            // stream across threads (cuda-mempool's rule), and a plan moves between threads.
            return Err(Error::Unsupported {
                what: "FFT execution",
                why: "on the per-thread default stream: a plan's work area cannot be ordered \
                      there across threads; use a created stream"
                    .into(),
            });
        }
        let lib = cufft()?;
        let issue = stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let capture = capture_of(stream)?;
        self.bind_stream(stream, capture)?;
        self.bind_work(&issue, capture)?;
        if capture.is_some() {
            // The graph keeps the handle (and the tables its kernels read) alive; when no
            // capture of cuda-core runs, the capture is foreign and keeps nothing.
            self.handle.record_stream(&issue)?;
            if !graph::captures_in_progress() {
                self.handle_unkept = true;
            }
        }
        input.record_stream(&issue)?;
        output.record_stream(&issue)?;
        let (i, o) = (input.as_raw(), output.as_raw());
        let sign = match dir {
            Direction::Forward => cudars_fft_sys::CUFFT_FORWARD,
            Direction::Inverse => cudars_fft_sys::CUFFT_INVERSE as i32,
        };
        let raw = self.raw;
        // SAFETY: (each arm) the plan's transform type; both views are on the plan's device,
        // aligned to their elements, at least as long as the layout reaches, and marked for
        // the stream; they overlap only as an in-place C2C with one layout (check_views);
        // the handle's stream is `stream` and its work area a live pool block of
        // `work_bytes` bytes held by the plan (and by the capture's graphs when captured).
        let status = unsafe {
            match (self.geometry.transform, self.geometry.precision) {
                (Transform::C2C, Precision::Single) => {
                    lib.cufftExecC2C(raw, i as *mut _, o as *mut _, sign)
                }
                (Transform::R2C, Precision::Single) => {
                    lib.cufftExecR2C(raw, i as *mut _, o as *mut _)
                }
                (Transform::C2R, Precision::Single) => {
                    lib.cufftExecC2R(raw, i as *mut _, o as *mut _)
                }
                (Transform::C2C, Precision::Double) => {
                    lib.cufftExecZ2Z(raw, i as *mut _, o as *mut _, sign)
                }
                (Transform::R2C, Precision::Double) => {
                    lib.cufftExecD2Z(raw, i as *mut _, o as *mut _)
                }
                (Transform::C2R, Precision::Double) => {
                    lib.cufftExecZ2D(raw, i as *mut _, o as *mut _)
                }
                // Half precision (cufftXt): one entry point; the sign matters for C2C only.
                (_, _) => lib.cufftXtExec(raw, i as *mut _, o as *mut _, sign),
            }
        };
        check(status, "cufftExec")?;
        self.executions += 1;
        Ok(())
    }

    /// Sets the handle's stream to `stream`, ordering it after the plan's last execution on
    /// another stream that used the same work area: the last eager one for an eager
    /// execution, the last one of the same capture for a captured one.
    fn bind_stream(&mut self, stream: &Stream, capture: Option<u64>) -> Result<()> {
        match capture {
            None => {
                if let Some(old) = &self.eager_stream {
                    if old != stream {
                        let ev = old.record(None)?;
                        stream.wait_event(&ev)?;
                    }
                }
                if self.eager_stream.as_ref() != Some(stream) {
                    self.eager_stream = Some(stream.clone());
                }
            }
            Some(id) => {
                if let Some((cid, old)) = &self.capture_stream {
                    if *cid == id && old != stream {
                        // Both streams are in this capture: an edge between the two runs.
                        let ev = old.record(None)?;
                        stream.wait_event(&ev)?;
                    }
                }
                if self.capture_stream.as_ref().map(|(c, s)| (*c, s)) != Some((id, stream)) {
                    self.capture_stream = Some((id, stream.clone()));
                }
            }
        }
        if self.bound.as_ref() == Some(stream) {
            return Ok(());
        }
        let lib = cufft()?;
        check(
            // SAFETY: a live handle used through `&mut self`; the stream is live and of the
            // plan's device (checked by `issue`).
            unsafe { lib.cufftSetStream(self.raw, stream.raw() as cudaStream_t) },
            "cufftSetStream",
        )?;
        self.bound = Some(stream.clone());
        Ok(())
    }

    /// Gives the handle the eager work area, or the capture's, taking it from the pool on
    /// first need.
    fn bind_work(&mut self, issue: &Issue<'_>, capture: Option<u64>) -> Result<()> {
        if self.work_bytes == 0 {
            return Ok(());
        }
        let stream = issue.stream();
        let take = |what: &str| -> Result<DevicePtr> {
            let p = cudars_mempool::allocator::alloc_on(stream, self.work_bytes).map_err(|e| {
                Error::Pool {
                    bytes: self.work_bytes,
                    why: format!("{what}: {e}"),
                }
            })?;
            if p.device() != self.device || p.len() < self.work_bytes {
                return Err(Error::Unsupported {
                    what: "FFT work area",
                    why: format!(
                        "the allocator gave {} bytes on device {}; the plan needs {} on device {}",
                        p.len(),
                        p.device().ordinal(),
                        self.work_bytes,
                        self.device.ordinal()
                    ),
                });
            }
            Ok(p)
        };
        let addr = match capture {
            None => {
                if self.eager.is_none() {
                    self.eager = Some(take("eager")?);
                }
                let p = self.eager.as_ref().map(|p| p.as_raw()).unwrap_or(0);
                if self.work_stream.as_ref() != Some(stream) {
                    // First use on this stream: the block's owner orders its free after it.
                    if let Some(w) = &self.eager {
                        w.record_stream(issue)?;
                    }
                    self.work_stream = Some(stream.clone());
                }
                p
            }
            Some(id) => {
                if self.capture.is_none() {
                    // Taken during the capture: from its private pool.
                    self.capture = Some(take("capture")?);
                }
                if self.capture_id != Some(id) {
                    if let Some(w) = &self.capture {
                        // Marked, the work area is kept alive by the graphs of a capture begun
                        // through cuda-core; when none runs, the capture is foreign and the
                        // work area is never freed.
                        w.record_stream(issue)?;
                        if !graph::captures_in_progress() {
                            self.capture_unkept = true;
                        }
                    }
                    self.capture_id = Some(id);
                }
                self.capture.as_ref().map(|p| p.as_raw()).unwrap_or(0)
            }
        };
        if self.bound_work != addr {
            let lib = cufft()?;
            check(
                // SAFETY: a live handle used through `&mut self`; the work area is a live
                // block of the plan's device of at least `work_bytes` bytes, held by the plan.
                unsafe { lib.cufftSetWorkArea(self.raw, addr as *mut std::ffi::c_void) },
                "cufftSetWorkArea",
            )?;
            self.bound_work = addr;
        }
        Ok(())
    }
}

/// Capture work areas and handles that foreign graphs may still replay into: never freed.
fn forever() -> &'static Mutex<Vec<DevicePtr>> {
    static FOREVER: Mutex<Vec<DevicePtr>> = Mutex::new(Vec::new());
    &FOREVER
}

/// Handles dropped while a capture may run, destroyed after it.
fn grave() -> &'static Mutex<Vec<(cufftHandle, Device)>> {
    static GRAVE: Mutex<Vec<(cufftHandle, Device)>> = Mutex::new(Vec::new());
    &GRAVE
}

fn destroy(raw: cufftHandle, device: Device) {
    let Ok(lib) = cufft() else { return };
    let Ok(_ctx) = device.bind() else { return };
    let _relaxed = graph::RelaxedCaptureMode::new();
    // SAFETY: a handle a plan created and never destroyed; nothing uses it any more. Work it
    // queued stays ordered on its stream.
    let _ = unsafe { lib.cufftDestroy(raw) };
}

/// Destroys the plans that waited for captures to end, when none may run now. Returns how
/// many are still waiting.
pub fn bury() -> usize {
    if capture_may_run() {
        return grave().lock().unwrap_or_else(PoisonError::into_inner).len();
    }
    let dead: Vec<_> = std::mem::take(&mut *grave().lock().unwrap_or_else(PoisonError::into_inner));
    for (raw, device) in dead {
        destroy(raw, device);
    }
    0
}

/// A cuFFT handle as a zero-byte owner: dropped (destroyed) when the plan and every graph
/// that captured it are gone.
struct Handle {
    raw: cufftHandle,
    device: Device,
}

// SAFETY: a zero-byte range (allowed: `size() == 0`, `as_raw()` 0) on the handle's device;
// nothing is copied to or from it, and the values never change. Its drop destroys the
// handle, after every graph and plan holding it is gone; work queued with it stays ordered
// on its streams.
unsafe impl DeviceAlloc for Handle {
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

impl Drop for Handle {
    fn drop(&mut self) {
        // `cufftDestroy` may synchronise: while a capture may run, the handle waits.
        if capture_may_run() {
            grave()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.raw, self.device));
        } else {
            destroy(self.raw, self.device);
            bury();
        }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        let mut forever = forever().lock().unwrap_or_else(PoisonError::into_inner);
        if self.capture_unkept {
            if let Some(p) = self.capture.take() {
                forever.push(p);
            }
        }
        if self.handle_unkept {
            forever.push(self.handle.clone());
        }
        // The work areas go back to the pool in stream order (capture-safe); the handle goes
        // with the last of the plan and the graphs that captured it.
    }
}
