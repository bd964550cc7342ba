// `RelaxedCaptureMode` restores the calling thread's capture mode: it is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_core::graph::RelaxedCaptureMode>();
}
