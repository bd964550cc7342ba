// Marking memory as used by a stream takes the `Issue` the work is issued with, not a
// stream: a mark made outside the gate could be undone by a capture that begins before the
// work is issued.
fn mark(buf: &cudars_core::DevicePtr, stream: &cudars_core::Stream) {
    let _ = buf.record_stream(stream);
}

fn main() {}
