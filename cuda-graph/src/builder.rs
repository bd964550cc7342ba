//! Graphs built node by node ([`GraphBuilder`]): kernel, copy, memset, host function, event,
//! child graph, memory and conditional nodes, with typed dependencies ([`NodeId`]).
//!
//! # Dependencies
//!
//! Every `add_*` method takes the nodes the new node depends on and returns the new node's
//! [`NodeId`]. A node id names its graph: passing a node of another graph (another builder,
//! or a conditional node's body) is [`BuildError::ForeignNode`], before the driver is called.
//! Dependencies can only name nodes that exist already, so a graph built this way has no
//! cycle. Repeated dependencies count once. A graph may be empty.
//!
//! # What a graph keeps alive
//!
//! Every buffer a node uses ([`DevicePtr`]s, [`HostBuffer`]s), every host closure, every
//! event and every child graph's own buffers are kept alive by the built [`Graph`] and by
//! every [`GraphExec`](crate::GraphExec) made from it, until the last launch that can use them has completed.
//! Raw kernel arguments ([`GraphBuilder::add_kernel`]) are the exception: the buffers passed
//! in its `keep` list are kept, anything else the kernel reaches is the caller's promise.
//!
//! # Memory nodes
//!
//! [`GraphBuilder::add_mem_alloc`] returns a [`GraphAlloc`]: an address that each launch
//! allocates when the node runs, valid only for nodes ordered after the allocation node and
//! before its free node. The builder checks what it can see: a copy or memset on the
//! allocation must depend (directly or not) on the allocation node, and the free node must
//! depend on every node that used it through this builder; after the free, the allocation
//! cannot be used. A kernel that receives the address as a raw argument is not seen: ordering
//! it is the caller's part of [`add_kernel`](GraphBuilder::add_kernel)'s contract. An
//! allocation the graph does not free is freed at the start of the next launch (the graph is
//! then instantiated with [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`]); its address is never
//! handed out as owned memory, so nothing outside the graph can use it.
//!
//! # Conditional nodes
//!
//! [`GraphBuilder::add_if`], [`add_if_else`](GraphBuilder::add_if_else),
//! [`add_while`](GraphBuilder::add_while) and [`add_switch`](GraphBuilder::add_switch) take a
//! [`ConditionalHandle`] made by [`GraphBuilder::conditional_handle`] on the same graph, and
//! closures that fill the bodies. A kernel sets the condition on the device with
//! `cudaGraphSetConditional(handle, value)`, the handle passed as an `unsigned long long`
//! argument ([`SET_CONDITIONAL_PRELUDE`] declares it for NVRTC sources). Bodies may hold
//! kernel, copy (device to device), memset, empty, child graph and conditional nodes: other
//! kinds are [`BuildError::NotAllowedInBody`]. If and while need a CUDA 12.3 driver, if/else
//! and switch 12.8: an older one is `cudars_core::Error::DriverTooOld`.
//!
//! ```no_run
//! use std::ffi::c_void;
//! use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
//! use cudars_graph::{GraphBuilder, SET_CONDITIONAL_PRELUDE};
//!
//! // Count down on the device: the body runs while *left > 0.
//! let source = format!("{SET_CONDITIONAL_PRELUDE}{}", r#"
//! extern "C" __global__ void step(unsigned* left, cudaGraphConditionalHandle h) {
//!     *left -= 1;
//!     cudaGraphSetConditional(h, *left > 0);
//! }"#);
//! let dev = Device::new(0)?;
//! let step = cudars_rtc::Program::new(source).device(&dev)?.compile()?.load(&dev)?.kernel("step")?;
//! let left = DevicePtr::alloc(&dev, 4)?;
//! let mut g = GraphBuilder::new(&dev)?;
//! let reset = g.add_memset_u32(&[], &left, 100)?;
//! let h = g.conditional_handle(Some(1))?; // enter the loop at each launch
//! g.add_while(&[reset], h, |body| {
//!     let (mut p, mut raw) = (left.as_raw(), h.raw());
//!     let mut params = [&mut p as *mut u64 as *mut c_void, &mut raw as *mut u64 as *mut c_void];
//!     // SAFETY: step's parameters; one thread touches the one u32 of `left`, kept by the graph.
//!     unsafe { body.add_kernel(&[], step.function(), &LaunchConfig::new((1, 1, 1), (1, 1, 1)), &mut params, &[&left]) }?;
//!     Ok(())
//! })?;
//! let exec = g.finish()?.instantiate()?;
//! let stream = Stream::new(&dev)?;
//! exec.launch(&stream)?; // 100 iterations, one launch
//! stream.synchronize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudars_core::graph::explicit::{self as ex, ConditionalKind, CopyEnd};
use cudars_core::graph::{GraphHandle, InstantiateFlags, UpdateRefusal};
use cudars_core::memory::{DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::module::{Function, LaunchConfig};
use cudars_core::sys::{CUcontext, CUgraph, CUgraphNode};
use cudars_core::{Device, Event};

use crate::error::{Error, Result};
use crate::graph::Graph;

/// CUDA C++ that declares the device-side `cudaGraphSetConditional` and the handle type for
/// a program compiled with NVRTC: put it at the top of the source of the kernel that sets a
/// condition. (`nvcc` programs get both from `cuda_runtime.h`.)
///
/// ```
/// let source = format!(
///     "{}\nextern \"C\" __global__ void keep_going(cudaGraphConditionalHandle h, const int* left) {{\n    cudaGraphSetConditional(h, *left > 0);\n}}\n",
///     cudars_graph::SET_CONDITIONAL_PRELUDE
/// );
/// assert!(source.contains("cudaGraphSetConditional(h"));
/// ```
pub const SET_CONDITIONAL_PRELUDE: &str = "typedef unsigned long long cudaGraphConditionalHandle;\n\
extern \"C\" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);\n";

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

fn next_graph_id() -> u64 {
    NEXT_GRAPH.fetch_add(1, Ordering::Relaxed)
}

/// A node of a graph built with [`GraphBuilder`]: names its graph and its place in it.
/// `Copy`; usable as a dependency in its own graph only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    graph: u64,
    index: u32,
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

/// A node refused before the driver was called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A dependency (or a node to update) that belongs to another graph.
    #[error("{node} belongs to another graph than graph #{graph}")]
    ForeignNode {
        /// The node passed.
        node: NodeId,
        /// The graph it was passed to.
        graph: u64,
    },
    /// A condition handle made for another graph.
    #[error("the condition handle was made for graph #{handle_graph}, not graph #{graph}")]
    ForeignHandle {
        /// The graph the handle belongs to.
        handle_graph: u64,
        /// The graph of the conditional node.
        graph: u64,
    },
    /// A graph allocation used in another graph than the one that allocates it.
    #[error("the graph allocation of {alloc} is used in graph #{graph}")]
    ForeignAllocation {
        /// The allocation node.
        alloc: NodeId,
        /// The graph it was used in.
        graph: u64,
    },
    /// A kind of node a conditional body cannot hold.
    #[error("a conditional node's body cannot hold a {kind}")]
    NotAllowedInBody {
        /// What was refused.
        kind: &'static str,
    },
    /// A use of a graph allocation that does not depend on its allocation node.
    #[error("a node using the graph allocation of {alloc} must depend on that allocation node")]
    NotOrderedAfterAllocation {
        /// The allocation node.
        alloc: NodeId,
    },
    /// A use of a graph allocation after its free node, or a second free.
    #[error("the graph allocation of {alloc} was freed by {free}")]
    AllocationFreed {
        /// The allocation node.
        alloc: NodeId,
        /// The free node.
        free: NodeId,
    },
    /// A free node that does not depend on a node that uses the allocation.
    #[error("the free node must depend on {user}, which uses the allocation")]
    UseNotBeforeFree {
        /// The node using the allocation.
        user: NodeId,
    },
    /// A copy or memset of zero bytes.
    #[error("a {kind} of zero bytes")]
    Empty {
        /// The node kind.
        kind: &'static str,
    },
    /// A memset whose destination is not a whole number of aligned elements.
    #[error("memset of {element}-byte elements: the destination (address {addr:#x}, {len} bytes) must be aligned to and a multiple of {element} bytes")]
    Misaligned {
        /// Element size.
        element: usize,
        /// Destination address.
        addr: u64,
        /// Destination length.
        len: usize,
    },
    /// A host-to-host copy.
    #[error("a graph copy needs at least one device end")]
    HostToHost,
    /// A pitched copy whose rows do not fit the pitch, or whose slices do not fit the rows.
    #[error("pitched copy: the {end} (pitch {pitch} bytes, {rows} rows per slice) cannot hold rows of {} bytes, {} per slice", extent.width, extent.height)]
    BadPitch {
        /// `"destination"` or `"source"`.
        end: &'static str,
        /// Its pitch.
        pitch: usize,
        /// Its rows per slice.
        rows: usize,
        /// The copy's extent.
        extent: Extent,
    },
    /// A node update of a node that is not in this executable graph.
    #[error("{node} is not a node of this executable graph")]
    NotInExecutable {
        /// The node.
        node: NodeId,
    },
    /// A node update of the wrong kind (a memset's parameters for a kernel node, say).
    #[error("{node} is a {actual}, not a {expected}")]
    WrongKind {
        /// The node.
        node: NodeId,
        /// The kind the update is for.
        expected: &'static str,
        /// The node's kind.
        actual: &'static str,
    },
    /// A body closure left another builder in its place (swapped builders).
    #[error("a conditional body's builder was replaced inside its closure")]
    BodyReplaced,
}

