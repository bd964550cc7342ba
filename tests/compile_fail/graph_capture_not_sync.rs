// Capture-mode rules are per thread: `Capture` is not `Sync` either.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_graph::Capture<'static>>();
}
