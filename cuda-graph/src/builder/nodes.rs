//! Kernel, copy, memset, host, event, child-graph and memory nodes.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use cudars_core::graph::explicit as ex;
use cudars_core::memory::DevicePtr;
use cudars_core::module::{Function, LaunchConfig};
use cudars_core::Event;

use super::extent::Extent;
use super::graph_builder::GraphBuilder;
use super::host::{host_callback, HOST_TRAMPOLINE};
use super::memory::GraphAlloc;
use super::node::{NodeId, NodeKind};
use super::operands::{DeviceMem, Mem, Pitched};
use super::registry::Owner;
use super::validate::{check_pitched, copy_size, memset_target};
use crate::error::{wrong_device, BuildError, Result};
use crate::graph::Graph;

impl<'a> GraphBuilder<'a> {
    /// An empty node: joins `deps` into one dependency.
    pub fn add_empty(&mut self, deps: &[NodeId]) -> Result<NodeId> {
        let (idx, raw) = self.prepare(deps, NodeKind::Empty)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph of this builder (the root's handle, or a body its conditional
        // node owns, alive while the root is) and nodes of it.
        let node = unsafe { ex::add_empty_node(self.graph(), &raw) }?;
        Ok(self.record(idx, node, NodeKind::Empty, Vec::new()))
    }

    /// A kernel node: `function` launched as `config` with the argument values `params`
    /// points to (copied now). `keep` lists the buffers the graph must keep alive for it.
    ///
    /// A function of another device is `WrongDevice`; a zero dimension is
    /// `InvalidArgument`; cluster dimensions are `Unsupported` (all before the driver call).
    ///
    /// # Safety
    ///
    /// `params` holds one pointer per kernel parameter, each to a live value of exactly that
    /// parameter's type and size; every address the kernel dereferences is valid at every
    /// launch (the buffers in `keep` are kept allocated by the graph; anything else, or a
    /// [`GraphAlloc`] used outside its allocation and free nodes, is the caller's promise),
    /// and the kernel is free of undefined behaviour with these arguments.
    pub unsafe fn add_kernel(
        &mut self,
        deps: &[NodeId],
        function: &Function,
        config: &LaunchConfig,
        params: &mut [*mut c_void],
        keep: &[&DevicePtr],
    ) -> Result<NodeId> {
        if function.device() != self.device {
            return Err(wrong_device("kernel", self.device, function.device()));
        }
        let (idx, raw) = self.prepare(deps, NodeKind::Kernel)?;
        let mut owners = Vec::with_capacity(keep.len());
        for p in keep {
            owners.extend(Mem::from(*p).owner(self.device)?);
        }
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it (see `add_empty`); the caller upholds the
        // argument and memory contract; the kept buffers are held by the graph.
        let node = unsafe { ex::add_kernel_node(self.graph(), &raw, function, config, params) }?;
        Ok(self.record(idx, node, NodeKind::Kernel, owners))
    }

    /// A one-dimensional copy node from `src` to `dst` (device or graph memory, or a pinned
    /// [`HostBuffer`](crate::HostBuffer) at one end), of their common length. Different lengths are
    /// `SizeMismatch`, zero bytes [`BuildError::Empty`], host to host
    /// [`BuildError::HostToHost`]; a conditional body refuses a host end. Both buffers are
    /// kept alive by the graph.
    pub fn add_memcpy<'m>(
        &mut self,
        deps: &[NodeId],
        dst: impl Into<Mem<'m>>,
        src: impl Into<Mem<'m>>,
    ) -> Result<NodeId> {
        let (dst, src) = (dst.into(), src.into());
        let bytes = copy_size(&dst, &src)?;
        if self.reg.body && (matches!(dst, Mem::Host(_)) || matches!(src, Mem::Host(_))) {
            return Err(BuildError::NotAllowedInBody {
                kind: "memcpy node with a host end",
            }
            .into());
        }
        let (idx, raw) = self.prepare(deps, NodeKind::Memcpy)?;
        for m in [&dst, &src] {
            if let Some(a) = m.alloc() {
                self.reg.check_alloc_use(a, &idx)?;
            }
        }
        let owners: Vec<Owner> = [dst.owner(self.device)?, src.owner(self.device)?]
            .into_iter()
            .flatten()
            .collect();
        let params = ex::memcpy_1d_params(dst.end(), src.end(), bytes);
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; both ranges are kept allocated by the graph
        // (or are graph memory ordered after its allocation, checked above); the host end is
        // pinned.
        let node = unsafe { ex::add_memcpy_node(self.graph(), &raw, &params, self.ctx()) }?;
        let id = self.record(idx, node, NodeKind::Memcpy, owners);
        for m in [&dst, &src] {
            if let Some(a) = m.alloc() {
                self.reg.note_use(a, id);
            }
        }
        Ok(id)
    }

