//! `cudars_dlpack`: a Python extension module (PyO3, abi3) that exchanges `cudars` device
//! memory with PyTorch, CuPy, JAX or any DLPack framework, in both directions, with no copy.
//!
//! ```python
//! import cudars_dlpack as cd, torch
//! buf = cd.pool_alloc(4096)              # a cuda-mempool block (cd.alloc: plain cuMemAlloc)
//! buf.fill_u32(7)                        # on the module's producer stream
//! t = torch.from_dlpack(buf.tensor("int32", (1024,)))  # __dlpack__(stream=torch's): ordered
//! imp = cd.from_dlpack(t)                # any framework tensor -> cudars (versioned or legacy)
//! imp.ptr == t.data_ptr(); imp.read()    # zero copy; read on the module's consumer stream
//! cd.stats()                             # exports, deleters run, imports, releases
//! ```
//!
//! Exports are `Tensor` objects (`Buffer.tensor(dtype, shape, strides, offset, read_only)`)
//! with `__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)` and
//! `__dlpack_device__()`: a versioned capsule (`dltensor_versioned`) when the consumer gives
//! `max_version >= (1, 0)`, a legacy one (`dltensor`) otherwise; the consumer's stream waits
//! for the producer stream on the device, and a pool block stays out of reuse until the
//! consumer calls the deleter. `copy=True` is refused (`BufferError`): nothing is copied.
//!
//! `from_dlpack(obj, device=None, stream=None, contiguous=False, writable=False,
//! c_api=False)` calls `obj.__dlpack__(stream=<our consumer stream>, max_version=(1, 3))`
//! (retrying without `max_version` for producers older than DLPack 1.0), takes the capsule
//! and renames it `used_dltensor[_versioned]`. With `c_api=True` it goes through the
//! producer's DLPack 1.3 C exchange API (`type(obj).__dlpack_c_exchange_api__`, PyTorch
//! 2.10+) when it has one: `managed_tensor_from_py_object_no_sync`, then the consumer stream
//! is ordered after the producer's `current_work_stream`. `stream=-1` asks for no ordering.
//! `stream` is an int (a raw `CUstream` the caller keeps alive while the import is used and
//! until it is released: a destroyed stream's handle is used after it is gone) or, better, a
//! stream object (`__cuda_stream__()`, PyTorch's `cuda_stream`, CuPy's `ptr`), which the
//! import keeps alive for as long as it uses the stream.
//!
//! `Tensor` also offers the producer side of that C API: `Tensor.__dlpack_c_exchange_api__`
//! is a capsule (`dlpack_exchange_api`) of a static `DLPackExchangeAPI` table (the struct of
//! dlpack.h 1.3, through dlpark): managed and non-owning exports of a `Tensor`, an importer
//! that wraps a foreign tensor as `Imported`, an allocator of device memory, and the current
//! work stream (the module's producer stream).
//!
//! A pool block's free records a fence on every stream that used it, the streams passed as
//! `__dlpack__(stream=...)` included: such a stream must stay alive until the block is freed
//! (the frameworks' default and pooled streams always are).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

// The fills that `Tensor.fill_u32` / `spin_fill_u32` and `Imported.fill_u32` offer (test
// helpers for the clients) are cuda-core's hand-written PTX kernels, on purpose: they need
// only the driver, whereas kernels compiled by cuda-rtc would make this Python extension load
// libnvrtc (a separate ~100 MB library a user of the module may not have) and compile on first
// use, for two fills.
use cudars_core::kernels::Kernels;
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Event, Stream};
use cudars_dlpack::ffi::{
    device_type, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackExchangeAPI,
    CAPSULE_EXCHANGE_API, CAPSULE_LEGACY, CAPSULE_LEGACY_USED, CAPSULE_VERSIONED,
    CAPSULE_VERSIONED_USED,
};
use cudars_dlpack::{
    order_after, prepare_for_consumer, ConsumerStream, ElemType, Expect, ExportedTensor,
    ImportedTensor, Layout, TensorSpec,
};
use cudars_mempool::{DeviceId, DevicePool};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// Tensors exported (capsules made).
static EXPORTS: AtomicU64 = AtomicU64::new(0);
/// Export deleters run (owners dropped): by a consumer, or by a capsule nobody consumed.
static EXPORT_DELETERS: AtomicU64 = AtomicU64::new(0);
/// Tensors imported.
static IMPORTS: AtomicU64 = AtomicU64::new(0);
/// Imported tensors released (their producer's deleter called).
static IMPORT_RELEASES: AtomicU64 = AtomicU64::new(0);
/// Imports that went through a producer's C exchange API.
static C_API_IMPORTS: AtomicU64 = AtomicU64::new(0);

fn runtime(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// A refusal of the protocol is a `BufferError` (what DLPack consumers expect); a failed
/// CUDA call a `RuntimeError`.
fn dl_err(e: cudars_dlpack::Error) -> PyErr {
    match e {
        cudars_dlpack::Error::Cuda(c) => runtime(c),
        cudars_dlpack::Error::InvalidStream(_) => PyValueError::new_err(e.to_string()),
        other => PyBufferError::new_err(other.to_string()),
    }
}

/// What the module keeps per device: its producer and consumer streams (non-blocking, so the
/// legacy stream orders nothing for them), the ordering event, the ready-made kernels.
struct PerDevice {
    device: Device,
    producer: Stream,
    consumer: Stream,
    event: Mutex<Event>,
    kernels: OnceLock<Kernels>,
    /// Counts the work this module issued on `producer`, bumped after each issue.
    issued: AtomicU64,
    /// `issued` as read before the legacy stream was last ordered after `producer`: while
    /// they are equal, the legacy stream (persistent, one per device) already waits for
    /// everything the module issued there, and an export to it needs no new event.
    legacy_ordered: AtomicU64,
}

impl PerDevice {
    /// Notes that work was just issued on the producer stream (after issuing it: an export
    /// that reads the count and then records its event covers that work).
    fn issued_work(&self) {
        self.issued.fetch_add(1, Ordering::SeqCst);
    }

    fn kernels(&self) -> PyResult<&Kernels> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let k = Kernels::load(&self.device).map_err(runtime)?;
        Ok(self.kernels.get_or_init(|| k))
    }
}

