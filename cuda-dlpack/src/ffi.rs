//! The DLPack C structs, as `dlpack.h` 1.3 declares them.
//!
//! They come from the [`dlpark`] crate (its bindgen output of `dlpack.h`), with its default
//! features off: no CUDA crate and no Python come with it. This module is the one place the
//! rest of the crate takes them from, and its tests pin every size, alignment and field
//! offset to the header's (64-bit targets), so a change upstream fails here first.
//!
//! | struct | what |
//! | --- | --- |
//! | [`DLDevice`] | device type (`kDLCUDA` = 2, `kDLCUDAManaged` = 13, ...) and ordinal |
//! | [`DLDataType`] | type code, bits, lanes |
//! | [`DLTensor`] | data pointer, device, `ndim`, dtype, shape, strides (in elements), byte offset |
//! | [`DLManagedTensor`] | the legacy (pre-1.0) owning tensor: `DLTensor`, context, deleter |
//! | [`DLManagedTensorVersioned`] | the 1.x owning tensor: version, context, deleter, flags, `DLTensor` |
//! | [`DLPackVersion`] | major, minor |
//! | [`DLPackExchangeAPI`] | the 1.3 C exchange table (`__dlpack_c_exchange_api__`) |

pub use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackCurrentWorkStream, DLPackExchangeAPI, DLPackExchangeAPIHeader,
    DLPackManagedTensorFromPyObjectNoSync, DLPackVersion, DLTensor,
};
pub use dlpark::DlpackFlags;

/// The DLPack major version this crate speaks (`DLPACK_MAJOR_VERSION`).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The DLPack minor version of the structs above (`DLPACK_MINOR_VERSION`).
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy for this export.
pub const FLAG_IS_COPIED: u64 = 2;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded to a byte.
pub const FLAG_IS_SUBBYTE_TYPE_PADDED: u64 = 4;

/// The Python capsule name of a versioned tensor (`DLManagedTensorVersioned`).
pub const CAPSULE_VERSIONED: &std::ffi::CStr = c"dltensor_versioned";
/// The capsule name once a consumer took the versioned tensor.
pub const CAPSULE_VERSIONED_USED: &std::ffi::CStr = c"used_dltensor_versioned";
/// The Python capsule name of a legacy tensor (`DLManagedTensor`).
pub const CAPSULE_LEGACY: &std::ffi::CStr = c"dltensor";
/// The capsule name once a consumer took the legacy tensor.
pub const CAPSULE_LEGACY_USED: &std::ffi::CStr = c"used_dltensor";
/// The capsule name of the C exchange API table (`__dlpack_c_exchange_api__`, DLPack 1.3).
pub const CAPSULE_EXCHANGE_API: &std::ffi::CStr = c"dlpack_exchange_api";

/// Device types this crate deals with (`DLDeviceType` values of the header).
pub mod device_type {
    use super::DLDeviceType;
    /// `kDLCPU`.
    pub const CPU: DLDeviceType = DLDeviceType(1);
    /// `kDLCUDA`: memory of one CUDA device.
    pub const CUDA: DLDeviceType = DLDeviceType(2);
    /// `kDLCUDAHost`: pinned host memory.
    pub const CUDA_HOST: DLDeviceType = DLDeviceType(3);
    /// `kDLCUDAManaged`: managed (unified) memory; `device_id` is 0 per the header.
    pub const CUDA_MANAGED: DLDeviceType = DLDeviceType(13);
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // The numbers below are the C layout of dlpack.h 1.x on LP64 (x86_64, aarch64): written
    // here from the header, not from the Rust definitions they check.

    #[test]
    fn version_and_device() {
        assert_eq!(
            (size_of::<DLPackVersion>(), align_of::<DLPackVersion>()),
            (8, 4)
        );
        assert_eq!(offset_of!(DLPackVersion, major), 0);
        assert_eq!(offset_of!(DLPackVersion, minor), 4);
        assert_eq!((size_of::<DLDevice>(), align_of::<DLDevice>()), (8, 4));
        assert_eq!(offset_of!(DLDevice, device_type), 0);
        assert_eq!(offset_of!(DLDevice, device_id), 4);
        assert_eq!(size_of::<DLDeviceType>(), 4);
    }

    #[test]
    fn data_type() {
        assert_eq!((size_of::<DLDataType>(), align_of::<DLDataType>()), (4, 2));
        assert_eq!(offset_of!(DLDataType, code), 0);
        assert_eq!(offset_of!(DLDataType, bits), 1);
        assert_eq!(offset_of!(DLDataType, lanes), 2);
        assert_eq!(size_of::<DLDataTypeCode>(), 1);
    }

    #[test]
    fn tensor() {
        assert_eq!((size_of::<DLTensor>(), align_of::<DLTensor>()), (48, 8));
        assert_eq!(offset_of!(DLTensor, data), 0);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    }

    #[test]
    fn managed_tensors() {
        assert_eq!(
            (size_of::<DLManagedTensor>(), align_of::<DLManagedTensor>()),
            (64, 8)
        );
        assert_eq!(offset_of!(DLManagedTensor, dl_tensor), 0);
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(
            (
                size_of::<DLManagedTensorVersioned>(),
                align_of::<DLManagedTensorVersioned>()
            ),
            (80, 8)
        );
        assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
        assert_eq!(size_of::<DlpackFlags>(), 8);
    }

    #[test]
    fn exchange_api_table() {
        assert_eq!(size_of::<DLPackExchangeAPIHeader>(), 16);
        assert_eq!(offset_of!(DLPackExchangeAPIHeader, prev_api), 8);
        assert_eq!(size_of::<DLPackExchangeAPI>(), 56);
        assert_eq!(offset_of!(DLPackExchangeAPI, managed_tensor_allocator), 16);
        assert_eq!(
            offset_of!(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync),
            24
        );
        assert_eq!(
            offset_of!(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync),
            32
        );
        assert_eq!(
            offset_of!(DLPackExchangeAPI, dltensor_from_py_object_no_sync),
            40
        );
        assert_eq!(offset_of!(DLPackExchangeAPI, current_work_stream), 48);
    }

    #[test]
    fn enum_values_match_the_header() {
        assert_eq!(device_type::CPU, DLDeviceType::CPU);
        assert_eq!(device_type::CUDA, DLDeviceType::CUDA);
        assert_eq!(device_type::CUDA_HOST, DLDeviceType::CUDAHOST);
        assert_eq!(device_type::CUDA_MANAGED, DLDeviceType::CUDAMANAGED);
        assert_eq!(DLDataTypeCode::INT.0, 0);
        assert_eq!(DLDataTypeCode::UINT.0, 1);
        assert_eq!(DLDataTypeCode::FLOAT.0, 2);
        assert_eq!(DLDataTypeCode::BFLOAT.0, 4);
        assert_eq!(DLDataTypeCode::COMPLEX.0, 5);
        assert_eq!(DLDataTypeCode::BOOL.0, 6);
        assert_eq!(DlpackFlags::READ_ONLY.bits(), FLAG_READ_ONLY);
        assert_eq!(DlpackFlags::IS_COPIED.bits(), FLAG_IS_COPIED);
        assert_eq!(
            DlpackFlags::IS_SUBBYTE_TYPE_PADDED.bits(),
            FLAG_IS_SUBBYTE_TYPE_PADDED
        );
        assert_eq!(
            (
                dlpark::ffi::DLPACK_MAJOR_VERSION,
                dlpark::ffi::DLPACK_MINOR_VERSION
            ),
            (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)
        );
    }
}
