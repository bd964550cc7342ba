//! [`GraphBuilder`]: the graph being built (or a conditional body), its id, device and nodes,
//! and [`finish`](GraphBuilder::finish).

use std::fmt;
use std::marker::PhantomData;

use cudars_core::graph::{GraphHandle, InstantiateFlags};
use cudars_core::sys::{CUcontext, CUgraph, CUgraphNode};
use cudars_core::Device;

use super::node::{NodeId, NodeKind};
use super::registry::{NodeEntry, NodeOwners, NodeTable, Owner, Registry};
use crate::error::{BuildError, Result};
use crate::graph::Graph;

/// Builds a graph node by node; [`finish`](GraphBuilder::finish) turns it into a [`Graph`]
/// to instantiate. See the [module documentation](crate::builder) for dependencies, keep-alive,
/// memory and conditional nodes.
///
/// The same type fills a conditional node's bodies, inside the closures given to
/// [`add_if`](Self::add_if) and its siblings; the lifetime parameter keeps a body's builder
/// inside its closure (a root builder is `GraphBuilder<'static>`).
///
/// ```no_run
/// use cudars_core::{memory::DevicePtr, Device, Stream};
/// use cudars_graph::GraphBuilder;
///
/// let dev = Device::new(0)?;
/// let stream = Stream::new(&dev)?;
/// let (a, b) = (DevicePtr::alloc(&dev, 4096)?, DevicePtr::alloc(&dev, 4096)?);
/// let mut g = GraphBuilder::new(&dev)?;
/// let set = g.add_memset_u32(&[], &a, 7)?;
/// let copy = g.add_memcpy(&[set], &b, &a)?;
/// let _done = g.add_host(&[copy], || println!("copied"))?;
/// let exec = g.finish()?.instantiate()?;
/// exec.launch(&stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cudars_graph::Error>(())
/// ```
pub struct GraphBuilder<'a> {
    /// The root graph (owned) or `None` for a body (owned by its conditional node).
    pub(super) handle: Option<GraphHandle>,
    pub(super) raw: usize,
    pub(super) device: Device,
    pub(super) ctx: usize,
    pub(super) reg: Registry,
    pub(super) table: NodeTable,
    pub(super) owners: NodeOwners,
    /// Ties a body's builder to its closure: invariant, so no other builder can take its place.
    pub(super) _body: PhantomData<fn(&'a ()) -> &'a ()>,
}

// SAFETY: the raw graph and context are driver handles usable from any thread; the builder is
// not Sync, so calls on one graph never overlap. The owners are Send.
unsafe impl Send for GraphBuilder<'_> {}

impl fmt::Debug for GraphBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphBuilder")
            .field("graph", &self.reg.graph)
            .field("body", &self.reg.body)
            .field("nodes", &self.reg.len())
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl GraphBuilder<'static> {
    /// An empty graph for `device` (`cuGraphCreate`).
    pub fn new(device: &Device) -> Result<GraphBuilder<'static>> {
        let handle = GraphHandle::new(device)?;
        let ctx = device.primary_context()? as usize;
        Ok(GraphBuilder {
            raw: handle.raw() as usize,
            handle: Some(handle),
            device: *device,
            ctx,
            reg: Registry::new(false),
            table: NodeTable::default(),
            owners: NodeOwners::new(),
            _body: PhantomData,
        })
    }

    /// The built graph, ready to [`instantiate`](Graph::instantiate). An allocation node
    /// without a free node makes the graph instantiate with
    /// [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`].
    pub fn finish(mut self) -> Result<Graph> {
        let Some(handle) = self.handle.take() else {
            return Err(BuildError::BodyReplaced.into());
        };
        let table = std::mem::take(&mut self.table);
        let owners = std::mem::take(&mut self.owners);
        let extra = if self.reg.has_unfreed() {
            InstantiateFlags::AUTO_FREE_ON_LAUNCH
        } else {
            InstantiateFlags::NONE
        };
        Ok(Graph::from_parts(handle, table, owners, extra))
    }
}

impl<'a> GraphBuilder<'a> {
    /// The id of this graph (or body): the [`NodeId::graph`] of its nodes.
    pub fn id(&self) -> u64 {
        self.reg.graph
    }

    /// The device the graph runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether this builder fills a conditional node's body.
    pub fn is_body(&self) -> bool {
        self.reg.body
    }

    /// Nodes added so far.
    pub fn len(&self) -> usize {
        self.reg.len()
    }

    /// Whether no node was added.
    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    pub(super) fn graph(&self) -> CUgraph {
        self.raw as CUgraph
    }

    pub(super) fn ctx(&self) -> CUcontext {
        self.ctx as CUcontext
    }

    /// Validates deps and kind; returns (dep indices, raw deps).
    pub(super) fn prepare(
        &self,
        deps: &[NodeId],
        kind: NodeKind,
    ) -> Result<(Vec<u32>, Vec<CUgraphNode>)> {
        self.reg.check_kind(kind)?;
        let idx = self.reg.check_deps(deps)?;
        // Every registered node has its table entry (`record` adds both).
        let raw = idx
            .iter()
            .filter_map(|i| self.table.nodes.get(&self.reg.id(*i)))
            .map(|e| e.raw as CUgraphNode)
            .collect();
        Ok((idx, raw))
    }

    pub(super) fn record(
        &mut self,
        deps: Vec<u32>,
        raw: CUgraphNode,
        kind: NodeKind,
        owners: Vec<Owner>,
    ) -> NodeId {
        let id = self.reg.push(deps);
        self.table.nodes.insert(
            id,
            NodeEntry {
                raw: raw as usize,
                kind,
            },
        );
        self.table.by_raw.insert(raw as usize, id);
        if !owners.is_empty() {
            self.owners.insert(id, owners);
        }
        id
    }
}
