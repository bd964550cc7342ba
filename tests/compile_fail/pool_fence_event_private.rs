// The driver backend caches the events behind its fences and records them again for later
// fences: a clone of one, re-recorded on an idle stream, made the pool believe a block's
// last owner had finished (soundness round 2, item 2). A fence's event cannot be taken
// out, neither through a method nor through the field.
use cudars_core::Event;
use cudars_mempool::DriverFence;

fn steal(fence: &DriverFence) -> Event {
    fence.event().clone()
}

fn steal_field(fence: &DriverFence) -> Event {
    fence.event.clone()
}

fn main() {
    let _ = (steal, steal_field);
}
