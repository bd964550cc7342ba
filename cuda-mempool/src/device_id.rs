//! [`DeviceId`], the backend's device number: its own module so that `error.rs` imports no
//! module that does work (the backend seam imports the error type).

use std::fmt;

/// A device, as the backend numbers them (a `CUdevice` ordinal for the driver backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub u32);

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
