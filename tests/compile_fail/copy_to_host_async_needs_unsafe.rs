// `DevicePtr::copy_to_host_async` writes the host slice after it returns: it is `unsafe`.
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let ptr: cudars_core::DevicePtr = cudars_core::DeviceMemory::new(&dev, 16).unwrap().into_ptr();
    let mut dst = [0u32; 4];
    ptr.copy_to_host_async(&mut dst, &stream).unwrap();
}
