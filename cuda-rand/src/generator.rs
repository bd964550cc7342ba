//! [`Generator`]: one cuRAND generator (host API), bound to one stream, filling device views.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use cudars_core::graph::{captures_in_progress, is_capturing, touches_capture};
use cudars_core::{Device, DevicePtr, Event, Stream, StreamKind};
use cudars_rand_sys::{cudaStream_t, curandGenerator_t, Curand};

use crate::check::{self, Fill, Shape, Target};
use crate::error::{check, library, Error, Result};
use crate::float::{to_f64, width, RandFloat};
use crate::kind::{RngKind, RngOrdering};

/// Generators whose destruction failed (or could not be attempted) and which were leaked:
/// see [`destroy_failures`].
static DESTROY_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many generators were leaked because destroying them failed: the wait for their
/// queued work, `curandDestroyGenerator` itself, or (for a generator dropped inside a host
/// function or during a capture) starting the thread that destroys it later. A drop never
/// panics and never reports; this count is where such a failure shows.
pub fn destroy_failures() -> u64 {
    DESTROY_FAILURES.load(AtomicOrdering::Relaxed)
}

/// Generators dropped where they could not be destroyed at once, not destroyed yet: see
/// [`deferred_destroys`].
static DEFERRED: AtomicU64 = AtomicU64::new(0);

/// How many dropped generators wait to be destroyed on a thread of their own: those dropped
/// inside a host function, while a capture begun through `cuda-core` ran, or while their
/// stream was being captured (see [`Generator`]'s Drop). 0 again once each is destroyed (or
/// leaked and counted in [`destroy_failures`]).
pub fn deferred_destroys() -> u64 {
    DEFERRED.load(AtomicOrdering::Acquire)
}

/// How often a generator dropped during a capture checks whether it may be destroyed.
const DEFERRED_POLL: Duration = Duration::from_millis(50);

/// A cuRAND generator of one [`RngKind`] on one device, issuing its work on one [`Stream`]
/// (`curandSetStream`). It fills [`DevicePtr`] views (plain allocations, slices, pool blocks)
/// with uniform, normal, log-normal and Poisson numbers and raw bits.
///
/// # Checks, ordering, refusals
///
/// Every fill takes its element count from the view, so cuRAND never writes outside it, and
/// checks, before anything is issued (no library call is made for a refusal): the view is of
/// the generator's device, a whole number of elements, aligned to them; the count suits the
/// generator (even for normal and log-normal numbers of a pseudo-random generator, a multiple
/// of the dimensions for Sobol); the numeric arguments are what cuRAND takes. A refusal is a
/// typed [`Error`] naming the argument. An empty view succeeds without a call.
///
/// Then the work is issued as every launcher of the workspace issues it: the stream's device
/// checked and the capture gate held ([`Stream::issue`]), the view marked as used by the
/// stream ([`DevicePtr::record_stream`]: a pool block is neither freed nor handed out again
/// before the numbers are written, and the stream waits for the block's earlier owner), then
/// the cuRAND call, with the device's context current.
///
/// A stream being captured into a graph is refused ([`Error::Capturing`]): the graph would
/// write the generator's internal state at each replay, after the generator may be gone, and
/// would repeat the same numbers.
///
/// # Defaults (CuPy's)
///
/// [`Generator::new`] seeds a pseudo-random generator from the operating system
/// (`/dev/urandom`), as CuPy's `RandomState(seed=None)` does with `os.urandom`; use
/// [`Generator::with_seed`] or [`set_seed`](Self::set_seed) for reproducible numbers.
/// `RngKind::default()` is XORWOW, CuPy's `CURAND_RNG_PSEUDO_DEFAULT`; PyTorch uses Philox.
/// [`set_seed`](Self::set_seed) also resets the offset to 0, as CuPy's `seed()` does, so the
/// same seed always gives the same numbers.
///
/// # Threads
///
/// `Send`: a generator may move to another thread (each call makes its device's context
/// current there). Not `Sync`: cuRAND does not synchronise calls on one generator, and every
/// method that reaches cuRAND takes `&mut self`. Give each thread its own generator (and
/// stream) to generate in parallel.
///
/// ```
/// fn needs_send<T: Send>() {}
/// needs_send::<cudars_rand::Generator>();
/// ```
///
/// ```compile_fail
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<cudars_rand::Generator>();
/// ```
///
/// The per-thread default stream ([`Stream::per_thread`]) is refused ([`Error::Unsupported`]):
/// its handle names the calling thread's stream, so a generator moved to another thread would
/// issue there, unordered with its earlier work on the generator's state.
///
/// # Drop
///
/// Dropping waits for the work queued on the generator's stream (an event, not a stream
/// synchronisation), then destroys the generator (`curandDestroyGenerator`) with its context
/// current. Dropped inside a host function, or while a capture runs (one begun through
/// `cuda-core`, or on the generator's stream), the generator is destroyed on a thread of its
/// own once that is allowed ([`deferred_destroys`] counts those waiting). A failure leaks it
/// and counts in [`destroy_failures`].
///
/// ```no_run
/// use cudars_core::{DevicePtr, Device, Stream};
/// use cudars_rand::{Generator, RngKind};
///
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let mut gen = Generator::with_seed(RngKind::Philox, &stream, 42)?;
/// let out = DevicePtr::alloc(&dev, 1 << 20)?; // 262,144 f32
/// gen.normal::<f32>(&out, 0.0, 1.0)?;
/// stream.synchronize()?;
/// let mut host = vec![0f32; 1 << 18];
/// out.copy_to_host(&mut host)?;
/// # Ok::<(), cudars_rand::Error>(())
/// ```
#[derive(Debug)]
pub struct Generator {
    raw: curandGenerator_t,
    lib: &'static Curand,
    kind: RngKind,
    stream: Stream,
    seed: Option<u64>,
    dimensions: u32,
    ordering: RngOrdering,
}

