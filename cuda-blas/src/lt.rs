//! cuBLASLt: [`LtMatmul`] (`D = alpha op(A) op(B) + beta C` with an epilogue: bias, ReLU,
//! GELU, their backward forms), [`Fp8Matmul`] (e4m3/e5m2 inputs with scales, on devices of
//! compute capability 8.9 and later), and the 16-bit `geam` through `cublasLtMatrixTransform`.
//!
//! The algorithm is chosen by cuBLASLt's heuristic once per shape and kept, with the
//! descriptors, in the handle's plan cache (at most [`MAX_PLANS`] per handle; a full cache is
//! emptied). A call then sets the pointers and runs: no descriptor is created and no heuristic
//! asked on the hot path. The workspace is the handle's (see [`handle`](crate::handle)).
//!
//! # Bias and auxiliary buffers
//!
//! cuBLASLt broadcasts the bias along the rows of the column-major output it computes. With a
//! column-major `C` that is one value per row of `C` (`m` values); with a row-major `C` (a
//! linear layer's `batch x features` output, computed as `C^T`) one value per column (`n`
//! values, one per feature), which is what a linear layer wants. The GELU auxiliary buffer
//! (the pre-activation, for the backward pass) has `C`'s shape and layout, with its own
//! leading dimension, a multiple of 8.

use std::collections::HashMap;
use std::ffi::c_void;

use cudars_blas_sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t as DescAttr, cublasLtMatmulDesc_t,
    cublasLtMatmulHeuristicResult_t, cublasLtMatmulPreferenceAttributes_t as PrefAttr,
    cublasLtMatmulPreference_t, cublasLtMatrixLayoutAttribute_t as LayoutAttr,
    cublasLtMatrixLayout_t, cublasLtMatrixTransformDescAttributes_t as TransAttr,
    cublasLtMatrixTransformDesc_t, cublasOperation_t, cublaslt, cudaDataType, cudaStream_t,
    CublasLt,
};
use cudars_core::memory::DevicePtr;
use cudars_core::Stream;

use crate::blas::MathMode;
use crate::element::Element;
use crate::error::{check, Error, Result};
use crate::handle::{with_call, Call};
use crate::shape::{check_view, fits_int, gemm_plan, mat_elements, Mat, Op, Order, Span, View};

/// Plans kept per handle before the cache is emptied.
pub const MAX_PLANS: usize = 256;

/// What cuBLASLt does to the product before it writes `D`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    /// Nothing.
    #[default]
    None,
    /// `max(0, x)`.
    Relu,
    /// `x + bias`.
    Bias,
    /// `max(0, x + bias)`.
    ReluBias,
    /// GELU (tanh approximation).
    Gelu,
    /// `gelu(x + bias)`.
    GeluBias,
    /// GELU, and the pre-activation `x` written to the auxiliary buffer.
    GeluAux,
    /// `gelu(x + bias)`, and `x + bias` written to the auxiliary buffer.
    GeluAuxBias,
    /// Backward of GELU: the product times `gelu'(aux)` (aux: the forward's pre-activation).
    DGelu,
    /// [`Epilogue::DGelu`], and the bias gradient (the sum over columns of the result) written
    /// to the bias buffer.
    DGeluBgrad,
    /// The product, and the bias gradient of `A` in the bias buffer: `op(A)` summed over `k`
    /// (one value per row of `op(A)`, `m` values). For `dW = dy^T x` with row-major `dy`
    /// (`batch x out`, read transposed), the sums of `dy` over the batch: `db`.
    BgradA,
    /// The product, and the bias gradient of `B` in the bias buffer: `op(B)` summed over `k`
    /// (one value per column of `op(B)`, `n` values).
    BgradB,
}

impl Epilogue {
    fn raw(self) -> cublasLtEpilogue_t {
        use cublasLtEpilogue_t as E;
        match self {
            Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::ReluBias => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::GeluBias => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::GeluAux => E::CUBLASLT_EPILOGUE_GELU_AUX,
            Epilogue::GeluAuxBias => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
            Epilogue::DGeluBgrad => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
            Epilogue::BgradA => E::CUBLASLT_EPILOGUE_BGRADA,
            Epilogue::BgradB => E::CUBLASLT_EPILOGUE_BGRADB,
        }
    }

    /// The epilogue of the column-major call: a row-major output swaps the operands, so the
    /// gradient of the caller's A is the call's B's, and the other way round.
    pub(crate) fn for_call(self, swapped: bool) -> Epilogue {
        match (self, swapped) {
            (Epilogue::BgradA, true) => Epilogue::BgradB,
            (Epilogue::BgradB, true) => Epilogue::BgradA,
            (e, _) => e,
        }
    }

