//! What a builder knows of its graph's nodes: the owners each node keeps alive, memory
//! allocations and their lifetimes, whether it is a conditional body.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use cudars_core::memory::DevicePtr;

use super::memory::GraphAlloc;
use super::node::{next_graph_id, NodeId, NodeKind};
use crate::error::{BuildError, Result};

/// Something a graph keeps alive for its nodes.
#[derive(Clone)]
pub(crate) enum Owner {
    /// Device memory: its uses are recorded on each launch stream.
    Device(DevicePtr),
    /// Anything else (host closures, pinned host buffers, events): released only once the
    /// launches that may use it have completed.
    Host(#[allow(dead_code, reason = "held only to keep it alive")] Arc<dyn Any + Send + Sync>),
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Device(p) => write!(f, "Device({:#x}, {})", p.as_raw(), p.len()),
            Owner::Host(_) => f.write_str("Host(..)"),
        }
    }
}

/// One node as the executable graph needs it to update it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeEntry {
    pub(crate) raw: usize,
    pub(crate) kind: NodeKind,
}

/// Every node of a built graph and of its conditional bodies, by id and by driver handle.
#[derive(Debug, Default)]
pub(crate) struct NodeTable {
    pub(crate) nodes: HashMap<NodeId, NodeEntry>,
    pub(crate) by_raw: HashMap<usize, NodeId>,
}

/// Owners by node.
pub(crate) type NodeOwners = HashMap<NodeId, Vec<Owner>>;

/// The validation state of one graph (or body), independent of the driver.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) graph: u64,
    pub(crate) body: bool,
    /// Each node's direct dependencies, by index.
    pub(crate) deps: Vec<Vec<u32>>,
    /// Graph allocations of this graph, by allocation node index.
    pub(crate) allocs: HashMap<u32, AllocState>,
}

#[derive(Debug, Default)]
pub(crate) struct AllocState {
    pub(crate) users: Vec<u32>,
    pub(crate) freed_by: Option<u32>,
}

impl Registry {
    pub(crate) fn new(body: bool) -> Registry {
        Registry {
            graph: next_graph_id(),
            body,
            deps: Vec::new(),
            allocs: HashMap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.deps.len()
    }

    /// The indices of `deps`, deduplicated, or the first foreign one.
    pub(crate) fn check_deps(&self, deps: &[NodeId]) -> Result<Vec<u32>, BuildError> {
        let mut out: Vec<u32> = Vec::with_capacity(deps.len());
        for d in deps {
            if d.graph != self.graph || d.index as usize >= self.deps.len() {
                return Err(BuildError::ForeignNode {
                    node: *d,
                    graph: self.graph,
                });
            }
            if !out.contains(&d.index) {
                out.push(d.index);
            }
        }
        Ok(out)
    }

    pub(crate) fn check_kind(&self, kind: NodeKind) -> Result<(), BuildError> {
        if self.body && !kind.allowed_in_body() {
            return Err(BuildError::NotAllowedInBody { kind: kind.name() });
        }
        Ok(())
    }

    pub(crate) fn id(&self, index: u32) -> NodeId {
        NodeId {
            graph: self.graph,
            index,
        }
    }

    /// Whether `target` is `from` or one of their transitive dependencies.
    pub(crate) fn reaches(&self, from: &[u32], target: u32) -> bool {
        let mut seen = HashSet::new();
        let mut stack: Vec<u32> = from.to_vec();
        while let Some(n) = stack.pop() {
            if n == target {
                return true;
            }
            if seen.insert(n) {
                if let Some(d) = self.deps.get(n as usize) {
                    stack.extend(d.iter().copied());
                }
            }
        }
        false
    }

    /// Checks a use of `alloc` by a node depending on `deps`.
    pub(crate) fn check_alloc_use(
        &self,
        alloc: &GraphAlloc,
        deps: &[u32],
    ) -> Result<(), BuildError> {
        if alloc.node.graph != self.graph {
            return Err(BuildError::ForeignAllocation {
                alloc: alloc.node,
                graph: self.graph,
            });
        }
        let state = self.allocs.get(&alloc.node.index);
        if let Some(free) = state.and_then(|s| s.freed_by) {
            return Err(BuildError::AllocationFreed {
                alloc: alloc.node,
                free: self.id(free),
            });
        }
        if !self.reaches(deps, alloc.node.index) {
            return Err(BuildError::NotOrderedAfterAllocation { alloc: alloc.node });
        }
        Ok(())
    }

    /// Checks a free of `alloc` by a node depending on `deps`.
    pub(crate) fn check_free(&self, alloc: &GraphAlloc, deps: &[u32]) -> Result<(), BuildError> {
        self.check_alloc_use(alloc, deps)?;
        if let Some(state) = self.allocs.get(&alloc.node.index) {
            for &user in &state.users {
                if !self.reaches(deps, user) {
                    return Err(BuildError::UseNotBeforeFree {
                        user: self.id(user),
                    });
                }
            }
        }
        Ok(())
    }

    /// Records a node; returns its id.
    pub(crate) fn push(&mut self, deps: Vec<u32>) -> NodeId {
        let index = self.deps.len() as u32;
        self.deps.push(deps);
        self.id(index)
    }

    pub(crate) fn note_alloc(&mut self, node: NodeId) {
        self.allocs.insert(node.index, AllocState::default());
    }

    pub(crate) fn note_use(&mut self, alloc: &GraphAlloc, user: NodeId) {
        self.allocs
            .entry(alloc.node.index)
            .or_default()
            .users
            .push(user.index);
    }

    pub(crate) fn note_free(&mut self, alloc: &GraphAlloc, free: NodeId) {
        self.allocs.entry(alloc.node.index).or_default().freed_by = Some(free.index);
    }

    /// Whether some allocation is never freed.
    pub(crate) fn has_unfreed(&self) -> bool {
        self.allocs.values().any(|a| a.freed_by.is_none())
    }
}

#[cfg(feature = "rtc")]
/// The owners of `args`' buffers, for a graph on `device`.
pub(crate) fn arg_owners<A: cudars_rtc::KernelArgs>(
    args: &A,
    device: cudars_core::Device,
) -> Result<Vec<Owner>> {
    let mut kept = Vec::new();
    args.keep_alive(device, &mut kept)
        .map_err(crate::error::Error::other)?;
    Ok(kept.into_iter().map(Owner::Device).collect())
}