// SAFETY: a cuRAND generator may be used from any thread as long as calls on it do not
// overlap, which `&mut self` on every method that reaches cuRAND guarantees (the type is not
// `Sync`); each call binds the device's context on the calling thread rather than relying on
// thread state; `Stream` is `Send` and `Curand` is `Sync`.
unsafe impl Send for Generator {}

/// The entropy CuPy's `RandomState(seed=None)` takes: 8 bytes of `/dev/urandom`, else (no
/// such device) a hash with the process's random keys of the time and a counter.
pub(crate) fn os_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_ok() {
        return u64::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::collections::hash_map::RandomState::new()
        .hash_one((now, COUNTER.fetch_add(1, AtomicOrdering::Relaxed)))
}

/// `true` when `stream` is being captured (for the legacy null stream: when work there would
/// join a capture). Errors of the question are the caller's.
fn captured(stream: &Stream) -> Result<bool> {
    match stream.kind() {
        StreamKind::LegacyNull => Ok(touches_capture(stream)),
        _ => Ok(is_capturing(stream)?),
    }
}

impl Generator {
    /// A generator of `kind` on `stream`'s device, issuing on `stream`. A pseudo-random
    /// generator is seeded from the operating system (CuPy's `RandomState(seed=None)`); a
    /// quasi-random one starts at offset 0 with 1 dimension.
    ///
    /// ```no_run
    /// # let dev = cudars_core::Device::new(0)?;
    /// # let stream = cudars_core::Stream::new(&dev)?;
    /// // What cupy.random uses: XORWOW, seeded from the OS.
    /// let gen = cudars_rand::Generator::new(Default::default(), &stream)?;
    /// assert!(gen.seed().is_some());
    /// # Ok::<(), cudars_rand::Error>(())
    /// ```
    pub fn new(kind: RngKind, stream: &Stream) -> Result<Generator> {
        let seed = kind.is_pseudo().then(os_seed);
        Generator::create(kind, stream, seed)
    }

    /// A pseudo-random generator of `kind` on `stream`, seeded with `seed` at offset 0.
    /// [`Error::Unsupported`] for a quasi-random kind, before any call.
    pub fn with_seed(kind: RngKind, stream: &Stream, seed: u64) -> Result<Generator> {
        check::seedable(kind)?;
        Generator::create(kind, stream, Some(seed))
    }