    /// Whether the epilogue reads (forward) or writes (gradients) the bias buffer.
    pub fn uses_bias(self) -> bool {
        matches!(
            self,
            Epilogue::Bias
                | Epilogue::ReluBias
                | Epilogue::GeluBias
                | Epilogue::GeluAuxBias
                | Epilogue::DGeluBgrad
                | Epilogue::BgradA
                | Epilogue::BgradB
        )
    }

    /// Whether the epilogue writes the bias buffer (a gradient) rather than reading it.
    pub fn writes_bias(self) -> bool {
        matches!(
            self,
            Epilogue::DGeluBgrad | Epilogue::BgradA | Epilogue::BgradB
        )
    }

    /// Whether the epilogue uses the auxiliary buffer.
    pub fn uses_aux(self) -> bool {
        matches!(
            self,
            Epilogue::GeluAux | Epilogue::GeluAuxBias | Epilogue::DGelu | Epilogue::DGeluBgrad
        )
    }
}

/// The key of a plan: everything the descriptors and the heuristic's choice depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    types: [u32; 4],
    compute: u32,
    transa: u32,
    transb: u32,
    dims: [u64; 3],
    lds: [u64; 4],
    epilogue: u32,
    aligns: [u16; 4],
    fast_accum: bool,
    workspace: usize,
    /// Batch count and the element strides of A, B, C (count 1: not batched).
    batch: [u64; 4],
}

/// Descriptors and the chosen algorithm of one shape.
struct Plan {
    desc: cublasLtMatmulDesc_t,
    layouts: [cublasLtMatrixLayout_t; 3],
    algo: cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        let Ok(lt) = cublaslt() else { return };
        // SAFETY: descriptors this plan created and never destroyed (null ones skipped);
        // destroying them needs no context.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt.cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt.cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// A handle's plans, by shape.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: HashMap<PlanKey, Plan>,
}

impl PlanCache {
    pub(crate) fn clear(&mut self) {
        self.plans.clear();
    }
}

fn set_desc<V>(lt: &CublasLt, desc: cublasLtMatmulDesc_t, attr: DescAttr, v: &V) -> Result<()> {
    check(
        // SAFETY: a live descriptor; `v` is the attribute's documented type, read for the call.
        unsafe {
            lt.cublasLtMatmulDescSetAttribute(
                desc,
                attr,
                (v as *const V).cast(),
                std::mem::size_of::<V>(),
            )
        },
        "cublasLtMatmulDescSetAttribute",
    )
}

fn set_layout<V>(lt: &CublasLt, l: cublasLtMatrixLayout_t, attr: LayoutAttr, v: &V) -> Result<()> {
    check(
        // SAFETY: a live layout; `v` is the attribute's documented type, read for the call.
        unsafe {
            lt.cublasLtMatrixLayoutSetAttribute(
                l,
                attr,
                (v as *const V).cast(),
                std::mem::size_of::<V>(),
            )
        },
        "cublasLtMatrixLayoutSetAttribute",
    )
}