/// The text of [`Error::UpdateRefused`].
pub(crate) fn describe_refusal(
    refusal: UpdateRefusal,
    node: Option<NodeId>,
    from: Option<NodeId>,
) -> String {
    let mut text = format!("the executable graph cannot be updated: {refusal}");
    match (node, from) {
        (Some(n), Some(f)) => text.push_str(&format!(" (at {n}, edge from {f})")),
        (Some(n), None) => text.push_str(&format!(" (at {n})")),
        _ => {}
    }
    text
}

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
    deps: Vec<Vec<u32>>,
    /// Graph allocations of this graph, by allocation node index.
    allocs: HashMap<u32, AllocState>,
}

#[derive(Debug, Default)]
struct AllocState {
    users: Vec<u32>,
    freed_by: Option<u32>,
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

/// A condition handle for a conditional node of one graph
/// ([`GraphBuilder::conditional_handle`]). Pass [`raw`](Self::raw) to the kernel that sets
/// the condition, as an `unsigned long long` (`cudaGraphConditionalHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConditionalHandle {
    raw: u64,
    graph: u64,
}

impl ConditionalHandle {
    /// The driver's handle: the kernel argument.
    pub fn raw(self) -> u64 {
        self.raw
    }

    /// The graph it belongs to.
    pub fn graph(self) -> u64 {
        self.graph
    }
}

