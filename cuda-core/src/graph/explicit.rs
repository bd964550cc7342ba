//! Thin wrappers over the driver's explicit graph construction and in-place update calls, for
//! `cuda-graph`'s graph builder (which adds the node handles, validation, keep-alive and
//! typed update errors on top).
//!
//! | here | driver |
//! | --- | --- |
//! | [`GraphHandle::new`] | `cuGraphCreate` |
//! | [`add_kernel_node`], [`add_memcpy_node`], [`add_memset_node`], [`add_host_node`] | `cuGraphAddKernelNode`, `cuGraphAddMemcpyNode`, `cuGraphAddMemsetNode`, `cuGraphAddHostNode` |
//! | [`add_event_record_node`], [`add_event_wait_node`], [`add_child_graph_node`], [`add_empty_node`] | `cuGraphAddEventRecordNode`, `cuGraphAddEventWaitNode`, `cuGraphAddChildGraphNode`, `cuGraphAddEmptyNode` |
//! | [`add_mem_alloc_node`], [`add_mem_free_node`] | `cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode` |
//! | [`conditional_handle_create`], [`add_conditional_node`] | `cuGraphConditionalHandleCreate`, `cuGraphAddNode` (12.3+) |
//! | [`GraphExecHandle::set_kernel_params`] and the memcpy, memset and host setters | `cuGraphExec*NodeSetParams` |
//! | [`GraphExecHandle::update_detailed`] | `cuGraphExecUpdate`, with the node the driver blamed |
//! | [`GraphHandle::instantiate_with_params`] | `cuGraphInstantiateWithParams` (upload stream, device launch) |
//!
//! Every node function is `unsafe`: the graph is passed as a raw `CUgraph` (a conditional
//! node's body graphs belong to the node, not to a [`GraphHandle`]), and the driver reads
//! the addresses a node uses at every launch, long after the call. In their contracts, "every
//! executable graph made from `graph`" also means every executable graph updated from it
//! ([`GraphExecHandle::update`], [`GraphExecHandle::update_detailed`]) and those made from or
//! updated from a graph that embeds it as a child: each of them runs its nodes too.

use std::ffi::c_void;
use std::sync::Arc;

use cudars_sys::compat::{ConditionalNodeParams, GraphNodeParams};
use cudars_sys::{
    CUcontext, CUdeviceptr, CUgraph, CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo,
    CUgraphNode, CUresult, CUDA_HOST_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS,
};

use super::{refusal_from_raw, GraphExecHandle, GraphHandle, InstantiateFlags, UpdateRefusal};
use crate::driver::drv;
use crate::error::{Error, Result};
use crate::memory::DeviceAlloc;
use crate::module::{Function, LaunchConfig};
use crate::{Device, Event, Stream};

/// The driver's host function type (`CUhostFn`).
pub type HostFn = unsafe extern "C" fn(*mut c_void);

impl GraphHandle {
    /// An empty graph for `device` (`cuGraphCreate`): add nodes with the functions of
    /// [`explicit`](self).
    pub fn new(device: &Device) -> Result<GraphHandle> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
        let _ctx = device.bind()?;
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags must be 0.
        unsafe { drv!(cuGraphCreate(&mut raw, 0)) }?;
        Ok(GraphHandle {
            raw,
            device: *device,
            keep: Arc::default(),
        })
    }

    /// The owners this graph keeps alive (those of the safe view operations captured into
    /// it): a graph that embeds this one as a child keeps them too.
    pub fn kept_alive(&self) -> &[Arc<dyn DeviceAlloc>] {
        &self.keep
    }

    /// An executable graph made with `cuGraphInstantiateWithParams`: `flags` (among them
    /// [`InstantiateFlags::UPLOAD`], which needs `upload`, and
    /// [`InstantiateFlags::DEVICE_LAUNCH`]) and the stream the upload goes to. On failure
    /// the error names the driver's instantiate result and, when the driver blamed one, the
    /// node in `error_node`.
    pub fn instantiate_with_params(
        &self,
        flags: InstantiateFlags,
        upload: Option<&Stream>,
        error_node: &mut CUgraphNode,
    ) -> Result<GraphExecHandle> {
        if let Some(stream) = upload {
            stream.expect_device(self.device)?;
        }
        let _ctx = self.device.bind()?;
        let mut params = cudars_sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
            flags: flags.0,
            hUploadStream: upload.map_or(std::ptr::null_mut(), Stream::raw),
            hErrNode_out: std::ptr::null_mut(),
            result_out: cudars_sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS,
        };
        let mut raw: cudars_sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph; valid out-pointers; the upload stream (if any) belongs to the
        // graph's device, whose context is current.
        let made = unsafe {
            drv!(cuGraphInstantiateWithParams(
                &mut raw,
                self.raw,
                &mut params
            ))
        };
        *error_node = params.hErrNode_out;
        made?;
        Ok(GraphExecHandle {
            raw,
            device: self.device,
            keep: Arc::clone(&self.keep),
        })
    }
}

