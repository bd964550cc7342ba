//! The sparse matrices: [`CsrMatrix`] and [`CooMatrix`] (zero-based, `f32`/`f64` values,
//! `i32`/`i64` indices), each owning its cuSPARSE descriptor; [`SparseMatrix`], what
//! [`Sparse::spmv`](crate::Sparse::spmv) and [`Sparse::spmm`](crate::Sparse::spmm) take.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudars_core::{graph, Device, DevicePtr, Stream};
use cudars_sparse_sys::{cusparseIndexBase_t, cusparseSpMatDescr_t};

use crate::check::{bytes, coo_structure, csr_structure, fits, view};
use crate::element::{Index, Value};
use crate::error::{check, cusparse, Error, Result};

/// The storage format of a sparse matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Compressed sparse row: `rows + 1` row offsets, `nnz` column indices and values.
    Csr,
    /// Coordinates: `nnz` row indices (sorted), column indices and values.
    Coo,
}

pub(crate) mod sealed {
    use super::Parts;

    /// Implemented by the matrix types of this crate only.
    pub trait Sealed {
        /// The descriptor and the arrays it points at.
        fn parts(&self) -> &Parts;
    }
}

/// A sparse matrix cuSPARSE can multiply: [`CsrMatrix`] or [`CooMatrix`]. Sealed.
pub trait SparseMatrix: sealed::Sealed {
    /// The value type (`f32`, `f64`): also the type of the dense operands and scalars.
    type Value: Value;
    /// The index type (`i32`, `i64`).
    type Index: Index;
    /// The storage format.
    const FORMAT: Format;

    /// Rows.
    fn rows(&self) -> usize {
        self.parts().rows
    }

    /// Columns.
    fn cols(&self) -> usize {
        self.parts().cols
    }

    /// Stored nonzeros.
    fn nnz(&self) -> usize {
        self.parts().nnz
    }

    /// The device its arrays live on.
    fn device(&self) -> Device {
        self.parts().device
    }

    /// The values view (the caller's, kept alive by the matrix); cuSPARSE reads its first
    /// `nnz` elements. Rewriting values between products is allowed (they are only numbers).
    fn values(&self) -> &DevicePtr {
        &self.parts().arrays[2].1
    }

    /// `true` when the index arrays were checked by this crate and are held privately
    /// (the safe constructors), `false` for the `unchecked` ones (the caller's arrays).
    fn is_checked(&self) -> bool {
        self.parts().checked
    }
}

