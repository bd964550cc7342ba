//! [`Extent`]: the size of a pitched (2-D or 3-D) copy.

/// The extent of a pitched copy: `width` bytes per row, `height` rows per slice, `depth`
/// slices (1 for a 2-D copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Bytes per row.
    pub width: usize,
    /// Rows per slice.
    pub height: usize,
    /// Slices.
    pub depth: usize,
}
