//! Two-dimensional layouts (CuPy's `order='C'` / `order='F'`) and the host-side relayout
//! that 2-D transfers use when the device and host orders differ.
//!
//! A [`Layout2`] says how a `rows x cols` matrix sits in a flat buffer: row-major (C order,
//! element `(i, j)` at `i * ld + j`) or column-major (Fortran order, at `j * ld + i`), with a
//! leading dimension `ld` of at least the row (row-major) or column (column-major) length.
//!
//! ```
//! use cudars_xfer::layout::{relayout, Layout2, Order};
//! // [[1, 2, 3], [4, 5, 6]] in row-major order, to column-major.
//! let c = [1, 2, 3, 4, 5, 6];
//! let mut f = [0; 6];
//! relayout(&c, Layout2::contiguous(2, 3, Order::RowMajor), &mut f, Layout2::contiguous(2, 3, Order::ColumnMajor))?;
//! assert_eq!(f, [1, 4, 2, 5, 3, 6]);
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use crate::error::{Error, Result};

/// Element order of a 2-D array in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// Rows are contiguous (C order, CuPy's `'C'`, NumPy's default).
    #[default]
    RowMajor,
    /// Columns are contiguous (Fortran order, CuPy's `'F'`, BLAS and LAPACK).
    ColumnMajor,
}

/// Where a `rows x cols` matrix's elements sit in a flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout2 {
    rows: usize,
    cols: usize,
    order: Order,
    ld: usize,
}

impl Layout2 {
    /// A matrix with no gaps: the leading dimension is the row length (row-major) or the
    /// column length (column-major).
    pub fn contiguous(rows: usize, cols: usize, order: Order) -> Layout2 {
        let ld = match order {
            Order::RowMajor => cols,
            Order::ColumnMajor => rows,
        };
        Layout2 {
            rows,
            cols,
            order,
            ld,
        }
    }

    /// A matrix whose consecutive rows (row-major) or columns (column-major) start `ld`
    /// elements apart, such as a pitched allocation or a sub-matrix.
    /// [`Error::BadLeadingDimension`] when `ld` is shorter than what it must span.
    pub fn with_leading_dimension(
        rows: usize,
        cols: usize,
        order: Order,
        ld: usize,
    ) -> Result<Layout2> {
        let layout = Layout2 {
            rows,
            cols,
            order,
            ld,
        };
        if ld < layout.inner() && layout.outer() > 0 {
            return Err(Error::BadLeadingDimension {
                ld,
                inner: layout.inner(),
            });
        }
        Ok(layout)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The element order.
    pub fn order(&self) -> Order {
        self.order
    }

    /// The leading dimension, in elements.
    pub fn leading_dimension(&self) -> usize {
        self.ld
    }

    /// Elements in the matrix (`rows * cols`); [`Error::SizeOverflow`] when that overflows.
    pub fn elements(&self) -> Result<usize> {
        self.rows.checked_mul(self.cols).ok_or(Error::SizeOverflow {
            count: self.rows,
            elem_size: self.cols,
        })
    }

    /// Length of the contiguous runs (row length in row-major order, column length in
    /// column-major order).
    pub fn inner(&self) -> usize {
        match self.order {
            Order::RowMajor => self.cols,
            Order::ColumnMajor => self.rows,
        }
    }

    /// Number of contiguous runs.
    pub fn outer(&self) -> usize {
        match self.order {
            Order::RowMajor => self.rows,
            Order::ColumnMajor => self.cols,
        }
    }

    /// `true` when the elements have no gaps between runs.
    pub fn is_contiguous(&self) -> bool {
        self.ld == self.inner() || self.outer() <= 1
    }

    /// Elements a buffer must hold for this layout: `(outer - 1) * ld + inner`, 0 for an
    /// empty matrix.
    pub fn span(&self) -> Result<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Ok(0);
        }
        (self.outer() - 1)
            .checked_mul(self.ld)
            .and_then(|n| n.checked_add(self.inner()))
            .ok_or(Error::SizeOverflow {
                count: self.outer(),
                elem_size: self.ld,
            })
    }

    /// Checks that a buffer of `len` elements holds this layout ([`Error::ShapeMismatch`]).
    pub fn check_fits(&self, len: usize) -> Result<()> {
        let needed = self.span()?;
        if needed > len {
            return Err(Error::ShapeMismatch {
                rows: self.rows,
                cols: self.cols,
                ld: self.ld,
                needed,
                len,
            });
        }
        Ok(())
    }

    /// The same matrix, contiguous, in `order`.
    pub fn to_contiguous(&self, order: Order) -> Layout2 {
        Layout2::contiguous(self.rows, self.cols, order)
    }

    /// Index of element `(i, j)`.
    #[inline]
    fn index(&self, i: usize, j: usize) -> usize {
        match self.order {
            Order::RowMajor => i * self.ld + j,
            Order::ColumnMajor => j * self.ld + i,
        }
    }
}