fn per_device(ordinal: usize) -> PyResult<Arc<PerDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<PerDevice>>>> = OnceLock::new();
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let device = Device::new(ordinal).map_err(runtime)?;
    let nb = |d: &Device| Stream::builder(d).non_blocking(true).build();
    let d = Arc::new(PerDevice {
        device,
        producer: nb(&device).map_err(runtime)?,
        consumer: nb(&device).map_err(runtime)?,
        event: Mutex::new(Event::new(&device).map_err(runtime)?),
        kernels: OnceLock::new(),
        issued: AtomicU64::new(0),
        legacy_ordered: AtomicU64::new(u64::MAX),
    });
    map.insert(ordinal, d.clone());
    Ok(d)
}

fn pool() -> PyResult<&'static Arc<DevicePool>> {
    static POOL: OnceLock<Arc<DevicePool>> = OnceLock::new();
    if let Some(p) = POOL.get() {
        return Ok(p);
    }
    let p = Arc::new(DevicePool::new_driver().map_err(runtime)?);
    Ok(POOL.get_or_init(|| p))
}

/// The owner an export keeps: the view, counted when the deleter drops it.
struct CountedOwner(#[allow(dead_code)] DevicePtr);

impl Drop for CountedOwner {
    fn drop(&mut self) {
        EXPORT_DELETERS.fetch_add(1, Ordering::SeqCst);
    }
}

/// Device memory made here: `alloc` (`cuMemAlloc`) or `pool_alloc` (a cuda-mempool block
/// allocated on the module's producer stream).
#[pyclass(frozen, module = "cudars_dlpack")]
struct Buffer {
    view: DevicePtr,
    dev: Arc<PerDevice>,
    pooled: bool,
}

impl Buffer {
    fn words(&self) -> PyResult<DevicePtr> {
        let n = self.view.len() / 4 * 4;
        self.view.slice(..n).map_err(runtime)
    }
}

#[pymethods]
impl Buffer {
    /// The device address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.view.as_raw()
    }
    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.len()
    }
    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.view.device().ordinal()
    }
    /// Whether the memory is a cuda-mempool block.
    #[getter]
    fn pooled(&self) -> bool {
        self.pooled
    }
    /// The producer stream's handle (int).
    #[getter]
    fn stream(&self) -> u64 {
        self.dev.producer.raw() as u64
    }
    /// Queues a fill of every whole u32 with `value` on the producer stream.
    fn fill_u32(&self, value: u32) -> PyResult<()> {
        let k = self.dev.kernels()?;
        let issued = k.fill(&self.dev.producer, &self.words()?, value);
        self.dev.issued_work();
        issued.map_err(runtime)
    }
    /// Queues a kernel that spins for about `cycles` SM clocks, then fills every whole u32
    /// with `value`, on the producer stream: the slow writer of ordering tests.
    fn spin_fill_u32(&self, value: u32, cycles: u64) -> PyResult<()> {
        let k = self.dev.kernels()?;
        let issued = k.fill_after_spin(&self.dev.producer, &self.words()?, value, cycles);
        self.dev.issued_work();
        issued.map_err(runtime)
    }
    /// Waits for the producer stream, then copies `data` (exactly `nbytes` bytes) in.
    fn write(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<()> {
        let (view, producer) = (self.view.clone(), self.dev.producer.clone());
        py.detach(move || {
            producer.synchronize()?;
            view.copy_from_host(&data)
        })
        .map_err(runtime)
    }
    /// Waits for the producer stream, then copies the bytes out.
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (view, producer) = (self.view.clone(), self.dev.producer.clone());
        let host = py
            .detach(move || {
                producer.synchronize()?;
                view.to_vec()
            })
            .map_err(runtime)?;
        Ok(PyBytes::new(py, &host))
    }
    /// Blocks until the producer stream's work is done.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let producer = self.dev.producer.clone();
        py.detach(move || producer.synchronize()).map_err(runtime)
    }
    /// A tensor view of the buffer to export: `dtype` a NumPy-style name, `shape` (default:
    /// every whole element, 1-D), `strides` in elements (default compact), `offset` in bytes.
    /// Checked here: out of bounds, misaligned, overflowing views are a `BufferError`.
    #[pyo3(signature = (dtype="uint8", shape=None, strides=None, offset=0, read_only=false))]
    fn tensor(
        &self,
        dtype: &str,
        shape: Option<Vec<i64>>,
        strides: Option<Vec<i64>>,
        offset: usize,
        read_only: bool,
    ) -> PyResult<Tensor> {
        let elem = ElemType::from_name(dtype)
            .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {dtype:?}")))?;
        let shape = shape
            .unwrap_or_else(|| vec![(self.view.len().saturating_sub(offset) / elem.size()) as i64]);
        let mut spec = TensorSpec::new(elem, shape)
            .byte_offset(offset)
            .read_only(read_only);
        if let Some(s) = strides {
            spec = spec.strides(s);
        }
        let strides = spec
            .check(self.view.as_raw(), self.view.len())
            .map_err(dl_err)?;
        let mut dims = spec.shape().to_vec();
        dims.extend_from_slice(&strides);
        Ok(Tensor {
            view: self.view.clone(),
            dev: self.dev.clone(),
            spec,
            dims,
        })
    }
}

