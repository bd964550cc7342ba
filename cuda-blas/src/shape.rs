//! Matrices and vectors as views with a shape ([`Mat`], [`Vector`]), and the checks every
//! routine makes before the library reads memory: dimensions and leading dimensions, strides,
//! counts, the bytes each view must hold, alignment, the device, and overlaps of outputs.
//!
//! # Row-major callers
//!
//! cuBLAS is column-major. A row-major `rows x cols` matrix with leading dimension `ld`
//! (elements between the starts of two rows) is, as stored, the column-major `cols x rows`
//! matrix with the same `ld`: its transpose. [`Mat::row_major`] records that, and the routines
//! map the call exactly (never a silent transposition of your data):
//!
//! * an input `A` that is row-major is passed as stored with its operation flipped
//!   (`N` <-> `T`); a conjugate transpose of a row-major input cannot be expressed and is
//!   refused ([`Error::Unsupported`]);
//! * a row-major output `C = op(A) op(B)` is computed as `C^T = op(B)^T op(A)^T`: the operands
//!   swap and both flip.
//!
//! Mixed orders are allowed; the result is the same as if every matrix were converted first.

use std::marker::PhantomData;

use cudars_blas_sys::cublasOperation_t;
use cudars_core::memory::DevicePtr;

use crate::element::Element;
use crate::error::{Error, Result};

/// What the checks need of a view: its first address, its length in bytes and its device.
/// Implemented for [`DevicePtr`], which is what the routines take; the checks are generic so
/// they can be tested without a GPU.
pub trait View {
    /// The address of the first byte.
    fn addr(&self) -> u64;
    /// Bytes in the view.
    fn bytes(&self) -> usize;
    /// The ordinal of the memory's device.
    fn device_ordinal(&self) -> usize;
}

impl View for DevicePtr {
    #[inline]
    fn addr(&self) -> u64 {
        self.as_raw()
    }
    #[inline]
    fn bytes(&self) -> usize {
        self.len()
    }
    #[inline]
    fn device_ordinal(&self) -> usize {
        self.device().ordinal()
    }
}

/// The operation applied to an input matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Op {
    /// As is.
    #[default]
    N,
    /// Transposed.
    T,
    /// Conjugate-transposed (for real types, the same as [`Op::T`]).
    C,
}

impl Op {
    pub(crate) fn raw(self) -> cublasOperation_t {
        match self {
            Op::N => cublasOperation_t::CUBLAS_OP_N,
            Op::T => cublasOperation_t::CUBLAS_OP_T,
            Op::C => cublasOperation_t::CUBLAS_OP_C,
        }
    }

    fn transposes(self) -> bool {
        self != Op::N
    }
}

/// How a matrix is laid out in its view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// Columns one after another (cuBLAS's, Fortran's); `ld >= rows`.
    #[default]
    ColMajor,
    /// Rows one after another (C's, PyTorch's, NumPy's default); `ld >= cols`.
    RowMajor,
}

/// A matrix in a device view: `rows x cols` elements of `T`, laid out in `order` with leading
/// dimension `ld`, starting at the view's first byte.
#[derive(Debug)]
pub struct Mat<'a, T, P: View = DevicePtr> {
    pub(crate) ptr: &'a P,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) ld: usize,
    pub(crate) order: Order,
    _t: PhantomData<T>,
}

impl<T, P: View> Clone for Mat<'_, T, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, P: View> Copy for Mat<'_, T, P> {}
impl<T, P: View> Clone for Vector<'_, T, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, P: View> Copy for Vector<'_, T, P> {}

impl<'a, T: Element, P: View> Mat<'a, T, P> {
    /// A column-major `rows x cols` matrix, packed (`ld = rows`).
    pub fn col_major(ptr: &'a P, rows: usize, cols: usize) -> Self {
        Mat {
            ptr,
            rows,
            cols,
            ld: rows.max(1),
            order: Order::ColMajor,
            _t: PhantomData,
        }
    }

    /// A row-major `rows x cols` matrix, packed (`ld = cols`).
    pub fn row_major(ptr: &'a P, rows: usize, cols: usize) -> Self {
        Mat {
            ptr,
            rows,
            cols,
            ld: cols.max(1),
            order: Order::RowMajor,
            _t: PhantomData,
        }
    }

