//! Import: a DLPack tensor made elsewhere (versioned `DLManagedTensorVersioned` or legacy
//! `DLManagedTensor`) becomes an [`ImportedTensor`] that owns its deleter (called once, on
//! drop, from whichever thread drops it), then a checked, typed [`TensorView`].
//!
//! [`Expect`] says what the caller needs; each refusal is its own [`Error`] variant:
//!
//! | check | refusal |
//! | --- | --- |
//! | device type `kDLCUDA` (`kDLCUDAManaged` only with [`Expect::allow_managed`]) | [`Error::NotCuda`] |
//! | the device named by [`Expect::device`] | [`Error::WrongDevice`] |
//! | a dtype this crate knows ([`ElemType`]), the one asked for | [`Error::UnsupportedDType`], [`Error::TypeMismatch`] |
//! | a valid shape | [`Error::InvalidShape`] |
//! | with [`Expect::contiguous`]: no negative stride, compact row-major | [`Error::NegativeStride`], [`Error::NotContiguous`] |
//! | data pointer plus byte offset aligned for the element | [`Error::Misaligned`] |
//! | with [`Expect::mutable`]: not flagged read-only | [`Error::ReadOnly`] |
//! | a data pointer when there are elements; no overflow | [`Error::Null`], [`Error::Overflow`] |
//!
//! Null strides mean compact row-major (DLPack before 1.2 allowed them; 1.2 forbids them for
//! `ndim > 0` but consumers still accept them). A legacy tensor carries no flags, so it is
//! never read-only here.
//!
//! Managed memory (`kDLCUDAManaged`) has `device_id` 0 by the header's rule whatever device
//! uses it; with [`Expect::allow_managed`] it is accepted for any expected device.
//!
//! Whether the deleter may run on another thread than the producer's is not stated by the
//! DLPack header; PyTorch's, CuPy's (it takes the GIL) and JAX's deleters allow it, and
//! `ImportedTensor` is `Send` so that a consumer can drop it anywhere, as the frameworks do.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Mutex;

use cudars_core::memory::{DeviceAlloc, DevicePtr, Handover};
use cudars_core::{Device, Stream, StreamKind};

use crate::dtype::{DlElem, ElemType};
use crate::error::{Error, Result};
use crate::ffi::{
    device_type, DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor, DlpackFlags, DLPACK_MAJOR_VERSION,
};
use crate::layout::{self, MAX_DIMS};

enum Raw {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

/// An owned DLPack tensor of another producer: its deleter runs exactly once, when this value
/// drops. The accessors read the producer's struct; [`check`](Self::check) and
/// [`into_view`](Self::into_view) validate it.
pub struct ImportedTensor {
    raw: Raw,
}

// SAFETY: the struct is owned by this value alone (the producer handed it over); the deleter
// may run on any thread (see the module documentation); `&self` only reads plain data that
// the producer does not change while the tensor is owned here.
unsafe impl Send for ImportedTensor {}
// SAFETY: as above; no interior mutability is reached through `&self`.
unsafe impl Sync for ImportedTensor {}

impl ImportedTensor {
    /// Takes ownership of a versioned tensor.
    ///
    /// A major version other than 1 is refused with [`Error::UnsupportedVersion`] after its
    /// deleter was called (the header's rule); an `ndim` outside `0..=64` or a null shape is
    /// refused with [`Error::InvalidShape`] or [`Error::Null`], also after the deleter.
    /// A null pointer is [`Error::Null`].
    ///
    /// # Safety
    ///
    /// `tensor` is null or a `DLManagedTensorVersioned` that the caller owns (a producer
    /// handed it over) and no longer uses; its `shape` (and `strides`, when not null) point
    /// to `ndim` integers, and its deleter may be called from any thread.
    ///
    /// The producer's writes to the data must be ordered as a later
    /// [`UntypedView::into_device_ptr`] is told, since that safe call cannot check it:
    /// complete when it is given `None` for `ordered_on`, else ordered before the stream it is
    /// given (what DLPack's `stream` argument asks of the producer). A view made otherwise
    /// lets safe calls read or write the memory while the producer still writes it.
    ///
    /// The view of [`UntypedView::into_device_ptr`] spans every byte from the first element
    /// to the last, and safe calls may write it: the caller also vouches that, until the
    /// deleter runs, no other code uses that span, the bytes between a strided tensor's
    /// elements and a tensor flagged read-only included (or that it never makes a device
    /// view of such a tensor: check [`ImportedTensor::is_read_only`] and
    /// [`TensorView::is_contiguous`] first, or import with [`Expect::mutable`] and
    /// [`Expect::contiguous`], which refuse them).
    pub unsafe fn from_versioned(tensor: *mut DLManagedTensorVersioned) -> Result<ImportedTensor> {
        let Some(ptr) = NonNull::new(tensor) else {
            return Err(Error::Null("DLManagedTensorVersioned"));
        };
        let imported = ImportedTensor {
            raw: Raw::Versioned(ptr),
        };
        // SAFETY: the caller's contract; the version comes first in every major version.
        let version = unsafe { ptr.as_ref() }.version;
        if version.major != DLPACK_MAJOR_VERSION {
            // The deleter is the one field every major version keeps in place (drop calls
            // it); the rest may differ, so nothing else is read.
            drop(imported);
            return Err(Error::UnsupportedVersion {
                major: version.major,
                minor: version.minor,
            });
        }
        imported.check_structure()?;
        Ok(imported)
    }

