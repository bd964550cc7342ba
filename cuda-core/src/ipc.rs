//! Sharing device memory between processes (CuPy's `runtime.ipcGetMemHandle` /
//! `ipcOpenMemHandle`). Linux only, as CUDA IPC.
//!
//! Two mechanisms:
//!
//! | kind | exporter | importer |
//! | --- | --- | --- |
//! | legacy IPC, for `cuMemAlloc` memory | [`DeviceMemory::ipc_handle`], [`export_view`] (a view into one allocation, e.g. a pool block) | [`IpcMapping::open`] / [`IpcMapping::open_shared`], [`IpcRegion::open`] |
//! | virtual-memory shareable handles, for `cuMemCreate` memory | [`PhysicalAllocation::new_shareable`], [`PhysicalAllocation::export_fd`], [`send_fd`] over a Unix socket | [`recv_fd`], [`PhysicalAllocation::import_fd`], [`SharedMapping::map`] |
//!
//! A legacy [`IpcMemHandle`] is 64 bytes of the driver's format, sent any way you like
//! (bytes, or hex text in an environment variable). A shareable handle is a file descriptor,
//! which only the kernel can pass to another process: [`send_fd`] / [`recv_fd`] do that over
//! a `UnixStream` (`SCM_RIGHTS`, through `rustix`'s safe `sendmsg`/`recvmsg`).
//!
//! Mappings are RAII and implement [`DeviceAlloc`], so an imported buffer is a [`DevicePtr`]
//! like any other. Dropping a mapping waits for the work that other devices' streams queued
//! on it through views (peer copies), synchronises its own device (the driver's unmap and
//! close calls are not stream-ordered), then closes or unmaps it.
//!
//! Ordering between the processes is the caller's: record an interprocess
//! [`Event`](crate::Event) after writing and send its [`IpcEventHandle`](crate::IpcEventHandle)
//! with the memory handle; the other side makes its stream wait on it.
//!
//! Failures are [`Error::Ipc`] with an [`IpcError`] that names the likely cause: a handle
//! this process exported ([`IpcError::SameProcess`]: the driver never opens those), a handle
//! already open here ([`IpcError::AlreadyOpen`]), a corrupted handle or one whose memory is
//! gone because the exporter freed it or exited ([`IpcError::InvalidHandle`]), memory on a
//! device the importing device cannot reach ([`IpcError::PeerAccess`],
//! [`IpcError::WrongDevice`]), memory that cannot be exported ([`IpcError::NotExportable`]).
//!
//! ```no_run
//! use cudars_core::ipc::{IpcMapping, IpcMemHandle};
//! use cudars_core::memory::{DeviceMemory, DevicePtr};
//! use cudars_core::Device;
//!
//! // exporter
//! let dev = Device::new(0)?;
//! let mem = DeviceMemory::new(&dev, 1 << 20)?;
//! let text = mem.ipc_handle()?.to_hex(); // send to the other process
//!
//! // importer (another process)
//! let handle = IpcMemHandle::from_hex(&text)?;
//! let view = DevicePtr::from_arc(IpcMapping::open(&dev, &handle)?);
//! let mut host = vec![0u8; view.len()];
//! view.copy_to_host(&mut host)?;
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use cudars_sys::{
    CUdeviceptr, CUipcMemHandle, CUipcMem_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUresult, CU_IPC_HANDLE_SIZE,
};

use crate::cross_device::CrossDeviceUses;
use crate::driver::drv;
use crate::error::{Error, Result};
use crate::memory::{DeviceAlloc, DeviceMemory, DevicePtr};
use crate::stream::Stream;
use crate::vmm::{self, Granularity, PhysicalAllocation, VirtualRange};
use crate::Device;

/// Size of an [`IpcMemHandle`] in bytes (64).
pub const IPC_MEM_HANDLE_BYTES: usize = CU_IPC_HANDLE_SIZE as usize;

/// Size of an [`IpcRegion`]'s byte form: the handle, then offset and length (little-endian
/// `u64`s).
pub const IPC_REGION_BYTES: usize = IPC_MEM_HANDLE_BYTES + 16;

pub use crate::error::IpcError;

// ---------------------------------------------------------------------------------------
// Handles and their text forms
// ---------------------------------------------------------------------------------------

/// A legacy IPC memory handle (`CUipcMemHandle`): 64 opaque bytes another process opens with
/// [`IpcMapping::open`]. Bytes and hex text forms, as [`IpcEventHandle`](crate::IpcEventHandle).
///
/// ```
/// use cudars_core::ipc::IpcMemHandle;
/// let handle = IpcMemHandle::from_bytes(&[9u8; 64])?;
/// assert_eq!(IpcMemHandle::from_hex(&handle.to_hex())?, handle);
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle(pub [u8; IPC_MEM_HANDLE_BYTES]);

impl fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcMemHandle({})", self.to_hex())
    }
}

