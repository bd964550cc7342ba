//! A fake driver older (and one newer) than the bindings: the loader never asks for an entry
//! point whose ABI the driver does not have, every such entry point returns the typed error,
//! and the entry points that changed between CUDA 12 and 13 go through their adapters.

use std::ffi::{c_uint, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;

use cudars_sys::compat::{self, MEM_LOCATION_TYPE_HOST, MEM_LOCATION_TYPE_HOST_NUMA};
use cudars_sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUgraph, CUgraphNode, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmem_advise, CUresult, CUstream,
    CUstreamCaptureStatus, Driver, Resolution, CUDA_VERSION, DRIVER_ENTRY_POINTS,
};

/// One scenario at a time: the fakes record into statics.
static SERIAL: Mutex<()> = Mutex::new(());

/// Which fake ran last, and with what device argument.
static LAST: AtomicUsize = AtomicUsize::new(0);
static LAST_DEVICE: AtomicI32 = AtomicI32::new(i32::MIN);
static PUSHED: AtomicI32 = AtomicI32::new(0);

const PREFETCH_V1: usize = 1;
const PREFETCH_V2: usize = 2;
const ADVISE_V1: usize = 3;
const ADVISE_V2: usize = 4;
const CAPTURE_V2: usize = 5;
const CAPTURE_V3: usize = 6;
const STREAM_DEVICE: usize = 7;
const ELAPSED_V1: usize = 8;
const ELAPSED_V2: usize = 9;
const LOCATION_INFO: usize = 10;
const GRAPH_ADD_NODE: usize = 11;
const COND_HANDLE: usize = 12;
const PARAM_INFO: usize = 13;

fn ran(which: usize, device: CUdevice) -> CUresult {
    LAST.store(which, Ordering::SeqCst);
    LAST_DEVICE.store(device, Ordering::SeqCst);
    CUresult::CUDA_SUCCESS
}

extern "C" fn never_called() {}

extern "C" fn prefetch_v1(_: CUdeviceptr, _: usize, device: CUdevice, _: CUstream) -> CUresult {
    ran(PREFETCH_V1, device)
}
extern "C" fn prefetch_v2(
    _: CUdeviceptr,
    _: usize,
    location: CUmemLocation,
    _: c_uint,
    _: CUstream,
) -> CUresult {
    ran(PREFETCH_V2, id_of(&location))
}
extern "C" fn advise_v1(_: CUdeviceptr, _: usize, _: CUmem_advise, device: CUdevice) -> CUresult {
    ran(ADVISE_V1, device)
}
extern "C" fn advise_v2(
    _: CUdeviceptr,
    _: usize,
    _: CUmem_advise,
    location: CUmemLocation,
) -> CUresult {
    ran(ADVISE_V2, id_of(&location))
}
extern "C" fn capture_v2(
    _: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut u64,
    _: *mut CUgraph,
    _: *mut *const CUgraphNode,
    _: *mut usize,
) -> CUresult {
    // SAFETY: the test passes valid out-pointers.
    unsafe {
        *status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        *id = 42;
    }
    ran(CAPTURE_V2, 0)
}
extern "C" fn capture_v3(
    _: CUstream,
    status: *mut CUstreamCaptureStatus,
    id: *mut u64,
    _: *mut CUgraph,
    _: *mut *const CUgraphNode,
    _: *mut *const c_void,
    _: *mut usize,
) -> CUresult {
    // SAFETY: the test passes valid out-pointers or null.
    unsafe {
        if !status.is_null() {
            *status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        }
        *id = 43;
    }
    ran(CAPTURE_V3, 0)
}
extern "C" fn stream_get_device(_: CUstream, device: *mut CUdevice) -> CUresult {
    // SAFETY: the test passes a valid out-pointer.
    unsafe { *device = 7 };
    ran(STREAM_DEVICE, 7)
}
const FAKE_CTX: usize = 0x1000;
extern "C" fn stream_get_ctx(_: CUstream, ctx: *mut CUcontext) -> CUresult {
    // SAFETY: valid out-pointer.
    unsafe { *ctx = FAKE_CTX as CUcontext };
    CUresult::CUDA_SUCCESS
}
extern "C" fn ctx_push(ctx: CUcontext) -> CUresult {
    assert_eq!(ctx as usize, FAKE_CTX);
    PUSHED.fetch_add(1, Ordering::SeqCst);
    CUresult::CUDA_SUCCESS
}
extern "C" fn ctx_pop(ctx: *mut CUcontext) -> CUresult {
    // SAFETY: valid out-pointer.
    unsafe { *ctx = FAKE_CTX as CUcontext };
    PUSHED.fetch_sub(1, Ordering::SeqCst);
    CUresult::CUDA_SUCCESS
}
extern "C" fn ctx_get_device(device: *mut CUdevice) -> CUresult {
    assert_eq!(
        PUSHED.load(Ordering::SeqCst),
        1,
        "the stream's context is current"
    );
    // SAFETY: valid out-pointer.
    unsafe { *device = 3 };
    CUresult::CUDA_SUCCESS
}
extern "C" fn graph_add_node(
    node: *mut CUgraphNode,
    _: CUgraph,
    _: *const CUgraphNode,
    _: usize,
    params: *mut compat::GraphNodeParams,
) -> CUresult {
    // SAFETY: valid pointers from the test; the params are a conditional node's.
    unsafe {
        *node = 0x40 as CUgraphNode;
        let p = &mut *params;
        assert_eq!(p.type_, compat::GRAPH_NODE_TYPE_CONDITIONAL);
        assert!(p.conditional.size as usize <= FAKE_BODIES.len());
        // As the driver does: phGraph_out is pointed at the node's own array of bodies.
        p.conditional.ph_graph_out = std::ptr::addr_of!(FAKE_BODIES) as *mut CUgraph;
    }
    ran(GRAPH_ADD_NODE, 0)
}
/// The fake driver's body graphs of a conditional node (addresses only, never used).
static FAKE_BODIES: [usize; 4] = [0x100, 0x101, 0x102, 0x103];