fn layout(
    lt: &CublasLt,
    ty: cudaDataType,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<cublasLtMatrixLayout_t> {
    let mut l: cublasLtMatrixLayout_t = std::ptr::null_mut();
    check(
        // SAFETY: a valid out-pointer; the dimensions were checked by the caller.
        unsafe { lt.cublasLtMatrixLayoutCreate(&mut l, ty, rows as u64, cols as u64, ld as i64) },
        "cublasLtMatrixLayoutCreate",
    )?;
    Ok(l)
}

/// The largest power of two (at most 256) dividing `addr`.
fn alignment(addr: u64) -> u16 {
    if addr == 0 {
        return 256;
    }
    (1u64 << addr.trailing_zeros().min(8)) as u16
}

/// One matmul, described for the plan cache.
struct Spec {
    key: PlanKey,
    scale_type: cudaDataType,
    /// (rows, cols, ld) of A, B, C as the call passes them.
    shapes: [(usize, usize, usize); 3],
    types: [cudaDataType; 3],
}

/// The plan of `spec`, made (descriptors, heuristic) on a miss.
fn plan_for<'c>(call: &'c mut Call<'_, '_>, spec: &Spec) -> Result<&'c Plan> {
    let handle = call.lt()?;
    let (_, ws) = call.workspace();
    let cache = call.plans();
    if !cache.plans.contains_key(&spec.key) {
        if cache.plans.len() >= MAX_PLANS {
            cache.plans.clear();
        }
        let lt = cublaslt()?;
        let mut p = Plan {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: cublasLtMatmulAlgo_t::default(),
        };
        check(
            // SAFETY: a valid out-pointer; compute and scale types are a documented pair.
            unsafe {
                lt.cublasLtMatmulDescCreate(
                    &mut p.desc,
                    cublasComputeType_t(spec.key.compute),
                    spec.scale_type,
                )
            },
            "cublasLtMatmulDescCreate",
        )?;
        set_desc(
            lt,
            p.desc,
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSA,
            &cublasOperation_t(spec.key.transa),
        )?;
        set_desc(
            lt,
            p.desc,
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSB,
            &cublasOperation_t(spec.key.transb),
        )?;
        set_desc(
            lt,
            p.desc,
            DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &cublasLtEpilogue_t(spec.key.epilogue),
        )?;
        if spec.key.fast_accum {
            set_desc(lt, p.desc, DescAttr::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &1i8)?;
        }
        if spec.key.lds[3] != 0 {
            set_desc(
                lt,
                p.desc,
                DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                &(spec.key.lds[3] as i64),
            )?;
        }
        for i in 0..3 {
            let (r, c, ld) = spec.shapes[i];
            p.layouts[i] = layout(lt, spec.types[i], r, c, ld)?;
            if spec.key.batch[0] > 1 {
                set_layout(
                    lt,
                    p.layouts[i],
                    LayoutAttr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &(spec.key.batch[0] as i32),
                )?;
                set_layout(
                    lt,
                    p.layouts[i],
                    LayoutAttr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &(spec.key.batch[i + 1] as i64),
                )?;
            }
        }
        let mut pref: cublasLtMatmulPreference_t = std::ptr::null_mut();
        check(
            // SAFETY: a valid out-pointer.
            unsafe { lt.cublasLtMatmulPreferenceCreate(&mut pref) },
            "cublasLtMatmulPreferenceCreate",
        )?;
        let chosen = choose(lt, handle, &p, pref, ws, &spec.key.aligns);
        // SAFETY: the preference this function created.
        let _ = unsafe { lt.cublasLtMatmulPreferenceDestroy(pref) };
        p.algo = chosen?;
        cache.plans.insert(spec.key, p);
    }
    cache
        .plans
        .get(&spec.key)
        .ok_or_else(|| Error::Unsupported {
            routine: "lt_matmul",
            why: "plan cache".into(),
        })
}

fn choose(
    lt: &CublasLt,
    handle: cudars_blas_sys::cublasLtHandle_t,
    p: &Plan,
    pref: cublasLtMatmulPreference_t,
    ws: usize,
    aligns: &[u16; 4],
) -> Result<cublasLtMatmulAlgo_t> {
    let set = |attr: PrefAttr, v: u64| -> Result<()> {
        check(
            // SAFETY: a live preference; both attributes are uint64 / uint32 and read for the call.
            unsafe {
                if attr == PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES {
                    lt.cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        attr,
                        (&v as *const u64).cast(),
                        8,
                    )
                } else {
                    let v32 = v as u32;
                    lt.cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        attr,
                        (&v32 as *const u32).cast(),
                        4,
                    )
                }
            },
            "cublasLtMatmulPreferenceSetAttribute",
        )
    };
    set(
        PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        ws as u64,
    )?;
    set(
        PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        aligns[0] as u64,
    )?;
    set(
        PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        aligns[1] as u64,
    )?;
    set(
        PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        aligns[2] as u64,
    )?;
    set(
        PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        aligns[2] as u64,
    )?;
    let mut result = cublasLtMatmulHeuristicResult_t::default();
    let mut count = 0;
    check(
        // SAFETY: live descriptors and preference; out-pointers for one result and the count.
        unsafe {
            lt.cublasLtMatmulAlgoGetHeuristic(
                handle,
                p.desc,
                p.layouts[0],
                p.layouts[1],
                p.layouts[2],
                p.layouts[2],
                pref,
                1,
                &mut result,
                &mut count,
            )
        },
        "cublasLtMatmulAlgoGetHeuristic",
    )?;
    if count < 1 {
        return Err(Error::Unsupported {
            routine: "lt_matmul",
            why: "cuBLASLt has no algorithm for this shape, type, epilogue and alignment".into(),
        });
    }
    Ok(result.algo)
}