/// A checked tensor view of a `Buffer`, exported through `__dlpack__`.
#[pyclass(frozen, module = "cudars_dlpack")]
struct Tensor {
    view: DevicePtr,
    dev: Arc<PerDevice>,
    spec: TensorSpec,
    /// Shape then strides (in elements), never changed: what a non-owning `DLTensor` of the
    /// C exchange API points to while the object lives.
    dims: Vec<i64>,
}

unsafe extern "C" fn capsule_versioned_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed (GIL held). A capsule still
    // named `dltensor_versioned` was never consumed: its tensor is still ours to delete,
    // once. A consumed one (renamed `used_...`) belongs to its consumer.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_VERSIONED.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if !t.is_null() {
                if let Some(d) = (*t).deleter {
                    d(t);
                }
            }
        }
    }
}

unsafe extern "C" fn capsule_legacy_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_versioned_destructor`, for the legacy name and struct.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_LEGACY.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, CAPSULE_LEGACY.as_ptr())
                .cast::<DLManagedTensor>();
            if !t.is_null() {
                if let Some(d) = (*t).deleter {
                    d(t);
                }
            }
        }
    }
}

/// The stream argument as the protocol passes it: `None` or an int.
fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    match stream {
        None => Ok(None),
        Some(s) if s.is_none() => Ok(None),
        Some(s) => s.extract::<i64>().map(Some).map_err(|_| {
            PyTypeError::new_err("stream must be None or an int (a CUDA stream handle)")
        }),
    }
}

impl Tensor {
    /// The owning export, counted.
    fn export(&self) -> PyResult<ExportedTensor> {
        let device = DLDevice {
            device_type: device_type::CUDA,
            device_id: self.view.device().ordinal() as i32,
        };
        // SAFETY: the view's range is live device memory of its device while the view (the
        // owner here) lives: DeviceAlloc's contract.
        let t = unsafe {
            ExportedTensor::from_raw_parts(
                device,
                self.view.as_raw(),
                self.view.len(),
                CountedOwner(self.view.clone()),
                &self.spec,
            )
        }
        .map_err(dl_err)?;
        EXPORTS.fetch_add(1, Ordering::SeqCst);
        Ok(t)
    }
}

#[pymethods]
impl Tensor {
    /// The DLPack protocol: a capsule owning a DLPack tensor of this view.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "cudars_dlpack exports without copying: copy=True cannot be honoured",
            ));
        }
        let ordinal = self.view.device().ordinal() as i32;
        if let Some((ty, id)) = dl_device {
            if ty != device_type::CUDA.0 as i32 || id != ordinal {
                return Err(PyBufferError::new_err(format!(
                    "the tensor is on CUDA device {ordinal}; dl_device=({ty}, {id}) would need a copy"
                )));
            }
        }
        let versioned = matches!(max_version, Some((major, _)) if major >= 1);
        if self.spec.is_read_only() && !versioned {
            return Err(PyBufferError::new_err(
                "the tensor is read-only, which a legacy (pre-1.0) DLPack capsule cannot say: \
                 pass max_version=(1, 0) or later",
            ));
        }
        let consumer = ConsumerStream::from_protocol(stream_arg(stream)?).map_err(dl_err)?;
        {
            let dev = &self.dev;
            let event = dev
                .event
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The legacy stream (what PyTorch and CuPy pass from their default streams)
            // needs no new event when it already waits for all the module's producer work.
            let legacy = consumer == ConsumerStream::Legacy;
            let seen = dev.issued.load(Ordering::SeqCst);
            let ordered = legacy && dev.legacy_ordered.load(Ordering::SeqCst) == seen;
            let producer = (!ordered).then_some(&dev.producer);
            // SAFETY: the stream handle is the consumer's, passed per the protocol, which
            // asks it to be a live stream of this device (the consumer keeps it alive).
            unsafe { prepare_for_consumer(&self.view, producer, consumer, Some(&event)) }
                .map_err(dl_err)?;
            if legacy && !ordered {
                dev.legacy_ordered.store(seen, Ordering::SeqCst);
            }
        }
        let mut exported = self.export()?;
        let capsule = match max_version {
            Some((major, minor)) if major >= 1 => {
                if major == 1 {
                    exported.set_minor_version(minor);
                }
                let raw = exported.into_raw();
                // SAFETY: `raw` is an owned tensor; the name is a static C string; the
                // destructor deletes it only if no consumer took it.
                unsafe {
                    ffi::PyCapsule_New(
                        raw.cast::<c_void>(),
                        CAPSULE_VERSIONED.as_ptr(),
                        Some(capsule_versioned_destructor),
                    )
                }
            }
            _ => {
                let raw = exported.into_raw_legacy();
                // SAFETY: as above, for the legacy struct.
                unsafe {
                    ffi::PyCapsule_New(
                        raw.cast::<c_void>(),
                        CAPSULE_LEGACY.as_ptr(),
                        Some(capsule_legacy_destructor),
                    )
                }
            }
        };
        // SAFETY: a new reference or null with an exception set (then the tensor leaked
        // with the failed capsule: PyCapsule_New fails only out of memory).
        Ok(unsafe { Bound::from_owned_ptr_or_err(py, capsule) }?.unbind())
    }

    /// The DLPack 1.3 C exchange API of this type: a capsule named `dlpack_exchange_api`
    /// holding a static `DLPackExchangeAPI` (see `exchange`).
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        exchange::capsule(py)
    }

    /// `(kDLCUDA, ordinal)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (
            device_type::CUDA.0 as i32,
            self.view.device().ordinal() as i32,
        )
    }

    /// The address of the first element.
    #[getter]
    fn ptr(&self) -> u64 {
        self.view.as_raw() + self.spec.offset() as u64
    }
    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.spec.shape().to_vec()
    }
    /// The dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.spec.elem().name()
    }
}

