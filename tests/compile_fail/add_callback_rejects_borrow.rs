// A host callback runs later, on a driver thread: `Stream::add_callback` rejects closures
// that borrow from the caller (they must be `'static`).
fn main() {
    let dev = cuda_core::Device::new(0).unwrap();
    let stream = cuda_core::Stream::new(&dev).unwrap();
    let mut seen = Vec::new();
    stream
        .add_callback(|status| seen.push(status.is_ok()))
        .unwrap();
}