extern "C" fn cond_handle(
    handle: *mut u64,
    _: CUgraph,
    _: CUcontext,
    default: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: valid out-pointer.
    unsafe { *handle = 0xc0de };
    ran(COND_HANDLE, (default * 10 + flags) as CUdevice)
}
extern "C" fn elapsed_v1(ms: *mut f32, _: CUevent, _: CUevent) -> CUresult {
    // SAFETY: valid out-pointer.
    unsafe { *ms = 1.5 };
    ran(ELAPSED_V1, 0)
}
extern "C" fn elapsed_v2(ms: *mut f32, _: CUevent, _: CUevent) -> CUresult {
    // SAFETY: valid out-pointer.
    unsafe { *ms = 2.5 };
    ran(ELAPSED_V2, 0)
}

/// `cuMemGetLocationInfo` (13.4): the fake answers for any request of it (the loader must not
/// make one to a driver older than 13.4).
extern "C" fn location_info(
    _: CUdeviceptr,
    _: usize,
    _: usize,
    _: usize,
    location: *mut CUmemLocation,
) -> CUresult {
    // SAFETY: the test passes a valid out-pointer.
    unsafe { *location = compat::mem_location(CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 4) };
    ran(LOCATION_INFO, 4)
}

/// `cuFuncGetParamInfo` (12.4): parameter `index` at offset `8 * index`, 8 bytes.
extern "C" fn param_info(
    _: cudars_sys::CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: the test passes valid out-pointers.
    unsafe {
        *offset = 8 * index;
        *size = 8;
    }
    ran(PARAM_INFO, index as CUdevice)
}