    fn create(kind: RngKind, stream: &Stream, seed: Option<u64>) -> Result<Generator> {
        refuse_per_thread(kind, stream)?;
        let lib = library()?;
        let device = stream.device();
        let _ctx = device.bind()?;
        let mut raw: curandGenerator_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a kind of the header; the device's primary context
        // is current, so cuRAND (through the CUDA runtime) makes the generator there.
        let status = unsafe { lib.curandCreateGenerator(&mut raw, kind.to_raw()) };
        check(status, "curandCreateGenerator")?;
        let mut generator = Generator {
            raw,
            lib,
            kind,
            stream: stream.clone(),
            seed: None,
            dimensions: 1,
            ordering: RngOrdering::default_for(kind),
        };
        // From here a failure drops `generator`, which destroys it.
        generator.bind_stream(stream)?;
        if let Some(seed) = seed {
            generator.apply_seed(seed)?;
        }
        Ok(generator)
    }

    /// The kind.
    pub fn kind(&self) -> RngKind {
        self.kind
    }

    /// The device (its stream's).
    pub fn device(&self) -> Device {
        self.stream.device()
    }

    /// The stream the generator issues on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The seed last set (`None` for quasi-random generators).
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// The Sobol dimensions (1 for pseudo-random generators).
    pub fn dimensions(&self) -> u32 {
        self.dimensions
    }

    /// The ordering last set (the kind's default at first).
    pub fn ordering(&self) -> RngOrdering {
        self.ordering
    }

    /// The cuRAND handle, for calls this crate does not wrap. It stays owned by the
    /// generator: do not destroy it or change its stream.
    pub fn as_raw(&self) -> curandGenerator_t {
        self.raw
    }

    fn shape(&self) -> Shape {
        Shape {
            kind: self.kind,
            dimensions: self.dimensions,
            device: self.device().ordinal(),
        }
    }

    /// `curandSetStream` to `stream`, which then becomes the generator's.
    fn bind_stream(&mut self, stream: &Stream) -> Result<()> {
        let _ctx = self.device().bind()?;
        // SAFETY: a live generator; `stream` is a live stream of the generator's device (a
        // `Stream` of that device, checked by the callers), and the clone kept below keeps
        // it alive for as long as the generator may issue on it.
        let status = unsafe {
            self.lib
                .curandSetStream(self.raw, stream.raw() as cudaStream_t)
        };
        check(status, "curandSetStream")?;
        self.stream = stream.clone();
        Ok(())
    }

