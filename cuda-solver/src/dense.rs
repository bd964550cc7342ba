//! [`Solver`]: a cuSOLVER dense handle bound to a stream, and its factorisations and solves.

use std::ffi::{c_int, c_schar};

use cudars_core::graph::{self, CaptureStatus};
use cudars_core::{Device, DevicePtr, Stream, StreamKind};
use cudars_solver_sys::{
    cublasFillMode_t, cublasOperation_t, cudaStream_t, cusolverDnHandle_t, cusolverEigMode_t,
    cusolverStatus_t, Cusolver, MissingSymbol,
};

use crate::check::{disjoint, info, matrix_bytes, square, view, Matrix, Uplo};
use crate::error::{check, cusolver, Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

type Status = std::result::Result<cusolverStatus_t, MissingSymbol>;

/// The element types of the dense routines: `f32` and `f64`.
///
/// # Safety
///
/// Implemented only here: each method forwards to cuSOLVER's routine of the type, whose
/// contract (live handle, pointers of the sizes the arguments say) is the caller's.
pub unsafe trait Scalar: sealed::Sealed + bytemuck::Pod + Send + Sync {
    /// `S` or `D`.
    const NAME: &'static str;
    #[doc(hidden)]
    unsafe fn potrf_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        uplo: cublasFillMode_t,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn potrf(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        uplo: cublasFillMode_t,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        work: *mut Self,
        lwork: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn potrs(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        uplo: cublasFillMode_t,
        n: c_int,
        nrhs: c_int,
        a: *const Self,
        lda: c_int,
        b: *mut Self,
        ldb: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    unsafe fn getrf_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn getrf(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        work: *mut Self,
        ipiv: *mut c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn getrs(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        trans: cublasOperation_t,
        n: c_int,
        nrhs: c_int,
        a: *const Self,
        lda: c_int,
        ipiv: *const c_int,
        b: *mut Self,
        ldb: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    unsafe fn geqrf_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn geqrf(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        tau: *mut Self,
        work: *mut Self,
        lwork: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn orgqr_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: *const Self,
        lda: c_int,
        tau: *const Self,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn orgqr(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: *mut Self,
        lda: c_int,
        tau: *const Self,
        work: *mut Self,
        lwork: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn syevd_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        jobz: cusolverEigMode_t,
        uplo: cublasFillMode_t,
        n: c_int,
        a: *const Self,
        lda: c_int,
        w: *const Self,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn syevd(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        jobz: cusolverEigMode_t,
        uplo: cublasFillMode_t,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        w: *mut Self,
        work: *mut Self,
        lwork: c_int,
        info: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    unsafe fn gesvd_buffer_size(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        m: c_int,
        n: c_int,
        lwork: *mut c_int,
    ) -> Status;
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "LAPACK's signature")]
    unsafe fn gesvd(
        lib: &Cusolver,
        h: cusolverDnHandle_t,
        jobs: (c_schar, c_schar),
        m: c_int,
        n: c_int,
        a: *mut Self,
        lda: c_int,
        s: *mut Self,
        u: (*mut Self, c_int),
        vt: (*mut Self, c_int),
        work: *mut Self,
        lwork: c_int,
        rwork: *mut Self,
        info: *mut c_int,
    ) -> Status;
}

macro_rules! scalar {
    ($t:ty, $name:literal, $pbs:ident, $p:ident, $ps:ident, $gbs:ident, $g:ident, $gs:ident,
     $qbs:ident, $q:ident, $obs:ident, $o:ident, $ebs:ident, $e:ident, $sbs:ident, $sv:ident) => {
        // SAFETY: each method forwards to cuSOLVER's routine of this type, unchanged.
        unsafe impl Scalar for $t {
            const NAME: &'static str = $name;
            unsafe fn potrf_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                uplo: cublasFillMode_t,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$pbs(h, uplo, n, a, lda, lwork) }
            }
            unsafe fn potrf(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                uplo: cublasFillMode_t,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                work: *mut Self,
                lwork: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$p(h, uplo, n, a, lda, work, lwork, info) }
            }
            unsafe fn potrs(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                uplo: cublasFillMode_t,
                n: c_int,
                nrhs: c_int,
                a: *const Self,
                lda: c_int,
                b: *mut Self,
                ldb: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$ps(h, uplo, n, nrhs, a, lda, b, ldb, info) }
            }
            unsafe fn getrf_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$gbs(h, m, n, a, lda, lwork) }
            }
            unsafe fn getrf(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                work: *mut Self,
                ipiv: *mut c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$g(h, m, n, a, lda, work, ipiv, info) }
            }
            unsafe fn getrs(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                trans: cublasOperation_t,
                n: c_int,
                nrhs: c_int,
                a: *const Self,
                lda: c_int,
                ipiv: *const c_int,
                b: *mut Self,
                ldb: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$gs(h, trans, n, nrhs, a, lda, ipiv, b, ldb, info) }
            }
            unsafe fn geqrf_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$qbs(h, m, n, a, lda, lwork) }
            }
            unsafe fn geqrf(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                tau: *mut Self,
                work: *mut Self,
                lwork: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$q(h, m, n, a, lda, tau, work, lwork, info) }
            }
            unsafe fn orgqr_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                k: c_int,
                a: *const Self,
                lda: c_int,
                tau: *const Self,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$obs(h, m, n, k, a, lda, tau, lwork) }
            }
            unsafe fn orgqr(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                k: c_int,
                a: *mut Self,
                lda: c_int,
                tau: *const Self,
                work: *mut Self,
                lwork: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$o(h, m, n, k, a, lda, tau, work, lwork, info) }
            }
            unsafe fn syevd_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                jobz: cusolverEigMode_t,
                uplo: cublasFillMode_t,
                n: c_int,
                a: *const Self,
                lda: c_int,
                w: *const Self,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$ebs(h, jobz, uplo, n, a, lda, w, lwork) }
            }
            unsafe fn syevd(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                jobz: cusolverEigMode_t,
                uplo: cublasFillMode_t,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                w: *mut Self,
                work: *mut Self,
                lwork: c_int,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$e(h, jobz, uplo, n, a, lda, w, work, lwork, info) }
            }
            unsafe fn gesvd_buffer_size(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                m: c_int,
                n: c_int,
                lwork: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe { lib.$sbs(h, m, n, lwork) }
            }
            unsafe fn gesvd(
                lib: &Cusolver,
                h: cusolverDnHandle_t,
                (jobu, jobvt): (c_schar, c_schar),
                m: c_int,
                n: c_int,
                a: *mut Self,
                lda: c_int,
                s: *mut Self,
                (u, ldu): (*mut Self, c_int),
                (vt, ldvt): (*mut Self, c_int),
                work: *mut Self,
                lwork: c_int,
                rwork: *mut Self,
                info: *mut c_int,
            ) -> Status {
                // SAFETY: the caller's contract.
                unsafe {
                    lib.$sv(
                        h, jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, rwork,
                        info,
                    )
                }
            }
        }
    };
}

