//! Sharing pool blocks with other processes (CUDA legacy IPC).
//!
//! Two kinds of pools export blocks:
//!
//! | pool | segments | a block travels as | importer |
//! | --- | --- | --- | --- |
//! | [`DevicePool::new_ipc`] | plain `cuMemAlloc` (legacy IPC handles) | [`IpcRegion`]: the segment's handle, the block's offset and length ([`DevicePool::malloc_ipc`], [`DevicePool::export_block`]) | [`import_block`] |
//! | [`DevicePool::new_shareable`] | virtual memory made whole per segment with a POSIX file descriptor handle ([`ShareableSegments`]) | the segment's file descriptor (`cuMemExportToShareableHandle`, sent with `cudars_core::ipc::send_fd`) and an [`FdRegion`] ([`DevicePool::malloc_fd`], [`DevicePool::export_block_fd`]) | [`import_block_fd`] |
//!
//! The default pool's virtual-memory segments (many 2 MiB pages, which are not shareable)
//! cannot export blocks and say so with [`PoolError::NotExportable`].
//!
//! Both kinds share the block's whole segment: the importer maps all of it (the legacy
//! handle opens the whole `cuMemAlloc` allocation, the descriptor the whole physical
//! memory), so it can reach the segment's other blocks, now and after the release. Export
//! only to processes you trust with the pool's memory, as with CUDA IPC itself.
//!
//! Both kinds follow the same rules below ([`ExportedBlock`] for the legacy kind,
//! [`ExportedFdBlock`] for the other).
//!
//! # Who keeps the block
//!
//! [`DevicePool::malloc_ipc`] returns an [`ExportedBlock`], which owns the block: while it
//! lives, and after it is dropped without a release, the pool never hands the block's
//! memory to another allocation. The exporter cannot see the importer's work, so only
//! the importer's word lets the block go back to the pool, in one of two ways:
//!
//! * [`ExportedBlock::release_after`] (safe): the importer records an interprocess event
//!   after its last use and sends its handle; the exporter opens it
//!   ([`Event::open_ipc`]), its stream waits on that event, and the block's reuse is
//!   ordered after it (the block stays out of reuse until the importer's work is done,
//!   without the exporter's host waiting). An event that is not interprocess is refused.
//! * [`ExportedBlock::release`] (`unsafe`): the caller asserts that the importer has
//!   finished its work on the memory and will issue no more (it said so out of band).
//!
//! Dropping an [`ExportedBlock`] without either keeps the block out of reuse for good: it is
//! leaked, with a reference to its pool (which is then never dropped), since nothing says
//! the importer is done. So is a block whose `release_after` fails.
//!
//! What no type can check: another process holding the handle can write the memory
//! whenever its mapping is open. The pool's promise is that it lends the block to no other
//! allocation before the importer's event (or the caller's `unsafe` assertion); an importer
//! that records its event and then keeps writing breaks the protocol, as any process that
//! writes memory shared with it does.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cudars_core::{Device, Event, Stream};
//! use cudars_mempool::{ipc, DevicePool};
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let pool = Arc::new(DevicePool::new_ipc()?);
//! let block = pool.malloc_ipc(&stream, 1 << 20)?;
//! block.view().memset_async(7, &stream)?;
//! let text = block.region().to_hex(); // send to the importer, with an event handle
//! // importer, in another process:
//! //   let view = ipc::import_block(&dev, &cudars_core::ipc::IpcRegion::from_hex(&text)?)?;
//! // ... and when it is done it records an interprocess event `done` and sends its handle:
//! # let done = Event::builder(&dev).interprocess(true).build()?;
//! block.release_after(&stream, &done)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::ipc::{self as core_ipc, IpcRegion, SharedMapping};
use cudars_core::memory::DevicePtr;
use cudars_core::vmm::PhysicalAllocation;
use cudars_core::{Device, Event, Stream};

use crate::driver::{device_id, DevicePool, DriverBackend, ExportedSegment, SegmentSource};
use crate::error::PoolError;
use crate::pool::{MemoryPool, PoolConfig};