    /// The same matrix with leading dimension `ld` (checked when used).
    pub fn with_ld(mut self, ld: usize) -> Self {
        self.ld = ld;
        self
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The leading dimension.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The layout.
    pub fn order(&self) -> Order {
        self.order
    }

    /// As stored, column-major: (rows, cols, transposed-from-logical).
    pub(crate) fn stored(&self) -> (usize, usize, bool) {
        match self.order {
            Order::ColMajor => (self.rows, self.cols, false),
            Order::RowMajor => (self.cols, self.rows, true),
        }
    }
}

/// A vector in a device view: `len` elements of `T`, `inc` elements apart (`inc >= 1`).
#[derive(Debug)]
pub struct Vector<'a, T, P: View = DevicePtr> {
    pub(crate) ptr: &'a P,
    pub(crate) len: usize,
    pub(crate) inc: usize,
    _t: PhantomData<T>,
}

impl<'a, T: Element, P: View> Vector<'a, T, P> {
    /// `len` contiguous elements.
    pub fn new(ptr: &'a P, len: usize) -> Self {
        Vector {
            ptr,
            len,
            inc: 1,
            _t: PhantomData,
        }
    }

    /// Every element of the view (its length divided by the element size).
    pub fn whole(ptr: &'a P) -> Self {
        Vector::new(ptr, ptr.bytes() / std::mem::size_of::<T>())
    }

    /// The same vector with elements `inc` apart (checked when used).
    pub fn with_inc(mut self, inc: usize) -> Self {
        self.inc = inc;
        self
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the vector has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The byte range a checked operand covers, for overlap checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Span {
    pub(crate) fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The largest dimension, leading dimension or count cuBLAS's 32-bit API takes.
pub(crate) const MAX_INT: usize = i32::MAX as usize;

pub(crate) fn fits_int(routine: &'static str, argument: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::shape(
            routine,
            argument,
            format!("{v} exceeds {MAX_INT}, the largest the library's 32-bit interface takes"),
        )
    })
}

/// Checks the view of an operand: device, alignment, and that it holds `elements` elements
/// (`elements` already computed with overflow checks). Returns the bytes it covers.
pub(crate) fn check_view<T>(
    routine: &'static str,
    argument: &'static str,
    ptr: &impl View,
    device: usize,
    elements: u64,
) -> Result<Span> {
    if ptr.device_ordinal() != device {
        return Err(Error::WrongDevice {
            routine,
            argument,
            expected: device,
            actual: ptr.device_ordinal(),
        });
    }
    let size = std::mem::size_of::<T>() as u64;
    let needed = elements
        .checked_mul(size)
        .ok_or_else(|| Error::shape(routine, argument, format!("{elements} elements overflow")))?;
    if needed > ptr.bytes() as u64 {
        return Err(Error::BufferTooSmall {
            routine,
            argument,
            needed,
            len: ptr.bytes(),
        });
    }
    let align = std::mem::align_of::<T>();
    if needed > 0 && !ptr.addr().is_multiple_of(align as u64) {
        return Err(Error::Misaligned {
            routine,
            argument,
            addr: ptr.addr(),
            align,
        });
    }
    Ok(Span {
        start: ptr.addr(),
        end: ptr.addr() + needed,
    })
}

/// Elements a stored `rows x cols` column-major matrix with `ld` spans: `ld * (cols - 1) +
/// rows`, 0 when empty. Checks `ld >= max(1, rows)` and the 32-bit limits.
pub(crate) fn mat_elements(
    routine: &'static str,
    argument: &'static str,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<u64> {
    fits_int(routine, argument, rows)?;
    fits_int(routine, argument, cols)?;
    fits_int(routine, argument, ld)?;
    if ld < rows.max(1) {
        return Err(Error::shape(
            routine,
            argument,
            format!("leading dimension {ld} is less than max(1, {rows}), the stored rows"),
        ));
    }
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    (ld as u64)
        .checked_mul(cols as u64 - 1)
        .and_then(|v| v.checked_add(rows as u64))
        .ok_or_else(|| Error::shape(routine, argument, "size overflows".into()))
}

/// Elements a batch of `count` matrices of `each` elements, `stride` apart, spans.
pub(crate) fn batch_elements(
    routine: &'static str,
    argument: &'static str,
    each: u64,
    stride: usize,
    count: usize,
) -> Result<u64> {
    if count == 0 || each == 0 {
        return Ok(0);
    }
    (stride as u64)
        .checked_mul(count as u64 - 1)
        .and_then(|v| v.checked_add(each))
        .ok_or_else(|| Error::shape(routine, argument, "batch size overflows".into()))
}

/// A GEMM reduced to cuBLAS's column-major call (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) transa: Op,
    pub(crate) transb: Op,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// `true`: the call's A is the caller's B (a row-major output).
    pub(crate) swapped: bool,
}

