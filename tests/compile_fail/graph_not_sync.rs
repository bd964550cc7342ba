// Calls on one graph must not overlap (the driver does not synchronise them): `Graph` is not
// `Sync`, although executable graphs share its handle to keep its nodes alive.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_graph::Graph>();
}
