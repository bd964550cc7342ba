//! What the running driver supports, decided in one place: [`driver_version`] plus the
//! [`Feature`] checks here. Pools and wrappers ask these before they pick a path, instead of
//! trying a call and failing.
//!
//! The workspace supports CUDA 12.0 through 13.x, for the headers it is built from and for the
//! driver it runs on. Features that need a newer driver than 12.0:
//!
//! | feature | driver | without it |
//! | --- | --- | --- |
//! | [`Feature::PoolMaxSize`] (`CUmemPoolProps::maxSize`) | 12.2 | `MemPool::new` with a size limit is [`Error::DriverTooOld`]; no limit works |
//! | [`Feature::MemLocationHints`] (`cuMemPrefetchAsync_v2`, `cuMemAdvise_v2`) | 12.2 | prefetch and advice to a device or the host go through the 8.0 entry points (same effect); other locations are [`Error::DriverTooOld`] |
//! | [`Feature::CaptureEdgeData`] (`cuStreamGetCaptureInfo_v3`) | 12.3 | capture status and id through the 11.3 entry point (same result); edge data is [`Error::DriverTooOld`] |
//! | [`Feature::StreamDevice`] (`cuStreamGetDevice`) | 12.8 | emulated exactly: the stream's context, then its device |
//! | [`Feature::ElapsedTimeV2`] (`cuEventElapsedTime_v2`) | 12.8 | the 2.0 entry point, same arguments and result |
//!
//! [`Feature::VirtualMemory`] and [`Feature::StreamOrderedAllocation`] are older than 12.0
//! (10.2 and 11.2) but depend on the device (and, for virtual memory, the platform): their
//! checks read the device attribute. Without virtual memory the pool's driver backend uses
//! plain `cuMemAlloc` segments; without stream-ordered allocation `AsyncPool` is refused with
//! the typed error.
//!
//! Any other entry point whose ABI is newer than the driver returns [`Error::DriverTooOld`]
//! naming it, the driver's version and the version needed.
//!
//! [`driver_version`]: crate::driver_version

use cudars_sys::compat::{CUDA_12_2, CUDA_12_3, CUDA_12_8};
use cudars_sys::CUdevice_attribute;

use crate::error::{Error, Result};
use crate::{driver_version, CudaVersion, Device};

