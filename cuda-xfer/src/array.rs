//! `ndarray` arrays in and out of transfers (feature `ndarray`).
//!
//! Arrays in C order, Fortran order or any strides go to the device; device matrices come
//! back as arrays in the order asked for.
//!
//! ```no_run
//! use cudars_xfer::array::{array_to_device, matrix_to_array};
//! use cudars_xfer::layout::Order;
//! use ndarray::array;
//! let dev = cudars_core::Device::new(0)?;
//! let a = array![[1.0f32, 2.0], [3.0, 4.0]];
//! let on_device = array_to_device(&dev, a.view(), Order::ColumnMajor)?;
//! let back = matrix_to_array(&on_device, Order::ColumnMajor)?;
//! assert_eq!(back, a);
//! assert!(back.t().is_standard_layout()); // Fortran order on the host too
//! # Ok::<(), cudars_xfer::Error>(())
//! ```

use bytemuck::Pod;
use cudars_core::Device;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, ShapeBuilder};

use crate::buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::layout::{Layout2, Order};
use crate::matrix::{matrix_to_device, matrix_to_host, matrix_to_host_into, DeviceMatrix};
use crate::transfer::{to_device, to_host};

/// The contiguous memory of a 2-D view and its layout, when it has one (C or Fortran order).
fn contiguous<'a, T>(view: &ArrayView2<'a, T>) -> Option<(&'a [T], Layout2)> {
    let (rows, cols) = view.dim();
    let order = if view.is_standard_layout() {
        Order::RowMajor
    } else if view.t().is_standard_layout() {
        Order::ColumnMajor
    } else {
        return None;
    };
    let slice = view.to_slice_memory_order()?;
    Some((slice, Layout2::contiguous(rows, cols, order)))
}

/// Copies a 2-D array to a new contiguous device matrix in `device_order`. Arrays with
/// other strides are gathered on the host first.
/// Done when it returns, for work on any stream, at the cost [`to_device`]
/// states (a wait for the last DMA from small pageable memory; nothing otherwise).
pub fn array_to_device<T: Pod>(
    device: &Device,
    array: ArrayView2<'_, T>,
    device_order: Order,
) -> Result<DeviceMatrix<T>> {
    if let Some((slice, layout)) = contiguous(&array) {
        return matrix_to_device(device, slice, layout, device_order);
    }
    let (rows, cols) = array.dim();
    let gathered: Vec<T> = array.iter().copied().collect(); // logical (row-major) order
    matrix_to_device(
        device,
        &gathered,
        Layout2::contiguous(rows, cols, Order::RowMajor),
        device_order,
    )
}

/// Copies a device matrix to a new array in `order` (C order for [`Order::RowMajor`],
/// Fortran order for [`Order::ColumnMajor`]).
/// Done when it returns, with no extra cost (the driver's copies to the host are complete
/// when they return), like [`to_host`].
pub fn matrix_to_array<T: Pod>(matrix: &DeviceMatrix<T>, order: Order) -> Result<Array2<T>> {
    let (rows, cols) = (matrix.rows(), matrix.cols());
    let data = matrix_to_host(matrix, order)?;
    let shape = (rows, cols).set_f(order == Order::ColumnMajor);
    Array2::from_shape_vec(shape, data).map_err(|_| Error::ShapeMismatch {
        rows,
        cols,
        ld: Layout2::contiguous(rows, cols, order).leading_dimension(),
        needed: rows.saturating_mul(cols),
        len: rows.saturating_mul(cols),
    })
}

/// Copies a device matrix into an existing array of the same shape, whatever its strides
/// (CuPy's `asnumpy(a, out=...)`).
/// Done when it returns, with no extra cost (the driver's copies to the host are complete
/// when they return), like [`to_host`].
pub fn matrix_to_array_into<T: Pod>(
    matrix: &DeviceMatrix<T>,
    mut out: ArrayViewMut2<'_, T>,
) -> Result<()> {
    let (rows, cols) = out.dim();
    let order = if out.is_standard_layout() {
        Some(Order::RowMajor)
    } else if out.t().is_standard_layout() {
        Some(Order::ColumnMajor)
    } else {
        None
    };
    if let Some(order) = order {
        if let Some(slice) = out.as_slice_memory_order_mut() {
            return matrix_to_host_into(matrix, slice, Layout2::contiguous(rows, cols, order));
        }
    }
    let layout = matrix.layout();
    if (layout.rows(), layout.cols()) != (rows, cols) {
        return Err(Error::ShapeMismatch {
            rows,
            cols,
            ld: 0,
            needed: rows.saturating_mul(cols),
            len: layout.elements()?,
        });
    }
    let fetched = matrix_to_array(matrix, Order::RowMajor)?;
    out.assign(&fetched);
    Ok(())
}

/// Copies a 1-D array to a new device buffer (gathering strided arrays first).
/// Done when it returns, for work on any stream, at the cost [`to_device`]
/// states (a wait for the last DMA from small pageable memory; nothing otherwise).
pub fn array1_to_device<T: Pod>(
    device: &Device,
    array: ArrayView1<'_, T>,
) -> Result<DeviceBuffer<T>> {
    match array.as_slice() {
        Some(slice) => to_device(device, slice),
        None => to_device(device, &array.iter().copied().collect::<Vec<T>>()),
    }
}

/// Copies a device buffer to a new 1-D array.
/// Done when it returns, with no extra cost (the driver's copies to the host are complete
/// when they return), like [`to_host`].
pub fn buffer_to_array1<T: Pod>(buffer: &DeviceBuffer<T>) -> Result<Array1<T>> {
    Ok(Array1::from_vec(to_host(buffer)?))
}