/// [`Error::ShapeMismatch`] unless `src` and `dst` have the same rows and columns.
pub(crate) fn check_same_shape(src: Layout2, dst: Layout2) -> Result<()> {
    if (src.rows, src.cols) != (dst.rows, dst.cols) {
        return Err(Error::ShapeMismatch {
            rows: dst.rows,
            cols: dst.cols,
            ld: dst.ld,
            needed: dst.elements()?,
            len: src.elements()?,
        });
    }
    Ok(())
}

/// Edge of the square tiles the transposing copy works in: 32 x 32 elements of up to 16 bytes
/// fit comfortably in L1 for both source and destination.
const TILE: usize = 32;

/// Copies the matrix `src` (laid out as `src_layout`) into `dst` (laid out as `dst_layout`):
/// element `(i, j)` of one becomes element `(i, j)` of the other, whatever the orders and
/// leading dimensions. Gaps in `dst` are left untouched.
///
/// Errors: the two layouts differ in shape ([`Error::ShapeMismatch`]), or a buffer is too
/// small for its layout; nothing is written then.
pub fn relayout<T: Copy>(
    src: &[T],
    src_layout: Layout2,
    dst: &mut [T],
    dst_layout: Layout2,
) -> Result<()> {
    src_layout.check_fits(src.len())?;
    dst_layout.check_fits(dst.len())?;
    check_same_shape(src_layout, dst_layout)?;
    if src_layout.rows == 0 || src_layout.cols == 0 {
        return Ok(());
    }
    if src_layout.order == dst_layout.order {
        // Run by run.
        let inner = src_layout.inner();
        for o in 0..src_layout.outer() {
            let s = o * src_layout.ld;
            let d = o * dst_layout.ld;
            dst[d..d + inner].copy_from_slice(&src[s..s + inner]);
        }
        return Ok(());
    }
    // Orders differ: a transpose, tile by tile so both sides stay in cache.
    let (rows, cols) = (src_layout.rows, src_layout.cols);
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            let (i1, j1) = ((i0 + TILE).min(rows), (j0 + TILE).min(cols));
            match dst_layout.order {
                // Write rows of dst, reading columns of src.
                Order::RowMajor => {
                    for i in i0..i1 {
                        for j in j0..j1 {
                            dst[dst_layout.index(i, j)] = src[src_layout.index(i, j)];
                        }
                    }
                }
                Order::ColumnMajor => {
                    for j in j0..j1 {
                        for i in i0..i1 {
                            dst[dst_layout.index(i, j)] = src[src_layout.index(i, j)];
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contiguous_layouts_have_the_obvious_leading_dimension() {
        let c = Layout2::contiguous(2, 3, Order::RowMajor);
        assert_eq!(c.leading_dimension(), 3);
        assert_eq!(c.span().unwrap(), 6);
        let f = Layout2::contiguous(2, 3, Order::ColumnMajor);
        assert_eq!(f.leading_dimension(), 2);
        assert_eq!(f.span().unwrap(), 6);
        assert!(c.is_contiguous() && f.is_contiguous());
    }

    #[test]
    fn a_short_leading_dimension_is_rejected() {
        assert_eq!(
            Layout2::with_leading_dimension(2, 3, Order::RowMajor, 2),
            Err(Error::BadLeadingDimension { ld: 2, inner: 3 })
        );
        assert!(Layout2::with_leading_dimension(2, 3, Order::ColumnMajor, 2).is_ok());
        let pitched = Layout2::with_leading_dimension(2, 3, Order::RowMajor, 8).unwrap();
        assert_eq!(pitched.span().unwrap(), 8 + 3);
        assert!(!pitched.is_contiguous());
    }

    #[test]
    fn span_overflow_and_short_buffers_are_typed_errors() {
        let huge = Layout2::with_leading_dimension(usize::MAX, 2, Order::RowMajor, 4).unwrap();
        assert!(matches!(huge.span(), Err(Error::SizeOverflow { .. })));
        let l = Layout2::contiguous(3, 3, Order::RowMajor);
        assert_eq!(
            l.check_fits(8),
            Err(Error::ShapeMismatch {
                rows: 3,
                cols: 3,
                ld: 3,
                needed: 9,
                len: 8
            })
        );
        assert!(Layout2::contiguous(0, 5, Order::RowMajor)
            .check_fits(0)
            .is_ok());
    }

    #[test]
    fn relayout_rejects_different_shapes_and_writes_nothing() {
        let src = [1, 2, 3, 4, 5, 6];
        let mut dst = [0; 6];
        let r = relayout(
            &src,
            Layout2::contiguous(2, 3, Order::RowMajor),
            &mut dst,
            Layout2::contiguous(3, 2, Order::RowMajor),
        );
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })));
        assert_eq!(dst, [0; 6]);
    }

    #[test]
    fn relayout_keeps_gaps_untouched() {
        // 2x2 row-major into a pitched column-major buffer with ld 3.
        let src = [1, 2, 3, 4];
        let mut dst = [-1; 5];
        let dl = Layout2::with_leading_dimension(2, 2, Order::ColumnMajor, 3).unwrap();
        relayout(
            &src,
            Layout2::contiguous(2, 2, Order::RowMajor),
            &mut dst,
            dl,
        )
        .unwrap();
        assert_eq!(dst, [1, 3, -1, 2, 4]);
    }

    fn layouts() -> impl Strategy<Value = (Layout2, Layout2)> {
        (
            0usize..70,
            0usize..70,
            any::<bool>(),
            any::<bool>(),
            0usize..5,
            0usize..5,
        )
            .prop_map(|(r, c, a, b, pa, pb)| {
                let oa = if a {
                    Order::RowMajor
                } else {
                    Order::ColumnMajor
                };
                let ob = if b {
                    Order::RowMajor
                } else {
                    Order::ColumnMajor
                };
                let la = Layout2::contiguous(r, c, oa);
                let lb = Layout2::contiguous(r, c, ob);
                (
                    Layout2::with_leading_dimension(r, c, oa, la.ld + pa).unwrap(),
                    Layout2::with_leading_dimension(r, c, ob, lb.ld + pb).unwrap(),
                )
            })
    }

    proptest! {
        /// Element (i, j) lands at (i, j) for every pair of layouts, and a round trip is exact.
        #[test]
        fn relayout_maps_each_element_to_its_place((a, b) in layouts()) {
            let src: Vec<u32> = (0..a.span().unwrap()).map(|k| k as u32 * 7 + 1).collect();
            let mut dst = vec![0u32; b.span().unwrap()];
            relayout(&src, a, &mut dst, b).unwrap();
            for i in 0..a.rows() {
                for j in 0..a.cols() {
                    prop_assert_eq!(dst[b.index(i, j)], src[a.index(i, j)]);
                }
            }
            let mut back = vec![0u32; a.span().unwrap()];
            relayout(&dst, b, &mut back, a).unwrap();
            for i in 0..a.rows() {
                for j in 0..a.cols() {
                    prop_assert_eq!(back[a.index(i, j)], src[a.index(i, j)]);
                }
            }
        }
    }
}