/// The exact-ABI entry points the fake driver exports: (symbol, ABI version, address).
fn exact_symbols() -> Vec<(&'static str, u32, *mut c_void)> {
    vec![
        ("cuMemPrefetchAsync", 8000, prefetch_v1 as *mut c_void),
        ("cuMemPrefetchAsync_v2", 12020, prefetch_v2 as *mut c_void),
        ("cuMemAdvise", 8000, advise_v1 as *mut c_void),
        ("cuMemAdvise_v2", 12020, advise_v2 as *mut c_void),
        (
            "cuStreamGetCaptureInfo_v2",
            11030,
            capture_v2 as *mut c_void,
        ),
        (
            "cuStreamGetCaptureInfo_v3",
            12030,
            capture_v3 as *mut c_void,
        ),
        ("cuStreamGetDevice", 12080, stream_get_device as *mut c_void),
        ("cuStreamGetCtx", 9020, stream_get_ctx as *mut c_void),
        ("cuCtxPushCurrent_v2", 4000, ctx_push as *mut c_void),
        ("cuCtxPopCurrent_v2", 4000, ctx_pop as *mut c_void),
        ("cuCtxGetDevice", 2000, ctx_get_device as *mut c_void),
        ("cuEventElapsedTime", 2000, elapsed_v1 as *mut c_void),
        ("cuEventElapsedTime_v2", 12080, elapsed_v2 as *mut c_void),
        ("cuGraphAddNode", 12020, graph_add_node as *mut c_void),
        (
            "cuGraphConditionalHandleCreate",
            12030,
            cond_handle as *mut c_void,
        ),
        ("cuFuncGetParamInfo", 12040, param_info as *mut c_void),
    ]
}

/// What the loader asked the fake driver for: (api, symbol, version).
type Asked = Vec<(String, String, i32)>;

/// A driver of version `version` built from fakes. Compat entry points are served by their
/// exact symbol when the fake driver is new enough for that ABI; every other request gets a
/// function that must never be called (as a real old driver would answer with an older ABI).
fn fake_driver(version: u32) -> (Driver, Asked) {
    let mut asked = Vec::new();
    let exact = exact_symbols();
    let compat: Vec<(&CStr, &CStr, u32)> = compat::COMPAT_ENTRY_POINTS.to_vec();
    let lookup = |api: &CStr, symbol: &CStr, at: i32| -> *mut c_void {
        let api = api.to_string_lossy().into_owned();
        let symbol = symbol.to_string_lossy().into_owned();
        asked.push((api.clone(), symbol.clone(), at));
        let is_compat = compat.iter().any(|(a, s, v)| {
            a.to_bytes() == api.as_bytes() && s.to_bytes() == symbol.as_bytes() && *v as i32 == at
        });
        if is_compat {
            return exact
                .iter()
                .find(|(s, v, _)| *s == symbol && *v <= version)
                .map_or(std::ptr::null_mut(), |(_, _, p)| *p);
        }
        if api == "cuMemGetLocationInfo" {
            return location_info as *mut c_void;
        }
        never_called as *mut c_void
    };
    // SAFETY: the fakes have the signatures of the ABIs they are returned for; the others are
    // never called (the test calls only compat methods and asks entry statuses).
    let driver = unsafe {
        Driver::with_resolver(
            "fake".into(),
            Resolution::ProcAddress,
            version,
            Some(CUresult::CUDA_SUCCESS),
            lookup,
        )
    };
    (driver, asked)
}

fn device(id: i32) -> CUmemLocation {
    compat::mem_location(CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id)
}

fn id_of(location: &CUmemLocation) -> i32 {
    // SAFETY: every location of these tests is made by `compat::mem_location`.
    unsafe { compat::mem_location_id(location) }
}

fn host() -> CUmemLocation {
    compat::mem_location(MEM_LOCATION_TYPE_HOST, 0)
}

/// The entry points whose shape or ABI changed between CUDA 12.0 and 13.0 that the workspace
/// calls, each with the compat method that covers it (checked below).
const CHANGED: &[&str] = &[
    "cuMemPrefetchAsync",
    "cuMemAdvise",
    "cuStreamGetCaptureInfo",
    "cuStreamGetDevice",
    "cuEventElapsedTime",
];

