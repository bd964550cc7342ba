//! The checks every routine makes before cuSOLVER sees its arguments: pure functions over
//! addresses and lengths (the CPU tests exercise each refusal).

use crate::error::{Error, Result};

/// A column-major matrix in a device view: `rows x cols`, columns `ld` elements apart
/// (LAPACK's layout, which cuSOLVER's dense routines take).
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub(crate) ptr: &'a cudars_core::DevicePtr,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) ld: usize,
}

impl<'a> Matrix<'a> {
    /// A packed `rows x cols` column-major matrix (`ld = rows`).
    pub fn new(ptr: &'a cudars_core::DevicePtr, rows: usize, cols: usize) -> Self {
        Matrix {
            ptr,
            rows,
            cols,
            ld: rows.max(1),
        }
    }

    /// The same matrix with columns `ld` elements apart (checked when used).
    pub fn with_ld(mut self, ld: usize) -> Self {
        self.ld = ld;
        self
    }
}

/// Which triangle a symmetric matrix's routines read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uplo {
    /// The lower triangle.
    Lower,
    /// The upper triangle.
    Upper,
}

/// A value cuSOLVER takes as a C `int`.
pub(crate) fn int(routine: &'static str, arg: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape {
        routine,
        arg,
        why: format!("{v} does not fit cuSOLVER's 32-bit int"),
    })
}

/// The bytes a `rows x cols` column-major matrix with leading dimension `ld` reaches, after
/// checking `ld >= max(1, rows)` and the int range.
pub(crate) fn matrix_bytes(
    routine: &'static str,
    arg: &'static str,
    (rows, cols, ld): (usize, usize, usize),
    elem: usize,
) -> Result<u64> {
    int(routine, arg, rows)?;
    int(routine, arg, cols)?;
    int(routine, arg, ld)?;
    if ld < rows.max(1) {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("leading dimension {ld} is less than max(1, {rows} rows)"),
        });
    }
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    (ld as u64)
        .checked_mul(cols as u64 - 1)
        .and_then(|v| v.checked_add(rows as u64))
        .and_then(|v| v.checked_mul(elem as u64))
        .ok_or_else(|| Error::Shape {
            routine,
            arg,
            why: "the matrix's extent overflows".into(),
        })
}

/// The bytes `batch` matrices reach, each as [`matrix_bytes`] checks it, stored
/// `ld * cols` elements apart (the batched routines' strided layout).
pub(crate) fn matrices_bytes(
    routine: &'static str,
    arg: &'static str,
    (rows, cols, ld): (usize, usize, usize),
    elem: usize,
    batch: usize,
) -> Result<u64> {
    let one = matrix_bytes(routine, arg, (rows, cols, ld), elem)?;
    if batch <= 1 || one == 0 {
        return Ok(one);
    }
    ((ld as u64) * (cols as u64) * elem as u64)
        .checked_mul(batch as u64 - 1)
        .and_then(|v| v.checked_add(one))
        .ok_or_else(|| Error::Shape {
            routine,
            arg,
            why: format!("{batch} matrices overflow the address space"),
        })
}

/// A view `(address, bytes, device)` against what it must hold: device, alignment, length.
/// Returns its byte range.
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
    Ok((addr, addr + need))
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

/// A square matrix's order, or [`Error::Shape`].
pub(crate) fn square(
    routine: &'static str,
    arg: &'static str,
    rows: usize,
    cols: usize,
) -> Result<usize> {
    if rows != cols {
        return Err(Error::Shape {
            routine,
            arg,
            why: format!("{rows} x {cols} is not square"),
        });
    }
    Ok(rows)
}

/// `info` as a result: 0 is `Ok`, a negative value a refused parameter, a positive one what
/// `positive` makes of it.
pub(crate) fn info(
    routine: &'static str,
    info: i32,
    positive: impl FnOnce(usize) -> Error,
) -> Result<()> {
    match info {
        0 => Ok(()),
        i if i < 0 => Err(Error::InvalidParameter {
            routine,
            index: i.unsigned_abs() as usize,
        }),
        i => Err(positive(i as usize)),
    }
}