    /// A pitched copy node: `extent.depth` slices of `extent.height` rows of `extent.width`
    /// bytes, from `src` to `dst`, each laid out with its own pitch and rows per slice (a 2-D
    /// copy has depth 1). Every byte must lie inside both buffers (`OutOfRange`), a row
    /// inside its pitch and a slice inside its rows ([`BuildError::BadPitch`]). The rules of
    /// [`add_memcpy`](Self::add_memcpy) on ends and keep-alive apply.
    pub fn add_memcpy_3d(
        &mut self,
        deps: &[NodeId],
        dst: Pitched<'_>,
        src: Pitched<'_>,
        extent: Extent,
    ) -> Result<NodeId> {
        check_pitched(&dst, &src, extent)?;
        if self.reg.body && (matches!(dst.mem, Mem::Host(_)) || matches!(src.mem, Mem::Host(_))) {
            return Err(BuildError::NotAllowedInBody {
                kind: "memcpy node with a host end",
            }
            .into());
        }
        let (idx, raw) = self.prepare(deps, NodeKind::Memcpy)?;
        for m in [&dst.mem, &src.mem] {
            if let Some(a) = m.alloc() {
                self.reg.check_alloc_use(a, &idx)?;
            }
        }
        let owners: Vec<Owner> = [dst.mem.owner(self.device)?, src.mem.owner(self.device)?]
            .into_iter()
            .flatten()
            .collect();
        // A 2-D copy's rows per slice are not read: give the driver a valid value anyway.
        let rows = |p: &Pitched<'_>| {
            if extent.depth == 1 {
                p.rows.max(extent.height)
            } else {
                p.rows
            }
        };
        let params = ex::memcpy_3d_params(
            (dst.mem.end(), dst.pitch, rows(&dst)),
            (src.mem.end(), src.pitch, rows(&src)),
            extent.width,
            extent.height,
            extent.depth,
        );
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; every byte copied lies inside both buffers
        // (checked above), which the graph keeps allocated (or graph memory ordered after its
        // allocation); a host end is pinned.
        let node = unsafe { ex::add_memcpy_node(self.graph(), &raw, &params, self.ctx()) }?;
        let id = self.record(idx, node, NodeKind::Memcpy, owners);
        for m in [&dst.mem, &src.mem] {
            if let Some(a) = m.alloc() {
                self.reg.note_use(a, id);
            }
        }
        Ok(id)
    }

    fn add_memset(
        &mut self,
        deps: &[NodeId],
        dst: DeviceMem<'_>,
        value: u32,
        element: usize,
    ) -> Result<NodeId> {
        let (addr, count) = memset_target(&dst, element)?;
        let (idx, raw) = self.prepare(deps, NodeKind::Memset)?;
        let mem = Mem::Device(dst);
        if let Some(a) = mem.alloc() {
            self.reg.check_alloc_use(a, &idx)?;
        }
        let owners: Vec<Owner> = mem.owner(self.device)?.into_iter().collect();
        let params = ex::memset_params(addr, value, element as u32, count);
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the range is kept allocated by the graph (or
        // is graph memory ordered after its allocation).
        let node = unsafe { ex::add_memset_node(self.graph(), &raw, &params, self.ctx()) }?;
        let id = self.record(idx, node, NodeKind::Memset, owners);
        if let Some(a) = mem.alloc() {
            self.reg.note_use(a, id);
        }
        Ok(id)
    }

    /// A memset node writing `value` to every byte of `dst`.
    pub fn add_memset_u8<'m>(
        &mut self,
        deps: &[NodeId],
        dst: impl Into<DeviceMem<'m>>,
        value: u8,
    ) -> Result<NodeId> {
        self.add_memset(deps, dst.into(), u32::from(value), 1)
    }

    /// A memset node writing `value` to every 2-byte element of `dst` (address and length
    /// multiples of 2, else [`BuildError::Misaligned`]).
    pub fn add_memset_u16<'m>(
        &mut self,
        deps: &[NodeId],
        dst: impl Into<DeviceMem<'m>>,
        value: u16,
    ) -> Result<NodeId> {
        self.add_memset(deps, dst.into(), u32::from(value), 2)
    }

    /// A memset node writing `value` to every 4-byte element of `dst` (address and length
    /// multiples of 4, else [`BuildError::Misaligned`]).
    pub fn add_memset_u32<'m>(
        &mut self,
        deps: &[NodeId],
        dst: impl Into<DeviceMem<'m>>,
        value: u32,
    ) -> Result<NodeId> {
        self.add_memset(deps, dst.into(), value, 4)
    }

    /// An event record node: records `event` when `deps` are done (another stream or graph
    /// can wait for it). The graph keeps the event alive.
    pub fn add_event_record(&mut self, deps: &[NodeId], event: &Event) -> Result<NodeId> {
        self.add_event(deps, event, NodeKind::EventRecord)
    }

    /// An event wait node: the nodes that depend on it wait for `event`'s last record. The
    /// graph keeps the event alive.
    pub fn add_event_wait(&mut self, deps: &[NodeId], event: &Event) -> Result<NodeId> {
        self.add_event(deps, event, NodeKind::EventWait)
    }

    fn add_event(&mut self, deps: &[NodeId], event: &Event, kind: NodeKind) -> Result<NodeId> {
        if event.device() != self.device {
            return Err(wrong_device("event", self.device, event.device()));
        }
        let (idx, raw) = self.prepare(deps, kind)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the graph keeps the event alive (owner below).
        let node = unsafe {
            if kind == NodeKind::EventRecord {
                ex::add_event_record_node(self.graph(), &raw, event)
            } else {
                ex::add_event_wait_node(self.graph(), &raw, event)
            }
        }?;
        let owner = Owner::Host(Arc::new(event.clone()) as Arc<dyn Any + Send + Sync>);
        Ok(self.record(idx, node, kind, vec![owner]))
    }

    /// A child graph node: embeds a copy of `child` (captured or built) after `deps`. The
    /// graph keeps alive everything `child` keeps alive. `child` stays usable.
    pub fn add_child(&mut self, deps: &[NodeId], child: &Graph) -> Result<NodeId> {
        if child.device() != self.device {
            return Err(wrong_device("child graph", self.device, child.device()));
        }
        let (idx, raw) = self.prepare(deps, NodeKind::Child)?;
        let mut owners: Vec<Owner> = child.all_owners();
        let _ctx = self.device.bind()?;
        let graph = self.graph();
        // The child is copied (`cuGraphAddChildGraphNode` reads it) with its calls serialised.
        let node = child.with_core(|h| {
            owners.extend(
                h.kept_alive()
                    .iter()
                    .map(|o| Owner::Device(DevicePtr::from_arc(Arc::clone(o)))),
            );
            // SAFETY: a live graph and nodes of it; everything the child's nodes use is kept
            // by this graph (the owners above).
            unsafe { ex::add_child_graph_node(graph, &raw, h) }
        })?;
        Ok(self.record(idx, node, NodeKind::Child, owners))
    }

    /// A host function node: `f` runs on a driver thread at each launch, after `deps`.
    ///
    /// `f` must not call CUDA (the driver forbids it in host nodes and may deadlock): set
    /// flags, count, send on a channel. A cuda-core value that `f` drops (a
    /// [`DevicePtr`] taken out of a captured `Option`, a stream, an
    /// event, memory) releases later on cuda-core's
    /// [release thread](cudars_core::release), not inside the host function. A panic in `f`
    /// is caught and the graph goes on. The
    /// graph and its executable graphs keep `f` alive until their launches have completed.
    /// Calls from launches of different executable graphs do not overlap (a mutex serialises
    /// them).
    pub fn add_host(
        &mut self,
        deps: &[NodeId],
        f: impl FnMut() + Send + 'static,
    ) -> Result<NodeId> {
        let (idx, raw) = self.prepare(deps, NodeKind::Host)?;
        let (cb, data) = host_callback(f);
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the trampoline is sound from any thread for
        // `data`, which the graph keeps alive (the owner below) until its launches complete;
        // it makes no CUDA call.
        let node = unsafe { ex::add_host_node(self.graph(), &raw, HOST_TRAMPOLINE, data) }?;
        Ok(self.record(idx, node, NodeKind::Host, vec![Owner::Host(cb)]))
    }

    /// A memory allocation node of `bytes` (> 0) on the graph's device: see the
    /// [module documentation](crate::builder) for the lifetime rules of the [`GraphAlloc`] returned.
    pub fn add_mem_alloc(&mut self, deps: &[NodeId], bytes: usize) -> Result<(NodeId, GraphAlloc)> {
        if bytes == 0 {
            return Err(BuildError::Empty {
                kind: "memory allocation node",
            }
            .into());
        }
        let (idx, raw) = self.prepare(deps, NodeKind::MemAlloc)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the address is used only through this
        // builder's checks (copies, memsets) or the caller's unsafe kernel contract.
        let (node, ptr) =
            unsafe { ex::add_mem_alloc_node(self.graph(), &raw, &self.device, bytes) }?;
        let id = self.record(idx, node, NodeKind::MemAlloc, Vec::new());
        self.reg.note_alloc(id);
        Ok((
            id,
            GraphAlloc {
                ptr,
                len: bytes,
                node: id,
            },
        ))
    }

    /// A memory free node for `alloc`, which must be of this graph, not freed yet, and
    /// used (through this builder) only by nodes that `deps` depend on.
    pub fn add_mem_free(&mut self, deps: &[NodeId], alloc: &GraphAlloc) -> Result<NodeId> {
        let (idx, raw) = self.prepare(deps, NodeKind::MemFree)?;
        self.reg.check_free(alloc, &idx)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; every use this builder saw precedes the free.
        let node = unsafe { ex::add_mem_free_node(self.graph(), &raw, alloc.ptr) }?;
        let id = self.record(idx, node, NodeKind::MemFree, Vec::new());
        self.reg.note_free(alloc, id);
        Ok(id)
    }
}