/// What an import keeps: the view (which owns the producer's tensor) and its description.
struct Held {
    ptr: DevicePtr,
}

impl Drop for Held {
    fn drop(&mut self) {
        IMPORT_RELEASES.fetch_add(1, Ordering::SeqCst);
    }
}

/// A tensor imported from another framework; owns its DLPack tensor (the producer's deleter
/// runs once, at `release()` or when this object goes).
#[pyclass(frozen, module = "cudars_dlpack")]
struct Imported {
    held: Mutex<Option<Held>>,
    layout: Layout,
    version: Option<(u32, u32)>,
    read_only: bool,
    via_c_api: bool,
    stream: Stream,
    dev: Arc<PerDevice>,
}

impl Imported {
    fn view(&self) -> PyResult<DevicePtr> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*held {
            Some(h) => Ok(h.ptr.clone()),
            None => Err(PyValueError::new_err("the imported tensor was released")),
        }
    }
    fn contiguous_view(&self) -> PyResult<DevicePtr> {
        if !self.layout.contiguous {
            return Err(PyBufferError::new_err(
                "the tensor is not contiguous: read/write/fill need compact row-major memory",
            ));
        }
        self.view()
    }
}

#[pymethods]
impl Imported {
    /// The address of the first element (data pointer plus byte offset).
    #[getter]
    fn ptr(&self) -> u64 {
        self.layout.addr
    }
    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.layout.shape.clone()
    }
    /// The strides in elements.
    #[getter]
    fn strides(&self) -> Vec<i64> {
        self.layout.strides.clone()
    }
    /// The dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.layout.elem.name()
    }
    /// The device ordinal (`None`: managed memory).
    #[getter]
    fn device(&self) -> Option<usize> {
        self.layout.device
    }
    /// `(major, minor)`, or `None` for a legacy capsule.
    #[getter]
    fn version(&self) -> Option<(u32, u32)> {
        self.version
    }
    /// Whether the producer marked it read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }
    /// Whether it is compact row-major.
    #[getter]
    fn contiguous(&self) -> bool {
        self.layout.contiguous
    }
    /// Bytes of its elements.
    #[getter]
    fn nbytes(&self) -> usize {
        self.layout.nbytes()
    }
    /// Whether it came through the producer's C exchange API.
    #[getter]
    fn via_c_api(&self) -> bool {
        self.via_c_api
    }
    /// Whether `release()` ran.
    #[getter]
    fn released(&self) -> bool {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }
    /// The bytes, copied on the import's stream (ordered after the producer's work by the
    /// protocol) and waited for.
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let view = self.contiguous_view()?;
        let stream = self.stream.clone();
        let host = py
            .detach(move || {
                let mut host = vec![0u8; view.len()];
                // SAFETY: `host` is neither touched nor freed before the stream is
                // synchronised just below.
                unsafe { view.copy_to_host_async(&mut host, &stream) }?;
                stream.synchronize()?;
                Ok::<_, cudars_core::Error>(host)
            })
            .map_err(runtime)?;
        Ok(PyBytes::new(py, &host))
    }
    /// Copies `data` (exactly `nbytes` bytes) in, on the import's stream, and waits.
    fn write(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<()> {
        if self.read_only {
            return Err(PyBufferError::new_err(
                "the producer marked the tensor read-only",
            ));
        }
        let view = self.contiguous_view()?;
        let stream = self.stream.clone();
        py.detach(move || {
            // SAFETY: `data` lives until the stream is synchronised just below.
            unsafe { view.copy_from_host_async(&data, &stream) }?;
            stream.synchronize()
        })
        .map_err(runtime)
    }
    /// Queues a fill of every whole u32 with `value` on the import's stream (call
    /// `synchronize()` before the producer reads it on its own stream).
    fn fill_u32(&self, value: u32) -> PyResult<()> {
        if self.read_only {
            return Err(PyBufferError::new_err(
                "the producer marked the tensor read-only",
            ));
        }
        let view = self.contiguous_view()?;
        let n = view.len() / 4 * 4;
        let k = self.dev.kernels()?;
        let issued = k.fill(&self.stream, &view.slice(..n).map_err(runtime)?, value);
        // An import through the C API's `managed_tensor_to_py_object_no_sync` works on the
        // producer stream: count the fill there, or the next export to the legacy stream
        // would skip its event and a consumer could read before it.
        if self.stream.raw() == self.dev.producer.raw() {
            self.dev.issued_work();
        }
        issued.map_err(runtime)
    }
    /// Waits for the import's stream.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.stream.clone();
        py.detach(move || stream.synchronize()).map_err(runtime)
    }
    /// Releases the tensor now: waits for this module's work on it, then calls the
    /// producer's deleter (once; later calls do nothing).
    fn release(&self, py: Python<'_>) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        py.detach(move || drop(held));
    }
}