    /// Takes ownership of a legacy tensor, with the checks of
    /// [`from_versioned`](Self::from_versioned) but the version's.
    ///
    /// # Safety
    ///
    /// As [`from_versioned`](Self::from_versioned), for a `DLManagedTensor`.
    pub unsafe fn from_legacy(tensor: *mut DLManagedTensor) -> Result<ImportedTensor> {
        let Some(ptr) = NonNull::new(tensor) else {
            return Err(Error::Null("DLManagedTensor"));
        };
        let imported = ImportedTensor {
            raw: Raw::Legacy(ptr),
        };
        imported.check_structure()?;
        Ok(imported)
    }

    /// `ndim` in range and a shape pointer when there are dimensions (else the value drops,
    /// calling the deleter).
    fn check_structure(&self) -> Result<()> {
        let t = self.dl_tensor();
        if t.ndim < 0 || t.ndim as usize > MAX_DIMS {
            return Err(Error::InvalidShape {
                shape: vec![i64::from(t.ndim)],
            });
        }
        if t.ndim > 0 && t.shape.is_null() {
            return Err(Error::Null("shape"));
        }
        Ok(())
    }

    /// The producer's `DLTensor`.
    pub fn dl_tensor(&self) -> &DLTensor {
        // SAFETY: owned and live until drop (constructors' contract).
        unsafe {
            match &self.raw {
                Raw::Versioned(p) => &p.as_ref().dl_tensor,
                Raw::Legacy(p) => &p.as_ref().dl_tensor,
            }
        }
    }

    /// The DLPack version (`None` for a legacy tensor).
    pub fn version(&self) -> Option<DLPackVersion> {
        match &self.raw {
            // SAFETY: owned and live.
            Raw::Versioned(p) => Some(unsafe { p.as_ref() }.version),
            Raw::Legacy(_) => None,
        }
    }

    /// Whether this came as a legacy `DLManagedTensor`.
    pub fn is_legacy(&self) -> bool {
        matches!(self.raw, Raw::Legacy(_))
    }

    /// The flags (empty for a legacy tensor).
    pub fn flags(&self) -> DlpackFlags {
        match &self.raw {
            // SAFETY: owned and live.
            Raw::Versioned(p) => unsafe { p.as_ref() }.flags,
            Raw::Legacy(_) => DlpackFlags::empty(),
        }
    }

    /// Whether the producer marked the data read-only.
    pub fn is_read_only(&self) -> bool {
        self.flags().contains(DlpackFlags::READ_ONLY)
    }

    /// The device.
    pub fn device(&self) -> DLDevice {
        self.dl_tensor().device
    }

    /// The raw dtype.
    pub fn dtype(&self) -> DLDataType {
        self.dl_tensor().dtype
    }