fn to_hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn from_hex<const N: usize>(what: &str, text: &str) -> Result<[u8; N]> {
    let text = text.trim();
    let bad = || Error::InvalidArgument(format!("{what} is {} hex digits, got {:?}", 2 * N, text));
    if text.len() != 2 * N || !text.is_ascii() {
        return Err(bad());
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(bytes)
}

impl IpcMemHandle {
    /// The handle's bytes.
    pub fn to_bytes(&self) -> [u8; IPC_MEM_HANDLE_BYTES] {
        self.0
    }

    /// A handle from exactly [`IPC_MEM_HANDLE_BYTES`] bytes; any other length is
    /// [`Error::InvalidArgument`].
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcMemHandle> {
        let array: [u8; IPC_MEM_HANDLE_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an IPC memory handle is {IPC_MEM_HANDLE_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(IpcMemHandle(array))
    }

    /// Lowercase hexadecimal (128 characters).
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// Parses [`to_hex`](Self::to_hex)'s output (either case); anything else is
    /// [`Error::InvalidArgument`].
    pub fn from_hex(text: &str) -> Result<IpcMemHandle> {
        Ok(IpcMemHandle(from_hex("an IPC memory handle", text)?))
    }

    fn to_raw(self) -> CUipcMemHandle {
        CUipcMemHandle {
            reserved: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

/// A part of an exported allocation: the allocation's [`IpcMemHandle`], and the offset and
/// length of the part (a pool block inside a segment, a sub-view). [`export_view`] makes
/// one; [`IpcRegion::open`] gives the importer a [`DevicePtr`] of exactly that part.
///
/// ```
/// use cudars_core::ipc::{IpcMemHandle, IpcRegion};
/// let region = IpcRegion { handle: IpcMemHandle([1; 64]), offset: 512, len: 100 };
/// assert_eq!(IpcRegion::from_bytes(&region.to_bytes())?, region);
/// assert_eq!(IpcRegion::from_hex(&region.to_hex())?, region);
/// # Ok::<(), cudars_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcRegion {
    /// The whole allocation's handle.
    pub handle: IpcMemHandle,
    /// Offset of the part from the start of the allocation, in bytes.
    pub offset: u64,
    /// Length of the part in bytes.
    pub len: u64,
}

impl IpcRegion {
    /// Handle, offset and length as [`IPC_REGION_BYTES`] bytes.
    pub fn to_bytes(&self) -> [u8; IPC_REGION_BYTES] {
        let mut out = [0u8; IPC_REGION_BYTES];
        out[..IPC_MEM_HANDLE_BYTES].copy_from_slice(&self.handle.0);
        out[IPC_MEM_HANDLE_BYTES..IPC_MEM_HANDLE_BYTES + 8]
            .copy_from_slice(&self.offset.to_le_bytes());
        out[IPC_MEM_HANDLE_BYTES + 8..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Parses [`to_bytes`](Self::to_bytes); another length is [`Error::InvalidArgument`].
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcRegion> {
        let bytes: [u8; IPC_REGION_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an IPC region is {IPC_REGION_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        let mut handle = [0u8; IPC_MEM_HANDLE_BYTES];
        handle.copy_from_slice(&bytes[..IPC_MEM_HANDLE_BYTES]);
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[IPC_MEM_HANDLE_BYTES..IPC_MEM_HANDLE_BYTES + 8]);
        let offset = u64::from_le_bytes(word);
        word.copy_from_slice(&bytes[IPC_MEM_HANDLE_BYTES + 8..]);
        let len = u64::from_le_bytes(word);
        Ok(IpcRegion {
            handle: IpcMemHandle(handle),
            offset,
            len,
        })
    }

    /// Lowercase hexadecimal of [`to_bytes`](Self::to_bytes) (160 characters).
    pub fn to_hex(&self) -> String {
        to_hex(&self.to_bytes())
    }

    /// Parses [`to_hex`](Self::to_hex).
    pub fn from_hex(text: &str) -> Result<IpcRegion> {
        IpcRegion::from_bytes(&from_hex::<IPC_REGION_BYTES>("an IPC region", text)?)
    }

    /// Opens the region in this process on `device`: the allocation is opened (or its open
    /// mapping shared, [`IpcMapping::open_shared`]) and the view covers exactly
    /// `offset..offset + len`. A region reaching past the allocation is
    /// [`Error::OutOfRange`], and the mapping is closed again.
    pub fn open(&self, device: &Device) -> Result<DevicePtr> {
        let mapping = IpcMapping::open_shared(device, &self.handle)?;
        let start = usize::try_from(self.offset).map_err(|_| Error::SizeOverflow("offset"))?;
        let len = usize::try_from(self.len).map_err(|_| Error::SizeOverflow("length"))?;
        let end = start
            .checked_add(len)
            .ok_or(Error::SizeOverflow("IPC region offset + length"))?;
        DevicePtr::from_arc(mapping).slice(start..end)
    }
}

// ---------------------------------------------------------------------------------------
// Legacy export
// ---------------------------------------------------------------------------------------

/// Handles this process exported: the driver refuses to open them here, and we say so
/// before asking it.
fn exported() -> MutexGuard<'static, HashSet<[u8; IPC_MEM_HANDLE_BYTES]>> {
    static EXPORTED: OnceLock<Mutex<HashSet<[u8; IPC_MEM_HANDLE_BYTES]>>> = OnceLock::new();
    EXPORTED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// `false` when the driver says `addr` has no legacy IPC handle
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`: virtual-memory and managed memory);
/// `true` when it says yes or cannot say (then `cuIpcGetMemHandle` decides).
fn legacy_ipc_capable(device: &Device, addr: CUdeviceptr) -> Result<bool> {
    let _ctx = device.bind()?;
    let mut value: u64 = 0;
    // SAFETY: the attribute is a boolean, written into the first bytes of an 8-byte,
    // zeroed, aligned out-value.
    let r = unsafe {
        drv!(cuPointerGetAttribute(
            (&mut value as *mut u64).cast(),
            cudars_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            addr
        ))
    };
    Ok(r.is_err() || value != 0)
}

/// `cuIpcGetMemHandle` of the allocation holding `addr` (its base must be a `cuMemAlloc`
/// allocation of `device`).
fn get_handle(device: &Device, addr: CUdeviceptr) -> Result<IpcMemHandle> {
    if !legacy_ipc_capable(device, addr)? {
        return Err(IpcError::NotExportable(
            "the driver reports no legacy IPC handle for this memory: only cuMemAlloc memory \
             has one (virtual-memory allocations export file descriptors instead)"
                .into(),
        )
        .into());
    }
    let mut raw = CUipcMemHandle {
        reserved: [0; IPC_MEM_HANDLE_BYTES],
    };
    let _ctx = device.bind()?;
    // SAFETY: valid out-pointer; the driver checks that `addr` is exportable device memory.
    match unsafe { drv!(cuIpcGetMemHandle(&mut raw, addr)) } {
        Ok(()) => {}
        Err(Error::Driver(d))
            if d.result() == CUresult::CUDA_ERROR_INVALID_VALUE
                || d.result() == CUresult::CUDA_ERROR_NOT_SUPPORTED =>
        {
            return Err(IpcError::NotExportable(format!(
                "the driver refused a legacy IPC handle ({}): only cuMemAlloc memory has one \
                 (virtual-memory allocations export file descriptors instead)",
                d.name
            ))
            .into())
        }
        Err(e) => return Err(e),
    }
    let handle = IpcMemHandle(raw.reserved.map(|b| b as u8));
    exported().insert(handle.0);
    Ok(handle)
}

impl DeviceMemory {
    /// The legacy IPC handle of this allocation (`cuIpcGetMemHandle`; CuPy's
    /// `runtime.ipcGetMemHandle`). Another process opens it with [`IpcMapping::open`]; the
    /// memory must stay allocated here while it is open there. An empty allocation is
    /// [`IpcError::NotExportable`].
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        if self.is_empty() {
            return Err(IpcError::NotExportable("an empty allocation".into()).into());
        }
        get_handle(&self.device(), self.as_raw())
    }
}

/// The base address and size of the allocation holding `addr` (`cuMemGetAddressRange`).
pub fn address_range(device: &Device, addr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    let _ctx = device.bind()?;
    // SAFETY: valid out-pointers; the driver checks the address.
    unsafe { drv!(cuMemGetAddressRange(&mut base, &mut size, addr)) }?;
    Ok((base, size))
}

/// Exports the memory `view` covers, which must lie inside one `cuMemAlloc` allocation
/// (plain device memory, a block of a pool made of `cuMemAlloc` segments): the allocation's
/// handle plus the view's offset and length in it. The allocation must stay alive while the
/// region is open elsewhere (the importer can reach all of the allocation through the
/// driver, but the [`IpcRegion::open`] view covers only the region). An empty view, or
/// virtual-memory memory, is [`IpcError::NotExportable`]. A reused pool block is exported only
/// once its earlier owner's work is done ([`DevicePtr::prepare_synchronous_use`]).
pub fn export_view(view: &DevicePtr) -> Result<IpcRegion> {
    if view.is_empty() {
        return Err(IpcError::NotExportable("an empty view".into()).into());
    }
    // The importer uses the memory in another process, ordered by nothing of ours: a reused
    // pool block's earlier owner must be done first (the ordering rule; one host wait).
    view.prepare_synchronous_use()?;
    let device = view.device();
    if !legacy_ipc_capable(&device, view.as_raw())? {
        return Err(IpcError::NotExportable(
            "the view is not cuMemAlloc memory (the driver reports no legacy IPC handle for \
             it; virtual-memory pool segments cannot export this way)"
                .into(),
        )
        .into());
    }
    let (base, _size) = address_range(&device, view.as_raw())?;
    let handle = get_handle(&device, base)?;
    Ok(IpcRegion {
        handle,
        offset: view.as_raw() - base,
        len: view.len() as u64,
    })
}

// ---------------------------------------------------------------------------------------
// Legacy import
// ---------------------------------------------------------------------------------------

type OpenRegistry = HashMap<[u8; IPC_MEM_HANDLE_BYTES], Weak<IpcMapping>>;

/// Handles open in this process. The lock is held across open and close, so a handle is
/// never opened while its previous mapping is being closed.
fn open_registry() -> MutexGuard<'static, OpenRegistry> {
    static OPEN: OnceLock<Mutex<OpenRegistry>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Memory of another process mapped into this one (`cuIpcOpenMemHandle` with
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`), closed on drop (`cuIpcCloseMemHandle`, after
/// synchronising the device). Implements [`DeviceAlloc`]: `DevicePtr::from_arc(mapping)` is
/// a view of the whole allocation.
///
/// `Send` and `Sync`: an address range that every access reaches through the driver.
pub struct IpcMapping {
    ptr: CUdeviceptr,
    size: usize,
    device: Device,
    handle: IpcMemHandle,
    /// Work of other devices' streams on the mapping, waited for before it is closed.
    cross: CrossDeviceUses,
}

impl IpcMapping {
    /// Opens `handle` on `device`. Errors ([`Error::Ipc`]): [`IpcError::SameProcess`] for a
    /// handle this process exported, [`IpcError::AlreadyOpen`] when it is open here already,
    /// [`IpcError::InvalidHandle`] when the driver refuses it (corrupted, or stale),
    /// [`IpcError::PeerAccess`] when `device` cannot reach the memory's device. Nothing is
    /// left open on error.
    pub fn open(device: &Device, handle: &IpcMemHandle) -> Result<Arc<IpcMapping>> {
        let mut registry = open_registry();
        if registry
            .get(&handle.0)
            .is_some_and(|w| w.strong_count() > 0)
        {
            return Err(IpcError::AlreadyOpen.into());
        }
        Self::open_locked(&mut registry, device, handle)
    }

    /// As [`open`](Self::open), but a handle already open in this process gives the same
    /// mapping (shared: closed when the last user drops it). This is how two blocks of one
    /// exported pool segment are imported. A mapping open on another device is
    /// [`Error::WrongDevice`].
    pub fn open_shared(device: &Device, handle: &IpcMemHandle) -> Result<Arc<IpcMapping>> {
        let mut registry = open_registry();
        if let Some(existing) = registry.get(&handle.0).and_then(Weak::upgrade) {
            if existing.device != *device {
                return Err(Error::WrongDevice {
                    what: "open IPC mapping",
                    expected: device.ordinal(),
                    actual: existing.device.ordinal(),
                });
            }
            return Ok(existing);
        }
        Self::open_locked(&mut registry, device, handle)
    }

    fn open_locked(
        registry: &mut OpenRegistry,
        device: &Device,
        handle: &IpcMemHandle,
    ) -> Result<Arc<IpcMapping>> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        if exported().contains(&handle.0) {
            return Err(IpcError::SameProcess { driver: None }.into());
        }
        let _ctx = device.bind()?;
        let mut ptr: CUdeviceptr = 0;
        let flags = CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.0;
        // SAFETY: the device's context is current; valid out-pointer; the handle is plain
        // bytes the driver validates.
        let opened = unsafe { drv!(cuIpcOpenMemHandle(&mut ptr, handle.to_raw(), flags)) };
        if let Err(e) = opened {
            return Err(classify_open_error(e));
        }
        let size = match address_range(device, ptr) {
            Ok((_, size)) => size,
            Err(e) => {
                // SAFETY: opened just above; nothing uses it yet.
                let _ = unsafe { drv!(cuIpcCloseMemHandle(ptr)) };
                return Err(e);
            }
        };
        let mapping = Arc::new(IpcMapping {
            ptr,
            size,
            device: *device,
            handle: *handle,
            cross: CrossDeviceUses::default(),
        });
        registry.retain(|_, w| w.strong_count() > 0);
        registry.insert(handle.0, Arc::downgrade(&mapping));
        Ok(mapping)
    }

    /// The importing device (whose context mapped the memory).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The mapped address in this process.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size of the whole exported allocation, in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The handle it was opened from.
    pub fn handle(&self) -> IpcMemHandle {
        self.handle
    }
}

/// The typed error for a failed `cuIpcOpenMemHandle`.
fn classify_open_error(e: Error) -> Error {
    let Error::Driver(d) = e else { return e };
    let r = d.result();
    let ipc = if r == CUresult::CUDA_ERROR_INVALID_CONTEXT {
        IpcError::SameProcess { driver: Some(d) }
    } else if r == CUresult::CUDA_ERROR_ALREADY_MAPPED {
        IpcError::AlreadyOpen
    } else if r == CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
        || r == CUresult::CUDA_ERROR_TOO_MANY_PEERS
    {
        IpcError::PeerAccess { driver: d }
    } else if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY
        || r == CUresult::CUDA_ERROR_NOT_INITIALIZED
        || r == CUresult::CUDA_ERROR_DEINITIALIZED
    {
        return Error::Driver(d);
    } else {
        // INVALID_VALUE, INVALID_HANDLE, MAP_FAILED, ...: the handle is the only input.
        IpcError::InvalidHandle { driver: d }
    };
    Error::Ipc(ipc)
}

impl fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMapping")
            .field("device", &self.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("cross_device_uses", &self.cross.len())
            .finish()
    }
}

/// How the wait before releasing a mapping went ([`wait_before_release`]).
enum ReleaseWait {
    /// No work uses the mapping any more.
    Done,
    /// A capture that foreign code runs refused the device synchronisation (and was
    /// invalidated by it): try again at `release::release_deferred`, or when a capture of this
    /// crate ends, never by polling, which would invalidate that capture again at each try.
    Retry,
    /// A wait failed for good (a device fault): work may still use the mapping.
    Failed,
}

/// Waits for the work that other devices' streams queued on a mapping (noted in `cross`:
/// synchronising `device` does not cover it), then for all of `device`'s work: what
/// `cuIpcCloseMemHandle` and `cuMemUnmap` need first, since neither is stream-ordered.
fn wait_before_release(device: &Device, cross: &CrossDeviceUses) -> ReleaseWait {
    if !cross.wait_all() {
        return ReleaseWait::Failed;
    }
    match device.synchronize() {
        Ok(()) => ReleaseWait::Done,
        Err(e) if crate::release::retry_may_succeed(&e) => ReleaseWait::Retry,
        Err(_) => ReleaseWait::Failed,
    }
}

impl IpcMapping {
    /// This mapping's handle, moved into a value the release thread closes later; `self`
    /// is left empty (its drop does nothing).
    fn moved_out(&mut self) -> IpcMapping {
        IpcMapping {
            ptr: std::mem::take(&mut self.ptr),
            size: self.size,
            device: self.device,
            handle: self.handle,
            cross: std::mem::take(&mut self.cross),
        }
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // `cuIpcCloseMemHandle` is not stream-ordered: the device must be synchronised first,
        // which is forbidden inside a host function and fails (and invalidates the capture)
        // while a capture runs. Then the close is deferred, never made without the wait.
        let Some(_gate) = crate::release::gate_or_defer(|| Box::new(self.moved_out())) else {
            return;
        };
        let mut registry = open_registry();
        let ctx = self.device.bind();
        match ctx
            .as_ref()
            .map(|_| wait_before_release(&self.device, &self.cross))
        {
            Ok(ReleaseWait::Done) => {
                // SAFETY: we opened this mapping and this is its last user; the device is
                // idle and other devices' uses are done, so no work uses it.
                let _ = unsafe { drv!(cuIpcCloseMemHandle(self.ptr)) };
            }
            Ok(ReleaseWait::Retry) => {
                let moved = self.moved_out();
                registry.retain(|_, w| w.strong_count() > 0);
                drop(registry);
                crate::release::defer(Box::new(moved), crate::release::When::Parked);
                return;
            }
            // A wait failed (or the context cannot be made current): work may still use
            // the mapping, which stays open (leaked), never closed under it.
            Ok(ReleaseWait::Failed) | Err(_) => crate::release::note_leak(),
        }
        drop(ctx);
        registry.retain(|_, w| w.strong_count() > 0);
    }
}

// SAFETY: `ptr..ptr + size` is the whole opened allocation, mapped in `device`'s context and
// readable and writable by it until Drop closes it; the fields never change; no host
// reference aliases device memory. Drop waits for the uses by other devices' streams that
// `record_stream` noted, then synchronises the device before closing, so work queued on
// any stream that uses the mapping finishes first.
unsafe impl DeviceAlloc for IpcMapping {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    /// A stream of the importing device: nothing, `Drop` synchronises that device before it
    /// closes the mapping. A stream of another device (a peer copy queued there) is noted
    /// (as for [`DeviceMemory`]), and `Drop` first waits for the work queued on it by then,
    /// since synchronising the importing device does not wait for other devices. Nothing
    /// while `stream` is captured (the graph's launches note their own use).
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.cross.record(self.device, stream)
    }
}

// ---------------------------------------------------------------------------------------
// Virtual-memory shareable handles
// ---------------------------------------------------------------------------------------

const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

impl PhysicalAllocation {
    /// Exports the allocation as a POSIX file descriptor (`cuMemExportToShareableHandle`),
    /// to send to another process ([`send_fd`]). Only allocations made with
    /// [`PhysicalAllocation::new_shareable`] can: others are [`IpcError::NotExportable`].
    /// The descriptor keeps the memory alive until every process closed it and released
    /// its imports.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        let _ctx = self.device().bind()?;
        // SAFETY: for the POSIX handle type the driver writes an int to the out-pointer;
        // the allocation handle is live; flags must be 0.
        let r = unsafe {
            drv!(cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.raw(),
                POSIX_FD,
                0
            ))
        };
        match r {
            Ok(()) if fd >= 0 => {
                // SAFETY: the driver created this descriptor for us; nobody else owns it.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            }
            Ok(()) => Err(IpcError::Protocol("the driver returned no descriptor".into()).into()),
            Err(Error::Driver(d))
                if d.result() == CUresult::CUDA_ERROR_INVALID_VALUE
                    || d.result() == CUresult::CUDA_ERROR_NOT_SUPPORTED
                    || d.result() == CUresult::CUDA_ERROR_NOT_PERMITTED =>
            {
                Err(IpcError::NotExportable(format!(
                    "{}: the allocation was not created with a POSIX file-descriptor handle \
                     type (use PhysicalAllocation::new_shareable)",
                    d.name
                ))
                .into())
            }
            Err(e) => Err(e),
        }
    }

    /// Imports memory another process exported with [`export_fd`](Self::export_fd)
    /// (`cuMemImportFromShareableHandle`). `size` is the exported allocation's size (the
    /// descriptor does not carry it: send it along, as [`send_fd`]'s payload does).
    /// `device`'s context makes the call; the allocation's device is the memory's own (from
    /// the handle's properties). A descriptor that is not a CUDA allocation is
    /// [`IpcError::InvalidHandle`].
    pub fn import_fd(
        device: &Device,
        fd: BorrowedFd<'_>,
        size: usize,
    ) -> Result<PhysicalAllocation> {
        if size == 0 {
            return Err(Error::InvalidArgument(
                "an imported allocation of 0 bytes".into(),
            ));
        }
        let _ctx = device.bind()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: for the POSIX type the driver takes the descriptor's value as the pointer
        // argument; valid out-pointer; the driver validates the descriptor.
        let r = unsafe {
            drv!(cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut std::ffi::c_void,
                POSIX_FD
            ))
        };
        if let Err(e) = r {
            return Err(match e {
                Error::Driver(d) => IpcError::InvalidHandle { driver: d }.into(),
                e => e,
            });
        }
        let mut prop = MaybeUninit::<CUmemAllocationProp>::zeroed();
        // SAFETY: a live handle; valid out-pointer to a zeroed property struct.
        let props = unsafe {
            drv!(cuMemGetAllocationPropertiesFromHandle(
                prop.as_mut_ptr(),
                handle
            ))
        };
        let device = match props {
            Ok(()) => {
                // SAFETY: the driver filled the struct; zeroed is a valid value of it anyway,
                // and `location.id` is initialised either way.
                let id =
                    unsafe { cudars_sys::compat::mem_location_id(&prop.assume_init().location) };
                Device::new(id.max(0) as usize)
            }
            Err(e) => Err(e),
        };
        match device {
            // SAFETY: a live handle we own from the import, of the device its properties
            // name; `size` is the caller's statement of its size (the driver checks maps).
            Ok(device) => Ok(unsafe { PhysicalAllocation::from_raw(device, handle, size) }),
            Err(e) => {
                // SAFETY: we own the imported handle and nothing maps it.
                let _ = unsafe { drv!(cuMemRelease(handle)) };
                Err(e)
            }
        }
    }
}

/// A [`PhysicalAllocation`] mapped at a reserved address range with read-write access for
/// one device: what an exporter writes through and an importer reads through. Unmapped on
/// drop (after synchronising the device), then the range is freed and the physical memory
/// released. Implements [`DeviceAlloc`], so `DevicePtr::from_arc(Arc::new(mapping))`, or
/// [`SharedMapping::into_ptr`], is a view of it.
///
/// `Send` and `Sync`: driver handles and an address range.
///
/// ```no_run
/// use std::os::unix::net::UnixStream;
/// use cudars_core::ipc::{self, SharedMapping};
/// use cudars_core::vmm::PhysicalAllocation;
/// use cudars_core::Device;
///
/// let dev = Device::new(0)?;
/// let (here, there) = UnixStream::pair().map_err(cudars_core::ipc::IpcError::from)?;
/// // exporter
/// let mapping = SharedMapping::new(&dev, 1 << 20)?;
/// ipc::send_fd(&here, mapping.physical().export_fd()?.as_fd(), mapping.size() as u64)?;
/// // importer (normally another process, `there` passed to it)
/// let (fd, size) = ipc::recv_fd(&there)?;
/// let physical = PhysicalAllocation::import_fd(&dev, fd.as_fd(), size as usize)?;
/// let imported = SharedMapping::map(&dev, physical)?.into_ptr();
/// # use std::os::fd::AsFd;
/// # Ok::<(), cudars_core::Error>(())
/// ```
pub struct SharedMapping {
    /// Dropped by hand in `Drop` (after the unmap), or leaked.
    range: ManuallyDrop<VirtualRange>,
    /// Dropped by hand in `Drop` (after the range), or leaked.
    physical: ManuallyDrop<PhysicalAllocation>,
    device: Device,
    /// Work of other devices' streams on the mapping, waited for before it is unmapped.
    cross: CrossDeviceUses,
    /// The fields were moved into a value the release thread drops (see `Drop`).
    moved: bool,
}

impl SharedMapping {
    /// Creates shareable memory ([`PhysicalAllocation::new_shareable`]) of at least `size`
    /// bytes on `device` (rounded up to the granularity) and maps it for `device`.
    pub fn new(device: &Device, size: usize) -> Result<SharedMapping> {
        if size == 0 {
            return Err(Error::InvalidArgument("a shared mapping of 0 bytes".into()));
        }
        let page = vmm::granularity(device, Granularity::Minimum)?.max(1);
        let rounded = size
            .div_ceil(page)
            .checked_mul(page)
            .ok_or(Error::SizeOverflow("shared mapping size"))?;
        let physical = PhysicalAllocation::new_shareable(device, rounded)?;
        SharedMapping::map(device, physical)
    }

    /// Maps `physical` (local, or imported with [`PhysicalAllocation::import_fd`]) at a new
    /// address range, readable and writable by `device`. Memory of another device needs
    /// peer access from `device` ([`IpcError::WrongDevice`] otherwise).
    pub fn map(device: &Device, physical: PhysicalAllocation) -> Result<SharedMapping> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let memory = physical.device();
        if memory != *device && !device.can_access_peer(&memory)? {
            return Err(IpcError::WrongDevice {
                memory: memory.ordinal(),
                requested: device.ordinal(),
            }
            .into());
        }
        let range = VirtualRange::reserve(&memory, physical.size(), 0)?;
        range.map(0, &physical)?;
        if let Err(e) = range.set_access(0, physical.size(), device) {
            // SAFETY: mapped just above; nothing uses it yet.
            let _ = unsafe { range.unmap(0, physical.size()) };
            return Err(e);
        }
        Ok(SharedMapping {
            range: ManuallyDrop::new(range),
            physical: ManuallyDrop::new(physical),
            device: *device,
            cross: CrossDeviceUses::default(),
            moved: false,
        })
    }

    /// Grants `peer` read-write access too (`cuMemSetAccess`), e.g. a second GPU of this
    /// process.
    pub fn grant_access(&self, peer: &Device) -> Result<()> {
        self.range.set_access(0, self.physical.size(), peer)
    }

    /// The physical memory (to [`export_fd`](PhysicalAllocation::export_fd) it).
    pub fn physical(&self) -> &PhysicalAllocation {
        &self.physical
    }

    /// The device the mapping was made for.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The first mapped address.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.range.base()
    }

    /// Size in bytes (the physical allocation's, a multiple of the granularity).
    pub fn size(&self) -> usize {
        self.physical.size()
    }

    /// A [`DevicePtr`] view of the whole mapping, which now owns it.
    pub fn into_ptr(self) -> DevicePtr {
        DevicePtr::new(self)
    }
}

impl fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMapping")
            .field("device", &self.device.ordinal())
            .field("range", &*self.range)
            .field("physical", &*self.physical)
            .field("cross_device_uses", &self.cross.len())
            .finish()
    }
}

