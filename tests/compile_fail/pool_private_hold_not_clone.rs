// A `PrivateHold` is released once: it is not `Clone`, so a holder cannot release another
// holder's hold (a graph's) and have the private pool's memory lent while the graph still
// replays into it (soundness round 2, item 10).
fn assert_clone<T: Clone>() {}

fn main() {
    assert_clone::<cudars_mempool::PrivateHold>();
}
