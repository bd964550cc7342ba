// A host callback runs later, on a driver thread: `Stream::add_callback` rejects closures
// that borrow from the caller (they must be `'static`).
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = cudars_core::Stream::new(&dev).unwrap();
    let mut seen = Vec::new();
    stream
        .add_callback(|status| seen.push(status.is_ok()))
        .unwrap();
}
