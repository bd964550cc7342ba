// A `Capture` borrows the stream it captures: it cannot outlive it.
fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let capture;
    {
        let stream = cudars_core::Stream::new(&dev).unwrap();
        capture = cudars_graph::capture_begin(&stream, cudars_graph::CaptureMode::Global).unwrap();
    }
    drop(capture);
}
