// The profiler guard stops collection on the thread that created it: `ProfileGuard` is not
// `Sync` either.
fn assert_sync<T: Sync>() {}

fn main() {
    assert_sync::<cudars_core::profiler::ProfileGuard>();
}
