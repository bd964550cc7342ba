// A `HookGuard` removes a hook from the thread that installed it: it is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_mempool::hooks::HookGuard>();
}
