// A `StreamScope` restores the current stream of the thread that made it: it is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_core::StreamScope>();
}
