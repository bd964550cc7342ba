// An `Issue` holds this thread's capture gate: it cannot move to another thread.
fn assert_send<T: Send>() {}

fn main() {
    assert_send::<cudars_core::Issue<'static>>();
}
