//! What nodes read and write: device memory ([`DeviceMem`]), any memory ([`Mem`]), and
//! pitched 2-D/3-D regions ([`Pitched`], [`Extent`]).

use cudars_core::graph::explicit::CopyEnd;
use cudars_core::memory::DevicePtr;
use cudars_core::Device;

use super::host::{host_owner, HostBuffer};
use super::memory::GraphAlloc;
use super::registry::Owner;
use crate::error::{wrong_device, Result};

/// Device memory a copy or memset node reads or writes.
#[derive(Debug, Clone, Copy)]
pub enum DeviceMem<'a> {
    /// Owned device memory: kept alive by the graph.
    Ptr(&'a DevicePtr),
    /// Memory of an allocation node of the same graph.
    Alloc(&'a GraphAlloc),
}

impl<'a> From<&'a DevicePtr> for DeviceMem<'a> {
    fn from(p: &'a DevicePtr) -> Self {
        DeviceMem::Ptr(p)
    }
}

impl<'a> From<&'a GraphAlloc> for DeviceMem<'a> {
    fn from(a: &'a GraphAlloc) -> Self {
        DeviceMem::Alloc(a)
    }
}

/// Either end of a copy node.
#[derive(Debug, Clone, Copy)]
pub enum Mem<'a> {
    /// Device memory.
    Device(DeviceMem<'a>),
    /// Pinned host memory.
    Host(&'a HostBuffer),
}

impl<'a> From<&'a DevicePtr> for Mem<'a> {
    fn from(p: &'a DevicePtr) -> Self {
        Mem::Device(DeviceMem::Ptr(p))
    }
}

impl<'a> From<&'a GraphAlloc> for Mem<'a> {
    fn from(a: &'a GraphAlloc) -> Self {
        Mem::Device(DeviceMem::Alloc(a))
    }
}

impl<'a> From<&'a HostBuffer> for Mem<'a> {
    fn from(h: &'a HostBuffer) -> Self {
        Mem::Host(h)
    }
}

impl<'a> From<DeviceMem<'a>> for Mem<'a> {
    fn from(d: DeviceMem<'a>) -> Self {
        Mem::Device(d)
    }
}

impl Mem<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Mem::Device(DeviceMem::Ptr(p)) => p.len(),
            Mem::Device(DeviceMem::Alloc(a)) => a.len,
            Mem::Host(h) => h.len(),
        }
    }

    pub(crate) fn end(&self) -> CopyEnd {
        match self {
            Mem::Device(DeviceMem::Ptr(p)) => CopyEnd::Device(p.as_raw()),
            Mem::Device(DeviceMem::Alloc(a)) => CopyEnd::Device(a.ptr),
            Mem::Host(h) => CopyEnd::Host(h.as_ptr().cast_mut().cast()),
        }
    }

    pub(crate) fn alloc(&self) -> Option<&GraphAlloc> {
        match self {
            Mem::Device(DeviceMem::Alloc(a)) => Some(a),
            _ => None,
        }
    }

    pub(crate) fn owner(&self, device: Device) -> Result<Option<Owner>> {
        match self {
            Mem::Device(DeviceMem::Ptr(p)) => {
                if p.device() != device {
                    return Err(wrong_device("buffer", device, p.device()));
                }
                Ok(Some(Owner::Device((*p).clone())))
            }
            Mem::Device(DeviceMem::Alloc(_)) => Ok(None),
            Mem::Host(h) => Ok(Some(host_owner(h))),
        }
    }
}

/// One end of a pitched (2-D or 3-D) copy: memory, the bytes from one row to the next, and
/// the rows from one slice to the next (for a 2-D copy, any value at least the copy's height).
#[derive(Debug, Clone, Copy)]
pub struct Pitched<'a> {
    /// The memory.
    pub mem: Mem<'a>,
    /// Bytes from the start of one row to the start of the next.
    pub pitch: usize,
    /// Rows from the start of one slice to the start of the next.
    pub rows: usize,
}

impl<'a> Pitched<'a> {
    /// `mem` laid out in rows of `pitch` bytes, `rows` rows per slice.
    pub fn new(mem: impl Into<Mem<'a>>, pitch: usize, rows: usize) -> Pitched<'a> {
        Pitched {
            mem: mem.into(),
            pitch,
            rows,
        }
    }
}