/// The producer's C exchange table, when its type has one (DLPack 1.3).
fn exchange_api(obj: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    let capsule = obj
        .get_type()
        .getattr(pyo3::intern!(obj.py(), "__dlpack_c_exchange_api__"))
        .ok()?;
    // SAFETY: a live object; a capsule of another name gives null with an exception, which
    // is cleared (the caller falls back to __dlpack__).
    let api = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE_EXCHANGE_API.as_ptr()) }
        .cast::<DLPackExchangeAPI>();
    if api.is_null() {
        let _ = PyErr::take(obj.py());
        return None;
    }
    // SAFETY: the spec makes the table static for the life of the process.
    let api = unsafe { &*api };
    (api.header.version.major == 1).then_some(api)
}

/// The `CUstream` of a stream object: `__cuda_stream__()` (the CUDA stream protocol,
/// `(version, handle)`), else PyTorch's `cuda_stream`, else CuPy's `ptr`.
fn stream_handle(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let py = obj.py();
    if let Ok(f) = obj.getattr(pyo3::intern!(py, "__cuda_stream__")) {
        let (_version, handle): (i64, i64) = f.call0()?.extract()?;
        return Ok(handle);
    }
    for name in [pyo3::intern!(py, "cuda_stream"), pyo3::intern!(py, "ptr")] {
        if let Ok(h) = obj.getattr(name) {
            return h.extract();
        }
    }
    Err(PyTypeError::new_err(
        "stream must be None, an int (a CUstream handle) or a stream object \
         (__cuda_stream__, cuda_stream or ptr)",
    ))
}

/// The consumer stream of a stream object, which the returned `Stream` keeps alive.
fn object_stream(dev: &PerDevice, obj: &Bound<'_, PyAny>) -> PyResult<(Stream, i64)> {
    // The implicit streams need no keeping alive; a handle of 0 (the default stream of
    // PyTorch and CuPy) is the legacy stream.
    let which = match stream_handle(obj)? {
        0 => ConsumerStream::Legacy,
        h => ConsumerStream::from_protocol(Some(h)).map_err(dl_err)?,
    };
    let ConsumerStream::Handle(h) = which else {
        // SAFETY: an implicit stream (legacy or per-thread), valid on every device.
        let s = unsafe { which.to_stream(&dev.device) }
            .map_err(dl_err)?
            .unwrap_or_else(|| dev.consumer.clone());
        return Ok((s, which.to_protocol()));
    };
    // SAFETY: the object's own stream, of this device (checked by the call), valid while
    // the object lives; the object is the `Stream`'s owner, dropped with its last clone (the
    // import's, its view's), so the handle outlives every use through them.
    let s = unsafe {
        Stream::external_with_owner(
            &dev.device,
            h as usize as cudars_core::sys::CUstream,
            obj.clone().unbind(),
        )
    }
    .map_err(runtime)?;
    Ok((s, h as i64))
}

/// The consumer stream an import uses: ours by default, or the one named (an int, or a
/// stream object that the returned `Stream` keeps alive).
fn import_stream(dev: &PerDevice, stream: Option<&Bound<'_, PyAny>>) -> PyResult<(Stream, i64)> {
    let stream = match stream {
        None => None,
        Some(obj) if obj.is_none() => None,
        Some(obj) => match obj.extract::<i64>() {
            // An int, or anything with `__index__` (a NumPy integer): a raw handle.
            Ok(v) => Some(v),
            Err(_) => return object_stream(dev, obj),
        },
    };
    Ok(match stream {
        None | Some(-1) => {
            let s = dev.consumer.clone();
            let arg = stream.unwrap_or(ConsumerStream::of_stream(&s).to_protocol());
            (s, arg)
        }
        Some(v) => {
            let which = ConsumerStream::from_protocol(Some(v)).map_err(dl_err)?;
            // SAFETY: the caller names a live stream of this device, as the protocol asks.
            let s = unsafe { which.to_stream(&dev.device) }
                .map_err(dl_err)?
                .unwrap_or_else(|| dev.consumer.clone());
            (s, v)
        }
    })
}