/// `C = alpha op(A) op(B) + beta C`, then the epilogue, through cuBLASLt (`D` is `C`, in
/// place). Shapes and layouts as [`Gemm`](crate::Gemm); bias and auxiliary buffers as the
/// [module documentation](self) says.
///
/// ```no_run
/// use cudars_blas::{Epilogue, LtMatmul, Mat, Op};
/// use cudars_core::{Device, Stream};
/// use half::bf16;
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let (batch, inp, out) = (8, 64, 32);
/// let x = cudars_mempool::driver::malloc(&stream, batch * inp * 2)?;
/// let w = cudars_mempool::driver::malloc(&stream, out * inp * 2)?;
/// let bias = cudars_mempool::driver::malloc(&stream, out * 2)?;
/// let y = cudars_mempool::driver::malloc(&stream, batch * out * 2)?;
/// // y = relu(x w^T + bias), row-major like torch.nn.Linear.
/// LtMatmul::new(
///     Mat::<bf16>::row_major(&x, batch, inp),
///     Mat::row_major(&w, out, inp),
///     Mat::row_major(&y, batch, out),
/// )
/// .op_b(Op::T)
/// .epilogue(Epilogue::ReluBias)
/// .bias(&bias)
/// .run(&stream)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LtMatmul<'a, T: Element> {
    /// `A`.
    pub a: Mat<'a, T>,
    /// The operation on `A`.
    pub op_a: Op,
    /// `B`.
    pub b: Mat<'a, T>,
    /// The operation on `B`.
    pub op_b: Op,
    /// `C`, read when `beta` is not zero, and written (`D`).
    pub c: Mat<'a, T>,
    /// `alpha`.
    pub alpha: T::Scalar,
    /// `beta`.
    pub beta: T::Scalar,
    /// The epilogue.
    pub epilogue: Epilogue,
    /// The bias (or bias-gradient) vector, of `T`.
    pub bias: Option<&'a DevicePtr>,
    /// The auxiliary buffer and its leading dimension, of `T`.
    pub aux: Option<(&'a DevicePtr, usize)>,
    /// Precision.
    pub math: MathMode,
}

