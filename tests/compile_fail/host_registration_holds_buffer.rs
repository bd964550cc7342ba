// A `HostRegistration` holds the buffer it page-locks: the buffer cannot be touched (or
// reallocated, or freed) except through the registration while it is registered.
use cudars_core::memory::{HostRegistration, RegisterFlags};

fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let mut data = vec![0u32; 1024];
    let reg = HostRegistration::new(&dev, &mut data[..], RegisterFlags::PORTABLE).unwrap();
    data.push(1);
    drop(reg);
}