    /// Issues the generator's later work on `stream` (`curandSetStream`), a stream of the
    /// generator's device ([`Error::WrongDevice`] naming `"stream"` otherwise, before any
    /// call). `stream` first waits for the work already queued on the old stream, so the
    /// generator's state is never used by both at once. Refused ([`Error::Capturing`]) while
    /// either stream is being captured.
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        check::same_device("stream", self.device().ordinal(), stream.device().ordinal())?;
        refuse_per_thread(self.kind, stream)?;
        if *stream == self.stream {
            return Ok(());
        }
        if captured(&self.stream)? {
            return Err(Error::Capturing {
                arg: "the generator's stream",
            });
        }
        if captured(stream)? {
            return Err(Error::Capturing { arg: "stream" });
        }
        let device = self.device();
        let queued = Event::new(&device)?;
        queued.record(&self.stream)?;
        stream.wait_event(&queued)?;
        self.bind_stream(stream)
    }

    fn apply_seed(&mut self, seed: u64) -> Result<()> {
        let _ctx = self.device().bind()?;
        // SAFETY: a live pseudo-random generator (the callers check the kind); any seed is
        // valid.
        let status = unsafe { self.lib.curandSetPseudoRandomGeneratorSeed(self.raw, seed) };
        check(status, "curandSetPseudoRandomGeneratorSeed")?;
        // SAFETY: a live generator; any offset is valid.
        let status = unsafe { self.lib.curandSetGeneratorOffset(self.raw, 0) };
        check(status, "curandSetGeneratorOffset")?;
        self.seed = Some(seed);
        Ok(())
    }

    /// Seeds a pseudo-random generator and sets its offset to 0
    /// (`curandSetPseudoRandomGeneratorSeed`, `curandSetGeneratorOffset`), as CuPy's
    /// `RandomState.seed(seed)`: the same seed gives the same numbers again.
    /// [`Error::Unsupported`] for Sobol, before any call.
    pub fn set_seed(&mut self, seed: u64) -> Result<()> {
        check::seedable(self.kind)?;
        self.apply_seed(seed)
    }

    /// Sets the absolute position in the sequence (`curandSetGeneratorOffset`): the next
    /// number generated is number `offset` of the sequence the seed (or Sobol's dimensions)
    /// define. Any kind, any value.
    pub fn set_offset(&mut self, offset: u64) -> Result<()> {
        let _ctx = self.device().bind()?;
        // SAFETY: a live generator; any offset is valid.
        let status = unsafe { self.lib.curandSetGeneratorOffset(self.raw, offset) };
        check(status, "curandSetGeneratorOffset")
    }

    /// Sets how results are laid out (`curandSetGeneratorOrdering`): a `Pseudo*` ordering
    /// for pseudo-random generators, [`RngOrdering::QuasiDefault`] for Sobol
    /// ([`Error::Unsupported`] otherwise, before any call).
    pub fn set_ordering(&mut self, ordering: RngOrdering) -> Result<()> {
        check::ordering(self.kind, ordering)?;
        let _ctx = self.device().bind()?;
        // SAFETY: a live generator; an ordering value of the header, of the generator's
        // class (cuRAND answers OUT_OF_RANGE for one the kind does not support).
        let status = unsafe {
            self.lib
                .curandSetGeneratorOrdering(self.raw, ordering.to_raw())
        };
        check(status, "curandSetGeneratorOrdering")?;
        self.ordering = ordering;
        Ok(())
    }

    /// Sets the number of Sobol dimensions, 1 to 20,000
    /// (`curandSetQuasiRandomGeneratorDimensions`). Every fill of a Sobol generator must then
    /// be a multiple of `dimensions` elements: `count / dimensions` points, dimension by
    /// dimension. [`Error::Unsupported`] for pseudo-random generators, [`Error::BadValue`]
    /// naming `"dimensions"` out of range, before any call.
    pub fn set_dimensions(&mut self, dimensions: u32) -> Result<()> {
        check::dimensions(self.kind, dimensions)?;
        let _ctx = self.device().bind()?;
        // SAFETY: a live quasi-random generator and a dimension count in cuRAND's range.
        let status = unsafe {
            self.lib
                .curandSetQuasiRandomGeneratorDimensions(self.raw, dimensions)
        };
        check(status, "curandSetQuasiRandomGeneratorDimensions")?;
        self.dimensions = dimensions;
        Ok(())
    }

    /// Fills `out` with uniform numbers in (0, 1] (`curandGenerateUniform` /
    /// `curandGenerateUniformDouble`): CuPy's `random.random_sample` draws from cuRAND the
    /// same way (and maps 1 to 0 to get [0, 1)).
    pub fn uniform<T: RandFloat>(&mut self, out: &DevicePtr) -> Result<()> {
        self.fill(
            out,
            Fill::Uniform {
                element: width::<T>(),
            },
        )
    }

    /// Fills `out` with normal numbers of mean `mean` and standard deviation `std`
    /// (`curandGenerateNormal` / `...Double`). `mean` finite, `std` finite and above 0;
    /// with a pseudo-random generator, an even number of elements (cuRAND makes them in
    /// pairs; CuPy generates one more and drops it: do the same with a view one element
    /// longer).
    pub fn normal<T: RandFloat>(&mut self, out: &DevicePtr, mean: T, std: T) -> Result<()> {
        self.fill(
            out,
            Fill::Normal {
                element: width::<T>(),
                mean: to_f64(mean),
                std: to_f64(std),
            },
        )
    }

    /// [`normal`](Self::normal) with mean 0 and standard deviation 1 (CuPy's
    /// `random.standard_normal`, PyTorch's `randn`).
    pub fn standard_normal<T: RandFloat>(&mut self, out: &DevicePtr) -> Result<()> {
        self.fill(
            out,
            Fill::Normal {
                element: width::<T>(),
                mean: 0.0,
                std: 1.0,
            },
        )
    }

    /// Fills `out` with log-normal numbers: `exp` of normal numbers of mean `mean` and
    /// standard deviation `std` (`curandGenerateLogNormal` / `...Double`). The rules of
    /// [`normal`](Self::normal).
    pub fn log_normal<T: RandFloat>(&mut self, out: &DevicePtr, mean: T, std: T) -> Result<()> {
        self.fill(
            out,
            Fill::LogNormal {
                element: width::<T>(),
                mean: to_f64(mean),
                std: to_f64(std),
            },
        )
    }

    /// Fills `out`, a view of `u32`s, with Poisson numbers of mean `lambda`
    /// (`curandGeneratePoisson`), `lambda` in (0, 400,000] (cuRAND's range).
    pub fn poisson(&mut self, out: &DevicePtr, lambda: f64) -> Result<()> {
        self.fill(out, Fill::Poisson { lambda })
    }

    /// Fills `out`, a view of `u32`s, with raw 32-bit numbers, every bit random
    /// (`curandGenerate`). Not for 64-bit Sobol generators ([`Error::Unsupported`]: use
    /// [`bits_u64`](Self::bits_u64)).
    pub fn bits_u32(&mut self, out: &DevicePtr) -> Result<()> {
        self.fill(out, Fill::Bits32)
    }

    /// Fills `out`, a view of `u64`s, with raw 64-bit numbers (`curandGenerateLongLong`).
    /// Only 64-bit Sobol generators make them ([`Error::Unsupported`] otherwise).
    pub fn bits_u64(&mut self, out: &DevicePtr) -> Result<()> {
        self.fill(out, Fill::Bits64)
    }

    /// The one path of every fill: checks ([`check::plan`]), then the issue, the mark, the
    /// call.
    fn fill(&mut self, out: &DevicePtr, fill: Fill) -> Result<()> {
        let count = check::plan(self.shape(), fill, Target::of(out))?;
        if count == 0 {
            return Ok(());
        }
        let device = self.device();
        // The stream's device checked and the capture gate held until the call is issued: a
        // capture begun through cuda-core on another thread waits for it.
        let issue = self.stream.issue(device)?;
        if captured(&self.stream)? {
            return Err(Error::Capturing {
                arg: "the generator's stream",
            });
        }
        out.record_stream(&issue)?;
        let _ctx = device.bind()?;
        let (lib, raw, addr) = (self.lib, self.raw, out.as_raw());
        // SAFETY: a live generator issuing on `issue`'s stream, with its device's context
        // current. `addr` is the address of `out`, live device memory of that device (the
        // view holds its owner), and `count` elements of the entry point's type fill exactly
        // the view's bytes, at an address aligned to them (`plan`). The view is marked as
        // used by the stream above, so its memory is not freed or reused before the kernel
        // has written it, and the stream is ordered after its earlier owner's work. The
        // numeric arguments are in cuRAND's ranges (`plan`); f32 arguments came from f32
        // values, so converting them back is exact.
        let (status, call) = unsafe {
            match fill {
                Fill::Uniform { element: 4 } => (
                    lib.curandGenerateUniform(raw, addr as *mut f32, count),
                    "curandGenerateUniform",
                ),
                Fill::Uniform { .. } => (
                    lib.curandGenerateUniformDouble(raw, addr as *mut f64, count),
                    "curandGenerateUniformDouble",
                ),
                Fill::Normal {
                    element: 4,
                    mean,
                    std,
                } => (
                    lib.curandGenerateNormal(raw, addr as *mut f32, count, mean as f32, std as f32),
                    "curandGenerateNormal",
                ),
                Fill::Normal { mean, std, .. } => (
                    lib.curandGenerateNormalDouble(raw, addr as *mut f64, count, mean, std),
                    "curandGenerateNormalDouble",
                ),
                Fill::LogNormal {
                    element: 4,
                    mean,
                    std,
                } => (
                    lib.curandGenerateLogNormal(
                        raw,
                        addr as *mut f32,
                        count,
                        mean as f32,
                        std as f32,
                    ),
                    "curandGenerateLogNormal",
                ),
                Fill::LogNormal { mean, std, .. } => (
                    lib.curandGenerateLogNormalDouble(raw, addr as *mut f64, count, mean, std),
                    "curandGenerateLogNormalDouble",
                ),
                Fill::Poisson { lambda } => (
                    lib.curandGeneratePoisson(raw, addr as *mut u32, count, lambda),
                    "curandGeneratePoisson",
                ),
                Fill::Bits32 => (
                    lib.curandGenerate(raw, addr as *mut u32, count),
                    "curandGenerate",
                ),
                Fill::Bits64 => (
                    lib.curandGenerateLongLong(raw, addr as *mut u64, count),
                    "curandGenerateLongLong",
                ),
            }
        };
        drop(issue);
        check(status, call)
    }
}

