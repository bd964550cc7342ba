//! [`Sparse`]: a cuSPARSE handle bound to a stream, and its products.

use std::ffi::c_void;

use cudars_core::graph;
use cudars_core::{Device, DevicePtr, Stream, StreamKind};
use cudars_sparse_sys::{
    cudaStream_t, cusparseDnMatDescr_t, cusparseDnVecDescr_t, cusparseHandle_t, cusparseSpMMAlg_t,
    cusparseSpMVAlg_t, Cusparse,
};

use crate::check::{disjoint, matrix_bytes, spmm_shapes, spmv_lengths, vector_bytes, view};
use crate::dense::{DnMat, DnVec, Op};
use crate::element::Value;
use crate::error::{check, cusparse, Error, Result};
use crate::matrix::SparseMatrix;

/// A cuSPARSE handle bound to a stream (CuPy's `cusparse` handle of a device). Each product
/// checks every operand first (shapes, lengths, leading dimensions, alignment, devices,
/// overlap of the output with the inputs), takes its buffer from the pool on the handle's
/// stream, marks every view it uses for the stream and issues the product; nothing waits for
/// the device.
///
/// Refused: the per-thread default stream ([`Error::PerThreadStream`]: a pool buffer cannot
/// be ordered on it across threads) and a stream being captured ([`Error::Capturing`], see
/// the crate documentation).
///
/// `Send`, not `Sync`: every product takes `&mut self`.
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_sparse::{CsrMatrix, DnMat, DnVec, Op, Sparse};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let mut sparse = Sparse::new(&stream)?;
/// let n = 1000;
/// // The n x n tridiagonal matrix [-1, 2, -1].
/// let mut offsets = vec![0i32];
/// let mut cols = Vec::new();
/// let mut vals = Vec::new();
/// for i in 0..n as i32 {
///     for (j, v) in [(i - 1, -1f64), (i, 2.0), (i + 1, -1.0)] {
///         if (0..n as i32).contains(&j) {
///             cols.push(j);
///             vals.push(v);
///         }
///     }
///     offsets.push(cols.len() as i32);
/// }
/// let values = cudars_mempool::driver::malloc(&stream, vals.len() * 8)?;
/// values.copy_from_host(&vals)?;
/// let a = CsrMatrix::<f64>::from_host(n, n, &offsets, &cols, &values)?;
/// let x = cudars_mempool::driver::malloc(&stream, n * 8)?;
/// let y = cudars_mempool::driver::malloc(&stream, n * 8)?;
/// sparse.spmv(Op::N, 1.0, &a, DnVec::new(&x, n), 0.0, DnVec::new(&y, n))?;
/// // Eight right-hand sides at once, column-major: C = A B.
/// let b = cudars_mempool::driver::malloc(&stream, n * 8 * 8)?;
/// let c = cudars_mempool::driver::malloc(&stream, n * 8 * 8)?;
/// sparse.spmm(Op::N, Op::N, 1.0, &a, DnMat::col_major(&b, n, 8), 0.0, DnMat::col_major(&c, n, 8))?;
/// // An output overlapping an input is refused before anything is issued:
/// let e = sparse.spmv(Op::N, 1.0, &a, DnVec::new(&x, n), 0.0, DnVec::new(&x, n)).unwrap_err();
/// assert!(matches!(e, cudars_sparse::Error::Overlap { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sparse {
    raw: cusparseHandle_t,
    device: Device,
    stream: Stream,
}

// SAFETY: a cuSPARSE handle may move between threads so long as calls on it do not overlap:
// every call goes through `&mut self` (or `Drop`), with the handle's device bound.
unsafe impl Send for Sparse {}

impl std::fmt::Debug for Sparse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sparse")
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