impl<'a, T: Element> LtMatmul<'a, T> {
    /// `C = A B`, no epilogue.
    pub fn new(a: Mat<'a, T>, b: Mat<'a, T>, c: Mat<'a, T>) -> Self {
        LtMatmul {
            a,
            op_a: Op::N,
            b,
            op_b: Op::N,
            c,
            alpha: T::one(),
            beta: T::zero(),
            epilogue: Epilogue::None,
            bias: None,
            aux: None,
            math: MathMode::Default,
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

    /// `beta`.
    pub fn beta(mut self, beta: T::Scalar) -> Self {
        self.beta = beta;
        self
    }

    /// The epilogue.
    pub fn epilogue(mut self, e: Epilogue) -> Self {
        self.epilogue = e;
        self
    }

    /// The bias vector.
    pub fn bias(mut self, bias: &'a DevicePtr) -> Self {
        self.bias = Some(bias);
        self
    }

    /// The auxiliary buffer with leading dimension `ld`.
    pub fn aux(mut self, aux: &'a DevicePtr, ld: usize) -> Self {
        self.aux = Some((aux, ld));
        self
    }

    /// The precision.
    pub fn math(mut self, math: MathMode) -> Self {
        self.math = math;
        self
    }

    /// Issues the matmul on `stream`. Nothing is issued when an argument is refused.
    pub fn run(&self, stream: &Stream) -> Result<()> {
        self.run_inner(stream, None)
    }

    /// `batch` matmuls of this shape, the i-th matrices `i * stride` elements after the first
    /// (cuBLASLt's strided batch: one call). Epilogues that read or write a bias or
    /// auxiliary buffer are refused here ([`Error::Unsupported`]); each view must hold its
    /// whole batch and the outputs must not overlap, as [`Gemm::run_strided_batched`] checks.
    ///
    /// [`Gemm::run_strided_batched`]: crate::Gemm::run_strided_batched
    pub fn run_strided_batched(
        &self,
        stream: &Stream,
        batch: usize,
        strides: crate::StridedBatch,
    ) -> Result<()> {
        self.run_inner(stream, Some((batch, strides)))
    }

    fn run_inner(
        &self,
        stream: &Stream,
        batched: Option<(usize, crate::StridedBatch)>,
    ) -> Result<()> {
        const R: &str = "lt_matmul";
        let device = stream.device().ordinal();
        let (plan, bias, aux, aux_ld) = match batched {
            None => check_lt(
                (&self.a, self.op_a),
                (&self.b, self.op_b),
                &self.c,
                self.epilogue,
                (self.bias, self.aux),
                device,
            )?,
            Some((count, st)) => {
                if self.epilogue.uses_bias()
                    || self.epilogue.uses_aux()
                    || self.bias.is_some()
                    || self.aux.is_some()
                {
                    return Err(Error::Unsupported {
                        routine: R,
                        why: format!(
                            "{:?} with a bias or auxiliary buffer in a strided batch",
                            self.epilogue
                        ),
                    });
                }
                fits_int(R, "batch", count)?;
                let plan = crate::blas::check_gemm(
                    R,
                    (&self.a, self.op_a),
                    (&self.b, self.op_b),
                    &self.c,
                    device,
                    Some((count, [st.a, st.b, st.c])),
                )?;
                (plan, 0, 0, 0)
            }
        };
        if plan.m == 0 || plan.n == 0 || batched.is_some_and(|(n, _)| n == 0) {
            return Ok(());
        }
        if T::COMPLEX && self.epilogue != Epilogue::None {
            return Err(Error::Unsupported {
                routine: R,
                why: "epilogues are for real types".into(),
            });
        }
        let batch = match batched {
            None => [1, 0, 0, 0],
            Some((count, st)) => {
                let (sa, sb) = if plan.swapped {
                    (st.b, st.a)
                } else {
                    (st.a, st.b)
                };
                [count as u64, sa as u64, sb as u64, st.c as u64]
            }
        };
        let (a, b) = if plan.swapped {
            (&self.b, &self.a)
        } else {
            (&self.a, &self.b)
        };
        let stored = |m: &Mat<'_, T>, op: Op| {
            let (r, c, _) = m.stored();
            // The layout describes the matrix as stored; the op says how it is read.
            let _ = op;
            (r, c, m.ld)
        };
        let compute = crate::blas::compute_of::<T>(self.math);
        let key = PlanKey {
            types: [T::DATA_TYPE.0; 4],
            compute: compute.0,
            transa: plan.transa.raw().0,
            transb: plan.transb.raw().0,
            dims: [plan.m as u64, plan.n as u64, plan.k as u64],
            lds: [a.ld as u64, b.ld as u64, self.c.ld as u64, aux_ld as u64],
            epilogue: self.epilogue.for_call(plan.swapped).raw().0,
            aligns: [
                alignment(a.ptr.as_raw()),
                alignment(b.ptr.as_raw()),
                alignment(self.c.ptr.as_raw()).min(alignment(aux).min(alignment(bias))),
                0,
            ],
            fast_accum: false,
            workspace: 0,
            batch,
        };
        let spec = Spec {
            key,
            scale_type: T::SCALAR_TYPE,
            shapes: [
                stored(a, plan.transa),
                stored(b, plan.transb),
                stored(&self.c, Op::N),
            ],
            types: [T::DATA_TYPE; 3],
        };
        let lt = cublaslt()?;
        with_call(stream, |call| {
            for p in [a.ptr, b.ptr, self.c.ptr] {
                p.record_stream(&call.issue)?;
            }
            if let Some(p) = self.bias.filter(|_| self.epilogue.uses_bias()) {
                p.record_stream(&call.issue)?;
            }
            if let Some((p, _)) = self.aux.filter(|_| self.epilogue.uses_aux()) {
                p.record_stream(&call.issue)?;
            }
            let (ws, ws_len) = call.workspace();
            let mut key = spec.key;
            key.workspace = ws_len;
            let spec = Spec { key, ..spec };
            let handle = call.lt()?;
            let raw_stream = call.issue.raw() as cudaStream_t;
            let p = plan_for(call, &spec)?;
            if bias != 0 {
                set_desc(
                    lt,
                    p.desc,
                    DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias,
                )?;
            }
            if aux != 0 {
                set_desc(
                    lt,
                    p.desc,
                    DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                    &aux,
                )?;
            }
            check(
                // SAFETY: shapes, leading dimensions and every buffer (bias, aux) were checked
                // against their views (the handle's device, marked for its stream); the plan's
                // layouts are those shapes; the algorithm was chosen for them, this workspace size
                // and these alignments; the workspace is the handle's, bound to this stream.
                unsafe {
                    lt.cublasLtMatmul(
                        handle,
                        p.desc,
                        (&self.alpha as *const T::Scalar).cast(),
                        a.ptr.as_raw() as *const c_void,
                        p.layouts[0],
                        b.ptr.as_raw() as *const c_void,
                        p.layouts[1],
                        (&self.beta as *const T::Scalar).cast(),
                        self.c.ptr.as_raw() as *const c_void,
                        p.layouts[2],
                        self.c.ptr.as_raw() as *mut c_void,
                        p.layouts[2],
                        &p.algo,
                        ws as *mut c_void,
                        ws_len,
                        raw_stream,
                    )
                },
                "cublasLtMatmul",
            )
        })
    }
}

/// Checks an [`LtMatmul`]: the GEMM's shapes and views, then the bias and auxiliary buffers
/// the epilogue needs (present, long enough, aligned, on the device, not overlapping what the
/// call writes). Returns the plan, the bias and aux addresses (0: none) and aux's leading
/// dimension. Pure: no library call.
pub(crate) fn check_lt<T: Element, P: View>(
    (a, op_a): (&Mat<'_, T, P>, Op),
    (b, op_b): (&Mat<'_, T, P>, Op),
    c: &Mat<'_, T, P>,
    epilogue: Epilogue,
    (bias, aux): (Option<&P>, Option<(&P, usize)>),
    device: usize,
) -> Result<(crate::shape::Plan, u64, u64, usize)> {
    const R: &str = "lt_matmul";
    let plan = gemm_plan(R, a, op_a, b, op_b, c)?;
    fits_int(R, "m", plan.m)?;
    fits_int(R, "n", plan.n)?;
    fits_int(R, "k", plan.k)?;
    let mut spans = [Span { start: 0, end: 0 }; 3];
    for (i, (name, m)) in [("a", a), ("b", b), ("c", c)].into_iter().enumerate() {
        let (r, c, _) = m.stored();
        let n = mat_elements(R, name, r, c, m.ld)?;
        spans[i] = check_view::<T>(R, name, m.ptr, device, n)?;
    }
    for (i, input) in [(0, "a"), (1, "b")] {
        if spans[2].overlaps(&spans[i]) {
            return Err(Error::Overlap {
                routine: R,
                output: "c",
                input,
            });
        }
    }
    // Bias: one value per row of the stored output (m of the call); the gradient of the
    // caller's A has op(A)'s rows (m of the call, or n when a row-major C swapped the
    // operands), of B op(B)'s columns.
    let bias_len = match epilogue.for_call(plan.swapped) {
        Epilogue::BgradB => plan.n,
        _ => plan.m,
    } as u64;
    let bias = match (epilogue.uses_bias(), bias) {
        (true, Some(bv)) => {
            let s = check_view::<T>(R, "bias", bv, device, bias_len)?;
            if epilogue.writes_bias() {
                for (i, input) in [(0, "a"), (1, "b"), (2, "c")] {
                    if s.overlaps(&spans[i]) {
                        return Err(Error::Overlap {
                            routine: R,
                            output: "bias",
                            input,
                        });
                    }
                }
            }
            bv.addr()
        }
        (true, None) => {
            return Err(Error::shape(
                R,
                "bias",
                format!("{:?} needs a bias buffer", epilogue),
            ))
        }
        (false, Some(_)) => {
            return Err(Error::shape(
                R,
                "bias",
                format!("{:?} takes no bias buffer", epilogue),
            ))
        }
        (false, None) => 0,
    };
    let (aux, aux_ld) = match (epilogue.uses_aux(), aux) {
        (true, Some((p, ld))) => {
            if ld % 8 != 0 {
                return Err(Error::shape(
                    R,
                    "aux",
                    format!("leading dimension {ld} is not a multiple of 8"),
                ));
            }
            let n = mat_elements(R, "aux", plan.m, plan.n, ld)?;
            let s = check_view::<T>(R, "aux", p, device, n)?;
            for (i, input) in [(0, "a"), (1, "b"), (2, "c")] {
                if s.overlaps(&spans[i]) {
                    return Err(Error::Overlap {
                        routine: R,
                        output: "aux",
                        input,
                    });
                }
            }
            (p.addr(), ld)
        }
        (true, None) => {
            return Err(Error::shape(
                R,
                "aux",
                format!("{:?} needs an auxiliary buffer", epilogue),
            ))
        }
        (false, Some(_)) => {
            return Err(Error::shape(
                R,
                "aux",
                format!("{:?} takes no auxiliary buffer", epilogue),
            ))
        }
        (false, None) => (0, 0),
    };
    if T::COMPLEX && epilogue != Epilogue::None {
        return Err(Error::Unsupported {
            routine: R,
            why: "epilogues are for real types".into(),
        });
    }
    Ok((plan, bias, aux, aux_ld))
}

/// An FP8 element kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8 {
    /// 4 exponent bits, 3 mantissa bits (`CUDA_R_8F_E4M3`): weights and activations.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits (`CUDA_R_8F_E5M2`): gradients.
    E5M2,
}

impl Fp8 {
    fn raw(self) -> cudaDataType {
        match self {
            Fp8::E4M3 => cudaDataType::CUDA_R_8F_E4M3,
            Fp8::E5M2 => cudaDataType::CUDA_R_8F_E5M2,
        }
    }
}

/// `D = (a_scale * b_scale) * A^T B` with FP8 inputs (one byte each) and a 16- or 32-bit
/// output `D`, the layout FP8 GEMMs require: `A` stored column-major `k x m` (read
/// transposed), `B` column-major `k x n`, `D` column-major `m x n`. The scales are one `f32`
/// each in device memory. Needs compute capability 8.9 or later ([`Error::Unsupported`]
/// before, with nothing issued); both inputs E5M2 is refused (the library has no such
/// kernel).
#[derive(Debug, Clone, Copy)]
pub struct Fp8Matmul<'a, D: Element> {
    /// `A`, `k x m`, column-major, `lda >= k`.
    pub a: (&'a DevicePtr, Fp8, usize),
    /// `B`, `k x n`, column-major, `ldb >= k`.
    pub b: (&'a DevicePtr, Fp8, usize),
    /// `D`, `m x n`, column-major.
    pub d: Mat<'a, D>,
    /// The scales of `A` and `B` (one device `f32` each).
    pub scales: (&'a DevicePtr, &'a DevicePtr),
    /// `k`.
    pub k: usize,
}

impl<D: Element> Fp8Matmul<'_, D> {
    /// Issues the FP8 matmul on `stream`.
    pub fn run(&self, stream: &Stream) -> Result<()> {
        const R: &str = "fp8_matmul";
        let dev = stream.device();
        let device = dev.ordinal();
        if D::COMPLEX || D::DATA_TYPE == cudaDataType::CUDA_R_64F {
            return Err(Error::Unsupported {
                routine: R,
                why: format!("output type {}", D::NAME),
            });
        }
        if self.d.order != Order::ColMajor {
            return Err(Error::Unsupported {
                routine: R,
                why: "d must be column-major".into(),
            });
        }
        let (cc_major, cc_minor) = dev.compute_capability()?;
        if (cc_major, cc_minor) < (8, 9) {
            return Err(Error::Unsupported {
                routine: R,
                why: format!("FP8 needs compute capability 8.9 or later; device {device} is {cc_major}.{cc_minor}"),
            });
        }
        if self.a.1 == Fp8::E5M2 && self.b.1 == Fp8::E5M2 {
            return Err(Error::Unsupported {
                routine: R,
                why: "E5M2 x E5M2 has no kernel".into(),
            });
        }
        let (m, n, k) = (self.d.rows, self.d.cols, self.k);
        fits_int(R, "k", k)?;
        if k % 16 != 0 || m % 16 != 0 || n % 16 != 0 {
            return Err(Error::shape(
                R,
                "k",
                format!("FP8 needs m, n and k multiples of 16 (m {m}, n {n}, k {k})"),
            ));
        }
        let ea = mat_elements(R, "a", k, m, self.a.2)?;
        let eb = mat_elements(R, "b", k, n, self.b.2)?;
        let ed = mat_elements(R, "d", m, n, self.d.ld)?;
        let sa = check_view::<u8>(R, "a", self.a.0, device, ea)?;
        let sb = check_view::<u8>(R, "b", self.b.0, device, eb)?;
        let sd = check_view::<D>(R, "d", self.d.ptr, device, ed)?;
        for (name, p) in [("a_scale", self.scales.0), ("b_scale", self.scales.1)] {
            let s = check_view::<f32>(R, name, p, device, 1)?;
            if sd.overlaps(&s) {
                return Err(Error::Overlap {
                    routine: R,
                    output: "d",
                    input: name,
                });
            }
        }
        for (s, input) in [(sa, "a"), (sb, "b")] {
            if sd.overlaps(&s) {
                return Err(Error::Overlap {
                    routine: R,
                    output: "d",
                    input,
                });
            }
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let key = PlanKey {
            types: [self.a.1.raw().0, self.b.1.raw().0, D::DATA_TYPE.0, 0],
            compute: cublasComputeType_t::CUBLAS_COMPUTE_32F.0,
            transa: cublasOperation_t::CUBLAS_OP_T.0,
            transb: cublasOperation_t::CUBLAS_OP_N.0,
            dims: [m as u64, n as u64, k as u64],
            lds: [self.a.2 as u64, self.b.2 as u64, self.d.ld as u64, 0],
            epilogue: cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT.0,
            aligns: [
                alignment(self.a.0.as_raw()),
                alignment(self.b.0.as_raw()),
                alignment(self.d.ptr.as_raw()),
                0,
            ],
            fast_accum: true,
            workspace: 0,
            batch: [1, 0, 0, 0],
        };
        let spec = Spec {
            key,
            scale_type: cudaDataType::CUDA_R_32F,
            shapes: [(k, m, self.a.2), (k, n, self.b.2), (m, n, self.d.ld)],
            types: [self.a.1.raw(), self.b.1.raw(), D::DATA_TYPE],
        };
        let lt = cublaslt()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        with_call(stream, |call| {
            for p in [self.a.0, self.b.0, self.d.ptr, self.scales.0, self.scales.1] {
                p.record_stream(&call.issue)?;
            }
            let (ws, ws_len) = call.workspace();
            let mut key = spec.key;
            key.workspace = ws_len;
            let spec = Spec { key, ..spec };
            let handle = call.lt()?;
            let raw_stream = call.issue.raw() as cudaStream_t;
            let p = plan_for(call, &spec)?;
            set_desc(
                lt,
                p.desc,
                DescAttr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &self.scales.0.as_raw(),
            )?;
            set_desc(
                lt,
                p.desc,
                DescAttr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &self.scales.1.as_raw(),
            )?;
            check(
                // SAFETY: as `LtMatmul::run`: shapes, leading dimensions, the scales and the output
                // were checked against their views and marked; the plan matches them.
                unsafe {
                    lt.cublasLtMatmul(
                        handle,
                        p.desc,
                        (&alpha as *const f32).cast(),
                        self.a.0.as_raw() as *const c_void,
                        p.layouts[0],
                        self.b.0.as_raw() as *const c_void,
                        p.layouts[1],
                        (&beta as *const f32).cast(),
                        self.d.ptr.as_raw() as *const c_void,
                        p.layouts[2],
                        self.d.ptr.as_raw() as *mut c_void,
                        p.layouts[2],
                        &p.algo,
                        ws as *mut c_void,
                        ws_len,
                        raw_stream,
                    )
                },
                "cublasLtMatmul",
            )
        })
    }
}

/// The 16-bit `geam`: `C_s = alpha op(A_s) + beta op(B_s)` on stored matrices through
/// `cublasLtMatrixTransform` (checked by [`geam`](crate::geam)).
pub(crate) fn transform<T: Element>(
    stream: &Stream,
    (alpha, a, ea): (T::Scalar, &Mat<'_, T>, Op),
    (beta, b, eb): (T::Scalar, &Mat<'_, T>, Op),
    c: &Mat<'_, T>,
    (m, n): (usize, usize),
) -> Result<()> {
    let lt = cublaslt()?;
    with_call(stream, |call| {
        for p in [a.ptr, b.ptr, c.ptr] {
            p.record_stream(&call.issue)?;
        }
        let handle = call.lt()?;
        let raw_stream = call.issue.raw() as cudaStream_t;
        let mut desc: cublasLtMatrixTransformDesc_t = std::ptr::null_mut();
        check(
            // SAFETY: a valid out-pointer; f32 scales for 16-bit data.
            unsafe { lt.cublasLtMatrixTransformDescCreate(&mut desc, T::SCALAR_TYPE) },
            "cublasLtMatrixTransformDescCreate",
        )?;
        let result = (|| {
            for (attr, op) in [
                (TransAttr::CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, ea),
                (TransAttr::CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB, eb),
            ] {
                let v = op.raw();
                check(
                    // SAFETY: a live descriptor; the attribute is a cublasOperation_t.
                    unsafe {
                        lt.cublasLtMatrixTransformDescSetAttribute(
                            desc,
                            attr,
                            (&v as *const cublasOperation_t).cast(),
                            std::mem::size_of::<cublasOperation_t>(),
                        )
                    },
                    "cublasLtMatrixTransformDescSetAttribute",
                )?;
            }
            let (ar, ac, _) = a.stored();
            let (br, bc, _) = b.stored();
            let la = layout(lt, T::DATA_TYPE, ar, ac, a.ld)?;
            let lb = layout(lt, T::DATA_TYPE, br, bc, b.ld);
            let lc = layout(lt, T::DATA_TYPE, m, n, c.ld);
            let out = match (lb, lc) {
                (Ok(lb), Ok(lc)) => {
                    // SAFETY: shapes and leading dimensions checked against the views by
                    // `geam`; the layouts describe them; host scalars alive for the call.
                    let r = check(
                        unsafe {
                            lt.cublasLtMatrixTransform(
                                handle,
                                desc,
                                (&alpha as *const T::Scalar).cast(),
                                a.ptr.as_raw() as *const c_void,
                                la,
                                (&beta as *const T::Scalar).cast(),
                                b.ptr.as_raw() as *const c_void,
                                lb,
                                c.ptr.as_raw() as *mut c_void,
                                lc,
                                raw_stream,
                            )
                        },
                        "cublasLtMatrixTransform",
                    );
                    // SAFETY: layouts created above.
                    unsafe {
                        let _ = lt.cublasLtMatrixLayoutDestroy(lb);
                        let _ = lt.cublasLtMatrixLayoutDestroy(lc);
                    }
                    r
                }
                (lb, lc) => {
                    // SAFETY: whichever layouts were created above.
                    unsafe {
                        if let Ok(l) = lb {
                            let _ = lt.cublasLtMatrixLayoutDestroy(l);
                        }
                        if let Ok(l) = lc {
                            let _ = lt.cublasLtMatrixLayoutDestroy(l);
                        }
                    }
                    Err(Error::Unsupported {
                        routine: "geam",
                        why: "layout creation failed".into(),
                    })
                }
            };
            // SAFETY: created above.
            let _ = unsafe { lt.cublasLtMatrixLayoutDestroy(la) };
            out
        })();
        // SAFETY: the descriptor created above.
        let _ = unsafe { lt.cublasLtMatrixTransformDescDestroy(desc) };
        result
    })
}