    /// The element type, or [`Error::UnsupportedDType`].
    pub fn elem_type(&self) -> Result<ElemType> {
        ElemType::from_dl(self.dtype())
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        let t = self.dl_tensor();
        if t.ndim <= 0 {
            return &[];
        }
        // SAFETY: `shape` is non-null with `ndim` elements (checked at construction and the
        // constructors' contract), live while the tensor is owned.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    /// The strides in elements, `None` when the producer left them null (compact row-major).
    pub fn strides(&self) -> Option<&[i64]> {
        let t = self.dl_tensor();
        if t.ndim <= 0 {
            return Some(&[]);
        }
        if t.strides.is_null() {
            return None;
        }
        // SAFETY: non-null `strides` has `ndim` elements (the constructors' contract).
        Some(unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) })
    }

    /// The data pointer (before the byte offset).
    pub fn data(&self) -> u64 {
        self.dl_tensor().data as u64
    }

    /// The byte offset of the first element from [`data`](Self::data).
    pub fn byte_offset(&self) -> u64 {
        self.dl_tensor().byte_offset
    }

    /// Validates the tensor against `expect` (see the module table) and describes it.
    pub fn check(&self, expect: &Expect) -> Result<Layout> {
        let device = self.device();
        let managed = device.device_type == device_type::CUDA_MANAGED;
        if device.device_type != device_type::CUDA && !(managed && expect.allow_managed) {
            return Err(Error::NotCuda {
                device_type: device.device_type.0,
                allowed: if expect.allow_managed {
                    "kDLCUDA or kDLCUDAManaged"
                } else {
                    "kDLCUDA"
                },
            });
        }
        let ordinal = if managed {
            None
        } else {
            Some(
                usize::try_from(device.device_id)
                    .map_err(|_| Error::InvalidDevice(device.device_id))?,
            )
        };
        if let (Some(expected), Some(actual)) = (expect.device, ordinal) {
            if actual != expected {
                return Err(Error::WrongDevice { expected, actual });
            }
        }
        let elem = self.elem_type()?;
        if let Some(wanted) = expect.elem {
            if wanted != elem {
                return Err(Error::TypeMismatch {
                    expected: wanted,
                    actual: elem,
                });
            }
        }
        let shape = self.shape().to_vec();
        layout::check_shape(&shape)?;
        let numel = layout::numel(&shape)?;
        // Broadcast (zero) strides let `numel` exceed what the memory holds: its bytes must
        // still be a number (`Layout::nbytes`).
        numel
            .checked_mul(elem.size())
            .ok_or(Error::Overflow("element bytes"))?;
        let strides = match self.strides() {
            Some(s) => s.to_vec(),
            None => layout::compact_strides(&shape)?,
        };
        let contiguous = layout::is_compact(&shape, &strides);
        if expect.contiguous && numel > 0 {
            if let Some((dim, &stride)) = strides
                .iter()
                .enumerate()
                .find(|(d, s)| **s < 0 && shape[*d] > 1)
            {
                return Err(Error::NegativeStride { dim, stride });
            }
            if !contiguous {
                return Err(Error::NotContiguous { shape, strides });
            }
        }
        let addr = self
            .data()
            .checked_add(self.byte_offset())
            .ok_or(Error::Overflow("data pointer + byte_offset"))?;
        let (lo, hi) = layout::byte_span(&shape, &strides, elem.size())?;
        if numel > 0 {
            if self.data() == 0 {
                return Err(Error::Null("data"));
            }
            if !addr.is_multiple_of(elem.align() as u64) {
                return Err(Error::Misaligned {
                    addr,
                    align: elem.align(),
                });
            }
            if i128::from(addr) + lo < 0 || i128::from(addr) + hi > i128::from(u64::MAX) {
                return Err(Error::Overflow("the tensor's address range"));
            }
        }
        if expect.mutable && self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let span = usize::try_from(hi - lo).map_err(|_| Error::Overflow("byte span"))?;
        // `lo` is at least `-addr`, which may be below `i64::MIN` for an address above 2^63:
        // never truncated (a wrapped `first_byte` would put the view's start elsewhere).
        let first_byte = i64::try_from(lo).map_err(|_| Error::Overflow("first byte reached"))?;
        Ok(Layout {
            elem,
            device: if managed { None } else { ordinal },
            addr,
            shape,
            strides,
            contiguous,
            first_byte,
            span,
            numel,
        })
    }