/// Takes the tensor out of a `__dlpack__` capsule and marks the capsule used.
fn take_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<ImportedTensor> {
    let p = capsule.as_ptr();
    // SAFETY: a live object; IsValid checks the type and name without raising.
    unsafe {
        if ffi::PyCapsule_IsValid(p, CAPSULE_VERSIONED.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(p, CAPSULE_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            // Renamed first: from here on the capsule's destructor leaves the tensor to us.
            if t.is_null() || ffi::PyCapsule_SetName(p, CAPSULE_VERSIONED_USED.as_ptr()) != 0 {
                return Err(PyErr::fetch(capsule.py()));
            }
            return ImportedTensor::from_versioned(t).map_err(dl_err);
        }
        if ffi::PyCapsule_IsValid(p, CAPSULE_LEGACY.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(p, CAPSULE_LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if t.is_null() || ffi::PyCapsule_SetName(p, CAPSULE_LEGACY_USED.as_ptr()) != 0 {
                return Err(PyErr::fetch(capsule.py()));
            }
            return ImportedTensor::from_legacy(t).map_err(dl_err);
        }
    }
    Err(PyTypeError::new_err(
        "__dlpack__ did not return an unused dltensor_versioned or dltensor capsule",
    ))
}

/// Imports any DLPack tensor of a CUDA device (see the module documentation).
#[pyfunction]
#[pyo3(signature = (obj, *, device=None, stream=None, contiguous=false, writable=false, c_api=false))]
fn from_dlpack(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    device: Option<usize>,
    stream: Option<&Bound<'_, PyAny>>,
    contiguous: bool,
    writable: bool,
    c_api: bool,
) -> PyResult<Imported> {
    let (ty, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    if ty != device_type::CUDA.0 as i32 && ty != device_type::CUDA_MANAGED.0 as i32 {
        return Err(PyBufferError::new_err(format!(
            "the tensor is on DLPack device type {ty}, not CUDA memory"
        )));
    }
    let ordinal = device.unwrap_or(id.max(0) as usize);
    let dev = per_device(ordinal)?;
    let (consumer, arg) = import_stream(&dev, stream)?;
    let mut via_c_api = false;
    let imported = match exchange_api(obj).filter(|_| c_api) {
        Some(api) => {
            let from = api.managed_tensor_from_py_object_no_sync.ok_or_else(|| {
                PyTypeError::new_err(
                    "the producer's exchange API has no managed_tensor_from_py_object_no_sync",
                )
            })?;
            let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
            // SAFETY: `obj` is a live object of the type the table came from; `out` is a
            // valid out-pointer; the GIL is held.
            if unsafe { from(obj.as_ptr().cast(), &mut out) } != 0 {
                return Err(PyErr::fetch(py));
            }
            // SAFETY: on success the producer handed over an owned tensor.
            let t = unsafe { ImportedTensor::from_versioned(out) }.map_err(dl_err)?;
            if arg != -1 {
                if let Some(current) = api.current_work_stream {
                    let mut raw: *mut c_void = std::ptr::null_mut();
                    // SAFETY: a valid out-pointer; the GIL is held.
                    if unsafe { current(device_type::CUDA, t.device().device_id, &mut raw) } != 0 {
                        return Err(PyErr::fetch(py));
                    }
                    let producer = ConsumerStream::of_stream_raw(raw as u64);
                    // SAFETY: the producer's current stream of this device, live now.
                    let producer = unsafe { producer.to_stream(&dev.device) }.map_err(dl_err)?;
                    if let Some(producer) = producer {
                        let event = dev
                            .event
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        order_after(&producer, &consumer, Some(&event)).map_err(dl_err)?;
                    }
                }
            }
            via_c_api = true;
            C_API_IMPORTS.fetch_add(1, Ordering::SeqCst);
            t
        }
        None => {
            let kwargs = PyDict::new(py);
            kwargs.set_item("stream", arg)?;
            kwargs.set_item("max_version", (1u32, 3u32))?;
            let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
                Ok(c) => c,
                Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                    // A producer older than DLPack 1.0 has no max_version.
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("stream", arg)?;
                    obj.call_method("__dlpack__", (), Some(&kwargs))?
                }
                Err(e) => return Err(e),
            };
            take_capsule(&capsule)?
        }
    };
    let expect = Expect::new()
        .device(ordinal)
        .allow_managed(true)
        .contiguous(contiguous)
        .mutable(writable);
    make_imported(imported, &expect, dev, consumer, via_c_api)
}

/// Checks an imported tensor and wraps it for Python, its uses ordered after `stream`.
fn make_imported(
    imported: ImportedTensor,
    expect: &Expect,
    dev: Arc<PerDevice>,
    stream: Stream,
    via_c_api: bool,
) -> PyResult<Imported> {
    let version = imported.version().map(|v| (v.major, v.minor));
    let read_only = imported.is_read_only();
    let view = imported.into_untyped_view(expect).map_err(dl_err)?;
    let layout = view.layout().clone();
    let ptr = view
        .into_device_ptr(&dev.device, Some(&stream))
        .map_err(dl_err)?;
    IMPORTS.fetch_add(1, Ordering::SeqCst);
    Ok(Imported {
        held: Mutex::new(Some(Held { ptr })),
        layout,
        version,
        read_only,
        via_c_api,
        stream,
        dev,
    })
}

/// Allocates `nbytes` of plain device memory (`cuMemAlloc`).
#[pyfunction]
#[pyo3(signature = (nbytes, device=0))]
fn alloc(py: Python<'_>, nbytes: usize, device: usize) -> PyResult<Buffer> {
    let dev = per_device(device)?;
    let d = dev.device;
    let view = py
        .detach(move || DevicePtr::alloc(&d, nbytes))
        .map_err(runtime)?;
    Ok(Buffer {
        view,
        dev,
        pooled: false,
    })
}

/// Allocates `nbytes` from the module's cuda-mempool pool, on the producer stream.
#[pyfunction]
#[pyo3(signature = (nbytes, device=0))]
fn pool_alloc(py: Python<'_>, nbytes: usize, device: usize) -> PyResult<Buffer> {
    let dev = per_device(device)?;
    let pool = pool()?;
    let producer = dev.producer.clone();
    let block = py
        .detach(move || pool.malloc_shared(&producer, nbytes))
        .map_err(runtime)?;
    // The allocation may have made the producer stream wait for other streams.
    dev.issued_work();
    Ok(Buffer {
        view: block.into(),
        dev,
        pooled: true,
    })
}

/// The module's pool's figures for a device: used, reserved, active_blocks (current),
/// allocations and frees.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn pool_stats<'py>(py: Python<'py>, device: u32) -> PyResult<Bound<'py, PyDict>> {
    let s = pool()?.stats(DeviceId(device)).map_err(runtime)?;
    let d = PyDict::new(py);
    d.set_item("used", s.used.current)?;
    d.set_item("reserved", s.reserved.current)?;
    d.set_item("active_blocks", s.active_blocks.current)?;
    d.set_item("allocations", s.allocations)?;
    d.set_item("frees", s.frees)?;
    Ok(d)
}