impl InstantiateFlags {
    /// Upload the graph to the device as part of instantiation, on the stream given to
    /// [`GraphHandle::instantiate_with_params`].
    pub const UPLOAD: InstantiateFlags = InstantiateFlags(
        cudars_sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64,
    );
    /// Make the executable graph launchable from the device (`cudaGraphLaunch` in a
    /// kernel). The graph may then hold only kernel, memcpy and memset nodes on one device.
    pub const DEVICE_LAUNCH: InstantiateFlags = InstantiateFlags(
        cudars_sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH.0 as u64,
    );

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: InstantiateFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

fn deps_ptr(deps: &[CUgraphNode]) -> *const CUgraphNode {
    if deps.is_empty() {
        std::ptr::null()
    } else {
        deps.as_ptr()
    }
}

/// The driver's kernel node parameters for `function` launched as `config` with `params`.
/// Cluster dimensions are not carried (a kernel node takes them as a node attribute).
pub fn kernel_node_params(
    function: &Function,
    config: &LaunchConfig,
    params: &mut [*mut c_void],
) -> Result<CUDA_KERNEL_NODE_PARAMS> {
    let (g, b) = (config.grid, config.block);
    if g.0 == 0 || g.1 == 0 || g.2 == 0 || b.0 == 0 || b.1 == 0 || b.2 == 0 {
        return Err(Error::InvalidArgument(format!(
            "kernel node {}: grid {g:?} and block {b:?} must have no zero dimension",
            function.name()
        )));
    }
    if config.cluster.is_some() {
        return Err(Error::Unsupported(
            "thread-block clusters on a kernel node (set them as a node attribute)",
        ));
    }
    Ok(CUDA_KERNEL_NODE_PARAMS {
        func: function.raw(),
        gridDimX: g.0,
        gridDimY: g.1,
        gridDimZ: g.2,
        blockDimX: b.0,
        blockDimY: b.1,
        blockDimZ: b.2,
        sharedMemBytes: config.shared_mem_bytes,
        kernelParams: if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        },
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    })
}

/// Adds a kernel node (`cuGraphAddKernelNode`). The driver copies the argument values now.
///
/// # Safety
///
/// `graph` is a live graph of `function`'s device, `deps` are nodes of it; `params` holds one
/// pointer per kernel parameter, each to a live value of exactly that parameter's type and
/// size; every address the kernel dereferences stays valid, and the kernel is free of
/// undefined behaviour, for every launch of every executable graph made from `graph`.
pub unsafe fn add_kernel_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    function: &Function,
    config: &LaunchConfig,
    params: &mut [*mut c_void],
) -> Result<CUgraphNode> {
    let p = kernel_node_params(function, config, params)?;
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract; `p` and the argument values live for the call.
    unsafe {
        drv!(cuGraphAddKernelNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            &p
        ))
    }?;
    Ok(node)
}

/// One end of a one-dimensional copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyEnd {
    /// A device (or managed, or mapped) address.
    Device(CUdeviceptr),
    /// A host address (pinned memory, for a copy a graph can run asynchronously).
    Host(*mut c_void),
}

