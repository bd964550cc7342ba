// An NVTX range belongs to the thread that pushed it: `Range` is not `Send`.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_core::nvtx::Range>();
}