/// Device memory that an allocation node of a graph allocates at each launch
/// ([`GraphBuilder::add_mem_alloc`]): an address valid between that node and its free node,
/// during a launch only. Not owned memory: it cannot be read or written outside the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphAlloc {
    ptr: u64,
    len: usize,
    node: NodeId,
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

struct HostBufferInner {
    mem: PinnedMemory,
}

/// Pinned host memory that graph copy nodes read or write: shared between the caller and
/// every graph that uses it, which keep it allocated.
///
/// A graph's copy may run whenever the graph is launched, so the contents are reached only
/// through `unsafe` calls whose caller promises that no launch using the buffer runs
/// meanwhile (after a `synchronize` of the launch stream, say).
/// [`try_into_inner`](Self::try_into_inner) gives the memory back once no graph holds it.
#[derive(Clone)]
pub struct HostBuffer {
    inner: Arc<HostBufferInner>,
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.inner.mem.as_ptr())
            .field("len", &self.len())
            .finish()
    }
}

impl HostBuffer {
    /// Wraps pinned memory.
    pub fn new(mem: PinnedMemory) -> HostBuffer {
        HostBuffer {
            inner: Arc::new(HostBufferInner { mem }),
        }
    }

    /// `len` bytes of zeroed pinned memory in `device`'s context.
    pub fn alloc(device: &Device, len: usize) -> Result<HostBuffer> {
        let mut mem = PinnedMemory::new(device, len, PinnedFlags::PORTABLE)?;
        mem.as_mut_slice().fill(0);
        Ok(HostBuffer::new(mem))
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    /// Whether it has zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first address.
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.mem.as_ptr()
    }

    /// Copies `src` into the start of the buffer (`src.len()` at most [`len`](Self::len):
    /// a longer one is [`cudars_core::Error::SizeMismatch`]).
    ///
    /// # Safety
    ///
    /// No launch of a graph that copies from or into this buffer runs during the call, and
    /// no other [`write`](Self::write) or [`read`](Self::read) of this buffer (through any
    /// clone, on any thread) runs at the same time.
    pub unsafe fn write<T: bytemuck::Pod>(&self, src: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(src);
        if bytes.len() > self.len() {
            return Err(cudars_core::Error::SizeMismatch {
                op: "HostBuffer::write",
                dst: self.len(),
                src: bytes.len(),
            }
            .into());
        }
        // SAFETY: the range is inside the buffer; the caller promises that no graph copy and
        // no other read or write touches it now, and `&self` access to the bytes is only
        // through these unsafe calls.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.inner.mem.as_ptr().cast_mut(),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies the start of the buffer into `dst` (`dst` at most [`len`](Self::len) bytes).
    ///
    /// # Safety
    ///
    /// No launch of a graph that copies into this buffer runs during the call, and no
    /// [`write`](Self::write) of this buffer (through any clone, on any thread) runs at the
    /// same time.
    pub unsafe fn read<T: bytemuck::Pod>(&self, dst: &mut [T]) -> Result<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if bytes.len() > self.len() {
            return Err(cudars_core::Error::SizeMismatch {
                op: "HostBuffer::read",
                dst: bytes.len(),
                src: self.len(),
            }
            .into());
        }
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.mem.as_ptr(), bytes.as_mut_ptr(), bytes.len())
        };
        Ok(())
    }

    /// The pinned memory back, when no graph and no other clone holds it (a graph's
    /// executables wait for their launches before they let go); else `Err(self)`.
    pub fn try_into_inner(self) -> std::result::Result<PinnedMemory, HostBuffer> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => Ok(inner.mem),
            Err(inner) => Err(HostBuffer { inner }),
        }
    }
}

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
    fn len(&self) -> usize {
        match self {
            Mem::Device(DeviceMem::Ptr(p)) => p.len(),
            Mem::Device(DeviceMem::Alloc(a)) => a.len,
            Mem::Host(h) => h.len(),
        }
    }

    fn end(&self) -> CopyEnd {
        match self {
            Mem::Device(DeviceMem::Ptr(p)) => CopyEnd::Device(p.as_raw()),
            Mem::Device(DeviceMem::Alloc(a)) => CopyEnd::Device(a.ptr),
            Mem::Host(h) => CopyEnd::Host(h.as_ptr().cast_mut().cast()),
        }
    }

    fn alloc(&self) -> Option<&GraphAlloc> {
        match self {
            Mem::Device(DeviceMem::Alloc(a)) => Some(a),
            _ => None,
        }
    }

    fn owner(&self, device: Device) -> Result<Option<Owner>> {
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

/// The extent of a pitched copy: `width` bytes per row, `height` rows per slice, `depth`
/// slices (1 for a 2-D copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Bytes per row.
    pub width: usize,
    /// Rows per slice.
    pub height: usize,
    /// Slices.
    pub depth: usize,
}

