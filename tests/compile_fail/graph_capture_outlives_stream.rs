// A `Capture` borrows the stream it captures: it cannot outlive it.
fn main() {
    let dev = cuda_core::Device::new(0).unwrap();
    let capture;
    {
        let stream = cuda_core::Stream::new(&dev).unwrap();
        capture = cuda_graph::capture_begin(&stream, cuda_graph::CaptureMode::Global).unwrap();
    }
    drop(capture);
}
