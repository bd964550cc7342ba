//! [`CudaVersion`]: a CUDA version as the driver encodes it. Plain data, so that the error
//! type can name it without importing a module that calls the driver.

/// A CUDA version as the driver encodes it (`1000 * major + 10 * minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion(pub u32);

impl CudaVersion {
    /// Major version (13 for 13000).
    pub fn major(self) -> u32 {
        self.0 / 1000
    }
    /// Minor version (0 for 13000).
    pub fn minor(self) -> u32 {
        (self.0 % 1000) / 10
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}
