// A `DriverFence` cannot be built outside the backend from an event the caller keeps a
// clone of, so `Backend::release_fence` (safe) only ever puts events nobody else holds into
// the backend's cache (soundness round 2, item 2).
use cudars_core::Event;
use cudars_mempool::DriverFence;

fn forge(event: Event) -> DriverFence {
    DriverFence { event }
}

fn main() {
    let _ = forge;
}
