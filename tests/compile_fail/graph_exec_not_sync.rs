// An executable graph may not be launched from two threads at once: `GraphExec` is not
// `Sync`.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_graph::GraphExec>();
}