impl SharedMapping {
    /// The mapping moved into a value the release thread unmaps later; `self` is left
    /// marked as moved (its drop does nothing).
    fn moved_out(&mut self) -> SharedMapping {
        self.moved = true;
        SharedMapping {
            // SAFETY: each field is taken once: `moved` makes this value's drop skip them.
            range: ManuallyDrop::new(unsafe { ManuallyDrop::take(&mut self.range) }),
            // SAFETY: as above.
            physical: ManuallyDrop::new(unsafe { ManuallyDrop::take(&mut self.physical) }),
            device: self.device,
            cross: std::mem::take(&mut self.cross),
            moved: false,
        }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        if self.moved {
            return;
        }
        // `cuMemUnmap` is not stream-ordered: the device must be synchronised first, which
        // is forbidden inside a host function and fails (invalidating the capture) while a
        // capture runs. Then the unmap is deferred, never made without the wait.
        let Some(_gate) = crate::release::gate_or_defer(|| Box::new(self.moved_out())) else {
            return;
        };
        match wait_before_release(&self.device, &self.cross) {
            ReleaseWait::Done => {}
            ReleaseWait::Retry => {
                let moved = self.moved_out();
                crate::release::defer(Box::new(moved), crate::release::When::Parked);
                return;
            }
            // Work may still use the memory: everything is leaked, never unmapped under it.
            ReleaseWait::Failed => {
                crate::release::note_leak();
                return;
            }
        }
        // SAFETY: the mapping is ours, made in `map`; the device is idle and other devices'
        // uses are done, and no view of it outlives this value (views own it through an
        // Arc).
        let _ = unsafe { self.range.unmap(0, self.physical.size()) };
        // SAFETY: neither field is used again; the range goes first, then the physical
        // memory (the order of the fields before they were wrapped).
        unsafe {
            ManuallyDrop::drop(&mut self.range);
            ManuallyDrop::drop(&mut self.physical);
        }
    }
}