#[test]
fn a_driver_older_than_the_bindings_is_never_handed_a_newer_abi() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let old = 12000;
    let (driver, asked) = fake_driver(old);
    assert_eq!(driver.driver_version(), old);

    let mut refused = 0;
    for entry in DRIVER_ENTRY_POINTS.iter() {
        let api = entry.api.to_str().unwrap();
        let status = driver.entry_status(api);
        if entry.since > old {
            refused += 1;
            let err = status.expect_err(api);
            assert!(err.is_driver_too_old(), "{api}: {err}");
            assert_eq!((err.name, err.needed, err.driver), (api, entry.since, old));
            assert!(err.to_string().contains("needs a CUDA"), "{err}");
            let asked_main = asked.iter().any(|(a, s, v)| {
                a == api
                    && s.as_bytes() == entry.symbol.to_bytes()
                    && !compat::COMPAT_ENTRY_POINTS.iter().any(|(ca, cs, cv)| {
                        ca.to_bytes() == a.as_bytes()
                            && cs.to_bytes() == s.as_bytes()
                            && *cv as i32 == *v
                    })
            });
            assert!(!asked_main, "{api}: asked an old driver for a newer ABI");
        } else {
            assert_eq!(status, Ok(()), "{api}");
        }
    }
    if CUDA_VERSION >= 13000 {
        // 13.0 bindings: at least the entry points the issue names are among the refused.
        assert!(refused >= CHANGED.len(), "{refused} refused");
        for name in [
            "cuMemPrefetchAsync",
            "cuMemAdvise",
            "cuStreamGetCaptureInfo",
        ] {
            assert!(driver.entry_status(name).is_err(), "{name}");
        }
    }
    for name in CHANGED {
        // Present in the bindings: either an ABI a 12.0 driver has, or refused.
        if let Some(entry) = DRIVER_ENTRY_POINTS
            .iter()
            .find(|e| e.api.to_bytes() == name.as_bytes())
        {
            assert_eq!(driver.entry_status(name).is_ok(), entry.since <= old);
        }
    }

    // The adapters: the 12.0 entry points, with the arguments they take.
    // SAFETY: (all calls below) the fake driver's functions accept any arguments.
    unsafe {
        let r = driver.mem_prefetch_async(0x10, 64, device(2), 0, std::ptr::null_mut());
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(LAST.load(Ordering::SeqCst), PREFETCH_V1);
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), 2);
        let r = driver.mem_prefetch_async(0x10, 64, host(), 0, std::ptr::null_mut());
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), compat::DEVICE_CPU);
        let numa = compat::mem_location(MEM_LOCATION_TYPE_HOST_NUMA, 0);
        let err = driver
            .mem_prefetch_async(0x10, 64, numa, 0, std::ptr::null_mut())
            .unwrap_err();
        assert!(err.is_driver_too_old());
        assert_eq!((err.name, err.needed), ("cuMemPrefetchAsync", 12020));
        assert!(driver
            .mem_prefetch_async(0x10, 64, device(0), 1, std::ptr::null_mut())
            .is_err());

        let advice = CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
        assert_eq!(
            driver.mem_advise(0x10, 64, advice, device(1)),
            Ok(CUresult::CUDA_SUCCESS)
        );
        assert_eq!(LAST.load(Ordering::SeqCst), ADVISE_V1);
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), 1);
        assert_eq!(
            driver.mem_advise(0x10, 64, advice, host()),
            Ok(CUresult::CUDA_SUCCESS)
        );
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), compat::DEVICE_CPU);
        assert!(driver
            .mem_advise(0x10, 64, advice, numa)
            .unwrap_err()
            .is_driver_too_old());

        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id = 0;
        let r = driver.stream_get_capture_info(
            std::ptr::null_mut(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!((LAST.load(Ordering::SeqCst), id), (CAPTURE_V2, 42));
        assert_eq!(
            status,
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        );
        let mut edges: *const c_void = std::ptr::null();
        let err = driver
            .stream_get_capture_info(
                std::ptr::null_mut(),
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut edges,
                std::ptr::null_mut(),
            )
            .unwrap_err();
        assert_eq!(
            (err.name, err.needed, err.driver),
            ("cuStreamGetCaptureInfo", 12030, old)
        );

        // Conditional graph nodes need 12.3: the typed error on a 12.0 driver.
        let mut handle = 0u64;
        let err = driver
            .graph_conditional_handle_create(
                &mut handle,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                0,
            )
            .unwrap_err();
        assert!(err.is_driver_too_old());
        assert_eq!(
            (err.name, err.needed),
            ("cuGraphConditionalHandleCreate", 12030)
        );
        let mut node: CUgraphNode = std::ptr::null_mut();
        let mut params = compat::GraphNodeParams::conditional(compat::ConditionalNodeParams {
            handle: 1,
            type_: compat::GRAPH_COND_TYPE_WHILE,
            size: 1,
            ph_graph_out: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        });
        let err = driver
            .graph_add_conditional_node(
                &mut node,
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                &mut params,
            )
            .unwrap_err();
        assert!(err.is_driver_too_old(), "{err}");

        LAST.store(0, Ordering::SeqCst);
        let mut dev = -1;
        let r = driver.stream_get_device(0x2000 as CUstream, &mut dev);
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(dev, 3, "emulated through the stream's context");
        assert_eq!(PUSHED.load(Ordering::SeqCst), 0, "the context was popped");
        assert_eq!(
            LAST.load(Ordering::SeqCst),
            0,
            "cuStreamGetDevice not called"
        );

        let mut ms = 0.0;
        let r = driver.event_elapsed_time(&mut ms, std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!((r, ms), (Ok(CUresult::CUDA_SUCCESS), 1.5));
        assert_eq!(LAST.load(Ordering::SeqCst), ELAPSED_V1);
    }

    let pinned = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    let none = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    // `.err()`: with 13.2+ headers `CUmemPoolProps` (a union inside) has no `Debug`.
    let err = driver
        .mem_pool_props(pinned, none, device(0), 1 << 20)
        .err()
        .unwrap();
    assert_eq!((err.needed, err.driver), (12020, old));
    let props = driver.mem_pool_props(pinned, none, device(0), 0).unwrap();
    assert_eq!(id_of(&props.location), 0);
}

#[test]
fn each_entry_point_is_asked_for_at_the_version_of_its_declared_abi() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_, asked) = fake_driver(CUDA_VERSION.max(13000));
    for entry in DRIVER_ENTRY_POINTS.iter() {
        let expected = match (entry.by_proc_address, entry.since) {
            (false, _) => 0,
            (true, 0) => CUDA_VERSION as i32,
            (true, since) => since as i32,
        };
        let ok = asked.iter().any(|(a, s, v)| {
            a.as_bytes() == entry.api.to_bytes()
                && s.as_bytes() == entry.symbol.to_bytes()
                && *v == expected
        });
        assert!(ok, "{entry:?} not asked at {expected}");
        assert!(entry.since <= CUDA_VERSION, "{entry:?}");
    }
    // The declaration 12.3+ headers keep on the 11.3 ABI is asked for at 11.3, not at the
    // headers' version (which would answer with `_v3`).
    if let Some(e) = DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.symbol.to_bytes() == b"cuStreamGetCaptureInfo_v2")
    {
        assert_eq!(e.since, 11030);
    }
    if let Some(e) = DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.symbol.to_bytes() == b"cuStreamGetCaptureInfo_v3")
    {
        assert_eq!(e.since, 12030);
    }
    if let Some(e) = DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.symbol.to_bytes() == b"cuCtxCreate_v2")
    {
        assert_eq!(e.since, 3020);
    }
}