/// The driver's parameters of a one-dimensional copy of `bytes` from `src` to `dst`.
pub fn memcpy_1d_params(dst: CopyEnd, src: CopyEnd, bytes: usize) -> CUDA_MEMCPY3D {
    use cudars_sys::CUmemorytype;
    // SAFETY: CUDA_MEMCPY3D is plain data; all zeros is its documented "unused" state.
    let mut p: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    match src {
        CopyEnd::Device(d) => {
            p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
            p.srcDevice = d;
        }
        CopyEnd::Host(h) => {
            p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            p.srcHost = h;
        }
    }
    match dst {
        CopyEnd::Device(d) => {
            p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
            p.dstDevice = d;
        }
        CopyEnd::Host(h) => {
            p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            p.dstHost = h;
        }
    }
    // One row of one slice: the pitches and heights describe exactly that row.
    p.srcPitch = bytes;
    p.dstPitch = bytes;
    p.srcHeight = 1;
    p.dstHeight = 1;
    p.WidthInBytes = bytes;
    p.Height = 1;
    p.Depth = 1;
    p
}

/// The driver's parameters of a pitched copy of `depth` slices of `height` rows of `width`
/// bytes: row `r` of slice `z` starts `(z * rows + r) * pitch` bytes into each end, with
/// each end's own pitch and rows per slice (`(pitch, rows)`).
pub fn memcpy_3d_params(
    dst: (CopyEnd, usize, usize),
    src: (CopyEnd, usize, usize),
    width: usize,
    height: usize,
    depth: usize,
) -> CUDA_MEMCPY3D {
    let mut p = memcpy_1d_params(dst.0, src.0, width);
    p.dstPitch = dst.1;
    p.dstHeight = dst.2;
    p.srcPitch = src.1;
    p.srcHeight = src.2;
    p.Height = height;
    p.Depth = depth;
    p
}

/// Adds a copy node (`cuGraphAddMemcpyNode`): one-dimensional ([`memcpy_1d_params`]) or
/// pitched ([`memcpy_3d_params`]).
///
/// # Safety
///
/// `graph` is live, `deps` are nodes of it, `ctx` is the graph's device's context; both
/// ranges stay valid (allocated, pinned for a host end) for every launch of every executable
/// graph made from `graph`, and nothing else accesses them in a conflicting way meanwhile.
pub unsafe fn add_memcpy_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    params: &CUDA_MEMCPY3D,
    ctx: CUcontext,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddMemcpyNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            params,
            ctx
        ))
    }?;
    Ok(node)
}

/// The driver's parameters of a memset of `count` elements of `element_size` bytes (1, 2 or
/// 4) to `value`.
pub fn memset_params(
    dst: CUdeviceptr,
    value: u32,
    element_size: u32,
    count: usize,
) -> CUDA_MEMSET_NODE_PARAMS {
    CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: 0,
        value,
        elementSize: element_size,
        width: count,
        height: 1,
    }
}

/// Adds a memset node (`cuGraphAddMemsetNode`).
///
/// # Safety
///
/// As [`add_memcpy_node`], for the destination range.
pub unsafe fn add_memset_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    params: &CUDA_MEMSET_NODE_PARAMS,
    ctx: CUcontext,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddMemsetNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            params,
            ctx
        ))
    }?;
    Ok(node)
}

/// Adds a host function node (`cuGraphAddHostNode`): `function(data)` runs on a driver
/// thread at each launch.
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; `function(data)` is sound to call from any
/// thread at every launch of every executable graph made from `graph` (so `data` stays
/// valid until the last of those launches completes), and makes no CUDA call.
pub unsafe fn add_host_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    function: HostFn,
    data: *mut c_void,
) -> Result<CUgraphNode> {
    let p = CUDA_HOST_NODE_PARAMS {
        fn_: Some(function),
        userData: data,
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddHostNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            &p
        ))
    }?;
    Ok(node)
}

/// Adds an empty node (`cuGraphAddEmptyNode`): a join point for dependencies.
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it.
pub unsafe fn add_empty_node(graph: CUgraph, deps: &[CUgraphNode]) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddEmptyNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len()
        ))
    }?;
    Ok(node)
}

