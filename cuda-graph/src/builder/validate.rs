//! The checks a node's operands pass before the driver sees them: the builder's nodes and
//! the executable graph's in-place updates use the same ones.

use super::extent::Extent;
use super::operands::{DeviceMem, Mem, Pitched};
use crate::error::{BuildError, Result};

/// Checks a pitched copy: no zero extent, rows inside pitches, slices inside row counts, and
/// every byte inside both buffers.
pub(crate) fn check_pitched(dst: &Pitched<'_>, src: &Pitched<'_>, extent: Extent) -> Result<()> {
    if matches!((dst.mem, src.mem), (Mem::Host(_), Mem::Host(_))) {
        return Err(BuildError::HostToHost.into());
    }
    if extent.width == 0 || extent.height == 0 || extent.depth == 0 {
        return Err(BuildError::Empty {
            kind: "pitched memcpy node",
        }
        .into());
    }
    for (end, name) in [(dst, "destination"), (src, "source")] {
        let needed = extent
            .depth
            .checked_sub(1)
            .and_then(|z| z.checked_mul(end.rows))
            .and_then(|r| r.checked_add(extent.height - 1))
            .and_then(|r| r.checked_mul(end.pitch))
            .and_then(|b| b.checked_add(extent.width))
            .ok_or(cudars_core::Error::SizeOverflow("pitched memcpy extent"))?;
        if extent.width > end.pitch || (extent.depth > 1 && extent.height > end.rows) {
            return Err(BuildError::BadPitch {
                end: name,
                pitch: end.pitch,
                rows: end.rows,
                extent,
            }
            .into());
        }
        if needed > end.mem.len() {
            return Err(cudars_core::Error::OutOfRange {
                offset: 0,
                len: needed,
                size: end.mem.len(),
            }
            .into());
        }
    }
    Ok(())
}

/// Checks a memset destination and returns (address, element count).
pub(crate) fn memset_target(dst: &DeviceMem<'_>, element: usize) -> Result<(u64, usize)> {
    let (addr, len) = match dst {
        DeviceMem::Ptr(p) => (p.as_raw(), p.len()),
        DeviceMem::Alloc(a) => (a.ptr, a.len),
    };
    if len == 0 {
        return Err(BuildError::Empty {
            kind: "memset node",
        }
        .into());
    }
    if addr % element as u64 != 0 || len % element != 0 {
        return Err(BuildError::Misaligned { element, addr, len }.into());
    }
    Ok((addr, len / element))
}

/// Checks a copy's ends and returns the byte count.
pub(crate) fn copy_size(dst: &Mem<'_>, src: &Mem<'_>) -> Result<usize> {
    if matches!((dst, src), (Mem::Host(_), Mem::Host(_))) {
        return Err(BuildError::HostToHost.into());
    }
    if dst.len() != src.len() {
        return Err(cudars_core::Error::SizeMismatch {
            op: "graph memcpy node",
            dst: dst.len(),
            src: src.len(),
        }
        .into());
    }
    if dst.len() == 0 {
        return Err(BuildError::Empty {
            kind: "memcpy node",
        }
        .into());
    }
    Ok(dst.len())
}
