//! The cuBLAS routines: [`Gemm`] (and its strided-batched and pointer-array batched forms),
//! [`gemv`], [`axpy`], [`dot`] / [`dot_into`], [`nrm2`] / [`nrm2_into`], [`scal`], [`geam`].
//!
//! Every routine checks its arguments first (see [`shape`](crate::shape)), then takes the
//! stream's cached handle ([`handle`](crate::handle)), marks every view with the issue (the
//! ordering rule of pool blocks; inside a capture begun through `cuda-core`, the graph keeps
//! them) and calls the library. On a refusal nothing was issued.

use std::ffi::c_void;

use cudars_blas_sys::{
    cublas, cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasPointerMode_t, cudaDataType,
};
use cudars_core::memory::DevicePtr;
use cudars_core::Stream;

use crate::element::Element;
use crate::error::{check, Error, Result};
use crate::handle::with_call;
use crate::shape::{
    batch_elements, check_view, fits_int, gemm_plan, mat_elements, Mat, Op, Order, Plan, Span,
    Vector, View,
};

/// How much precision a routine may trade for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MathMode {
    /// The library's default: full-precision `f32` and `f64` (no TF32: PyTorch's default for
    /// matmul), tensor cores for the 16-bit types with `f32` accumulation.
    #[default]
    Default,
    /// `f32` products on TF32 tensor cores (10-bit mantissa inputs, `f32` accumulation).
    Tf32,
    /// No reduced-precision shortcut anywhere (`*_PEDANTIC` compute types): reproducible
    /// reference results.
    Pedantic,
}

impl MathMode {
    fn compute<T: Element>(self) -> cublasComputeType_t {
        let c = T::COMPUTE;
        match self {
            MathMode::Default => c,
            MathMode::Tf32 if c == cublasComputeType_t::CUBLAS_COMPUTE_32F => {
                cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
            }
            MathMode::Tf32 => c,
            MathMode::Pedantic if c == cublasComputeType_t::CUBLAS_COMPUTE_64F => {
                cublasComputeType_t::CUBLAS_COMPUTE_64F_PEDANTIC
            }
            MathMode::Pedantic => cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        }
    }

    fn handle_mode(self) -> cublasMath_t {
        match self {
            MathMode::Default => cublasMath_t::CUBLAS_DEFAULT_MATH,
            MathMode::Tf32 => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            MathMode::Pedantic => cublasMath_t::CUBLAS_PEDANTIC_MATH,
        }
    }
}

/// `C = alpha op(A) op(B) + beta C` (cuBLAS's `cublasGemmEx`), for every [`Element`].
///
/// Shapes come from the matrices: `op(A)` is `m x k`, `op(B)` `k x n`, `C` `m x n`; each may
/// be column- or row-major ([`Mat`]; the row-major mapping is in [`shape`](crate::shape)).
/// `C` must not overlap `A` or `B`.
///
/// ```no_run
/// use cudars_blas::{Gemm, Mat, Op};
/// use cudars_core::{memory::DevicePtr, Device, Stream};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let (m, n, k) = (64, 32, 16);
/// let a = cudars_mempool::driver::malloc(&stream, m * k * 4)?;
/// let b = cudars_mempool::driver::malloc(&stream, k * n * 4)?;
/// let c = cudars_mempool::driver::malloc(&stream, m * n * 4)?;
/// // Row-major, as a C or PyTorch program keeps them: C = A B^T with B stored n x k.
/// Gemm::new(
///     Mat::<f32>::row_major(&a, m, k),
///     Mat::row_major(&b, n, k),
///     Mat::row_major(&c, m, n),
/// )
/// .op_b(Op::T)
/// .run(&stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Gemm<'a, T: Element> {
    /// `A`.
    pub a: Mat<'a, T>,
    /// The operation on `A`.
    pub op_a: Op,
    /// `B`.
    pub b: Mat<'a, T>,
    /// The operation on `B`.
    pub op_b: Op,
    /// `C`, read when `beta` is not zero, written.
    pub c: Mat<'a, T>,
    /// `alpha`.
    pub alpha: T::Scalar,
    /// `beta`.
    pub beta: T::Scalar,
    /// Precision.
    pub math: MathMode,
    /// `alpha` and `beta` read from device memory (one `T::Scalar` each, cuBLAS's device
    /// pointer mode) instead of `alpha` and `beta` above: the values at the time the GEMM
    /// runs, so a captured GEMM replays with whatever they hold then.
    pub device_scalars: Option<(&'a DevicePtr, &'a DevicePtr)>,
}

impl<'a, T: Element> Gemm<'a, T> {
    /// `C = A B`: no transposes, `alpha = 1`, `beta = 0`, [`MathMode::Default`].
    pub fn new(a: Mat<'a, T>, b: Mat<'a, T>, c: Mat<'a, T>) -> Self {
        Gemm {
            a,
            op_a: Op::N,
            b,
            op_b: Op::N,
            c,
            alpha: T::one(),
            beta: T::zero(),
            math: MathMode::Default,
            device_scalars: None,
        }
    }

    /// The operation on `A`.
    pub fn op_a(mut self, op: Op) -> Self {
        self.op_a = op;
        self
    }

    /// The operation on `B`.
    pub fn op_b(mut self, op: Op) -> Self {
        self.op_b = op;
        self
    }