/// A dense vector descriptor, destroyed on drop.
struct VecDescr(cusparseDnVecDescr_t, &'static Cusparse);

impl VecDescr {
    fn new<T: Value>(lib: &'static Cusparse, v: &DnVec<'_>) -> Result<VecDescr> {
        let mut raw: cusparseDnVecDescr_t = std::ptr::null_mut();
        check(
            // SAFETY: a valid out-pointer; the view holds `len` elements of `T` (checked by
            // the caller); cuSPARSE only stores the pointer.
            unsafe {
                lib.cusparseCreateDnVec(
                    &mut raw,
                    v.len as i64,
                    v.ptr.as_raw() as *mut c_void,
                    T::data_type(),
                )
            },
            "cusparseCreateDnVec",
        )?;
        Ok(VecDescr(raw, lib))
    }
}

impl Drop for VecDescr {
    fn drop(&mut self) {
        // SAFETY: the descriptor `new` created, destroyed once; host memory only.
        let _ = unsafe { self.1.cusparseDestroyDnVec(self.0) };
    }
}

/// A dense matrix descriptor, destroyed on drop.
struct MatDescr(cusparseDnMatDescr_t, &'static Cusparse);

impl MatDescr {
    fn new<T: Value>(lib: &'static Cusparse, m: &DnMat<'_>) -> Result<MatDescr> {
        let mut raw: cusparseDnMatDescr_t = std::ptr::null_mut();
        check(
            // SAFETY: a valid out-pointer; the view holds the matrix with its leading
            // dimension and order (checked by the caller); cuSPARSE only stores the pointer.
            unsafe {
                lib.cusparseCreateDnMat(
                    &mut raw,
                    m.rows as i64,
                    m.cols as i64,
                    m.ld as i64,
                    m.ptr.as_raw() as *mut c_void,
                    T::data_type(),
                    m.order.raw(),
                )
            },
            "cusparseCreateDnMat",
        )?;
        Ok(MatDescr(raw, lib))
    }
}

impl Drop for MatDescr {
    fn drop(&mut self) {
        // SAFETY: the descriptor `new` created, destroyed once; host memory only.
        let _ = unsafe { self.1.cusparseDestroyDnMat(self.0) };
    }
}

fn refuse_per_thread(stream: &Stream, routine: &'static str) -> Result<()> {
    if stream.kind() == StreamKind::PerThread {
        return Err(Error::PerThreadStream { routine });
    }
    Ok(())
}

impl Sparse {
    /// A handle on `stream`'s device, bound to `stream`.
    pub fn new(stream: &Stream) -> Result<Sparse> {
        refuse_per_thread(stream, "Sparse::new")?;
        let lib = cusparse()?;
        let device = stream.device();
        let _ctx = device.bind()?;
        let _relaxed = graph::RelaxedCaptureMode::new()?;
        let mut raw: cusparseHandle_t = std::ptr::null_mut();
        let created = {
            // SAFETY: a valid out-pointer; the device's primary context is current.
            unsafe { lib.cusparseCreate(&mut raw) }
        };
        check(created, "cusparseCreate")?;
        let mut s = Sparse {
            raw,
            device,
            stream: stream.clone(),
        };
        s.bind(stream)?;
        Ok(s)
    }

    /// The stream the handle runs on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The handle's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Moves the handle to `stream` (of its device), after everything queued on the old one.
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        refuse_per_thread(stream, "Sparse::set_stream")?;
        stream.expect_device(self.device)?;
        let ev = self.stream.record(None)?;
        stream.wait_event(&ev)?;
        self.bind(stream)?;
        self.stream = stream.clone();
        Ok(())
    }

    fn bind(&mut self, stream: &Stream) -> Result<()> {
        let lib = cusparse()?;
        check(
            // SAFETY: a live handle used through `&mut self`; a live stream of its device.
            unsafe { lib.cusparseSetStream(self.raw, stream.raw() as cudaStream_t) },
            "cusparseSetStream",
        )
    }

    /// Checks a dense vector of `len` elements of `T` and returns its byte range.
    fn check_vec<T: Value>(
        &self,
        routine: &'static str,
        arg: &'static str,
        v: &DnVec<'_>,
        len: usize,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        let need = vector_bytes(routine, arg, v.len, len, size)?;
        view(
            routine,
            arg,
            (v.ptr.as_raw(), v.ptr.len(), v.ptr.device().ordinal()),
            need,
            (size, self.device.ordinal()),
        )
    }

    /// Checks a dense matrix of `T` and returns its byte range.
    fn check_mat<T: Value>(
        &self,
        routine: &'static str,
        arg: &'static str,
        m: &DnMat<'_>,
    ) -> Result<(u64, u64)> {
        let size = std::mem::size_of::<T>();
        let need = matrix_bytes(routine, arg, (m.rows, m.cols, m.ld), m.order, size)?;
        view(
            routine,
            arg,
            (m.ptr.as_raw(), m.ptr.len(), m.ptr.device().ordinal()),
            need,
            (size, self.device.ordinal()),
        )
    }

    /// The sparse operand's device against the handle's; the output against its arrays.
    fn check_sparse<A: SparseMatrix>(
        &self,
        routine: &'static str,
        a: &A,
        out: (&'static str, (u64, u64)),
    ) -> Result<()> {
        let p = a.parts();
        if p.device != self.device {
            return Err(Error::WrongDevice {
                routine,
                arg: "a",
                expected: self.device.ordinal(),
                actual: p.device.ordinal(),
            });
        }
        for (name, r) in p.ranges() {
            disjoint(routine, (name, r), out)?;
        }
        Ok(())
    }

    /// A buffer of `bytes` from the pool on the handle's stream (at least one byte, so
    /// cuSPARSE gets a live address).
    fn buffer(&self, bytes: usize) -> Result<DevicePtr> {
        let ask = bytes.max(1);
        let buf =
            cudars_mempool::allocator::alloc_on(&self.stream, ask).map_err(|e| Error::Pool {
                bytes: ask,
                why: e.to_string(),
            })?;
        if buf.len() < bytes || buf.device() != self.device {
            return Err(Error::Pool {
                bytes: ask,
                why: format!(
                    "the allocator gave {} bytes on device {}",
                    buf.len(),
                    buf.device().ordinal()
                ),
            });
        }
        Ok(buf)
    }

    /// Refuses work that would touch a capture (inside the issue gate).
    fn not_capturing(&self, routine: &'static str) -> Result<()> {
        if graph::touches_capture(&self.stream) {
            return Err(Error::Capturing { routine });
        }
        Ok(())
    }

    /// `y = alpha op(A) x + beta y` (`cusparseSpMV`, default algorithm, computed in
    /// `A::Value`). For an `m x n` matrix, `x` has `n` elements and `y` `m` (`Op::N`), or `x`
    /// `m` and `y` `n` (`Op::T`). `y` must not overlap `x` nor any array of `a`; every
    /// operand must be on the handle's device.
    pub fn spmv<A: SparseMatrix>(
        &mut self,
        op: Op,
        alpha: A::Value,
        a: &A,
        x: DnVec<'_>,
        beta: A::Value,
        y: DnVec<'_>,
    ) -> Result<()> {
        const R: &str = "spmv";
        let (xn, yn) = spmv_lengths(op, a.rows(), a.cols());
        let rx = self.check_vec::<A::Value>(R, "x", &x, xn)?;
        let ry = self.check_vec::<A::Value>(R, "y", &y, yn)?;
        disjoint(R, ("x", rx), ("y", ry))?;
        self.check_sparse(R, a, ("y", ry))?;
        let lib = cusparse()?;
        let issue = self.stream.issue(self.device)?;
        self.not_capturing(R)?;
        let _ctx = self.device.bind()?;
        let dx = VecDescr::new::<A::Value>(lib, &x)?;
        let dy = VecDescr::new::<A::Value>(lib, &y)?;
        let (pa, pb) = (
            &alpha as *const A::Value as *const c_void,
            &beta as *const A::Value as *const c_void,
        );
        let alg = cusparseSpMVAlg_t::CUSPARSE_SPMV_ALG_DEFAULT;
        let mut size = 0usize;
        check(
            // SAFETY: a live handle (through `&mut self`); the descriptors describe views
            // checked to hold what they say, of the handle's device; alpha and beta are host
            // values of the compute type (the handle's pointer mode is host, the default);
            // a valid out-pointer.
            unsafe {
                lib.cusparseSpMV_bufferSize(
                    self.raw,
                    op.raw(),
                    pa,
                    a.parts().raw(),
                    dx.0,
                    pb,
                    dy.0,
                    A::Value::data_type(),
                    alg,
                    &mut size,
                )
            },
            "cusparseSpMV_bufferSize",
        )?;
        let buf = self.buffer(size)?;
        for p in a.parts().arrays.iter().map(|(_, p, _)| p) {
            p.record_stream(&issue)?;
        }
        for p in [x.ptr, y.ptr, &buf] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above, with a buffer of at least `size` bytes from the pool; every
            // view marked for the stream, so none is freed or reused before the product has
            // run. The matrix's indices were checked (or are trusted under its unchecked
            // constructor's contract) to stay within its arrays and the dense operands; `y`
            // overlaps no input.
            unsafe {
                lib.cusparseSpMV(
                    self.raw,
                    op.raw(),
                    pa,
                    a.parts().raw(),
                    dx.0,
                    pb,
                    dy.0,
                    A::Value::data_type(),
                    alg,
                    buf.as_raw() as *mut c_void,
                )
            },
            "cusparseSpMV",
        )?;
        drop(issue);
        Ok(())
    }

    /// `C = alpha op(A) op(B) + beta C` (`cusparseSpMM`, default algorithm, computed in
    /// `A::Value`): `op(A)` is `m x k`, `op(B)` `k x n` and `C` `m x n`; `b` and `c` column-
    /// or row-major (a combination cuSPARSE does not support is its
    /// `CUSPARSE_STATUS_NOT_SUPPORTED`, as an [`Error::Cusparse`]). `c` must not overlap `b`
    /// nor any array of `a`; every operand must be on the handle's device.
    #[allow(
        clippy::too_many_arguments,
        reason = "cuSPARSE's C = alpha op(A) op(B) + beta C"
    )]
    pub fn spmm<A: SparseMatrix>(
        &mut self,
        op_a: Op,
        op_b: Op,
        alpha: A::Value,
        a: &A,
        b: DnMat<'_>,
        beta: A::Value,
        c: DnMat<'_>,
    ) -> Result<()> {
        const R: &str = "spmm";
        spmm_shapes(
            R,
            op_a.apply((a.rows(), a.cols())),
            op_b.apply((b.rows, b.cols)),
            (c.rows, c.cols),
        )?;
        let rb = self.check_mat::<A::Value>(R, "b", &b)?;
        let rc = self.check_mat::<A::Value>(R, "c", &c)?;
        disjoint(R, ("b", rb), ("c", rc))?;
        self.check_sparse(R, a, ("c", rc))?;
        let lib = cusparse()?;
        let issue = self.stream.issue(self.device)?;
        self.not_capturing(R)?;
        let _ctx = self.device.bind()?;
        let db = MatDescr::new::<A::Value>(lib, &b)?;
        let dc = MatDescr::new::<A::Value>(lib, &c)?;
        let (pa, pb) = (
            &alpha as *const A::Value as *const c_void,
            &beta as *const A::Value as *const c_void,
        );
        let alg = cusparseSpMMAlg_t::CUSPARSE_SPMM_ALG_DEFAULT;
        let mut size = 0usize;
        check(
            // SAFETY: a live handle (through `&mut self`); the descriptors describe views
            // checked to hold what they say, of the handle's device; alpha and beta are host
            // values of the compute type (host pointer mode); a valid out-pointer.
            unsafe {
                lib.cusparseSpMM_bufferSize(
                    self.raw,
                    op_a.raw(),
                    op_b.raw(),
                    pa,
                    a.parts().raw(),
                    db.0,
                    pb,
                    dc.0,
                    A::Value::data_type(),
                    alg,
                    &mut size,
                )
            },
            "cusparseSpMM_bufferSize",
        )?;
        let buf = self.buffer(size)?;
        for p in a.parts().arrays.iter().map(|(_, p, _)| p) {
            p.record_stream(&issue)?;
        }
        for p in [b.ptr, c.ptr, &buf] {
            p.record_stream(&issue)?;
        }
        check(
            // SAFETY: as above, with a buffer of at least `size` bytes from the pool; every
            // view marked for the stream. The matrix's indices stay within its arrays and the
            // dense operands (checked, or trusted under its unchecked constructor's
            // contract); `c` overlaps no input.
            unsafe {
                lib.cusparseSpMM(
                    self.raw,
                    op_a.raw(),
                    op_b.raw(),
                    pa,
                    a.parts().raw(),
                    db.0,
                    pb,
                    dc.0,
                    A::Value::data_type(),
                    alg,
                    buf.as_raw() as *mut c_void,
                )
            },
            "cusparseSpMM",
        )?;
        drop(issue);
        Ok(())
    }
}

/// A handle nobody uses any more, destroyed by whichever thread buries it.
struct Raw(cusparseHandle_t, Device);

// SAFETY: a handle no `Sparse` uses; destroyed once.
unsafe impl Send for Raw {}

impl Raw {
    fn destroy(self) {
        let Ok(lib) = cusparse() else { return };
        let Ok(_ctx) = self.1.bind() else { return };
        let _relaxed = graph::RelaxedCaptureMode::new();
        // SAFETY: the handle a `Sparse` created, destroyed once; work it queued stays ordered
        // on its stream.
        let _ = unsafe { lib.cusparseDestroy(self.0) };
    }
}

/// Handles dropped while a capture may run (`cusparseDestroy` may synchronise the device,
/// which would invalidate another thread's capture): destroyed after it.
fn grave() -> &'static std::sync::Mutex<Vec<Raw>> {
    static GRAVE: std::sync::Mutex<Vec<Raw>> = std::sync::Mutex::new(Vec::new());
    &GRAVE
}

fn capture_may_run() -> bool {
    graph::captures_in_progress() || graph::announced_captures_in_progress()
}

impl Drop for Sparse {
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