/// Checks a pitched copy: no zero extent, rows inside pitches, slices inside row counts, and
/// every byte inside both buffers.
pub(crate) fn check_pitched(dst: &Pitched<'_>, src: &Pitched<'_>, extent: Extent) -> Result<()> {
    if matches!((dst.mem, src.mem), (Mem::Host(_), Mem::Host(_))) {
        return Err(BuildError::HostToHost.into());
    }
    if extent.width == 0 || extent.height == 0 || extent.depth == 0 {
        return Err(BuildError::Empty {
            kind: "pitched memcpy node",
        }
        .into());
    }
    for (end, name) in [(dst, "destination"), (src, "source")] {
        let needed = extent
            .depth
            .checked_sub(1)
            .and_then(|z| z.checked_mul(end.rows))
            .and_then(|r| r.checked_add(extent.height - 1))
            .and_then(|r| r.checked_mul(end.pitch))
            .and_then(|b| b.checked_add(extent.width))
            .ok_or(cudars_core::Error::SizeOverflow("pitched memcpy extent"))?;
        if extent.width > end.pitch || (extent.depth > 1 && extent.height > end.rows) {
            return Err(BuildError::BadPitch {
                end: name,
                pitch: end.pitch,
                rows: end.rows,
                extent,
            }
            .into());
        }
        if needed > end.mem.len() {
            return Err(cudars_core::Error::OutOfRange {
                offset: 0,
                len: needed,
                size: end.mem.len(),
            }
            .into());
        }
    }
    Ok(())
}

/// What keeps a host buffer alive in a graph.
pub(crate) fn host_owner(h: &HostBuffer) -> Owner {
    Owner::Host(h.inner.clone() as Arc<dyn Any + Send + Sync>)
}

pub(crate) fn wrong_device(what: &'static str, expected: Device, actual: Device) -> Error {
    cudars_core::Error::WrongDevice {
        what,
        expected: expected.ordinal(),
        actual: actual.ordinal(),
    }
    .into()
}

/// A host closure as a host node runs it.
pub(crate) struct HostCallback {
    f: Mutex<Box<dyn FnMut() + Send>>,
}

/// The host node's trampoline: runs the closure, catching a panic (it must not unwind into
/// the driver).
pub(crate) unsafe extern "C" fn host_trampoline(data: *mut c_void) {
    // SAFETY: `data` is the `HostCallback` of an `Arc` that every graph and executable graph
    // holding the node keeps alive until its launches have completed.
    let callback = unsafe { &*(data as *const HostCallback) };
    // A value of cuda-core that the closure drops here (taken out of a captured `Option`)
    // releases on cuda-core's release thread: no CUDA call inside the host function.
    let _inside = cudars_core::release::HostFunctionScope::enter();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut f = callback.f.lock().unwrap_or_else(PoisonError::into_inner);
        (f)();
    }));
}

pub(crate) fn host_callback(f: impl FnMut() + Send + 'static) -> (Arc<HostCallback>, *mut c_void) {
    let cb = Arc::new(HostCallback {
        f: Mutex::new(Box::new(f)),
    });
    let data = Arc::as_ptr(&cb) as *mut c_void;
    (cb, data)
}

pub(crate) use host_trampoline as HOST_TRAMPOLINE;

/// Checks a memset destination and returns (address, element count).
pub(crate) fn memset_target(dst: &DeviceMem<'_>, element: usize) -> Result<(u64, usize)> {
    let (addr, len) = match dst {
        DeviceMem::Ptr(p) => (p.as_raw(), p.len()),
        DeviceMem::Alloc(a) => (a.ptr, a.len),
    };
    if len == 0 {
        return Err(BuildError::Empty {
            kind: "memset node",
        }
        .into());
    }
    if addr % element as u64 != 0 || len % element != 0 {
        return Err(BuildError::Misaligned { element, addr, len }.into());
    }
    Ok((addr, len / element))
}

