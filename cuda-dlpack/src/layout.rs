//! Shapes and strides: compact row-major strides, element counts, the bytes a layout reaches,
//! and the checks exports and imports share. Strides are in elements, as in DLPack.

use crate::error::{Error, Result};

/// Most dimensions a tensor may have here (PyTorch's limit too).
pub const MAX_DIMS: usize = 64;

/// [`Error::InvalidShape`] for a negative extent or more than [`MAX_DIMS`] dimensions.
pub fn check_shape(shape: &[i64]) -> Result<()> {
    if shape.len() > MAX_DIMS || shape.iter().any(|&d| d < 0) {
        return Err(Error::InvalidShape {
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

/// The number of elements of `shape` (1 for a scalar, `ndim == 0`).
pub fn numel(shape: &[i64]) -> Result<usize> {
    check_shape(shape)?;
    shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or(Error::Overflow("element count"))
    })
}

/// The compact row-major (C order) strides of `shape`, in elements: what null strides mean.
///
/// ```
/// assert_eq!(cudars_dlpack::layout::compact_strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
/// ```
pub fn compact_strides(shape: &[i64]) -> Result<Vec<i64>> {
    check_shape(shape)?;
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc
            .checked_mul(d.max(1))
            .ok_or(Error::Overflow("compact strides"))?;
    }
    Ok(strides)
}

/// Whether `strides` lay `shape` out compact and row-major. An empty tensor is; a dimension
/// of extent 1 may have any stride (no step is ever taken along it).
pub fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.len() != strides.len() || shape.contains(&0) {
        return shape.len() == strides.len();
    }
    let mut expected: i64 = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = match expected.checked_mul(d) {
            Some(e) => e,
            None => return false,
        };
    }
    true
}

/// The bytes `[first, end)` that the elements of a layout reach, relative to the address of
/// element `[0, ..., 0]`: `first` is negative when a stride is. `(0, 0)` for an empty tensor.
pub fn byte_span(shape: &[i64], strides: &[i64], elem_size: usize) -> Result<(i128, i128)> {
    check_shape(shape)?;
    if strides.len() != shape.len() {
        return Err(Error::StrideCount {
            ndim: shape.len(),
            strides: strides.len(),
        });
    }
    if shape.contains(&0) {
        return Ok((0, 0));
    }
    let overflow = || Error::Overflow("the bytes a layout reaches");
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        // One product of two i64 always fits an i128; sums of many may not.
        let reach = i128::from(d - 1) * i128::from(s);
        if reach < 0 {
            lo = lo.checked_add(reach).ok_or_else(overflow)?;
        } else {
            hi = hi.checked_add(reach).ok_or_else(overflow)?;
        }
    }
    let size = elem_size as i128;
    let first = lo.checked_mul(size).ok_or_else(overflow)?;
    let end = hi
        .checked_add(1)
        .and_then(|h| h.checked_mul(size))
        .ok_or_else(overflow)?;
    Ok((first, end))
}

