// A communicator cannot be shared between threads: NCCL forbids concurrent use of one.
fn shared<T: Sync>(_: &T) {}

fn check(comm: &cudars_nccl::Communicator) {
    shared(comm);
}

fn main() {}
