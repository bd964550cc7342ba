// A group belongs to the thread that opened it: the guard cannot move to another thread.
fn sent<T: Send>(_: T) {}

fn check(guard: cudars_nccl::GroupGuard) {
    sent(guard);
}

fn main() {}
