//! GPU: the loader against the real driver, and the basics of cuda-core.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::Device;
use cudars_sys::Resolution;

#[test]
fn the_real_driver_loads_through_cu_get_proc_address() {
    let driver = cudars_sys::driver().expect("libcuda loads");
    assert_eq!(driver.resolution(), Resolution::ProcAddress);
    assert_eq!(
        driver.init_status(),
        Some(cudars_sys::CUresult::CUDA_SUCCESS)
    );
    // A driver at least as new as the bindings provides every entry point.
    let version = cudars_core::driver_version().unwrap();
    if version >= cudars_core::bindings_version() {
        assert_eq!(
            driver.resolved_count(),
            cudars_sys::DRIVER_ENTRY_POINT_COUNT,
            "{driver:?}"
        );
    }
    assert!(cudars_core::is_available());
}

#[test]
fn device_zero_is_described() {
    let dev = Device::new(0).unwrap();
    let name = dev.name().unwrap();
    assert!(!name.is_empty());
    let (major, _) = dev.compute_capability().unwrap();
    assert!(major >= 7);
    let total = dev.total_memory().unwrap();
    let (free, total_now) = dev.memory_info().unwrap();
    assert_eq!(total, total_now);
    assert!(free > 0 && free <= total);
    assert!(dev.multiprocessor_count().unwrap() > 0);
    let pci = dev.pci_bus_id().unwrap();
    assert_eq!(pci.matches(':').count(), 2, "{pci}");
    let uuid = dev.uuid().unwrap().to_string();
    assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
    let (least, greatest) = dev.stream_priority_range().unwrap();
    assert!(greatest <= least);
}

#[test]
fn an_invalid_ordinal_is_a_typed_error() {
    let count = cudars_core::device_count().unwrap();
    match Device::new(count) {
        Err(cudars_core::Error::InvalidDevice { ordinal, count: c }) => {
            assert_eq!(ordinal, count);
            assert_eq!(c, count);
        }
        other => panic!("expected InvalidDevice, got {other:?}"),
    }
}

#[test]
fn a_driver_error_names_the_call_code_and_message() {
    let dev = Device::new(0).unwrap();
    let err = dev
        .attribute(cudars_sys::CUdevice_attribute(1_000_000))
        .unwrap_err();
    let d = err.driver().expect("a driver error");
    assert_eq!(d.call, "cuDeviceGetAttribute");
    assert_eq!(d.name, "CUDA_ERROR_INVALID_VALUE");
    assert!(!d.message.is_empty());
}

#[test]
fn device_synchronize_calls_the_abi_it_declares() {
    // Regression: cuCtxSynchronize resolved through cuGetProcAddress at 13.0 is the _v2 ABI
    // (it takes a context); calling it without one failed with CONTEXT_IS_DESTROYED.
    let dev = Device::new(0).unwrap();
    dev.synchronize().unwrap();
    let _scope = dev.scope().unwrap();
    assert_eq!(Device::current().unwrap(), dev);
}