/// A generator on its way to `curandDestroyGenerator`.
struct Doomed {
    raw: curandGenerator_t,
    lib: &'static Curand,
    stream: Stream,
}

// SAFETY: the handle is no longer reachable from its `Generator` (which is being dropped),
// so the one thread that holds this value is the only user; cuRAND lets any thread destroy
// a generator.
unsafe impl Send for Doomed {}

impl Doomed {
    /// Whether destroying now must wait: inside a host function (no CUDA calls there), while
    /// a capture begun through cuda-core runs (cuRAND's `cudaFree` would invalidate it), or
    /// while the generator's stream is captured (the wait for its work would be captured).
    /// A failure to ask about the stream does not wait: the destruction then fails, counted.
    fn must_wait(&self) -> bool {
        cudars_core::release::inside_host_function()
            || captures_in_progress()
            || matches!(captured(&self.stream), Ok(true))
    }

    /// Waits for the work queued on the generator's stream, then destroys it; a failure is
    /// counted and leaks the generator.
    fn destroy(self) {
        let device = self.stream.device();
        let destroyed = (|| -> Result<()> {
            let _ctx = device.bind()?;
            // Every earlier stream of the generator is ordered before this one (set_stream),
            // so this event covers all its queued work.
            let queued = Event::new(&device)?;
            queued.record(&self.stream)?;
            queued.synchronize()?;
            // SAFETY: a live generator no one else holds, none of whose work is pending (just
            // waited for); its device's context is current.
            let status = unsafe { self.lib.curandDestroyGenerator(self.raw) };
            check(status, "curandDestroyGenerator")
        })();
        if destroyed.is_err() {
            DESTROY_FAILURES.fetch_add(1, AtomicOrdering::Relaxed);
        }
    }