/// Counters: exports (capsules made), export_deleters (owners dropped), live_exports,
/// imports, import_releases (producer deleters called), c_api_imports.
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let (e, ed) = (
        EXPORTS.load(Ordering::SeqCst),
        EXPORT_DELETERS.load(Ordering::SeqCst),
    );
    d.set_item("exports", e)?;
    d.set_item("export_deleters", ed)?;
    d.set_item("live_exports", e.saturating_sub(ed))?;
    d.set_item("imports", IMPORTS.load(Ordering::SeqCst))?;
    d.set_item("import_releases", IMPORT_RELEASES.load(Ordering::SeqCst))?;
    d.set_item("c_api_imports", C_API_IMPORTS.load(Ordering::SeqCst))?;
    Ok(d)
}

/// `(free, total)` bytes of the device (`cuMemGetInfo`).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn mem_get_info(device: usize) -> PyResult<(usize, usize)> {
    per_device(device)?.device.memory_info().map_err(runtime)
}

/// The handles of the module's producer and consumer streams of a device (for tests: work
/// that others queue on the producer stream is not known to the module, whose exports to
/// the legacy stream skip the event while it issued nothing new there).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn streams(device: usize) -> PyResult<(u64, u64)> {
    let d = per_device(device)?;
    Ok((d.producer.raw() as u64, d.consumer.raw() as u64))
}

/// Whether `obj`'s type offers the DLPack 1.3 C exchange API.
#[pyfunction]
fn has_c_exchange_api(obj: &Bound<'_, PyAny>) -> bool {
    exchange_api(obj).is_some()
}

#[pymodule]
#[pyo3(name = "cudars_dlpack")]
fn cudars_dlpack_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Buffer>()?;
    m.add_class::<Tensor>()?;
    m.add_class::<Imported>()?;
    m.add_function(wrap_pyfunction!(alloc, m)?)?;
    m.add_function(wrap_pyfunction!(pool_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(mem_get_info, m)?)?;
    m.add_function(wrap_pyfunction!(streams, m)?)?;
    m.add_function(wrap_pyfunction!(has_c_exchange_api, m)?)?;
    m.add("DLPACK_VERSION", (1u32, 3u32))?;
    Ok(())
}

/// The producer side of the DLPack 1.3 C exchange API for `Tensor`: a static table of C
/// functions that a consumer finds through `type(t).__dlpack_c_exchange_api__` and calls
/// with the GIL held, without going through `__dlpack__`. None of them synchronises: the
/// consumer orders its work after `current_work_stream` (the module's producer stream).
mod exchange {
    use super::*;
    use cudars_dlpack::ffi::{DLDeviceType, DLPackExchangeAPIHeader, DLPackVersion, DLTensor};
    use std::ffi::{c_char, c_int, CString};
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// The table: static for the life of the process, as the spec asks.
    struct Table(DLPackExchangeAPI);
    // SAFETY: the table is immutable; its one pointer (`prev_api`) is null.
    unsafe impl Sync for Table {}

    static TABLE: Table = Table(DLPackExchangeAPI {
        header: DLPackExchangeAPIHeader {
            version: DLPackVersion { major: 1, minor: 3 },
            prev_api: std::ptr::null_mut(),
        },
        managed_tensor_allocator: Some(allocator),
        managed_tensor_from_py_object_no_sync: Some(managed_from_py),
        managed_tensor_to_py_object_no_sync: Some(managed_to_py),
        dltensor_from_py_object_no_sync: Some(dltensor_from_py),
        current_work_stream: Some(current_work_stream),
    });

    pub(super) fn capsule(py: Python<'_>) -> PyResult<Py<PyAny>> {
        let ptr = (&raw const TABLE.0).cast_mut().cast::<c_void>();
        // SAFETY: a static table and a static name; no destructor (nothing to free).
        let cap = unsafe { ffi::PyCapsule_New(ptr, CAPSULE_EXCHANGE_API.as_ptr(), None) };
        // SAFETY: a new reference, or null with an exception set.
        Ok(unsafe { Bound::from_owned_ptr_or_err(py, cap) }?.unbind())
    }

