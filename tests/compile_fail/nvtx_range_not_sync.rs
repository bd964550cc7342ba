// An NVTX range belongs to the thread that pushed it: `Range` is not `Sync` either.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_core::nvtx::Range>();
}
