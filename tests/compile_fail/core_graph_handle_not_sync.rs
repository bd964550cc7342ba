// A recorded graph may move between threads but not be used by two at once: `GraphHandle` is `Send`, not `Sync`.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_core::graph::GraphHandle>();
}