/// Checks that a layout at `offset` bytes into an allocation of `size` bytes stays inside
/// it: [`Error::OutOfBounds`] otherwise (also for an offset past the end).
pub fn check_bounds(
    shape: &[i64],
    strides: &[i64],
    elem_size: usize,
    offset: usize,
    size: usize,
) -> Result<()> {
    let (lo, hi) = byte_span(shape, strides, elem_size)?;
    let (first, end) = (offset as i128 + lo, offset as i128 + hi);
    if first < 0 || end > size as i128 || offset > size {
        return Err(Error::OutOfBounds { first, end, size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_strides_are_row_major() {
        assert_eq!(compact_strides(&[]).unwrap(), Vec::<i64>::new());
        assert_eq!(compact_strides(&[5]).unwrap(), vec![1]);
        assert_eq!(compact_strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(compact_strides(&[2, 0, 4]).unwrap(), vec![4, 4, 1]);
        assert!(matches!(
            compact_strides(&[i64::MAX, 4, 1]),
            Err(Error::Overflow(_))
        ));
        assert!(matches!(
            compact_strides(&[2, -1]),
            Err(Error::InvalidShape { .. })
        ));
    }

    #[test]
    fn numel_counts_and_overflows() {
        assert_eq!(numel(&[]).unwrap(), 1);
        assert_eq!(numel(&[2, 3]).unwrap(), 6);
        assert_eq!(numel(&[2, 0]).unwrap(), 0);
        assert!(matches!(
            numel(&[i64::MAX, i64::MAX]),
            Err(Error::Overflow(_))
        ));
        assert!(matches!(
            numel(&vec![1; MAX_DIMS + 1]),
            Err(Error::InvalidShape { .. })
        ));
    }

    #[test]
    fn compactness() {
        assert!(is_compact(&[2, 3], &[3, 1]));
        assert!(!is_compact(&[2, 3], &[1, 2]), "column-major");
        assert!(!is_compact(&[2, 3], &[6, 2]), "every other element");
        assert!(
            is_compact(&[1, 3], &[99, 1]),
            "an extent-1 dimension may have any stride"
        );
        assert!(is_compact(&[2, 0], &[7, 7]), "empty");
        assert!(is_compact(&[], &[]), "scalar");
        assert!(!is_compact(&[2], &[]), "stride count");
        assert!(!is_compact(&[3], &[-1]));
    }

    #[test]
    fn spans_cover_exactly_the_reached_bytes() {
        assert_eq!(byte_span(&[2, 3], &[3, 1], 4).unwrap(), (0, 24));
        assert_eq!(byte_span(&[2, 3], &[1, 2], 4).unwrap(), (0, 24));
        assert_eq!(byte_span(&[4], &[-1], 4).unwrap(), (-12, 4));
        assert_eq!(byte_span(&[3], &[0], 8).unwrap(), (0, 8), "broadcast");
        assert_eq!(byte_span(&[], &[], 2).unwrap(), (0, 2), "scalar");
        assert_eq!(byte_span(&[0, 5], &[5, 1], 4).unwrap(), (0, 0), "empty");
        assert!(matches!(
            byte_span(&[2, 3], &[1], 4),
            Err(Error::StrideCount {
                ndim: 2,
                strides: 1
            })
        ));
        // Extremes are an error, never an arithmetic overflow.
        let (lo, hi) = byte_span(&[i64::MAX, i64::MAX], &[i64::MIN, i64::MAX], 1).unwrap();
        assert!(lo < 0 && hi > 0);
        assert!(matches!(
            byte_span(&[i64::MAX, i64::MAX], &[i64::MIN, i64::MAX], 8),
            Err(Error::Overflow(_))
        ));
        assert!(matches!(
            byte_span(&[i64::MAX; 64], &[i64::MAX; 64], 1),
            Err(Error::Overflow(_))
        ));
    }

    #[test]
    fn bounds() {
        assert!(check_bounds(&[2, 3], &[3, 1], 4, 0, 24).is_ok());
        assert!(check_bounds(&[2, 3], &[3, 1], 4, 4, 28).is_ok());
        assert!(matches!(
            check_bounds(&[2, 3], &[3, 1], 4, 4, 24),
            Err(Error::OutOfBounds {
                first: 4,
                end: 28,
                size: 24
            })
        ));
        assert!(matches!(
            check_bounds(&[4], &[-1], 4, 8, 64),
            Err(Error::OutOfBounds { first: -4, .. })
        ));
        assert!(check_bounds(&[4], &[-1], 4, 12, 16).is_ok());
        assert!(
            check_bounds(&[0], &[1], 4, 16, 16).is_ok(),
            "empty at the end"
        );
        assert!(matches!(
            check_bounds(&[0], &[1], 4, 17, 16),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            check_bounds(&[i64::MAX], &[1], 8, 0, usize::MAX),
            Err(Error::OutOfBounds { .. })
        ));
    }
}