/// Checks a copy's ends and returns the byte count.
pub(crate) fn copy_size(dst: &Mem<'_>, src: &Mem<'_>) -> Result<usize> {
    if matches!((dst, src), (Mem::Host(_), Mem::Host(_))) {
        return Err(BuildError::HostToHost.into());
    }
    if dst.len() != src.len() {
        return Err(cudars_core::Error::SizeMismatch {
            op: "graph memcpy node",
            dst: dst.len(),
            src: src.len(),
        }
        .into());
    }
    if dst.len() == 0 {
        return Err(BuildError::Empty {
            kind: "memcpy node",
        }
        .into());
    }
    Ok(dst.len())
}

/// Builds a graph node by node; [`finish`](GraphBuilder::finish) turns it into a [`Graph`]
/// to instantiate. See the [module documentation](self) for dependencies, keep-alive,
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
    handle: Option<GraphHandle>,
    raw: usize,
    device: Device,
    ctx: usize,
    reg: Registry,
    table: NodeTable,
    owners: NodeOwners,
    /// Ties a body's builder to its closure: invariant, so no other builder can take its place.
    _body: PhantomData<fn(&'a ()) -> &'a ()>,
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

    fn graph(&self) -> CUgraph {
        self.raw as CUgraph
    }

    fn ctx(&self) -> CUcontext {
        self.ctx as CUcontext
    }

    /// Validates deps and kind; returns (dep indices, raw deps).
    fn prepare(&self, deps: &[NodeId], kind: NodeKind) -> Result<(Vec<u32>, Vec<CUgraphNode>)> {
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

    fn record(
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
    /// [`HostBuffer`] at one end), of their common length. Different lengths are
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

    /// A memory allocation node of `bytes` (> 0) on the graph's device: see the
    /// [module documentation](self) for the lifetime rules of the [`GraphAlloc`] returned.
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

    /// A condition handle for a conditional node of this graph (this builder: a body's own
    /// conditional nodes need a handle of that body). With `default`, each launch starts
    /// with the condition at that value; without, the condition is whatever a kernel last
    /// set, so a kernel must set it before the node reads it. Needs a CUDA 12.3 driver
    /// (`DriverTooOld` otherwise). Every handle should drive a conditional node: the driver
    /// may refuse to instantiate a graph with a handle that drives none.
    pub fn conditional_handle(&mut self, default: Option<u32>) -> Result<ConditionalHandle> {
        ex::require_conditional(ConditionalKind::If)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph of this builder and its device's context.
        let raw = unsafe { ex::conditional_handle_create(self.graph(), self.ctx(), default) }?;
        Ok(ConditionalHandle {
            raw,
            graph: self.reg.graph,
        })
    }

    /// A conditional node of `kind`; `fill(i, body)` fills body `i` (0-based).
    ///
    /// When `fill` fails (or panics), its error is returned, but the conditional node stays
    /// in the graph with the nodes its bodies got so far, whose buffers and closures the
    /// graph keeps alive like any other node's: do not launch a graph whose build failed
    /// half-way unless that partial body is what you want.
    pub fn add_conditional(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        kind: ConditionalKind,
        mut fill: impl FnMut(usize, &mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        if handle.graph != self.reg.graph {
            return Err(BuildError::ForeignHandle {
                handle_graph: handle.graph,
                graph: self.reg.graph,
            }
            .into());
        }
        let nk = NodeKind::Conditional(kind);
        let (idx, raw) = self.prepare(deps, nk)?;
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph and nodes of it; the handle was made for this graph (checked
        // above); the device's context.
        let (node, bodies) =
            unsafe { ex::add_conditional_node(self.graph(), &raw, handle.raw, kind, self.ctx()) }?;
        let id = self.record(idx, node, nk, Vec::new());
        let anchor = ();
        for (i, body) in bodies.into_iter().enumerate() {
            // The nodes a body gets stay in the graph even when its closure fails or panics
            // (the conditional node is already in the graph, and the builder stays usable):
            // the guard hands their owners to this builder on every path, so no later launch
            // reaches a buffer or closure dropped with the body's builder.
            let mut guard = BodyGuard {
                table: &mut self.table,
                owners: &mut self.owners,
                body: Self::body_builder(self.device, self.ctx, body, &anchor),
            };
            let expected = guard.body.reg.graph;
            fill(i, &mut guard.body)?;
            if guard.body.reg.graph != expected || guard.body.handle.is_some() {
                return Err(BuildError::BodyReplaced.into());
            }
        }
        Ok(id)
    }

    fn body_builder<'b>(
        device: Device,
        ctx: usize,
        raw: CUgraph,
        _anchor: &'b (),
    ) -> GraphBuilder<'b> {
        GraphBuilder {
            handle: None,
            raw: raw as usize,
            device,
            ctx,
            reg: Registry::new(true),
            table: NodeTable::default(),
            owners: NodeOwners::new(),
            _body: PhantomData,
        }
    }

    /// An if node: `then` runs when the condition is nonzero (CUDA 12.3).
    pub fn add_if(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        then: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let mut then = Some(then);
        self.add_conditional(deps, handle, ConditionalKind::If, |_, b| {
            match then.take() {
                Some(f) => f(b),
                None => Ok(()),
            }
        })
    }

    /// An if/else node: `then` runs when the condition is nonzero, `otherwise` when it is
    /// zero (CUDA 12.8).
    pub fn add_if_else(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        then: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
        otherwise: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let (mut then, mut otherwise) = (Some(then), Some(otherwise));
        self.add_conditional(deps, handle, ConditionalKind::IfElse, |i, b| {
            if i == 0 {
                then.take().map_or(Ok(()), |f| f(b))
            } else {
                otherwise.take().map_or(Ok(()), |f| f(b))
            }
        })
    }

    /// A while node: `body` runs again and again while the condition is nonzero, checked
    /// before each iteration (so zero iterations when it starts at zero). Something in the
    /// body (or before the node, for the first check) must set the condition, or the loop
    /// never ends (CUDA 12.3).
    pub fn add_while(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        body: impl FnOnce(&mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        let mut body = Some(body);
        self.add_conditional(deps, handle, ConditionalKind::While, |_, b| {
            match body.take() {
                Some(f) => f(b),
                None => Ok(()),
            }
        })
    }

    /// A switch node of `cases` bodies: body `n` runs when the condition is `n`, none when it
    /// is `cases` or more (CUDA 12.8). `fill(n, body)` fills body `n`.
    pub fn add_switch(
        &mut self,
        deps: &[NodeId],
        handle: ConditionalHandle,
        cases: u32,
        fill: impl FnMut(usize, &mut GraphBuilder<'_>) -> Result<()>,
    ) -> Result<NodeId> {
        self.add_conditional(deps, handle, ConditionalKind::Switch(cases), fill)
    }
}

/// Hands a conditional body's nodes and owners to its parent builder when dropped, whether
/// the body's closure returned, failed or panicked.
struct BodyGuard<'p, 'b> {
    table: &'p mut NodeTable,
    owners: &'p mut NodeOwners,
    body: GraphBuilder<'b>,
}

impl Drop for BodyGuard<'_, '_> {
    fn drop(&mut self) {
        self.table.nodes.extend(self.body.table.nodes.drain());
        self.table.by_raw.extend(self.body.table.by_raw.drain());
        self.owners.extend(self.body.owners.drain());
    }
}

#[cfg(feature = "rtc")]
mod typed {
    use super::*;
    use cudars_rtc::{Kernel, KernelArg, KernelArgs};

    impl KernelArg for ConditionalHandle {
        type Raw = u64;
        fn raw(&self) -> u64 {
            self.raw
        }
    }

    impl KernelArg for &GraphAlloc {
        type Raw = u64;
        fn raw(&self) -> u64 {
            self.ptr
        }
    }

    /// The owners of `args`' buffers, for a graph on `device`.
    pub(crate) fn arg_owners<A: KernelArgs>(args: &A, device: Device) -> Result<Vec<Owner>> {
        let mut kept = Vec::new();
        args.keep_alive(device, &mut kept).map_err(Error::other)?;
        Ok(kept.into_iter().map(Owner::Device).collect())
    }

    impl GraphBuilder<'_> {
        /// A kernel node with typed arguments ([`cudars_rtc::KernelArgs`]): checked against
        /// the kernel's parameters like [`Kernel::launch`] (a mismatch is a `cudars_rtc`
        /// error in [`Error::Other`], before the driver call); every [`DevicePtr`] argument
        /// is kept alive by the graph (a `&DeviceMemory` argument is refused: nothing could
        /// keep it alive).
        ///
        /// # Safety
        ///
        /// [`Kernel::launch`]'s contract, at every launch of the graph: the kernel is free of
        /// undefined behaviour with these arguments on this grid, and a [`GraphAlloc`]
        /// argument is used only between its allocation and free nodes.
        pub unsafe fn add_kernel_typed<A: KernelArgs>(
            &mut self,
            deps: &[NodeId],
            kernel: &Kernel,
            config: &LaunchConfig,
            args: A,
        ) -> Result<NodeId> {
            kernel.check::<A>().map_err(Error::other)?;
            let function = kernel.function();
            if function.device() != self.device {
                return Err(wrong_device("kernel", self.device, function.device()));
            }
            let owners = arg_owners(&args, self.device)?;
            let (idx, raw) = self.prepare(deps, NodeKind::Kernel)?;
            let _ctx = self.device.bind()?;
            let graph = self.graph();
            // SAFETY: a live graph and nodes of it; the arguments match the parameters
            // (checked above) and point at values alive for the call; the buffers are kept
            // by the graph (owners); the caller upholds the kernel's contract.
            let node = args.with_params(|params| unsafe {
                ex::add_kernel_node(graph, &raw, function, config, params)
            })?;
            Ok(self.record(idx, node, NodeKind::Kernel, owners))
        }
    }
}

#[cfg(feature = "rtc")]
pub(crate) use typed::arg_owners;

#[cfg(test)]
mod tests {
    use super::*;

    fn reg_with(n: usize) -> Registry {
        let mut r = Registry::new(false);
        for i in 0..n {
            let deps = if i == 0 { vec![] } else { vec![i as u32 - 1] };
            r.push(deps);
        }
        r
    }

    #[test]
    fn nodes_of_another_graph_are_refused() {
        let a = reg_with(2);
        let b = reg_with(1);
        let foreign = b.id(0);
        match a.check_deps(&[a.id(0), foreign]) {
            Err(BuildError::ForeignNode { node, graph }) => {
                assert_eq!(node, foreign);
                assert_eq!(graph, a.graph);
            }
            other => panic!("{other:?}"),
        }
        // A forged index past the end counts as foreign too.
        let forged = NodeId {
            graph: a.graph,
            index: 99,
        };
        assert!(matches!(
            a.check_deps(&[forged]),
            Err(BuildError::ForeignNode { .. })
        ));
        assert_ne!(a.graph, b.graph);
    }

    #[test]
    fn repeated_dependencies_count_once_and_empty_is_fine() {
        let a = reg_with(3);
        assert_eq!(
            a.check_deps(&[a.id(2), a.id(0), a.id(2)]).unwrap(),
            vec![2, 0]
        );
        assert!(a.check_deps(&[]).unwrap().is_empty());
        let empty = Registry::new(false);
        assert_eq!(empty.len(), 0);
        assert!(!empty.has_unfreed());
    }

    #[test]
    fn reachability_follows_transitive_dependencies() {
        let mut r = reg_with(3); // 0 <- 1 <- 2
        let side = r.push(vec![]); // 3, independent
        assert!(r.reaches(&[2], 0));
        assert!(r.reaches(&[2], 2));
        assert!(!r.reaches(&[2], side.index));
        assert!(!r.reaches(&[], 0));
    }

    #[test]
    fn bodies_refuse_host_event_and_memory_nodes() {
        let body = Registry::new(true);
        for kind in [
            NodeKind::Host,
            NodeKind::EventRecord,
            NodeKind::EventWait,
            NodeKind::MemAlloc,
            NodeKind::MemFree,
        ] {
            assert_eq!(
                body.check_kind(kind),
                Err(BuildError::NotAllowedInBody { kind: kind.name() })
            );
        }
        for kind in [
            NodeKind::Kernel,
            NodeKind::Memcpy,
            NodeKind::Memset,
            NodeKind::Empty,
            NodeKind::Child,
            NodeKind::Conditional(ConditionalKind::While),
        ] {
            body.check_kind(kind).unwrap();
        }
        Registry::new(false).check_kind(NodeKind::Host).unwrap();
    }

    fn alloc_in(r: &mut Registry, deps: Vec<u32>) -> GraphAlloc {
        let node = r.push(deps);
        r.note_alloc(node);
        GraphAlloc {
            ptr: 0x1000,
            len: 64,
            node,
        }
    }

    #[test]
    fn graph_allocations_are_used_in_order_and_freed_after_their_uses() {
        let mut r = Registry::new(false);
        let before = r.push(vec![]);
        let a = alloc_in(&mut r, vec![]);
        // A use must depend on the allocation node.
        assert_eq!(
            r.check_alloc_use(&a, &[before.index]),
            Err(BuildError::NotOrderedAfterAllocation { alloc: a.node })
        );
        r.check_alloc_use(&a, &[a.node.index]).unwrap();
        let user = r.push(vec![a.node.index]);
        r.note_use(&a, user);
        let other = r.push(vec![a.node.index]);
        r.note_use(&a, other);
        // The free must depend on every use.
        assert_eq!(
            r.check_free(&a, &[user.index]),
            Err(BuildError::UseNotBeforeFree { user: other })
        );
        assert!(r.has_unfreed());
        r.check_free(&a, &[user.index, other.index]).unwrap();
        let free = r.push(vec![user.index, other.index]);
        r.note_free(&a, free);
        assert!(!r.has_unfreed());
        // After the free: no use, no second free.
        let err = Err(BuildError::AllocationFreed {
            alloc: a.node,
            free,
        });
        assert_eq!(r.check_alloc_use(&a, &[free.index]), err);
        assert_eq!(r.check_free(&a, &[free.index]), err);
        // Another graph's allocation.
        let other_graph = Registry::new(false);
        assert!(matches!(
            other_graph.check_alloc_use(&a, &[]),
            Err(BuildError::ForeignAllocation { .. })
        ));
    }

    #[test]
    fn memset_and_copy_shapes_are_checked() {
        let reg = Registry::new(false);
        let a = GraphAlloc {
            ptr: 0x1002,
            len: 6,
            node: reg.id(0),
        };
        assert_eq!(
            memset_target(&DeviceMem::Alloc(&a), 1).unwrap(),
            (0x1002, 6)
        );
        assert_eq!(
            memset_target(&DeviceMem::Alloc(&a), 2).unwrap(),
            (0x1002, 3)
        );
        assert!(matches!(
            memset_target(&DeviceMem::Alloc(&a), 4),
            Err(Error::Build(BuildError::Misaligned { element: 4, .. }))
        ));
        let empty = GraphAlloc { len: 0, ..a };
        assert!(matches!(
            memset_target(&DeviceMem::Alloc(&empty), 1),
            Err(Error::Build(BuildError::Empty { .. }))
        ));
        let b = GraphAlloc { len: 8, ..a };
        assert!(matches!(
            copy_size(&Mem::from(&a), &Mem::from(&b)),
            Err(Error::Cuda(cudars_core::Error::SizeMismatch {
                dst: 6,
                src: 8,
                ..
            }))
        ));
        assert_eq!(copy_size(&Mem::from(&a), &Mem::from(&a)).unwrap(), 6);
        assert!(matches!(
            copy_size(&Mem::from(&empty), &Mem::from(&empty)),
            Err(Error::Build(BuildError::Empty { .. }))
        ));
    }

    #[test]
    fn pitched_copies_stay_inside_both_buffers() {
        let reg = Registry::new(false);
        let alloc = |len| GraphAlloc {
            ptr: 0x1000,
            len,
            node: reg.id(0),
        };
        let (big, small) = (alloc(4096), alloc(1000));
        let e = Extent {
            width: 100,
            height: 10,
            depth: 2,
        };
        // 2 slices of 16 rows of 128 bytes: (1 * 16 + 9) * 128 + 100 = 3300 bytes needed.
        let ok = Pitched::new(&big, 128, 16);
        check_pitched(&ok, &ok, e).unwrap();
        assert!(matches!(
            check_pitched(&Pitched::new(&small, 128, 16), &ok, e),
            Err(Error::Cuda(cudars_core::Error::OutOfRange {
                len: 3300,
                size: 1000,
                ..
            }))
        ));
        assert!(matches!(
            check_pitched(&Pitched::new(&big, 64, 16), &ok, e),
            Err(Error::Build(BuildError::BadPitch {
                end: "destination",
                ..
            }))
        ));
        assert!(matches!(
            check_pitched(&ok, &Pitched::new(&big, 128, 4), e),
            Err(Error::Build(BuildError::BadPitch { end: "source", .. }))
        ));
        // A 2-D copy does not look at the rows per slice.
        let flat = Extent { depth: 1, ..e };
        check_pitched(&ok, &Pitched::new(&big, 128, 0), flat).unwrap();
        assert!(matches!(
            check_pitched(&ok, &ok, Extent { width: 0, ..e }),
            Err(Error::Build(BuildError::Empty { .. }))
        ));
        let huge = Extent {
            width: 1,
            height: 2,
            depth: usize::MAX,
        };
        assert!(matches!(
            check_pitched(&ok, &ok, huge),
            Err(Error::Cuda(cudars_core::Error::SizeOverflow(_)))
        ));
    }

    #[test]
    fn errors_name_nodes_and_reasons() {
        let r = reg_with(1);
        let e = BuildError::ForeignNode {
            node: r.id(0),
            graph: 5,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "node #0 of graph #{} belongs to another graph than graph #5",
                r.graph
            )
        );
        let text = describe_refusal(UpdateRefusal::TopologyChanged, Some(r.id(0)), None);
        assert!(text.contains("the topology changed"), "{text}");
        assert!(text.contains("at node #0"), "{text}");
        let e = Error::UpdateRefused {
            refusal: UpdateRefusal::ParametersChanged,
            node: None,
            from: None,
        };
        assert!(e.to_string().contains("parameters changed"), "{e}");
        assert!(SET_CONDITIONAL_PRELUDE.contains("cudaGraphSetConditional"));
        assert_eq!(ConditionalKind::Switch(3).bodies(), 3);
        assert_eq!(ConditionalKind::IfElse.bodies(), 2);
        assert!(ConditionalKind::IfElse.min_driver() > ConditionalKind::While.min_driver());
    }

    #[test]
    fn host_callbacks_run_and_panics_are_caught() {
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = Arc::clone(&hits);
        let (cb, data) = host_callback(move || {
            if h.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("second call panics");
            }
        });
        for _ in 0..3 {
            // SAFETY: `data` points at `cb`, alive here.
            unsafe { host_trampoline(data) };
        }
        assert_eq!(hits.load(Ordering::SeqCst), 3);
        drop(cb);
    }
}
