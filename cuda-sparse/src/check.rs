//! The checks made before cuSPARSE sees an argument: pure functions over lengths, addresses
//! and host copies of the index arrays (the CPU tests exercise each refusal).

use crate::dense::{Op, Order};
use crate::element::Index;
use crate::error::{Error, Result};

/// A count the index type `I` must be able to hold (rows, columns, nonzeros), and that
/// cuSPARSE takes as an `int64_t`.
pub(crate) fn fits<I: Index>(routine: &'static str, arg: &'static str, v: usize) -> Result<()> {
    if v > I::MAX {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("{v} does not fit the {} indices", I::NAME),
        });
    }
    Ok(())
}

/// `count` elements of `elem` bytes, without overflow.
pub(crate) fn bytes(
    routine: &'static str,
    arg: &'static str,
    count: usize,
    elem: usize,
) -> Result<u64> {
    (count as u64)
        .checked_mul(elem as u64)
        .filter(|b| *b <= i64::MAX as u64)
        .ok_or_else(|| Error::Shape {
            routine,
            arg,
            why: format!("{count} elements of {elem} bytes overflow"),
        })
}

/// A view `(address, bytes, device)` against what it must hold: device, alignment, length.
/// Returns the byte range the routine touches.
pub(crate) fn view(
    routine: &'static str,
    arg: &'static str,
    (addr, have, device): (u64, usize, usize),
    need: u64,
    (align, expected_device): (usize, usize),
) -> Result<(u64, u64)> {
    if device != expected_device {
        return Err(Error::WrongDevice {
            routine,
            arg,
            expected: expected_device,
            actual: device,
        });
    }
    if !addr.is_multiple_of(align as u64) {
        return Err(Error::Misaligned {
            routine,
            arg,
            addr,
            align,
        });
    }
    if need > have as u64 {
        return Err(Error::BufferTooSmall {
            routine,
            arg,
            need,
            have: have as u64,
        });
    }
    Ok((addr, addr.saturating_add(need)))
}

