//! The dense operands: [`DnVec`], [`DnMat`] (column- or row-major, [`Order`]), and the
//! operation applied to an operand ([`Op`]).

use cudars_core::DevicePtr;
use cudars_sparse_sys::{cusparseOperation_t, cusparseOrder_t};

/// What a routine applies to an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Op {
    /// As is.
    #[default]
    N,
    /// Transposed.
    T,
}

impl Op {
    pub(crate) fn raw(self) -> cusparseOperation_t {
        match self {
            Op::N => cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE,
            Op::T => cusparseOperation_t::CUSPARSE_OPERATION_TRANSPOSE,
        }
    }

    /// The shape of `op(M)` for a stored `rows x cols` matrix `M`.
    pub fn apply(self, (rows, cols): (usize, usize)) -> (usize, usize) {
        match self {
            Op::N => (rows, cols),
            Op::T => (cols, rows),
        }
    }
}

/// The memory layout of a dense matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// Columns one after another (cuSPARSE's default, Fortran's); `ld >= rows`.
    #[default]
    ColMajor,
    /// Rows one after another (C's, PyTorch's, NumPy's default); `ld >= cols`.
    RowMajor,
}

impl Order {
    pub(crate) fn raw(self) -> cusparseOrder_t {
        match self {
            Order::ColMajor => cusparseOrder_t::CUSPARSE_ORDER_COL,
            Order::RowMajor => cusparseOrder_t::CUSPARSE_ORDER_ROW,
        }
    }
}

/// A dense vector of `len` elements at the start of a device view. The element type is the
/// sparse matrix's it is used with; the view must hold `len` of them (checked when used).
#[derive(Debug, Clone, Copy)]
pub struct DnVec<'a> {
    pub(crate) ptr: &'a DevicePtr,
    pub(crate) len: usize,
}

impl<'a> DnVec<'a> {
    /// `len` elements at the start of `ptr`.
    pub fn new(ptr: &'a DevicePtr, len: usize) -> Self {
        DnVec { ptr, len }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a vector of no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A dense `rows x cols` matrix at the start of a device view, laid out in `order` with
/// leading dimension `ld` (elements between the starts of consecutive columns, column-major,
/// or rows, row-major). As cuSPARSE documents, the view must hold `ld * cols` elements
/// (column-major) or `ld * rows` (row-major), padding of the last column or row included
/// (checked when used).
#[derive(Debug, Clone, Copy)]
pub struct DnMat<'a> {
    pub(crate) ptr: &'a DevicePtr,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) ld: usize,
    pub(crate) order: Order,
}

impl<'a> DnMat<'a> {
    /// A packed column-major matrix (`ld = rows`).
    pub fn col_major(ptr: &'a DevicePtr, rows: usize, cols: usize) -> Self {
        DnMat {
            ptr,
            rows,
            cols,
            ld: rows.max(1),
            order: Order::ColMajor,
        }
    }

    /// A packed row-major matrix (`ld = cols`).
    pub fn row_major(ptr: &'a DevicePtr, rows: usize, cols: usize) -> Self {
        DnMat {
            ptr,
            rows,
            cols,
            ld: cols.max(1),
            order: Order::RowMajor,
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
}
