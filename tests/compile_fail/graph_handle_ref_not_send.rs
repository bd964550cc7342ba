// The bare handle a `Graph` lends holds the graph's call lock: it stays on its thread, so an
// executable graph's node update cannot deadlock on a lock held across a thread boundary.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_graph::GraphHandleRef<'static>>();
}
