// `DevicePtr::copy_from_host_async` reads the host slice after it returns: it is `unsafe`.
fn main() {
    let dev = cuda_core::Device::new(0).unwrap();
    let stream = cuda_core::Stream::new(&dev).unwrap();
    let ptr: cuda_core::DevicePtr = cuda_core::DeviceMemory::new(&dev, 16).unwrap().into_ptr();
    let src = [0u32; 4];
    ptr.copy_from_host_async(&src, &stream).unwrap();
}