// SAFETY: the range is mapped to `physical` with read-write access for `device` from `map`
// until Drop; the fields never change; Drop waits for the uses by other devices' streams
// that `record_stream` noted, then synchronises the device before unmapping.
unsafe impl DeviceAlloc for SharedMapping {
    fn device(&self) -> Device {
        self.device
    }
    fn as_raw(&self) -> CUdeviceptr {
        self.range.base()
    }
    fn size(&self) -> usize {
        self.physical.size()
    }
    /// A stream of the mapping's device: nothing, `Drop` synchronises that device before it
    /// unmaps. A stream of another device (one granted access with
    /// [`grant_access`](SharedMapping::grant_access)) is noted (as for [`DeviceMemory`]), and
    /// `Drop` first waits for the work queued on it by then, since synchronising the
    /// mapping's device does not wait for other devices. Nothing while `stream` is captured
    /// (the graph's launches note their own use).
    fn record_stream(&self, stream: &Stream) -> Result<()> {
        self.cross.record(self.device, stream)
    }
}

// ---------------------------------------------------------------------------------------
// Passing descriptors
// ---------------------------------------------------------------------------------------

/// Sends `fd` and an 8-byte payload (a size, say) over a Unix stream socket (`sendmsg` with
/// `SCM_RIGHTS`). The receiver gets its own descriptor for the same object ([`recv_fd`]).
pub fn send_fd(socket: &UnixStream, fd: BorrowedFd<'_>, payload: u64) -> Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
        return Err(IpcError::Protocol("control buffer too small".into()).into());
    }
    let bytes = payload.to_le_bytes();
    let sent = rustix::net::sendmsg(
        socket.as_fd(),
        &[IoSlice::new(&bytes)],
        &mut control,
        rustix::net::SendFlags::empty(),
    )
    .map_err(IpcError::from)?;
    if sent != bytes.len() {
        return Err(IpcError::Protocol(format!("sent {sent} of 8 bytes")).into());
    }
    Ok(())
}