/// A sparse matrix's descriptor and the arrays it points at, destroyed on drop.
pub struct Parts {
    raw: cusparseSpMatDescr_t,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) nnz: usize,
    pub(crate) device: Device,
    /// `(name, view, bytes cuSPARSE reads from its start)`: the two index arrays, then the
    /// values. Kept alive (and, for the checked constructors, unreachable to anyone else)
    /// for the descriptor's life.
    pub(crate) arrays: [(&'static str, DevicePtr, u64); 3],
    checked: bool,
}

// SAFETY: the descriptor is host memory owned by this value alone, not tied to a thread;
// it is destroyed once, in `Drop` (`&mut self`). Shared (`&self`) uses only hand it to
// cuSPARSE's generic SpMV/SpMM as a `cusparseConstSpMatDescr_t`: cuSPARSE guarantees those
// do not modify their const inputs, so calls from several threads at once only read it. The
// views are `DevicePtr`s, which are `Send + Sync`.
unsafe impl Send for Parts {}
// SAFETY: as above.
unsafe impl Sync for Parts {}

impl Parts {
    /// The descriptor, for a product.
    pub(crate) fn raw(&self) -> cusparseSpMatDescr_t {
        self.raw
    }

    /// The byte ranges cuSPARSE reads.
    pub(crate) fn ranges(&self) -> [(&'static str, (u64, u64)); 3] {
        self.arrays.each_ref().map(|(name, p, need)| {
            let a = p.as_raw();
            (*name, (a, a.saturating_add(*need)))
        })
    }
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("nnz", &self.nnz)
            .field("device", &self.device.ordinal())
            .field("checked", &self.checked)
            .finish_non_exhaustive()
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        let Ok(lib) = cusparse() else { return };
        // SAFETY: the descriptor this value created, destroyed once. It is host memory only
        // (products already issued copied what they need at launch); the arrays it points at
        // are dropped after it, and stay alive until the work marked on them is done.
        let _ = unsafe { lib.cusparseDestroySpMat(self.raw) };
    }
}

/// Creates the descriptor over views already checked (or trusted, for the unchecked
/// constructors) to hold what it describes.
fn create<T: Value, I: Index>(
    format: Format,
    (rows, cols, nnz): (usize, usize, usize),
    arrays: [(&'static str, DevicePtr, u64); 3],
    checked: bool,
) -> Result<Parts> {
    let lib = cusparse()?;
    let device = arrays[2].1.device();
    let [a, b, v] = [&arrays[0].1, &arrays[1].1, &arrays[2].1].map(|p| p.as_raw() as *mut c_void);
    let (r, c, n) = (rows as i64, cols as i64, nnz as i64);
    let base = cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO;
    let mut raw: cusparseSpMatDescr_t = std::ptr::null_mut();
    let (status, call) = match format {
        Format::Csr => (
            // SAFETY: a valid out-pointer; the arrays hold rows + 1 offsets, nnz column
            // indices and nnz values of the types named (checked by the caller, or trusted
            // under an unchecked constructor's contract); cuSPARSE only stores the pointers.
            unsafe {
                lib.cusparseCreateCsr(
                    &mut raw,
                    r,
                    c,
                    n,
                    a,
                    b,
                    v,
                    I::index_type(),
                    I::index_type(),
                    base,
                    T::data_type(),
                )
            },
            "cusparseCreateCsr",
        ),
        Format::Coo => (
            // SAFETY: as for CSR, with nnz row indices, column indices and values.
            unsafe {
                lib.cusparseCreateCoo(
                    &mut raw,
                    r,
                    c,
                    n,
                    a,
                    b,
                    v,
                    I::index_type(),
                    base,
                    T::data_type(),
                )
            },
            "cusparseCreateCoo",
        ),
    };
    check(status, call)?;
    Ok(Parts {
        raw,
        rows,
        cols,
        nnz,
        device,
        arrays,
        checked,
    })
}

/// The values view: on its own device, aligned to `T`, holding `nnz` of them.
fn check_values<T: Value>(routine: &'static str, values: &DevicePtr, nnz: usize) -> Result<u64> {
    let size = std::mem::size_of::<T>();
    let need = bytes(routine, "values", nnz, size)?;
    let d = values.device().ordinal();
    view(
        routine,
        "values",
        (values.as_raw(), values.len(), d),
        need,
        (size, d),
    )?;
    Ok(need)
}

/// An index view of `values`' device, aligned to `I`, holding `count` of them.
fn check_indices<I: Index>(
    routine: &'static str,
    arg: &'static str,
    p: &DevicePtr,
    count: usize,
    device: Device,
) -> Result<u64> {
    let size = std::mem::size_of::<I>();
    let need = bytes(routine, arg, count, size)?;
    view(
        routine,
        arg,
        (p.as_raw(), p.len(), p.device().ordinal()),
        need,
        (size, device.ordinal()),
    )?;
    Ok(need)
}

/// A private device copy of a host index array (never empty, so cuSPARSE gets a live,
/// non-null address): memory of this matrix alone (plain `cuMemAlloc`, not the pool or a
/// pluggable allocator, so nothing else can hold a view of it).
fn upload<I: Index>(device: &Device, host: &[I]) -> Result<DevicePtr> {
    let n = std::mem::size_of_val(host);
    let buf = DevicePtr::alloc(device, n.max(std::mem::size_of::<I>()))?;
    buf.slice(..n)?.copy_from_host(host)?;
    Ok(buf)
}

/// Private device copies of two index arrays (`(view, count)`), ordered on `stream` after
/// the work queued there, and their host copies read back from the private copies: what is
/// checked is exactly what cuSPARSE will read, since nothing else can reach those copies.
fn copy_back<I: Index>(
    routine: &'static str,
    stream: &Stream,
    [(s0, n0), (s1, n1)]: [(&DevicePtr, usize); 2],
) -> Result<[(DevicePtr, Vec<I>); 2]> {
    if graph::touches_capture(stream) {
        return Err(Error::Capturing { routine });
    }
    let size = std::mem::size_of::<I>();
    let device = stream.device();
    let private = |src: &DevicePtr, count: usize| -> Result<DevicePtr> {
        let n = count * size;
        let buf = DevicePtr::alloc(&device, n.max(size))?;
        buf.slice(..n)?
            .copy_from_device_async(&src.slice(..n)?, stream)?;
        Ok(buf)
    };
    let read = |buf: &DevicePtr, count: usize| -> Result<Vec<I>> {
        let mut host = vec![I::zeroed(); count];
        buf.slice(..count * size)?.copy_to_host(&mut host)?;
        Ok(host)
    };
    let (b0, b1) = (private(s0, n0)?, private(s1, n1)?);
    stream.synchronize()?;
    let (h0, h1) = (read(&b0, n0)?, read(&b1, n1)?);
    Ok([(b0, h0), (b1, h1)])
}

/// A CSR matrix (`rows x cols`, zero-based) of `T` values and `I` indices, owning its
/// cuSPARSE descriptor (destroyed on drop).
///
/// The safe constructors check the structure cuSPARSE trusts (see
/// [`from_host`](Self::from_host)) and keep the checked index arrays in device memory of
/// their own that nothing else can reach, so the check holds for the matrix's whole life.
/// The values stay in the caller's view. [`from_device_unchecked`](Self::from_device_unchecked)
/// uses the caller's index arrays as they are, trusting them.
///
/// `Send + Sync`: products only read it (see [`SparseMatrix`]).
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_sparse::{CsrMatrix, DnVec, Op, Sparse, SparseMatrix};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// // [[1, 0, 2], [0, 3, 0]]
/// let values = cudars_mempool::driver::malloc(&stream, 3 * 4)?;
/// values.copy_from_host(&[1f32, 2.0, 3.0])?;
/// let a = CsrMatrix::<f32>::from_host(2, 3, &[0, 2, 3], &[0, 2, 1], &values)?;
/// assert_eq!((a.rows(), a.cols(), a.nnz()), (2, 3, 3));
/// // A column index out of range is refused before cuSPARSE sees it:
/// let bad = CsrMatrix::<f32>::from_host(2, 3, &[0, 2, 3], &[0, 3, 1], &values);
/// assert!(matches!(bad, Err(cudars_sparse::Error::IndexOutOfRange { position: 1, .. })));
/// let x = cudars_mempool::driver::malloc(&stream, 3 * 4)?;
/// let y = cudars_mempool::driver::malloc(&stream, 2 * 4)?;
/// x.copy_from_host(&[1f32, 1.0, 1.0])?;
/// let mut sparse = Sparse::new(&stream)?;
/// sparse.spmv(Op::N, 1.0, &a, DnVec::new(&x, 3), 0.0, DnVec::new(&y, 2))?; // y = [3, 3]
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CsrMatrix<T: Value, I: Index = i32> {
    parts: Parts,
    _types: PhantomData<fn() -> (T, I)>,
}

impl<T: Value, I: Index> std::fmt::Debug for CsrMatrix<T, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrMatrix")
            .field("value", &T::NAME)
            .field("index", &I::NAME)
            .field("parts", &self.parts)
            .finish()
    }
}

impl<T: Value, I: Index> sealed::Sealed for CsrMatrix<T, I> {
    fn parts(&self) -> &Parts {
        &self.parts
    }
}

impl<T: Value, I: Index> SparseMatrix for CsrMatrix<T, I> {
    type Value = T;
    type Index = I;
    const FORMAT: Format = Format::Csr;
}

impl<T: Value, I: Index> CsrMatrix<T, I> {
    /// A CSR matrix from host index arrays and device values (`col_indices.len()` nonzeros,
    /// the first that many elements of `values`, on `values`' device).
    ///
    /// Checked on the host before anything else: `rows + 1` row offsets, the first 0, none
    /// smaller than the one before it, the last equal to nnz; every column index in
    /// `[0, cols)`; `rows`, `cols` and nnz within `I`; `values` aligned to `T` and holding nnz
    /// of them. The index arrays are then copied into device memory the matrix owns alone
    /// (`(rows + 1 + nnz) * size_of::<I>()` bytes, one synchronous upload).
    pub fn from_host(
        rows: usize,
        cols: usize,
        row_offsets: &[I],
        col_indices: &[I],
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CsrMatrix::from_host";
        csr_structure(R, (rows, cols), row_offsets, col_indices)?;
        let nnz = col_indices.len();
        let vbytes = check_values::<T>(R, values, nnz)?;
        cusparse()?;
        let device = values.device();
        let ro = upload(&device, row_offsets)?;
        let ci = upload(&device, col_indices)?;
        let parts = create::<T, I>(
            Format::Csr,
            (rows, cols, nnz),
            [
                ("row_offsets", ro, std::mem::size_of_val(row_offsets) as u64),
                ("col_indices", ci, std::mem::size_of_val(col_indices) as u64),
                ("values", values.clone(), vbytes),
            ],
            true,
        )?;
        Ok(CsrMatrix {
            parts,
            _types: PhantomData,
        })
    }

    /// A CSR matrix from index arrays already on the device (all three views on one device,
    /// `stream`'s): the first `rows + 1` offsets of `row_offsets`, the first `nnz` indices of
    /// `col_indices` and values of `values`.
    ///
    /// The views are checked (device, alignment, length), then the index arrays are copied
    /// into device memory the matrix owns alone (ordered on `stream` after the work queued
    /// there), read back to the host and checked as [`from_host`](Self::from_host) does.
    /// The cost, once per matrix: a device-to-device copy and a device-to-host copy of
    /// `(rows + 1 + nnz) * size_of::<I>()` bytes, the same again of device memory and of
    /// (temporary) host memory, a wait for `stream`, and a pass over the indices on the host.
    /// A stream being captured is refused ([`Error::Capturing`]).
    pub fn from_device(
        stream: &Stream,
        rows: usize,
        cols: usize,
        nnz: usize,
        row_offsets: &DevicePtr,
        col_indices: &DevicePtr,
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CsrMatrix::from_device";
        fits::<I>(R, "rows", rows)?;
        fits::<I>(R, "cols", cols)?;
        fits::<I>(R, "nnz", nnz)?;
        let vbytes = check_values::<T>(R, values, nnz)?;
        let device = values.device();
        let count = rows.saturating_add(1);
        let rb = check_indices::<I>(R, "row_offsets", row_offsets, count, device)?;
        let cb = check_indices::<I>(R, "col_indices", col_indices, nnz, device)?;
        if stream.device() != device {
            return Err(Error::WrongDevice {
                routine: R,
                arg: "stream",
                expected: device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        cusparse()?;
        let [(ro, ho), (ci, hc)] =
            copy_back::<I>(R, stream, [(row_offsets, count), (col_indices, nnz)])?;
        csr_structure(R, (rows, cols), &ho, &hc)?;
        let parts = create::<T, I>(
            Format::Csr,
            (rows, cols, nnz),
            [
                ("row_offsets", ro, rb),
                ("col_indices", ci, cb),
                ("values", values.clone(), vbytes),
            ],
            true,
        )?;
        Ok(CsrMatrix {
            parts,
            _types: PhantomData,
        })
    }

    /// A CSR matrix over the caller's device arrays as they are, with no copy and no read of
    /// the indices. The views are still checked (one device, alignment, lengths: `rows + 1`
    /// offsets, `nnz` indices and values) and the counts against `I`.
    ///
    /// # Safety
    ///
    /// cuSPARSE reads memory at the positions the indices give, unchecked. From this call
    /// until the matrix is dropped and every product issued with it has completed on the
    /// device, the first `rows + 1` elements of `row_offsets` must be: the first 0, each no
    /// smaller than the one before it, the last equal to `nnz`; and each of the first `nnz`
    /// elements of `col_indices` in `[0, cols)`. Nothing may write those elements while a
    /// product using the matrix may run.
    pub unsafe fn from_device_unchecked(
        rows: usize,
        cols: usize,
        nnz: usize,
        row_offsets: &DevicePtr,
        col_indices: &DevicePtr,
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CsrMatrix::from_device_unchecked";
        fits::<I>(R, "rows", rows)?;
        fits::<I>(R, "cols", cols)?;
        fits::<I>(R, "nnz", nnz)?;
        let vbytes = check_values::<T>(R, values, nnz)?;
        let device = values.device();
        let rb = check_indices::<I>(
            R,
            "row_offsets",
            row_offsets,
            rows.saturating_add(1),
            device,
        )?;
        let cb = check_indices::<I>(R, "col_indices", col_indices, nnz, device)?;
        let parts = create::<T, I>(
            Format::Csr,
            (rows, cols, nnz),
            [
                ("row_offsets", row_offsets.clone(), rb),
                ("col_indices", col_indices.clone(), cb),
                ("values", values.clone(), vbytes),
            ],
            false,
        )?;
        Ok(CsrMatrix {
            parts,
            _types: PhantomData,
        })
    }
}

/// A COO matrix (`rows x cols`, zero-based, row indices sorted as cuSPARSE's COO format has
/// them) of `T` values and `I` indices, owning its cuSPARSE descriptor (destroyed on drop).
/// The constructors mirror [`CsrMatrix`]'s: checked and private index arrays, or the
/// caller's trusted ones.
///
/// `Send + Sync`: products only read it (see [`SparseMatrix`]).
///
/// ```no_run
/// use cudars_core::{Device, Stream};
/// use cudars_sparse::{CooMatrix, DnMat, Op, Sparse};
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let values = cudars_mempool::driver::malloc(&stream, 3 * 8)?;
/// values.copy_from_host(&[1f64, 2.0, 3.0])?;
/// // [[1, 0, 2], [0, 3, 0]]
/// let a = CooMatrix::<f64>::from_host(2, 3, &[0, 0, 1], &[0, 2, 1], &values)?;
/// let b = cudars_mempool::driver::malloc(&stream, 3 * 4 * 8)?; // 3 x 4, row-major
/// let c = cudars_mempool::driver::malloc(&stream, 2 * 4 * 8)?; // 2 x 4, row-major
/// let mut sparse = Sparse::new(&stream)?;
/// sparse.spmm(Op::N, Op::N, 1.0, &a, DnMat::row_major(&b, 3, 4), 0.0, DnMat::row_major(&c, 2, 4))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CooMatrix<T: Value, I: Index = i32> {
    parts: Parts,
    _types: PhantomData<fn() -> (T, I)>,
}

impl<T: Value, I: Index> std::fmt::Debug for CooMatrix<T, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CooMatrix")
            .field("value", &T::NAME)
            .field("index", &I::NAME)
            .field("parts", &self.parts)
            .finish()
    }
}

impl<T: Value, I: Index> sealed::Sealed for CooMatrix<T, I> {
    fn parts(&self) -> &Parts {
        &self.parts
    }
}

impl<T: Value, I: Index> SparseMatrix for CooMatrix<T, I> {
    type Value = T;
    type Index = I;
    const FORMAT: Format = Format::Coo;
}

impl<T: Value, I: Index> CooMatrix<T, I> {
    /// A COO matrix from host index arrays and device values (`row_indices.len()` nonzeros,
    /// the first that many elements of `values`, on `values`' device).
    ///
    /// Checked on the host before anything else: as many column as row indices; every row
    /// index in `[0, rows)`, sorted (non-decreasing); every column index in `[0, cols)`;
    /// `rows`, `cols` and nnz within `I`; `values` aligned to `T` and holding nnz of them. The
    /// index arrays are then copied into device memory the matrix owns alone
    /// (`2 * nnz * size_of::<I>()` bytes, one synchronous upload).
    pub fn from_host(
        rows: usize,
        cols: usize,
        row_indices: &[I],
        col_indices: &[I],
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CooMatrix::from_host";
        coo_structure(R, (rows, cols), row_indices, col_indices)?;
        let nnz = row_indices.len();
        let vbytes = check_values::<T>(R, values, nnz)?;
        cusparse()?;
        let device = values.device();
        let ri = upload(&device, row_indices)?;
        let ci = upload(&device, col_indices)?;
        let ib = std::mem::size_of_val(row_indices) as u64;
        let parts = create::<T, I>(
            Format::Coo,
            (rows, cols, nnz),
            [
                ("row_indices", ri, ib),
                ("col_indices", ci, ib),
                ("values", values.clone(), vbytes),
            ],
            true,
        )?;
        Ok(CooMatrix {
            parts,
            _types: PhantomData,
        })
    }

    /// A COO matrix from index arrays already on the device (all three views on `stream`'s
    /// device): the first `nnz` elements of each. Checked as [`CsrMatrix::from_device`]
    /// checks (the views, then private device copies read back and checked on the host as
    /// [`from_host`](Self::from_host) does), at the same kind of cost, for
    /// `2 * nnz * size_of::<I>()` bytes. A stream being captured is refused.
    pub fn from_device(
        stream: &Stream,
        rows: usize,
        cols: usize,
        nnz: usize,
        row_indices: &DevicePtr,
        col_indices: &DevicePtr,
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CooMatrix::from_device";
        fits::<I>(R, "rows", rows)?;
        fits::<I>(R, "cols", cols)?;
        fits::<I>(R, "nnz", nnz)?;
        let vbytes = check_values::<T>(R, values, nnz)?;
        let device = values.device();
        let rb = check_indices::<I>(R, "row_indices", row_indices, nnz, device)?;
        let cb = check_indices::<I>(R, "col_indices", col_indices, nnz, device)?;
        if stream.device() != device {
            return Err(Error::WrongDevice {
                routine: R,
                arg: "stream",
                expected: device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        cusparse()?;
        let [(ri, hr), (ci, hc)] =
            copy_back::<I>(R, stream, [(row_indices, nnz), (col_indices, nnz)])?;
        coo_structure(R, (rows, cols), &hr, &hc)?;
        let parts = create::<T, I>(
            Format::Coo,
            (rows, cols, nnz),
            [
                ("row_indices", ri, rb),
                ("col_indices", ci, cb),
                ("values", values.clone(), vbytes),
            ],
            true,
        )?;
        Ok(CooMatrix {
            parts,
            _types: PhantomData,
        })
    }

    /// A COO matrix over the caller's device arrays as they are, with no copy and no read of
    /// the indices; the views are still checked (one device, alignment, `nnz` elements each)
    /// and the counts against `I`.
    ///
    /// # Safety
    ///
    /// cuSPARSE reads memory at the positions the indices give, unchecked. From this call
    /// until the matrix is dropped and every product issued with it has completed on the
    /// device, each of the first `nnz` elements of `row_indices` must be in `[0, rows)`, in
    /// non-decreasing order, and each of the first `nnz` elements of `col_indices` in
    /// `[0, cols)`. Nothing may write those elements while a product using the matrix may
    /// run.
    pub unsafe fn from_device_unchecked(
        rows: usize,
        cols: usize,
        nnz: usize,
        row_indices: &DevicePtr,
        col_indices: &DevicePtr,
        values: &DevicePtr,
    ) -> Result<Self> {
        const R: &str = "CooMatrix::from_device_unchecked";
        fits::<I>(R, "rows", rows)?;
        fits::<I>(R, "cols", cols)?;
        fits::<I>(R, "nnz", nnz)?;
        let vbytes = check_values::<T>(R, values, nnz)?;
        let device = values.device();
        let rb = check_indices::<I>(R, "row_indices", row_indices, nnz, device)?;
        let cb = check_indices::<I>(R, "col_indices", col_indices, nnz, device)?;
        let parts = create::<T, I>(
            Format::Coo,
            (rows, cols, nnz),
            [
                ("row_indices", row_indices.clone(), rb),
                ("col_indices", col_indices.clone(), cb),
                ("values", values.clone(), vbytes),
            ],
            false,
        )?;
        Ok(CooMatrix {
            parts,
            _types: PhantomData,
        })
    }
}