impl MemoryPool<DriverBackend> {
    /// A pool over every device whose blocks can be exported to other processes
    /// ([`malloc_ipc`](Self::malloc_ipc)): plain `cuMemAlloc` segments
    /// (`PoolConfig { virtual_memory: false, .. }`), the limit from the environment.
    pub fn new_ipc() -> Result<DevicePool, PoolError> {
        let backend = DriverBackend::new().map_err(PoolError::Cuda)?;
        let config = PoolConfig {
            virtual_memory: false,
            ..PoolConfig::from_env()?
        };
        MemoryPool::with_config(backend, config)
    }

    /// Whether blocks of `device` can be exported ([`export_block`](Self::export_block)):
    /// `true` when its segments are plain `cuMemAlloc` memory (not a [`SegmentSource`]'s).
    pub fn can_export(&self, device: &Device) -> Result<bool, PoolError> {
        Ok(!self.uses_virtual_memory(device_id(device))? && !self.backend().has_segment_source())
    }

    /// Allocates `size` bytes on `stream` and exports the block: the [`ExportedBlock`] owns
    /// it until released (see the [module documentation](self)). A pool with
    /// virtual-memory segments is [`PoolError::NotExportable`] (make it with
    /// [`new_ipc`](Self::new_ipc)); size 0 too (nothing to share).
    #[track_caller]
    pub fn malloc_ipc(
        self: &Arc<Self>,
        stream: &Stream,
        size: usize,
    ) -> Result<ExportedBlock, PoolError> {
        self.check_exportable(&stream.device(), size)?;
        let view: DevicePtr = self.malloc_shared(stream, size)?.into();
        export_view(view, stream)
    }

    /// Exports a block this pool allocated (a view of a [`PoolMemory`](crate::PoolMemory),
    /// made on `stream`), as [`malloc_ipc`](Self::malloc_ipc). The [`ExportedBlock`] takes
    /// the view; other clones of it keep the block alive too.
    pub fn export_block(
        &self,
        view: DevicePtr,
        stream: &Stream,
    ) -> Result<ExportedBlock, PoolError> {
        self.check_exportable(&view.device(), view.len())?;
        export_view(view, stream)
    }

    /// A pool over every device whose blocks can be exported as file descriptors
    /// ([`malloc_fd`](Self::malloc_fd)): each plain segment is shareable virtual memory
    /// ([`ShareableSegments`]), the limit and the rest from the environment.
    pub fn new_shareable() -> Result<DevicePool, PoolError> {
        DevicePool::with_segments(Arc::new(ShareableSegments::new()))
    }

    /// Allocates `size` bytes on `stream` and exports the block as its segment's file
    /// descriptor: the [`ExportedFdBlock`] owns it until released (the rules of
    /// [`ExportedBlock`]). A pool whose segments cannot be shared (not made with
    /// [`new_shareable`](Self::new_shareable)) is [`PoolError::NotExportable`]; size 0 too.
    #[track_caller]
    pub fn malloc_fd(
        self: &Arc<Self>,
        stream: &Stream,
        size: usize,
    ) -> Result<ExportedFdBlock, PoolError> {
        if size == 0 {
            return Err(PoolError::NotExportable {
                reason: "an empty block has no memory to share".into(),
            });
        }
        let view: DevicePtr = self.malloc_shared(stream, size)?.into();
        self.export_block_fd(view, stream)
    }

