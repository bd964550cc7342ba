// A `ProfileGuard` stops the profiler of the thread's context on drop: it is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_core::profiler::ProfileGuard>();
}
