//! Typed size and alignment rules: how many bytes `n` elements take, how many elements a byte
//! range holds, and whether a device address can hold a `T`.
//!
//! Every transfer is over [`bytemuck::Pod`] elements (integers, floats, `half::f16`,
//! `half::bf16`, `#[derive(Pod)]` structs): any bit pattern is a valid value, so bytes copied
//! from the device can be read as `T` without checks. These functions are the one place
//! that turns element counts into byte counts and back.
//!
//! ```
//! use cudars_xfer::elements::{byte_len, element_count};
//! assert_eq!(byte_len::<f32>(3)?, 12);
//! assert_eq!(element_count::<half::f16>(10)?, 5);
//! assert!(element_count::<u32>(10).is_err()); // 10 bytes is not a whole number of u32
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use bytemuck::Pod;

use crate::error::{Error, Result};

/// Bytes taken by `count` elements of `T`; [`Error::SizeOverflow`] when that overflows.
pub fn byte_len<T: Pod>(count: usize) -> Result<usize> {
    count
        .checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow {
            count,
            elem_size: std::mem::size_of::<T>(),
        })
}

/// Elements of `T` in `bytes` bytes; [`Error::NotWholeElements`] when `bytes` is not a
/// multiple of `size_of::<T>()`, [`Error::ZeroSizedElement`] for a zero-sized `T`.
pub fn element_count<T: Pod>(bytes: usize) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    if size == 0 {
        return Err(Error::ZeroSizedElement);
    }
    if !bytes.is_multiple_of(size) {
        return Err(Error::NotWholeElements {
            bytes,
            elem_size: size,
        });
    }
    Ok(bytes / size)
}

/// Checks that a device address can hold a `T` ([`Error::Misaligned`] otherwise). Host
/// slices `&[T]` are aligned by construction; device memory reinterpreted as `T` is not.
pub fn check_device_alignment<T: Pod>(addr: u64) -> Result<()> {
    let align = std::mem::align_of::<T>();
    if !addr.is_multiple_of(align as u64) {
        return Err(Error::Misaligned { addr, align });
    }
    Ok(())
}

/// Checks that a copy's destination and source hold the same number of elements
/// ([`Error::LengthMismatch`] naming `op` otherwise).
pub fn check_same_len(op: &'static str, dst: usize, src: usize) -> Result<()> {
    if dst != src {
        return Err(Error::LengthMismatch { op, dst, src });
    }
    Ok(())
}

/// `offset + len`, or [`Error::SizeOverflow`].
pub(crate) fn end_of(offset: usize, len: usize) -> Result<usize> {
    offset.checked_add(len).ok_or(Error::SizeOverflow {
        count: len,
        elem_size: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Rgb {
        r: u8,
        g: u8,
        b: u8,
    }

    #[test]
    fn byte_len_multiplies_by_the_element_size() {
        assert_eq!(byte_len::<u8>(7).unwrap(), 7);
        assert_eq!(byte_len::<f64>(7).unwrap(), 56);
        assert_eq!(byte_len::<f16>(3).unwrap(), 6);
        assert_eq!(byte_len::<bf16>(3).unwrap(), 6);
        assert_eq!(byte_len::<Rgb>(5).unwrap(), 15);
        assert_eq!(byte_len::<u32>(0).unwrap(), 0);
    }

    #[test]
    fn byte_len_overflow_is_a_typed_error() {
        let n = usize::MAX / 4 + 1;
        assert_eq!(
            byte_len::<u32>(n),
            Err(Error::SizeOverflow {
                count: n,
                elem_size: 4
            })
        );
        assert_eq!(byte_len::<u8>(usize::MAX).unwrap(), usize::MAX);
    }

    #[test]
    fn element_count_needs_whole_elements() {
        assert_eq!(element_count::<u32>(16).unwrap(), 4);
        assert_eq!(element_count::<Rgb>(15).unwrap(), 5);
        assert_eq!(
            element_count::<u32>(10),
            Err(Error::NotWholeElements {
                bytes: 10,
                elem_size: 4
            })
        );
        assert_eq!(
            element_count::<Rgb>(16),
            Err(Error::NotWholeElements {
                bytes: 16,
                elem_size: 3
            })
        );
        assert_eq!(element_count::<u64>(0).unwrap(), 0);
        assert_eq!(element_count::<()>(0), Err(Error::ZeroSizedElement));
    }

    #[test]
    fn device_alignment_follows_the_element_alignment() {
        assert!(check_device_alignment::<u8>(0x1001).is_ok());
        assert!(check_device_alignment::<f16>(0x1002).is_ok());
        assert_eq!(
            check_device_alignment::<f16>(0x1001),
            Err(Error::Misaligned {
                addr: 0x1001,
                align: 2
            })
        );
        assert!(check_device_alignment::<f64>(0x1008).is_ok());
        assert!(check_device_alignment::<f64>(0x1004).is_err());
        // A struct of bytes needs no alignment even though its size is 3.
        assert!(check_device_alignment::<Rgb>(0x1003).is_ok());
    }

    #[test]
    fn lengths_must_match() {
        assert!(check_same_len("copy", 3, 3).is_ok());
        assert_eq!(
            check_same_len("copy", 3, 4),
            Err(Error::LengthMismatch {
                op: "copy",
                dst: 3,
                src: 4
            })
        );
        assert!(end_of(usize::MAX, 1).is_err());
        assert_eq!(end_of(3, 4).unwrap(), 7);
    }
}