    /// Exports a block of this pool (a view of a [`PoolMemory`](crate::PoolMemory), made on
    /// `stream`) as its segment's file descriptor, as [`malloc_fd`](Self::malloc_fd).
    pub fn export_block_fd(
        &self,
        view: DevicePtr,
        stream: &Stream,
    ) -> Result<ExportedFdBlock, PoolError> {
        if view.is_empty() {
            return Err(PoolError::NotExportable {
                reason: "an empty block has no memory to share".into(),
            });
        }
        // As the legacy path: the host waits until no earlier owner's work can touch the
        // block (a reused block), since the importer's work is ordered after nothing here.
        view.prepare_synchronous_use().map_err(PoolError::Cuda)?;
        let Some(seg) = self
            .backend()
            .export_segment_fd(view.as_raw())
            .map_err(PoolError::Cuda)?
        else {
            return Err(PoolError::NotExportable {
                reason: format!(
                    "no shareable segment of this pool holds {:#x}: build the pool with \
                     DevicePool::new_shareable()",
                    view.as_raw()
                ),
            });
        };
        let offset = view.as_raw().checked_sub(seg.base);
        let fits = offset
            .and_then(|o| o.checked_add(view.len() as u64))
            .is_some_and(|end| end <= seg.size as u64);
        let (Some(offset), true) = (offset, fits) else {
            return Err(PoolError::NotExportable {
                reason: "the view does not lie in the segment its source names".into(),
            });
        };
        Ok(ExportedBlock {
            region: FdHandle {
                region: FdRegion {
                    segment_size: seg.size as u64,
                    offset,
                    len: view.len() as u64,
                },
                fd: seg.fd,
            },
            view,
            stream: stream.clone(),
            released: false,
        })
    }

    fn check_exportable(&self, device: &Device, size: usize) -> Result<(), PoolError> {
        if size == 0 {
            return Err(PoolError::NotExportable {
                reason: "an empty block has no memory to share".into(),
            });
        }
        if !self.can_export(device)? {
            return Err(PoolError::NotExportable {
                reason: format!(
                    "device {} uses virtual-memory segments, which have no legacy IPC handle: \
                     build the pool with DevicePool::new_ipc()",
                    device.ordinal()
                ),
            });
        }
        Ok(())
    }
}

fn export_view(view: DevicePtr, stream: &Stream) -> Result<ExportedBlock, PoolError> {
    let region = core_ipc::export_view(&view).map_err(|e| match e {
        cudars_core::Error::Ipc(core_ipc::IpcError::NotExportable(reason)) => {
            PoolError::NotExportable { reason }
        }
        e => PoolError::Cuda(e),
    })?;
    Ok(ExportedBlock {
        view,
        region,
        stream: stream.clone(),
        released: false,
    })
}

/// A pool block exported to other processes: owns the block, which the pool does not reuse
/// while this value lives. Release it with [`release_after`](Self::release_after) or
/// [`release`](Self::release) once the importer is done; dropping it without a release
/// leaks the block (it never returns to the pool), see the [module documentation](self).
/// `R` is what the importer needs: an [`IpcRegion`] (legacy IPC), or for
/// [`ExportedFdBlock`] the segment's file descriptor and an [`FdRegion`].
#[derive(Debug)]
pub struct ExportedBlock<R = IpcRegion> {
    view: DevicePtr,
    region: R,
    stream: Stream,
    /// Set by the releasing methods; unset at drop, the block is leaked.
    released: bool,
}

/// A pool block exported as its segment's file descriptor ([`DevicePool::malloc_fd`]).
pub type ExportedFdBlock = ExportedBlock<FdHandle>;

/// What the importer of an [`ExportedFdBlock`] needs: the descriptor and the region.
#[derive(Debug)]
pub struct FdHandle {
    region: FdRegion,
    fd: OwnedFd,
}

/// Where a block lies in its exported segment: the size of the segment's physical memory
/// (what the importer maps), the block's offset in it and its length. 48 hex digits as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdRegion {
    /// Bytes of the segment's physical memory.
    pub segment_size: u64,
    /// The block's offset in the segment.
    pub offset: u64,
    /// The block's length.
    pub len: u64,
}

impl FdRegion {
    /// As text: three 16-digit hex numbers.
    pub fn to_hex(&self) -> String {
        format!(
            "{:016x}{:016x}{:016x}",
            self.segment_size, self.offset, self.len
        )
    }