scalar!(
    f32,
    "S",
    cusolverDnSpotrf_bufferSize,
    cusolverDnSpotrf,
    cusolverDnSpotrs,
    cusolverDnSgetrf_bufferSize,
    cusolverDnSgetrf,
    cusolverDnSgetrs,
    cusolverDnSgeqrf_bufferSize,
    cusolverDnSgeqrf,
    cusolverDnSorgqr_bufferSize,
    cusolverDnSorgqr,
    cusolverDnSsyevd_bufferSize,
    cusolverDnSsyevd,
    cusolverDnSgesvd_bufferSize,
    cusolverDnSgesvd
);
scalar!(
    f64,
    "D",
    cusolverDnDpotrf_bufferSize,
    cusolverDnDpotrf,
    cusolverDnDpotrs,
    cusolverDnDgetrf_bufferSize,
    cusolverDnDgetrf,
    cusolverDnDgetrs,
    cusolverDnDgeqrf_bufferSize,
    cusolverDnDgeqrf,
    cusolverDnDorgqr_bufferSize,
    cusolverDnDorgqr,
    cusolverDnDsyevd_bufferSize,
    cusolverDnDsyevd,
    cusolverDnDgesvd_bufferSize,
    cusolverDnDgesvd
);

fn fill(uplo: Uplo) -> cublasFillMode_t {
    match uplo {
        Uplo::Lower => cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
        Uplo::Upper => cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
    }
}

/// A cuSOLVER dense handle bound to a stream (CuPy's `cusolver` handle of a device, PyTorch's
/// per-stream one). Every routine checks its views first, takes its workspace from the pool on
/// the stream, runs, and reads the routine's `info` back (waiting for the stream): a matrix
/// that is not positive definite or is singular is an `Err` naming the index, never a silently
/// wrong answer. A stream being captured is refused ([`Error::Capturing`]): the routines read
/// `info` on the host. The per-thread default stream is refused too (a pool workspace cannot
/// be ordered on it across threads).
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
    /// The routine's `info` (one i32).
    info: DevicePtr,
}

