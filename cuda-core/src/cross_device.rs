//! Cross-device uses: work that streams of *other* devices queued on one allocation, which
//! an owner whose free is ordered only with its own device waits for before it frees.

use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::graph::is_capturing;
use crate::stream::{Stream, StreamKind};
use crate::Device;

/// Work that streams of *other* devices queued on one allocation: what an owner whose free
/// is only ordered with its own device must wait for before it frees the memory.
///
/// `cuMemFree` (and `cuIpcCloseMemHandle`, `cuMemUnmap` after a device synchronisation) wait
/// at most for the work of the memory's own device: the driver documents only that
/// `cuMemFree` "may perform implicit synchronization", nothing about other devices. A peer
/// copy queued on device 1's stream that reads device 0's memory is device 1's work, so the
/// owners of such memory ([`DeviceMemory`](crate::memory::DeviceMemory),
/// [`ManagedMemory`](crate::memory::ManagedMemory),
/// [`UnownedMemory`](crate::memory::UnownedMemory) and the IPC mappings) note each such
/// stream here, from their [`DeviceAlloc::record_stream`], and wait for it in `Drop` before
/// they free. Uses by streams of the memory's own device note nothing (their free already
/// waits for that device), so the common case costs one comparison.
///
/// `record_stream` runs *before* the work is issued, so an event recorded then would mark a
/// point before that work. What is kept is therefore the stream itself, and `Drop` waits for
/// everything queued on it by then (an event recorded at drop time):
/// - a stream this crate created, or a legacy null stream: a clone of it (which keeps a
///   created stream alive until the memory goes; a newer use of the same stream replaces
///   the older, and a use of a stream nobody else holds any more is forgotten once its work
///   is done);
/// - the per-thread stream (its handle names another stream on each thread) and external
///   streams (whose handles this crate must not keep past the caller's promise): the device,
///   which `Drop` synchronises as a whole.
///
/// A noted stream that is being captured when the memory drops cannot be waited for (an
/// event recorded now would only be captured): the memory is then leaked, as it is when any
/// wait fails.
#[derive(Default)]
pub(crate) struct CrossDeviceUses {
    uses: Mutex<Vec<CrossDeviceUse>>,
}

/// One use noted by [`CrossDeviceUses`].
enum CrossDeviceUse {
    /// A created or legacy stream: its work as of the drop is waited for.
    Stream(Stream),
    /// The per-thread or an external stream of this device: the whole device is waited for.
    Device(Device),
}

impl CrossDeviceUses {
    /// Notes that work queued on `stream` from now on uses memory of `device`: nothing when
    /// `stream` belongs to `device`, or when it is being captured (the work then runs at
    /// the graph's launches, and [`GraphExecHandle::launch`](crate::graph::GraphExecHandle::launch) notes each of them; graphs of
    /// captures begun through this module keep the memory's owner alive meanwhile).
    pub(crate) fn record(&self, device: Device, stream: &Stream) -> Result<()> {
        if stream.device() == device || is_capturing(stream)? {
            return Ok(());
        }
        let new = match stream.kind() {
            StreamKind::Owned | StreamKind::LegacyNull => CrossDeviceUse::Stream(stream.clone()),
            StreamKind::PerThread | StreamKind::External => CrossDeviceUse::Device(stream.device()),
        };
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        uses.retain(|old| match (old, &new) {
            // The same stream (a held clone keeps its handle from being reused), or the same
            // device: the new use covers the old one.
            (CrossDeviceUse::Stream(a), CrossDeviceUse::Stream(b)) if a == b => false,
            (CrossDeviceUse::Device(a), CrossDeviceUse::Device(b)) if a == b => false,
            // A created stream only this list still holds: no new work (or capture) can
            // reach it, so once its work is done the use is over.
            (CrossDeviceUse::Stream(a), _) if a.clone_count() == Some(1) => {
                !matches!(a.is_done(), Ok(true))
            }
            _ => true,
        });
        uses.push(new);
        Ok(())
    }

    /// Waits for every noted use. `false` when a wait failed or could not be made (a noted
    /// stream being captured): that work may still run, so the caller must leak the memory
    /// rather than free it.
    pub(crate) fn wait_all(&self) -> bool {
        let uses = std::mem::take(&mut *self.uses.lock().unwrap_or_else(PoisonError::into_inner));
        let mut all = true;
        for used in uses {
            all &= match used {
                CrossDeviceUse::Stream(stream) => wait_for_stream(&stream).is_ok(),
                CrossDeviceUse::Device(device) => device.synchronize().is_ok(),
            };
        }
        all
    }

    /// How many uses are noted (for `Debug`).
    pub(crate) fn len(&self) -> usize {
        self.uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Waits for the work queued on `stream` so far, through an event (not
/// [`Stream::synchronize`], which would take a host callback's panic report from the
/// stream's owner). A stream being captured is an error: an event recorded there now would
/// be captured, and waiting on it would wait for nothing.
fn wait_for_stream(stream: &Stream) -> Result<()> {
    if is_capturing(stream)? {
        return Err(Error::Unsupported(
            "waiting for a stream's work while the stream is being captured",
        ));
    }
    let event = crate::event::Event::new(&stream.device())?;
    event.record(stream)?;
    event.synchronize()
}