    /// `alpha`.
    pub fn alpha(mut self, alpha: T::Scalar) -> Self {
        self.alpha = alpha;
        self
    }

    /// `alpha` and `beta` from device memory (see [`Gemm::device_scalars`](Self#structfield.device_scalars)).
    pub fn scalars_on_device(mut self, alpha: &'a DevicePtr, beta: &'a DevicePtr) -> Self {
        self.device_scalars = Some((alpha, beta));
        self
    }

    /// `beta` (C is read when not zero).
    pub fn beta(mut self, beta: T::Scalar) -> Self {
        self.beta = beta;
        self
    }

    /// The precision.
    pub fn math(mut self, math: MathMode) -> Self {
        self.math = math;
        self
    }

    /// Checks the shapes and views (see [`check_gemm`]).
    fn check(
        &self,
        routine: &'static str,
        stream: &Stream,
        strides: Option<(usize, [usize; 3])>,
    ) -> Result<Plan> {
        let device = stream.device().ordinal();
        let plan = check_gemm(
            routine,
            (&self.a, self.op_a),
            (&self.b, self.op_b),
            &self.c,
            device,
            strides,
        )?;
        if let Some((alpha, beta)) = self.device_scalars {
            check_scalars::<T, DevicePtr>(routine, (alpha, beta), &self.c, device)?;
        }
        Ok(plan)
    }

