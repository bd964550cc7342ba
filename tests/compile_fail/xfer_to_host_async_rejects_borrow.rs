// `to_host_async` takes ownership of its host buffer: a borrowed `&mut [T]` could be
// touched (or freed) while the copy into it is still running.
fn main() {
    let dev = cuda_core::Device::new(0).unwrap();
    let stream = cuda_core::Stream::new(&dev).unwrap();
    let on_device = cuda_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let mut out = vec![0u32; 4];
    let _pending = cuda_xfer::to_host_async(&on_device, &mut out[..], &stream);
}
