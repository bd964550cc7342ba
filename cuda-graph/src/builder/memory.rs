//! Memory nodes: [`GraphAlloc`], an address each launch allocates, and its allocation and
//! free nodes.

use super::node::NodeId;

/// Device memory that an allocation node of a graph allocates at each launch
/// ([`GraphBuilder::add_mem_alloc`](crate::GraphBuilder::add_mem_alloc)): an address valid between that node and its free node,
/// during a launch only. Not owned memory: it cannot be read or written outside the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphAlloc {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) node: NodeId,
}

impl GraphAlloc {
    /// The address each launch allocates (the same at every launch): a raw kernel argument.
    pub fn as_raw(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has zero bytes (never: allocation nodes of zero bytes are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation node.
    pub fn node(&self) -> NodeId {
        self.node
    }
}
