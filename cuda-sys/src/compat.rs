//! One API over CUDA 12.0 through 13.x: the entry points whose shape changed between the two
//! majors, with their CUDA 13.0 shapes, whatever headers the bindings came from and whatever
//! driver is loaded.
//!
//! The generated [`Driver`] methods have the shapes of the headers the build found, and the
//! loader hands each one out only when the driver has the ABI the binding declares (see
//! [`EntryPoint::since`](crate::EntryPoint::since)). The methods here are written by hand and
//! resolve every ABI they may need by its exact version, so `cuda-core` calls them the same way
//! against 12.x and 13.x bindings and needs no `cfg`:
//!
//! | method | newest entry point | on an older driver |
//! | --- | --- | --- |
//! | [`Driver::mem_prefetch_async`] | `cuMemPrefetchAsync_v2` (12.2) | `cuMemPrefetchAsync` (8.0): a device or the host, flags 0; otherwise the typed error |
//! | [`Driver::mem_advise`] | `cuMemAdvise_v2` (12.2) | `cuMemAdvise` (8.0): a device or the host; otherwise the typed error |
//! | [`Driver::stream_get_capture_info`] | `cuStreamGetCaptureInfo_v3` (12.3) | `cuStreamGetCaptureInfo_v2` (11.3) when no edge data is asked for; otherwise the typed error |
//! | [`Driver::stream_get_device`] | `cuStreamGetDevice` (12.8) | emulated exactly: `cuStreamGetCtx`, then `cuCtxGetDevice` with that context pushed |
//! | [`Driver::event_elapsed_time`] | `cuEventElapsedTime_v2` (12.8) | `cuEventElapsedTime` (2.0), same arguments |
//! | [`Driver::func_get_param_info`] | `cuFuncGetParamInfo` (12.4; not in 12.0-12.3 headers) | the typed error |
//! | [`Driver::mem_pool_props`] | `CUmemPoolProps::maxSize` (12.2) | a size limit is the typed error; no limit works everywhere |
//! | [`Driver::graph_add_conditional_node`] | `cuGraphAddNode` (12.2) with [`ConditionalNodeParams`] (12.3) | the typed error |
//! | [`Driver::graph_conditional_handle_create`] | `cuGraphConditionalHandleCreate` (12.3) | the typed error |
//!
//! And the structs whose shape changed within 13.x:
//!
//! | function | what changed |
//! | --- | --- |
//! | [`mem_location`], [`mem_location_id`] | 13.2 headers put `CUmemLocation::id` in an anonymous union (beside `localized`); same layout |
//!
//! "The typed error" is [`MissingSymbol`] with [`MissingSymbol::is_driver_too_old`] true: it
//! names the entry point, the driver's version and the version needed.

use std::ffi::{c_int, c_uint, c_void, CStr};

use crate::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraph, CUgraphNode,
    CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation, CUmemLocationType,
    CUmemPoolProps, CUmem_advise, CUresult, CUstream, CUstreamCaptureStatus, Driver, MissingSymbol,
};