/// The effective operation on a stored matrix: `op` applied to the logical matrix, which is
/// the stored one transposed when `stored_t`.
fn effective(
    routine: &'static str,
    argument: &'static str,
    op: Op,
    stored_t: bool,
    complex: bool,
) -> Result<Op> {
    if !stored_t {
        return Ok(op);
    }
    match op {
        Op::N => Ok(Op::T),
        Op::T => Ok(Op::N),
        Op::C if !complex => Ok(Op::N),
        Op::C => Err(Error::Unsupported {
            routine,
            why: format!(
                "{argument}: the conjugate transpose of a row-major complex matrix is its \
                 element-wise conjugate, which cuBLAS cannot apply; pass it column-major"
            ),
        }),
    }
}

/// Flips an effective operation for the transposed problem (`C^T = B'^T A'^T`).
fn flip(routine: &'static str, argument: &'static str, op: Op, complex: bool) -> Result<Op> {
    match op {
        Op::N => Ok(Op::T),
        Op::T => Ok(Op::N),
        Op::C if !complex => Ok(Op::N),
        Op::C => Err(Error::Unsupported {
            routine,
            why: format!(
                "{argument}: a conjugate transpose into a row-major complex output cannot be \
                 expressed; make the output column-major"
            ),
        }),
    }
}

/// Logical shape of `op(mat)`.
fn op_shape<T: Element, P: View>(m: &Mat<'_, T, P>, op: Op) -> (usize, usize) {
    if op.transposes() {
        (m.cols, m.rows)
    } else {
        (m.rows, m.cols)
    }
}

/// Checks `C = op_a(A) op_b(B)`'s shapes and maps it to cuBLAS's column-major call.
pub(crate) fn gemm_plan<T: Element, P: View>(
    routine: &'static str,
    a: &Mat<'_, T, P>,
    op_a: Op,
    b: &Mat<'_, T, P>,
    op_b: Op,
    c: &Mat<'_, T, P>,
) -> Result<Plan> {
    let (am, ak) = op_shape(a, op_a);
    let (bk, bn) = op_shape(b, op_b);
    if ak != bk {
        return Err(Error::shape(
            routine,
            "b",
            format!("op(a) is {am}x{ak} but op(b) is {bk}x{bn}: inner dimensions differ"),
        ));
    }
    if (c.rows, c.cols) != (am, bn) {
        return Err(Error::shape(
            routine,
            "c",
            format!("c is {}x{} but op(a) op(b) is {am}x{bn}", c.rows, c.cols),
        ));
    }
    let ea = effective(routine, "a", op_a, a.stored().2, T::COMPLEX)?;
    let eb = effective(routine, "b", op_b, b.stored().2, T::COMPLEX)?;
    if c.order == Order::RowMajor {
        Ok(Plan {
            transa: flip(routine, "b", eb, T::COMPLEX)?,
            transb: flip(routine, "a", ea, T::COMPLEX)?,
            m: bn,
            n: am,
            k: ak,
            swapped: true,
        })
    } else {
        Ok(Plan {
            transa: ea,
            transb: eb,
            m: am,
            n: bn,
            k: ak,
            swapped: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e<T>(r: Result<T>) -> Error {
        match r {
            Err(e) => e,
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn leading_dimensions_below_the_rows_are_refused() {
        assert_eq!(mat_elements("gemm", "a", 4, 3, 4).unwrap(), 4 * 2 + 4);
        assert_eq!(mat_elements("gemm", "a", 0, 3, 1).unwrap(), 0);
        let err = e(mat_elements("gemm", "a", 4, 3, 3));
        assert!(matches!(err, Error::Shape { argument: "a", .. }), "{err}");
        assert!(err.to_string().contains("leading dimension 3"), "{err}");
        let err = e(mat_elements("gemm", "a", 0, 3, 0));
        assert!(matches!(err, Error::Shape { .. }));
    }

    #[test]
    fn dimensions_beyond_the_32_bit_interface_are_refused() {
        let err = e(mat_elements("gemm", "c", 1 << 31, 1, 1 << 31));
        assert!(err.to_string().contains("2147483648 exceeds"), "{err}");
    }

    #[test]
    fn batches_span_stride_times_count_less_one_plus_one_matrix() {
        assert_eq!(batch_elements("b", "a", 12, 16, 3).unwrap(), 16 * 2 + 12);
        assert_eq!(batch_elements("b", "a", 12, 16, 0).unwrap(), 0);
        assert!(batch_elements("b", "a", 12, usize::MAX, 3).is_err());
    }

    #[test]
    fn spans_overlap_only_when_they_share_a_byte() {
        let a = Span { start: 0, end: 16 };
        assert!(a.overlaps(&Span { start: 15, end: 20 }));
        assert!(!a.overlaps(&Span { start: 16, end: 20 }));
        assert!(!a.overlaps(&Span { start: 0, end: 0 }));
    }
}