/// Refuses two byte ranges that share memory (empty ranges share nothing).
pub(crate) fn disjoint(
    routine: &'static str,
    (a, ra): (&'static str, (u64, u64)),
    (b, rb): (&'static str, (u64, u64)),
) -> Result<()> {
    if ra.0 < ra.1 && rb.0 < rb.1 && ra.0 < rb.1 && rb.0 < ra.1 {
        return Err(Error::Overlap { routine, a, b });
    }
    Ok(())
}

/// An index array's length against what the matrix needs.
pub(crate) fn length(
    routine: &'static str,
    arg: &'static str,
    actual: usize,
    expected: usize,
) -> Result<()> {
    if actual != expected {
        return Err(Error::Length {
            routine,
            arg,
            expected,
            actual,
        });
    }
    Ok(())
}

/// The first index of `indices` outside `[0, bound)`, as the error. Scans once (a pass the
/// compiler vectorises); the position is looked for only on failure.
fn in_range<I: Index>(
    routine: &'static str,
    arg: &'static str,
    indices: &[I],
    bound: usize,
) -> Result<()> {
    let bound64 = bound as u64;
    // A negative index becomes a huge u64: one comparison catches both ends.
    if indices.iter().all(|&i| (i.to_i64() as u64) < bound64) {
        return Ok(());
    }
    let (position, value) = indices
        .iter()
        .map(|&i| i.to_i64())
        .enumerate()
        .find(|&(_, v)| (v as u64) >= bound64)
        .unwrap_or((0, 0));
    Err(Error::IndexOutOfRange {
        routine,
        arg,
        position,
        value,
        bound,
    })
}

/// The structure of a CSR matrix (`rows x cols`, `col_indices.len()` nonzeros, zero-based):
/// `rows + 1` row offsets, the first 0, none smaller than the one before it, the last equal
/// to the number of nonzeros; every column index in `[0, cols)`. What cuSPARSE trusts: with
/// these, every position it reads is inside the arrays and the dense operands.
pub(crate) fn csr_structure<I: Index>(
    routine: &'static str,
    (rows, cols): (usize, usize),
    row_offsets: &[I],
    col_indices: &[I],
) -> Result<()> {
    let nnz = col_indices.len();
    fits::<I>(routine, "rows", rows)?;
    fits::<I>(routine, "cols", cols)?;
    fits::<I>(routine, "nnz", nnz)?;
    length(
        routine,
        "row_offsets",
        row_offsets.len(),
        rows.saturating_add(1),
    )?;
    let first = row_offsets.first().map_or(0, |o| o.to_i64());
    if first != 0 {
        return Err(Error::RowOffsets {
            routine,
            position: 0,
            why: format!("{first}; the first offset must be 0"),
        });
    }
    if !row_offsets.windows(2).all(|w| w[0] <= w[1]) {
        let position = row_offsets
            .windows(2)
            .position(|w| w[0] > w[1])
            .map_or(0, |p| p + 1);
        return Err(Error::RowOffsets {
            routine,
            position,
            why: format!(
                "{} is smaller than the offset before it ({})",
                row_offsets[position].to_i64(),
                row_offsets[position - 1].to_i64()
            ),
        });
    }
    let last = row_offsets.last().map_or(0, |o| o.to_i64());
    if last != nnz as i64 {
        return Err(Error::RowOffsets {
            routine,
            position: rows,
            why: format!("{last}; the last offset must be nnz = {nnz}"),
        });
    }
    in_range(routine, "col_indices", col_indices, cols)
}

/// The structure of a COO matrix (`rows x cols`, zero-based): as many row as column indices,
/// the row indices sorted (cuSPARSE's COO format), each in `[0, rows)`, each column index in
/// `[0, cols)`.
pub(crate) fn coo_structure<I: Index>(
    routine: &'static str,
    (rows, cols): (usize, usize),
    row_indices: &[I],
    col_indices: &[I],
) -> Result<()> {
    let nnz = row_indices.len();
    fits::<I>(routine, "rows", rows)?;
    fits::<I>(routine, "cols", cols)?;
    fits::<I>(routine, "nnz", nnz)?;
    length(routine, "col_indices", col_indices.len(), nnz)?;
    in_range(routine, "row_indices", row_indices, rows)?;
    if !row_indices.windows(2).all(|w| w[0] <= w[1]) {
        let position = row_indices
            .windows(2)
            .position(|w| w[0] > w[1])
            .map_or(0, |p| p + 1);
        return Err(Error::Unsorted {
            routine,
            arg: "row_indices",
            position,
        });
    }
    in_range(routine, "col_indices", col_indices, cols)
}

/// The lengths of `x` and `y` in `y = op(A) x` for a `rows x cols` matrix `A`.
pub(crate) fn spmv_lengths(op: Op, rows: usize, cols: usize) -> (usize, usize) {
    let (m, k) = op.apply((rows, cols));
    (k, m)
}

/// A dense vector's length against the one the routine needs; its bytes.
pub(crate) fn vector_bytes(
    routine: &'static str,
    arg: &'static str,
    len: usize,
    expected: usize,
    elem: usize,
) -> Result<u64> {
    if len != expected {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("{len} elements; the product needs {expected}"),
        });
    }
    bytes(routine, arg, len, elem)
}

/// The bytes of a dense `rows x cols` matrix with leading dimension `ld` in `order`, after
/// checking `ld` against the layout: `ld * cols` elements (column-major, `ld >= rows`) or
/// `ld * rows` (row-major, `ld >= cols`), the length cuSPARSE documents for the values.
pub(crate) fn matrix_bytes(
    routine: &'static str,
    arg: &'static str,
    (rows, cols, ld): (usize, usize, usize),
    order: Order,
    elem: usize,
) -> Result<u64> {
    let (inner, outer, name) = match order {
        Order::ColMajor => (rows, cols, "rows"),
        Order::RowMajor => (cols, rows, "cols"),
    };
    if ld < inner.max(1) {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("leading dimension {ld} is less than max(1, {inner} {name})"),
        });
    }
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    ld.checked_mul(outer)
        .ok_or_else(|| Error::Shape {
            routine,
            arg,
            why: "the matrix's extent overflows".into(),
        })
        .and_then(|n| bytes(routine, arg, n, elem))
}

/// `C = op(A) op(B)`: `op(A)` is `m x k`, `op(B)` `k x n`, `C` `m x n`.
pub(crate) fn spmm_shapes(
    routine: &'static str,
    a: (usize, usize),
    b: (usize, usize),
    c: (usize, usize),
) -> Result<()> {
    let ((m, k), (kb, n)) = (a, b);
    if kb != k {
        return Err(Error::Shape {
            routine,
            arg: "b",
            why: format!("op(B) has {kb} rows; op(A) is {m} x {k}"),
        });
    }
    if c != (m, n) {
        return Err(Error::Shape {
            routine,
            arg: "c",
            why: format!("{} x {}; op(A) op(B) is {m} x {n}", c.0, c.1),
        });
    }
    Ok(())
}