/// `CU_MEM_LOCATION_TYPE_HOST` (12.2+ headers; the value is part of the ABI).
pub const MEM_LOCATION_TYPE_HOST: CUmemLocationType = CUmemLocationType(2);
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA` (12.2+ headers).
pub const MEM_LOCATION_TYPE_HOST_NUMA: CUmemLocationType = CUmemLocationType(3);
/// `CU_DEVICE_CPU`: the host, as the pre-12.2 entry points take it in place of a device.
pub const DEVICE_CPU: CUdevice = -1;

/// The CUDA version that introduced `cuMemPrefetchAsync_v2` and `cuMemAdvise_v2`, and
/// `CUmemPoolProps::maxSize`.
pub const CUDA_12_2: u32 = 12020;
/// The CUDA version that introduced `cuStreamGetCaptureInfo_v3` (edge data).
pub const CUDA_12_3: u32 = 12030;
/// The CUDA version that introduced `cuFuncGetParamInfo`.
pub const CUDA_12_4: u32 = 12040;
/// The CUDA version that introduced `cuStreamGetDevice` and `cuEventElapsedTime_v2`, and the
/// switch and if/else conditional graph nodes.
pub const CUDA_12_8: u32 = 12080;

/// `CU_GRAPH_NODE_TYPE_CONDITIONAL` (12.3+ headers; the value is part of the ABI).
pub const GRAPH_NODE_TYPE_CONDITIONAL: u32 = 13;
/// `CU_GRAPH_COND_TYPE_IF` (12.3; with `size` 2 since 12.8: if/else).
pub const GRAPH_COND_TYPE_IF: u32 = 0;
/// `CU_GRAPH_COND_TYPE_WHILE` (12.3).
pub const GRAPH_COND_TYPE_WHILE: u32 = 1;
/// `CU_GRAPH_COND_TYPE_SWITCH` (12.8).
pub const GRAPH_COND_TYPE_SWITCH: u32 = 2;
/// `CU_GRAPH_COND_ASSIGN_DEFAULT`: the handle takes its default value at each launch.
pub const GRAPH_COND_ASSIGN_DEFAULT: c_uint = 1;

/// `CUDA_CONDITIONAL_NODE_PARAMS` (12.3), written out so that it exists whatever headers the
/// bindings came from. On success the driver points `phGraph_out` at its own array of `size`
/// body graphs, owned by the node (pass it null).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConditionalNodeParams {
    /// The condition handle (`cuGraphConditionalHandleCreate`).
    pub handle: u64,
    /// One of the `GRAPH_COND_TYPE_*` values.
    pub type_: u32,
    /// Number of body graphs: 1 for if and while, 2 for if/else, n for a switch.
    pub size: c_uint,
    /// Out: set by the driver to its array of `size` body graphs (valid as long as the node).
    pub ph_graph_out: *mut CUgraph,
    /// The context the node's bodies run in.
    pub ctx: CUcontext,
}

/// `CUgraphNodeParams` (12.2): the node type, then a 232-byte union, padded to 256 bytes as
/// the ABI lays it out. Only the conditional member is written out here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    /// `CUgraphNodeType`.
    pub type_: u32,
    /// Reserved, zero.
    pub reserved0: [c_int; 3],
    /// The union: the conditional parameters, then zeros.
    pub conditional: ConditionalNodeParams,
    /// The rest of the union, zero.
    pub union_rest: [u8; 232 - std::mem::size_of::<ConditionalNodeParams>()],
    /// Reserved, zero.
    pub reserved2: i64,
}

impl GraphNodeParams {
    /// The parameters of a conditional node.
    pub fn conditional(conditional: ConditionalNodeParams) -> GraphNodeParams {
        GraphNodeParams {
            type_: GRAPH_NODE_TYPE_CONDITIONAL,
            reserved0: [0; 3],
            conditional,
            union_rest: [0; 232 - std::mem::size_of::<ConditionalNodeParams>()],
            reserved2: 0,
        }
    }
}

// The ABI's sizes: 32 bytes of conditional parameters, 256 of node parameters.
const _: () = assert!(std::mem::size_of::<ConditionalNodeParams>() == 32);
const _: () = assert!(std::mem::size_of::<GraphNodeParams>() == 256);

type GraphAddNodeV1 = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    *mut GraphNodeParams,
) -> CUresult;
type CondHandleCreate =
    unsafe extern "C" fn(*mut u64, CUgraph, CUcontext, c_uint, c_uint) -> CUresult;

type PrefetchV2 =
    unsafe extern "C" fn(CUdeviceptr, usize, CUmemLocation, c_uint, CUstream) -> CUresult;
type PrefetchV1 = unsafe extern "C" fn(CUdeviceptr, usize, CUdevice, CUstream) -> CUresult;
type AdviseV2 = unsafe extern "C" fn(CUdeviceptr, usize, CUmem_advise, CUmemLocation) -> CUresult;
type AdviseV1 = unsafe extern "C" fn(CUdeviceptr, usize, CUmem_advise, CUdevice) -> CUresult;
type CaptureInfoV3 = unsafe extern "C" fn(
    CUstream,
    *mut CUstreamCaptureStatus,
    *mut u64,
    *mut CUgraph,
    *mut *const CUgraphNode,
    *mut *const c_void,
    *mut usize,
) -> CUresult;
type CaptureInfoV2 = unsafe extern "C" fn(
    CUstream,
    *mut CUstreamCaptureStatus,
    *mut u64,
    *mut CUgraph,
    *mut *const CUgraphNode,
    *mut usize,
) -> CUresult;
type EventElapsed = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
type StreamGetDevice = unsafe extern "C" fn(CUstream, *mut CUdevice) -> CUresult;
type StreamGetCtx = unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult;
type CtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
type CtxPush = unsafe extern "C" fn(CUcontext) -> CUresult;
type CtxPop = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type FuncGetParamInfo = unsafe extern "C" fn(CUfunction, usize, *mut usize, *mut usize) -> CUresult;

/// Every exact ABI the compat methods use: (API name, exported symbol, CUDA version of the ABI).
pub const COMPAT_ENTRY_POINTS: [(&CStr, &CStr, u32); 16] = [
    (c"cuMemPrefetchAsync", c"cuMemPrefetchAsync_v2", CUDA_12_2),
    (c"cuMemPrefetchAsync", c"cuMemPrefetchAsync", 8000),
    (c"cuMemAdvise", c"cuMemAdvise_v2", CUDA_12_2),
    (c"cuMemAdvise", c"cuMemAdvise", 8000),
    (
        c"cuStreamGetCaptureInfo",
        c"cuStreamGetCaptureInfo_v3",
        CUDA_12_3,
    ),
    (
        c"cuStreamGetCaptureInfo",
        c"cuStreamGetCaptureInfo_v2",
        11030,
    ),
    (c"cuStreamGetDevice", c"cuStreamGetDevice", CUDA_12_8),
    (c"cuStreamGetCtx", c"cuStreamGetCtx", 9020),
    (c"cuCtxGetDevice", c"cuCtxGetDevice", 2000),
    (c"cuCtxPushCurrent", c"cuCtxPushCurrent_v2", 4000),
    (c"cuCtxPopCurrent", c"cuCtxPopCurrent_v2", 4000),
    (c"cuEventElapsedTime", c"cuEventElapsedTime_v2", CUDA_12_8),
    (c"cuEventElapsedTime", c"cuEventElapsedTime", 2000),
    (c"cuGraphAddNode", c"cuGraphAddNode", 12020),
    (
        c"cuGraphConditionalHandleCreate",
        c"cuGraphConditionalHandleCreate",
        CUDA_12_3,
    ),
    (c"cuFuncGetParamInfo", c"cuFuncGetParamInfo", CUDA_12_4),
];

/// The exact-version entry points behind the compat methods.
#[derive(Clone, Copy, Default)]
pub(crate) struct CompatTable {
    prefetch_v2: Option<PrefetchV2>,
    prefetch_v1: Option<PrefetchV1>,
    advise_v2: Option<AdviseV2>,
    advise_v1: Option<AdviseV1>,
    capture_info_v3: Option<CaptureInfoV3>,
    capture_info_v2: Option<CaptureInfoV2>,
    stream_get_device: Option<StreamGetDevice>,
    stream_get_ctx: Option<StreamGetCtx>,
    ctx_get_device: Option<CtxGetDevice>,
    ctx_push: Option<CtxPush>,
    ctx_pop: Option<CtxPop>,
    elapsed_v2: Option<EventElapsed>,
    elapsed_v1: Option<EventElapsed>,
    graph_add_node_v1: Option<GraphAddNodeV1>,
    cond_handle_create: Option<CondHandleCreate>,
    func_get_param_info: Option<FuncGetParamInfo>,
}

/// Turns a looked-up address into a typed function pointer.
///
/// # Safety
///
/// `ptr` is null or a function of type `F`.
unsafe fn cast<F: Copy>(ptr: *mut c_void) -> Option<F> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: `F` is a function pointer type of the size of a data pointer, and the caller
        // vouches for the signature.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
    }
}

impl CompatTable {
    /// Asks `lookup(api, symbol, version)` for each of [`COMPAT_ENTRY_POINTS`].
    ///
    /// # Safety
    ///
    /// `lookup` returns null or the entry point at exactly that ABI version.
    pub(crate) unsafe fn resolve(mut lookup: impl FnMut(&CStr, &CStr, u32) -> *mut c_void) -> Self {
        let mut at = |i: usize| {
            let (api, symbol, version) = COMPAT_ENTRY_POINTS[i];
            lookup(api, symbol, version)
        };
        // SAFETY: each index names the ABI whose type the field has (see the table above).
        unsafe {
            CompatTable {
                prefetch_v2: cast(at(0)),
                prefetch_v1: cast(at(1)),
                advise_v2: cast(at(2)),
                advise_v1: cast(at(3)),
                capture_info_v3: cast(at(4)),
                capture_info_v2: cast(at(5)),
                stream_get_device: cast(at(6)),
                stream_get_ctx: cast(at(7)),
                ctx_get_device: cast(at(8)),
                ctx_push: cast(at(9)),
                ctx_pop: cast(at(10)),
                elapsed_v2: cast(at(11)),
                elapsed_v1: cast(at(12)),
                graph_add_node_v1: cast(at(13)),
                cond_handle_create: cast(at(14)),
                func_get_param_info: cast(at(15)),
            }
        }
    }
}

/// A `CUmemLocation` of type `type_` and identifier `id`, whatever the headers' shape of it:
/// a plain `id` field (12.x, 13.0, 13.1) or `id` in an anonymous union (13.2+).
pub fn mem_location(type_: CUmemLocationType, id: c_int) -> CUmemLocation {
    #[cfg(not(cuda_sys_mem_location_union))]
    {
        CUmemLocation { type_, id }
    }
    #[cfg(cuda_sys_mem_location_union)]
    {
        CUmemLocation {
            type_,
            __bindgen_anon_1: crate::CUmemLocation_st__bindgen_ty_1 { id },
        }
    }
}

/// The `id` of `location`, whatever the headers' shape of `CUmemLocation` (see
/// [`mem_location`]).
///
/// # Safety
///
/// With 13.2+ headers `id` shares a union with `localized` (two bytes): `location`'s `id` must
/// be initialised, as it is in a location made by [`mem_location`] or `Default`, or filled in
/// by the driver; not in one built from `localized` alone.
pub unsafe fn mem_location_id(location: &CUmemLocation) -> c_int {
    #[cfg(not(cuda_sys_mem_location_union))]
    {
        location.id
    }
    // SAFETY: the caller vouches that `id` is initialised; every bit pattern is a c_int.
    #[cfg(cuda_sys_mem_location_union)]
    unsafe {
        location.__bindgen_anon_1.id
    }
}

/// The pre-12.2 form of a location: a device ordinal, or [`DEVICE_CPU`] for the host.
///
/// # Safety
///
/// A device location's `id` is initialised (the driver API's contract for a location).
unsafe fn legacy_device(location: &CUmemLocation) -> Option<CUdevice> {
    if location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
        // SAFETY: the caller vouches for the device location's `id`.
        Some(unsafe { mem_location_id(location) })
    } else if location.type_ == MEM_LOCATION_TYPE_HOST {
        Some(DEVICE_CPU)
    } else {
        None
    }
}

impl Driver {
    /// `cuMemPrefetchAsync` with the CUDA 13.0 shape (a `CUmemLocation` and flags). On a driver
    /// older than 12.2 it calls the 8.0 entry point with the device ordinal (or `CU_DEVICE_CPU`
    /// for the host); other locations or nonzero flags are then the typed error.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuMemPrefetchAsync`.
    pub unsafe fn mem_prefetch_async(
        &self,
        dev_ptr: CUdeviceptr,
        count: usize,
        location: CUmemLocation,
        flags: c_uint,
        stream: CUstream,
    ) -> Result<CUresult, MissingSymbol> {
        if let Some(f) = self.compat.prefetch_v2 {
            // SAFETY: the caller upholds the driver's contract; exact 12.2 ABI.
            return Ok(unsafe { f(dev_ptr, count, location, flags, stream) });
        }
        // SAFETY: the caller passes a location valid for the driver API (see `# Safety`).
        let legacy = unsafe { legacy_device(&location) };
        match (self.compat.prefetch_v1, legacy) {
            (Some(f), Some(device)) if flags == 0 => {
                // SAFETY: as above; exact 8.0 ABI, same meaning for a device or the host.
                Ok(unsafe { f(dev_ptr, count, device, stream) })
            }
            _ => Err(self.missing("cuMemPrefetchAsync", CUDA_12_2)),
        }
    }

    /// `cuMemAdvise` with the CUDA 13.0 shape (a `CUmemLocation`). On a driver older than 12.2
    /// it calls the 8.0 entry point with the device ordinal (or `CU_DEVICE_CPU` for the host);
    /// other locations are then the typed error.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuMemAdvise`.
    pub unsafe fn mem_advise(
        &self,
        dev_ptr: CUdeviceptr,
        count: usize,
        advice: CUmem_advise,
        location: CUmemLocation,
    ) -> Result<CUresult, MissingSymbol> {
        if let Some(f) = self.compat.advise_v2 {
            // SAFETY: the caller upholds the driver's contract; exact 12.2 ABI.
            return Ok(unsafe { f(dev_ptr, count, advice, location) });
        }
        // SAFETY: the caller passes a location valid for the driver API (see `# Safety`).
        let legacy = unsafe { legacy_device(&location) };
        match (self.compat.advise_v1, legacy) {
            // SAFETY: as above; exact 8.0 ABI, same meaning for a device or the host.
            (Some(f), Some(device)) => Ok(unsafe { f(dev_ptr, count, advice, device) }),
            _ => Err(self.missing("cuMemAdvise", CUDA_12_2)),
        }
    }

    /// `cuStreamGetCaptureInfo` with the CUDA 13.0 shape (`edge_data_out` before
    /// `num_dependencies_out`; pass null for any output not wanted). On a driver older than
    /// 12.3 it calls the 11.3 entry point, which has no edge data: asking for edge data there
    /// is the typed error.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuStreamGetCaptureInfo`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn stream_get_capture_info(
        &self,
        stream: CUstream,
        status_out: *mut CUstreamCaptureStatus,
        id_out: *mut u64,
        graph_out: *mut CUgraph,
        dependencies_out: *mut *const CUgraphNode,
        edge_data_out: *mut *const c_void,
        num_dependencies_out: *mut usize,
    ) -> Result<CUresult, MissingSymbol> {
        if let Some(f) = self.compat.capture_info_v3 {
            // SAFETY: the caller upholds the driver's contract; exact 12.3 ABI.
            return Ok(unsafe {
                f(
                    stream,
                    status_out,
                    id_out,
                    graph_out,
                    dependencies_out,
                    edge_data_out,
                    num_dependencies_out,
                )
            });
        }
        match self.compat.capture_info_v2 {
            // SAFETY: as above; exact 11.3 ABI, the same outputs less edge data.
            Some(f) if edge_data_out.is_null() => Ok(unsafe {
                f(
                    stream,
                    status_out,
                    id_out,
                    graph_out,
                    dependencies_out,
                    num_dependencies_out,
                )
            }),
            _ => Err(self.missing("cuStreamGetCaptureInfo", CUDA_12_3)),
        }
    }

    /// `cuStreamGetDevice`: the device of `stream`. On a driver older than 12.8 it is emulated
    /// exactly: the stream's context (`cuStreamGetCtx`) is pushed, `cuCtxGetDevice` asked, and
    /// the context popped again. The null and per-thread streams answer for the current
    /// context, as `cuStreamGetDevice` does.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuStreamGetDevice`: `stream` is a live stream (or null) and
    /// `device` a valid out-pointer.
    pub unsafe fn stream_get_device(
        &self,
        stream: CUstream,
        device: *mut CUdevice,
    ) -> Result<CUresult, MissingSymbol> {
        if let Some(f) = self.compat.stream_get_device {
            // SAFETY: the caller upholds the driver's contract; exact 12.8 ABI.
            return Ok(unsafe { f(stream, device) });
        }
        let c = &self.compat;
        let (Some(get_ctx), Some(get_device), Some(push), Some(pop)) =
            (c.stream_get_ctx, c.ctx_get_device, c.ctx_push, c.ctx_pop)
        else {
            return Err(self.missing("cuStreamGetDevice", CUDA_12_8));
        };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the caller vouches for the stream; valid out-pointer.
        let r = unsafe { get_ctx(stream, &mut ctx) };
        if r != CUresult::CUDA_SUCCESS {
            return Ok(r);
        }
        // SAFETY: a context the driver just named; pushed and popped on this thread only.
        let r = unsafe { push(ctx) };
        if r != CUresult::CUDA_SUCCESS {
            return Ok(r);
        }
        // SAFETY: the caller's out-pointer; a context is current.
        let asked = unsafe { get_device(device) };
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let r = unsafe { pop(&mut popped) };
        if asked != CUresult::CUDA_SUCCESS {
            return Ok(asked);
        }
        Ok(r)
    }

    /// `cuEventElapsedTime`: milliseconds between two recorded events. The 12.8 entry point
    /// where the driver has it, else the 2.0 one, which takes the same arguments.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuEventElapsedTime`.
    pub unsafe fn event_elapsed_time(
        &self,
        ms: *mut f32,
        start: CUevent,
        end: CUevent,
    ) -> Result<CUresult, MissingSymbol> {
        match self.compat.elapsed_v2.or(self.compat.elapsed_v1) {
            // SAFETY: the caller upholds the driver's contract; both ABIs take these arguments.
            Some(f) => Ok(unsafe { f(ms, start, end) }),
            None => Err(self.missing("cuEventElapsedTime", 2000)),
        }
    }

    /// `cuGraphAddNode` (the 12.2 ABI, no edge data) with a conditional node's parameters:
    /// adds an if, while or switch node to `graph` and points `params.conditional.ph_graph_out`
    /// at the node's array of body graphs.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuGraphAddNode`: a live graph, `deps` valid for `num_deps` nodes
    /// of it, `params` a conditional node's parameters with a handle of `graph` and an
    /// out-array of `size` graphs.
    pub unsafe fn graph_add_conditional_node(
        &self,
        node: *mut CUgraphNode,
        graph: CUgraph,
        deps: *const CUgraphNode,
        num_deps: usize,
        params: *mut GraphNodeParams,
    ) -> Result<CUresult, MissingSymbol> {
        if self.compat.cond_handle_create.is_none() {
            // Conditional nodes came with 12.3; `cuGraphAddNode` alone (12.2) cannot add one.
            return Err(self.missing("cuGraphAddNode (conditional node)", CUDA_12_3));
        }
        match self.compat.graph_add_node_v1 {
            // SAFETY: the caller upholds the driver's contract; exact 12.2 ABI.
            Some(f) => Ok(unsafe { f(node, graph, deps, num_deps, params) }),
            None => Err(self.missing("cuGraphAddNode", 12020)),
        }
    }

    /// `cuGraphConditionalHandleCreate` (12.3): a condition handle of `graph`, set to
    /// `default` at each launch when `flags` is [`GRAPH_COND_ASSIGN_DEFAULT`].
    ///
    /// # Safety
    ///
    /// As the driver API's `cuGraphConditionalHandleCreate`.
    pub unsafe fn graph_conditional_handle_create(
        &self,
        handle: *mut u64,
        graph: CUgraph,
        ctx: CUcontext,
        default: c_uint,
        flags: c_uint,
    ) -> Result<CUresult, MissingSymbol> {
        match self.compat.cond_handle_create {
            // SAFETY: the caller upholds the driver's contract; exact 12.3 ABI.
            Some(f) => Ok(unsafe { f(handle, graph, ctx, default, flags) }),
            None => Err(self.missing("cuGraphConditionalHandleCreate", CUDA_12_3)),
        }
    }

    /// `cuFuncGetParamInfo`: the offset and size of a kernel parameter. Declared here, so that
    /// bindings from 12.0-12.3 headers (which lack it) offer it too; a driver older than 12.4
    /// gets the typed error.
    ///
    /// # Safety
    ///
    /// As the driver API's `cuFuncGetParamInfo`: `func` is a live function handle, `offset`
    /// and `size` valid out-pointers.
    pub unsafe fn func_get_param_info(
        &self,
        func: CUfunction,
        index: usize,
        offset: *mut usize,
        size: *mut usize,
    ) -> Result<CUresult, MissingSymbol> {
        match self.compat.func_get_param_info {
            // SAFETY: the caller upholds the driver's contract; the exact 12.4 ABI.
            Some(f) => Ok(unsafe { f(func, index, offset, size) }),
            None => Err(self.missing("cuFuncGetParamInfo", CUDA_12_4)),
        }
    }

    /// `CUmemPoolProps` for `cuMemPoolCreate`, every field the headers may lack zeroed. A
    /// nonzero `max_size` (`maxSize`, CUDA 12.2) goes where 12.2+ drivers read it, also when
    /// the bindings come from 12.0/12.1 headers; on a driver older than 12.2 it is the typed
    /// error (such a driver requires those bytes to be zero).
    pub fn mem_pool_props(
        &self,
        alloc_type: CUmemAllocationType,
        handle_types: CUmemAllocationHandleType,
        location: CUmemLocation,
        max_size: usize,
    ) -> Result<CUmemPoolProps, MissingSymbol> {
        if max_size != 0 && self.driver_version() != 0 && self.driver_version() < CUDA_12_2 {
            return Err(self.missing("CUmemPoolProps::maxSize", CUDA_12_2));
        }
        Ok(pool_props(alloc_type, handle_types, location, max_size))
    }
}

/// [`Driver::mem_pool_props`] without the driver check.
pub fn pool_props(
    alloc_type: CUmemAllocationType,
    handle_types: CUmemAllocationHandleType,
    location: CUmemLocation,
    max_size: usize,
) -> CUmemPoolProps {
    let mut props = CUmemPoolProps {
        allocType: alloc_type,
        handleTypes: handle_types,
        location,
        win32SecurityAttributes: std::ptr::null_mut(),
        ..Default::default()
    };
    set_max_size(&mut props, max_size);
    props
}

#[cfg(cuda_sys_pool_max_size)]
fn set_max_size(props: &mut CUmemPoolProps, max_size: usize) {
    props.maxSize = max_size;
}

/// 12.0/12.1 headers: `maxSize` is the first 8 bytes of `reserved` (the layout 12.2 gave it).
#[cfg(not(cuda_sys_pool_max_size))]
fn set_max_size(props: &mut CUmemPoolProps, max_size: usize) {
    let bytes = max_size.to_ne_bytes();
    props.reserved[..bytes.len()].copy_from_slice(&bytes);
}
