// `to_host_async` takes ownership of its host buffer: a borrowed `&mut [T]` could be
// touched (or freed) while the copy into it is still running.
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let on_device = cudars_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let mut out = vec![0u32; 4];
    let _pending = cudars_xfer::to_host_async(&on_device, &mut out[..], &stream);
}
