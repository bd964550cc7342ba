// A host slice lent to an upload inside `cuda_xfer::scope` cannot be written until the scope
// ends (the device may still be reading it).
fn main() {
    let dev = cuda_core::Device::new(0).unwrap();
    let stream = cuda_core::Stream::new(&dev).unwrap();
    let on_device = cuda_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let mut data = vec![1u32; 4];
    let _ = cuda_xfer::scope(|s| {
        s.copy_to_device(&data, &on_device, &stream).unwrap();
        data[0] = 2;
    });
}