    /// Runs `f` with the GIL the caller holds; an error or a panic becomes a Python exception
    /// and -1.
    fn guarded(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> c_int {
        // SAFETY: every entry of the table is called with the GIL held (the spec's contract
        // for these functions).
        let py = unsafe { Python::assume_attached() };
        match catch_unwind(AssertUnwindSafe(|| f(py))) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                e.restore(py);
                -1
            }
            Err(_) => {
                PyRuntimeError::new_err("cudars_dlpack: panic in the C exchange API").restore(py);
                -1
            }
        }
    }

    fn tensor_of<'py>(py: Python<'py>, obj: *mut c_void) -> PyResult<Bound<'py, Tensor>> {
        if obj.is_null() {
            return Err(PyValueError::new_err("null object"));
        }
        // SAFETY: the consumer passes a live object (the spec's contract).
        let any = unsafe { Bound::from_borrowed_ptr(py, obj.cast::<ffi::PyObject>()) };
        any.cast::<Tensor>()
            .cloned()
            .map_err(|_| PyTypeError::new_err("not a cudars_dlpack.Tensor"))
    }

    unsafe extern "C" fn managed_from_py(
        py_object: *mut c_void,
        out: *mut *mut DLManagedTensorVersioned,
    ) -> c_int {
        guarded(|py| {
            let t = tensor_of(py, py_object)?;
            if out.is_null() {
                return Err(PyValueError::new_err("null out pointer"));
            }
            let raw = t.get().export()?.into_raw();
            // SAFETY: a valid out-pointer (checked non-null; the consumer's contract).
            unsafe { *out = raw };
            Ok(())
        })
    }

    unsafe extern "C" fn dltensor_from_py(py_object: *mut c_void, out: *mut DLTensor) -> c_int {
        guarded(|py| {
            let t = tensor_of(py, py_object)?;
            if out.is_null() {
                return Err(PyValueError::new_err("null out pointer"));
            }
            let t = t.get();
            // A non-owning DLTensor has no flags: a consumer would take a read-only view as
            // writable (the rule `__dlpack__` applies to legacy capsules).
            if t.spec.is_read_only() {
                return Err(PyBufferError::new_err(
                    "the tensor is read-only, which a bare DLTensor cannot say: use \
                     managed_tensor_from_py_object_no_sync or __dlpack__",
                ));
            }
            let ndim = t.spec.shape().len();
            let dims = t.dims.as_ptr().cast_mut();
            let tensor = DLTensor {
                data: (t.view.as_raw() + t.spec.offset() as u64) as usize as *mut c_void,
                device: DLDevice {
                    device_type: device_type::CUDA,
                    device_id: t.view.device().ordinal() as i32,
                },
                ndim: ndim as i32,
                dtype: t.spec.elem().to_dl(),
                shape: if ndim == 0 {
                    std::ptr::null_mut()
                } else {
                    dims
                },
                strides: if ndim == 0 {
                    std::ptr::null_mut()
                } else {
                    // SAFETY: `dims` holds 2 * ndim elements.
                    unsafe { dims.add(ndim) }
                },
                byte_offset: 0,
            };
            // SAFETY: a valid out-pointer; shape and strides point into the object's own
            // immutable `dims`, live while the consumer holds the object (the spec's
            // non-owning contract).
            unsafe { *out = tensor };
            Ok(())
        })
    }

    unsafe extern "C" fn managed_to_py(
        tensor: *mut DLManagedTensorVersioned,
        out_py_object: *mut *mut c_void,
    ) -> c_int {
        guarded(|py| {
            // SAFETY: the caller hands over an owned tensor (ownership is stolen).
            let imported = unsafe { ImportedTensor::from_versioned(tensor) }.map_err(dl_err)?;
            let d = imported.device();
            let ordinal = usize::try_from(d.device_id)
                .map_err(|_| dl_err(cudars_dlpack::Error::InvalidDevice(d.device_id)))?;
            let dev = per_device(ordinal)?;
            let stream = dev.producer.clone();
            let obj = make_imported(
                imported,
                &Expect::new().allow_managed(true),
                dev,
                stream,
                true,
            )?;
            if out_py_object.is_null() {
                return Err(PyValueError::new_err("null out pointer"));
            }
            let obj = Py::new(py, obj)?;
            // SAFETY: a valid out-pointer; the new reference goes to the caller.
            unsafe { *out_py_object = obj.into_ptr().cast() };
            Ok(())
        })
    }

    unsafe extern "C" fn current_work_stream(
        device_type: DLDeviceType,
        device_id: i32,
        out_current_stream: *mut *mut c_void,
    ) -> c_int {
        guarded(|_| {
            if out_current_stream.is_null() {
                return Err(PyValueError::new_err("null out pointer"));
            }
            let stream = if device_type == device_type::CUDA {
                per_device(
                    usize::try_from(device_id)
                        .map_err(|_| dl_err(cudars_dlpack::Error::InvalidDevice(device_id)))?,
                )?
                .producer
                .raw()
                .cast::<c_void>()
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: a valid out-pointer.
            unsafe { *out_current_stream = stream };
            Ok(())
        })
    }

    unsafe extern "C" fn allocator(
        prototype: *mut DLTensor,
        out: *mut *mut DLManagedTensorVersioned,
        error_ctx: *mut c_void,
        set_error: Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char)>,
    ) -> c_int {
        let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
            if prototype.is_null() || out.is_null() {
                return Err("null prototype or out pointer".into());
            }
            // SAFETY: the caller's prototype; only dtype, ndim, shape and device are read.
            let p = unsafe { &*prototype };
            if p.device.device_type != device_type::CUDA {
                return Err(format!(
                    "device type {} is not CUDA",
                    p.device.device_type.0
                ));
            }
            if p.ndim < 0 || (p.ndim > 0 && p.shape.is_null()) {
                return Err("invalid prototype shape".into());
            }
            let shape = if p.ndim == 0 {
                Vec::new()
            } else {
                // SAFETY: `shape` has `ndim` elements (the DLTensor contract).
                unsafe { std::slice::from_raw_parts(p.shape, p.ndim as usize) }.to_vec()
            };
            let elem = ElemType::from_dl(p.dtype).map_err(|e| e.to_string())?;
            let n = cudars_dlpack::layout::numel(&shape).map_err(|e| e.to_string())?;
            let bytes = n.checked_mul(elem.size()).ok_or("size overflow")?;
            let device = Device::new(
                usize::try_from(p.device.device_id)
                    .map_err(|_| format!("negative device id {}", p.device.device_id))?,
            )
            .map_err(|e| e.to_string())?;
            let view = DevicePtr::alloc(&device, bytes).map_err(|e| e.to_string())?;
            let spec = TensorSpec::new(elem, shape);
            let t = ExportedTensor::from_view(&view, &spec).map_err(|e| e.to_string())?;
            // SAFETY: a valid out-pointer (checked).
            unsafe { *out = t.into_raw() };
            Ok(())
        }));
        let message = match result {
            Ok(Ok(())) => return 0,
            Ok(Err(m)) => m,
            Err(_) => "panic in the allocator".to_string(),
        };
        if let Some(set_error) = set_error {
            let kind = c"RuntimeError";
            let msg = CString::new(message.replace('\0', " ")).unwrap_or_default();
            // SAFETY: the caller's error callback with its context and two C strings that
            // live for the call.
            unsafe { set_error(error_ctx, kind.as_ptr(), msg.as_ptr()) };
        }
        -1
    }
}
