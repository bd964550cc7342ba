// A capture must end on the thread that began it: `Capture` is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_graph::Capture<'static>>();
}
