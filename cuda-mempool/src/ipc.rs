//! Sharing pool blocks with other processes (CUDA legacy IPC).
//!
//! A pool made for IPC ([`DevicePool::new_ipc`]) builds its segments with plain
//! `cuMemAlloc`, which has legacy IPC handles; a block is then exported as its segment's
//! handle plus the block's offset and length ([`IpcRegion`]). A pool with virtual-memory
//! segments cannot export blocks this way and says so with [`PoolError::NotExportable`]
//! (its segments are many physical pages; exporting them as file descriptors is left to
//! `cudars_core::ipc::SharedMapping`).
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

use std::sync::Arc;

use cudars_core::ipc::{self as core_ipc, IpcRegion};
use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Event, Stream};

use crate::driver::{device_id, DevicePool, DriverBackend};
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
    /// `true` when its segments are plain `cuMemAlloc` memory.
    pub fn can_export(&self, device: &Device) -> Result<bool, PoolError> {
        Ok(!self.uses_virtual_memory(device_id(device))?)
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
#[derive(Debug)]
pub struct ExportedBlock {
    view: DevicePtr,
    region: IpcRegion,
    stream: Stream,
    /// Set by the releasing methods; unset at drop, the block is leaked.
    released: bool,
}

impl Drop for ExportedBlock {
    fn drop(&mut self) {
        if !self.released {
            // Nothing says the importer is done: keep the block out of reuse for good (one
            // reference of the view, and so the block and its pool, is never dropped).
            std::mem::forget(self.view.clone());
        }
    }
}

impl ExportedBlock {
    /// What the importer needs: the segment's handle, the block's offset and length
    /// (bytes and hex forms on [`IpcRegion`]).
    pub fn region(&self) -> IpcRegion {
        self.region
    }

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
