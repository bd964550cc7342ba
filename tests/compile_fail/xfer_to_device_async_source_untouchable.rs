// A host slice lent to an upload inside `cudars_xfer::scope` cannot be written until the scope
// ends (the device may still be reading it).
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let on_device = cudars_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let mut data = vec![1u32; 4];
    let _ = cudars_xfer::scope(|s| {
        s.copy_to_device(&data, &on_device, &stream).unwrap();
        data[0] = 2;
    });
}
