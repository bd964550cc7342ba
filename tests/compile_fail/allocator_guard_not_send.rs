// An `AllocatorGuard` restores the thread-local allocator of the thread that made it: it is
// not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_mempool::allocator::AllocatorGuard>();
}