    /// From [`to_hex`](Self::to_hex)'s text; anything else is an error naming it.
    pub fn from_hex(text: &str) -> Result<FdRegion, PoolError> {
        let bad = || {
            PoolError::Cuda(cudars_core::Error::InvalidArgument(format!(
                "not an FdRegion (48 hex digits): {text:?}"
            )))
        };
        if text.len() != 48 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let field =
            |i: usize| u64::from_str_radix(&text[i * 16..(i + 1) * 16], 16).map_err(|_| bad());
        Ok(FdRegion {
            segment_size: field(0)?,
            offset: field(1)?,
            len: field(2)?,
        })
    }
}

impl<R> Drop for ExportedBlock<R> {
    fn drop(&mut self) {
        if !self.released {
            // Nothing says the importer is done: keep the block out of reuse for good (one
            // reference of the view, and so the block and its pool, is never dropped).
            std::mem::forget(self.view.clone());
        }
    }
}

impl ExportedBlock<IpcRegion> {
    /// What the importer needs: the segment's handle, the block's offset and length
    /// (bytes and hex forms on [`IpcRegion`]).
    pub fn region(&self) -> IpcRegion {
        self.region
    }
}

impl ExportedBlock<FdHandle> {
    /// Where the block lies in its segment, for the importer.
    pub fn region(&self) -> FdRegion {
        self.region.region
    }

    /// The segment's file descriptor, to send to the importer
    /// (`cudars_core::ipc::send_fd`); it stays open while this value lives.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.region.fd.as_fd()
    }
}

impl<R> ExportedBlock<R> {
    /// A view of the block, for the exporter's own work.
    pub fn view(&self) -> &DevicePtr {
        &self.view
    }

    /// Releases the block once `importer_done` (an event the importer recorded after its
    /// last use, opened here with `Event::open_ipc`) has completed: `stream` waits on the
    /// event, the block is marked as used on `stream`, and dropped, so the pool reuses it
    /// only after the importer's work. Returns at once.
    ///
    /// An event that is not interprocess cannot be the importer's and is refused with
    /// [`PoolError::NotInterprocessEvent`]. On any error the block is not released: it stays
    /// out of reuse for good (leaked), since nothing then says the importer is done.
    pub fn release_after(
        mut self,
        stream: &Stream,
        importer_done: &Event,
    ) -> Result<(), PoolError> {
        if !importer_done.is_interprocess() {
            return Err(PoolError::NotInterprocessEvent);
        }
        stream.wait_event(importer_done).map_err(PoolError::Cuda)?;
        let issue = stream.issue_any();
        self.view.record_stream(&issue).map_err(PoolError::Cuda)?;
        self.released = true;
        Ok(())
    }

    /// Releases the block now: it goes back to the pool, which may lend its memory to the
    /// next allocation at once.
    ///
    /// # Safety
    ///
    /// The importer has finished with the memory: all its work on the block has completed
    /// and it will issue no more (it told you so out of band, for example after closing its
    /// mapping). Otherwise its writes land in whatever allocation gets the memory next.
    pub unsafe fn release(mut self) {
        self.released = true;
    }