    /// The scalars' pointers and the pointer mode they need; marks device scalars.
    fn scalars(
        &self,
        call: &mut crate::handle::Call<'_, '_>,
    ) -> Result<(*const c_void, *const c_void)> {
        match self.device_scalars {
            Some((alpha, beta)) => {
                alpha.record_stream(&call.issue)?;
                beta.record_stream(&call.issue)?;
                call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE)?;
                Ok((
                    alpha.as_raw() as *const c_void,
                    beta.as_raw() as *const c_void,
                ))
            }
            None => {
                call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
                Ok((
                    (&self.alpha as *const T::Scalar).cast(),
                    (&self.beta as *const T::Scalar).cast(),
                ))
            }
        }
    }

    /// Operands in the call's order (A and B swap for a row-major C).
    fn operands(&self, plan: &Plan) -> (&Mat<'a, T>, &Mat<'a, T>) {
        if plan.swapped {
            (&self.b, &self.a)
        } else {
            (&self.a, &self.b)
        }
    }

    /// Issues the GEMM on `stream` (see the type's documentation). Nothing is issued when an
    /// argument is refused.
    pub fn run(&self, stream: &Stream) -> Result<()> {
        const R: &str = "gemm";
        let plan = self.check(R, stream, None)?;
        if plan.m == 0 || plan.n == 0 {
            return Ok(());
        }
        let lib = cublas()?;
        let (a, b) = self.operands(&plan);
        with_call(stream, |call| {
            for p in [a.ptr, b.ptr, self.c.ptr] {
                p.record_stream(&call.issue)?;
            }
            let (alpha, beta) = self.scalars(call)?;
            call.set_math(self.math.handle_mode())?;
            check(
                // SAFETY: the shapes, leading dimensions and view lengths were checked against
                // the plan (`check`): the library reads and writes inside the views; the views are
                // of the handle's device and marked for its stream; alpha and beta are host
                // scalars of the compute type alive for the call, or checked and marked device
                // views of one scalar each (`scalars`, with the matching pointer mode).
                unsafe {
                    lib.cublasGemmEx(
                        call.raw(),
                        plan.transa.raw(),
                        plan.transb.raw(),
                        plan.m as i32,
                        plan.n as i32,
                        plan.k as i32,
                        alpha,
                        a.ptr.as_raw() as *const c_void,
                        T::DATA_TYPE,
                        a.ld as i32,
                        b.ptr.as_raw() as *const c_void,
                        T::DATA_TYPE,
                        b.ld as i32,
                        beta,
                        self.c.ptr.as_raw() as *mut c_void,
                        T::DATA_TYPE,
                        self.c.ld as i32,
                        self.math.compute::<T>(),
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                },
                "cublasGemmEx",
            )
        })
    }

    /// `batch` GEMMs of this shape, the i-th matrices `i * stride` elements after the first
    /// (`cublasGemmStridedBatchedEx`). Each view must hold all of its batch; the matrices of
    /// `C` must not overlap one another nor `A` or `B`: `stride_c` at least one matrix, or
    /// the matrices side by side within the leading dimension (`stride_c` at least one stored
    /// row, `(batch - 1) * stride_c + row <= ld`: attention heads interleaved in a row).
    pub fn run_strided_batched(
        &self,
        stream: &Stream,
        batch: usize,
        strides: StridedBatch,
    ) -> Result<()> {
        const R: &str = "gemm_strided_batched";
        let s = [strides.a, strides.b, strides.c];
        let plan = self.check(R, stream, Some((batch, s)))?;
        fits_int(R, "batch", batch)?;
        if plan.m == 0 || plan.n == 0 || batch == 0 {
            return Ok(());
        }
        for (name, v) in [("stride_a", s[0]), ("stride_b", s[1]), ("stride_c", s[2])] {
            i64::try_from(v).map_err(|_| Error::shape(R, name, format!("{v} exceeds i64")))?;
        }
        let (sa, sb) = if plan.swapped {
            (s[1], s[0])
        } else {
            (s[0], s[1])
        };
        let lib = cublas()?;
        let (a, b) = self.operands(&plan);
        with_call(stream, |call| {
            for p in [a.ptr, b.ptr, self.c.ptr] {
                p.record_stream(&call.issue)?;
            }
            let (alpha, beta) = self.scalars(call)?;
            call.set_math(self.math.handle_mode())?;
            check(
                // SAFETY: as `run`, with every view checked to hold its whole batch
                // (`batch_elements`) and the outputs not overlapping.
                unsafe {
                    lib.cublasGemmStridedBatchedEx(
                        call.raw(),
                        plan.transa.raw(),
                        plan.transb.raw(),
                        plan.m as i32,
                        plan.n as i32,
                        plan.k as i32,
                        alpha,
                        a.ptr.as_raw() as *const c_void,
                        T::DATA_TYPE,
                        a.ld as i32,
                        sa as i64,
                        b.ptr.as_raw() as *const c_void,
                        T::DATA_TYPE,
                        b.ld as i32,
                        sb as i64,
                        beta,
                        self.c.ptr.as_raw() as *mut c_void,
                        T::DATA_TYPE,
                        self.c.ld as i32,
                        s[2] as i64,
                        batch as i32,
                        self.math.compute::<T>(),
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                },
                "cublasGemmStridedBatchedEx",
            )
        })
    }
}

/// Checks `c = op_a(a) op_b(b)`: shapes, leading dimensions, each view's length (with
/// `batch` matrices `strides` apart, or one), alignment, device, overlaps; returns the
/// column-major plan. Pure: no library call.
pub(crate) fn check_gemm<T: Element, P: View>(
    routine: &'static str,
    (a, op_a): (&Mat<'_, T, P>, Op),
    (b, op_b): (&Mat<'_, T, P>, Op),
    c: &Mat<'_, T, P>,
    device: usize,
    strides: Option<(usize, [usize; 3])>,
) -> Result<Plan> {
    let plan = gemm_plan(routine, a, op_a, b, op_b, c)?;
    fits_int(routine, "m", plan.m)?;
    fits_int(routine, "n", plan.n)?;
    fits_int(routine, "k", plan.k)?;
    let mut spans: [Span; 3] = [Span { start: 0, end: 0 }; 3];
    for (i, (name, m)) in [("a", a), ("b", b), ("c", c)].into_iter().enumerate() {
        let (r, cc, _) = m.stored();
        let each = mat_elements(routine, name, r, cc, m.ld)?;
        let total = match strides {
            None => each,
            Some((batch, s)) => batch_elements(routine, name, each, s[i], batch)?,
        };
        spans[i] = check_view::<T>(routine, name, m.ptr, device, total)?;
    }
    for (i, input) in [(0, "a"), (1, "b")] {
        if spans[2].overlaps(&spans[i]) {
            return Err(Error::Overlap {
                routine,
                output: "c",
                input,
            });
        }
    }
    if let Some((batch, s)) = strides {
        let (r, cc, _) = c.stored();
        let each = mat_elements(routine, "c", r, cc, c.ld)?;
        let stride = s[2] as u64;
        // Disjoint either one after another (a stride of at least one matrix), or side by
        // side: every matrix's stored rows `r` elements wide and all `batch` of them within
        // one leading dimension (heads interleaved in a row, as `(B, T, NH, HS)` holds them).
        let side_by_side = stride >= r as u64
            && (stride)
                .checked_mul((batch as u64).saturating_sub(1))
                .and_then(|v| v.checked_add(r as u64))
                .is_some_and(|end| end <= c.ld as u64);
        if batch > 1 && each > 0 && stride < each && !side_by_side {
            return Err(Error::Overlap {
                routine,
                output: "c",
                input: "c (the next matrix of the batch: stride_c is less than one matrix, \
                        and the matrices do not fit side by side in the leading dimension)",
            });
        }
    }
    Ok(plan)
}

/// Checks device-resident `alpha` and `beta`: one scalar each, aligned, on the device, and
/// not inside the output. Pure: no library call.
pub(crate) fn check_scalars<T: Element, P: View>(
    routine: &'static str,
    (alpha, beta): (&P, &P),
    c: &Mat<'_, T, P>,
    device: usize,
) -> Result<()> {
    let (r, cc, _) = c.stored();
    let out = check_view::<T>(
        routine,
        "c",
        c.ptr,
        device,
        mat_elements(routine, "c", r, cc, c.ld)?,
    )?;
    for (name, p) in [("alpha", alpha), ("beta", beta)] {
        let s = check_view::<T::Scalar>(routine, name, p, device, 1)?;
        if s.overlaps(&out) {
            return Err(Error::Overlap {
                routine,
                output: "c",
                input: name,
            });
        }
    }
    Ok(())
}

/// Element strides between the matrices of a strided batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StridedBatch {
    /// Between two `A`s (0: the same `A` for every product).
    pub a: usize,
    /// Between two `B`s (0: the same `B`).
    pub b: usize,
    /// Between two `C`s (at least one matrix, or the matrices side by side within the
    /// leading dimension: see [`Gemm::run_strided_batched`]).
    pub c: usize,
}

/// GEMMs of one shape on matrices anywhere (`cublasGemmBatchedEx`): `gemms[i]` is computed
/// for every i. All must have the shapes, layouts, leading dimensions, operations, scalars
/// and precision of the first; no `C` may overlap another `C` or any `A` or `B`.
///
/// The pointer arrays go to the device through a pool block on `stream`, copied
/// synchronously (so the host arrays may be dropped at return); on a stream being captured the
/// copy cannot be recorded, and the call is refused ([`Error::Unsupported`]): capture
/// [`Gemm::run_strided_batched`] instead.
pub fn gemm_batched<T: Element>(stream: &Stream, gemms: &[Gemm<'_, T>]) -> Result<()> {
    const R: &str = "gemm_batched";
    let Some(first) = gemms.first() else {
        return Ok(());
    };
    fits_int(R, "gemms.len()", gemms.len())?;
    let plan = first.check(R, stream, None)?;
    let same = |g: &Gemm<'_, T>| {
        let shape = |m: &Mat<'_, T>| (m.rows, m.cols, m.ld, m.order);
        shape(&g.a) == shape(&first.a)
            && shape(&g.b) == shape(&first.b)
            && shape(&g.c) == shape(&first.c)
            && g.op_a == first.op_a
            && g.op_b == first.op_b
            && g.math == first.math
            && bytemuck::bytes_of(&g.alpha) == bytemuck::bytes_of(&first.alpha)
            && bytemuck::bytes_of(&g.beta) == bytemuck::bytes_of(&first.beta)
            && g.device_scalars.map(|(a, b)| (a.as_raw(), b.as_raw()))
                == first.device_scalars.map(|(a, b)| (a.as_raw(), b.as_raw()))
    };
    let mut outputs: Vec<Span> = Vec::with_capacity(gemms.len());
    let mut inputs: Vec<Span> = Vec::with_capacity(2 * gemms.len());
    for g in gemms {
        if !same(g) {
            return Err(Error::shape(
                R,
                "gemms",
                "every GEMM of a batch must have the first one's shapes, layouts, operations, \
                 scalars and precision"
                    .into(),
            ));
        }
        g.check(R, stream, None)?;
        let span = |m: &Mat<'_, T>| -> Result<Span> {
            let (r, c, _) = m.stored();
            let n = mat_elements(R, "c", r, c, m.ld)?;
            Ok(Span {
                start: m.ptr.as_raw(),
                end: m.ptr.as_raw() + n * std::mem::size_of::<T>() as u64,
            })
        };
        outputs.push(span(&g.c)?);
        inputs.push(span(&g.a)?);
        inputs.push(span(&g.b)?);
    }
    for (i, o) in outputs.iter().enumerate() {
        if outputs[i + 1..].iter().any(|p| p.overlaps(o)) {
            return Err(Error::Overlap {
                routine: R,
                output: "c",
                input: "another c of the batch",
            });
        }
        if inputs.iter().any(|p| p.overlaps(o)) {
            return Err(Error::Overlap {
                routine: R,
                output: "c",
                input: "an a or b of the batch",
            });
        }
    }
    if plan.m == 0 || plan.n == 0 {
        return Ok(());
    }
    if cudars_core::graph::is_capturing(stream)? {
        return Err(Error::Unsupported {
            routine: R,
            why: "the pointer arrays cannot be copied into a capture; capture \
                  Gemm::run_strided_batched instead"
                .into(),
        });
    }
    let count = gemms.len();
    let mut host: Vec<u64> = Vec::with_capacity(3 * count);
    for g in gemms {
        let (a, _) = g.operands(&plan);
        host.push(a.ptr.as_raw());
    }
    for g in gemms {
        let (_, b) = g.operands(&plan);
        host.push(b.ptr.as_raw());
    }
    host.extend(gemms.iter().map(|g| g.c.ptr.as_raw()));
    let arrays = cudars_mempool::allocator::alloc_on(stream, host.len() * 8)
        .map_err(|e| Error::pool("gemm_batched pointer arrays", e))?;
    arrays.copy_from_host(&host)?;
    let at = |i: usize| arrays.as_raw() + (i * count * 8) as u64;
    let lib = cublas()?;
    let (a0, b0) = first.operands(&plan);
    with_call(stream, |call| {
        arrays.record_stream(&call.issue)?;
        for g in gemms {
            for p in [g.a.ptr, g.b.ptr, g.c.ptr] {
                p.record_stream(&call.issue)?;
            }
        }
        let (alpha, beta) = first.scalars(call)?;
        call.set_math(first.math.handle_mode())?;
        check(
            // SAFETY: every GEMM of the batch was checked as `Gemm::run` checks one, with the
            // first's shapes; the three device arrays hold `count` addresses each, copied before
            // the call and marked for the stream; the outputs overlap nothing.
            unsafe {
                lib.cublasGemmBatchedEx(
                    call.raw(),
                    plan.transa.raw(),
                    plan.transb.raw(),
                    plan.m as i32,
                    plan.n as i32,
                    plan.k as i32,
                    alpha,
                    at(0) as *const *const c_void,
                    T::DATA_TYPE,
                    a0.ld as i32,
                    at(1) as *const *const c_void,
                    T::DATA_TYPE,
                    b0.ld as i32,
                    beta,
                    at(2) as *const *mut c_void,
                    T::DATA_TYPE,
                    first.c.ld as i32,
                    count as i32,
                    first.math.compute::<T>(),
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            },
            "cublasGemmBatchedEx",
        )
    })
}

/// Checks a vector: increment, length limits, device, alignment and extent.
pub(crate) fn check_vector<T: Element, P: View>(
    routine: &'static str,
    argument: &'static str,
    v: &Vector<'_, T, P>,
    device: usize,
) -> Result<Span> {
    fits_int(routine, argument, v.len)?;
    if v.inc == 0 {
        return Err(Error::shape(routine, argument, "increment 0".into()));
    }
    fits_int(routine, argument, v.inc)?;
    let elements = if v.len == 0 {
        0
    } else {
        ((v.len - 1) as u64)
            .checked_mul(v.inc as u64)
            .map(|e| e + 1)
            .ok_or_else(|| Error::shape(routine, argument, "extent overflows".into()))?
    };
    check_view::<T>(routine, argument, v.ptr, device, elements)
}

/// `y = alpha op(A) x + beta y` (`cublas{S,D,C,Z}gemv`; the 16-bit types through
/// `cublasGemmEx` with one column, which needs `x` and `y` contiguous).
pub fn gemv<T: Element>(
    stream: &Stream,
    a: Mat<'_, T>,
    op: Op,
    x: Vector<'_, T>,
    y: Vector<'_, T>,
    scalars: (T::Scalar, T::Scalar),
) -> Result<()> {
    const R: &str = "gemv";
    let device = stream.device().ordinal();
    let (ar, ac) = if op == Op::N {
        (a.rows, a.cols)
    } else {
        (a.cols, a.rows)
    };
    if x.len != ac {
        return Err(Error::shape(
            R,
            "x",
            format!("op(a) has {ac} columns; x has {} elements", x.len),
        ));
    }
    if y.len != ar {
        return Err(Error::shape(
            R,
            "y",
            format!("op(a) has {ar} rows; y has {} elements", y.len),
        ));
    }
    let (sr, sc, stored_t) = a.stored();
    let ea = mat_elements(R, "a", sr, sc, a.ld)?;
    let sa = check_view::<T>(R, "a", a.ptr, device, ea)?;
    let sx = check_vector(R, "x", &x, device)?;
    let sy = check_vector(R, "y", &y, device)?;
    for (span, input) in [(sa, "a"), (sx, "x")] {
        if sy.overlaps(&span) {
            return Err(Error::Overlap {
                routine: R,
                output: "y",
                input,
            });
        }
    }
    let eff = if stored_t {
        match op {
            Op::N => Op::T,
            Op::T => Op::N,
            Op::C if !T::COMPLEX => Op::N,
            Op::C => {
                return Err(Error::Unsupported {
                    routine: R,
                    why: "a: the conjugate transpose of a row-major complex matrix cannot be \
                          expressed; pass it column-major"
                        .into(),
                })
            }
        }
    } else {
        op
    };
    let half =
        T::DATA_TYPE == cudaDataType::CUDA_R_16F || T::DATA_TYPE == cudaDataType::CUDA_R_16BF;
    if half && (x.inc != 1 || y.inc != 1) {
        return Err(Error::Unsupported {
            routine: R,
            why: "the 16-bit gemv goes through cublasGemmEx, which needs x and y contiguous \
                  (inc 1)"
                .into(),
        });
    }
    // BLAS's quick return: no rows, or no columns (then y is left as it is, whatever beta).
    if ar == 0 || ac == 0 {
        return Ok(());
    }
    let lib = cublas()?;
    let (alpha, beta) = scalars;
    with_call(stream, |call| {
        for p in [a.ptr, x.ptr, y.ptr] {
            p.record_stream(&call.issue)?;
        }
        call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
        call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
        let (h, t) = (call.raw(), eff.raw());
        let (m, n, lda) = (sr as i32, sc as i32, a.ld as i32);
        let (ix, iy) = (x.inc as i32, y.inc as i32);
        let (pa, px, py) = (a.ptr.as_raw(), x.ptr.as_raw(), y.ptr.as_raw());
        let (al, be) = (
            (&alpha as *const T::Scalar).cast::<c_void>(),
            (&beta as *const T::Scalar).cast::<c_void>(),
        );
        // SAFETY: (all arms) the stored matrix's shape and `lda`, the vectors' lengths and
        // increments were checked against the views (of the handle's device, marked for its
        // stream); `y` overlaps neither input; the scalars are host values of the element's
        // scalar type alive for the call.
        let status = unsafe {
            match T::DATA_TYPE {
                cudaDataType::CUDA_R_32F => lib.cublasSgemv_v2(
                    h,
                    t,
                    m,
                    n,
                    al.cast(),
                    pa as _,
                    lda,
                    px as _,
                    ix,
                    be.cast(),
                    py as _,
                    iy,
                ),
                cudaDataType::CUDA_R_64F => lib.cublasDgemv_v2(
                    h,
                    t,
                    m,
                    n,
                    al.cast(),
                    pa as _,
                    lda,
                    px as _,
                    ix,
                    be.cast(),
                    py as _,
                    iy,
                ),
                cudaDataType::CUDA_C_32F => lib.cublasCgemv_v2(
                    h,
                    t,
                    m,
                    n,
                    al.cast(),
                    pa as _,
                    lda,
                    px as _,
                    ix,
                    be.cast(),
                    py as _,
                    iy,
                ),
                cudaDataType::CUDA_C_64F => lib.cublasZgemv_v2(
                    h,
                    t,
                    m,
                    n,
                    al.cast(),
                    pa as _,
                    lda,
                    px as _,
                    ix,
                    be.cast(),
                    py as _,
                    iy,
                ),
                _ => {
                    // y (len ar) = op(A) (ar x ac) x (ac x 1), as one GEMM column.
                    lib.cublasGemmEx(
                        h,
                        t,
                        cudars_blas_sys::cublasOperation_t::CUBLAS_OP_N,
                        ar as i32,
                        1,
                        ac as i32,
                        al,
                        pa as *const c_void,
                        T::DATA_TYPE,
                        lda,
                        px as *const c_void,
                        T::DATA_TYPE,
                        (ac as i32).max(1),
                        be,
                        py as *mut c_void,
                        T::DATA_TYPE,
                        (ar as i32).max(1),
                        T::COMPUTE,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
            }
        };
        check(status, "gemv")
    })
}

/// The execution type of the `*Ex` level-1 routines: `f32` for the 16-bit types, the element
/// type otherwise.
fn execution<T: Element>() -> cudaDataType {
    T::SCALAR_TYPE
}

/// `y = alpha x + y` (`cublasAxpyEx`).
pub fn axpy<T: Element>(
    stream: &Stream,
    alpha: T::Scalar,
    x: Vector<'_, T>,
    y: Vector<'_, T>,
) -> Result<()> {
    const R: &str = "axpy";
    let device = stream.device().ordinal();
    if x.len != y.len {
        return Err(Error::shape(
            R,
            "y",
            format!("x has {} elements, y {}", x.len, y.len),
        ));
    }
    let sx = check_vector(R, "x", &x, device)?;
    let sy = check_vector(R, "y", &y, device)?;
    if sy.overlaps(&sx) {
        return Err(Error::Overlap {
            routine: R,
            output: "y",
            input: "x",
        });
    }
    if x.len == 0 {
        return Ok(());
    }
    let lib = cublas()?;
    with_call(stream, |call| {
        x.ptr.record_stream(&call.issue)?;
        y.ptr.record_stream(&call.issue)?;
        call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
        call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
        check(
            // SAFETY: lengths and increments checked against the views (handle's device, marked);
            // `alpha` is a host scalar of the execution type.
            unsafe {
                lib.cublasAxpyEx(
                    call.raw(),
                    x.len as i32,
                    (&alpha as *const T::Scalar).cast(),
                    T::SCALAR_TYPE,
                    x.ptr.as_raw() as *const c_void,
                    T::DATA_TYPE,
                    x.inc as i32,
                    y.ptr.as_raw() as *mut c_void,
                    T::DATA_TYPE,
                    y.inc as i32,
                    execution::<T>(),
                )
            },
            "cublasAxpyEx",
        )
    })
}

/// `x = alpha x` (`cublasScalEx`).
pub fn scal<T: Element>(stream: &Stream, alpha: T::Scalar, x: Vector<'_, T>) -> Result<()> {
    const R: &str = "scal";
    check_vector(R, "x", &x, stream.device().ordinal())?;
    if x.len == 0 {
        return Ok(());
    }
    let lib = cublas()?;
    with_call(stream, |call| {
        x.ptr.record_stream(&call.issue)?;
        call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
        call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
        check(
            // SAFETY: length and increment checked against the view (handle's device, marked).
            unsafe {
                lib.cublasScalEx(
                    call.raw(),
                    x.len as i32,
                    (&alpha as *const T::Scalar).cast(),
                    T::SCALAR_TYPE,
                    x.ptr.as_raw() as *mut c_void,
                    T::DATA_TYPE,
                    x.inc as i32,
                    execution::<T>(),
                )
            },
            "cublasScalEx",
        )
    })
}

/// Where a reduction's result goes.
enum Out<'p, R> {
    Host(&'p mut R),
    Device(&'p DevicePtr),
}

fn reduction<R: bytemuck::Pod>(
    routine: &'static str,
    stream: &Stream,
    out: Out<'_, R>,
    issue_call: impl FnOnce(cudars_blas_sys::cublasHandle_t, *mut c_void) -> Result<()>,
    marks: &[(&DevicePtr, Span)],
) -> Result<()> {
    if let Out::Device(p) = &out {
        let r = check_view::<R>(routine, "result", *p, stream.device().ordinal(), 1)?;
        if marks.iter().any(|(_, s)| s.overlaps(&r)) {
            return Err(Error::Overlap {
                routine,
                output: "result",
                input: "x or y",
            });
        }
    }
    with_call(stream, |call| {
        if matches!(out, Out::Host(_)) && call.capture.is_some() {
            return Err(Error::Unsupported {
                routine,
                why: "a host result cannot be returned from a capture; use the `_into` form \
                      with a device result"
                    .into(),
            });
        }
        for (p, _) in marks {
            p.record_stream(&call.issue)?;
        }
        match out {
            Out::Host(r) => {
                call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
                call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
                // cuBLAS blocks until the host result is written.
                issue_call(call.raw(), (r as *mut R).cast())
            }
            Out::Device(p) => {
                p.record_stream(&call.issue)?;
                call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE)?;
                call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
                issue_call(call.raw(), p.as_raw() as *mut c_void)
            }
        }
    })
}

impl<T: Element> Vector<'_, T> {
    fn raw(&self) -> *const c_void {
        self.ptr.as_raw() as *const c_void
    }
}

fn dot_impl<T: Element>(
    stream: &Stream,
    x: Vector<'_, T>,
    y: Vector<'_, T>,
    conjugate: bool,
    out: Out<'_, T>,
) -> Result<()> {
    const R: &str = "dot";
    let device = stream.device().ordinal();
    if x.len != y.len {
        return Err(Error::shape(
            R,
            "y",
            format!("x has {} elements, y {}", x.len, y.len),
        ));
    }
    let sx = check_vector(R, "x", &x, device)?;
    let sy = check_vector(R, "y", &y, device)?;
    let lib = cublas()?;
    let (name, f) = if conjugate && T::COMPLEX {
        ("cublasDotcEx", true)
    } else {
        ("cublasDotEx", false)
    };
    reduction::<T>(
        R,
        stream,
        out,
        |h, result| {
            // SAFETY: lengths and increments checked against the views; `result` is a host
            // `T` alive for the (blocking) call or a checked device view of one `T`.
            let status = unsafe {
                if f {
                    lib.cublasDotcEx(
                        h,
                        x.len as i32,
                        x.raw(),
                        T::DATA_TYPE,
                        x.inc as i32,
                        y.raw(),
                        T::DATA_TYPE,
                        y.inc as i32,
                        result,
                        T::DATA_TYPE,
                        execution::<T>(),
                    )
                } else {
                    lib.cublasDotEx(
                        h,
                        x.len as i32,
                        x.raw(),
                        T::DATA_TYPE,
                        x.inc as i32,
                        y.raw(),
                        T::DATA_TYPE,
                        y.inc as i32,
                        result,
                        T::DATA_TYPE,
                        execution::<T>(),
                    )
                }
            };
            check(status, name)
        },
        &[(x.ptr, sx), (y.ptr, sy)],
    )
}

/// `x . y` (for complex types `conj(x) . y`, `cublasDotcEx`), returned to the host: blocks
/// until it is computed. Refused on a stream being captured; see [`dot_into`].
pub fn dot<T: Element>(stream: &Stream, x: Vector<'_, T>, y: Vector<'_, T>) -> Result<T> {
    let mut r = T::zeroed();
    if x.len == 0 {
        check_vector("dot", "x", &x, stream.device().ordinal())?;
        check_vector("dot", "y", &y, stream.device().ordinal())?;
        return Ok(r);
    }
    dot_impl(stream, x, y, true, Out::Host(&mut r))?;
    Ok(r)
}

/// `x . y` written to the first element of `result` on the device (stream-ordered, capturable).
pub fn dot_into<T: Element>(
    stream: &Stream,
    x: Vector<'_, T>,
    y: Vector<'_, T>,
    result: &DevicePtr,
) -> Result<()> {
    dot_impl(stream, x, y, true, Out::Device(result))
}

fn nrm2_impl<T: Element>(stream: &Stream, x: Vector<'_, T>, out: Out<'_, T::Real>) -> Result<()> {
    const R: &str = "nrm2";
    let sx = check_vector(R, "x", &x, stream.device().ordinal())?;
    let lib = cublas()?;
    reduction::<T::Real>(
        R,
        stream,
        out,
        |h, result| {
            check(
                // SAFETY: length and increment checked against the view; `result` is a host
                // `T::Real` alive for the (blocking) call or a checked device view of one.
                unsafe {
                    lib.cublasNrm2Ex(
                        h,
                        x.len as i32,
                        x.raw(),
                        T::DATA_TYPE,
                        x.inc as i32,
                        result,
                        T::REAL_TYPE,
                        T::REAL_EXECUTION,
                    )
                },
                "cublasNrm2Ex",
            )
        },
        &[(x.ptr, sx)],
    )
}

/// The Euclidean norm of `x`, returned to the host (blocks). Refused on a stream being
/// captured; see [`nrm2_into`].
pub fn nrm2<T: Element>(stream: &Stream, x: Vector<'_, T>) -> Result<T::Real> {
    let mut r = <T::Real as bytemuck::Zeroable>::zeroed();
    if x.len == 0 {
        check_vector("nrm2", "x", &x, stream.device().ordinal())?;
        return Ok(r);
    }
    nrm2_impl(stream, x, Out::Host(&mut r))?;
    Ok(r)
}

/// The Euclidean norm of `x` written to the first element of `result` on the device.
pub fn nrm2_into<T: Element>(stream: &Stream, x: Vector<'_, T>, result: &DevicePtr) -> Result<()> {
    nrm2_impl(stream, x, Out::Device(result))
}

/// `C = alpha op(A) + beta op(B)` (`cublas{S,D,C,Z}geam`; the 16-bit types through
/// cuBLASLt's `cublasLtMatrixTransform`). `C` may be `B` exactly (in place, when `op_b` is
/// [`Op::N`] and the layouts match, as the library allows), else it must overlap neither.
pub fn geam<T: Element>(
    stream: &Stream,
    (alpha, a, op_a): (T::Scalar, Mat<'_, T>, Op),
    (beta, b, op_b): (T::Scalar, Mat<'_, T>, Op),
    c: Mat<'_, T>,
) -> Result<()> {
    const R: &str = "geam";
    let device = stream.device().ordinal();
    let shape = |m: &Mat<'_, T>, op: Op| {
        if op == Op::N {
            (m.rows, m.cols)
        } else {
            (m.cols, m.rows)
        }
    };
    for (name, m, op) in [("a", &a, op_a), ("b", &b, op_b)] {
        if shape(m, op) != (c.rows, c.cols) {
            let (r, cc) = shape(m, op);
            return Err(Error::shape(
                R,
                name,
                format!("op({name}) is {r}x{cc}; c is {}x{}", c.rows, c.cols),
            ));
        }
    }
    let mut spans = [Span { start: 0, end: 0 }; 3];
    for (i, (name, m)) in [("a", &a), ("b", &b), ("c", &c)].into_iter().enumerate() {
        let (r, cc, _) = m.stored();
        let n = mat_elements(R, name, r, cc, m.ld)?;
        spans[i] = check_view::<T>(R, name, m.ptr, device, n)?;
    }
    let in_place_b = spans[2] == spans[1] && op_b == Op::N && b.order == c.order && b.ld == c.ld;
    if spans[2].overlaps(&spans[0]) {
        return Err(Error::Overlap {
            routine: R,
            output: "c",
            input: "a",
        });
    }
    if spans[2].overlaps(&spans[1]) && !in_place_b {
        return Err(Error::Overlap {
            routine: R,
            output: "c",
            input: "b",
        });
    }
    // Everything as stored, column-major: C_s = alpha op'(A_s) + beta op'(B_s), where a
    // row-major C transposes the problem (flip both) and a row-major input flips its own op.
    let flip = |op: Op, t: bool, name: &'static str| -> Result<Op> {
        if !t {
            return Ok(op);
        }
        match op {
            Op::N => Ok(Op::T),
            Op::T => Ok(Op::N),
            Op::C if !T::COMPLEX => Ok(Op::N),
            Op::C => Err(Error::Unsupported {
                routine: R,
                why: format!("{name}: a conjugate transpose cannot be expressed with row-major operands; use column-major"),
            }),
        }
    };
    let ct = c.order == Order::RowMajor;
    let ea = flip(flip(op_a, a.stored().2, "a")?, ct, "a")?;
    let eb = flip(flip(op_b, b.stored().2, "b")?, ct, "b")?;
    let (m, n, _) = c.stored();
    if m == 0 || n == 0 {
        return Ok(());
    }
    let half =
        T::DATA_TYPE == cudaDataType::CUDA_R_16F || T::DATA_TYPE == cudaDataType::CUDA_R_16BF;
    if half {
        return crate::lt::transform::<T>(stream, (alpha, &a, ea), (beta, &b, eb), &c, (m, n));
    }
    let lib = cublas()?;
    with_call(stream, |call| {
        for p in [a.ptr, b.ptr, c.ptr] {
            p.record_stream(&call.issue)?;
        }
        call.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)?;
        call.set_math(cublasMath_t::CUBLAS_DEFAULT_MATH)?;
        let h = call.raw();
        let (ta, tb) = (ea.raw(), eb.raw());
        let (mi, ni) = (m as i32, n as i32);
        let (pa, pb, pc) = (a.ptr.as_raw(), b.ptr.as_raw(), c.ptr.as_raw());
        let (la, lb, lc) = (a.ld as i32, b.ld as i32, c.ld as i32);
        let (al, be) = (
            (&alpha as *const T::Scalar).cast::<c_void>(),
            (&beta as *const T::Scalar).cast::<c_void>(),
        );
        // SAFETY: (all arms) shapes and leading dimensions checked against the views (the
        // handle's device, marked for its stream); C overlaps no input except B exactly, in
        // place, which the library allows; host scalars alive for the call.
        let status = unsafe {
            match T::DATA_TYPE {
                cudaDataType::CUDA_R_32F => lib.cublasSgeam(
                    h,
                    ta,
                    tb,
                    mi,
                    ni,
                    al.cast(),
                    pa as _,
                    la,
                    be.cast(),
                    pb as _,
                    lb,
                    pc as _,
                    lc,
                ),
                cudaDataType::CUDA_R_64F => lib.cublasDgeam(
                    h,
                    ta,
                    tb,
                    mi,
                    ni,
                    al.cast(),
                    pa as _,
                    la,
                    be.cast(),
                    pb as _,
                    lb,
                    pc as _,
                    lc,
                ),
                cudaDataType::CUDA_C_32F => lib.cublasCgeam(
                    h,
                    ta,
                    tb,
                    mi,
                    ni,
                    al.cast(),
                    pa as _,
                    la,
                    be.cast(),
                    pb as _,
                    lb,
                    pc as _,
                    lc,
                ),
                _ => lib.cublasZgeam(
                    h,
                    ta,
                    tb,
                    mi,
                    ni,
                    al.cast(),
                    pa as _,
                    la,
                    be.cast(),
                    pb as _,
                    lb,
                    pc as _,
                    lc,
                ),
            }
        };
        check(status, "geam")
    })
}

/// The compute type of a GEMM on `T` under `math` (shared with cuBLASLt).
pub(crate) fn compute_of<T: Element>(math: MathMode) -> cublasComputeType_t {
    math.compute::<T>()
}
