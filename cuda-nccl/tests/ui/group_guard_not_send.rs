// A group belongs to the thread that opened it: the guard cannot move to another thread.
fn sent<T: Send>(_: T) {}

fn check(guard: cuda_nccl::GroupGuard) {
    sent(guard);
}

fn main() {}