// SAFETY: a cuSOLVER handle may move between threads so long as calls on it do not overlap:
// every call goes through `&mut self` (or `Drop`), with the handle's device bound.
unsafe impl Send for Solver {}

impl std::fmt::Debug for Solver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Solver")
            .field("device", &self.device.ordinal())
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
        let info = cudars_mempool::allocator::alloc_on(stream, 4).map_err(|e| Error::Pool {
            bytes: 4,
            why: e.to_string(),
        })?;
        let mut raw: cusolverDnHandle_t = std::ptr::null_mut();
        let created = {
            // SAFETY: a valid out-pointer; the device's primary context is current.
            unsafe { lib.cusolverDnCreate(&mut raw) }
        };
        check(created, "cusolverDnCreate")?;
        let mut s = Solver {
            raw,
            device,
            stream: stream.clone(),
            info,
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

    /// Refuses a stream being captured.
    fn not_capturing(&self, routine: &'static str) -> Result<()> {
        if self.stream.kind() == StreamKind::LegacyNull {
            return Ok(());
        }
        match graph::capture_info(&self.stream)?.status {
            CaptureStatus::None => Ok(()),
            _ => Err(Error::Capturing { routine }),
        }
    }

    /// Checks `m` against the solver's device and returns its byte range.
    fn check_matrix<T: Scalar>(
        &self,
        routine: &'static str,
        arg: &'static str,
        m: &Matrix<'_>,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        let need = matrix_bytes(routine, arg, (m.rows, m.cols, m.ld), size)?;
        view(
            routine,
            arg,
            (m.ptr.as_raw(), m.ptr.len(), m.ptr.device().ordinal()),
            need,
            (size, self.device.ordinal()),
        )
    }

    /// A workspace of `elems` elements of `T` from the pool on the solver's stream.
    fn workspace<T: Scalar>(&self, elems: c_int) -> Result<DevicePtr> {
        let bytes = (elems.max(1) as usize) * std::mem::size_of::<T>();
        cudars_mempool::allocator::alloc_on(&self.stream, bytes).map_err(|e| Error::Pool {
            bytes,
            why: e.to_string(),
        })
    }

    /// Reads `info` (waits for the stream).
    fn read_info(&self) -> Result<i32> {
        self.stream.synchronize()?;
        let mut v = [0i32];
        self.info.copy_to_host(&mut v)?;
        Ok(v[0])
    }

    /// Cholesky factorisation of the symmetric positive definite `a` (square, its `uplo`
    /// triangle read), in place: `A = L L^T` (`Lower`) or `U^T U` (`Upper`).
    /// [`Error::NotPositiveDefinite`] names the order of the first leading minor that is not.
    pub fn potrf<T: Scalar>(&mut self, a: Matrix<'_>, uplo: Uplo) -> Result<()> {
        const R: &str = "potrf";
        self.not_capturing(R)?;
        let n = square(R, "a", a.rows, a.cols)?;
        self.check_matrix::<T>(R, "a", &a)?;
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (ni, lda) = (n as c_int, a.ld as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; `a` holds the n x n matrix with leading dimension lda
            // (checked); a valid out-pointer.
            unsafe {
                T::potrf_buffer_size(
                    lib,
                    self.raw,
                    fill(uplo),
                    ni,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    &mut lwork,
                )
            },
            "cusolverDnXpotrf_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        for p in [a.ptr, &work, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above, with a workspace of `lwork` elements of T and the 4-byte info
            // from the pool, both marked for the stream.
            unsafe {
                T::potrf(
                    lib,
                    self.raw,
                    fill(uplo),
                    ni,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    work.as_raw() as *mut T,
                    lwork,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXpotrf",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::NotPositiveDefinite {
            routine: R,
            index,
        })
    }

    /// Solves `A X = B` with `a` holding [`potrf`](Self::potrf)'s factor (its `uplo`
    /// triangle); `b` (n x nrhs) is overwritten with `X`. `a` and `b` must not overlap.
    pub fn potrs<T: Scalar>(&mut self, a: Matrix<'_>, uplo: Uplo, b: Matrix<'_>) -> Result<()> {
        const R: &str = "potrs";
        self.not_capturing(R)?;
        let n = square(R, "a", a.rows, a.cols)?;
        if b.rows != n {
            return Err(Error::Shape {
                routine: R,
                arg: "b",
                why: format!("{} rows for an order-{n} system", b.rows),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rb = self.check_matrix::<T>(R, "b", &b)?;
        disjoint(R, ("a", ra), ("b", rb))?;
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        for p in [a.ptr, b.ptr, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: a live handle; `a` (n x n) and `b` (n x nrhs) checked against their
            // views and disjoint; info is 4 bytes; all marked for the stream.
            unsafe {
                T::potrs(
                    lib,
                    self.raw,
                    fill(uplo),
                    n as c_int,
                    b.cols as c_int,
                    a.ptr.as_raw() as *const T,
                    a.ld as c_int,
                    b.ptr.as_raw() as *mut T,
                    b.ld as c_int,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXpotrs",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::InvalidParameter { routine: R, index })
    }

    /// LU factorisation with partial pivoting of `a` (m x n), in place: `P A = L U`;
    /// `pivots` receives `min(m, n)` 1-based row indices (i32). [`Error::Singular`] names the
    /// first exactly-zero diagonal element of `U` (the factors are still written).
    pub fn getrf<T: Scalar>(&mut self, a: Matrix<'_>, pivots: &DevicePtr) -> Result<()> {
        const R: &str = "getrf";
        self.not_capturing(R)?;
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let k = a.rows.min(a.cols);
        let rp = view(
            R,
            "pivots",
            (pivots.as_raw(), pivots.len(), pivots.device().ordinal()),
            (k as u64) * 4,
            (4, self.device.ordinal()),
        )?;
        disjoint(R, ("a", ra), ("pivots", rp))?;
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (m, n, lda) = (a.rows as c_int, a.cols as c_int, a.ld as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; `a` holds the m x n matrix (checked); a valid out-pointer.
            unsafe {
                T::getrf_buffer_size(
                    lib,
                    self.raw,
                    m,
                    n,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    &mut lwork,
                )
            },
            "cusolverDnXgetrf_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        for p in [a.ptr, pivots, &work, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above; the pivots hold min(m, n) i32 (checked, disjoint from `a`);
            // the workspace `lwork` elements and info 4 bytes, from the pool; all marked.
            unsafe {
                T::getrf(
                    lib,
                    self.raw,
                    m,
                    n,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    work.as_raw() as *mut T,
                    pivots.as_raw() as *mut c_int,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXgetrf",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::Singular { routine: R, index })
    }

    /// Solves `A X = B` with `a` and `pivots` from [`getrf`](Self::getrf) (square); `b`
    /// (n x nrhs) is overwritten with `X`. The pivots are read on the device as cuSOLVER
    /// wrote them; pivots that did not come from `getrf` of this `a` give a wrong answer
    /// (cuSOLVER trusts them: each must lie in `1..=n`, which `getrf` guarantees).
    pub fn getrs<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        pivots: &DevicePtr,
        b: Matrix<'_>,
    ) -> Result<()> {
        const R: &str = "getrs";
        self.not_capturing(R)?;
        let n = square(R, "a", a.rows, a.cols)?;
        if b.rows != n {
            return Err(Error::Shape {
                routine: R,
                arg: "b",
                why: format!("{} rows for an order-{n} system", b.rows),
            });
        }
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rb = self.check_matrix::<T>(R, "b", &b)?;
        let rp = view(
            R,
            "pivots",
            (pivots.as_raw(), pivots.len(), pivots.device().ordinal()),
            (n as u64) * 4,
            (4, self.device.ordinal()),
        )?;
        disjoint(R, ("a", ra), ("b", rb))?;
        disjoint(R, ("pivots", rp), ("b", rb))?;
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        for p in [a.ptr, pivots, b.ptr, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: a live handle; `a` (n x n), the n pivots and `b` (n x nrhs) checked
            // against their views, `b` disjoint from both; all marked for the stream.
            unsafe {
                T::getrs(
                    lib,
                    self.raw,
                    cublasOperation_t::CUBLAS_OP_N,
                    n as c_int,
                    b.cols as c_int,
                    a.ptr.as_raw() as *const T,
                    a.ld as c_int,
                    pivots.as_raw() as *const c_int,
                    b.ptr.as_raw() as *mut T,
                    b.ld as c_int,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXgetrs",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::InvalidParameter { routine: R, index })
    }
}

impl Solver {
    /// Checks a vector of `len` elements of `T` in `v` and returns its byte range.
    fn check_vector<T: Scalar>(
        &self,
        routine: &'static str,
        arg: &'static str,
        v: &DevicePtr,
        len: usize,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        view(
            routine,
            arg,
            (v.as_raw(), v.len(), v.device().ordinal()),
            (len as u64) * size as u64,
            (size, self.device.ordinal()),
        )
    }

    /// QR factorisation of `a` (m x n), in place: `R` in the upper triangle, the Householder
    /// vectors below it, their scalars in `tau` (`min(m, n)` elements of `T`).
    pub fn geqrf<T: Scalar>(&mut self, a: Matrix<'_>, tau: &DevicePtr) -> Result<()> {
        const R: &str = "geqrf";
        self.not_capturing(R)?;
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rt = self.check_vector::<T>(R, "tau", tau, a.rows.min(a.cols))?;
        disjoint(R, ("a", ra), ("tau", rt))?;
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (m, n, lda) = (a.rows as c_int, a.cols as c_int, a.ld as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; `a` holds the m x n matrix (checked); an out-pointer.
            unsafe {
                T::geqrf_buffer_size(
                    lib,
                    self.raw,
                    m,
                    n,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    &mut lwork,
                )
            },
            "cusolverDnXgeqrf_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        for p in [a.ptr, tau, &work, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above; tau holds min(m, n) elements, disjoint from `a`; the
            // workspace `lwork` elements; all marked for the stream.
            unsafe {
                T::geqrf(
                    lib,
                    self.raw,
                    m,
                    n,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    tau.as_raw() as *mut T,
                    work.as_raw() as *mut T,
                    lwork,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXgeqrf",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::InvalidParameter { routine: R, index })
    }

    /// Forms the m x n matrix `Q` with orthonormal columns in `a` (in place) from
    /// [`geqrf`](Self::geqrf)'s output: the first `k` reflectors and `tau` (`k` elements);
    /// `m >= n >= k`.
    pub fn orgqr<T: Scalar>(&mut self, a: Matrix<'_>, k: usize, tau: &DevicePtr) -> Result<()> {
        const R: &str = "orgqr";
        self.not_capturing(R)?;
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
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (m, n, kk, lda) = (a.rows as c_int, a.cols as c_int, k as c_int, a.ld as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; `a` and `tau` checked; an out-pointer.
            unsafe {
                T::orgqr_buffer_size(
                    lib,
                    self.raw,
                    m,
                    n,
                    kk,
                    a.ptr.as_raw() as *const T,
                    lda,
                    tau.as_raw() as *const T,
                    &mut lwork,
                )
            },
            "cusolverDnXorgqr_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        for p in [a.ptr, tau, &work, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above, with the workspace; all marked for the stream.
            unsafe {
                T::orgqr(
                    lib,
                    self.raw,
                    m,
                    n,
                    kk,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    tau.as_raw() as *const T,
                    work.as_raw() as *mut T,
                    lwork,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXorgqr",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::InvalidParameter { routine: R, index })
    }

    /// Eigenvalues (ascending, into `w`: n elements of `T`) and, with `vectors`, the
    /// orthonormal eigenvectors (into `a`'s columns, in place) of the symmetric `a` (its
    /// `uplo` triangle read; destroyed either way). [`Error::NoConvergence`] if the
    /// tridiagonal iteration fails.
    pub fn syevd<T: Scalar>(
        &mut self,
        a: Matrix<'_>,
        uplo: Uplo,
        w: &DevicePtr,
        vectors: bool,
    ) -> Result<()> {
        const R: &str = "syevd";
        self.not_capturing(R)?;
        let n = square(R, "a", a.rows, a.cols)?;
        let ra = self.check_matrix::<T>(R, "a", &a)?;
        let rw = self.check_vector::<T>(R, "w", w, n)?;
        disjoint(R, ("a", ra), ("w", rw))?;
        let jobz = if vectors {
            cusolverEigMode_t::CUSOLVER_EIG_MODE_VECTOR
        } else {
            cusolverEigMode_t::CUSOLVER_EIG_MODE_NOVECTOR
        };
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (ni, lda) = (n as c_int, a.ld as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; `a` and `w` checked; an out-pointer.
            unsafe {
                T::syevd_buffer_size(
                    lib,
                    self.raw,
                    jobz,
                    fill(uplo),
                    ni,
                    a.ptr.as_raw() as *const T,
                    lda,
                    w.as_raw() as *const T,
                    &mut lwork,
                )
            },
            "cusolverDnXsyevd_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        for p in [a.ptr, w, &work, &self.info] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above, with the workspace; all marked for the stream.
            unsafe {
                T::syevd(
                    lib,
                    self.raw,
                    jobz,
                    fill(uplo),
                    ni,
                    a.ptr.as_raw() as *mut T,
                    lda,
                    w.as_raw() as *mut T,
                    work.as_raw() as *mut T,
                    lwork,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXsyevd",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::NoConvergence { routine: R, index })
    }

    /// Singular value decomposition `A = U diag(s) V^T` of `a` (m x n, **m >= n**, as
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
        self.not_capturing(R)?;
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
        let mut outs = vec![("s", rs)];
        for (arg, mat, order) in [("u", &u, m), ("vt", &vt, n)] {
            if let Some(x) = mat {
                let _ = square(R, arg, x.rows, x.cols)?;
                if x.rows != order {
                    return Err(Error::Shape {
                        routine: R,
                        arg,
                        why: format!("{} x {}; it must be {order} x {order}", x.rows, x.cols),
                    });
                }
                let r = self.check_matrix::<T>(R, arg, x)?;
                disjoint(R, ("a", ra), (arg, r))?;
                for &(o, ro) in &outs {
                    disjoint(R, (o, ro), (arg, r))?;
                }
                outs.push((arg, r));
            }
        }
        let lib = cusolver()?;
        let issue = self.stream.issue(self.device)?;
        let _ctx = self.device.bind()?;
        let (mi, ni) = (m as c_int, n as c_int);
        let mut lwork: c_int = 0;
        check(
            // SAFETY: a live handle; an out-pointer.
            unsafe { T::gesvd_buffer_size(lib, self.raw, mi, ni, &mut lwork) },
            "cusolverDnXgesvd_bufferSize",
        )?;
        let work = self.workspace::<T>(lwork)?;
        let rwork = self.workspace::<T>(n.saturating_sub(1).max(1) as c_int)?;
        for p in [a.ptr, s, &work, &rwork, &self.info] {
            p.record_stream(&issue)?;
        }
        let side = |x: &Option<Matrix<'_>>| -> Result<(c_schar, *mut T, c_int)> {
            Ok(match x {
                Some(x) => {
                    x.ptr.record_stream(&issue)?;
                    (b'A' as c_schar, x.ptr.as_raw() as *mut T, x.ld as c_int)
                }
                None => (b'N' as c_schar, std::ptr::null_mut(), 1),
            })
        };
        let (ju, up, ldu) = side(&u)?;
        let (jv, vp, ldvt) = side(&vt)?;
        check(
            // SAFETY: a live handle; `a` (m x n, m >= n), `s` (n), U (m x m) and V^T (n x n)
            // when asked (null and 'N' otherwise) checked and pairwise disjoint; workspaces
            // of `lwork` and n - 1 elements from the pool; all marked for the stream.
            unsafe {
                T::gesvd(
                    lib,
                    self.raw,
                    (ju, jv),
                    mi,
                    ni,
                    a.ptr.as_raw() as *mut T,
                    a.ld as c_int,
                    s.as_raw() as *mut T,
                    (up, ldu),
                    (vp, ldvt),
                    work.as_raw() as *mut T,
                    lwork,
                    rwork.as_raw() as *mut T,
                    self.info.as_raw() as *mut c_int,
                )
            },
            "cusolverDnXgesvd",
        )?;
        drop(issue);
        let i = self.read_info()?;
        info(R, i, |index| Error::NoConvergence { routine: R, index })
    }
}

fn refuse_per_thread(stream: &Stream, routine: &'static str) -> Result<()> {
    if stream.kind() == StreamKind::PerThread {
        return Err(Error::Shape {
            routine,
            arg: "stream",
            why: "the per-thread default stream: a pool workspace cannot be ordered on it \
                  across threads; use a created stream"
                .into(),
        });
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

fn capture_may_run() -> bool {
    graph::captures_in_progress() || graph::announced_captures_in_progress()
}

impl Drop for Solver {
    fn drop(&mut self) {
        let raw = Raw(self.raw, self.device);
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
