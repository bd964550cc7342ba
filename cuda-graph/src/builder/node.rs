//! [`NodeId`] and [`NodeKind`]: what names a node, and what it is.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use cudars_core::graph::explicit::ConditionalKind;

/// A node of a graph built with [`GraphBuilder`](crate::GraphBuilder): names its graph and its place in it.
/// `Copy`; usable as a dependency in its own graph only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub(crate) graph: u64,
    pub(crate) index: u32,
}

impl NodeId {
    /// The key under which a cloned graph keeps its source's owners (graph ids start at 1).
    pub(crate) fn clone_marker() -> NodeId {
        NodeId { graph: 0, index: 0 }
    }

    /// The id of the graph (or conditional body) the node belongs to, unique in the process.
    pub fn graph(self) -> u64 {
        self.graph
    }

    /// The node's index in its graph, in the order nodes were added.
    pub fn index(self) -> u32 {
        self.index
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node #{} of graph #{}", self.index, self.graph)
    }
}

/// What a node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeKind {
    /// A kernel launch.
    Kernel,
    /// A one-dimensional copy.
    Memcpy,
    /// A memset.
    Memset,
    /// A host function.
    Host,
    /// An event record.
    EventRecord,
    /// An event wait.
    EventWait,
    /// An embedded child graph.
    Child,
    /// A memory allocation.
    MemAlloc,
    /// A memory free.
    MemFree,
    /// A node that only joins dependencies.
    Empty,
    /// A conditional node.
    Conditional(ConditionalKind),
}

impl NodeKind {
    /// The name errors use.
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Kernel => "kernel node",
            NodeKind::Memcpy => "memcpy node",
            NodeKind::Memset => "memset node",
            NodeKind::Host => "host function node",
            NodeKind::EventRecord => "event record node",
            NodeKind::EventWait => "event wait node",
            NodeKind::Child => "child graph node",
            NodeKind::MemAlloc => "memory allocation node",
            NodeKind::MemFree => "memory free node",
            NodeKind::Empty => "empty node",
            NodeKind::Conditional(k) => k.name(),
        }
    }

    /// Whether a conditional node's body may hold it.
    pub fn allowed_in_body(self) -> bool {
        matches!(
            self,
            NodeKind::Kernel
                | NodeKind::Memcpy
                | NodeKind::Memset
                | NodeKind::Empty
                | NodeKind::Child
                | NodeKind::Conditional(_)
        )
    }
}

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// A new graph id, unique in the process: what a [`NodeId`] names its graph by.
pub(super) fn next_graph_id() -> u64 {
    NEXT_GRAPH.fetch_add(1, Ordering::Relaxed)
}