#[test]
fn a_driver_as_new_as_the_bindings_gets_every_entry_point_and_the_new_abis() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (driver, _) = fake_driver(CUDA_VERSION.max(13000));
    for entry in DRIVER_ENTRY_POINTS.iter() {
        let api = entry.api.to_str().unwrap();
        assert_eq!(driver.entry_status(api), Ok(()), "{api}");
    }
    // SAFETY: (all calls below) the fake driver's functions accept any arguments.
    unsafe {
        let host_numa = compat::mem_location(MEM_LOCATION_TYPE_HOST_NUMA, 5);
        let mut handle = 0u64;
        let r = driver.graph_conditional_handle_create(
            &mut handle,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            1,
            compat::GRAPH_COND_ASSIGN_DEFAULT,
        );
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(handle, 0xc0de);
        assert_eq!(LAST.load(Ordering::SeqCst), COND_HANDLE);
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), 11, "default 1, flags 1");
        let mut node: CUgraphNode = std::ptr::null_mut();
        let mut params = compat::GraphNodeParams::conditional(compat::ConditionalNodeParams {
            handle,
            type_: compat::GRAPH_COND_TYPE_SWITCH,
            size: 3,
            ph_graph_out: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        });
        let r = driver.graph_add_conditional_node(
            &mut node,
            std::ptr::null_mut(),
            std::ptr::null(),
            0,
            &mut params,
        );
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(LAST.load(Ordering::SeqCst), GRAPH_ADD_NODE);
        assert_eq!(node as usize, 0x40);
        // The fake pointed phGraph_out at its array of (at least) 3 bodies.
        let out = std::slice::from_raw_parts(params.conditional.ph_graph_out, 3);
        assert_eq!(
            out.iter().map(|b| *b as usize).collect::<Vec<_>>(),
            [0x100, 0x101, 0x102]
        );

        let r = driver.mem_prefetch_async(0x10, 64, host_numa, 0, std::ptr::null_mut());
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(LAST.load(Ordering::SeqCst), PREFETCH_V2);
        assert_eq!(LAST_DEVICE.load(Ordering::SeqCst), 5);
        let advice = CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY;
        assert_eq!(
            driver.mem_advise(0x10, 64, advice, device(1)),
            Ok(CUresult::CUDA_SUCCESS)
        );
        assert_eq!(LAST.load(Ordering::SeqCst), ADVISE_V2);
        let mut id = 0;
        let mut edges: *const c_void = std::ptr::null();
        let r = driver.stream_get_capture_info(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut edges,
            std::ptr::null_mut(),
        );
        assert_eq!((r, id), (Ok(CUresult::CUDA_SUCCESS), 43));
        let mut dev = -1;
        assert_eq!(
            driver.stream_get_device(std::ptr::null_mut(), &mut dev),
            Ok(CUresult::CUDA_SUCCESS)
        );
        assert_eq!((LAST.load(Ordering::SeqCst), dev), (STREAM_DEVICE, 7));
        let mut ms = 0.0;
        let r = driver.event_elapsed_time(&mut ms, std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!((r, ms), (Ok(CUresult::CUDA_SUCCESS), 2.5));
    }
    let props = driver
        .mem_pool_props(
            CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            device(0),
            1 << 20,
        )
        .unwrap();
    // The limit sits where 12.2+ drivers read `maxSize`, whatever headers the bindings used.
    // SAFETY: CUmemPoolProps is plain old data; reading its bytes is sound.
    let bytes: &[u8] = unsafe {
        std::slice::from_raw_parts(
            (&props as *const cudars_sys::CUmemPoolProps).cast::<u8>(),
            std::mem::size_of_val(&props),
        )
    };
    let offset = std::mem::offset_of!(cudars_sys::CUmemPoolProps, win32SecurityAttributes)
        + std::mem::size_of::<*mut c_void>();
    let max_size = usize::from_ne_bytes(bytes[offset..offset + 8].try_into().unwrap());
    assert_eq!(max_size, 1 << 20);
}