    /// Checks the tensor against `expect` and the element type `T`; gives a typed view that
    /// owns the tensor. On a refusal the tensor is dropped (its deleter runs); call
    /// [`check`](Self::check) first to keep it.
    pub fn into_view<T: DlElem>(self, expect: &Expect) -> Result<TensorView<T>> {
        let mut expect = expect.clone();
        expect.elem = Some(T::TYPE);
        let layout = self.check(&expect)?;
        Ok(TensorView {
            tensor: self,
            layout,
            _elem: PhantomData,
        })
    }

    /// Checks the tensor against `expect` and gives a view whose element type is known at run
    /// time only ([`Layout::elem`]). On a refusal the tensor is dropped.
    pub fn into_untyped_view(self, expect: &Expect) -> Result<UntypedView> {
        let layout = self.check(expect)?;
        Ok(UntypedView {
            tensor: self,
            layout,
        })
    }
}

impl Drop for ImportedTensor {
    fn drop(&mut self) {
        // SAFETY: owned (the constructors' contract), dropped once: the deleter is called
        // exactly once, with the struct it belongs to; a null deleter means nothing to free.
        unsafe {
            match &self.raw {
                Raw::Versioned(p) => {
                    if let Some(d) = p.as_ref().deleter {
                        d(p.as_ptr())
                    }
                }
                Raw::Legacy(p) => {
                    if let Some(d) = p.as_ref().deleter {
                        d(p.as_ptr())
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for ImportedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.device();
        f.debug_struct("ImportedTensor")
            .field("version", &self.version().map(|v| (v.major, v.minor)))
            .field("device", &(d.device_type.0, d.device_id))
            .field("data", &format_args!("{:#x}", self.data()))
            .field("byte_offset", &self.byte_offset())
            .field("dtype", &self.elem_type().ok())
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("flags", &self.flags())
            .finish()
    }
}

/// What an importer needs of a tensor; everything else is accepted. The default accepts any
/// CUDA device, any supported dtype and any strides, read-only or not.
///
/// ```
/// use cudars_dlpack::Expect;
/// let expect = Expect::new().device(0).contiguous(true).mutable(true);
/// # let _ = expect;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expect {
    device: Option<usize>,
    allow_managed: bool,
    contiguous: bool,
    mutable: bool,
    elem: Option<ElemType>,
}

impl Expect {
    /// Accepts any CUDA tensor.
    pub fn new() -> Expect {
        Expect::default()
    }

    /// Only a tensor on this device ordinal.
    pub fn device(mut self, ordinal: usize) -> Expect {
        self.device = Some(ordinal);
        self
    }

    /// Also accepts managed memory (`kDLCUDAManaged`).
    pub fn allow_managed(mut self, allow: bool) -> Expect {
        self.allow_managed = allow;
        self
    }

    /// Only compact row-major memory (no negative strides).
    pub fn contiguous(mut self, contiguous: bool) -> Expect {
        self.contiguous = contiguous;
        self
    }

    /// The caller will write: refuse a read-only tensor.
    pub fn mutable(mut self, mutable: bool) -> Expect {
        self.mutable = mutable;
        self
    }

    /// Only this element type ([`ImportedTensor::into_view`] sets it from its `T`).
    pub fn elem(mut self, elem: ElemType) -> Expect {
        self.elem = Some(elem);
        self
    }
}

/// A checked tensor's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The element type.
    pub elem: ElemType,
    /// The device ordinal (`None` for managed memory).
    pub device: Option<usize>,
    /// The address of element `[0, ..., 0]`: data pointer plus byte offset.
    pub addr: u64,
    /// The shape.
    pub shape: Vec<i64>,
    /// The strides in elements (compact ones when the producer gave none).
    pub strides: Vec<i64>,
    /// Whether the layout is compact row-major.
    pub contiguous: bool,
    /// The first byte any element reaches, relative to `addr` (negative with negative strides).
    pub first_byte: i64,
    /// Bytes from the first byte any element reaches to one past the last.
    pub span: usize,
    /// The number of elements.
    pub numel: usize,
}

impl Layout {
    /// Bytes of the elements (`numel * size`; exact for a checked layout, saturating at
    /// `usize::MAX` for one built by hand).
    pub fn nbytes(&self) -> usize {
        self.numel.saturating_mul(self.elem.size())
    }
}

/// A checked, typed view of an imported tensor, owning it (its deleter runs when the view, or
/// the last `DevicePtr` made from it, drops).
pub struct TensorView<T: DlElem> {
    tensor: ImportedTensor,
    layout: Layout,
    _elem: PhantomData<fn() -> T>,
}

impl<T: DlElem> TensorView<T> {
    /// The description the checks produced.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The imported tensor.
    pub fn tensor(&self) -> &ImportedTensor {
        &self.tensor
    }
    /// The address of element `[0, ..., 0]`.
    pub fn addr(&self) -> u64 {
        self.layout.addr
    }
    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.layout.shape
    }
    /// The strides in elements.
    pub fn strides(&self) -> &[i64] {
        &self.layout.strides
    }
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel
    }
    /// Whether the layout is compact row-major.
    pub fn is_contiguous(&self) -> bool {
        self.layout.contiguous
    }
    /// Forgets the element type.
    pub fn into_untyped(self) -> UntypedView {
        UntypedView {
            tensor: self.tensor,
            layout: self.layout,
        }
    }
    /// A `cudars_core` view of the elements on `device` (see
    /// [`UntypedView::into_device_ptr`]).
    pub fn into_device_ptr(
        self,
        device: &Device,
        ordered_on: Option<&Stream>,
    ) -> Result<DevicePtr> {
        self.into_untyped().into_device_ptr(device, ordered_on)
    }
}

