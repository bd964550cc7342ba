// A `DriverFence` cannot be cloned, so no copy of a fence the pool holds exists outside it
// (soundness round 2, item 2).
fn assert_clone<T: Clone>() {}

fn main() {
    assert_clone::<cudars_mempool::DriverFence>();
}