/// Entry points that first appeared in CUDA 13.4 or 13.5: the 13.5 `cudaTypedefs.h` lists one
/// ABI of each, `PFN_<name>_v13040` or `PFN_<name>_v13050`.
const NEW_IN_13_4_OR_LATER: &[(&str, u32)] = &[
    ("cuMemGetLocationInfo", 13040),
    ("cuDeviceGetCliqueCount", 13040),
    ("cuCheckpointOperationComplete", 13040),
    ("cuTensorMapSetAllocationClass", 13050),
    ("cuFabricCpyBatchAsync", 13050),
];

/// The GPU machine's case: bindings from the newest headers (13.5) on a 13.0 driver.
#[test]
fn a_13_0_driver_refuses_the_entry_points_of_13_4_and_later() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let old = 13000;
    let (driver, asked) = fake_driver(old);
    for entry in DRIVER_ENTRY_POINTS.iter() {
        let api = entry.api.to_str().unwrap();
        let status = driver.entry_status(api);
        if entry.since > old {
            let err = status.expect_err(api);
            assert!(err.is_driver_too_old(), "{api}: {err}");
            assert_eq!((err.name, err.needed, err.driver), (api, entry.since, old));
            assert!(
                !asked
                    .iter()
                    .any(|(a, s, _)| a == api && s.as_bytes() == entry.symbol.to_bytes()),
                "{api}: a 13.0 driver was asked for an ABI it does not have"
            );
        } else {
            assert_eq!(status, Ok(()), "{api}");
        }
    }
    for &(name, since) in NEW_IN_13_4_OR_LATER {
        let entry = DRIVER_ENTRY_POINTS
            .iter()
            .find(|e| e.api.to_bytes() == name.as_bytes());
        if since > CUDA_VERSION {
            assert!(entry.is_none(), "{name} in CUDA {CUDA_VERSION} bindings");
            continue;
        }
        let entry = entry.unwrap_or_else(|| panic!("{name} not in CUDA {CUDA_VERSION} bindings"));
        assert_eq!(entry.since, since, "{name}");
        let err = driver.entry_status(name).unwrap_err();
        assert!(err.is_driver_too_old(), "{name}: {err}");
        assert_eq!(
            err.to_string(),
            format!(
                "`{name}` needs a CUDA 13.{} driver; the loaded driver supports CUDA 13.0",
                since % 1000 / 10
            )
        );
    }

    // The call itself: the typed error, and the driver is not reached.
    #[cfg(cuda_sys_cuda_13_4)]
    {
        let device = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        let mut location = compat::mem_location(device, -1);
        LAST.store(0, Ordering::SeqCst);
        // SAFETY: the table has no entry for it on this driver; nothing is called.
        let r = unsafe { driver.cuMemGetLocationInfo(0x10, 64, 0, 0, &mut location) };
        let err = r.unwrap_err();
        assert_eq!(
            (err.name, err.needed, err.driver, err.is_driver_too_old()),
            ("cuMemGetLocationInfo", 13040, old, true)
        );
        assert_eq!(LAST.load(Ordering::SeqCst), 0, "the driver was called");
        assert_eq!(id_of(&location), -1);

        // A 13.4 driver gets the call.
        let (new, _) = fake_driver(13040);
        // SAFETY: the fake has the 13.4 signature; valid out-pointer.
        let r = unsafe { new.cuMemGetLocationInfo(0x10, 64, 0, 0, &mut location) };
        assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
        assert_eq!(LAST.load(Ordering::SeqCst), LOCATION_INFO);
        assert_eq!(id_of(&location), 4);
    }
}