/// Adds an event record node (`cuGraphAddEventRecordNode`).
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; `event` stays alive for every launch of every
/// executable graph made from `graph`.
pub unsafe fn add_event_record_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    event: &Event,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddEventRecordNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            event.raw()
        ))
    }?;
    Ok(node)
}

/// Adds an event wait node (`cuGraphAddEventWaitNode`).
///
/// # Safety
///
/// As [`add_event_record_node`].
pub unsafe fn add_event_wait_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    event: &Event,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddEventWaitNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            event.raw()
        ))
    }?;
    Ok(node)
}

/// Adds a child graph node (`cuGraphAddChildGraphNode`): the driver embeds a copy of `child`,
/// which stays the caller's.
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; whatever `child`'s nodes use stays valid for
/// every launch of every executable graph made from `graph`.
pub unsafe fn add_child_graph_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    child: &GraphHandle,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract; `child` is a live graph.
    unsafe {
        drv!(cuGraphAddChildGraphNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            child.raw()
        ))
    }?;
    Ok(node)
}

/// Adds a memory allocation node (`cuGraphAddMemAllocNode`) of `bytes` on `device`: returns
/// the node and the address every launch allocates (the same one each time).
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; the address is used only by nodes that the
/// allocation node precedes and that precede its free (in this graph, or later on the
/// stream before a `cuMemFreeAsync`).
pub unsafe fn add_mem_alloc_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    device: &Device,
    bytes: usize,
) -> Result<(CUgraphNode, CUdeviceptr)> {
    use cudars_sys::{CUmemAllocationType, CUmemLocationType};
    // SAFETY: CUDA_MEM_ALLOC_NODE_PARAMS is plain data; zero is "unset" for each field.
    let mut p: cudars_sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
    p.poolProps.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location = cudars_sys::compat::mem_location(
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        device.ordinal() as i32,
    );
    p.bytesize = bytes;
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract; `p` lives for the call and receives the address.
    unsafe {
        drv!(cuGraphAddMemAllocNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            &mut p
        ))
    }?;
    Ok((node, p.dptr))
}

/// Adds a memory free node (`cuGraphAddMemFreeNode`) for `ptr`, an address of an allocation
/// node of this graph.
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; every node that uses `ptr` precedes this one.
pub unsafe fn add_mem_free_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    ptr: CUdeviceptr,
) -> Result<CUgraphNode> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    unsafe {
        drv!(cuGraphAddMemFreeNode(
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            ptr
        ))
    }?;
    Ok(node)
}

/// A conditional node's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionalKind {
    /// Runs its body once when the condition is nonzero (CUDA 12.3).
    If,
    /// Runs its first body when the condition is nonzero, its second otherwise (CUDA 12.8).
    IfElse,
    /// Runs its body while the condition is nonzero, checked before each iteration (12.3).
    While,
    /// Runs body `n` when the condition is `n`, none when it is past the last (12.8).
    Switch(u32),
}

impl ConditionalKind {
    /// The oldest driver that has it (`1000 * major + 10 * minor`).
    pub fn min_driver(self) -> u32 {
        match self {
            ConditionalKind::If | ConditionalKind::While => cudars_sys::compat::CUDA_12_3,
            ConditionalKind::IfElse | ConditionalKind::Switch(_) => cudars_sys::compat::CUDA_12_8,
        }
    }

    /// How many body graphs the node has.
    pub fn bodies(self) -> u32 {
        match self {
            ConditionalKind::If | ConditionalKind::While => 1,
            ConditionalKind::IfElse => 2,
            ConditionalKind::Switch(n) => n,
        }
    }

    /// The name errors use.
    pub fn name(self) -> &'static str {
        match self {
            ConditionalKind::If => "conditional if node",
            ConditionalKind::IfElse => "conditional if/else node",
            ConditionalKind::While => "conditional while node",
            ConditionalKind::Switch(_) => "conditional switch node",
        }
    }
}

/// [`Error::DriverTooOld`] unless the running driver has `kind`.
pub fn require_conditional(kind: ConditionalKind) -> Result<()> {
    let driver = crate::driver_version()?;
    if driver.0 < kind.min_driver() {
        return Err(Error::DriverTooOld {
            symbol: kind.name(),
            driver,
            needed: crate::CudaVersion(kind.min_driver()),
        });
    }
    Ok(())
}