/// Receives what [`send_fd`] sent: the descriptor (close-on-exec) and the payload. A message
/// without a descriptor, or a closed socket, is an [`IpcError`].
pub fn recv_fd(socket: &UnixStream) -> Result<(OwnedFd, u64)> {
    let mut bytes = [0u8; 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket.as_fd(),
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        rustix::net::RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(IpcError::from)?;
    let mut fd = None;
    for msg in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                // Keep the first; any others close as they drop.
                if fd.is_none() {
                    fd = Some(f);
                }
            }
        }
    }
    let fd = fd.ok_or_else(|| {
        IpcError::Protocol(if got.bytes == 0 {
            "the peer closed the socket".into()
        } else {
            "a message without a file descriptor".into()
        })
    })?;
    if got.bytes != bytes.len() {
        return Err(IpcError::Protocol(format!("received {} of 8 bytes", got.bytes)).into());
    }
    Ok((fd, u64::from_le_bytes(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DriverError;

    #[test]
    fn mem_handle_round_trips() {
        let mut bytes = [0u8; 64];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 11 + 3) as u8;
        }
        let h = IpcMemHandle::from_bytes(&bytes).unwrap();
        assert_eq!(h.to_bytes(), bytes);
        assert_eq!(IpcMemHandle::from_hex(&h.to_hex()).unwrap(), h);
        assert_eq!(
            IpcMemHandle::from_hex(&h.to_hex().to_uppercase()).unwrap(),
            h
        );
        assert!(IpcMemHandle::from_bytes(&[0; 63]).is_err());
        assert!(IpcMemHandle::from_hex("abc").is_err());
        let mut bad = "0".repeat(128);
        bad.replace_range(0..1, "x");
        assert!(IpcMemHandle::from_hex(&bad).is_err());
    }

    #[test]
    fn region_round_trips() {
        let r = IpcRegion {
            handle: IpcMemHandle([0xab; 64]),
            offset: 0x1234_5678_9abc,
            len: 7,
        };
        assert_eq!(IpcRegion::from_bytes(&r.to_bytes()).unwrap(), r);
        assert_eq!(r.to_hex().len(), 2 * IPC_REGION_BYTES);
        assert_eq!(IpcRegion::from_hex(&r.to_hex()).unwrap(), r);
        assert!(IpcRegion::from_bytes(&[0; 64]).is_err());
    }

    #[test]
    fn descriptors_pass_over_a_socket() {
        use std::io::Write;
        let (a, b) = UnixStream::pair().unwrap();
        let path = std::env::temp_dir().join(format!("cuda-core-ipc-{}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(b"hello").unwrap();
        send_fd(&a, file.as_fd(), 42).unwrap();
        let (fd, payload) = recv_fd(&b).unwrap();
        assert_eq!(payload, 42);
        // The received descriptor is the same open file: it shares the file offset.
        let mut received = std::fs::File::from(fd);
        received.write_all(b"!").unwrap();
        drop((received, file));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello!");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn recv_without_descriptor_is_a_protocol_error() {
        use std::io::Write;
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[0u8; 8]).unwrap();
        let err = recv_fd(&b).unwrap_err();
        assert!(matches!(err, Error::Ipc(IpcError::Protocol(_))), "{err}");
        drop(a);
        let err = recv_fd(&b).unwrap_err();
        assert!(matches!(err, Error::Ipc(IpcError::Protocol(_))), "{err}");
    }

    #[test]
    fn open_errors_are_classified() {
        let d = |r| {
            Error::Driver(DriverError {
                code: CUresult(r).0,
                name: "X",
                message: "y",
                call: "cuIpcOpenMemHandle",
            })
        };
        assert!(matches!(
            classify_open_error(d(CUresult::CUDA_ERROR_INVALID_CONTEXT.0)),
            Error::Ipc(IpcError::SameProcess { driver: Some(_) })
        ));
        assert!(matches!(
            classify_open_error(d(CUresult::CUDA_ERROR_INVALID_VALUE.0)),
            Error::Ipc(IpcError::InvalidHandle { .. })
        ));
        assert!(matches!(
            classify_open_error(d(CUresult::CUDA_ERROR_ALREADY_MAPPED.0)),
            Error::Ipc(IpcError::AlreadyOpen)
        ));
        assert!(matches!(
            classify_open_error(d(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED.0)),
            Error::Ipc(IpcError::PeerAccess { .. })
        ));
        assert!(classify_open_error(d(CUresult::CUDA_ERROR_OUT_OF_MEMORY.0)).is_out_of_memory());
    }
}