    /// The stream the block was allocated on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// Opens a block another process exported ([`ExportedBlock::region`]) on `device`: a view
/// of exactly the block. Blocks of one segment share one mapping
/// ([`IpcMapping::open_shared`](cudars_core::ipc::IpcMapping::open_shared)), closed when
/// the last view drops. The driver's refusals are `PoolError::Backend` carrying a
/// `cudars_core::Error::Ipc` with the cause.
pub fn import_block(device: &Device, region: &IpcRegion) -> Result<DevicePtr, PoolError> {
    region.open(device).map_err(PoolError::Cuda)
}

/// Opens a block another process exported as a file descriptor ([`ExportedFdBlock`]) on
/// `device`: imports the segment's physical memory (`cuMemImportFromShareableHandle`), maps
/// it, and returns a view of exactly the block. The mapping is unmapped when the last view
/// drops (after its device's work on it). A region that runs past the segment is an error,
/// and so is every refusal of the driver (a descriptor of something else, a size that is not
/// the physical memory's).
pub fn import_block_fd(
    device: &Device,
    fd: BorrowedFd<'_>,
    region: &FdRegion,
) -> Result<DevicePtr, PoolError> {
    let end = region.offset.checked_add(region.len);
    if region.len == 0 || end.is_none_or(|e| e > region.segment_size) {
        return Err(PoolError::Cuda(cudars_core::Error::InvalidArgument(
            format!(
                "the block {}+{} does not lie in its segment of {} bytes",
                region.offset, region.len, region.segment_size
            ),
        )));
    }
    let size = usize::try_from(region.segment_size)
        .map_err(|_| PoolError::Cuda(cudars_core::Error::SizeOverflow("segment size")))?;
    let physical = PhysicalAllocation::import_fd(device, fd, size).map_err(PoolError::Cuda)?;
    let view = SharedMapping::map(device, physical)
        .map_err(PoolError::Cuda)?
        .into_ptr();
    view.slice(region.offset as usize..(region.offset + region.len) as usize)
        .map_err(PoolError::Cuda)
}

/// The [`SegmentSource`] of [`DevicePool::new_shareable`]: every segment is one piece of
/// shareable virtual memory ([`SharedMapping::new`], a POSIX file descriptor handle, rounded
/// up to the granularity), so a block is exported as its segment's descriptor. Only
/// [`DevicePool::new_shareable`] makes one, and nothing outside the pool reaches it: a
/// segment's descriptor leaves only with an exported block, which keeps that block out of
/// reuse. Dropping the pool frees its segments (each after its device's work on it).
#[derive(Debug)]
pub struct ShareableSegments {
    segments: Mutex<BTreeMap<u64, SharedMapping>>,
}

impl ShareableSegments {
    fn new() -> ShareableSegments {
        ShareableSegments {
            segments: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, SharedMapping>> {
        self.segments.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many segments are live.
    pub fn segments(&self) -> usize {
        self.lock().len()
    }
}

// SAFETY: each segment is a `SharedMapping` of at least `size` bytes (rounded up to the
// granularity, aligned to it), readable and writable by `device`, distinct from every other
// live mapping; kept in the map, and so valid, until `deallocate` drops it (after the pool's
// fences: nothing uses it any more).
unsafe impl SegmentSource for ShareableSegments {
    fn allocate(&self, device: &Device, size: usize) -> cudars_core::Result<Option<u64>> {
        let mapping = match SharedMapping::new(device, size) {
            Ok(m) => m,
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e),
        };
        let addr = mapping.as_raw();
        self.lock().insert(addr, mapping);
        Ok(Some(addr))
    }

    unsafe fn deallocate(
        &self,
        _device: &Device,
        addr: u64,
        _size: usize,
    ) -> cudars_core::Result<()> {
        let mapping = self.lock().remove(&addr);
        match mapping {
            Some(m) => {
                drop(m);
                Ok(())
            }
            None => Err(cudars_core::Error::InvalidArgument(format!(
                "no segment of this source at {addr:#x}"
            ))),
        }
    }

    fn export_fd(&self, addr: u64) -> cudars_core::Result<Option<ExportedSegment>> {
        let segments = self.lock();
        let Some((&base, mapping)) = segments.range(..=addr).next_back() else {
            return Ok(None);
        };
        if addr >= base + mapping.size() as u64 {
            return Ok(None);
        }
        Ok(Some(ExportedSegment {
            fd: mapping.physical().export_fd()?,
            base,
            size: mapping.physical().size(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::FdRegion;

    #[test]
    fn an_fd_region_round_trips_as_text_and_bad_text_is_an_error() {
        let r = FdRegion {
            segment_size: 2 << 20,
            offset: 512,
            len: u64::MAX - 7,
        };
        assert_eq!(FdRegion::from_hex(&r.to_hex()).unwrap(), r);
        let plus = format!("+{}", "0".repeat(47));
        for bad in [
            "",
            "00",
            &"g".repeat(48),
            &"0".repeat(47),
            &"é".repeat(24),
            &plus,
        ] {
            assert!(FdRegion::from_hex(bad).is_err(), "{bad:?}");
        }
    }
}