/// A condition handle of `graph` (`cuGraphConditionalHandleCreate`, CUDA 12.3): set to
/// `default` at the start of each launch when given, else left as the last launch set it
/// (zero at first).
///
/// # Safety
///
/// `graph` is a live graph and `ctx` its device's context.
pub unsafe fn conditional_handle_create(
    graph: CUgraph,
    ctx: CUcontext,
    default: Option<u32>,
) -> Result<u64> {
    let mut handle = 0u64;
    let (value, flags) = match default {
        Some(v) => (v, cudars_sys::compat::GRAPH_COND_ASSIGN_DEFAULT),
        None => (0, 0),
    };
    // SAFETY: the caller's contract; valid out-pointer.
    unsafe {
        drv!(graph_conditional_handle_create as "cuGraphConditionalHandleCreate" (
            &mut handle,
            graph,
            ctx,
            value,
            flags
        ))
    }?;
    Ok(handle)
}

/// Adds a conditional node (`cuGraphAddNode`) driven by `handle`: returns the node and its
/// body graphs (owned by the node: they live as long as `graph` and are destroyed with it).
/// A kind the driver lacks is [`Error::DriverTooOld`], before the call.
///
/// # Safety
///
/// `graph` is live and `deps` are nodes of it; `handle` was created for `graph`; `ctx` is
/// its device's context.
pub unsafe fn add_conditional_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    handle: u64,
    kind: ConditionalKind,
    ctx: CUcontext,
) -> Result<(CUgraphNode, Vec<CUgraph>)> {
    use cudars_sys::compat::{GRAPH_COND_TYPE_IF, GRAPH_COND_TYPE_SWITCH, GRAPH_COND_TYPE_WHILE};
    require_conditional(kind)?;
    let size = kind.bodies();
    if size == 0 {
        return Err(Error::InvalidArgument(
            "a switch node needs at least one body".into(),
        ));
    }
    let type_ = match kind {
        ConditionalKind::If | ConditionalKind::IfElse => GRAPH_COND_TYPE_IF,
        ConditionalKind::While => GRAPH_COND_TYPE_WHILE,
        ConditionalKind::Switch(_) => GRAPH_COND_TYPE_SWITCH,
    };
    let mut params = GraphNodeParams::conditional(ConditionalNodeParams {
        handle,
        type_,
        size,
        // Out: the driver points this at its own array of `size` body graphs.
        ph_graph_out: std::ptr::null_mut(),
        ctx,
    });
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: the caller's contract; `params` lives for the call.
    unsafe {
        drv!(graph_add_conditional_node as "cuGraphAddNode" (
            &mut node,
            graph,
            deps_ptr(deps),
            deps.len(),
            &mut params
        ))
    }?;
    // SAFETY: `params` is what the successful call left: `ph_graph_out` (passed null) now
    // points at the node's array of `size` body graphs, or is still null.
    let bodies = unsafe { body_graphs(&params.conditional) }?;
    Ok((node, bodies))
}

/// The body graphs a conditional node's creation left in `params`. The driver documents
/// `phGraph_out` as a CUDA-owned array it populates, and NVIDIA's own examples pass none and
/// read the driver's pointer back: so the array is read from wherever `ph_graph_out` points
/// after the call (the caller's array, filled, or the driver's own). A null pointer or a null
/// body is [`Error::InvalidArgument`]: a body builder must never add nodes to a null graph.
///
/// # Safety
///
/// `params` is what a successful `cuGraphAddNode` of a conditional node left: a null
/// `ph_graph_out`, or a pointer to `size` graphs alive for the call.
pub(crate) unsafe fn body_graphs(params: &ConditionalNodeParams) -> Result<Vec<CUgraph>> {
    let bad = || {
        Error::InvalidArgument("the driver returned no body graph for a conditional node".into())
    };
    if params.ph_graph_out.is_null() {
        return Err(bad());
    }
    // SAFETY: the caller's contract: `size` graphs at `ph_graph_out`.
    let bodies =
        unsafe { std::slice::from_raw_parts(params.ph_graph_out, params.size as usize) }.to_vec();
    if bodies.iter().any(|b| b.is_null()) {
        return Err(bad());
    }
    Ok(bodies)
}

