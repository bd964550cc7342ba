// A host callback's captures are dropped after it returns, on a cleanup thread, never inside
// the driver's callback (where the CUDA calls of a drop are forbidden): the closure is an
// `FnMut`, so it cannot move a captured view out and drop it there.
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let buf = cudars_core::DevicePtr::alloc(&dev, 64).unwrap();
    stream.add_callback(move |_| drop(buf)).unwrap();
}
