//! Two-dimensional transfers in row-major or column-major order (CuPy's `order='C'`/`'F'`).
//!
//! A [`DeviceMatrix<T>`] is a [`DeviceBuffer<T>`] with a [`Layout2`]: shape, order and
//! leading dimension (pitch) on the device. Transfers convert between the device layout and
//! the host layout asked for: the same order is a straight copy; different orders are a
//! transposing copy on the host (tiled, cache-friendly) after or before the transfer, which
//! itself always runs over contiguous memory at full speed.
//!
//! ```no_run
//! use cudars_xfer::layout::{Layout2, Order};
//! use cudars_xfer::matrix::{matrix_to_device, matrix_to_host};
//! let dev = cudars_core::Device::new(0)?;
//! // [[1, 2, 3], [4, 5, 6]], row-major on the host, stored column-major on the device.
//! let host = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let m = matrix_to_device(&dev, &host, Layout2::contiguous(2, 3, Order::RowMajor), Order::ColumnMajor)?;
//! assert_eq!(cudars_xfer::to_host(m.buffer())?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
//! assert_eq!(matrix_to_host(&m, Order::RowMajor)?, host);
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use bytemuck::Pod;
use cudars_core::Device;

use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::host::HostMemoryKind;
use crate::layout::{check_same_shape, relayout, Layout2, Order};
use crate::transfer::{copy_to_device, h2d_unlanded, land, to_host, to_host_into};

/// A matrix in device memory: a buffer and the layout of its elements.
///
/// Cloning shares the memory (like [`DeviceBuffer`]). `Send` and `Sync`.
#[derive(Debug, Clone)]
pub struct DeviceMatrix<T> {
    buffer: DeviceBuffer<T>,
    layout: Layout2,
}

impl<T: Pod> DeviceMatrix<T> {
    /// Describes `buffer` as a matrix laid out as `layout`;
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the buffer is too short.
    pub fn new(buffer: DeviceBuffer<T>, layout: Layout2) -> Result<DeviceMatrix<T>> {
        layout.check_fits(buffer.len())?;
        Ok(DeviceMatrix { buffer, layout })
    }

    /// A new contiguous `rows x cols` matrix in `order` on `device`, zero-filled; done when
    /// it returns, as [`DeviceBuffer::zeroed`] is.
    pub fn zeroed(device: &Device, rows: usize, cols: usize, order: Order) -> Result<Self> {
        let layout = Layout2::contiguous(rows, cols, order);
        let buffer = DeviceBuffer::zeroed(device, layout.span()?)?;
        Ok(DeviceMatrix { buffer, layout })
    }

    /// The buffer holding the elements.
    pub fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buffer
    }

    /// The layout on the device.
    pub fn layout(&self) -> Layout2 {
        self.layout
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.layout.rows()
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.layout.cols()
    }

    /// The element order on the device.
    pub fn order(&self) -> Order {
        self.layout.order()
    }

    /// The buffer part the layout spans.
    fn span(&self) -> Result<DeviceBuffer<T>> {
        self.buffer.slice(..self.layout.span()?)
    }
}

/// Copies the host matrix `src` (laid out as `src_layout`) to a new contiguous device
/// matrix in `device_order`.
/// Done when it returns, for work on any stream, at the cost [`to_device`](crate::to_device)
/// states (a wait for the last DMA from small pageable memory; nothing otherwise).
pub fn matrix_to_device<T: Pod>(
    device: &Device,
    src: &[T],
    src_layout: Layout2,
    device_order: Order,
) -> Result<DeviceMatrix<T>> {
    src_layout.check_fits(src.len())?;
    let layout = src_layout.to_contiguous(device_order);
    let buffer = DeviceBuffer::alloc(device, layout.span()?)?;
    let dst = DeviceMatrix { buffer, layout };
    copy_matrix_to_device(src, src_layout, &dst)?;
    Ok(dst)
}

/// Copies the host matrix `src` (laid out as `src_layout`) into the device matrix `dst`,
/// which must have the same shape. Elements in the gaps of a pitched `dst` are left as they
/// were.
/// Done when it returns, for work on any stream, at the cost [`to_device`](crate::to_device)
/// states; a pitched `dst` is written run by run with one wait at the end, not one a run.
pub fn copy_matrix_to_device<T: Pod>(
    src: &[T],
    src_layout: Layout2,
    dst: &DeviceMatrix<T>,
) -> Result<()> {
    src_layout.check_fits(src.len())?;
    let dl = dst.layout;
    check_same_shape(src_layout, dl)?;
    if dl.rows() == 0 || dl.cols() == 0 {
        return Ok(());
    }
    if dl.is_contiguous() {
        if src_layout.order() == dl.order() && src_layout.is_contiguous() {
            return copy_to_device(&src[..dl.span()?], &dst.span()?);
        }
        let mut staged = bytemuck::zeroed_vec::<T>(dl.span()?);
        relayout(src, src_layout, &mut staged, dl)?;
        return copy_to_device(&staged, &dst.span()?);
    }
    // A pitched destination: write run by run so the gaps keep their contents.
    let packed = dl.to_contiguous(dl.order());
    let mut staged = bytemuck::zeroed_vec::<T>(packed.span()?);
    relayout(src, src_layout, &mut staged, packed)?;
    // One landing wait for all the runs (see `transfer`'s docs), not one each.
    let inner = dl.inner();
    let mut unlanded = false;
    for run in 0..dl.outer() {
        let at = run * dl.leading_dimension();
        unlanded |= h2d_unlanded(
            bytemuck::cast_slice(&staged[run * inner..(run + 1) * inner]),
            dst.buffer.slice(at..at + inner)?.as_ptr(),
            HostMemoryKind::Unknown,
        )?;
    }
    if unlanded {
        land(&dst.buffer.device())?;
    }
    Ok(())
}

/// Copies the device matrix `src` to a new contiguous host matrix in `order`
/// (CuPy's `asnumpy(a, order=...)`).
/// Done when it returns, with no extra cost (the driver's copies to the host are complete
/// when they return), like [`to_host`].
pub fn matrix_to_host<T: Pod>(src: &DeviceMatrix<T>, order: Order) -> Result<Vec<T>> {
    let layout = src.layout.to_contiguous(order);
    let mut out = bytemuck::zeroed_vec::<T>(layout.span()?);
    matrix_to_host_into(src, &mut out, layout)?;
    Ok(out)
}

/// Copies the device matrix `src` into the host matrix `dst` laid out as `dst_layout`
/// (same shape; CuPy's `asnumpy(a, out=dst)`). Gaps of a pitched `dst` are left untouched.
/// Done when it returns, with no extra cost (the driver's copies to the host are complete
/// when they return), like [`to_host`].
pub fn matrix_to_host_into<T: Pod>(
    src: &DeviceMatrix<T>,
    dst: &mut [T],
    dst_layout: Layout2,
) -> Result<()> {
    dst_layout.check_fits(dst.len())?;
    let sl = src.layout;
    check_same_shape(sl, dst_layout)?;
    if sl.rows() == 0 || sl.cols() == 0 {
        return Ok(());
    }
    let span = src.span()?;
    if sl.order() == dst_layout.order() && sl == dst_layout && sl.is_contiguous() {
        return to_host_into(&span, &mut dst[..sl.span()?]);
    }
    // Read the whole span (gaps included: reading them is harmless) and rearrange.
    let staged = to_host(&span)?;
    relayout(&staged, sl, dst, dst_layout)
}