impl<T: DlElem> std::fmt::Debug for TensorView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("layout", &self.layout)
            .finish()
    }
}

/// A checked view of an imported tensor whose element type is known at run time.
#[derive(Debug)]
pub struct UntypedView {
    tensor: ImportedTensor,
    layout: Layout,
}

impl UntypedView {
    /// The description the checks produced.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The imported tensor.
    pub fn tensor(&self) -> &ImportedTensor {
        &self.tensor
    }
    /// The typed view, or [`Error::TypeMismatch`] (the view drops then, calling the deleter).
    pub fn into_typed<T: DlElem>(self) -> Result<TensorView<T>> {
        if self.layout.elem != T::TYPE {
            return Err(Error::TypeMismatch {
                expected: T::TYPE,
                actual: self.layout.elem,
            });
        }
        Ok(TensorView {
            tensor: self.tensor,
            layout: self.layout,
            _elem: PhantomData,
        })
    }

    /// A `cudars_core` view of the bytes the elements span on `device`, which now owns the
    /// tensor: copies, memsets and kernels through the workspace's usual API.
    ///
    /// `ordered_on` is the stream the producer's work was ordered before: the `stream`
    /// argument given to the producer's `__dlpack__` (or the stream made to wait for its
    /// current stream). Uses of the view on that stream follow stream order; uses on any
    /// other stream first wait for a fence recorded on it, and synchronous calls wait for
    /// that fence on the host (`cudars_core::memory::Handover`, the workspace's one ordering
    /// rule), so no use of the view races the producer's last writes. `None` when the
    /// producer's work is known to be complete (the tensor was taken with no pending work,
    /// or the caller synchronised). Which of the two holds is part of what the caller of the
    /// `unsafe` [`ImportedTensor::from_versioned`] / [`ImportedTensor::from_legacy`] vouched
    /// for.
    ///
    /// Streams that use the view ([`DevicePtr::record_stream`], which every asynchronous view
    /// operation calls) are remembered, and before the deleter runs the host waits for the
    /// work queued on them by then: the producer may reuse the memory as soon as its deleter
    /// returns, and PyTorch's and CuPy's pools do. If such a wait fails the tensor is leaked,
    /// never released under running work.
    ///
    /// The tensor must be on `device` ([`Error::WrongDevice`]); managed memory is taken to be
    /// usable from it. The view spans every byte from the first element to the last and is
    /// writable: that it may be is part of what the `unsafe` constructor's caller vouched
    /// for (its `# Safety`), for strided and read-only tensors too.
    pub fn into_device_ptr(
        self,
        device: &Device,
        ordered_on: Option<&Stream>,
    ) -> Result<DevicePtr> {
        if let Some(actual) = self.layout.device {
            if actual != device.ordinal() {
                return Err(Error::WrongDevice {
                    expected: device.ordinal(),
                    actual,
                });
            }
        }
        let start = if self.layout.numel == 0 {
            self.layout.addr
        } else {
            (i128::from(self.layout.addr) + i128::from(self.layout.first_byte)) as u64
        };
        let size = if self.layout.numel == 0 {
            0
        } else {
            self.layout.span
        };
        let handover = match ordered_on {
            Some(s) => Some(Handover::new(s)?),
            None => None,
        };
        Ok(DevicePtr::new(ImportedAlloc {
            handover,
            device: *device,
            start,
            size,
            streams: Mutex::new(Some(Vec::new())),
            tensor: Some(self.tensor),
        }))
    }
}

