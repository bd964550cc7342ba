// A host slice lent to a transfer inside `cudars_xfer::scope` cannot be touched until the
// scope ends (the device may still be writing it).
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let on_device = cudars_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let mut out = vec![0u32; 4];
    let _ = cudars_xfer::scope(|s| {
        s.to_host(&on_device, &mut out, &stream).unwrap();
        out[0] = 1;
    });
}
