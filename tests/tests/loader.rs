//! Loader behaviour that needs no GPU: missing libraries and missing symbols are errors that
//! name what was tried, never panics.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_sys::{Driver, LoadError};

#[test]
fn loading_a_missing_path_reports_not_found_with_the_path() {
    let path = "/nonexistent/dir/libcuda.so.1";
    // SAFETY: the path does not exist, so nothing is loaded.
    let err = unsafe { Driver::load_from(path) }.unwrap_err();
    let LoadError::DriverNotFound { tried } = &err;
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].0, path);
    assert!(!tried[0].1.is_empty(), "the loader's reason is kept");
    let shown = err.to_string();
    assert!(shown.contains(path), "{shown}");
    assert!(shown.contains("CUDA_DRIVER_LIBRARY"), "{shown}");
}

#[test]
fn a_library_that_is_not_the_driver_gives_missing_symbol_errors_naming_the_entry_point() {
    // SAFETY: the C library exports no cu* symbols, so no entry point can be called with a
    // wrong signature.
    let driver = unsafe { Driver::load_from(workspace_tests::libc_path()) }.expect("libc opens");
    assert_eq!(driver.resolved_count(), 0);
    assert_eq!(driver.init_status(), None);
    let mut count = 0;
    // SAFETY: valid out-pointer; the call cannot reach a foreign function (none resolved).
    let err = unsafe { driver.cuDeviceGetCount(&mut count) }.unwrap_err();
    assert_eq!(err.name, "cuDeviceGetCount");
    assert!(err.to_string().contains("cuDeviceGetCount"));
    // A versioned entry point is named by its API name.
    let mut ptr = 0;
    // SAFETY: as above.
    let err = unsafe { driver.cuMemAlloc(&mut ptr, 16) }.unwrap_err();
    assert_eq!(err.name, "cuMemAlloc");
}

#[test]
fn entry_points_carry_api_and_versioned_symbol_names() {
    let mem_alloc = cudars_sys::DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.api.to_bytes() == b"cuMemAlloc")
        .expect("cuMemAlloc is an entry point");
    assert_eq!(mem_alloc.symbol.to_bytes(), b"cuMemAlloc_v2");
    let instantiate = cudars_sys::DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.symbol.to_bytes() == b"cuGraphInstantiateWithFlags")
        .expect("cuGraphInstantiateWithFlags is an entry point");
    assert_eq!(instantiate.api.to_bytes(), b"cuGraphInstantiateWithFlags");
    assert_eq!(
        cudars_sys::DRIVER_ENTRY_POINTS.len(),
        cudars_sys::DRIVER_ENTRY_POINT_COUNT
    );
    let mut apis: Vec<_> = cudars_sys::DRIVER_ENTRY_POINTS
        .iter()
        .map(|e| e.api)
        .collect();
    apis.sort();
    apis.dedup();
    assert_eq!(
        apis.len(),
        cudars_sys::DRIVER_ENTRY_POINT_COUNT,
        "API names are unique"
    );
    for needed in [
        &b"cuInit"[..],
        b"cuGetProcAddress",
        b"cuStreamCreate",
        b"cuEventRecord",
        b"cuProfilerStart",
    ] {
        assert!(
            apis.iter().any(|a| a.to_bytes() == needed),
            "{}",
            String::from_utf8_lossy(needed)
        );
    }
}

#[test]
fn cuda_versions_decode_and_display() {
    let v = cudars_core::CudaVersion(12040);
    assert_eq!((v.major(), v.minor()), (12, 4));
    assert_eq!(v.to_string(), "12.4");
    assert_eq!(
        cudars_core::bindings_version(),
        cudars_core::CudaVersion(cudars_sys::CUDA_VERSION)
    );
}

#[test]
fn plain_entry_points_with_a_distinct_v2_twin_are_resolved_by_exact_symbol() {
    // cuda.h 13 declares cuCtxSynchronize(void) and cuCtxSynchronize_v2(CUcontext) with no
    // #define between them; cuGetProcAddress("cuCtxSynchronize", 13000) answers with the _v2
    // ABI, so both must come from dlsym of their own symbol.
    // 12.2-12.x headers have the same shape for cuMemPrefetchAsync / cuMemPrefetchAsync_v2;
    // 12.0/12.1 headers have no such pair.
    let pairs: &[(&[u8], &[u8])] = if cudars_sys::CUDA_VERSION >= 13000 {
        &[
            (b"cuCtxSynchronize", b"cuCtxSynchronize"),
            (b"cuCtxSynchronize_v2", b"cuCtxSynchronize_v2"),
        ]
    } else if cudars_sys::CUDA_VERSION >= 12020 {
        &[
            (b"cuMemPrefetchAsync", b"cuMemPrefetchAsync"),
            (b"cuMemPrefetchAsync_v2", b"cuMemPrefetchAsync_v2"),
        ]
    } else {
        &[]
    };
    for &(api, symbol) in pairs {
        let e = cudars_sys::DRIVER_ENTRY_POINTS
            .iter()
            .find(|e| e.api.to_bytes() == api)
            .expect("declared");
        assert_eq!(e.symbol.to_bytes(), symbol);
        assert!(!e.by_proc_address, "{e:?}");
    }
    let alloc = cudars_sys::DRIVER_ENTRY_POINTS
        .iter()
        .find(|e| e.api.to_bytes() == b"cuMemAlloc")
        .expect("declared");
    assert!(alloc.by_proc_address);
}