/// Why [`GraphExecHandle::update_detailed`] refused, and the node the driver blamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateFailure {
    /// The reason.
    pub refusal: UpdateRefusal,
    /// The node of the new graph the driver blamed (null when it named none).
    pub node: CUgraphNode,
    /// For a topology change, the node at the other end of the edge that differs (or null).
    pub from_node: CUgraphNode,
}

impl GraphExecHandle {
    /// [`update`](Self::update) that also says which node the driver blamed. Like it, keeps
    /// alive what `graph` keeps (the memory of its captured operations) on success.
    pub fn update_detailed(
        &mut self,
        graph: &GraphHandle,
    ) -> Result<std::result::Result<(), UpdateFailure>> {
        let _ctx = self.device.bind()?;
        // The source graph's nodes name objects of its generation (kernels, addresses).
        crate::health::usable(&graph.device())?;
        let mut info = CUgraphExecUpdateResultInfo {
            result: CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: std::ptr::null_mut(),
            errorFromNode: std::ptr::null_mut(),
        };
        // SAFETY: live graphs; valid out-pointer.
        match unsafe { drv!(cuGraphExecUpdate(self.raw, graph.raw, &mut info)) } {
            Ok(()) => {
                if !graph.keep.is_empty() {
                    let mut keep: Vec<_> = self.keep.iter().cloned().collect();
                    keep.extend(graph.keep.iter().cloned());
                    self.keep = Arc::new(keep);
                }
                Ok(Ok(()))
            }
            Err(Error::Driver(e))
                if e.result() == CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE =>
            {
                Ok(Err(UpdateFailure {
                    refusal: refusal_from_raw(info.result),
                    node: info.errorNode,
                    from_node: info.errorFromNode,
                }))
            }
            Err(e) => Err(e),
        }
    }

    /// Sets a kernel node's launch and arguments for later launches
    /// (`cuGraphExecKernelNodeSetParams`). The function must be the node's, or one the
    /// driver accepts in its place.
    ///
    /// # Safety
    ///
    /// `node` is a kernel node of the graph this was instantiated from; the contract of
    /// [`add_kernel_node`] holds for the new arguments.
    pub unsafe fn set_kernel_params(
        &self,
        node: CUgraphNode,
        function: &Function,
        config: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let p = kernel_node_params(function, config, params)?;
        let _ctx = self.device.bind()?;
        // SAFETY: the caller's contract; `p` lives for the call.
        unsafe { drv!(cuGraphExecKernelNodeSetParams(self.raw, node, &p)) }
    }

    /// Sets a copy node's parameters (`cuGraphExecMemcpyNodeSetParams`): same kinds of
    /// memory, other addresses and size.
    ///
    /// # Safety
    ///
    /// `node` is a copy node of the graph this was instantiated from; the contract of
    /// [`add_memcpy_node`] holds for the new ranges.
    pub unsafe fn set_memcpy_params(
        &self,
        node: CUgraphNode,
        params: &CUDA_MEMCPY3D,
        ctx: CUcontext,
    ) -> Result<()> {
        let _ctx = self.device.bind()?;
        // SAFETY: the caller's contract.
        unsafe { drv!(cuGraphExecMemcpyNodeSetParams(self.raw, node, params, ctx)) }
    }

    /// Sets a memset node's parameters (`cuGraphExecMemsetNodeSetParams`).
    ///
    /// # Safety
    ///
    /// `node` is a memset node of the graph this was instantiated from; the contract of
    /// [`add_memset_node`] holds for the new range.
    pub unsafe fn set_memset_params(
        &self,
        node: CUgraphNode,
        params: &CUDA_MEMSET_NODE_PARAMS,
        ctx: CUcontext,
    ) -> Result<()> {
        let _ctx = self.device.bind()?;
        // SAFETY: the caller's contract.
        unsafe { drv!(cuGraphExecMemsetNodeSetParams(self.raw, node, params, ctx)) }
    }