    /// Destroys on a thread of its own once [`must_wait`](Self::must_wait) clears.
    fn destroy_later(self) {
        DEFERRED.fetch_add(1, AtomicOrdering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("cudars-rand-drop".into())
            .spawn(move || {
                while self.must_wait() {
                    std::thread::sleep(DEFERRED_POLL);
                }
                self.destroy();
                DEFERRED.fetch_sub(1, AtomicOrdering::AcqRel);
            });
        if spawned.is_err() {
            DESTROY_FAILURES.fetch_add(1, AtomicOrdering::Relaxed);
            DEFERRED.fetch_sub(1, AtomicOrdering::AcqRel);
        }
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        let doomed = Doomed {
            raw: self.raw,
            lib: self.lib,
            stream: self.stream.clone(),
        };
        if doomed.must_wait() {
            doomed.destroy_later();
        } else {
            doomed.destroy();
        }
    }
}

/// [`Error::Unsupported`] for the per-thread default stream (see [`Generator`]).
fn refuse_per_thread(kind: RngKind, stream: &Stream) -> Result<()> {
    if stream.kind() == cudars_core::StreamKind::PerThread {
        return Err(Error::Unsupported {
            what: "the per-thread default stream",
            kind,
            why: "a Send generator would issue on whichever thread's stream, unordered with its \
                  earlier work; use a created stream",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_seeds_differ_from_call_to_call() {
        let seeds: std::collections::HashSet<u64> = (0..16).map(|_| os_seed()).collect();
        assert_eq!(seeds.len(), 16);
    }
}