/// `cuFuncGetParamInfo` is a compat method, so bindings from 12.0-12.3 headers (which lack it)
/// offer it too: a 12.4 driver gets the call, an older one gives the typed error.
#[test]
fn param_info_reaches_a_12_4_driver_and_is_too_old_before() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut offset, mut size) = (0usize, 0usize);
    let (new, _) = fake_driver(12040);
    LAST.store(0, Ordering::SeqCst);
    // SAFETY: the fake accepts any handle; valid out-pointers.
    let r = unsafe { new.func_get_param_info(std::ptr::null_mut(), 3, &mut offset, &mut size) };
    assert_eq!(r, Ok(CUresult::CUDA_SUCCESS));
    assert_eq!(
        (LAST.load(Ordering::SeqCst), offset, size),
        (PARAM_INFO, 24, 8)
    );

    let (old, asked) = fake_driver(12030);
    LAST.store(0, Ordering::SeqCst);
    // SAFETY: as above; nothing is called.
    let r = unsafe { old.func_get_param_info(std::ptr::null_mut(), 0, &mut offset, &mut size) };
    let err = r.unwrap_err();
    assert_eq!(
        (err.name, err.needed, err.driver, err.is_driver_too_old()),
        ("cuFuncGetParamInfo", 12040, 12030, true)
    );
    assert_eq!(LAST.load(Ordering::SeqCst), 0, "the driver was called");
    assert!(
        !asked
            .iter()
            .any(|(a, _, v)| a == "cuFuncGetParamInfo" && *v == 12040),
        "a 12.3 driver was asked for the 12.4 entry point"
    );
}