/// A capability whose presence depends on the driver's version (and maybe the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Virtual memory management (`cuMemAddressReserve`/`cuMemCreate`/`cuMemMap`): 10.2 and
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    VirtualMemory,
    /// Stream-ordered allocation and memory pools (`cuMemAllocAsync`, `cuMemPool*`): 11.2 and
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`.
    StreamOrderedAllocation,
    /// A size limit on a new memory pool (`CUmemPoolProps::maxSize`): 12.2.
    PoolMaxSize,
    /// Prefetch and advice to any `CUmemLocation` (host NUMA nodes included): 12.2.
    MemLocationHints,
    /// Edge data in stream capture (`cuStreamGetCaptureInfo_v3`): 12.3.
    CaptureEdgeData,
    /// `cuStreamGetDevice` in the driver (emulated before): 12.8.
    StreamDevice,
    /// `cuEventElapsedTime_v2` (the 2.0 entry point serves before): 12.8.
    ElapsedTimeV2,
}

impl Feature {
    /// Every feature.
    pub const ALL: [Feature; 7] = [
        Feature::VirtualMemory,
        Feature::StreamOrderedAllocation,
        Feature::PoolMaxSize,
        Feature::MemLocationHints,
        Feature::CaptureEdgeData,
        Feature::StreamDevice,
        Feature::ElapsedTimeV2,
    ];

    /// The oldest driver that has it.
    pub fn min_driver(self) -> CudaVersion {
        CudaVersion(match self {
            Feature::VirtualMemory => 10020,
            Feature::StreamOrderedAllocation => 11020,
            Feature::PoolMaxSize | Feature::MemLocationHints => CUDA_12_2,
            Feature::CaptureEdgeData => CUDA_12_3,
            Feature::StreamDevice | Feature::ElapsedTimeV2 => CUDA_12_8,
        })
    }

    /// The name errors use.
    pub fn name(self) -> &'static str {
        match self {
            Feature::VirtualMemory => "virtual memory management",
            Feature::StreamOrderedAllocation => "stream-ordered allocation (cuMemPool)",
            Feature::PoolMaxSize => "CUmemPoolProps::maxSize",
            Feature::MemLocationHints => "cuMemPrefetchAsync_v2/cuMemAdvise_v2",
            Feature::CaptureEdgeData => "cuStreamGetCaptureInfo_v3",
            Feature::StreamDevice => "cuStreamGetDevice",
            Feature::ElapsedTimeV2 => "cuEventElapsedTime_v2",
        }
    }

    /// The device attribute that must also be nonzero, for features that depend on the device.
    pub fn device_attribute(self) -> Option<CUdevice_attribute> {
        match self {
            Feature::VirtualMemory => {
                Some(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
            }
            Feature::StreamOrderedAllocation => {
                Some(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            }
            _ => None,
        }
    }

    /// Whether `driver` is new enough.
    pub fn driver_has(self, driver: CudaVersion) -> bool {
        driver >= self.min_driver()
    }
}

/// Whether the running driver is new enough for `feature` (device attributes not consulted).
pub fn driver_supports(feature: Feature) -> Result<bool> {
    Ok(feature.driver_has(driver_version()?))
}

/// Whether `feature` is usable on `device`: the driver is new enough and, where the feature
/// depends on the device, its attribute says so.
pub fn supported(device: &Device, feature: Feature) -> Result<bool> {
    if !driver_supports(feature)? {
        return Ok(false);
    }
    match feature.device_attribute() {
        Some(attribute) => Ok(device.attribute(attribute)? != 0),
        None => Ok(true),
    }
}

/// `Ok(())` when `feature` is usable on `device`; otherwise [`Error::DriverTooOld`] when the
/// driver is too old, or [`Error::Unsupported`] when the device lacks it.
pub fn require(device: &Device, feature: Feature) -> Result<()> {
    let driver = driver_version()?;
    if !feature.driver_has(driver) {
        return Err(Error::DriverTooOld {
            symbol: feature.name(),
            driver,
            needed: feature.min_driver(),
        });
    }
    if supported(device, feature)? {
        Ok(())
    } else {
        Err(Error::Unsupported(feature.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decide_driver_support() {
        let r12_0 = CudaVersion(12000);
        let r12_4 = CudaVersion(12040);
        let r13_0 = CudaVersion(13000);
        for f in Feature::ALL {
            assert!(f.driver_has(r13_0), "{f:?} on 13.0");
            assert!(!f.name().is_empty());
        }
        assert!(Feature::VirtualMemory.driver_has(r12_0));
        assert!(Feature::StreamOrderedAllocation.driver_has(r12_0));
        assert!(!Feature::PoolMaxSize.driver_has(r12_0));
        assert!(Feature::PoolMaxSize.driver_has(r12_4));
        assert!(Feature::CaptureEdgeData.driver_has(r12_4));
        assert!(!Feature::StreamDevice.driver_has(r12_4));
        assert!(Feature::VirtualMemory.device_attribute().is_some());
        assert!(Feature::PoolMaxSize.device_attribute().is_none());
    }

    #[test]
    fn driver_too_old_names_feature_and_versions() {
        let e = Error::DriverTooOld {
            symbol: Feature::StreamDevice.name(),
            driver: CudaVersion(12040),
            needed: Feature::StreamDevice.min_driver(),
        };
        assert_eq!(
            e.to_string(),
            "cuStreamGetDevice needs a CUDA 12.8 driver; the installed driver supports CUDA 12.4"
        );
    }

    #[test]
    fn an_old_abi_missing_symbol_becomes_driver_too_old() {
        let missing = cudars_sys::MissingSymbol {
            name: "cuMemAdvise",
            needed: 12020,
            driver: 12000,
        };
        assert_eq!(
            Error::from(missing),
            Error::DriverTooOld {
                symbol: "cuMemAdvise",
                driver: CudaVersion(12000),
                needed: CudaVersion(12020),
            }
        );
        let plain = cudars_sys::MissingSymbol::new("cuFoo");
        assert_eq!(Error::from(plain), Error::MissingSymbol(plain));
    }

    /// The GPU machine's case: bindings from 13.4+ headers on a 13.0 driver. cuda-sys's
    /// `tests/old_driver.rs` shows a fake 13.0 driver's `cuMemGetLocationInfo` call failing
    /// with exactly this `MissingSymbol` without reaching the driver; here it becomes
    /// `DriverTooOld`, which every cuda-core call returns through `?`.
    #[test]
    fn a_13_4_entry_point_on_a_13_0_driver_is_driver_too_old() {
        let missing = cudars_sys::MissingSymbol {
            name: "cuMemGetLocationInfo",
            needed: 13040,
            driver: 13000,
        };
        assert!(missing.is_driver_too_old());
        let e = Error::from(missing);
        assert_eq!(
            e,
            Error::DriverTooOld {
                symbol: "cuMemGetLocationInfo",
                driver: CudaVersion(13000),
                needed: CudaVersion(13040),
            }
        );
        assert_eq!(
            e.to_string(),
            "cuMemGetLocationInfo needs a CUDA 13.4 driver; the installed driver supports CUDA 13.0"
        );
    }
}
