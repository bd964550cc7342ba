// `to_host_async` moves its host buffer into the `Pending` transfer: the buffer cannot be
// touched before the copy completes, and `Pending::wait` is the only way to get it back.
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let on_device = cudars_xfer::DeviceBuffer::<u32>::zeroed(&dev, 4).unwrap();
    let out = vec![0u32; 4];
    let pending = cudars_xfer::to_host_async(&on_device, out, &stream).unwrap();
    println!("{}", out[0]);
    drop(pending.wait());
}