    /// Sets a host node's function and data (`cuGraphExecHostNodeSetParams`).
    ///
    /// # Safety
    ///
    /// `node` is a host node of the graph this was instantiated from; the contract of
    /// [`add_host_node`] holds for the new function and data.
    pub unsafe fn set_host_params(
        &self,
        node: CUgraphNode,
        function: HostFn,
        data: *mut c_void,
    ) -> Result<()> {
        let p = CUDA_HOST_NODE_PARAMS {
            fn_: Some(function),
            userData: data,
        };
        let _ctx = self.device.bind()?;
        // SAFETY: the caller's contract; `p` lives for the call.
        unsafe { drv!(cuGraphExecHostNodeSetParams(self.raw, node, &p)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_graphs_are_read_from_where_the_driver_left_them() {
        let params = |out: *mut CUgraph, size: u32| ConditionalNodeParams {
            handle: 1,
            type_: 0,
            size,
            ph_graph_out: out,
            ctx: std::ptr::null_mut(),
        };
        // The caller's array, filled in place.
        let mut mine = [0x100usize as CUgraph, 0x200usize as CUgraph];
        // SAFETY: two graphs at the pointer, alive for the call.
        let got = unsafe { body_graphs(&params(mine.as_mut_ptr(), 2)) }.unwrap();
        assert_eq!(got, mine.to_vec());
        // The driver's own array, put in place of the caller's pointer.
        let mut drivers = [0x300usize as CUgraph];
        // SAFETY: one graph at the pointer.
        let got = unsafe { body_graphs(&params(drivers.as_mut_ptr(), 1)) }.unwrap();
        assert_eq!(got, vec![0x300usize as CUgraph]);
        // No array, or a null body (the caller's array left unfilled): refused.
        // SAFETY: a null pointer is checked first.
        let none = unsafe { body_graphs(&params(std::ptr::null_mut(), 1)) };
        assert!(matches!(none, Err(Error::InvalidArgument(_))));
        let mut unfilled: [CUgraph; 2] = [std::ptr::null_mut(); 2];
        // SAFETY: two graphs at the pointer.
        let unfilled = unsafe { body_graphs(&params(unfilled.as_mut_ptr(), 2)) };
        assert!(matches!(unfilled, Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn conditional_kinds_name_their_driver_and_bodies() {
        assert_eq!(ConditionalKind::If.min_driver(), 12030);
        assert_eq!(ConditionalKind::While.min_driver(), 12030);
        assert_eq!(ConditionalKind::IfElse.min_driver(), 12080);
        assert_eq!(ConditionalKind::Switch(5).min_driver(), 12080);
        assert_eq!(ConditionalKind::While.bodies(), 1);
        assert_eq!(ConditionalKind::IfElse.bodies(), 2);
        assert_eq!(ConditionalKind::Switch(5).bodies(), 5);
        assert!(ConditionalKind::Switch(0).name().contains("switch"));
    }

    #[test]
    fn one_dimensional_copies_and_memsets_fill_the_driver_structs() {
        let p = memcpy_1d_params(
            CopyEnd::Device(0x2000),
            CopyEnd::Host(0x10 as *mut c_void),
            96,
        );
        assert_eq!(p.dstDevice, 0x2000);
        assert_eq!(p.srcHost as usize, 0x10);
        assert_eq!((p.WidthInBytes, p.Height, p.Depth), (96, 1, 1));
        assert_eq!(
            p.srcMemoryType,
            cudars_sys::CUmemorytype::CU_MEMORYTYPE_HOST
        );
        assert_eq!(
            p.dstMemoryType,
            cudars_sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
        );
        let m = memset_params(0x3000, 7, 4, 10);
        assert_eq!(
            (m.dst, m.value, m.elementSize, m.width, m.height),
            (0x3000, 7, 4, 10, 1)
        );
        assert!(InstantiateFlags::UPLOAD.contains(InstantiateFlags::NONE));
        assert!((InstantiateFlags::UPLOAD | InstantiateFlags::DEVICE_LAUNCH)
            .contains(InstantiateFlags::DEVICE_LAUNCH));
    }
}