/// The owner behind [`UntypedView::into_device_ptr`].
struct ImportedAlloc {
    /// Orders uses off the import's stream after the producer's work.
    handover: Option<Handover>,
    device: Device,
    start: u64,
    size: usize,
    /// Streams that used the memory: waited for before the deleter runs. `None` once a
    /// stream that names no one stream was used (the per-thread default stream names the
    /// calling thread's, an external one may be any): then the whole device is waited for.
    streams: Mutex<Option<Vec<Stream>>>,
    /// `Some` until dropped.
    tensor: Option<ImportedTensor>,
}

// SAFETY: `start..start + size` is the span of a checked CUDA tensor of `device` (or managed
// memory), which its producer keeps allocated until the deleter runs, in Drop, after the
// host waited for every stream `record_stream` noted; fields never change; no Rust reference
// aliases device memory. The producer's earlier work was ordered before the `ordered_on`
// stream (the DLPack `stream` argument); the hand-over orders every other stream and every
// synchronous use after that stream's fence (or, with no stream, the caller of the unsafe
// constructor vouched that it was complete: its `# Safety`).
unsafe impl DeviceAlloc for ImportedAlloc {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> cudars_core::sys::CUdeviceptr {
        self.start as cudars_core::sys::CUdeviceptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn record_stream(&self, stream: &Stream) -> cudars_core::Result<()> {
        if let Some(h) = &self.handover {
            h.order_stream(stream)?;
        }
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(stream.kind(), StreamKind::PerThread | StreamKind::External) {
            // The drop may run on another thread, where the handle names another stream (or
            // the foreign stream is gone): wait for the device then (as cuda-core's owners do).
            *streams = None;
        } else if let Some(list) = streams.as_mut() {
            if !list
                .iter()
                .any(|s| s.raw() == stream.raw() && s.device() == stream.device())
            {
                list.push(stream.clone());
            }
        }
        Ok(())
    }
    fn prepare_synchronous_use(&self) -> cudars_core::Result<()> {
        match &self.handover {
            Some(h) => h.wait_host(),
            None => Ok(()),
        }
    }
}

impl Drop for ImportedAlloc {
    fn drop(&mut self) {
        let streams = std::mem::take(
            self.streams
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let done = match streams {
            None => self.device.synchronize().is_ok(),
            Some(streams) => streams.iter().all(|s| {
                // A stream being captured would take the fence as a graph node, which says
                // nothing about the work already issued: then the memory is leaked.
                !cudars_core::graph::touches_capture(s)
                    && s.record(None).and_then(|e| e.synchronize()).is_ok()
            }),
        };
        if !done {
            // Work may still use the memory: never hand it back under it.
            std::mem::forget(self.tensor.take());
        }
    }
}
